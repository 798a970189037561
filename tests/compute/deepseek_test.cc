// DeepSeek-V2 and V3 (multi-head latent attention, shared and routed experts) from Hugging Face
// checkpoints, against the independent float64 forward pass of tests/deepseek_reference.h. The
// reference is first held to the golden logits of ../shared's DeepSeek-V3-form model (llama.cpp's);
// then the engine is held to the reference on checkpoints written here, in the forms ../shared has
// no file of: DeepSeek-V2-Lite's (q not compressed, softmax routing without groups) and
// DeepSeek-V2's (groups ranked by their best score), and V3's with other head sizes.
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/model.h"
#include "model/synth.h"
#include "tests/compute/engine_test_util.h"
#include "tests/deepseek_reference.h"
#include "tests/safetensors_writer.h"
#include "tests/test_support.h"

namespace troupe::compute {
namespace {

using testing::StTensor;
using testing::TempDir;

// The reference against llama.cpp's logits of the same weights (the GGUF form of
// ../shared/models/hf/deepseek2): every position of every golden case.
TEST(DeepseekReference, ReproducesTheGoldenLogits) {
  TROUPE_SHARED_OR_SKIP(shared);
  const std::string golden = shared + "/golden/deepseek2";
  for (const char* name : {"bos_only", "once_upon_a_time", "the_little_dog"}) {
    SCOPED_TRACE(name);
    const std::string dir = golden + "/" + name;
    const auto j = nlohmann::json::parse(testing::read_text_file(dir + "/case.json"));
    std::vector<int32_t> tokens = j.at("prompt_tokens").get<std::vector<int32_t>>();
    for (int32_t t : j.at("greedy_tokens").get<std::vector<int32_t>>()) tokens.push_back(t);
    ASSERT_EQ(static_cast<int64_t>(tokens.size()), j.at("n_positions").get<int64_t>());
    const std::vector<float> want = testing::read_f32_file(dir + "/logits.f32");
    const std::vector<double> ref =
        testing::deepseek_reference_logits(shared + "/models/hf/deepseek2", tokens);
    expect_near_reference(want, ref, j.at("vocab").get<int64_t>());
  }
}

// A checkpoint's shape. Head sizes differ from one another (nope + rope != kv_lora + rope,
// v != nope) so that a mix-up of any two shows.
struct DsForm {
  const char* arch = "DeepseekV3ForCausalLM";
  int64_t q_lora = 40;  // 0: q_proj (q not compressed)
  bool softmax = false;
  const char* topk_method = "noaux_tc";
  int64_t n_group = 4, topk_group = 2;
  bool norm_topk = true;
  double routed_scale = 2.5;
  int64_t shared = 1;
  bool bias = true;  // mlp.gate.e_score_correction_bias
  bool interleave = true;
  double rope_theta = 10000;
  nlohmann::json rope_scaling = nullptr;  // none
};

constexpr int64_t kVocab = 96, kE = 64, kLayers = 3, kHeads = 4, kNope = 16, kRope = 8, kV = 12,
                  kKvLora = 28, kI = 80, kF = 24, kExperts = 16, kUsed = 3;

/// Writes config.json and model.safetensors of a random-weight checkpoint of form f (F32; the
/// first layer dense) into dir.
void write_checkpoint(const TempDir& dir, const DsForm& f, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::vector<StTensor> t;
  auto put = [&](const std::string& name, std::vector<int64_t> shape, float lo, float hi) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = u(rng);
    std::string bytes(v.size() * sizeof(float), '\0');
    std::memcpy(bytes.data(), v.data(), bytes.size());
    t.push_back({name, "F32", std::move(shape), std::move(bytes)});
  };
  // A Linear [out, in] of weights within +-1/sqrt(in) (scaled so activations keep their size).
  auto linear = [&](const std::string& name, int64_t out, int64_t in, float gain = 1.7f) {
    const float a = gain / std::sqrt(static_cast<float>(in));
    put(name, {out, in}, -a, a);
  };
  auto norm = [&](const std::string& name, int64_t n) { put(name, {n}, 0.8f, 1.2f); };
  auto mlp = [&](const std::string& p, int64_t width) {
    linear(p + "gate_proj.weight", width, kE);
    linear(p + "up_proj.weight", width, kE);
    linear(p + "down_proj.weight", kE, width);
  };
  put("model.embed_tokens.weight", {kVocab, kE}, -1.f, 1.f);
  for (int64_t l = 0; l < kLayers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".", a = p + "self_attn.";
    norm(p + "input_layernorm.weight", kE);
    if (f.q_lora > 0) {
      linear(a + "q_a_proj.weight", f.q_lora, kE);
      norm(a + "q_a_layernorm.weight", f.q_lora);
      linear(a + "q_b_proj.weight", kHeads * (kNope + kRope), f.q_lora);
    } else {
      linear(a + "q_proj.weight", kHeads * (kNope + kRope), kE);
    }
    linear(a + "kv_a_proj_with_mqa.weight", kKvLora + kRope, kE);
    norm(a + "kv_a_layernorm.weight", kKvLora);
    linear(a + "kv_b_proj.weight", kHeads * (kNope + kV), kKvLora);
    linear(a + "o_proj.weight", kE, kHeads * kV);
    norm(p + "post_attention_layernorm.weight", kE);
    if (l == 0) {
      mlp(p + "mlp.", kI);
      continue;
    }
    linear(p + "mlp.gate.weight", kExperts, kE, 6.f);  // spread scores: groups and picks differ
    if (f.bias) put(p + "mlp.gate.e_score_correction_bias", {kExperts}, -0.05f, 0.05f);
    for (int64_t e = 0; e < kExperts; ++e) mlp(p + "mlp.experts." + std::to_string(e) + ".", kF);
    if (f.shared > 0) mlp(p + "mlp.shared_experts.", kF * f.shared);
  }
  norm("model.norm.weight", kE);
  linear("lm_head.weight", kVocab, kE);

