// Frames: a Cap'n Proto message as bytes on a link (the standard segment table, then the
// segments). to_frame()/frame_gather() write one; read_frame() validates one from an untrusted
// peer and returns a reader over it without copying.
// Users: transport/ (send and receive paths), tests, and actors that persist messages.
// Cap'n Proto types are only forward-declared here (STYLE.md "Header hygiene"); callers that
// use the results include <capnp/serialize.h>. Thread safety: free functions, no shared state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "base/result.h"

namespace capnp {
class MessageBuilder;
class FlatArrayMessageReader;
class word;
}  // namespace capnp
namespace kj {
template <typename T>
class Array;
}  // namespace kj

namespace troupe::schemas {

/// What read_frame() accepts.
struct FrameLimits {
  size_t max_bytes = 64u << 20;  // bytes: the whole frame, segment table included
  uint32_t max_segments = 512;   // segments; Cap'n Proto's own stream reader allows 512
  /// Traversal limit = traversal_factor * frame size in words + 1024: a reader may visit each
  /// word this many times (plus a little, for re-reading small structs) before Cap'n Proto
  /// stops it; the defence against messages whose pointers alias the same bytes to look far
  /// larger than they are.
  uint32_t traversal_factor = 4;
  int nesting_limit = 16;  // levels of struct/list nesting; our schemas use fewer than 8
};

/// The message as one flat frame. Copies every segment (external data too): use frame_gather()
/// to send large tensors without the copy.
kj::Array<capnp::word> to_frame(capnp::MessageBuilder& message);

/// The same frame as a segment table plus the message's own segments, for a gather send
/// (UCX iov). Nothing is copied: `segments` point into the builder (and into buffers attached
/// with set_tensor_external()), so they are valid until the builder changes or is destroyed.
struct FrameGather {
  std::vector<uint32_t> table;                     // segment table: count - 1, sizes in words, pad
  std::vector<std::span<const uint8_t>> segments;  // each segment's bytes, in order
  std::span<const uint8_t> table_bytes() const {
    return {reinterpret_cast<const uint8_t*>(table.data()), table.size() * sizeof(uint32_t)};
  }
  /// Bytes of the whole frame: table then segments.
  size_t size_bytes() const;
};
FrameGather frame_gather(capnp::MessageBuilder& message);

/// Validates a frame from an untrusted peer and returns a reader of it.
/// Checks, before Cap'n Proto sees the bytes: size <= limits.max_bytes (Errc::kOversized), a
/// whole number of words and a segment table that fits (Errc::kTruncated), 1..max_segments
/// segments, a non-empty first segment and no trailing bytes (Errc::kBadSegmentTable); then that
/// the root is an in-bounds struct (Errc::kMalformed). Never throws.
/// The reader references `frame`, which must outlive it, unless `frame` is not 8-byte aligned:
/// then the frame is copied into storage the reader owns (Cap'n Proto requires aligned words).
/// NOTE: Cap'n Proto checks pointers lazily, so typed getters on the reader may still throw
/// kj::Exception on a hostile message: read it inside schemas::guard() (tensor_codec.h).
Result<std::unique_ptr<capnp::FlatArrayMessageReader>> read_frame(std::span<const uint8_t> frame,
                                                                  const FrameLimits& limits);
/// As above with default limits but max_bytes.
Result<std::unique_ptr<capnp::FlatArrayMessageReader>> read_frame(std::span<const uint8_t> frame,
                                                                  size_t max_bytes);

}  // namespace troupe::schemas
