// The AVX-512 kernels of float-widened weights (F32, F16, BF16, F8_E4M3, I4_PACKED, FP4_PACKED,
// MXFP4): FloatLoad widens 16 stored values, FloatKernel multiplies R rows by NT tokens. Included
// by compute/matmul_avx512.cc only (its compile flags enable AVX-512).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <vector>

#include "compute/detail/avx512_common.h"
#include "compute/detail/matmul_kernels.h"
#include "compute/detail/matmul_tiles.h"
#include "compute/detail/simd_hsum.h"
#include "compute/detail/unroll.h"
#include "model/ggml_types.h"

namespace troupe::compute::detail::avx512 {

using model::GgmlType;

// ------------------------------------------------------------------------------------------
// Float weights (F32, F16, BF16)
// Output (r, t): lane l sums w[k]*x[k] for k = l (mod 16) in k order by FMA; the last partial
// chunk goes through masked (zeroing) loads; then hsum16.

template <GgmlType kType>
struct FloatLoad;

template <>
struct FloatLoad<GgmlType::kF32> {
  static __m512 load(const uint8_t* row, int64_t k) {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(row) + k);
  }
  static __m512 load_tail(const uint8_t* row, int64_t k, __mmask16 m) {
    return _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(row) + k);
  }
};

template <>
struct FloatLoad<GgmlType::kF16> {
  static __m512 load(const uint8_t* row, int64_t k) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * k)));
  }
  static __m512 load_tail(const uint8_t* row, int64_t k, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, row + 2 * k));
  }
};

template <>
struct FloatLoad<GgmlType::kBF16> {
  static __m512 widen(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static __m512 load(const uint8_t* row, int64_t k) {
    return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * k)));
  }
  static __m512 load_tail(const uint8_t* row, int64_t k, __mmask16 m) {
    return widen(_mm256_maskz_loadu_epi16(m, row + 2 * k));
  }
};

// FP8 E4M3 as 1/256 of its value through an f16 (as in matmul_avx2.cc: sign-extend, shift,
// and the carry that completes the NaN code's f16 NaN); the kernel's per-block scale carries
// the 256.
template <>
struct FloatLoad<GgmlType::kF8_E4M3> {
  static __m512 widen(__m128i b) {
    const __m256i h =
        _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(b), 7), _mm256_set1_epi16(-0x4080));
    // h | ((h + 0x80) & 0x4000)
    const __m256i t = _mm256_add_epi16(h, _mm256_set1_epi16(0x80));
    return _mm512_cvtph_ps(_mm256_ternarylogic_epi32(h, t, _mm256_set1_epi16(0x4000), 0xf8));
  }
  static __m512 load(const uint8_t* row, int64_t k) {
    return widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k)));
  }
  static __m512 load_tail(const uint8_t* row, int64_t k, __mmask16 m) {
    return widen(_mm_maskz_loadu_epi8(m, row + k));
  }
  // Tiles (no NaN code; model::f8_tiles_suit): the 16 bytes at p as the f32 bits of 2^-120
  // times their values, exact for every other code: the sign in bit 31, E4M3's exponent and
  // mantissa fields in bits 20-26 (the low bits of f32's fields, whose bias is 120 more than
  // E4M3's; E4M3's subnormals become f32 subnormals). Three instructions instead of six, the NaN
  // code's carry not among them.
  static __m512 load_finite(const uint8_t* p) {
    const __m512i d = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(d, 20),
                                                _mm512_set1_epi32(static_cast<int>(0x87F00000))));
  }
};

