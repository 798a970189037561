// Wire codec of the actor messages: StepBatch (+ hidden states) <-> BatchDescriptor, StepOutcome
// <-> StepResult, ExpertRequest <-> ExpertDispatch / ExpertCombine (schemas/step.capnp and
// schemas/expert.capnp), and the image messages EncodeImage / EncodedImage (schemas/encoder.capnp).
// Users: the cross-host links of actors/ (stage, scheduler, expert shard, image encoder).
// No CAF or Cap'n Proto types here: the message structs of messages.h are forward-declared.
// Thread safety: free functions with no shared state; a WireFrame is immutable once built.
//
// Mapping notes (in-process field <-> wire field):
// - StepBatch.epoch <-> Header.clusterEpoch (>= 1); step_id <-> stepId; microbatch <-> microbatch.
//   attempt and deadlineMs have no in-process home: they travel in SendInfo / DecodedStep.
// - SeqWork.seq_id <-> SequenceStep.seqId (UInt32); requestId = seq_id + 1 on encode (the schema
//   makes 0 invalid); decode checks requestId != 0 and otherwise ignores it.
// - SeqWork.blocks <-> ONE BlockTable whose `stage` is the receiving stage: in-process, every
//   stage of a pipeline shares the scheduler's block ids. Decode reads the table of its own stage
//   and ignores tables of other stages.
// - sample <-> sample; want_logits <-> returnLogits; logits mode = last when either is set, else
//   none (troupe's last stage computes only the last row). Decode rejects mode `all` as
//   unsupported, and sample or returnLogits with mode none as invalid.
// - SeqWork.rng <-> samplerState (all-zero is rejected); history <-> penaltyHistory, truncated
//   to the last penalty_last_n tokens (all for -1, none when the penalties are off): the sampler
//   reads only that window (compute/sampler.cc penalize()), so the drawn token is unchanged.
// - compute::SamplingParams <-> SamplingParams field by field, except stop_strings (the router
//   keeps them; decoded params have none) and numLogprobs (no C++ home: encoded 0, and a
//   non-zero value is rejected as unsupported).
// - ExpertRequest <-> ExpertDispatch: one wire row per (token, expert) pair; the expert id of
//   each row is experts[t] repeated rows[t] times, and decode turns runs of equal ids back into
//   tasks (so zero-row tasks vanish and adjacent tasks of one expert merge). tokenIdx, slots and
//   weights stay EMPTY: troupe's engine weights and sums the expert outputs itself, in a fixed
//   order, so the shard returns UNWEIGHTED outputs (ExpertCombine.outputs = expert(row), as
//   schemas/expert.capnp documents). Decode rejects a dispatch that carries weights.
// - Errors (StepOutcome.error, ExpertRequest.error) <-> ErrorReport{domain "actors", code 0,
//   message truncated to kMaxErrorBytes}; compute_seconds <-> computeNs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/result.h"

