// Dispatch and the portable build of the attention kernel (compute/detail/attend_simd.h).
#include "compute/vec_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "compute/detail/act_simd.h"
#include "compute/detail/attend_simd.h"
#include "compute/detail/delta_rule_simd.h"
#include "compute/matmul.h"
#include "model/ggml_types.h"

namespace troupe::compute {

namespace {

// Eight lanes in plain C++ (no instruction-set assumptions): the portable level.
struct Portable {
  static constexpr int kLanes = 8;
  struct Reg {
    float v[8];
  };
  template <class F>
  static Reg map(F f) {
    Reg r;
    for (int i = 0; i < 8; ++i) r.v[i] = f(i);
    return r;
  }
  static Reg zero() { return set1(0.0f); }
  static Reg set1(float f) {
    return map([&](int) { return f; });
  }
  static Reg load(const float* p) {
    return map([&](int i) { return p[i]; });
  }
  static Reg load_n(const float* p, int k) {
    return map([&](int i) { return i < k ? p[i] : 0.0f; });
  }
  static Reg load_f16(const uint16_t* h) {
    return map([&](int i) { return model::fp16_to_fp32(h[i]); });
  }
  static Reg load_bf16(const uint16_t* h) {
    return map([&](int i) { return model::bf16_to_fp32(h[i]); });
  }
  static void store(float* p, const Reg& r) { std::memcpy(p, r.v, sizeof r.v); }
  static void store_n(float* p, const Reg& r, int k) {
    std::memcpy(p, r.v, static_cast<size_t>(k) * sizeof(float));
  }
  static Reg add(const Reg& a, const Reg& b) {
    return map([&](int i) { return a.v[i] + b.v[i]; });
  }
  static Reg sub(const Reg& a, const Reg& b) {
    return map([&](int i) { return a.v[i] - b.v[i]; });
  }
  static Reg mul(const Reg& a, const Reg& b) {
    return map([&](int i) { return a.v[i] * b.v[i]; });
  }
  static Reg max(const Reg& a, const Reg& b) {
    return map([&](int i) { return a.v[i] > b.v[i] ? a.v[i] : b.v[i]; });
  }
  static Reg div(const Reg& a, const Reg& b) {
    return map([&](int i) { return a.v[i] / b.v[i]; });
  }
  static Reg select_nonneg(const Reg& x, const Reg& a, const Reg& b) {
    return map([&](int i) { return x.v[i] >= 0.0f ? a.v[i] : b.v[i]; });
  }
  static Reg fmadd(const Reg& a, const Reg& b, const Reg& c) {
    return map([&](int i) { return a.v[i] * b.v[i] + c.v[i]; });
  }
  static float tree(Reg r) {
    for (int w = 4; w >= 1; w /= 2)
      for (int i = 0; i < w; ++i) r.v[i] += r.v[i + w];
    return r.v[0];
  }
  static float hsum(const Reg& r) { return tree(r); }
  static float hmax(const Reg& r) { return *std::max_element(r.v, r.v + 8); }
  static Reg lane_sums(Reg (&a)[8]) {
    return map([&](int i) { return tree(a[i]); });
  }
  // e^x for x <= 0 as in the SIMD files: x = n ln2 + r, a degree-6 polynomial, 2^n in the
  // exponent bits; below -87 it is 0, a NaN stays NaN.
  static Reg exp_nonpos(const Reg& in) {
    return map([&](int i) {
      const float x0 = in.v[i];
      const float x = x0 < -87.0f ? -87.0f : x0;  // a NaN x0 is kept
      const float n = std::floor(x * 1.44269504088896341f + 0.5f);
      float r = x - n * 0.693145751953125f;
      r = r - n * 1.42860682030941723212e-6f;
      float p = 1.0f / 720;
      for (const float c : {1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f}) p = p * r + c;
      if (x0 < -87.0f) return 0.0f;
      const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
      float scale;
      std::memcpy(&scale, &bits, sizeof scale);
      return p * scale;
    });
  }
};

// The function built for the level the matmul kernels use (TROUPE_SIMD applies to all), each
// chosen once.
template <class Fn>
Fn for_level(Fn (*avx512)(), Fn (*avx2)(), Fn portable) {
  const std::string_view level = simd_level();
  if (level == "avx512") return avx512();
  if (level == "avx2") return avx2();
  return portable;
}

detail::AttendFn attend_fn() {
  static const detail::AttendFn f = for_level<detail::AttendFn>(
      detail::attend_avx512, detail::attend_avx2, detail::attend_simd<Portable>);
  return f;
}

detail::SoftmaxFn softmax_fn() {
  static const detail::SoftmaxFn f = for_level<detail::SoftmaxFn>(
      detail::softmax_avx512, detail::softmax_avx2, detail::softmax_rows_simd<Portable>);
  return f;
}

detail::SiluMulFn silu_mul_fn() {
  static const detail::SiluMulFn f = for_level<detail::SiluMulFn>(
      detail::silu_mul_avx512, detail::silu_mul_avx2, detail::silu_mul_simd<Portable>);
  return f;
}

void round_to_f16_portable(const float* x, uint16_t* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = model::fp32_to_fp16(x[i]);
}

detail::RoundF16Fn round_to_f16_fn() {
  static const detail::RoundF16Fn f = for_level<detail::RoundF16Fn>(
      detail::round_to_f16_avx512, detail::round_to_f16_avx2, round_to_f16_portable);
  return f;
}

}  // namespace

void round_to_f16(const float* x, uint16_t* out, int64_t n) { round_to_f16_fn()(x, out, n); }

void silu_mul(float* g, const float* u, int64_t n) { silu_mul_fn()(g, u, n); }

void delta_rule_steps(float* S, int64_t dk, int64_t dv, int64_t n, const float* k, const float* q,
                      const float* v, int64_t v_stride, const float* decay, const float* beta,
                      float* o, int64_t o_stride) {
  static const detail::DeltaRuleFn f = for_level<detail::DeltaRuleFn>(
      detail::delta_rule_avx512, detail::delta_rule_avx2, detail::delta_rule_simd<Portable>);
  f(S, dk, dv, n, k, q, v, v_stride, decay, beta, o, o_stride);
}

void softmax_rows(float* p, int64_t rows, int64_t n, float scale) {
  softmax_fn()(p, rows, n, scale);
}

void attend_heads(const float* q, int64_t q_stride, int64_t g, int64_t dk, const KvView& kv,
                  int64_t n, float scale, int64_t dv, float* out, int64_t out_stride) {
  attend_fn()(q, q_stride, g, dk, kv, n, scale, dv, out, out_stride);
}

}  // namespace troupe::compute
