// DeepSeek-V4's layers on the CPU (Engine::layer_v4), as transformers' DeepseekV4 computes them:
// manifold-constrained hyper-connections into and out of each block, attention of one shared
// key-and-value head over a sliding window plus compressed entries, the MoE. Every per-token
// result depends on its own sequence only (batch-invariant, as compute/engine.cc).
//
// A layer's KV row per position (ModelSpec::v4_row): the rotated key; in a compressing
// layer, the entry of the window this position ends (written when it is the window's last) and
// the compressor's two projections of this position (gate already plus its position bias); with
// an indexer, the same three for the indexer's keys. Entries are pooled from rows, so chunked
// prefill, preemption and prefix sharing need nothing beyond the paged KV cache.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "compute/detail/engine_scratch.h"
#include "compute/detail/ops.h"
#include "compute/engine.h"
#include "compute/matmul.h"
#include "compute/thread_pool.h"
#include "compute/vec_ops.h"

namespace troupe::compute {

using detail::f32;
using detail::grow;
using detail::head_part;
using model::LayerSpec;
using model::ModelSpec;
using model::WeightView;

namespace {

// One token's hyper-connection weights from its mixes: pre [hc], post [hc] and comb [hc, hc]
// (row j: input stream j, column k: output stream k), Sinkhorn-normalized to be doubly
// stochastic. In double; the reference's formulas (transformers' DeepseekV4HyperConnection).
void hc_weights(const ModelSpec& s, const float* mix, const float* base, const float* scale,
                float* pre, float* post, float* comb) {
  const int64_t hc = s.hc_mult;
  const double eps = s.hc_eps;
  auto sigmoid = [](double x) { return 1.0 / (1.0 + std::exp(-x)); };
  for (int64_t j = 0; j < hc; ++j) {
    pre[j] = static_cast<float>(sigmoid(static_cast<double>(mix[j]) * scale[0] + base[j]) + eps);
    post[j] = static_cast<float>(
        2.0 * sigmoid(static_cast<double>(mix[hc + j]) * scale[1] + base[hc + j]));
  }
  thread_local std::vector<double> c;
  c.assign(static_cast<size_t>(hc * hc), 0.0);
  for (int64_t j = 0; j < hc; ++j) {  // a softmax over each row
    double* row = &c[static_cast<size_t>(j * hc)];
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t k = 0; k < hc; ++k) {
      const int64_t i = 2 * hc + j * hc + k;
      row[k] = static_cast<double>(mix[i]) * scale[2] + base[i];
      mx = std::max(mx, row[k]);
    }
    double sum = 0;
    for (int64_t k = 0; k < hc; ++k) sum += (row[k] = std::exp(row[k] - mx));
    for (int64_t k = 0; k < hc; ++k) row[k] = row[k] / sum + eps;
  }
  auto columns = [&] {
    for (int64_t k = 0; k < hc; ++k) {
      double sum = 0;
      for (int64_t j = 0; j < hc; ++j) sum += c[static_cast<size_t>(j * hc + k)];
      for (int64_t j = 0; j < hc; ++j) c[static_cast<size_t>(j * hc + k)] /= sum + eps;
    }
  };
  columns();
  for (int64_t it = 1; it < s.hc_sinkhorn_iters; ++it) {
    for (int64_t j = 0; j < hc; ++j) {
      double sum = 0;
      for (int64_t k = 0; k < hc; ++k) sum += c[static_cast<size_t>(j * hc + k)];
      for (int64_t k = 0; k < hc; ++k) c[static_cast<size_t>(j * hc + k)] /= sum + eps;
    }
    columns();
  }
  for (int64_t i = 0; i < hc * hc; ++i) comb[i] = static_cast<float>(c[static_cast<size_t>(i)]);
}

// out = sum_j w[j] * streams[j] (n values each, hc streams n apart), j in order.
void weighted_streams(const float* streams, const float* w, int64_t hc, int64_t n, float* out) {
  for (int64_t d = 0; d < n; ++d) out[d] = w[0] * streams[d];
  for (int64_t j = 1; j < hc; ++j)
    for (int64_t d = 0; d < n; ++d) out[d] += w[j] * streams[j * n + d];
}

}  // namespace

