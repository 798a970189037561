// The GpuEngine's own kernels (gpu/engine.cc is their only user; their argument structs and
// launchers are declared in gpu/detail/engine_kernels.h): the MLA cache write and query split of
// compute/engine.cc attention_mla(), a copy between token-major and head-major layouts (the
// per-head GEMMs of MLA need 16-byte aligned, dense head matrices), and the row gather of the
// output head. Every kernel computes a row or a token from that row alone, in a fixed order:
// batch-invariant. Float expressions the CPU rounds step by step use __f*_rn (no FMA contraction,
// as in gpu/ops.cu).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstddef>
#include <cstdint>

#include "base/check.h"
#include "gpu/detail/engine_kernels.h"
#include "gpu/runtime.h"

namespace troupe::gpu::detail {

namespace {

constexpr unsigned kFullMask = 0xFFFFFFFFu;
constexpr int kPrepWarps = 4;
constexpr int kCopyThreads = 128;
constexpr int kGatherThreads = 256;
constexpr int kDotWarps = 4;

__device__ __forceinline__ float nan_f32() { return __int_as_float(0x7FC00000); }

__device__ __forceinline__ double warp_sum(double v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kFullMask, v, off);
  return v;
}

// compute::detail::rms_norm's scale from a double sum of squares: 1 / sqrt(float(sum / n) + eps).
__device__ __forceinline__ float rms_scale(double sum_sq, int64_t n, float eps) {
  const float mean = __double2float_rn(__ddiv_rn(sum_sq, static_cast<double>(n)));
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
}

// compute::detail::rope_cs on the pairs of x (f32, `rope` dims) owned by this lane; writes bf16.
// cs/sn null (bad position): NaN.
__device__ __forceinline__ void rope_pairs(const float* x, int64_t rope, const float* cs,
                                           const float* sn, bool neox, int lane,
                                           __nv_bfloat16* dst) {
  const int64_t half = rope / 2;
  for (int64_t i = lane; i < half; i += 32) {
    const int64_t ia = neox ? i : 2 * i;
    const int64_t ib = neox ? i + half : 2 * i + 1;
    if (cs == nullptr) {
      dst[ia] = __float2bfloat16_rn(nan_f32());
      dst[ib] = __float2bfloat16_rn(nan_f32());
      continue;
    }
    const float x0 = x[ia], x1 = x[ib], c = cs[i], s = sn[i];
    dst[ia] = __float2bfloat16_rn(__fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s)));
    dst[ib] = __float2bfloat16_rn(__fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c)));
  }
}

// Thread mapping: one block of kPrepWarps warps per token (blockIdx.x). Warp 0 first writes the
// token's cache row: RMSNorm of the latent [0, lora) (sum of squares in double, lanes strided,
// then a fixed butterfly) and RoPE of the shared key [lora, lora + rope). Then warp w handles
// query heads w, w + kPrepWarps, ...: RoPE of q_pe into q_abs[.., lora:], q_nope copied (bf16)
// into its head-major matrix.
__global__ void __launch_bounds__(kPrepWarps * 32) mla_prep_kernel(const MlaPrepArgs a) {
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t t = blockIdx.x;
  const int64_t kw = a.lora + a.rope, dqk = a.nope + a.rope, half = a.rope / 2;
  const int32_t pos = a.positions[t];
  const bool bad_pos = a.rope > 0 && (pos < 0 || pos >= a.max_pos);
  const float* cs =
      a.rope > 0 && !bad_pos ? a.rope_cos + static_cast<int64_t>(pos) * half : nullptr;
  const float* sn =
      a.rope > 0 && !bad_pos ? a.rope_sin + static_cast<int64_t>(pos) * half : nullptr;
  const bool neox = a.neox != 0;
  if (warp == 0) {
    const int64_t slot = a.slots[t];
    if (slot >= 0 && slot < a.num_slots) {  // warp-uniform
      const float* row = a.kva + t * kw;
      double ss = 0;
      for (int64_t d = lane; d < a.lora; d += 32) {
        const double v = row[d];
        ss = __dadd_rn(ss, __dmul_rn(v, v));
      }
      const float scale = rms_scale(warp_sum(ss), a.lora, a.eps);
      __nv_bfloat16* dst = a.cache + slot * kw;
      for (int64_t d = lane; d < a.lora; d += 32)
        dst[d] = __float2bfloat16_rn(__fmul_rn(__fmul_rn(row[d], scale), a.kv_norm[d]));
      rope_pairs(row + a.lora, a.rope, cs, sn, neox, lane, dst + a.lora);
    }
  }
  for (int64_t h = warp; h < a.n_head; h += kPrepWarps) {
    const float* qh = a.q + (t * a.n_head + h) * dqk;
    rope_pairs(qh + a.nope, a.rope, cs, sn, neox, lane, a.q_abs + (t * a.n_head + h) * kw + a.lora);
    __nv_bfloat16* qn = a.q_nope + h * a.nope_head_stride + t * a.nope_ld;
    for (int64_t d = lane; d < a.nope; d += 32) qn[d] = __float2bfloat16_rn(qh[d]);
  }
}

