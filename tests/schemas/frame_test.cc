// Tests of schemas/frame.h: writing frames (flat and gather), and one test per way a received
// frame can be bad (truncated, oversized, garbage, absurd segment table, trailing bytes, null or
// non-struct root, hostile pointers found later by guard(), the traversal limit).
#include "schemas/frame.h"

#include <cstring>
#include <vector>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <gtest/gtest.h>

#include "schemas/errc.h"
#include "schemas/step.capnp.h"
#include "schemas/tensor_codec.h"

namespace troupe::schemas {
namespace {

std::vector<uint8_t> bytes_of(const kj::Array<capnp::word>& words) {
  auto b = words.asBytes();
  return {b.begin(), b.end()};
}

// A small valid message: a BatchDescriptor with one sequence.
std::vector<uint8_t> sample_frame() {
  capnp::MallocMessageBuilder mb;
  auto root = mb.initRoot<BatchDescriptor>();
  set_header(root.initHeader(),
             {.cluster_epoch = 3, .node = 1, .role = Role::SCHEDULER, .index = 0, .seq = 7});
  root.setStepId(42);
  auto seq = root.initSequences(1)[0];
  seq.setRequestId(9);
  seq.setCount(2);
  auto toks = seq.initTokenIds(2);
  toks.set(0, 11);
  toks.set(1, 12);
  return bytes_of(to_frame(mb));
}

// A frame from raw words (little-endian uint32 pairs), 8-byte aligned.
struct RawFrame {
  std::vector<uint64_t> words;
  std::span<const uint8_t> bytes() const {
    return {reinterpret_cast<const uint8_t*>(words.data()), words.size() * 8};
  }
};

uint64_t table_word(uint32_t count_minus_one, uint32_t seg0_words) {
  return uint64_t{count_minus_one} | (uint64_t{seg0_words} << 32);
}

void expect_error(const Result<std::unique_ptr<capnp::FlatArrayMessageReader>>& r, Errc errc,
                  const std::string& text) {
  ASSERT_FALSE(r.has_value()) << "expected " << to_string(errc);
  EXPECT_EQ(r.error().code, code(errc)) << r.error().message;
  EXPECT_NE(r.error().message.find(text), std::string::npos) << r.error().message;
}

std::span<const uint8_t> span_of(const std::vector<uint8_t>& v) { return {v.data(), v.size()}; }

TEST(Frame, RoundTripsAndReadsInPlace) {
  capnp::MallocMessageBuilder mb;
  auto root = mb.initRoot<BatchDescriptor>();
  set_header(root.initHeader(),
             {.cluster_epoch = 3, .node = 1, .role = Role::SCHEDULER, .index = 0, .seq = 7});
  root.setStepId(42);
  kj::Array<capnp::word> frame = to_frame(mb);
  auto b = frame.asBytes();
  auto r = read_frame({b.begin(), b.size()}, 1 << 20);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ((*r)->getRoot<BatchDescriptor>().getStepId(), 42u);
  // The reader points into the frame: no copy on an aligned buffer.
  auto seg0 = (*r)->getSegment(0);
  EXPECT_GE(reinterpret_cast<const uint8_t*>(seg0.begin()), b.begin());
  EXPECT_LT(reinterpret_cast<const uint8_t*>(seg0.begin()), b.end());
}

TEST(Frame, GatherPartsConcatenateToTheFlatFrame) {
  capnp::MallocMessageBuilder mb(16);  // tiny first segment: forces several segments
  auto root = mb.initRoot<BatchDescriptor>();
  set_header(root.initHeader(),
             {.cluster_epoch = 1, .node = 1, .role = Role::SCHEDULER, .index = 0, .seq = 1});
  auto seqs = root.initSequences(50);
  for (unsigned i = 0; i < seqs.size(); ++i) seqs[i].initTokenIds(100).set(0, int32_t(i));
  FrameGather g = frame_gather(mb);
  ASSERT_GT(g.segments.size(), 1u);
  std::vector<uint8_t> joined(g.table_bytes().begin(), g.table_bytes().end());
  for (auto s : g.segments) joined.insert(joined.end(), s.begin(), s.end());
  EXPECT_EQ(joined.size(), g.size_bytes());
  EXPECT_EQ(joined, bytes_of(to_frame(mb)));
  auto r = read_frame(span_of(joined), 1 << 20);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ((*r)->getRoot<BatchDescriptor>().getSequences()[49].getTokenIds()[0], 49);
}

TEST(Frame, MisalignedBufferIsCopiedAndRead) {
  std::vector<uint8_t> frame = sample_frame();
  std::vector<uint8_t> storage(frame.size() + 8);
  uint8_t* p = storage.data();
  while (reinterpret_cast<uintptr_t>(p) % 8 != 3) ++p;  // deliberately misaligned
  std::memcpy(p, frame.data(), frame.size());
  auto r = read_frame({p, frame.size()}, 1 << 20);
  ASSERT_TRUE(r) << r.error().message;
  auto seg0 = (*r)->getSegment(0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(seg0.begin()) % 8, 0u);
  EXPECT_EQ((*r)->getRoot<BatchDescriptor>().getSequences()[0].getTokenIds()[1], 12);
}

// ---- Bad input: each way a frame can be bad has its own test (STYLE.md "Tests"). -----------

TEST(FrameBadInput, TruncatedFrame) {
  std::vector<uint8_t> frame = sample_frame();
  std::vector<uint8_t> cut(frame.begin(), frame.end() - 8);
  expect_error(read_frame(span_of(cut), 1 << 20), Errc::kTruncated, "segments need");
}

TEST(FrameBadInput, FrameShorterThanOneWord) {
  std::vector<uint8_t> frame = sample_frame();
  std::vector<uint8_t> cut(frame.begin(), frame.begin() + 4);
  expect_error(read_frame(span_of(cut), 1 << 20), Errc::kTruncated, "shorter than");
  expect_error(read_frame({}, 1 << 20), Errc::kTruncated, "frame of 0 bytes");
}

TEST(FrameBadInput, FrameNotWholeWords) {
  std::vector<uint8_t> frame = sample_frame();
  std::vector<uint8_t> cut(frame.begin(), frame.end() - 3);
  expect_error(read_frame(span_of(cut), 1 << 20), Errc::kTruncated,
               "not a whole number of 8-byte words");
}

TEST(FrameBadInput, OversizedFrame) {
  std::vector<uint8_t> frame = sample_frame();
  expect_error(read_frame(span_of(frame), frame.size() - 1), Errc::kOversized,
               "exceeds the limit of");
  EXPECT_TRUE(read_frame(span_of(frame), frame.size()));
}

TEST(FrameBadInput, AbsurdSegmentCount) {
  RawFrame f{{table_word(0xffffffffu, 1), 0, 0}};
  expect_error(read_frame(f.bytes(), 1 << 20), Errc::kBadSegmentTable,
               "segment count 4294967296 exceeds the limit of 512");
  RawFrame g{{table_word(600, 1), 0, 0}};
  expect_error(read_frame(g.bytes(), 1 << 20), Errc::kBadSegmentTable, "segment count 601");
}

TEST(FrameBadInput, SegmentTableLongerThanFrame) {
  RawFrame f{{table_word(99, 1), 0}};  // 100 segments need a 51-word table
  expect_error(read_frame(f.bytes(), 1 << 20), Errc::kTruncated,
               "segment table of 100 segments needs 408 bytes, frame has 16");
}

TEST(FrameBadInput, SegmentSizesBeyondFrame) {
  RawFrame f{{table_word(0, 0xfffffff0u), 0}};
  expect_error(read_frame(f.bytes(), 1 << 20), Errc::kTruncated, "segments need");
}

TEST(FrameBadInput, TrailingBytes) {
  std::vector<uint8_t> frame = sample_frame();
  frame.insert(frame.end(), 16, uint8_t{0});
  expect_error(read_frame(span_of(frame), 1 << 20), Errc::kBadSegmentTable, "16 trailing bytes");
}

TEST(FrameBadInput, EmptyFirstSegment) {
  RawFrame f{{table_word(0, 0)}};
  expect_error(read_frame(f.bytes(), 1 << 20), Errc::kBadSegmentTable, "first segment is empty");
}

TEST(FrameBadInput, NullRoot) {
  RawFrame f{{table_word(0, 1), 0}};
  expect_error(read_frame(f.bytes(), 1 << 20), Errc::kMalformed, "root pointer is null");
}

TEST(FrameBadInput, GarbageRootPointer) {
  // Struct pointer (kind 0) with offset 2^29 words: far outside the 1-word segment.
  RawFrame f{{table_word(0, 1), (uint64_t{1} << 31) | (uint64_t{1} << 32)}};
  expect_error(read_frame(f.bytes(), 1 << 20), Errc::kMalformed, "out-of-bounds");
}

TEST(FrameBadInput, RootIsNotAStruct) {
  // List pointer (kind 1), offset 0, element size 2 (one byte), 0 elements.
  RawFrame f{{table_word(0, 2), 1 | (uint64_t{2} << 32), 0}};
  expect_error(read_frame(f.bytes(), 1 << 20), Errc::kMalformed, "frame rejected");
}

TEST(FrameBadInput, GarbageBytesNeverCrash) {
  // Random words behind a valid segment table: read_frame either rejects them or returns a
  // reader whose typed reads guard() turns into errors. Nothing may crash or escape.
  uint64_t x = 0x9e3779b97f4a7c15ull;
  auto next = [&] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  int accepted = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const uint32_t n = 1 + static_cast<uint32_t>(next() % 24);
    RawFrame f{{table_word(0, n)}};
    for (uint32_t i = 0; i < n; ++i) {
      uint64_t w = next();
      if (trial % 2 == 0) w &= 0x000f0003ffffffffull;  // small offsets: often in bounds
      f.words.push_back(w);
    }
    if (trial % 7 == 0) f.words[0] = next();  // garbage table too
    auto r = read_frame(f.bytes(), 1 << 20);
    if (!r) continue;
    ++accepted;
    Status st = guard("BatchDescriptor", [&]() -> Status {
      auto root = (*r)->getRoot<BatchDescriptor>();
      (void)read_header(root.getHeader(), 1);
      for (auto s : root.getSequences()) {
        for (int32_t t : s.getTokenIds()) (void)t;
        for (auto bt : s.getBlockTables()) (void)bt.getBlockIds().size();
      }
      (void)read_tensor(root.getHidden());
      return Ok{};
    });
    if (!st) {
      EXPECT_EQ(st.error().code, code(Errc::kMalformed));
    }
  }
  EXPECT_GT(accepted, 0);  // the loop did reach the typed reads
}

TEST(FrameBadInput, WrongPointerKindIsCaughtByGuard) {
  // A Tensor read as a BatchDescriptor: pointer 0 is a list (shape) where a struct (header) is
  // expected. read_frame cannot know the root type; the typed getter throws inside guard().
  capnp::MallocMessageBuilder mb;
  auto t = mb.initRoot<Tensor>();
  t.setDtype(DType::F32);
  t.initShape(1).set(0, 4);
  t.initData(16);
  std::vector<uint8_t> frame = bytes_of(to_frame(mb));
  auto r = read_frame(span_of(frame), 1 << 20);
  ASSERT_TRUE(r) << r.error().message;
  Status st = guard("BatchDescriptor", [&]() -> Status {
    (void)(*r)->getRoot<BatchDescriptor>().getHeader().getClusterEpoch();
    return Ok{};
  });
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, code(Errc::kMalformed));
  EXPECT_NE(st.error().message.find("BatchDescriptor: malformed message"), std::string::npos)
      << st.error().message;
}

