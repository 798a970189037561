// Test helper for Meta's Llama 4 text decoder in Hugging Face form, which ../shared has no files
// of: the twin of a synthesized f32 "llama4" GGUF (llama.cpp's conventions), written by reversing
// the names llama.cpp's converter gives and its repacking of the stacked experts, either as
// Llama4ForConditionalGeneration (text part only) or as Llama4ForCausalLM. F32 safetensors.
// Header-only; for test binaries that link troupe_model.
#pragma once

#include <algorithm>
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
struct Llama4HfOptions {
  bool causal_lm = false;  // true: Llama4ForCausalLM, flat config, "model." and "lm_head.weight"
  int64_t chunk = 8192;    // attention_chunk_size
  int64_t floor_scale = 8192;
  double attn_scale = 0.1;
  bool qk_norm = true;             // use_qk_norm
  bool temperature_tuning = true;  // attn_temperature_tuning
  bool drop_router = false;        // omit layer 1's router, for a bad-file test
};

namespace llama4_twin {

/// The rope_scaling from which troupe's synthesizer computes the GGUF's rope_freqs.weight, so
/// the twin, which drops that tensor, rotates alike.
inline nlohmann::json rope_scaling() {
  return {{"rope_type", "llama3"},
          {"factor", 16.0},
          {"low_freq_factor", 1.0},
          {"high_freq_factor", 1.0},
          {"original_max_position_embeddings", 8192}};
}

/// Llama4TextConfig's keys from the GGUF's "llama4." hyperparameters and the options.
inline nlohmann::json text_config(const model::GgufFile& g, const Llama4HfOptions& o) {
  const std::string a = "llama4.";
  const int64_t n_layer = g.get_int(a + "block_count");
  const int64_t step = g.get_int(a + "interleave_moe_layer_step");
  std::vector<int64_t> moe_layers, no_rope_layers;
  for (int64_t l = 0; l < n_layer; ++l) {
    if ((l + 1) % step == 0) moe_layers.push_back(l);
    no_rope_layers.push_back((l + 1) % 4 != 0 ? 1 : 0);  // 1: the layer rotates
  }
  return {{"model_type", "llama4_text"},
          {"vocab_size", g.get_int_or(a + "vocab_size", g.find_tensor("token_embd.weight")->ne[1])},
          {"hidden_size", g.get_int(a + "embedding_length")},
          {"intermediate_size", g.get_int(a + "expert_feed_forward_length")},
          {"intermediate_size_mlp", g.get_int(a + "feed_forward_length")},
          {"num_hidden_layers", n_layer},
          {"num_attention_heads", g.get_int(a + "attention.head_count")},
          {"num_key_value_heads", g.get_int(a + "attention.head_count_kv")},
          {"head_dim", g.get_int(a + "attention.key_length")},
          {"max_position_embeddings", g.get_int(a + "context_length")},
          {"rope_theta", g.get_float(a + "rope.freq_base")},
          {"rope_scaling", rope_scaling()},
          {"rms_norm_eps", g.get_float(a + "attention.layer_norm_rms_epsilon")},
          {"num_local_experts", g.get_int(a + "expert_count")},
          {"num_experts_per_tok", g.get_int(a + "expert_used_count")},
          {"interleave_moe_layer_step", step},
          {"moe_layers", moe_layers},
          {"no_rope_layers", no_rope_layers},
          {"attention_chunk_size", o.chunk},
          {"attn_temperature_tuning", o.temperature_tuning},
          {"floor_scale", o.floor_scale},
          {"attn_scale", o.attn_scale},
          {"use_qk_norm", o.qk_norm},
          {"hidden_act", "silu"},
          {"attention_bias", false},
          {"tie_word_embeddings", false}};
}

/// The Hugging Face name (under the decoder's prefix, without "model.") of a llama4 GGUF tensor
/// other than the stacked experts; "" for those and for ones it has no name for.
inline std::string hf_name(const std::string& g) {
  if (g == "token_embd.weight") return "embed_tokens.weight";
  if (g == "output_norm.weight") return "norm.weight";
  const size_t dot = g.find('.', 4);
  if (g.rfind("blk.", 0) != 0 || dot == std::string::npos) return "";
  const std::string at = "layers." + g.substr(4, dot - 4) + ".", rest = g.substr(dot + 1);
  static const std::pair<const char*, const char*> kLayer[] = {
      {"attn_norm.weight", "input_layernorm.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"attn_q.weight", "self_attn.q_proj.weight"},  // not permuted: Llama 4's converter keeps
      {"attn_k.weight", "self_attn.k_proj.weight"},  // the interleaved rotary order
      {"attn_v.weight", "self_attn.v_proj.weight"},
      {"attn_output.weight", "self_attn.o_proj.weight"},
      {"ffn_gate.weight", "feed_forward.gate_proj.weight"},
      {"ffn_up.weight", "feed_forward.up_proj.weight"},
      {"ffn_down.weight", "feed_forward.down_proj.weight"},
      {"ffn_gate_inp.weight", "feed_forward.router.weight"},
      {"ffn_gate_shexp.weight", "feed_forward.shared_expert.gate_proj.weight"},
      {"ffn_up_shexp.weight", "feed_forward.shared_expert.up_proj.weight"},
      {"ffn_down_shexp.weight", "feed_forward.shared_expert.down_proj.weight"}};
  for (const auto& [from, to] : kLayer)
    if (rest == from) return at + to;
  return "";
}

/// The values of the f32 GGUF tensor t.
inline std::vector<float> values_of(const model::TensorInfo& t) {
  std::vector<float> v(static_cast<size_t>(t.num_elements()));
  std::memcpy(v.data(), t.data, v.size() * sizeof(float));
  return v;
}

/// Layer `at`'s stacked experts (prefix: the layer's Hugging Face prefix) as transformers'
/// Llama4TextExperts holds them: gate_up_proj [N, E, 2F] with gate_up[e][i][j] = gate_e[j][i]
/// (j < F) and up_e[j - F][i] (j >= F), and down_proj [N, F, E] with down[e][j][i] =
/// down_e[i][j]: both the transposes of the GGUF's per-expert rows, as the product is y @ W.
inline void write_experts(const model::GgufFile& g, const std::string& at,
                          const std::string& prefix, std::vector<StTensor>* out) {
  const model::TensorInfo* gate = g.find_tensor(at + "ffn_gate_exps.weight");  // [E, F, N]
  const model::TensorInfo* up = g.find_tensor(at + "ffn_up_exps.weight");      // [E, F, N]
  const model::TensorInfo* down = g.find_tensor(at + "ffn_down_exps.weight");  // [F, E, N]
  ASSERT_TRUE(gate && up && down) << "missing stacked experts of " << at;
  const int64_t E = gate->ne[0], F = gate->ne[1], N = gate->ne[2];
  ASSERT_TRUE(up->ne[0] == E && up->ne[1] == F && up->ne[2] == N) << up->name;
  ASSERT_TRUE(down->ne[0] == F && down->ne[1] == E && down->ne[2] == N) << down->name;
  const std::vector<float> gv = values_of(*gate), uv = values_of(*up), dv = values_of(*down);
  std::vector<float> gu(static_cast<size_t>(N * E * 2 * F)), dt(static_cast<size_t>(N * F * E));
  for (int64_t e = 0; e < N; ++e)
    for (int64_t j = 0; j < F; ++j)
      for (int64_t i = 0; i < E; ++i) {
        const auto src = static_cast<size_t>((e * F + j) * E + i);  // gate_e[j][i], up_e[j][i]
        gu[static_cast<size_t>((e * E + i) * 2 * F + j)] = gv[src];
        gu[static_cast<size_t>((e * E + i) * 2 * F + F + j)] = uv[src];
        dt[static_cast<size_t>((e * F + j) * E + i)] =
            dv[static_cast<size_t>((e * E + i) * F + j)];  // down_e[i][j]
      }
  out->push_back(
      {prefix + "feed_forward.experts.gate_up_proj", "F32", {N, E, 2 * F}, f32_bytes(gu)});
  out->push_back({prefix + "feed_forward.experts.down_proj", "F32", {N, F, E}, f32_bytes(dt)});
}

}  // namespace llama4_twin

/// The Hugging Face form of the f32 llama4 GGUF at `gguf_path` (config.json + model.safetensors)
/// in `out`: Llama4ForConditionalGeneration's text decoder (config under text_config, tensors
/// under "language_model.") unless o.causal_lm. rope_freqs.weight is not copied: the config's
/// llama3 rope_scaling gives the same frequencies. Fails the test (gtest ASSERT) on a GGUF of
/// another architecture or type, or a tensor it has no name for.
inline void write_llama4_hf_twin(const std::string& gguf_path, const TempDir& out,
                                 const Llama4HfOptions& o = {}) {
  auto f = model::GgufFile::open(gguf_path);
  ASSERT_TRUE(f.has_value()) << f.error().message;
  const model::GgufFile& g = **f;
  ASSERT_EQ(g.get_string("general.architecture"), "llama4");
  ASSERT_EQ(g.get_int_or("llama4.rope.dimension_count", g.get_int("llama4.attention.key_length")),
            g.get_int("llama4.attention.key_length"))
      << "Llama 4 rotates whole heads";
  ASSERT_NE(g.find_tensor("output.weight"), nullptr) << "the twin's head is untied";
  if (o.drop_router) {
    ASSERT_NE(g.find_tensor("blk.1.ffn_gate_inp.weight"), nullptr) << "layer 1 has no router";
  }
  const std::string prefix = o.causal_lm ? "model." : "language_model.model.";
  const std::string head = o.causal_lm ? "lm_head.weight" : "language_model.lm_head.weight";
  std::vector<StTensor> tensors;
  for (const model::TensorInfo& t : g.tensors()) {
    ASSERT_EQ(t.type, model::GgmlType::kF32) << t.name;
    if (t.name == "rope_freqs.weight" || t.name.find("_exps.weight") != std::string::npos)
      continue;  // the rope_scaling stands for it; the experts are repacked below
    if (o.drop_router && t.name == "blk.1.ffn_gate_inp.weight") continue;
    const std::string name =
        t.name == "output.weight" ? head : prefix + llama4_twin::hf_name(t.name);
    ASSERT_NE(name, prefix) << "no Hugging Face name for " << t.name;
    std::vector<int64_t> shape(t.ne, t.ne + t.n_dims);
    std::reverse(shape.begin(), shape.end());  // ggml ne -> PyTorch order
    tensors.push_back(
        {name, "F32", shape,
         std::string(reinterpret_cast<const char*>(t.data), static_cast<size_t>(t.nbytes))});
  }
  const int64_t n_layer = g.get_int("llama4.block_count");
  const int64_t step = g.get_int("llama4.interleave_moe_layer_step");
  ASSERT_GT(step, 0) << "llama4.interleave_moe_layer_step";
  for (int64_t l = step - 1; l < n_layer; l += step) {  // the MoE layers: (l + 1) % step == 0
    ASSERT_NO_FATAL_FAILURE(llama4_twin::write_experts(g, "blk." + std::to_string(l) + ".",
                                                       prefix + "layers." + std::to_string(l) + ".",
                                                       &tensors));
  }
  nlohmann::json config = llama4_twin::text_config(g, o);
  if (o.causal_lm) {
    config["architectures"] = {"Llama4ForCausalLM"};
  } else {
    config = {{"architectures", {"Llama4ForConditionalGeneration"}},
              {"model_type", "llama4"},
              {"text_config", config},
              {"tie_word_embeddings", false}};
  }
  out.write("config.json", config.dump(2));
  out.write("model.safetensors", safetensors_image(tensors));
}

}  // namespace troupe::testing
