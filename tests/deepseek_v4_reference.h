// A test reference for DeepSeek-V4 checkpoints (DeepseekV4ForCausalLM): a deliberately naive
// float64 forward pass written from the semantics of transformers' modeling_deepseek_v4,
// independently of troupe's engine and model loader (it uses only the safetensors container
// parser), so that tests can compare the engine's logits against it. Its pieces:
// - the residual is hc_mult parallel streams, read and written by hyper-connections: per block a
//   learned weighting collapses the streams into the block's input, and the block's output is
//   spread back over them beside a Sinkhorn-balanced mix of the old streams;
// - attention with one shared key/value head over a sliding window of raw positions, plus, in
//   compressed layers, entries that each summarize `rate` positions by a learned softmax gate:
//   every visible entry in heavily compressed (HCA) layers, the index_topk an indexer scores
//   best in compressed sparse (CSA) layers; a per-head sink logit; grouped low-rank output;
// - mixture-of-experts feed-forward with sqrt(softplus) scores, routed by a token-id table in the
//   first layers ("hash" layers) and by score plus a bias elsewhere, with clamped SwiGLU experts.
// Plain loops, no caching: for small test models (a few hundred tokens).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numbers>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/hf_moe_reference.h"
#include "tests/reference_math.h"

namespace troupe::testing::deepseek_v4_ref {

using namespace refmath;  // NOLINT(google-build-using-namespace): the shared arithmetic
using moe_ref::ConfigJson;
using moe_ref::Tensor;
using moe_ref::Tensors;

[[noreturn]] inline void fail(const std::string& what) {
  throw std::runtime_error("deepseek-v4 reference: " + what);
}

// ---------------------------------------------------------------------------------------------
// Configuration

enum class Attn { sliding, csa, hca };  // sliding_attention and the two compressed kinds

/// The config.json fields the forward pass uses (DeepseekV4Config's names in the comments).
struct Config {
  int64_t vocab = 0, E = 0, L = 0, H = 0, D = 0;  // head_dim: of the one key/value head too
  int64_t R = 64;                                 // qk_rope_head_dim: rotated tail of a head
  int64_t q_lora = 0, G = 0, o_lora = 0;          // q_lora_rank, o_groups, o_lora_rank
  int64_t N = 0, K = 0, F = 0, shared = 1;        // n_routed_experts, num_experts_per_tok, width
  int64_t hc = 4, sinkhorn_iters = 20;            // hc_mult, hc_sinkhorn_iters
  double hc_eps = 1e-6, eps = 1e-6;               // hc_eps, rms_norm_eps
  double rope_theta = 10000, compress_rope_theta = 160000;
  // rope_scaling yarn, applied to the compressed layers' frequencies only.
  bool yarn = false;
  double yarn_factor = 1, yarn_orig = 0, beta_fast = 32, beta_slow = 1;
  int64_t window = 128;              // sliding_window
  std::vector<Attn> types;           // per layer
  std::vector<int64_t> rate;         // per layer: positions per compressed entry (0: sliding)
  int64_t Hi = 0, Di = 0, topk = 0;  // index_n_heads, index_head_dim, index_topk
  std::vector<bool> hash;            // per layer: routed by the tid2eid table
  double swiglu_limit = 10, routed_scale = 1.5;
  bool tie = false;
};

/// The per-layer attention kinds: layer_types with compress_rates (or the top-level
/// compress_rate_csa and compress_rate_hca), else DeepSeek's compress_ratios (0 sliding, 4 CSA,
/// 128 HCA; entries past num_hidden_layers, the MTP layers', ignored).
inline void read_layer_types(const ConfigJson& j, Config& c) {
  if (j.has("layer_types")) {
    const nlohmann::json& types = j.j["layer_types"];
    if (types.size() != static_cast<size_t>(c.L)) fail("layer_types: one entry per layer");
    int64_t csa = j.get("compress_rate_csa", int64_t{4});
    int64_t hca = j.get("compress_rate_hca", int64_t{128});
    if (j.has("compress_rates")) {
      const nlohmann::json& r = j.j["compress_rates"];
      csa = r.value("compressed_sparse_attention", csa);
      hca = r.value("heavily_compressed_attention", hca);
    }
    for (const auto& t : types) {
      const std::string s = t.get<std::string>();
      if (s == "sliding_attention") {
        c.types.push_back(Attn::sliding);
        c.rate.push_back(0);
      } else if (s == "compressed_sparse_attention") {
        c.types.push_back(Attn::csa);
        c.rate.push_back(csa);
      } else if (s == "heavily_compressed_attention") {
        c.types.push_back(Attn::hca);
        c.rate.push_back(hca);
      } else {
        fail("unknown layer type " + s);
      }
    }
  } else if (j.has("compress_ratios")) {
    const nlohmann::json& ratios = j.j["compress_ratios"];
    if (ratios.size() < static_cast<size_t>(c.L)) fail("compress_ratios: one entry per layer");
    for (int64_t l = 0; l < c.L; ++l) {
      const auto r = ratios[static_cast<size_t>(l)].get<int64_t>();
      if (r != 0 && r != 4 && r != 128) fail("compress_ratios entries must be 0, 4 or 128");
      c.types.push_back(r == 0 ? Attn::sliding : r == 4 ? Attn::csa : Attn::hca);
      c.rate.push_back(r);
    }
  } else {
    fail("config.json has neither layer_types nor compress_ratios");
  }
  for (size_t l = 0; l < c.types.size(); ++l)
    if (c.types[l] != Attn::sliding && c.rate[l] < 1) fail("compress rates must be positive");
}

/// rope_scaling (or rope_parameters): yarn or none.
inline void read_rope_scaling(const ConfigJson& j, Config& c) {
  const char* key = j.has("rope_scaling") ? "rope_scaling" : "rope_parameters";
  if (!j.has(key)) return;
  const nlohmann::json& r = j.j[key];
  if (!r.is_object()) fail(std::string(key) + " must be an object");
  if (r.contains("rope_theta") && !j.has("rope_theta"))
    c.rope_theta = r.at("rope_theta").get<double>();
  const std::string type = r.value("type", r.value("rope_type", std::string("default")));
  if (type == "default") return;
  if (type != "yarn") fail("rope scaling " + type + " is not supported (yarn)");
  c.yarn = true;
  c.yarn_factor = r.at("factor").get<double>();
  c.yarn_orig = r.contains("original_max_position_embeddings")
                    ? r["original_max_position_embeddings"].get<double>()
                    : static_cast<double>(j.req("original_max_position_embeddings"));
  c.beta_fast = r.value("beta_fast", 32.0);
  c.beta_slow = r.value("beta_slow", 1.0);
}

inline Config read_config(const std::string& dir) {
  const ConfigJson j(dir);
  if (j.has("architectures") && j.j["architectures"].at(0) != "DeepseekV4ForCausalLM")
    fail("architectures[0] is " + j.j["architectures"].at(0).dump());
  Config c;
  c.vocab = j.req("vocab_size");
  c.E = j.req("hidden_size");
  c.L = j.req("num_hidden_layers");
  c.H = j.req("num_attention_heads");
  c.D = j.req("head_dim");
  c.R = j.get("qk_rope_head_dim", int64_t{64});
  c.q_lora = j.req("q_lora_rank");
  c.G = j.req("o_groups");
  c.o_lora = j.req("o_lora_rank");
  c.N = j.req("n_routed_experts");
  c.K = j.req("num_experts_per_tok");
  c.F = j.req("moe_intermediate_size");
  c.shared = j.get("n_shared_experts", int64_t{1});
  c.hc = j.get("hc_mult", int64_t{4});
  c.sinkhorn_iters = j.get("hc_sinkhorn_iters", int64_t{20});
  c.hc_eps = j.get("hc_eps", 1e-6);
  c.eps = j.get("rms_norm_eps", 1e-6);
  c.rope_theta = j.get("rope_theta", 10000.0);
  c.compress_rope_theta = j.get("compress_rope_theta", 160000.0);
  read_rope_scaling(j, c);
  c.window = j.get("sliding_window", int64_t{128});
  c.swiglu_limit = j.get("swiglu_limit", 10.0);
  c.routed_scale = j.get("routed_scaling_factor", 1.5);
  c.tie = j.get("tie_word_embeddings", false);
  read_layer_types(j, c);
  if (std::ranges::find(c.types, Attn::csa) != c.types.end()) {
    c.Hi = j.req("index_n_heads");
    c.Di = j.req("index_head_dim");
    c.topk = j.req("index_topk");
    if (c.Hi < 1 || c.Di < c.R || c.topk < 1) fail("bad indexer sizes");
  }
  if (j.has("mlp_layer_types")) {
    const nlohmann::json& types = j.j["mlp_layer_types"];
    if (types.size() != static_cast<size_t>(c.L)) fail("mlp_layer_types: one entry per layer");
    for (const auto& t : types) {
      if (t != "hash_moe" && t != "moe") fail("mlp_layer_types entries: hash_moe or moe");
      c.hash.push_back(t == "hash_moe");
    }
  } else {
    const int64_t n_hash = j.get("num_hash_layers", int64_t{3});
    for (int64_t l = 0; l < c.L; ++l) c.hash.push_back(l < n_hash);
  }
  if (j.get("num_key_value_heads", int64_t{1}) != 1) fail("num_key_value_heads must be 1");
  if (j.get("scoring_func", std::string("sqrtsoftplus")) != "sqrtsoftplus")
    fail("scoring_func must be sqrtsoftplus");
  if (!j.get("norm_topk_prob", true)) fail("norm_topk_prob false is not supported");
  if (c.G < 1 || c.H % c.G != 0) fail("num_attention_heads must be a multiple of o_groups");
  if (c.R < 0 || c.R % 2 != 0 || c.R > c.D) fail("qk_rope_head_dim: even, at most head_dim");
  if (c.K < 1 || c.K > c.N) fail("bad num_experts_per_tok");
  if (c.hc < 1 || c.sinkhorn_iters < 1 || c.window < 1)
    fail(
        "bad hc_mult, hc_sinkhorn_iters "
        "or sliding_window");
  return c;
}

// ---------------------------------------------------------------------------------------------
// Tensors

/// The tensor `name` or "model." + name, which must exist, be F32/F16/BF16 (or `dtypes` when
/// given) and have `shape`.
inline const Tensor& tensor(const Tensors& st, const std::string& name,
                            const std::vector<int64_t>& shape,
                            const std::vector<std::string>& dtypes = {"F32", "F16", "BF16"}) {
  const Tensor* t = st.find(name);
  if (t == nullptr) t = st.find("model." + name);
  if (t == nullptr) fail("missing tensor " + name);
  if (std::ranges::find(dtypes, t->dtype) == dtypes.end())
    fail("tensor " + name + " has unsupported dtype " + t->dtype);
  if (t->shape != shape) {
    std::string want = "[";
    for (size_t i = 0; i < shape.size(); ++i) want += (i ? ", " : "") + std::to_string(shape[i]);
    fail("tensor " + name + " has shape " + t->shape_string() + ", config.json implies " + want +
         "]");
  }
  return *t;
}

inline Vec vec(const Tensors& st, const std::string& name, int64_t n) {
  return moe_ref::row(tensor(st, name, {n}), 0);
}

/// A Linear weight [rows, cols], read once into rows of doubles.
struct Matrix {
  std::vector<Vec> rows;
  Vec operator*(const Vec& x) const {
    Vec out(rows.size());
    for (size_t r = 0; r < rows.size(); ++r) out[r] = dot(rows[r], x);
    return out;
  }
};
inline Matrix matrix(const Tensors& st, const std::string& name, int64_t rows, int64_t cols) {
  const Tensor& t = tensor(st, name, {rows, cols});
  Matrix m;
  for (int64_t r = 0; r < rows; ++r) m.rows.push_back(moe_ref::row(t, r));
  return m;
}

/// v / sqrt(mean(v^2) + eps): RMSNorm without a weight.
inline Vec unit_rms(const Vec& v, double eps) { return rms_norm(v, Vec(v.size(), 1.0), eps); }

// ---------------------------------------------------------------------------------------------
// Rotary

/// The pair frequencies of the main rotary (rope_theta) or of the compressed layers'
/// (compress_rope_theta, blended by YaRN when rope_scaling says so: pair i keeps its frequency
/// below the correction range, is divided by the factor above it and interpolated linearly
/// within; no magnitude correction).
inline Vec rope_freqs(const Config& c, bool compressed) {
  const double base = compressed ? c.compress_rope_theta : c.rope_theta;
  const auto dim = static_cast<double>(c.R);
  Vec f(static_cast<size_t>(c.R / 2));
  for (size_t i = 0; i < f.size(); ++i) f[i] = std::pow(base, -2.0 * static_cast<double>(i) / dim);
  if (!compressed || !c.yarn) return f;
  auto corr = [&](double rotations) {
    return dim * std::log(c.yarn_orig / (rotations * 2 * std::numbers::pi)) / (2 * std::log(base));
  };
  const double low = std::max(std::floor(corr(c.beta_fast)), 0.0);
  double high = std::min(std::ceil(corr(c.beta_slow)), dim - 1);
  if (low == high) high += 0.001;
  for (size_t i = 0; i < f.size(); ++i) {
    const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    const double keep = 1 - ramp;
    f[i] = f[i] / c.yarn_factor * (1 - keep) + f[i] * keep;
  }
  return f;
}

/// Rotates the last 2 * freq.size() values of the head [off, off + width) of v for position pos
/// in neighbouring pairs (a, b) -> (a cos - b sin, b cos + a sin); `inverse` turns the other way.
inline void rope(Vec& v, int64_t off, int64_t width, int64_t pos, const Vec& freq,
                 bool inverse = false) {
  const int64_t start = off + width - 2 * static_cast<int64_t>(freq.size());
  for (size_t i = 0; i < freq.size(); ++i) {
    const double angle = static_cast<double>(pos) * freq[i];
    const double cs = std::cos(angle), sn = inverse ? -std::sin(angle) : std::sin(angle);
    const auto ia = static_cast<size_t>(start + 2 * static_cast<int64_t>(i));
    const double a = v[ia], b = v[ia + 1];
    v[ia] = a * cs - b * sn;
    v[ia + 1] = b * cs + a * sn;
  }
}

// ---------------------------------------------------------------------------------------------
// Hyper-connections

/// The hc streams of one position, each [E].
using Streams = std::vector<Vec>;

/// The weights of a hyper-connection (prefix "layers.N.hc_attn_", "layers.N.hc_ffn_" or
/// "hc_head_"): fn [rows, hc * E], base [rows], scale [n_scales].
struct HcWeights {
  Matrix fn;
  Vec base, scale;
};
inline HcWeights hc_weights(const Tensors& st, const Config& c, const std::string& p, int64_t rows,
                            int64_t n_scales) {
  return {matrix(st, p + "fn", rows, c.hc * c.E), vec(st, p + "base", rows),
          vec(st, p + "scale", n_scales)};
}

/// fn times the unweighted RMSNorm of the streams laid end to end.
inline Vec hc_mixes(const Config& c, const HcWeights& w, const Streams& x) {
  Vec flat;
  for (const Vec& s : x) flat.insert(flat.end(), s.begin(), s.end());
  return w.fn * unit_rms(flat, c.eps);
}

/// sum_j pre[j] x[j].
inline Vec collapse(const Config& c, const Vec& pre, const Streams& x) {
  Vec y(static_cast<size_t>(c.E), 0.0);
  for (int64_t j = 0; j < c.hc; ++j) add_scaled(y, pre[j], x[j]);
  return y;
}

/// A block's hyper-connection at one position: the weights that collapse the streams into the
/// block's input (pre), spread its output (post) and mix the old streams (comb[j][k]: from j to
/// k, Sinkhorn-balanced).
struct HcMix {
  Vec pre, post;
  std::vector<Vec> comb;
};
inline HcMix hc_mix(const Config& c, const HcWeights& w, const Streams& x) {
  const Vec z = hc_mixes(c, w, x);
  const auto n = static_cast<size_t>(c.hc);
  HcMix m;
  m.pre.resize(n);
  m.post.resize(n);
  m.comb.assign(n, Vec(n));
  for (size_t j = 0; j < n; ++j) {
    m.pre[j] = sigmoid(z[j] * w.scale[0] + w.base[j]) + c.hc_eps;
    m.post[j] = 2 * sigmoid(z[n + j] * w.scale[1] + w.base[n + j]);
  }
  for (size_t j = 0; j < n; ++j) {
    Vec& r = m.comb[j];
    for (size_t k = 0; k < n; ++k)
      r[k] = z[2 * n + j * n + k] * w.scale[2] + w.base[2 * n + j * n + k];
    softmax(r);
    for (double& e : r) e += c.hc_eps;
  }
  auto normalize_columns = [&] {
    for (size_t k = 0; k < n; ++k) {
      double s = 0;
      for (size_t j = 0; j < n; ++j) s += m.comb[j][k];
      for (size_t j = 0; j < n; ++j) m.comb[j][k] /= s + c.hc_eps;
    }
  };
  normalize_columns();
  for (int64_t it = 1; it < c.sinkhorn_iters; ++it) {
    for (Vec& r : m.comb) {
      double s = 0;
      for (double e : r) s += e;
      for (double& e : r) e /= s + c.hc_eps;
    }
    normalize_columns();
  }
  return m;
}

/// The streams after a block whose output is `out`: x[k] = post[k] out + sum_j comb[j][k] x[j].
inline Streams hc_spread(const Config& c, const HcMix& m, const Vec& out, const Streams& x) {
  Streams y(x.size());
  for (int64_t k = 0; k < c.hc; ++k) {
    y[k].assign(static_cast<size_t>(c.E), 0.0);
    add_scaled(y[k], m.post[k], out);
    for (int64_t j = 0; j < c.hc; ++j) add_scaled(y[k], m.comb[j][k], x[j]);
  }
  return y;
}

// ---------------------------------------------------------------------------------------------
// Attention

/// The compressor at prefix p ("layers.N.attn.compressor." or "...indexer.compressor.") over
/// the block inputs hs: entry w for each complete window of m positions (w m .. w m + m - 1).
/// Per channel c < width a softmax over slots of gate logits weights the slots' values; a slot is
/// a position of the window (value wkv h[c] and gate wgate h[c] + ape[i][c] for HCA; value
/// wkv h[width + c], gate wgate h[width + c] + ape[i][width + c] for CSA), and with `overlap`
/// (CSA) also a position of the previous window, if any, through the first `width` channels.
/// Each entry is then RMS-normed by norm.weight and rotated for position w m with `freq`.
inline std::vector<Vec> compress(const Tensors& st, const Config& c, const std::string& p,
                                 int64_t width, int64_t m, bool overlap, const std::vector<Vec>& hs,
                                 const Vec& freq) {
  const int64_t rows = (overlap ? 2 : 1) * width;
  const Matrix wkv = matrix(st, p + "wkv.weight", rows, c.E);
  const Matrix wgate = matrix(st, p + "wgate.weight", rows, c.E);
  const Matrix ape = matrix(st, p + "ape", m, rows);
  const Vec norm = vec(st, p + "norm.weight", width);
  const auto n = static_cast<int64_t>(hs.size());
  std::vector<Vec> kv, gate;
  for (const Vec& h : hs) {
    kv.push_back(wkv * h);
    gate.push_back(wgate * h);
  }
  const int64_t cur = overlap ? width : 0;  // channel offset of a window's own slots
  std::vector<Vec> entries;
  for (int64_t w = 0; (w + 1) * m <= n; ++w) {
    Vec e(static_cast<size_t>(width));
    for (int64_t ch = 0; ch < width; ++ch) {
      Vec value, logit;
      if (overlap && w > 0)
        for (int64_t i = 0; i < m; ++i) {
          value.push_back(kv[(w - 1) * m + i][ch]);
          logit.push_back(gate[(w - 1) * m + i][ch] + ape.rows[i][ch]);
        }
      for (int64_t i = 0; i < m; ++i) {
        value.push_back(kv[w * m + i][cur + ch]);
        logit.push_back(gate[w * m + i][cur + ch] + ape.rows[i][cur + ch]);
      }
      softmax(logit);
      e[ch] = dot(logit, value);
    }
    e = rms_norm(e, norm, c.eps);
    rope(e, 0, width, w * m, freq);
    entries.push_back(std::move(e));
  }
  return entries;
}

/// The compressed entries each position t of a CSA layer (attention prefix a) attends to: of the
/// visible ones ((w + 1) m <= t + 1), all when they are at most index_topk, else the index_topk
/// of largest score(t, w) = sum_h wh[h] max(0, iq_h . ik_w) / sqrt(Di) (ties: the lower w), in
/// increasing order. iq = indexer.wq_b qr, Hi heads of Di each rotated for t; wh =
/// indexer.weights_proj h / sqrt(Hi); ik: indexer.compressor's entries.
inline std::vector<std::vector<int64_t>> index_select(const Tensors& st, const Config& c,
                                                      const std::string& a, int64_t m,
                                                      const std::vector<Vec>& hs,
                                                      const std::vector<Vec>& qr, const Vec& freq) {
  const std::string x = a + "indexer.";
  const std::vector<Vec> ik = compress(st, c, x + "compressor.", c.Di, m, true, hs, freq);
  const Matrix wq = matrix(st, x + "wq_b.weight", c.Hi * c.Di, c.q_lora);
  const Matrix ww = matrix(st, x + "weights_proj.weight", c.Hi, c.E);
  std::vector<std::vector<int64_t>> keep(hs.size());
  for (size_t t = 0; t < hs.size(); ++t) {
    const auto visible = static_cast<int64_t>(t + 1) / m;
    std::vector<int64_t>& k = keep[t];
    for (int64_t w = 0; w < visible; ++w) k.push_back(w);
    if (visible <= c.topk) continue;
    Vec iq = wq * qr[t];
    for (int64_t h = 0; h < c.Hi; ++h) rope(iq, h * c.Di, c.Di, static_cast<int64_t>(t), freq);
    const Vec wh = ww * hs[t];
    Vec score(static_cast<size_t>(visible), 0.0);
    for (int64_t w = 0; w < visible; ++w)
      for (int64_t h = 0; h < c.Hi; ++h) {
        double d = 0;
        for (int64_t e = 0; e < c.Di; ++e) d += iq[h * c.Di + e] * ik[w][e];
        score[w] += wh[h] / std::sqrt(static_cast<double>(c.Hi)) * std::max(0.0, d) /
                    std::sqrt(static_cast<double>(c.Di));
      }
    std::ranges::stable_sort(k, [&](int64_t l, int64_t r) { return score[l] > score[r]; });
    k.resize(static_cast<size_t>(c.topk));
    std::ranges::sort(k);
  }
  return keep;
}

/// The attention of layer l (prefix "layers.l.attn.") over the block inputs hs, causal,
/// positions 0..n-1. qr = q_norm(wq_a h); q = wq_b qr, H heads of D, each unit-RMS-normed and
/// rotated; kv = rotated kv_norm(wkv h), one head that is both key and value. Query t attends to
/// kv_s for t - sliding_window < s <= t and the compressed entries the layer kind allows (see
/// compress, index_select), scores q . k / sqrt(D), with one sink logit attn_sink[h] in each
/// head's softmax; each head's output is rotated back for t; then the G groups of H D / G
/// values each through their o_lora rows of wo_a, and wo_b. Sliding layers rotate with
/// rope_theta, compressed ones with the compressed frequencies.
inline std::vector<Vec> attention(const Tensors& st, const Config& c, int64_t l,
                                  const std::vector<Vec>& hs) {
  const std::string a = "layers." + std::to_string(l) + ".attn.";
  const Attn type = c.types[l];
  const int64_t m = c.rate[l], H = c.H, D = c.D;
  const Vec freq = rope_freqs(c, type != Attn::sliding);
  const Matrix wq_a = matrix(st, a + "wq_a.weight", c.q_lora, c.E);
  const Vec q_norm = vec(st, a + "q_norm.weight", c.q_lora);
  const Matrix wq_b = matrix(st, a + "wq_b.weight", H * D, c.q_lora);
  const Matrix wkv = matrix(st, a + "wkv.weight", D, c.E);
  const Vec kv_norm = vec(st, a + "kv_norm.weight", D);
  const Vec sink = vec(st, a + "attn_sink", H);
  const size_t n = hs.size();
  std::vector<Vec> q(n), qr(n), kv(n);
  for (size_t t = 0; t < n; ++t) {
    const auto pos = static_cast<int64_t>(t);
    qr[t] = rms_norm(wq_a * hs[t], q_norm, c.eps);
    q[t] = wq_b * qr[t];
    for (int64_t h = 0; h < H; ++h) {
      const Vec head(q[t].begin() + h * D, q[t].begin() + (h + 1) * D);
      std::ranges::copy(unit_rms(head, c.eps), q[t].begin() + h * D);
      rope(q[t], h * D, D, pos, freq);
    }
    kv[t] = rms_norm(wkv * hs[t], kv_norm, c.eps);
    rope(kv[t], 0, D, pos, freq);
  }
  std::vector<Vec> entries;
  std::vector<std::vector<int64_t>> picked;  // CSA: the entries each query keeps
  if (type != Attn::sliding)
    entries = compress(st, c, a + "compressor.", D, m, type == Attn::csa, hs, freq);
  if (type == Attn::csa) picked = index_select(st, c, a, m, hs, qr, freq);
  const int64_t group = H * D / c.G;
  const Matrix wo_a = matrix(st, a + "wo_a.weight", c.G * c.o_lora, group);
  const Matrix wo_b = matrix(st, a + "wo_b.weight", c.E, c.G * c.o_lora);
  std::vector<Vec> out(n);
  for (size_t t = 0; t < n; ++t) {
    const auto pos = static_cast<int64_t>(t);
    std::vector<const Vec*> keys;
    for (int64_t s = std::max<int64_t>(0, pos - c.window + 1); s <= pos; ++s)
      keys.push_back(&kv[s]);
    if (type == Attn::hca)
      for (int64_t w = 0; (w + 1) * m <= pos + 1; ++w) keys.push_back(&entries[w]);
    if (type == Attn::csa)
      for (int64_t w : picked[t]) keys.push_back(&entries[w]);
    Vec o(static_cast<size_t>(H * D), 0.0);
    for (int64_t h = 0; h < H; ++h) {
      const Vec qh(q[t].begin() + h * D, q[t].begin() + (h + 1) * D);
      Vec p;
      for (const Vec* k : keys) p.push_back(dot(qh, *k) / std::sqrt(static_cast<double>(D)));
      p.push_back(sink[h]);  // the sink: in the denominator, without a value
      softmax(p);
      for (size_t i = 0; i < keys.size(); ++i)
        for (int64_t e = 0; e < D; ++e) o[h * D + e] += p[i] * (*keys[i])[e];
      rope(o, h * D, D, pos, freq, /*inverse=*/true);
    }
    Vec z;
    for (int64_t g = 0; g < c.G; ++g) {
      const Vec part(o.begin() + g * group, o.begin() + (g + 1) * group);
      for (int64_t r = 0; r < c.o_lora; ++r) z.push_back(dot(wo_a.rows[g * c.o_lora + r], part));
    }
    out[t] = wo_b * z;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Mixture of experts

/// w2 (silu(min(w1 h, limit)) * clamp(w3 h, -limit, limit)) of the expert at prefix p.
inline Vec expert(const Tensors& st, const Config& c, const std::string& p, int64_t width,
                  const Vec& h) {
  const Vec g = matrix(st, p + "w1.weight", width, c.E) * h;
  const Vec u = matrix(st, p + "w3.weight", width, c.E) * h;
  Vec act(g.size());
  const double lim = c.swiglu_limit;
  for (size_t i = 0; i < act.size(); ++i)
    act[i] = silu(std::min(g[i], lim)) * std::clamp(u[i], -lim, lim);
  return matrix(st, p + "w2.weight", c.E, width) * act;
}

/// Row `token` of the hash layer's expert table ffn.gate.tid2eid [vocab, K] (I32 or I64).
inline std::vector<int64_t> table_experts(const Tensors& st, const Config& c, const std::string& f,
                                          int32_t token) {
  const Tensor& t = tensor(st, f + "gate.tid2eid", {c.vocab, c.K}, {"I32", "I64"});
  const size_t size = t.dtype == "I64" ? 8 : 4;
  std::vector<int64_t> ids;
  for (int64_t k = 0; k < c.K; ++k) {
    const uint8_t* p = t.data + (token * c.K + k) * static_cast<int64_t>(size);
    int64_t e = 0;
    if (size == 8) {
      std::memcpy(&e, p, 8);
    } else {
      int32_t e32 = 0;
      std::memcpy(&e32, p, 4);
      e = e32;
    }
    if (e < 0 || e >= c.N) fail(f + "gate.tid2eid holds expert " + std::to_string(e));
    ids.push_back(e);
  }
  return ids;
}

/// The feed-forward of layer l for the block input h of a position whose input token is `token`:
/// scores sqrt(softplus(gate.weight h)); experts from the table (hash layers) or the K largest
/// score + gate.bias (ties: the lower index); weights their scores over the picked scores' sum
/// times routed_scaling_factor; plus the shared experts.
inline Vec moe(const Tensors& st, const Config& c, int64_t l, const Vec& h, int32_t token) {
  const std::string f = "layers." + std::to_string(l) + ".ffn.";
  Vec score = matrix(st, f + "gate.weight", c.N, c.E) * h;
  for (double& s : score) s = std::sqrt(std::max(s, 0.0) + std::log1p(std::exp(-std::fabs(s))));
  std::vector<int64_t> ids;
  if (c.hash[l]) {
    ids = table_experts(st, c, f, token);
  } else {
    Vec choice = score;
    add_scaled(choice, 1.0, vec(st, f + "gate.bias", c.N));
    std::vector<int64_t> order(static_cast<size_t>(c.N));
    for (int64_t e = 0; e < c.N; ++e) order[e] = e;
    std::ranges::stable_sort(order, [&](int64_t x, int64_t y) { return choice[x] > choice[y]; });
    ids.assign(order.begin(), order.begin() + c.K);
  }
  double sum = 0;
  for (int64_t e : ids) sum += score[e];
  Vec out(static_cast<size_t>(c.E), 0.0);
  for (int64_t e : ids)
    add_scaled(out, score[e] / (sum + 1e-20) * c.routed_scale,
               expert(st, c, f + "experts." + std::to_string(e) + ".", c.F, h));
  if (c.shared > 0) add_scaled(out, 1.0, expert(st, c, f + "shared_experts.", c.F * c.shared, h));
  return out;
}

// ---------------------------------------------------------------------------------------------
// The whole model

/// Logits [tokens.size()][vocab] of a teacher-forced pass over `tokens` (row t: after
/// tokens[0..t], positions 0..n-1), in double, from the DeepseekV4ForCausalLM directory `dir`
/// (config.json + model.safetensors or a sharded index; tensor names with or without "model.";
/// float tensors F32, BF16 or F16). Layers past num_hidden_layers (MTP) are ignored. Throws
/// std::runtime_error naming the tensor or key on a missing tensor, a shape that config.json does
/// not imply, or an unsupported config.
inline std::vector<std::vector<double>> logits(const std::string& dir,
                                               const std::vector<int32_t>& tokens) {
  const Config c = read_config(dir);
  const auto st = moe_ref::open_checkpoint(dir);
  const size_t n = tokens.size();
  const Tensor& embed = tensor(*st, "embed.weight", {c.vocab, c.E});
  std::vector<Streams> x(n);
  for (size_t t = 0; t < n; ++t) {
    if (tokens[t] < 0 || tokens[t] >= c.vocab)
      fail("token " + std::to_string(tokens[t]) + " outside the vocabulary");
    x[t].assign(static_cast<size_t>(c.hc), moe_ref::row(embed, tokens[t]));
  }
  const int64_t hc_rows = (2 + c.hc) * c.hc;
  for (int64_t l = 0; l < c.L; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    const HcWeights attn_hc = hc_weights(*st, c, p + "hc_attn_", hc_rows, 3);
    const HcWeights ffn_hc = hc_weights(*st, c, p + "hc_ffn_", hc_rows, 3);
    const Vec attn_norm = vec(*st, p + "attn_norm.weight", c.E);
    const Vec ffn_norm = vec(*st, p + "ffn_norm.weight", c.E);
    std::vector<HcMix> mix(n);
    std::vector<Vec> hs(n);
    for (size_t t = 0; t < n; ++t) {
      mix[t] = hc_mix(c, attn_hc, x[t]);
      hs[t] = rms_norm(collapse(c, mix[t].pre, x[t]), attn_norm, c.eps);
    }
    const std::vector<Vec> o = attention(*st, c, l, hs);
    for (size_t t = 0; t < n; ++t) {
      x[t] = hc_spread(c, mix[t], o[t], x[t]);
      const HcMix fm = hc_mix(c, ffn_hc, x[t]);
      const Vec h = rms_norm(collapse(c, fm.pre, x[t]), ffn_norm, c.eps);
      x[t] = hc_spread(c, fm, moe(*st, c, l, h, tokens[t]), x[t]);
    }
  }
  const HcWeights head_hc = hc_weights(*st, c, "hc_head_", c.hc, 1);
  const Vec norm = vec(*st, "norm.weight", c.E);
  const Matrix head = matrix(*st, c.tie ? "embed.weight" : "head.weight", c.vocab, c.E);
  std::vector<std::vector<double>> out;
  for (size_t t = 0; t < n; ++t) {
    const Vec z = hc_mixes(c, head_hc, x[t]);
    Vec pre(static_cast<size_t>(c.hc));
    for (int64_t j = 0; j < c.hc; ++j)
      pre[j] = sigmoid(z[j] * head_hc.scale[0] + head_hc.base[j]) + c.hc_eps;
    out.push_back(head * rms_norm(collapse(c, pre, x[t]), norm, c.eps));
  }
  return out;
}

}  // namespace troupe::testing::deepseek_v4_ref
