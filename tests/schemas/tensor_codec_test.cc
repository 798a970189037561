// Tests of schemas/tensor_codec.h and schemas/tensor_view.h: zero-copy tensor write and read,
// one test per bad tensor (shape/size mismatch, unknown dtype, bad rank, overflow, misaligned
// data, bulk payload), expectations on views, and Header checks.
#include "schemas/tensor_codec.h"

#include <cstring>
#include <memory>
#include <vector>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <gtest/gtest.h>

#include "schemas/frame.h"
#include "schemas/step.capnp.h"
#include "schemas/tensor_view.h"

namespace troupe::schemas {
namespace {

std::span<const uint8_t> as_bytes(const std::vector<float>& v) {
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(float)};
}

template <class T>
void expect_error(const Result<T>& r, Errc errc, const std::string& text) {
  ASSERT_FALSE(r.has_value()) << "expected " << to_string(errc);
  EXPECT_EQ(r.error().code, code(errc)) << r.error().message;
  EXPECT_NE(r.error().message.find(text), std::string::npos) << r.error().message;
}

std::vector<float> ramp(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = 0.5f * static_cast<float>(i);
  return v;
}

TEST(TensorCodec, ZeroCopyReadPointsIntoTheFrame) {
  capnp::MallocMessageBuilder mb;
  auto t = mb.initRoot<Tensor>();
  std::vector<float> src = ramp(6);
  const uint64_t shape[] = {2, 3};
  ASSERT_TRUE(set_tensor_copy(t, TensorDtype::kF32, shape, as_bytes(src)));
  kj::Array<capnp::word> frame = to_frame(mb);
  auto b = frame.asBytes();
  auto r = read_frame({b.begin(), b.size()}, 1 << 20);
  ASSERT_TRUE(r) << r.error().message;
  auto v = read_tensor((*r)->getRoot<Tensor>());
  ASSERT_TRUE(v) << v.error().message;
  EXPECT_FALSE(v->copied());
  EXPECT_EQ(v->dtype(), TensorDtype::kF32);
  ASSERT_EQ(v->rank(), 2);
  EXPECT_EQ(v->dim(0), 2u);
  EXPECT_EQ(v->dim(1), 3u);
  EXPECT_EQ(v->num_elements(), 6u);
  // Pointer equality: the payload is read in place, inside the frame buffer.
  const uint8_t* p = v->bytes().data();
  EXPECT_GE(p, b.begin());
  EXPECT_LE(p + v->bytes().size(), b.end());
  EXPECT_EQ(std::memcmp(p, src.data(), 24), 0);
  auto f = v->as<float>();
  ASSERT_EQ(f.size(), 6u);
  EXPECT_EQ(f[5], 2.5f);
}

TEST(TensorCodec, ZeroCopyWriteReferencesTheExternalBuffer) {
  std::vector<float> src = ramp(1024);  // 4 KiB, from operator new: 16-byte aligned
  capnp::MallocMessageBuilder mb;
  auto root = mb.initRoot<BatchDescriptor>();
  const uint64_t shape[] = {4, 256};
  ASSERT_TRUE(set_tensor_external(root.initHidden(), TensorDtype::kF32, shape, as_bytes(src)));
  // The buffer itself is one of the message's segments.
  auto segments = mb.getSegmentsForOutput();
  bool found = false;
  for (auto s : segments) {
    found = found || reinterpret_cast<const void*>(s.begin()) == src.data();
  }
  EXPECT_TRUE(found);
  EXPECT_EQ(root.asReader().getHidden().getData().begin(),
            reinterpret_cast<const uint8_t*>(src.data()));
  FrameGather g = frame_gather(mb);
  bool gathered = false;
  for (auto s : g.segments) gathered = gathered || s.data() == as_bytes(src).data();
  EXPECT_TRUE(gathered);
  // What the receiver gets back is the same tensor.
  std::vector<uint8_t> joined(g.table_bytes().begin(), g.table_bytes().end());
  for (auto s : g.segments) joined.insert(joined.end(), s.begin(), s.end());
  auto r = read_frame({joined.data(), joined.size()}, 1 << 20);
  ASSERT_TRUE(r) << r.error().message;
  auto v = read_tensor((*r)->getRoot<BatchDescriptor>().getHidden());
  ASSERT_TRUE(v) << v.error().message;
  EXPECT_EQ(std::memcmp(v->bytes().data(), src.data(), 4096), 0);
}

TEST(TensorCodec, ExternalWriteRejectsMisalignedBuffer) {
  std::vector<uint8_t> buf(64);
  capnp::MallocMessageBuilder mb;
  auto t = mb.initRoot<Tensor>();
  const uint64_t shape[] = {32};
  Status st = set_tensor_external(t, TensorDtype::kU8, shape, {buf.data() + 1, 32}, 63);
  expect_error(st, Errc::kMisaligned, "not 8-byte aligned");
  EXPECT_FALSE(t.hasData());  // nothing written
}

TEST(TensorCodec, ExternalWriteNeedsAWholeLastWord) {
  std::vector<float> src = ramp(3);  // 12 bytes: Cap'n Proto would read 4 bytes past the end
  capnp::MallocMessageBuilder mb;
  auto t = mb.initRoot<Tensor>();
  const uint64_t shape[] = {3};
  expect_error(set_tensor_external(t, TensorDtype::kF32, shape, as_bytes(src)), Errc::kMisaligned,
               "needs 16 readable bytes");
  std::vector<float> padded = ramp(4);
  EXPECT_TRUE(set_tensor_external(t, TensorDtype::kF32, shape, as_bytes(padded).first(12),
                                  /*readable_bytes=*/16));
}

TEST(TensorCodec, WriteRejectsShapeSizeMismatch) {
  std::vector<float> src = ramp(5);
  capnp::MallocMessageBuilder mb;
  auto t = mb.initRoot<Tensor>();
  const uint64_t shape[] = {2, 3};
  expect_error(set_tensor_copy(t, TensorDtype::kF32, shape, as_bytes(src)), Errc::kBadShape,
               "tensor f32 [2, 3] needs 24 bytes, data has 20");
  EXPECT_FALSE(t.hasShape());
}

// ---- Bad tensors on the wire: one test each. ---------------------------------------------

TEST(TensorBadInput, ShapeDataSizeMismatch) {
  capnp::MallocMessageBuilder mb;
  auto t = mb.initRoot<Tensor>();
  t.setDtype(DType::F32);
  auto s = t.initShape(2);
  s.set(0, 2);
  s.set(1, 3);
  t.initData(20);
  expect_error(read_tensor(t.asReader()), Errc::kBadShape,
               "tensor f32 [2, 3] needs 24 bytes, data has 20");
}

TEST(TensorBadInput, UnknownDtype) {
  capnp::MallocMessageBuilder mb;
  auto t = mb.initRoot<Tensor>();
  t.setDtype(static_cast<DType>(200));  // from a newer peer
  t.initShape(1).set(0, 4);
  t.initData(16);
  expect_error(read_tensor(t.asReader()), Errc::kUnknownDtype,
               "tensor dtype 200 is unknown (this build knows 1..11)");
}

TEST(TensorBadInput, UnsetDtype) {
  capnp::MallocMessageBuilder mb;
  auto t = mb.initRoot<Tensor>();
  t.initShape(1).set(0, 4);
  t.initData(16);
  expect_error(read_tensor(t.asReader()), Errc::kUnknownDtype, "tensor dtype is unset (0)");
}

TEST(TensorBadInput, AbsentTensor) {
  capnp::MallocMessageBuilder mb;
  auto root = mb.initRoot<BatchDescriptor>();
  ASSERT_FALSE(root.hasHidden());
  expect_error(read_tensor(root.asReader().getHidden()), Errc::kBadShape, "rank 0");
}

TEST(TensorBadInput, RankTooLarge) {
  capnp::MallocMessageBuilder mb;
  auto t = mb.initRoot<Tensor>();
  t.setDtype(DType::U8);
  auto s = t.initShape(9);
  for (unsigned i = 0; i < 9; ++i) s.set(i, 1);
  t.initData(1);
  expect_error(read_tensor(t.asReader()), Errc::kBadShape, "tensor rank 9 is outside 1..8");
}

TEST(TensorBadInput, ShapeOverflows) {
  capnp::MallocMessageBuilder mb;
  auto t = mb.initRoot<Tensor>();
  t.setDtype(DType::F32);
  auto s = t.initShape(2);
  s.set(0, uint64_t{1} << 40);
  s.set(1, uint64_t{1} << 40);
  t.initData(8);
  expect_error(read_tensor(t.asReader()), Errc::kBadShape, "overflows 64 bits");
  s.set(0, uint64_t{1} << 31);
  s.set(1, uint64_t{1} << 31);  // 2^62 elements fit, 2^64 bytes do not
  expect_error(read_tensor(t.asReader()), Errc::kBadShape, "overflows 64 bits");
}

TEST(TensorBadInput, MisalignedData) {
  std::vector<float> src = ramp(4);
  std::vector<uint8_t> storage(24);
  uint8_t* p = storage.data();
  while (reinterpret_cast<uintptr_t>(p) % 4 != 1) ++p;
  std::memcpy(p, src.data(), 16);
  const uint64_t shape[] = {4};
  TensorReadOptions strict;
  strict.copy_if_misaligned = false;
  expect_error(make_tensor_view(uint16_t(TensorDtype::kF32), shape, {p, 16}, strict),
               Errc::kMisaligned, "not aligned to its 4-byte elements");
  // By default the bytes are copied out into an aligned buffer instead.
  auto v = make_tensor_view(uint16_t(TensorDtype::kF32), shape, {p, 16});
  ASSERT_TRUE(v) << v.error().message;
  EXPECT_TRUE(v->copied());
  EXPECT_NE(v->bytes().data(), p);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(v->bytes().data()) % 4, 0u);
  EXPECT_EQ(v->as<float>()[3], 1.5f);
  // A copy of the view shares the owned bytes, so its span stays valid.
  TensorView copy = *v;
  v = make_tensor_view(uint16_t(TensorDtype::kU8), shape, {p, 4});
  EXPECT_EQ(copy.as<float>()[2], 1.0f);
}

