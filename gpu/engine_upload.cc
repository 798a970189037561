// Weight upload and checks of GpuEngine::create (gpu/detail/engine_upload.h).
#include "gpu/detail/engine_upload.h"

#include <algorithm>
#include <cstddef>

#include "base/check.h"
#include "gpu/ops.h"

namespace troupe::gpu::detail {

using bf16 = __nv_bfloat16;
using model::GgmlType;
using model::WeightView;

namespace {

constexpr size_t kStagingBytes = size_t{64} << 20;  // raw bytes per copy

size_t sz(int64_t n) { return static_cast<size_t>(n); }
long long ll(int64_t v) { return static_cast<long long>(v); }

}  // namespace

void Uploader::rows(const WeightView& w, bf16* dst) {
  const int64_t n_rows = w.ne[1] * w.ne[2], row_bytes = w.row_bytes();
  if (n_rows == 0) return;
  const int64_t per = std::max<int64_t>(1, static_cast<int64_t>(kStagingBytes) / row_bytes);
  const size_t need = sz(std::min(per, n_rows) * row_bytes);
  if (staging_.size() < need) staging_ = DeviceBuffer<uint8_t>(need);
  for (int64_t r0 = 0; r0 < n_rows; r0 += per) {
    const int64_t n = std::min(per, n_rows - r0);
    const size_t bytes = sz(n * row_bytes);
    TROUPE_CUDA_CHECK(cudaMemcpyAsync(staging_.get(), w.data + r0 * row_bytes, bytes,
                                      cudaMemcpyHostToDevice, stream_));
    dequantize_to_bf16(staging_.get(), bytes, w.type, n, w.cols(), dst + r0 * w.cols(), stream_);
    // The next chunk overwrites the staging buffer.
    TROUPE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
}

void Uploader::cols(const WeightView& w, int64_t c0, int64_t nc, bf16* dst) {
  const int64_t n_rows = w.ne[1] * w.ne[2], row_bytes = w.row_bytes(), C = w.cols();
  if (c0 == 0 && nc == C) return rows(w, dst);
  if (n_rows == 0 || nc == 0) return;
  const int64_t per = std::max<int64_t>(
      1, static_cast<int64_t>(kStagingBytes) / std::max<int64_t>(row_bytes, 2 * C));
  const int64_t chunk = std::min(per, n_rows);
  if (staging_.size() < sz(chunk * row_bytes))
    staging_ = DeviceBuffer<uint8_t>(sz(chunk * row_bytes));
  if (wide_.size() < sz(chunk * C)) wide_ = DeviceBuffer<bf16>(sz(chunk * C));
  for (int64_t r0 = 0; r0 < n_rows; r0 += per) {
    const int64_t n = std::min(per, n_rows - r0);
    const size_t bytes = sz(n * row_bytes);
    TROUPE_CUDA_CHECK(cudaMemcpyAsync(staging_.get(), w.data + r0 * row_bytes, bytes,
                                      cudaMemcpyHostToDevice, stream_));
    dequantize_to_bf16(staging_.get(), bytes, w.type, n, C, wide_.get(), stream_);
    TROUPE_CUDA_CHECK(cudaMemcpy2DAsync(dst + r0 * nc, sz(nc) * sizeof(bf16), wide_.get() + c0,
                                        sz(C) * sizeof(bf16), sz(nc) * sizeof(bf16), sz(n),
                                        cudaMemcpyDeviceToDevice, stream_));
    TROUPE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
}

void Uploader::f32(const float* host, int64_t n, float* dst) {
  TROUPE_CUDA_CHECK(
      cudaMemcpyAsync(dst, host, sz(n) * sizeof(float), cudaMemcpyHostToDevice, stream_));
  TROUPE_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void Uploader::zeros(float* dst, int64_t n) {
  TROUPE_CUDA_CHECK(cudaMemsetAsync(dst, 0, sz(n) * sizeof(float), stream_));
}

void shape_error(const WeightView& w, const char* expected) {
  TROUPE_INPUT_ERROR("GpuEngine: weight %s has shape [%lld, %lld, %lld], expected %s",
                     w.name.c_str(), ll(w.ne[0]), ll(w.ne[1]), ll(w.ne[2]), expected);
}

void expect_matrix(const WeightView& w, int64_t rows, int64_t cols, int64_t stack) {
  if (!w.present()) TROUPE_INPUT_ERROR("GpuEngine: weight %s is missing", w.name.c_str());
  if (w.ne[0] != cols || w.ne[1] != rows || w.ne[2] != stack)
    shape_error(
        w, strfmt("[%lld, %lld, %lld] (cols, rows, stack)", ll(cols), ll(rows), ll(stack)).c_str());
  if (!dequantize_supported(w.type))
    TROUPE_INPUT_ERROR(
        "GpuEngine: weight %s has type %s, which the GPU backend does not support (f32, f16, "
        "bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, iq4_xs and q2_K to q6_K are)",
        w.name.c_str(), model::type_name(w.type).c_str());
}

void expect_f32_vector(const WeightView& w, int64_t n) {
  if (w.type != GgmlType::kF32)
    TROUPE_INPUT_ERROR("GpuEngine: norm/bias weight %s must be f32, is %s", w.name.c_str(),
                       model::type_name(w.type).c_str());
  if (w.ne[0] * w.ne[1] * w.ne[2] != n) shape_error(w, strfmt("%lld elements", ll(n)).c_str());
}

WeightView row_slice(const WeightView& w, int64_t r0, int64_t n) {
  WeightView v = w;
  v.ne[1] = n;
  v.data = w.data + r0 * w.row_bytes();
  return v;
}

}  // namespace troupe::gpu::detail
