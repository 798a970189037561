// Helpers shared by the matmul tests (matmul_test.cc, matmul_tiles_test.cc, the FP8 and int4
// ones).
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/check.h"
#include "compute/detail/matmul_kernels.h"
#include "compute/matmul.h"
#include "compute/thread_pool.h"
#include "model/model_spec.h"

namespace troupe::compute::matmultest {

/// n_tok rows of cols uniform values in [-1, 1).
inline std::vector<float> random_x(int64_t n_tok, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  std::vector<float> x(static_cast<size_t>(n_tok * cols));
  for (auto& v : x) v = uni(rng);
  return x;
}

/// Every kernel set this CPU runs, best first (the scalar one last).
inline std::vector<const detail::KernelSet*> kernel_sets() {
  const detail::KernelSet* sets[8];
  const int n = detail::supported_kernel_sets(sets, 8);
  return {sets, sets + n};
}

/// w times x's first n_tok rows through kernel set ks (dense output, -12345 where unwritten).
inline std::vector<float> run(const detail::KernelSet& ks, const model::WeightView& w,
                              const std::vector<float>& x, int64_t n_tok, ThreadPool* pool) {
  std::vector<float> y(static_cast<size_t>(n_tok * w.rows()), -12345.f);
  detail::matmul_with(ks, w, x.data(), w.cols(), n_tok, y.data(), w.rows(), pool);
  return y;
}

/// A view of `values` as an F32 matrix of rows x cols (the exact twin of a scaled matrix).
inline model::WeightView f32_view(const std::vector<float>& values, int64_t rows, int64_t cols) {
  model::WeightView v;
  v.name = "test.f32";
  v.type = model::GgmlType::kF32;
  v.ne[0] = cols;
  v.ne[1] = rows;
  v.data = reinterpret_cast<const uint8_t*>(values.data());
  return v;
}

/// The InputError message of w times one row of x (a bad weight view's refusal), or
/// "no error".
inline std::string matmul_error(const model::WeightView& w, const std::vector<float>& x) {
  std::vector<float> y(static_cast<size_t>(w.rows()));
  try {
    matmul(w, x.data(), 1, y.data(), nullptr);
  } catch (const InputError& e) {
    return e.what();
  }
  return "no error";
}

/// a and b hold the same bits.
inline void expect_bits(const std::vector<float>& a, const std::vector<float>& b,
                        const char* what) {
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << what;
}

}  // namespace troupe::compute::matmultest
