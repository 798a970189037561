// AVX2 matmul kernels for Q2_K, Q3_K and IQ4_XS: their row kernels, which matmul_avx2.cc's
// kernel set takes with its int8 super-block activations (quantize_actk). Q4_K, Q5_K and Q6_K
// rows are read by their tile kernels (matmul_tiles_k_avx2.cc).
// Compiled with -mavx2 -mfma -mf16c (compute/CMakeLists.txt).
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "compute/detail/matmul_kernels.h"
#include "compute/detail/matmul_tiles.h"
#include "compute/detail/simd_hsum.h"

namespace troupe::compute::detail {
namespace {

using model::kQK_K;

// ------------------------------------------------------------------------------------------
// K-quants: a super-block (256 values) is 8 steps of 32 values. Per step: pair products of
// the unsigned weight values with the int8 activations (vpmaddubsw), each pair times its
// sub-block's scale into int32 lanes (vpmaddwd): exact. Per super-block:
// acc = fma(float(lanes), d * x_scale, acc), then two FMAs of corr with the activations'
// d*sum(x) per 16 values (groups 0-7, then 8-15) for the min/offset term. Then hsum8.
// A row's super-block header (scales, mins, offset factors) is unpacked in vector registers:
// built with scalar stores and read back as vectors, as first written, it cost a third to a
// half of the products' time (docs/benchmarks.md "Engine, session 34").

// The scales of step q of a type with 16 groups of 16 (sc16: group g's scale in int16 word g):
// group 2q's in the low 8 words, 2q + 1's in the high 8, for vpmaddwd against the step's pairs.
// Dword q of sc16 holds both; one permute copies it everywhere and one shuffle splits it.
inline __m256i step_scales(__m256i sc16, int q) {
  const __m256i pair = _mm256_permutevar8x32_epi32(sc16, _mm256_set1_epi32(q));
  return _mm256_shuffle_epi8(
      pair, _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3,
                             2, 3, 2, 3, 2, 3, 2, 3));
}

// 16 int8 or uint8 values as floats times f (one rounding each): lanes of groups 0-7 and 8-15.
template <bool kSigned>
inline void times16(__m128i v, float f, __m256* lo, __m256* hi) {
  const __m256 fv = _mm256_set1_ps(f);
  const __m128i h = _mm_unpackhi_epi64(v, v);
  if constexpr (kSigned) {
    *lo = _mm256_mul_ps(fv, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)));
    *hi = _mm256_mul_ps(fv, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(h)));
  } else {
    *lo = _mm256_mul_ps(fv, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)));
    *hi = _mm256_mul_ps(fv, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(h)));
  }
}

// Q2_K and Q3_K (kQ3): value e = 128n + 32j + l of a super-block is 2 bits of qs[32n + l] at
// bit 2j (Q3_K: and bit 4n + j of hmask[l] as its bit 2, giving u in [0, 7]); a scale per group
// of 16. Q2_K: d*sc*q - dmin*m; Q3_K: d*s*(u - 4) with s signed.
template <bool kQ3>
struct LowBitDecode {
  using Block = std::conditional_t<kQ3, model::BlockQ3_K, model::BlockQ2_K>;
  struct Row {
    const Block* b;
    float d;
    __m256i sc16;             // group g's scale in int16 word g
    __m256 corr_lo, corr_hi;  // group g: Q2_K -dmin*m[g], Q3_K -4*d*s[g]
  };
  static Row prepare(const uint8_t* row, int64_t s) {
    Row r;
    r.b = reinterpret_cast<const Block*>(row) + s;
    r.d = _cvtsh_ss(r.b->d);
    if constexpr (kQ3) {
      alignas(16) int8_t sc[16];
      model::q3k_scales(r.b->scales, sc);
      const __m128i v = _mm_load_si128(reinterpret_cast<const __m128i*>(sc));
      r.sc16 = _mm256_cvtepi8_epi16(v);
      times16<true>(v, -4.f * r.d, &r.corr_lo, &r.corr_hi);  // -4 * d exact
    } else {
      // Byte g: the scale in the low nibble, the min in the high one.
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r.b->scales));
      const __m128i m4 = _mm_set1_epi8(0x0F);
      r.sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(v, m4));
      times16<false>(_mm_and_si128(_mm_srli_epi16(v, 4), m4), -_cvtsh_ss(r.b->dmin), &r.corr_lo,
                     &r.corr_hi);
    }
    return r;
  }
  // Step q: values 32q..32q+31 (n = q/4, j = q%4); scales: group 2q for int16 words 0-7, 2q+1
  // for 8-15.
  static void step(const Row& r, int q, __m256i& w, __m256i& sc) {
    const int n = q / 4, j = q % 4;
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r.b->qs + 32 * n));
    w = _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * j)), _mm256_set1_epi8(3));
    if constexpr (kQ3) {
      const __m256i hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r.b->hmask));
      const __m256i hb =
          _mm256_and_si256(_mm256_srl_epi16(hm, _mm_cvtsi32_si128(4 * n + j)), _mm256_set1_epi8(1));
      w = _mm256_or_si256(w, _mm256_slli_epi16(hb, 2));
    }
    sc = step_scales(r.sc16, q);
  }
};

