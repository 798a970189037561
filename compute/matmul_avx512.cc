// AVX-512 matmul kernels (F, BW, VL, DQ; VNNI when the CPU has it). Float weights use f32
// activations with one 16-lane FMA accumulator per output (detail/matmul_float_avx512.h); Q8_0
// and Q4_0 without VNNI use int8 activations and exact integer dot products
// (vpmaddubsw+vpmaddwd), scaled into a 16-lane f32 accumulator per output (with VNNI they run
// the tile kernels, matmul_tiles_avx512.cc). The K-quant kernels (Q4_K, Q6_K) are in
// matmul_kquant_avx512.cc. Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq
// (compute/CMakeLists.txt).
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "compute/detail/avx512_common.h"
#include "compute/detail/matmul_float_avx512.h"
#include "compute/detail/matmul_kernels.h"
#include "compute/detail/matmul_tiles.h"
#include "compute/detail/simd_hsum.h"

namespace troupe::compute::detail {
namespace {

using model::BlockQ4_0;
using model::BlockQ8_0;
using model::GgmlType;

using avx512::FloatKernel;

// ------------------------------------------------------------------------------------------
// Int8 activations of the 32-value block types (quantize_vecs: avx512_common.h).

// The 32-value block types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL) work on groups of 4 blocks
// (128 values) laid out so that one int32 lane always belongs to one block: part A holds values
// 0-15 of each block (lanes 4i..4i+3 for block i), part B values 16-31 in the same lanes. Two
// lane dots (A, B) then share one conversion and scaling per token, and the low/high nibbles
// are exactly parts A and B.
// Activations per group (256 bytes): A (64 int8), B (64 int8), 16 lanes of `extra`, 16 floats:
// the block's scale by lane. `extra` is the int32 kInit * the sum of the lane's 8 values (folds
// the weights' offset into the integer dot), or for Q4_1 and Q5_1 (kSums) the float scale * that
// sum, which the block offset multiplies. Missing blocks of a last partial group are x = 0,
// scale 0.
constexpr int64_t kGroupBytes = 256;

int64_t act32_bytes(int64_t cols) { return (cols / 32 + 3) / 4 * kGroupBytes; }

template <int kInit, bool kSums = false>
void quantize_act32(const float* x, int64_t cols, uint8_t* out) {
  const int64_t nb = cols / 32;
  for (int64_t g = 0; g < (nb + 3) / 4; ++g) {
    uint8_t* a = out + g * kGroupBytes;
    alignas(64) int8_t part[2][64] = {};
    alignas(64) float dl[16];
    for (int i = 0; i < 4; ++i) {
      const int64_t b = 4 * g + i;
      float d = 0.f;
      if (b < nb) {
        __m512i q[2];
        d = quantize_vecs(x + 32 * b, 2, q);
        _mm_store_si128(reinterpret_cast<__m128i*>(part[0] + 16 * i), _mm512_cvtepi32_epi8(q[0]));
        _mm_store_si128(reinterpret_cast<__m128i*>(part[1] + 16 * i), _mm512_cvtepi32_epi8(q[1]));
      }
      for (int l = 0; l < 4; ++l) dl[4 * i + l] = d;
    }
    const __m512i xa = _mm512_load_si512(part[0]), xb = _mm512_load_si512(part[1]);
    const __m512i ones8 = _mm512_set1_epi8(1), ones16 = _mm512_set1_epi16(1);
    const __m512i sums = _mm512_madd_epi16(
        _mm512_add_epi16(_mm512_maddubs_epi16(ones8, xa), _mm512_maddubs_epi16(ones8, xb)), ones16);
    const __m512 scale = _mm512_load_ps(dl);
    _mm512_storeu_si512(a, xa);
    _mm512_storeu_si512(a + 64, xb);
    if constexpr (kSums) {
      _mm512_storeu_ps(a + 128, _mm512_mul_ps(_mm512_cvtepi32_ps(sums), scale));
    } else {
      _mm512_storeu_si512(a + 128, _mm512_mullo_epi32(sums, _mm512_set1_epi32(kInit)));
    }
    _mm512_storeu_ps(a + 192, scale);
  }
}

// The activations each 32-value block type reads.
template <GgmlType kType>
void quantize_act_blocks32(const float* x, int64_t cols, uint8_t* out) {
  quantize_act32<blocks32_init(kType), blocks32_min(kType)>(x, cols, out);
}

// ------------------------------------------------------------------------------------------
// The 32-value block types, a group of 4 blocks per step (see above). Output (r, t):
// acc = fma(float(exact lane dots) * x_scale_lanes, w_scale_lanes, acc) per group in order
// (Q4_1, Q5_1: then acc = fma(x_scale_sum_lanes, w_offset_lanes, acc)), then hsum16.

// Four 16-byte pieces at p, p + stride, ... as one vector.
inline __m512i load4x16(const uint8_t* p, int64_t stride) {
  const __m256i lo = _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + stride)), 1);
  const __m256i hi = _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * stride))),
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 3 * stride)), 1);
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

