// Ling-2.0 (bailingmoe2 / BailingMoeV2ForCausalLM: Ling-mini-2.0, Ling-flash-2.0, Ling-1T)
// through the engine: a synthesized GGUF in llama.cpp's conventions and its Hugging Face twin,
// against the independent float64 forward pass of tests/hf_moe_reference.h. Its q, k and v come
// from one fused matrix, split into views of its rows. No ../shared golden case exists for this
// architecture.
#include <cstring>
#include <fstream>
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

using testing::TempDir;
using testing::write_hf_twin;

std::string synth_bailing(const TempDir& dir, uint64_t seed = 3) {
  return testing::synth_arch(dir, "bailingmoe2", seed);
}

TEST(BailingMoe2, GgufMapsAsLlamaCppWithTheFusedQkvAsViews) {
  TempDir dir;
  const std::string path = synth_bailing(dir);
  auto m = model::load_model(path);
  ASSERT_TRUE(m.has_value()) << m.error().message;
  const model::ModelSpec& s = (*m)->spec;
  EXPECT_EQ(s.arch, model::Arch::kBailingMoe2);
  EXPECT_STREQ(model::arch_name(s.arch), "bailingmoe2");
  EXPECT_EQ(s.n_rot * 2, s.head_dim_k);
  EXPECT_EQ(s.rope_style, model::RopeStyle::kNeox);
  EXPECT_EQ(s.gating, model::Gating::kSigmoid);
  EXPECT_TRUE(s.norm_topk);
  EXPECT_EQ(s.n_group, 4);
  EXPECT_EQ(s.n_group_used, 2);
  EXPECT_EQ(s.n_leading_dense, 1);
  auto g = model::GgufFile::open(path);
  ASSERT_TRUE(g.has_value());
  for (size_t il = 0; il < s.layers.size(); ++il) {
    const model::LayerSpec& L = s.layers[il];
    const model::TensorInfo* qkv =
        (*g)->find_tensor("blk." + std::to_string(il) + ".attn_qkv.weight");
    ASSERT_NE(qkv, nullptr);
    // Zero-copy: the q, k and v views are the fused matrix's rows in the model's mapping (at
    // the file offset of attn_qkv, measured from token_embd's in both mappings).
    const uint8_t* embd = (*g)->find_tensor("token_embd.weight")->data;
    EXPECT_EQ(L.wq.data - s.token_embd.data, qkv->data - embd);
    EXPECT_EQ(L.wk.data, L.wq.data + L.wq.nbytes());
    EXPECT_EQ(L.wv.data, L.wk.data + L.wk.nbytes());
    EXPECT_EQ(L.wq.rows(), s.n_head * s.head_dim_k);
    EXPECT_EQ(L.q_norm.cols(), s.head_dim_k);
    EXPECT_EQ(L.is_moe, il >= 1);
    if (L.is_moe) {
      EXPECT_TRUE(L.router_bias.present());
      EXPECT_TRUE(L.shared.gate.present());
    }
  }
}

// No golden case exists: the engine's logits are held to an independent float64 forward pass
// of the Hugging Face form, written from its modeling code's semantics.
TEST(BailingMoe2, EngineMatchesTheFloat64ReferenceFromGgufAndHf) {
  TempDir dir, hf;
  const std::string gguf = synth_bailing(dir);
  write_hf_twin(gguf, hf);
  auto m = model::load_model(gguf);
  ASSERT_TRUE(m.has_value()) << m.error().message;
  const int32_t vocab = static_cast<int32_t>((*m)->spec.n_vocab);
  const std::vector<int32_t> prompt = prompt_of(40, vocab, 41);
  const std::vector<float> from_gguf = prompt_logits(*m, prompt);
  expect_near_reference(from_gguf, testing::bailing_moe_v2_reference_logits(hf.path(), prompt),
                        vocab);
  EXPECT_TRUE(bit_equal(prompt_logits(hf.path(), prompt), from_gguf));
}

