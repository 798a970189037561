// Test references for four Hugging Face MoE checkpoint families: Glm4MoeForCausalLM (GLM-4.5,
// GLM-4.5-Air, GLM-4.6), MiniMaxM2ForCausalLM (MiniMax-M2), BailingMoeV2ForCausalLM
// (inclusionAI's Ling-2.0: Ling-mini-2.0, Ling-flash-2.0, Ling-1T) and Baidu's
// Ernie4_5_MoeForCausalLM (with its dense Ernie4_5ForCausalLM), and the dense MistralForCausalLM
// with its sliding window and Phi3ForCausalLM. Each is a deliberately naive
// float64 forward pass that reads the checkpoint by its Hugging Face tensor names, written from the
// semantics of transformers' modeling_glm4_moe.py, MiniMax's modeling_minimax_m2.py,
// inclusionAI's modeling_bailing_moe_v2.py and transformers' modeling_ernie4_5_moe.py,
// independently of troupe's engine and model loader (it uses only the safetensors container
// parser), so that tests can compare the engine's logits against it. The generic pieces (RMSNorm,
// projections, SwiGLU, rotary, causal GQA attention, sigmoid scoring, group-limited top-k routing,
// dense-or-MoE feed-forward, the layer loop) are shared; only config reading, q/k-norm layout,
// fused or separate q/k/v, routing details and tensor names differ. Plain loops, no caching: for
// small test models.
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
#include "tests/reference_math.h"

