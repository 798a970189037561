// Shared by the AVX2 kernel files (matmul_avx2.cc, matmul_tiles_avx2.cc, matmul_tiles_k_avx2.cc):
// small loads and AVX-VNNI's dot product, and the record loop and entry of the tile kernels. In an
// unnamed namespace, as simd_hsum.h: each including file keeps its own copy built with its AVX2
// flags.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "compute/detail/matmul_kernels.h"
#include "compute/detail/matmul_tiles.h"
#include "compute/detail/page_ahead.h"
#include "compute/detail/unroll.h"

namespace troupe::compute::detail {
namespace {  // NOLINT(google-build-namespaces): one copy per including file, see above

#if defined(__AVX2__)
/// acc + the exact 4-byte dot products of unsigned a and signed b in each int32 lane, by
/// AVX-VNNI's VEX-encoded vpdpbusd; asm, so that the including file keeps its AVX2 flags.
inline __m256i dpbusd(__m256i acc, __m256i a, __m256i b) {
  __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(a), "x"(b));
  return acc;
}

/// The 4 bytes at p in every dword.
inline __m256i bcast4(const void* p) {
  int32_t v;
  __builtin_memcpy(&v, p, sizeof v);
  return _mm256_set1_epi32(v);
}

inline __m256i load32(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

/// 8 f16 at p as floats.
inline __m256 f16x8(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

/// The record loop of the AVX2 tile kernels: halves [h0, h0 + NH) (rows 8 h..) of the tile at w
/// for the tokens' activation records a[0..NT), every record in order, into out. K provides
/// kRec (bytes of a record), kRecCols (columns it holds), kNextRecord (one token alone prefetches
/// the next record into L1, as well as a page ahead) and
///   template <int NT, int NH> static void record(const MatmulJob&, const uint8_t* tile,
///       const uint8_t* rec, int64_t s, const Act* const* x, int h0, __m256 (&acc)[NH][NT]);
/// (x[n]: token n's activation record for record s).
template <class K, class Act, int NT, int NH>
[[gnu::always_inline]] inline void avx2_pass(const MatmulJob& j, const uint8_t* w,
                                             const Act* const* a, int h0, bool alone,
                                             float (&out)[NT][16]) {
  __m256 acc[NH][NT];
  unroll<NH>([&](int hh) __attribute__((always_inline)) {
    unroll<NT>([&](int n) __attribute__((always_inline)) { acc[hh][n] = _mm256_setzero_ps(); });
  });
  for (int64_t s = 0; s < j.cols / K::kRecCols; ++s) {
    const uint8_t* rec = w + s * K::kRec;
    if (alone) {
      prefetch_page_ahead(rec, K::kRec);
      if constexpr (K::kNextRecord)
        for (int64_t o = 0; o < K::kRec; o += 64) prefetch_l1(rec + K::kRec + o);
    }
    const Act* x[NT];
    unroll<NT>([&](int n) __attribute__((always_inline)) { x[n] = a[n] + s; });
    K::template record<NT, NH>(j, w, rec, s, x, h0, acc);
  }
  unroll<NH>([&](int hh) __attribute__((always_inline)) {
    unroll<NT>([&](int n) __attribute__((always_inline)) {
      _mm256_storeu_ps(out[n] + 8 * (h0 + hh), acc[hh][n]);
    });
  });
}

/// A kernel K's tile(): one token alone reads each record once for both halves, so the weights
/// stream without a pause; more tokens take a half at a time (the tile, 18-50 KB, is still in
/// L1 or L2 for the second), so that their sums fit the 16 registers.
template <class K, class Act, int NT>
[[gnu::always_inline]] inline void avx2_tile(const MatmulJob& j, int64_t row, int64_t tok,
                                             int64_t n_rows, TilePass pass) {
  const uint8_t* w = j.w + row * j.w_row_bytes;
  const Act* a[NT];
  unroll<NT>([&](int n) __attribute__((always_inline)) {
    a[n] = reinterpret_cast<const Act*>(j.act + (tok + n) * j.act_stride);
  });
  alignas(32) float out[NT][16];
  if constexpr (NT == 1) {
    avx2_pass<K, Act, NT, 2>(j, w, a, 0, pass.alone(NT), out);
  } else {
    avx2_pass<K, Act, NT, 1>(j, w, a, 0, false, out);
    avx2_pass<K, Act, NT, 1>(j, w, a, 1, false, out);
  }
  for (int n = 0; n < NT; ++n)
    for (int64_t i = 0; i < n_rows; ++i) j.y[(tok + n) * j.y_stride + row + i] = out[n][i];
}
#endif

}  // namespace
}  // namespace troupe::compute::detail
