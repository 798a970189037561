// GLM-4.5-family models (glm4moe / Glm4MoeForCausalLM) through the engine: a synthesized GGUF in
// llama.cpp's conventions and its Hugging Face twin, against the independent float64 forward
// pass of tests/hf_moe_reference.h; the multi-token-prediction layer is skipped; bad files are
// refused by name. No ../shared golden case exists for this architecture (see the test names).
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/gguf.h"
#include "model/model.h"
#include "tests/compute/engine_test_util.h"
#include "tests/edited_model.h"
#include "tests/hf_moe_reference.h"
#include "tests/hf_twin_model.h"
#include "tests/test_support.h"

namespace troupe::compute {
namespace {

using testing::HfOptions;
using testing::synth_glm;
using testing::TempDir;
using testing::write_hf_twin;

TEST(Glm4Moe, GgufMapsAsLlamaCppAndSkipsTheMtpLayer) {
  TempDir dir;
  const std::string path = synth_glm(dir);
  auto m = model::load_model(path);
  ASSERT_TRUE(m.has_value()) << m.error().message;
  const model::ModelSpec& s = (*m)->spec;
  EXPECT_EQ(s.arch, model::Arch::kGlm4Moe);
  EXPECT_STREQ(model::arch_name(s.arch), "glm4moe");
  ASSERT_EQ(s.n_layer, 4);  // block_count 5 = 4 decoder layers + 1 MTP layer
  ASSERT_EQ(s.layers.size(), 4u);
  EXPECT_EQ(s.n_rot * 2, s.head_dim_k);
  EXPECT_EQ(s.rope_style, model::RopeStyle::kNeox);
  EXPECT_EQ(s.gating, model::Gating::kSigmoid);
  EXPECT_TRUE(s.norm_topk);
  EXPECT_FLOAT_EQ(s.routed_scale, 2.5f);
  EXPECT_EQ(s.n_leading_dense, 1);
  EXPECT_FALSE(s.layers[0].is_moe);
  for (size_t il = 1; il < 4; ++il) {
    const model::LayerSpec& L = s.layers[il];
    EXPECT_TRUE(L.is_moe);
    EXPECT_TRUE(L.router_bias.present());
    EXPECT_TRUE(L.shared.gate.present());
    EXPECT_TRUE(L.bq.present() && L.bk.present() && L.bv.present());
    EXPECT_TRUE(L.q_norm.present() && L.k_norm.present());
    EXPECT_EQ(L.ffn_norm.name, "blk." + std::to_string(il) + ".post_attention_norm.weight");
  }
  auto g = model::GgufFile::open(path);
  ASSERT_TRUE(g.has_value());
  EXPECT_NE((*g)->find_tensor("blk.4.nextn.eh_proj.weight"), nullptr);
}

// No golden case exists for GLM: the engine's logits are held to an independent float64 forward
// pass of the Hugging Face form, written from transformers' semantics.
TEST(Glm4Moe, EngineMatchesTheFloat64ReferenceFromGgufAndHf) {
  TempDir dir, hf;
  const std::string gguf = synth_glm(dir);
  write_hf_twin(gguf, hf);
  auto m = model::load_model(gguf);
  ASSERT_TRUE(m.has_value()) << m.error().message;
  const int32_t vocab = static_cast<int32_t>((*m)->spec.n_vocab);
  const std::vector<int32_t> prompt = prompt_of(40, vocab, 37);
  const std::vector<double> ref = testing::glm4moe_reference_logits(hf.path(), prompt);
  const std::vector<float> from_gguf = prompt_logits(*m, prompt);
  expect_near_reference(from_gguf, ref, vocab);
  // The Hugging Face directory loads to the same views: the same bits.
  EXPECT_TRUE(bit_equal(prompt_logits(hf.path(), prompt), from_gguf));
}

// GLM-4.5-Air's form: no q/k norms.
TEST(Glm4Moe, WithoutQkNormMatchesTheReference) {
  TempDir dir, hf;
  write_hf_twin(synth_glm(dir, 11), hf, {.qk_norm = false});
  auto m = model::load_model(hf.path());
  ASSERT_TRUE(m.has_value()) << m.error().message;
  EXPECT_FALSE((*m)->spec.layers[1].q_norm.present());
  const int32_t vocab = static_cast<int32_t>((*m)->spec.n_vocab);
  const std::vector<int32_t> prompt = prompt_of(17, vocab, 91);
  expect_near_reference(prompt_logits(*m, prompt),
                        testing::glm4moe_reference_logits(hf.path(), prompt), vocab);
}

TEST(Glm4Moe, BatchedEqualsAlone) {
  TempDir dir;
  auto m = model::load_model(synth_glm(dir));
  ASSERT_TRUE(m.has_value()) << m.error().message;
  const int32_t vocab = static_cast<int32_t>((*m)->spec.n_vocab);
  const std::vector<int32_t> a = prompt_of(21, vocab, 13), b = prompt_of(9, vocab, 71);
  EXPECT_TRUE(bit_equal(prompt_logits(*m, a), batch_logits(*m, {b, a}, 1)));
}

TEST(Glm4Moe, HfWithoutRouterBiasIsRefusedByName) {
  TempDir dir, hf;
  write_hf_twin(synth_glm(dir), hf, {.router_bias = false});
  EXPECT_NE(load_error(hf.path()).find(
                "missing tensor 'model.layers.1.mlp.gate.e_score_correction_bias'"),
            std::string::npos)
      << load_error(hf.path());
}

TEST(Glm4Moe, HfBadPartialRotaryFactorIsRefused) {
  TempDir dir, hf;
  write_hf_twin(synth_glm(dir), hf);
  std::ifstream in(hf.file("config.json"));
  nlohmann::json c = nlohmann::json::parse(in);
  c["partial_rotary_factor"] = 1.5;
  hf.write("config.json", c.dump());
  EXPECT_NE(load_error(hf.path()).find("partial_rotary_factor 1.5 must be in (0, 1]"),
            std::string::npos)
      << load_error(hf.path());
}

TEST(Glm4Moe, GgufBadMtpCountAndMultimodalRopeAreRefused) {
  TempDir dir;
  const std::string src = synth_glm(dir);
  const std::string all_mtp = testing::edited_gguf(
      dir, "all_mtp.gguf", src, [](auto& w) { w.set_u32("glm4moe.nextn_predict_layers", 5); });
  EXPECT_NE(load_error(all_mtp).find("nextn_predict_layers 5 must be below block_count 5"),
            std::string::npos)
      << load_error(all_mtp);
  const std::string mrope = testing::edited_gguf(dir, "mrope.gguf", src, [](auto& w) {
    const std::vector<int32_t> sections{8, 12, 12, 0};
    w.set_array_i32("glm4moe.rope.dimension_sections", sections);
  });
  EXPECT_NE(load_error(mrope).find("multimodal rope"), std::string::npos) << load_error(mrope);
}

}  // namespace
}  // namespace troupe::compute
