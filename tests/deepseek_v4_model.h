// A random-weight DeepSeek-V4 checkpoint for tests: config.json (DeepseekV4Config's keys) and
// model.safetensors under DeepSeek's own tensor names (no "model." prefix), every float tensor
// F32. Each tensor draws its values from its own pseudo-random stream, seeded by the options' seed
// and the tensor's name, so two checkpoints that differ in one setting share every tensor the
// setting does not touch. The scales keep activations of order one: projections uniform in
// +-1.5/sqrt(fan_in), norm weights near 1, router and compressor gates wide enough that routing
// and the compressor's softmax differ from token to token. Header-only; independent of troupe's
// engine (it writes files, nothing more).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/safetensors_writer.h"

namespace troupe::testing {

/// The sizes and settings of the checkpoint write_deepseek_v4 writes (config.json's keys in the
/// comments where the name differs).
struct V4Options {
  int64_t vocab = 256, E = 64, L = 4, H = 4, D = 64, R = 16;  // R: qk_rope_head_dim
  int64_t q_lora = 32, G = 2, o_lora = 16;                    // G: o_groups
  int64_t N = 8, K = 2, F = 32, n_shared = 1;  // routed experts, experts per token, expert width
  int64_t hc = 4, sinkhorn_iters = 20;         // hc_mult, hc_sinkhorn_iters
  double hc_eps = 1e-6, eps = 1e-6, rope_theta = 10000, compress_rope_theta = 160000;
  int64_t window = 8;  // sliding_window
  std::vector<std::string> layer_types = {
      "compressed_sparse_attention", "heavily_compressed_attention", "compressed_sparse_attention",
      "heavily_compressed_attention"};
  int64_t csa_rate = 4, hca_rate = 8;  // compress_rates
  // Writes compress_ratios (per layer: 0 sliding, 4 CSA, 128 HCA) instead of layer_types and
  // compress_rates; the rates are then 4 and 128 whatever csa_rate and hca_rate say.
  bool legacy_ratios = false;
  int64_t Hi = 4, Di = 32, index_topk = 3;  // index_n_heads, index_head_dim
  int64_t num_hash_layers = 1;
  bool tid2eid_i64 = false;  // tid2eid stored as I64 (else I32)
  double swiglu_limit = 10.0, routed_scale = 1.5;
  bool yarn = true;  // rope_scaling yarn (it applies to the compressed layers' frequencies)
  double yarn_factor = 4, yarn_beta_fast = 32, yarn_beta_slow = 1;
  int64_t yarn_orig_ctx = 32;
  uint64_t seed = 1;
};

namespace v4_model {

[[noreturn]] inline void fail(const std::string& what) {
  throw std::runtime_error("deepseek-v4 model writer: " + what);
}

/// splitmix64: a small, well-mixed 64-bit generator.
struct Rng {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  /// Uniform in [lo, hi).
  double uniform(double lo, double hi) {
    return lo + (hi - lo) * static_cast<double>(next() >> 11) * 0x1.0p-53;
  }
  /// Uniform in [0, n).
  int64_t below(int64_t n) { return static_cast<int64_t>(next() % static_cast<uint64_t>(n)); }
};

/// The stream of tensor `name` under `seed` (the name hashed by FNV-1a).
inline Rng stream(uint64_t seed, const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : name) h = (h ^ ch) * 0x100000001b3ull;
  Rng r{seed * 0x2545f4914f6cdd1dull ^ h};
  r.next();
  return r;
}

/// The tensors being written, in order.
class Writer {
 public:
  explicit Writer(uint64_t seed) : seed_(seed) {}

