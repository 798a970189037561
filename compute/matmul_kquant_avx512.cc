// AVX-512 kernels for the K-quant weight types (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K): int8 activations
// per 256-value super-block and exact integer products, as the other quantized kernels
// (matmul_avx512.cc).
// With VNNI, Q4_K, Q5_K and Q6_K run the tile kernels instead (matmul_tiles_k_avx512.cc,
// matmul_tiles_q6k_avx512.cc).
// Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq (compute/CMakeLists.txt).
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "compute/detail/avx512_common.h"
#include "compute/detail/matmul_kernels.h"
#include "compute/detail/matmul_tiles.h"
#include "compute/detail/simd_hsum.h"

namespace troupe::compute::detail {
namespace {

using model::BlockQ4_K;
using model::BlockQ5_K;
using model::BlockQ6_K;
using model::kQK_K;

// Activations for K-quants, per 256 values (kActKBytes, compute/detail/matmul_kernels.h).

int64_t actk_bytes(int64_t cols) { return cols / kQK_K * kActKBytes; }

void quantize_actk(const float* x, int64_t cols, uint8_t* out) {
  for (int64_t s = 0; s < cols / kQK_K; ++s) {
    uint8_t* a = out + s * kActKBytes;
    __m512i q[16];
    const float d = quantize_vecs(x + s * kQK_K, 16, q);
    float* bs = reinterpret_cast<float*>(a + 256);
    for (int g = 0; g < 16; ++g) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(a + 16 * g), _mm512_cvtepi32_epi8(q[g]));
      bs[g] = d * static_cast<float>(_mm512_reduce_add_epi32(q[g]));
    }
    std::memcpy(a + 320, &d, sizeof(d));
  }
}

// ------------------------------------------------------------------------------------------
// K-quants. A super-block (256 values) is 4 steps of 64 values. Per step: pair products of
// the unsigned weight values with the int8 activations (vpmaddubsw), each pair times its
// sub-block's scale (int16) into int32 lanes (vpmaddwd + add): exact. Per
// super-block: acc = fma(float(lanes), d * x_scale, acc), then acc = fma(corr, x_sums, acc)
// for the min/offset term (per-16-group weight factor times the activations' d*sum(x)).
// Then hsum16.

// Q4_K and Q5_K (Block): the same scales and mins; Q5_K adds a fifth bit per value from qh.
template <class Block>
struct Q45KDecode {
  struct Row {
    const Block* b;
    float d;
    __m512i sc;   // int16 words 0-7: sc[0..7]
    __m512 corr;  // lane g: -dmin*m[g/2]
  };
  static Row prepare(const uint8_t* row, int64_t s) {
    Row r;
    r.b = reinterpret_cast<const Block*>(row) + s;
    const Q4kScaleBytes sm = q4k_scale_bytes(r.b->scales);  // sc[0..7], then m[0..7]
    const __m128i bytes = _mm_set_epi64x(static_cast<int64_t>(sm.mn), static_cast<int64_t>(sm.sc));
    r.sc = _mm512_castsi128_si512(_mm_cvtepu8_epi16(bytes));
    r.d = _cvtsh_ss(r.b->d);
    const __m512 m = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_srli_si128(bytes, 8)));
    r.corr = _mm512_mul_ps(
        _mm512_permutexvar_ps(_mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0), m),
        _mm512_set1_ps(-_cvtsh_ss(r.b->dmin)));
    return r;
  }
  // Step q: values 64q..64q+63 = the low nibbles (sub-block 2q) and high nibbles (2q+1) of
  // qs[32q..32q+31] (Q5_K: bits 2q and 2q+1 of qh[0..31] on top); scales by int16 word: 2q for
  // words 0-15, 2q+1 for 16-31.
  static void step(const Row& r, int q, __m512i& w, __m512i& sc) {
    const __m512i z = _mm512_broadcast_i64x4(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r.b->qs + 32 * q)));
    w = _mm512_and_si512(_mm512_srlv_epi64(z, _mm512_set_epi64(4, 4, 4, 4, 0, 0, 0, 0)),
                         _mm512_set1_epi8(0x0F));
    if constexpr (std::is_same_v<Block, BlockQ5_K>) {
      const __m512i qh =
          _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(r.b->qh)));
      const int64_t lo = 2 * q, hi = 2 * q + 1;
      const __m512i hb =
          _mm512_and_si512(_mm512_srlv_epi64(qh, _mm512_set_epi64(hi, hi, hi, hi, lo, lo, lo, lo)),
                           _mm512_set1_epi8(1));
      w = _mm512_or_si512(w, _mm512_slli_epi16(hb, 4));
    }
    sc = _mm512_permutexvar_epi16(
        _mm512_inserti64x4(_mm512_set1_epi16(static_cast<int16_t>(2 * q)),
                           _mm256_set1_epi16(static_cast<int16_t>(2 * q + 1)), 1),
        r.sc);
  }
};

