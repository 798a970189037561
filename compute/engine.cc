// The CPU forward pass: embeddings, attention (GQA or MLA) over paged KV, dense or MoE FFN,
// output head. Every per-token result is computed by code whose reduction order depends only on
// that token's inputs, so batching, chunking and threads never change a bit.
#include "compute/engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "base/check.h"
#include "compute/detail/engine_scratch.h"
#include "compute/detail/ops.h"
#include "compute/ffn.h"
#include "compute/matmul.h"
#include "compute/moe_route.h"
#include "compute/thread_pool.h"
#include "compute/vec_ops.h"
#include "model/rope.h"

namespace troupe::compute {

using detail::f32;
using detail::grow;
using detail::head_part;
using model::LayerSpec;
using model::ModelSpec;
using model::WeightView;

namespace {

// Each of n rows of y (width e) RMS-normalized in place by w (a no-op without w).
void post_norm(const WeightView& w, float* y, int64_t n, int64_t e, float eps) {
  if (!w.present()) return;
  for (int64_t r = 0; r < n; ++r) detail::rms_norm(y + r * e, f32(w), y + r * e, e, eps);
}

// How many positions the token at `pos` of step q attends to: those up to itself, or with
// non_causal every position of the step.
int64_t keys_seen(const SeqStep& q, int64_t pos) {
  return q.non_causal ? q.pos0 + static_cast<int64_t>(q.tokens.size()) : pos + 1;
}

// The KV view of KV head `head` of one sequence at layer l: its blocks, in position order (MLA:
// head 0, the value the key's latent prefix).
KvView kv_view(KvCache& kv, int64_t l, const SeqStep& q, int64_t n, int64_t head, bool mla,
               std::vector<const void*>& blocks) {
  const int64_t bs = kv.block_size(), nb = (n + bs - 1) / bs;
  blocks.resize(static_cast<size_t>(nb));
  for (int64_t b = 0; b < nb; ++b)
    blocks[static_cast<size_t>(b)] = kv.block(l, q.blocks[static_cast<size_t>(b)]);
  KvView v;
  v.blocks = blocks.data();
  v.type = kv.config().type;
  v.block_size = bs;
  v.k_offset = kv.k_offset(head);
  v.k_stride = kv.k_stride();
  v.v_offset = mla ? v.k_offset : kv.v_offset(head);
  v.v_stride = mla ? v.k_stride : kv.v_stride();
  v.k_by_dim = kv.config().k_by_dim;
  return v;
}

}  // namespace

Engine::~Engine() = default;

int Engine::n_threads() const { return pool_->size(); }

const ThreadPool& Engine::pool() const { return *pool_; }

Result<std::unique_ptr<Engine>> Engine::create(std::shared_ptr<const model::Model> model,
                                               const EngineOptions& opts) {
  try {
    if (!model) return Error{1, "engine: no model"};
    if (opts.n_threads < 1 || opts.n_threads > 1024)
      return Error{1, strfmt("engine: thread count %d must be in 1..1024", opts.n_threads)};
    if (opts.kv_block_size < 1 || opts.kv_block_size > 4096)
      return Error{1, "engine: KV block size must be in 1..4096"};
    if (opts.max_recurrent_seqs < 1 || opts.max_recurrent_seqs > 65536)
      return Error{1, "engine: max_recurrent_seqs must be in 1..65536"};
    // Norm and bias weights are read as f32 directly; anything else is a bad file.
    const ModelSpec& s = model->spec;
    auto need_f32 = [&](const WeightView& w) -> bool {
      return !w.present() || w.type == model::GgmlType::kF32;
    };
    bool ok = need_f32(s.output_norm) && need_f32(s.hc_head_fn) && need_f32(s.hc_head_base) &&
              need_f32(s.hc_head_scale);
    for (const LayerSpec& L : s.layers) {
      ok = ok && need_f32(L.attn_norm) && need_f32(L.ffn_norm) && need_f32(L.bq) &&
           need_f32(L.bk) && need_f32(L.bv) && need_f32(L.q_norm) && need_f32(L.k_norm) &&
           need_f32(L.q_a_norm) && need_f32(L.kv_a_norm) && need_f32(L.router_bias) &&
           need_f32(L.bo) && need_f32(L.sinks) && need_f32(L.router_logit_bias) &&
           need_f32(L.shared.gate_b) && need_f32(L.shared.up_b) && need_f32(L.shared.down_b) &&
           need_f32(L.attn_post_norm) && need_f32(L.ffn_post_norm) && need_f32(L.idx_k_norm) &&
           need_f32(L.idx_k_norm_b) && need_f32(L.ssm_conv) && need_f32(L.ssm_dt) &&
           need_f32(L.ssm_a) && need_f32(L.ssm_norm) && need_f32(L.hc_attn_fn) &&
           need_f32(L.hc_attn_base) && need_f32(L.hc_attn_scale) && need_f32(L.hc_ffn_fn) &&
           need_f32(L.hc_ffn_base) && need_f32(L.hc_ffn_scale) && need_f32(L.cmp_ape) &&
           need_f32(L.cmp_norm) && need_f32(L.idx_cmp_ape) && need_f32(L.idx_cmp_norm);
      for (const model::ExpertFfn& X : L.experts)
        ok = ok && need_f32(X.gate_b) && need_f32(X.up_b) && need_f32(X.down_b);
    }
    if (!ok) return Error{1, model->path + ": norm and bias weights must be f32"};

    LayerRange range = opts.range;
    if (range.end < 0) range.end = s.n_layer;
    if (range.begin < 0 || range.begin >= range.end || range.end > s.n_layer)
      return Error{1, strfmt("engine: layer range [%lld, %lld) is not inside [0, %lld)",
                             static_cast<long long>(range.begin), static_cast<long long>(range.end),
                             static_cast<long long>(s.n_layer))};
    if (s.layers[static_cast<size_t>(range.begin)].idx_shared)
      return Error{1,
                   strfmt("engine: layer %lld reuses the positions an earlier layer's indexer "
                          "chose, so the layers [%lld, %lld) cannot start there: a stage "
                          "must start at a layer with its own indexer",
                          static_cast<long long>(range.begin), static_cast<long long>(range.begin),
                          static_cast<long long>(range.end))};
    std::unique_ptr<Engine> e(new Engine());
    e->model_ = std::move(model);
    e->pool_ = std::make_unique<ThreadPool>(opts.n_threads);
    e->range_ = range;
    e->local_experts_ = std::make_unique<ExpertCompute>(e->model_, e->pool_.get());
    e->experts_ = opts.expert_runner ? opts.expert_runner : e->local_experts_.get();
    // KV rows for the attention layers only; a linear-attention layer keeps a recurrent state
    // per sequence instead (its floats at state_offset_ in each state).
    int64_t n_kv_layers = 0;
    for (int64_t il = range.begin; il < range.end; ++il) {
      const bool rec = s.layers[static_cast<size_t>(il)].recurrent;
      e->kv_layer_.push_back(rec ? -1 : n_kv_layers++);
      e->state_offset_.push_back(rec ? e->state_floats_ : -1);
      if (rec) e->state_floats_ += s.ssm_state_floats();
    }
    const int64_t num_blocks =
        opts.kv_num_blocks > 0
            ? opts.kv_num_blocks
            : (opts.max_tokens_in_cache + opts.kv_block_size - 1) / opts.kv_block_size;
    e->kv_ = std::make_unique<KvCache>(
        kv_cache_config(s, range, opts.kv_block_size, num_blocks, opts.kv_type));
    e->alloc_ = std::make_unique<BlockAllocator>(num_blocks);
    e->s_ = std::make_unique<Scratch>();
    if (e->state_floats_ > 0) e->max_states_ = std::max<int64_t>(0, opts.max_recurrent_seqs);
    e->s_->rope = model::rope_frequencies(s, opts.max_positions);
    for (int64_t il = range.begin; il < range.end; ++il)
      e->s_->any_local_rope = e->s_->any_local_rope || s.layers[static_cast<size_t>(il)].local_rope;
    if (e->s_->any_local_rope) e->s_->rope_local = model::rope_frequencies_local(s);
    if (s.is_v4()) {
      for (int64_t il = range.begin; il < range.end; ++il) {
        const LayerSpec& L = s.layers[static_cast<size_t>(il)];
        auto& groups = e->s_->wo_a_groups.emplace_back();
        for (int64_t g = 0; g < s.o_groups; ++g) groups.push_back(L.wo_a.slice(g));
      }
    }
    if (s.is_mla()) {
      for (int64_t il = range.begin; il < range.end; ++il) {
        const LayerSpec& L = s.layers[static_cast<size_t>(il)];
        auto& kb = e->s_->k_b_heads.emplace_back();
        auto& vb = e->s_->v_b_heads.emplace_back();
        for (int64_t hh = 0; hh < s.n_head; ++hh) {
          kb.push_back(L.wk_b.slice(hh));
          vb.push_back(L.wv_b.slice(hh));
        }
      }
    }
    return e;
  } catch (const std::exception& ex) {
    return Error{1, ex.what()};
  }
}

Status Engine::step(std::span<const SeqStep> seqs, StepResult* out, const float* hidden_in,
                    std::vector<float>* hidden_out) {
  const ModelSpec& s = spec();
  if (!range_.embed && hidden_in == nullptr)
    return Error{1, "step: this stage does not embed: hidden states are required"};
  if (!range_.head && hidden_out == nullptr)
    return Error{1, "step: this stage has no output head: a hidden-state buffer is required"};
  const int64_t bs = kv_->block_size();
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SeqStep& q = seqs[i];
    if (q.pos0 < 0) return Error{1, strfmt("step: sequence %zu has negative position", i)};
    if (q.tokens.empty()) return Error{1, strfmt("step: sequence %zu has no tokens", i)};
    int64_t n_embedded = 0;
    for (int32_t t : q.tokens) {
      if (t == SeqStep::kEmbedded) {
        ++n_embedded;
        continue;
      }
      if (t < 0 || t >= s.n_vocab)
        return Error{
            1, strfmt("step: sequence %zu: token id %d is outside the vocabulary (0..%lld)", i, t,
                      static_cast<long long>(s.n_vocab - 1))};
    }
    // A stage after the first takes hidden states: its tokens only place positions, and image
    // positions come without rows.
    const int64_t rows = range_.embed ? n_embedded : 0;
    if (static_cast<int64_t>(q.embd.size()) != rows * s.n_embd)
      return Error{1, strfmt("step: sequence %zu has %lld embedded positions (n_embd %lld) but "
                             "%zu embedding values%s",
                             i, static_cast<long long>(rows), static_cast<long long>(s.n_embd),
                             q.embd.size(), range_.embed ? "" : " (this stage does not embed)")};
    const int64_t end = q.pos0 + static_cast<int64_t>(q.tokens.size());
    const int64_t need = (end + bs - 1) / bs;
    if (static_cast<int64_t>(q.blocks.size()) < need)
      return Error{
          1, strfmt("step: sequence %zu needs %lld KV blocks for %lld positions, has %zu", i,
                    static_cast<long long>(need), static_cast<long long>(end), q.blocks.size())};
    for (int64_t b = 0; b < need; ++b)
      if (q.blocks[static_cast<size_t>(b)] < 0 ||
          q.blocks[static_cast<size_t>(b)] >= kv_->num_blocks())
        return Error{1, strfmt("step: sequence %zu: block id %d out of range", i,
                               q.blocks[static_cast<size_t>(b)])};
  }
  if (needs_state()) {
    Status st = check_states(seqs);
    if (!st) return st;
    // A step at position 0 starts its state afresh, now its owner's (a slot the caller assigns
    // comes into being with that first step).
    for (const SeqStep& q : seqs) {
      if (q.pos0 != 0) continue;
      if (q.state >= static_cast<int32_t>(states_.size()))
        states_.resize(static_cast<size_t>(q.state) + 1);
      RecurrentState& r = states_[static_cast<size_t>(q.state)];
      r.data.assign(static_cast<size_t>(state_floats_), 0.0f);
      r.owner = q.state_owner;
    }
  }
  try {
    forward(seqs, out, hidden_in, hidden_out);
    if (needs_state())
      for (const SeqStep& q : seqs)
        states_[static_cast<size_t>(q.state)].pos = q.pos0 + static_cast<int64_t>(q.tokens.size());
    return Ok{};
  } catch (const std::exception& ex) {
    // A state the step may have half updated must start again from position 0.
    if (needs_state())
      for (const SeqStep& q : seqs) states_[static_cast<size_t>(q.state)].pos = -1;
    return Error{2, ex.what()};
  }
}