// F8_E4M3, I4_PACKED and FP4_PACKED: the values q * scale, each the nearest float to the exact
// product, lane for lane as an F32 matrix holding them (the same bits; matmul_avx2.cc). I4 and
// FP4 rows are whole multiples of 16 (matmul.cc checks), so they never take the tail. An I4 or
// FP4 weight is looked up in a 16-entry table of its block's (q - 8) * scale or E2M1(q) * scale
// (vpermps reads the low 4 bits of each index lane; the qword lane j holds byte j in its low
// dword and byte j >> 4 in its high one). MXFP4 (GGUF's 17-byte blocks: the scale byte, then value
// j in byte j's low nibble and j + 16 in its high one) likewise, its table kMXFP4Values(q) *
// mxfp4_scale(e) (model::dequantize_row's values) rebuilt at every block; its rows are whole
// blocks.
// kTiled, F16, BF16 and F8_E4M3: the matrix is in 16-row tiles, a float tile being 4 quads of 4
// rows interleaved 16 columns at a time (model/weight_tiles.h); the same arithmetic in the same
// order, so the same bits as reading rows. Its columns are a multiple of 16: no tail. F8 tiles
// hold no NaN code, no scale of 256 or more and few subnormal codes (model::f8_tiles_suit): each
// value is loaded as fp8 * 2^-120 (FloatLoad::load_finite) and multiplied by 2^120 * scale, a
// finite float, where rows multiply fp8 / 256 by 256 * scale: both products are exactly
// fp8 * scale before their one rounding, so the same bits. On a Zen 4 host, 3.1 cycles per 16
// values from L1 against 4.3; with 6 % of the codes subnormal (f32 subnormals here) 3.4-3.6
// (docs/benchmarks.md "Engine, session 48").
// kTiled, I4_PACKED and FP4_PACKED: quads too, a row's 64 bytes of 128 columns at a time, with
// column 16s + d at nibble s of dword d (model/weight_tiles.h): the 16 columns from 16s on take
// their table indices from the 64 bytes shifted right by 4s (vpermps reads the low 4 bits). One
// 512-bit shuffle and one shift per 16 values instead of two shuffles, a shift and an OR: products
// of one token 1.6x as fast from cache on a Zen 4 (docs/benchmarks.md "Engine, session 47"). The
// same values in the same lanes and order: the bits of rows.
template <GgmlType kType, bool kTiled = false>
struct FloatKernel {
  using L = FloatLoad<kType>;
  static constexpr bool kF8 = kType == GgmlType::kF8_E4M3;
  // Two 4-bit values per byte, read through a table (I4_PACKED, FP4_PACKED).
  static constexpr bool kI4 = kType == GgmlType::kI4_PACKED || kType == GgmlType::kFP4_PACKED;
  static constexpr bool kScaled = kF8 || kI4;             // a separate scale grid
  static constexpr bool kMx = kType == GgmlType::kMXFP4;  // a scale byte in every block
  static constexpr bool kQuads = kTiled && !kI4;          // F16, BF16 and F8 tiles
  static constexpr bool kNibbleTiles = kTiled && kI4;     // I4_PACKED and FP4_PACKED tiles
  // Bytes from the row start to column k (MXFP4: to its block).
  static constexpr int64_t offset(int64_t k) {
    return kMx ? k / 32 * 17 : kI4 ? k / 2 : kType == GgmlType::kF32 ? 4 * k : kF8 ? k : 2 * k;
  }
  static constexpr int kRows = 4;  // a quad of a tiled matrix
  // Tiled: bytes of a quad's chunk (16 columns of F16/BF16, 128 of the 4-bit types) and of one
  // row's part of it.
  static constexpr int64_t kQuadChunk = kNibbleTiles ? 4 * 64 : kF8 ? 4 * 16 : 4 * 32;
  static constexpr int64_t kQuadCols = kNibbleTiles ? model::kNibbleTileCols : 16;
  static_assert(!kTiled || kType == GgmlType::kF16 || kType == GgmlType::kBF16 || kF8 || kI4);
  static constexpr int kToks = 6;
  static constexpr int64_t kTokBlock = 48;

  // The weights of R rows from column 0 on, 16 at a time (scales followed block by block).
  template <int R>
  struct Rows {
    const uint8_t* w[R];
    const float* sc[R] = {};  // each row's scales as floats (MatmulJob::scale_row)
    // F8: 256 * the scale of the block being read (tiles: 2^120 * it); I4, FP4 and MXFP4: its
    // table of values.
    __m512 f[R];
    // MXFP4: the block's 16 value bytes widened to dwords, once for both of its halves (the low
    // nibbles index the first half's values, the high ones the second's).
    [[maybe_unused]] __m512i mq[kMx ? R : 1];
    int64_t k_next = 0, cols_per_scale = 0;

