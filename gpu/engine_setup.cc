// GpuEngine::create (gpu/engine.h) and the set-up it runs once, on the caller's thread: the model
// shape checks (init_dims), the weight upload (place_weights, dequantizing to bf16 through a
// staging buffer), the KV pool (place_kv) and the workspace carve (carve_work). Each placement runs
// twice over the same code: a sizing pass (ArenaSizer, which also does every shape and type check)
// and, when everything fits in free device memory, the real pass into the arenas.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <exception>
#include <initializer_list>
#include <limits>
#include <utility>

#include "base/check.h"
#include "gpu/attention.h"
#include "gpu/collective.h"
#include "gpu/detail/engine_impl.h"
#include "gpu/detail/engine_upload.h"
#include "gpu/engine.h"
#include "gpu/gemm.h"
#include "gpu/moe.h"
#include "gpu/ops.h"
#include "gpu/runtime.h"
#include "model/model.h"
#include "model/rope.h"

namespace troupe::gpu {

using detail::align_up;
using detail::bf16;
using detail::DevLayer;
using detail::expect_f32_vector;
using detail::expect_matrix;
using detail::InputLayout;
using detail::kErrBadInput;
using detail::ll;
using detail::row_slice;
using detail::shape_error;
using detail::sz;
using detail::Uploader;
using detail::Work;
using model::GgmlType;
using model::LayerSpec;
using model::ModelSpec;
using model::WeightView;

namespace {

constexpr size_t kDeviceSlackBytes = size_t{256} << 20;  // cuBLASLt, streams, graphs, staging

int64_t round_up8(int64_t n) { return (n + 7) / 8 * 8; }
double mib(uint64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }

/// Counts what an Arena hands out for the same sequence of allocate() calls (the same 256-byte
/// alignment of every start): the sizing pass before the real allocation.
class ArenaSizer {
 public:
  void* allocate(size_t bytes, const char* /*what*/) {
    used_ = align_up(used_, 256) + bytes;
    return nullptr;
  }
  template <class T>
  T* allocate_n(size_t n, const char* what) {
    return static_cast<T*>(allocate(n * sizeof(T), what));
  }
  size_t used() const { return used_; }