Status Engine::check_states(std::span<const SeqStep> seqs) const {
  std::vector<int32_t> seen;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SeqStep& q = seqs[i];
    if (q.state < 0 || q.state >= max_states_)
      return Error{1, strfmt("step: sequence %zu names recurrent state %d, outside [0, %lld): this "
                             "model's linear-attention layers need a state slot per sequence "
                             "(Engine::acquire_state)",
                             i, q.state, static_cast<long long>(max_states_))};
    if (std::find(seen.begin(), seen.end(), q.state) != seen.end())
      return Error{1, strfmt("step: sequence %zu shares recurrent state %d with an earlier one", i,
                             q.state)};
    seen.push_back(q.state);
    const bool used = q.state < static_cast<int32_t>(states_.size());
    const int64_t held = used ? states_[static_cast<size_t>(q.state)].pos : -1;
    const int64_t owner = used ? states_[static_cast<size_t>(q.state)].owner : -1;
    if (q.pos0 != 0 && q.state_owner >= 0 && q.state_owner != owner)
      return Error{1, strfmt("step: sequence %zu (owner %lld) continues recurrent state %d, which "
                             "holds the positions of owner %lld",
                             i, static_cast<long long>(q.state_owner), q.state,
                             static_cast<long long>(owner))};
    if (q.pos0 != 0 && q.pos0 != held)
      return Error{1, strfmt("step: sequence %zu starts at position %lld, but its recurrent "
                             "state holds %lld positions (a recurrent layer cannot skip or "
                             "revisit positions: start again at 0)",
                             i, static_cast<long long>(q.pos0), static_cast<long long>(held))};
    if (q.non_causal)
      return Error{1, strfmt("step: sequence %zu is non-causal, which recurrent layers cannot "
                             "compute",
                             i)};
  }
  return Ok{};
}

