// Pieces shared by the AVX-512 kernel files (matmul_avx512.cc: float, Q8_0, Q4_0;
// matmul_kquant_avx512.cc: Q4_K, Q6_K). Include only from *_avx512.cc files: they are compiled
// with -mavx512f -mavx512bw -mavx512vl -mavx512dq (compute/CMakeLists.txt), and these inline
// functions use those instructions.
#pragma once

#include <immintrin.h>

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "compute/detail/matmul_kernels.h"
#include "compute/detail/page_ahead.h"

namespace troupe::compute::detail {

// int32 lanes += 4-byte dot products of unsigned a and signed b. Both variants are exact, so
// they give the same lanes; the pairwise one needs |a*b| pair sums below 2^15, which every
// caller keeps (a <= 128 with |b| <= 127, or a <= 63).
template <bool kVnni>
inline __m512i dot_u8s8(__m512i acc, __m512i a, __m512i b);

// vpdpbusd through inline asm: a target attribute would stop the kernels from inlining it
// (they are compiled without -mavx512vnni), and this runs only where VNNI was detected.
template <>
inline __m512i dot_u8s8<true>(__m512i acc, __m512i a, __m512i b) {
  __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
  return acc;
}

template <>
inline __m512i dot_u8s8<false>(__m512i acc, __m512i a, __m512i b) {
  const __m512i pairs = _mm512_maddubs_epi16(a, b);
  return _mm512_add_epi32(acc, _mm512_madd_epi16(pairs, _mm512_set1_epi16(1)));
}

// acc += 4-byte dots of unsigned w with the 4 signed bytes at p broadcast, the broadcast folded
// into the instruction's memory operand (VNNI only: the tile kernels).
inline __m512i dot_u8s8_bcast(__m512i acc, __m512i w, const void* p) {
  __asm__("vpdpbusd %2%{1to16%}, %1, %0"
          : "+v"(acc)
          : "v"(w), "m"(*static_cast<const int32_t*>(p)));
  return acc;
}

// The high nibbles of z's bytes, as bytes 0-15. With GFNI one affine transform (its matrix
// moves bits 4-7 to 0-3 and clears the rest), else a shift and a mask: Q4_0 and Q4_K tiles
// unpack half their values through this, once per record and pass. Inline asm as for vpdpbusd:
// runs only where GFNI was detected.
template <bool kGfni>
inline __m512i high_nibbles(__m512i z) {
  if constexpr (kGfni) {
    const __m512i m = _mm512_set1_epi64(0x1020408000000000);
    __asm__("vgf2p8affineqb $0, %1, %0, %0" : "+v"(z) : "v"(m));
    return z;
  } else {
    return _mm512_and_si512(_mm512_srli_epi16(z, 4), _mm512_set1_epi8(0x0F));
  }
}

// The 16 rows of a tile read from ggml's row layout (a mapped file) by the tile kernels'
// kRowsIn instantiations. load16 reads 16 bytes of each row and transposes them into 4 vectors
// of dwords; loading 4 rows per 128-bit lane and transposing dwords within lanes puts row 4g + L
// in lane 4L + g (lane_row; the map is its own inverse), and a kernel's results go back to row
// order once per tile (to_row_order). A dword gather per vector, as first written, streamed 2-3
// times slower (docs/benchmarks.md "Engine, session 16"). Rows at and past n are read as row 0:
// their lanes are computed but never stored (and gathers, in the same lane order, mask them).
struct TileRows {
  static constexpr int lane_row(int p) { return 4 * (p % 4) + p / 4; }

  const uint8_t* row[16];
  __m512i offsets;  // byte offset of each lane's row, for gathers (int32: tile16_rows checks)
  __mmask16 valid;  // lanes of rows below n

  TileRows(const uint8_t* base, int64_t row_bytes, int64_t n) {
    alignas(64) int32_t off[16];
    unsigned v = 0;
    for (int p = 0; p < 16; ++p) {
      off[p] = static_cast<int32_t>(lane_row(p) * row_bytes);
      if (lane_row(p) < n) v |= 1u << p;
      row[p] = base + (p < n ? p : 0) * row_bytes;
    }
    offsets = _mm512_load_si512(off);
    valid = static_cast<__mmask16>(v);
  }

  // The 16 bytes at `at` of each row as 4 vectors: v[c] lane p = dword c of row lane_row(p).
  void load16(int64_t at, __m512i* v) const {
    __m512i z[4];  // z[g] lane L: row 4g + L
    for (int g = 0; g < 4; ++g) {
      auto row16 = [&](int i) {
        return _mm_loadu_si128(reinterpret_cast<const __m128i*>(row[4 * g + i] + at));
      };
      __m512i t = _mm512_castsi128_si512(row16(0));
      t = _mm512_inserti32x4(t, row16(1), 1);
      t = _mm512_inserti32x4(t, row16(2), 2);
      z[g] = _mm512_inserti32x4(t, row16(3), 3);
    }
    const __m512i t0 = _mm512_unpacklo_epi32(z[0], z[1]), t1 = _mm512_unpackhi_epi32(z[0], z[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(z[2], z[3]), t3 = _mm512_unpackhi_epi32(z[2], z[3]);
    v[0] = _mm512_unpacklo_epi64(t0, t2);
    v[1] = _mm512_unpackhi_epi64(t0, t2);
    v[2] = _mm512_unpacklo_epi64(t1, t3);
    v[3] = _mm512_unpackhi_epi64(t1, t3);
  }

  // The dword at `at` of each row (lane order as load16's), lanes of rows past n zero.
  __m512i gather(const uint8_t* base, int64_t at) const {
    return _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), valid, offsets, base + at, 1);
  }