void Engine::hc_pre(const WeightView& fn, const WeightView& base, const WeightView& scale,
                    const WeightView& norm) {
  const ModelSpec& s = spec();
  Scratch& S = *s_;
  const int64_t T = S.T, E = s.n_embd, hc = s.hc_mult, HW = hc * E, mix = (2 + hc) * hc;
  grow(S.hc_norm, T * HW);
  grow(S.hc_mix, T * mix);
  grow(S.hc_post, T * hc);
  grow(S.hc_comb, T * hc * hc);
  for (int64_t t = 0; t < T; ++t)
    detail::rms_norm_plain(&S.x[t * HW], &S.hc_norm[t * HW], HW, s.rms_eps);
  matmul(fn, S.hc_norm.data(), T, S.hc_mix.data(), pool_.get());
  const float *nw = f32(norm), *bw = f32(base), *sw = f32(scale);
  pool_->parallel_for(T, 1, [&](int64_t b, int64_t e) {
    thread_local std::vector<float> pre;
    pre.resize(static_cast<size_t>(hc));
    for (int64_t t = b; t < e; ++t) {
      hc_weights(s, &S.hc_mix[t * mix], bw, sw, pre.data(), &S.hc_post[t * hc],
                 &S.hc_comb[t * hc * hc]);
      float* c = &S.tmp[t * E];
      weighted_streams(&S.x[t * HW], pre.data(), hc, E, c);
      detail::rms_norm(c, nw, &S.h[t * E], E, s.rms_eps);
    }
  });
}

// Streams of every token: x[k] = post[k] * out + sum_j comb[j][k] x[j], out the block's output
// (S.tmp).
void Engine::hc_post() {
  const ModelSpec& s = spec();
  Scratch& S = *s_;
  const int64_t T = S.T, E = s.n_embd, hc = s.hc_mult, HW = hc * E;
  pool_->parallel_for(T, 1, [&](int64_t b, int64_t e) {
    thread_local std::vector<float> next, col;
    next.resize(static_cast<size_t>(HW));
    col.resize(static_cast<size_t>(hc));
    for (int64_t t = b; t < e; ++t) {
      const float* x = &S.x[t * HW];
      const float* comb = &S.hc_comb[t * hc * hc];
      const float* out = &S.tmp[t * E];
      for (int64_t k = 0; k < hc; ++k) {
        for (int64_t j = 0; j < hc; ++j) col[static_cast<size_t>(j)] = comb[j * hc + k];
        float* y = &next[static_cast<size_t>(k * E)];
        weighted_streams(x, col.data(), hc, E, y);
        const float p = S.hc_post[t * hc + k];
        for (int64_t d = 0; d < E; ++d) y[d] += p * out[d];
      }
      std::memcpy(&S.x[t * HW], next.data(), static_cast<size_t>(HW) * sizeof(float));
    }
  });
}

void Engine::head_v4(std::span<const int64_t> rows) {
  const ModelSpec& s = spec();
  Scratch& S = *s_;
  const int64_t E = s.n_embd, hc = s.hc_mult, HW = hc * E;
  const auto R = static_cast<int64_t>(rows.size());
  grow(S.hc_norm, R * HW);
  grow(S.hc_mix, R * hc);
  grow(S.tmp, R * E);
  for (int64_t r = 0; r < R; ++r)
    detail::rms_norm_plain(&S.x[rows[static_cast<size_t>(r)] * HW], &S.hc_norm[r * HW], HW,
                           s.rms_eps);
  matmul(s.hc_head_fn, S.hc_norm.data(), R, S.hc_mix.data(), pool_.get());
  const float* base = f32(s.hc_head_base);
  const float scale = f32(s.hc_head_scale)[0];
  const float* on = f32(s.output_norm);
  std::vector<float> pre(static_cast<size_t>(hc));
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t j = 0; j < hc; ++j)
      pre[static_cast<size_t>(j)] = static_cast<float>(
          1.0 / (1.0 + std::exp(-(static_cast<double>(S.hc_mix[r * hc + j]) * scale + base[j]))) +
          s.hc_eps);
    weighted_streams(&S.x[rows[static_cast<size_t>(r)] * HW], pre.data(), hc, E, &S.tmp[r * E]);
    detail::rms_norm(&S.tmp[r * E], on, &S.h[r * E], E, s.rms_eps);
  }
}

