// Test reference for Hugging Face Glm4MoeForCausalLM checkpoints (GLM-4.5, GLM-4.5-Air, GLM-4.6):
// a deliberately naive float64 forward pass that reads the checkpoint by its Hugging Face tensor
// names. Written from the semantics of transformers' modeling_glm4_moe.py, independently of
// troupe's engine and model loader (it uses only the safetensors container parser), so that tests
// can compare the engine's logits against it. Plain loops, no caching: for small test models.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/ggml_types.h"
#include "model/safetensors.h"

namespace troupe::testing {
namespace glm4moe_ref {

using Vec = std::vector<double>;
using Tensor = model::SafetensorsTensor;

[[noreturn]] inline void fail(const std::string& what) {
  throw std::runtime_error("glm4moe reference: " + what);
}

/// The config.json fields the forward pass uses (names as in the comments).
struct Config {
  int64_t vocab = 0, E = 0, L = 0, H = 0, Hkv = 0, D = 0, R = 0;  // R: rotary dims of a head
  int64_t I = 0;                                                  // intermediate_size
  int64_t F = 0, N = 0, K = 0, shared = 0;  // moe_intermediate_size, n_routed_experts, top-k
  int64_t first_dense = 1, n_group = 1, topk_group = 1;
  double rope_theta = 10000, eps = 1e-5, routed_scale = 1;
  bool attention_bias = false, qk_norm = false, norm_topk = true, tie = false;
};

inline Config read_config(const std::string& dir) {
  std::ifstream in(dir + "/config.json");
  if (!in) fail("cannot open " + dir + "/config.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  auto has = [&](const char* key) { return j.contains(key) && !j[key].is_null(); };
  auto get = [&](const char* key, auto dflt) {
    return has(key) ? j[key].get<decltype(dflt)>() : dflt;
  };
  auto req = [&](const char* key) {
    if (!has(key)) fail(std::string("config.json lacks ") + key);
    return j[key].get<int64_t>();
  };
  if (has("rope_scaling")) fail("rope_scaling is not supported");
  Config c;
  c.vocab = req("vocab_size");
  c.E = req("hidden_size");
  c.L = req("num_hidden_layers");
  c.H = req("num_attention_heads");
  c.Hkv = get("num_key_value_heads", int64_t{c.H});
  if (c.H <= 0 || c.Hkv <= 0 || c.H % c.Hkv != 0) fail("num_attention_heads % kv heads != 0");
  c.D = get("head_dim", int64_t{c.E / c.H});
  c.R = static_cast<int64_t>(static_cast<double>(c.D) * get("partial_rotary_factor", 0.5));
  c.rope_theta = get("rope_theta", 10000.0);
  c.eps = get("rms_norm_eps", 1e-5);
  c.attention_bias = get("attention_bias", false);
  c.qk_norm = get("use_qk_norm", false);
  c.first_dense = std::min(get("first_k_dense_replace", int64_t{1}), c.L);
  c.I = c.first_dense > 0 ? req("intermediate_size") : 0;
  if (c.first_dense < c.L) {  // some MoE layer
    c.F = req("moe_intermediate_size");
    c.N = req("n_routed_experts");
    c.K = req("num_experts_per_tok");
  }
  c.shared = get("n_shared_experts", int64_t{1});
  c.routed_scale = get("routed_scaling_factor", 1.0);
  c.norm_topk = get("norm_topk_prob", true);
  c.n_group = get("n_group", int64_t{1});
  c.topk_group = get("topk_group", int64_t{1});
  c.tie = get("tie_word_embeddings", false);
  if (c.R % 2 != 0 || c.R > c.D) fail("rotary dims must be even and at most head_dim");
  if (c.first_dense < c.L) {
    if (c.n_group <= 0 || c.N % c.n_group != 0) fail("n_routed_experts % n_group != 0");
    if (c.topk_group <= 0 || c.topk_group > c.n_group) fail("bad topk_group");
    if (c.K <= 0 || c.K > c.topk_group * (c.N / c.n_group)) fail("bad num_experts_per_tok");
  }
  return c;
}

/// The tensor `name`, which must exist, be F32/F16/BF16 and have `shape`.
inline const Tensor& tensor(const model::SafetensorsSet& st, const std::string& name,
                            const std::vector<int64_t>& shape) {
  const Tensor* t = st.find(name);
  if (t == nullptr) fail("missing tensor " + name);
  if (t->dtype != "F32" && t->dtype != "F16" && t->dtype != "BF16")
    fail("tensor " + name + " has unsupported dtype " + t->dtype);
  if (t->shape != shape) {
    std::string want = "[";
    for (size_t i = 0; i < shape.size(); ++i) want += (i ? ", " : "") + std::to_string(shape[i]);
    fail("tensor " + name + " has shape " + t->shape_string() + ", config.json implies " + want +
         "]");
  }
  return *t;
}

/// Row r of t (a 1-D tensor has the one row 0) as doubles.
inline Vec row(const Tensor& t, int64_t r) {
  const int64_t n = t.shape.back();
  Vec out(static_cast<size_t>(n));
  const bool f32 = t.dtype == "F32";
  const uint8_t* p = t.data + r * n * (f32 ? 4 : 2);
  for (int64_t i = 0; i < n; ++i) {
    if (f32) {
      float f;
      std::memcpy(&f, p + 4 * i, 4);
      out[i] = f;
    } else {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      out[i] = t.dtype == "F16" ? model::fp16_to_fp32(h) : model::bf16_to_fp32(h);
    }
  }
  return out;
}

inline double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

/// W x for a Linear weight W [out, in], read row by row.
inline Vec matvec(const Tensor& w, const Vec& x) {
  Vec out(static_cast<size_t>(w.shape[0]));
  for (int64_t r = 0; r < w.shape[0]; ++r) out[r] = dot(row(w, r), x);
  return out;
}

/// v / sqrt(mean(v^2) + eps) * w.
inline Vec rms_norm(const Vec& v, const Vec& w, double eps) {
  const double inv = 1.0 / std::sqrt(dot(v, v) / static_cast<double>(v.size()) + eps);
  Vec out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = v[i] * inv * w[i];
  return out;
}

/// down(silu(gate h) * up h) with prefix+"{gate,up,down}_proj.weight", hidden width `width`.
inline Vec swiglu(const model::SafetensorsSet& st, const std::string& prefix, int64_t E,
                  int64_t width, const Vec& h) {
  const Vec g = matvec(tensor(st, prefix + "gate_proj.weight", {width, E}), h);
  const Vec u = matvec(tensor(st, prefix + "up_proj.weight", {width, E}), h);
  Vec a(g.size());
  for (size_t i = 0; i < a.size(); ++i) a[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
  return matvec(tensor(st, prefix + "down_proj.weight", {E, width}), a);
}

/// Rotates the first R elements of head [off, off + D) of v for position pos (rotate_half style).
inline void rope(Vec& v, int64_t off, int64_t pos, const Config& c) {
  for (int64_t i = 0; i < c.R / 2; ++i) {
    const double inv_freq = std::pow(c.rope_theta, -2.0 * static_cast<double>(i) / c.R);
    const double angle = static_cast<double>(pos) * inv_freq;
    const double cs = std::cos(angle), sn = std::sin(angle);
    const double a = v[off + i], b = v[off + i + c.R / 2];
    v[off + i] = a * cs - b * sn;
    v[off + i + c.R / 2] = b * cs + a * sn;
  }
}

/// Projection prefix+name+".weight" [rows, E] of h, plus its bias when attention_bias says so.
inline Vec project(const model::SafetensorsSet& st, const Config& c, const std::string& name,
                   int64_t rows, const Vec& h) {
  Vec out = matvec(tensor(st, name + ".weight", {rows, c.E}), h);
  if (c.attention_bias && st.find(name + ".bias") != nullptr) {
    const Vec b = row(tensor(st, name + ".bias", {rows}), 0);
    for (size_t i = 0; i < out.size(); ++i) out[i] += b[i];
  }
  return out;
}

/// Causal GQA self-attention of layer prefix p over the normed inputs hs (one per position).
inline std::vector<Vec> attention(const model::SafetensorsSet& st, const Config& c,
                                  const std::string& p, const std::vector<Vec>& hs) {
  const size_t n = hs.size();
  std::vector<Vec> q(n), k(n), v(n), out(n);
  Vec qn, kn;
  if (c.qk_norm) {
    qn = row(tensor(st, p + "self_attn.q_norm.weight", {c.D}), 0);
    kn = row(tensor(st, p + "self_attn.k_norm.weight", {c.D}), 0);
  }
  auto norm_and_rotate = [&](Vec& x, int64_t heads, const Vec& w, int64_t pos) {
    for (int64_t j = 0; j < heads; ++j) {
      if (c.qk_norm) {
        const Vec head(x.begin() + j * c.D, x.begin() + (j + 1) * c.D);
        std::ranges::copy(rms_norm(head, w, c.eps), x.begin() + j * c.D);
      }
      rope(x, j * c.D, pos, c);
    }
  };
  for (size_t i = 0; i < n; ++i) {
    q[i] = project(st, c, p + "self_attn.q_proj", c.H * c.D, hs[i]);
    k[i] = project(st, c, p + "self_attn.k_proj", c.Hkv * c.D, hs[i]);
    v[i] = project(st, c, p + "self_attn.v_proj", c.Hkv * c.D, hs[i]);
    norm_and_rotate(q[i], c.H, qn, static_cast<int64_t>(i));
    norm_and_rotate(k[i], c.Hkv, kn, static_cast<int64_t>(i));
  }
  const Tensor& wo = tensor(st, p + "self_attn.o_proj.weight", {c.E, c.H * c.D});
  for (size_t i = 0; i < n; ++i) {
    Vec heads(static_cast<size_t>(c.H * c.D), 0.0);
    for (int64_t j = 0; j < c.H; ++j) {
      const int64_t qo = j * c.D, ko = j / (c.H / c.Hkv) * c.D;
      Vec score(i + 1);
      for (size_t s = 0; s <= i; ++s) {
        double d = 0;
        for (int64_t e = 0; e < c.D; ++e) d += q[i][qo + e] * k[s][ko + e];
        score[s] = d / std::sqrt(static_cast<double>(c.D));
      }
      const double mx = *std::ranges::max_element(score);
      double sum = 0;
      for (double& x : score) sum += (x = std::exp(x - mx));
      for (size_t s = 0; s <= i; ++s)
        for (int64_t e = 0; e < c.D; ++e) heads[qo + e] += score[s] / sum * v[s][ko + e];
    }
    out[i] = matvec(wo, heads);
  }
  return out;
}

/// The routed experts of layer prefix p for h and their weights (sigmoid scores, group limit,
/// top-K by score + correction bias, weights from the unbiased scores).
inline std::vector<std::pair<int64_t, double>> route(const model::SafetensorsSet& st,
                                                     const Config& c, const std::string& p,
                                                     const Vec& h) {
  const Vec logits = matvec(tensor(st, p + "mlp.gate.weight", {c.N, c.E}), h);
  Vec score(logits.size()), choice(logits.size(), 0.0);
  if (st.find(p + "mlp.gate.e_score_correction_bias") != nullptr)
    choice = row(tensor(st, p + "mlp.gate.e_score_correction_bias", {c.N}), 0);
  for (int64_t e = 0; e < c.N; ++e) {
    score[e] = 1.0 / (1.0 + std::exp(-logits[e]));
    choice[e] += score[e];
  }
  // Group limit: keep the topk_group groups whose two best choices sum highest.
  const int64_t size = c.N / c.n_group;
  std::vector<std::pair<double, int64_t>> groups;  // (-group score, group): sorts best first
  for (int64_t g = 0; g < c.n_group; ++g) {
    Vec m(choice.begin() + g * size, choice.begin() + (g + 1) * size);
    std::ranges::sort(m, std::greater<>());
    groups.emplace_back(-(m[0] + (size > 1 ? m[1] : 0.0)), g);
  }
  std::ranges::sort(groups);
  for (int64_t r = c.topk_group; r < c.n_group; ++r)
    for (int64_t e = groups[r].second * size; e < (groups[r].second + 1) * size; ++e)
      choice[e] = -std::numeric_limits<double>::infinity();
  // Top K by choice (ties: lower index first); weights are the unbiased scores.
  std::vector<int64_t> order(static_cast<size_t>(c.N));
  for (int64_t e = 0; e < c.N; ++e) order[e] = e;
  std::ranges::stable_sort(order, [&](int64_t a, int64_t b) { return choice[a] > choice[b]; });
  std::vector<std::pair<int64_t, double>> picked;
  double sum = 0;
  for (int64_t r = 0; r < c.K; ++r) {
    picked.emplace_back(order[r], score[order[r]]);
    sum += score[order[r]];
  }
  for (auto& [e, w] : picked) w = (c.norm_topk ? w / (sum + 1e-20) : w) * c.routed_scale;
  return picked;
}

/// The MoE feed-forward of layer prefix p: routed experts plus the shared experts.
inline Vec moe(const model::SafetensorsSet& st, const Config& c, const std::string& p,
               const Vec& h) {
  Vec out(static_cast<size_t>(c.E), 0.0);
  for (const auto& [e, w] : route(st, c, p, h)) {
    const Vec y = swiglu(st, p + "mlp.experts." + std::to_string(e) + ".", c.E, c.F, h);
    for (int64_t i = 0; i < c.E; ++i) out[i] += w * y[i];
  }
  if (c.shared > 0) {
    const Vec y = swiglu(st, p + "mlp.shared_experts.", c.E, c.F * c.shared, h);
    for (int64_t i = 0; i < c.E; ++i) out[i] += y[i];
  }
  return out;
}

}  // namespace glm4moe_ref

/// Logits [tokens.size() x vocab_size], row i = logits after tokens[0..i] (causal, positions
/// 0..n-1), computed in double from the Hugging Face Glm4MoeForCausalLM directory `dir`
/// (config.json + model.safetensors or a sharded index). Layers >= num_hidden_layers (the MTP
/// layer) are ignored. Throws std::runtime_error naming the tensor or key on a missing tensor, a
/// shape that config.json does not imply, or a bad config.
inline std::vector<double> glm4moe_reference_logits(const std::string& dir,
                                                    const std::vector<int32_t>& tokens) {
  using namespace glm4moe_ref;
  const Config c = read_config(dir);
  auto opened = model::SafetensorsSet::open_dir(dir);
  if (!opened) fail(opened.error().message);
  const model::SafetensorsSet& st = **opened;

  const Tensor& embed = tensor(st, "model.embed_tokens.weight", {c.vocab, c.E});
  std::vector<Vec> x;
  for (int32_t t : tokens) {
    if (t < 0 || t >= c.vocab) fail("token " + std::to_string(t) + " outside the vocabulary");
    x.push_back(row(embed, t));
  }
  for (int64_t l = 0; l < c.L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const Vec in_norm = row(tensor(st, p + "input_layernorm.weight", {c.E}), 0);
    const Vec post_norm = row(tensor(st, p + "post_attention_layernorm.weight", {c.E}), 0);
    std::vector<Vec> hs;
    for (const Vec& xi : x) hs.push_back(rms_norm(xi, in_norm, c.eps));
    const std::vector<Vec> o = attention(st, c, p, hs);
    for (size_t i = 0; i < x.size(); ++i) {
      for (int64_t e = 0; e < c.E; ++e) x[i][e] += o[i][e];
      const Vec h = rms_norm(x[i], post_norm, c.eps);
      const Vec ffn = l < c.first_dense ? swiglu(st, p + "mlp.", c.E, c.I, h) : moe(st, c, p, h);
      for (int64_t e = 0; e < c.E; ++e) x[i][e] += ffn[e];
    }
  }
  const Vec final_norm = row(tensor(st, "model.norm.weight", {c.E}), 0);
  const Tensor& head = c.tie ? embed : tensor(st, "lm_head.weight", {c.vocab, c.E});
  std::vector<double> logits;
  logits.reserve(x.size() * static_cast<size_t>(c.vocab));
  for (const Vec& xi : x) {
    const Vec y = matvec(head, rms_norm(xi, final_norm, c.eps));
    logits.insert(logits.end(), y.begin(), y.end());
  }
  return logits;
}

}  // namespace troupe::testing
