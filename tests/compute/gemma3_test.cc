// Google Gemma 3's text decoder (GGUF "gemma3", llama.cpp's conventions; Hugging Face
// Gemma3ForCausalLM) through the engine: a synthesized model against the independent float64
// forward pass of tests/gemma3_reference.h. New parts it exercises: embeddings scaled by
// sqrt(n_embd), RMSNorms of the attention's and the FFN's outputs, the GELU FFN, five
// sliding-window layers (their own rope base) to every global one, llama.cpp's query scale for
// the 27B shape, the final logit soft cap of the variant without a window, and Gemma's 1 + w
// norms in the Hugging Face form. No ../shared golden case exists for this architecture.
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/gguf.h"
#include "model/model.h"
#include "model/synth.h"
#include "tests/compute/engine_test_util.h"
#include "tests/edited_model.h"
#include "tests/gemma3_hf_twin.h"
#include "tests/gemma3_reference.h"
#include "tests/hf_twin_model.h"
#include "tests/test_support.h"

namespace troupe::compute {
namespace {

using testing::TempDir;

std::string synth_gemma3(const TempDir& dir, uint64_t seed = 11) {
  return testing::synth_arch(dir, "gemma3", seed);
}

TEST(Gemma3, GgufMapsAsLlamaCpp) {
  TempDir dir;
  auto m = model::load_model(synth_gemma3(dir));
  ASSERT_TRUE(m.has_value()) << m.error().message;
  const model::ModelSpec& s = (*m)->spec;
  EXPECT_EQ(s.arch, model::Arch::kGemma3);
  EXPECT_STREQ(model::arch_name(s.arch), "gemma3");
  EXPECT_EQ(s.ffn_act, model::FfnAct::kGeluTanh);
  EXPECT_EQ(s.embd_scale, std::sqrt(128.0f));
  EXPECT_EQ(s.rope_style, model::RopeStyle::kNeox);
  EXPECT_EQ(s.rope_theta_local, 10000.f);
  EXPECT_EQ(s.kq_scale_mult, 1.0);
  EXPECT_EQ(s.final_logit_softcap, 0.f);
  EXPECT_EQ(s.output.data, s.token_embd.data) << "the head is the embedding";
  ASSERT_EQ(s.layers.size(), 7u);
  for (size_t il = 0; il < s.layers.size(); ++il) {
    const model::LayerSpec& L = s.layers[il];
    const bool global = il == 5;  // five sliding-window layers, then a global one
    EXPECT_EQ(L.window, global ? 0 : 8) << il;
    EXPECT_EQ(L.local_rope, !global) << il;
    EXPECT_TRUE(L.attn_post_norm.present() && L.ffn_post_norm.present()) << il;
    EXPECT_TRUE(L.q_norm.present() && L.k_norm.present()) << il;
    EXPECT_EQ(L.attn_post_norm.name, "blk." + std::to_string(il) + ".post_attention_norm.weight");
    EXPECT_FALSE(L.is_moe);
  }
}

// No golden case exists: the engine's logits are held to an independent float64 forward pass.
// 40 tokens over a window of 8, KV blocks of 4 and 16.
TEST(Gemma3, EngineMatchesTheFloat64Reference) {
  TempDir dir;
  const std::string path = synth_gemma3(dir);
  auto m = model::load_model(path);
  ASSERT_TRUE(m.has_value()) << m.error().message;
  const int32_t vocab = static_cast<int32_t>((*m)->spec.n_vocab);
  const std::vector<int32_t> prompt = prompt_of(40, vocab, 19);
  expect_engine_near_reference(*m, prompt, testing::gemma3_reference_logits(path, prompt));
}

TEST(Gemma3, LogitsBitIdenticalAcrossChunkingThreadsAndBatches) {
  TempDir dir;
  auto m = model::load_model(synth_gemma3(dir, 17));
  ASSERT_TRUE(m.has_value()) << m.error().message;
  expect_batch_invariant(*m);
}

// llama.cpp's variants: without a sliding window every layer is global and the file's final
// logit soft cap applies; linear rope scaling stretches the global layers only; 62 layers (the
// 27B shape) scale queries by 1/sqrt(n_embd / n_head).
TEST(Gemma3, VariantsMatchTheReference) {
  TempDir dir;
  const std::string src = synth_gemma3(dir, 23);
  const std::string no_window = testing::edited_gguf(dir, "nw.gguf", src, [](auto& w) {
    w.remove_key("gemma3.attention.sliding_window");
    w.set_f32("gemma3.final_logit_softcapping", 3.0f);
  });
  const std::string linear = testing::edited_gguf(dir, "lin.gguf", src, [](auto& w) {
    w.set_string("gemma3.rope.scaling.type", "linear");
    w.set_f32("gemma3.rope.scaling.factor", 8.0f);
  });
  model::SynthOptions o;
  o.arch = "gemma3";
  o.seed = 29;
  o.n_ctx = 256;
  o.n_layer = 62;
  o.n_embd = 64;
  o.n_head = 4;
  o.head_dim = 32;  // n_embd / n_head is 16
  o.n_ff = 64;
  const std::string deep = dir.file("62.gguf");
  ASSERT_TRUE(model::synth_model(o, deep).has_value());
  for (const std::string& path : {no_window, linear, deep}) {
    SCOPED_TRACE(path);
    auto m = model::load_model(path);
    ASSERT_TRUE(m.has_value()) << m.error().message;
    const model::ModelSpec& s = (*m)->spec;
    if (path == no_window) {
      EXPECT_EQ(s.final_logit_softcap, 3.0f);
      for (const model::LayerSpec& L : s.layers) EXPECT_TRUE(L.window == 0 && !L.local_rope);
    }
    if (path == linear) {
      EXPECT_EQ(s.rope_scaling.type, model::RopeScalingType::kLinear);
    }
    if (path == deep) {
      EXPECT_DOUBLE_EQ(s.kq_scale_mult, std::sqrt(2.0));
    }
    const int32_t vocab = static_cast<int32_t>(s.n_vocab);
    const std::vector<int32_t> prompt = prompt_of(20, vocab, 31);
    expect_near_reference(prompt_logits(*m, prompt), testing::gemma3_reference_logits(path, prompt),
                          vocab);
  }
}

// The Hugging Face form (norms stored as w - 1, the names Gemma3ForCausalLM uses) gives the
// GGUF's logits bit for bit.
TEST(Gemma3, HuggingFaceTwinEqualsTheGguf) {
  TempDir dir, hf;
  const std::string path = synth_gemma3(dir, 37);
  testing::write_gemma3_hf_twin(path, hf);
  auto m = model::load_model(hf.path());
  ASSERT_TRUE(m.has_value()) << m.error().message;
  const model::ModelSpec& s = (*m)->spec;
  EXPECT_EQ(s.arch, model::Arch::kGemma3);
  EXPECT_EQ(s.output.data, s.token_embd.data);
  EXPECT_EQ(s.layers[5].window, 0);
  EXPECT_EQ(s.layers[6].window, 8);
  EXPECT_TRUE(s.layers[6].local_rope);
  const std::vector<int32_t> prompt = prompt_of(30, static_cast<int32_t>(s.n_vocab), 41);
  EXPECT_TRUE(bit_equal(prompt_logits(*m, prompt), prompt_logits(path, prompt)));
}

// The multimodal checkpoints (Gemma 3 4B, 12B, 27B): the decoder under text_config, keys at
// Gemma3TextConfig's defaults left out, tensors under either prefix transformers has written,
// the vision tower beside them unread: the GGUF's logits bit for bit.
TEST(Gemma3, MultimodalCheckpointsTextDecoderEqualsTheGguf) {
  TempDir dir;
  const std::string path = synth_gemma3(dir, 39);
  const std::vector<int32_t> prompt = prompt_of(25, 512, 43);
  const std::vector<float> want = prompt_logits(path, prompt);
  for (const std::string prefix : {"language_model.model.", "model.language_model."}) {
    SCOPED_TRACE(prefix);
    TempDir hf;
    testing::write_gemma3_hf_twin(path, hf, prefix);
    auto m = model::load_model(hf.path());
    ASSERT_TRUE(m.has_value()) << m.error().message;
    EXPECT_EQ((*m)->spec.arch, model::Arch::kGemma3);
    EXPECT_EQ((*m)->spec.layers[5].window, 0);
    EXPECT_TRUE(bit_equal(prompt_logits(*m, prompt), want));
  }
}

// Gemma3TextConfig's keys: query_pre_attn_scalar, sliding_window_pattern (without layer_types),
// rope_local_base_freq and final_logit_softcapping are read; Gemma 2's attention soft cap and
// other activations are refused by name.
TEST(Gemma3, HuggingFaceConfigChecked) {
  TempDir dir, hf;
  testing::write_gemma3_hf_twin(synth_gemma3(dir, 43), hf);
  const nlohmann::json base =
      nlohmann::json::parse(testing::read_text_file(hf.file("config.json")));
  auto with = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json c = base;
    edit(c);
    hf.write("config.json", c.dump());
    return hf.path();
  };
  {
    auto m = model::load_model(with([](nlohmann::json& c) {
      c.erase("layer_types");
      c["sliding_window_pattern"] = 3;
      c["query_pre_attn_scalar"] = 8;
      c["rope_local_base_freq"] = 5000.0;
      c["final_logit_softcapping"] = 30.0;
    }));
    ASSERT_TRUE(m.has_value()) << m.error().message;
    const model::ModelSpec& s = (*m)->spec;
    for (size_t il = 0; il < s.layers.size(); ++il)
      EXPECT_EQ(s.layers[il].window, (il + 1) % 3 != 0 ? 8 : 0) << il;
    EXPECT_DOUBLE_EQ(s.kq_scale_mult, std::sqrt(static_cast<double>(s.head_dim_k) / 8.0));
    EXPECT_EQ(s.rope_theta_local, 5000.f);
    EXPECT_EQ(s.final_logit_softcap, 30.f);
  }
  EXPECT_NE(load_error(with([](nlohmann::json& c) {
              c["attn_logit_softcapping"] = 50.0;
            })).find("attn_logit_softcapping is not supported"),
            std::string::npos);
  EXPECT_NE(load_error(with([](nlohmann::json& c) {
              c["hidden_activation"] = "relu";
            })).find("hidden_activation 'relu' is not supported for Gemma3ForCausalLM"),
            std::string::npos);
}

}  // namespace
}  // namespace troupe::compute