void Engine::layer_v4(int64_t il, std::span<const SeqStep> seqs) {
  const ModelSpec& s = spec();
  const LayerSpec& L = s.layers[static_cast<size_t>(il)];
  Scratch& S = *s_;
  const int64_t T = S.T, G = s.o_groups, ol = s.o_lora_rank, HD = s.n_head * s.head_dim_k;
  hc_pre(L.hc_attn_fn, L.hc_attn_base, L.hc_attn_scale, L.attn_norm);
  attention_v4(il, seqs);
  // The grouped output: each group of heads to o_lora_rank values (one product per group),
  // then all groups' to n_embd.
  grow(S.og, T * G * ol);
  S.products.clear();
  const auto& groups = S.wo_a_groups[static_cast<size_t>(il - range_.begin)];
  for (int64_t g = 0; g < G; ++g)
    S.products.push_back(
        {&groups[static_cast<size_t>(g)], &S.attn[g * (HD / G)], HD, T, &S.og[g * ol], G * ol});
  matmul_many(S.products, pool_.get());
  matmul(L.wo, S.og.data(), T, S.tmp.data(), pool_.get());
  hc_post();
  hc_pre(L.hc_ffn_fn, L.hc_ffn_base, L.hc_ffn_scale, L.ffn_norm);
  moe(il);
  hc_post();
}

