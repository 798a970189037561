// A test reference for Meta's Llama 4 text decoder (Scout, Maverick) in Hugging Face form
// (Llama4ForConditionalGeneration, text part only, or Llama4ForCausalLM): a deliberately naive
// float64 forward pass that reads the checkpoint by its Hugging Face tensor names, written from
// the semantics of transformers' modeling_llama4.py, independently of troupe's engine, model
// loader and rope code (it uses only the safetensors container parser). Interleaved-pair rotary
// with llama3 scaling, weightless q/k RMSNorm and chunked attention on the rope layers, query
// temperature tuning on the NoPE layers, dense or MoE feed-forward (sigmoid top-K router whose
// score scales the expert's input, plus a shared expert). The tensor access and the SwiGLU MLP
// are tests/hf_moe_reference.h's. Plain loops, no caching: for small test models.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/hf_moe_reference.h"

namespace troupe::testing {
namespace llama4_ref {

using namespace moe_ref;  // NOLINT(google-build-using-namespace): the shared pieces

/// The Llama 4 fields of text_config, beside moe_ref::Config's (vocab, E, L, H, Hkv, D, F: the
/// width of a routed and of the shared expert, N, K, rope_theta, eps, tie).
struct Llama4 {
  std::string prefix;         // "language_model.model." or "model."
  std::string head;           // "language_model.lm_head.weight" or "lm_head.weight"
  int64_t I = 0;              // intermediate_size_mlp: width of the dense layers' MLP
  std::vector<bool> moe;      // [L]: layer in moe_layers
  std::vector<bool> rope;     // [L]: no_rope_layers[l] == 1 (rotary, qk norm, chunked)
  int64_t chunk = 8192;       // attention_chunk_size
  bool temperature = true;    // attn_temperature_tuning
  double floor_scale = 8192;  // floor_scale
  double attn_scale = 0.1;    // attn_scale
  bool qk_norm = true;        // use_qk_norm
  Vec inv_freq;               // [D/2]: rotary frequency of pair i, llama3-scaled when asked
};

/// theta^(-2i/D) for each pair i < D/2, then transformers' _compute_llama3_parameters when
/// rope_scaling (`rs`, null for none) says "llama3": long wavelengths divided by factor, short
/// ones kept, those between blended linearly in orig / wavelen.
inline Vec llama3_inv_freq(int64_t D, double theta, const nlohmann::json& rs) {
  Vec f(static_cast<size_t>(D / 2));
  for (int64_t i = 0; i < D / 2; ++i)
    f[i] = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(D));
  if (rs.is_null()) return f;
  const std::string type = rs.value("rope_type", rs.value("type", std::string()));
  if (type != "llama3") fail("rope_scaling type \"" + type + "\" is not supported (llama3)");
  const auto get = [&](const char* k) {
    if (!rs.contains(k) || !rs[k].is_number()) fail(std::string("rope_scaling lacks ") + k);
    return rs[k].get<double>();
  };
  const double factor = get("factor"), low = get("low_freq_factor"), high = get("high_freq_factor"),
               orig = get("original_max_position_embeddings");
  const double low_wavelen = orig / low, high_wavelen = orig / high;
  for (double& x : f) {
    const double wavelen = 2 * std::numbers::pi / x;
    if (wavelen > low_wavelen) {
      x /= factor;
    } else if (wavelen >= high_wavelen) {  // medium: blend
      const double smooth = (orig / wavelen - low) / (high - low);
      x = (1 - smooth) * x / factor + smooth * x;
    }
  }
  return f;
}

/// A list of layer indices or flags from config key `key` (`dflt` when absent or null).
inline std::vector<int64_t> int_list(const ConfigJson& j, const char* key,
                                     std::vector<int64_t> dflt) {
  if (!j.has(key)) return dflt;
  if (!j.j[key].is_array()) fail(std::string(key) + " must be a list");
  return j.j[key].get<std::vector<int64_t>>();
}

/// config.json of `dir`: Llama4ForConditionalGeneration (fields under text_config, tensors under
/// "language_model.") or Llama4ForCausalLM (flat); null counts as absent.
inline Llama4 read_config(const std::string& dir, Config* cfg) {
  ConfigJson j(dir);
  Llama4 m;
  const std::string arch = j.has("architectures") ? j.j["architectures"].at(0).get<std::string>()
                           : j.has("text_config") ? "Llama4ForConditionalGeneration"
                                                  : "Llama4ForCausalLM";
  if (arch == "Llama4ForConditionalGeneration") {
    if (!j.has("text_config")) fail("Llama4ForConditionalGeneration config lacks text_config");
    j.j = nlohmann::json(j.j["text_config"]);
    m.prefix = "language_model.model.";
    m.head = "language_model.lm_head.weight";
  } else if (arch == "Llama4ForCausalLM") {
    m.prefix = "model.";
    m.head = "lm_head.weight";
  } else {
    fail("architectures[0] is " + arch + " (Llama4ForConditionalGeneration, Llama4ForCausalLM)");
  }
  const nlohmann::json rs = j.has("rope_scaling") ? j.j["rope_scaling"] : nlohmann::json();
  j.j.erase("rope_scaling");  // read_common refuses every scaling
  Config c = read_common(j);
  c.rope_theta = j.get("rope_theta", 500000.0);  // transformers' Llama4TextConfig default
  c.eps = j.get("rms_norm_eps", 1e-5);
  if (c.D <= 0 || c.D % 2 != 0) fail("head_dim must be positive and even");
  m.inv_freq = llama3_inv_freq(c.D, c.rope_theta, rs);

  const int64_t step = j.get("interleave_moe_layer_step", int64_t{1});
  if (step <= 0) fail("interleave_moe_layer_step must be positive");
  std::vector<int64_t> dflt_moe, dflt_rope;
  for (int64_t l = step - 1; l < c.L; l += step) dflt_moe.push_back(l);
  for (int64_t l = 0; l < c.L; ++l) dflt_rope.push_back((l + 1) % 4 != 0 ? 1 : 0);
  m.moe.assign(static_cast<size_t>(c.L), false);
  for (int64_t l : int_list(j, "moe_layers", dflt_moe)) {
    if (l < 0 || l >= c.L) fail("moe_layers holds " + std::to_string(l) + ", outside the layers");
    m.moe[l] = true;
  }
  const std::vector<int64_t> rope = int_list(j, "no_rope_layers", dflt_rope);
  if (static_cast<int64_t>(rope.size()) != c.L)
    fail("no_rope_layers has " + std::to_string(rope.size()) + " entries, num_hidden_layers " +
         std::to_string(c.L));
  for (int64_t r : rope) {
    if (r != 0 && r != 1) fail("no_rope_layers entries must be 0 or 1");
    m.rope.push_back(r == 1);
  }

  const bool any_moe = std::ranges::find(m.moe, true) != m.moe.end();
  const bool any_dense = std::ranges::find(m.moe, false) != m.moe.end();
  if (any_dense) m.I = j.req("intermediate_size_mlp");
  if (any_moe) {
    c.F = j.req("intermediate_size");
    c.N = j.req("num_local_experts");
    c.K = j.req("num_experts_per_tok");
    if (c.K <= 0 || c.K > c.N) fail("bad num_experts_per_tok");
  }
  m.chunk = j.get("attention_chunk_size", int64_t{8192});
  if (m.chunk <= 0) fail("attention_chunk_size must be positive");
  // Python truthiness, as transformers tests it: Meta's configs give a number (4).
  m.temperature =
      !j.has("attn_temperature_tuning") || (j.j["attn_temperature_tuning"].is_number()
                                                ? j.j["attn_temperature_tuning"].get<double>() != 0
                                                : j.j["attn_temperature_tuning"].get<bool>());
  m.floor_scale = j.get("floor_scale", 8192.0);
  if (m.floor_scale <= 0) fail("floor_scale must be positive");
  m.attn_scale = j.get("attn_scale", 0.1);
  m.qk_norm = j.get("use_qk_norm", true);
  *cfg = c;
  return m;
}

/// Rotates each of the `heads` heads of v (D values each) for position pos: pairs
/// (2i, 2i + 1) by pos * inv_freq[i], as view_as_complex on adjacent values does.
inline void rope_interleaved(Vec& v, int64_t heads, int64_t D, int64_t pos, const Vec& inv_freq) {
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < D / 2; ++i) {
      const double angle = static_cast<double>(pos) * inv_freq[i];
      const double cs = std::cos(angle), sn = std::sin(angle);
      const int64_t ia = h * D + 2 * i;
      const double a = v[ia], b = v[ia + 1];
      v[ia] = a * cs - b * sn;
      v[ia + 1] = b * cs + a * sn;
    }
}

