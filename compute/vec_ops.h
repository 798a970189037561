// Small f32 vector kernels for attention (dot products and scaled adds), dispatched once per
// process to the same SIMD level as the matmul kernels. Each function's result depends only on
// its inputs and n, so attention stays batch-invariant. Thread-safe (pure functions).
#pragma once

#include <cstdint>

namespace troupe::compute {

/// sum_i a[i] * b[i] in a fixed order for a given n.
float vec_dot(const float* a, const float* b, int64_t n);
/// y[i] += alpha * x[i].
void vec_axpy(float alpha, const float* x, float* y, int64_t n);

namespace detail {
struct VecOps {
  float (*dot)(const float*, const float*, int64_t);
  void (*axpy)(float, const float*, float*, int64_t);
};
VecOps vec_ops_avx2();
VecOps vec_ops_avx512();
}  // namespace detail

}  // namespace troupe::compute
