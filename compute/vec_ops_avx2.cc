// The attention kernel built for AVX2 + FMA (this file is compiled with -mavx2 -mfma; it is
// called only when the CPU has them). The algorithm is compute/detail/attend_simd.h.
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

struct Avx2 {
  static constexpr int kLanes = 8;
  using Reg = __m256;
  // Lanes [0, k) set: the mask of maskload/maskstore.
  static __m256i first(int k) {
    alignas(32) static constexpr int32_t kTable[16] = {-1, -1, -1, -1, -1, -1, -1, -1,
                                                       0,  0,  0,  0,  0,  0,  0,  0};
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kTable + 8 - k));
  }
  static Reg zero() { return _mm256_setzero_ps(); }
  static Reg set1(float f) { return _mm256_set1_ps(f); }
  static Reg load(const float* p) { return _mm256_loadu_ps(p); }
  static Reg load_n(const float* p, int k) { return _mm256_maskload_ps(p, first(k)); }
  static Reg load_f16(const uint16_t* h) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)));
  }
  static Reg load_bf16(const uint16_t* h) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  static void store(float* p, Reg r) { _mm256_storeu_ps(p, r); }
  static void store_n(float* p, Reg r, int k) { _mm256_maskstore_ps(p, first(k), r); }
  static Reg add(Reg a, Reg b) { return _mm256_add_ps(a, b); }
  static Reg sub(Reg a, Reg b) { return _mm256_sub_ps(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm256_mul_ps(a, b); }
  static Reg max(Reg a, Reg b) { return _mm256_max_ps(a, b); }
  static Reg div(Reg a, Reg b) { return _mm256_div_ps(a, b); }
  // x >= 0 ? a : b, lane by lane (a NaN x takes b).
  static Reg select_nonneg(Reg x, Reg a, Reg b) {
    return _mm256_blendv_ps(b, a, _mm256_cmp_ps(x, zero(), _CMP_GE_OQ));
  }
  static Reg fmadd(Reg a, Reg b, Reg c) { return _mm256_fmadd_ps(a, b, c); }
  static float hsum(Reg r) { return hsum8(r); }
  static float hmax(Reg r) {
    __m128 b = _mm_max_ps(_mm256_castps256_ps128(r), _mm256_extractf128_ps(r, 1));
    b = _mm_max_ps(b, _mm_movehl_ps(b, b));
    b = _mm_max_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
  }

  // Lane i of the result: the sum of every lane of a[i] (folds as in the AVX-512 file).
  static Reg lane_sums(Reg (&a)[8]) {
    Reg t[4], u[2];
    for (int i = 0; i < 4; ++i)
      t[i] = _mm256_add_ps(_mm256_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                           _mm256_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    for (int i = 0; i < 2; ++i) {
      const __m256d x = _mm256_castps_pd(t[2 * i]), y = _mm256_castps_pd(t[2 * i + 1]);
      u[i] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(x, y)),
                           _mm256_castpd_ps(_mm256_unpackhi_pd(x, y)));
    }
    return _mm256_add_ps(_mm256_permute2f128_ps(u[0], u[1], 0x20),
                         _mm256_permute2f128_ps(u[0], u[1], 0x31));
  }

  // e^x for x <= 0 as in the AVX-512 file, with 2^n built in the exponent bits.
  static Reg exp_nonpos(Reg x) {
    const Reg tiny = _mm256_cmp_ps(x, set1(-87.0f), _CMP_LT_OQ);
    x = _mm256_max_ps(set1(-87.0f), x);  // a NaN x is kept (max returns its second operand)
    const Reg n = _mm256_floor_ps(_mm256_fmadd_ps(x, set1(1.44269504088896341f), set1(0.5f)));
    Reg r = _mm256_fnmadd_ps(n, set1(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(n, set1(1.42860682030941723212e-6f), r);
    Reg p = set1(1.0f / 720);
    p = _mm256_fmadd_ps(p, r, set1(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, set1(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, set1(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, set1(0.5f));
    p = _mm256_fmadd_ps(p, r, set1(1.0f));
    p = _mm256_fmadd_ps(p, r, set1(1.0f));
    const __m256i bits =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(tiny, _mm256_mul_ps(p, _mm256_castsi256_ps(bits)));
  }
};

// round_to_f16 with F16C, 8 values per conversion; a chunk holding a NaN goes through the scalar
// function (as in the AVX-512 file).
void round_to_f16_simd(const float* x, uint16_t* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) == 0) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                       _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    } else {
      for (int64_t k = i; k < i + 8; ++k) out[k] = model::fp32_to_fp16(x[k]);
    }
  }
  for (; i < n; ++i) out[i] = model::fp32_to_fp16(x[i]);
}

}  // namespace

AttendFn attend_avx2() { return attend_simd<Avx2>; }
SoftmaxFn softmax_avx2() { return softmax_rows_simd<Avx2>; }
SiluMulFn silu_mul_avx2() { return silu_mul_simd<Avx2>; }
DeltaRuleFn delta_rule_avx2() { return delta_rule_simd<Avx2>; }
RoundF16Fn round_to_f16_avx2() { return round_to_f16_simd; }

}  // namespace troupe::compute::detail