// use_qk_norm and moe_router_enable_expert_bias false.
TEST(BailingMoe2, WithoutQkNormOrExpertBiasMatchesTheReference) {
  TempDir dir, hf;
  write_hf_twin(synth_bailing(dir, 8), hf, {.qk_norm = false, .router_bias = false});
  auto m = model::load_model(hf.path());
  ASSERT_TRUE(m.has_value()) << m.error().message;
  EXPECT_FALSE((*m)->spec.layers[1].q_norm.present());
  EXPECT_FALSE((*m)->spec.layers[1].router_bias.present());
  const int32_t vocab = static_cast<int32_t>((*m)->spec.n_vocab);
  const std::vector<int32_t> prompt = prompt_of(15, vocab, 23);
  expect_near_reference(prompt_logits(*m, prompt),
                        testing::bailing_moe_v2_reference_logits(hf.path(), prompt), vocab);
}

// Ling-1T ships in DeepSeek's FP8 form. A fused matrix whose q/k/v parts start on whole scale
// blocks stays FP8 (views of its rows); one whose parts would cut a block becomes exact f32.
// Either way the logits are the exact twin's.
TEST(BailingMoe2, Fp8CheckpointEqualsItsExactTwin) {
  TempDir dir, hf;
  write_hf_twin(synth_bailing(dir), hf);
  for (const int64_t block : {16, 128}) {
    SCOPED_TRACE("blocks of " + std::to_string(block));
    const testing::Fp8Copy copy(hf.path(), block, block);
    auto fp8 = model::load_model(copy.fp8_path());
    ASSERT_TRUE(fp8.has_value()) << fp8.error().message;
    const model::LayerSpec& L = (*fp8)->spec.layers[1];
    EXPECT_EQ(L.wk.type, block == 16 ? model::GgmlType::kF8_E4M3 : model::GgmlType::kF32);
    EXPECT_EQ(L.experts[0].gate.type, model::GgmlType::kF8_E4M3);
    const auto p = prompt_of(12, static_cast<int32_t>((*fp8)->spec.n_vocab), 11);
    expect_quantized_logits(prompt_logits(*fp8, p), prompt_logits(copy.twin_path(), p),
                            prompt_logits(hf.path(), p), 0.0);
  }
}

TEST(BailingMoe2, BatchedEqualsAlone) {
  TempDir dir;
  auto m = model::load_model(synth_bailing(dir));
  ASSERT_TRUE(m.has_value()) << m.error().message;
  const int32_t vocab = static_cast<int32_t>((*m)->spec.n_vocab);
  const std::vector<int32_t> a = prompt_of(19, vocab, 31), b = prompt_of(7, vocab, 5);
  EXPECT_TRUE(bit_equal(prompt_logits(*m, a), batch_logits(*m, {b, a}, 1)));
}

TEST(BailingMoe2, UnsupportedVariantsAndBadFilesAreRefused) {
  TempDir dir;
  const std::string gguf = synth_bailing(dir);
  const std::pair<const char*, std::pair<const char*, nlohmann::json>> cases[] = {
      {"use_bias (an output projection bias) is not supported", {"use_bias", true}},
      {"score_function 'softmax' is not supported", {"score_function", "softmax"}}};
  for (const auto& [want, edit] : cases) {
    TempDir hf;
    write_hf_twin(gguf, hf);
    std::ifstream in(hf.file("config.json"));
    nlohmann::json c = nlohmann::json::parse(in);
    c[edit.first] = edit.second;
    hf.write("config.json", c.dump());
    const std::string err = load_error(hf.path());
    EXPECT_NE(err.find(want), std::string::npos) << edit.first << ": " << err;
  }
  // A fused matrix of the wrong height: its rows are named against q + k + v.
  const std::string more_kv = testing::edited_gguf(
      dir, "kv.gguf", gguf, [](auto& w) { w.set_u32("bailingmoe2.attention.head_count_kv", 4); });
  EXPECT_NE(load_error(more_kv).find("'blk.0.attn_qkv.weight' has 192 rows, expected 256 (q 128 + "
                                     "k 64 + v 64)"),
            std::string::npos)
      << load_error(more_kv);
}

}  // namespace
}  // namespace troupe::compute
