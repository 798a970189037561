// Test reference for OpenAI's gpt-oss (gpt-oss-20b, gpt-oss-120b) as llama.cpp runs its "gpt-oss"
// GGUF architecture: a deliberately naive float64 forward pass that reads the file by its GGUF
// tensor names and "gpt-oss." keys, independently of troupe's engine and model loader (it uses
// only the GGUF container parser), so that tests can compare the engine's logits against it.
// Biased q/k/v/o projections, NeoX rotary, causal GQA attention with one learned sink logit per
// query head, sliding-window attention on the even layers, softmax-over-top-K routing with a
// router bias, and biased clamped-SwiGLU experts (gpt-oss's swiglu_oai). F32 tensors only, no
// YaRN. Plain loops, no caching: for small test models.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "model/ggml_types.h"
#include "model/gguf.h"
#include "tests/reference_gguf.h"
#include "tests/reference_math.h"

namespace troupe::testing {
namespace gpt_oss_ref {

using namespace refmath;  // NOLINT(google-build-using-namespace): the shared arithmetic
using Gguf = model::GgufFile;
using Tensor = model::TensorInfo;

inline constexpr const char* kWho = "gpt-oss";

[[noreturn]] inline void fail(const std::string& what) { refgguf::fail(kWho, what); }

// ---------------------------------------------------------------------------------------------
// Configuration

/// The "gpt-oss." hyperparameters the forward pass uses.
struct Config {
  int64_t vocab = 0, E = 0, L = 0, H = 0, Hkv = 0, D = 0, R = 0;  // R: rotary dims of a head
  int64_t N = 0, K = 0, F = 0;  // experts, experts per token, width of one expert
  int64_t W = 0;                // sliding window of the even layers
  double rope_theta = 10000, eps = 1e-5;
};

inline constexpr double kSwigluAlpha = 1.702;  // gpt-oss's swiglu_oai constants
inline constexpr double kSwigluLimit = 7.0;

/// The key "gpt-oss." + name.
inline std::string key(const char* name) { return std::string("gpt-oss.") + name; }

/// The hyperparameters of g (vocab is set later, from token_embd.weight). Missing or mistyped
/// keys throw the parser's error, which names the key.
inline Config read_config(const Gguf& g) {
  const std::string arch = g.get_string_or("general.architecture", "gpt-oss");
  if (arch != "gpt-oss") fail("general.architecture is \"" + arch + "\", not \"gpt-oss\"");
  const std::string scaling = g.get_string_or(key("rope.scaling.type"), "none");
  if (scaling != "none") fail(key("rope.scaling.type") + " \"" + scaling + "\" is not supported");
  Config c;
  c.E = g.get_int(key("embedding_length"));
  c.L = g.get_int(key("block_count"));
  c.H = g.get_int(key("attention.head_count"));
  c.Hkv = g.get_int(key("attention.head_count_kv"));
  if (c.E <= 0 || c.L < 0) fail("bad " + key("embedding_length") + " or " + key("block_count"));
  if (c.H <= 0 || c.Hkv <= 0 || c.H % c.Hkv != 0)
    fail(key("attention.head_count") + " must be a positive multiple of " +
         key("attention.head_count_kv"));
  c.D = g.get_int_or(key("attention.key_length"), c.E / c.H);
  const int64_t dv = g.get_int_or(key("attention.value_length"), c.D);
  if (c.D <= 0 || dv != c.D) fail(key("attention.value_length") + " must equal key_length");
  c.R = g.get_int_or(key("rope.dimension_count"), c.D);
  if (c.R < 0 || c.R % 2 != 0 || c.R > c.D)
    fail(key("rope.dimension_count") + " must be even and at most key_length");
  c.rope_theta = g.get_float_or(key("rope.freq_base"), 10000.0);
  c.eps = g.get_float(key("attention.layer_norm_rms_epsilon"));
  c.N = g.get_int(key("expert_count"));
  c.K = g.get_int(key("expert_used_count"));
  if (c.N <= 0 || c.K <= 0 || c.K > c.N)
    fail(key("expert_used_count") + " must be in [1, " + key("expert_count") + "]");
  c.F = g.get_int(key("expert_feed_forward_length"));
  c.W = g.get_int(key("attention.sliding_window"));
  if (c.F <= 0) fail("bad " + key("expert_feed_forward_length"));
  if (c.W <= 0) fail("bad " + key("attention.sliding_window"));
  return c;
}

// ---------------------------------------------------------------------------------------------
// Tensors and vector arithmetic

inline const Tensor& tensor(const Gguf& g, const std::string& name,
                            const std::vector<int64_t>& ne) {
  return refgguf::tensor(g, name, ne, kWho, /*f32_only=*/true);
}
inline Vec row(const Tensor& t, int64_t r) { return refgguf::row(t, r, kWho); }

/// The 1-D tensor `name` of length n as doubles.
inline Vec vec(const Gguf& g, const std::string& name, int64_t n) {
  return row(tensor(g, name, {n}), 0);
}

inline Vec matvec(const Tensor& w, const Vec& x, int64_t m = 0) {
  return refgguf::matvec(w, x, kWho, m);
}

// ---------------------------------------------------------------------------------------------
// Attention

/// NeoX rotary on the first R elements of the head at off (refmath::rope_neox).
inline void rope(Vec& v, int64_t off, int64_t pos, const Config& c) {
  rope_neox(v, off, pos, c.R, c.rope_theta);
}

/// name.weight [E cols, rows] h + name.bias [rows].
inline Vec project(const Gguf& g, const std::string& name, int64_t cols, int64_t rows,
                   const Vec& h) {
  Vec out = matvec(tensor(g, name + ".weight", {cols, rows}), h);
  add_scaled(out, 1.0, vec(g, name + ".bias", rows));
  return out;
}

/// Whether layer l attends through the sliding window (llama.cpp's gpt-oss: the even layers).
inline bool is_sliding(int64_t l) { return l % 2 == 0; }

/// Output of query head j at position i: softmax over the allowed keys s (first..i) plus the sink
/// logit (whose value vector is zero), applied to the values.
inline Vec attend_head(const Config& c, const std::vector<Vec>& q, const std::vector<Vec>& k,
                       const std::vector<Vec>& v, size_t i, size_t first, int64_t j, double sink) {
  const int64_t qo = j * c.D, ko = j / (c.H / c.Hkv) * c.D;
  Vec z;  // scores of keys first..i, then the sink
  for (size_t s = first; s <= i; ++s) {
    double d = 0;
    for (int64_t e = 0; e < c.D; ++e) d += q[i][qo + e] * k[s][ko + e];
    z.push_back(d / std::sqrt(static_cast<double>(c.D)));
  }
  z.push_back(sink);
  softmax(z);
  Vec out(static_cast<size_t>(c.D), 0.0);
  for (size_t s = first; s <= i; ++s)
    for (int64_t e = 0; e < c.D; ++e) out[e] += z[s - first] * v[s][ko + e];
  return out;
}

/// Attention of layer l (prefix p) over the normed inputs hs (positions 0..n-1): biased q/k/v,
/// rotary on q and k, per-head sinks, window W on sliding layers, biased output projection.
inline std::vector<Vec> attention(const Gguf& g, const Config& c, int64_t l, const std::string& p,
                                  const std::vector<Vec>& hs) {
  const size_t n = hs.size();
  std::vector<Vec> q(n), k(n), v(n), out(n);
  for (size_t i = 0; i < n; ++i) {
    const auto pos = static_cast<int64_t>(i);
    q[i] = project(g, p + "attn_q", c.E, c.H * c.D, hs[i]);
    k[i] = project(g, p + "attn_k", c.E, c.Hkv * c.D, hs[i]);
    v[i] = project(g, p + "attn_v", c.E, c.Hkv * c.D, hs[i]);
    for (int64_t j = 0; j < c.H; ++j) rope(q[i], j * c.D, pos, c);
    for (int64_t j = 0; j < c.Hkv; ++j) rope(k[i], j * c.D, pos, c);
  }
  const Vec sinks = vec(g, p + "attn_sinks.weight", c.H);
  const Tensor& wo = tensor(g, p + "attn_output.weight", {c.H * c.D, c.E});
  const Vec bo = vec(g, p + "attn_output.bias", c.E);
  for (size_t i = 0; i < n; ++i) {
    // Sliding: keys s with i - W < s <= i.
    const auto w = static_cast<size_t>(c.W);
    const size_t first = is_sliding(l) && i + 1 > w ? i + 1 - w : 0;
    Vec heads;
    for (int64_t j = 0; j < c.H; ++j) {
      const Vec o = attend_head(c, q, k, v, i, first, j, sinks[j]);
      heads.insert(heads.end(), o.begin(), o.end());
    }
    out[i] = matvec(wo, heads);
    add_scaled(out[i], 1.0, bo);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Mixture of experts

/// The K experts with the largest router logits ffn_gate_inp.weight h + ffn_gate_inp.bias (ties:
/// lower index first), each weighted by the softmax over the K selected logits.
using Picked = std::vector<std::pair<int64_t, double>>;  // (expert, weight)
inline Picked route(const Gguf& g, const Config& c, const std::string& p, const Vec& h) {
  const Vec logits = project(g, p + "ffn_gate_inp", c.E, c.N, h);
  std::vector<int64_t> order(static_cast<size_t>(c.N));
  for (size_t e = 0; e < order.size(); ++e) order[e] = static_cast<int64_t>(e);
  std::ranges::stable_sort(order, [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
  Vec w;
  for (int64_t r = 0; r < c.K; ++r) w.push_back(logits[order[r]]);
  softmax(w);
  Picked picked;
  for (int64_t r = 0; r < c.K; ++r) picked.emplace_back(order[r], w[r]);
  return picked;
}

/// Expert e of layer prefix p on h: g = min(Wg h + bg, 7), u = clamp(Wu h + bu, -7, 7),
/// Wd (g * sigmoid(1.702 g) * (u + 1)) + bd.
inline Vec expert(const Gguf& g, const Config& c, const std::string& p, int64_t e, const Vec& h) {
  const Tensor& wg = tensor(g, p + "ffn_gate_exps.weight", {c.E, c.F, c.N});
  const Tensor& wu = tensor(g, p + "ffn_up_exps.weight", {c.E, c.F, c.N});
  const Tensor& wd = tensor(g, p + "ffn_down_exps.weight", {c.F, c.E, c.N});
  const Tensor& bg = tensor(g, p + "ffn_gate_exps.bias", {c.F, c.N});
  const Tensor& bu = tensor(g, p + "ffn_up_exps.bias", {c.F, c.N});
  const Tensor& bd = tensor(g, p + "ffn_down_exps.bias", {c.E, c.N});
  Vec gate = matvec(wg, h, e), up = matvec(wu, h, e);
  add_scaled(gate, 1.0, row(bg, e));
  add_scaled(up, 1.0, row(bu, e));
  Vec a(gate.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = std::min(gate[i], kSwigluLimit);
    const double y = std::clamp(up[i], -kSwigluLimit, kSwigluLimit);
    a[i] = x * sigmoid(kSwigluAlpha * x) * (y + 1.0);
  }
  Vec out = matvec(wd, a, e);
  add_scaled(out, 1.0, row(bd, e));
  return out;
}

/// The feed-forward of layer prefix p for the post-attention-normed h: sum of w * expert e over
/// the routed (e, w).
inline Vec moe_ffn(const Gguf& g, const Config& c, const std::string& p, const Vec& h) {
  Vec out(static_cast<size_t>(c.E), 0.0);
  for (const auto& [e, w] : route(g, c, p, h)) add_scaled(out, w, expert(g, c, p, e, h));
  return out;
}

// ---------------------------------------------------------------------------------------------
// The whole model

/// Logits [tokens x vocab]: the embedding; per layer x += attention(attn_norm x),
/// x += moe(post_attention_norm x); output (or token_embd when absent) of output_norm x.
inline std::vector<double> forward(const Gguf& g, Config c, const std::vector<int32_t>& tokens) {
  const Tensor* te = g.find_tensor("token_embd.weight");
  if (te == nullptr) fail("missing tensor token_embd.weight");
  c.vocab = te->ne[1];
  const Tensor& embed = tensor(g, "token_embd.weight", {c.E, c.vocab});
  std::vector<Vec> x;
  for (int32_t t : tokens) {
    if (t < 0 || t >= c.vocab) fail("token " + std::to_string(t) + " outside the vocabulary");
    x.push_back(row(embed, t));
  }
  for (int64_t l = 0; l < c.L; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const Vec attn_norm = vec(g, p + "attn_norm.weight", c.E);
    const Vec post_norm = vec(g, p + "post_attention_norm.weight", c.E);
    std::vector<Vec> hs;
    for (const Vec& xi : x) hs.push_back(rms_norm(xi, attn_norm, c.eps));
    const std::vector<Vec> o = attention(g, c, l, p, hs);
    for (size_t i = 0; i < x.size(); ++i) {
      add_scaled(x[i], 1.0, o[i]);
      add_scaled(x[i], 1.0, moe_ffn(g, c, p, rms_norm(x[i], post_norm, c.eps)));
    }
  }
  const Vec final_norm = vec(g, "output_norm.weight", c.E);
  const Tensor& head = g.find_tensor("output.weight") != nullptr
                           ? tensor(g, "output.weight", {c.E, c.vocab})
                           : embed;
  std::vector<double> logits;
  logits.reserve(x.size() * static_cast<size_t>(c.vocab));
  for (const Vec& xi : x) {
    const Vec y = matvec(head, rms_norm(xi, final_norm, c.eps));
    logits.insert(logits.end(), y.begin(), y.end());
  }
  return logits;
}

inline std::unique_ptr<Gguf> open_gguf(const std::string& path) {
  return refgguf::open_gguf(path, kWho);
}

}  // namespace gpt_oss_ref

/// Logits [tokens.size() x vocab] of the gpt-oss GGUF file `path` (llama.cpp's "gpt-oss"
/// architecture, all tensors F32), in double; row i = logits after tokens[0..i] (causal,
/// positions 0..n-1); vocab = token_embd.weight's ne[1]. Layers 0, 2, 4, ... attend through a
/// sliding window of gpt-oss.attention.sliding_window positions, the others to the whole prefix;
/// every query head has a learned sink logit. Throws std::runtime_error naming the key or tensor on
/// a missing or mistyped key, a missing tensor, a tensor that is not F32 or whose shape the
/// metadata does not imply, a token outside the vocabulary, or an unsupported config (rope scaling
/// other than "none", value_length != key_length).
inline std::vector<double> gpt_oss_reference_logits(const std::string& path,
                                                    const std::vector<int32_t>& tokens) {
  using namespace gpt_oss_ref;
  const auto g = open_gguf(path);
  return forward(*g, read_config(*g), tokens);
}

}  // namespace troupe::testing