TEST(TensorBadInput, BulkPayloadNotResolved) {
  capnp::MallocMessageBuilder mb;
  auto t = mb.initRoot<Tensor>();
  t.setDtype(DType::F32);
  t.initShape(1).set(0, 4);
  t.initBulk().setTransferId(17);
  t.getBulk().setSizeBytes(16);
  expect_error(read_tensor(t.asReader()), Errc::kBulkPayload, "bulk transfer 17 (16 bytes)");
}

TEST(TensorView, ExpectTensorChecksDtypeAndShape) {
  std::vector<float> src = ramp(6);
  const uint64_t shape[] = {2, 3};
  auto v = make_tensor_view(uint16_t(TensorDtype::kF32), shape, as_bytes(src));
  ASSERT_TRUE(v);
  EXPECT_TRUE(expect_tensor(*v, {TensorDtype::kF32, TensorDtype::kBf16}, {-1, 3}, "hidden"));
  EXPECT_TRUE(expect_tensor(*v, {}, {2, 3}, "hidden"));
  expect_error(expect_tensor(*v, {TensorDtype::kBf16}, {-1, 3}, "BatchDescriptor.hidden"),
               Errc::kShapeMismatch,
               "BatchDescriptor.hidden: expected bf16 [*, 3], got f32 [2, 3]");
  expect_error(expect_tensor(*v, {TensorDtype::kF32}, {2, 4}, "rows"), Errc::kShapeMismatch,
               "rows: expected f32 [2, 4], got f32 [2, 3]");
  expect_error(expect_tensor(*v, {}, {6}, "rows"), Errc::kShapeMismatch, "expected any [6]");
}

