// LocalCluster: the whole actor system of a plan inside this process (router, scheduler, pipeline
// stages, expert shards, controller). The public face of actors/ for the CLI and tests: it hides
// CAF entirely. Thread safety: generate()/generate_many() may be called from one thread at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "actors/plan.h"
#include "base/result.h"
#include "compute/multimodal_prompt.h"
#include "compute/sampler.h"
#include "model/model.h"
#include "model/vision.h"

namespace troupe::actors {

struct GenerateRequest {
  std::string prompt;                  // text; used when prompt_tokens is empty
  std::vector<int32_t> prompt_tokens;  // token ids (take precedence over text)
  /// A prompt with images (compute/multimodal_prompt.h): when set, its tokens are the prompt
  /// (prompt and prompt_tokens are ignored) and its rows feed the image positions.
  std::shared_ptr<const compute::MultimodalPrompt> images;
  /// Image files (PNG or JPEG bytes), one per <__media__> marker of the text `prompt`, in order
  /// (with no marker they come first): the cluster's image encoder lays the prompt out (needs a
  /// vision encoder: Plan::mmproj). Ignored when `images` is set.
  std::shared_ptr<const std::vector<std::string>> image_files;
  bool add_bos = true;  // for a text prompt
  compute::SamplingParams sampling;
  int64_t max_tokens = 128;
  bool return_logits = false;  // the logits row of every sampled token (tests, eval)
};

struct GenerateResult {
  std::vector<int32_t> prompt_tokens;
  std::vector<int32_t> tokens;  // generated (without an end-of-generation token)
  std::string text;
  std::string finish_reason;  // "length", "stop", "cancelled", "error", "overloaded"
  std::string error;          // set for "error" and "overloaded"
  std::vector<float> logits;  // f32 [tokens sampled, n_vocab] when return_logits
  bool ok() const { return error.empty(); }
};

/// Called for each streamed piece: (request index, text delta, token id).
using StreamCallback = std::function<void(size_t, const std::string&, int32_t)>;

struct ClusterOptions {
  int64_t expert_timeout_ms = 10000;    // a shard that does not answer fails the step (retried)
  int64_t request_timeout_ms = 600000;  // generate() gives up waiting after this
  /// Multi-host clusters: a pipeline step not back after this long is run again (a lost
  /// message); 0 = never (in one process nothing is lost).
  int64_t step_timeout_ms = 0;
  /// A request whose steps keep failing (every retry too, with none succeeding) ends with an
  /// error naming the last failure once they have failed for this long (and at least 8 times).
  int64_t step_failure_window_ms = 60000;
  /// The scheduler's KV pools (compute/kv_pools.h); 0: the plan's (Plan::kv_pools: one per GPU
  /// of a data-parallel stage). Tests set it to run pooled KV on CPU stages.
  int64_t kv_pools = 0;
  /// The vision encoder (an mmproj) for requests with image_files; null refuses them.
  std::shared_ptr<const model::VisionModel> vision;
  int vision_threads = 0;  // its compute threads; 0 = all cores (a plan with several [[encoder]]
                           // tables runs one instance per table, with its threads)
  int64_t image_cache_bytes = int64_t{256} << 20;  // encoded images kept (actors/encoder.h)
};

class LocalCluster {
 public:
  /// Builds every actor of a resolved plan. Errors: a stage or shard that cannot be built.
  static Result<std::unique_ptr<LocalCluster>> start(const Plan& plan,
                                                     std::shared_ptr<const model::Model> model,
                                                     const ClusterOptions& opts = {});
  ~LocalCluster();

  /// Runs requests through the router, at most `concurrency` at once (0 = all at once), and
  /// returns their results in order. Never throws for a bad request: its result has an error.
  std::vector<GenerateResult> generate_many(const std::vector<GenerateRequest>& reqs,
                                            size_t concurrency = 0,
                                            const StreamCallback& on_delta = nullptr);
  GenerateResult generate(const GenerateRequest& req, const StreamCallback& on_delta = nullptr);

  /// From inside a StreamCallback of the running generate_many: stop request `index`. Its result
  /// then ends with finish_reason "cancelled" (tokens streamed so far kept) and its KV is freed.
  void cancel(size_t index);

  /// Fault injection (tests): "stage/N", "expert/N", "scheduler" or "router" throws while
  /// handling its next message; its supervisor restarts it and no accepted request is lost. May be
  /// called from inside a StreamCallback.
  Status inject_fault(const std::string& actor);
  /// A JSON summary:
  ///   "scheduler":  counters, KV usage, prefix-cache hits (one line from the scheduler)
  ///   "controller": restarts per actor
  ///   "encoder":    images encoded, cache hits, encode seconds (only with a vision encoder)
  ///   "kv_stages":  one object per pipeline stage, in order. Block ids are shared along the
  ///                 pipeline (one logical block table per sequence), so the block counts are the
  ///                 same for every stage; the bytes are that stage's own pool:
  ///     stage, layers [begin, end)
  ///     blocks_total, blocks_used (held by live sequences), blocks_cached (unreferenced but
  ///     holding a reusable prefix: evictable), blocks_free; used + cached + free = total
  ///     block_bytes: bytes of one block in this stage's pool (all its layers' K and V)
  ///     bytes_used: blocks_used * block_bytes
  ///     fragmentation_perc: of the token slots of used blocks, the share holding no computed
  ///                         token yet (partly filled tail blocks, slots reserved for a step in
  ///                         flight), in [0, 1]
  ///     state_bytes: the stage's recurrent states allocated so far (models with linear
  ///                  attention: one per state slot a step has used; 0 for other models)
  std::string stats_json();

 private:
  LocalCluster();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe::actors
