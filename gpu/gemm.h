// Gemm: y = x · W^T on the GPU through cuBLASLt, for the linear layers of a stage or an expert
// shard. bf16 inputs, f32 accumulation, f32 or bf16 output; epilogues: + bias, and y += (the
// residual add fused into the GEMM). Batch-invariant: row m of y is bitwise the same whatever M is.
// Thread safety: one Gemm per compute actor (it owns a cuBLASLt handle, a cache and a workspace
// pointer); calls come from that actor's thread, on the device current when it was created.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace troupe::gpu {

enum class GemmOut : uint8_t {
  kF32 = 0,   ///< f32 output (bias f32)
  kBf16 = 1,  ///< bf16 output, rounded to nearest even from the f32 accumulator (bias bf16)
};

/// One product y = x · W^T (+ bias) (+ y). All matrices row-major; leading dimensions in elements.
/// Requirements (checked by validate_gemm_args, InputError naming the field):
///  - m >= 0 (m == 0 does nothing), n >= 1, k >= 1; ldx >= k, ldw >= k, ldy >= n (0 = dense).
///  - x, w, y and bias are 16-byte aligned (Arena and cudaMalloc give 256). Leading dimensions
///    may be any value: cuBLASLt takes rows aligned to 2, 4 or 8 bytes too (slower kernels), so
///    odd k and n work; the alignment class of ldx/ldw/ldy is part of the algorithm cache key.
///  - bias has the output's type (cuBLASLt's bias epilogue reads Dtype for bf16/f32 GEMMs).
///  - accumulate needs an f32 output (adding into bf16 would round the residual every layer).
struct GemmArgs {
  int64_t m = 0;                     // rows of x and y (tokens in the batch)
  int64_t n = 0;                     // output features (rows of W)
  int64_t k = 0;                     // input features
  const __nv_bfloat16* x = nullptr;  // bf16 [m, k], row stride ldx
  int64_t ldx = 0;
  const __nv_bfloat16* w = nullptr;  // bf16 [n, k], row stride ldw (a weight matrix as stored)
  int64_t ldw = 0;
  void* y = nullptr;  // f32 or bf16 [m, n], row stride ldy
  int64_t ldy = 0;
  GemmOut y_type = GemmOut::kF32;
  const void* bias = nullptr;  // [n] of the output type, added to every row; null = none
  bool accumulate = false;     // true: y = y + x·W^T (+ bias), C = D in place, beta = 1
};

/// Throws troupe::InputError when `a` breaks a requirement above. Needs no GPU.
void validate_gemm_args(const GemmArgs& a);

/// Loads cuBLASLt if not yet loaded (a Gemm does at construction; it is not linked, see
/// gemm.cc) and returns why it could not be: "" when it is loaded. Needs no GPU.
std::string cublaslt_load_error();

struct GemmOptions {
  /// The M the cuBLASLt heuristic is asked about when it picks the algorithm that is then pinned
  /// for every M of that (N, K, type, epilogue, alignment) key: a decode-heavy actor may prefer a
  /// small value (small tiles), a prefill-heavy one a large value. Same value, same bits.
  int64_t m_hint = 256;
};

/// The cuBLASLt wrapper. Algorithm choice (the batch-invariance contract):
///  - the heuristic may only return algorithms without split-K (preference
///    CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK = NONE; every pick is read back and must have
///    CUBLASLT_ALGO_CONFIG_SPLITK_NUM <= 1), so each output element is one K loop in one CTA;
///  - the algorithm (tile, stages, swizzle, cluster...) is chosen once per key
///    (n, k, output type, bias, accumulate, alignment of ldx/ldw/ldy) for M = m_hint, checked
///    with cublasLtMatmulAlgoCheck at M = 1 too, cached, and used for every M. M only changes the
///    grid, never the K order of a row: rows are bitwise identical for any batch size.
/// Errors: cuBLASLt failures throw DeviceError(kCublas) naming the call, the status and the shape.
class Gemm {
 public:
  /// Creates the cuBLASLt handle on the current device. `workspace`: device memory of
  /// `workspace_bytes` (256-byte aligned; from an Arena), used by every call on this Gemm's
  /// stream; kDefaultWorkspaceBytes suits Hopper. Not owned. Throws DeviceError, InputError.
  Gemm(void* workspace, size_t workspace_bytes, GemmOptions opts = {});
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  static constexpr size_t kDefaultWorkspaceBytes = size_t{32} << 20;

  /// Enqueues y = x · W^T (+ bias) (+ y) on `stream`. Validates `a` (InputError). The first call
  /// for a key runs the heuristic on the host (no device sync); later calls are cache hits.
  /// The workspace must not be used by another stream concurrently.
  void run(const GemmArgs& a, cudaStream_t stream);

  /// One line per cached key: the shape key and the pinned algorithm (id, tile, stages,
  /// split-K, swizzle, custom option, inner shape, cluster, workspace, waves). For benchmarks.
  std::string debug_string() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe::gpu