void Engine::attention_v4(int64_t il, std::span<const SeqStep> seqs) {
  const ModelSpec& s = spec();
  const LayerSpec& L = s.layers[static_cast<size_t>(il)];
  Scratch& S = *s_;
  const int64_t T = S.T, E = s.n_embd, H = s.n_head, D = s.head_dim_k, R = s.n_rot;
  const int64_t ql = s.q_lora_rank, m = L.compress, coff = L.compress_overlap ? 2 : 1;
  const int64_t Di = s.idx_head_dim, Hi = s.idx_n_head, half = R / 2;
  const ModelSpec::V4Row row = s.v4_row(L);
  const int64_t l = kv_layer(il), bs = kv_->block_size();
  grow(S.qa, T * ql);
  grow(S.kva, T * D);
  grow(S.q, T * H * D);
  grow(S.attn, T * H * D);
  std::vector<MatmulTarget> from_h;
  from_h.reserve(7);
  from_h.push_back({L.wq_a, S.qa.data(), ql});
  from_h.push_back({L.wkv_a, S.kva.data(), D});
  if (m > 0) {  // each token's kv then gate projections, as its KV row keeps them
    grow(S.cmp, T * 2 * coff * D);
    from_h.push_back({L.cmp_kv, S.cmp.data(), 2 * coff * D});
    from_h.push_back({L.cmp_gate, S.cmp.data() + coff * D, 2 * coff * D});
  }
  if (L.compress_overlap) {
    grow(S.icmp, T * 4 * Di);
    grow(S.iw, T * Hi);
    from_h.push_back({L.idx_cmp_kv, S.icmp.data(), 4 * Di});
    from_h.push_back({L.idx_cmp_gate, S.icmp.data() + 2 * Di, 4 * Di});
    from_h.push_back({L.idx_proj, S.iw.data(), Hi});
  }
  matmul_shared(from_h, S.h.data(), E, T, pool_.get());
  const float* qn = f32(L.q_a_norm);
  for (int64_t t = 0; t < T; ++t) detail::rms_norm(&S.qa[t * ql], qn, &S.qa[t * ql], ql, s.rms_eps);
  matmul(L.wq_b, S.qa.data(), T, S.q.data(), pool_.get());
  // Sliding-only layers rotate with the local (main) base, compressing ones with the model's.
  const std::vector<float>& rc = L.local_rope ? S.rope_cos_local : S.rope_cos;
  const std::vector<float>& rs = L.local_rope ? S.rope_sin_local : S.rope_sin;
  const float* kvn = f32(L.kv_a_norm);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t pos = S.tok_pos[static_cast<size_t>(t)];
    const float* cs = &rc[t * half];
    const float* sn = &rs[t * half];
    for (int64_t hh = 0; hh < H; ++hh) {
      float* qh = &S.q[(t * H + hh) * D];
      detail::rms_norm_plain(qh, qh, D, s.rms_eps);
      detail::rope_cs(qh + D - R, R, cs, sn, false);
    }
    float* kv = &S.kva[t * D];
    detail::rms_norm(kv, kvn, kv, D, s.rms_eps);
    detail::rope_cs(kv + D - R, R, cs, sn, false);
    const SeqStep& q = seqs[static_cast<size_t>(S.tok_seq[static_cast<size_t>(t)])];
    const int32_t blk = q.blocks[static_cast<size_t>(pos / bs)];
    kv_->store(l, blk, pos % bs, 0, kv, D);
    if (m > 0) {
      float* c = &S.cmp[t * 2 * coff * D];
      const float* ape = f32(L.cmp_ape) + pos % m * coff * D;
      for (int64_t i = 0; i < coff * D; ++i) c[coff * D + i] += ape[i];
      kv_->store(l, blk, pos % bs, row.proj, c, 2 * coff * D);
    }
    if (L.compress_overlap) {
      float* c = &S.icmp[t * 4 * Di];
      const float* ape = f32(L.idx_cmp_ape) + pos % m * 2 * Di;
      for (int64_t i = 0; i < 2 * Di; ++i) c[2 * Di + i] += ape[i];
      kv_->store(l, blk, pos % bs, row.iproj, c, 4 * Di);
    }
  }
  if (m > 0) compress_v4(il, seqs, false);
  if (L.compress_overlap) {
    compress_v4(il, seqs, true);
    select_v4(il, seqs);
  }
  // Attention over the window's raw rows and the entries (all visible ones, or the indexer's
  // choice), each row its own block of one.
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const float* sinks = f32(L.sinks);
  const int64_t rbytes = kv_->config().k_width * kv_type_bytes(kv_->config().type);
  const int64_t ebytes = kv_type_bytes(kv_->config().type);
  const int64_t part = head_part(H, T, H, pool_->size(), 32), parts = H / part;
  pool_->parallel_for(T * parts, 1, [&](int64_t b, int64_t e) {
    thread_local std::vector<const void*> blocks;
    for (int64_t tp = b; tp < e; ++tp) {
      const int64_t t = tp / parts, h0 = tp % parts * part;
      const auto t0 = static_cast<size_t>(t);
      const int64_t pos = S.tok_pos[t0];
      const SeqStep& q = seqs[static_cast<size_t>(S.tok_seq[t0])];
      auto at = [&](int64_t p) {
        return kv_->block(l, q.blocks[static_cast<size_t>(p / bs)]) + p % bs * rbytes;
      };
      const int64_t first = std::max<int64_t>(0, pos + 1 - L.window);
      const int64_t n_vis = m > 0 ? (pos + 1) / m : 0;
      const int64_t n_sel = L.compress_overlap ? S.sel_at[t0 + 1] - S.sel_at[t0] : 0;
      const int64_t n_ent = n_sel > 0 ? n_sel : n_vis;
      blocks.resize(static_cast<size_t>(pos + 1 - first + n_ent));
      size_t k = 0;
      for (int64_t p = first; p <= pos; ++p) blocks[k++] = at(p);
      for (int64_t i = 0; i < n_ent; ++i) {
        const int64_t w = n_sel > 0 ? S.sel[static_cast<size_t>(S.sel_at[t0] + i)] : i;
        blocks[k++] = at((w + 1) * m - 1) + row.entry * ebytes;
      }
      KvView kv;
      kv.blocks = blocks.data();
      kv.type = kv_->config().type;
      kv.block_size = 1;
      kv.k_stride = kv.v_stride = D;
      kv.sinks = sinks + h0;
      attend_heads(&S.q[(t * H + h0) * D], D, part, D, kv, static_cast<int64_t>(k), scale, D,
                   &S.attn[(t * H + h0) * D], D);
    }
  });
  // The values carried their keys' rotation: turned back by the query's angle.
  std::vector<float> neg(static_cast<size_t>(half));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < half; ++i) neg[static_cast<size_t>(i)] = -rs[t * half + i];
    for (int64_t hh = 0; hh < H; ++hh)
      detail::rope_cs(&S.attn[(t * H + hh) * D] + D - R, R, &rc[t * half], neg.data(), false);
  }
}

