// MiniMax-M2 (minimax-m2 / MiniMaxM2ForCausalLM) through the engine: a synthesized GGUF in
// llama.cpp's conventions and its Hugging Face twin, against the independent float64 forward
// pass of tests/hf_moe_reference.h. Its q/k RMSNorm spans all heads of a token at once (one
// mean over n_head * head_dim), unlike Qwen3's and GLM's per-head norms. No ../shared golden case
// exists for this architecture.
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/gguf.h"
#include "model/model.h"
#include "tests/compute/engine_test_util.h"
#include "tests/hf_moe_reference.h"
#include "tests/hf_twin_model.h"
#include "tests/test_support.h"

namespace troupe::compute {
namespace {

using testing::TempDir;
using testing::write_hf_twin;

std::string synth_minimax(const TempDir& dir, uint64_t seed = 5) {
  return testing::synth_arch(dir, "minimax-m2", seed);
}

TEST(MinimaxM2, GgufMapsAsLlamaCpp) {
  TempDir dir;
  auto m = model::load_model(synth_minimax(dir));
  ASSERT_TRUE(m.has_value()) << m.error().message;
  const model::ModelSpec& s = (*m)->spec;
  EXPECT_EQ(s.arch, model::Arch::kMinimaxM2);
  EXPECT_STREQ(model::arch_name(s.arch), "minimax-m2");
  EXPECT_EQ(s.n_rot * 2, s.head_dim_k);
  EXPECT_EQ(s.rope_style, model::RopeStyle::kNeox);
  EXPECT_EQ(s.gating, model::Gating::kSigmoid);
  EXPECT_TRUE(s.norm_topk);
  EXPECT_EQ(s.n_leading_dense, 0);
  EXPECT_EQ(s.n_expert_shared, 0);
  for (const model::LayerSpec& L : s.layers) {
    EXPECT_TRUE(L.is_moe);
    EXPECT_TRUE(L.router_bias.present());
    EXPECT_FALSE(L.shared.gate.present());
    EXPECT_FALSE(L.bq.present());
    EXPECT_EQ(L.q_norm.cols(), s.n_head * s.head_dim_k);
    EXPECT_EQ(L.k_norm.cols(), s.n_head_kv * s.head_dim_k);
  }
}

// No golden case exists: the engine's logits are held to an independent float64 forward pass
// of the Hugging Face form, written from its modeling code's semantics.
TEST(MinimaxM2, EngineMatchesTheFloat64ReferenceFromGgufAndHf) {
  TempDir dir, hf;
  const std::string gguf = synth_minimax(dir);
  write_hf_twin(gguf, hf);
  auto m = model::load_model(gguf);
  ASSERT_TRUE(m.has_value()) << m.error().message;
  const int32_t vocab = static_cast<int32_t>((*m)->spec.n_vocab);
  const std::vector<int32_t> prompt = prompt_of(40, vocab, 53);
  const std::vector<float> from_gguf = prompt_logits(*m, prompt);
  expect_near_reference(from_gguf, testing::minimax_m2_reference_logits(hf.path(), prompt), vocab);
  EXPECT_TRUE(bit_equal(prompt_logits(hf.path(), prompt), from_gguf));
}

// use_qk_norm and use_routing_bias false: no norms, no selection bias.
TEST(MinimaxM2, WithoutQkNormOrRoutingBiasMatchesTheReference) {
  TempDir dir, hf;
  write_hf_twin(synth_minimax(dir, 9), hf, {.qk_norm = false, .router_bias = false});
  auto m = model::load_model(hf.path());
  ASSERT_TRUE(m.has_value()) << m.error().message;
  EXPECT_FALSE((*m)->spec.layers[0].q_norm.present());
  EXPECT_FALSE((*m)->spec.layers[0].router_bias.present());
  const int32_t vocab = static_cast<int32_t>((*m)->spec.n_vocab);
  const std::vector<int32_t> prompt = prompt_of(19, vocab, 29);
  expect_near_reference(prompt_logits(*m, prompt),
                        testing::minimax_m2_reference_logits(hf.path(), prompt), vocab);
}

// MiniMax-M2 is released in DeepSeek's FP8 form (blocks of 128 x 128): an FP8 copy of the twin
// gives its exact f32 twin's bits.
TEST(MinimaxM2, Fp8CheckpointEqualsItsExactTwin) {
  TempDir dir, hf;
  write_hf_twin(synth_minimax(dir), hf);
  const testing::Fp8Copy copy(hf.path(), 128, 128);
  ASSERT_GT(copy.quantized(), 0);
  auto fp8 = model::load_model(copy.fp8_path());
  ASSERT_TRUE(fp8.has_value()) << fp8.error().message;
  EXPECT_EQ((*fp8)->spec.layers[1].experts[0].gate.type, model::GgmlType::kF8_E4M3);
  const auto p = prompt_of(12, static_cast<int32_t>((*fp8)->spec.n_vocab), 7);
  expect_quantized_logits(prompt_logits(*fp8, p), prompt_logits(copy.twin_path(), p),
                          prompt_logits(hf.path(), p), 0.0);
}

TEST(MinimaxM2, BatchedEqualsAlone) {
  TempDir dir;
  auto m = model::load_model(synth_minimax(dir));
  ASSERT_TRUE(m.has_value()) << m.error().message;
  const int32_t vocab = static_cast<int32_t>((*m)->spec.n_vocab);
  const std::vector<int32_t> a = prompt_of(23, vocab, 17), b = prompt_of(6, vocab, 61);
  EXPECT_TRUE(bit_equal(prompt_logits(*m, a), batch_logits(*m, {a, b}, 0)));
}

// MiniMax-Text-01's features under the same config keys, and other variants, are refused by
// name rather than computed wrongly.
TEST(MinimaxM2, UnsupportedVariantsAreRefused) {
  TempDir dir;
  const std::string gguf = synth_minimax(dir);
  const std::pair<const char*, nlohmann::json> cases[] = {
      {"attn_type_list holds 0", nlohmann::json::array({1, 0, 1, 1})},
      {"qk_norm_type 'per_head' is not supported", "per_head"},
      {"scoring_func 'softmax' is not supported for MiniMax-M2", "softmax"},
      {"shared_intermediate_size > 0", 64},
      {"postnorm is not supported", true},
      {"use_grouped_topk is not supported", true},
      {"routed_scaling_factor other than 1", 2.5}};
  const char* keys[] = {"attn_type_list",           "qk_norm_type", "scoring_func",
                        "shared_intermediate_size", "postnorm",     "use_grouped_topk",
                        "routed_scaling_factor"};
  for (size_t i = 0; i < std::size(cases); ++i) {
    TempDir hf;
    write_hf_twin(gguf, hf);
    std::ifstream in(hf.file("config.json"));
    nlohmann::json c = nlohmann::json::parse(in);
    c[keys[i]] = cases[i].second;
    hf.write("config.json", c.dump());
    const std::string err = load_error(hf.path());
    EXPECT_NE(err.find(cases[i].first), std::string::npos) << keys[i] << ": " << err;
  }
}

TEST(MinimaxM2, WideQkNormOfTheWrongWidthIsRefused) {
  TempDir dir;
  const std::string src = synth_minimax(dir);
  // k_norm per head while q_norm spans all heads: a shape error naming the tensor.
  TempDir hf;
  write_hf_twin(src, hf);
  auto st = model::SafetensorsSet::open_dir(hf.path());
  ASSERT_TRUE(st.has_value());
  std::vector<testing::StTensor> tensors;
  for (const auto& [name, t] : (*st)->tensors()) {
    std::string bytes(reinterpret_cast<const char*>(t->data), t->nbytes);
    std::vector<int64_t> shape = t->shape;
    if (name == "model.layers.2.self_attn.k_norm.weight") {
      shape = {shape[0] / 2};
      bytes.resize(bytes.size() / 2);
    }
    tensors.push_back({name, "F32", shape, bytes});
  }
  TempDir bad;
  bad.link("config.json", hf.file("config.json"));
  bad.write("model.safetensors", testing::safetensors_image(tensors));
  const std::string err = load_error(bad.path());
  EXPECT_NE(err.find("model.layers.2.self_attn.k_norm.weight"), std::string::npos) << err;
}

}  // namespace
}  // namespace troupe::compute
