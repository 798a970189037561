// GpuEngine's per-layer orchestration on the compute stream (gpu/detail/engine_impl.h): the body
// of one step (embedding, then per layer the attention and the dense FFN or MoE, with residual
// adds fused into the GEMMs) and the output head, mirroring compute/engine.cc forward(),
// attention(), attention_mla(), ffn() and moe(). Every launch computes a row from that row alone
// (see engine.cc, "Batch invariance"); the batch only sets grids and row counts.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "base/check.h"
#include "gpu/attention.h"
#include "gpu/collective.h"
#include "gpu/detail/engine_impl.h"
#include "gpu/detail/engine_kernels.h"
#include "gpu/gemm.h"
#include "gpu/moe.h"
#include "gpu/ops.h"
#include "gpu/runtime.h"

namespace troupe::gpu {

using detail::bf16;
using detail::DevLayer;
using detail::StepInputs;
using detail::StepPlan;
using detail::sz;

AttnBatch GpuEngine::Impl::batch(const StepPlan& p, const StepInputs& in) const {
  AttnBatch b;
  b.n_seqs = static_cast<int32_t>(p.S);
  b.n_tok = p.T;
  b.q_start = in.q_start;
  b.q_len = in.q_len;
  b.pos0 = in.pos0;
  b.block_table = in.table;
  b.max_blocks_per_seq = static_cast<int32_t>(p.W);
  b.max_q_len = p.max_q_len;
  b.min_q_len = p.min_q_len;
  b.max_kv_len = p.max_kv_len;
  return b;
}

void GpuEngine::Impl::gemm(int64_t m, int64_t n, int64_t k, const bf16* x, int64_t ldx,
                           const bf16* wt, int64_t ldw, void* y, int64_t ldy, GemmOut y_type,
                           bool accumulate) {
  GemmArgs g;
  g.m = m;
  g.n = n;
  g.k = k;
  g.x = x;
  g.ldx = ldx;
  g.w = wt;
  g.ldw = ldw;
  g.y = y;
  g.ldy = ldy;
  g.y_type = y_type;
  g.accumulate = accumulate;
  gemmer->run(g, streams->compute());
}

void GpuEngine::Impl::enqueue_body(const StepPlan& p) {
  const detail::MicroBatch one{&p, inputs(p), 0, nullptr};
  enqueue_layers({&one, 1});
  if (head_here && p.R > 0) enqueue_head(one.in, 0, std::min(p.R, C_cap));
}

// The step's buffers seen from row t0 on: a micro-batch's rows. Row-major [T, width] buffers move
// by t0 rows of their widest use (a layer with a narrower FFN writes inside its share), rounded up
// to 16 bytes (Gemm's alignment of a matrix start; carve_work leaves 8 rows of slack); rows keep
// their leading dimension, so their alignment class, hence the GEMM algorithm, is unchanged. The
// head-major MLA buffers [H, T_cap, ld] (ld a multiple of 8) move by t0 rows of each head.
// Workspaces, inputs and the head's buffers stay shared: the compute stream runs the
// micro-batches one kernel at a time.
detail::Work GpuEngine::Impl::rows_from(const detail::Work& base, int64_t t0) const {
  detail::Work v = base;
  auto at = [t0](auto* p, int64_t width) {
    using T = std::remove_pointer_t<decltype(p)>;
    if (!p) return p;
    const size_t bytes = detail::align_up(sz(t0 * width) * sizeof(T), 16);
    return reinterpret_cast<T*>(reinterpret_cast<uintptr_t>(p) + bytes);
  };
  v.x = at(base.x, E);
  v.h = at(base.h, E);
  v.qkv = at(base.qkv, qkv_rows);
  v.q = at(base.q, H * D);
  v.attn = at(base.attn, attn_width);
  v.qa = at(base.qa, q_lora);
  v.qa_n = at(base.qa_n, q_lora);
  v.qf = at(base.qf, H * dqk);
  v.kva = at(base.kva, kw);
  v.q_nope_h = at(base.q_nope_h, nope_ld);
  v.qlat_h = at(base.qlat_h, lora_ld);
  v.q_abs = at(base.q_abs, H * kw);
  v.lat = at(base.lat, H * lora);
  v.lat_h = at(base.lat_h, lora_ld);
  v.attn_h = at(base.attn_h, dv_ld);
  v.gate_up = at(base.gate_up, 2 * ff_max);
  v.act = at(base.act, ff_max);
  v.router = at(base.router, n_expert);
  v.shared_out = at(base.shared_out, E);
  v.shared_gate = at(base.shared_gate, 1);
  v.moe_y = at(base.moe_y, E);
  return v;
}

// The layers over one batch or two micro-batches. With two (tensor parallelism), each layer runs
// micro-batch 0's attention, then 1's while 0's sum runs on the comm stream, then 0's FFN while
// 1's attention sum runs, and so on: each part waits only for its own micro-batch's last sum.
void GpuEngine::Impl::enqueue_layers(std::span<const detail::MicroBatch> mbs) {
  cudaStream_t cs = streams->compute();
  const detail::Work base = w;
  // Each micro-batch's view of the buffers, made once for all its layers.
  TROUPE_CHECK(mbs.size() <= 2, "%zu micro-batches (at most 2)", mbs.size());
  detail::Work views[2];
  for (size_t i = 0; i < mbs.size(); ++i) views[i] = rows_from(base, mbs[i].t0);
  auto run = [&](auto&& part) {
    for (size_t i = 0; i < mbs.size(); ++i) {
      w = views[i];
      if (mbs[i].summed) TROUPE_CUDA_CHECK(cudaStreamWaitEvent(cs, mbs[i].summed, 0));
      part(mbs[i]);
    }
  };
  try {
    if (range.embed)
      run([&](const detail::MicroBatch& m) {
        embed_rows(tok_embd, V, E, m.in.tok, m.p->T, w.x, cs);
      });
    for (const DevLayer& L : layers) {
      run([&](const detail::MicroBatch& m) { attention_part(L, m); });
      run([&](const detail::MicroBatch& m) { ffn_part(L, m); });
    }
    for (const detail::MicroBatch& mb : mbs)
      if (mb.summed) TROUPE_CUDA_CHECK(cudaStreamWaitEvent(cs, mb.summed, 0));
  } catch (...) {
    w = base;
    throw;
  }
  w = base;
}

// attn_norm, attention, wo with the residual. Tensor parallelism: rank 0 adds its partial
// product to x, the others overwrite x with theirs, and the sum over ranks (rank order) leaves
// (x + p0) + p1 + ... on every rank.
void GpuEngine::Impl::attention_part(const DevLayer& L, const detail::MicroBatch& mb) {
  cudaStream_t cs = streams->compute();
  const int64_t T = mb.p->T;
  add_rms_norm(w.x, nullptr, L.attn_norm, T, E, eps, w.h, cs);
  if (mla) {
    attention_mla(L, *mb.p, mb.in);
  } else {
    attention(L, *mb.p, mb.in);
  }
  // x += attn . wo^T (the residual add fused into the GEMM).
  gemm(T, E, attn_width, w.attn, attn_width, L.wo, attn_width, w.x, E, GemmOut::kF32, tp_rank == 0);
  reduce(w.x, T * E, mb.summed);
}

// ffn_norm, then the dense FFN or the MoE layer, with the residual (summed as above).
void GpuEngine::Impl::ffn_part(const DevLayer& L, const detail::MicroBatch& mb) {
  cudaStream_t cs = streams->compute();
  const int64_t T = mb.p->T;
  add_rms_norm(w.x, nullptr, L.ffn_norm, T, E, eps, w.h, cs);
  if (L.moe) {
    moe(L, *mb.p);
    if (tp_rank == 0)
      add_inplace(w.x, w.moe_y, T * E, cs);
    else
      TROUPE_CUDA_CHECK(
          cudaMemcpyAsync(w.x, w.moe_y, sz(T * E) * sizeof(float), cudaMemcpyDeviceToDevice, cs));
  } else {
    gemm(T, 2 * L.n_ff, E, w.h, E, L.w_gate_up, E, w.gate_up, 2 * L.n_ff, GemmOut::kF32, false);
    swiglu(w.gate_up, T, L.n_ff, w.act, cs);
    gemm(T, E, L.n_ff, w.act, L.n_ff, L.w_down, L.n_ff, w.x, E, GemmOut::kF32, tp_rank == 0);
  }
  reduce(w.x, T * E, mb.summed);
}

// The partial outputs of the group's ranks summed on the comm stream, after the compute work
// queued so far; the compute stream waits for the sum at once (summed null) or where the
// micro-batch's next part starts (enqueue_layers).
void GpuEngine::Impl::reduce(float* data, int64_t count, cudaEvent_t summed) {
  if (!tp) return;
  streams->comm_waits_for_compute();
  tp->all_reduce_sum(data, sz(count), streams->comm());
  if (summed)
    TROUPE_CUDA_CHECK(cudaEventRecord(summed, streams->comm()));
  else
    streams->compute_waits_for_comm();
}

void GpuEngine::Impl::attention(const DevLayer& L, const StepPlan& p, const StepInputs& in) {
  cudaStream_t cs = streams->compute();
  const int64_t T = p.T;
  gemm(T, qkv_rows, E, w.h, E, L.wqkv, E, w.qkv, qkv_rows, GemmOut::kF32, false);
  RopeQkvArgs r;
  r.qkv = w.qkv;
  r.bias = L.bqkv;
  r.num_tokens = T;
  r.n_head = H;
  r.n_head_kv = HK;
  r.head_dim = D;
  r.q_norm = L.q_norm;
  r.k_norm = L.k_norm;
  r.norm_eps = eps;
  r.n_rot = rope_cos ? n_rot : 0;
  r.neox = neox;
  r.rope_cos = rope_cos;
  r.rope_sin = rope_sin;
  r.max_pos = rope_cos ? num_slots : 0;
  r.positions = in.pos;
  r.slots = in.slot;
  r.q_out = w.q;
  r.kv.k = L.k;
  r.kv.v = L.v;
  r.kv.num_blocks = num_blocks;
  r.kv.block_size = bs;
  r.kv.n_head_kv = HK;
  r.kv.head_dim = D;
  rope_qkv_write(r, cs);
  AttnArgs a;
  a.q = w.q;
  a.n_head = static_cast<int32_t>(H);
  a.kv.k = L.k;
  a.kv.v = L.v;
  a.kv.num_slots = num_slots;
  a.kv.n_head_kv = static_cast<int32_t>(HK);
  a.kv.head_dim = static_cast<int32_t>(D);
  a.kv.block_size = static_cast<int32_t>(bs);
  a.batch = batch(p, in);
  // compute/engine.cc attention()
  a.scale = static_cast<float>(kq_scale_mult * (1.0f / std::sqrt(static_cast<float>(D))));
  a.out = w.attn;
  a.out_type = AttnOut::kBf16;
  a.workspace = w.attn_ws;
  a.workspace_bytes = w.attn_ws_bytes;
  paged_attention(a, cs);
}

// compute/engine.cc attention_mla(): q (optionally through the q LoRA), the latent cache row,
// q_abs = [wk_b[h] . q_nope[h], q_pe[h]], attention over the latent rows, then wv_b[h] per head.
// The per-head products read and write head-major copies (dense, 16-byte aligned matrices).
void GpuEngine::Impl::attention_mla(const DevLayer& L, const StepPlan& p, const StepInputs& in) {
  cudaStream_t cs = streams->compute();
  const int64_t T = p.T;
  if (L.wq_a) {
    gemm(T, q_lora, E, w.h, E, L.wq_a, E, w.qa, q_lora, GemmOut::kF32, false);
    add_rms_norm(w.qa, nullptr, L.q_a_norm, T, q_lora, eps, w.qa_n, cs);
    gemm(T, H * dqk, q_lora, w.qa_n, q_lora, L.wq_b, q_lora, w.qf, H * dqk, GemmOut::kF32, false);
  } else {
    gemm(T, H * dqk, E, w.h, E, L.wq, E, w.qf, H * dqk, GemmOut::kF32, false);
  }
  gemm(T, kw, E, w.h, E, L.wkv_a, E, w.kva, kw, GemmOut::kF32, false);
  detail::MlaPrepArgs m;
  m.num_tokens = T;
  m.n_head = H;
  m.nope = nope;
  m.rope = rope;
  m.lora = lora;
  m.kva = w.kva;
  m.kv_norm = L.kv_a_norm;
  m.eps = eps;
  m.q = w.qf;
  m.rope_cos = rope_cos;
  m.rope_sin = rope_sin;
  m.max_pos = rope_cos ? num_slots : 0;
  m.neox = neox ? 1 : 0;
  m.positions = in.pos;
  m.slots = in.slot;
  m.cache = L.k;
  m.num_slots = num_slots;
  m.q_abs = w.q_abs;
  m.q_nope = w.q_nope_h;
  m.nope_head_stride = T_cap * nope_ld;
  m.nope_ld = nope_ld;
  detail::launch_mla_prep(m, cs);
  for (int64_t h = 0; h < H; ++h)
    gemm(T, lora, nope, w.q_nope_h + h * T_cap * nope_ld, nope_ld, L.wk_b + h * L.wk_b_stride, nope,
         w.qlat_h + h * T_cap * lora_ld, lora_ld, GemmOut::kBf16, false);
  detail::HeadCopyArgs c;  // q_abs[t, h, 0:lora] = qlat_h[h, t, :]
  c.src = w.qlat_h;
  c.src_a = T_cap * lora_ld;
  c.src_b = lora_ld;
  c.dst = w.q_abs;
  c.dst_a = kw;
  c.dst_b = H * kw;
  c.n_a = H;
  c.n_b = T;
  c.n_c = lora;
  detail::launch_copy_heads(c, cs);
  AttnMlaArgs a;
  a.q = w.q_abs;
  a.n_head = static_cast<int32_t>(H);
  a.kv.kv = L.k;
  a.kv.num_slots = num_slots;
  a.kv.kv_lora_rank = static_cast<int32_t>(lora);
  a.kv.rope_dim = static_cast<int32_t>(rope);
  a.kv.block_size = static_cast<int32_t>(bs);
  a.batch = batch(p, in);
  // compute/engine.cc attention_mla()
  a.scale = static_cast<float>(kq_scale_mult * (1.0f / std::sqrt(static_cast<float>(dqk))));
  a.out = w.lat;
  a.out_type = AttnOut::kBf16;
  a.workspace = w.attn_ws;
  a.workspace_bytes = w.attn_ws_bytes;
  paged_attention_mla(a, cs);
  c = detail::HeadCopyArgs{};  // lat_h[h, t, :] = lat[t, h, :]
  c.src = w.lat;
  c.src_a = lora;
  c.src_b = H * lora;
  c.dst = w.lat_h;
  c.dst_a = T_cap * lora_ld;
  c.dst_b = lora_ld;
  c.n_a = H;
  c.n_b = T;
  c.n_c = lora;
  detail::launch_copy_heads(c, cs);
  for (int64_t h = 0; h < H; ++h)
    gemm(T, dv, lora, w.lat_h + h * T_cap * lora_ld, lora_ld, L.wv_b + h * L.wv_b_stride, lora,
         w.attn_h + h * T_cap * dv_ld, dv_ld, GemmOut::kBf16, false);
  c = detail::HeadCopyArgs{};  // attn[t, h * dv : (h + 1) * dv] = attn_h[h, t, :]
  c.src = w.attn_h;
  c.src_a = T_cap * dv_ld;
  c.src_b = dv_ld;
  c.dst = w.attn;
  c.dst_a = dv;
  c.dst_b = H * dv;
  c.n_a = H;
  c.n_b = T;
  c.n_c = dv;
  detail::launch_copy_heads(c, cs);
}

// compute/engine.cc moe(): router logits, the shared expert (and its sigmoid gate), then the
// routed experts and the fixed-order combine (MoeForward) into moe_y; the caller adds moe_y.
void GpuEngine::Impl::moe(const DevLayer& L, const StepPlan& p) {
  cudaStream_t cs = streams->compute();
  const int64_t T = p.T;
  gemm(T, n_expert, E, w.h, E, L.router, E, w.router, n_expert, GemmOut::kF32, false);
  const float* shared = nullptr;
  const float* shared_gate = nullptr;
  if (L.sh_gate_up) {
    const int64_t ff = L.n_ff_sh;
    gemm(T, 2 * ff, E, w.h, E, L.sh_gate_up, E, w.gate_up, 2 * ff, GemmOut::kF32, false);
    swiglu(w.gate_up, T, ff, w.act, cs);
    gemm(T, E, ff, w.act, ff, L.sh_down, ff, w.shared_out, E, GemmOut::kF32, false);
    shared = w.shared_out;
    if (L.sh_gate) {
      detail::launch_row_dot(w.h, E, L.sh_gate, E, T, w.shared_gate, cs);
      shared_gate = w.shared_gate;
    }
  }
  MoeForwardArgs m;
  m.n_tok = T;
  m.x = w.h;
  m.router_logits = w.router;
  m.router_bias = L.router_bias;
  m.experts.gate = L.exp_gate;
  m.experts.up = L.exp_up;
  m.experts.down = L.exp_down;
  m.experts.n_expert = exp_count;
  m.expert_begin = exp_begin;
  m.experts.d = E;
  m.experts.d_ff = ff_exp;
  m.shared_out = shared;
  m.shared_gate_logit = shared_gate;
  m.y = w.moe_y;
  if (ep)
    moe_fwd->run_dispatch(m, *ep, work, cs);
  else
    moe_fwd->run(m, work, cs);
}

// A data-parallel rank without sequences this step still serves its experts in every MoE layer
// (the other ranks' rows come here), in layer order like a step would.
void GpuEngine::Impl::serve_experts() {
  cudaStream_t cs = streams->compute();
  for (const DevLayer& L : layers) {
    if (!L.moe) continue;
    MoeForwardArgs m;
    m.n_tok = 0;
    m.router_bias = L.router_bias;
    m.experts = {L.exp_gate, L.exp_up, L.exp_down, exp_count, E, ff_exp};
    m.expert_begin = exp_begin;
    moe_fwd->run_dispatch(m, *ep, work, cs);
  }
  ep->synchronize(cs);
}

// Logits of computed rows [r0, r0 + n) (n <= C_cap) into w.logits: gather, output norm, head.
void GpuEngine::Impl::enqueue_head(const StepInputs& in, int64_t r0, int64_t n) {
  cudaStream_t cs = streams->compute();
  detail::launch_gather_rows(w.x, E, in.rows + r0, n, w.head_x, cs);
  add_rms_norm(w.head_x, nullptr, out_norm, n, E, eps, w.head_h, cs);
  gemm(n, V, E, w.head_h, E, output, E, w.logits, V, GemmOut::kF32, false);
}

// Copies the asked rows to out->logits, computing the head C_cap rows at a time (the body
// already queued the first pass). Copies to pageable memory return when done, so the next pass
// may overwrite w.logits.
void GpuEngine::Impl::copy_logits(const StepPlan& p, const StepInputs& in,
                                  compute::StepResult* out) {
  cudaStream_t cs = streams->compute();
  const size_t n_out = p.out_src.size();
  out->logits.resize(n_out * sz(V));
  size_t k = 0;
  for (int64_t c0 = 0; c0 < p.R; c0 += C_cap) {
    const int64_t n = std::min(C_cap, p.R - c0);
    if (c0 > 0) enqueue_head(in, c0, n);
    while (k < n_out && p.out_src[k] < c0 + n) {
      size_t e = k + 1;  // a run of rows that are consecutive on both sides
      while (e < n_out && p.out_src[e] == p.out_src[e - 1] + 1 && p.out_src[e] < c0 + n) ++e;
      TROUPE_CUDA_CHECK(
          cudaMemcpyAsync(out->logits.data() + k * sz(V), w.logits + (p.out_src[k] - c0) * V,
                          (e - k) * sz(V) * sizeof(float), cudaMemcpyDeviceToHost, cs));
      k = e;
    }
  }
  TROUPE_CHECK(k == n_out, "copied %zu of %zu logits rows", k, n_out);
}

}  // namespace troupe::gpu
