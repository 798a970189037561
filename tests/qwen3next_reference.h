// A test reference for Qwen3-Next in Hugging Face form (Qwen3NextForCausalLM): a deliberately
// naive float64 forward pass that reads the checkpoint by its Hugging Face tensor names, written
// from the semantics of transformers' modeling_qwen3_next.py, independently of troupe's engine,
// model loader and rope code (it uses only the safetensors container parser). A hybrid decoder:
// most layers are Gated DeltaNet linear attention (a causal depthwise convolution, then a
// per-head delta-rule state updated token by token, gated RMSNorm), every few a full softmax
// attention whose heads are gated by a sigmoid of a second half of q_proj, with partial NeoX
// rotary and per-head q/k norms; MoE feed-forward with a softmax router and a sigmoid-gated shared
// expert. The RMSNorms outside the DeltaNet scale by (1 + weight). The tensor access and the
// SwiGLU MLP are tests/hf_moe_reference.h's. Plain loops, no caching: for small test models.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/hf_moe_reference.h"

namespace troupe::testing {
namespace qwen3next_ref {

using namespace moe_ref;  // NOLINT(google-build-using-namespace): the shared pieces

/// The Qwen3-Next fields of config.json, beside moe_ref::Config's (vocab, E, L, H, Hkv, D, R:
/// rotary dims of a head, F: width of a routed expert, N, K: experts per token, I: dense MLP
/// width, rope_theta, eps, norm_topk, tie).
struct Qwen3Next {
  std::vector<bool> full;  // [L]: layer_types[l] == "full_attention" (else linear_attention)
  std::vector<bool> moe;   // [L]: sparse MoE block (else the dense MLP of width I)
  int64_t nk = 0, nv = 0;  // linear_num_key_heads, linear_num_value_heads (nv % nk == 0)
  int64_t dk = 0, dv = 0;  // linear_key_head_dim, linear_value_head_dim
  int64_t conv = 0;        // linear_conv_kernel_dim
  int64_t shared = 0;      // shared_expert_intermediate_size (0: no shared expert)
};

/// A list of layer indices from config key `key` (empty when absent or null).
inline std::vector<int64_t> int_list(const ConfigJson& j, const char* key) {
  if (!j.has(key)) return {};
  if (!j.j[key].is_array()) fail(std::string(key) + " must be a list");
  return j.j[key].get<std::vector<int64_t>>();
}

inline Qwen3Next read_config(const std::string& dir, Config* cfg) {
  const ConfigJson j(dir);
  Config c = read_common(j);
  Qwen3Next m;
  c.eps = j.get("rms_norm_eps", 1e-6);
  // As transformers: int(head_dim * partial_rotary_factor), truncated.
  c.R = static_cast<int64_t>(static_cast<double>(c.D) * j.get("partial_rotary_factor", 0.25));
  check_rotary(c);
  if (j.get("hidden_act", std::string("silu")) != "silu") fail("hidden_act must be \"silu\"");
  if (j.get("attention_bias", false)) fail("attention_bias true is not supported");

  if (j.has("layer_types")) {
    const auto types = j.j["layer_types"].get<std::vector<std::string>>();
    if (static_cast<int64_t>(types.size()) != c.L)
      fail("layer_types has " + std::to_string(types.size()) + " entries, num_hidden_layers " +
           std::to_string(c.L));
    for (const std::string& t : types) {
      if (t != "full_attention" && t != "linear_attention")
        fail("layer_types holds \"" + t + "\" (full_attention, linear_attention)");
      m.full.push_back(t == "full_attention");
    }
  } else {
    const int64_t interval = j.get("full_attention_interval", int64_t{4});
    if (interval <= 0) fail("full_attention_interval must be positive");
    for (int64_t l = 0; l < c.L; ++l) m.full.push_back((l + 1) % interval == 0);
  }
  if (std::ranges::find(m.full, false) != m.full.end()) {  // some linear-attention layer
    m.nk = j.req("linear_num_key_heads");
    m.nv = j.req("linear_num_value_heads");
    m.dk = j.req("linear_key_head_dim");
    m.dv = j.req("linear_value_head_dim");
    m.conv = j.req("linear_conv_kernel_dim");
    if (m.nk <= 0 || m.nv % m.nk != 0) fail("linear_num_value_heads % linear_num_key_heads != 0");
    if (m.dk <= 0 || m.dv <= 0 || m.conv <= 0) fail("bad linear attention sizes");
  }

  c.N = j.req("num_experts");
  const int64_t step = j.get("decoder_sparse_step", int64_t{1});
  if (c.N > 0 && step <= 0) fail("decoder_sparse_step must be positive");
  m.moe.assign(static_cast<size_t>(c.L), false);
  for (int64_t l = 0; l < c.L && c.N > 0; ++l) m.moe[l] = (l + 1) % step == 0;
  for (int64_t l : int_list(j, "mlp_only_layers"))
    if (l >= 0 && l < c.L) m.moe[l] = false;
  if (std::ranges::find(m.moe, true) != m.moe.end()) {
    c.F = j.req("moe_intermediate_size");
    c.K = j.req("num_experts_per_tok");
    m.shared = j.req("shared_expert_intermediate_size");
    c.norm_topk = j.get("norm_topk_prob", true);
    if (c.K <= 0 || c.K > c.N) fail("bad num_experts_per_tok");
    if (m.shared < 0) fail("bad shared_expert_intermediate_size");
  }
  if (std::ranges::find(m.moe, false) != m.moe.end()) c.I = j.req("intermediate_size");
  *cfg = c;
  return m;
}

/// The (1 + weight) that Qwen3NextRMSNorm scales by, from the stored zero-centered weight.
inline Vec centered(const Tensors& st, const std::string& name, int64_t n) {
  Vec w = vec(st, name, n);
  for (double& x : w) x += 1;
  return w;
}

/// Each of the `heads` heads of v (n values each, from offset 0) RMS-normed by w.
inline void norm_heads(Vec& v, int64_t heads, int64_t n, const Vec& w, double eps) {
  for (int64_t h = 0; h < heads; ++h) {
    const Vec head(v.begin() + h * n, v.begin() + (h + 1) * n);
    std::ranges::copy(rms_norm(head, w, eps), v.begin() + h * n);
  }
}

/// Gated full attention of layer prefix p over the normed inputs hs (one per position): q_proj
/// gives per head [query (D), gate (D)]; per-head q_norm / k_norm (zero-centered), NeoX rotary
/// on the first R dims of each head, causal GQA softmax(q k / sqrt(D)) v, each head's output times
/// sigmoid(gate) elementwise, then o_proj. No biases.
inline std::vector<Vec> full_attention(const Tensors& st, const Config& c, const std::string& p,
                                       const std::vector<Vec>& hs) {
  const std::string a = p + "self_attn.";
  const size_t n = hs.size();
  std::vector<Vec> q(n), gate(n), k(n), v(n), out(n);
  const Vec qn = centered(st, a + "q_norm.weight", c.D),
            kn = centered(st, a + "k_norm.weight", c.D);
  for (size_t i = 0; i < n; ++i) {
    const auto pos = static_cast<int64_t>(i);
    const Vec qg = matvec(tensor(st, a + "q_proj.weight", {c.H * c.D * 2, c.E}), hs[i]);
    q[i].resize(static_cast<size_t>(c.H * c.D));
    gate[i].resize(static_cast<size_t>(c.H * c.D));
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t e = 0; e < c.D; ++e) {
        q[i][h * c.D + e] = qg[h * 2 * c.D + e];
        gate[i][h * c.D + e] = qg[h * 2 * c.D + c.D + e];
      }
    k[i] = matvec(tensor(st, a + "k_proj.weight", {c.Hkv * c.D, c.E}), hs[i]);
    v[i] = matvec(tensor(st, a + "v_proj.weight", {c.Hkv * c.D, c.E}), hs[i]);
    norm_heads(q[i], c.H, c.D, qn, c.eps);
    norm_heads(k[i], c.Hkv, c.D, kn, c.eps);
    for (int64_t h = 0; h < c.H; ++h) rope(q[i], h * c.D, pos, c);
    for (int64_t h = 0; h < c.Hkv; ++h) rope(k[i], h * c.D, pos, c);
  }
  const Tensor& wo = tensor(st, a + "o_proj.weight", {c.E, c.H * c.D});
  for (size_t i = 0; i < n; ++i) {
    Vec heads(static_cast<size_t>(c.H * c.D), 0.0);
    for (int64_t h = 0; h < c.H; ++h) {
      const int64_t qo = h * c.D, ko = h / (c.H / c.Hkv) * c.D;
      Vec score(i + 1);
      for (size_t s = 0; s <= i; ++s) {
        double d = 0;
        for (int64_t e = 0; e < c.D; ++e) d += q[i][qo + e] * k[s][ko + e];
        score[s] = d / std::sqrt(static_cast<double>(c.D));
      }
      softmax(score);
      for (size_t s = 0; s <= i; ++s)
        for (int64_t e = 0; e < c.D; ++e) heads[qo + e] += score[s] * v[s][ko + e];
    }
    for (size_t e = 0; e < heads.size(); ++e) heads[e] *= sigmoid(gate[i][e]);
    out[i] = matvec(wo, heads);
  }
  return out;
}

/// torch.nn.functional.softplus with its defaults (beta 1, linear above 20).
inline double softplus(double x) { return x > 20 ? x : std::log1p(std::exp(x)); }

/// x / sqrt(sum x^2 + 1e-6) over [off, off + n) of x: the l2norm of the delta rule's q and k.
inline void l2_normalize(Vec& x, int64_t off, int64_t n) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += x[off + i] * x[off + i];
  const double inv = 1.0 / std::sqrt(ss + 1e-6);
  for (int64_t i = 0; i < n; ++i) x[off + i] *= inv;
}

