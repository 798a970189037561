// Test helpers for GLM-4.5-family models: a synthesized glm4moe GGUF (llama.cpp's conventions)
// and its Hugging Face form (Glm4MoeForCausalLM, F32 safetensors, the multi-token-prediction
// layer included as the released checkpoints carry it). Header-only; for test binaries that link
// troupe_model.
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

/// A synthesized glm4moe GGUF (f32, 4 decoder layers + 1 MTP layer, 16 experts of which 4 are
/// used, one shared, the first layer dense) in `dir`.
inline std::string synth_glm(const TempDir& dir, uint64_t seed = 7) {
  model::SynthOptions o;
  o.arch = "glm4moe";
  o.seed = seed;
  o.n_ctx = 256;
  const std::string path = dir.file("glm.gguf");
  const Status st = model::synth_model(o, path);
  EXPECT_TRUE(st.has_value()) << st.error().message;
  return path;
}

/// The Hugging Face name of a glm4moe GGUF tensor (the mapping of llama.cpp's converter,
/// reversed); "" for a stacked expert tensor.
inline std::string glm_hf_name(const std::string& g) {
  static const std::pair<const char*, const char*> kTop[] = {
      {"token_embd.weight", "model.embed_tokens.weight"},
      {"output_norm.weight", "model.norm.weight"},
      {"output.weight", "lm_head.weight"}};
  for (const auto& [from, to] : kTop)
    if (g == from) return to;
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
      {"attn_output.weight", "self_attn.o_proj.weight"},
      {"attn_q_norm.weight", "self_attn.q_norm.weight"},
      {"attn_k_norm.weight", "self_attn.k_norm.weight"},
      {"post_attention_norm.weight", "post_attention_layernorm.weight"},
      {"ffn_gate.weight", "mlp.gate_proj.weight"},
      {"ffn_up.weight", "mlp.up_proj.weight"},
      {"ffn_down.weight", "mlp.down_proj.weight"},
      {"ffn_gate_inp.weight", "mlp.gate.weight"},
      {"exp_probs_b.bias", "mlp.gate.e_score_correction_bias"},
      {"ffn_gate_shexp.weight", "mlp.shared_experts.gate_proj.weight"},
      {"ffn_up_shexp.weight", "mlp.shared_experts.up_proj.weight"},
      {"ffn_down_shexp.weight", "mlp.shared_experts.down_proj.weight"},
      {"nextn.eh_proj.weight", "eh_proj.weight"},
      {"nextn.enorm.weight", "enorm.weight"},
      {"nextn.hnorm.weight", "hnorm.weight"},
      {"nextn.shared_head_norm.weight", "shared_head.norm.weight"}};
  for (const auto& [from, to] : kLayer)
    if (rest == from) return "model.layers." + layer + "." + to;
  return "";
}

struct HfOptions {
  bool qk_norm = true;      // keep the q/k norms (GLM-4.5); false: GLM-4.5-Air's use_qk_norm false
  bool router_bias = true;  // keep e_score_correction_bias
};

/// The Hugging Face form of the f32 glm4moe GGUF at `gguf` (config.json + model.safetensors,
/// the MTP layer included as the released checkpoints carry it) in `dir`.
inline void write_hf_twin(const std::string& gguf, const TempDir& dir, const HfOptions& opt = {}) {
  auto f = model::GgufFile::open(gguf);
  ASSERT_TRUE(f.has_value()) << f.error().message;
  const model::GgufFile& g = **f;
  std::vector<StTensor> tensors;
  for (const model::TensorInfo& t : g.tensors()) {
    ASSERT_EQ(t.type, model::GgmlType::kF32) << t.name;
    if (!opt.qk_norm && t.name.find("_norm.weight") != std::string::npos &&
        (t.name.find("attn_q_norm") != std::string::npos ||
         t.name.find("attn_k_norm") != std::string::npos))
      continue;
    if (!opt.router_bias && t.name.find("exp_probs_b") != std::string::npos) continue;
    const std::string bytes(reinterpret_cast<const char*>(t.data), t.nbytes);
    std::vector<int64_t> shape(t.ne, t.ne + t.n_dims);
    std::reverse(shape.begin(), shape.end());  // ggml ne → PyTorch order
    const std::string name = glm_hf_name(t.name);
    if (!name.empty()) {
      tensors.push_back({name, "F32", shape, bytes});
      continue;
    }
    // blk.N.ffn_{gate,up,down}_exps.weight [n_expert, rows, cols] → one tensor per expert.
    const size_t dot = t.name.find('.', 4);
    const std::string layer = t.name.substr(4, dot - 4), kind = t.name.substr(dot + 1);
    const char* proj = kind == "ffn_gate_exps.weight"   ? "gate_proj"
                       : kind == "ffn_up_exps.weight"   ? "up_proj"
                       : kind == "ffn_down_exps.weight" ? "down_proj"
                                                        : nullptr;
    ASSERT_NE(proj, nullptr) << "no Hugging Face name for " << t.name;
    const size_t per = bytes.size() / static_cast<size_t>(shape[0]);
    for (int64_t e = 0; e < shape[0]; ++e)
      tensors.push_back(
          {"model.layers." + layer + ".mlp.experts." + std::to_string(e) + "." + proj + ".weight",
           "F32",
           {shape[1], shape[2]},
           bytes.substr(static_cast<size_t>(e) * per, per)});
  }
  const std::string a = "glm4moe.";
  const int64_t n_nextn = g.get_int(a + "nextn_predict_layers");
  nlohmann::json c = {
      {"architectures", {"Glm4MoeForCausalLM"}},
      {"model_type", "glm4_moe"},
      {"vocab_size", g.find_tensor("token_embd.weight")->ne[1]},
      {"hidden_size", g.get_int(a + "embedding_length")},
      {"num_hidden_layers", g.get_int(a + "block_count") - n_nextn},
      {"num_nextn_predict_layers", n_nextn},
      {"num_attention_heads", g.get_int(a + "attention.head_count")},
      {"num_key_value_heads", g.get_int(a + "attention.head_count_kv")},
      {"head_dim", g.get_int(a + "attention.key_length")},
      {"partial_rotary_factor", static_cast<double>(g.get_int(a + "rope.dimension_count")) /
                                    static_cast<double>(g.get_int(a + "attention.key_length"))},
      {"rope_theta", g.get_float(a + "rope.freq_base")},
      {"rms_norm_eps", g.get_float(a + "attention.layer_norm_rms_epsilon")},
      {"max_position_embeddings", g.get_int(a + "context_length")},
      {"attention_bias", true},
      {"use_qk_norm", opt.qk_norm},
      {"intermediate_size", g.get_int(a + "feed_forward_length")},
      {"moe_intermediate_size", g.get_int(a + "expert_feed_forward_length")},
      {"n_routed_experts", g.get_int(a + "expert_count")},
      {"num_experts_per_tok", g.get_int(a + "expert_used_count")},
      {"n_shared_experts", g.get_int(a + "expert_shared_count")},
      {"first_k_dense_replace", g.get_int(a + "leading_dense_block_count")},
      {"routed_scaling_factor", g.get_float(a + "expert_weights_scale")},
      {"norm_topk_prob", g.get_bool(a + "expert_weights_norm")},
      {"n_group", 1},
      {"topk_group", 1},
      {"hidden_act", "silu"},
      {"tie_word_embeddings", false}};
  dir.write("config.json", c.dump(2));
  dir.write("model.safetensors", testing::safetensors_image(tensors));
}

}  // namespace troupe::testing
