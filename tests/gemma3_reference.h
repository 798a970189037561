// Test reference for Google's Gemma 3 text decoder as llama.cpp runs its "gemma3" GGUF
// architecture: a deliberately naive float64 forward pass that reads the file by its GGUF tensor
// names and "gemma3." keys, independently of troupe's engine and model loader (it uses only the
// GGUF container parser and model::dequantize_row), so that tests can compare the engine's logits
// against it. Embeddings times sqrt(n_embd); per layer RMSNorm, q/k/v, per-head q/k RMSNorm, NeoX
// rotary, GQA attention (five sliding-window layers with rope base 10000, then one global layer
// with the file's base and linear scaling), RMSNorm after attention and after the GELU(tanh)-gated
// FFN; final RMSNorm, output head (tied to the embeddings when absent), optional soft cap.
// Also input rows in place of tokens (image positions, unscaled) and non-causal position ranges
// (Gemma 3's image chunks). Plain loops, layer by layer over all positions: for small test models.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <memory>
#include <numbers>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "model/ggml_types.h"
#include "model/gguf.h"
#include "tests/reference_gguf.h"
#include "tests/reference_math.h"

namespace troupe::testing {
namespace gemma3_ref {

using namespace refmath;  // NOLINT(google-build-using-namespace): the shared arithmetic
using Gguf = model::GgufFile;
using Tensor = model::TensorInfo;

inline constexpr const char* kWho = "gemma3";

[[noreturn]] inline void fail(const std::string& what) { refgguf::fail(kWho, what); }

// ---------------------------------------------------------------------------------------------
// Configuration

/// llama.cpp's gemma3: every sixth layer (il % 6 == 5) is global, the others slide (when the file
/// has a sliding window at all); sliding layers rotate with base 10000 and no scaling.
inline constexpr int64_t kSlidingPattern = 6;
inline constexpr double kSlidingRopeTheta = 10000.0;
/// llama.cpp's LLM_TYPE_27B, whose attention scale is 1/sqrt(n_embd / n_head).
inline constexpr int64_t kLayers27B = 62;

/// The "gemma3." hyperparameters the forward pass uses.
struct Config {
  int64_t vocab = 0, E = 0, L = 0, F = 0, H = 0, Hkv = 0, D = 0;  // D: head size (k and v)
  int64_t W = 0;              // sliding window of the sliding layers; 0: none, every layer global
  double eps = 1e-6;          // RMSNorm epsilon
  double rope_theta = 10000;  // rope base of the global layers
  double rope_scale = 1;      // linear factor s of the global layers: angles use position / s
  double attn_scale = 1;      // multiplies q before the scores q . k
  double softcap = 0;         // > 0: logits become softcap * tanh(logits / softcap)
};

/// The key "gemma3." + name.
inline std::string key(const char* name) { return std::string("gemma3.") + name; }

/// The linear rope factor of the global layers as llama.cpp derives it: rope.scaling.factor (or
/// the older rope.scale_linear; 0 or absent means 1), ignored when rope.scaling.type is "none".
/// llama.cpp's default type is "linear", so a factor without a type scales.
inline double read_rope_scale(const Gguf& g) {
  const std::string type = g.get_string_or(key("rope.scaling.type"), "linear");
  if (type == "none") return 1.0;
  if (type != "linear")
    fail(key("rope.scaling.type") + " \"" + type + "\" is not supported (none, linear)");
  const double factor = g.find(key("rope.scaling.factor")) != nullptr
                            ? g.get_float(key("rope.scaling.factor"))
                            : g.get_float_or(key("rope.scale_linear"), 0.0);
  if (factor < 0 || !std::isfinite(factor)) fail("bad " + key("rope.scaling.factor"));
  return factor == 0 ? 1.0 : factor;
}

/// The hyperparameters of g (vocab is set later, from token_embd.weight). Missing or mistyped
/// keys throw the parser's error, which names the key.
inline Config read_config(const Gguf& g) {
  const std::string arch = g.get_string_or("general.architecture", "gemma3");
  if (arch != "gemma3") fail("general.architecture is \"" + arch + "\", not \"gemma3\"");
  Config c;
  c.E = g.get_int(key("embedding_length"));
  c.L = g.get_int(key("block_count"));
  c.F = g.get_int(key("feed_forward_length"));
  c.H = g.get_int(key("attention.head_count"));
  c.Hkv = g.get_int(key("attention.head_count_kv"));
  if (c.E <= 0 || c.L < 0) fail("bad " + key("embedding_length") + " or " + key("block_count"));
  if (c.F <= 0) fail("bad " + key("feed_forward_length"));
  if (c.H <= 0 || c.Hkv <= 0 || c.H % c.Hkv != 0)
    fail(key("attention.head_count") + " must be a positive multiple of " +
         key("attention.head_count_kv"));
  c.D = g.get_int_or(key("attention.key_length"), c.E / c.H);
  if (c.D <= 0 || c.D % 2 != 0) fail(key("attention.key_length") + " must be positive and even");
  if (g.get_int_or(key("attention.value_length"), c.D) != c.D)
    fail(key("attention.value_length") + " must equal key_length");
  if (g.get_int_or(key("rope.dimension_count"), c.D) != c.D)
    fail(key("rope.dimension_count") + " must equal key_length (the whole head rotates)");
  c.eps = g.get_float(key("attention.layer_norm_rms_epsilon"));
  c.rope_theta = g.get_float_or(key("rope.freq_base"), 10000.0);
  c.rope_scale = read_rope_scale(g);
  c.W = g.get_int_or(key("attention.sliding_window"), 0);
  if (c.W < 0) fail(key("attention.sliding_window") + " must not be negative");
  // llama.cpp soft-caps only in its graph without sliding windows (llm_build_gemma3<false>),
  // which it picks when the file has no positive sliding window.
  const double cap = g.get_float_or(key("final_logit_softcapping"), 0.0);
  c.softcap = c.W == 0 && cap > 0 ? cap : 0.0;
  // llama.cpp's f_attention_scale, n_embd / n_head in integers as there.
  c.attn_scale = 1.0 / std::sqrt(static_cast<double>(c.L == kLayers27B ? c.E / c.H : c.D));
  return c;
}

// ---------------------------------------------------------------------------------------------
// Tensors and vector arithmetic

inline const Tensor& tensor(const Gguf& g, const std::string& name,
                            const std::vector<int64_t>& ne) {
  return refgguf::tensor(g, name, ne, kWho, /*f32_only=*/false);
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
// Weights

/// One layer's weights: the norm vectors read once, the matrices as views into the file.
struct Layer {
  Vec attn_norm, q_norm, k_norm, post_attn_norm, ffn_norm, post_ffw_norm;
  const Tensor* wq = nullptr;    // [E, H * D]
  const Tensor* wk = nullptr;    // [E, Hkv * D]
  const Tensor* wv = nullptr;    // [E, Hkv * D]
  const Tensor* wo = nullptr;    // [H * D, E]
  const Tensor* gate = nullptr;  // [E, F]
  const Tensor* up = nullptr;    // [E, F]
  const Tensor* down = nullptr;  // [F, E]
};

/// Everything the forward pass reads, validated against the metadata up front.
struct Model {
  Config c;
  const Tensor* embed = nullptr;   // token_embd.weight [E, vocab]
  const Tensor* output = nullptr;  // output.weight [E, vocab], or embed when the file has none
  Vec output_norm;
  std::vector<Layer> layers;
};

inline Layer read_layer(const Gguf& g, const Config& c, int64_t il) {
  const std::string p = "blk." + std::to_string(il) + ".";
  Layer ly;
  ly.attn_norm = vec(g, p + "attn_norm.weight", c.E);
  ly.q_norm = vec(g, p + "attn_q_norm.weight", c.D);
  ly.k_norm = vec(g, p + "attn_k_norm.weight", c.D);
  ly.post_attn_norm = vec(g, p + "post_attention_norm.weight", c.E);
  ly.ffn_norm = vec(g, p + "ffn_norm.weight", c.E);
  ly.post_ffw_norm = vec(g, p + "post_ffw_norm.weight", c.E);
  ly.wq = &tensor(g, p + "attn_q.weight", {c.E, c.H * c.D});
  ly.wk = &tensor(g, p + "attn_k.weight", {c.E, c.Hkv * c.D});
  ly.wv = &tensor(g, p + "attn_v.weight", {c.E, c.Hkv * c.D});
  ly.wo = &tensor(g, p + "attn_output.weight", {c.H * c.D, c.E});
  ly.gate = &tensor(g, p + "ffn_gate.weight", {c.E, c.F});
  ly.up = &tensor(g, p + "ffn_up.weight", {c.E, c.F});
  ly.down = &tensor(g, p + "ffn_down.weight", {c.F, c.E});
  return ly;
}

/// The model of g; its tensor pointers stay valid while g lives.
inline Model read_model(const Gguf& g) {
  Model m;
  m.c = read_config(g);
  const Tensor* te = g.find_tensor("token_embd.weight");
  if (te == nullptr) fail("missing tensor token_embd.weight");
  m.c.vocab = te->ne[1];
  m.embed = &tensor(g, "token_embd.weight", {m.c.E, m.c.vocab});
  m.output = g.find_tensor("output.weight") != nullptr
                 ? &tensor(g, "output.weight", {m.c.E, m.c.vocab})
                 : m.embed;
  m.output_norm = vec(g, "output_norm.weight", m.c.E);
  for (int64_t il = 0; il < m.c.L; ++il) m.layers.push_back(read_layer(g, m.c, il));
  return m;
}

// ---------------------------------------------------------------------------------------------
// Input and visibility

/// The token id of a position whose input row is the next row of Prompt::rows instead of a row
/// of the embedding table (an image position of a vision-language prompt).
inline constexpr int32_t kEmbeddedRow = -1;

/// Positions [begin, end) decoded as one non-causal chunk: each of their queries sees every key
/// up to `end`, not only the earlier ones.
struct PosRange {
  int64_t begin = 0, end = 0;
};

/// What a forward pass reads, at positions 0, 1, ...
struct Prompt {
  std::vector<int32_t> tokens;       // ids in [0, vocab), or kEmbeddedRow
  std::vector<double> rows;          // [number of kEmbeddedRow tokens, E], in order
  std::vector<PosRange> non_causal;  // ascending, disjoint, non-empty, inside [0, tokens.size())
};

/// Throws unless p's tokens, rows and ranges fit each other and the vocabulary.
inline void check_prompt(const Config& c, const Prompt& p) {
  int64_t n_rows = 0;
  for (int32_t t : p.tokens) {
    if (t == kEmbeddedRow)
      ++n_rows;
    else if (t < 0 || t >= c.vocab)
      fail("token " + std::to_string(t) + " outside the vocabulary");
  }
  if (static_cast<int64_t>(p.rows.size()) != n_rows * c.E)
    fail(std::to_string(n_rows) + " embedded positions need " + std::to_string(n_rows * c.E) +
         " row values, got " + std::to_string(p.rows.size()));
  int64_t at = 0;
  for (const PosRange& r : p.non_causal) {
    if (r.begin < at || r.end <= r.begin || r.end > static_cast<int64_t>(p.tokens.size()))
      fail("non-causal ranges must be ascending, disjoint, non-empty and inside the prompt");
    at = r.end;
  }
}

/// The input rows [tokens][E]: token rows times sqrt(E), kEmbeddedRow positions their row of
/// p.rows as it is. llama.cpp's gemma3 graph scales only a batch of token ids (`if
/// (ubatch.token)`): rows from the vision projector come at the scale the decoder expects.
inline std::vector<Vec> embed(const Model& m, const Prompt& p) {
  const double embd_scale = std::sqrt(static_cast<double>(m.c.E));
  std::vector<Vec> xs;
  auto next_row = p.rows.begin();
  for (int32_t t : p.tokens) {
    if (t == kEmbeddedRow) {
      xs.emplace_back(next_row, next_row + m.c.E);
      next_row += m.c.E;
      continue;
    }
    xs.push_back(row(*m.embed, t));
    for (double& e : xs.back()) e *= embd_scale;
  }
  return xs;
}

/// Whether layer il attends through the sliding window (and rotates with base 10000, unscaled).
inline bool is_sliding(const Config& c, int64_t il) {
  return c.W > 0 && (il + 1) % kSlidingPattern != 0;
}

/// One past the last key the query at pos sees: pos + 1, or the end of its non-causal range.
inline int64_t keys_end(const std::vector<PosRange>& non_causal, int64_t pos) {
  for (const PosRange& r : non_causal)
    if (r.begin <= pos && pos < r.end) return r.end;
  return pos + 1;
}

/// The first key the query at pos sees on layer il: on sliding layers the last W up to pos (keys
/// s with pos - s < W), else 0. The bound holds for non-causal queries too: llama.cpp's standard
/// SWA mask hides key p0 from query p1 when p1 - p0 >= n_swa whatever the causality, and keys
/// after the query (p1 - p0 < 0) are never hidden by it.
inline int64_t keys_begin(const Config& c, int64_t il, int64_t pos) {
  return is_sliding(c, il) ? std::max<int64_t>(0, pos - c.W + 1) : 0;
}

// ---------------------------------------------------------------------------------------------
// Attention

/// refmath::rope_neox at a fractional position (pos / s under linear scaling): pairs
/// (i, i + r/2), angle = pos * theta^(-2i/r).
inline void rope_neox_at(Vec& v, int64_t off, double pos, int64_t r, double theta) {
  for (int64_t i = 0; i < r / 2; ++i) {
    const double inv_freq = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(r));
    const double angle = pos * inv_freq;
    const double cs = std::cos(angle), sn = std::sin(angle);
    const double a = v[off + i], b = v[off + i + r / 2];
    v[off + i] = a * cs - b * sn;
    v[off + i + r / 2] = b * cs + a * sn;
  }
}

/// Each of the n heads of v in turn: RMSNorm over its D values with w (the same for every head),
/// then NeoX rotary over all D dims with layer il's base and scaling for position pos.
inline void norm_and_rotate(Vec& v, int64_t n, const Vec& w, const Config& c, int64_t il,
                            int64_t pos) {
  for (int64_t j = 0; j < n; ++j) {
    const auto first = v.begin() + j * c.D;
    const Vec normed = rms_norm(Vec(first, first + c.D), w, c.eps);
    std::ranges::copy(normed, first);
    if (is_sliding(c, il))
      rope_neox(v, j * c.D, pos, c.D, kSlidingRopeTheta);
    else if (c.rope_scale == 1.0)
      rope_neox(v, j * c.D, pos, c.D, c.rope_theta);
    else
      rope_neox_at(v, j * c.D, static_cast<double>(pos) / c.rope_scale, c.D, c.rope_theta);
  }
}

/// One layer's queries (times the attention scale), rotated keys and values, per position:
/// H * D, Hkv * D and Hkv * D values each.
struct Qkv {
  std::vector<Vec> q, k, v;
};

/// Layer il's Qkv of the normed inputs hs (position = index): per-head normed and rotated q, k.
inline Qkv project(const Layer& ly, const Config& c, int64_t il, const std::vector<Vec>& hs) {
  Qkv out;
  for (size_t pos = 0; pos < hs.size(); ++pos) {
    Vec q = matvec(*ly.wq, hs[pos]), k = matvec(*ly.wk, hs[pos]);
    norm_and_rotate(q, c.H, ly.q_norm, c, il, static_cast<int64_t>(pos));
    norm_and_rotate(k, c.Hkv, ly.k_norm, c, il, static_cast<int64_t>(pos));
    for (double& e : q) e *= c.attn_scale;
    out.q.push_back(std::move(q));
    out.k.push_back(std::move(k));
    out.v.push_back(matvec(*ly.wv, hs[pos]));
  }
  return out;
}

/// GQA softmax(q . k) over keys [first, end) for query q: the H * D head outputs.
inline Vec attend(const Config& c, const Vec& q, const Qkv& kv, int64_t first, int64_t end) {
  Vec heads(static_cast<size_t>(c.H * c.D), 0.0);
  for (int64_t j = 0; j < c.H; ++j) {
    const int64_t qo = j * c.D, ko = j / (c.H / c.Hkv) * c.D;
    Vec z;  // scores of keys first..end-1
    for (int64_t s = first; s < end; ++s) {
      double d = 0;
      for (int64_t e = 0; e < c.D; ++e) d += q[qo + e] * kv.k[s][ko + e];
      z.push_back(d);
    }
    softmax(z);
    for (int64_t s = first; s < end; ++s)
      for (int64_t e = 0; e < c.D; ++e) heads[qo + e] += z[s - first] * kv.v[s][ko + e];
  }
  return heads;
}

/// Attention of layer il for every position's normed input hs: each query over the keys
/// [keys_begin, keys_end), then the output projection.
inline std::vector<Vec> attention(const Layer& ly, const Config& c, int64_t il,
                                  const std::vector<Vec>& hs,
                                  const std::vector<PosRange>& non_causal) {
  const Qkv kv = project(ly, c, il, hs);
  std::vector<Vec> out;
  for (int64_t pos = 0; pos < static_cast<int64_t>(hs.size()); ++pos) {
    const Vec heads = attend(c, kv.q[pos], kv, keys_begin(c, il, pos), keys_end(non_causal, pos));
    out.push_back(matvec(*ly.wo, heads));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Feed-forward and the whole model

/// GELU, tanh form: 0.5 z (1 + tanh(sqrt(2/pi) (z + 0.044715 z^3))).
inline double gelu_tanh(double z) {
  const double k = std::sqrt(2.0 / std::numbers::pi);
  return 0.5 * z * (1.0 + std::tanh(k * (z + 0.044715 * z * z * z)));
}

/// Wdown (gelu_tanh(Wgate f) * Wup f).
inline Vec ffn(const Layer& ly, const Vec& f) {
  const Vec g = matvec(*ly.gate, f), u = matvec(*ly.up, f);
  Vec m(g.size());
  for (size_t i = 0; i < m.size(); ++i) m[i] = gelu_tanh(g[i]) * u[i];
  return matvec(*ly.down, m);
}

/// Layer il on the residuals xs of all positions: x += post_attention_norm(attention(attn_norm
/// x)); x += post_ffw_norm(ffn(ffn_norm x)).
inline void layer(const Layer& ly, const Config& c, int64_t il, std::vector<Vec>& xs,
                  const std::vector<PosRange>& non_causal) {
  std::vector<Vec> hs;
  for (const Vec& x : xs) hs.push_back(rms_norm(x, ly.attn_norm, c.eps));
  const std::vector<Vec> a = attention(ly, c, il, hs, non_causal);
  for (size_t pos = 0; pos < xs.size(); ++pos) {
    Vec& x = xs[pos];
    add_scaled(x, 1.0, rms_norm(a[pos], ly.post_attn_norm, c.eps));
    const Vec y = ffn(ly, rms_norm(x, ly.ffn_norm, c.eps));
    add_scaled(x, 1.0, rms_norm(y, ly.post_ffw_norm, c.eps));
  }
}

/// Logits [tokens x vocab] of p, layer by layer over all positions: the input rows (embed), the
/// layers, output_norm, the output head, the soft cap when the config has one.
inline std::vector<double> forward(const Model& m, const Prompt& p) {
  const Config& c = m.c;
  check_prompt(c, p);
  std::vector<Vec> xs = embed(m, p);
  for (int64_t il = 0; il < c.L; ++il) layer(m.layers[il], c, il, xs, p.non_causal);
  std::vector<double> logits;
  logits.reserve(xs.size() * static_cast<size_t>(c.vocab));
  for (const Vec& x : xs) {
    Vec y = matvec(*m.output, rms_norm(x, m.output_norm, c.eps));
    if (c.softcap > 0)
      for (double& e : y) e = c.softcap * std::tanh(e / c.softcap);
    logits.insert(logits.end(), y.begin(), y.end());
  }
  return logits;
}

/// The same for token ids only, all causal.
inline std::vector<double> forward(const Model& m, const std::vector<int32_t>& tokens) {
  for (int32_t t : tokens)
    if (t < 0) fail("token " + std::to_string(t) + " outside the vocabulary");
  return forward(m, Prompt{tokens, {}, {}});
}

inline std::unique_ptr<Gguf> open_gguf(const std::string& path) {
  return refgguf::open_gguf(path, kWho);
}

}  // namespace gemma3_ref

/// Logits [tokens.size() x vocab] of the Gemma 3 GGUF file `path` (llama.cpp's "gemma3"
/// architecture; tensors of any type model::dequantize_row reads), in double; row i = logits
/// after tokens[0..i] (causal, positions 0..n-1); vocab = token_embd.weight's ne[1]. With a
/// positive gemma3.attention.sliding_window W, layers il with (il + 1) % 6 != 0 attend to their
/// last W positions and rotate with base 10000 unscaled; the others (all layers without W) attend
/// to the whole prefix with rope.freq_base and the linear rope factor. The logits are soft-capped
/// only without a sliding window (as llama.cpp). Throws std::runtime_error naming the key or
/// tensor on a missing or mistyped key, a missing tensor, an unreadable type, a shape the metadata
/// does not imply, a token outside the vocabulary, or an unsupported config (rope scaling other
/// than none/linear, value_length or rope.dimension_count != key_length).
inline std::vector<double> gemma3_reference_logits(const std::string& path,
                                                   const std::vector<int32_t>& tokens) {
  using namespace gemma3_ref;
  const auto g = open_gguf(path);
  return forward(read_model(*g), tokens);
}

/// The same for a prompt with input rows and non-causal ranges (gemma3_ref::Prompt): positions
/// with token kEmbeddedRow take the next row of prompt.rows, unscaled; a query inside a
/// non-causal range [b, e) sees the keys up to e (from pos + 1 - W on sliding layers). Also
/// throws when the rows or ranges do not fit the tokens.
inline std::vector<double> gemma3_reference_logits(const std::string& path,
                                                   const gemma3_ref::Prompt& prompt) {
  using namespace gemma3_ref;
  const auto g = open_gguf(path);
  return forward(read_model(*g), prompt);
}

}  // namespace troupe::testing
