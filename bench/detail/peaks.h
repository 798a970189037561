// The machine's arithmetic peaks, measured one way for every benchmark that reports a fraction of
// them (matmul_bench, engine_bench): f32 FMA (the float kernels) and int8 dot products (the
// quantized kernels: Q8_0, Q4_0 and the K-quants multiply int8 weights by int8 activations).
// Each loop runs 12-16 independent accumulator chains, enough to cover latency x pipes; the
// figure is the best of 5 passes, since other load on the machine only ever lowers it.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "compute/thread_pool.h"

namespace troupe::bench {

__attribute__((target("avx512f"))) inline double fma_loop_avx512(int64_t iters) {
  __m512 a[16];
  for (int i = 0; i < 16; ++i) a[i] = _mm512_set1_ps(static_cast<float>(i) * 1e-3f);
  const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  for (int64_t k = 0; k < iters; ++k)
    for (int i = 0; i < 16; ++i) a[i] = _mm512_fmadd_ps(a[i], m, c);
  float v[16], s = 0;
  for (int i = 0; i < 16; ++i) {
    _mm512_storeu_ps(v, a[i]);
    for (float x : v) s += x;
  }
  return static_cast<double>(iters) * 16 * 16 * 2 + (s == 12345.f ? 1 : 0);
}

__attribute__((target("avx2,fma"))) inline double fma_loop_avx2(int64_t iters) {
  __m256 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm256_set1_ps(static_cast<float>(i) * 1e-3f);
  const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  for (int64_t k = 0; k < iters; ++k)
    for (int i = 0; i < 12; ++i) a[i] = _mm256_fmadd_ps(a[i], m, c);
  float v[8], s = 0;
  for (int i = 0; i < 12; ++i) {
    _mm256_storeu_ps(v, a[i]);
    for (float x : v) s += x;
  }
  return static_cast<double>(iters) * 12 * 8 * 2 + (s == 12345.f ? 1 : 0);
}

/// u8 x s8 dot products accumulated into s32 (vpdpbusd: 64 multiply-adds per instruction),
/// counted as 2 operations per multiply-add. Twelve named accumulators: written as an array of
/// 16 (as the loops above), g++ 12 kept two of them on the stack, and the store-to-load chain
/// through them held the loop to about half the peak -- every "of the int8 peak" figure before
/// 2026-12-03 is against that half (docs/benchmarks.md, "Engine, session 27").
__attribute__((target("avx512f,avx512bw,avx512vnni"))) inline double int8_loop_avx512vnni(
    int64_t iters) {
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
  __m512i c0 = _mm512_set1_epi32(0), c1 = _mm512_set1_epi32(1), c2 = _mm512_set1_epi32(2),
          c3 = _mm512_set1_epi32(3), c4 = _mm512_set1_epi32(4), c5 = _mm512_set1_epi32(5),
          c6 = _mm512_set1_epi32(6), c7 = _mm512_set1_epi32(7), c8 = _mm512_set1_epi32(8),
          c9 = _mm512_set1_epi32(9), c10 = _mm512_set1_epi32(10), c11 = _mm512_set1_epi32(11);
  for (int64_t k = 0; k < iters; ++k) {
    c0 = _mm512_dpbusd_epi32(c0, a, b);
    c1 = _mm512_dpbusd_epi32(c1, a, b);
    c2 = _mm512_dpbusd_epi32(c2, a, b);
    c3 = _mm512_dpbusd_epi32(c3, a, b);
    c4 = _mm512_dpbusd_epi32(c4, a, b);
    c5 = _mm512_dpbusd_epi32(c5, a, b);
    c6 = _mm512_dpbusd_epi32(c6, a, b);
    c7 = _mm512_dpbusd_epi32(c7, a, b);
    c8 = _mm512_dpbusd_epi32(c8, a, b);
    c9 = _mm512_dpbusd_epi32(c9, a, b);
    c10 = _mm512_dpbusd_epi32(c10, a, b);
    c11 = _mm512_dpbusd_epi32(c11, a, b);
  }
  const __m512i sum = _mm512_add_epi32(
      _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(c0, c1), _mm512_add_epi32(c2, c3)),
                       _mm512_add_epi32(_mm512_add_epi32(c4, c5), _mm512_add_epi32(c6, c7))),
      _mm512_add_epi32(_mm512_add_epi32(c8, c9), _mm512_add_epi32(c10, c11)));
  int32_t v[16];
  _mm512_storeu_si512(v, sum);
  int64_t s = 0;
  for (int32_t x : v) s += x;
  return static_cast<double>(iters) * 12 * 64 * 2 + (s == 12345 ? 1 : 0);
}

/// The AVX2 way to the same sums: u8 x s8 pairs to s16 (vpmaddubsw), pairs of s16 to s32
/// (vpmaddwd with ones), added: 32 multiply-adds per three instructions.
__attribute__((target("avx2"))) inline double int8_loop_avx2(int64_t iters) {
  __m256i acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_epi32(i);
  const __m256i a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(-2), ones = _mm256_set1_epi16(1);
  for (int64_t k = 0; k < iters; ++k)
    for (int i = 0; i < 12; ++i)
      acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), ones));
  int32_t v[8];
  int64_t s = 0;
  for (int i = 0; i < 12; ++i) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(v), acc[i]);
    for (int32_t x : v) s += x;
  }
  return static_cast<double>(iters) * 12 * 32 * 2 + (s == 12345 ? 1 : 0);
}

enum class PeakKind { kF32Fma, kInt8Dot };

/// The peak of `kind` with the pool's threads for the kernel level `level` (compute::simd_level:
/// "avx512", "avx2" or "scalar"), in G operations/s (a multiply-add counts 2). Scalar, and int8
/// on AVX-512 without VNNI, are not measured: 0.
inline double compute_peak(compute::ThreadPool& pool, const std::string& level, PeakKind kind) {
  const bool vnni = __builtin_cpu_supports("avx512vnni");
  if (level == "scalar" || (kind == PeakKind::kInt8Dot && level == "avx512" && !vnni)) return 0;
  std::vector<double> g;
  for (int pass = 0; pass < 5; ++pass) {
    std::vector<double> ops(static_cast<size_t>(pool.size()));
    const auto t0 = std::chrono::steady_clock::now();
    pool.run([&](int idx, int) {
      constexpr int64_t kIters = 2'000'000;
      double f = 0;
      if (kind == PeakKind::kF32Fma)
        f = level == "avx512" ? fma_loop_avx512(kIters) : fma_loop_avx2(kIters);
      else
        f = level == "avx512" ? int8_loop_avx512vnni(kIters) : int8_loop_avx2(kIters);
      ops[static_cast<size_t>(idx)] = f;
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double total = 0;
    for (double f : ops) total += f;
    g.push_back(total / s / 1e9);
  }
  return *std::max_element(g.begin(), g.end());
}

}  // namespace troupe::bench