TEST(FrameBadInput, TraversalLimitFollowsFrameSize) {
  // With traversal_factor 1 the 64 KiB payload can be read once, not twice: a message cannot
  // make its reader walk more than factor * its own size.
  capnp::MallocMessageBuilder mb;
  auto root = mb.initRoot<BatchDescriptor>();
  std::vector<float> payload(16384, 1.0f);
  const uint64_t shape[] = {16384};
  ASSERT_TRUE(set_tensor_copy(root.initHidden(), TensorDtype::kF32, shape,
                              {reinterpret_cast<const uint8_t*>(payload.data()), 65536}));
  std::vector<uint8_t> frame = bytes_of(to_frame(mb));
  FrameLimits limits;
  limits.max_bytes = 1 << 20;
  limits.traversal_factor = 1;
  auto r = read_frame(span_of(frame), limits);
  ASSERT_TRUE(r) << r.error().message;
  auto hidden = (*r)->getRoot<BatchDescriptor>().getHidden();
  EXPECT_TRUE(read_tensor(hidden));
  Result<TensorView> again = read_tensor(hidden);
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().code, code(Errc::kMalformed));
  EXPECT_NE(again.error().message.find("traversal limit"), std::string::npos)
      << again.error().message;
}

}  // namespace
}  // namespace troupe::schemas
