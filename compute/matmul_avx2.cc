// The AVX2 kernel set (with FMA and F16C): its float and IQ4_NL row kernels and the activation
// quantizers of every int8 kernel. Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K, in tiles
// or in ggml's rows, are read by the tile kernels (matmul_tiles_avx2.cc, matmul_tiles_k_avx2.cc);
// Q2_K, Q3_K and IQ4_XS by matmul_kquant_avx2.cc. Float weights use f32 activations with one
// 8-lane FMA accumulator per output; IQ4_NL uses int8 activations and exact integer dot products
// (vpmaddubsw + vpmaddwd), scaled into an 8-lane f32 accumulator per output. Compiled with -mavx2
// -mfma -mf16c (compute/CMakeLists.txt).
#include <immintrin.h>

#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <type_traits>
#include <vector>

#include "compute/detail/avx2_common.h"
#include "compute/detail/matmul_kernels.h"
#include "compute/detail/matmul_tiles.h"
#include "compute/detail/simd_hsum.h"

namespace troupe::compute::detail {
namespace {

using model::BlockQ8_0;
using model::GgmlType;
using model::kQK_K;

// int32 lanes: exact 4-byte dot products of unsigned a and signed b (pair sums < 2^15).
inline __m256i dot_u8s8(__m256i a, __m256i b) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1));
}

// ------------------------------------------------------------------------------------------
// Float weights (F32, F16, BF16). Output (r, t): lane l sums w[k]*x[k] for k = l (mod 8) in
// k order by FMA; the last partial chunk is zero-padded; then hsum8.

template <GgmlType kType>
struct FloatLoad;

template <>
struct FloatLoad<GgmlType::kF32> {
  static __m256 load(const uint8_t* row, int64_t k) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + k);
  }
};

template <>
struct FloatLoad<GgmlType::kF16> {
  static __m256 load(const uint8_t* row, int64_t k) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * k)));
  }
};

template <>
struct FloatLoad<GgmlType::kBF16> {
  static __m256 load(const uint8_t* row, int64_t k) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * k));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
};

// FP8 E4M3 as 1/256 of its value through an f16, exact for every code (subnormals too): the
// byte sign-extended to 16 bits and shifted left by 7 puts the sign at bit 15 (and 14, cleared)
// and the exponent and mantissa at bits 13-7 (f16's bias is 8 more: the 256). S.1111.111 (NaN):
// adding 1 at bit 7 carries into bit 14 only then, which completes an f16 NaN. The kernel's
// per-block scale carries the 256.
template <>
struct FloatLoad<GgmlType::kF8_E4M3> {
  static __m256 load(const uint8_t* row, int64_t k) {
    const __m128i w = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + k)));
    const __m128i h = _mm_and_si128(_mm_slli_epi16(w, 7), _mm_set1_epi16(-0x4080));  // 0xbf80
    const __m128i nan =
        _mm_and_si128(_mm_add_epi16(h, _mm_set1_epi16(0x80)), _mm_set1_epi16(0x4000));
    return _mm256_cvtph_ps(_mm_or_si128(h, nan));
  }
};

// The 8 nibbles of the 4 bytes holding values k..k+7 of a row packed two to a byte, low nibble
// first (I4_PACKED, FP4_PACKED), one per byte of the low 8 bytes.
inline __m128i nibbles8(const uint8_t* row, int64_t k) {
  int32_t word;
  std::memcpy(&word, row + k / 2, 4);
  const __m128i b = _mm_cvtsi32_si128(word);
  const __m128i m = _mm_set1_epi8(0x0f);
  return _mm_unpacklo_epi8(_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16(b, 4), m));
}