/// Gated DeltaNet of layer prefix p over the normed inputs hs (one per position), token by token.
/// in_proj_qkvz's output is grouped per k-head g: [q (dk), k (dk), v (r dv), z (r dv)], r = nv/nk,
/// the v and z of v-heads g r .. g r + r - 1; in_proj_ba's per k-head: [b (r), a (r)]. The
/// channels [all q, all k, all v] go through the causal depthwise conv1d [conv_dim, 1, K] and
/// SiLU; q and k are L2-normed per head, q scaled by 1/sqrt(dk); v-head h reads k-head h / r.
/// Per v-head: beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias); the state S [dk x dv]
/// decays by exp(g), then S += k (beta (v - S^T k))^T, and o = S^T q. o is RMS-normed per head by
/// linear_attn.norm.weight (plain, not zero-centered) times silu(z), then out_proj.
inline std::vector<Vec> linear_attention(const Tensors& st, const Config& c, const Qwen3Next& m,
                                         const std::string& p, const std::vector<Vec>& hs) {
  const std::string a = p + "linear_attn.";
  const int64_t r = m.nv / m.nk, key_dim = m.nk * m.dk, value_dim = m.nv * m.dv;
  const int64_t conv_dim = 2 * key_dim + value_dim, group = 2 * m.dk + 2 * r * m.dv;
  const Tensor& w_qkvz = tensor(st, a + "in_proj_qkvz.weight", {2 * key_dim + 2 * value_dim, c.E});
  const Tensor& w_ba = tensor(st, a + "in_proj_ba.weight", {2 * m.nv, c.E});
  const Tensor& w_conv = tensor(st, a + "conv1d.weight", {conv_dim, 1, m.conv});
  const Vec a_log = vec(st, a + "A_log", m.nv), dt_bias = vec(st, a + "dt_bias", m.nv);
  const Vec norm_w = vec(st, a + "norm.weight", m.dv);
  const Tensor& w_out = tensor(st, a + "out_proj.weight", {c.E, value_dim});
  const size_t n = hs.size();

  // Per position: the conv input [q heads, k heads, v heads], z [nv*dv], b and a [nv].
  std::vector<Vec> mixed(n), z(n), b(n), alpha(n);
  for (size_t t = 0; t < n; ++t) {
    const Vec qkvz = matvec(w_qkvz, hs[t]), ba = matvec(w_ba, hs[t]);
    mixed[t].resize(static_cast<size_t>(conv_dim));
    z[t].resize(static_cast<size_t>(value_dim));
    b[t].resize(static_cast<size_t>(m.nv));
    alpha[t].resize(static_cast<size_t>(m.nv));
    for (int64_t g = 0; g < m.nk; ++g) {
      const int64_t base = g * group;
      for (int64_t d = 0; d < m.dk; ++d) {
        mixed[t][g * m.dk + d] = qkvz[base + d];
        mixed[t][key_dim + g * m.dk + d] = qkvz[base + m.dk + d];
      }
      for (int64_t d = 0; d < r * m.dv; ++d) {
        mixed[t][2 * key_dim + g * r * m.dv + d] = qkvz[base + 2 * m.dk + d];
        z[t][g * r * m.dv + d] = qkvz[base + 2 * m.dk + r * m.dv + d];
      }
      for (int64_t j = 0; j < r; ++j) {
        b[t][g * r + j] = ba[g * 2 * r + j];
        alpha[t][g * r + j] = ba[g * 2 * r + r + j];
      }
    }
  }

  std::vector<Vec> conv_w(static_cast<size_t>(conv_dim));  // [conv_dim][K]
  for (int64_t ch = 0; ch < conv_dim; ++ch) conv_w[ch] = row(w_conv, ch);
  std::vector<Vec> state(static_cast<size_t>(m.nv), Vec(static_cast<size_t>(m.dk * m.dv), 0.0));
  std::vector<Vec> out(n);
  for (size_t t = 0; t < n; ++t) {
    Vec x(static_cast<size_t>(conv_dim));  // conv, then SiLU: out[t] = sum_i w[i] in[t-(K-1)+i]
    for (int64_t ch = 0; ch < conv_dim; ++ch) {
      double s = 0;
      for (int64_t i = 0; i < m.conv; ++i) {
        const int64_t src = static_cast<int64_t>(t) - (m.conv - 1) + i;
        if (src >= 0) s += conv_w[ch][i] * mixed[src][ch];
      }
      x[ch] = silu(s);
    }
    for (int64_t g = 0; g < m.nk; ++g) {
      l2_normalize(x, g * m.dk, m.dk);            // q
      l2_normalize(x, key_dim + g * m.dk, m.dk);  // k
      for (int64_t d = 0; d < m.dk; ++d) x[g * m.dk + d] /= std::sqrt(static_cast<double>(m.dk));
    }
    Vec o(static_cast<size_t>(value_dim));
    for (int64_t h = 0; h < m.nv; ++h) {
      const int64_t qo = h / r * m.dk, ko = key_dim + qo, vo = 2 * key_dim + h * m.dv;
      const double beta = sigmoid(b[t][h]);
      const double decay = std::exp(-std::exp(a_log[h]) * softplus(alpha[t][h] + dt_bias[h]));
      Vec& s = state[h];  // s[i * dv + j]: key dim i, value dim j
      for (double& e : s) e *= decay;
      for (int64_t j = 0; j < m.dv; ++j) {
        double kv_mem = 0;
        for (int64_t i = 0; i < m.dk; ++i) kv_mem += s[i * m.dv + j] * x[ko + i];
        const double delta = (x[vo + j] - kv_mem) * beta;
        for (int64_t i = 0; i < m.dk; ++i) s[i * m.dv + j] += x[ko + i] * delta;
      }
      Vec head(static_cast<size_t>(m.dv), 0.0);
      for (int64_t j = 0; j < m.dv; ++j)
        for (int64_t i = 0; i < m.dk; ++i) head[j] += s[i * m.dv + j] * x[qo + i];
      head = rms_norm(head, norm_w, c.eps);
      for (int64_t j = 0; j < m.dv; ++j) o[h * m.dv + j] = head[j] * silu(z[t][h * m.dv + j]);
    }
    out[t] = matvec(w_out, o);
  }
  return out;
}

