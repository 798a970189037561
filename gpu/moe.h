// Mixture-of-experts on the GPU: routing (Mixtral softmax top-k, Qwen3 normalized top-k,
// DeepSeek-V3 sigmoid + bias + group-limited top-k, DeepSeek-V2 softmax + group-limited top-k
// with groups ranked by their best), a deterministic permutation of (token, slot) pairs by
// expert, the experts' SwiGLU FFN as one cuBLASLt GEMM per non-empty expert, and the
// fixed-order combine. Each step matches compute/engine.cc Engine::moe() (see each launcher).
// Users: the stage actor's GPU forward pass and the expert-shard actor.
// Thread safety: launchers are stateless; a MoeForward belongs to one actor (one stream).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "model/model_spec.h"

namespace troupe::gpu {

class Arena;
class Collective;
class Gemm;

/// The routing parameters of a MoE layer (the ModelSpec fields engine.cc reads).
struct MoeRouting {
  int64_t n_expert = 0;  // 1 ... kMaxExperts
  int64_t k = 0;         // experts per token (n_expert_used), 1 ... min(n_expert, kMaxK)
  model::Gating gating = model::Gating::kSoftmax;
  bool norm_topk = false;    // divide the k weights by their sum (Qwen3, DeepSeek-V3)
  float routed_scale = 1.f;  // DeepSeek-V3 routed_scaling_factor, applied after normalizing
  int64_t n_group = 1;       // 1 ... kMaxGroups; group-limited routing when n_group > 1 and
  int64_t n_group_used = 1;  // n_group_used < n_group (n_expert must then be a multiple of n_group)
  model::GroupScore group_score = model::GroupScore::kTopTwoSum;  // a group's score

  // Bounds of the routing kernel's shared memory (one warp per token, ~37 KiB at most).
  static constexpr int64_t kMaxExperts = 4096;
  static constexpr int64_t kMaxK = 64;
  static constexpr int64_t kMaxGroups = 64;
  static MoeRouting from_spec(const model::ModelSpec& s);
};

/// Throws troupe::InputError when `r` cannot be routed (the message names the field).
void validate_moe_routing(const MoeRouting& r);

/// Routes n_tok tokens. logits: f32 [n_tok, n_expert]; bias: f32 [n_expert] or null (added to
/// the scores for selection only, DeepSeek-V3 e_score_correction_bias). Writes ids: int32
/// [n_tok, k] and weights: f32 [n_tok, k], slot j = the j-th best expert.
/// Same math as engine.cc: softmax (max-subtracted expf, sum in double, times 1/sum) or sigmoid;
/// selection score = prob + bias; group score = sum of a group's two best selection scores (or
/// its best one: GroupScore::kMax), groups outside the best n_group_used get -inf; the k best by
/// (score desc, expert id asc) — std::stable_sort's order, so equal scores pick the lower id like
/// the CPU; weights = unbiased probs, divided by their double sum cast to float when norm_topk,
/// then times routed_scale. Ids equal the CPU's wherever no two scores are within a few ulp (expf
/// may differ from glibc's by 1-2 ulp); weights agree to ~1e-6 relative. A NaN logit gives an
/// unspecified choice.
void launch_moe_route(const MoeRouting& r, const float* logits, const float* bias, int64_t n_tok,
                      int32_t* ids, float* weights, cudaStream_t stream);

/// Output of the permutation (device pointers, caller-allocated). n_entries = n_tok * k;
/// entry i = t * k + slot.
struct MoePermutation {
  int32_t* counts = nullptr;     // int32 [n_expert]: entries routed to each expert
  int32_t* offsets = nullptr;    // int32 [n_expert + 1]: expert e's rows are [offsets[e], [e+1])
  int32_t* row_entry = nullptr;  // int32 [n_entries]: sorted row -> entry
  int32_t* entry_row = nullptr;  // int32 [n_entries]: entry -> sorted row (the inverse)
};

/// Groups the (token, slot) entries by expert with a counting sort that keeps entry order within
/// an expert (token, then slot: the CPU's order), with no order-deciding atomics, and gathers
/// x_sorted[row] = x[row_entry[row] / k]. ids: int32 [n_tok, k] in [0, n_expert); x: bf16
/// [n_tok, d] dense; x_sorted: bf16 [n_tok * k, d]. An id out of range is counted nowhere, so
/// offsets[n_expert] < n_tok * k (MoeForward checks this; rows past it are not written).
void launch_moe_permute(const int32_t* ids, int64_t n_tok, int64_t k, int64_t n_expert,
                        const __nv_bfloat16* x, int64_t d, __nv_bfloat16* x_sorted,
                        const MoePermutation& out, cudaStream_t stream);

/// The routed experts' weights as stacked in the model (bf16, row-major, experts contiguous).
struct MoeExpertWeights {
  const __nv_bfloat16* gate = nullptr;  // bf16 [n_expert, d_ff, d]
  const __nv_bfloat16* up = nullptr;    // bf16 [n_expert, d_ff, d]
  const __nv_bfloat16* down = nullptr;  // bf16 [n_expert, d, d_ff]
  int64_t n_expert = 0;
  int64_t d = 0;     // model width (n_embd), a multiple of 8 (16-byte aligned expert rows)
  int64_t d_ff = 0;  // expert width (n_ff_exp), a multiple of 8
};

/// out[r] = down_e(silu(gate_e(x_sorted[r])) * up_e(x_sorted[r])) for the rows r of each expert
/// e, with offsets_host: int32 [n_expert + 1] on the host (a copy of MoePermutation::offsets).
/// x_sorted: bf16 [rows, d]; out: f32 [rows, d], rows = offsets_host[n_expert]. gate and up are
/// f32 GEMM outputs, the SwiGLU product is rounded to bf16 (the down GEMM's input), down is f32.
/// Three Gemm::run per non-empty expert (M = that expert's rows; Gemm pins algorithms per (N, K),
/// so a row's result does not depend on how many rows its expert got). Scratch comes from
/// `arena` and is given back before returning (stream order keeps later users on `stream` safe).
void run_moe_experts(Gemm& gemm, const MoeExpertWeights& w, std::span<const int32_t> offsets_host,
                     const __nv_bfloat16* x_sorted, float* out, Arena& arena, cudaStream_t stream);

struct MoeCombineArgs {
  int64_t n_tok = 0, k = 0, d = 0;
  const float* expert_out = nullptr;         // f32 [n_tok * k, d], rows in sorted order
  const int32_t* entry_row = nullptr;        // int32 [n_tok * k] (MoePermutation::entry_row)
  const float* weights = nullptr;            // f32 [n_tok, k] (launch_moe_route)
  const float* shared_out = nullptr;         // f32 [n_tok, d] shared expert(s) output, or null
  const float* shared_gate_logit = nullptr;  // f32 [n_tok]: shared output times sigmoid, or null
  float* y = nullptr;                        // f32 [n_tok, d], overwritten
};

/// y[t] = w[t,0]*out[row(t,0)]; y[t] += w[t,s]*out[row(t,s)] for s = 1..k-1; then
/// y[t] += shared[t] * g (g = sigmoid(gate logit) or 1). Every product and sum rounded on its
/// own (no FMA), in this order: the CPU engine's order, so without a shared gate the result is
/// bitwise the CPU's for the same inputs.
void launch_moe_combine(const MoeCombineArgs& a, cudaStream_t stream);

struct MoeForwardArgs {
  int64_t n_tok = 0;
  const __nv_bfloat16* x = nullptr;      // bf16 [n_tok, d]: the normed hidden states
  const float* router_logits = nullptr;  // f32 [n_tok, n_expert]
  const float* router_bias = nullptr;    // f32 [n_expert] or null
  MoeExpertWeights experts;              // all experts, or those from expert_begin on
  int64_t expert_begin = 0;  // experts holds experts [expert_begin, + experts.n_expert) of the
                             // routing's; entries routed elsewhere add 0 to y (expert parallelism:
                             // a rank's partial sum; y sums its experts in the same slot order)
  const float* shared_out = nullptr;         // f32 [n_tok, d] or null (computed by the caller)
  const float* shared_gate_logit = nullptr;  // f32 [n_tok] or null
  float* y = nullptr;                        // f32 [n_tok, d]
};

/// A MoE layer's routed part: route, permute, copy the per-expert offsets to the host (one
/// (n_expert + 1) * 4-byte D2H copy and a stream synchronize per call: the host needs the
/// counts to issue one GEMM per non-empty expert), experts, combine.
class MoeForward {
 public:
  /// Allocates the pinned host buffer for the offsets (set-up, not the hot path). Throws
  /// DeviceError, InputError (bad routing).
  MoeForward(const MoeRouting& routing, Gemm* gemm);
  ~MoeForward();
  MoeForward(const MoeForward&) = delete;
  MoeForward& operator=(const MoeForward&) = delete;