// Signed int4 (I4_PACKED), 8 values: the nibbles widened to int32 lanes; with the bits of 2^23
// OR-ed in they are the floats 2^23 + u, and subtracting 2^23 + 8 leaves u - 8 exactly.
template <>
struct FloatLoad<GgmlType::kI4_PACKED> {
  static __m256 load(const uint8_t* row, int64_t k) {
    const __m256i u =
        _mm256_or_si256(_mm256_cvtepu8_epi32(nibbles8(row, k)), _mm256_set1_epi32(0x4B000000));
    return _mm256_sub_ps(_mm256_castsi256_ps(u), _mm256_set1_ps(8388616.f));
  }
};

// Eight E2M1 codes (the low 8 bytes of `codes`, each 0-15) as floats of twice their value
// (model::kMXFP4Values: small integers, exact), looked up with one byte shuffle.
inline __m256 e2m1_doubled(__m128i codes) {
  const __m128i table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(model::kMXFP4Values));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_shuffle_epi8(table, codes)));
}

// FP4 E2M1 (FP4_PACKED), 8 values in I4_PACKED's nibble order, doubled (the kernel's scale
// factor is half the E8M0 scale).
template <>
struct FloatLoad<GgmlType::kFP4_PACKED> {
  static __m256 load(const uint8_t* row, int64_t k) { return e2m1_doubled(nibbles8(row, k)); }
};

// MXFP4 (GGUF's 17-byte blocks: the scale byte, then value j in byte j's low nibble and j + 16
// in its high one), 8 values at column k (a multiple of 8) as twice their E2M1 values; the
// kernel multiplies by the block's mxfp4_scale (half its E8M0 scale).
template <>
struct FloatLoad<GgmlType::kMXFP4> {
  static __m256 load(const uint8_t* row, int64_t k) {
    const uint8_t* qs = row + k / 32 * 17 + 1 + (k / 8 % 2) * 8;
    __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs));
    if (k / 16 % 2 != 0) b = _mm_srli_epi16(b, 4);
    return e2m1_doubled(_mm_and_si128(b, _mm_set1_epi8(0x0f)));
  }
};

// The last n < 8 values of a row, zero-padded, through the same conversion.
template <GgmlType kType>
__m256 load_tail(const uint8_t* row, int64_t k, int64_t n) {
  constexpr int64_t kSize = kType == GgmlType::kF32 ? 4 : kType == GgmlType::kF8_E4M3 ? 1 : 2;
  alignas(32) uint8_t buf[8 * kSize] = {};
  std::memcpy(buf, row + k * kSize, static_cast<size_t>(n * kSize));
  return FloatLoad<kType>::load(buf, 0);
}

