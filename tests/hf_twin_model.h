// Test helpers for architectures ../shared has no files of: a synthesized GGUF in llama.cpp's
// conventions (glm4moe: GLM-4.5's decoder plus its multi-token-prediction layer; minimax-m2;
// bailingmoe2: Ling-2.0; ernie4_5 and ernie4_5-moe: ERNIE 4.5) and its Hugging Face form
// (Glm4MoeForCausalLM / MiniMaxM2ForCausalLM / BailingMoeV2ForCausalLM / Ernie4_5ForCausalLM /
// Ernie4_5_MoeForCausalLM, F32 safetensors, the MTP layer included as the released GLM
// checkpoints carry it), written by reversing the names llama.cpp's converter gives. Header-only;
// for test binaries that link troupe_model.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/gguf.h"
#include "model/synth.h"
#include "tests/fp8_model.h"
#include "tests/test_support.h"

namespace troupe::testing {

/// A synthesized f32 model of `arch` in `dir` (troupe synth's defaults: 4 decoder layers; glm4moe
/// adds its MTP layer, has 16 experts of which 4 are used, one shared, the first layer dense;
/// minimax-m2 has 8 experts of which 2 are used in every layer).
inline std::string synth_arch(const TempDir& dir, const std::string& arch, uint64_t seed) {
  model::SynthOptions o;
  o.arch = arch;
  o.seed = seed;
  o.n_ctx = 256;
  const std::string path = dir.file(arch + ".gguf");
  const Status st = model::synth_model(o, path);
  EXPECT_TRUE(st.has_value()) << st.error().message;
  return path;
}

inline std::string synth_glm(const TempDir& dir, uint64_t seed = 7) {
  return synth_arch(dir, "glm4moe", seed);
}

enum class Twin { kGlm, kMinimax, kBailing, kErnie };

/// The Hugging Face name of a glm4moe, minimax-m2, bailingmoe2 or ernie4_5(-moe) GGUF tensor
/// (llama.cpp's converter's mapping, reversed); "" for a stacked expert tensor.
inline std::string twin_hf_name(Twin arch, const std::string& g) {
  const bool minimax = arch == Twin::kMinimax, bailing = arch == Twin::kBailing;
  if (g == "token_embd.weight")
    return bailing ? "model.word_embeddings.weight" : "model.embed_tokens.weight";
  if (g == "output_norm.weight") return "model.norm.weight";
  if (g == "output.weight") return "lm_head.weight";
  const size_t dot = g.find('.', 4);
  const std::string layer = g.substr(4, dot - 4), rest = g.substr(dot + 1);
  static const std::pair<const char*, const char*> kLayer[] = {
      {"attn_norm.weight", "input_layernorm.weight"},
      {"attn_q.weight", "self_attn.q_proj.weight"},
      {"attn_k.weight", "self_attn.k_proj.weight"},
      {"attn_v.weight", "self_attn.v_proj.weight"},
      {"attn_q.bias", "self_attn.q_proj.bias"},
      {"attn_k.bias", "self_attn.k_proj.bias"},
      {"attn_v.bias", "self_attn.v_proj.bias"},
      {"post_attention_norm.weight", "post_attention_layernorm.weight"},  // glm4moe
      {"ffn_norm.weight", "post_attention_layernorm.weight"},             // the others
      {"ffn_gate.weight", "mlp.gate_proj.weight"},
      {"ffn_up.weight", "mlp.up_proj.weight"},
      {"ffn_down.weight", "mlp.down_proj.weight"},
      {"ffn_gate_shexp.weight", "mlp.shared_experts.gate_proj.weight"},
      {"ffn_up_shexp.weight", "mlp.shared_experts.up_proj.weight"},
      {"ffn_down_shexp.weight", "mlp.shared_experts.down_proj.weight"},
      {"nextn.eh_proj.weight", "eh_proj.weight"},
      {"nextn.enorm.weight", "enorm.weight"},
      {"nextn.hnorm.weight", "hnorm.weight"},
      {"nextn.shared_head_norm.weight", "shared_head.norm.weight"}};
  const std::string at = "model.layers." + layer + ".";
  if (bailing) {  // Ling-2.0's own attention and router names
    if (rest == "attn_qkv.weight") return at + "attention.query_key_value.weight";
    if (rest == "attn_output.weight") return at + "attention.dense.weight";
    if (rest == "attn_q_norm.weight") return at + "attention.query_layernorm.weight";
    if (rest == "attn_k_norm.weight") return at + "attention.key_layernorm.weight";
    if (rest == "exp_probs_b.bias") return at + "mlp.gate.expert_bias";
  }
  if (arch == Twin::kErnie && rest == "exp_probs_b.bias")
    return at + "mlp.moe_statics.e_score_correction_bias";
  if (rest == "attn_output.weight") return at + "self_attn.o_proj.weight";
  if (rest == "attn_q_norm.weight") return at + "self_attn.q_norm.weight";
  if (rest == "attn_k_norm.weight") return at + "self_attn.k_norm.weight";
  if (rest == "ffn_gate_inp.weight")
    return at + (minimax ? "block_sparse_moe.gate.weight" : "mlp.gate.weight");
  if (rest == "exp_probs_b.bias")
    return at + (minimax ? "block_sparse_moe.e_score_correction_bias"
                         : "mlp.gate.e_score_correction_bias");
  for (const auto& [from, to] : kLayer)
    if (rest == from) return at + to;
  return "";
}

struct HfOptions {
  bool qk_norm = true;      // keep the q/k norms; false: use_qk_norm false (GLM-4.5-Air)
  bool router_bias = true;  // keep the selection bias (minimax-m2, bailingmoe2: else the config
                            // says there is none; glm4moe: a broken checkpoint)
};

/// config.json of an ERNIE 4.5 twin: Ernie4_5_MoeForCausalLM's keys (Ernie4_5ForCausalLM's for
/// a dense ernie4_5 file); the embedding is the head when the file has no output.weight.
inline nlohmann::json ernie_twin_config(const model::GgufFile& g) {
  const std::string arch = g.get_string("general.architecture"), a = arch + ".";
  const int64_t heads = g.get_int(a + "attention.head_count");
  nlohmann::json c = {
      {"vocab_size", g.find_tensor("token_embd.weight")->ne[1]},
      {"hidden_size", g.get_int(a + "embedding_length")},
      {"intermediate_size", g.get_int(a + "feed_forward_length")},
      {"num_hidden_layers", g.get_int(a + "block_count")},
      {"num_attention_heads", heads},
      {"num_key_value_heads", g.get_int(a + "attention.head_count_kv")},
      {"head_dim",
       g.get_int_or(a + "attention.key_length", g.get_int(a + "embedding_length") / heads)},
      {"rope_theta", g.get_float_or(a + "rope.freq_base", 10000.0)},  // llama.cpp's default
      {"rms_norm_eps", g.get_float(a + "attention.layer_norm_rms_epsilon")},
      {"max_position_embeddings", g.get_int(a + "context_length")},
      {"hidden_act", "silu"},
      {"use_bias", false},
      {"tie_word_embeddings", g.find_tensor("output.weight") == nullptr}};
  if (arch == "ernie4_5") {
    c["architectures"] = {"Ernie4_5ForCausalLM"};
    c["model_type"] = "ernie4_5";
    return c;
  }
  c["architectures"] = {"Ernie4_5_MoeForCausalLM"};
  c["model_type"] = "ernie4_5_moe";
  c["moe_num_experts"] = g.get_int(a + "expert_count");
  c["moe_k"] = g.get_int(a + "expert_used_count");
  c["moe_intermediate_size"] = g.get_int(a + "expert_feed_forward_length");
  c["moe_num_shared_experts"] = g.get_int_or(a + "expert_shared_count", 0);
  c["moe_layer_start_index"] = g.get_int_or(a + "leading_dense_block_count", 0);
  c["moe_layer_end_index"] = -1;
  c["moe_layer_interval"] = g.get_int(a + "interleave_moe_layer_step");
  c["moe_norm_min"] = 1e-12;
  c["moe_gate_act"] = "softmax";
  c["moe_use_aux_free"] = true;
  return c;
}

/// config.json of the twin: the GGUF's hyperparameters under the transformers class's keys.
inline nlohmann::json twin_config(const model::GgufFile& g, Twin arch, const HfOptions& opt) {
  if (arch == Twin::kErnie) return ernie_twin_config(g);
  const bool minimax = arch == Twin::kMinimax;
  const std::string a = g.get_string("general.architecture") + ".";
  const int64_t n_nextn = g.get_int_or(a + "nextn_predict_layers", 0);
  const int64_t n_layer = g.get_int(a + "block_count") - n_nextn;
  const int64_t head_dim =
      g.get_int_or(a + "attention.key_length",
                   g.get_int(a + "embedding_length") / g.get_int(a + "attention.head_count"));
  nlohmann::json c = {{"vocab_size", g.find_tensor("token_embd.weight")->ne[1]},
                      {"hidden_size", g.get_int(a + "embedding_length")},
                      {"num_hidden_layers", n_layer},
                      {"num_attention_heads", g.get_int(a + "attention.head_count")},
                      {"num_key_value_heads", g.get_int(a + "attention.head_count_kv")},
                      {"head_dim", head_dim},
                      {"rope_theta", g.get_float(a + "rope.freq_base")},
                      {"rms_norm_eps", g.get_float(a + "attention.layer_norm_rms_epsilon")},
                      {"max_position_embeddings", g.get_int(a + "context_length")},
                      {"use_qk_norm", opt.qk_norm},
                      {"num_experts_per_tok", g.get_int(a + "expert_used_count")},
                      {"hidden_act", "silu"},
                      {"tie_word_embeddings", false}};
  if (arch == Twin::kBailing) {
    c["architectures"] = {"BailingMoeV2ForCausalLM"};
    c["model_type"] = "bailing_moe";
    c["partial_rotary_factor"] =
        static_cast<double>(g.get_int(a + "rope.dimension_count")) / static_cast<double>(head_dim);
    c["use_qkv_bias"] = false;
    c["use_bias"] = false;
    c["intermediate_size"] = g.get_int(a + "feed_forward_length");
    c["moe_intermediate_size"] = g.get_int(a + "expert_feed_forward_length");
    c["num_experts"] = g.get_int(a + "expert_count");
    c["num_shared_experts"] = g.get_int(a + "expert_shared_count");
    c["first_k_dense_replace"] = g.get_int(a + "leading_dense_block_count");
    c["n_group"] = g.get_int(a + "expert_group_count");
    c["topk_group"] = g.get_int(a + "expert_group_used_count");
    c["routed_scaling_factor"] = g.get_float(a + "expert_weights_scale");
    c["norm_topk_prob"] = g.get_bool(a + "expert_weights_norm");
    c["score_function"] = "sigmoid";
    c["moe_router_enable_expert_bias"] = opt.router_bias;
    return c;
  }
  if (minimax) {
    c["architectures"] = {"MiniMaxM2ForCausalLM"};
    c["model_type"] = "minimax_m2";
    c["rotary_dim"] = g.get_int(a + "rope.dimension_count");
    c["qk_norm_type"] = "per_layer";
    c["intermediate_size"] = g.get_int(a + "expert_feed_forward_length");
    c["num_local_experts"] = g.get_int(a + "expert_count");
    c["scoring_func"] = "sigmoid";
    c["use_routing_bias"] = opt.router_bias;
    c["shared_intermediate_size"] = 0;
    c["attn_type_list"] = std::vector<int>(static_cast<size_t>(n_layer), 1);
    return c;
  }
  c["architectures"] = {"Glm4MoeForCausalLM"};
  c["model_type"] = "glm4_moe";
  c["num_nextn_predict_layers"] = n_nextn;
  c["partial_rotary_factor"] =
      static_cast<double>(g.get_int(a + "rope.dimension_count")) / static_cast<double>(head_dim);
  c["attention_bias"] = true;
  c["intermediate_size"] = g.get_int(a + "feed_forward_length");
  c["moe_intermediate_size"] = g.get_int(a + "expert_feed_forward_length");
  c["n_routed_experts"] = g.get_int(a + "expert_count");
  c["n_shared_experts"] = g.get_int(a + "expert_shared_count");
  c["first_k_dense_replace"] = g.get_int(a + "leading_dense_block_count");
  c["routed_scaling_factor"] = g.get_float(a + "expert_weights_scale");
  c["norm_topk_prob"] = g.get_bool(a + "expert_weights_norm");
  c["n_group"] = 1;
  c["topk_group"] = 1;
  return c;
}

/// The Hugging Face form of the f32 glm4moe, minimax-m2, bailingmoe2 or ernie4_5(-moe) GGUF at
/// `gguf` (config.json + model.safetensors) in `dir`.
inline void write_hf_twin(const std::string& gguf, const TempDir& dir, const HfOptions& opt = {}) {
  auto f = model::GgufFile::open(gguf);
  ASSERT_TRUE(f.has_value()) << f.error().message;
  const model::GgufFile& g = **f;
  const std::string gguf_arch = g.get_string("general.architecture");
  const Twin arch = gguf_arch == "minimax-m2"             ? Twin::kMinimax
                    : gguf_arch == "bailingmoe2"          ? Twin::kBailing
                    : gguf_arch.rfind("ernie4_5", 0) == 0 ? Twin::kErnie
                                                          : Twin::kGlm;
  const bool minimax = arch == Twin::kMinimax;
  std::vector<StTensor> tensors;
  for (const model::TensorInfo& t : g.tensors()) {
    ASSERT_EQ(t.type, model::GgmlType::kF32) << t.name;
    const bool qk_norm = t.name.find("attn_q_norm") != std::string::npos ||
                         t.name.find("attn_k_norm") != std::string::npos;
    if ((!opt.qk_norm && qk_norm) ||
        (!opt.router_bias && t.name.find("exp_probs_b") != std::string::npos))
      continue;
    const std::string bytes(reinterpret_cast<const char*>(t.data), t.nbytes);
    std::vector<int64_t> shape(t.ne, t.ne + t.n_dims);
    std::reverse(shape.begin(), shape.end());  // ggml ne → PyTorch order
    const std::string name = twin_hf_name(arch, t.name);
    // ERNIE's correction bias is stored as [1, n_expert] (one row per modality group).
    if (arch == Twin::kErnie && t.name.find("exp_probs_b") != std::string::npos)
      shape.insert(shape.begin(), 1);
    if (!name.empty()) {
      tensors.push_back({name, "F32", shape, bytes});
      continue;
    }
    // blk.N.ffn_{gate,up,down}_exps.weight [n_expert, rows, cols] → one tensor per expert.
    const size_t dot = t.name.find('.', 4);
    const std::string layer = t.name.substr(4, dot - 4), kind = t.name.substr(dot + 1);
    const char* proj = kind == "ffn_gate_exps.weight"   ? (minimax ? "w1" : "gate_proj")
                       : kind == "ffn_up_exps.weight"   ? (minimax ? "w3" : "up_proj")
                       : kind == "ffn_down_exps.weight" ? (minimax ? "w2" : "down_proj")
                                                        : nullptr;
    ASSERT_NE(proj, nullptr) << "no Hugging Face name for " << t.name;
    const std::string experts = minimax ? ".block_sparse_moe.experts." : ".mlp.experts.";
    const size_t per = bytes.size() / static_cast<size_t>(shape[0]);
    for (int64_t e = 0; e < shape[0]; ++e)
      tensors.push_back(
          {"model.layers." + layer + experts + std::to_string(e) + "." + proj + ".weight",
           "F32",
           {shape[1], shape[2]},
           bytes.substr(static_cast<size_t>(e) * per, per)});
  }
  dir.write("config.json", twin_config(g, arch, opt).dump(2));
  dir.write("model.safetensors", safetensors_image(tensors));
}

}  // namespace troupe::testing
