// The attention kernel (scores, softmax, weighted values over paged K/V rows) and the SwiGLU
// activation, dispatched once per process to the same SIMD level as the matmul kernels. A head's
// result depends only on its query row, the K/V rows and their count, so attention stays
// batch-invariant. Thread-safe.
#pragma once

#include <cstdint>

#include "compute/kv_type.h"

namespace troupe::compute {

/// K/V rows of one KV head of one sequence at one layer, in its blocks, values of `type` (f32,
/// or f16 or bf16 bits): position j's key starts at blocks[j / block_size] + k_offset +
/// (j % block_size) * k_stride, its value at blocks[j / block_size] + v_offset +
/// (j % block_size) * v_stride (MLA: the value is the key's latent prefix, v_offset = k_offset
/// and v_stride = k_stride). With k_by_dim, a block's keys are stored dimension by dimension
/// instead: key value c of position j is at blocks[j / block_size] + k_offset + c * block_size +
/// j % block_size (k_stride unused; the values stay in rows).
struct KvView {
  const void* const* blocks = nullptr;
  KvType type = KvType::kF32;
  int64_t block_size = 0;
  int64_t k_offset = 0;
  int64_t k_stride = 0;
  int64_t v_offset = 0;
  int64_t v_stride = 0;
  bool k_by_dim = false;
  int64_t first = 0;             ///< positions before it are not attended (a sliding window)
  const float* sinks = nullptr;  ///< g logits, one per head: an extra softmax term, value 0
};

/// Attention of g query heads that share one KV head, over positions [kv.first, n):
/// out_h = sum_j softmax_j(q_h . k_j * scale) v_j, the softmax's denominator also holding
/// exp(kv.sinks[h]) when there are sinks. q: g rows of dk floats, q_stride apart;
/// out: g rows of dv floats, out_stride apart. Each K and V row is read once for all g heads.
void attend_heads(const float* q, int64_t q_stride, int64_t g, int64_t dk, const KvView& kv,
                  int64_t n, float scale, int64_t dv, float* out, int64_t out_stride);

/// out[i] = x[i] rounded to f16 (nearest even; overflow to infinity, NaN to the quiet NaN
/// 0x7e00 with x's sign): model::fp32_to_fp16's bits, with F16C where the CPU has it.
void round_to_f16(const float* x, uint16_t* out, int64_t n);

/// In place, for each of `rows` rows of n floats: x_j = softmax_j(x_j * scale) (the maximum
/// subtracted, the sum over the row in a fixed order). Rows are independent of each other.
void softmax_rows(float* p, int64_t rows, int64_t n, float scale);

/// g[i] = silu(g[i]) * u[i] for i < n: the SwiGLU activation, SIMD (compute/detail/act_simd.h).
/// Each element's result depends on its two inputs only.
void silu_mul(float* g, const float* u, int64_t n);

/// n tokens of the gated delta rule (Gated DeltaNet) for one value head, in order: for token t
/// the state S [dk rows, dv columns] decays, is corrected toward v_t along k_t, and is read by q_t:
///   S = decay_t S;  delta = beta_t (v_t - S^T k_t);  S += k_t delta^T;  o_t = S^T q_t.
/// k, q: [n, dk]; v: n rows of dv, v_stride apart; o: n rows of dv, o_stride apart. Each column of
/// S and o depends on its own column and the inputs only, in a fixed order, and a run of n tokens
/// gives the bits n runs of one give.
void delta_rule_steps(float* S, int64_t dk, int64_t dv, int64_t n, const float* k, const float* q,
                      const float* v, int64_t v_stride, const float* decay, const float* beta,
                      float* o, int64_t o_stride);

namespace detail {
using DeltaRuleFn = void (*)(float*, int64_t, int64_t, int64_t, const float*, const float*,
                             const float*, int64_t, const float*, const float*, float*, int64_t);
DeltaRuleFn delta_rule_avx2();
DeltaRuleFn delta_rule_avx512();
using AttendFn = void (*)(const float*, int64_t, int64_t, int64_t, const KvView&, int64_t, float,
                          int64_t, float*, int64_t);
AttendFn attend_avx2();
AttendFn attend_avx512();
using SoftmaxFn = void (*)(float*, int64_t, int64_t, float);
SoftmaxFn softmax_avx2();
SoftmaxFn softmax_avx512();
using SiluMulFn = void (*)(float*, const float*, int64_t);
SiluMulFn silu_mul_avx2();
SiluMulFn silu_mul_avx512();
using RoundF16Fn = void (*)(const float*, uint16_t*, int64_t);
RoundF16Fn round_to_f16_avx2();
RoundF16Fn round_to_f16_avx512();
}  // namespace detail

}  // namespace troupe::compute