/// Each head of v becomes head / sqrt(mean(head^2) + eps): Llama4TextL2Norm, no weight.
inline void norm_heads(Vec& v, int64_t D, double eps) {
  const Vec ones(static_cast<size_t>(D), 1.0);
  for (size_t off = 0; off < v.size(); off += static_cast<size_t>(D)) {
    const Vec head(v.begin() + static_cast<int64_t>(off),
                   v.begin() + static_cast<int64_t>(off) + D);
    std::ranges::copy(rms_norm(head, ones, eps), v.begin() + static_cast<int64_t>(off));
  }
}

/// Self-attention of layer l (prefix p) over the normed inputs hs (one per position 0..n-1).
/// Rope layers: interleaved rotary, then (use_qk_norm) weightless per-head RMSNorm of q and k,
/// and each query sees only the keys of its own attention_chunk_size chunk. NoPE layers: q times
/// log(floor((pos + 1) / floor_scale) + 1) * attn_scale + 1 (attn_temperature_tuning), every
/// earlier key visible. Softmax(q k / sqrt(D)) v over GQA heads, then o_proj.
inline std::vector<Vec> attention(const Tensors& st, const Config& c, const Llama4& m, int64_t l,
                                  const std::string& p, const std::vector<Vec>& hs) {
  const std::string a = p + "self_attn.";
  const bool rope = m.rope[l];
  const size_t n = hs.size();
  std::vector<Vec> q(n), k(n), v(n), out(n);
  for (size_t i = 0; i < n; ++i) {
    const auto pos = static_cast<int64_t>(i);
    q[i] = matvec(tensor(st, a + "q_proj.weight", {c.H * c.D, c.E}), hs[i]);    // [H*D]
    k[i] = matvec(tensor(st, a + "k_proj.weight", {c.Hkv * c.D, c.E}), hs[i]);  // [Hkv*D]
    v[i] = matvec(tensor(st, a + "v_proj.weight", {c.Hkv * c.D, c.E}), hs[i]);  // [Hkv*D]
    if (rope) {
      rope_interleaved(q[i], c.H, c.D, pos, m.inv_freq);
      rope_interleaved(k[i], c.Hkv, c.D, pos, m.inv_freq);
      if (m.qk_norm) {
        norm_heads(q[i], c.D, c.eps);
        norm_heads(k[i], c.D, c.eps);
      }
    } else if (m.temperature) {
      const double t =
          std::log(std::floor(static_cast<double>(pos + 1) / m.floor_scale) + 1) * m.attn_scale + 1;
      for (double& x : q[i]) x *= t;
    }
  }
  const Tensor& wo = tensor(st, a + "o_proj.weight", {c.E, c.H * c.D});
  for (size_t i = 0; i < n; ++i) {
    // Chunked attention: the first visible key of a rope layer starts the query's chunk.
    const size_t first = rope ? i / static_cast<size_t>(m.chunk) * static_cast<size_t>(m.chunk) : 0;
    Vec heads(static_cast<size_t>(c.H * c.D), 0.0);
    for (int64_t h = 0; h < c.H; ++h) {
      const int64_t qo = h * c.D, ko = h / (c.H / c.Hkv) * c.D;
      Vec score(i + 1 - first);
      for (size_t s = first; s <= i; ++s) {
        double d = 0;
        for (int64_t e = 0; e < c.D; ++e) d += q[i][qo + e] * k[s][ko + e];
        score[s - first] = d / std::sqrt(static_cast<double>(c.D));
      }
      softmax(score);
      for (size_t s = first; s <= i; ++s)
        for (int64_t e = 0; e < c.D; ++e) heads[qo + e] += score[s - first] * v[s][ko + e];
    }
    out[i] = matvec(wo, heads);
  }
  return out;
}

