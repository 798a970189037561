// GpuEngine: the forward pass of compute::Engine on one CUDA device, for a stage (a layer range,
// with or without the embedding and the head) over a batch of sequences with a paged bf16 KV
// cache. Weights are dequantized to bf16 at start (norms and biases stay f32); the residual
// stream is f32; every GEMM reads bf16 and accumulates in f32 (gpu/gemm.h).
// Users: the stage actor's GPU executor, gpu_bench, tests. Same step() contract as
// compute::Engine::step, and the same batch invariance: a sequence's logits are bitwise the same
// alone or in any batch, prefilled in one chunk or in chunks of more than one token, with or
// without CUDA graphs (see gpu/engine.cc for how each piece keeps this).
// Thread safety: one step at a time per engine, from any one thread at a time; the engine makes
// its device current at every call.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/result.h"
#include "compute/engine.h"
#include "compute/kv_cache.h"
#include "model/model.h"

namespace troupe::gpu {

class Collective;
class StreamPair;

struct GpuEngineOptions {
  int device = 0;
  compute::LayerRange range;  // as compute::Engine: layer range, embed, head
  int64_t kv_block_size = 16;
  int64_t kv_num_blocks = 0;  // 0: enough for max_tokens_in_cache
  int64_t max_tokens_in_cache = 4096;
  int64_t max_step_tokens = 4096;  // bound on the tokens of one step (sizes the workspace)
  int64_t max_step_seqs = 256;
  int64_t max_positions = 0;  // as compute::EngineOptions::max_positions (LongRoPE's factors)
  bool cuda_graphs = true;    // decode-only steps of a seen batch size replay a graph
  /// Tensor parallelism: this engine is rank tp->rank() of a group of tp->size() (not owned; it
  /// must outlive the engine). The rank holds 1/size of every layer: the heads
  /// [r*H/size, (r+1)*H/size) (and their KV heads; MLA keeps the whole latent cache), 1/size of
  /// every dense and shared-expert FFN's width, of the routed experts either n_expert/size whole
  /// ones or 1/size of each one's width (tp_expert_parallel), and the matching columns of wo and
  /// the down projections; embeddings, norms and routers whole. After wo and after each FFN the
  /// ranks sum their partial outputs (Collective::all_reduce_sum, on the comm stream). Only rank
  /// 0 holds and computes the output head. Every rank must get the same steps, each from its
  /// own thread (gpu/tp_engine.h does this). null: the whole range on this device. CUDA graphs
  /// are off with a group of more than one rank.
  Collective* tp = nullptr;
  /// With tp: a step of two or more sequences runs as two micro-batches (sequences split at
  /// about half the tokens), each layer's sums of one overlapping the other's compute; the same
  /// bits as one batch (batch invariance). false: one batch, every sum waited for.
  bool tp_overlap = true;
  /// With tp, MoE layers: each rank holds n_expert / size whole experts (expert parallelism: it
  /// computes the routed rows of its experts at full width, tokens stay on every rank, the sum
  /// over ranks combines) when size divides n_expert; false, or n_expert not divisible: every
  /// rank holds 1/size of every expert's width. Shared experts are always split by width.
  bool tp_expert_parallel = true;
  /// Expert parallelism with data-parallel attention (not with tp): this engine is rank
  /// ep->rank() of a group whose ranks each compute their own sequences through whole attention
  /// and dense layers (their own KV pools) and hold n_expert / size experts of every MoE layer;
  /// MoE rows go to their experts' ranks and back by all-to-all (MoeForward::run_dispatch), so a
  /// sequence's logits are bitwise those of a one-GPU engine. Every rank steps at the same time
  /// with its own steps, possibly none (it still serves its experts). A driver must check every
  /// rank's steps (check_step) before starting any: a rank that refused its step would leave
  /// the others waiting (a refused step breaks the group). Every rank needs the same
  /// max_step_tokens, and the group's a2a_capacity() at least size x max_step_tokens x
  /// n_expert_used x n_embd x 4 bytes (checked). Not owned; must outlive the engine.
  Collective* ep = nullptr;
};

class GpuEngine {
 public:
  /// Uploads the range's weights (dequantized to bf16; norms f32), allocates the KV pool and one
  /// workspace arena up front (no cudaMalloc in step()). Errors: no GPU (the message says why),
  /// out of device memory (says how much was needed), unsupported architecture or weight type,
  /// bad options (as compute::Engine::create). Error codes: Errc::kNoDevice, Errc::kOutOfMemory,
  /// another Errc for a CUDA/cuBLAS failure during set-up, Errc::kBadInput for bad options or an
  /// unsupported model.
  static Result<std::unique_ptr<GpuEngine>> create(std::shared_ptr<const model::Model> model,
                                                   const GpuEngineOptions& opts);
  ~GpuEngine();
  GpuEngine(const GpuEngine&) = delete;
  GpuEngine& operator=(const GpuEngine&) = delete;

  /// Same contract as compute::Engine::step: validates every SeqStep (token ids, block tables,
  /// block ids, sizes against max_step_*, positions inside the KV pool), returns an Error without
  /// computing when one is bad; fills out->logits (f32, host) for the rows each SeqStep asks for;
  /// hidden_in (f32 [num_tokens, n_embd]) / hidden_out for ranges without embedding / head.
  /// Synchronous: returns when results are on the host. Error codes: Errc::kBadInput for a bad
  /// step (nothing computed), Errc::kStepFailed for a device failure during the step (the KV
  /// rows of that step are then undefined).
  Status step(std::span<const compute::SeqStep> seqs, compute::StepResult* out,
              const float* hidden_in = nullptr, std::vector<float>* hidden_out = nullptr);

  /// The checks step() runs first (the same errors), without computing: GpuTpEngine checks a
  /// step once before its ranks start, so that no rank waits for one that refused it.
  Status check_step(std::span<const compute::SeqStep> seqs, const compute::StepResult* out,
                    const float* hidden_in, const std::vector<float>* hidden_out) const;

  const model::ModelSpec& spec() const;
  const compute::LayerRange& range() const;
  compute::BlockAllocator& blocks();  // the KV block ids of this engine's pool
  uint64_t weight_bytes() const;      // device bytes of weights held
  uint64_t kv_bytes() const;          // device bytes of the KV pool
  float last_step_ms() const;         // device time of the last step (events on the compute stream)
  StreamPair& streams();

  /// Diagnostics (tests, benchmarks): CUDA graphs captured so far, and the last capture failure
  /// ("" when none; a step whose capture fails still returns its eager results, and that batch
  /// shape then stays eager).
  size_t num_graphs() const;
  const std::string& graph_error() const;

 private:
  struct Impl;
  explicit GpuEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe::gpu