TEST(TensorView, AsWithWrongElementSizeIsABug) {
  std::vector<float> src = ramp(2);
  const uint64_t shape[] = {2};
  auto v = make_tensor_view(uint16_t(TensorDtype::kF32), shape, as_bytes(src));
  ASSERT_TRUE(v);
  EXPECT_THROW((void)v->as<double>(), InternalError);
}

TEST(TensorView, DtypeSizesAndNames) {
  EXPECT_EQ(dtype_size(TensorDtype::kBf16), 2u);
  EXPECT_EQ(dtype_size(TensorDtype::kI64), 8u);
  EXPECT_EQ(dtype_size(TensorDtype::kF8E4M3), 1u);
  EXPECT_EQ(dtype_size(TensorDtype::kUnknown), 0u);
  EXPECT_EQ(dtype_size(static_cast<TensorDtype>(99)), 0u);
  EXPECT_STREQ(dtype_name(TensorDtype::kF16), "f16");
  EXPECT_STREQ(dtype_name(static_cast<TensorDtype>(99)), "unknown");
}

// ---- Header ---------------------------------------------------------------------------------

HeaderFields sample_header() {
  return {.cluster_epoch = 5, .node = 2, .role = Role::STAGE, .index = 1, .seq = 77};
}

TEST(Header, RoundTrips) {
  capnp::MallocMessageBuilder mb;
  auto h = mb.initRoot<Header>();
  set_header(h, sample_header());
  auto got = read_header(h.asReader(), 5);
  ASSERT_TRUE(got) << got.error().message;
  EXPECT_EQ(got->cluster_epoch, 5u);
  EXPECT_EQ(got->node, 2u);
  EXPECT_EQ(got->role, Role::STAGE);
  EXPECT_EQ(got->index, 1u);
  EXPECT_EQ(got->seq, 77u);
}