  /// Runs the layer; scratch from `arena` (given back before returning). Returns when the
  /// offsets are on the host; the rest is queued on `stream`. Throws InputError for bad
  /// arguments, DeviceError for CUDA/cuBLASLt failures, InternalError for routed ids out of
  /// range (the routing kernel cannot produce them).
  void run(const MoeForwardArgs& a, Arena& arena, cudaStream_t stream);

  /// Expert parallelism with data-parallel tokens (gpu/moe_dispatch.cc): this rank's own n_tok
  /// tokens (n_tok >= 0: a rank without tokens still serves its experts) are routed here, their
  /// rows go by all-to-all to the ranks owning their experts (rank p owns experts
  /// [p * EC, (p + 1) * EC), EC = n_expert / group size), which run them and send the results
  /// back, and the combine runs here. a.experts holds this rank's EC experts and a.expert_begin
  /// is group.rank() * EC. Every rank of the group calls it for the same layer, in the same
  /// order. y is bitwise what run() gives with every expert on one device (each row meets the
  /// same GEMMs, the combine is the same). Syncs the host once (for this rank's per-expert counts
  /// and those every rank sends here). Throws InputError (bad shapes, n_expert not a multiple
  /// of the group size), DeviceError.
  void run_dispatch(const MoeForwardArgs& a, Collective& group, Arena& arena, cudaStream_t stream);

  /// int32 [n_expert + 1]: the last run's per-expert row offsets (counts = differences).
  std::span<const int32_t> offsets() const { return {offsets_host_, offsets_len_}; }

 private:
  // The argument checks of run and run_dispatch (InputError naming the field).
  void check_args(const MoeForwardArgs& a) const;
  // The weighted sum of a's tokens' expert rows (and shared expert) into a.y.
  void combine(const MoeForwardArgs& a, const float* expert_out, const int32_t* entry_row,
               const float* weights, cudaStream_t stream);

  MoeRouting routing_;
  Gemm* gemm_;
  int32_t* offsets_host_ = nullptr;  // pinned
  size_t offsets_len_ = 0;
  int32_t* recv_counts_host_ = nullptr;  // pinned, n_expert: run_dispatch's [rank, expert] counts
};

}  // namespace troupe::gpu