// F8_E4M3, I4_PACKED, FP4_PACKED and MXFP4 weights are the same kernel on the values q * scale,
// each the nearest float to the exact product (for F8 one multiply of the exact fp8/256 by 256 *
// scale; MXFP4 twice its E2M1 value times half its scale, as model::dequantize_row), lane for
// lane as an F32 matrix holding those values: the same bits. I4 and FP4 rows are whole
// multiples of 16 (matmul.cc checks) and MXFP4 rows of 32, so they never take the tail.
// kTiled, I4_PACKED: the matrix in the AVX-512 kernels' tiles (model/weight_tiles.h: quads,
// 128 columns at a time, value 16s + d of a row's 64 bytes at nibble s of dword d), read here as
// two 32-byte halves: the 8 values at k are the half k / 8 % 2 shifted right by 4 (k % 128 / 16)
// and masked, in the lanes and order of rows (their bits). kTiled, F8_E4M3: the AVX-512 kernels'
// quads too (16 columns, 16 bytes per row, at a time), which hold no NaN code, no scale of 256 or
// more and few subnormal codes (model::f8_tiles_suit): as there, each byte widens straight to the
// f32 bits of fp8 * 2^-120, multiplied by 2^120 * scale, the product the rows form (their bits).
template <GgmlType kType, bool kTiled = false>
struct FloatKernel {
  using L = FloatLoad<kType>;
  static constexpr bool kF8 = kType == GgmlType::kF8_E4M3;
  // Two 4-bit values per byte (I4_PACKED, FP4_PACKED).
  static constexpr bool kI4 = kType == GgmlType::kI4_PACKED || kType == GgmlType::kFP4_PACKED;
  static constexpr bool kScaled = kF8 || kI4;             // a separate scale grid
  static constexpr bool kMx = kType == GgmlType::kMXFP4;  // a scale byte in every block
  // What a load is short of the value, per unit of scale: F8 loads fp8 / 256 (tiles: fp8 *
  // 2^-120), FP4 twice E2M1.
  static constexpr float kScaleFactor = kF8 ? (kTiled ? 0x1p120f : 256.f)
                                        : kType == GgmlType::kFP4_PACKED ? 0.5f
                                                                         : 1.f;
  // Bytes from the row start to column k (MXFP4: to its block).
  static constexpr int64_t offset(int64_t k) {
    return kMx ? k / 32 * 17 : kI4 ? k / 2 : kType == GgmlType::kF32 ? 4 * k : kF8 ? k : 2 * k;
  }
  // Tiled F8: whole quads (4 rows), 2 tokens a pass (8 sums, 4 weight vectors and x in the 16
  // registers). With 3 rows and 4 tokens, a pass read two quads' lines in part, and products of
  // 4-16 tokens ran 0.87-0.97x as fast as rows (docs/benchmarks.md "Engine, session 48").
  static constexpr int kRows = kTiled && kF8 ? 4 : 3;
  static constexpr int kToks = kTiled && kF8 ? 2 : 4;
  static constexpr int64_t kTokBlock = 48;
  static_assert(!kTiled || kType == GgmlType::kI4_PACKED || kF8);
  // Tiled: a quad's bytes of 128 columns (I4_PACKED) or of 16 (F8).
  static constexpr int64_t kQuadChunk = kF8 ? 4 * 16 : 4 * 64;

