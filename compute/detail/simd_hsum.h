// Horizontal sums of a float vector in one fixed order (halves, then quarters, then pairs), for
// the kernel files compiled for AVX2 or AVX-512. In an unnamed namespace: each including file
// keeps its own copy built for its instruction set (one shared inline copy could be an AVX-512
// build run on a CPU with AVX2 only).
#pragma once

#include <immintrin.h>

namespace troupe::compute::detail {
namespace {  // NOLINT(google-build-namespaces): one copy per SIMD level, see above

#if defined(__AVX2__)
inline float hsum8(__m256 v) {
  __m128 b = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  b = _mm_add_ps(b, _mm_movehl_ps(b, b));
  b = _mm_add_ss(b, _mm_movehdup_ps(b));
  return _mm_cvtss_f32(b);
}
#endif

#if defined(__AVX512F__) && defined(__AVX512DQ__)
inline float hsum16(__m512 v) {
  return hsum8(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}
#endif

}  // namespace
}  // namespace troupe::compute::detail
