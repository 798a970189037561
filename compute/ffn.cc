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

// Element by element (the same result on any split): on the pool once there is enough of it,
// as at 16 sequences (90k exp() per layer of the 1.1B shape; SiLU in SIMD, silu_mul, ~10x the
// scalar loop: docs/benchmarks.md "Engine, session 27").
void ffn_activation(const model::ModelSpec& s, float* g, float* u, int64_t n, ThreadPool* pool) {
  const float alpha = s.act_alpha, limit = s.act_limit;
  auto act = [&](int64_t b, int64_t e) {
    if (s.ffn_act == model::FfnAct::kSwigluOai) {
      for (int64_t i = b; i < e; ++i) {
        const float gi = std::min(g[i], limit), ui = std::clamp(u[i], -limit, limit);
        g[i] = gi * detail::sigmoid(alpha * gi) * (ui + 1.0f);
      }
    } else if (s.ffn_act == model::FfnAct::kSiluClamp) {  // DeepSeek-V4: clamped, then SwiGLU
      for (int64_t i = b; i < e; ++i) {
        g[i] = std::min(g[i], limit);
        u[i] = std::clamp(u[i], -limit, limit);
      }
      silu_mul(g + b, u + b, e - b);
    } else if (s.ffn_act == model::FfnAct::kGeluTanh) {
      for (int64_t i = b; i < e; ++i) g[i] = detail::gelu_tanh(g[i]) * u[i];
    } else {
      silu_mul(g + b, u + b, e - b);
    }
  };
  if (pool != nullptr && pool->size() > 1 && n >= kMinParallelActivations)
    pool->parallel_for(n, 64, act);
  else
    act(0, n);
}

}  // namespace

void gated_ffn(const model::ModelSpec& s, const model::ExpertFfn& f, const float* x, int64_t n,
               float* y, std::vector<float>& g, std::vector<float>& u, ThreadPool* pool) {
  const FfnTask task{&f, x, n, y};
  gated_ffns(s, {&task, 1}, g, u, pool);
}

// Per task, one product per projection (a fused interleaved one for gate_up) into its slice of
// g and u, all tasks' products in one matmul_many; the activation element by element over
// every slice at once; then every down product in one more matmul_many.
void gated_ffns(const model::ModelSpec& s, std::span<const FfnTask> tasks, std::vector<float>& g,
                std::vector<float>& u, ThreadPool* pool) {
  // Task i's activations: g and u from at[i], n * ff values each; an interleaved gate_up's
  // products first land in u past `total`, at total + 2 at[i] (2 n ff values).
  thread_local std::vector<int64_t> at;
  at.assign(tasks.size() + 1, 0);
  bool interleaved = false;
  for (size_t i = 0; i < tasks.size(); ++i) {
    at[i + 1] = at[i] + tasks[i].n * tasks[i].f->width();
    interleaved = interleaved || tasks[i].f->gate_up.present();
  }
  const int64_t total = at[tasks.size()];
  grow(g, total);
  grow(u, interleaved ? 3 * total : total);
  thread_local std::vector<MatmulProduct> products;
  products.clear();
  for (size_t i = 0; i < tasks.size(); ++i) {
    const FfnTask& t = tasks[i];
    const model::ExpertFfn& f = *t.f;
    const int64_t ff = f.width(), e = f.down.rows();
    if (f.gate_up.present()) {
      products.push_back({&f.gate_up, t.x, e, t.n, u.data() + total + 2 * at[i], 2 * ff});
    } else {
      products.push_back({&f.gate, t.x, e, t.n, g.data() + at[i], ff});
      products.push_back({&f.up, t.x, e, t.n, u.data() + at[i], ff});
    }
  }
  matmul_many(products, pool);
  for (size_t i = 0; i < tasks.size(); ++i) {
    const FfnTask& t = tasks[i];
    const model::ExpertFfn& f = *t.f;
    if (f.gate_up.present()) {
      // The interleaved rows' outputs: gate's (even) to g, up's (odd) to u. Every output is
      // the dot product of one weight row with x, as with separate matrices.
      float* gi = g.data() + at[i];
      const float* ui2 = u.data() + total + 2 * at[i];
      float* ui = u.data() + at[i];
      const int64_t m = at[i + 1] - at[i];
      for (int64_t j = 0; j < m; ++j) gi[j] = ui2[2 * j];
      for (int64_t j = 0; j < m; ++j) ui[j] = ui2[2 * j + 1];
    }
    add_rows(f.gate_b, g.data() + at[i], t.n);
    add_rows(f.up_b, u.data() + at[i], t.n);
  }
  ffn_activation(s, g.data(), u.data(), total, pool);
  products.clear();
  for (size_t i = 0; i < tasks.size(); ++i) {
    const FfnTask& t = tasks[i];
    const int64_t ff = t.f->width();
    products.push_back({&t.f->down, g.data() + at[i], ff, t.n, t.y, t.f->down.rows()});
  }
  matmul_many(products, pool);
  for (const FfnTask& t : tasks) add_rows(t.f->down_b, t.y, t.n);
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