// The first kNeed bytes (at most 128) of a group of 4 blocks of kStride bytes at p, read with masks
// that stop at the group's end (the last group of a mapped file may end a page), and word
// selections from them: the blocks' f16 fields and Q5's high-bit words, gathered by one permute
// each (of one register where kNeed <= 64).
template <int64_t kStride, int64_t kNeed>
struct GroupWords {
  static_assert(kStride % 2 == 0 && kNeed <= 4 * kStride && kNeed <= 128);
  static constexpr bool kTwo = kNeed > 64;
  __m512i lo, hi;
  explicit GroupWords(const uint8_t* p) {
    constexpr auto mask = [](int64_t n) {
      return n >= 64 ? ~__mmask64{0} : (__mmask64{1} << n) - 1;
    };
    lo = _mm512_maskz_loadu_epi8(mask(4 * kStride), p);
    if constexpr (kTwo) {
      hi = _mm512_maskz_loadu_epi8(mask(4 * kStride - 64), p + 64);
    } else {
      hi = lo;
    }
  }
  // Word w of the result is word idx[w] of the group (idx: 32 words, each within kNeed).
  __m512i select(const int16_t* idx) const {
    if constexpr (kTwo) return _mm512_permutex2var_epi16(lo, _mm512_loadu_si512(idx), hi);
    return _mm512_permutexvar_epi16(_mm512_loadu_si512(idx), lo);
  }
};

// Word indices of a 32-value block type's group: [0, 32) the f16 scales as lanes [d0 x4, d1 x4,
// d2 x4, d3 x4] and (Q4_1, Q5_1) the offsets m likewise; [32, 40) (Q5_0, Q5_1) the low halves of
// the 4 qh words, then their high halves.
template <class Block>
constexpr std::array<int16_t, 64> group_word_index() {
  constexpr int64_t kStride = sizeof(Block);
  std::array<int16_t, 64> a{};
  for (int w = 0; w < 16; ++w) {
    a[static_cast<size_t>(w)] = static_cast<int16_t>(w / 4 * kStride / 2);
    a[static_cast<size_t>(16 + w)] = static_cast<int16_t>((2 + w / 4 * kStride) / 2);  // m
  }
  if constexpr (requires { Block::qh; }) {
    constexpr int64_t kQh = offsetof(Block, qh);
    for (int i = 0; i < 4; ++i) {
      a[static_cast<size_t>(32 + i)] = static_cast<int16_t>((kQh + i * kStride) / 2);
      a[static_cast<size_t>(36 + i)] = static_cast<int16_t>((kQh + 2 + i * kStride) / 2);
    }
  }
  return a;
}

template <GgmlType kType>
struct Blocks32Kernel {
  using Block = Block32<kType>;
  static constexpr int kRows = 4;
  static constexpr int kDecodeRowsQ4 = 8;  // Q4_0, one token (rows below)
  static constexpr int kToks = 4;
  static constexpr int64_t kTokBlock = 64;     // tiled_rows (few tokens)
  static constexpr int64_t kStreamBlock = 32;  // streaming (many tokens)

  // One row's group, prepared once and used by every token of the tile. Unsigned types: q
  // (Q4_0, Q5_0: the activations' init supplies their zero). Signed types: magnitudes, and
  // masks of the negative values that flip the activations' signs.
  struct WGroup {
    __m512i a, b;            // unsigned operands for parts A and B
    __mmask64 neg_a, neg_b;  // signed types: negative values
    __m512 dw;               // block scales by lane
    __m512 dm;               // Q4_1, Q5_1: block offsets by lane
  };

  static constexpr std::array<int16_t, 64> kWordIndex = group_word_index<Block>();
  // The bytes of a group those words lie in.
  static constexpr int64_t kWordBytes = [] {
    int64_t n = 0;
    for (size_t w = 0; w < 64; ++w) {
      const bool used =
          w < 16 || (w < 32 && blocks32_min(kType)) || (w >= 32 && w < 40 && blocks32_five(kType));
      if (used) n = std::max<int64_t>(n, 2 * kWordIndex[w] + 2);
    }
    return n;
  }();

