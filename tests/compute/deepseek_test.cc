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
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/gguf_writer.h"
#include "model/model.h"
#include "model/synth.h"
#include "tests/compute/engine_test_util.h"
#include "tests/deepseek_reference.h"
#include "tests/edited_model.h"
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
  int64_t used = 3;  // num_experts_per_tok
  bool norm_topk = true;
  double routed_scale = 2.5;
  int64_t shared = 1;
  bool bias = true;  // mlp.gate.e_score_correction_bias
  bool interleave = true;
  double rope_theta = 10000;
  nlohmann::json rope_scaling = nullptr;  // none
};

constexpr int64_t kVocab = 96, kE = 64, kLayers = 3, kHeads = 4, kNope = 16, kRope = 8, kV = 12,
                  kKvLora = 28, kI = 80, kF = 24, kExperts = 16;

/// Random F32 weights of form f (the first layer dense) under DeepSeek's tensor names.
std::vector<StTensor> checkpoint_tensors(const DsForm& f, uint64_t seed) {
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
  // A Linear [out, in] of weights within +-gain/sqrt(in) (activations keep their size).
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
  return t;
}

/// config.json of form f.
nlohmann::json checkpoint_config(const DsForm& f) {
  return {{"architectures", {f.arch}},
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
          {"num_experts_per_tok", f.used},
          {"n_shared_experts", f.shared},
          {"n_group", f.n_group},
          {"topk_group", f.topk_group},
          {"topk_method", f.topk_method},
          {"scoring_func", f.softmax ? "softmax" : "sigmoid"},
          {"norm_topk_prob", f.norm_topk},
          {"routed_scaling_factor", f.routed_scale}};
}

void write_checkpoint(const TempDir& dir, const DsForm& f, uint64_t seed) {
  dir.write("config.json", checkpoint_config(f).dump(2));
  dir.write("model.safetensors", testing::safetensors_image(checkpoint_tensors(f, seed)));
}

using ModelPtr = std::shared_ptr<const model::Model>;

// The engine's logits of a checkpoint of form f (each chunking expect_engine_near_reference
// tries) against the reference's; returns the model (null when it did not load).
ModelPtr check_form(const DsForm& f, uint64_t seed, const std::vector<int32_t>& prompt) {
  TempDir dir;
  write_checkpoint(dir, f, seed);
  auto m = model::load_model(dir.path());
  EXPECT_TRUE(m.has_value()) << m.error().message;
  if (!m) return nullptr;
  EXPECT_TRUE((*m)->spec.is_mla());
  expect_engine_near_reference(*m, prompt, testing::deepseek_reference_logits(dir.path(), prompt));
  return *m;
}
ModelPtr check_form(const DsForm& f, uint64_t seed) {
  return check_form(f, seed, prompt_of(24, static_cast<int32_t>(kVocab), 29));
}

// The same weights routed with the other group ranking give other logits: the ranking mattered.
void expect_ranking_matters(const ModelPtr& m, const std::vector<int32_t>& prompt) {
  auto other = std::make_shared<model::Model>(*m);  // the same views
  other->spec.group_score = m->spec.group_score == model::GroupScore::kMax
                                ? model::GroupScore::kTopTwoSum
                                : model::GroupScore::kMax;
  EXPECT_FALSE(bit_equal(prompt_logits(m, prompt), prompt_logits(other, prompt)));
}

TEST(Deepseek, V3FormMatchesTheReference) {
  const std::vector<int32_t> prompt = prompt_of(24, static_cast<int32_t>(kVocab), 29);
  const ModelPtr m = check_form({.topk_group = 1}, 1, prompt);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->spec.group_score, model::GroupScore::kTopTwoSum);
  EXPECT_FLOAT_EQ(m->spec.routed_scale, 2.5f);
  EXPECT_TRUE(m->spec.norm_topk);
  expect_ranking_matters(m, prompt);
}

TEST(Deepseek, V3FormWithRotaryHalvesMatchesTheReference) { check_form({.interleave = false}, 2); }

// YaRN as DeepSeek states it (modeling_deepseek.py's DeepseekV2YarnRotaryEmbedding).
// mscale != mscale_all_dim multiplies cos and sin, mscale_all_dim the softmax scale (squared).
TEST(Deepseek, V3FormWithYarnMatchesTheReference) {
  // rope_theta 100, an original context of 16 and beta_slow 0.05 spread the correction range
  // over all 4 rotary pairs: the ramp is 0, 1/7, 2/7, 3/7, so pairs 1-3 are blends.
  const nlohmann::json yarn = {{"type", "yarn"},
                               {"factor", 4.0},
                               {"beta_fast", 32},
                               {"beta_slow", 0.05},
                               {"mscale", 1.0},
                               {"mscale_all_dim", 0.707},
                               {"original_max_position_embeddings", 16}};
  check_form({.rope_theta = 100, .rope_scaling = yarn}, 7);
  // DeepSeek-V3's own values: mscale and mscale_all_dim both 1 (cos and sin unscaled); beta_slow
  // 1 makes the ramp 0, 1, 1, 1 (pair 0 kept, the others divided by the factor).
  nlohmann::json v3 = yarn;
  v3["mscale_all_dim"] = 1.0;
  v3["beta_slow"] = 1;
  v3["rope_type"] = "yarn";
  v3.erase("type");
  check_form({.rope_theta = 100, .rope_scaling = v3}, 8);
}