// The entries of the windows this step's tokens end (token at p ends window p / m when
// (p + 1) % m == 0), from the rows of that window (and, overlapping, the one before): per value
// a softmax over the pooled positions of their gates, the values weighted by it; RMS-normed,
// rotated at the window's first position with the model's rope, written in the ending token's
// row. `indexer`: the indexer's keys instead of the compressor's entries.
void Engine::compress_v4(int64_t il, std::span<const SeqStep> seqs, bool indexer) {
  const ModelSpec& s = spec();
  const LayerSpec& L = s.layers[static_cast<size_t>(il)];
  Scratch& S = *s_;
  const int64_t m = L.compress, coff = L.compress_overlap ? 2 : 1, R = s.n_rot;
  const int64_t W = indexer ? s.idx_head_dim : s.head_dim_k;
  const ModelSpec::V4Row row = s.v4_row(L);
  const int64_t proj = indexer ? row.iproj : row.proj, out = indexer ? row.ientry : row.entry;
  const float* nw = f32(indexer ? L.idx_cmp_norm : L.cmp_norm);
  const int64_t l = kv_layer(il), bs = kv_->block_size();
  std::vector<int64_t> ends;
  for (int64_t t = 0; t < S.T; ++t)
    if ((S.tok_pos[static_cast<size_t>(t)] + 1) % m == 0) ends.push_back(t);
  pool_->parallel_for(static_cast<int64_t>(ends.size()), 1, [&](int64_t b, int64_t e) {
    thread_local std::vector<float> vals, gates, entry, cs, sn;
    for (int64_t i = b; i < e; ++i) {
      const auto t = static_cast<size_t>(ends[static_cast<size_t>(i)]);
      const int64_t pos = S.tok_pos[t], w = pos / m;
      const SeqStep& q = seqs[static_cast<size_t>(S.tok_seq[t])];
      // Slots: the window before's first halves (overlapping, from window 1 on), then this
      // window's (second halves when overlapping).
      const int64_t before = coff == 2 && w > 0 ? m : 0, n = before + m;
      vals.resize(static_cast<size_t>(n * W));
      gates.resize(static_cast<size_t>(n * W));
      for (int64_t j = 0; j < n; ++j) {
        const int64_t p = j < before ? (w - 1) * m + j : w * m + (j - before);
        const int64_t half = coff == 2 && j >= before ? W : 0;
        const int32_t blk = q.blocks[static_cast<size_t>(p / bs)];
        kv_->load(l, blk, p % bs, proj + half, W, &vals[static_cast<size_t>(j * W)]);
        kv_->load(l, blk, p % bs, proj + coff * W + half, W, &gates[static_cast<size_t>(j * W)]);
      }
      entry.assign(static_cast<size_t>(W), 0.0f);
      for (int64_t c = 0; c < W; ++c) {
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < n; ++j) mx = std::max(mx, gates[static_cast<size_t>(j * W + c)]);
        double sum = 0, acc = 0;
        for (int64_t j = 0; j < n; ++j) {
          const double g =
              std::exp(static_cast<double>(gates[static_cast<size_t>(j * W + c)]) - mx);
          sum += g;
          acc += g * vals[static_cast<size_t>(j * W + c)];
        }
        entry[static_cast<size_t>(c)] = static_cast<float>(acc / sum);
      }
      detail::rms_norm(entry.data(), nw, entry.data(), W, s.rms_eps);
      cs.resize(static_cast<size_t>(R / 2));
      sn.resize(static_cast<size_t>(R / 2));
      const int64_t at = w * m;
      model::rope_cos_sin(S.rope, std::span<const int64_t>(&at, 1), cs.data(), sn.data());
      detail::rope_cs(entry.data() + W - R, R, cs.data(), sn.data(), false);
      kv_->store(l, q.blocks[static_cast<size_t>(pos / bs)], pos % bs, out, entry.data(), W);
    }
  });
}