// Step q's scales for types with one per group of 16 values (Q2_K, Q3_K, Q6_K), from the 16
// int16 words of `scales`: words 0-7 of the step's pair products take group 4q, 8-15 4q + 1,
// 16-23 4q + 2, 24-31 4q + 3.
inline __m512i group16_scales(int q, __m512i scales) {
  const auto g = static_cast<int16_t>(4 * q);
  const __m512i idx =
      _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(
                             _mm_set1_epi16(static_cast<int16_t>(g + 1)), _mm_set1_epi16(g))),
                         _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(g + 3)),
                                          _mm_set1_epi16(static_cast<int16_t>(g + 2))),
                         1);
  return _mm512_permutexvar_epi16(idx, scales);
}

// Q2_K and Q3_K (kQ3): value e = 128n + 32j + l of a super-block is 2 bits of qs[32n + l] at
// bit 2j (Q3_K: and bit 4n + j of hmask[l] as its bit 2, giving u in [0, 7]); a scale per group
// of 16. Q2_K: d*sc*q - dmin*m, corr lane g: -dmin*m[g]. Q3_K: d*s*(u - 4) with s signed, corr
// lane g: -4*d*s[g].
template <bool kQ3>
struct LowBitDecode {
  using Block = std::conditional_t<kQ3, model::BlockQ3_K, model::BlockQ2_K>;
  struct Row {
    const Block* b;
    float d;
    __m512i sc;   // int16 words 0-15: the group scales
    __m512 corr;  // lane g: the group's offset factor
  };
  static Row prepare(const uint8_t* row, int64_t s) {
    Row r;
    r.b = reinterpret_cast<const Block*>(row) + s;
    r.d = _cvtsh_ss(r.b->d);
    if constexpr (kQ3) {
      uint32_t w[4];
      model::q3k_scale_words(r.b->scales, w);
      const __m128i s8 = _mm_sub_epi8(_mm_set_epi32(static_cast<int>(w[3]), static_cast<int>(w[2]),
                                                    static_cast<int>(w[1]), static_cast<int>(w[0])),
                                      _mm_set1_epi8(32));
      r.sc = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(s8));
      r.corr =
          _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(s8)), _mm512_set1_ps(-4.f * r.d));
    } else {
      const __m128i b8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r.b->scales));
      const __m128i m4 = _mm_set1_epi8(0x0F);
      r.sc = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(_mm_and_si128(b8, m4)));
      const __m128i mn = _mm_and_si128(_mm_srli_epi16(b8, 4), m4);
      r.corr = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(mn)),
                             _mm512_set1_ps(-_cvtsh_ss(r.b->dmin)));
    }
    return r;
  }
  // Step q: values 64q..64q+63 = j = 2(q%2) (bytes 0-31) and j + 1 (32-63) of n = q/2.
  static void step(const Row& r, int q, __m512i& w, __m512i& sc) {
    const int n = q / 2;
    const int64_t j = 2 * (q % 2);
    const __m512i z = _mm512_broadcast_i64x4(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r.b->qs + 32 * n)));
    w = _mm512_and_si512(
        _mm512_srlv_epi64(z, _mm512_set_epi64(2 * j + 2, 2 * j + 2, 2 * j + 2, 2 * j + 2, 2 * j,
                                              2 * j, 2 * j, 2 * j)),
        _mm512_set1_epi8(3));
    if constexpr (kQ3) {
      const __m512i hm =
          _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(r.b->hmask)));
      const int64_t lo = 4 * n + j, hi = lo + 1;
      const __m512i hb =
          _mm512_and_si512(_mm512_srlv_epi64(hm, _mm512_set_epi64(hi, hi, hi, hi, lo, lo, lo, lo)),
                           _mm512_set1_epi8(1));
      w = _mm512_or_si512(w, _mm512_slli_epi16(hb, 2));
    }
    sc = group16_scales(q, r.sc);
  }
};

