// Helpers over the generated message types: write a Tensor field without copying its payload,
// read one into a validated TensorView, write and check the Header every message carries, and
// guard() typed reads of untrusted messages.
// Users: .cc files in actors/ and transport/ only. This header includes the generated
// schemas/common.capnp.h, so no other header may include it (STYLE.md "Header hygiene"); code
// elsewhere takes a TensorView (schemas/tensor_view.h) or frames (schemas/frame.h).
// Thread safety: free functions; builders and readers follow Cap'n Proto's rules (one thread).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <type_traits>

#include <kj/exception.h>

#include "base/result.h"
#include "schemas/common.capnp.h"
#include "schemas/errc.h"
#include "schemas/tensor_view.h"

namespace troupe::schemas {

// ---- Tensor fields ----------------------------------------------------------------------------

/// Writes dtype and shape and makes dst.data reference `data` in place: the bytes become a
/// segment of the message, so frame_gather() sends them without a copy.
/// REQUIRES (checked, Errc::kMisaligned): data.data() 8-byte aligned (Cap'n Proto segments are
/// word arrays), and `readable_bytes` (default data.size()) >= data.size() rounded up to 8,
/// because Cap'n Proto reads the last word whole; any padding bytes travel on the wire.
/// Also checked: a known dtype (Errc::kUnknownDtype) and a shape that matches data.size()
/// (Errc::kBadShape). Nothing is written on error.
/// Ownership: `data` must stay valid and unchanged until the MessageBuilder is destroyed.
Status set_tensor_external(Tensor::Builder dst, TensorDtype dtype, std::span<const uint64_t> shape,
                           std::span<const uint8_t> data, size_t readable_bytes = 0);

/// As set_tensor_external() but copies `data` into the message: any alignment and size.
Status set_tensor_copy(Tensor::Builder dst, TensorDtype dtype, std::span<const uint64_t> shape,
                       std::span<const uint8_t> data);

/// Validates a Tensor read from a message and returns a view of its payload in place (zero
/// copy; the view is valid while the message's buffer is). Errors: Errc::kUnknownDtype,
/// kBadShape, kMisaligned (only with opts.copy_if_misaligned = false), kBulkPayload (the
/// payload travels as a bulk transfer: validate the received bytes with make_tensor_view()),
/// kMalformed (Cap'n Proto rejected the field). Never throws.
Result<TensorView> read_tensor(Tensor::Reader src, const TensorReadOptions& opts = {});

// ---- Header -----------------------------------------------------------------------------------

/// The Header of a message as plain values.
struct HeaderFields {
  uint64_t cluster_epoch = 0;  // >= 1
  uint32_t node = 0;           // sender's node id; 0 only before joining
  Role role = Role::UNKNOWN;   // sender's role
  uint32_t index = 0;          // sender's index within its role
  uint64_t seq = 0;            // per-link sequence number, >= 1
};

void set_header(Header::Builder dst, const HeaderFields& fields);

/// Reads and checks a Header. Errc::kBadHeader: seq 0, role unknown (or unknown to this build),
/// epoch 0 when an epoch is expected. With expected_epoch != 0: a smaller epoch is
/// Errc::kStaleEpoch (drop the message), a larger one Errc::kFutureEpoch (the receiver is
/// behind). expected_epoch = 0 skips the epoch checks (JoinRequest). Never throws.
Result<HeaderFields> read_header(Header::Reader src, uint64_t expected_epoch);

// ---- Guarding typed reads ---------------------------------------------------------------------

/// The Error for a kj::Exception raised while reading `what` (Errc::kMalformed).
Error malformed_error(std::string_view what, const kj::Exception& e);

/// Runs fn() and turns a kj::Exception (Cap'n Proto found a bad pointer, or the traversal limit
/// ran out, while fn read an untrusted message) into an Errc::kMalformed Error naming `what`.
/// fn returns a Result<T> (or Status); guard returns the same type.
///   auto st = schemas::guard("BatchDescriptor", [&]() -> Status { ... getSequences() ... });
template <class F>
auto guard(std::string_view what, F&& fn) -> std::invoke_result_t<F&> {
  try {
    return fn();
  } catch (const kj::Exception& e) {
    return malformed_error(what, e);
  }
}

}  // namespace troupe::schemas