// The indexer's choice for each token that sees more than idx_top_k entries: the idx_top_k
// with the largest sum over heads of w_h relu(q_h . k) (ties: the earlier), in window order.
// Queries from the compressed q, rotated at the token's position with the model's rope; head
// weights scaled by (heads * width)^-1/2. Into S.sel_at / S.sel (a token with none: all).
void Engine::select_v4(int64_t il, std::span<const SeqStep> seqs) {
  const ModelSpec& s = spec();
  const LayerSpec& L = s.layers[static_cast<size_t>(il)];
  Scratch& S = *s_;
  const int64_t T = S.T, Hi = s.idx_n_head, Di = s.idx_head_dim, R = s.n_rot, half = R / 2;
  const int64_t m = L.compress, top = s.idx_top_k;
  const ModelSpec::V4Row row = s.v4_row(L);
  const int64_t l = kv_layer(il), bs = kv_->block_size();
  grow(S.iq, T * Hi * Di);
  matmul(L.idx_wq_b, S.qa.data(), T, S.iq.data(), pool_.get());
  const float wscale = 1.0f / std::sqrt(static_cast<float>(Hi)) / std::sqrt(static_cast<float>(Di));
  S.sel_at.assign(static_cast<size_t>(T + 1), 0);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t hh = 0; hh < Hi; ++hh) {
      detail::rope_cs(&S.iq[(t * Hi + hh) * Di] + Di - R, R, &S.rope_cos[t * half],
                      &S.rope_sin[t * half], false);
      S.iw[t * Hi + hh] *= wscale;
    }
    const int64_t n_vis = (S.tok_pos[static_cast<size_t>(t)] + 1) / m;
    S.sel_at[static_cast<size_t>(t + 1)] =
        S.sel_at[static_cast<size_t>(t)] + (n_vis > top ? top : 0);
  }
  S.sel.resize(static_cast<size_t>(S.sel_at[static_cast<size_t>(T)]));
  pool_->parallel_for(T, 1, [&](int64_t b, int64_t e) {
    thread_local std::vector<float> key, score;
    thread_local std::vector<int32_t> order;
    key.resize(static_cast<size_t>(Di));
    for (int64_t t = b; t < e; ++t) {
      const auto t0 = static_cast<size_t>(t);
      if (S.sel_at[t0 + 1] == S.sel_at[t0]) continue;
      const int64_t n_vis = (S.tok_pos[t0] + 1) / m;
      const SeqStep& q = seqs[static_cast<size_t>(S.tok_seq[t0])];
      score.assign(static_cast<size_t>(n_vis), 0.0f);
      for (int64_t w = 0; w < n_vis; ++w) {
        const int64_t p = (w + 1) * m - 1;
        kv_->load(l, q.blocks[static_cast<size_t>(p / bs)], p % bs, row.ientry, Di, key.data());
        float sc = 0;
        for (int64_t hh = 0; hh < Hi; ++hh)
          sc += std::max(0.0f, detail::dot(&S.iq[(t * Hi + hh) * Di], key.data(), Di)) *
                S.iw[t * Hi + hh];
        score[static_cast<size_t>(w)] = sc;
      }
      order.resize(static_cast<size_t>(n_vis));
      for (int64_t w = 0; w < n_vis; ++w) order[static_cast<size_t>(w)] = static_cast<int32_t>(w);
      std::partial_sort(order.begin(), order.begin() + top, order.end(), [&](int32_t x, int32_t y) {
        const float a = score[static_cast<size_t>(x)], c = score[static_cast<size_t>(y)];
        return a > c || (a == c && x < y);
      });
      std::sort(order.begin(), order.begin() + top);
      std::copy(order.begin(), order.begin() + top,
                S.sel.begin() + static_cast<std::ptrdiff_t>(S.sel_at[t0]));
    }
  });
}

}  // namespace troupe::compute