struct Q6KDecode {
  struct Row {
    const BlockQ6_K* b;
    float d;
    __m512i sc;   // int16 words 0-15: sc[0..15]
    __m512 corr;  // lane g: -32*d*sc[g]
  };
  static Row prepare(const uint8_t* row, int64_t s) {
    Row r;
    r.b = reinterpret_cast<const BlockQ6_K*>(row) + s;
    const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r.b->scales));
    r.sc = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(sc8));
    r.d = _cvtsh_ss(r.b->d);
    r.corr =
        _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc8)), _mm512_set1_ps(-32.f * r.d));
    return r;
  }
  // Step q: values 64q..64q+63 of the super-block. Half h = q/2 holds 128 values: ql[64h..]
  // gives the low 4 bits (low nibbles for even steps, high for odd), qh[32h..] the top 2
  // (bits 0-1 and 2-3 for the step's two 32-value halves in even steps, 4-5 and 6-7 in odd).
  // Scales by int16 word: group 4q + word/8.
  static void step(const Row& r, int q, __m512i& w, __m512i& sc) {
    const int h = q / 2;
    const __m512i ql = _mm512_loadu_si512(r.b->ql + 64 * h);
    const __m512i qh = _mm512_broadcast_i64x4(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r.b->qh + 32 * h)));
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512i lo, hb;
    if (q & 1) {
      lo = _mm512_and_si512(_mm512_srli_epi16(ql, 4), m4);
      hb = _mm512_srlv_epi64(qh, _mm512_set_epi64(6, 6, 6, 6, 4, 4, 4, 4));
    } else {
      lo = _mm512_and_si512(ql, m4);
      hb = _mm512_srlv_epi64(qh, _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0));
    }
    hb = _mm512_slli_epi16(_mm512_and_si512(hb, _mm512_set1_epi8(3)), 4);
    w = _mm512_or_si512(lo, hb);
    sc = group16_scales(q, r.sc);
  }
};

// IQ4_XS: 8 sub-blocks of 32 values, each 16 bytes of indices into model::kIQ4Values (low
// nibbles values 0-15, high 16-31) with a signed 6-bit scale. Signed weights (kSigned): the
// kernel multiplies their magnitudes with sign-flipped activations. No offset term (corr 0).
struct IQ4XSDecode {
  static constexpr bool kSigned = true;
  struct Row {
    const model::BlockIQ4_XS* b;
    float d;
    int16_t sc[8];
    __m512 corr;
  };
  static Row prepare(const uint8_t* row, int64_t s) {
    Row r;
    r.b = reinterpret_cast<const model::BlockIQ4_XS*>(row) + s;
    r.d = _cvtsh_ss(r.b->d);
    for (int j = 0; j < 8; ++j) r.sc[j] = static_cast<int16_t>(model::iq4xs_scale(*r.b, j));
    r.corr = _mm512_setzero_ps();
    return r;
  }
  // Step q: values 64q..64q+63 = sub-blocks 2q (bytes 0-31 of w) and 2q + 1 (32-63), from
  // qs[32q..32q+31]; 128-bit lanes: low nibbles of bytes 0-15, their high nibbles, then the
  // same of bytes 16-31. Scales by int16 word: 2q for words 0-15, 2q+1 for 16-31.
  static void step(const Row& r, int q, __m512i& w, __m512i& sc) {
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r.b->qs + 32 * q));
    const __m512i z = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3),
                                               _mm512_castsi256_si512(c));
    const __m512i idx = _mm512_and_si512(
        _mm512_srlv_epi64(z, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4)), _mm512_set1_epi8(0x0F));
    const __m512i table = _mm512_broadcast_i32x4(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(model::kIQ4Values)));
    w = _mm512_shuffle_epi8(table, idx);
    sc = _mm512_inserti64x4(_mm512_set1_epi16(r.sc[2 * q]), _mm256_set1_epi16(r.sc[2 * q + 1]), 1);
  }
};

