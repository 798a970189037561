// The engine's per-step scratch buffers and small helpers, shared by compute/engine.cc and
// compute/engine_v4.cc (DeepSeek-V4's layers). Internal to compute/.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "base/check.h"
#include "compute/engine.h"
#include "compute/matmul.h"
#include "model/rope.h"

namespace troupe::compute {

struct Engine::Scratch {
  int64_t T = 0;
  std::vector<int64_t> tok_pos;           // [T]
  std::vector<int32_t> tok_seq;           // [T] index into the step's SeqStep list
  std::vector<int64_t> seq_first;         // [seqs + 1]: each sequence's first token, then T
  std::vector<float> rope_cos, rope_sin;  // [T, n_rot / 2]: each token's rotary angles
  model::RopeFrequencies rope;            // the model's, scaling applied (set once)
  // Layers with local_rope (Gemma 3's sliding ones): their own base, unscaled.
  std::vector<float> rope_cos_local, rope_sin_local;
  model::RopeFrequencies rope_local;
  bool any_local_rope = false;
  std::vector<float> x, h, tmp;           // [T, n_embd]
  std::vector<float> q, k, v;             // attention projections
  std::vector<float> attn;                // [T, n_head * head_dim_v]
  std::vector<float> qa, kva, qabs, lat;  // MLA
  // DeepSeek-V3.2's indexer: queries [T, heads, width], keys [T, width], head weights [T, heads];
  // the positions each token attends to (sel_at[t] .. sel_at[t + 1] of sel; none: all).
  std::vector<float> iq, ik, iw, ikeys, iscore;  // ... and a sequence's keys, its scores
  std::vector<int64_t> sel_at;
  std::vector<int32_t> sel;
  std::vector<float> attn_gate;  // Qwen3-Next: [T, n_head * head_dim] (q's second half)
  // Gated DeltaNet: the projections' q, k, v before and after the convolution [T, conv_dim],
  // z [T, nv * dv], b and a [T, 2 nv]; with ssm_in, its output before being split.
  std::vector<float> lin_x, lin_y, lin_z, lin_ba, lin_in;
  std::vector<float> gate, up;  // FFN
  // MoE
  std::vector<float> router;    // [T, n_expert]
  std::vector<int32_t> sel_id;  // [T, k]
  std::vector<float> sel_w;     // [T, k]
  std::vector<float> slot_out;  // [T, k, n_embd]
  std::vector<float> xe, ge, ue, de;
  std::vector<float> shared_out;
  std::span<const SeqStep> seqs;
  // MLA: each layer's k_b and v_b as one matrix per head (WeightView::slice), made once, and
  // the per-head products of a step, run together (matmul_many).
  std::vector<std::vector<model::WeightView>> k_b_heads, v_b_heads;  // [layer - range.begin][head]
  std::vector<MatmulProduct> products;
  // DeepSeek-V4: each token's input token id [T]; its streams RMS-normed [T, hc n_embd], their
  // hyper-connection mixes [T, (2 + hc) hc], post [T, hc] and comb [T, hc, hc] weights; the
  // compressor's projections [T, 2 coff head_dim] and the indexer's [T, 4 idx_head_dim]; the
  // grouped output's first projection [T, o_groups o_lora_rank]; each layer's wo_a by group.
  std::vector<int32_t> tok_id;
  std::vector<float> hc_norm, hc_mix, hc_post, hc_comb, cmp, icmp, og;
  std::vector<std::vector<model::WeightView>> wo_a_groups;  // [layer - range.begin][group]
};

namespace detail {

inline void grow(std::vector<float>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
}

inline const float* f32(const model::WeightView& w) {
  TROUPE_CHECK(w.type == model::GgmlType::kF32, "%s: norm/bias weights must be f32, are %s",
               w.name.c_str(), model::type_name(w.type).c_str());
  return reinterpret_cast<const float*>(w.data);
}

// Query heads per piece of attention work: the g heads of a KV head share each K/V row read,
// so the largest divisor of g up to `most` -- but smaller while the step's T tokens x h heads
// would give the threads fewer than two pieces each (a decode step on a many-core CPU). A
// head's result does not depend on its piece (Attention tests), so this changes speed only.
// GQA pieces hold up to 8 (the by-dimension score kernel's widest pass); MLA's 16 to 128 heads
// share one latent KV, and 32 per piece read it a quarter as often as 8 (128 heads at 4096
// positions: 1.7x faster, docs/benchmarks.md "Engine, session 37"); more gained nothing.
inline int64_t head_part(int64_t g, int64_t T, int64_t h, int n_threads, int64_t most = 8) {
  for (int64_t p = std::min<int64_t>(g, most); p > 1; --p)
    if (g % p == 0 && T * (h / p) >= 2 * static_cast<int64_t>(n_threads)) return p;
  return 1;
}

}  // namespace detail
}  // namespace troupe::compute