  /// An F32 tensor of `shape`, uniform in [lo, hi).
  void uniform(const std::string& name, const std::vector<int64_t>& shape, double lo, double hi) {
    Rng r = stream(seed_, name);
    std::vector<float> v(static_cast<size_t>(count(shape)));
    for (float& x : v) x = static_cast<float>(r.uniform(lo, hi));
    tensors_.push_back({name, "F32", shape, f32_bytes(v)});
  }
  /// A Linear weight [rows, cols]: uniform in +-gain/sqrt(cols).
  void linear(const std::string& name, int64_t rows, int64_t cols, double gain = 1.5) {
    const double a = gain / std::sqrt(static_cast<double>(cols));
    uniform(name, {rows, cols}, -a, a);
  }
  /// An RMSNorm weight [n]: 1 +- 0.2.
  void norm(const std::string& name, int64_t n) { uniform(name, {n}, 0.8, 1.2); }
  /// Expert ids [rows, k], each row k distinct ids below n, as I32 or I64.
  void distinct_ids(const std::string& name, int64_t rows, int64_t k, int64_t n, bool i64) {
    if (k > n) fail("num_experts_per_tok above n_routed_experts");
    Rng r = stream(seed_, name);
    std::vector<int64_t> ids;
    for (int64_t i = 0; i < rows; ++i) {
      std::vector<bool> used(static_cast<size_t>(n), false);
      for (int64_t j = 0; j < k; ++j) {
        int64_t e = r.below(n);
        while (used[static_cast<size_t>(e)]) e = (e + 1) % n;
        used[static_cast<size_t>(e)] = true;
        ids.push_back(e);
      }
    }
    std::string bytes;
    for (int64_t e : ids) {
      char b[8];
      if (i64) {
        std::memcpy(b, &e, 8);
        bytes.append(b, 8);
      } else {
        const auto e32 = static_cast<int32_t>(e);
        std::memcpy(b, &e32, 4);
        bytes.append(b, 4);
      }
    }
    tensors_.push_back({name, i64 ? "I64" : "I32", {rows, k}, bytes});
  }
  const std::vector<StTensor>& tensors() const { return tensors_; }

