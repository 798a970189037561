// Errc: the error codes of schemas/ (frame, header and tensor validation), carried in
// troupe::Error::code by the codec functions. actors/ maps them to caf::error.
// Header-only, no dependencies; safe to include from any folder.
#pragma once

#include <cstdint>

namespace troupe::schemas {

/// Numbers are pinned: never reuse or renumber one (STYLE.md "Errors").
enum class Errc : uint8_t {
  /// The frame is shorter than its segment table says, or not a whole number of 8-byte words.
  kTruncated = 1,
  /// The frame is larger than the receiver's limit.
  kOversized = 2,
  /// The segment table is malformed: too many segments, an empty first segment, trailing bytes.
  kBadSegmentTable = 3,
  /// Cap'n Proto rejected the message structure: out-of-bounds or wrong-kind pointer, traversal
  /// or nesting limit exceeded.
  kMalformed = 4,
  /// A tensor's dtype is unset or unknown to this build.
  kUnknownDtype = 5,
  /// A tensor's shape is empty, too deep or overflows, or disagrees with its data size.
  kBadShape = 6,
  /// Tensor data is not aligned as required (and copying it was not allowed).
  kMisaligned = 7,
  /// A tensor's payload is a bulk transfer that the transport has not resolved.
  kBulkPayload = 8,
  /// The message's cluster epoch is older than the receiver's: drop it.
  kStaleEpoch = 9,
  /// The message's cluster epoch is newer than the receiver's: the receiver is behind.
  kFutureEpoch = 10,
  /// The header is missing or has an unset or invalid field.
  kBadHeader = 11,
  /// A valid tensor has a dtype or shape other than the receiver expects.
  kShapeMismatch = 12,
};

inline const char* to_string(Errc e) {
  switch (e) {
    case Errc::kTruncated:
      return "truncated";
    case Errc::kOversized:
      return "oversized";
    case Errc::kBadSegmentTable:
      return "bad_segment_table";
    case Errc::kMalformed:
      return "malformed";
    case Errc::kUnknownDtype:
      return "unknown_dtype";
    case Errc::kBadShape:
      return "bad_shape";
    case Errc::kMisaligned:
      return "misaligned";
    case Errc::kBulkPayload:
      return "bulk_payload";
    case Errc::kStaleEpoch:
      return "stale_epoch";
    case Errc::kFutureEpoch:
      return "future_epoch";
    case Errc::kBadHeader:
      return "bad_header";
    case Errc::kShapeMismatch:
      return "shape_mismatch";
  }
  return "unknown";
}

/// The value stored in troupe::Error::code.
constexpr int code(Errc e) { return static_cast<int>(e); }

}  // namespace troupe::schemas