Result<int32_t> Engine::acquire_state() {
  if (!needs_state()) return Error{1, "engine: this model keeps no recurrent state"};
  for (int64_t i = 0; i < max_states_; ++i) {
    if (i == static_cast<int64_t>(states_.size())) states_.emplace_back();
    RecurrentState& r = states_[static_cast<size_t>(i)];
    if (r.held) continue;
    r.held = true;  // its first step starts at 0, which sizes and zeroes the floats (step)
    return static_cast<int32_t>(i);
  }
  return Error{1, strfmt("engine: all %lld recurrent states are held (EngineOptions::"
                         "max_recurrent_seqs)",
                         static_cast<long long>(max_states_))};
}

void Engine::release_state(int32_t state) {
  if (state < 0 || state >= static_cast<int32_t>(states_.size())) return;
  states_[static_cast<size_t>(state)].held = false;
  states_[static_cast<size_t>(state)].pos = -1;
}

KvCacheConfig kv_cache_config(const model::ModelSpec& s, const LayerRange& range,
                              int64_t block_size, int64_t num_blocks, KvType type) {
  const int64_t end = range.end < 0 ? s.n_layer : range.end;
  int64_t n_kv_layers = 0;
  for (int64_t il = std::max<int64_t>(0, range.begin); il < std::min(end, s.n_layer); ++il)
    if (!s.layers[static_cast<size_t>(il)].recurrent) ++n_kv_layers;
  KvCacheConfig kc;
  kc.n_layer = std::max<int64_t>(1, n_kv_layers);
  kc.k_width = s.kv_k_width();
  kc.v_width = s.kv_v_width();
  kc.heads = s.is_mla() ? 1 : s.n_head_kv;
  kc.block_size = block_size;
  kc.num_blocks = num_blocks;
  kc.type = type;
  // MLA's values are read from its keys' rows; DeepSeek-V4's rows are read field by field.
  kc.k_by_dim = !s.is_mla() && !s.is_v4();
  return kc;
}

uint64_t recurrent_state_bytes(const model::ModelSpec& s, const LayerRange& range) {
  const int64_t end = range.end < 0 ? s.n_layer : range.end;
  uint64_t floats = 0;
  for (int64_t il = std::max<int64_t>(0, range.begin); il < std::min(end, s.n_layer); ++il)
    if (s.layers[static_cast<size_t>(il)].recurrent)
      floats += static_cast<uint64_t>(s.ssm_state_floats());
  return floats * sizeof(float);
}

uint64_t Engine::state_bytes() const {
  uint64_t n = 0;
  for (const RecurrentState& r : states_) n += r.data.capacity() * sizeof(float);
  return n;
}

int64_t Engine::state_positions(int32_t state) const {
  if (state < 0 || state >= static_cast<int32_t>(states_.size())) return -1;
  return states_[static_cast<size_t>(state)].pos;
}

void Engine::forward(std::span<const SeqStep> seqs, StepResult* out, const float* hidden_in,
                     std::vector<float>* hidden_out) {
  const ModelSpec& s = spec();
  Scratch& S = *s_;
  const int64_t E = s.n_embd, HW = s.hidden_width();
  int64_t T = 0;
  for (const SeqStep& q : seqs) T += static_cast<int64_t>(q.tokens.size());
  S.T = T;
  S.seqs = seqs;
  S.tok_pos.resize(static_cast<size_t>(T));
  S.tok_seq.resize(static_cast<size_t>(T));
  S.seq_first.resize(seqs.size() + 1);
  {
    int64_t t = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      S.seq_first[i] = t;
      for (size_t j = 0; j < seqs[i].tokens.size(); ++j, ++t) {
        S.tok_pos[static_cast<size_t>(t)] = seqs[i].pos0 + static_cast<int64_t>(j);
        S.tok_seq[static_cast<size_t>(t)] = static_cast<int32_t>(i);
      }
    }
    S.seq_first[seqs.size()] = t;
  }
  grow(S.x, T * HW);
  grow(S.h, T * E);
  grow(S.tmp, T * E);
  // Rotary cos/sin once per token for all layers and heads (model/rope.h: scaling applied).
  const int64_t half = s.n_rot / 2;
  grow(S.rope_cos, T * half);
  grow(S.rope_sin, T * half);
  const std::span<const int64_t> positions(S.tok_pos.data(), static_cast<size_t>(T));
  model::rope_cos_sin(S.rope, positions, S.rope_cos.data(), S.rope_sin.data());
  if (S.any_local_rope) {
    grow(S.rope_cos_local, T * half);
    grow(S.rope_sin_local, T * half);
    model::rope_cos_sin(S.rope_local, positions, S.rope_cos_local.data(), S.rope_sin_local.data());
  }
  if (range_.embed) {
    int64_t t = 0;
    for (const SeqStep& q : seqs) {
      const float* row = q.embd.data();  // the next embedded position's input row
      for (int32_t id : q.tokens) {
        float* x = &S.x[static_cast<size_t>(t++ * E)];
        if (id == SeqStep::kEmbedded) {
          std::memcpy(x, row, static_cast<size_t>(E) * sizeof(float));
          row += E;
          continue;
        }
        get_row(s.token_embd, id, x);
        if (s.embd_scale != 1.0f)
          for (int64_t i = 0; i < E; ++i) x[i] *= s.embd_scale;
      }
    }
    if (HW != E)  // DeepSeek-V4: every stream starts as the embedding
      for (int64_t t = T - 1; t >= 0; --t)
        for (int64_t j = HW / E - 1; j >= 0; --j)
          std::memmove(&S.x[t * HW + j * E], &S.x[t * E], static_cast<size_t>(E) * sizeof(float));
  } else {
    std::memcpy(S.x.data(), hidden_in, static_cast<size_t>(T * HW) * sizeof(float));
  }
  if (s.is_v4()) {
    S.tok_id.clear();
    for (const SeqStep& q : seqs) S.tok_id.insert(S.tok_id.end(), q.tokens.begin(), q.tokens.end());
  }

  for (int64_t il = range_.begin; il < range_.end; ++il) {
    if (s.is_v4()) {
      layer_v4(il, seqs);
      continue;
    }
    const LayerSpec& L = s.layers[static_cast<size_t>(il)];
    const float* an = f32(L.attn_norm);
    for (int64_t t = 0; t < T; ++t) detail::rms_norm(&S.x[t * E], an, &S.h[t * E], E, s.rms_eps);
    if (L.recurrent) {
      linear_attention(il, seqs);
    } else if (s.is_mla()) {
      attention_mla(il, seqs);
    } else {
      attention(il, seqs);
    }
    matmul(L.wo, S.attn.data(), T, S.tmp.data(), pool_.get());
    add_rows(L.bo, S.tmp.data(), T);
    post_norm(L.attn_post_norm, S.tmp.data(), T, E, s.rms_eps);
    for (int64_t i = 0; i < T * E; ++i) S.x[i] += S.tmp[i];
    const float* fn = f32(L.ffn_norm);
    for (int64_t t = 0; t < T; ++t) detail::rms_norm(&S.x[t * E], fn, &S.h[t * E], E, s.rms_eps);
    if (L.is_moe) {
      moe(il);
    } else {
      ffn(il);
    }
    post_norm(L.ffn_post_norm, S.tmp.data(), T, E, s.rms_eps);
    for (int64_t i = 0; i < T * E; ++i) S.x[i] += S.tmp[i];
  }

  // Output head for the rows that asked for logits.
  out->n_vocab = s.n_vocab;
  if (!range_.head) {
    hidden_out->assign(S.x.begin(), S.x.begin() + T * HW);
    out->row_begin.assign(seqs.size(), 0);
    out->row_count.assign(seqs.size(), 0);
    out->logits.clear();
    return;
  }
  out->row_begin.assign(seqs.size(), 0);
  out->row_count.assign(seqs.size(), 0);
  std::vector<int64_t> rows;
  {
    int64_t t = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const int64_t n = static_cast<int64_t>(seqs[i].tokens.size());
      out->row_begin[i] = static_cast<int64_t>(rows.size());
      if (seqs[i].logits == SeqStep::Logits::kAll) {
        for (int64_t j = 0; j < n; ++j) rows.push_back(t + j);
        out->row_count[i] = n;
      } else if (seqs[i].logits == SeqStep::Logits::kLast) {
        rows.push_back(t + n - 1);
        out->row_count[i] = 1;
      }
      t += n;
    }
  }
  const int64_t R = static_cast<int64_t>(rows.size());
  out->logits.resize(static_cast<size_t>(R * s.n_vocab));
  if (R == 0) return;
  if (s.is_v4()) {
    head_v4(rows);
  } else {
    const float* on = f32(s.output_norm);
    for (int64_t r = 0; r < R; ++r)
      detail::rms_norm(&S.x[rows[r] * E], on, &S.h[r * E], E, s.rms_eps);
  }
  matmul(s.output, S.h.data(), R, out->logits.data(), pool_.get());
  if (s.final_logit_softcap > 0) {
    const float c = s.final_logit_softcap;
    for (float& z : out->logits) z = c * std::tanh(z / c);
  }
}

