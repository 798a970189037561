// The attention kernel built for AVX-512 (this file is compiled with -mavx512f and friends; it
// is called only when the CPU has them). The algorithm is compute/detail/attend_simd.h.
#include <immintrin.h>

#include <cstdint>

#include "compute/detail/act_simd.h"
#include "compute/detail/attend_simd.h"
#include "compute/detail/delta_rule_simd.h"
#include "compute/detail/simd_hsum.h"
#include "compute/vec_ops.h"
#include "model/ggml_types.h"

namespace troupe::compute::detail {
namespace {

struct Avx512 {
  static constexpr int kLanes = 16;
  using Reg = __m512;
  static __mmask16 first(int k) { return static_cast<__mmask16>((1u << k) - 1u); }
  static Reg zero() { return _mm512_setzero_ps(); }
  static Reg set1(float f) { return _mm512_set1_ps(f); }
  static Reg load(const float* p) { return _mm512_loadu_ps(p); }
  static Reg load_n(const float* p, int k) { return _mm512_maskz_loadu_ps(first(k), p); }
  static Reg load_f16(const uint16_t* h) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h)));
  }
  static Reg load_bf16(const uint16_t* h) {
    const __m512i w =
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
  static void store(float* p, Reg r) { _mm512_storeu_ps(p, r); }
  static void store_n(float* p, Reg r, int k) { _mm512_mask_storeu_ps(p, first(k), r); }
  static Reg add(Reg a, Reg b) { return _mm512_add_ps(a, b); }
  static Reg sub(Reg a, Reg b) { return _mm512_sub_ps(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm512_mul_ps(a, b); }
  static Reg max(Reg a, Reg b) { return _mm512_max_ps(a, b); }
  static Reg div(Reg a, Reg b) { return _mm512_div_ps(a, b); }
  // x >= 0 ? a : b, lane by lane (a NaN x takes b).
  static Reg select_nonneg(Reg x, Reg a, Reg b) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, zero(), _CMP_GE_OQ), b, a);
  }
  static Reg fmadd(Reg a, Reg b, Reg c) { return _mm512_fmadd_ps(a, b, c); }
  static float hsum(Reg r) { return hsum16(r); }
  static float hmax(Reg r) { return _mm512_reduce_max_ps(r); }

  // Lane i of the result: the sum of every lane of a[i]. Pairs of registers are folded within
  // 128-bit chunks (unpack), then chunks are folded across registers (shuffle_f32x4).
  static Reg lane_sums(Reg (&a)[16]) {
    Reg t[8], u[4];
    for (int i = 0; i < 8; ++i)
      t[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                           _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    for (int i = 0; i < 4; ++i) {
      const __m512d x = _mm512_castps_pd(t[2 * i]), y = _mm512_castps_pd(t[2 * i + 1]);
      u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                           _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    // u[i], chunk c: the chunk-c sums of a[4i .. 4i+3].
    constexpr int kEven = _MM_SHUFFLE(2, 0, 2, 0), kOdd = _MM_SHUFFLE(3, 1, 3, 1);
    const Reg w0 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], kEven),
                                 _mm512_shuffle_f32x4(u[0], u[1], kOdd));
    const Reg w1 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], kEven),
                                 _mm512_shuffle_f32x4(u[2], u[3], kOdd));
    return _mm512_add_ps(_mm512_shuffle_f32x4(w0, w1, kEven), _mm512_shuffle_f32x4(w0, w1, kOdd));
  }

  // e^x for x <= 0: x = n ln2 + r, a degree-6 polynomial for e^r, scaled by 2^n (vscalefps).
  // Below -87 the result is 0; a NaN stays NaN.
  static Reg exp_nonpos(Reg x) {
    const __mmask16 tiny = _mm512_cmp_ps_mask(x, set1(-87.0f), _CMP_LT_OQ);
    x = _mm512_max_ps(set1(-87.0f), x);  // a NaN x is kept (max returns its second operand)
    const Reg n = _mm512_roundscale_ps(_mm512_fmadd_ps(x, set1(1.44269504088896341f), set1(0.5f)),
                                       _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    Reg r = _mm512_fnmadd_ps(n, set1(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, set1(1.42860682030941723212e-6f), r);
    Reg p = set1(1.0f / 720);
    p = _mm512_fmadd_ps(p, r, set1(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, set1(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, set1(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, set1(0.5f));
    p = _mm512_fmadd_ps(p, r, set1(1.0f));
    p = _mm512_fmadd_ps(p, r, set1(1.0f));
    return _mm512_mask_mov_ps(_mm512_scalef_ps(p, n), tiny, zero());
  }
};

// round_to_f16: 16 values per conversion (round to nearest even, as model::fp32_to_fp16); a
// chunk holding a NaN goes through the scalar function, which makes every NaN 0x7e00 (F16C
// would keep its payload).
void round_to_f16_simd(const float* x, uint16_t* out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    if (_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) == 0) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                          _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    } else {
      for (int64_t k = i; k < i + 16; ++k) out[k] = model::fp32_to_fp16(x[k]);
    }
  }
  for (; i < n; ++i) out[i] = model::fp32_to_fp16(x[i]);
}

}  // namespace

AttendFn attend_avx512() { return attend_simd<Avx512>; }
SoftmaxFn softmax_avx512() { return softmax_rows_simd<Avx512>; }
SiluMulFn silu_mul_avx512() { return silu_mul_simd<Avx512>; }
DeltaRuleFn delta_rule_avx512() { return delta_rule_simd<Avx512>; }
RoundF16Fn round_to_f16_avx512() { return round_to_f16_simd; }

}  // namespace troupe::compute::detail