/// The sparse MoE block of prefix p for the post-attention-normed x: softmax over all N router
/// logits, the K largest (ties: lower index first), renormalized to sum 1 when norm_topk_prob;
/// their SwiGLU experts weighted, plus the shared expert times sigmoid(shared_expert_gate x).
inline Vec moe_ffn(const Tensors& st, const Config& c, const Qwen3Next& m, const std::string& p,
                   const Vec& x) {
  Scores s;
  s.score = matvec(tensor(st, p + "mlp.gate.weight", {c.N, c.E}), x);
  softmax(s.score);
  s.choice = s.score;
  Vec out = mix_experts(st, c, p + "mlp.experts.", kProjNames, top_k(s, c.K, c.norm_topk), x);
  if (m.shared > 0) {
    const double g =
        sigmoid(dot(row(tensor(st, p + "mlp.shared_expert_gate.weight", {1, c.E}), 0), x));
    add_scaled(out, g, swiglu(st, p + "mlp.shared_expert.", kProjNames, c.E, m.shared, x));
  }
  return out;
}

/// Logits [tokens x vocab]: embed_tokens; per layer h += (linear or full attention)(
/// input_layernorm h), h += (MoE or dense MLP)(post_attention_layernorm h); lm_head (or the
/// embedding when tied) of norm h. Every RMSNorm here is zero-centered.
inline std::vector<double> forward(const Tensors& st, const Config& c, const Qwen3Next& m,
                                   const std::vector<int32_t>& tokens) {
  const Tensor& embed = tensor(st, "model.embed_tokens.weight", {c.vocab, c.E});
  std::vector<Vec> h;
  for (int32_t t : tokens) {
    if (t < 0 || t >= c.vocab) fail("token " + std::to_string(t) + " outside the vocabulary");
    h.push_back(row(embed, t));
  }
  for (int64_t l = 0; l < c.L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const Vec in_norm = centered(st, p + "input_layernorm.weight", c.E);
    const Vec post_norm = centered(st, p + "post_attention_layernorm.weight", c.E);
    std::vector<Vec> xs;
    for (const Vec& hi : h) xs.push_back(rms_norm(hi, in_norm, c.eps));
    const std::vector<Vec> o =
        m.full[l] ? full_attention(st, c, p, xs) : linear_attention(st, c, m, p, xs);
    for (size_t i = 0; i < h.size(); ++i) {
      add_scaled(h[i], 1.0, o[i]);
      const Vec x = rms_norm(h[i], post_norm, c.eps);
      add_scaled(
          h[i], 1.0,
          m.moe[l] ? moe_ffn(st, c, m, p, x) : swiglu(st, p + "mlp.", kProjNames, c.E, c.I, x));
    }
  }
  const Vec final_norm = centered(st, "model.norm.weight", c.E);
  const Tensor& head = c.tie ? embed : tensor(st, "lm_head.weight", {c.vocab, c.E});
  std::vector<double> logits;
  logits.reserve(h.size() * static_cast<size_t>(c.vocab));
  for (const Vec& hi : h) {
    const Vec y = matvec(head, rms_norm(hi, final_norm, c.eps));
    logits.insert(logits.end(), y.begin(), y.end());
  }
  return logits;
}

}  // namespace qwen3next_ref

/// Logits [tokens.size() x vocab_size] of the Hugging Face Qwen3NextForCausalLM directory
/// `hf_dir` (config.json + model.safetensors or a sharded index), in double; row i = logits after
/// tokens[0..i] (causal, positions 0..n-1). Tensors outside the num_hidden_layers decoder layers
/// (the mtp.* module) are ignored. Throws std::runtime_error naming the tensor or key on a missing
/// tensor, a shape that config.json does not imply, or a bad or unsupported config (layer_types
/// of the wrong length or kind, linear_num_value_heads not a multiple of linear_num_key_heads,
/// hidden_act other than silu, attention_bias, rope_scaling).
inline std::vector<double> qwen3next_reference_logits(const std::string& hf_dir,
                                                      const std::vector<int32_t>& tokens) {
  using namespace qwen3next_ref;
  Config c;
  const Qwen3Next m = read_config(hf_dir, &c);
  const auto st = open_checkpoint(hf_dir);
  return forward(*st, c, m, tokens);
}

}  // namespace troupe::testing
