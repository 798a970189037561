// Test helper for Qwen3-Next in Hugging Face form (Qwen3NextForCausalLM), which ../shared has no
// files of: the twin of a synthesized f32 "qwen3next" GGUF (llama.cpp's conventions), written by
// undoing what llama.cpp's converter does to the checkpoint: it renames the tensors, adds 1 to the
// zero-centered RMSNorm weights (not to the DeltaNet's gated norm), stores -exp(A_log) as ssm_a,
// splits in_proj_qkvz (grouped per key head) into a flat attn_qkv and attn_gate, squeezes
// conv1d's middle dimension and stacks the routed experts. F32 safetensors. Also Qwen3.5's
// Hugging Face form of the same weights (write_qwen35_hf_twin). Header-only; for test binaries
// that link troupe_model.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/gguf.h"
#include "tests/safetensors_writer.h"
#include "tests/test_support.h"

namespace troupe::testing {

/// How the twin is written; the defaults are the released checkpoints' form.
struct Qwen3NextHfOptions {
  bool tie = false;         // reserved: tied embeddings (not written yet; must stay false)
  bool drop_a_log = false;  // omit layer 0's linear_attn.A_log, for a bad-file test
};

namespace qwen3next_twin {

/// The sizes of the GGUF that the tensor conversions need.
struct Dims {
  int64_t E = 0;
  int64_t nk = 0, nv = 0, dk = 0, dv = 0;  // linear heads: key, value; head dims: key, value
};

/// Qwen3NextConfig's keys from the GGUF's "qwen3next." hyperparameters.
inline nlohmann::json config(const model::GgufFile& g, const Dims& d) {
  const std::string a = "qwen3next.";
  const int64_t n_layer = g.get_int(a + "block_count");
  const int64_t interval = g.get_int(a + "full_attention_interval");
  const int64_t head_dim = g.get_int(a + "attention.key_length");
  std::vector<std::string> layer_types;
  for (int64_t l = 0; l < n_layer; ++l)
    layer_types.emplace_back((l + 1) % interval == 0 ? "full_attention" : "linear_attention");
  return {
      {"architectures", {"Qwen3NextForCausalLM"}},
      {"model_type", "qwen3_next"},
      {"vocab_size", g.get_int_or(a + "vocab_size", g.find_tensor("token_embd.weight")->ne[1])},
      {"hidden_size", d.E},
      {"intermediate_size", g.get_int_or(a + "feed_forward_length", 0)},
      {"num_hidden_layers", n_layer},
      {"num_attention_heads", g.get_int(a + "attention.head_count")},
      {"num_key_value_heads", g.get_int(a + "attention.head_count_kv")},
      {"head_dim", head_dim},
      {"max_position_embeddings", g.get_int(a + "context_length")},
      {"rope_theta", g.get_float(a + "rope.freq_base")},
      {"partial_rotary_factor",
       static_cast<double>(g.get_int(a + "rope.dimension_count")) / static_cast<double>(head_dim)},
      {"rms_norm_eps", g.get_float(a + "attention.layer_norm_rms_epsilon")},
      {"full_attention_interval", interval},
      {"layer_types", layer_types},
      {"linear_num_key_heads", d.nk},
      {"linear_num_value_heads", d.nv},
      {"linear_key_head_dim", d.dk},
      {"linear_value_head_dim", d.dv},
      {"linear_conv_kernel_dim", g.get_int(a + "ssm.conv_kernel")},
      // A file without experts (Qwen3.5's dense form) gives dense MLPs of intermediate_size.
      {"num_experts", g.get_int_or(a + "expert_count", 0)},
      {"num_experts_per_tok", g.get_int_or(a + "expert_used_count", 0)},
      {"moe_intermediate_size", g.get_int_or(a + "expert_feed_forward_length", 0)},
      {"shared_expert_intermediate_size", g.get_int_or(a + "expert_shared_feed_forward_length", 0)},
      {"norm_topk_prob", true},
      {"decoder_sparse_step", 1},
      {"mlp_only_layers", nlohmann::json::array()},
      {"hidden_act", "silu"},
      {"attention_bias", false},
      {"tie_word_embeddings", false}};
}

/// The values of the f32 GGUF tensor t.
inline std::vector<float> values_of(const model::TensorInfo& t) {
  std::vector<float> v(static_cast<size_t>(t.num_elements()));
  std::memcpy(v.data(), t.data, v.size() * sizeof(float));
  return v;
}

/// t's PyTorch shape (ggml's ne reversed).
inline std::vector<int64_t> torch_shape(const model::TensorInfo& t) {
  std::vector<int64_t> shape(t.ne, t.ne + t.n_dims);
  std::reverse(shape.begin(), shape.end());
  return shape;
}

/// in_proj_qkvz [2 nk dk + 2 nv dv, E] of a linear-attention layer from the GGUF's flat attn_qkv
/// (rows: all q heads, all k heads, all v heads) and attn_gate (z, by v-head): per k-head g the
/// rows [q_g (dk), k_g (dk), v of v-heads g r .. g r + r - 1, z of the same], r = nv / nk.
inline void write_qkvz(const model::GgufFile& g, const std::string& at, const Dims& d,
                       const std::string& name, std::vector<StTensor>* out) {
  const model::TensorInfo* qkv = g.find_tensor(at + "attn_qkv.weight");
  const model::TensorInfo* gate = g.find_tensor(at + "attn_gate.weight");
  ASSERT_TRUE(qkv && gate) << "missing attn_qkv or attn_gate of " << at;
  const int64_t key_dim = d.nk * d.dk, value_dim = d.nv * d.dv, r = d.nv / d.nk;
  ASSERT_TRUE(qkv->n_dims == 2 && qkv->ne[0] == d.E && qkv->ne[1] == 2 * key_dim + value_dim)
      << qkv->name << " " << qkv->shape_string();
  ASSERT_TRUE(gate->n_dims == 2 && gate->ne[0] == d.E && gate->ne[1] == value_dim)
      << gate->name << " " << gate->shape_string();
  const std::vector<float> qv = values_of(*qkv), zv = values_of(*gate);
  std::vector<float> w;
  w.reserve(static_cast<size_t>((2 * key_dim + 2 * value_dim) * d.E));
  auto rows = [&](const std::vector<float>& src, int64_t first, int64_t count) {
    w.insert(w.end(), src.begin() + first * d.E, src.begin() + (first + count) * d.E);
  };
  for (int64_t k = 0; k < d.nk; ++k) {
    rows(qv, k * d.dk, d.dk);                        // q of k-head k
    rows(qv, key_dim + k * d.dk, d.dk);              // k of k-head k
    rows(qv, 2 * key_dim + k * r * d.dv, r * d.dv);  // v of its r v-heads
    rows(zv, k * r * d.dv, r * d.dv);                // z of its r v-heads
  }
  out->push_back({name, "F32", {2 * key_dim + 2 * value_dim, d.E}, f32_bytes(w)});
}

/// Layer `at`'s stacked experts (ggml ne {E, F, N} for gate and up, {F, E, N} for down) as
/// prefix + "mlp.experts.{e}.{gate,up,down}_proj.weight": expert e's slice of each is already
/// that expert's PyTorch [F, E] or [E, F] matrix.
inline void write_experts(const model::GgufFile& g, const std::string& at,
                          const std::string& prefix, std::vector<StTensor>* out) {
  const model::TensorInfo* gate = g.find_tensor(at + "ffn_gate_exps.weight");
  const model::TensorInfo* up = g.find_tensor(at + "ffn_up_exps.weight");
  const model::TensorInfo* down = g.find_tensor(at + "ffn_down_exps.weight");
  ASSERT_TRUE(gate && up && down) << "missing stacked experts of " << at;
  const int64_t E = gate->ne[0], F = gate->ne[1], N = gate->ne[2];
  ASSERT_TRUE(up->ne[0] == E && up->ne[1] == F && up->ne[2] == N) << up->name;
  ASSERT_TRUE(down->ne[0] == F && down->ne[1] == E && down->ne[2] == N) << down->name;
  const auto slice = [&](const model::TensorInfo* t, int64_t e) {
    const auto bytes = static_cast<size_t>(F * E) * sizeof(float);
    return std::string(reinterpret_cast<const char*>(t->data) + static_cast<size_t>(e) * bytes,
                       bytes);
  };
  for (int64_t e = 0; e < N; ++e) {
    const std::string p = prefix + "mlp.experts." + std::to_string(e) + ".";
    out->push_back({p + "gate_proj.weight", "F32", {F, E}, slice(gate, e)});
    out->push_back({p + "up_proj.weight", "F32", {F, E}, slice(up, e)});
    out->push_back({p + "down_proj.weight", "F32", {E, F}, slice(down, e)});
  }
}

/// How a GGUF tensor's values change on the way back.
enum class Undo { none, minus_one, a_log };

/// The Hugging Face name (after "model.layers.N.") and the undoing of a per-layer GGUF tensor
/// (after "blk.N.") that maps one to one; "" for the others.
inline std::pair<std::string, Undo> layer_name(const std::string& rest) {
  static const std::pair<const char*, const char*> kPlain[] = {
      {"attn_q.weight", "self_attn.q_proj.weight"},  // per head [query, gate], as in HF
      {"attn_k.weight", "self_attn.k_proj.weight"},
      {"attn_v.weight", "self_attn.v_proj.weight"},
      {"attn_output.weight", "self_attn.o_proj.weight"},
      {"ssm_dt.bias", "linear_attn.dt_bias"},
      {"ssm_ba.weight", "linear_attn.in_proj_ba.weight"},  // already grouped per k-head
      {"ssm_norm.weight", "linear_attn.norm.weight"},      // plain weight: no +1 to undo
      {"ssm_out.weight", "linear_attn.out_proj.weight"},
      {"ffn_gate_inp.weight", "mlp.gate.weight"},
      {"ffn_gate_shexp.weight", "mlp.shared_expert.gate_proj.weight"},
      {"ffn_up_shexp.weight", "mlp.shared_expert.up_proj.weight"},
      {"ffn_down_shexp.weight", "mlp.shared_expert.down_proj.weight"},
      {"ffn_gate.weight", "mlp.gate_proj.weight"},  // a dense layer's MLP
      {"ffn_up.weight", "mlp.up_proj.weight"},
      {"ffn_down.weight", "mlp.down_proj.weight"}};
  static const std::pair<const char*, const char*> kCentered[] = {
      {"attn_norm.weight", "input_layernorm.weight"},
      {"post_attention_norm.weight", "post_attention_layernorm.weight"},  // the pre-FFN norm
      {"attn_q_norm.weight", "self_attn.q_norm.weight"},
      {"attn_k_norm.weight", "self_attn.k_norm.weight"}};
  for (const auto& [from, to] : kPlain)
    if (rest == from) return {to, Undo::none};
  for (const auto& [from, to] : kCentered)
    if (rest == from) return {to, Undo::minus_one};
  if (rest == "ssm_a") return {"linear_attn.A_log", Undo::a_log};
  return {"", Undo::none};
}

/// Appends the Hugging Face form of GGUF tensor t, unless another tensor's conversion writes it
/// (attn_gate with attn_qkv; the experts per layer) or the options drop it.
inline void convert(const model::GgufFile& g, const model::TensorInfo& t, const Dims& d,
                    const Qwen3NextHfOptions& o, std::vector<StTensor>* out) {
  std::vector<int64_t> shape = torch_shape(t);
  auto copy = [&](const std::string& name, Undo undo) {
    std::vector<float> v = values_of(t);
    for (float& x : v) {
      if (undo == Undo::minus_one) x -= 1.0f;
      if (undo == Undo::a_log) {
        ASSERT_LT(x, 0.0f) << t.name << " holds -exp(A_log), which is negative";
        x = std::log(-x);
      }
    }
    out->push_back({name, "F32", shape, f32_bytes(v)});
  };
  if (t.name == "token_embd.weight") return copy("model.embed_tokens.weight", Undo::none);
  if (t.name == "output.weight") return copy("lm_head.weight", Undo::none);
  if (t.name == "output_norm.weight") return copy("model.norm.weight", Undo::minus_one);
  const size_t dot = t.name.find('.', 4);
  ASSERT_TRUE(t.name.rfind("blk.", 0) == 0 && dot != std::string::npos)
      << "no Hugging Face name for " << t.name;
  const std::string layer = t.name.substr(4, dot - 4), rest = t.name.substr(dot + 1);
  const std::string at = "blk." + layer + ".", prefix = "model.layers." + layer + ".";
  if (rest == "attn_gate.weight" || rest == "ffn_up_exps.weight" || rest == "ffn_down_exps.weight")
    return;  // written with attn_qkv and ffn_gate_exps
  if (rest == "attn_qkv.weight")
    return write_qkvz(g, at, d, prefix + "linear_attn.in_proj_qkvz.weight", out);
  if (rest == "ffn_gate_exps.weight") return write_experts(g, at, prefix, out);
  if (rest == "ssm_conv1d.weight") {  // ggml ne {K, conv_dim}: torch [conv_dim, K]
    ASSERT_EQ(shape.size(), 2u) << t.name;
    shape = {shape[0], 1, shape[1]};
    return copy(prefix + "linear_attn.conv1d.weight", Undo::none);
  }
  if (rest == "ffn_gate_inp_shexp.weight") {  // ggml ne {E}: Linear(E, 1)'s weight [1, E]
    shape = {1, d.E};
    return copy(prefix + "mlp.shared_expert_gate.weight", Undo::none);
  }
  if (o.drop_a_log && layer == "0" && rest == "ssm_a") return;
  const auto [name, undo] = layer_name(rest);
  ASSERT_FALSE(name.empty()) << "no Hugging Face name for " << t.name;
  copy(prefix + name, undo);
}

}  // namespace qwen3next_twin

/// The Hugging Face form of the f32 qwen3next GGUF at `gguf_path` (config.json +
/// model.safetensors) in `out`: Qwen3NextForCausalLM with explicit layer_types, MoE in every
/// layer (dense MLPs in a file without experts), untied lm_head. Fails the test (gtest ASSERT) on a
/// GGUF of another architecture or type, inconsistent linear-attention sizes, a layer lacking the
/// tensors of its kind, a non-negative ssm_a, or a tensor it has no name for.
namespace qwen3next_twin {

/// The twin's tensors and config.json (write_qwen3next_hf_twin), and the sizes they have.
inline void build(const std::string& gguf_path, const Qwen3NextHfOptions& o,
                  std::vector<StTensor>* tensors, nlohmann::json* config, Dims* dims) {
  ASSERT_FALSE(o.tie) << "tied embeddings are not written yet";
  auto f = model::GgufFile::open(gguf_path);
  ASSERT_TRUE(f.has_value()) << f.error().message;
  const model::GgufFile& g = **f;
  ASSERT_EQ(g.get_string("general.architecture"), "qwen3next");
  ASSERT_NE(g.find_tensor("output.weight"), nullptr) << "the twin's head is untied";
  ASSERT_NE(g.find_tensor("token_embd.weight"), nullptr);
  const std::string a = "qwen3next.";
  qwen3next_twin::Dims d;
  d.E = g.get_int(a + "embedding_length");
  d.nk = g.get_int(a + "ssm.group_count");
  d.nv = g.get_int(a + "ssm.time_step_rank");
  d.dk = g.get_int(a + "ssm.state_size");
  ASSERT_TRUE(d.nk > 0 && d.nv > 0 && d.nv % d.nk == 0) << "ssm.time_step_rank % group_count";
  ASSERT_EQ(g.get_int(a + "ssm.inner_size") % d.nv, 0) << "ssm.inner_size % time_step_rank";
  d.dv = g.get_int(a + "ssm.inner_size") / d.nv;
  const int64_t head_dim = g.get_int(a + "attention.key_length");
  ASSERT_EQ(g.get_int_or(a + "attention.value_length", head_dim), head_dim);
  const int64_t rot = g.get_int(a + "rope.dimension_count");
  ASSERT_EQ(static_cast<int64_t>(static_cast<double>(head_dim) *
                                 (static_cast<double>(rot) / static_cast<double>(head_dim))),
            rot)
      << "partial_rotary_factor would not give back rope.dimension_count";
  const int64_t n_layer = g.get_int(a + "block_count");
  const int64_t interval = g.get_int(a + "full_attention_interval");
  ASSERT_GT(interval, 0) << "qwen3next.full_attention_interval";
  for (int64_t l = 0; l < n_layer; ++l) {
    const std::string at = "blk." + std::to_string(l) + ".";
    const bool full = (l + 1) % interval == 0;
    ASSERT_NE(g.find_tensor(at + (full ? "attn_q.weight" : "ssm_a")), nullptr)
        << at << " is a " << (full ? "full" : "linear") << " attention layer";
    if (g.get_int_or(a + "expert_count", 0) > 0) {
      ASSERT_NE(g.find_tensor(at + "ffn_gate_inp.weight"), nullptr) << at << " has no router";
    }
  }
  if (o.drop_a_log) {
    ASSERT_NE(g.find_tensor("blk.0.ssm_a"), nullptr) << "layer 0 has no ssm_a";
  }
  for (const model::TensorInfo& t : g.tensors()) {
    ASSERT_EQ(t.type, model::GgmlType::kF32) << t.name;
    ASSERT_NO_FATAL_FAILURE(convert(g, t, d, o, tensors));
  }
  *config = qwen3next_twin::config(g, d);
  *dims = d;
}

/// Rows [first, first + count) of a [rows, width] f32 tensor's bytes.
inline std::string row_bytes(const StTensor& t, int64_t first, int64_t count) {
  const auto w = static_cast<size_t>(t.shape.back()) * sizeof(float);
  return t.bytes.substr(static_cast<size_t>(first) * w, static_cast<size_t>(count) * w);
}

}  // namespace qwen3next_twin

inline void write_qwen3next_hf_twin(const std::string& gguf_path, const TempDir& out,
                                    const Qwen3NextHfOptions& o = {}) {
  std::vector<StTensor> tensors;
  nlohmann::json config;
  qwen3next_twin::Dims d;
  ASSERT_NO_FATAL_FAILURE(qwen3next_twin::build(gguf_path, o, &tensors, &config, &d));
  out.write("config.json", config.dump(2));
  out.write("model.safetensors", safetensors_image(tensors));
}

/// How a Qwen3.5 twin is written.
struct Qwen35HfOptions {
  bool multimodal = true;       // Qwen3_5(Moe)ForConditionalGeneration (as released), else the
                                // text-only Qwen3_5(Moe)ForCausalLM
  bool stacked_experts = true;  // transformers' fused experts.gate_up_proj / down_proj, else
                                // experts.{e}.{gate,up,down}_proj.weight
};

/// The Qwen3.5 form of a GGUF in Qwen3-Next's order (value heads grouped by key head, as the
/// checkpoint keeps them: what llama.cpp's converter tiles for qwen35moe / qwen35, undone):
/// Qwen3_5MoeForConditionalGeneration (Qwen3_5ForConditionalGeneration without experts), its
/// decoder under model.language_model. with its keys in text_config and its rope in
/// rope_parameters (mrope_section over the rotated pairs), in_proj_qkv / in_proj_z / in_proj_b /
/// in_proj_a apart, experts stacked; plus an MTP and a vision tensor, which a text decoder's
/// reader skips.
inline void write_qwen35_hf_twin(const std::string& gguf_path, const TempDir& out,
                                 const Qwen35HfOptions& o = {}) {
  std::vector<StTensor> in;
  nlohmann::json text;
  qwen3next_twin::Dims d;
  ASSERT_NO_FATAL_FAILURE(qwen3next_twin::build(gguf_path, {}, &in, &text, &d));
  const bool moe = text["num_experts"].get<int64_t>() > 0;
  const int64_t r = d.nv / d.nk, kw = d.nk * d.dk;
  const std::string lm = o.multimodal ? "model.language_model." : "model.";
  std::vector<StTensor> outs;
  std::vector<std::vector<std::string>> gate_up, down;  // per layer, per expert: its bytes
  for (StTensor& t : in) {
    std::string name = t.name;
    if (name.rfind("model.", 0) == 0) name = lm + name.substr(6);
    const auto ends = [&](const char* s) { return name.ends_with(s); };
    if (ends("linear_attn.in_proj_qkvz.weight")) {  // per key head q, k, its r v, its r z
      const std::string at = name.substr(0, name.size() - std::strlen("in_proj_qkvz.weight"));
      const int64_t per = 2 * d.dk + 2 * r * d.dv;
      std::string q, k, v, z;
      for (int64_t g = 0; g < d.nk; ++g) {
        q += qwen3next_twin::row_bytes(t, g * per, d.dk);
        k += qwen3next_twin::row_bytes(t, g * per + d.dk, d.dk);
        v += qwen3next_twin::row_bytes(t, g * per + 2 * d.dk, r * d.dv);
        z += qwen3next_twin::row_bytes(t, g * per + 2 * d.dk + r * d.dv, r * d.dv);
      }
      outs.push_back({at + "in_proj_qkv.weight", "F32", {2 * kw + d.nv * d.dv, d.E}, q + k + v});
      outs.push_back({at + "in_proj_z.weight", "F32", {d.nv * d.dv, d.E}, z});
    } else if (ends("linear_attn.in_proj_ba.weight")) {  // per key head its r b, then its r a
      const std::string at = name.substr(0, name.size() - std::strlen("in_proj_ba.weight"));
      std::string b, a;
      for (int64_t g = 0; g < d.nk; ++g) {
        b += qwen3next_twin::row_bytes(t, g * 2 * r, r);
        a += qwen3next_twin::row_bytes(t, g * 2 * r + r, r);
      }
      outs.push_back({at + "in_proj_b.weight", "F32", {d.nv, d.E}, b});
      outs.push_back({at + "in_proj_a.weight", "F32", {d.nv, d.E}, a});
    } else if (o.stacked_experts && name.find(".mlp.experts.") != std::string::npos) {
      // lm + "layers.L.mlp.experts.E.{gate,up,down}_proj.weight", in expert order per layer
      const size_t l0 = lm.size() + std::strlen("layers.");
      const auto layer = static_cast<size_t>(std::stoll(name.substr(l0)));
      const size_t e0 = name.find(".mlp.experts.") + std::strlen(".mlp.experts.");
      const auto e = static_cast<size_t>(std::stoll(name.substr(e0)));
      if (gate_up.size() <= layer) {
        gate_up.resize(layer + 1);
        down.resize(layer + 1);
      }
      if (gate_up[layer].size() <= e) {
        gate_up[layer].resize(e + 1);
        down[layer].resize(e + 1);
      }
      if (ends("down_proj.weight"))
        down[layer][e] = t.bytes;
      else  // gate (written first) then up
        gate_up[layer][e] += t.bytes;
    } else {
      t.name = name;
      outs.push_back(std::move(t));
    }
  }
  const int64_t F = text["moe_intermediate_size"].get<int64_t>();
  const int64_t N = text["num_experts"].get<int64_t>();
  for (size_t layer = 0; layer < gate_up.size(); ++layer) {
    if (gate_up[layer].empty()) continue;
    ASSERT_EQ(static_cast<int64_t>(gate_up[layer].size()), N) << "layer " << layer;
    const std::string x = lm + "layers." + std::to_string(layer) + ".mlp.experts.";
    std::string gu, dn;
    for (size_t e = 0; e < gate_up[layer].size(); ++e) {
      gu += gate_up[layer][e];
      dn += down[layer][e];
    }
    outs.push_back({x + "gate_up_proj", "F32", {N, 2 * F, d.E}, gu});
    outs.push_back({x + "down_proj", "F32", {N, d.E, F}, dn});
  }
  // Read by neither the decoder nor this twin's reader: the MTP block and the vision tower.
  outs.push_back({"mtp.fc.weight",
                  "F32",
                  {d.E, 2 * d.E},
                  std::string(static_cast<size_t>(2 * d.E * d.E) * sizeof(float), '\0')});
  if (o.multimodal)
    outs.push_back({"model.visual.patch_embed.proj.weight",
                    "F32",
                    {4, 3},
                    std::string(12 * sizeof(float), '\0')});
  // Rope: rope_parameters (transformers' newer form), with the multimodal sections.
  const int64_t head_dim = text["head_dim"].get<int64_t>();
  const double partial = text["partial_rotary_factor"].get<double>();
  const int64_t pairs = static_cast<int64_t>(static_cast<double>(head_dim) * partial) / 2;
  text["rope_parameters"] = {{"rope_type", "default"},
                             {"rope_theta", text["rope_theta"]},
                             {"partial_rotary_factor", partial},
                             {"mrope_interleaved", true},
                             {"mrope_section", {pairs - 2 * (pairs / 3), pairs / 3, pairs / 3}}};
  text.erase("rope_theta");
  text.erase("partial_rotary_factor");
  text["model_type"] = moe ? "qwen3_5_moe_text" : "qwen3_5_text";
  const std::string causal = moe ? "Qwen3_5MoeForCausalLM" : "Qwen3_5ForCausalLM";
  nlohmann::json config;
  if (o.multimodal) {
    text.erase("architectures");
    config = {{"architectures",
               {moe ? "Qwen3_5MoeForConditionalGeneration" : "Qwen3_5ForConditionalGeneration"}},
              {"model_type", moe ? "qwen3_5_moe" : "qwen3_5"},
              {"text_config", text},
              {"vision_config", {{"depth", 1}, {"hidden_size", 4}, {"patch_size", 16}}},
              {"tie_word_embeddings", false}};
  } else {
    text["architectures"] = {causal};
    config = text;
  }
  out.write("config.json", config.dump(2));
  out.write("model.safetensors", safetensors_image(outs));
}

}  // namespace troupe::testing