void Engine::attention(int64_t il, std::span<const SeqStep> seqs) {
  const ModelSpec& s = spec();
  const LayerSpec& L = s.layers[static_cast<size_t>(il)];
  Scratch& S = *s_;
  const int64_t T = S.T;
  const int64_t H = s.n_head, HK = s.n_head_kv, dk = s.head_dim_k, dv = s.head_dim_v;
  const int64_t qw = H * dk, kw = HK * dk, vw = HK * dv;
  grow(S.q, T * qw);
  grow(S.k, T * kw);
  grow(S.v, T * vw);
  grow(S.attn, T * H * dv);
  // Qwen3-Next: each head's q rows are followed by as many gate rows; the two are split apart.
  if (L.attn_gate) grow(S.lin_in, T * 2 * qw);
  const MatmulTarget qkv[] = {{L.wq, L.attn_gate ? S.lin_in.data() : S.q.data(), L.wq.rows()},
                              {L.wk, S.k.data(), L.wk.rows()},
                              {L.wv, S.v.data(), L.wv.rows()}};
  matmul_shared(qkv, S.h.data(), L.wq.cols(), T, pool_.get());
  if (L.attn_gate) {
    grow(S.attn_gate, T * qw);
    for (int64_t th = 0; th < T * H; ++th) {
      const float* src = &S.lin_in[th * 2 * dk];
      std::memcpy(&S.q[th * dk], src, static_cast<size_t>(dk) * sizeof(float));
      std::memcpy(&S.attn_gate[th * dk], src + dk, static_cast<size_t>(dk) * sizeof(float));
    }
  }
  add_rows(L.bq, S.q.data(), T);
  add_rows(L.bk, S.k.data(), T);
  add_rows(L.bv, S.v.data(), T);
  // q/k RMSNorm per head (Qwen3, GLM: weights [head_dim]) or over all heads of a token at once
  // (MiniMax-M2: weights [heads * head_dim]); either way rows of the weights' width.
  auto qk_norm = [&](const WeightView& w, std::vector<float>& y, int64_t width) {
    if (!w.present()) return;
    const int64_t n = w.cols();
    for (int64_t r = 0; r < T * width / n; ++r)
      detail::rms_norm(&y[r * n], f32(w), &y[r * n], n, s.rms_eps);
  };
  qk_norm(L.q_norm, S.q, qw);
  qk_norm(L.k_norm, S.k, kw);
  const bool neox = s.rope_style == model::RopeStyle::kNeox;
  const int64_t bs = kv_->block_size();
  const std::vector<float>& rc = L.local_rope ? S.rope_cos_local : S.rope_cos;
  const std::vector<float>& rs = L.local_rope ? S.rope_sin_local : S.rope_sin;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t pos = S.tok_pos[static_cast<size_t>(t)];
    const float* cs = &rc[t * (s.n_rot / 2)];
    const float* sn = &rs[t * (s.n_rot / 2)];
    if (!L.nope) {
      for (int64_t hh = 0; hh < H; ++hh)
        detail::rope_cs(&S.q[t * qw + hh * dk], s.n_rot, cs, sn, neox);
      for (int64_t hh = 0; hh < HK; ++hh)
        detail::rope_cs(&S.k[t * kw + hh * dk], s.n_rot, cs, sn, neox);
    } else if (s.attn_temp_scale != 0.0f) {  // Llama 4's NoPE layers, far into the context
      const double steps =
          std::floor(static_cast<double>(pos + 1) / static_cast<double>(s.attn_temp_floor));
      const auto m = static_cast<float>(std::log(steps + 1.0) * s.attn_temp_scale + 1.0);
      if (m != 1.0f)
        for (int64_t i = 0; i < qw; ++i) S.q[t * qw + i] *= m;
    }
    if (L.qk_l2_norm) {
      for (int64_t hh = 0; hh < H; ++hh)
        detail::rms_norm_plain(&S.q[t * qw + hh * dk], &S.q[t * qw + hh * dk], dk, s.rms_eps);
      for (int64_t hh = 0; hh < HK; ++hh)
        detail::rms_norm_plain(&S.k[t * kw + hh * dk], &S.k[t * kw + hh * dk], dk, s.rms_eps);
    }
    const SeqStep& q = seqs[static_cast<size_t>(S.tok_seq[static_cast<size_t>(t)])];
    const int32_t blk = q.blocks[static_cast<size_t>(pos / bs)];
    kv_->store(kv_layer(il), blk, pos % bs, 0, &S.k[t * kw], kw);
    kv_->store(kv_layer(il), blk, pos % bs, kv_->config().k_width, &S.v[t * vw], vw);
  }
  const float scale =
      static_cast<float>(s.kq_scale_mult * (1.0f / std::sqrt(static_cast<float>(dk))));
  const int64_t group = H / HK, part = head_part(group, T, H, pool_->size()), parts = H / part;
  const int64_t l = kv_layer(il);
  const float* sinks = L.sinks.present() ? f32(L.sinks) : nullptr;
  pool_->parallel_for(T * parts, 1, [&](int64_t b, int64_t e) {
    thread_local std::vector<const void*> blocks;
    for (int64_t tp = b; tp < e; ++tp) {
      const int64_t t = tp / parts, h0 = tp % parts * part, kvh = h0 / group;
      const int64_t pos = S.tok_pos[static_cast<size_t>(t)];
      const SeqStep& q = seqs[static_cast<size_t>(S.tok_seq[static_cast<size_t>(t)])];
      const int64_t n_keys = keys_seen(q, pos);
      KvView kv = kv_view(*kv_, l, q, n_keys, kvh, false, blocks);
      if (L.window > 0) kv.first = std::max<int64_t>(0, pos + 1 - L.window);
      if (L.chunk > 0) kv.first = pos / L.chunk * L.chunk;
      if (sinks != nullptr) kv.sinks = sinks + h0;
      attend_heads(&S.q[t * qw + h0 * dk], dk, part, dk, kv, n_keys, scale, dv,
                   &S.attn[t * H * dv + h0 * dv], dv);
    }
  });
  if (L.attn_gate)  // head_dim_k == head_dim_v (validate_spec)
    for (int64_t i = 0; i < T * qw; ++i) S.attn[i] *= detail::sigmoid(S.attn_gate[i]);
}

