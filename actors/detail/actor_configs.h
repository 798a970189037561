// Construction parameters of the compute actors (private to actors/). The controller keeps them
// so that it can respawn a failed actor exactly as it was.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "actors/interfaces.h"
#include "actors/plan.h"
#include "compute/engine.h"
#include "model/model.h"

namespace troupe::actors {

struct StageConfig {
  int index = 0;
  int num_stages = 1;
  compute::LayerRange range;
  int threads = 1;
  int64_t kv_blocks = 0;
  int64_t kv_block_size = 16;
  compute::KvType kv_type = compute::KvType::kF32;  // a CPU stage's KV values (Plan::kv_type)
  // Recurrent state slots the scheduler assigns (state_slots_for: 0 on a model without them).
  int64_t state_slots = 0;
  // The longest sequence the stage runs (scheduler.max_model_len): a LongRoPE model's factors.
  int64_t max_positions = 0;
  std::shared_ptr<const model::Model> model;
  std::string device = "cpu";                       // "cpu" or "cuda:N[,M...]" (StagePlan::device)
  std::string parallel = "tensor";                  // with several GPUs (StagePlan::parallel)
  std::chrono::milliseconds expert_timeout{10000};  // a shard that does not answer fails the step
  SchedulerActor scheduler;  // gets (done, outcome): the last stage's, and failed steps of any
};

struct ExpertShardConfig {
  int index = 0;
  std::vector<int32_t> experts;  // routed experts it owns (in every MoE layer)
  int threads = 1;
  std::shared_ptr<const model::Model> model;
};

struct SchedulerActorConfig {
  SchedulerConfig limits;
  int64_t kv_blocks = 0;  // the logical pool shared by every stage (block ids are pipeline-wide)
  // Equal pools the ids split into, a sequence in one (a data-parallel GPU stage keeps pool p on
  // its rank p: compute/kv_pools.h); 1 = one pool.
  int64_t kv_pools = 1;
  int64_t kv_block_size = 16;
  int64_t n_vocab = 0;
  int64_t n_embd = 0;  // image rows' width (0: image prompts are refused)
  // First step epoch. A replacement starts far above its predecessor's epochs, so outcomes of
  // steps the failed scheduler sent (still in the pipeline) are recognised and dropped.
  uint64_t epoch0 = 1;
  // A step whose outcome has not come back after this long is treated as failed and its
  // sequences run again (a lost message, a dead node); 0 = no deadline. The late outcome, if it
  // ever comes, is dropped.
  int64_t step_timeout_ms = 0;
  // A sequence whose steps keep failing ends with the last failure's message once they have
  // failed for this long in a row (and at least 8 times).
  int64_t step_failure_window_ms = 60000;
  // Recurrent state slots, one per admitted sequence (state_slots_for); 0: the model keeps none.
  // With them the prefix cache is off (a hit would skip positions a recurrent layer must see),
  // and a failed step's sequences are recomputed from position 0 (a stage before the failure
  // may have advanced their state, which a step cannot undo).
  int64_t state_slots = 0;
};

/// Recurrent state slots a plan's scheduler hands out for `spec`: one per sequence it may run
/// at once when the model has linear-attention layers, else 0.
inline int64_t state_slots_for(const model::ModelSpec& spec, const SchedulerConfig& sc) {
  return spec.has_recurrent_layers() ? sc.max_sequences : 0;
}

/// The actors a controller supervises, as they are now (replacements included).
struct ActorHandles {
  RouterActor router;
  SchedulerActor scheduler;
  std::vector<StageActor> stages;  // pipeline order
  std::vector<ExpertShardActor> shards;
};

/// Where each routed expert lives: shards[owner[e]] computes expert e. Empty: in the stage.
struct ExpertPlacement {
  std::vector<ExpertShardActor> shards;  // local shards or remote proxies (detail/remote.h)
  std::vector<int32_t> owner;            // [n_expert]
};

}  // namespace troupe::actors
