// Test helper for Gemma 3 in Hugging Face form (Gemma3ForCausalLM), which ../shared has no files
// of: the twin of a synthesized "gemma3" GGUF (llama.cpp's conventions), written by reversing the
// names llama.cpp's converter gives and the 1 it adds to every RMSNorm weight (Gemma's norms
// multiply by 1 + w). F32 safetensors; the head tied to the embedding. Header-only; for test
// binaries that link troupe_model.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/gguf.h"
#include "tests/fp8_model.h"
#include "tests/llava_hf_twin.h"
#include "tests/test_support.h"

namespace troupe::testing {

/// The Hugging Face name of a gemma3 GGUF tensor ("" for one it has no name for).
inline std::string gemma3_hf_name(const std::string& g) {
  if (g == "token_embd.weight") return "model.embed_tokens.weight";
  if (g == "output_norm.weight") return "model.norm.weight";
  const size_t dot = g.find('.', 4);
  if (g.rfind("blk.", 0) != 0 || dot == std::string::npos) return "";
  const std::string at = "model.layers." + g.substr(4, dot - 4) + ".", rest = g.substr(dot + 1);
  static const std::pair<const char*, const char*> kLayer[] = {
      {"attn_norm.weight", "input_layernorm.weight"},
      {"attn_q.weight", "self_attn.q_proj.weight"},
      {"attn_k.weight", "self_attn.k_proj.weight"},
      {"attn_v.weight", "self_attn.v_proj.weight"},
      {"attn_output.weight", "self_attn.o_proj.weight"},
      {"attn_q_norm.weight", "self_attn.q_norm.weight"},
      {"attn_k_norm.weight", "self_attn.k_norm.weight"},
      {"post_attention_norm.weight", "post_attention_layernorm.weight"},
      {"ffn_norm.weight", "pre_feedforward_layernorm.weight"},
      {"post_ffw_norm.weight", "post_feedforward_layernorm.weight"},
      {"ffn_gate.weight", "mlp.gate_proj.weight"},
      {"ffn_up.weight", "mlp.up_proj.weight"},
      {"ffn_down.weight", "mlp.down_proj.weight"}};
  for (const auto& [from, to] : kLayer)
    if (rest == from) return at + to;
  return "";
}

/// config.json of the twin: the GGUF's hyperparameters under Gemma3TextConfig's keys.
inline nlohmann::json gemma3_twin_config(const model::GgufFile& g) {
  const std::string a = "gemma3.";
  const int64_t n_layer = g.get_int(a + "block_count");
  const int64_t head_dim = g.get_int(a + "attention.key_length");
  std::vector<std::string> types;
  for (int64_t il = 0; il < n_layer; ++il)
    types.push_back((il + 1) % 6 != 0 ? "sliding_attention" : "full_attention");
  return {{"architectures", {"Gemma3ForCausalLM"}},
          {"model_type", "gemma3_text"},
          {"vocab_size", g.find_tensor("token_embd.weight")->ne[1]},
          {"hidden_size", g.get_int(a + "embedding_length")},
          {"intermediate_size", g.get_int(a + "feed_forward_length")},
          {"num_hidden_layers", n_layer},
          {"num_attention_heads", g.get_int(a + "attention.head_count")},
          {"num_key_value_heads", g.get_int(a + "attention.head_count_kv")},
          {"head_dim", head_dim},
          {"hidden_activation", "gelu_pytorch_tanh"},
          {"max_position_embeddings", g.get_int(a + "context_length")},
          {"rms_norm_eps", g.get_float(a + "attention.layer_norm_rms_epsilon")},
          {"rope_theta", g.get_float(a + "rope.freq_base")},
          {"rope_local_base_freq", 10000.0},
          {"rope_scaling", nullptr},
          {"query_pre_attn_scalar", head_dim},
          {"sliding_window", g.get_int(a + "attention.sliding_window")},
          {"layer_types", types},
          {"final_logit_softcapping", nullptr},
          {"attn_logit_softcapping", nullptr},
          {"attention_bias", false},
          {"tie_word_embeddings", true}};
}

/// The multimodal form's config.json: the text decoder's keys under text_config, those equal to
/// Gemma3TextConfig's defaults left out (as the released files do), and a vision config.
inline nlohmann::json gemma3_multimodal_config(const nlohmann::json& text) {
  nlohmann::json t = text;
  for (const char* k : {"architectures", "hidden_activation", "rms_norm_eps", "rope_theta",
                        "rope_local_base_freq", "final_logit_softcapping", "attn_logit_softcapping",
                        "attention_bias", "tie_word_embeddings", "layer_types"})
    t.erase(k);
  t["model_type"] = "gemma3_text";
  return {{"architectures", {"Gemma3ForConditionalGeneration"}},
          {"model_type", "gemma3"},
          {"text_config", t},
          {"vision_config", {{"model_type", "siglip_vision_model"}, {"hidden_size", 16}}},
          {"mm_tokens_per_image", 256}};
}

/// The vision half of a Gemma3ForConditionalGeneration twin from the f32 gemma3 mmproj GGUF at
/// `mmproj`: its tensors under `tower` ("[model.]vision_tower.vision_model.") and `projector`
/// ("[model.]multi_modal_projector."), the soft-embedding norm's weight stored as w - 1, and the
/// keys for config.json (vision_config, mm_tokens_per_image; the rest at transformers' defaults).
inline void gemma3_vision_twin(const std::string& mmproj, const std::string& tower,
                               const std::string& projector, std::vector<StTensor>* out,
                               nlohmann::json* config) {
  auto f = model::GgufFile::open(mmproj);
  ASSERT_TRUE(f.has_value()) << f.error().message;
  const model::GgufFile& v = **f;
  ASSERT_EQ(v.get_string("clip.projector_type"), "gemma3");
  for (const model::TensorInfo& t : v.tensors()) {
    ASSERT_EQ(t.type, model::GgmlType::kF32) << t.name;
    std::vector<int64_t> shape(t.ne, t.ne + t.n_dims);
    std::reverse(shape.begin(), shape.end());  // ggml ne -> PyTorch order
    std::vector<float> x(static_cast<size_t>(t.nbytes / 4));
    std::memcpy(x.data(), t.data, x.size() * 4);
    std::string name;
    if (t.name == "mm.soft_emb_norm.weight") {
      name = projector + "mm_soft_emb_norm.weight";
      for (float& w : x) w -= 1.0f;  // exact for the values near 1 synth writes
    } else if (t.name == "mm.input_projection.weight") {
      name = projector + "mm_input_projection_weight";  // [n_embd, text width], as stored
    } else {
      bool is_proj = false;
      name = llava_vision_hf_name(t.name, &is_proj);
      ASSERT_FALSE(name.empty() || is_proj) << "no Hugging Face name for " << t.name;
      name = tower + name;
    }
    out->push_back({name, "F32", shape, f32_bytes(x)});
  }
  const int64_t side = v.get_int("clip.vision.image_size") / v.get_int("clip.vision.patch_size");
  const int64_t pooled = side / v.get_int("clip.vision.projector.scale_factor");
  (*config)["mm_tokens_per_image"] = pooled * pooled;
  (*config)["vision_config"] = {
      {"model_type", "siglip_vision_model"},
      {"hidden_size", v.get_int("clip.vision.embedding_length")},
      {"intermediate_size", v.get_int("clip.vision.feed_forward_length")},
      {"num_attention_heads", v.get_int("clip.vision.attention.head_count")},
      {"num_hidden_layers", v.get_int("clip.vision.block_count")},
      {"image_size", v.get_int("clip.vision.image_size")},
      {"patch_size", v.get_int("clip.vision.patch_size")},
      {"vision_use_head", false}};
}

/// The Hugging Face form of the f32 gemma3 GGUF at `gguf` (config.json + model.safetensors) in
/// `dir`: every norm weight w stored as w - 1. With `multimodal_prefix` ("language_model.model."
/// or "model.language_model."), the Gemma3ForConditionalGeneration form: the decoder's tensors
/// under that prefix beside a vision tower: the f32 gemma3 mmproj GGUF `mmproj`'s, or without one
/// a tiny one (which the text reader never reads).
inline void write_gemma3_hf_twin(const std::string& gguf, const TempDir& dir,
                                 const std::string& multimodal_prefix = "",
                                 const std::string& mmproj = "") {
  auto f = model::GgufFile::open(gguf);
  ASSERT_TRUE(f.has_value()) << f.error().message;
  const model::GgufFile& g = **f;
  ASSERT_EQ(g.get_string("general.architecture"), "gemma3");
  std::vector<StTensor> out;
  for (const model::TensorInfo& t : g.tensors()) {
    ASSERT_EQ(t.type, model::GgmlType::kF32) << t.name;
    const std::string name = gemma3_hf_name(t.name);
    ASSERT_FALSE(name.empty()) << "no Hugging Face name for " << t.name;
    std::vector<int64_t> shape(t.ne, t.ne + t.n_dims);
    std::reverse(shape.begin(), shape.end());  // ggml ne -> PyTorch order
    std::vector<float> v(static_cast<size_t>(t.nbytes / 4));
    std::memcpy(v.data(), t.data, v.size() * 4);
    if (name.ends_with("norm.weight"))
      for (float& x : v) x -= 1.0f;  // exact for the values near 1 synth writes
    out.push_back({multimodal_prefix.empty() ? name : multimodal_prefix + name.substr(6), "F32",
                   shape, f32_bytes(v)});
  }
  nlohmann::json config = gemma3_twin_config(g);
  if (!multimodal_prefix.empty()) {
    config = gemma3_multimodal_config(config);
    const std::string tower = multimodal_prefix == "model.language_model." ? "model." : "";
    if (!mmproj.empty()) {
      ASSERT_NO_FATAL_FAILURE(gemma3_vision_twin(mmproj, tower + "vision_tower.vision_model.",
                                                 tower + "multi_modal_projector.", &out, &config));
    } else {
      out.push_back({tower + "vision_tower.vision_model.embeddings.patch_embedding.weight",
                     "F32",
                     {16, 3, 2, 2},
                     f32_bytes(std::vector<float>(192, 0.5f))});
    }
  }
  dir.write("config.json", config.dump(2));
  dir.write("model.safetensors", safetensors_image(out));
}

}  // namespace troupe::testing