  nlohmann::json c = {{"architectures", {f.arch}},
                      {"vocab_size", kVocab},
                      {"hidden_size", kE},
                      {"num_hidden_layers", kLayers},
                      {"num_attention_heads", kHeads},
                      {"num_key_value_heads", kHeads},
                      {"max_position_embeddings", 256},
                      {"rms_norm_eps", 1e-6},
                      {"rope_theta", f.rope_theta},
                      {"rope_scaling", f.rope_scaling},
                      {"tie_word_embeddings", false},
                      {"hidden_act", "silu"},
                      {"q_lora_rank", f.q_lora > 0 ? nlohmann::json(f.q_lora) : nlohmann::json()},
                      {"kv_lora_rank", kKvLora},
                      {"qk_nope_head_dim", kNope},
                      {"qk_rope_head_dim", kRope},
                      {"v_head_dim", kV},
                      {"rope_interleave", f.interleave},
                      {"attention_bias", false},
                      {"intermediate_size", kI},
                      {"moe_intermediate_size", kF},
                      {"first_k_dense_replace", 1},
                      {"moe_layer_freq", 1},
                      {"n_routed_experts", kExperts},
                      {"num_experts_per_tok", kUsed},
                      {"n_shared_experts", f.shared},
                      {"n_group", f.n_group},
                      {"topk_group", f.topk_group},
                      {"topk_method", f.topk_method},
                      {"scoring_func", f.softmax ? "softmax" : "sigmoid"},
                      {"norm_topk_prob", f.norm_topk},
                      {"routed_scaling_factor", f.routed_scale}};
  dir.write("config.json", c.dump(2));
  dir.write("model.safetensors", testing::safetensors_image(t));
}

// The engine's logits of the checkpoint (each chunking expect_engine_near_reference tries) against
// the reference's.
void check_form(const DsForm& f, uint64_t seed) {
  TempDir dir;
  write_checkpoint(dir, f, seed);
  auto m = model::load_model(dir.path());
  ASSERT_TRUE(m.has_value()) << m.error().message;
  ASSERT_TRUE((*m)->spec.is_mla());
  const std::vector<int32_t> prompt = prompt_of(24, static_cast<int32_t>(kVocab), 29);
  expect_engine_near_reference(*m, prompt, testing::deepseek_reference_logits(dir.path(), prompt));
}

TEST(Deepseek, V3FormMatchesTheReference) { check_form({}, 1); }

TEST(Deepseek, V3FormWithRotaryHalvesMatchesTheReference) { check_form({.interleave = false}, 2); }

// YaRN as DeepSeek states it (modeling_deepseek.py's DeepseekV2YarnRotaryEmbedding). A small
// rope_theta and original context put the correction range inside the 4 rotary pairs, so the
// ramp blends some pairs' frequencies and keeps or divides the others; positions run past the
// original context. mscale != mscale_all_dim multiplies cos and sin, mscale_all_dim the softmax
// scale (its square).
TEST(Deepseek, V3FormWithYarnMatchesTheReference) {
  const nlohmann::json yarn = {{"type", "yarn"},
                               {"factor", 4.0},
                               {"beta_fast", 32},
                               {"beta_slow", 1},
                               {"mscale", 1.0},
                               {"mscale_all_dim", 0.707},
                               {"original_max_position_embeddings", 16}};
  check_form({.rope_theta = 100, .rope_scaling = yarn}, 7);
  // DeepSeek-V3's own values: mscale and mscale_all_dim both 1 (cos and sin unscaled).
  nlohmann::json v3 = yarn;
  v3["mscale_all_dim"] = 1.0;
  v3["rope_type"] = "yarn";
  v3.erase("type");
  check_form({.rope_theta = 100, .rope_scaling = v3}, 8);
}

// DeepSeek-V2-Lite (and Moonlight): q not compressed, softmax scores, plain top-k, weights neither
// normalized nor scaled, two shared experts, no selection bias.
TEST(Deepseek, V2LiteFormMatchesTheReference) {
  check_form({.arch = "DeepseekV2ForCausalLM",
              .q_lora = 0,
              .softmax = true,
              .topk_method = "greedy",
              .n_group = 1,
              .topk_group = 1,
              .norm_topk = false,
              .routed_scale = 1.0,
              .shared = 2,
              .bias = false},
             3);
}

// DeepSeek-V2 and V2.5: groups ranked by their best softmax score (not V3's two best summed), the
// weights scaled by routed_scaling_factor and not normalized.
TEST(Deepseek, V2FormWithGroupLimitedGreedyMatchesTheReference) {
  check_form({.arch = "DeepseekV2ForCausalLM",
              .softmax = true,
              .topk_method = "group_limited_greedy",
              .topk_group = 1,  // all picks from one group: the ranking rule decides which
              .norm_topk = false,
              .routed_scale = 16.0,
              .bias = false},
             4);
}

// V2's gate renormalizes or scales, never both: with norm_topk_prob its routed_scaling_factor is
// not applied.
TEST(Deepseek, V2FormWithNormalizedWeightsIgnoresTheScale) {
  check_form({.arch = "DeepseekV2ForCausalLM",
              .q_lora = 0,
              .softmax = true,
              .topk_method = "greedy",
              .norm_topk = true,
              .routed_scale = 16.0,
              .bias = false},
             5);
}

// A GGUF file has no topk_method: a softmax-gated deepseek2 file is DeepSeek-V2 (V3 gates by
// sigmoid), so its groups are ranked by their best score. A softmax model must then route as a
// top-two-sum ranking would not: the same weights under both rules give different logits.
TEST(Deepseek, SoftmaxGatedGgufRanksGroupsByTheirBestScore) {
  TempDir dir;
  model::SynthOptions o;
  o.arch = "deepseek2";
  o.seed = 12;
  o.n_ctx = 256;
  o.n_expert = 16;
  o.n_expert_used = 3;
  o.n_group = 4;
  o.n_group_used = 1;
  o.gating = "softmax";
  ASSERT_TRUE(model::synth_model(o, dir.file("v2.gguf")).has_value());
  o.gating = "sigmoid";
  ASSERT_TRUE(model::synth_model(o, dir.file("v3.gguf")).has_value());
  auto v2 = model::load_model(dir.file("v2.gguf"));
  auto v3 = model::load_model(dir.file("v3.gguf"));
  ASSERT_TRUE(v2.has_value() && v3.has_value());
  EXPECT_EQ((*v2)->spec.group_score, model::GroupScore::kMax);
  EXPECT_EQ((*v3)->spec.group_score, model::GroupScore::kTopTwoSum);
  auto as_v3 = std::make_shared<model::Model>(**v2);  // the same views, V3's ranking
  as_v3->spec.group_score = model::GroupScore::kTopTwoSum;
  const std::vector<int32_t> prompt = prompt_of(24, static_cast<int32_t>((*v2)->spec.n_vocab), 29);
  EXPECT_FALSE(bit_equal(prompt_logits(*v2, prompt), prompt_logits(as_v3, prompt)));
}

TEST(Deepseek, UnknownTopkMethodIsRefusedByName) {
  TempDir dir;
  write_checkpoint(dir, {.topk_method = "sinkhorn"}, 6);
  auto m = model::load_model(dir.path());
  ASSERT_FALSE(m.has_value());
  EXPECT_NE(m.error().message.find("topk_method 'sinkhorn' is not supported"), std::string::npos)
      << m.error().message;
}

}  // namespace
}  // namespace troupe::compute
