// Shared helpers of the GPU tests: skip without a usable GPU, host bf16 conversion, random
// inputs, and an element-wise comparison that fails on NaN and on any unwritten (poisoned) value.
#pragma once

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gpu/runtime.h"

/// Every GPU test starts with this: it skips, saying why, where cudaGetDeviceCount fails or
/// finds no device (DEPENDENCIES.md §5: a failing call reports count 0 too).
#define TROUPE_REQUIRE_GPU()                                     \
  do {                                                           \
    std::string troupe_gpu_why_;                                 \
    if (!::troupe::gpu::gpu_available(&troupe_gpu_why_))         \
      GTEST_SKIP() << "no usable CUDA GPU: " << troupe_gpu_why_; \
  } while (0)

namespace troupe::gpu::testing {

/// f32 -> bf16 with round-to-nearest-even (what __float2bfloat16 does on the device).
inline __nv_bfloat16 to_bf16(float f) { return __float2bfloat16(f); }
inline float from_bf16(__nv_bfloat16 b) { return __bfloat162float(b); }

inline std::vector<__nv_bfloat16> to_bf16(const std::vector<float>& v) {
  std::vector<__nv_bfloat16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = to_bf16(v[i]);
  return out;
}
inline std::vector<float> from_bf16(const std::vector<__nv_bfloat16>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = from_bf16(v[i]);
  return out;
}
/// Rounds through bf16 and back: the host reference uses the same inputs the device sees.
inline std::vector<float> round_bf16(const std::vector<float>& v) { return from_bf16(to_bf16(v)); }

inline std::vector<float> random_floats(size_t n, uint64_t seed, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

/// Expects |got - want| <= atol + rtol * |want| for every element; a NaN or infinity in `got`
/// always fails (poisoned outputs are NaN). Reports the first few mismatches and their count.
inline ::testing::AssertionResult all_close(const std::vector<float>& got,
                                            const std::vector<float>& want, float rtol, float atol,
                                            const char* what = "output") {
  if (got.size() != want.size())
    return ::testing::AssertionFailure()
           << what << ": size " << got.size() << " != expected " << want.size();
  size_t bad = 0;
  std::string first;
  for (size_t i = 0; i < got.size(); ++i) {
    const float g = got[i], w = want[i];
    const bool ok = std::isfinite(g) && std::fabs(g - w) <= atol + rtol * std::fabs(w);
    if (!ok) {
      if (bad < 5)
        first += "\n  [" + std::to_string(i) + "] got " + std::to_string(g) + " want " +
                 std::to_string(w);
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": " << bad << " of " << got.size() << " elements outside rtol " << rtol
         << " atol " << atol << first;
}

}  // namespace troupe::gpu::testing