/// y @ W for the slice e of a stacked expert tensor W [N, rows, cols]: out[j] = sum_i y[i] *
/// W[e][i][j], read row by row.
inline Vec stacked_matmul(const Tensor& w, int64_t e, const Vec& y) {
  const int64_t rows = w.shape[1];
  Vec out(static_cast<size_t>(w.shape[2]), 0.0);
  for (int64_t i = 0; i < rows; ++i) add_scaled(out, y[i], row(w, e * rows + i));
  return out;
}

/// The MoE feed-forward of prefix p for the post-attention-normed x: router logits [N]; the K
/// largest (ties: lower index first) each give expert e the input x * sigmoid(logit_e) (the score
/// scales the input, not the output); expert e(y) = (silu(y @ gate_e) * (y @ up_e)) @ down_e with
/// gate and up the two halves of gate_up_proj [N, E, 2F]; plus the shared expert of x.
inline Vec moe_ffn(const Tensors& st, const Config& c, const std::string& p, const Vec& x) {
  const std::string f = p + "feed_forward.";
  Scores s;
  s.choice = matvec(tensor(st, f + "router.weight", {c.N, c.E}), x);
  s.score = s.choice;
  for (double& z : s.score) z = sigmoid(z);
  const Tensor& gate_up = tensor(st, f + "experts.gate_up_proj", {c.N, c.E, 2 * c.F});
  const Tensor& down = tensor(st, f + "experts.down_proj", {c.N, c.F, c.E});
  Vec out = swiglu(st, f + "shared_expert.", kProjNames, c.E, c.F, x);
  for (const auto& [e, score] : top_k(s, c.K, /*normalize=*/false)) {
    Vec y = x;
    for (double& z : y) z *= score;
    const Vec gu = stacked_matmul(gate_up, e, y);  // [2F]: gate, then up
    Vec act(static_cast<size_t>(c.F));
    for (int64_t j = 0; j < c.F; ++j) act[j] = silu(gu[j]) * gu[c.F + j];
    add_scaled(out, 1.0, stacked_matmul(down, e, act));
  }
  return out;
}

