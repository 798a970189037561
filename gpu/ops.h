// Element-wise and per-row operations of the GPU forward pass: weight dequantization to bf16,
// embedding lookup, fused residual add + RMSNorm, q/k norm + RoPE + paged K/V write, SwiGLU and
// casts. Each matches its CPU reference in compute/ (engine.cc, detail/ops.h, matmul.h get_row).
// Users: the GPU stage executor, weight upload. Host launchers only (kernels in ops.cu): each
// validates its shapes (throws troupe::InputError naming the argument), queues one kernel on
// `stream` and checks the launch (throws DeviceError). None allocates device memory.
// Conventions: activations are row-major [num_rows, width]; the residual stream is f32; GEMM
// inputs are bf16 (round to nearest even from f32). Batch invariance: every kernel computes a
// row from that row alone, in a fixed order (one block per row, fixed reduction trees, no
// atomics), so a row's result never depends on the other rows of the launch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/ggml_types.h"

namespace troupe::gpu {

/// Widest row add_rms_norm accepts (one block per row; the limit only bounds the loop counts).
constexpr int64_t kMaxNormWidth = int64_t{1} << 20;
/// Widest head rope_qkv_write accepts (a warp keeps one head in shared memory).
constexpr int64_t kMaxHeadDim = 1024;

// ---- weights ----

/// Dequantizes a GGUF weight tensor already copied to device memory into bf16 [rows, cols].
/// src: the tensor's raw bytes as stored in the file (rows of model::row_bytes(type, cols) bytes,
/// rows contiguous; a 3-D stack of matrices is rows = ne[1] * ne[2]); any byte alignment.
/// src_bytes: bytes readable at src (checked: >= rows * row_bytes).
/// Types: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K-Q6_K, IQ4_NL, IQ4_XS. Each element is
/// exactly the f32 value of compute::get_row (same float operations, in the same order, no FMA
/// contraction), rounded to bf16 to nearest even. Throws InputError for another type, cols not a
/// multiple of the block size, negative sizes, a null pointer or a short src.
void dequantize_to_bf16(const void* src, size_t src_bytes, model::GgmlType type, int64_t rows,
                        int64_t cols, __nv_bfloat16* out, cudaStream_t stream);
/// True for the weight types dequantize_to_bf16 takes.
bool dequantize_supported(model::GgmlType type);

// ---- embedding ----

/// hidden[t, :] = table[token_ids[t], :] as f32.
/// table: bf16 [n_vocab, n_embd]; token_ids: device int32 [num_tokens]; hidden: f32
/// [num_tokens, n_embd]. The host validates ids before the copy; an id outside [0, n_vocab)
/// still reads nothing out of bounds: its row comes out all NaN.
void embed_rows(const __nv_bfloat16* table, int64_t n_vocab, int64_t n_embd,
                const int32_t* token_ids, int64_t num_tokens, float* hidden, cudaStream_t stream);

// ---- residual add + RMSNorm ----

/// For each row r < num_rows: if delta is not null, residual[r] += delta[r] (f32, written back);
/// then out[r] = rms_norm(residual[r]) * weight, as compute::detail::rms_norm:
///   out[i] = (x[i] * s) * w[i],  s = 1 / sqrt(float(sum(x^2) / width) + eps).
/// residual, delta: f32 [num_rows, width]; weight: f32 [width]; out: bf16 or f32
/// [num_rows, width], not overlapping residual or delta.
/// The sum of squares is accumulated in double like the CPU's, but in a fixed tree instead of
/// left to right: s equals the CPU's except when float(sum / width) lies within ~1e-16
/// (relative) of an f32 rounding boundary. The residual update is bit-exact; the f32 output
/// matches the CPU bit for bit in practice (tests allow 1e-6 relative), the bf16 output is that
/// value rounded to nearest even.
void add_rms_norm(float* residual, const float* delta, const float* weight, int64_t num_rows,
                  int64_t width, float eps, __nv_bfloat16* out, cudaStream_t stream);
void add_rms_norm(float* residual, const float* delta, const float* weight, int64_t num_rows,
                  int64_t width, float eps, float* out, cudaStream_t stream);

// ---- attention input: q/k norm, RoPE, paged K/V cache write ----

/// One layer's paged K/V cache, the layout the attention kernels read (gpu/attention.h AttnKv):
///   k, v: bf16 [num_slots, n_head_kv, head_dim] each, num_slots = num_blocks * block_size;
///   element (slot, h, d) is at k[(slot * n_head_kv + h) * head_dim + d] (same for v);
///   slot = block_id * block_size + offset_in_block: position p of a sequence lives in slot
///   block_table[p / block_size] * block_size + p % block_size.
/// k and v point at this layer's base; a stage keeps one PagedKv per layer.
struct PagedKv {
  __nv_bfloat16* k = nullptr;
  __nv_bfloat16* v = nullptr;
  int64_t num_blocks = 0;
  int64_t block_size = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;
  int64_t num_slots() const { return num_blocks * block_size; }
};

/// Rotary angles of positions [0, max_pos) for the first n_rot dims of a head, on the host:
/// cos/sin f32 [max_pos, n_rot / 2], row p, column i = cos/sin(p * theta^(-2i / n_rot)) computed
/// in double exactly as compute::detail::rope and compute/engine.cc do, then rounded to f32.
struct RopeTable {
  std::vector<float> cos, sin;
  int64_t max_pos = 0;
  int64_t n_rot = 0;
};
/// Throws InputError unless max_pos >= 1 and n_rot is even and >= 2.
RopeTable make_rope_table(int64_t max_pos, int64_t n_rot, float theta_base);
/// The same with each pair's frequency given (model::rope_frequencies: scaling applied) and
/// every cos/sin multiplied by mscale, as compute/engine.cc does.
RopeTable make_rope_table(int64_t max_pos, const std::vector<double>& inv_freq, double mscale);

struct RopeQkvArgs {
  /// f32 [num_tokens, (n_head + 2 * n_head_kv) * head_dim]: the fused QKV projection of each
  /// token: n_head q heads, then n_head_kv k heads, then n_head_kv v heads, head_dim each.
  const float* qkv = nullptr;
  /// Optional f32 [(n_head + 2 * n_head_kv) * head_dim] (Qwen2 q/k/v biases), added first.
  const float* bias = nullptr;
  int64_t num_tokens = 0, n_head = 0, n_head_kv = 0, head_dim = 0;
  /// Optional f32 [head_dim] per-head RMSNorm weights (Qwen3), applied to every q (k) head
  /// after the bias and before RoPE, as compute::detail::rms_norm with norm_eps.
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  float norm_eps = 1e-6f;
  /// RoPE of dims [0, n_rot) of each q and k head (0 = none; even, <= head_dim). neox pairs
  /// (i, i + n_rot/2), else (2i, 2i+1); dims >= n_rot pass through. rope_cos/rope_sin: device
  /// copies of a RopeTable (f32 [max_pos, n_rot / 2]).
  int64_t n_rot = 0;
  bool neox = false;
  const float* rope_cos = nullptr;
  const float* rope_sin = nullptr;
  int64_t max_pos = 0;
  /// Device int32 [num_tokens]: each token's position (the RopeTable row). A position outside
  /// [0, max_pos) makes that token's q, k and v all NaN (nothing out of bounds is read).
  const int32_t* positions = nullptr;
  /// Device int64 [num_tokens]: the cache slot of each token's K/V (see PagedKv). A negative
  /// slot (padding) writes no K/V; a slot >= kv.num_slots() writes no K/V and makes q NaN.
  const int64_t* slots = nullptr;
  /// bf16 [num_tokens, n_head, head_dim]: normed, roped q.
  __nv_bfloat16* q_out = nullptr;
  /// Receives k (normed, roped) and v as bf16 at each token's slot. kv.n_head_kv and
  /// kv.head_dim must equal the fields above.
  PagedKv kv;
};

/// Per token: x = qkv + bias; q/k heads: optional per-head RMSNorm, then RoPE (f32 math in the
/// CPU's order, no FMA contraction); then round to bf16 and write q_out and the cache.
/// Without q/k norm the output is exactly bf16(CPU f32 value); with it, see add_rms_norm.
void rope_qkv_write(const RopeQkvArgs& args, cudaStream_t stream);

// ---- feed-forward ----

/// out[r, i] = silu(gate[r, i]) * up[r, i] with silu(x) = x / (1 + exp(-x)), rounded to bf16.
/// gate_up: f32 [num_rows, 2 * n_ff], gate in columns [0, n_ff), up in [n_ff, 2 n_ff).
/// out: bf16 [num_rows, n_ff]. CUDA's expf (<= 2 ulp) stands for libm's: f32 results may
/// differ from the CPU's in the last bit, so rarely by one bf16 ulp after rounding.
void swiglu(const float* gate_up, int64_t num_rows, int64_t n_ff, __nv_bfloat16* out,
            cudaStream_t stream);
/// The same with gate and up as separate f32 [num_rows, n_ff] arrays.
void swiglu(const float* gate, const float* up, int64_t num_rows, int64_t n_ff, __nv_bfloat16* out,
            cudaStream_t stream);

// ---- small helpers ----

/// x[i] += delta[i] for i < n (f32; the CPU's residual add, bit-exact).
void add_inplace(float* x, const float* delta, int64_t n, cudaStream_t stream);
/// out[i] = bf16(in[i]) (round to nearest even; NaN stays NaN) for i < n.
void cast_f32_to_bf16(const float* in, int64_t n, __nv_bfloat16* out, cudaStream_t stream);
/// out[i] = float(in[i]) (exact) for i < n.
void cast_bf16_to_f32(const __nv_bfloat16* in, int64_t n, float* out, cudaStream_t stream);

}  // namespace troupe::gpu
