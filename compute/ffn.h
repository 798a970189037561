// The feed-forward block of a dense layer, a shared expert or a routed expert: gate and up
// projections (or gpt-oss's interleaved gate_up), the gated activation, the down projection,
// biases where the FFN has them. Users: compute/engine.cc (the engine, and ExpertCompute for
// expert shards). Thread safety: one call at a time per scratch pair and pool.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/model_spec.h"

namespace troupe::compute {

class ThreadPool;

/// y [n, n_embd] = down(act(gate(x), up(x))) + biases for n rows of x [n, n_embd]; act is
/// silu(g) * u, gpt-oss's clamped form or Gemma's gelu(g) * u (s.ffn_act). g and u are scratch
/// (grown as needed). Every output row depends on its own input row only.
void gated_ffn(const model::ModelSpec& s, const model::ExpertFfn& f, const float* x, int64_t n,
               float* y, std::vector<float>& g, std::vector<float>& u, ThreadPool* pool);

/// One FFN of gated_ffns: y [n, n_embd] = f(x [n, n_embd]).
struct FfnTask {
  const model::ExpertFfn* f;
  const float* x;
  int64_t n;
  float* y;
};

/// gated_ffn for several FFNs at once (the experts an MoE layer routes a step's tokens to),
/// every output bit-identical to gated_ffn's: the gate and up products of all of them run as
/// one parallel section, the activations as one pass, the down products as one more section
/// (compute/matmul.h matmul_many) -- rather than two sections per expert.
void gated_ffns(const model::ModelSpec& s, std::span<const FfnTask> tasks, std::vector<float>& g,
                std::vector<float>& u, ThreadPool* pool);

/// y[r] += b for each of n rows of b's width (nothing without a bias; b must be f32).
void add_rows(const model::WeightView& b, float* y, int64_t n);

}  // namespace troupe::compute
