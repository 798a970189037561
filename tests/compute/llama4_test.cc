// Meta's Llama 4 text decoder (llama4 GGUF as llama.cpp runs it; Llama4ForConditionalGeneration
// and Llama4ForCausalLM) through the engine: a synthesized GGUF and its Hugging Face twin against
// the independent float64 forward pass of tests/llama4_reference.h, with chunked attention and
// the NoPE layers' temperature brought within a short prompt's reach through the twin's config;
// bad files refused by name. No ../shared golden case exists for this architecture.
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/model.h"
#include "model/synth.h"
#include "tests/compute/engine_test_util.h"
#include "tests/edited_model.h"
#include "tests/llama4_hf_twin.h"
#include "tests/llama4_reference.h"
#include "tests/test_support.h"

namespace troupe::compute {
namespace {

using testing::Llama4HfOptions;
using testing::TempDir;
using testing::write_llama4_hf_twin;

// troupe synth --arch llama4's defaults: 4 layers (the fourth NoPE), MoE in layers 1 and 3.
std::string synth_llama4(const TempDir& dir, uint64_t seed = 5, int64_t moe_step = 2) {
  model::SynthOptions o;
  o.arch = "llama4";
  o.seed = seed;
  o.n_ctx = 256;
  o.moe_layer_step = moe_step;
  const std::string path = dir.file("llama4.gguf");
  const Status st = model::synth_model(o, path);
  EXPECT_TRUE(st.has_value()) << st.error().message;
  return path;
}

std::shared_ptr<const model::Model> load(const std::string& path) {
  auto m = model::load_model(path);
  EXPECT_TRUE(m.has_value()) << m.error().message;
  return m.has_value() ? *m : nullptr;
}

TEST(Llama4, GgufMapsAsLlamaCpp) {
  TempDir dir;
  auto m = load(synth_llama4(dir));
  ASSERT_TRUE(m);
  const model::ModelSpec& s = m->spec;
  EXPECT_EQ(s.arch, model::Arch::kLlama4);
  EXPECT_STREQ(model::arch_name(s.arch), "llama4");
  EXPECT_EQ(s.rope_style, model::RopeStyle::kNormal);
  EXPECT_EQ(s.rope_freq_factors.size(), static_cast<size_t>(s.n_rot / 2));
  EXPECT_EQ(s.gating, model::Gating::kSigmoid);
  EXPECT_FALSE(s.norm_topk);
  EXPECT_TRUE(s.moe_weight_input);
  EXPECT_EQ(s.n_expert_used, 1);
  EXPECT_FLOAT_EQ(s.attn_temp_scale, 0.1f);
  EXPECT_EQ(s.attn_temp_floor, 8192);
  ASSERT_EQ(s.layers.size(), 4u);
  for (size_t il = 0; il < 4; ++il) {
    SCOPED_TRACE("layer " + std::to_string(il));
    const model::LayerSpec& L = s.layers[il];
    const bool global = il == 3;
    EXPECT_EQ(L.nope, global);
    EXPECT_EQ(L.chunk, global ? 0 : 8192);
    EXPECT_EQ(L.qk_l2_norm, !global);  // 8 experts: llama.cpp norms q and k
    EXPECT_EQ(L.is_moe, il % 2 == 1);
    EXPECT_EQ(L.shared.gate.present(), L.is_moe);
  }
}

// No golden case exists for Llama 4: the engine's logits are held to an independent float64
// forward pass of the Hugging Face form, written from transformers' semantics.
TEST(Llama4, EngineMatchesTheFloat64ReferenceFromGgufAndHf) {
  TempDir dir, hf;
  const std::string gguf = synth_llama4(dir);
  write_llama4_hf_twin(gguf, hf);
  auto m = load(gguf);
  ASSERT_TRUE(m);
  const int32_t vocab = static_cast<int32_t>(m->spec.n_vocab);
  const std::vector<int32_t> prompt = prompt_of(33, vocab, 37);
  const std::vector<float> from_gguf = prompt_logits(m, prompt);
  expect_near_reference(from_gguf, testing::llama4_reference_logits(hf.path(), prompt), vocab);
  // The Hugging Face directory loads to the same layers and arithmetic: the same bits.
  auto h = load(hf.path());
  ASSERT_TRUE(h);
  EXPECT_EQ(h->spec.n_leading_dense, m->spec.n_leading_dense);
  for (size_t il = 0; il < m->spec.layers.size(); ++il) {
    const model::LayerSpec &a = m->spec.layers[il], &b = h->spec.layers[il];
    EXPECT_EQ(std::tuple(a.is_moe, a.nope, a.chunk, a.qk_l2_norm),
              std::tuple(b.is_moe, b.nope, b.chunk, b.qk_l2_norm))
        << "layer " << il;
  }
  EXPECT_TRUE(bit_equal(prompt_logits(h, prompt), from_gguf));
}

// Chunks of 8 positions and a temperature that starts at position 3 and grows, so that a
// 30-token prompt crosses both; KV blocks of 4 and 16.
TEST(Llama4, ChunkedAttentionAndTemperatureMatchTheReference) {
  TempDir dir, hf;
  write_llama4_hf_twin(synth_llama4(dir, 9), hf, {.chunk = 8, .floor_scale = 4, .attn_scale = 0.5});
  auto m = load(hf.path());
  ASSERT_TRUE(m);
  EXPECT_EQ(m->spec.layers[0].chunk, 8);
  EXPECT_EQ(m->spec.attn_temp_floor, 4);
  const std::vector<int32_t> prompt = prompt_of(30, static_cast<int32_t>(m->spec.n_vocab), 11);
  expect_engine_near_reference(m, prompt, testing::llama4_reference_logits(hf.path(), prompt));
}

// Each of the two changes what it should and nothing else: chunks of 8 leave positions 0-7 as
// they are and change the later ones; a temperature floor of 4 leaves positions 0-2 and changes
// position 3 on.
TEST(Llama4, ChunksAndTemperatureEachActWhereTheyShould) {
  TempDir dir, plain, chunked, warm;
  const std::string gguf = synth_llama4(dir, 13);
  write_llama4_hf_twin(gguf, plain);
  write_llama4_hf_twin(gguf, chunked, {.chunk = 8});
  write_llama4_hf_twin(gguf, warm, {.floor_scale = 4, .attn_scale = 0.5});
  auto m = load(gguf);
  ASSERT_TRUE(m);
  const auto V = static_cast<size_t>(m->spec.n_vocab);
  const std::vector<int32_t> prompt = prompt_of(12, static_cast<int32_t>(V), 5);
  const std::vector<float> a = prompt_logits(plain.path(), prompt);
  auto same_rows = [&](const std::vector<float>& b, size_t r0, size_t r1) {
    return std::equal(a.begin() + static_cast<std::ptrdiff_t>(r0 * V),
                      a.begin() + static_cast<std::ptrdiff_t>(r1 * V),
                      b.begin() + static_cast<std::ptrdiff_t>(r0 * V));
  };
  const std::vector<float> c = prompt_logits(chunked.path(), prompt);
  EXPECT_TRUE(same_rows(c, 0, 8));
  for (size_t r = 8; r < 12; ++r) EXPECT_FALSE(same_rows(c, r, r + 1)) << "row " << r;
  const std::vector<float> w = prompt_logits(warm.path(), prompt);
  EXPECT_TRUE(same_rows(w, 0, 3));
  for (size_t r = 3; r < 12; ++r) EXPECT_FALSE(same_rows(w, r, r + 1)) << "row " << r;
  // Meta's configs say attn_temperature_tuning 4, which transformers takes as true; 0 is false.
  std::ifstream in(warm.file("config.json"));
  nlohmann::json cfg = nlohmann::json::parse(in);
  cfg["text_config"]["attn_temperature_tuning"] = 4;
  warm.write("config.json", cfg.dump());
  EXPECT_TRUE(bit_equal(prompt_logits(warm.path(), prompt), w));
  expect_near_reference(w, testing::llama4_reference_logits(warm.path(), prompt),
                        static_cast<int64_t>(V));
  cfg["text_config"]["attn_temperature_tuning"] = 0;
  warm.write("config.json", cfg.dump());
  EXPECT_TRUE(bit_equal(prompt_logits(warm.path(), prompt), a));
}

// A GGUF of 128 experts is Maverick's shape, whose q and k llama.cpp does not norm (its
// checkpoint's use_qk_norm is false): the same logits as the twin that says so.
TEST(Llama4, GgufOf128ExpertsNormsNoQk) {
  TempDir dir, hf;
  model::SynthOptions o;
  o.arch = "llama4";
  o.seed = 21;
  o.n_ctx = 256;
  o.n_embd = 64;
  o.n_expert = 128;
  const std::string gguf = dir.file("maverick.gguf");
  ASSERT_TRUE(model::synth_model(o, gguf).has_value());
  auto m = load(gguf);
  ASSERT_TRUE(m);
  for (const model::LayerSpec& L : m->spec.layers) EXPECT_FALSE(L.qk_l2_norm);
  write_llama4_hf_twin(gguf, hf, {.qk_norm = false});
  const std::vector<int32_t> prompt = prompt_of(15, static_cast<int32_t>(m->spec.n_vocab), 7);
  const std::vector<float> from_gguf = prompt_logits(m, prompt);
  expect_near_reference(from_gguf, testing::llama4_reference_logits(hf.path(), prompt),
                        m->spec.n_vocab);
  EXPECT_TRUE(bit_equal(prompt_logits(hf.path(), prompt), from_gguf));
}

// Maverick's form: no q/k norms (use_qk_norm false), MoE in every layer here, as a flat
// Llama4ForCausalLM checkpoint.
TEST(Llama4, WithoutQkNormAsCausalLmMatchesTheReference) {
  TempDir dir, hf;
  write_llama4_hf_twin(synth_llama4(dir, 3, 1), hf, {.causal_lm = true, .qk_norm = false});
  auto m = load(hf.path());
  ASSERT_TRUE(m);
  for (const model::LayerSpec& L : m->spec.layers) {
    EXPECT_FALSE(L.qk_l2_norm);
    EXPECT_TRUE(L.is_moe);
  }
  const std::vector<int32_t> prompt = prompt_of(19, static_cast<int32_t>(m->spec.n_vocab), 29);
  expect_near_reference(prompt_logits(m, prompt),
                        testing::llama4_reference_logits(hf.path(), prompt), m->spec.n_vocab);
}

// Batch invariance across chunk boundaries (chunks of 8, prefill steps of other sizes).
TEST(Llama4, ChunkedModelIsBatchInvariant) {
  TempDir dir, hf;
  write_llama4_hf_twin(synth_llama4(dir, 17), hf, {.chunk = 8, .floor_scale = 4});
  auto m = load(hf.path());
  ASSERT_TRUE(m);
  expect_batch_invariant(m);
}

TEST(Llama4, BadFilesAreRefusedByName) {
  TempDir dir, hf;
  const std::string gguf = synth_llama4(dir);
  write_llama4_hf_twin(gguf, hf, {.drop_router = true});
  EXPECT_NE(load_error(hf.path()).find(
                "missing tensor 'language_model.model.layers.1.feed_forward.router.weight'"),
            std::string::npos)
      << load_error(hf.path());
  const std::string no_chunks = testing::edited_gguf(dir, "no_chunks.gguf", gguf, [](auto& w) {
    w.set_u32("llama4.attention.sliding_window", 0);
  });
  EXPECT_NE(load_error(no_chunks).find("llama4 without chunked attention"), std::string::npos)
      << load_error(no_chunks);
  const std::string step0 = testing::edited_gguf(
      dir, "step0.gguf", gguf, [](auto& w) { w.set_u32("llama4.interleave_moe_layer_step", 0); });
  EXPECT_NE(load_error(step0).find("interleave_moe_layer_step 0 must be in 1..4"),
            std::string::npos)
      << load_error(step0);
  // A config whose layer lists do not fit.
  TempDir bad;
  write_llama4_hf_twin(gguf, bad);
  std::ifstream in(bad.file("config.json"));
  nlohmann::json c = nlohmann::json::parse(in);
  c["text_config"]["no_rope_layers"] = {1, 1, 0};
  bad.write("config.json", c.dump());
  EXPECT_NE(load_error(bad.path()).find("'no_rope_layers' must be a list of 4 entries"),
            std::string::npos)
      << load_error(bad.path());
  c["text_config"]["no_rope_layers"] = {1, 1, 1, 0};
  c["text_config"]["layer_types"] = {"chunked_attention", "sliding_attention", "full_attention",
                                     "full_attention"};
  bad.write("config.json", c.dump());
  EXPECT_NE(load_error(bad.path()).find("layer_types[1] is \"sliding_attention\""),
            std::string::npos)
      << load_error(bad.path());
}

}  // namespace
}  // namespace troupe::compute
