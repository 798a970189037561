// Private to gpu/engine_setup.cc and gpu/engine_upload.cc: GpuEngine::create's weight upload
// (Uploader: dequantizes to bf16 on the device through a staging buffer, whole rows or a column
// range, a tensor-parallel rank's share) and the shape and type checks of each weight.
// Set-up only, on the creating thread.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "gpu/runtime.h"
#include "model/model_spec.h"

namespace troupe::gpu::detail {

/// Copies weights to the device: matrices dequantized to bf16 through a staging buffer, norm and
/// bias vectors as f32. Synchronous: each call returns when its copies are done.
class Uploader {
 public:
  explicit Uploader(cudaStream_t stream) : stream_(stream) {}

  /// All rows of w (ne[1] * ne[2] rows of ne[0] columns) as bf16 at dst, row-major.
  void rows(const model::WeightView& w, __nv_bfloat16* dst);
  /// Columns [c0, c0 + nc) of every row of w as bf16 [rows, nc] at dst (tensor parallelism's
  /// share of a matrix whose input is split: wo, the down projections).
  void cols(const model::WeightView& w, int64_t c0, int64_t nc, __nv_bfloat16* dst);
  void f32(const float* host, int64_t n, float* dst);
  void zeros(float* dst, int64_t n);

 private:
  cudaStream_t stream_;
  DeviceBuffer<uint8_t> staging_;
  DeviceBuffer<__nv_bfloat16> wide_;  // cols(): whole dequantized rows
};

/// Throws InputError naming the weight, its shape and the expected one.
[[noreturn]] void shape_error(const model::WeightView& w, const char* expected);
/// A present matrix [stack][rows][cols] of a type the upload takes; else InputError.
void expect_matrix(const model::WeightView& w, int64_t rows, int64_t cols, int64_t stack = 1);
/// An f32 vector of n elements; else InputError.
void expect_f32_vector(const model::WeightView& w, int64_t n);
/// Rows [r0, r0 + n) of a 2-D weight (tensor parallelism's share of a matrix whose output is
/// split: wq/wk/wv, wq_b, gate and up).
model::WeightView row_slice(const model::WeightView& w, int64_t r0, int64_t n);

}  // namespace troupe::gpu::detail