  // Tiled F8: the 8 values at p as fp8 * 2^-120 (the sign to bit 31, the exponent and mantissa
  // fields to bits 20-26).
  static __m256 f8_tiled_load(const uint8_t* p) {
    const __m256i d = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(d, 20),
                                                _mm256_set1_epi32(static_cast<int>(0x87F00000))));
  }

  // Tiled I4_PACKED: the 8 values of the 32-byte half at p, shifted right by `shift`
  // (4 (k % 128 / 16)).
  static __m256 i4_tiled_load(const uint8_t* p, __m128i shift) {
    const __m256i g = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i u =
        _mm256_or_si256(_mm256_and_si256(_mm256_srl_epi32(g, shift), _mm256_set1_epi32(0xF)),
                        _mm256_set1_epi32(0x4B000000));
    return _mm256_sub_ps(_mm256_castsi256_ps(u), _mm256_set1_ps(8388616.f));
  }

  template <int R, int NT>
  static void tile(const MatmulJob& j, int64_t r, int64_t t) {
    const uint8_t* w[R];
    const float* x[NT];
    for (int i = 0; i < R; ++i) {
      const int64_t row = r + i;
      w[i] = kTiled ? j.w + row / 4 * 4 * j.w_row_bytes + row % 4 * (kQuadChunk / 4)
                    : j.w + row * j.w_row_bytes;
    }
    for (int n = 0; n < NT; ++n)
      x[n] = reinterpret_cast<const float*>(j.act + (t + n) * j.act_stride);
    __m256 acc[R][NT];
    for (int i = 0; i < R; ++i)
      for (int n = 0; n < NT; ++n) acc[i][n] = _mm256_setzero_ps();
    // Scaled types: each row's scales, and the factor of the block k is in (the next from
    // k_next): the scale times kScaleFactor.
    const float* sc[R] = {};
    __m256 ds[R];
    for (int i = 0; i < R; ++i) ds[i] = _mm256_setzero_ps();
    int64_t k_next = 0;
    if constexpr (kScaled) {
      thread_local std::vector<float> tmp;
      float* buf = scratch(tmp, R * j.w_scale_stride);
      for (int i = 0; i < R; ++i) sc[i] = j.scale_row(r + i, buf + i * j.w_scale_stride);
    }
    auto scaled = [&](__m256 v, int i) {
      if constexpr (kScaled || kMx) return _mm256_mul_ps(v, ds[i]);
      return v;
    };
    auto next_scales = [&](int64_t k) {
      if constexpr (kMx) {
        if (k % 32 == 0)
          for (int i = 0; i < R; ++i) ds[i] = _mm256_set1_ps(model::mxfp4_scale(w[i][offset(k)]));
      } else if constexpr (kScaled) {
        if (k == k_next) {
          for (int i = 0; i < R; ++i)
            ds[i] = _mm256_set1_ps(kScaleFactor * sc[i][k / j.w_scale_cols]);
          k_next += j.w_scale_cols;
        }
      }
    };
    // The same place in the next tile's rows (tiled: two quads on).
    const int64_t pf = (kTiled ? 8 : R) * j.w_row_bytes;
    int64_t k = 0;
    for (; k + 8 <= j.cols; k += 8) {
      next_scales(k);
      __m256 wv[R];
      [[maybe_unused]] __m128i shift;
      if constexpr (kTiled && !kF8) shift = _mm_cvtsi32_si128(static_cast<int>(k % 128 / 16 * 4));
      for (int i = 0; i < R; ++i) {
        if constexpr (kTiled && kF8) {
          const uint8_t* c = w[i] + k / 16 * kQuadChunk;
          if (k % 16 == 0 && (r + i) % 4 == 0) prefetch(c, pf, 0);  // once per quad's line
          wv[i] = scaled(f8_tiled_load(c + k % 16), i);
        } else if constexpr (kTiled) {
          const uint8_t* g = w[i] + k / model::kNibbleTileCols * kQuadChunk;
          if (k % 128 == 0) prefetch(g, pf, 0);
          wv[i] = scaled(i4_tiled_load(g + k / 8 % 2 * 32, shift), i);
        } else {
          if (kMx ? k % 128 == 0 : (offset(k) & 63) == 0) prefetch(w[i] + offset(k), pf, 0);
          wv[i] = scaled(L::load(w[i], k), i);
        }
      }
      for (int n = 0; n < NT; ++n) {
        const __m256 xv = _mm256_loadu_ps(x[n] + k);
        for (int i = 0; i < R; ++i) acc[i][n] = _mm256_fmadd_ps(wv[i], xv, acc[i][n]);
      }
    }
    if constexpr (!kI4 && !kMx && !kTiled) {  // (tiled F8: columns a multiple of 16)
      if (k < j.cols) {
        next_scales(k);
        const int64_t rem = j.cols - k;
        __m256 wv[R];
        for (int i = 0; i < R; ++i) wv[i] = scaled(load_tail<kType>(w[i], k, rem), i);
        for (int n = 0; n < NT; ++n) {
          const __m256 xv =
              load_tail<GgmlType::kF32>(reinterpret_cast<const uint8_t*>(x[n]), k, rem);
          for (int i = 0; i < R; ++i) acc[i][n] = _mm256_fmadd_ps(wv[i], xv, acc[i][n]);
        }
      }
    }
    for (int n = 0; n < NT; ++n)
      for (int i = 0; i < R; ++i) j.y[(t + n) * j.y_stride + r + i] = hsum8(acc[i][n]);
  }
};

// ------------------------------------------------------------------------------------------
// Int8 activation quantization: scale amax/127, round to nearest even (vcvtps2dq); a block
// holding NaN or an infinity gets a NaN scale and zero values, so the output is NaN.