    Rows(const MatmulJob& j, int64_t r) {
      for (int i = 0; i < R; ++i) {
        const int64_t row = r + i;
        // Tiled: row's part of the quad's first chunk; its chunk c is kQuadChunk * c on.
        w[i] = kTiled ? j.w + row / 4 * 4 * j.w_row_bytes + row % 4 * (kQuadChunk / 4)
                      : j.w + row * j.w_row_bytes;
      }
      if constexpr (kScaled) {
        thread_local std::vector<float> tmp;
        float* t = scratch(tmp, R * j.w_scale_stride);
        for (int i = 0; i < R; ++i) sc[i] = j.scale_row(r + i, t + i * j.w_scale_stride);
        cols_per_scale = j.w_scale_cols;
      }
    }
    // Call at every k (a multiple of 16) before loading there.
    void at(int64_t k) {
      if constexpr (kMx) {
        if (k % 32 == 0) {
          alignas(64) static constexpr float kDoubled[16] = {0, 1,  2,  3,  4,  6,  8,  12,
                                                             0, -1, -2, -3, -4, -6, -8, -12};
          for (int i = 0; i < R; ++i) {
            f[i] = _mm512_mul_ps(_mm512_load_ps(kDoubled),
                                 _mm512_set1_ps(model::mxfp4_scale(w[i][offset(k)])));
            mq[i] = _mm512_cvtepu8_epi32(
                _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[i] + offset(k) + 1)));
          }
        }
      } else if constexpr (kScaled) {
        if (k == k_next) {
          const int64_t b = k / cols_per_scale;
          for (int i = 0; i < R; ++i) {
            if constexpr (kF8) {
              f[i] = _mm512_set1_ps((kTiled ? 0x1p120f : 256.f) * sc[i][b]);
            } else {
              const __m512 steps =
                  kType == GgmlType::kFP4_PACKED
                      ? _mm512_loadu_ps(model::kE2M1Values)
                      : _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
              f[i] = _mm512_mul_ps(steps, _mm512_set1_ps(sc[i][b]));
            }
          }
          k_next += cols_per_scale;
        }
      }
    }
    // Nibble tiles: the 16 values of row i at columns k0 + 16 s of the 64-byte group from k0.
    template <int S>
    __m512 nibbles(int i, int64_t k0) const {
      const __m512i g = _mm512_loadu_si512(w[i] + k0 / kQuadCols * kQuadChunk);
      return _mm512_permutexvar_ps(S == 0 ? g : _mm512_srli_epi32(g, 4 * S), f[i]);
    }
    __m512 load(int i, int64_t k) const {
      if constexpr (kMx) {
        return _mm512_permutexvar_ps(k / 16 % 2 != 0 ? _mm512_srli_epi32(mq[i], 4) : mq[i], f[i]);
      } else if constexpr (kI4) {
        const __m512i q =
            _mm512_cvtepu8_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w[i] + k / 2)));
        return _mm512_permutexvar_ps(_mm512_or_si512(q, _mm512_slli_epi64(q, 28)), f[i]);
      } else if constexpr (kF8) {
        return _mm512_mul_ps(kQuads ? L::load_finite(w[i] + k / 16 * kQuadChunk) : L::load(w[i], k),
                             f[i]);
      } else if constexpr (kQuads) {
        return L::load(w[i] + k / 16 * kQuadChunk, 0);
      } else {
        return L::load(w[i], k);
      }
    }
    __m512 load_tail(int i, int64_t k, __mmask16 m) const {
      static_assert(!kI4 && !kMx, "I4, FP4 and MXFP4 rows have no tail");
      if constexpr (kF8) return _mm512_mul_ps(L::load_tail(w[i], k, m), f[i]);
      return L::load_tail(w[i], k, m);
    }
  };

  // The loops over acc[R][NT] are unroll<>s (compute/detail/unroll.h): written as for loops,
  // g++ 12 kept the row kernels' accumulators of 3 or more tokens on the stack, each FMA reading
  // one there and a store after it (the tiled ones it kept in registers). The loads stay a for
  // loop: in an unroll<> g++ dropped their _mm_prefetch (docs/benchmarks.md "Engine, session
  // 44").
  template <int R, int NT>
  static void tile(const MatmulJob& j, int64_t r, int64_t t) {
    Rows<R> rw(j, r);
    const float* x[NT];
    unroll<NT>([&](int n) __attribute__((always_inline)) {
      x[n] = reinterpret_cast<const float*>(j.act + (t + n) * j.act_stride);
    });
    __m512 acc[R][NT];
    unroll<R>([&](int i) __attribute__((always_inline)) {
      unroll<NT>([&](int n) __attribute__((always_inline)) { acc[i][n] = _mm512_setzero_ps(); });
    });
    const int64_t pf = 2 * R * j.w_row_bytes;  // the same place two tiles ahead
    // A quad's only pass (all tokens in one): its weights come from DRAM (below).
    [[maybe_unused]] const bool stream = j.n_tok <= kToks;
    // Multiply-add 16 columns of the R rows (wv) into the NT tokens' sums.
    const auto madd = [&](const __m512* wv, auto&& xload) __attribute__((always_inline)) {
      unroll<NT>([&](int n) __attribute__((always_inline)) {
        const __m512 xv = xload(x[n]);
        unroll<R>([&](int i) __attribute__((always_inline)) {
          acc[i][n] = _mm512_fmadd_ps(wv[i], xv, acc[i][n]);
        });
      });
    };
    int64_t k = 0;
    if constexpr (kNibbleTiles) {
      // 128 columns at a time (a 64-byte group of each row), unrolled, so that each 16 columns'
      // shift is an immediate on the group loaded again from L1: kept in a register per row, the
      // groups made passes of 6 tokens spill (4 more registers beside 24 sums and 4 value
      // vectors), and products of 16 tokens ran 0.9x as fast as reading rows.
      for (; k < j.cols; k += kQuadCols) {
        // Prefetches as the F16/BF16 quads' below, per chunk of 4 lines instead of 2, but for a
        // lone token: each line kStreamAheadL2 on into L2, not one per page two pages on. On a
        // Zen 4 host, 1.5x as fast with 5632 columns (one thread; the cache-resident rate) and
        // as fast with 2048 (docs/benchmarks.md "Engine, session 47").
        const uint8_t* chunk = rw.w[0] + k / kQuadCols * kQuadChunk;
        if constexpr (NT == 1 && R == kRows) {
          for (int64_t o = 0; o < kQuadChunk; o += 64) prefetch_l2(chunk + kStreamAheadL2 + o);
        } else if constexpr (R == kRows) {
          if (stream) {
            prefetch_page_ahead(chunk, kQuadChunk);
            for (int64_t o = 0; o < kQuadChunk; o += 64) {
              prefetch_l2(chunk + kStreamAheadL2 + o);
              prefetch_l1(chunk + kStreamAheadFar + o);
            }
          } else {
            prefetch(chunk, pf, kQuadChunk - 64);
          }
        }
        unroll<8>([&](auto s) __attribute__((always_inline)) {
          const int64_t ks = k + 16 * s;
          rw.at(ks);
          __m512 wv[R];
          unroll<R>([&](int i) __attribute__((always_inline)) {
            wv[i] = rw.template nibbles<decltype(s)::value>(i, k);
          });
          madd(
              wv, [ks](const float* xn)
                      __attribute__((always_inline)) { return _mm512_loadu_ps(xn + ks); });
        });
      }
    }
    for (; !kNibbleTiles && k + 16 <= j.cols; k += 16) {
      rw.at(k);
      __m512 wv[R];
      if constexpr (kQuads) {
        // One stream: a lone F16/BF16 token fetches a page two ahead as it enters a page, like the
        // int8 tile kernels (batch-1 decode 1.4x the per-line fetch below). 2 to kToks tokens, a
        // quad's only pass, do that too and fetch both lines of the chunk kStreamAheadFar bytes
        // on into L1: products of 2-6 tokens 1.2-1.5x as fast with two threads as with the chunk
        // two quads ahead into L1 (docs/benchmarks.md "Engine, session 44"), the form later
        // passes over a quad keep. They fetch both lines kStreamAheadL2 on into L2 first: on a
        // Zen 4 host 1.3-2.3x faster with one thread, 1.1-1.7x with two ("Engine, session 45").
        const uint8_t* chunk = rw.w[0] + k / 16 * kQuadChunk;
        if constexpr (NT == 1 && R == kRows && kF8) {
          // F8, a lone token: the line kStreamAheadL2 on into L2, as the nibble tiles above. On a
          // Zen 4 host, engine decode 1.15-1.2x as fast as with the page fetch ("Engine, session
          // 48").
          prefetch_l2(chunk + kStreamAheadL2);
        } else if constexpr (NT == 1 && R == kRows) {
          prefetch_page_ahead(chunk, kQuadChunk);
        } else if constexpr (R == kRows) {
          if (stream) {
            prefetch_page_ahead(chunk, kQuadChunk);
            for (int64_t o = 0; o < kQuadChunk; o += 64) {
              prefetch_l2(chunk + kStreamAheadL2 + o);
              prefetch_l1(chunk + kStreamAheadFar + o);
            }
          } else {
            prefetch(chunk, pf, kQuadChunk - 64);  // [chunk, chunk + kQuadChunk) + pf
          }
        }
      }
      for (int i = 0; i < R; ++i) {
        if (!kQuads && (kType == GgmlType::kF32 || (kMx ? k % 128 == 0 : (offset(k) & 63) == 0)))
          prefetch(rw.w[i] + offset(k), pf, 0);
        wv[i] = rw.load(i, k);
      }
      madd(
          wv, [k](const float* xn)
                  __attribute__((always_inline)) { return _mm512_loadu_ps(xn + k); });
    }
    if constexpr (!kI4 && !kMx && !kQuads) {
      if (k < j.cols) {
        rw.at(k);
        const auto m = static_cast<__mmask16>((1u << (j.cols - k)) - 1);
        __m512 wv[R];
        unroll<R>([&](int i) __attribute__((always_inline)) { wv[i] = rw.load_tail(i, k, m); });
        madd(
            wv, [ k, m ](const float* xn)
                    __attribute__((always_inline)) { return _mm512_maskz_loadu_ps(m, xn + k); });
      }
    }
    unroll<NT>([&](int n) __attribute__((always_inline)) {
      unroll<R>([&](int i) __attribute__((always_inline)) {
        j.y[(t + n) * j.y_stride + r + i] = hsum16(acc[i][n]);
      });
    });
  }
};

}  // namespace troupe::compute::detail::avx512