/// Logits [tokens x vocab]: embed_tokens; per layer h += attention(input_layernorm h),
/// h += (MoE or dense MLP)(post_attention_layernorm h); lm_head (or the embedding when tied) of
/// norm h.
inline std::vector<double> forward(const Tensors& st, const Config& c, const Llama4& m,
                                   const std::vector<int32_t>& tokens) {
  const Tensor& embed = tensor(st, m.prefix + "embed_tokens.weight", {c.vocab, c.E});
  std::vector<Vec> h;
  for (int32_t t : tokens) {
    if (t < 0 || t >= c.vocab) fail("token " + std::to_string(t) + " outside the vocabulary");
    h.push_back(row(embed, t));
  }
  for (int64_t l = 0; l < c.L; ++l) {
    const std::string p = m.prefix + "layers." + std::to_string(l) + ".";
    const Vec in_norm = vec(st, p + "input_layernorm.weight", c.E);
    const Vec post_norm = vec(st, p + "post_attention_layernorm.weight", c.E);
    std::vector<Vec> xs;
    for (const Vec& hi : h) xs.push_back(rms_norm(hi, in_norm, c.eps));
    const std::vector<Vec> o = attention(st, c, m, l, p, xs);
    for (size_t i = 0; i < h.size(); ++i) {
      add_scaled(h[i], 1.0, o[i]);
      const Vec x = rms_norm(h[i], post_norm, c.eps);
      add_scaled(h[i], 1.0,
                 m.moe[l] ? moe_ffn(st, c, p, x)
                          : swiglu(st, p + "feed_forward.", kProjNames, c.E, m.I, x));
    }
  }
  const Vec final_norm = vec(st, m.prefix + "norm.weight", c.E);
  const Tensor& head = c.tie ? embed : tensor(st, m.head, {c.vocab, c.E});
  std::vector<double> logits;
  logits.reserve(h.size() * static_cast<size_t>(c.vocab));
  for (const Vec& hi : h) {
    const Vec y = matvec(head, rms_norm(hi, final_norm, c.eps));
    logits.insert(logits.end(), y.begin(), y.end());
  }
  return logits;
}

}  // namespace llama4_ref

/// Logits [tokens.size() x vocab_size] of the Hugging Face Llama 4 directory `hf_dir`
/// (Llama4ForConditionalGeneration's text decoder, or Llama4ForCausalLM; config.json +
/// model.safetensors or a sharded index), in double; row i = logits after tokens[0..i] (causal,
/// positions 0..n-1). Vision tensors are ignored. Throws std::runtime_error naming the tensor or
/// key on a missing tensor, a shape that config.json does not imply, or a bad or unsupported
/// config (rope_scaling other than llama3, malformed moe_layers or no_rope_layers).
inline std::vector<double> llama4_reference_logits(const std::string& hf_dir,
                                                   const std::vector<int32_t>& tokens) {
  using namespace llama4_ref;
  Config c;
  const Llama4 m = read_config(hf_dir, &c);
  const auto st = open_checkpoint(hf_dir);
  return forward(*st, c, m, tokens);
}

}  // namespace troupe::testing