void Engine::attention_mla(int64_t il, std::span<const SeqStep> seqs) {
  const ModelSpec& s = spec();
  const LayerSpec& L = s.layers[static_cast<size_t>(il)];
  Scratch& S = *s_;
  const int64_t T = S.T;
  const int64_t H = s.n_head, nope = s.qk_nope_dim, rope = s.qk_rope_dim, lora = s.kv_lora_rank;
  const int64_t dqk = nope + rope, kw = lora + rope, dv = s.v_head_dim;
  grow(S.q, T * H * dqk);
  grow(S.kva, T * kw);
  if (L.wq_a.present()) {  // q's and the KV latent's down-projections of h in one run
    grow(S.qa, T * s.q_lora_rank);
    const MatmulTarget down[] = {{L.wq_a, S.qa.data(), s.q_lora_rank}, {L.wkv_a, S.kva.data(), kw}};
    matmul_shared(down, S.h.data(), s.n_embd, T, pool_.get());
    const float* qn = f32(L.q_a_norm);
    for (int64_t t = 0; t < T; ++t)
      detail::rms_norm(&S.qa[t * s.q_lora_rank], qn, &S.qa[t * s.q_lora_rank], s.q_lora_rank,
                       s.rms_eps);
    matmul(L.wq_b, S.qa.data(), T, S.q.data(), pool_.get());
  } else {
    const MatmulTarget proj[] = {{L.wq, S.q.data(), H * dqk}, {L.wkv_a, S.kva.data(), kw}};
    matmul_shared(proj, S.h.data(), s.n_embd, T, pool_.get());
  }
  const float* kvn = f32(L.kv_a_norm);
  const int64_t bs = kv_->block_size();
  const bool neox = s.rope_style == model::RopeStyle::kNeox;
  for (int64_t t = 0; t < T; ++t) {
    float* row = &S.kva[t * kw];
    detail::rms_norm(row, kvn, row, lora, s.rms_eps);
    const int64_t pos = S.tok_pos[static_cast<size_t>(t)];
    const float* cs = &S.rope_cos[t * (rope / 2)];
    const float* sn = &S.rope_sin[t * (rope / 2)];
    detail::rope_cs(row + lora, rope, cs, sn, neox);
    for (int64_t hh = 0; hh < H; ++hh)
      detail::rope_cs(&S.q[(t * H + hh) * dqk + nope], rope, cs, sn, neox);
    const SeqStep& q = seqs[static_cast<size_t>(S.tok_seq[static_cast<size_t>(t)])];
    kv_->store(kv_layer(il), q.blocks[static_cast<size_t>(pos / bs)], pos % bs, 0, row, kw);
  }
  // A shared layer (GLM-5.2) keeps the choice the last full layer of this step made (S.sel):
  // create() refuses a range that starts with one.
  if (s.has_indexer() && !L.idx_shared) indexer(il, seqs);
  // Absorb k_b into the query: q_abs[t][h] = [wk_b[h] * q_nope[t][h], q_pe[t][h]], every
  // head's product in one run.
  const int64_t l = kv_layer(il);
  grow(S.qabs, T * H * kw);
  S.products.clear();
  for (int64_t hh = 0; hh < H; ++hh)
    S.products.push_back({&S.k_b_heads[static_cast<size_t>(l)][static_cast<size_t>(hh)],
                          &S.q[hh * dqk], H * dqk, T, &S.qabs[hh * kw], H * kw});
  matmul_many(S.products, pool_.get());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t hh = 0; hh < H; ++hh)
      std::memcpy(&S.qabs[(t * H + hh) * kw + lora], &S.q[(t * H + hh) * dqk + nope],
                  static_cast<size_t>(rope) * 4);
  grow(S.lat, T * H * lora);
  const float scale =
      static_cast<float>(s.kq_scale_mult * (1.0f / std::sqrt(static_cast<float>(dqk))));
  // MLA: keys are [latent, rope key] rows; values are the latent part of the same rows, and
  // every head shares them (one KV "head").
  const int64_t part = head_part(H, T, H, pool_->size(), 32), parts = H / part;
  pool_->parallel_for(T * parts, 1, [&](int64_t b, int64_t e) {
    thread_local std::vector<const void*> blocks;
    for (int64_t tp = b; tp < e; ++tp) {
      const int64_t t = tp / parts, h0 = tp % parts * part;
      const int64_t pos = S.tok_pos[static_cast<size_t>(t)];
      const SeqStep& q = seqs[static_cast<size_t>(S.tok_seq[static_cast<size_t>(t)])];
      const int64_t n_keys = keys_seen(q, pos);
      const auto t0 = static_cast<size_t>(t);
      const int64_t n_sel = s.has_indexer() ? S.sel_at[t0 + 1] - S.sel_at[t0] : 0;
      if (n_sel > 0) {  // DSA: only the positions the indexer chose, each its own block of one row
        blocks.resize(static_cast<size_t>(n_sel));
        const int64_t row_bytes = kw * kv_type_bytes(kv_->config().type);
        for (int64_t i = 0; i < n_sel; ++i) {
          const int32_t j = S.sel[static_cast<size_t>(S.sel_at[t0] + i)];
          blocks[static_cast<size_t>(i)] =
              kv_->block(l, q.blocks[static_cast<size_t>(j / bs)]) + (j % bs) * row_bytes;
        }
        KvView kv;
        kv.blocks = blocks.data();
        kv.type = kv_->config().type;
        kv.block_size = 1;
        kv.k_stride = kv.v_stride = kw;
        attend_heads(&S.qabs[(t * H + h0) * kw], kw, part, kw, kv, n_sel, scale, lora,
                     &S.lat[(t * H + h0) * lora], lora);
        continue;
      }
      const KvView kv = kv_view(*kv_, l, q, n_keys, 0, true, blocks);
      attend_heads(&S.qabs[(t * H + h0) * kw], kw, part, kw, kv, n_keys, scale, lora,
                   &S.lat[(t * H + h0) * lora], lora);
    }
  });
  grow(S.attn, T * H * dv);
  S.products.clear();
  for (int64_t hh = 0; hh < H; ++hh)
    S.products.push_back({&S.v_b_heads[static_cast<size_t>(l)][static_cast<size_t>(hh)],
                          &S.lat[hh * lora], H * lora, T, &S.attn[hh * dv], H * dv});
  matmul_many(S.products, pool_.get());
}