namespace troupe::actors {

struct StepBatch;
struct StepOutcome;
struct ExpertRequest;
// The same aliases as actors/interfaces.h (a redeclaration naming the same type is allowed).
using StepBatchPtr = std::shared_ptr<const StepBatch>;
using HiddenPtr = std::shared_ptr<const std::vector<float>>;  // f32 [num_tokens, n_embd]
using StepOutcomePtr = std::shared_ptr<const StepOutcome>;
using ExpertRequestPtr = std::shared_ptr<ExpertRequest>;

namespace detail {

/// Error codes of the codec's content checks, in troupe::Error::code. Frame, header and tensor
/// failures keep their schemas::Errc value (1..12, schemas/errc.h); these start at 64 so the two
/// never collide. Numbers are pinned: never reuse or renumber one.
enum class WireErrc : uint8_t {
  /// A field's value is out of range or inconsistent with another (token id, block table, ...).
  kInvalid = 64,
  /// A list is longer than the receiver's limit.
  kTooLong = 65,
  /// Valid on the wire, but troupe cannot honour it (image splices, logprobs, weighted experts).
  kUnsupported = 66,
  /// Encoder: an in-process value has no wire form (a negative id, a field that overflows).
  kUnencodable = 67,
  /// The receiver cannot act on it now (the actor it names is not running there): try again,
  /// there or elsewhere. Carried in ErrorReport.code of an answer (EncodedImage).
  kUnavailable = 68,
};
const char* to_string(WireErrc e);
constexpr int code(WireErrc e) { return static_cast<int>(e); }

/// Messages carry ErrorReport.message up to this many bytes; longer text is cut.
inline constexpr size_t kMaxErrorBytes = 1024;

/// Mirrors schemas::Role (common.capnp) value for value (checked in wire.cc).
enum class ActorRole : uint16_t {
  kUnknown = 0,  // never valid on the wire
  kController = 1,
  kRouter = 2,
  kScheduler = 3,
  kStage = 4,
  kExpertShard = 5,
  kKvManager = 6,
  kEncoder = 7,
  kNodeDaemon = 8,
  kGateway = 9,
};

/// One actor instance (common.capnp ActorId), printed `role/index@node`.
struct ActorRef {
  uint32_t node = 0;
  ActorRole role = ActorRole::kUnknown;
  uint32_t index = 0;
  bool operator==(const ActorRef&) const = default;
};

/// What a sender adds to every message besides its content.
struct SendInfo {
  ActorRef sender;       // Header.sender; role must be known
  uint64_t seq = 0;      // Header.seq: per-link sequence number, >= 1
  uint32_t attempt = 0;  // the messages' `attempt`: 0 on the first try, +1 per retry of a step
};

/// A decoded Header (already checked: seq >= 1, known role, epoch >= 1 and as expected).
struct WireHeader {
  uint64_t cluster_epoch = 0;
  ActorRef sender;
  uint64_t seq = 0;
};

/// An encoded message, ready for a gather send. Holds the Cap'n Proto builder and whatever its
/// external payloads point into (the hidden states or expert rows), so nothing is copied.
/// Copies share the same frame. Immutable; any thread may read it.
class WireFrame {
 public:
  struct Impl;  // wire.cc
  WireFrame() = default;
  explicit WireFrame(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

  /// The frame as gather pieces: the segment table, then every segment in order. The large
  /// tensor of a step or dispatch is one piece that points into the caller's buffer. Valid as
  /// long as this WireFrame (or a keep_alive()) lives. Empty for a default-constructed frame.
  const std::vector<std::span<const uint8_t>>& iov() const;
  /// Bytes of the whole frame (the sum of iov() sizes).
  size_t size_bytes() const;
  /// The frame as one contiguous copy (tests, persistence, small messages).
  std::vector<uint8_t> flatten() const;
  /// Keeps the frame, and the buffers it references, alive: a transport holds it until an
  /// asynchronous send completes, then drops it.
  std::shared_ptr<const void> keep_alive() const { return impl_; }

 private:
  std::shared_ptr<const Impl> impl_;
};

// ---- Steps: scheduler -> stage 0 -> ... -> last stage ------------------------------------------

/// Encodes `batch` as the BatchDescriptor sent to pipeline stage `stage`. hidden: f32
/// [sum of tokens, n_embd], referenced in place (not copied; kept alive by the frame) when its
/// byte size is a whole number of 8-byte words or its capacity covers the padding, else copied;
/// null for stage 0 (required), non-null for every later stage (required).
/// Errors (WireErrc::kUnencodable or kInvalid): a field out of its wire range (negative ids,
/// seq_id >= 2^32, microbatch < 0), epoch or seq 0, hidden of the wrong size.
Result<WireFrame> encode_step(const StepBatch& batch, HiddenPtr hidden, int64_t n_embd,
                              uint32_t stage, const SendInfo& send);

/// What the receiving stage accepts.
struct StepLimits {
  int64_t n_embd = 0;           // hidden row width (required, >= 1)
  int64_t n_vocab = 0;          // token ids in [0, n_vocab) (required, >= 1)
  int64_t block_size = 0;       // KV tokens per block (required, >= 1)
  int64_t max_positions = 0;    // context length: pos0 + count <= max_positions (required)
  int64_t num_kv_blocks = 0;    // block ids in [0, num_kv_blocks); 0: only ids >= 0 are checked
  int64_t num_state_slots = 0;  // recurrent state slots in [0, num_state_slots); 0: none (-1 only)
  uint64_t expected_epoch = 0;  // receiver's epoch; 0 skips the stale/future check (not the != 0)
  size_t max_seqs = 1024;       // sequences per step
  size_t max_step_tokens = 65536;  // new tokens per step, summed over sequences
  size_t max_stages = 64;          // block tables per sequence
  size_t max_stop_tokens = 1024;   // SamplingParams.stopTokenIds
  size_t max_frame_bytes = size_t{1} << 30;
};

struct DecodedStep {
  WireHeader header;
  uint32_t stage = 0;  // receiving stage (the block tables read were this stage's)
  uint32_t attempt = 0;
  uint32_t deadline_ms = 0;  // 0 = no deadline
  StepBatchPtr batch;        // usable exactly like the sender's (sampling, history shared_ptrs)
  HiddenPtr hidden;          // f32 [sum of tokens, n_embd]; null at stage 0. A copy of the frame.
};

/// Decodes and fully validates a BatchDescriptor from an untrusted peer: frame and header; every
/// list length against `limits`; per sequence requestId != 0, count >= 1 and tokenIds of that
/// length, ids in [0, n_vocab) or -1 (an image position), pos0 + count <= max_positions, this
/// stage's block table present once and covering pos0 + count at block_size (and no longer than
/// max_positions needs), block ids in range, logits mode none or last (sample and returnLogits need
/// last; all is unsupported), sampling params present when sampling and valid
/// (compute::SamplingParams::validate()), a non-zero sampler state, a penalty history no longer
/// than penaltyLastN; at stage 0 one f32 [run length, n_embd] splice per run of image positions, at
/// its start (their rows become SeqWork::image_rows), none at later stages; the hidden tensor
/// absent at stage 0, else f32 [sum of counts, n_embd]. Error messages are one line: what,
/// expected, got. Never throws. `frame` need not outlive the result.
Result<DecodedStep> decode_step(std::span<const uint8_t> frame, const StepLimits& limits);

// ---- Step outcomes: last stage -> scheduler ----------------------------------------------------

/// Encodes `out` as a StepResult. Each SeqResult's logits are empty or f32 [n_vocab]; the
/// non-empty ones are copied, in order, into StepResult.logits f32 [rows, n_vocab]. A non-empty
/// `out.error` becomes the ErrorReport and no sequences are sent (the schema's rule).
/// Errors: WireErrc::kUnencodable for a logits row of the wrong size, ids out of range, epoch 0.
Result<WireFrame> encode_step_outcome(const StepOutcome& out, int64_t n_vocab,
                                      const SendInfo& send);

struct OutcomeLimits {
  int64_t n_vocab = 0;          // required, >= 1
  uint64_t expected_epoch = 0;  // 0 skips the stale/future check
  size_t max_seqs = 1024;
  size_t max_frame_bytes = size_t{1} << 30;
};

struct DecodedOutcome {
  WireHeader header;
  uint32_t attempt = 0;
  StepOutcomePtr outcome;  // error set from ErrorReport (never empty when the report is set)
};

/// Decodes and validates a StepResult: sampled token in [-1, n_vocab), non-zero sampler state,
/// at most one logits row per sequence (troupe returns the last row only), rows inside the
/// logits tensor, which is f32 [rows, n_vocab]; no sequences when an error is reported.
/// Never throws.
Result<DecodedOutcome> decode_step_outcome(std::span<const uint8_t> frame,
                                           const OutcomeLimits& limits);

// ---- Experts: stage -> expert shard -> stage ---------------------------------------------------

/// The step an expert exchange belongs to (ExpertRequest does not carry it).
struct ExpertStep {
  uint64_t epoch = 0;  // Header.clusterEpoch, >= 1
  uint64_t step_id = 0;
  uint32_t microbatch = 0;
  bool operator==(const ExpertStep&) const = default;
};

/// Encodes req's layer, tasks and x (f32 [sum rows, n_embd], referenced in place and kept alive
/// through `req`) as an ExpertDispatch; tokenIdx, slots and weights are left empty (unweighted,
/// see the notes at the top). Errors: kUnencodable for mismatched experts/rows, a negative
/// expert, layer or row count, or x of the wrong size.
Result<WireFrame> encode_expert_dispatch(ExpertRequestPtr req, int64_t n_embd,
                                         const ExpertStep& step, const SendInfo& send);

struct DispatchLimits {
  int64_t n_embd = 0;              // required
  int64_t n_layer = 0;             // layer in [0, n_layer) (required)
  std::span<const int32_t> owned;  // the experts this shard owns; any other id is rejected
  uint64_t expected_epoch = 0;     // 0 skips the stale/future check
  size_t max_rows = 65536;         // rows per dispatch
  size_t max_frame_bytes = size_t{1} << 30;
};

struct DecodedDispatch {
  WireHeader header;
  ExpertStep step;
  uint32_t attempt = 0;
  /// layer, experts, rows and x (copied out of the frame) set; y sized like x, zero-filled;
  /// done is a fresh Latch(1) that the transport may replace to learn of completion.
  ExpertRequestPtr request;
};

/// Decodes and validates an ExpertDispatch: layer range, rows f32 [numRows, n_embd], expertIds
/// of numRows entries each owned by this shard, tokenIdx/slots empty or of numRows entries,
/// weights empty (kUnsupported otherwise). Never throws.
Result<DecodedDispatch> decode_expert_dispatch(std::span<const uint8_t> frame,
                                               const DispatchLimits& limits);

/// Encodes the shard's answer to `req`: y (f32 [sum rows, n_embd], unweighted, referenced in
/// place) as ExpertCombine.outputs, or, when req->error is set, the ErrorReport and no outputs.
Result<WireFrame> encode_expert_combine(ExpertRequestPtr req, int64_t n_embd,
                                        const ExpertStep& step, const SendInfo& send,
                                        double compute_seconds);

struct CombineLimits {
  int64_t n_embd = 0;           // required
  size_t expected_rows = 0;     // rows of the dispatch this answers; 0: any (caller checks y)
  uint64_t expected_epoch = 0;  // 0 skips the stale/future check
  size_t max_frame_bytes = size_t{1} << 30;
};

struct DecodedCombine {
  WireHeader header;
  ExpertStep step;
  uint32_t attempt = 0;
  uint32_t layer = 0;
  std::vector<float> y;  // f32 [rows, n_embd] (rows = expected_rows unless 0); empty on error
  std::string error;     // the shard's ErrorReport message, never empty when reported
  double compute_seconds = 0;
};

/// Decodes and validates an ExpertCombine: outputs f32 [expected_rows, n_embd] unless an error
/// is reported (then outputs must be absent). With expected_rows 0, any number of rows is
/// accepted and the caller checks y.size() against its dispatch. The caller checks step/layer
/// against its dispatch. Never throws.
Result<DecodedCombine> decode_expert_combine(std::span<const uint8_t> frame,
                                             const CombineLimits& limits);

// ---- Images: head -> encoder node -> head (schemas/encoder.capnp) ------------------------------

/// The most bytes of one image file a node accepts (as ClientLimits::max_image_bytes).
inline constexpr size_t kMaxImageFileBytes = size_t{32} << 20;
/// EncodeImage.what is cut to this many bytes.
inline constexpr size_t kMaxImageWhatBytes = 64;

/// One image for an encoder instance (EncodeImage).
struct ImageJobWire {
  uint64_t job_id = 0;                       // >= 1
  uint32_t encoder = 0;                      // EncoderPlacement.index
  std::shared_ptr<const std::string> image;  // the file's bytes, referenced until sent
  std::string what;                          // "image 2"
};

/// Encodes `job` (the image bytes copied into the frame). Errors: kUnencodable for job id 0, no
/// image, or an image over kMaxImageFileBytes.
Result<WireFrame> encode_encode_image(const ImageJobWire& job, uint64_t epoch,
                                      const SendInfo& send);

struct EncodeImageLimits {
  uint32_t num_encoders = 0;  // encoder index < this (required: the placement's count)
  uint64_t expected_epoch = 0;
  size_t max_image_bytes = kMaxImageFileBytes;
  size_t max_frame_bytes = kMaxImageFileBytes + (size_t{1} << 20);
};

struct DecodedEncodeImage {
  WireHeader header;
  ImageJobWire job;  // the image copied out of the frame
};

/// Decodes and validates an EncodeImage: job id >= 1, encoder index in range, an image of 1 to
/// max_image_bytes bytes, `what` at most kMaxImageWhatBytes (longer is cut). Never throws.
Result<DecodedEncodeImage> decode_encode_image(std::span<const uint8_t> frame,
                                               const EncodeImageLimits& limits);

/// An encoder's answer (EncodedImage): rows f32 [n_rows, n_embd], or an error.
struct ImageRowsWire {
  uint64_t job_id = 0;
  std::shared_ptr<const std::vector<float>> rows;  // referenced in place; null with an error
  std::string error;                               // "" = ok
  bool retry = false;     // with an error: the instance is not running here (yet); try again
  double seconds = 0;     // spent decoding and encoding
  bool accepted = false;  // a receipt: the job reached its instance (no rows, no error)
};

/// Encodes `r`: a receipt (accepted: nothing else is written), or rows that must be n_rows x
/// n_embd finite floats unless r.error is set (else kUnencodable: the caller sends an error
/// answer instead).
Result<WireFrame> encode_encoded_image(const ImageRowsWire& r, int64_t n_rows, int64_t n_embd,
                                       uint64_t epoch, const SendInfo& send);

struct EncodedImageLimits {
  int64_t n_rows = 0;  // tokens per image (required)
  int64_t n_embd = 0;  // the text model's width (required)
  uint64_t expected_epoch = 0;
  size_t max_frame_bytes = size_t{1} << 30;
};

struct DecodedEncodedImage {
  WireHeader header;
  uint64_t job_id = 0;
  std::vector<float> rows;  // f32 [n_rows, n_embd]; empty with an error
  std::string error;        // never empty when reported
  bool retry = false;       // ErrorReport.code kImageRetry: not the image's fault
  double seconds = 0;
  bool accepted = false;  // a receipt (rows and error absent)
};

/// EncodedImage.error.code of an answer to try again elsewhere (retry); 0 for a bad image.
inline constexpr uint16_t kImageRetry = static_cast<uint16_t>(WireErrc::kUnavailable);

/// The checked header of an EncodedImage (its sender names the encoder instance), without
/// reading the rows: where to route it; and its job id in *job_id when given (0 if absent), so
/// that an answer whose rows do not decode can still end its job. Never throws.
Result<WireHeader> peek_encoded_image(std::span<const uint8_t> frame,
                                      size_t max_frame_bytes = size_t{1} << 30,
                                      uint64_t* job_id = nullptr);

/// Decodes and validates an EncodedImage: job id >= 1; a receipt (accepted) carries neither rows
/// nor an error; otherwise rows f32 [n_rows, n_embd] with every value finite, unless an error is
/// reported (then rows must be absent). Never throws.
Result<DecodedEncodedImage> decode_encoded_image(std::span<const uint8_t> frame,
                                                 const EncodedImageLimits& limits);

}  // namespace detail
}  // namespace troupe::actors
