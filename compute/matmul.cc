// Reference matmul: dequantize one weight row at a time, f32 dot in a fixed order.
// TODO(#2): SIMD kernels with run-time dispatch and quantized-activation paths.
#include "compute/matmul.h"

#include <vector>

#include "compute/thread_pool.h"

namespace troupe::compute {

namespace {
// Fixed reduction order: 8 partial sums over i mod 8, combined pairwise at the end.
float dot_f32(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += a[i + k] * b[i + k];
  for (int k = 0; i < n; ++i, ++k) acc[k] += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}
}  // namespace

void get_row(const model::WeightView& w, int64_t r, float* out) {
  model::dequantize_row(w.type, w.row(r), out, w.cols());
}

void matmul(const model::WeightView& w, const float* x, int64_t x_stride, int64_t n_tok, float* y,
            int64_t y_stride, ThreadPool* pool) {
  const int64_t rows = w.rows(), cols = w.cols();
  auto body = [&](int64_t r0, int64_t r1) {
    std::vector<float> buf(static_cast<size_t>(cols));
    for (int64_t r = r0; r < r1; ++r) {
      const float* wr;
      if (w.type == model::GgmlType::kF32) {
        wr = reinterpret_cast<const float*>(w.row(r));
      } else {
        model::dequantize_row(w.type, w.row(r), buf.data(), cols);
        wr = buf.data();
      }
      for (int64_t t = 0; t < n_tok; ++t) y[t * y_stride + r] = dot_f32(wr, x + t * x_stride, cols);
    }
  };
  if (pool && pool->size() > 1 && rows >= 16) {
    pool->parallel_for(rows, 16, body);
  } else {
    body(0, rows);
  }
}

const char* simd_level() { return "scalar"; }

}  // namespace troupe::compute
