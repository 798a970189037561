// The GPU engine's own kernels (gpu/engine_kernels.cu), private to gpu/: their argument structs
// and launchers, shared by engine.cc (the caller) and engine_kernels.cu (the definitions).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace troupe::gpu::detail {

struct MlaPrepArgs {
  int64_t num_tokens = 0;
  int64_t n_head = 0, nope = 0, rope = 0, lora = 0;  // q head: nope + rope; cache row: lora + rope
  const float* kva = nullptr;      // f32 [num_tokens, lora + rope]: the wkv_a projection
  const float* kv_norm = nullptr;  // f32 [lora]: kv_a_norm weights
  float eps = 0;
  const float* q = nullptr;         // f32 [num_tokens, n_head, nope + rope]
  const float* rope_cos = nullptr;  // f32 [max_pos, rope / 2]
  const float* rope_sin = nullptr;
  int64_t max_pos = 0;
  int32_t neox = 0;
  const int32_t* positions = nullptr;  // [num_tokens]
  const int64_t* slots = nullptr;      // [num_tokens]: cache slot of each token; < 0: no write
  __nv_bfloat16* cache = nullptr;      // bf16 [num_slots, lora + rope]
  int64_t num_slots = 0;
  __nv_bfloat16* q_abs = nullptr;   // bf16 [num_tokens, n_head, lora + rope]: [lora, +rope) written
  __nv_bfloat16* q_nope = nullptr;  // bf16 element (h, t, d) at h * nope_head_stride + t * nope_ld
  int64_t nope_head_stride = 0, nope_ld = 0;
};

struct HeadCopyArgs {
  const __nv_bfloat16* src = nullptr;  // element (a, b, c) at a * src_a + b * src_b + c
  int64_t src_a = 0, src_b = 0;
  __nv_bfloat16* dst = nullptr;  // element (a, b, c) at a * dst_a + b * dst_b + c
  int64_t dst_a = 0, dst_b = 0;
  int64_t n_a = 0, n_b = 0, n_c = 0;
};

/// compute/engine.cc attention_mla() per token: RMSNorm + RoPE of the latent cache row, written
/// as bf16 at the token's slot; RoPE of each head's q_pe into q_abs[.., lora:]; q_nope as bf16
/// into a head-major matrix. One block per token.
void launch_mla_prep(const MlaPrepArgs& a, cudaStream_t stream);
/// dst(a, b, :) = src(a, b, :) for the n_c elements of every (a < n_a, b < n_b). bf16.
void launch_copy_heads(const HeadCopyArgs& a, cudaStream_t stream);
/// dst[r, :] = src[rows[r], :] for r < num_rows; f32 rows of `width`; rows: device int32.
void launch_gather_rows(const float* src, int64_t width, const int32_t* rows, int64_t num_rows,
                        float* dst, cudaStream_t stream);
/// out[t] = dot(x[t, 0:n], w[0:n]) for t < num_rows, f32 accumulation in a fixed order (one warp
/// per row: lane-strided partial sums, then a fixed butterfly). x: bf16 rows of stride ldx.
void launch_row_dot(const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* w, int64_t n,
                    int64_t num_rows, float* out, cudaStream_t stream);

}  // namespace troupe::gpu::detail
