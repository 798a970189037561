// Test helper: the Hugging Face form (LlavaForConditionalGeneration) of ../shared's synthetic
// LLaVA pair, models/synth/llava-tiny (model.gguf + mmproj.gguf), which ../shared has no files
// of. Written by reversing what llama.cpp's converter does: tensor names, the text model's q/k
// row permutation (GGUF pairs rotated dimensions, transformers keeps rotate_half's halves), and
// the metadata (config.json, preprocessor_config.json; the tokenizer files are stories260K's, the
// donor of the text model's vocabulary). F32 safetensors, so every weight keeps its bits.
// Header-only; the writer itself (llava_hf_twin_files) needs no test framework (hf_fuzz uses it).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/ggml_types.h"
#include "model/gguf.h"
#include "tests/safetensors_writer.h"
#include "tests/test_support.h"

namespace troupe::testing {

/// The Hugging Face name of a llama GGUF tensor ("" for none), without the decoder's prefix
/// ("model." in a text-only checkpoint) except for the head.
inline std::string llava_text_hf_name(const std::string& g) {
  if (g == "token_embd.weight") return "embed_tokens.weight";
  if (g == "output_norm.weight") return "norm.weight";
  if (g == "output.weight") return "lm_head.weight";
  if (g.rfind("blk.", 0) != 0) return "";
  const size_t dot = g.find('.', 4);
  const std::string layer = g.substr(4, dot - 4), rest = g.substr(dot + 1);
  static const std::pair<const char*, const char*> kLayer[] = {
      {"attn_norm.weight", "input_layernorm.weight"},
      {"attn_q.weight", "self_attn.q_proj.weight"},
      {"attn_k.weight", "self_attn.k_proj.weight"},
      {"attn_v.weight", "self_attn.v_proj.weight"},
      {"attn_output.weight", "self_attn.o_proj.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"ffn_gate.weight", "mlp.gate_proj.weight"},
      {"ffn_up.weight", "mlp.up_proj.weight"},
      {"ffn_down.weight", "mlp.down_proj.weight"}};
  for (const auto& [gg, hf] : kLayer)
    if (rest == gg) return "layers." + layer + "." + hf;
  return "";
}

/// The Hugging Face name of an mmproj GGUF tensor ("" for none), below the tower's
/// "vision_tower.vision_model." or the projector's "multi_modal_projector." (which *projector
/// tells).
inline std::string llava_vision_hf_name(const std::string& g, bool* projector) {
  *projector = g.rfind("mm.", 0) == 0;
  if (g == "mm.0.weight") return "linear_1.weight";
  if (g == "mm.0.bias") return "linear_1.bias";
  if (g == "mm.2.weight") return "linear_2.weight";
  if (g == "mm.2.bias") return "linear_2.bias";
  if (g == "v.patch_embd.weight") return "embeddings.patch_embedding.weight";
  if (g == "v.patch_embd.bias") return "embeddings.patch_embedding.bias";
  if (g == "v.class_embd") return "embeddings.class_embedding";
  if (g == "v.position_embd.weight") return "embeddings.position_embedding.weight";
  if (g == "v.pre_ln.weight") return "pre_layrnorm.weight";
  if (g == "v.pre_ln.bias") return "pre_layrnorm.bias";
  if (g == "v.post_ln.weight") return "post_layernorm.weight";
  if (g == "v.post_ln.bias") return "post_layernorm.bias";
  if (g.rfind("v.blk.", 0) != 0) return "";
  const size_t dot = g.find('.', 6);
  const std::string layer = g.substr(6, dot - 6), rest = g.substr(dot + 1);
  static const std::pair<const char*, const char*> kLayer[] = {
      {"ln1.", "layer_norm1."},         {"ln2.", "layer_norm2."},
      {"attn_q.", "self_attn.q_proj."}, {"attn_k.", "self_attn.k_proj."},
      {"attn_v.", "self_attn.v_proj."}, {"attn_out.", "self_attn.out_proj."},
      {"ffn_up.", "mlp.fc1."},          {"ffn_down.", "mlp.fc2."}};
  for (const auto& [gg, hf] : kLayer)
    if (rest.rfind(gg, 0) == 0)
      return "encoder.layers." + layer + "." + hf + rest.substr(std::string(gg).size());
  return "";
}

/// Where a checkpoint keeps its parts: transformers before 4.52 ("language_model.model.",
/// "vision_tower.", "multi_modal_projector.", "language_model.lm_head.") or after ("model."
/// before each of them, "lm_head." at the top).
enum class LlavaLayout { kBefore452, kAfter452 };

/// Writes the LlavaForConditionalGeneration form of the llama GGUF `text_gguf` and the "mlp"
/// mmproj GGUF `mmproj` into the existing folder `dir`, with the tokenizer files of the Hugging
/// Face directory `tokenizer_dir`; returns "" or what went wrong. `dtype` "F16" or "BF16" stores
/// every f32 tensor rounded to that type (as released checkpoints are), "F32" keeps every bit
/// (and refuses other types), "stored" keeps each f32 or f16 tensor as it is. Without
/// `text_gguf` only the vision half is written (text_config then has no weights behind it).
inline std::string llava_hf_files(const std::string& text_gguf, const std::string& mmproj,
                                  const std::string& tokenizer_dir, const std::string& dir,
                                  LlavaLayout layout, const std::string& dtype) {
  std::unique_ptr<model::GgufFile> no_text;
  auto text = text_gguf.empty() ? Result<std::unique_ptr<model::GgufFile>>(std::move(no_text))
                                : model::GgufFile::open(text_gguf);
  if (!text) return text.error().message;
  auto vision = model::GgufFile::open(mmproj);
  if (!vision) return vision.error().message;
  auto write = [&](const std::string& name, const std::string& bytes) {
    std::ofstream f(dir + "/" + name, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return f.good();
  };
  const model::GgufFile* tp = text->get();
  const model::GgufFile& v = **vision;
  const bool after = layout == LlavaLayout::kAfter452;
  const std::string lm = after ? "model.language_model." : "language_model.model.";
  const std::string head = after ? "lm_head.weight" : "language_model.lm_head.weight";
  const std::string tower =
      after ? "model.vision_tower.vision_model." : "vision_tower.vision_model.";
  const std::string proj = after ? "model.multi_modal_projector." : "multi_modal_projector.";
  auto text_int = [&](const char* key, int64_t def) { return tp ? tp->get_int(key) : def; };
  const int64_t n_head = text_int("llama.attention.head_count", 1);
  const int64_t n_head_kv = text_int("llama.attention.head_count_kv", 1);
  const int64_t n_embd = text_int("llama.embedding_length", 1);
  const int64_t head_dim = n_embd / n_head;

  std::vector<StTensor> out;
  std::string error;
  auto add = [&](const model::TensorInfo& ti, const std::string& name) {
    const bool f16 = ti.type == model::GgmlType::kF16 && dtype == "stored";
    if (name.empty() || (ti.type != model::GgmlType::kF32 && !f16)) {
      error = "no Hugging Face tensor for " + ti.name + " (" + model::type_name(ti.type) + ")";
      return;
    }
    std::vector<int64_t> shape(ti.ne, ti.ne + ti.n_dims);
    std::reverse(shape.begin(), shape.end());  // ggml ne -> PyTorch order
    std::string bytes(reinterpret_cast<const char*>(ti.data), ti.nbytes);
    const bool text_model = ti.name.rfind("blk.", 0) == 0;  // not the ViT's "v.blk."
    const bool q = text_model && ti.name.ends_with("attn_q.weight");
    const bool k = text_model && ti.name.ends_with("attn_k.weight");
    if (q || k) {  // GGUF row h*hd + 2i + j holds HF row h*hd + j*hd/2 + i
      const size_t row = static_cast<size_t>(shape[1]) * (f16 ? 2 : 4);
      const int64_t rows = (q ? n_head : n_head_kv) * head_dim, half = head_dim / 2;
      std::string hf(bytes.size(), '\0');
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t h = r / head_dim, kk = r % head_dim, j = kk / half, i = kk % half;
        const int64_t g = h * head_dim + 2 * i + j;
        std::memcpy(hf.data() + static_cast<size_t>(r) * row,
                    bytes.data() + static_cast<size_t>(g) * row, row);
      }
      bytes = std::move(hf);
    }
    if (dtype == "F16" || dtype == "BF16") {
      std::string half(bytes.size() / 2, '\0');
      for (size_t i = 0; i < bytes.size() / 4; ++i) {
        float x;
        std::memcpy(&x, bytes.data() + 4 * i, 4);
        const uint16_t h = dtype == "F16" ? model::fp32_to_fp16(x) : model::fp32_to_bf16(x);
        std::memcpy(half.data() + 2 * i, &h, 2);
      }
      bytes = std::move(half);
    }
    const std::string stored = dtype == "F16" || dtype == "BF16" ? dtype : f16 ? "F16" : "F32";
    out.push_back({name, stored, shape, std::move(bytes)});
  };
  if (tp)
    for (const model::TensorInfo& ti : tp->tensors()) {
      const std::string name = llava_text_hf_name(ti.name);
      add(ti, name.empty() ? "" : name == "lm_head.weight" ? head : lm + name);
    }
  for (const model::TensorInfo& ti : v.tensors()) {
    bool is_proj = false;
    const std::string name = llava_vision_hf_name(ti.name, &is_proj);
    add(ti, name.empty() ? "" : (is_proj ? proj : tower) + name);
  }
  if (!error.empty()) return error;
  if (!write("model.safetensors", safetensors_image(out))) return "cannot write in " + dir;

  // The feature layer: GGUF lists hidden-state indices; one is written as the single integer
  // released LLaVA configs give (-2 there).
  std::vector<int64_t> feats;
  if (const model::GgufValue* f = v.find("clip.vision.feature_layer"))
    for (uint64_t i = 0; i < f->count; ++i) feats.push_back(f->array_i64(i));
  nlohmann::json feature = feats.size() == 1
                               ? nlohmann::json(feats[0] - v.get_int("clip.vision.block_count") - 1)
                               : nlohmann::json(feats);
  auto triple = [&](const char* key) {
    const model::GgufValue* a = v.find(key);
    std::vector<double> x;
    for (uint64_t i = 0; i < a->count; ++i) x.push_back(static_cast<float>(a->array_f64(i)));
    return x;
  };
  const nlohmann::json config = {
      {"architectures", {"LlavaForConditionalGeneration"}},
      {"model_type", "llava"},
      // The bookkeeping keys released files carry beside the model's (read by nothing here).
      {"image_token_index", 32000},
      {"ignore_index", -100},
      {"pad_token_id", 0},
      {"tie_word_embeddings", false},
      {"torch_dtype", "float32"},
      {"transformers_version", "4.36.0"},
      {"vocab_size", text_int("llama.vocab_size", 32000)},
      {"vision_feature_layer", feature},
      {"vision_feature_select_strategy", "default"},
      {"projector_hidden_act", "gelu"},
      // Only what differs from LlamaConfig's defaults, as LLaVA 1.5's released file does.
      {"text_config",
       {{"_name_or_path", "synth-llava-tiny-text"},
        {"architectures", {"LlamaForCausalLM"}},
        {"torch_dtype", "float32"},
        {"model_type", "llama"},
        {"vocab_size", text_int("llama.vocab_size", 32000)},
        {"hidden_size", n_embd},
        {"intermediate_size", text_int("llama.feed_forward_length", 11008)},
        {"num_hidden_layers", text_int("llama.block_count", 32)},
        {"num_attention_heads", n_head},
        {"num_key_value_heads", n_head_kv},
        {"rms_norm_eps", tp ? tp->get_float("llama.attention.layer_norm_rms_epsilon") : 1e-5},
        {"max_position_embeddings", text_int("llama.context_length", 4096)}}},
      {"vision_config",
       {{"model_type", "clip_vision_model"},
        {"hidden_size", v.get_int("clip.vision.embedding_length")},
        {"intermediate_size", v.get_int("clip.vision.feed_forward_length")},
        {"num_attention_heads", v.get_int("clip.vision.attention.head_count")},
        {"num_hidden_layers", v.get_int("clip.vision.block_count")},
        {"image_size", v.get_int("clip.vision.image_size")},
        {"patch_size", v.get_int("clip.vision.patch_size")},
        {"projection_dim", v.get_int("clip.vision.projection_dim")},  // CLIP's, unused
        {"hidden_act", v.get_bool_or("clip.use_gelu", false) ? "gelu" : "quick_gelu"},
        {"layer_norm_eps", v.get_float("clip.vision.attention.layer_norm_epsilon")}}}};
  const nlohmann::json pre = {{"image_processor_type", "CLIPImageProcessor"},
                              {"image_mean", triple("clip.vision.image_mean")},
                              {"image_std", triple("clip.vision.image_std")}};
  if (!write("config.json", config.dump(2)) || !write("preprocessor_config.json", pre.dump(2)))
    return "cannot write in " + dir;
  std::error_code ec;
  if (!tokenizer_dir.empty())
    for (const char* f : {"tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"})
      if (!std::filesystem::copy_file(tokenizer_dir + "/" + f, dir + "/" + f,
                                      std::filesystem::copy_options::overwrite_existing, ec))
        return std::string("cannot copy ") + f + ": " + ec.message();
  return "";
}

/// The twin of shared/models/synth/llava-tiny (its tokenizer: stories260K's, the donor of the
/// text model's vocabulary).
inline std::string llava_hf_twin_files(const std::string& shared, const std::string& dir,
                                       LlavaLayout layout = LlavaLayout::kBefore452,
                                       const std::string& dtype = "F32") {
  const std::string src = shared + "/models/synth/llava-tiny/";
  return llava_hf_files(src + "model.gguf", src + "mmproj.gguf", shared + "/models/hf/stories260K",
                        dir, layout, dtype);
}

/// The same into a test's TempDir (a failure fails the test).
inline void write_llava_hf_twin(const std::string& shared, const TempDir& dir,
                                LlavaLayout layout = LlavaLayout::kBefore452,
                                const std::string& dtype = "F32") {
  ASSERT_EQ(llava_hf_twin_files(shared, dir.path(), layout, dtype), "");
}

}  // namespace troupe::testing