// DeepSeek-V3.2's lightning indexer, as llama.cpp's deepseek32 graph computes it (no FP8
// rounding of its queries and keys, whose Hadamard rotation then changes no score and is left
// out): each token's key, LayerNormed and rotated NeoX-style (GLM-5: in neighbouring pairs) on
// its first n_rot values, stored in the V part of its KV row; for each token that sees more
// than idx_top_k positions, the idx_top_k with the largest sum over heads of relu(q_h . k) * w_h
// (ties: the earlier), in position order. A token's choice depends on its own sequence only.
void Engine::indexer(int64_t il, std::span<const SeqStep> seqs) {
  const ModelSpec& s = spec();
  const LayerSpec& L = s.layers[static_cast<size_t>(il)];
  Scratch& S = *s_;
  const int64_t T = S.T, Hi = s.idx_n_head, Di = s.idx_head_dim, R = s.qk_rope_dim;
  const int64_t top = s.idx_top_k, kw = s.kv_k_width(), bs = kv_->block_size();
  const int64_t l = kv_layer(il);
  grow(S.iq, T * Hi * Di);
  grow(S.ik, T * Di);
  grow(S.iw, T * Hi);
  matmul(L.idx_wq_b, S.qa.data(), T, S.iq.data(), pool_.get());
  const MatmulTarget from_h[] = {{L.idx_wk, S.ik.data(), Di}, {L.idx_proj, S.iw.data(), Hi}};
  matmul_shared(from_h, S.h.data(), s.n_embd, T, pool_.get());
  const float* nw = f32(L.idx_k_norm);
  const float* nb = f32(L.idx_k_norm_b);
  // Both positive factors of the reference's weights (they change no choice).
  const float wscale = 1.0f / std::sqrt(static_cast<float>(Hi)) / std::sqrt(static_cast<float>(Di));
  S.sel_at.assign(static_cast<size_t>(T + 1), 0);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t pos = S.tok_pos[static_cast<size_t>(t)];
    const SeqStep& q = seqs[static_cast<size_t>(S.tok_seq[static_cast<size_t>(t)])];
    float* k = &S.ik[t * Di];
    detail::layer_norm(k, nw, nb, k, Di, 1e-6f);
    const float* cs = &S.rope_cos[t * (R / 2)];
    const float* sn = &S.rope_sin[t * (R / 2)];
    detail::rope_cs(k, R, cs, sn, s.idx_rope_neox);
    for (int64_t hh = 0; hh < Hi; ++hh) {
      detail::rope_cs(&S.iq[(t * Hi + hh) * Di], R, cs, sn, s.idx_rope_neox);
      S.iw[t * Hi + hh] *= wscale;
    }
    kv_->store(l, q.blocks[static_cast<size_t>(pos / bs)], pos % bs, kw, k, Di);
    const int64_t n_keys = keys_seen(q, pos);
    S.sel_at[static_cast<size_t>(t + 1)] =
        S.sel_at[static_cast<size_t>(t)] + (n_keys > top ? top : 0);
  }
  S.sel.resize(static_cast<size_t>(S.sel_at[static_cast<size_t>(T)]));
  // Per sequence of the step: its keys as one f32 matrix [n, Di] (n: the most any of its tokens
  // sees), then the head scores of its choosing tokens, a few at a time, as one product each
  // (batch-invariant: each score depends on its query and key rows only).
  constexpr int64_t kGroup = 8;  // choosing tokens per product
  for (int64_t t0 = 0; t0 < T;) {
    const int32_t si = S.tok_seq[static_cast<size_t>(t0)];
    int64_t t1 = t0;
    while (t1 < T && S.tok_seq[static_cast<size_t>(t1)] == si) ++t1;
    int64_t tc = t0;  // the first token of the sequence that chooses (the later ones do too)
    while (tc < t1 && S.sel_at[static_cast<size_t>(tc + 1)] == S.sel_at[static_cast<size_t>(tc)])
      ++tc;
    const SeqStep& q = seqs[static_cast<size_t>(si)];
    const int64_t n = keys_seen(q, S.tok_pos[static_cast<size_t>(t1 - 1)]);
    if (tc < t1) {
      grow(S.ikeys, n * Di);
      pool_->parallel_for(n, 64, [&](int64_t b, int64_t e) {
        for (int64_t j = b; j < e; ++j)
          kv_->load(l, q.blocks[static_cast<size_t>(j / bs)], j % bs, kw, Di, &S.ikeys[j * Di]);
      });
      WeightView keys;
      keys.name = L.idx_wk.name + " (cached keys)";
      keys.ne[0] = Di;
      keys.ne[1] = n;
      keys.data = reinterpret_cast<const uint8_t*>(S.ikeys.data());
      for (int64_t g0 = tc; g0 < t1; g0 += kGroup) {
        const int64_t g = std::min(kGroup, t1 - g0);
        grow(S.iscore, g * Hi * n);
        matmul(keys, &S.iq[g0 * Hi * Di], g * Hi, S.iscore.data(), pool_.get());
        pool_->parallel_for(g, 1, [&](int64_t b, int64_t e) {
          thread_local std::vector<float> score;
          thread_local std::vector<int32_t> order;
          for (int64_t u = b; u < e; ++u) {
            const int64_t t = g0 + u;
            const int64_t nt = keys_seen(q, S.tok_pos[static_cast<size_t>(t)]);
            score.assign(static_cast<size_t>(nt), 0.0f);
            for (int64_t hh = 0; hh < Hi; ++hh) {  // heads in order, for every position
              const float* d = &S.iscore[(u * Hi + hh) * n];
              const float w = S.iw[t * Hi + hh];
              for (int64_t j = 0; j < nt; ++j)
                score[static_cast<size_t>(j)] += std::max(0.0f, d[j]) * w;
            }
            order.resize(static_cast<size_t>(nt));
            for (int64_t j = 0; j < nt; ++j)
              order[static_cast<size_t>(j)] = static_cast<int32_t>(j);
            std::partial_sort(order.begin(), order.begin() + top, order.end(),
                              [&](int32_t x, int32_t y) {
                                const float a = score[static_cast<size_t>(x)];
                                const float c = score[static_cast<size_t>(y)];
                                return a > c || (a == c && x < y);
                              });
            std::sort(order.begin(), order.begin() + top);
            std::copy(
                order.begin(), order.begin() + top,
                S.sel.begin() + static_cast<std::ptrdiff_t>(S.sel_at[static_cast<size_t>(t)]));
          }
        });
      }
    }
    t0 = t1;
  }
}

