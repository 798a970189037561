// Frame writing and validated frame reading (see frame.h).
#include "schemas/frame.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <string>
#include <utility>

#include <capnp/any.h>
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/array.h>
#include <kj/exception.h>

#include "schemas/errc.h"

namespace troupe::schemas {
namespace {

constexpr size_t kWordBytes = sizeof(capnp::word);
static_assert(kWordBytes == 8);
constexpr uint64_t kTraversalSlackWords = 1024;

Error fail(Errc e, std::string message) { return make_error(code(e), std::move(message)); }

uint32_t load_u32_le(const uint8_t* p) {
  // Cap'n Proto is little-endian on the wire; so are the hosts we build for.
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Holds the aligned copy of a frame that arrived misaligned. A base class rather than a member,
// so that it is constructed before the FlatArrayMessageReader that points into it.
struct AlignedFrameCopy {
  explicit AlignedFrameCopy(std::span<const uint8_t> frame)
      : words(kj::heapArray<capnp::word>(frame.size() / kWordBytes)) {
    std::memcpy(words.begin(), frame.data(), frame.size());
  }
  kj::Array<capnp::word> words;
};

class OwningFrameReader : private AlignedFrameCopy, public capnp::FlatArrayMessageReader {
 public:
  OwningFrameReader(std::span<const uint8_t> frame, const capnp::ReaderOptions& options)
      : AlignedFrameCopy(frame), capnp::FlatArrayMessageReader(words.asPtr(), options) {}
};

// Checks the segment table and sizes; returns the frame's size in words on success.
Result<size_t> check_segment_table(std::span<const uint8_t> frame, const FrameLimits& limits) {
  const size_t size = frame.size();
  if (size > limits.max_bytes) {
    return fail(Errc::kOversized, strfmt("frame of %zu bytes exceeds the limit of %zu bytes", size,
                                         limits.max_bytes));
  }
  if (size < kWordBytes) {
    return fail(
        Errc::kTruncated,
        strfmt("frame of %zu bytes is shorter than the smallest segment table (8 bytes)", size));
  }
  if (size % kWordBytes != 0) {
    return fail(Errc::kTruncated,
                strfmt("frame of %zu bytes is not a whole number of 8-byte words", size));
  }
  // First uint32: segment count - 1 (64-bit here: 0xffffffff + 1 must not wrap to 0).
  const uint64_t num_segments = uint64_t{load_u32_le(frame.data())} + 1;
  if (num_segments > limits.max_segments) {
    return fail(Errc::kBadSegmentTable,
                strfmt("segment count %llu exceeds the limit of %u",
                       static_cast<unsigned long long>(num_segments), limits.max_segments));
  }
  // The table: 1 + num_segments uint32s, padded to a whole word.
  const size_t table_bytes = ((1 + num_segments + 1) / 2) * kWordBytes;
  if (table_bytes > size) {
    return fail(Errc::kTruncated,
                strfmt("segment table of %llu segments needs %zu bytes, frame has %zu",
                       static_cast<unsigned long long>(num_segments), table_bytes, size));
  }
  uint64_t total_words = 0;  // at most 512 * (2^32 - 1): no overflow
  for (uint64_t i = 0; i < num_segments; ++i) {
    const uint32_t words = load_u32_le(frame.data() + 4 * (1 + i));
    if (i == 0 && words == 0) {
      return fail(Errc::kBadSegmentTable, "first segment is empty: the frame has no root pointer");
    }
    total_words += words;
  }
  const uint64_t need = table_bytes + total_words * kWordBytes;
  if (need > size) {
    return fail(Errc::kTruncated, strfmt("frame's %llu segments need %llu bytes, frame has %zu",
                                         static_cast<unsigned long long>(num_segments),
                                         static_cast<unsigned long long>(need), size));
  }
  if (need < size) {
    return fail(Errc::kBadSegmentTable,
                strfmt("frame has %llu trailing bytes after its %llu segments",
                       static_cast<unsigned long long>(size - need),
                       static_cast<unsigned long long>(num_segments)));
  }
  return size / kWordBytes;
}

}  // namespace

kj::Array<capnp::word> to_frame(capnp::MessageBuilder& message) {
  return capnp::messageToFlatArray(message);
}

size_t FrameGather::size_bytes() const {
  size_t n = table.size() * sizeof(uint32_t);
  for (const auto& s : segments) n += s.size();
  return n;
}

FrameGather frame_gather(capnp::MessageBuilder& message) {
  FrameGather out;
  auto segments = message.getSegmentsForOutput();
  const size_t count = segments.size();
  out.table.assign(((1 + count + 1) / 2) * 2, 0);  // 1 + count uint32s, padded to whole words
  out.table[0] = static_cast<uint32_t>(count - 1);
  out.segments.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    out.table[1 + i] = static_cast<uint32_t>(segments[i].size());
    auto bytes = segments[i].asBytes();
    out.segments.emplace_back(bytes.begin(), bytes.size());
  }
  return out;
}

Result<std::unique_ptr<capnp::FlatArrayMessageReader>> read_frame(std::span<const uint8_t> frame,
                                                                  const FrameLimits& limits) {
  Result<size_t> words = check_segment_table(frame, limits);
  if (!words) return words.error();
  capnp::ReaderOptions options;
  // The slack covers re-reading small structs (the root is visited here and again by the
  // caller) without letting a large message be walked more than traversal_factor times.
  options.traversalLimitInWords =
      uint64_t{*words} * std::max<uint32_t>(limits.traversal_factor, 1) + kTraversalSlackWords;
  options.nestingLimit = limits.nesting_limit;
  try {
    std::unique_ptr<capnp::FlatArrayMessageReader> reader;
    if (reinterpret_cast<uintptr_t>(frame.data()) % kWordBytes == 0) {
      kj::ArrayPtr<const capnp::word> view(reinterpret_cast<const capnp::word*>(frame.data()),
                                           *words);
      reader = std::make_unique<capnp::FlatArrayMessageReader>(view, options);
    } else {
      reader = std::make_unique<OwningFrameReader>(frame, options);
    }
    auto root = reader->getRoot<capnp::AnyPointer>();
    if (root.isNull()) return fail(Errc::kMalformed, "frame's root pointer is null");
    (void)reader->getRoot<capnp::AnyStruct>();  // throws unless an in-bounds struct
    return reader;
  } catch (const kj::Exception& e) {
    return fail(Errc::kMalformed,
                std::string("frame rejected by Cap'n Proto: ") + e.getDescription().cStr());
  } catch (const std::bad_alloc&) {
    return fail(Errc::kMalformed,
                strfmt("out of memory reading a frame of %zu bytes", frame.size()));
  }
}

Result<std::unique_ptr<capnp::FlatArrayMessageReader>> read_frame(std::span<const uint8_t> frame,
                                                                  size_t max_bytes) {
  FrameLimits limits;
  limits.max_bytes = max_bytes;
  return read_frame(frame, limits);
}

}  // namespace troupe::schemas