// IQ4_XS: 8 sub-blocks of 32 values, each 16 bytes of indices into model::kIQ4Values (low
// nibbles values 0-15, high 16-31) with a signed 6-bit scale. Signed weights (kSigned): the
// kernel multiplies their magnitudes with sign-flipped activations. No offset term.
struct IQ4XSDecode {
  static constexpr bool kSigned = true;
  struct Row {
    const model::BlockIQ4_XS* b;
    float d;
    int16_t sc[8];
    __m256 corr_lo, corr_hi;
  };
  static Row prepare(const uint8_t* row, int64_t s) {
    Row r;
    r.b = reinterpret_cast<const model::BlockIQ4_XS*>(row) + s;
    r.d = _cvtsh_ss(r.b->d);
    // model::iq4xs_scale for j = 0..7 at once: byte j takes nibble j of scales_l (low nibbles
    // are the even j) and, at bits 4-5, bits 2j..2j+1 of scales_h (spread by three shifts).
    uint32_t l = 0;
    std::memcpy(&l, r.b->scales_l, sizeof l);
    const __m128i v = _mm_cvtsi32_si128(static_cast<int>(l));
    const __m128i m4 = _mm_set1_epi8(0x0F);
    const __m128i lo =
        _mm_unpacklo_epi8(_mm_and_si128(v, m4), _mm_and_si128(_mm_srli_epi16(v, 4), m4));
    uint64_t h = r.b->scales_h;
    h = (h & 0xFF) | (h & 0xFF00) << 24;      // fields 0-3 in byte 0, 4-7 in byte 4
    h = (h | h << 12) & 0x000F000F000F000Fu;  // two fields per 16 bits
    h = (h | h << 6) & 0x0303030303030303u;   // one field per byte
    const __m128i u = _mm_or_si128(lo, _mm_cvtsi64_si128(static_cast<int64_t>(h << 4)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(r.sc),
                     _mm_cvtepi8_epi16(_mm_sub_epi8(u, _mm_set1_epi8(32))));
    r.corr_lo = r.corr_hi = _mm256_setzero_ps();
    return r;
  }
  // Step q: sub-block q, from qs[16q..16q+15]: low nibbles (values 0-15), then high (16-31).
  static void step(const Row& r, int q, __m256i& w, __m256i& sc) {
    const __m256i z = _mm256_broadcastsi128_si256(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(r.b->qs + 16 * q)));
    const __m256i idx = _mm256_and_si256(_mm256_srlv_epi64(z, _mm256_setr_epi64x(0, 0, 4, 4)),
                                         _mm256_set1_epi8(0x0F));
    const __m256i table = _mm256_broadcastsi128_si256(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(model::kIQ4Values)));
    w = _mm256_shuffle_epi8(table, idx);
    sc = _mm256_set1_epi16(r.sc[q]);
  }
};