// Qwen3-Next's Gated DeltaNet, as llama.cpp's qwen3next graph computes it, one token after
// another per sequence (never the chunked form: every token's arithmetic is the same whether
// its sequence was prefilled at once, in chunks or token by token, alone or in a batch):
//   q, k, v = silu(causal depthwise conv(x W_qkv)), z = x W_z, b and a = x W_ba;
//   per value head h (key head h / r; Qwen3.5's GGUF: h % nk): q, k L2-normalized, q / sqrt(dk);
//   beta = sigmoid(b_h), decay = exp(A_h * softplus(a_h + dt_h)) with A_h = -exp(A_log_h);
//   S = decay * S;  S += k (beta (v - S^T k))^T;  o = S^T q  (S: dk x dv, per sequence);
//   out = rmsnorm(o) * w * silu(z_h), then W_out (the layer's wo, in forward()).
// The sequence's state (the convolution's last kernel - 1 inputs, then S per head) lives in its
// recurrent state slot.
void Engine::linear_attention(int64_t il, std::span<const SeqStep> seqs) {
  const ModelSpec& s = spec();
  const LayerSpec& L = s.layers[static_cast<size_t>(il)];
  Scratch& S = *s_;
  const int64_t T = S.T, E = s.n_embd, nk = s.ssm_k_heads, nv = s.ssm_v_heads;
  const int64_t dk = s.ssm_k_dim, dv = s.ssm_v_dim, r = nv / nk, K = s.ssm_conv_kernel;
  const int64_t kw = nk * dk, vw = nv * dv, C = s.ssm_conv_dim();
  grow(S.lin_x, T * C);
  grow(S.lin_y, T * C);
  grow(S.lin_z, T * vw);
  grow(S.lin_ba, T * 2 * nv);
  grow(S.attn, T * vw);
  // b and a: per key head its r value heads' b, then their a (ssm_ba); or (Qwen3.5) every
  // head's b, then every head's a.
  const bool ba_apart = L.ssm_beta.present();
  const model::WeightView& w_b = ba_apart ? L.ssm_beta : L.ssm_ba;
  const MatmulTarget b_and_a[] = {{w_b, S.lin_ba.data(), 2 * nv},
                                  {L.ssm_alpha, S.lin_ba.data() + nv, 2 * nv}};
  const auto n_ba = static_cast<size_t>(ba_apart ? 2 : 1);
  if (L.ssm_in.present()) {  // per key head: q, k, its r heads' v, their z
    grow(S.lin_in, T * (C + vw));
    const MatmulTarget pr[] = {{L.ssm_in, S.lin_in.data(), C + vw}, b_and_a[0], b_and_a[1]};
    matmul_shared(std::span(pr, 1 + n_ba), S.h.data(), E, T, pool_.get());
    const int64_t gw = 2 * dk + 2 * r * dv;
    const auto f = [](int64_t n) { return static_cast<size_t>(n) * sizeof(float); };
    for (int64_t t = 0; t < T; ++t)
      for (int64_t g = 0; g < nk; ++g) {
        const float* in = &S.lin_in[t * (C + vw) + g * gw];
        float* x = &S.lin_x[t * C];
        std::memcpy(x + g * dk, in, f(dk));
        std::memcpy(x + kw + g * dk, in + dk, f(dk));
        std::memcpy(x + 2 * kw + g * r * dv, in + 2 * dk, f(r * dv));
        std::memcpy(&S.lin_z[t * vw + g * r * dv], in + 2 * dk + r * dv, f(r * dv));
      }
  } else {
    const MatmulTarget pr[] = {
        {L.ssm_qkv, S.lin_x.data(), C}, {L.ssm_z, S.lin_z.data(), vw}, b_and_a[0], b_and_a[1]};
    matmul_shared(std::span(pr, 2 + n_ba), S.h.data(), E, T, pool_.get());
  }
  const int64_t off = state_offset_[static_cast<size_t>(il - range_.begin)];
  const std::vector<int64_t>& first = S.seq_first;
  auto state_of = [&](size_t i) {
    return states_[static_cast<size_t>(seqs[i].state)].data.data() + off;
  };
  // The convolution, per sequence and block of channels, token after token (each token's row
  // read and written where it lies); then the blocks' conv state moves on to the last K - 1
  // inputs.
  const float* cw = f32(L.ssm_conv);
  constexpr int64_t kChannels = 64;
  static constexpr float kOnes[kChannels] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                             1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                             1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                             1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  const int64_t blocks = (C + kChannels - 1) / kChannels;
  pool_->parallel_for(static_cast<int64_t>(seqs.size()) * blocks, 1, [&](int64_t b, int64_t e) {
    for (int64_t item = b; item < e; ++item) {
      const auto i = static_cast<size_t>(item / blocks);
      const int64_t c0 = item % blocks * kChannels, c1 = std::min(C, c0 + kChannels);
      const int64_t t0 = first[i], n = first[i + 1] - t0;
      float* hist = state_of(i);     // [K - 1, C], oldest first
      auto input = [&](int64_t j) {  // token j's row of the step; j < 0: of the history
        return j >= 0 ? &S.lin_x[(t0 + j) * C] : &hist[(K - 1 + j) * C];
      };
      for (int64_t j = 0; j < n; ++j) {
        float* y = &S.lin_y[(t0 + j) * C];
        std::fill(y + c0, y + c1, 0.0f);
        for (int64_t m = 0; m < K; ++m) {
          const float* x = input(j - (K - 1) + m);
          for (int64_t c = c0; c < c1; ++c) y[c] += cw[c * K + m] * x[c];
        }
        silu_mul(y + c0, kOnes, c1 - c0);
      }
      // Row m of the new history is input n - (K - 1) + m: read before it is overwritten, since
      // n > 0 puts every history row read (n + m) after the rows written so far.
      for (int64_t m = 0; m < K - 1; ++m) {
        const float* x = input(n - (K - 1) + m);
        std::copy(x + c0, x + c1, hist + m * C + c0);
      }
    }
  });
  // The recurrence, per sequence and value head, token by token.
  const float* a_rate = f32(L.ssm_a);
  const float* dt = f32(L.ssm_dt);
  const float* nw = f32(L.ssm_norm);
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(dk));
  pool_->parallel_for(static_cast<int64_t>(seqs.size()) * nv, 1, [&](int64_t b, int64_t e) {
    thread_local std::vector<float> qn, kn, decay, beta;  // per token of the sequence
    for (int64_t item = b; item < e; ++item) {
      const auto i = static_cast<size_t>(item / nv);
      // The key head value head h reads: its group's (h / r), or in tiled order h % nk.
      const int64_t h = item % nv, g = s.ssm_tiled ? h % nk : h / r;
      const int64_t b_at = ba_apart ? h : h / r * 2 * r + h % r;  // b's place in lin_ba's row
      const int64_t a_at = ba_apart ? nv + h : b_at + r;
      const int64_t t0 = first[i], n = first[i + 1] - t0;
      qn.resize(static_cast<size_t>(n * dk));
      kn.resize(static_cast<size_t>(n * dk));
      decay.resize(static_cast<size_t>(n));
      beta.resize(static_cast<size_t>(n));
      for (int64_t j = 0; j < n; ++j) {
        const int64_t t = t0 + j;
        const float* y = &S.lin_y[t * C];
        // L2 norms as ggml_l2_norm: x / max(|x|, eps), the sum of squares in double.
        auto l2 = [&](const float* x, float* out, float mul) {
          const double ss = detail::dot_in<double>(x, x, dk);
          const float inv = mul / std::max(std::sqrt(static_cast<float>(ss)), s.rms_eps);
          for (int64_t d = 0; d < dk; ++d) out[d] = x[d] * inv;
        };
        l2(y + g * dk, &qn[static_cast<size_t>(j * dk)], q_scale);
        l2(y + kw + g * dk, &kn[static_cast<size_t>(j * dk)], 1.0f);
        const float aa = S.lin_ba[t * 2 * nv + a_at] + dt[h];
        const float softplus = aa > 20.0f ? aa : std::log1p(std::exp(aa));
        decay[static_cast<size_t>(j)] = std::exp(a_rate[h] * softplus);
        beta[static_cast<size_t>(j)] = detail::sigmoid(S.lin_ba[t * 2 * nv + b_at]);
      }
      float* st = state_of(i) + (K - 1) * C + h * dk * dv;  // [dk, dv]
      float* o0 = &S.attn[t0 * vw + h * dv];
      delta_rule_steps(st, dk, dv, n, kn.data(), qn.data(), &S.lin_y[t0 * C + 2 * kw + h * dv], C,
                       decay.data(), beta.data(), o0, vw);
      for (int64_t j = 0; j < n; ++j) {
        float* o = o0 + j * vw;
        detail::rms_norm(o, nw, o, dv, s.rms_eps);
        float* z = &S.lin_z[(t0 + j) * vw + h * dv];  // read once: it becomes silu(z) o, then o
        silu_mul(z, o, dv);
        std::copy(z, z + dv, o);
      }
    }
  });
}