// Quantizes 8*n_vec floats into int8 q; returns the scale. Group sums of 16 go to gsum.
float quantize_block(const float* x, int n_vec, int8_t* q, int32_t* gsum16) {
  __m256 amax = _mm256_setzero_ps();
  int bad = 0;
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int i = 0; i < n_vec; ++i) {
    const __m256 v = _mm256_loadu_ps(x + 8 * i);
    bad |= _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    amax = _mm256_max_ps(amax, _mm256_and_ps(v, abs_mask));
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  const float m = _mm_cvtss_f32(m4);
  if (bad != 0 || !(m <= FLT_MAX)) {
    std::memset(q, 0, static_cast<size_t>(8 * n_vec));
    if (gsum16 != nullptr) std::memset(gsum16, 0, sizeof(int32_t) * static_cast<size_t>(n_vec / 2));
    return NAN;
  }
  const float inv = m > 0.f ? 127.f / m : 0.f;  // too small a block: zeros (quantize_int8)
  const __m256 id = _mm256_set1_ps(inv <= FLT_MAX ? inv : 0.f);
  for (int i = 0; i < n_vec; i += 4) {  // 32 values: 4 x 8 int32 -> 32 int8
    __m256i v[4];
    for (int u = 0; u < 4; ++u)
      v[u] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * (i + u)), id));
    if (gsum16 != nullptr) {
      for (int g = 0; g < 2; ++g) {
        __m256i s = _mm256_add_epi32(v[2 * g], v[2 * g + 1]);
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        s4 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 1));
        gsum16[i / 2 + g] = _mm_cvtsi128_si32(s4);
      }
    }
    // Pack with saturation (values are within [-127, 127]) and undo the lane interleave.
    const __m256i p16a = _mm256_packs_epi32(v[0], v[1]), p16b = _mm256_packs_epi32(v[2], v[3]);
    const __m256i p8 = _mm256_packs_epi16(p16a, p16b);
    const __m256i ordered =
        _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 8 * i), ordered);
  }
  return m / 127.f;
}

// IQ4_NL (32-value blocks of indices into model::kIQ4Values; the other 32-value block types are
// read by the tile kernels, matmul_tiles_avx2.cc) works on groups of 2 blocks (64 values) laid
// out so that one int32 lane always belongs to one block: part A holds values 0-15 of each block
// (lanes 4i..4i+3 for block i), part B values 16-31 in the same lanes; two lane dots then share
// one conversion and scaling, and the low/high nibbles are exactly parts A and B.
// Activations per group (96 bytes): A (32 int8), B (32 int8), 8 floats: the block's scale by
// lane. A missing second block of an odd last group is x = 0, scale 0.
constexpr int64_t kGroupBytes = 96;

int64_t act_iq4nl_bytes(int64_t cols) { return (cols / 32 + 1) / 2 * kGroupBytes; }

void quantize_act_iq4nl(const float* x, int64_t cols, uint8_t* out) {
  const int64_t nb = cols / 32;
  for (int64_t g = 0; g < (nb + 1) / 2; ++g) {
    uint8_t* a = out + g * kGroupBytes;
    alignas(32) int8_t q[2][32] = {};
    alignas(32) float dl[8];
    for (int i = 0; i < 2; ++i) {
      const int64_t b = 2 * g + i;
      const float d = b < nb ? quantize_block(x + 32 * b, 4, q[i], nullptr) : 0.f;
      for (int l = 0; l < 4; ++l) dl[4 * i + l] = d;
    }
    // Part A = values 0-15 of both blocks, part B = values 16-31.
    const __m256i b0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(q[0]));
    const __m256i b1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(q[1]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(a), _mm256_permute2x128_si256(b0, b1, 0x20));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(a + 32),
                        _mm256_permute2x128_si256(b0, b1, 0x31));
    _mm256_storeu_ps(reinterpret_cast<float*>(a + 64), _mm256_load_ps(dl));
  }
}

// Activations for K-quants, per 256 values (kActKBytes, compute/detail/matmul_kernels.h).

