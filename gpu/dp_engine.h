// GpuDpEngine: one pipeline stage computed by data-parallel GPU ranks with expert parallelism —
// each rank holds the stage's whole attention and dense layers and a share of every MoE layer's
// experts (GpuEngineOptions::ep), and computes the sequences whose KV blocks are in its share of
// the stage's block ids; MoE rows travel to their experts' ranks and back by all-to-all. The
// layout DeepSeek-V3-style (MLA) models want: no rank stores another rank's KV cache, where
// tensor parallelism (gpu/tp_engine.h) keeps the whole latent cache on every rank.
// Same step() contract as GpuEngine, with block ids [0, size * blocks_per_rank): ids
// [r * blocks_per_rank, (r + 1) * blocks_per_rank) are rank r's, and each sequence's blocks must
// all be one rank's (compute::KvPools hands them out that way). Every sequence's logits are
// bitwise those of one GpuEngine holding the whole stage.
// Failure: as GpuTpEngine (a failing rank breaks the group; recreate the engine).
// Thread safety: one step at a time, from any one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "base/result.h"
#include "compute/engine.h"
#include "gpu/engine.h"
#include "model/model.h"

namespace troupe::gpu {

class GpuDpEngine {
 public:
  /// Ranks on `devices` (all distinct: NCCL; all the same: the one-GPU stand-in). The KV pool,
  /// opts.kv_num_blocks (or max_tokens_in_cache's blocks when 0), is split equally between the
  /// ranks and must divide by their number. Errors as GpuTpEngine::create, and Errc::kBadInput
  /// when the pool does not divide or the model's experts do not divide over the ranks.
  static Result<std::unique_ptr<GpuDpEngine>> create(std::shared_ptr<const model::Model> model,
                                                     const GpuEngineOptions& opts,
                                                     std::vector<int> devices);
  ~GpuDpEngine();
  GpuDpEngine(const GpuDpEngine&) = delete;
  GpuDpEngine& operator=(const GpuDpEngine&) = delete;

  /// Every rank steps at once with its own sequences (possibly none). Errors: Errc::kBadInput
  /// for a sequence whose blocks are on two ranks or out of range, and every GpuEngine::step
  /// error (checked on every rank before any starts).
  Status step(std::span<const compute::SeqStep> seqs, compute::StepResult* out,
              const float* hidden_in = nullptr, std::vector<float>* hidden_out = nullptr);

  int size() const;
  bool uses_nccl() const;
  int64_t blocks_per_rank() const;
  const model::ModelSpec& spec() const;
  const compute::LayerRange& range() const;
  uint64_t weight_bytes() const;  // summed over ranks
  uint64_t kv_bytes() const;      // summed over ranks
  GpuEngine& rank(int r);

 private:
  struct Impl;
  explicit GpuDpEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe::gpu