  static WGroup prepare(const Block* blk) {
    const auto* p = reinterpret_cast<const uint8_t*>(blk);
    WGroup g;
    const GroupWords<sizeof(Block), kWordBytes> words(p);
    const __m512i fields = words.select(kWordIndex.data());
    g.dw = _mm512_cvtph_ps(_mm512_castsi512_si256(fields));
    if constexpr (blocks32_min(kType)) {
      g.dm = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(fields, 1));
    } else {
      g.dm = _mm512_setzero_ps();
    }
    g.neg_a = g.neg_b = 0;
    if constexpr (!blocks32_signed(kType)) {
      const __m512i z = load4x16(p + offsetof(Block, qs), sizeof(Block));
      const __m512i m4 = _mm512_set1_epi8(0x0F);
      g.a = _mm512_and_si512(z, m4);
      g.b = _mm512_and_si512(_mm512_srli_epi16(z, 4), m4);
      if constexpr (blocks32_five(kType)) {  // bit j of qh: value j's bit 4
        const __m128i qh = _mm512_castsi512_si128(words.select(kWordIndex.data() + 32));
        const auto ha = static_cast<__mmask64>(_mm_cvtsi128_si64(qh));
        const auto hb = static_cast<__mmask64>(_mm_extract_epi64(qh, 1));
        g.a = _mm512_or_si512(g.a, _mm512_maskz_set1_epi8(ha, 0x10));
        g.b = _mm512_or_si512(g.b, _mm512_maskz_set1_epi8(hb, 0x10));
      }
    } else {
      __m512i wa, wb;
      if constexpr (kType == GgmlType::kIQ4_NL) {  // Q4_0's layout, values looked up
        const __m512i z = load4x16(p + offsetof(BlockQ4_0, qs), sizeof(Block));
        const __m512i m4 = _mm512_set1_epi8(0x0F);
        const __m512i table = _mm512_broadcast_i32x4(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(model::kIQ4Values)));
        wa = _mm512_shuffle_epi8(table, _mm512_and_si512(z, m4));
        wb = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(z, 4), m4));
      } else {
        wa = load4x16(p + offsetof(BlockQ8_0, qs), sizeof(Block));
        wb = load4x16(p + offsetof(BlockQ8_0, qs) + 16, sizeof(Block));
      }
      g.a = _mm512_abs_epi8(wa);
      g.b = _mm512_abs_epi8(wb);
      g.neg_a = _mm512_movepi8_mask(wa);
      g.neg_b = _mm512_movepi8_mask(wb);
    }
    return g;
  }

  // Exact int32 lane dots of one group with one token's activations.
  static __m512i lane_dots(const WGroup& g, const uint8_t* act) {
    const __m512i xa = _mm512_loadu_si512(act), xb = _mm512_loadu_si512(act + 64);
    if constexpr (!blocks32_signed(kType)) {
      // Pair sums stay below 2 * 2 * 31 * 127 < 2^15: add them as int16.
      const __m512i pairs =
          _mm512_add_epi16(_mm512_maddubs_epi16(g.a, xa), _mm512_maddubs_epi16(g.b, xb));
      const __m512i dots = _mm512_madd_epi16(pairs, _mm512_set1_epi16(1));
      if constexpr (blocks32_min(kType)) return dots;
      return _mm512_add_epi32(_mm512_loadu_si512(act + 128), dots);
    } else {
      const __m512i zero = _mm512_setzero_si512();
      const __m512i sa = _mm512_mask_sub_epi8(xa, g.neg_a, zero, xa);
      const __m512i sb = _mm512_mask_sub_epi8(xb, g.neg_b, zero, xb);
      return dot_u8s8<false>(dot_u8s8<false>(zero, g.a, sa), g.b, sb);
    }
  }

  // The one arithmetic of an output for one group (both loop structures below use it).
  static __m512 token_group(const WGroup& g, const uint8_t* act, __m512 dx, __m512 acc) {
    const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(lane_dots(g, act)), dx);
    acc = _mm512_fmadd_ps(f, g.dw, acc);
    if constexpr (blocks32_min(kType)) acc = _mm512_fmadd_ps(_mm512_loadu_ps(act + 128), g.dm, acc);
    return acc;
  }

  // Few tokens (decode): register tiles of kRows x kToks through tiled_rows.
  // wb[i]: the group's first block in row i; xg[n]: the group's activations of token n.
  template <int R, int NT>
  static void group(const Block* const* wb, const uint8_t* const* xg, __m512 (&acc)[R][NT]) {
    WGroup wg[R];
    for (int i = 0; i < R; ++i) wg[i] = prepare(wb[i]);
    for (int n = 0; n < NT; ++n) {
      const __m512 dx = _mm512_loadu_ps(xg[n] + 192);
      for (int i = 0; i < R; ++i) acc[i][n] = token_group(wg[i], xg[n], dx, acc[i][n]);
    }
  }

  template <int R, int NT>
  static void tile(const MatmulJob& j, int64_t r, int64_t t) {
    const Block* w[R];
    const uint8_t* x[NT];
    for (int i = 0; i < R; ++i)
      w[i] = reinterpret_cast<const Block*>(j.w + (r + i) * j.w_row_bytes);
    for (int n = 0; n < NT; ++n) x[n] = j.act + (t + n) * j.act_stride;
    __m512 acc[R][NT];
    for (int i = 0; i < R; ++i)
      for (int n = 0; n < NT; ++n) acc[i][n] = _mm512_setzero_ps();
    const int64_t nb = j.cols / 32, full = nb / 4;
    const Block* wb[R];
    const uint8_t* xg[NT];
    const int64_t pf = 2 * R * j.w_row_bytes;  // the same place two tiles ahead
    for (int64_t g = 0; g < full; ++g) {
      for (int i = 0; i < R; ++i) {
        wb[i] = w[i] + 4 * g;
        prefetch(wb[i], pf, 4 * sizeof(Block));
      }
      for (int n = 0; n < NT; ++n) xg[n] = x[n] + g * kGroupBytes;
      group<R, NT>(wb, xg, acc);
    }
    if (nb > 4 * full) {
      // A partial last group: the blocks there, then zero blocks (scale 0).
      Block tail[R][4] = {};
      for (int i = 0; i < R; ++i) {
        std::memcpy(tail[i], w[i] + 4 * full, static_cast<size_t>(nb - 4 * full) * sizeof(Block));
        wb[i] = tail[i];
      }
      for (int n = 0; n < NT; ++n) xg[n] = x[n] + full * kGroupBytes;
      group<R, NT>(wb, xg, acc);
    }
    for (int n = 0; n < NT; ++n)
      for (int i = 0; i < R; ++i) j.y[(t + n) * j.y_stride + r + i] = hsum16(acc[i][n]);
  }

  // Many tokens: rows [r, r + R) for tokens [t0, t1) (at most kStreamBlock). Each row group
  // is prepared once and then meets every token of the block; the accumulators live in `acc`.
  template <int R>
  static void row_tile(const MatmulJob& j, int64_t r, int64_t t0, int64_t t1, __m512* acc) {
    const int64_t nt = t1 - t0;
    const Block* w[R];
    for (int i = 0; i < R; ++i)
      w[i] = reinterpret_cast<const Block*>(j.w + (r + i) * j.w_row_bytes);
    const int64_t nb = j.cols / 32, full = nb / 4;
    const int64_t pf = 2 * R * j.w_row_bytes;  // the same place two tiles ahead
    Block tail[R][4];
    for (int64_t g = 0; g < (nb + 3) / 4; ++g) {
      WGroup wg[R];
      for (int i = 0; i < R; ++i) {
        const Block* b = w[i] + 4 * g;
        if (g == full) {
          // A partial last group: the blocks there, then zero blocks (scale 0).
          std::memset(tail[i], 0, sizeof(tail[i]));
          std::memcpy(tail[i], b, static_cast<size_t>(nb - 4 * full) * sizeof(Block));
          b = tail[i];
        } else {
          prefetch(b, pf, 4 * sizeof(Block));
        }
        wg[i] = prepare(b);
      }
      // The first group starts every accumulator at zero (no pass that zeroes them first).
      const bool first = g == 0;
      for (int64_t n = 0; n < nt; ++n) {
        const uint8_t* a = j.act + (t0 + n) * j.act_stride + g * kGroupBytes;
        const __m512 dx = _mm512_loadu_ps(a + 192);
        for (int i = 0; i < R; ++i)
          acc[i * nt + n] =
              token_group(wg[i], a, dx, first ? _mm512_setzero_ps() : acc[i * nt + n]);
      }
    }
    for (int64_t n = 0; n < nt; ++n)
      for (int i = 0; i < R; ++i) j.y[(t0 + n) * j.y_stride + r + i] = hsum16(acc[i * nt + n]);
  }

  // Both loop structures compute every output with the same arithmetic (token_*), so which one
  // runs, chosen by n_tok, changes speed only: BatchInvariant tests pin it.
  static void rows(const MatmulJob& j, int64_t r0, int64_t r1) {
    if (kType == GgmlType::kQ4_0 && j.n_tok == 1) {
      // Batch-1 Q4_0 streams 8 rows at once: with 4 (half of Q8_0's bytes per group step) it
      // read its weights 15-25 % slower from DRAM while its cache-resident rate was twice the
      // bandwidth (docs/benchmarks.md). Q8_0 gets slower with 8 (register pressure), so it
      // keeps 4. Same per-row arithmetic: the outputs do not change.
      int64_t r = r0;
      for (; r + kDecodeRowsQ4 <= r1; r += kDecodeRowsQ4) tile<kDecodeRowsQ4, 1>(j, r, 0);
      for (; r < r1; ++r) tile<1, 1>(j, r, 0);
      return;
    }
    if (j.n_tok <= kToks) {
      tiled_rows<Blocks32Kernel>(j, r0, r1);
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

// ------------------------------------------------------------------------------------------

template <class K>
TypeKernels float_kernels() {
  TypeKernels k;
  k.rows = tiled_rows<K>;
  k.row_tile = K::kRows;
  return k;
}

template <GgmlType kType>
TypeKernels blocks32_kernels() {
  return streaming_kernels<Blocks32Kernel<kType>>(act32_bytes, quantize_act_blocks32<kType>);
}

template <bool kVnni, bool kGfni = false>
KernelSet make_set() {
  KernelSet s{};
  s.name = kGfni ? "avx512-vnni-gfni" : kVnni ? "avx512-vnni" : "avx512";
  s.f32 = float_kernels<FloatKernel<GgmlType::kF32>>();
  s.f16 = float_kernels<FloatKernel<GgmlType::kF16>>();
  s.bf16 = float_kernels<FloatKernel<GgmlType::kBF16>>();
  s.f16_t16 = float_kernels<FloatKernel<GgmlType::kF16, true>>();
  s.bf16_t16 = float_kernels<FloatKernel<GgmlType::kBF16, true>>();
  s.f8 = float_kernels<FloatKernel<GgmlType::kF8_E4M3>>();
  s.f8_t16 = float_kernels<FloatKernel<GgmlType::kF8_E4M3, true>>();
  s.i4 = float_kernels<FloatKernel<GgmlType::kI4_PACKED>>();
  s.fp4 = float_kernels<FloatKernel<GgmlType::kFP4_PACKED>>();
  s.i4_t16 = float_kernels<FloatKernel<GgmlType::kI4_PACKED, true>>();
  s.fp4_t16 = float_kernels<FloatKernel<GgmlType::kFP4_PACKED, true>>();
  if constexpr (kVnni) {
    // Q8_0 and Q4_0, in rows or in tiles, run the tile kernels' arithmetic (reading 16 rows
    // at a time from rows): a matrix gives the same bits mapped from its file and copied into
    // tiles.
    avx512_tile_kernels(kGfni, &s.q8_0_t16, &s.q4_0_t16, &s.q8_0, &s.q4_0);
  } else {
    s.q8_0 = blocks32_kernels<GgmlType::kQ8_0>();
    s.q4_0 = blocks32_kernels<GgmlType::kQ4_0>();
  }
  // Q4_1, Q5_0 and Q5_1 likewise.
  if constexpr (kVnni) {
    avx512_tile_kernels_q451(kGfni, &s);
  } else {
    s.q4_1 = blocks32_kernels<GgmlType::kQ4_1>();
    s.q5_0 = blocks32_kernels<GgmlType::kQ5_0>();
    s.q5_1 = blocks32_kernels<GgmlType::kQ5_1>();
  }
  // IQ4_NL: Q8_0's arithmetic on looked-up values, at every AVX-512 level (no tiles).
  s.iq4_nl = blocks32_kernels<GgmlType::kIQ4_NL>();
  s.mxfp4 = float_kernels<FloatKernel<GgmlType::kMXFP4>>();
  if constexpr (kVnni) {  // Q4_K, Q5_K and Q6_K likewise
    avx512_tile_kernels_k(kGfni, &s.q4_k_t16, &s.q4_k, &s.q5_k_t16, &s.q5_k);
    avx512_tile_kernels_q6k(kGfni, &s.q6_k_t16, &s.q6_k);
  } else {
    avx512_kquant_kernels(&s.q4_k, &s.q5_k, &s.q6_k);
  }
  avx512_low_bit_kernels(&s.q2_k, &s.q3_k, &s.iq4_xs);
  return s;
}

}  // namespace

const KernelSet& avx512_kernels(bool use_vnni, bool use_gfni) {
  static const KernelSet gfni = make_set<true, true>();
  static const KernelSet vnni = make_set<true>();
  static const KernelSet plain = make_set<false>();
  return use_vnni ? (use_gfni ? gfni : vnni) : plain;
}

}  // namespace troupe::compute::detail