namespace troupe::testing {
namespace moe_ref {

using namespace refmath;  // NOLINT(google-build-using-namespace): the shared arithmetic
using Tensor = model::SafetensorsTensor;
using Tensors = model::SafetensorsSet;

[[noreturn]] inline void fail(const std::string& what) {
  throw std::runtime_error("moe reference: " + what);
}

// ---------------------------------------------------------------------------------------------
// Configuration

/// How q and k are RMS-normed before rotary: not at all, per head (GLM, Qwen3: weights [D]), or
/// over all heads of the position together (MiniMax-M2: weights [H*D] and [Hkv*D], one mean).
enum class QkNorm { none, per_head, whole };

/// The config.json fields the forward passes use (names as in the comments); fields a model does
/// not have keep their defaults.
struct Config {
  int64_t vocab = 0, E = 0, L = 0, H = 0, Hkv = 0, D = 0, R = 0;  // R: rotary dims of a head
  int64_t F = 0, N = 0, K = 0;  // width of one routed expert, routed experts, experts per token
  double rope_theta = 10000, eps = 1e-5;
  bool attention_bias = false, tie = false;  // attention_bias: GLM's; Bailing's use_qkv_bias
  QkNorm qk_norm = QkNorm::none;
  // GLM and Bailing only.
  int64_t I = 0;       // intermediate_size of the dense layers
  int64_t shared = 0;  // n_shared_experts (GLM), num_shared_experts (Bailing)
  int64_t first_dense = 0, n_group = 1, topk_group = 1;
  double routed_scale = 1;
  bool norm_topk = true;
  // MiniMax-M2 and Bailing only.
  bool routing_bias = true;  // use_routing_bias (MiniMax), moe_router_enable_expert_bias (Bailing)
  // Mistral only: sliding_window; position i attends to s with i - W < s <= i (0: to all s <= i).
  int64_t W = 0;
  // Phi-3's LongRoPE: a divisor per rotary pair (empty: none) and the factor on cos and sin.
  std::vector<double> ext;
  double rope_mscale = 1;
  // ERNIE 4.5: interleaved rotary; MoE layers moe_start <= l <= moe_end, (l + 1) % moe_interval
  // == 0; the picked probabilities divided by at least norm_min.
  bool interleaved = false;
  int64_t moe_start = 0, moe_end = -1, moe_interval = 1;
  double norm_min = 1e-12;
};

/// config.json of `dir` with typed look-ups; null counts as absent.
struct ConfigJson {
  nlohmann::json j;
  explicit ConfigJson(const std::string& dir) {
    std::ifstream in(dir + "/config.json");
    if (!in) fail("cannot open " + dir + "/config.json");
    j = nlohmann::json::parse(in);
  }
  bool has(const char* key) const { return j.contains(key) && !j[key].is_null(); }
  template <typename T>
  T get(const char* key, T dflt) const {
    return has(key) ? j[key].get<T>() : dflt;
  }
  int64_t req(const char* key) const {
    if (!has(key)) fail(std::string("config.json lacks ") + key);
    return j[key].get<int64_t>();
  }
};

/// The fields both models read the same way: sizes, heads, rope_theta, tying.
inline Config read_common(const ConfigJson& j, bool rope_scaling_read_elsewhere = false) {
  if (j.has("rope_scaling") && !rope_scaling_read_elsewhere) fail("rope_scaling is not supported");
  Config c;
  c.vocab = j.req("vocab_size");
  c.E = j.req("hidden_size");
  c.L = j.req("num_hidden_layers");
  c.H = j.req("num_attention_heads");
  c.Hkv = j.get("num_key_value_heads", int64_t{c.H});
  if (c.H <= 0 || c.Hkv <= 0 || c.H % c.Hkv != 0) fail("num_attention_heads % kv heads != 0");
  c.D = j.get("head_dim", int64_t{c.E / c.H});
  c.rope_theta = j.get("rope_theta", 10000.0);
  c.tie = j.get("tie_word_embeddings", false);
  return c;
}

inline void check_rotary(const Config& c) {
  if (c.R % 2 != 0 || c.R < 0 || c.R > c.D) fail("rotary dims must be even and at most head_dim");
}

/// The group-limited routing sizes (GLM, Bailing; `experts_key`: the key of N), when some layer is
/// MoE.
inline void check_groups(const Config& c, const std::string& experts_key) {
  if (c.first_dense >= c.L) return;
  if (c.n_group <= 0 || c.N % c.n_group != 0) fail(experts_key + " % n_group != 0");
  if (c.topk_group <= 0 || c.topk_group > c.n_group) fail("bad topk_group");
  if (c.K <= 0 || c.K > c.topk_group * (c.N / c.n_group)) fail("bad num_experts_per_tok");
}

/// MistralForCausalLM (Mistral 7B, Nemo, Small 3): Llama's dense decoder, whole-head NeoX rotary,
/// SwiGLU MLPs of intermediate_size, and sliding_window when set (transformers' MistralConfig
/// defaults it to 4096; this reference reads only what the file says).
inline Config read_mistral_config(const std::string& dir) {
  const ConfigJson j(dir);
  Config c = read_common(j);
  c.R = c.D;
  c.eps = j.get("rms_norm_eps", 1e-6);
  c.I = j.req("intermediate_size");
  c.W = j.get("sliding_window", int64_t{0});
  if (c.W < 0) fail("bad sliding_window");
  if (j.get("hidden_act", std::string("silu")) != "silu") fail("hidden_act must be silu");
  return c;
}

/// Phi3ForCausalLM (Phi-3, Phi-3.5-mini, Phi-4, Phi-4-mini): Mistral's decoder with the q, k and
/// v projections fused in self_attn.qkv_proj and gate and up in mlp.gate_up_proj, NeoX rotary on
/// partial_rotary_factor of each head, and LongRoPE: rope_scaling {"type": "longrope",
/// short_factor, long_factor} ("su" its older name), each pair's frequency divided by its
/// short_factor, or by its long_factor when the `n_tokens` of the one forward pass are more than
/// original_max_position_embeddings (transformers' rule for a pass over a whole prompt), cos and
/// sin multiplied by attention_factor or else sqrt(1 + ln(s) /
/// ln(original_max_position_embeddings)), s the ratio max_position_embeddings /
/// original_max_position_embeddings (1 when s <= 1).
inline Config read_phi3_config(const std::string& dir, size_t n_tokens) {
  const ConfigJson j(dir);
  Config c = read_common(j, true);
  c.R = static_cast<int64_t>(static_cast<double>(c.D) * j.get("partial_rotary_factor", 1.0));
  c.eps = j.get("rms_norm_eps", 1e-5);
  c.I = j.req("intermediate_size");
  c.W = j.get("sliding_window", int64_t{0});
  if (c.W < 0) fail("bad sliding_window");
  if (j.get("hidden_act", std::string("silu")) != "silu") fail("hidden_act must be silu");
  check_rotary(c);
  if (j.has("rope_scaling")) {
    const nlohmann::json& r = j.j["rope_scaling"];
    const std::string type = r.value("type", r.value("rope_type", std::string()));
    if (type != "longrope" && type != "su") fail("rope_scaling other than longrope (or su)");
    const double orig = static_cast<double>(j.req("original_max_position_embeddings"));
    const char* which = static_cast<double>(n_tokens) > orig ? "long_factor" : "short_factor";
    for (const auto& x : r.at(which)) c.ext.push_back(x.get<double>());
    if (static_cast<int64_t>(c.ext.size()) != c.R / 2)
      fail(std::string(which) + ": one per rotary pair");
    const double ratio = static_cast<double>(j.req("max_position_embeddings")) / orig;
    c.rope_mscale = r.contains("attention_factor") && !r["attention_factor"].is_null()
                        ? r["attention_factor"].get<double>()
                    : ratio <= 1 ? 1.0
                                 : std::sqrt(1 + std::log(ratio) / std::log(orig));
  }
  return c;
}

/// Ernie4_5ForCausalLM (ERNIE-4.5-0.3B) and Ernie4_5_MoeForCausalLM (ERNIE-4.5-21B-A3B,
/// -300B-A47B): Llama's decoder rotating interleaved pairs over whole heads (head_dim: the dense
/// config's default 128, the MoE config's hidden_size / heads), tied embeddings unless
/// tie_word_embeddings says otherwise, rope_theta 500000 by default; the MoE model's layers from
/// moe_layer_start_index to moe_layer_end_index (-1: the last), every moe_layer_interval-th,
/// route to moe_k of moe_num_experts experts beside moe_num_shared_experts shared ones.
inline Config read_ernie45_config(const std::string& dir) {
  const ConfigJson j(dir);
  Config c = read_common(j);
  const bool moe = j.j.at("architectures").at(0) == "Ernie4_5_MoeForCausalLM";
  if (!j.has("head_dim")) c.D = moe ? c.E / c.H : 128;
  if (!j.has("rope_theta")) c.rope_theta = 500000;
  c.tie = j.get("tie_word_embeddings", true);
  c.R = c.D;
  c.interleaved = true;
  c.eps = j.get("rms_norm_eps", 1e-5);
  c.I = j.req("intermediate_size");
  if (j.get("use_bias", false)) fail("use_bias true is not supported");
  if (j.get("hidden_act", std::string("silu")) != "silu") fail("hidden_act must be silu");
  if (!moe) return c;
  if (j.get("moe_gate_act", std::string("softmax")) != "softmax")
    fail("moe_gate_act must be softmax");
  c.N = j.get("moe_num_experts", int64_t{64});
  c.K = j.get("moe_k", int64_t{6});
  c.F = j.get("moe_intermediate_size", int64_t{1536});
  c.shared = j.get("moe_num_shared_experts", int64_t{2});
  c.moe_start = j.get("moe_layer_start_index", int64_t{1});
  c.moe_end = j.get("moe_layer_end_index", int64_t{-1});
  if (c.moe_end == -1) c.moe_end = c.L - 1;
  c.moe_interval = j.get("moe_layer_interval", int64_t{1});
  c.norm_min = j.get("moe_norm_min", 1e-12);
  if (c.K <= 0 || c.K > c.N || c.moe_interval <= 0 || c.shared < 0) fail("bad MoE settings");
  return c;
}

inline Config read_glm4moe_config(const std::string& dir) {
  const ConfigJson j(dir);
  Config c = read_common(j);
  c.R = static_cast<int64_t>(static_cast<double>(c.D) * j.get("partial_rotary_factor", 0.5));
  c.eps = j.get("rms_norm_eps", 1e-5);
  c.attention_bias = j.get("attention_bias", false);
  c.qk_norm = j.get("use_qk_norm", false) ? QkNorm::per_head : QkNorm::none;
  c.first_dense = std::min(j.get("first_k_dense_replace", int64_t{1}), c.L);
  c.I = c.first_dense > 0 ? j.req("intermediate_size") : 0;
  if (c.first_dense < c.L) {  // some MoE layer
    c.F = j.req("moe_intermediate_size");
    c.N = j.req("n_routed_experts");
    c.K = j.req("num_experts_per_tok");
  }
  c.shared = j.get("n_shared_experts", int64_t{1});
  c.routed_scale = j.get("routed_scaling_factor", 1.0);
  c.norm_topk = j.get("norm_topk_prob", true);
  c.n_group = j.get("n_group", int64_t{1});
  c.topk_group = j.get("topk_group", int64_t{1});
  check_rotary(c);
  check_groups(c, "n_routed_experts");
  return c;
}

inline Config read_minimax_m2_config(const std::string& dir) {
  const ConfigJson j(dir);
  Config c = read_common(j);
  c.R = j.get("rotary_dim", int64_t{c.D});
  c.eps = j.get("rms_norm_eps", 1e-6);
  c.qk_norm = j.get("use_qk_norm", true) ? QkNorm::whole : QkNorm::none;
  if (j.has("qk_norm_type") && j.get("qk_norm_type", std::string()) != "per_layer")
    fail("qk_norm_type " + j.j["qk_norm_type"].dump() + " is not supported (only per_layer)");
  if (j.get("scoring_func", std::string()) != "sigmoid") fail("scoring_func must be \"sigmoid\"");
  c.N = j.req("num_local_experts");
  c.K = j.req("num_experts_per_tok");
  c.F = j.req("intermediate_size");
  c.routing_bias = j.get("use_routing_bias", true);
  check_rotary(c);
  if (c.K <= 0 || c.K > c.N) fail("bad num_experts_per_tok");
  return c;
}

inline Config read_bailing_moe_v2_config(const std::string& dir) {
  const ConfigJson j(dir);
  Config c = read_common(j);
  if (c.D == 0) c.D = c.E / c.H;  // head_dim 0 means unset, as "config.head_dim or E // H"
  c.R = j.has("rotary_dim")
            ? j.req("rotary_dim")
            : static_cast<int64_t>(static_cast<double>(c.D) * j.get("partial_rotary_factor", 1.0));
  c.eps = j.get("rms_norm_eps", 1e-6);
  c.attention_bias = j.get("use_qkv_bias", false);
  if (j.get("use_bias", false)) fail("use_bias true (biased dense projections) is not supported");
  if (j.get("hidden_act", std::string("silu")) != "silu") fail("hidden_act must be \"silu\"");
  c.qk_norm = j.get("use_qk_norm", true) ? QkNorm::per_head : QkNorm::none;
  c.first_dense = std::min(j.get("first_k_dense_replace", int64_t{0}), c.L);
  c.I = c.first_dense > 0 ? j.req("intermediate_size") : 0;
  if (c.first_dense < c.L) {  // some MoE layer
    c.F = j.req("moe_intermediate_size");
    c.N = j.req("num_experts");
    c.K = j.req("num_experts_per_tok");
  }
  if (j.get("score_function", std::string("sigmoid")) != "sigmoid")
    fail("score_function must be \"sigmoid\"");
  c.shared = j.get("num_shared_experts", int64_t{0});
  c.routed_scale = j.get("routed_scaling_factor", 1.0);
  c.norm_topk = j.get("norm_topk_prob", true);
  c.n_group = j.get("n_group", int64_t{1});
  c.topk_group = j.get("topk_group", int64_t{1});
  c.routing_bias = j.get("moe_router_enable_expert_bias", true);
  check_rotary(c);
  check_groups(c, "num_experts");
  if (c.shared < 0) fail("bad num_shared_experts");
  return c;
}

// ---------------------------------------------------------------------------------------------
// Tensors and vector arithmetic

/// The tensor `name`, which must exist, be F32/F16/BF16 and have `shape`.
inline const Tensor& tensor(const Tensors& st, const std::string& name,
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

/// The 1-D tensor `name` of length n as doubles.
inline Vec vec(const Tensors& st, const std::string& name, int64_t n) {
  return row(tensor(st, name, {n}), 0);
}

/// W x for a Linear weight W [out, in], read row by row.
inline Vec matvec(const Tensor& w, const Vec& x) {
  Vec out(static_cast<size_t>(w.shape[0]));
  for (int64_t r = 0; r < w.shape[0]; ++r) out[r] = dot(row(w, r), x);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Feed-forward

/// The three weight names of a gated MLP (prefix + name + ".weight"): GLM's and MiniMax's.
struct MlpNames {
  const char *gate, *up, *down;
};
inline constexpr MlpNames kProjNames{"gate_proj", "up_proj", "down_proj"};
inline constexpr MlpNames kW123Names{"w1", "w3", "w2"};

/// down(silu(gate h) * up h), gate and up [width, E], down [E, width].
inline Vec swiglu(const Tensors& st, const std::string& prefix, const MlpNames& names, int64_t E,
                  int64_t width, const Vec& h) {
  auto weight = [&](const char* name) { return prefix + name + ".weight"; };
  const Vec g = matvec(tensor(st, weight(names.gate), {width, E}), h);
  const Vec u = matvec(tensor(st, weight(names.up), {width, E}), h);
  Vec a(g.size());
  for (size_t i = 0; i < a.size(); ++i) a[i] = silu(g[i]) * u[i];
  return matvec(tensor(st, weight(names.down), {E, width}), a);
}

/// Sigmoid router of h: score = sigmoid(gate [N, E] h), and choice = score + bias [N] (the
/// e_score_correction_bias `bias`; "" for none), by which experts are picked.
struct Scores {
  Vec score, choice;
};
inline Scores sigmoid_scores(const Tensors& st, const Config& c, const std::string& gate,
                             const std::string& bias, const Vec& h) {
  Scores s;
  s.score = matvec(tensor(st, gate, {c.N, c.E}), h);
  for (double& x : s.score) x = sigmoid(x);
  s.choice = s.score;
  if (!bias.empty()) add_scaled(s.choice, 1.0, vec(st, bias, c.N));
  return s;
}

/// The K experts with the largest choice (ties: lower index first), each weighted by its score
/// divided by the sum of the K picked scores when `normalize`.
using Picked = std::vector<std::pair<int64_t, double>>;  // (expert, weight)
inline Picked top_k(const Scores& s, int64_t K, bool normalize) {
  std::vector<int64_t> order(s.choice.size());
  for (size_t e = 0; e < order.size(); ++e) order[e] = static_cast<int64_t>(e);
  std::ranges::stable_sort(order, [&](int64_t a, int64_t b) { return s.choice[a] > s.choice[b]; });
  Picked picked;
  double sum = 0;
  for (int64_t r = 0; r < K; ++r) {
    picked.emplace_back(order[r], s.score[order[r]]);
    sum += s.score[order[r]];
  }
  if (normalize)
    for (auto& [e, w] : picked) w /= sum + 1e-20;
  return picked;
}

/// Sum of w * expert e (prefix experts + "{e}.") of h over the picked (e, w).
inline Vec mix_experts(const Tensors& st, const Config& c, const std::string& experts,
                       const MlpNames& names, const Picked& picked, const Vec& h) {
  Vec out(static_cast<size_t>(c.E), 0.0);
  for (const auto& [e, w] : picked)
    add_scaled(out, w, swiglu(st, experts + std::to_string(e) + ".", names, c.E, c.F, h));
  return out;
}

// ---------------------------------------------------------------------------------------------
// Attention

/// NeoX rotary on the first R elements of the head at off (refmath::rope_neox).
inline void rope(Vec& v, int64_t off, int64_t pos, const Config& c) {
  if (c.interleaved) return rope_interleaved(v, off, pos, c.R, c.rope_theta);
  if (c.ext.empty() && c.rope_mscale == 1) return rope_neox(v, off, pos, c.R, c.rope_theta);
  for (int64_t i = 0; i < c.R / 2; ++i) {  // LongRoPE: divided frequencies, scaled cos and sin
    const double inv_freq =
        std::pow(c.rope_theta, -2.0 * static_cast<double>(i) / static_cast<double>(c.R)) /
        (c.ext.empty() ? 1.0 : c.ext[static_cast<size_t>(i)]);
    const double angle = static_cast<double>(pos) * inv_freq;
    const double cs = c.rope_mscale * std::cos(angle), sn = c.rope_mscale * std::sin(angle);
    const double a = v[off + i], b = v[off + i + c.R / 2];
    v[off + i] = a * cs - b * sn;
    v[off + i + c.R / 2] = b * cs + a * sn;
  }
}

/// Projection name+".weight" [rows, E] of h, plus its bias when attention_bias says so.
inline Vec project(const Tensors& st, const Config& c, const std::string& name, int64_t rows,
                   const Vec& h) {
  Vec out = matvec(tensor(st, name + ".weight", {rows, c.E}), h);
  if (c.attention_bias && st.find(name + ".bias") != nullptr)
    add_scaled(out, 1.0, vec(st, name + ".bias", rows));
  return out;
}

/// The attention tensors of a layer, relative to its prefix and without ".weight"/".bias": either
/// separate q, k and v projections (qkv null) or one fused projection qkv whose output rows are the
/// H q heads, then the Hkv k heads, then the Hkv v heads; the q and k norms; the output projection.
struct AttnNames {
  const char *qkv, *q, *k, *v, *q_norm, *k_norm, *o;
};
inline constexpr AttnNames kSelfAttnNames{
    .qkv = nullptr,
    .q = "self_attn.q_proj",
    .k = "self_attn.k_proj",
    .v = "self_attn.v_proj",
    .q_norm = "self_attn.q_norm",
    .k_norm = "self_attn.k_norm",
    .o = "self_attn.o_proj",
};
inline constexpr AttnNames kPhi3AttnNames{
    .qkv = "self_attn.qkv_proj",
    .q = nullptr,
    .k = nullptr,
    .v = nullptr,
    .q_norm = nullptr,
    .k_norm = nullptr,
    .o = "self_attn.o_proj",
};
inline constexpr AttnNames kBailingAttnNames{
    .qkv = "attention.query_key_value",
    .q = nullptr,
    .k = nullptr,
    .v = nullptr,
    .q_norm = "attention.query_layernorm",
    .k_norm = "attention.key_layernorm",
    .o = "attention.dense",
};

/// Causal GQA self-attention of layer prefix p over the normed inputs hs (one per position):
/// projections, q/k norm as c.qk_norm says, rotary, softmax(q k / sqrt(D)) v, output projection.
/// Separate projections add their bias when attention_bias says so and it exists; a fused one
/// requires it then.
inline std::vector<Vec> attention(const Tensors& st, const Config& c, const std::string& p,
                                  const AttnNames& names, const std::vector<Vec>& hs) {
  const size_t n = hs.size();
  std::vector<Vec> q(n), k(n), v(n), out(n);
  Vec qn, kn;  // q_norm and k_norm weights: [D] (per head) or [H*D] and [Hkv*D] (whole)
  if (c.qk_norm != QkNorm::none) {
    const bool whole = c.qk_norm == QkNorm::whole;
    qn = vec(st, p + names.q_norm + ".weight", whole ? c.H * c.D : c.D);
    kn = vec(st, p + names.k_norm + ".weight", whole ? c.Hkv * c.D : c.D);
  }
  const int64_t qkv_rows = (c.H + 2 * c.Hkv) * c.D;
  if (names.qkv != nullptr && c.attention_bias) tensor(st, p + names.qkv + ".bias", {qkv_rows});
  auto norm_and_rotate = [&](Vec& x, int64_t heads, const Vec& w, int64_t pos) {
    if (c.qk_norm == QkNorm::whole) x = rms_norm(x, w, c.eps);
    for (int64_t j = 0; j < heads; ++j) {
      if (c.qk_norm == QkNorm::per_head) {
        const Vec head(x.begin() + j * c.D, x.begin() + (j + 1) * c.D);
        std::ranges::copy(rms_norm(head, w, c.eps), x.begin() + j * c.D);
      }
      rope(x, j * c.D, pos, c);
    }
  };
  for (size_t i = 0; i < n; ++i) {
    const auto pos = static_cast<int64_t>(i);
    if (names.qkv != nullptr) {
      const Vec qkv = project(st, c, p + names.qkv, qkv_rows, hs[i]);
      const auto kb = qkv.begin() + c.H * c.D, vb = kb + c.Hkv * c.D;
      q[i].assign(qkv.begin(), kb);
      k[i].assign(kb, vb);
      v[i].assign(vb, qkv.end());
    } else {
      q[i] = project(st, c, p + names.q, c.H * c.D, hs[i]);
      k[i] = project(st, c, p + names.k, c.Hkv * c.D, hs[i]);
      v[i] = project(st, c, p + names.v, c.Hkv * c.D, hs[i]);
    }
    norm_and_rotate(q[i], c.H, qn, pos);
    norm_and_rotate(k[i], c.Hkv, kn, pos);
  }
  const Tensor& wo = tensor(st, p + names.o + ".weight", {c.E, c.H * c.D});
  for (size_t i = 0; i < n; ++i) {
    Vec heads(static_cast<size_t>(c.H * c.D), 0.0);
    for (int64_t j = 0; j < c.H; ++j) {
      const int64_t qo = j * c.D, ko = j / (c.H / c.Hkv) * c.D;
      const size_t s0 = c.W > 0 && i + 1 > static_cast<size_t>(c.W) ? i + 1 - c.W : 0;
      Vec score(i + 1 - s0);
      for (size_t s = s0; s <= i; ++s) {
        double d = 0;
        for (int64_t e = 0; e < c.D; ++e) d += q[i][qo + e] * k[s][ko + e];
        score[s - s0] = d / std::sqrt(static_cast<double>(c.D));
      }
      const double mx = *std::ranges::max_element(score);
      double sum = 0;
      for (double& x : score) sum += (x = std::exp(x - mx));
      for (size_t s = s0; s <= i; ++s)
        for (int64_t e = 0; e < c.D; ++e) heads[qo + e] += score[s - s0] / sum * v[s][ko + e];
    }
    out[i] = matvec(wo, heads);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// The whole model

/// The feed-forward of layer l (prefix p) for the post-attention-normed h.
using Ffn = std::function<Vec(int64_t l, const std::string& p, const Vec& h)>;

/// The tensor names that differ between the decoders: the embedding and the attention block.
struct Layout {
  const char* embed;
  AttnNames attn;
};
inline constexpr Layout kHfLayout{"model.embed_tokens.weight", kSelfAttnNames};  // GLM, MiniMax
inline constexpr Layout kBailingLayout{"model.word_embeddings.weight", kBailingAttnNames};
inline constexpr Layout kPhi3Layout{"model.embed_tokens.weight", kPhi3AttnNames};

/// The attention block of layer prefix p over its normed inputs hs (one per position).
using Attn = std::function<std::vector<Vec>(const std::string& p, const std::vector<Vec>& hs)>;

/// Logits [tokens x vocab] of the decoder the models share: the embedding `embed_name`; per
/// layer x += attn(input_layernorm x), x += ffn(post_attention_layernorm x); lm_head (or the
/// embedding when tied) of norm x. Layers >= num_hidden_layers (MTP) are ignored.
inline std::vector<double> forward_with(const Tensors& st, const Config& c,
                                        const std::string& embed_name,
                                        const std::vector<int32_t>& tokens, const Attn& attn,
                                        const Ffn& ffn) {
  const Tensor& embed = tensor(st, embed_name, {c.vocab, c.E});
  std::vector<Vec> x;
  for (int32_t t : tokens) {
    if (t < 0 || t >= c.vocab) fail("token " + std::to_string(t) + " outside the vocabulary");
    x.push_back(row(embed, t));
  }
  for (int64_t l = 0; l < c.L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const Vec in_norm = vec(st, p + "input_layernorm.weight", c.E);
    const Vec post_norm = vec(st, p + "post_attention_layernorm.weight", c.E);
    std::vector<Vec> hs;
    for (const Vec& xi : x) hs.push_back(rms_norm(xi, in_norm, c.eps));
    const std::vector<Vec> o = attn(p, hs);
    for (size_t i = 0; i < x.size(); ++i) {
      add_scaled(x[i], 1.0, o[i]);
      add_scaled(x[i], 1.0, ffn(l, p, rms_norm(x[i], post_norm, c.eps)));
    }
  }
  const Vec final_norm = vec(st, "model.norm.weight", c.E);
  const Tensor& head = c.tie ? embed : tensor(st, "lm_head.weight", {c.vocab, c.E});
  std::vector<double> logits;
  logits.reserve(x.size() * static_cast<size_t>(c.vocab));
  for (const Vec& xi : x) {
    const Vec y = matvec(head, rms_norm(xi, final_norm, c.eps));
    logits.insert(logits.end(), y.begin(), y.end());
  }
  return logits;
}

/// forward_with the GQA attention of `layout`.
inline std::vector<double> forward(const Tensors& st, const Config& c, const Layout& layout,
                                   const std::vector<int32_t>& tokens, const Ffn& ffn) {
  return forward_with(
      st, c, layout.embed, tokens,
      [&](const std::string& p, const std::vector<Vec>& hs) {
        return attention(st, c, p, layout.attn, hs);
      },
      ffn);
}

inline std::unique_ptr<Tensors> open_checkpoint(const std::string& dir) {
  auto opened = Tensors::open_dir(dir);
  if (!opened) fail(opened.error().message);
  return std::move(*opened);
}

// ---------------------------------------------------------------------------------------------
// Group-limited routing and the dense-or-MoE feed-forward (GLM, Bailing)

/// The experts picked from s: of the n_group contiguous groups of experts, only the topk_group
/// whose two best choices sum highest (or, `by_best`, whose best choice is highest: DeepSeek-V2)
/// take part; of those, the K with the largest choice, each weighted by its score (normalized
/// over the K when `normalize`) times routed_scaling_factor.
inline Picked group_limited_top_k(Scores s, const Config& c, bool normalize, bool by_best = false) {
  const int64_t size = c.N / c.n_group;
  std::vector<std::pair<double, int64_t>> groups;  // (-group score, group): sorts best first
  for (int64_t g = 0; g < c.n_group; ++g) {
    Vec m(s.choice.begin() + g * size, s.choice.begin() + (g + 1) * size);
    std::ranges::sort(m, std::greater<>());
    groups.emplace_back(-(m[0] + (size > 1 && !by_best ? m[1] : 0.0)), g);
  }
  std::ranges::sort(groups);
  for (int64_t r = c.topk_group; r < c.n_group; ++r)
    for (int64_t e = groups[r].second * size; e < (groups[r].second + 1) * size; ++e)
      s.choice[e] = -std::numeric_limits<double>::infinity();
  auto picked = top_k(s, c.K, normalize);
  for (auto& [e, w] : picked) w *= c.routed_scale;
  return picked;
}

/// The routed experts of MoE layer prefix p for h, with their weights.
using Router =
    std::function<Picked(const Tensors& st, const Config& c, const std::string& p, const Vec& h)>;

/// The feed-forward of layer l (prefix p): a dense MLP "mlp." of width I below
/// first_k_dense_replace, else the experts "mlp.experts.{e}." (width F) that `route` picks plus,
/// when there are shared experts, "mlp.shared_experts." of width F * shared.
inline Vec dense_or_moe_ffn(const Tensors& st, const Config& c, int64_t l, const std::string& p,
                            const Vec& h, const Router& route) {
  if (l < c.first_dense) return swiglu(st, p + "mlp.", kProjNames, c.E, c.I, h);
  Vec out = mix_experts(st, c, p + "mlp.experts.", kProjNames, route(st, c, p, h), h);
  if (c.shared > 0)
    add_scaled(out, 1.0, swiglu(st, p + "mlp.shared_experts.", kProjNames, c.E, c.F * c.shared, h));
  return out;
}

// ---------------------------------------------------------------------------------------------
// GLM-4.5 MoE

/// The routed experts of GLM layer prefix p for h and their weights: sigmoid scores, group limit,
/// top-K by score + mlp.gate.e_score_correction_bias (when present), weights from the unbiased
/// scores, normalized when norm_topk_prob, times routed_scaling_factor.
inline Picked glm_route(const Tensors& st, const Config& c, const std::string& p, const Vec& h) {
  const std::string bias = p + "mlp.gate.e_score_correction_bias";
  return group_limited_top_k(
      sigmoid_scores(st, c, p + "mlp.gate.weight", st.find(bias) ? bias : "", h), c, c.norm_topk);
}

/// The feed-forward of GLM layer l: a dense MLP below first_k_dense_replace, else the routed
/// experts plus the shared experts.
inline Vec glm_ffn(const Tensors& st, const Config& c, int64_t l, const std::string& p,
                   const Vec& h) {
  return dense_or_moe_ffn(st, c, l, p, h, glm_route);
}

// ---------------------------------------------------------------------------------------------
// MiniMax-M2 MoE

/// The feed-forward of MiniMax-M2 layer prefix p: sigmoid scores, top-K by score +
/// block_sparse_moe.e_score_correction_bias (when use_routing_bias), weights the unbiased scores
/// normalized over the K; experts w2(silu(w1 h) * w3 h). No shared experts, no scaling.
inline Vec minimax_m2_ffn(const Tensors& st, const Config& c, const std::string& p, const Vec& h) {
  const std::string moe = p + "block_sparse_moe.";
  const Scores s = sigmoid_scores(st, c, moe + "gate.weight",
                                  c.routing_bias ? moe + "e_score_correction_bias" : "", h);
  return mix_experts(st, c, moe + "experts.", kW123Names, top_k(s, c.K, true), h);
}

// ---------------------------------------------------------------------------------------------
// Bailing MoE V2 (Ling-2.0)

/// The routed experts of Bailing layer prefix p for h and their weights: sigmoid scores, group
/// limit, top-K by score + mlp.gate.expert_bias (required when moe_router_enable_expert_bias, else
/// none), weights from the unbiased scores, normalized when norm_topk_prob and K > 1, times
/// routed_scaling_factor.
inline Picked bailing_route(const Tensors& st, const Config& c, const std::string& p,
                            const Vec& h) {
  const std::string bias = c.routing_bias ? p + "mlp.gate.expert_bias" : "";
  return group_limited_top_k(sigmoid_scores(st, c, p + "mlp.gate.weight", bias, h), c,
                             c.norm_topk && c.K > 1);
}

// ---------------------------------------------------------------------------------------------
// ERNIE 4.5 MoE

/// The routed experts of ERNIE layer prefix p for h and their weights: probabilities by a
/// softmax of mlp.gate.weight h; the K largest of probability + mlp.moe_statics.
/// e_score_correction_bias ([1, N], when present) picked; weighted by their probabilities over
/// max(their sum, moe_norm_min).
inline Picked ernie_route(const Tensors& st, const Config& c, const std::string& p, const Vec& h) {
  Scores s;
  s.score = matvec(tensor(st, p + "mlp.gate.weight", {c.N, c.E}), h);
  softmax(s.score);
  s.choice = s.score;
  const std::string bias = p + "mlp.moe_statics.e_score_correction_bias";
  if (st.find(bias) != nullptr) add_scaled(s.choice, 1.0, row(tensor(st, bias, {1, c.N}), 0));
  Picked picked = top_k(s, c.K, false);
  double sum = 0;
  for (const auto& [e, w] : picked) sum += w;
  for (auto& [e, w] : picked) w /= std::max(sum, c.norm_min);
  return picked;
}

/// The feed-forward of ERNIE layer l (prefix p): the routed and shared experts where the MoE
/// settings put them, else the dense MLP of intermediate_size.
inline Vec ernie_ffn(const Tensors& st, const Config& c, int64_t l, const std::string& p,
                     const Vec& h) {
  const bool moe = c.N > 0 && l >= c.moe_start && l <= c.moe_end && (l + 1) % c.moe_interval == 0;
  if (!moe) return swiglu(st, p + "mlp.", kProjNames, c.E, c.I, h);
  Vec out = mix_experts(st, c, p + "mlp.experts.", kProjNames, ernie_route(st, c, p, h), h);
  if (c.shared > 0)
    add_scaled(out, 1.0, swiglu(st, p + "mlp.shared_experts.", kProjNames, c.E, c.F * c.shared, h));
  return out;
}

}  // namespace moe_ref

/// Logits [tokens.size() x vocab_size], row i = logits after tokens[0..i] (causal, positions
/// 0..n-1), computed in double from the Hugging Face Glm4MoeForCausalLM directory `dir`
/// (config.json + model.safetensors or a sharded index). Layers >= num_hidden_layers (the MTP
/// layer) are ignored. Throws std::runtime_error naming the tensor or key on a missing tensor, a
/// shape that config.json does not imply, or a bad config.
inline std::vector<double> glm4moe_reference_logits(const std::string& dir,
                                                    const std::vector<int32_t>& tokens) {
  using namespace moe_ref;
  const Config c = read_glm4moe_config(dir);
  const auto st = open_checkpoint(dir);
  return forward(*st, c, kHfLayout, tokens, [&](int64_t l, const std::string& p, const Vec& h) {
    return glm_ffn(*st, c, l, p, h);
  });
}

/// Logits [tokens.size() x vocab_size] of the Hugging Face MistralForCausalLM directory `dir`, in
/// double; row i = logits after tokens[0..i] (causal, positions 0..n-1, each attending to the
/// last sliding_window positions when the config sets it). Throws std::runtime_error naming the
/// tensor or key on a missing tensor, a shape that config.json does not imply, or a bad config.
inline std::vector<double> mistral_reference_logits(const std::string& dir,
                                                    const std::vector<int32_t>& tokens) {
  using namespace moe_ref;
  const Config c = read_mistral_config(dir);
  const auto st = open_checkpoint(dir);
  return forward(*st, c, kHfLayout, tokens, [&](int64_t, const std::string& p, const Vec& h) {
    return swiglu(*st, p + "mlp.", kProjNames, c.E, c.I, h);
  });
}

/// Logits [tokens.size() x vocab_size] of the Hugging Face Phi3ForCausalLM directory `dir`, in
/// double (read_phi3_config says what it reads); row i = logits after tokens[0..i] (causal,
/// positions 0..n-1). The MLP: down_proj(silu(g) * u), g and u the first and second halves of
/// gate_up_proj's output. Throws std::runtime_error as mistral_reference_logits.
inline std::vector<double> phi3_reference_logits(const std::string& dir,
                                                 const std::vector<int32_t>& tokens) {
  using namespace moe_ref;
  const Config c = read_phi3_config(dir, tokens.size());
  const auto st = open_checkpoint(dir);
  return forward(*st, c, kPhi3Layout, tokens, [&](int64_t, const std::string& p, const Vec& h) {
    const Vec gu = matvec(tensor(*st, p + "mlp.gate_up_proj.weight", {2 * c.I, c.E}), h);
    Vec a(static_cast<size_t>(c.I));
    for (size_t i = 0; i < a.size(); ++i) a[i] = silu(gu[i]) * gu[i + a.size()];
    return matvec(tensor(*st, p + "mlp.down_proj.weight", {c.E, c.I}), a);
  });
}

/// Logits [tokens.size() x vocab_size] of the Hugging Face Ernie4_5ForCausalLM or
/// Ernie4_5_MoeForCausalLM directory `dir`, in double (read_ernie45_config says what it reads);
/// row i = logits after tokens[0..i] (causal, positions 0..n-1). Tensors outside the decoder
/// layers (the 300B's MTP block) are ignored. Throws std::runtime_error as
/// mistral_reference_logits.
inline std::vector<double> ernie45_reference_logits(const std::string& dir,
                                                    const std::vector<int32_t>& tokens) {
  using namespace moe_ref;
  const Config c = read_ernie45_config(dir);
  const auto st = open_checkpoint(dir);
  return forward(*st, c, kHfLayout, tokens, [&](int64_t l, const std::string& p, const Vec& h) {
    return ernie_ffn(*st, c, l, p, h);
  });
}

/// Logits [tokens.size() x vocab_size] of the Hugging Face MiniMaxM2ForCausalLM directory `dir`,
/// in double; row i = logits after tokens[0..i] (causal, positions 0..n-1). Tensors outside the
/// num_hidden_layers decoder layers (e.g. multi-token-prediction modules) are ignored. Throws
/// std::runtime_error naming the tensor or key on a missing tensor, a shape that config.json does
/// not imply, or an unsupported config (scoring_func other than sigmoid, qk_norm_type other than
/// per_layer, rope_scaling).
inline std::vector<double> minimax_m2_reference_logits(const std::string& dir,
                                                       const std::vector<int32_t>& tokens) {
  using namespace moe_ref;
  const Config c = read_minimax_m2_config(dir);
  const auto st = open_checkpoint(dir);
  return forward(*st, c, kHfLayout, tokens, [&](int64_t, const std::string& p, const Vec& h) {
    return minimax_m2_ffn(*st, c, p, h);
  });
}

/// Logits [tokens.size() x vocab_size] of the Hugging Face BailingMoeV2ForCausalLM directory `dir`
/// (Ling-2.0: config.json + model.safetensors or a sharded index), in double; row i = logits after
/// tokens[0..i] (causal, positions 0..n-1). Embedding model.word_embeddings; fused
/// attention.query_key_value (q heads, k heads, v heads) with per-head query_layernorm and
/// key_layernorm, partial rotary, attention.dense; dense MLPs below first_k_dense_replace, else
/// sigmoid group-limited routing with mlp.gate.expert_bias plus shared experts. Layers >=
/// num_hidden_layers (MTP) are ignored. Throws std::runtime_error naming the tensor or key on a
/// missing tensor, a shape that config.json does not imply, or an unsupported config (use_bias,
/// score_function other than sigmoid, hidden_act other than silu, rope_scaling).
inline std::vector<double> bailing_moe_v2_reference_logits(const std::string& dir,
                                                           const std::vector<int32_t>& tokens) {
  using namespace moe_ref;
  const Config c = read_bailing_moe_v2_config(dir);
  const auto st = open_checkpoint(dir);
  return forward(*st, c, kBailingLayout, tokens,
                 [&](int64_t l, const std::string& p, const Vec& h) {
                   return dense_or_moe_ffn(*st, c, l, p, h, bailing_route);
                 });
}

}  // namespace troupe::testing
