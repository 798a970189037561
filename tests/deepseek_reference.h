// A test reference for DeepSeek-V2, V3 and V3.2 Hugging Face checkpoints
// (DeepseekV2ForCausalLM: V2, V2-Lite, V2.5, Coder-V2; DeepseekV3ForCausalLM: V3, R1, Kimi K2;
// DeepseekV32ForCausalLM: V3.2-Exp, V3.2) and GLM-5's (GlmMoeDsaForCausalLM: V3.2's layers, its
// indexer rotating neighbouring pairs, layers that may share an earlier indexer's choice):
// a deliberately naive float64 forward pass that reads the checkpoint by its Hugging Face tensor
// names, written from the semantics of the modeling_deepseek.py these checkpoints ship and of
// transformers' DeepseekV3, independently of troupe's engine and model loader (it uses only the
// safetensors container parser). Multi-head latent attention is computed as written there: each
// head's keys and values expanded from the latent by kv_b_proj, nothing absorbed. The layer loop,
// the SwiGLU experts and DeepSeek-V3's routing are tests/hf_moe_reference.h's (GLM-4.5 routes as
// V3 does). V3.2's sparse attention (DSA) is a selection on that same dense path: its lightning
// indexer scores each earlier position and a query past index_topk keys attends only to the
// index_topk best, the rest masked, so that sparse kernels are held to plain masked attention.
// Plain loops, no caching: for small test models.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <string>
#include <vector>

#include "tests/hf_moe_reference.h"