  // Results in lane order back to row order.
  static __m512 to_row_order(__m512 x) {
    const __m512i order = _mm512_setr_epi32(lane_row(0), lane_row(1), lane_row(2), lane_row(3),
                                            lane_row(4), lane_row(5), lane_row(6), lane_row(7),
                                            lane_row(8), lane_row(9), lane_row(10), lane_row(11),
                                            lane_row(12), lane_row(13), lane_row(14), lane_row(15));
    return _mm512_permutexvar_ps(order, x);
  }
};
/// What a tile kernel reading tiles has in TileRows' place.
struct NoRows {
  NoRows(const uint8_t*, int64_t, int64_t) {}
};

// ------------------------------------------------------------------------------------------
// Int8 activation quantization. Scale amax/127, round to nearest even (vcvtps2dq); a block
// holding NaN or an infinity gets a NaN scale and zero values, so the output is NaN.

// Quantizes 16*n_vec floats to int32 lanes q[]; returns the scale.
inline float quantize_vecs(const float* x, int n_vec, __m512i* q) {
  __m512 amax = _mm512_setzero_ps();
  __mmask16 bad = 0;
  __m512 v[16];
  for (int i = 0; i < n_vec; ++i) {
    v[i] = _mm512_loadu_ps(x + 16 * i);
    bad |= _mm512_cmp_ps_mask(v[i], v[i], _CMP_UNORD_Q);
    amax = _mm512_max_ps(amax, _mm512_abs_ps(v[i]));
  }
  const float m = _mm512_reduce_max_ps(amax);
  if (bad != 0 || !(m <= FLT_MAX)) {
    for (int i = 0; i < n_vec; ++i) q[i] = _mm512_setzero_si512();
    return NAN;
  }
  const float inv = m > 0.f ? 127.f / m : 0.f;  // too small a block: zeros (quantize_int8)
  const __m512 id = _mm512_set1_ps(inv <= FLT_MAX ? inv : 0.f);
  for (int i = 0; i < n_vec; ++i) q[i] = _mm512_cvtps_epi32(_mm512_mul_ps(v[i], id));
  return m / 127.f;
}

// Kernels that walk their rows themselves (K::rows) rather than through tiled_rows.
template <class K>
TypeKernels streaming_kernels(int64_t (*bytes)(int64_t),
                              void (*quantize)(const float*, int64_t, uint8_t*)) {
  TypeKernels k;
  k.act_row_bytes = bytes;
  k.quantize = quantize;
  k.rows = K::rows;
  k.row_tile = K::kRows;
  return k;
}

/// The Q4_K, Q5_K and Q6_K kernels without VNNI (matmul_kquant_avx512.cc); with VNNI they run
/// the tile kernels (avx512_tile_kernels_k, avx512_tile_kernels_q6k).
void avx512_kquant_kernels(TypeKernels* q4_k, TypeKernels* q5_k, TypeKernels* q6_k);
/// The Q2_K, Q3_K and IQ4_XS kernels (matmul_kquant_avx512.cc), with or without VNNI: no tiles.
void avx512_low_bit_kernels(TypeKernels* q2_k, TypeKernels* q3_k, TypeKernels* iq4_xs);

/// The VNNI kernels for Q8_0 and Q4_0 in 16-row tiles, and the same arithmetic reading them in
/// rows (matmul_tiles_avx512.cc); gfni: unpack 4-bit values with GFNI (the same bits).
void avx512_tile_kernels(bool gfni, TypeKernels* q8_0, TypeKernels* q4_0, TypeKernels* q8_0_rows,
                         TypeKernels* q4_0_rows);
/// Q4_1, Q5_0 and Q5_1 likewise (matmul_tiles_avx512.cc): s's q*_t16 and rows kernels.
void avx512_tile_kernels_q451(bool gfni, KernelSet* s);
/// The same for Q4_K and Q5_K (matmul_tiles_k_avx512.cc) and Q6_K (matmul_tiles_q6k_avx512.cc).
void avx512_tile_kernels_k(bool gfni, TypeKernels* q4_k_tiles, TypeKernels* q4_k_rows,
                           TypeKernels* q5_k_tiles, TypeKernels* q5_k_rows);
void avx512_tile_kernels_q6k(bool gfni, TypeKernels* q6_k_tiles, TypeKernels* q6_k_rows);

}  // namespace troupe::compute::detail
