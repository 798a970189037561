// Baidu's ERNIE 4.5 (GGUF ernie4_5 and ernie4_5-moe; Hugging Face Ernie4_5ForCausalLM and
// Ernie4_5_MoeForCausalLM) through the engine: synthesized GGUF files in llama.cpp's conventions
// and their Hugging Face twins against the independent float64 forward pass of
// tests/hf_moe_reference.h, and stories260K written as a dense ERNIE model against its own
// logits (which the golden tests hold to ../shared's reference). What ERNIE adds to Llama's
// decoder: rotary over interleaved pairs in the Hugging Face form (transformers' rotate_half on
// x[0::2], x[1::2]), a softmax router whose choice adds a selection bias (moe_statics) but whose
// weights do not, renormalized; ungated shared experts; experts in the layers from
// moe_layer_start_index to moe_layer_end_index, every moe_layer_interval-th.
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/gguf.h"
#include "model/model.h"
#include "model/synth.h"
#include "tests/compute/engine_test_util.h"
#include "tests/edited_model.h"
#include "tests/hf_moe_reference.h"
#include "tests/hf_twin_model.h"
#include "tests/test_support.h"

namespace troupe::compute {
namespace {

using testing::TempDir;
using testing::write_hf_twin;

std::string synth_ernie(const TempDir& dir, uint64_t seed,
                        const std::function<void(model::SynthOptions&)>& edit = {}) {
  model::SynthOptions o;
  o.arch = "ernie4_5-moe";
  o.seed = seed;
  o.n_ctx = 256;
  o.n_expert_used = 3;  // 21B-A3B picks 6 of 64: more than two, so the renormalization shows
  if (edit) edit(o);
  const std::string path = dir.file("ernie.gguf");
  const Status st = model::synth_model(o, path);
  EXPECT_TRUE(st.has_value()) << st.error().message;
  return path;
}

/// config.json of the Hugging Face directory `dir`, edited by `edit`, written back.
void edit_config(const TempDir& dir, const std::function<void(nlohmann::json&)>& edit) {
  std::ifstream in(dir.file("config.json"));
  nlohmann::json c = nlohmann::json::parse(in);
  edit(c);
  dir.write("config.json", c.dump(2));
}

TEST(Ernie45, GgufMapsAsLlamaCpp) {
  TempDir dir;
  auto m = model::load_model(synth_ernie(dir, 3));
  ASSERT_TRUE(m.has_value()) << m.error().message;
  const model::ModelSpec& s = (*m)->spec;
  EXPECT_EQ(s.arch, model::Arch::kLlama);
  EXPECT_EQ(s.rope_style, model::RopeStyle::kNormal);
  EXPECT_EQ(s.n_rot, s.head_dim_k);
  EXPECT_EQ(s.head_dim_k, s.n_embd / s.n_head);
  EXPECT_EQ(s.gating, model::Gating::kSoftmax);
  EXPECT_TRUE(s.norm_topk);
  EXPECT_EQ(s.n_expert_used, 3);
  EXPECT_EQ(s.n_leading_dense, 1);
  EXPECT_EQ(s.output.data, s.token_embd.data);  // tied, as ERNIE-4.5-21B-A3B
  ASSERT_EQ(s.layers.size(), 4u);
  EXPECT_FALSE(s.layers[0].is_moe);
  EXPECT_TRUE(s.layers[0].ffn_gate.present());
  for (size_t il = 1; il < 4; ++il) {
    const model::LayerSpec& L = s.layers[il];
    EXPECT_TRUE(L.is_moe) << il;
    EXPECT_TRUE(L.router_bias.present()) << il;
    EXPECT_EQ(L.shared.gate.rows(), 2 * s.n_ff_exp) << il;  // two shared experts, one MLP
    EXPECT_FALSE(L.shared_gate.present()) << il;
    EXPECT_FALSE(L.bq.present()) << il;
  }
}

// No golden case exists for ERNIE: the engine's logits are held to the float64 forward pass of
// the Hugging Face form, which transformers' semantics were written into independently.
TEST(Ernie45, MoeMatchesTheFloat64ReferenceFromGgufAndHf) {
  TempDir dir, hf;
  const std::string gguf = synth_ernie(dir, 5);
  write_hf_twin(gguf, hf);
  auto m = model::load_model(gguf);
  ASSERT_TRUE(m.has_value()) << m.error().message;
  const int32_t vocab = static_cast<int32_t>((*m)->spec.n_vocab);
  const std::vector<int32_t> prompt = prompt_of(33, vocab, 41);
  const std::vector<double> ref = testing::ernie45_reference_logits(hf.path(), prompt);
  expect_engine_near_reference(*m, prompt, ref);
  auto h = model::load_model(hf.path());
  ASSERT_TRUE(h.has_value()) << h.error().message;
  EXPECT_EQ((*h)->spec.rope_style, model::RopeStyle::kNormal);
  EXPECT_EQ((*h)->spec.output.data, (*h)->spec.token_embd.data);
  EXPECT_TRUE(bit_equal(prompt_logits(*h, prompt), prompt_logits(*m, prompt)));
}

// The rotation is what tells the two forms apart: read as Llama's (NeoX on the rows as stored),
// the same checkpoint gives logits far from the reference.
TEST(Ernie45, NeoxRotationWouldBeWrong) {
  TempDir dir, hf;
  write_hf_twin(synth_ernie(dir, 7), hf);
  auto m = model::load_model(hf.path());
  ASSERT_TRUE(m.has_value()) << m.error().message;
  auto spec = std::make_shared<model::Model>(**m);
  spec->spec.rope_style = model::RopeStyle::kNeox;
  const int32_t vocab = static_cast<int32_t>((*m)->spec.n_vocab);
  const std::vector<int32_t> prompt = prompt_of(12, vocab, 9);
  const std::vector<double> ref = testing::ernie45_reference_logits(hf.path(), prompt);
  const std::vector<float> wrong = prompt_logits(spec, prompt);
  double worst = 0, max_ref = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    worst = std::max(worst, std::fabs(wrong[i] - ref[i]));
    max_ref = std::max(max_ref, std::fabs(ref[i]));
  }
  EXPECT_GT(worst, 1e-2 * max_ref);
}

// Experts every second layer from the first (moe_layer_interval 2: layers 1 and 3), no shared
// experts, no leading dense layer; and a checkpoint without moe_statics (moe_use_aux_free
// false), which transformers routes with a zero bias.
TEST(Ernie45, InterleavedMoeLayersWithoutSharedExpertsOrBias) {
  TempDir dir, hf, plain;
  const std::string gguf = synth_ernie(dir, 11, [](model::SynthOptions& o) {
    o.moe_layer_step = 2;
    o.n_dense_lead = 0;
    o.n_expert_shared = 0;
  });
  write_hf_twin(gguf, hf);
  auto m = model::load_model(hf.path());
  ASSERT_TRUE(m.has_value()) << m.error().message;
  const model::ModelSpec& s = (*m)->spec;
  for (size_t il = 0; il < 4; ++il) EXPECT_EQ(s.layers[il].is_moe, il % 2 == 1) << il;
  EXPECT_FALSE(s.layers[1].shared.gate.present());
  const int32_t vocab = static_cast<int32_t>(s.n_vocab);
  const std::vector<int32_t> prompt = prompt_of(21, vocab, 13);
  expect_engine_near_reference(*m, prompt, testing::ernie45_reference_logits(hf.path(), prompt));
  EXPECT_TRUE(bit_equal(prompt_logits(gguf, prompt), prompt_logits(*m, prompt)));

  write_hf_twin(gguf, plain, {.router_bias = false});
  edit_config(plain, [](nlohmann::json& c) { c["moe_use_aux_free"] = false; });
  auto p = model::load_model(plain.path());
  ASSERT_TRUE(p.has_value()) << p.error().message;
  EXPECT_FALSE((*p)->spec.layers[1].router_bias.present());
  expect_engine_near_reference(*p, prompt, testing::ernie45_reference_logits(plain.path(), prompt));
  EXPECT_FALSE(bit_equal(prompt_logits(*p, prompt), prompt_logits(*m, prompt)));
}

// moe_layer_end_index: layers after it are dense, so a checkpoint with experts there but no
// dense MLP is refused by the name of the missing tensor (and within it, it loads).
TEST(Ernie45, MoeLayerEndIndexEndsTheExperts) {
  TempDir dir, hf;
  write_hf_twin(synth_ernie(dir, 13), hf);
  edit_config(hf, [](nlohmann::json& c) { c["moe_layer_end_index"] = 2; });
  const std::string err = load_error(hf.path());
  EXPECT_NE(err.find("model.layers.3.mlp.gate_proj.weight"), std::string::npos) << err;
  edit_config(hf, [](nlohmann::json& c) { c["moe_layer_end_index"] = 3; });
  EXPECT_EQ(load_error(hf.path()), "loaded");
}

TEST(Ernie45, BatchInvariant) {
  TempDir dir;
  auto m = model::load_model(synth_ernie(dir, 17));
  ASSERT_TRUE(m.has_value()) << m.error().message;
  expect_batch_invariant(*m);
}

// ERNIE-4.5-0.3B's shape: a dense decoder whose heads are twice n_embd / n_head wide.
TEST(Ernie45, DenseWithWideHeadsMatchesTheReference) {
  TempDir dir, hf;
  model::SynthOptions o;
  o.arch = "ernie4_5";
  o.seed = 19;
  o.n_ctx = 256;
  const std::string gguf = dir.file("dense.gguf");
  ASSERT_TRUE(model::synth_model(o, gguf).has_value());
  write_hf_twin(gguf, hf);
  auto m = model::load_model(hf.path());
  ASSERT_TRUE(m.has_value()) << m.error().message;
  EXPECT_EQ((*m)->spec.head_dim_k, 2 * (*m)->spec.n_embd / (*m)->spec.n_head);
  EXPECT_EQ((*m)->spec.n_expert, 0);
  const int32_t vocab = static_cast<int32_t>((*m)->spec.n_vocab);
  const std::vector<int32_t> prompt = prompt_of(25, vocab, 31);
  expect_engine_near_reference(*m, prompt, testing::ernie45_reference_logits(hf.path(), prompt));
  EXPECT_TRUE(bit_equal(prompt_logits(gguf, prompt), prompt_logits(*m, prompt)));
  // Without head_dim in config.json the dense class's default, 128, applies: a shape error.
  edit_config(hf, [](nlohmann::json& c) { c.erase("head_dim"); });
  const std::string err = load_error(hf.path());
  EXPECT_NE(err.find("q_proj"), std::string::npos) << err;
}

// stories260K is a Llama model whose GGUF rows llama.cpp permuted for its pair rotation: the
// same rows under GGUF arch ernie4_5, and as an Ernie4_5ForCausalLM checkpoint (whose rotation
// pairs neighbours), are the same model, bit for bit; the float64 reference of the ERNIE form
// agrees.
TEST(Ernie45, StoriesAsErnieGivesItsLogits) {
  TROUPE_SHARED_OR_SKIP(shared);
  const std::string src = shared + "/models/stories260K/stories260K.gguf";
  TempDir dir, hf;
  auto llama = model::GgufFile::open(src);
  ASSERT_TRUE(llama.has_value());
  const std::string gguf = testing::edited_gguf(dir, "ernie.gguf", src, [&](model::GgufWriter& w) {
    w.set_string("general.architecture", "ernie4_5");
    for (const auto& [key, value] : (*llama)->metadata())
      if (key.starts_with("llama.")) w.copy_value("ernie4_5." + key.substr(6), value);
  });
  auto m = model::load_model(gguf);
  ASSERT_TRUE(m.has_value()) << m.error().message;
  const int32_t vocab = static_cast<int32_t>((*m)->spec.n_vocab);
  const std::vector<int32_t> prompt = prompt_of(40, vocab, 23);
  const std::vector<float> want = prompt_logits(src, prompt);
  EXPECT_TRUE(bit_equal(prompt_logits(*m, prompt), want));
  write_hf_twin(gguf, hf);
  EXPECT_TRUE(bit_equal(prompt_logits(hf.path(), prompt), want));
  expect_near_reference(want, testing::ernie45_reference_logits(hf.path(), prompt), vocab);
}

TEST(Ernie45, UnsupportedOrBrokenSettingsAreRefusedByName) {
  TempDir dir;
  const std::string gguf = synth_ernie(dir, 29);
  const std::pair<const char*, nlohmann::json> cases[] = {
      {"use_bias", true},        {"moe_gate_act", "sigmoid"},    {"moe_k", 9},
      {"moe_layer_interval", 0}, {"moe_num_shared_experts", -1},
  };
  for (const auto& setting : cases) {  // (not bound by name: clang 14 cannot capture bindings)
    const char* key = setting.first;
    TempDir hf;
    write_hf_twin(gguf, hf);
    edit_config(hf, [&](nlohmann::json& c) { c[key] = setting.second; });
    const std::string err = load_error(hf.path());
    EXPECT_NE(err.find(key), std::string::npos) << key << ": " << err;
  }
  // GGUF: ernie4_5-moe needs its interleave step; a dense ernie4_5 file has no experts.
  const std::string no_step = testing::edited_gguf(
      dir, "no_step.gguf", gguf,
      [](model::GgufWriter& w) { w.remove_key("ernie4_5-moe.interleave_moe_layer_step"); });
  EXPECT_NE(load_error(no_step).find("interleave_moe_layer_step"), std::string::npos)
      << load_error(no_step);
  const std::string as_dense =
      testing::edited_gguf(dir, "dense.gguf", gguf, [&](model::GgufWriter& w) {
        w.set_string("general.architecture", "ernie4_5");
        auto f = model::GgufFile::open(gguf);
        for (const auto& [key, value] : (*f)->metadata())
          if (key.starts_with("ernie4_5-moe.")) w.copy_value("ernie4_5." + key.substr(13), value);
      });
  EXPECT_NE(load_error(as_dense).find("a dense ernie4_5 model with 8 experts"), std::string::npos)
      << load_error(as_dense);
}

}  // namespace
}  // namespace troupe::compute
