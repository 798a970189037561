// Matrix products of stored weights (any supported GgmlType) with f32 activations.
// Batch-invariant by contract: y[t][o] depends only on weight row o and activation row t, never
// on n_tok, on the thread count, or on which rows are computed together. Tests pin this.
#pragma once

#include <cstdint>

#include "model/model_spec.h"

namespace troupe::compute {

class ThreadPool;

/// y[t * y_stride + o] = dot(W row o, x row t) for t < n_tok, o < w.rows().
/// x: f32 [n_tok, w.cols()] with row stride x_stride; y: f32 with row stride y_stride.
/// pool may be null (single-threaded).
void matmul(const model::WeightView& w, const float* x, int64_t x_stride, int64_t n_tok, float* y,
            int64_t y_stride, ThreadPool* pool);

/// Convenience: dense rows, y_stride = w.rows(), x_stride = w.cols().
inline void matmul(const model::WeightView& w, const float* x, int64_t n_tok, float* y,
                   ThreadPool* pool) {
  matmul(w, x, w.cols(), n_tok, y, w.rows(), pool);
}

/// Dequantizes row r of w into out[w.cols()] (embedding lookup).
void get_row(const model::WeightView& w, int64_t r, float* out);

/// Which SIMD path the kernels dispatch to on this CPU ("avx512", "avx2", "scalar").
const char* simd_level();

}  // namespace troupe::compute