void Engine::ffn(int64_t il) {
  const LayerSpec& L = spec().layers[static_cast<size_t>(il)];
  Scratch& S = *s_;
  model::ExpertFfn f;
  f.gate = L.ffn_gate;
  f.up = L.ffn_up;
  f.down = L.ffn_down;
  gated_ffn(spec(), f, S.h.data(), S.T, S.tmp.data(), S.gate, S.up, pool_.get());
}

void Engine::moe(int64_t il) {
  const ModelSpec& s = spec();
  const LayerSpec& L = s.layers[static_cast<size_t>(il)];
  Scratch& S = *s_;
  const int64_t T = S.T, E = s.n_embd, NE = s.n_expert, K = s.n_expert_used;
  grow(S.router, T * NE);
  matmul(L.router, S.h.data(), T, S.router.data(), pool_.get());
  S.sel_id.resize(static_cast<size_t>(T * K));
  S.sel_w.resize(static_cast<size_t>(T * K));
  route_experts(s, L, S.router.data(), T, S.sel_id.data(), S.sel_w.data(), S.tok_id.data());
  // Gather the rows routed to each expert, let the runner compute them, then weight.
  grow(S.slot_out, T * K * E);
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(NE));  // entries: t * K + k
  for (int64_t i = 0; i < T * K; ++i)
    rows[static_cast<size_t>(S.sel_id[static_cast<size_t>(i)])].push_back(i);
  int64_t total = 0;
  for (const auto& r : rows) total += static_cast<int64_t>(r.size());
  grow(S.xe, total * E);
  grow(S.de, total * E);
  std::vector<ExpertTask> tasks;
  int64_t at = 0;
  for (int64_t e = 0; e < NE; ++e) {
    const auto& r = rows[static_cast<size_t>(e)];
    if (r.empty()) continue;
    const int64_t n = static_cast<int64_t>(r.size());
    for (int64_t i = 0; i < n; ++i) {
      const int64_t slot = r[static_cast<size_t>(i)];
      float* xe = &S.xe[(at + i) * E];
      std::memcpy(xe, &S.h[(slot / K) * E], static_cast<size_t>(E) * 4);
      if (s.moe_weight_input) {  // Llama 4: the router's weight scales the expert's input
        const float w = S.sel_w[static_cast<size_t>(slot)];
        for (int64_t d = 0; d < E; ++d) xe[d] *= w;
      }
    }
    tasks.push_back(ExpertTask{static_cast<int32_t>(e), n, &S.xe[at * E], &S.de[at * E]});
    at += n;
  }
  // A shared expert computed here joins the routed ones' parallel sections.
  const bool shared = L.shared.gate.present();
  if (shared) grow(S.shared_out, T * E);
  const FfnTask shared_task{&L.shared, S.h.data(), T, S.shared_out.data()};
  const bool together = shared && experts_ == local_experts_.get();
  if (together)
    local_experts_->run_with(il, tasks, {&shared_task, 1});
  else
    experts_->run(il, tasks);
  at = 0;
  for (int64_t e = 0; e < NE; ++e) {
    const auto& r = rows[static_cast<size_t>(e)];
    for (size_t i = 0; i < r.size(); ++i, ++at) {
      const int64_t slot = r[i];
      if (s.moe_weight_input) {
        std::memcpy(&S.slot_out[slot * E], &S.de[at * E], static_cast<size_t>(E) * 4);
        continue;
      }
      const float w = S.sel_w[static_cast<size_t>(slot)];
      for (int64_t d = 0; d < E; ++d) S.slot_out[slot * E + d] = S.de[at * E + d] * w;
    }
  }
  for (int64_t t = 0; t < T; ++t) {
    float* y = &S.tmp[t * E];
    std::memcpy(y, &S.slot_out[(t * K) * E], static_cast<size_t>(E) * 4);
    for (int64_t k = 1; k < K; ++k)
      for (int64_t d = 0; d < E; ++d) y[d] += S.slot_out[(t * K + k) * E + d];
  }
  if (shared) {
    if (!together)
      gated_ffn(s, L.shared, S.h.data(), T, S.shared_out.data(), S.gate, S.up, pool_.get());
    for (int64_t t = 0; t < T; ++t) {
      float g = 1.f;
      if (L.shared_gate.present()) {
        float gl;
        matmul(L.shared_gate, &S.h[t * E], 1, &gl, nullptr);
        g = detail::sigmoid(gl);
      }
      for (int64_t d = 0; d < E; ++d) S.tmp[t * E + d] += S.shared_out[t * E + d] * g;
    }
  }
}

ExpertCompute::ExpertCompute(std::shared_ptr<const model::Model> model, ThreadPool* pool)
    : model_(std::move(model)), pool_(pool) {}

ExpertCompute::~ExpertCompute() = default;

void ExpertCompute::run(int64_t layer, std::span<const ExpertTask> tasks) {
  run_with(layer, tasks, {});
}

void ExpertCompute::run_with(int64_t layer, std::span<const ExpertTask> tasks,
                             std::span<const FfnTask> also) {
  const ModelSpec& s = model_->spec;
  TROUPE_CHECK(layer >= 0 && layer < s.n_layer, "expert layer %lld out of range",
               static_cast<long long>(layer));
  const LayerSpec& L = s.layers[static_cast<size_t>(layer)];
  std::vector<FfnTask> ffns;
  ffns.reserve(tasks.size() + also.size());
  for (const ExpertTask& t : tasks) {
    TROUPE_CHECK(t.expert >= 0 && t.expert < static_cast<int32_t>(L.experts.size()),
                 "expert %d out of range", t.expert);
    ffns.push_back({&L.experts[static_cast<size_t>(t.expert)], t.x, t.n_rows, t.y});
  }
  ffns.insert(ffns.end(), also.begin(), also.end());
  gated_ffns(s, ffns, gate_, up_, pool_);
}

Sequence::Sequence(Engine& engine) : engine_(engine) {
  if (!engine_.needs_state()) return;
  auto st = engine_.acquire_state();
  if (!st) throw std::runtime_error(st.error().message);
  state_ = *st;
}

Sequence::~Sequence() {
  engine_.blocks().release(blocks_);
  engine_.release_state(state_);
}

bool Sequence::reserve(int64_t n) {
  const int64_t bs = engine_.kv_cache().block_size();
  const int64_t need = (length_ + n + bs - 1) / bs - static_cast<int64_t>(blocks_.size());
  return need <= 0 || engine_.blocks().allocate(need, &blocks_);
}

SeqStep Sequence::next(std::span<const int32_t> tokens, SeqStep::Logits logits) const {
  SeqStep st;
  st.pos0 = length_;
  st.tokens = tokens;
  st.blocks = blocks_;
  st.logits = logits;
  st.state = state_;
  return st;
}

}  // namespace troupe::compute