 private:
  static int64_t count(const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  uint64_t seed_;
  std::vector<StTensor> tensors_;
};

inline constexpr const char* kCsa = "compressed_sparse_attention";
inline constexpr const char* kHca = "heavily_compressed_attention";
inline constexpr const char* kSliding = "sliding_attention";

/// config.json for `o`.
inline nlohmann::json config(const V4Options& o) {
  nlohmann::json c = {{"architectures", {"DeepseekV4ForCausalLM"}},
                      {"model_type", "deepseek_v4"},
                      {"vocab_size", o.vocab},
                      {"hidden_size", o.E},
                      {"num_hidden_layers", o.L},
                      {"num_attention_heads", o.H},
                      {"num_key_value_heads", 1},
                      {"head_dim", o.D},
                      {"qk_rope_head_dim", o.R},
                      {"q_lora_rank", o.q_lora},
                      {"o_groups", o.G},
                      {"o_lora_rank", o.o_lora},
                      {"rope_theta", o.rope_theta},
                      {"compress_rope_theta", o.compress_rope_theta},
                      {"hc_mult", o.hc},
                      {"hc_sinkhorn_iters", o.sinkhorn_iters},
                      {"hc_eps", o.hc_eps},
                      {"num_hash_layers", o.num_hash_layers},
                      {"swiglu_limit", o.swiglu_limit},
                      {"sliding_window", o.window},
                      {"index_n_heads", o.Hi},
                      {"index_head_dim", o.Di},
                      {"index_topk", o.index_topk},
                      {"n_routed_experts", o.N},
                      {"n_shared_experts", o.n_shared},
                      {"num_experts_per_tok", o.K},
                      {"moe_intermediate_size", o.F},
                      {"scoring_func", "sqrtsoftplus"},
                      {"norm_topk_prob", true},
                      {"routed_scaling_factor", o.routed_scale},
                      {"rms_norm_eps", o.eps},
                      {"tie_word_embeddings", false},
                      {"max_position_embeddings", 4096},
                      {"bos_token_id", 0},
                      {"eos_token_id", 1}};
  if (o.legacy_ratios) {
    std::vector<int64_t> ratios;
    for (const std::string& t : o.layer_types)
      ratios.push_back(t == kCsa ? 4 : t == kHca ? 128 : 0);
    c["compress_ratios"] = ratios;
  } else {
    c["layer_types"] = o.layer_types;
    c["compress_rates"] = {{kCsa, o.csa_rate}, {kHca, o.hca_rate}};
  }
  if (o.yarn)
    c["rope_scaling"] = {{"type", "yarn"},
                         {"factor", o.yarn_factor},
                         {"original_max_position_embeddings", o.yarn_orig_ctx},
                         {"beta_fast", o.yarn_beta_fast},
                         {"beta_slow", o.yarn_beta_slow}};
  return c;
}

/// The compressor at prefix p (width `width`, rate m, two overlapping halves when `overlap`).
inline void compressor(Writer& w, const std::string& p, int64_t E, int64_t width, int64_t m,
                       bool overlap) {
  const int64_t rows = (overlap ? 2 : 1) * width;
  w.linear(p + "wkv.weight", rows, E);
  w.linear(p + "wgate.weight", rows, E, 3.0);  // wide gates: an uneven softmax over the slots
  w.uniform(p + "ape", {m, rows}, -0.5, 0.5);
  w.norm(p + "norm.weight", width);
}

/// A hyper-connection's mixing weights at prefix p ("hc_attn_"): fn [rows, hc*E], base [rows],
/// scale [n_scales].
inline void hyper_connection(Writer& w, const std::string& p, int64_t rows, int64_t hc, int64_t E,
                             int64_t n_scales) {
  w.linear(p + "fn", rows, hc * E);
  w.uniform(p + "base", {rows}, -0.5, 0.5);
  w.uniform(p + "scale", {n_scales}, 0.5, 1.5);
}

}  // namespace v4_model

/// Writes config.json and model.safetensors (all float tensors F32) of a random DeepSeek-V4
/// model with the sizes of `o` into the existing directory `dir`. Throws std::runtime_error on
/// inconsistent options (a layer type list of the wrong length or with an unknown type, H not a
/// multiple of G, K above N) or when a file cannot be written.
inline void write_deepseek_v4(const std::string& dir, const V4Options& o) {
  using namespace v4_model;  // NOLINT(google-build-using-namespace): the writer's pieces
  if (static_cast<int64_t>(o.layer_types.size()) != o.L) fail("layer_types: one entry per layer");
  if (o.G <= 0 || o.H % o.G != 0) fail("num_attention_heads must be a multiple of o_groups");
  Writer w(o.seed);
  w.uniform("embed.weight", {o.vocab, o.E}, -1, 1);
  for (int64_t l = 0; l < o.L; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    const std::string& type = o.layer_types[static_cast<size_t>(l)];
    if (type != kCsa && type != kHca && type != kSliding) fail("unknown layer type " + type);
    w.norm(p + "attn_norm.weight", o.E);
    w.norm(p + "ffn_norm.weight", o.E);
    hyper_connection(w, p + "hc_attn_", (2 + o.hc) * o.hc, o.hc, o.E, 3);
    hyper_connection(w, p + "hc_ffn_", (2 + o.hc) * o.hc, o.hc, o.E, 3);
    const std::string a = p + "attn.";
    w.linear(a + "wq_a.weight", o.q_lora, o.E);
    w.norm(a + "q_norm.weight", o.q_lora);
    w.linear(a + "wq_b.weight", o.H * o.D, o.q_lora);
    w.linear(a + "wkv.weight", o.D, o.E);
    w.norm(a + "kv_norm.weight", o.D);
    w.linear(a + "wo_a.weight", o.G * o.o_lora, o.H * o.D / o.G);
    w.linear(a + "wo_b.weight", o.E, o.G * o.o_lora);
    w.uniform(a + "attn_sink", {o.H}, -1, 1);
    const int64_t csa_rate = o.legacy_ratios ? 4 : o.csa_rate;
    const int64_t hca_rate = o.legacy_ratios ? 128 : o.hca_rate;
    if (type == kCsa) {
      compressor(w, a + "compressor.", o.E, o.D, csa_rate, true);
      w.linear(a + "indexer.wq_b.weight", o.Hi * o.Di, o.q_lora);
      w.linear(a + "indexer.weights_proj.weight", o.Hi, o.E);
      compressor(w, a + "indexer.compressor.", o.E, o.Di, csa_rate, true);
    } else if (type == kHca) {
      compressor(w, a + "compressor.", o.E, o.D, hca_rate, false);
    }
    const std::string f = p + "ffn.";
    w.linear(f + "gate.weight", o.N, o.E, 3.0);  // wide: routing differs from token to token
    if (l < o.num_hash_layers)
      w.distinct_ids(f + "gate.tid2eid", o.vocab, o.K, o.N, o.tid2eid_i64);
    else
      w.uniform(f + "gate.bias", {o.N}, -0.1, 0.1);
    for (int64_t e = 0; e < o.N; ++e) {
      const std::string x = f + "experts." + std::to_string(e) + ".";
      w.linear(x + "w1.weight", o.F, o.E);
      w.linear(x + "w3.weight", o.F, o.E);
      w.linear(x + "w2.weight", o.E, o.F);
    }
    const int64_t sf = o.F * o.n_shared;
    if (sf > 0) {
      w.linear(f + "shared_experts.w1.weight", sf, o.E);
      w.linear(f + "shared_experts.w3.weight", sf, o.E);
      w.linear(f + "shared_experts.w2.weight", o.E, sf);
    }
  }
  w.norm("norm.weight", o.E);
  w.linear("head.weight", o.vocab, o.E);
  hyper_connection(w, "hc_head_", o.hc, o.hc, o.E, 1);

  auto write = [&](const std::string& name, const std::string& bytes) {
    std::ofstream out(dir + "/" + name, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) fail("cannot write " + dir + "/" + name);
  };
  write("config.json", config(o).dump(2));
  write("model.safetensors", safetensors_image(w.tensors()));
}

}  // namespace troupe::testing