int64_t actk_bytes(int64_t cols) { return cols / kQK_K * kActKBytes; }

void quantize_actk(const float* x, int64_t cols, uint8_t* out) {
  for (int64_t s = 0; s < cols / kQK_K; ++s) {
    uint8_t* a = out + s * kActKBytes;
    int32_t gsum[16];
    const float d = quantize_block(x + s * kQK_K, 32, reinterpret_cast<int8_t*>(a), gsum);
    float* bs = reinterpret_cast<float*>(a + 256);
    for (int g = 0; g < 16; ++g) bs[g] = d * static_cast<float>(gsum[g]);
    std::memcpy(a + 320, &d, sizeof(d));
  }
}

// Activations of the tile kernels (ActTile32, matmul_kernels.h; matmul_tiles_avx2.cc).
template <GgmlType kType>
void quantize_act_tile32(const float* x, int64_t cols, uint8_t* out) {
  auto* a = reinterpret_cast<ActTile32*>(out);
  for (int64_t b = 0; b < cols / 32; ++b) {
    int32_t half_sums[2];
    const float d = quantize_block(x + 32 * b, 4, a[b].q, half_sums);
    finish_act_tile32(a[b], tile_init(kType), half_sums[0] + half_sums[1], d);
  }
}

// Activations of the Q4_K and Q5_K tile kernels (ActTileK) and of the Q6_K ones (ActTileQ6K).
void quantize_act_tilek(const float* x, int64_t cols, uint8_t* out) {
  auto* a = reinterpret_cast<ActTileK*>(out);
  for (int64_t s = 0; s < cols / kQK_K; ++s) {
    int32_t g16[16];
    a[s].d = quantize_block(x + s * kQK_K, 32, a[s].q, g16);
    for (int j = 0; j < 8; ++j)
      a[s].xsum[kTileKSumSlot[j]] = static_cast<int16_t>(g16[2 * j] + g16[2 * j + 1]);
  }
}

void quantize_act_tileq6k(const float* x, int64_t cols, uint8_t* out) {
  auto* a = reinterpret_cast<ActTileQ6K*>(out);
  for (int64_t s = 0; s < cols / kQK_K; ++s) {
    int32_t g16[16];
    a[s].d = quantize_block(x + s * kQK_K, 32, a[s].q, g16);
    for (int g = 0; g < 16; ++g) a[s].start[g] = tile_start(-32 * g16[g]);
  }
}

// ------------------------------------------------------------------------------------------
// IQ4_NL, a group of 2 blocks per step (see above). Output (r, t):
// acc = fma(float(exact lane dots) * x_scale_lanes, w_scale_lanes, acc) per group in order, then
// hsum8. The weights are signed: their magnitudes multiply the activations with the weights'
// signs (pair sums stay below 2^15). kVnni: the integer dots by AVX-VNNI's vpdpbusd (dpbusd,
// detail/avx2_common.h; the avx2-vnni set): the same integers, the same outputs.

// Two blocks' 16-byte halves as one vector (block 0 low, block 1 high).
inline __m256i load2x16(const uint8_t* p, int64_t stride) {
  return _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + stride)), 1);
}

template <bool kVnni>
struct IQ4NLKernel {
  using Block = model::BlockIQ4_NL;
  static constexpr int kRows = 2;
  static constexpr int kToks = 4;
  static constexpr int64_t kTokBlock = 64;

  // One row's group, prepared once and used by every token of the tile.
  struct WGroup {
    __m256i a, b;            // magnitudes for parts A and B
    __m256i sign_a, sign_b;  // the signed values
    __m256 dw;               // block scales by lane: [d0 x4, d1 x4]
  };

