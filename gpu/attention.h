// Paged attention on the GPU for one layer of one batched step: grouped-query attention with
// causal masking (FlashAttention-style prefill, split-K "flash-decoding" for single-token steps)
// and DeepSeek-style multi-head latent attention over the compressed cache. Matches
// compute/engine.cc attention() and attention_mla(). Users: the GPU stage executor, one call per
// layer per step, on its compute stream. Host launchers only; kernels live in attention.cu.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace troupe::gpu {

/// One layer's paged GQA cache (the same layout as PagedKv in gpu/ops.h, which fills it).
/// slot = block_id * block_size + offset_in_block; position p of a sequence lives in slot
/// block_table[p / block_size] * block_size + p % block_size.
struct AttnKv {
  const __nv_bfloat16* k = nullptr;  // bf16 [num_slots, n_head_kv, head_dim]
  const __nv_bfloat16* v = nullptr;  // bf16 [num_slots, n_head_kv, head_dim]
  int64_t num_slots = 0;             // num_blocks * block_size
  int32_t n_head_kv = 0;
  int32_t head_dim = 0;  // 1..256 (K and V); a multiple of 8 with 16-byte aligned k/v/q takes
                         // the 16-byte load path, anything else element loads
  int32_t block_size = 0;
};

/// One layer's MLA cache: per slot the RMS-normalized latent c_kv followed by the roped shared
/// key k_pe (what attention_mla() stores: row[0, lora) = c_kv, row[lora, lora + rope) = k_pe).
struct AttnMlaKv {
  const __nv_bfloat16* kv = nullptr;  // bf16 [num_slots, kv_lora_rank + rope_dim]
  int64_t num_slots = 0;
  int32_t kv_lora_rank = 0;  // 1..512
  int32_t rope_dim = 0;      // 0..64
  int32_t block_size = 0;
};

/// The sequences of one step. Device arrays are read by the kernels only; the host bounds size
/// the grids and the workspace and must hold for every sequence (REQUIRES, not checked on the
/// device: rows beyond max_q_len are not computed; memory stays safe: a decode row needing more
/// splits than max_kv_len provides comes out NaN, and a block id out of range or past
/// max_blocks_per_seq reads as NaN keys and values).
struct AttnBatch {
  int32_t n_seqs = 0;                // 0: the call does nothing
  int64_t n_tok = 0;                 // rows of q and out (sum of q_len)
  const int32_t* q_start = nullptr;  // device int32 [n_seqs]: first row of the sequence in q/out
  const int32_t* q_len = nullptr;    // device int32 [n_seqs]: new tokens, >= 1
  const int32_t* pos0 = nullptr;     // device int32 [n_seqs]: positions [0, pos0) were cached
                                     // before; the new tokens are pos0 .. pos0 + q_len - 1 and
                                     // their K/V are already in the cache
  const int32_t* block_table = nullptr;  // device int32 [n_seqs, max_blocks_per_seq], padded
                                         // row-major; entries past a sequence's need are unread
  int32_t max_blocks_per_seq = 0;
  int32_t max_q_len = 0;   // host: >= every q_len (prefill grid)
  int32_t min_q_len = 1;   // host: <= every q_len; > 1 skips the decode kernels
  int32_t max_kv_len = 0;  // host: >= every pos0 + q_len (decode grid and workspace)
};

enum class AttnOut : uint8_t {
  kBf16 = 0,  ///< bf16, rounded to nearest even from f32 (what the output-projection GEMM reads)
  kF32 = 1,   ///< f32 (tests, debugging)
};

/// GQA: out[t, h] = softmax_j(q[t, h] . K[j, h / (n_head / n_head_kv)] * scale) V[j, ...] over
/// the positions j <= position of t of t's sequence.
struct AttnArgs {
  const __nv_bfloat16* q = nullptr;  // bf16 [n_tok, n_head, head_dim] (roped)
  int32_t n_head = 0;                // a multiple of kv.n_head_kv
  AttnKv kv;
  AttnBatch batch;
  float scale = 0.f;    // 0: 1 / sqrt(head_dim)
  void* out = nullptr;  // [n_tok, n_head, head_dim] of out_type
  AttnOut out_type = AttnOut::kBf16;
  void* workspace = nullptr;   // split-K partials, >= paged_attention_workspace_bytes(...) bytes,
  size_t workspace_bytes = 0;  // 16-byte aligned; unused (may be null) when batch.min_q_len > 1
};

/// MLA in the absorbed form of attention_mla(): the caller has already computed
/// q_abs[t, h] = [wk_b[h] . q_nope[t, h], q_pe[t, h]] (a GEMM) and applies wv_b to `out`
/// afterwards (a GEMM); this computes, per head, softmax(q_abs . row(j) * scale) over the cache
/// rows j and the weighted sum of their latent parts row(j)[0, kv_lora_rank).
struct AttnMlaArgs {
  const __nv_bfloat16* q = nullptr;  // bf16 [n_tok, n_head, kv_lora_rank + rope_dim] (q_abs)
  int32_t n_head = 0;
  AttnMlaKv kv;
  AttnBatch batch;
  float scale = 0.f;    // required: attention_mla uses 1 / sqrt(qk_nope_dim + qk_rope_dim)
  void* out = nullptr;  // [n_tok, n_head, kv_lora_rank] of out_type
  AttnOut out_type = AttnOut::kBf16;
  void* workspace = nullptr;   // >= paged_attention_workspace_bytes(n_seqs, n_head,
  size_t workspace_bytes = 0;  //    kv_lora_rank, max_kv_len) when batch.min_q_len == 1
};

/// Keys per split of the decode kernel for a context of kv_len positions: 256, doubled until
/// there are at most 64 splits. A function of kv_len alone (batch invariance).
int32_t attention_decode_chunk(int32_t kv_len);

/// Bytes of split-K workspace a call with these bounds needs (head_dim_v: head_dim, or
/// kv_lora_rank for MLA). Layout: f32 [n_seqs, splits, n_head, head_dim_v] partial outputs, then
/// f32 [n_seqs, splits, n_head, 2] (max, sum), splits = min(64, ceil(max_kv_len / 256)).
size_t paged_attention_workspace_bytes(int32_t n_seqs, int32_t n_head, int32_t head_dim_v,
                                       int32_t max_kv_len);

/// Throw troupe::InputError naming the field when the arguments break a requirement above.
/// Need no GPU; the launchers call them first.
void validate_attention_args(const AttnArgs& a);
void validate_attention_mla_args(const AttnMlaArgs& a);

/// Enqueues attention for every sequence of the batch on `stream` (no sync, no allocation).
/// Dispatch is per sequence, on its own q_len: q_len == 1 runs the split-K decode kernel plus a
/// combine kernel, q_len > 1 the prefill kernel (both kernels are launched over the whole batch;
/// each block returns at once for sequences of the other kind).
/// Batch invariance: a row's arithmetic depends only on its own query, its own sequence's cache
/// rows and q_len == 1 or not: key tiles of 32 start at position 0 (prefill) or at the split
/// start (decode), the decode chunk depends only on the context length, each dot product, the
/// online softmax and the split combine run in a fixed order. So a sequence's output is bitwise
/// the same alone or in any batch, and a prompt processed in chunks of q_len > 1 gives bitwise
/// the same rows as in one chunk. A q_len == 1 step differs from the same row computed by the
/// prefill kernel by rounding only.
/// Throws InputError (bad arguments), DeviceError (launch failure).
void paged_attention(const AttnArgs& a, cudaStream_t stream);
void paged_attention_mla(const AttnMlaArgs& a, cudaStream_t stream);

}  // namespace troupe::gpu