TEST(HeaderBadInput, StaleEpoch) {
  capnp::MallocMessageBuilder mb;
  auto h = mb.initRoot<Header>();
  set_header(h, sample_header());
  expect_error(read_header(h.asReader(), 6), Errc::kStaleEpoch,
               "message from epoch 5, receiver is in epoch 6: stale");
}

TEST(HeaderBadInput, FutureEpoch) {
  capnp::MallocMessageBuilder mb;
  auto h = mb.initRoot<Header>();
  set_header(h, sample_header());
  expect_error(read_header(h.asReader(), 4), Errc::kFutureEpoch, "receiver is behind");
}

TEST(HeaderBadInput, UnsetFields) {
  capnp::MallocMessageBuilder mb;
  auto h = mb.initRoot<Header>();
  HeaderFields f = sample_header();
  f.seq = 0;
  set_header(h, f);
  expect_error(read_header(h.asReader(), 5), Errc::kBadHeader, "seq is unset");
  f = sample_header();
  f.cluster_epoch = 0;
  set_header(h, f);
  expect_error(read_header(h.asReader(), 5), Errc::kBadHeader, "cluster epoch is unset");
  EXPECT_TRUE(read_header(h.asReader(), 0));  // JoinRequest: epoch not checked
  f = sample_header();
  f.role = static_cast<Role>(40);
  set_header(h, f);
  expect_error(read_header(h.asReader(), 5), Errc::kBadHeader, "sender role 40 is invalid");
  // A message without a header at all reads as all-zero fields.
  capnp::MallocMessageBuilder mb2;
  auto root = mb2.initRoot<BatchDescriptor>();
  expect_error(read_header(root.asReader().getHeader(), 5), Errc::kBadHeader, "seq is unset");
}

}  // namespace
}  // namespace troupe::schemas
