// In-process message types of the actor system (private to actors/). Within one process these
// move between actors as shared pointers: no serialization, no tensor copies. The atoms and the
// interfaces that carry them are in actors/interfaces.h; no CAF here (wire.cc needs none). Their
// cross-host form is the Cap'n Proto schema in schemas/ (step.capnp, expert.capnp).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "actors/local_cluster.h"
#include "compute/engine.h"
#include "compute/kv_block_manager.h"
#include "compute/sampler.h"

namespace troupe::actors {

/// One sequence's share of a pipeline step.
struct SeqWork {
  int64_t seq_id = 0;
  int64_t pos0 = 0;             // positions [0, pos0) are in the KV cache
  std::vector<int32_t> tokens;  // new tokens at pos0 ...
  std::vector<int32_t> blocks;  // block table covering [0, pos0 + tokens.size())
  bool sample = false;          // the last stage samples the next token
  bool want_logits = false;     // return the sampled row's logits (tests, eval)
  std::shared_ptr<const compute::SamplingParams> sampling;
  compute::SamplerState rng;  // the request's RNG state before this sample
  std::shared_ptr<const std::vector<int32_t>> history;  // prompt + generated (penalties)
  /// The reply's tokens so far, when the request has a grammar (compute/grammar_sampling.h).
  std::shared_ptr<const std::vector<int32_t>> output;
  /// f32 [number of SeqStep::kEmbedded tokens in `tokens`, n_embd]: their input rows, for the
  /// stage that embeds; null when the step has no image positions.
  std::shared_ptr<const std::vector<float>> image_rows;
  bool non_causal = false;  // the tokens see all of the step's positions (a Gemma 3 image)
  // The sequence's recurrent state slot, the same at every stage (models with linear-attention
  // layers; compute::SeqStep::state); -1: the model keeps none.
  int32_t state = -1;
};

/// A step descriptor, shared read-only by every stage it passes through.
struct StepBatch {
  uint64_t epoch = 0;  // scheduler epoch: outcomes of an older epoch are dropped
  uint64_t step_id = 0;
  int32_t microbatch = 0;
  std::vector<SeqWork> seqs;
};
// The pointer aliases are the same as actors/interfaces.h's (a redeclaration naming the same type
// is allowed).
using StepBatchPtr = std::shared_ptr<const StepBatch>;
using HiddenPtr = std::shared_ptr<const std::vector<float>>;  // f32 [num_tokens, n_embd]

struct SeqResult {
  int64_t seq_id = 0;
  int32_t token = -1;         // sampled token, -1 when the step did not sample
  compute::SamplerState rng;  // RNG state after the sample
  std::vector<float> logits;  // f32 [n_vocab] when want_logits
  /// Non-empty: this sequence cannot go on (its grammar allows no token, ...); it ends with this
  /// error while the rest of the step stands.
  std::string error;
};

struct StepOutcome {
  uint64_t epoch = 0;
  uint64_t step_id = 0;
  int32_t microbatch = 0;
  std::vector<SeqResult> results;  // one per SeqWork, same order
  std::string error;               // non-empty: the step failed (the scheduler recomputes)
  double compute_seconds = 0;      // summed over the stages: time inside Engine::step
};
using StepOutcomePtr = std::shared_ptr<const StepOutcome>;

/// A one-shot completion flag the stage thread waits on while expert shards compute.
class Latch {
 public:
  explicit Latch(int count) : count_(count) {}
  /// With `on_zero`: called once, on the thread whose count_down() reaches zero (a node daemon
  /// uses it to send an expert shard's answer back over the network).
  Latch(int count, std::function<void()> on_zero) : count_(count), on_zero_(std::move(on_zero)) {}
  void count_down() {
    std::function<void()> fire;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (--count_ == 0) {
        cv_.notify_all();
        fire = std::move(on_zero_);
      }
    }
    if (fire) fire();
  }
  template <class Dur>
  bool wait_for(Dur d) {
    std::unique_lock<std::mutex> lk(mu_);
    return cv_.wait_for(lk, d, [&] { return count_ <= 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int count_;
  std::function<void()> on_zero_;
};

/// Rows of one MoE layer for one expert shard. The shard owns nothing here: it reads x and writes
/// y (request-owned buffers, so a stage that timed out never sees late writes into its scratch).
struct ExpertRequest {
  int64_t layer = 0;
  std::vector<int32_t> experts;  // per task
  std::vector<int64_t> rows;     // per task: number of rows
  std::vector<float> x;          // f32 [sum rows, n_embd]
  std::vector<float> y;          // f32 [sum rows, n_embd], filled by the shard
  std::string error;             // set by the shard on failure
  std::shared_ptr<Latch> done;
  std::atomic<bool> answered{false};  // set by the first answer (answer_request / fail_request)
};
using ExpertRequestPtr = std::shared_ptr<ExpertRequest>;

/// Answers the request: counts its latch down, once. Whoever holds a request may answer it (the
/// shard that computed it, a proxy whose link went down, the guard below); later answers are
/// ignored, so the latch of a stage waiting on several shards is never counted down twice.
inline void answer_request(ExpertRequest& r) {
  if (!r.answered.exchange(true)) r.done->count_down();
}
/// Answers the request with an error (ignored when it was answered already).
inline void fail_request(ExpertRequest& r, const std::string& why) {
  if (r.answered.exchange(true)) return;
  r.error = why;
  r.done->count_down();
}

/// The pointer to send to an expert shard (or its proxy): it shares the request but owns a guard
/// that fails the request with `why` when the last copy of this pointer goes away unanswered -- the
/// message was dropped in a stopped shard's mailbox, a proxy stopped with it pending, the receiver
/// was already gone. The sender keeps its own plain pointer to read the answer. Without the guard
/// the waiting stage would wait out its expert timeout for an answer that can never come (and a
/// node could not exit until then).
inline ExpertRequestPtr guard_request(ExpertRequestPtr r, std::string why) {
  struct Guard {
    Guard(ExpertRequestPtr req, std::string reason) : r(std::move(req)), why(std::move(reason)) {}
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;
    ~Guard() { fail_request(*r, why); }
    ExpertRequestPtr r;
    std::string why;
  };
  ExpertRequest* raw = r.get();
  auto g = std::make_shared<Guard>(std::move(r), std::move(why));
  return ExpertRequestPtr(std::move(g), raw);
}

/// A request as the scheduler sees it: tokens in, token events out.
struct SeqRequest {
  int64_t seq_id = 0;
  std::vector<int32_t> prompt;
  int64_t max_tokens = 0;
  std::shared_ptr<const compute::SamplingParams> sampling;
  std::vector<int32_t> eos_ids;  // end-of-generation tokens of the vocabulary
  bool want_logits = false;
  /// The prompt's images (its tokens equal `prompt`'s first tokens); null without images.
  std::shared_ptr<const compute::MultimodalPrompt> images;
  // A resubmission after a scheduler or router failure. The request was admitted once already,
  // so it bypasses the queue limit. `prompt` ends with the num_generated tokens sampled before
  // the failure, `max_tokens` counts only the rest, and `rng` is the sampler state after the last
  // of them (all zero: start from sampling->seed); with num_generated > 0, a prompt that reached
  // max_model_len finishes as "length" (only its finish event was lost).
  bool replay = false;
  int64_t num_generated = 0;
  compute::SamplerState rng;
};
using SeqRequestPtr = std::shared_ptr<const SeqRequest>;

/// What the scheduler reports to the router for each sampled token.
struct TokenEvent {
  int64_t seq_id = 0;
  int32_t token = -1;
  bool finished = false;
  std::string finish_reason;  // "length", "eos", "stop", "cancelled", "error", ...
  std::string error;
  std::vector<float> logits;  // when requested
  compute::SamplerState rng;  // after sampling `token`: a replay continues from it
};
using TokenEventPtr = std::shared_ptr<const TokenEvent>;

/// One piece the router streams to its client. Besides the text it carries what the client needs
/// to resume the request at a new router if this one fails (the router holds the token logs).
struct StreamPiece {
  std::string delta;          // text safe to show now (may be empty)
  int32_t token = -1;         // the generated token; -1: text flushed at the end
  std::vector<float> logits;  // f32 [n_vocab] of `token` when return_logits
  compute::SamplerState rng;  // the sampler state after `token`
};
using StreamPiecePtr = std::shared_ptr<const StreamPiece>;

/// What a client saw of a request before its router failed; (submit, request, tag, resume) asks
/// the new router to continue from there without streaming any of it again.
struct ResumeState {
  std::vector<int32_t> tokens;  // streamed tokens, in order
  std::vector<float> logits;    // f32 [tokens, n_vocab] when return_logits
  compute::SamplerState rng;    // after the last token; all zero when none was streamed
};
using ResumeStatePtr = std::shared_ptr<const ResumeState>;

using GenerateRequestPtr = std::shared_ptr<const GenerateRequest>;
using GenerateResultPtr = std::shared_ptr<const GenerateResult>;

}  // namespace troupe::actors