// Thread mapping: block (b, a) = (blockIdx.x, blockIdx.y) copies the n_c elements of (a, b).
__global__ void __launch_bounds__(kCopyThreads) copy_heads_kernel(const HeadCopyArgs a) {
  const int64_t b = blockIdx.x, ia = blockIdx.y;
  const __nv_bfloat16* s = a.src + ia * a.src_a + b * a.src_b;
  __nv_bfloat16* d = a.dst + ia * a.dst_a + b * a.dst_b;
  for (int64_t c = threadIdx.x; c < a.n_c; c += kCopyThreads) d[c] = s[c];
}

// Thread mapping: one block per output row (blockIdx.x); threads stride over the columns.
__global__ void __launch_bounds__(kGatherThreads)
    gather_rows_kernel(const float* src, int64_t width, const int32_t* rows, float* dst) {
  const int64_t r = blockIdx.x;
  const float* s = src + static_cast<int64_t>(rows[r]) * width;
  float* d = dst + r * width;
  for (int64_t c = threadIdx.x; c < width; c += kGatherThreads) d[c] = s[c];
}

// Thread mapping: warp w of block b computes row b * kDotWarps + w: lane-strided f32 FMA
// partial sums, then a fixed butterfly (every lane ends with the same bits).
__global__ void __launch_bounds__(kDotWarps * 32)
    row_dot_kernel(const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* w, int64_t n,
                   int64_t num_rows, float* out) {
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kDotWarps + warp;
  if (r >= num_rows) return;  // warp-uniform
  const __nv_bfloat16* xr = x + r * ldx;
  float acc = 0.f;
  for (int64_t i = lane; i < n; i += 32)
    acc = fmaf(__bfloat162float(xr[i]), __bfloat162float(w[i]), acc);
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(kFullMask, acc, off);
  if (lane == 0) out[r] = acc;
}

}  // namespace

void launch_mla_prep(const MlaPrepArgs& a, cudaStream_t stream) {
  TROUPE_CHECK(a.num_tokens >= 0 && a.num_tokens <= INT_MAX && a.n_head >= 1 && a.nope >= 0 &&
                   a.rope >= 0 && a.rope % 2 == 0 && a.lora >= 1,
               "mla_prep: bad shape tokens=%lld heads=%lld nope=%lld rope=%lld lora=%lld",
               static_cast<long long>(a.num_tokens), static_cast<long long>(a.n_head),
               static_cast<long long>(a.nope), static_cast<long long>(a.rope),
               static_cast<long long>(a.lora));
  if (a.num_tokens == 0) return;
  TROUPE_CHECK(a.kva && a.kv_norm && a.q && a.positions && a.slots && a.cache && a.q_abs &&
                   a.q_nope && (a.rope == 0 || (a.rope_cos && a.rope_sin)),
               "mla_prep: null pointer");
  mla_prep_kernel<<<static_cast<unsigned>(a.num_tokens), kPrepWarps * 32, 0, stream>>>(a);
  TROUPE_CUDA_CHECK_LAUNCH();
}

void launch_copy_heads(const HeadCopyArgs& a, cudaStream_t stream) {
  TROUPE_CHECK(a.n_a >= 0 && a.n_a <= 65535 && a.n_b >= 0 && a.n_b <= INT_MAX && a.n_c >= 0,
               "copy_heads: bad shape [%lld, %lld, %lld]", static_cast<long long>(a.n_a),
               static_cast<long long>(a.n_b), static_cast<long long>(a.n_c));
  if (a.n_a == 0 || a.n_b == 0 || a.n_c == 0) return;
  TROUPE_CHECK(a.src && a.dst, "copy_heads: null pointer");
  const dim3 grid(static_cast<unsigned>(a.n_b), static_cast<unsigned>(a.n_a));
  copy_heads_kernel<<<grid, kCopyThreads, 0, stream>>>(a);
  TROUPE_CUDA_CHECK_LAUNCH();
}

void launch_gather_rows(const float* src, int64_t width, const int32_t* rows, int64_t num_rows,
                        float* dst, cudaStream_t stream) {
  TROUPE_CHECK(width >= 1 && num_rows >= 0 && num_rows <= INT_MAX,
               "gather_rows: bad shape rows=%lld width=%lld", static_cast<long long>(num_rows),
               static_cast<long long>(width));
  if (num_rows == 0) return;
  TROUPE_CHECK(src && rows && dst, "gather_rows: null pointer");
  gather_rows_kernel<<<static_cast<unsigned>(num_rows), kGatherThreads, 0, stream>>>(src, width,
                                                                                     rows, dst);
  TROUPE_CUDA_CHECK_LAUNCH();
}

void launch_row_dot(const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* w, int64_t n,
                    int64_t num_rows, float* out, cudaStream_t stream) {
  TROUPE_CHECK(n >= 1 && ldx >= n && num_rows >= 0 && num_rows <= INT_MAX,
               "row_dot: bad shape rows=%lld n=%lld ldx=%lld", static_cast<long long>(num_rows),
               static_cast<long long>(n), static_cast<long long>(ldx));
  if (num_rows == 0) return;
  TROUPE_CHECK(x && w && out, "row_dot: null pointer");
  const int64_t blocks = (num_rows + kDotWarps - 1) / kDotWarps;
  row_dot_kernel<<<static_cast<unsigned>(blocks), kDotWarps * 32, 0, stream>>>(x, ldx, w, n,
                                                                               num_rows, out);
  TROUPE_CUDA_CHECK_LAUNCH();
}

}  // namespace troupe::gpu::detail