  static WGroup prepare(const Block* blk) {
    WGroup g;
    g.dw = _mm256_cvtph_ps(_mm_unpacklo_epi64(_mm_set1_epi16(static_cast<int16_t>(blk[0].d)),
                                              _mm_set1_epi16(static_cast<int16_t>(blk[1].d))));
    const __m256i z =
        load2x16(reinterpret_cast<const uint8_t*>(blk) + offsetof(Block, qs), sizeof(Block));
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i table = _mm256_broadcastsi128_si256(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(model::kIQ4Values)));
    g.sign_a = _mm256_shuffle_epi8(table, _mm256_and_si256(z, m4));
    g.sign_b = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(z, 4), m4));
    g.a = _mm256_abs_epi8(g.sign_a);
    g.b = _mm256_abs_epi8(g.sign_b);
    return g;
  }

  static __m256i lane_dots(const WGroup& g, const uint8_t* act) {
    const __m256i xa =
        _mm256_sign_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(act)), g.sign_a);
    const __m256i xb =
        _mm256_sign_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(act + 32)), g.sign_b);
    if constexpr (kVnni) return dpbusd(dpbusd(_mm256_setzero_si256(), g.a, xa), g.b, xb);
    return _mm256_add_epi32(dot_u8s8(g.a, xa), dot_u8s8(g.b, xb));
  }

  // wb[i]: the group's first block in row i; xg[n]: the group's activations of token n.
  template <int R, int NT>
  static void group(const Block* const* wb, const uint8_t* const* xg, __m256 (&acc)[R][NT]) {
    WGroup wg[R];
    for (int i = 0; i < R; ++i) wg[i] = prepare(wb[i]);
    for (int n = 0; n < NT; ++n) {
      const __m256 dx = _mm256_loadu_ps(reinterpret_cast<const float*>(xg[n] + 64));
      for (int i = 0; i < R; ++i) {
        const __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(lane_dots(wg[i], xg[n])), dx);
        acc[i][n] = _mm256_fmadd_ps(f, wg[i].dw, acc[i][n]);
      }
    }
  }

  template <int R, int NT>
  static void tile(const MatmulJob& j, int64_t r, int64_t t) {
    const Block* w[R];
    const uint8_t* x[NT];
    for (int i = 0; i < R; ++i)
      w[i] = reinterpret_cast<const Block*>(j.w + (r + i) * j.w_row_bytes);
    for (int n = 0; n < NT; ++n) x[n] = j.act + (t + n) * j.act_stride;
    __m256 acc[R][NT];
    for (int i = 0; i < R; ++i)
      for (int n = 0; n < NT; ++n) acc[i][n] = _mm256_setzero_ps();
    const int64_t nb = j.cols / 32, full = nb / 2;
    const Block* wb[R];
    const uint8_t* xg[NT];
    const int64_t pf = R * j.w_row_bytes;  // the same place in the next tile's rows
    for (int64_t g = 0; g < full; ++g) {
      for (int i = 0; i < R; ++i) {
        wb[i] = w[i] + 2 * g;
        prefetch(wb[i], pf, 2 * sizeof(Block));
      }
      for (int n = 0; n < NT; ++n) xg[n] = x[n] + g * kGroupBytes;
      group<R, NT>(wb, xg, acc);
    }
    if (nb & 1) {
      // An odd last block, then a zero block (scale 0).
      Block tail[R][2] = {};
      for (int i = 0; i < R; ++i) {
        tail[i][0] = w[i][nb - 1];
        wb[i] = tail[i];
      }
      for (int n = 0; n < NT; ++n) xg[n] = x[n] + full * kGroupBytes;
      group<R, NT>(wb, xg, acc);
    }
    for (int n = 0; n < NT; ++n)
      for (int i = 0; i < R; ++i) j.y[(t + n) * j.y_stride + r + i] = hsum8(acc[i][n]);
  }
};

// ------------------------------------------------------------------------------------------

