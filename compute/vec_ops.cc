// Dispatch and the scalar fallback of the attention vector kernels.
#include "compute/vec_ops.h"

#include <string_view>

#include "compute/matmul.h"

namespace troupe::compute {

namespace {

float dot_scalar(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += a[i + k] * b[i + k];
  for (int k = 0; i < n; ++i, ++k) acc[k] += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

void axpy_scalar(float alpha, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// Chosen once, from the same level the matmul kernels use (TROUPE_SIMD applies to both).
const detail::VecOps& ops() {
  static const detail::VecOps o = [] {
    const std::string_view level = simd_level();
    if (level == "avx512") return detail::vec_ops_avx512();
    if (level == "avx2") return detail::vec_ops_avx2();
    return detail::VecOps{dot_scalar, axpy_scalar};
  }();
  return o;
}

}  // namespace

float vec_dot(const float* a, const float* b, int64_t n) { return ops().dot(a, b, n); }
void vec_axpy(float alpha, const float* x, float* y, int64_t n) { ops().axpy(alpha, x, y, n); }

}  // namespace troupe::compute
