// What the wire fuzzer (wire_fuzz.cc) and its seed writer (wire_fuzz_seeds.cc) share: which
// decoder an input goes to (its first byte) and the limits every decoder is called with, so
// that the seeds are valid frames for exactly those limits.
#pragma once

#include <cstdint>
#include <vector>

#include "actors/detail/control_wire.h"
#include "actors/detail/wire.h"
#include "tests/actors/control_wire_samples.h"

namespace troupe::actors::detail::fuzz {

/// An input is one selector byte (modulo kNumDecoders), then the frame.
enum class Decoder : uint8_t {
  kJoinRequest,
  kJoinReply,
  kHeartbeat,
  kHeartbeatAck,
  kMembership,
  kPlacement,
  kPlacementReport,
  kLeaveNotice,
  kActorRestart,
  kStatusRequest,
  kStatusSnapshot,
  kGenerateRequest,
  kCancelRequest,
  kGenerateEvent,
  kStep,
  kStepOutcome,
  kExpertDispatch,
  kExpertCombine,
  kEncodeImage,
  kEncodedImage,
  kPeekEncodedImage,  // peek_encoded_image: the header of an EncodedImage only
};
inline constexpr int kNumDecoders = 21;

inline constexpr uint64_t kEpoch = samples::kEpoch;  // the samples' epoch
inline constexpr int64_t kVocab = 64;
inline constexpr int64_t kEmbd = 8;
inline constexpr int64_t kBlockSize = 4;
inline constexpr int64_t kLayers = 8;

inline ControlLimits control_limits() { return {.expected_epoch = kEpoch}; }
inline ClientLimits client_limits() { return {.n_vocab = kVocab, .expected_epoch = kEpoch}; }
inline StepLimits step_limits() {
  StepLimits l;
  l.n_embd = kEmbd;
  l.n_vocab = kVocab;
  l.block_size = kBlockSize;
  l.max_positions = 256;
  l.num_kv_blocks = 64;
  l.expected_epoch = kEpoch;
  return l;
}
inline OutcomeLimits outcome_limits() {
  OutcomeLimits l;
  l.n_vocab = kVocab;
  l.expected_epoch = kEpoch;
  return l;
}
inline const std::vector<int32_t>& owned_experts() {
  static const std::vector<int32_t> owned = {1, 4, 6, 8};
  return owned;
}
inline DispatchLimits dispatch_limits() {
  DispatchLimits l;
  l.n_embd = kEmbd;
  l.n_layer = kLayers;
  l.owned = owned_experts();
  l.expected_epoch = kEpoch;
  return l;
}
inline CombineLimits combine_limits() {
  CombineLimits l;
  l.n_embd = kEmbd;
  l.expected_epoch = kEpoch;
  return l;
}

inline EncodeImageLimits encode_image_limits() {
  EncodeImageLimits l;
  l.num_encoders = 2;
  l.expected_epoch = kEpoch;
  l.max_image_bytes = 4096;  // small, so that the fuzzer reaches the limit
  return l;
}
inline constexpr int64_t kImageRows = 4;  // tokens per image
inline EncodedImageLimits encoded_image_limits() {
  EncodedImageLimits l;
  l.n_rows = kImageRows;
  l.n_embd = kEmbd;
  l.expected_epoch = kEpoch;
  return l;
}

}  // namespace troupe::actors::detail::fuzz