template <class K>
TypeKernels make_kernels(int64_t (*bytes)(int64_t) = nullptr,
                         void (*quantize)(const float*, int64_t, uint8_t*) = nullptr) {
  TypeKernels k;
  k.act_row_bytes = bytes;
  k.quantize = quantize;
  k.rows = tiled_rows<K>;
  k.row_tile = K::kRows;
  return k;
}

KernelSet make_set(bool vnni) {
  KernelSet s{};
  s.name = vnni ? "avx2-vnni" : "avx2";
  s.f32 = make_kernels<FloatKernel<GgmlType::kF32>>();
  s.f16 = make_kernels<FloatKernel<GgmlType::kF16>>();
  s.bf16 = make_kernels<FloatKernel<GgmlType::kBF16>>();
  s.f8 = make_kernels<FloatKernel<GgmlType::kF8_E4M3>>();
  s.i4 = make_kernels<FloatKernel<GgmlType::kI4_PACKED>>();
  s.fp4 = make_kernels<FloatKernel<GgmlType::kFP4_PACKED>>();
  s.i4_t16 = make_kernels<FloatKernel<GgmlType::kI4_PACKED, true>>();
  s.f8_t16 = make_kernels<FloatKernel<GgmlType::kF8_E4M3, true>>();
  s.iq4_nl = vnni ? make_kernels<IQ4NLKernel<true>>(act_iq4nl_bytes, quantize_act_iq4nl)
                  : make_kernels<IQ4NLKernel<false>>(act_iq4nl_bytes, quantize_act_iq4nl);
  s.mxfp4 = make_kernels<FloatKernel<GgmlType::kMXFP4>>();
  // Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1: the tile kernels, reading tiles or ggml's rows with the
  // same arithmetic (matmul_tiles_avx2.cc), so a matrix gives the same bits mapped or copied.
  avx2_tile_rows(vnni, &s);
  struct Tile32 {
    TypeKernels *tiles, *rows;
    void (*quantize)(const float*, int64_t, uint8_t*);
  };
  for (const Tile32& t : {Tile32{&s.q8_0_t16, &s.q8_0, quantize_act_tile32<GgmlType::kQ8_0>},
                          Tile32{&s.q4_0_t16, &s.q4_0, quantize_act_tile32<GgmlType::kQ4_0>},
                          Tile32{&s.q4_1_t16, &s.q4_1, quantize_act_tile32<GgmlType::kQ4_1>},
                          Tile32{&s.q5_0_t16, &s.q5_0, quantize_act_tile32<GgmlType::kQ5_0>},
                          Tile32{&s.q5_1_t16, &s.q5_1, quantize_act_tile32<GgmlType::kQ5_1>}})
    for (TypeKernels* k : {t.tiles, t.rows}) {
      k->act_row_bytes = act_tile32_bytes;
      k->quantize = t.quantize;
    }
  avx2_tile_rows_k(vnni, &s);  // matmul_tiles_k_avx2.cc: Q4_K, Q5_K, Q6_K, tiles and rows
  for (TypeKernels* k : {&s.q4_k_t16, &s.q4_k, &s.q5_k_t16, &s.q5_k}) {
    k->act_row_bytes = act_records256_bytes<ActTileK>;
    k->quantize = quantize_act_tilek;
  }
  for (TypeKernels* k : {&s.q6_k_t16, &s.q6_k}) {
    k->act_row_bytes = act_records256_bytes<ActTileQ6K>;
    k->quantize = quantize_act_tileq6k;
  }
  avx2_kquant_rows(&s);  // matmul_kquant_avx2.cc
  for (TypeKernels* k : {&s.iq4_xs, &s.q2_k, &s.q3_k}) {
    k->act_row_bytes = actk_bytes;
    k->quantize = quantize_actk;
  }
  return s;
}

}  // namespace

const KernelSet& avx2_kernels(bool use_vnni) {
  static const KernelSet plain = make_set(false), vnni = make_set(true);
  return use_vnni ? vnni : plain;
}

}  // namespace troupe::compute::detail