// DeepSeek-V2-Lite: q not compressed, softmax scores, plain top-k, weights neither normalized nor
// scaled, two shared experts, no selection bias.
TEST(Deepseek, V2LiteFormMatchesTheReference) {
  const ModelPtr m = check_form({.arch = "DeepseekV2ForCausalLM",
                                 .q_lora = 0,
                                 .softmax = true,
                                 .topk_method = "greedy",
                                 .norm_topk = false,
                                 .routed_scale = 1.0,
                                 .shared = 2,
                                 .bias = false},
                                3);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->spec.n_group, 1);  // greedy: no group limit, whatever n_group says
}

// DeepSeek-V2 and V2.5: groups ranked by their best softmax score (not V3's two best summed), the
// weights scaled by routed_scaling_factor and not normalized.
TEST(Deepseek, V2FormWithGroupLimitedGreedyMatchesTheReference) {
  const std::vector<int32_t> prompt = prompt_of(24, static_cast<int32_t>(kVocab), 29);
  const ModelPtr m = check_form({.arch = "DeepseekV2ForCausalLM",
                                 .softmax = true,
                                 .topk_method = "group_limited_greedy",
                                 .topk_group = 1,  // all picks from one group: the rank decides
                                 .norm_topk = false,
                                 .routed_scale = 16.0,
                                 .bias = false},
                                4, prompt);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->spec.group_score, model::GroupScore::kMax);
  EXPECT_FLOAT_EQ(m->spec.routed_scale, 16.f);
  expect_ranking_matters(m, prompt);
}

// V2's gate renormalizes or scales, never both: with norm_topk_prob (and more than one expert) its
// routed_scaling_factor is not applied; with one expert per token it is, and nothing is
// renormalized.
TEST(Deepseek, V2FormRenormalizesOrScalesNeverBoth) {
  const DsForm v2{.arch = "DeepseekV2ForCausalLM",
                  .q_lora = 0,
                  .softmax = true,
                  .topk_method = "greedy",
                  .norm_topk = true,
                  .routed_scale = 16.0,
                  .bias = false};
  const ModelPtr normalized = check_form(v2, 5);
  ASSERT_TRUE(normalized);
  EXPECT_TRUE(normalized->spec.norm_topk);
  EXPECT_FLOAT_EQ(normalized->spec.routed_scale, 1.f);
  DsForm one = v2;
  one.used = 1;
  const ModelPtr scaled = check_form(one, 5);
  ASSERT_TRUE(scaled);
  EXPECT_FALSE(scaled->spec.norm_topk);
  EXPECT_FLOAT_EQ(scaled->spec.routed_scale, 16.f);
}

// A GGUF file has no topk_method: a softmax-gated deepseek2 file is DeepSeek-V2 (V3 gates by
// sigmoid), so its groups are ranked by their best score and its gate renormalizes or scales.
TEST(Deepseek, SoftmaxGatedGgufIsDeepseekV2) {
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
  o.expert_weights_norm = true;
  o.expert_weights_scale = 16.0;
  ASSERT_TRUE(model::synth_model(o, dir.file("v2.gguf")).has_value());
  o.gating = "sigmoid";
  ASSERT_TRUE(model::synth_model(o, dir.file("v3.gguf")).has_value());
  auto v2 = model::load_model(dir.file("v2.gguf"));
  auto v3 = model::load_model(dir.file("v3.gguf"));
  ASSERT_TRUE(v2.has_value() && v3.has_value());
  EXPECT_EQ((*v2)->spec.group_score, model::GroupScore::kMax);
  EXPECT_FLOAT_EQ((*v2)->spec.routed_scale, 1.f);
  EXPECT_EQ((*v3)->spec.group_score, model::GroupScore::kTopTwoSum);
  EXPECT_FLOAT_EQ((*v3)->spec.routed_scale, 16.f);
  expect_ranking_matters(*v2, prompt_of(24, static_cast<int32_t>((*v2)->spec.n_vocab), 29));
  // More experts per token than the kept groups hold is refused (V2 would weight some by 0).
  const std::string bad = testing::edited_gguf(
      dir, "bad.gguf", dir.file("v2.gguf"),
      [](model::GgufWriter& w) { w.set_u32("deepseek2.expert_group_count", 8); });
  EXPECT_NE(load_error(bad).find("3 experts per token, but the 1 kept groups hold only 2"),
            std::string::npos)
      << load_error(bad);
}

// Each family's gate knows its own methods only: others are refused by name.
TEST(Deepseek, TopkMethodsOutsideTheFamilyAreRefusedByName) {
  const std::pair<DsForm, const char*> cases[] = {
      {{.topk_method = "sinkhorn"}, "topk_method 'sinkhorn' is not supported for DeepSeek-V3"},
      {{.topk_method = "group_limited_greedy"},
       "topk_method 'group_limited_greedy' is not supported for DeepSeek-V3 (noaux_tc)"},
      {{.arch = "DeepseekV2ForCausalLM", .softmax = true, .topk_method = "noaux_tc"},
       "topk_method 'noaux_tc' is not supported for DeepSeek-V2 (greedy, group_limited_greedy)"}};
  for (const auto& [form, want] : cases) {
    TempDir dir;
    write_checkpoint(dir, form, 6);
    EXPECT_NE(load_error(dir.path()).find(want), std::string::npos) << load_error(dir.path());
  }
}

}  // namespace
}  // namespace troupe::compute