template <class D>
struct KQuantKernel {
  static constexpr int kRows = 2;
  static constexpr int kToks = 4;
  static constexpr int64_t kTokBlock = 64;     // tiled_rows (few tokens)
  static constexpr int64_t kStreamBlock = 32;  // streaming (many tokens)

  // Signed weights (D::kSigned, IQ4_XS): step gives their magnitudes and the mask of the
  // negative ones, whose activations token_step negates.
  static constexpr bool kSigned = requires { D::kSigned; };
  static void step(const typename D::Row& r, int q, __m512i& w, __m512i& sc, __mmask64& neg) {
    D::step(r, q, w, sc);
    neg = 0;
    if constexpr (kSigned) {
      neg = _mm512_movepi8_mask(w);
      w = _mm512_abs_epi8(w);
    }
  }

  // The one arithmetic of an output for one super-block (both loop structures use it):
  // isum over the 4 steps (exact), then two FMAs.
  static __m512i token_step(__m512i isum, __m512i w, __m512i sc, __mmask64 neg, __m512i xq) {
    if constexpr (kSigned) xq = _mm512_mask_sub_epi8(xq, neg, _mm512_setzero_si512(), xq);
    // Pair sums below 2 * 127 * 127 < 2^15: no saturation.
    const __m512i pairs = _mm512_maddubs_epi16(w, xq);
    return _mm512_add_epi32(isum, _mm512_madd_epi16(pairs, sc));
  }
  static __m512 token_finish(const typename D::Row& row, __m512i isum, const uint8_t* a,
                             __m512 acc) {
    float dx;
    std::memcpy(&dx, a + 320, sizeof(dx));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(row.d * dx), acc);
    return _mm512_fmadd_ps(row.corr, _mm512_loadu_ps(a + 256), acc);
  }

  // Few tokens (decode): register tiles of kRows x kToks through tiled_rows.
  template <int R, int NT>
  static void tile(const MatmulJob& j, int64_t r, int64_t t) {
    const uint8_t* w[R];
    const uint8_t* x[NT];
    for (int i = 0; i < R; ++i) w[i] = j.w + (r + i) * j.w_row_bytes;
    for (int n = 0; n < NT; ++n) x[n] = j.act + (t + n) * j.act_stride;
    __m512 acc[R][NT];
    for (int i = 0; i < R; ++i)
      for (int n = 0; n < NT; ++n) acc[i][n] = _mm512_setzero_ps();
    const int64_t pf = 2 * R * j.w_row_bytes;  // the same place two tiles ahead
    for (int64_t s = 0; s < j.cols / kQK_K; ++s) {
      typename D::Row rows[R];
      for (int i = 0; i < R; ++i) {
        rows[i] = D::prepare(w[i], s);
        prefetch(rows[i].b, pf, sizeof(*rows[i].b));
      }
      __m512i isum[R][NT];
      for (int i = 0; i < R; ++i)
        for (int n = 0; n < NT; ++n) isum[i][n] = _mm512_setzero_si512();
      for (int q = 0; q < 4; ++q) {
        __m512i wq[R], sc[R];
        __mmask64 ng[R];
        for (int i = 0; i < R; ++i) step(rows[i], q, wq[i], sc[i], ng[i]);
        for (int n = 0; n < NT; ++n) {
          const __m512i xq = _mm512_loadu_si512(x[n] + s * kActKBytes + 64 * q);
          for (int i = 0; i < R; ++i) isum[i][n] = token_step(isum[i][n], wq[i], sc[i], ng[i], xq);
        }
      }
      for (int n = 0; n < NT; ++n)
        for (int i = 0; i < R; ++i)
          acc[i][n] = token_finish(rows[i], isum[i][n], x[n] + s * kActKBytes, acc[i][n]);
    }
    for (int n = 0; n < NT; ++n)
      for (int i = 0; i < R; ++i) j.y[(t + n) * j.y_stride + r + i] = hsum16(acc[i][n]);
  }

  // Many tokens: rows [r, r + R) for tokens [t0, t1) (at most kStreamBlock). Each row's
  // super-block is decoded once and then meets every token of the block; the accumulators
  // live in `acc`.
  template <int R>
  static void row_tile(const MatmulJob& j, int64_t r, int64_t t0, int64_t t1, __m512* acc) {
    const int64_t nt = t1 - t0;
    const uint8_t* w[R];
    for (int i = 0; i < R; ++i) w[i] = j.w + (r + i) * j.w_row_bytes;
    const int64_t pf = 2 * R * j.w_row_bytes;  // the same place two tiles ahead
    for (int64_t s = 0; s < j.cols / kQK_K; ++s) {
      const bool first = s == 0;  // starts every accumulator at zero (no zeroing pass first)
      typename D::Row rows[R];
      __m512i wq[R][4], sc[R][4];
      __mmask64 ng[R][4];
      for (int i = 0; i < R; ++i) {
        rows[i] = D::prepare(w[i], s);
        prefetch(rows[i].b, pf, sizeof(*rows[i].b));
        for (int q = 0; q < 4; ++q) step(rows[i], q, wq[i][q], sc[i][q], ng[i][q]);
      }
      for (int64_t n = 0; n < nt; ++n) {
        const uint8_t* a = j.act + (t0 + n) * j.act_stride + s * kActKBytes;
        __m512i isum[R];
        for (int i = 0; i < R; ++i) isum[i] = _mm512_setzero_si512();
        for (int q = 0; q < 4; ++q) {
          const __m512i xq = _mm512_loadu_si512(a + 64 * q);
          for (int i = 0; i < R; ++i)
            isum[i] = token_step(isum[i], wq[i][q], sc[i][q], ng[i][q], xq);
        }
        for (int i = 0; i < R; ++i)
          acc[i * nt + n] =
              token_finish(rows[i], isum[i], a, first ? _mm512_setzero_ps() : acc[i * nt + n]);
      }
    }
    for (int64_t n = 0; n < nt; ++n)
      for (int i = 0; i < R; ++i) j.y[(t0 + n) * j.y_stride + r + i] = hsum16(acc[i * nt + n]);
  }

  // Both loop structures compute every output with the same arithmetic (token_*), so which one
  // runs, chosen by n_tok, changes speed only: BatchInvariant tests pin it.
  static void rows(const MatmulJob& j, int64_t r0, int64_t r1) {
    if (j.n_tok <= kToks) {
      tiled_rows<KQuantKernel>(j, r0, r1);
      return;
    }
    alignas(64) __m512 acc[kRows * kStreamBlock];
    for (int64_t t0 = 0; t0 < j.n_tok; t0 += kStreamBlock) {
      const int64_t t1 = std::min(j.n_tok, t0 + kStreamBlock);
      int64_t r = r0;
      for (; r + kRows <= r1; r += kRows) row_tile<kRows>(j, r, t0, t1, acc);
      for (; r < r1; ++r) row_tile<1>(j, r, t0, t1, acc);
    }
  }
};

}  // namespace

void avx512_low_bit_kernels(TypeKernels* q2_k, TypeKernels* q3_k, TypeKernels* iq4_xs) {
  *q2_k = streaming_kernels<KQuantKernel<LowBitDecode<false>>>(actk_bytes, quantize_actk);
  *q3_k = streaming_kernels<KQuantKernel<LowBitDecode<true>>>(actk_bytes, quantize_actk);
  *iq4_xs = streaming_kernels<KQuantKernel<IQ4XSDecode>>(actk_bytes, quantize_actk);
}

void avx512_kquant_kernels(TypeKernels* q4_k, TypeKernels* q5_k, TypeKernels* q6_k) {
  *q4_k = streaming_kernels<KQuantKernel<Q45KDecode<BlockQ4_K>>>(actk_bytes, quantize_actk);
  *q5_k = streaming_kernels<KQuantKernel<Q45KDecode<BlockQ5_K>>>(actk_bytes, quantize_actk);
  *q6_k = streaming_kernels<KQuantKernel<Q6KDecode>>(actk_bytes, quantize_actk);
}

}  // namespace troupe::compute::detail