namespace troupe::testing {
namespace deepseek_ref {

using namespace moe_ref;  // NOLINT(google-build-using-namespace): the shared pieces

/// The MLA and routing fields of config.json, beside moe_ref::Config's.
struct Mla {
  int64_t q_lora = 0;  // q_lora_rank; 0 (null): q = q_proj x
  int64_t kv_lora = 0, nope = 0, rope = 0, v = 0;
  bool interleave = true;  // rope_interleave: rope rows stored as interleaved pairs
  bool v3 = true;          // DeepseekV3ForCausalLM or DeepseekV32ForCausalLM (else V2's gate)
  std::string topk_method;
  // rope_scaling {"type" (or "rope_type"): "yarn", ...}, as modeling_deepseek.py's
  // DeepseekV2YarnRotaryEmbedding: each pair's frequency blended between itself and itself /
  // factor by a linear ramp over the pairs, cos and sin times
  // mscale(factor, mscale) / mscale(factor, mscale_all_dim), and the softmax scale times
  // mscale(factor, mscale_all_dim)^2, where mscale(f, m) = 0.1 m ln f + 1 (1 for f <= 1).
  bool yarn = false;
  double factor = 1, orig_ctx = 0, beta_fast = 32, beta_slow = 1, mscale = 1, mscale_all_dim = 0;
  // DeepseekV32ForCausalLM's sparse attention (DSA), read by read_dsa.
  bool dsa = false;
  int64_t index_heads = 0;  // index_n_heads (Hi)
  int64_t index_dim = 0;    // index_head_dim (Di)
  int64_t index_topk = 0;   // index_topk: keys a query keeps once it has more
  // GLM-5 (GlmMoeDsaForCausalLM): the indexer rotates neighbouring pairs (transformers'
  // GlmMoeDsaIndexer), and a "shared" layer (indexer_types) reuses the choice of the last layer
  // before it that ran its indexer.
  bool index_interleave = false;
  std::vector<bool> index_shared;  // per layer; empty: none
};

/// GlmMoeDsaConfig's indexer_types: the list itself, else index_topk_pattern's F and S, else
/// index_topk_freq and index_skip_topk_offset (full when max(l - offset + 1, 0) % freq == 0).
inline std::vector<bool> read_indexer_shared(const ConfigJson& j, int64_t layers) {
  std::vector<bool> shared(static_cast<size_t>(layers), false);
  auto from = [&](const nlohmann::json& list) {
    if (list.size() != shared.size()) fail("indexer_types: one entry per layer");
    for (size_t l = 0; l < shared.size(); ++l) shared[l] = list[l] == "shared" || list[l] == "S";
  };
  if (j.has("indexer_types")) {
    from(j.j["indexer_types"]);
  } else if (j.has("index_topk_pattern")) {
    const nlohmann::json& pat = j.j["index_topk_pattern"];
    nlohmann::json list = nlohmann::json::array();
    if (pat.is_string())
      for (char ch : pat.get<std::string>()) list.push_back(std::string(1, ch));
    from(pat.is_string() ? list : pat);
  } else {
    const int64_t freq = std::max<int64_t>(1, j.get("index_topk_freq", int64_t{1}));
    const int64_t offset = j.get("index_skip_topk_offset", int64_t{2});
    for (int64_t l = 0; l < layers; ++l)
      shared[static_cast<size_t>(l)] = std::max<int64_t>(l - offset + 1, 0) % freq != 0;
  }
  if (!shared.empty() && shared[0]) fail("layer 0's indexer cannot be shared");
  return shared;
}

inline double yarn_mscale(double factor, double m) {
  return factor <= 1 ? 1.0 : 0.1 * m * std::log(factor) + 1.0;
}

/// The lightning indexer's sizes of a DeepseekV32ForCausalLM config.json into m (whose q_lora
/// and rope are read): its queries come from the compressed q, so q_lora_rank must be set, and
/// each head's first qk_rope_head_dim values are rotated, so index_head_dim must hold them.
inline void read_dsa(const ConfigJson& j, Mla* m) {
  auto need = [&](const char* key) {
    if (!j.has(key)) fail(std::string("DeepseekV32ForCausalLM config.json lacks ") + key);
    return j.j[key].get<int64_t>();
  };
  if (m->q_lora <= 0) fail("DeepseekV32ForCausalLM needs q_lora_rank > 0 (the indexer's queries)");
  m->dsa = true;
  m->index_heads = need("index_n_heads");
  m->index_dim = need("index_head_dim");
  m->index_topk = need("index_topk");
  if (m->index_heads < 1) fail("index_n_heads must be at least 1");
  if (m->index_dim < 1 || m->index_dim < m->rope)
    fail("index_head_dim " + std::to_string(m->index_dim) +
         " must be at least 1 and at least qk_rope_head_dim " + std::to_string(m->rope));
  if (m->index_topk < 1)
    fail("index_topk must be at least 1, got " + std::to_string(m->index_topk));
}

inline Mla read_config(const std::string& dir, Config* cfg) {
  ConfigJson j(dir);
  Mla m;
  if (j.has("rope_scaling")) {
    const nlohmann::json rs = j.j["rope_scaling"];
    const std::string type = rs.value("type", rs.value("rope_type", std::string()));
    if (type != "yarn") fail("rope_scaling type " + type + " is not supported (yarn)");
    m.yarn = true;
    m.factor = rs.at("factor").get<double>();
    m.orig_ctx = rs.at("original_max_position_embeddings").get<double>();
    m.beta_fast = rs.value("beta_fast", 32.0);
    m.beta_slow = rs.value("beta_slow", 1.0);
    m.mscale = rs.value("mscale", 1.0);
    m.mscale_all_dim = rs.value("mscale_all_dim", 0.0);
    j.j.erase("rope_scaling");  // read_common refuses every other scaling
  }
  Config c = read_common(j);
  const std::string arch = j.j.at("architectures").at(0).get<std::string>();
  const bool glm = arch == "GlmMoeDsaForCausalLM";
  if (arch != "DeepseekV3ForCausalLM" && arch != "DeepseekV2ForCausalLM" &&
      arch != "DeepseekV32ForCausalLM" && !glm)
    fail("architectures[0] is " + arch);
  m.v3 = arch != "DeepseekV2ForCausalLM";  // V3.2 routes as V3
  m.q_lora = j.get("q_lora_rank", int64_t{0});
  m.kv_lora = j.req("kv_lora_rank");
  m.nope = j.req("qk_nope_head_dim");
  m.rope = j.req("qk_rope_head_dim");
  m.v = j.req("v_head_dim");
  m.interleave = j.get("rope_interleave", true);
  if (m.rope % 2 != 0) fail("qk_rope_head_dim must be even");
  if (arch == "DeepseekV32ForCausalLM" || glm) read_dsa(j, &m);
  if (glm) {
    m.index_interleave = true;
    m.index_shared = read_indexer_shared(j, c.L);
  }
  if (j.get("attention_bias", false)) fail("attention_bias is not supported");
  if (j.get("moe_layer_freq", int64_t{1}) != 1) fail("moe_layer_freq must be 1");
  c.eps = j.get("rms_norm_eps", glm ? 1e-5 : 1e-6);
  c.first_dense = std::min(j.get("first_k_dense_replace", int64_t{glm ? 3 : 0}), c.L);
  if (glm && j.has("mlp_layer_types")) {  // GLM-5's per-layer list: only a leading dense run here
    const nlohmann::json& types = j.j["mlp_layer_types"];
    if (types.size() != static_cast<size_t>(c.L)) fail("mlp_layer_types: one entry per layer");
    c.first_dense = 0;
    while (c.first_dense < c.L && types[static_cast<size_t>(c.first_dense)] == "dense")
      ++c.first_dense;
    for (int64_t l = c.first_dense; l < c.L; ++l)
      if (types[static_cast<size_t>(l)] != "sparse") fail("mlp_layer_types: dense after sparse");
  }
  c.I = c.first_dense > 0 ? j.req("intermediate_size") : 0;
  if (c.first_dense < c.L) {
    c.F = j.req("moe_intermediate_size");
    c.N = j.req("n_routed_experts");
    c.K = j.req("num_experts_per_tok");
  }
  c.shared = j.get("n_shared_experts", int64_t{glm ? 1 : 0});
  c.routed_scale = j.get("routed_scaling_factor", 1.0);
  c.norm_topk = j.get("norm_topk_prob", m.v3);
  const std::string scoring = m.v3 ? "sigmoid" : "softmax";  // each family's only scoring
  if (j.get("scoring_func", scoring) != scoring) fail("scoring_func must be " + scoring);
  m.topk_method = j.get("topk_method", std::string(m.v3 ? "noaux_tc" : "greedy"));
  // V3's gate knows only noaux_tc (and raises on any other), V2's only the two greedy ones.
  if (m.v3 ? m.topk_method != "noaux_tc"
           : m.topk_method != "greedy" && m.topk_method != "group_limited_greedy")
    fail("topk_method " + m.topk_method + " for " + arch);
  c.n_group = m.topk_method == "greedy" ? 1 : j.get("n_group", int64_t{1});
  c.topk_group = m.topk_method == "greedy" ? 1 : j.get("topk_group", c.n_group);
  check_groups(c, "n_routed_experts");
  *cfg = c;
  return m;
}

/// The frequency of each rotary pair i < r/2: theta^(-2i/r), or YaRN's blend of it and it /
/// factor (the correction range of yarn_find_correction_range, clamped to the pairs, and the
/// linear ramp of yarn_linear_ramp_mask, as in modeling_deepseek.py).
inline Vec rope_freqs(const Mla& m, int64_t r, double theta) {
  Vec f(static_cast<size_t>(r / 2));
  const auto dim = static_cast<double>(r);
  auto corr_dim = [&](double rotations) {
    return dim * std::log(m.orig_ctx / (rotations * 2 * std::numbers::pi)) / (2 * std::log(theta));
  };
  double lo = 0, hi = 0;
  if (m.yarn) {
    lo = std::max(0.0, std::floor(corr_dim(m.beta_fast)));
    hi = std::min(dim - 1, std::ceil(corr_dim(m.beta_slow)));
    if (lo == hi) hi += 0.001;
  }
  for (int64_t i = 0; i < r / 2; ++i) {
    const double extra = std::pow(theta, -2.0 * static_cast<double>(i) / dim);
    if (!m.yarn) {
      f[i] = extra;
      continue;
    }
    const double ramp = std::clamp((static_cast<double>(i) - lo) / (hi - lo), 0.0, 1.0);
    f[i] = extra / m.factor * ramp + extra * (1 - ramp);  // inv_freq_mask = 1 - ramp
  }
  return f;
}

/// Rotary on the `r` values at off of v for position pos with pair frequencies `freq` and cos
/// and sin times `mult`: pairs (off + 2i, off + 2i + 1) when `interleave` (what de-interleaving
/// and then rotate_half amounts to on the stored order), else (off + i, off + i + r/2).
inline void rope(Vec& v, int64_t off, int64_t r, int64_t pos, const Vec& freq, double mult,
                 bool interleave) {
  for (int64_t i = 0; i < r / 2; ++i) {
    const double angle = static_cast<double>(pos) * freq[i];
    const double cs = std::cos(angle) * mult, sn = std::sin(angle) * mult;
    const int64_t ia = interleave ? off + 2 * i : off + i;
    const int64_t ib = interleave ? ia + 1 : ia + r / 2;
    const double a = v[ia], b = v[ib];
    v[ia] = a * cs - b * sn;
    v[ib] = b * cs + a * sn;
  }
}

/// (v - mean) / sqrt(var + eps) * w + b, var the population variance: torch's LayerNorm.
inline Vec layer_norm(const Vec& v, const Vec& w, const Vec& b, double eps) {
  const auto n = static_cast<double>(v.size());
  double mean = 0, var = 0;
  for (double x : v) mean += x;
  mean /= n;
  for (double x : v) var += (x - mean) * (x - mean);
  var /= n;
  const double inv = 1.0 / std::sqrt(var + eps);
  Vec out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = (v[i] - mean) * inv * w[i] + b[i];
  return out;
}

/// The keys each query attends to: [query i][key s <= i], true when kept; empty: all (dense).
using Selection = std::vector<std::vector<bool>>;

/// DeepSeek-V3.2's lightning indexer of attention prefix a ("model.layers.N.self_attn."), over
/// the attn-normed inputs hs and qr, the MLA query's q_a_layernorm outputs (one per position),
/// with MLA's pair frequencies freq. Per position p: iq = indexer.wq_b qr, Hi heads of Di;
/// ik = LayerNorm(indexer.wk h) by k_norm's weight and bias, eps 1e-6; on the first
/// qk_rope_head_dim values of each, rotary with pairs (i, i + R/2) whatever rope_interleave says
/// (V3.2's indexer layout is not interleaved; GLM-5's is: pairs (2i, 2i + 1)) and without YaRN's
/// cos/sin mscale; w =
/// indexer.weights_proj h * Hi^-0.5 * Di^-0.5. score(p, s) = sum_h max(0, iq_h . ik_s) w_h.
/// Query p keeps every s <= p while p + 1 <= index_topk, else the index_topk of largest score
/// (ties: the lower position first).
inline Selection dsa_select(const Tensors& st, const Config& c, const Mla& m, const std::string& a,
                            const std::vector<Vec>& hs, const std::vector<Vec>& qr,
                            const Vec& freq) {
  const std::string x = a + "indexer.";
  const int64_t Hi = m.index_heads, Di = m.index_dim;
  const Tensor& wq = tensor(st, x + "wq_b.weight", {Hi * Di, m.q_lora});
  const Tensor& wk = tensor(st, x + "wk.weight", {Di, c.E});
  const Tensor& ww = tensor(st, x + "weights_proj.weight", {Hi, c.E});
  const Vec norm_w = vec(st, x + "k_norm.weight", Di), norm_b = vec(st, x + "k_norm.bias", Di);
  const double w_scale =
      std::pow(static_cast<double>(Hi), -0.5) * std::pow(static_cast<double>(Di), -0.5);
  const size_t n = hs.size();
  std::vector<Vec> iq(n), ik(n), w(n);
  for (size_t s = 0; s < n; ++s) {
    const auto pos = static_cast<int64_t>(s);
    iq[s] = matvec(wq, qr[s]);
    for (int64_t h = 0; h < Hi; ++h)
      rope(iq[s], h * Di, m.rope, pos, freq, 1.0, m.index_interleave);
    ik[s] = layer_norm(matvec(wk, hs[s]), norm_w, norm_b, 1e-6);
    rope(ik[s], 0, m.rope, pos, freq, 1.0, m.index_interleave);
    w[s] = matvec(ww, hs[s]);
    for (double& e : w[s]) e *= w_scale;
  }
  Selection keep(n);
  for (size_t i = 0; i < n; ++i) {
    keep[i].assign(i + 1, true);
    if (static_cast<int64_t>(i) + 1 <= m.index_topk) continue;
    Vec score(i + 1, 0.0);
    for (size_t s = 0; s <= i; ++s)
      for (int64_t h = 0; h < Hi; ++h) {
        double d = 0;
        for (int64_t e = 0; e < Di; ++e) d += iq[i][h * Di + e] * ik[s][e];
        score[s] += std::max(0.0, d) * w[i][h];
      }
    std::vector<size_t> order(i + 1);
    for (size_t s = 0; s <= i; ++s) order[s] = s;
    std::ranges::stable_sort(order, [&](size_t l, size_t r) { return score[l] > score[r]; });
    keep[i].assign(i + 1, false);
    for (int64_t r = 0; r < m.index_topk; ++r) keep[i][order[r]] = true;
  }
  return keep;
}

/// Multi-head latent attention of layer prefix p ("model.layers.N."), causal, positions 0..n-1:
/// q = q_proj h, or q_b_proj(q_a_layernorm(q_a_proj h)), per head [nope | rope];
/// kv_a_proj_with_mqa h = [latent | k_rope]; per head [k_nope | v] = kv_b_proj(kv_a_layernorm
/// latent); k_rope, one per position, shared by every head; rotary on the rope parts only;
/// softmax((q_nope k_nope + q_rope k_rope) / sqrt(nope + rope)) v; o_proj. With DSA, each
/// query's softmax runs over dsa_select's keys only, the same for every head; `last` holds the
/// latest layer's choice, which a shared layer (GLM-5's indexer_types) reuses.
inline std::vector<Vec> attention(const Tensors& st, const Config& c, const Mla& m,
                                  const std::string& p, const std::vector<Vec>& hs,
                                  Selection* last) {
  const std::string a = p + "self_attn.";
  const int64_t H = c.H, qk = m.nope + m.rope, kvw = m.nope + m.v;
  const size_t n = hs.size();
  std::vector<Vec> q(n), qr(n), kv(n), kr(n), out(n);  // qr: q_a_layernorm outputs
  const Vec freq = rope_freqs(m, m.rope, c.rope_theta);
  const double mult =
      m.yarn ? yarn_mscale(m.factor, m.mscale) / yarn_mscale(m.factor, m.mscale_all_dim) : 1.0;
  for (size_t i = 0; i < n; ++i) {
    const auto pos = static_cast<int64_t>(i);
    if (m.q_lora > 0) {
      const Vec qa = matvec(tensor(st, a + "q_a_proj.weight", {m.q_lora, c.E}), hs[i]);
      qr[i] = rms_norm(qa, vec(st, a + "q_a_layernorm.weight", m.q_lora), c.eps);
      q[i] = matvec(tensor(st, a + "q_b_proj.weight", {H * qk, m.q_lora}), qr[i]);
    } else {
      q[i] = matvec(tensor(st, a + "q_proj.weight", {H * qk, c.E}), hs[i]);
    }
    const Vec ckv =
        matvec(tensor(st, a + "kv_a_proj_with_mqa.weight", {m.kv_lora + m.rope, c.E}), hs[i]);
    const Vec latent(ckv.begin(), ckv.begin() + m.kv_lora);
    kr[i].assign(ckv.begin() + m.kv_lora, ckv.end());
    const Vec ln = rms_norm(latent, vec(st, a + "kv_a_layernorm.weight", m.kv_lora), c.eps);
    kv[i] = matvec(tensor(st, a + "kv_b_proj.weight", {H * kvw, m.kv_lora}), ln);
    for (int64_t h = 0; h < H; ++h)
      rope(q[i], h * qk + m.nope, m.rope, pos, freq, mult, m.interleave);
    rope(kr[i], 0, m.rope, pos, freq, mult, m.interleave);
  }
  double scale = 1.0 / std::sqrt(static_cast<double>(qk));
  if (m.yarn && m.mscale_all_dim != 0) {
    const double ms = yarn_mscale(m.factor, m.mscale_all_dim);
    scale *= ms * ms;
  }
  const int64_t layer = std::stoll(p.substr(std::string("model.layers.").size()));
  const bool shared = !m.index_shared.empty() && m.index_shared[static_cast<size_t>(layer)];
  if (m.dsa && !shared) *last = dsa_select(st, c, m, a, hs, qr, freq);
  const Selection keep = m.dsa ? *last : Selection();
  const Tensor& wo = tensor(st, a + "o_proj.weight", {c.E, H * m.v});
  for (size_t i = 0; i < n; ++i) {
    Vec heads(static_cast<size_t>(H * m.v), 0.0);
    for (int64_t h = 0; h < H; ++h) {
      Vec score(i + 1);
      for (size_t s = 0; s <= i; ++s) {
        double d = 0;
        for (int64_t e = 0; e < m.nope; ++e) d += q[i][h * qk + e] * kv[s][h * kvw + e];
        for (int64_t e = 0; e < m.rope; ++e) d += q[i][h * qk + m.nope + e] * kr[s][e];
        score[s] =
            keep.empty() || keep[i][s] ? d * scale : -std::numeric_limits<double>::infinity();
      }
      softmax(score);
      for (size_t s = 0; s <= i; ++s)
        for (int64_t e = 0; e < m.v; ++e)
          heads[h * m.v + e] += score[s] * kv[s][h * kvw + m.nope + e];
    }
    out[i] = matvec(wo, heads);
  }
  return out;
}

/// DeepSeek-V2's gate (modeling_deepseek.py's MoEGate): softmax scores; topk_method greedy, or
/// group_limited_greedy: only the topk_group groups with the largest best score take part; the K
/// best scores among them; then either divided by their sum (K > 1 and norm_topk_prob) or times
/// routed_scaling_factor. (V2 masks the other groups' scores to 0, moe_ref to -inf: the same picks,
/// softmax scores being positive and K never above the kept experts.)
inline Picked v2_route(const Tensors& st, const Config& c, const std::string& p, const Vec& h) {
  Scores s;
  s.score = matvec(tensor(st, p + "mlp.gate.weight", {c.N, c.E}), h);
  softmax(s.score);
  s.choice = s.score;
  const bool normalize = c.K > 1 && c.norm_topk;
  Config unscaled = c;
  if (normalize) unscaled.routed_scale = 1;
  return group_limited_top_k(s, unscaled, normalize, /*by_best=*/true);
}

/// The feed-forward of layer l: DeepSeek-V3's gate is GLM-4.5's (moe_ref::glm_route: sigmoid
/// scores, selection by score + e_score_correction_bias, groups ranked by their two best, weights
/// normalized when norm_topk_prob, times routed_scaling_factor); V2's is v2_route.
inline Vec ffn(const Tensors& st, const Config& c, const Mla& m, int64_t l, const std::string& p,
               const Vec& h) {
  return dense_or_moe_ffn(st, c, l, p, h, m.v3 ? Router(glm_route) : Router(v2_route));
}

}  // namespace deepseek_ref

/// Logits [tokens.size() x vocab_size] of the Hugging Face DeepseekV2ForCausalLM,
/// DeepseekV3ForCausalLM, DeepseekV32ForCausalLM or GlmMoeDsaForCausalLM directory `dir`, in
/// double; row i = logits
/// after tokens[0..i] (causal, positions 0..n-1). Throws std::runtime_error naming the tensor or
/// key on a missing tensor (V3.2: the indexer's too), a shape that config.json does not imply, or
/// an unsupported config (rope_scaling other than yarn, attention_bias, moe_layer_freq other than
/// 1, an unknown topk_method; for V3.2 no q_lora_rank, a missing index_n_heads, index_head_dim
/// or index_topk, index_topk < 1).
inline std::vector<double> deepseek_reference_logits(const std::string& dir,
                                                     const std::vector<int32_t>& tokens) {
  using namespace deepseek_ref;
  Config c;
  const Mla m = read_config(dir, &c);
  const auto st = open_checkpoint(dir);
  Selection last;
  return forward_with(
      *st, c, "model.embed_tokens.weight", tokens,
      [&](const std::string& p, const std::vector<Vec>& hs) {
        return attention(*st, c, m, p, hs, &last);
      },
      [&](int64_t l, const std::string& p, const Vec& h) { return ffn(*st, c, m, l, p, h); });
}

}  // namespace troupe::testing