template <class D>
struct KQuantKernel {
  static constexpr int kRows = 2;
  static constexpr int kToks = 4;
  static constexpr int64_t kTokBlock = 64;
  static constexpr bool kSigned = requires { D::kSigned; };

  template <int R, int NT>
  static void tile(const MatmulJob& j, int64_t r, int64_t t) {
    const uint8_t* w[R];
    const uint8_t* x[NT];
    for (int i = 0; i < R; ++i) w[i] = j.w + (r + i) * j.w_row_bytes;
    for (int n = 0; n < NT; ++n) x[n] = j.act + (t + n) * j.act_stride;
    __m256 acc[R][NT];
    for (int i = 0; i < R; ++i)
      for (int n = 0; n < NT; ++n) acc[i][n] = _mm256_setzero_ps();
    const int64_t pf = R * j.w_row_bytes;  // the same place in the next tile's rows
    for (int64_t s = 0; s < j.cols / kQK_K; ++s) {
      typename D::Row rows[R];
      for (int i = 0; i < R; ++i) {
        rows[i] = D::prepare(w[i], s);
        prefetch(rows[i].b, pf, sizeof(*rows[i].b));
      }
      __m256i isum[R][NT];
      for (int i = 0; i < R; ++i)
        for (int n = 0; n < NT; ++n) isum[i][n] = _mm256_setzero_si256();
      for (int q = 0; q < 8; ++q) {
        // Signed weights (D::kSigned, IQ4_XS): their magnitudes times the activations with
        // the weights' signs (no weight is 0).
        __m256i wq[R], sc[R], sg[R];
        for (int i = 0; i < R; ++i) {
          D::step(rows[i], q, wq[i], sc[i]);
          sg[i] = wq[i];
          if constexpr (kSigned) wq[i] = _mm256_abs_epi8(wq[i]);
        }
        for (int n = 0; n < NT; ++n) {
          const __m256i xq =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[n] + s * kActKBytes + 32 * q));
          for (int i = 0; i < R; ++i) {
            // Pair sums below 2 * 127 * 127 < 2^15: no saturation.
            const __m256i pairs =
                _mm256_maddubs_epi16(wq[i], kSigned ? _mm256_sign_epi8(xq, sg[i]) : xq);
            isum[i][n] = _mm256_add_epi32(isum[i][n], _mm256_madd_epi16(pairs, sc[i]));
          }
        }
      }
      for (int n = 0; n < NT; ++n) {
        const uint8_t* a = x[n] + s * kActKBytes;
        float dx;
        std::memcpy(&dx, a + 320, sizeof(dx));
        const auto* bs = reinterpret_cast<const float*>(a + 256);
        const __m256 lo = _mm256_loadu_ps(bs), hi = _mm256_loadu_ps(bs + 8);
        for (int i = 0; i < R; ++i) {
          const __m256 scale = _mm256_set1_ps(rows[i].d * dx);
          acc[i][n] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[i][n]), scale, acc[i][n]);
          acc[i][n] = _mm256_fmadd_ps(rows[i].corr_lo, lo, acc[i][n]);
          acc[i][n] = _mm256_fmadd_ps(rows[i].corr_hi, hi, acc[i][n]);
        }
      }
    }
    for (int n = 0; n < NT; ++n)
      for (int i = 0; i < R; ++i) j.y[(t + n) * j.y_stride + r + i] = hsum8(acc[i][n]);
  }
};

template <class K>
void set_rows(TypeKernels* k) {
  k->rows = tiled_rows<K>;
  k->row_tile = K::kRows;
}

}  // namespace

void avx2_kquant_rows(KernelSet* s) {
  set_rows<KQuantKernel<IQ4XSDecode>>(&s->iq4_xs);
  set_rows<KQuantKernel<LowBitDecode<false>>>(&s->q2_k);
  set_rows<KQuantKernel<LowBitDecode<true>>>(&s->q3_k);
}

}  // namespace troupe::compute::detail