 private:
  size_t used_ = 0;
};

/// A bf16 matrix of the given views' rows, in order (each [rows_i, cols]).
template <class Alloc>
bf16* place_matrix(Alloc& a, Uploader* up, std::initializer_list<const WeightView*> parts,
                   const char* what) {
  int64_t rows = 0, cols = -1;
  for (const WeightView* p : parts) {
    if (cols < 0) cols = p->cols();
    if (p->cols() != cols)
      TROUPE_INPUT_ERROR("GpuEngine: %s: %s has %lld columns, expected %lld", what, p->name.c_str(),
                         ll(p->cols()), ll(cols));
    rows += p->ne[1] * p->ne[2];
  }
  bf16* dst = a.template allocate_n<bf16>(sz(rows * cols), what);
  if (up) {
    int64_t at = 0;
    for (const WeightView* p : parts) {
      up->rows(*p, dst + at * cols);
      at += p->ne[1] * p->ne[2];
    }
  }
  return dst;
}

/// Columns [c0, c0 + nc) of a 2-D weight as a bf16 [rows, nc] matrix.
template <class Alloc>
bf16* place_cols(Alloc& a, Uploader* up, const WeightView& w, int64_t c0, int64_t nc,
                 const char* what) {
  bf16* dst = a.template allocate_n<bf16>(sz(w.rows() * nc), what);
  if (up) up->cols(w, c0, nc, dst);
  return dst;
}

template <class Alloc>
const float* place_f32(Alloc& a, Uploader* up, const WeightView& w, int64_t n, const char* what) {
  if (!w.present()) return nullptr;
  expect_f32_vector(w, n);
  float* dst = a.template allocate_n<float>(sz(n), what);
  if (up) up->f32(reinterpret_cast<const float*>(w.data), n, dst);
  return dst;
}

/// place_f32 of a weight the architecture needs: a missing one is an error (in both passes).
template <class Alloc>
const float* place_f32_required(Alloc& a, Uploader* up, const WeightView& w, int64_t n,
                                const char* what) {
  if (!w.present()) TROUPE_INPUT_ERROR("GpuEngine: the model lacks a needed %s weight", what);
  return place_f32(a, up, w, n, what);
}

}  // namespace

void GpuEngine::Impl::init_dims(const GpuEngineOptions& o) {
  const ModelSpec& s = model->spec;
  E = s.n_embd;
  V = s.n_vocab;
  H = s.n_head;
  HK = s.n_head_kv;
  n_rot = s.n_rot;
  kq_scale_mult = s.kq_scale_mult;
  neox = s.rope_style == model::RopeStyle::kNeox;
  eps = s.rms_eps;
  mla = s.is_mla();
  n_layers = range.end - range.begin;
  if (E < 1 || V < 1 || H < 1) TROUPE_INPUT_ERROR("GpuEngine: model has an empty shape");
  if (s.is_v4())
    TROUPE_INPUT_ERROR(
        "GpuEngine: DeepSeek-V4 (hyper-connection streams, compressed and sparse attention, "
        "hash routing) is not supported yet; the CPU engine runs it");
  // gpt-oss's parts the GPU kernels do not have yet (the CPU engine runs them).
  bool gpt_oss_parts =
      s.ffn_act == model::FfnAct::kSwigluOai || s.gating == model::Gating::kSoftmaxTopk;
  for (const model::LayerSpec& L : s.layers) {
    gpt_oss_parts = gpt_oss_parts || L.sinks.present() || L.window > 0 || L.bo.present() ||
                    L.router_logit_bias.present();
    for (const model::ExpertFfn& X : L.experts)
      gpt_oss_parts = gpt_oss_parts || X.gate_b.present() || X.up_b.present() ||
                      X.down_b.present() || X.gate_up.present();
  }
  if (gpt_oss_parts)
    TROUPE_INPUT_ERROR(
        "GpuEngine: attention sinks, sliding windows, output and expert biases, the clamped "
        "SwiGLU, softmax-over-top-k routing and interleaved gate/up experts (gpt-oss) are not "
        "supported yet; the CPU engine runs them");
  // Gemma 3's parts likewise.
  bool gemma_parts =
      s.embd_scale != 1.0f || s.final_logit_softcap > 0 || s.ffn_act == model::FfnAct::kGeluTanh;
  for (const model::LayerSpec& L : s.layers)
    gemma_parts =
        gemma_parts || L.attn_post_norm.present() || L.ffn_post_norm.present() || L.local_rope;
  if (gemma_parts)
    TROUPE_INPUT_ERROR(
        "GpuEngine: scaled embeddings, post-attention and post-FFN norms, per-layer rope bases, "
        "the GELU FFN and logit soft-capping (Gemma 3) are not supported yet; the CPU engine "
        "runs them");
  if (s.has_indexer())
    TROUPE_INPUT_ERROR(
        "GpuEngine: DeepSeek-V3.2's sparse attention (its lightning indexer) is not supported yet; "
        "the CPU engine runs it");
  if (s.has_recurrent())
    TROUPE_INPUT_ERROR(
        "GpuEngine: Gated DeltaNet linear attention and gated attention (Qwen3-Next) are not "
        "supported yet; the CPU engine runs them");
  // And Llama 4's.
  bool llama4_parts = s.moe_weight_input || s.attn_temp_scale != 0.0f;
  for (const model::LayerSpec& L : s.layers)
    llama4_parts = llama4_parts || L.nope || L.chunk > 0 || L.qk_l2_norm;
  if (llama4_parts)
    TROUPE_INPUT_ERROR(
        "GpuEngine: layers without rotary, chunked attention, weightless q/k norms and experts "
        "weighted at their input (Llama 4) are not supported yet; the CPU engine runs them");
  if (H > 65535)
    TROUPE_INPUT_ERROR("GpuEngine: %lld heads are more than the GPU kernels take (65535)", ll(H));
  if (n_rot < 0 || n_rot % 2 != 0)
    TROUPE_INPUT_ERROR("GpuEngine: n_rot %lld must be even and >= 0", ll(n_rot));
  if (mla) {
    q_lora = s.q_lora_rank;
    lora = s.kv_lora_rank;
    rope = s.qk_rope_dim;
    nope = s.qk_nope_dim;
    dv = s.v_head_dim;
    dqk = nope + rope;
    kw = lora + rope;
    if (lora < 1 || lora > 512 || rope > 64 || rope % 2 != 0 || nope < 1 || dv < 1)
      TROUPE_INPUT_ERROR(
          "GpuEngine: MLA shape not supported on the GPU: kv_lora_rank %lld (1..512), "
          "qk_rope_dim %lld (even, <= 64), qk_nope_dim %lld (>= 1), v_head_dim %lld (>= 1)",
          ll(lora), ll(rope), ll(nope), ll(dv));
    if (rope != n_rot)
      TROUPE_INPUT_ERROR("GpuEngine: MLA needs n_rot (%lld) == qk_rope_dim (%lld)", ll(n_rot),
                         ll(rope));
    nope_ld = round_up8(nope);
    lora_ld = round_up8(lora);
    dv_ld = round_up8(dv);
    attn_width = H * dv;
  } else {
    D = s.head_dim_k;
    if (HK < 1 || H % HK != 0)
      TROUPE_INPUT_ERROR("GpuEngine: n_head %lld is not a multiple of n_head_kv %lld", ll(H),
                         ll(HK));
    if (s.head_dim_v != D)
      TROUPE_INPUT_ERROR(
          "GpuEngine: key and value head widths differ (%lld, %lld): not supported on the GPU",
          ll(D), ll(s.head_dim_v));
    if (D < 1 || D > 256)
      TROUPE_INPUT_ERROR("GpuEngine: head_dim %lld is outside 1..256 (the GPU attention kernels)",
                         ll(D));
    if (n_rot > D) TROUPE_INPUT_ERROR("GpuEngine: n_rot %lld > head_dim %lld", ll(n_rot), ll(D));
    qkv_rows = (H + 2 * HK) * D;
    attn_width = H * D;
  }
  H_all = H;
  HK_all = HK;
  const int64_t P = tp_size;
  if (P > 1) {
    if (H % P != 0 || (!mla && HK % P != 0))
      TROUPE_INPUT_ERROR(
          "GpuEngine: tensor parallelism over %d ranks needs n_head (%lld)%s to be a multiple "
          "of %d",
          tp_size, ll(H), mla ? "" : strfmt(" and n_head_kv (%lld)", ll(HK)).c_str(), tp_size);
    H /= P;
    if (!mla) {
      HK /= P;
      qkv_rows = (H + 2 * HK) * D;
    }
    attn_width = H * (mla ? dv : D);
  }
  // A layer's FFN width (dense or shared experts) as this rank holds it.
  auto ff_share = [&](int64_t ff, int64_t il, const char* what) {
    if (ff % P != 0)
      TROUPE_INPUT_ERROR(
          "GpuEngine: tensor parallelism over %d ranks needs layer %lld's %s width (%lld) to be "
          "a multiple of %d",
          tp_size, ll(il), what, ll(ff), tp_size);
    return ff / P;
  };
  for (int64_t il = range.begin; il < range.end; ++il) {
    const LayerSpec& L = s.layers[sz(il)];
    if (L.is_moe) {
      any_moe = true;
      if (L.shared.gate.present()) {
        any_shared = true;
        ff_max = std::max(ff_max, ff_share(L.shared.gate.rows(), il, "shared expert"));
        if (L.shared_gate.present()) any_shared_gate = true;
      }
    } else {
      ff_max = std::max(ff_max, ff_share(L.ffn_gate.rows(), il, "FFN"));
    }
  }
  if (any_moe) {
    n_expert = s.n_expert;
    n_expert_used = s.n_expert_used;
    expert_parallel = P > 1 && o.tp_expert_parallel && n_expert % P == 0;
    exp_count = expert_parallel ? n_expert / P : n_expert;
    exp_begin = expert_parallel ? tp_rank * exp_count : 0;
    if (ep) {
      if (n_expert % ep->size() != 0)
        TROUPE_INPUT_ERROR("GpuEngine: %lld experts do not divide over %d expert-parallel ranks",
                           ll(n_expert), ep->size());
      expert_parallel = true;
      exp_count = n_expert / ep->size();
      exp_begin = ep->rank() * exp_count;
    }
    const int64_t width_ranks = expert_parallel ? 1 : P;  // ranks one expert's width is split in
    ff_exp = s.n_ff_exp / width_ranks;
    if (E % 8 != 0 || ff_exp % 8 != 0 || ff_exp < 8 || s.n_ff_exp % width_ranks != 0)
      TROUPE_INPUT_ERROR(
          "GpuEngine: MoE on the GPU needs n_embd (%lld) and n_ff_exp (%lld%s) to be positive "
          "multiples of 8",
          ll(E), ll(s.n_ff_exp),
          width_ranks > 1 ? strfmt(", divided over %d tensor-parallel ranks", tp_size).c_str()
                          : "");
    validate_moe_routing(MoeRouting::from_spec(s));
  }
  bs = o.kv_block_size;
  num_blocks = o.kv_num_blocks > 0 ? o.kv_num_blocks : (o.max_tokens_in_cache + bs - 1) / bs;
  if (num_blocks < 1 || num_blocks > std::numeric_limits<int32_t>::max() / bs)
    TROUPE_INPUT_ERROR(
        "GpuEngine: the KV pool of %lld blocks of %lld positions must hold 1 .. 2^31 - 1 "
        "positions",
        ll(num_blocks), ll(bs));
  num_slots = num_blocks * bs;
  T_cap = o.max_step_tokens;
  S_cap = std::min(o.max_step_seqs, o.max_step_tokens);
  C_cap = S_cap;
  const int64_t kv_heads = mla ? 1 : HK;
  if (S_cap * kv_heads > 65535)
    TROUPE_INPUT_ERROR(
        "GpuEngine: max_step_seqs %lld times %lld KV heads exceeds 65535 (the attention grid)",
        ll(S_cap), ll(kv_heads));
  in_cap = InputLayout::make(T_cap, S_cap, num_blocks, T_cap);
}

template <class Alloc>
void GpuEngine::Impl::place_weights(Alloc& a, Uploader* up) {
  const ModelSpec& s = model->spec;
  layers.assign(sz(n_layers), DevLayer{});
  tok_embd = output = nullptr;
  out_norm = rope_cos = rope_sin = nullptr;
  if (range.embed) {
    expect_matrix(s.token_embd, V, E);
    tok_embd = place_matrix(a, up, {&s.token_embd}, "token_embd");
  }
  if (head_here) {
    out_norm = place_f32_required(a, up, s.output_norm, E, "output_norm");
    expect_matrix(s.output, V, E);
    // A tied head reads the embedding table already on the device.
    if (range.embed && s.output.data == s.token_embd.data && s.output.type == s.token_embd.type)
      output = tok_embd;
    else
      output = place_matrix(a, up, {&s.output}, "output");
  }
  if (n_rot >= 2) {
    const int64_t half = n_rot / 2;
    float* c = a.template allocate_n<float>(sz(num_slots * half), "rope cos");
    float* sn = a.template allocate_n<float>(sz(num_slots * half), "rope sin");
    if (up) {
      const model::RopeFrequencies f = model::rope_frequencies(s, opts.max_positions);
      const RopeTable t = make_rope_table(num_slots, f.inv_freq, f.mscale);
      up->f32(t.cos.data(), num_slots * half, c);
      up->f32(t.sin.data(), num_slots * half, sn);
    }
    rope_cos = c;
    rope_sin = sn;
  }
  for (int64_t l = 0; l < n_layers; ++l) {
    const LayerSpec& L = s.layers[sz(range.begin + l)];
    DevLayer& d = layers[sz(l)];
    d.attn_norm = place_f32_required(a, up, L.attn_norm, E, "attn_norm");
    d.ffn_norm = place_f32_required(a, up, L.ffn_norm, E, "ffn_norm");
    if (mla) {
      // This rank's heads: rows [h0 * dqk, (h0 + H) * dqk) of wq_b / wq.
      const int64_t h0 = tp_rank * H;
      if (L.wq_a.present()) {
        expect_matrix(L.wq_a, q_lora, E);
        expect_matrix(L.wq_b, H_all * dqk, q_lora);
        d.wq_a = place_matrix(a, up, {&L.wq_a}, "wq_a");
        d.q_a_norm = place_f32_required(a, up, L.q_a_norm, q_lora, "q_a_norm");
        const WeightView qb = row_slice(L.wq_b, h0 * dqk, H * dqk);
        d.wq_b = place_matrix(a, up, {&qb}, "wq_b");
      } else {
        expect_matrix(L.wq, H_all * dqk, E);
        const WeightView q = row_slice(L.wq, h0 * dqk, H * dqk);
        d.wq = place_matrix(a, up, {&q}, "wq");
      }
      expect_matrix(L.wkv_a, kw, E);
      d.wkv_a = place_matrix(a, up, {&L.wkv_a}, "wkv_a");
      d.kv_a_norm = place_f32_required(a, up, L.kv_a_norm, lora, "kv_a_norm");
      // Per-head matrices, each starting 16-byte aligned (Gemm's requirement on w).
      expect_matrix(L.wk_b, lora, nope, H_all);
      expect_matrix(L.wv_b, dv, lora, H_all);
      d.wk_b_stride = round_up8(lora * nope);
      d.wv_b_stride = round_up8(dv * lora);
      bf16* kb = a.template allocate_n<bf16>(sz(H * d.wk_b_stride), "wk_b");
      bf16* vb = a.template allocate_n<bf16>(sz(H * d.wv_b_stride), "wv_b");
      if (up) {
        for (int64_t h = 0; h < H; ++h) {
          up->rows(L.wk_b.slice(h0 + h), kb + h * d.wk_b_stride);
          up->rows(L.wv_b.slice(h0 + h), vb + h * d.wv_b_stride);
        }
      }
      d.wk_b = kb;
      d.wv_b = vb;
    } else {
      expect_matrix(L.wq, H_all * D, E);
      expect_matrix(L.wk, HK_all * D, E);
      expect_matrix(L.wv, HK_all * D, E);
      // This rank's query heads and KV heads (a group of P = 1 takes them all).
      const WeightView q = row_slice(L.wq, tp_rank * H * D, H * D);
      const WeightView k = row_slice(L.wk, tp_rank * HK * D, HK * D);
      const WeightView v = row_slice(L.wv, tp_rank * HK * D, HK * D);
      d.wqkv = place_matrix(a, up, {&q, &k, &v}, "wqkv");
      if (L.bq.present() || L.bk.present() || L.bv.present()) {
        float* b = a.template allocate_n<float>(sz(qkv_rows), "bqkv");
        const WeightView* parts[3] = {&L.bq, &L.bk, &L.bv};
        const int64_t widths[3] = {H * D, HK * D, HK * D};
        int64_t at = 0;
        for (int i = 0; i < 3; ++i) {
          if (parts[i]->present()) {
            expect_f32_vector(*parts[i], widths[i] * tp_size);
            if (up)
              up->f32(reinterpret_cast<const float*>(parts[i]->data) + tp_rank * widths[i],
                      widths[i], b + at);
          } else if (up) {
            up->zeros(b + at, widths[i]);  // x + 0 == x: the CPU adds nothing there
          }
          at += widths[i];
        }
        d.bqkv = b;
      }
      if ((L.q_norm.present() && L.q_norm.cols() != D) ||
          (L.k_norm.present() && L.k_norm.cols() != D))
        TROUPE_INPUT_ERROR(
            "GpuEngine: q/k RMSNorm over all heads at once (MiniMax-M2) is not supported yet; "
            "the CPU engine runs it");
      d.q_norm = place_f32(a, up, L.q_norm, D, "q_norm");
      d.k_norm = place_f32(a, up, L.k_norm, D, "k_norm");
    }
    expect_matrix(L.wo, E, attn_width * tp_size);
    d.wo = place_cols(a, up, L.wo, tp_rank * attn_width, attn_width, "wo");
    d.moe = L.is_moe;
    if (L.is_moe) {
      expect_matrix(L.router, n_expert, E);
      d.router = place_matrix(a, up, {&L.router}, "router");
      d.router_bias = place_f32(a, up, L.router_bias, n_expert, "router_bias");
      if (static_cast<int64_t>(L.experts.size()) != n_expert)
        TROUPE_INPUT_ERROR("GpuEngine: layer %lld has %zu experts, expected %lld",
                           ll(range.begin + l), L.experts.size(), ll(n_expert));
      // This rank's experts (all, or its whole ones), each whole or this rank's width share.
      bf16* g = a.template allocate_n<bf16>(sz(exp_count * ff_exp * E), "experts gate");
      bf16* u = a.template allocate_n<bf16>(sz(exp_count * ff_exp * E), "experts up");
      bf16* dn = a.template allocate_n<bf16>(sz(exp_count * E * ff_exp), "experts down");
      const int64_t ff_all = s.n_ff_exp, c0 = expert_parallel ? 0 : tp_rank * ff_exp;
      for (int64_t e = 0; e < n_expert; ++e) {
        const model::ExpertFfn& f = L.experts[sz(e)];
        expect_matrix(f.gate, ff_all, E);
        expect_matrix(f.up, ff_all, E);
        expect_matrix(f.down, E, ff_all);
        const int64_t i = e - exp_begin;  // index among this rank's experts
        if (up && i >= 0 && i < exp_count) {
          up->rows(row_slice(f.gate, c0, ff_exp), g + i * ff_exp * E);
          up->rows(row_slice(f.up, c0, ff_exp), u + i * ff_exp * E);
          up->cols(f.down, c0, ff_exp, dn + i * E * ff_exp);
        }
      }
      d.exp_gate = g;
      d.exp_up = u;
      d.exp_down = dn;
      if (L.shared.gate.present()) {
        const int64_t ff_all = L.shared.gate.rows();
        d.n_ff_sh = ff_all / tp_size;
        expect_matrix(L.shared.gate, ff_all, E);
        expect_matrix(L.shared.up, ff_all, E);
        expect_matrix(L.shared.down, E, ff_all);
        const WeightView sg = row_slice(L.shared.gate, tp_rank * d.n_ff_sh, d.n_ff_sh);
        const WeightView su = row_slice(L.shared.up, tp_rank * d.n_ff_sh, d.n_ff_sh);
        d.sh_gate_up = place_matrix(a, up, {&sg, &su}, "shared gate_up");
        d.sh_down = place_cols(a, up, L.shared.down, tp_rank * d.n_ff_sh, d.n_ff_sh, "shared down");
        if (L.shared_gate.present()) {
          expect_matrix(L.shared_gate, 1, E);
          d.sh_gate = place_matrix(a, up, {&L.shared_gate}, "shared_gate");
        }
      }
    } else {
      const int64_t ff_all = L.ffn_gate.rows();
      d.n_ff = ff_all / tp_size;
      expect_matrix(L.ffn_gate, ff_all, E);
      expect_matrix(L.ffn_up, ff_all, E);
      expect_matrix(L.ffn_down, E, ff_all);
      const WeightView fg = row_slice(L.ffn_gate, tp_rank * d.n_ff, d.n_ff);
      const WeightView fu = row_slice(L.ffn_up, tp_rank * d.n_ff, d.n_ff);
      d.w_gate_up = place_matrix(a, up, {&fg, &fu}, "ffn gate_up");
      d.w_down = place_cols(a, up, L.ffn_down, tp_rank * d.n_ff, d.n_ff, "ffn down");
    }
  }
}

template <class Alloc>
void GpuEngine::Impl::place_kv(Alloc& a) {
  const int64_t k_width = mla ? kw : HK * D;
  for (int64_t l = 0; l < n_layers; ++l) {
    DevLayer& d = layers[sz(l)];
    d.k = a.template allocate_n<bf16>(sz(num_slots * k_width), "KV cache K");
    d.v = mla ? nullptr : a.template allocate_n<bf16>(sz(num_slots * HK * D), "KV cache V");
  }
}

template <class Alloc>
void GpuEngine::Impl::carve_work(Alloc& a) {
  // With tensor parallelism a step may run as two micro-batches whose second one starts at a
  // 16-byte boundary after the first's rows (rows_from): 8 rows of slack per buffer.
  const size_t T = sz(T_cap) + (tp ? 8 : 0), C = sz(C_cap);
  w = Work{};
  w.gemm_ws = a.allocate(Gemm::kDefaultWorkspaceBytes, "gemm workspace");
  w.in_dev = a.template allocate_n<uint8_t>(in_cap.total * (tp ? 2 : 1), "step inputs");
  w.x = a.template allocate_n<float>(T * sz(E), "residual");
  w.h = a.template allocate_n<bf16>(T * sz(E), "normed hidden");
  if (mla) {
    if (q_lora > 0) {
      w.qa = a.template allocate_n<float>(T * sz(q_lora), "q_a");
      w.qa_n = a.template allocate_n<bf16>(T * sz(q_lora), "q_a normed");
    }
    w.qf = a.template allocate_n<float>(T * sz(H * dqk), "q");
    w.kva = a.template allocate_n<float>(T * sz(kw), "kv_a");
    w.q_nope_h = a.template allocate_n<bf16>(sz(H) * T * sz(nope_ld), "q_nope by head");
    w.qlat_h = a.template allocate_n<bf16>(sz(H) * T * sz(lora_ld), "q latent by head");
    w.q_abs = a.template allocate_n<bf16>(T * sz(H * kw), "q_abs");
    w.lat = a.template allocate_n<bf16>(T * sz(H * lora), "attention latent");
    w.lat_h = a.template allocate_n<bf16>(sz(H) * T * sz(lora_ld), "latent by head");
    w.attn_h = a.template allocate_n<bf16>(sz(H) * T * sz(dv_ld), "values by head");
  } else {
    w.qkv = a.template allocate_n<float>(T * sz(qkv_rows), "qkv");
    w.q = a.template allocate_n<bf16>(T * sz(H * D), "q");
  }
  w.attn = a.template allocate_n<bf16>(T * sz(attn_width), "attention output");
  w.attn_ws_bytes = paged_attention_workspace_bytes(
      static_cast<int32_t>(S_cap), static_cast<int32_t>(H), static_cast<int32_t>(mla ? lora : D),
      static_cast<int32_t>(num_slots));
  w.attn_ws = a.allocate(w.attn_ws_bytes, "attention workspace");
  if (ff_max > 0) {
    w.gate_up = a.template allocate_n<float>(T * sz(2 * ff_max), "gate_up");
    w.act = a.template allocate_n<bf16>(T * sz(ff_max), "swiglu");
  }
  if (any_moe) {
    w.router = a.template allocate_n<float>(T * sz(n_expert), "router logits");
    w.moe_y = a.template allocate_n<float>(T * sz(E), "moe output");
    if (any_shared) w.shared_out = a.template allocate_n<float>(T * sz(E), "shared expert");
    if (any_shared_gate) w.shared_gate = a.template allocate_n<float>(T, "shared gate logit");
  }
  if (head_here) {
    w.head_x = a.template allocate_n<float>(C * sz(E), "head rows");
    w.head_h = a.template allocate_n<bf16>(C * sz(E), "head rows normed");
    w.logits = a.template allocate_n<float>(C * sz(V), "logits");
  }
}

// What MoeForward::run and run_moe_experts take from the arena for T_cap tokens (gpu/moe.cu):
// ids, weights, row_entry, entry_row (4 B per entry), x_sorted (bf16) and expert_out (f32) rows,
// per-expert counts and offsets, then gate and up (f32) and the SwiGLU product (bf16) per entry;
// 256 bytes of alignment for each of the 11 allocations.
size_t GpuEngine::Impl::moe_scratch_bytes() const {
  if (!any_moe) return 0;
  const size_t n_ent = sz(T_cap) * sz(n_expert_used);
  const size_t d = sz(E), ff = sz(ff_exp);
  const size_t local = n_ent * (16 + 6 * d + 10 * ff) + 8 * sz(n_expert) + 4 + 16 * 256;
  if (!ep) return local + (size_t{1} << 20);
  // run_dispatch (gpu/moe_dispatch.cc): besides its own entries, the rows every rank may send
  // here (each at most T_cap tokens x k): bf16 in, f32 out, and the experts' gate, up and SwiGLU
  // rows; the counts from every rank.
  // (run_moe_experts runs once per sender, at most n_ent rows, in the local term's space.)
  const size_t from_all = sz(ep->size()) * n_ent;
  return local + from_all * 6 * d + 4 * sz(n_expert) + 8 * 256 + (size_t{1} << 20);
}

Result<std::unique_ptr<GpuEngine>> GpuEngine::create(std::shared_ptr<const model::Model> model,
                                                     const GpuEngineOptions& opts) {
  if (!model) return Error{kErrBadInput, "GpuEngine: no model"};
  const ModelSpec& s = model->spec;
  std::string tiled;
  model::for_each_weight(s, [&](const model::WeightView& w) {
    if (tiled.empty() && w.present() && w.layout != model::WeightLayout::kRows) tiled = w.name;
  });
  if (!tiled.empty())
    return Error{kErrBadInput,
                 "GpuEngine: weight " + tiled +
                     " was put in 16-row tiles for the CPU's int8 kernels; the GPU engine uploads "
                     "weights in rows (give it the model as loaded, or a copy made without tiles)"};
  std::string why;
  if (!gpu_available(&why))
    return Error{static_cast<int>(Errc::kNoDevice), "GpuEngine: no usable CUDA GPU: " + why};
  if (opts.kv_block_size < 1 || opts.kv_block_size > 4096)
    return Error{kErrBadInput, "GpuEngine: KV block size must be in 1..4096"};
  if (opts.max_step_tokens < 1 || opts.max_step_tokens > std::numeric_limits<int32_t>::max())
    return Error{kErrBadInput, "GpuEngine: max_step_tokens must be in 1..2^31 - 1"};
  if (opts.max_step_seqs < 1) return Error{kErrBadInput, "GpuEngine: max_step_seqs must be >= 1"};
  compute::LayerRange range = opts.range;
  if (range.end < 0) range.end = s.n_layer;
  if (range.begin < 0 || range.begin >= range.end || range.end > s.n_layer)
    return Error{kErrBadInput, strfmt("GpuEngine: layer range [%lld, %lld) is not inside [0, %lld)",
                                      ll(range.begin), ll(range.end), ll(s.n_layer))};
  uint64_t need = 0;
  size_t free_bytes = 0;
  try {
    int count = 0;
    TROUPE_CUDA_CHECK(cudaGetDeviceCount(&count));
    if (opts.device < 0 || opts.device >= count)
      return Error{kErrBadInput, strfmt("GpuEngine: device %d does not exist (%d CUDA devices)",
                                        opts.device, count)};
    TROUPE_CUDA_CHECK(cudaSetDevice(opts.device));
    cudaDeviceProp prop{};
    TROUPE_CUDA_CHECK(cudaGetDeviceProperties(&prop, opts.device));
    if (prop.major < 8)
      return Error{kErrBadInput,
                   strfmt("GpuEngine: %s is sm_%d%d: unsupported architecture (the GPU backend "
                          "needs sm_80 or newer for bf16)",
                          prop.name, prop.major, prop.minor)};

    auto impl = std::make_unique<Impl>();
    Impl& m = *impl;
    m.model = std::move(model);
    m.opts = opts;
    m.range = range;
    m.device = opts.device;
    if (opts.tp && opts.tp->size() > 1) {
      m.tp = opts.tp;
      m.tp_rank = opts.tp->rank();
      m.tp_size = opts.tp->size();
      if (static_cast<size_t>(opts.max_step_tokens) * static_cast<size_t>(s.n_embd) >
          opts.tp->capacity())
        return Error{kErrBadInput,
                     strfmt("GpuEngine: the tensor-parallel group takes %zu floats per sum, a "
                            "step needs up to %lld (max_step_tokens x n_embd)",
                            opts.tp->capacity(), ll(opts.max_step_tokens * s.n_embd))};
    }
    if (opts.ep && opts.ep->size() > 1) {
      if (m.tp)
        return Error{kErrBadInput,
                     "GpuEngine: tensor parallelism (tp) and data-parallel expert parallelism (ep) "
                     "cannot be combined yet"};
      m.ep = opts.ep;
      // The largest exchange: results for every rank's T_cap x k rows, f32.
      const size_t need = static_cast<size_t>(opts.ep->size()) *
                          static_cast<size_t>(opts.max_step_tokens) *
                          static_cast<size_t>(std::max<int64_t>(s.n_expert_used, 1)) *
                          static_cast<size_t>(s.n_embd) * sizeof(float);
      if (opts.ep->a2a_capacity() < need)
        return Error{kErrBadInput,
                     strfmt("GpuEngine: the expert-parallel group moves at most %zu bytes per "
                            "all-to-all, a step may need %zu (ranks x max_step_tokens x "
                            "n_expert_used x n_embd x 4)",
                            opts.ep->a2a_capacity(), need)};
    }
    m.head_here = range.head && m.tp_rank == 0;
    m.init_dims(opts);

    // Sizing passes (also every shape and type check), then one check against free memory.
    ArenaSizer wsz, ksz, xsz;
    m.place_weights(wsz, nullptr);
    m.place_kv(ksz);
    m.carve_work(xsz);
    const size_t work_bytes = xsz.used() + m.moe_scratch_bytes();
    need = wsz.used() + ksz.used() + work_bytes + kDeviceSlackBytes;
    size_t total_bytes = 0;
    TROUPE_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    auto oom = [&](const std::string& detail) {
      return Error{static_cast<int>(Errc::kOutOfMemory),
                   strfmt("GpuEngine: out of device memory on GPU %d: needs %.1f MiB (weights "
                          "%.1f, KV pool %.1f, workspace %.1f, slack %.1f), %.1f MiB free%s",
                          opts.device, mib(need), mib(wsz.used()), mib(ksz.used()), mib(work_bytes),
                          mib(kDeviceSlackBytes), mib(free_bytes), detail.c_str())};
    };
    if (need > free_bytes) return oom("");

    try {
      m.streams = std::make_unique<StreamPair>();
      TROUPE_CUDA_CHECK(cudaEventCreate(&m.ev_start));
      TROUPE_CUDA_CHECK(cudaEventCreate(&m.ev_stop));
      TROUPE_CUDA_CHECK(
          cudaMallocHost(reinterpret_cast<void**>(&m.in_host), m.in_cap.total * (m.tp ? 2 : 1)));
      if (m.tp)
        for (cudaEvent_t& e : m.ev_summed)
          TROUPE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      m.weights = Arena(wsz.used());
      m.kv = Arena(ksz.used());
      m.work = Arena(work_bytes);
      {
        Uploader up(m.streams->compute());
        m.place_weights(m.weights, &up);
      }
      m.place_kv(m.kv);
      if (m.kv.capacity() > 0)
        TROUPE_CUDA_CHECK(cudaMemsetAsync(m.layers[0].k, 0, m.kv.capacity(), m.streams->compute()));
      m.carve_work(m.work);
      TROUPE_CUDA_CHECK(cudaStreamSynchronize(m.streams->compute()));
    } catch (const DeviceError& ex) {
      if (ex.code() == Errc::kOutOfMemory) return oom(std::string(": ") + ex.what());
      throw;
    }
    m.gemmer = std::make_unique<Gemm>(m.w.gemm_ws, Gemm::kDefaultWorkspaceBytes);
    if (m.any_moe)
      m.moe_fwd = std::make_unique<MoeForward>(MoeRouting::from_spec(s), m.gemmer.get());
    m.alloc = std::make_unique<compute::BlockAllocator>(m.num_blocks);
    m.graphs_allowed = !m.any_moe && m.tp == nullptr;
    return std::unique_ptr<GpuEngine>(new GpuEngine(std::move(impl)));
  } catch (const DeviceError& ex) {
    return Error{static_cast<int>(ex.code()), ex.what()};
  } catch (const std::exception& ex) {
    return Error{kErrBadInput, ex.what()};
  }
}

}  // namespace troupe::gpu
