// The FFN of a dense layer, a shared expert or a routed one (compute/ffn.h).
#include "compute/ffn.h"

#include <algorithm>

#include "base/check.h"
#include "compute/detail/ops.h"
#include "compute/matmul.h"
#include "compute/thread_pool.h"
#include "compute/vec_ops.h"

namespace troupe::compute {
namespace {

void grow(std::vector<float>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
}

// SwiGLU activations below this many run on the calling thread (waking the pool costs more).
constexpr int64_t kMinParallelActivations = 32768;

}  // namespace

// One product per projection (a fused interleaved one for gate_up), the activation element by
// element, then down.
void gated_ffn(const model::ModelSpec& s, const model::ExpertFfn& f, const float* x, int64_t n,
               float* y, std::vector<float>& g, std::vector<float>& u, ThreadPool* pool) {
  const int64_t ff = f.width();
  grow(g, n * ff);
  if (f.gate_up.present()) {
    // One product of the interleaved rows into u, then gate's (even) outputs moved to g and
    // up's (odd) packed in place (each read before anything lands on it). Every output is the
    // dot product of one weight row with x, as with separate matrices.
    grow(u, 2 * n * ff);
    matmul(f.gate_up, x, n, u.data(), pool);
    for (int64_t i = 0; i < n * ff; ++i) g[i] = u[2 * i];
    for (int64_t i = 0; i < n * ff; ++i) u[i] = u[2 * i + 1];
  } else {
    grow(u, n * ff);
    const MatmulTarget gate_up[] = {{f.gate, g.data(), ff}, {f.up, u.data(), ff}};
    matmul_shared(gate_up, x, f.gate.cols(), n, pool);
  }
  add_rows(f.gate_b, g.data(), n);
  add_rows(f.up_b, u.data(), n);
  // Element by element (the same result on any split): on the pool once there is enough of it,
  // as at 16 sequences (90k exp() per layer of the 1.1B shape; SiLU in SIMD, silu_mul, ~10x
  // the scalar loop: docs/benchmarks.md "Engine, session 27").
  const float alpha = s.act_alpha, limit = s.act_limit;
  auto act = [&](int64_t b, int64_t e) {
    if (s.ffn_act == model::FfnAct::kSwigluOai) {
      for (int64_t i = b; i < e; ++i) {
        const float gi = std::min(g[i], limit), ui = std::clamp(u[i], -limit, limit);
        g[i] = gi * detail::sigmoid(alpha * gi) * (ui + 1.0f);
      }
    } else if (s.ffn_act == model::FfnAct::kGeluTanh) {
      for (int64_t i = b; i < e; ++i) g[i] = detail::gelu_tanh(g[i]) * u[i];
    } else {
      silu_mul(g.data() + b, u.data() + b, e - b);
    }
  };
  if (pool != nullptr && pool->size() > 1 && n * ff >= kMinParallelActivations)
    pool->parallel_for(n * ff, 64, act);
  else
    act(0, n * ff);
  matmul(f.down, g.data(), n, y, pool);
  add_rows(f.down_b, y, n);
}

void add_rows(const model::WeightView& b, float* y, int64_t n) {
  if (!b.present()) return;
  TROUPE_CHECK(b.type == model::GgmlType::kF32, "%s: bias weights must be f32, are %s",
               b.name.c_str(), model::type_name(b.type).c_str());
  const auto* bb = reinterpret_cast<const float*>(b.data);
  const int64_t w = b.cols();
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < w; ++i) y[r * w + i] += bb[i];
}

}  // namespace troupe::compute
