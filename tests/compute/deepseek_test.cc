// DeepSeek-V2 and V3 (multi-head latent attention, shared and routed experts) from Hugging Face
// checkpoints, against the independent float64 forward pass of tests/deepseek_reference.h. The
// reference is first held to the golden logits of ../shared's DeepSeek-V3-form model (llama.cpp's);
// then the engine is held to the reference on checkpoints written here, in the forms ../shared has
// no file of: DeepSeek-V2-Lite's (q not compressed, softmax routing without groups) and
// DeepSeek-V2's (groups ranked by their best score), and V3's with other head sizes.
#include <cstdint>
#include <cstring>
#include <map>
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
  // DeepSeek-V3.2's indexer (with arch DeepseekV32ForCausalLM): positions a query keeps (0: no
  // indexer), its heads and their width.
  int64_t index_topk = 0, index_heads = 3, index_dim = 12;
  // GLM-5.2's indexer_types (GlmMoeDsaForCausalLM): a "shared" layer has no indexer of its own.
  std::vector<std::string> indexer_types = {};
  bool shared_indexer(int64_t l) const {
    return !indexer_types.empty() && indexer_types[static_cast<size_t>(l)] == "shared";
  }
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
    if (f.index_topk > 0 && !f.shared_indexer(l)) {
      const std::string x = a + "indexer.";
      linear(x + "wq_b.weight", f.index_heads * f.index_dim, f.q_lora);
      linear(x + "wk.weight", f.index_dim, kE);
      norm(x + "k_norm.weight", f.index_dim);
      put(x + "k_norm.bias", {f.index_dim}, -0.1f, 0.1f);
      linear(x + "weights_proj.weight", f.index_heads, kE);
    }
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
                      {"num_experts_per_tok", f.used},
                      {"n_shared_experts", f.shared},
                      {"n_group", f.n_group},
                      {"topk_group", f.topk_group},
                      {"topk_method", f.topk_method},
                      {"scoring_func", f.softmax ? "softmax" : "sigmoid"},
                      {"norm_topk_prob", f.norm_topk},
                      {"routed_scaling_factor", f.routed_scale}};
  if (f.index_topk > 0) {
    c["index_topk"] = f.index_topk;
    c["index_n_heads"] = f.index_heads;
    c["index_head_dim"] = f.index_dim;
  }
  if (!f.indexer_types.empty()) c["indexer_types"] = f.indexer_types;
  return c;
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

// DeepSeek's YaRN with rope_theta 100: an original context of 16 and beta_slow 0.05 spread the
// correction range over all 4 rotary pairs (the ramp is 0, 1/7, 2/7, 3/7: pairs 1-3 blends), and
// mscale != mscale_all_dim.
nlohmann::json yarn_spread() {
  return {{"type", "yarn"},
          {"factor", 4.0},
          {"beta_fast", 32},
          {"beta_slow", 0.05},
          {"mscale", 1.0},
          {"mscale_all_dim", 0.707},
          {"original_max_position_embeddings", 16}};
}

// YaRN as DeepSeek states it (modeling_deepseek.py's DeepseekV2YarnRotaryEmbedding).
// mscale != mscale_all_dim multiplies cos and sin, mscale_all_dim the softmax scale (squared).
TEST(Deepseek, V3FormWithYarnMatchesTheReference) {
  const nlohmann::json yarn = yarn_spread();
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

// DeepSeek-V3.2's sparse attention: once a query sees more than index_topk positions, it attends
// to the ones its lightning indexer scores highest (here 6 of up to 24), in every chunking.
TEST(Deepseek, V32SparseAttentionMatchesTheReference) {
  const DsForm dsa{.arch = "DeepseekV32ForCausalLM", .index_topk = 6};
  const ModelPtr m = check_form(dsa, 9);
  ASSERT_TRUE(m);
  EXPECT_TRUE(m->spec.has_indexer());
  EXPECT_EQ(m->spec.idx_n_head, 3);
  EXPECT_EQ(m->spec.idx_head_dim, 12);
  EXPECT_EQ(m->spec.kv_v_width(), 12);  // the indexer's key beside the latent
  expect_batch_invariant(m);
  // Positions up to 6 attend densely: as the V3 form of the same weights; later ones do not.
  TempDir dir;
  write_checkpoint(dir, dsa, 9);
  auto c = nlohmann::json::parse(testing::read_text_file(dir.file("config.json")));
  c["index_topk"] = 64;
  dir.write("config.json", c.dump());
  const std::vector<int32_t> prompt = prompt_of(24, static_cast<int32_t>(kVocab), 29);
  const std::vector<float> sparse = prompt_logits(m, prompt),
                           dense = prompt_logits(dir.path(), prompt);
  const auto V = static_cast<size_t>(kVocab);
  EXPECT_TRUE(std::equal(sparse.begin(), sparse.begin() + 6 * V, dense.begin()));
  for (size_t r = 6; r < 24; ++r)
    EXPECT_FALSE(
        std::equal(sparse.begin() + r * V, sparse.begin() + (r + 1) * V, dense.begin() + r * V))
        << "row " << r;
}

// YaRN's frequencies reach the indexer's rotation too.
TEST(Deepseek, V32SparseAttentionWithYarnMatchesTheReference) {
  const nlohmann::json yarn = yarn_spread();
  check_form({.arch = "DeepseekV32ForCausalLM",
              .rope_theta = 100,
              .rope_scaling = yarn,
              .index_topk = 5,
              .index_dim = 8},
             10);
}

// The GGUF form llama.cpp's converter gives a V3.2 checkpoint ("deepseek32": kv_b_proj split
// into attn_k_b and attn_v_b, experts stacked, the indexer under blk.N.indexer.*), written here
// from the checkpoint's tensors: it loads to the same arithmetic, the same logits bit for bit.
// GLM-5's (arch "glm-dsa") is laid out the same way.
std::string write_deepseek32_gguf(const TempDir& dir, const DsForm& f, uint64_t seed,
                                  const std::string& arch = "deepseek32") {
  std::map<std::string, const StTensor*> by;
  const std::vector<StTensor> t = checkpoint_tensors(f, seed);
  for (const StTensor& x : t) by[x.name] = &x;
  auto floats = [&](const std::string& n) {
    const StTensor& x = *by.at(n);
    std::vector<float> v(x.bytes.size() / 4);
    std::memcpy(v.data(), x.bytes.data(), x.bytes.size());
    return v;
  };
  model::GgufWriter w;
  const std::string k = arch + ".";
  w.set_string("general.architecture", arch);
  auto u32 = [&](const std::string& key, int64_t v) {
    w.set_u32(k + key, static_cast<uint32_t>(v));
  };
  u32("embedding_length", kE);
  u32("context_length", 256);
  u32("block_count", kLayers);
  u32("feed_forward_length", kI);
  u32("attention.head_count", kHeads);
  u32("attention.head_count_kv", 1);
  w.set_f32(k + "rope.freq_base", static_cast<float>(f.rope_theta));
  w.set_f32(k + "attention.layer_norm_rms_epsilon", 1e-6f);
  u32("attention.q_lora_rank", f.q_lora);
  u32("attention.kv_lora_rank", kKvLora);
  u32("attention.key_length", kKvLora + kRope);
  u32("attention.value_length", kKvLora);
  u32("attention.key_length_mla", kNope + kRope);
  u32("attention.value_length_mla", kV);
  u32("rope.dimension_count", kRope);
  u32("expert_count", kExperts);
  u32("expert_used_count", f.used);
  u32("expert_feed_forward_length", kF);
  u32("expert_shared_count", f.shared);
  u32("leading_dense_block_count", 1);
  w.set_f32(k + "expert_weights_scale", static_cast<float>(f.routed_scale));
  w.set_bool(k + "expert_weights_norm", f.norm_topk);
  u32("expert_gating_func", 2);
  u32("expert_group_count", f.n_group);
  u32("expert_group_used_count", f.topk_group);
  u32("attention.indexer.head_count", f.index_heads);
  u32("attention.indexer.key_length", f.index_dim);
  u32("attention.indexer.top_k", f.index_topk);
  if (!f.indexer_types.empty()) w.set_string_array(k + "attention.indexer.types", f.indexer_types);
  std::vector<std::vector<float>> keep;  // the tensors' floats, alive until write()
  auto add = [&](const std::string& name, std::vector<int64_t> ne, std::vector<float> v) {
    keep.push_back(std::move(v));
    EXPECT_TRUE(w.add_tensor_f32(name, model::GgmlType::kF32, ne, keep.back()).has_value());
  };
  auto same = [&](const std::string& g, const std::string& hf) {
    std::vector<int64_t> ne(by.at(hf)->shape.rbegin(), by.at(hf)->shape.rend());
    add(g, ne, floats(hf));
  };
  keep.reserve(256);
  same("token_embd.weight", "model.embed_tokens.weight");
  same("output_norm.weight", "model.norm.weight");
  same("output.weight", "lm_head.weight");
  for (int64_t l = 0; l < kLayers; ++l) {
    const std::string h = "model.layers." + std::to_string(l) + ".", a = h + "self_attn.";
    const std::string b = "blk." + std::to_string(l) + ".";
    same(b + "attn_norm.weight", h + "input_layernorm.weight");
    same(b + "attn_q_a.weight", a + "q_a_proj.weight");
    same(b + "attn_q_a_norm.weight", a + "q_a_layernorm.weight");
    same(b + "attn_q_b.weight", a + "q_b_proj.weight");
    same(b + "attn_kv_a_mqa.weight", a + "kv_a_proj_with_mqa.weight");
    same(b + "attn_kv_a_norm.weight", a + "kv_a_layernorm.weight");
    // kv_b_proj [heads * (nope + v), kv_lora]: per head its nope rows transposed (k_b: rows
    // kv_lora, columns nope), and its v rows as they are (v_b: rows v, columns kv_lora).
    const std::vector<float> kvb = floats(a + "kv_b_proj.weight");
    std::vector<float> kb(static_cast<size_t>(kHeads * kKvLora * kNope)),
        vb(static_cast<size_t>(kHeads * kV * kKvLora));
    for (int64_t hh = 0; hh < kHeads; ++hh)
      for (int64_t r = 0; r < kKvLora; ++r) {
        for (int64_t d = 0; d < kNope; ++d)
          kb[static_cast<size_t>((hh * kKvLora + r) * kNope + d)] =
              kvb[static_cast<size_t>((hh * (kNope + kV) + d) * kKvLora + r)];
        for (int64_t v = 0; v < kV; ++v)
          vb[static_cast<size_t>((hh * kV + v) * kKvLora + r)] =
              kvb[static_cast<size_t>((hh * (kNope + kV) + kNope + v) * kKvLora + r)];
      }
    add(b + "attn_k_b.weight", {kNope, kKvLora, kHeads}, kb);
    add(b + "attn_v_b.weight", {kKvLora, kV, kHeads}, vb);
    same(b + "attn_output.weight", a + "o_proj.weight");
    if (!f.shared_indexer(l)) {
      same(b + "indexer.attn_q_b.weight", a + "indexer.wq_b.weight");
      same(b + "indexer.attn_k.weight", a + "indexer.wk.weight");
      same(b + "indexer.k_norm.weight", a + "indexer.k_norm.weight");
      same(b + "indexer.k_norm.bias", a + "indexer.k_norm.bias");
      same(b + "indexer.proj.weight", a + "indexer.weights_proj.weight");
    }
    same(b + "ffn_norm.weight", h + "post_attention_layernorm.weight");
    if (l == 0) {
      for (const char* m : {"gate", "up", "down"})
        same(b + "ffn_" + m + ".weight", h + "mlp." + m + "_proj.weight");
      continue;
    }
    same(b + "ffn_gate_inp.weight", h + "mlp.gate.weight");
    same(b + "exp_probs_b.bias", h + "mlp.gate.e_score_correction_bias");
    for (const char* m : {"gate", "up", "down"}) {
      std::vector<float> stack;
      for (int64_t e = 0; e < kExperts; ++e) {
        const std::vector<float> x =
            floats(h + "mlp.experts." + std::to_string(e) + "." + m + "_proj.weight");
        stack.insert(stack.end(), x.begin(), x.end());
      }
      const bool down = std::string(m) == "down";
      add(b + "ffn_" + m + "_exps.weight", {down ? kF : kE, down ? kE : kF, kExperts}, stack);
      same(b + "ffn_" + m + "_shexp.weight", h + "mlp.shared_experts." + m + "_proj.weight");
    }
  }
  const std::string path = dir.file(arch + ".gguf");
  EXPECT_TRUE(w.write(path).has_value());
  return path;
}

TEST(Deepseek, V32GgufGivesTheCheckpointsLogits) {
  const DsForm dsa{.arch = "DeepseekV32ForCausalLM", .index_topk = 6};
  TempDir hf, gg;
  write_checkpoint(hf, dsa, 13);
  const std::string gguf = write_deepseek32_gguf(gg, dsa, 13);
  auto m = model::load_model(gguf);
  ASSERT_TRUE(m.has_value()) << m.error().message;
  EXPECT_EQ((*m)->spec.idx_top_k, 6);
  const std::vector<int32_t> prompt = prompt_of(20, static_cast<int32_t>(kVocab), 17);
  EXPECT_TRUE(bit_equal(prompt_logits(*m, prompt), prompt_logits(hf.path(), prompt)));
  const std::string bad = testing::edited_gguf(gg, "bad.gguf", gguf, [](model::GgufWriter& w) {
    w.set_u32("deepseek32.attention.indexer.top_k", 0);
  });
  EXPECT_NE(load_error(bad).find("attention.indexer.top_k must be positive"), std::string::npos)
      << load_error(bad);
}

// troupe synth --arch deepseek32: the same arithmetic from a synthesized file; chunked prefill,
// token by token and batching keep each token's choice.
TEST(Deepseek, SynthesizedV32IsBatchInvariantAndSparse) {
  TempDir dir;
  model::SynthOptions o;
  o.arch = "deepseek32";
  o.seed = 14;
  o.n_ctx = 256;
  o.index_top_k = 8;
  ASSERT_TRUE(model::synth_model(o, dir.file("d32.gguf")).has_value());
  auto m = model::load_model(dir.file("d32.gguf"));
  ASSERT_TRUE(m.has_value()) << m.error().message;
  EXPECT_EQ((*m)->spec.idx_top_k, 8);
  expect_batch_invariant(*m);
  auto dense = std::make_shared<model::Model>(**m);  // the same views, every position kept
  dense->spec.idx_top_k = 64;
  const auto V = static_cast<size_t>((*m)->spec.n_vocab);
  const std::vector<int32_t> prompt = prompt_of(20, static_cast<int32_t>(V), 13);
  const std::vector<float> a = prompt_logits(*m, prompt), b = prompt_logits(dense, prompt);
  EXPECT_TRUE(std::equal(a.begin(), a.begin() + 8 * V, b.begin()));
  EXPECT_FALSE(std::equal(a.begin() + 8 * V, a.end(), b.begin() + 8 * V));
  o.q_lora_rank = 0;
  EXPECT_NE(model::synth_model(o, dir.file("bad.gguf")).error().message.find("--q-lora-rank"),
            std::string::npos);
}

// GLM-5 (GlmMoeDsaForCausalLM): DeepSeek-V3.2's layers, whose indexer rotates neighbouring pairs
// of its queries' and keys' first values rather than halves. The same weights as a V3.2
// checkpoint choose other positions, so the logits part once a query chooses.
TEST(Deepseek, Glm5FormMatchesTheReference) {
  const DsForm glm{.arch = "GlmMoeDsaForCausalLM", .index_topk = 6};
  const std::vector<int32_t> prompt = prompt_of(24, static_cast<int32_t>(kVocab), 29);
  const ModelPtr m = check_form(glm, 15, prompt);
  ASSERT_TRUE(m);
  EXPECT_TRUE(m->spec.has_indexer());
  EXPECT_FALSE(m->spec.idx_rope_neox);
  expect_batch_invariant(m);
  const ModelPtr v32 = check_form({.arch = "DeepseekV32ForCausalLM", .index_topk = 6}, 15, prompt);
  ASSERT_TRUE(v32);
  EXPECT_TRUE(v32->spec.idx_rope_neox);
  const std::vector<float> a = prompt_logits(m, prompt), b = prompt_logits(v32, prompt);
  const auto V = static_cast<size_t>(kVocab);
  EXPECT_TRUE(std::equal(a.begin(), a.begin() + 6 * V, b.begin()));
  EXPECT_FALSE(std::equal(a.begin() + 6 * V, a.end(), b.begin() + 6 * V));
}

// GLM-5's GGUF (glm-dsa, as llama.cpp converts it) gives its checkpoint's logits bit for bit;
// the config's three ways of naming every layer's indexer full (GLM-5 and 5.1) load alike.
TEST(Deepseek, Glm5GgufGivesTheCheckpointsLogits) {
  const DsForm glm{.arch = "GlmMoeDsaForCausalLM", .index_topk = 6};
  TempDir hf, gg;
  write_checkpoint(hf, glm, 16);
  const std::string gguf = write_deepseek32_gguf(gg, glm, 16, "glm-dsa");
  auto m = model::load_model(gguf);
  ASSERT_TRUE(m.has_value()) << m.error().message;
  EXPECT_FALSE((*m)->spec.idx_rope_neox);
  const std::vector<int32_t> prompt = prompt_of(20, static_cast<int32_t>(kVocab), 17);
  const std::vector<float> want = prompt_logits(hf.path(), prompt);
  EXPECT_TRUE(bit_equal(prompt_logits(*m, prompt), want));
  auto c = nlohmann::json::parse(testing::read_text_file(hf.file("config.json")));
  for (const nlohmann::json& types :
       {nlohmann::json{{"indexer_types", {"full", "full", "full"}}},
        nlohmann::json{{"index_topk_pattern", "FFF"}},
        nlohmann::json{{"index_topk_freq", 1}, {"index_skip_topk_offset", 2}}}) {
    nlohmann::json e = c;
    e.update(types);
    hf.write("config.json", e.dump());
    EXPECT_TRUE(bit_equal(prompt_logits(hf.path(), prompt), want)) << types.dump();
  }
  // mlp_layer_types, where a config gives it, says which layers are MoE.
  c["mlp_layer_types"] = {"dense", "sparse", "sparse"};
  hf.write("config.json", c.dump());
  EXPECT_TRUE(bit_equal(prompt_logits(hf.path(), prompt), want));
  c["mlp_layer_types"] = {"dense", "dense", "sparse"};
  hf.write("config.json", c.dump());
  EXPECT_NE(load_error(hf.path()).find("model.layers.1.mlp.gate_proj.weight"), std::string::npos)
      << load_error(hf.path());
}

// GLM-5.2: a "shared" layer has no indexer and attends to the positions the last layer before it
// with an indexer chose. Two shared layers after a full one, against the reference, in every
// chunking and batch; and full, full, shared as GGUF, bit for bit as its checkpoint.
TEST(Deepseek, Glm52SharedIndexersMatchTheReference) {
  const DsForm fss{.arch = "GlmMoeDsaForCausalLM",
                   .index_topk = 6,
                   .indexer_types = {"full", "shared", "shared"}};
  const ModelPtr m = check_form(fss, 17);
  ASSERT_TRUE(m);
  EXPECT_FALSE(m->spec.layers[0].idx_shared);
  EXPECT_TRUE(m->spec.layers[1].idx_shared && m->spec.layers[2].idx_shared);
  EXPECT_FALSE(m->spec.layers[1].idx_wq_b.present());
  expect_batch_invariant(m);
  const DsForm ffs{
      .arch = "GlmMoeDsaForCausalLM", .index_topk = 5, .indexer_types = {"full", "full", "shared"}};
  const std::vector<int32_t> prompt = prompt_of(22, static_cast<int32_t>(kVocab), 19);
  const ModelPtr h = check_form(ffs, 18, prompt);
  ASSERT_TRUE(h);
  TempDir gg;
  auto g = model::load_model(write_deepseek32_gguf(gg, ffs, 18, "glm-dsa"));
  ASSERT_TRUE(g.has_value()) << g.error().message;
  EXPECT_TRUE((*g)->spec.layers[2].idx_shared);
  EXPECT_TRUE(bit_equal(prompt_logits(*g, prompt), prompt_logits(h, prompt)));
  // A stage cannot start at a shared layer: its choice is made in the layer before.
  EngineOptions o;
  o.max_tokens_in_cache = 64;
  o.range = {2, 3};
  auto e = Engine::create(h, o);
  ASSERT_FALSE(e.has_value());
  EXPECT_NE(e.error().message.find("layer 2 reuses the positions an earlier layer's indexer"),
            std::string::npos)
      << e.error().message;
  o.range = {1, 3};
  EXPECT_TRUE(Engine::create(h, o).has_value());
}

// Malformed indexer types are refused by name: an unknown kind, a first layer that shares, a
// list of the wrong length; in GGUF too. A GGUF of GLM-5.2's context (1M) without the key takes
// llama.cpp's GLM-5.2 pattern, one of shorter context every layer full.
TEST(Deepseek, Glm5IndexerTypesAreCheckedAndDefaultAsLlamaCpp) {
  TempDir hf;
  write_checkpoint(hf, {.arch = "GlmMoeDsaForCausalLM", .index_topk = 6}, 19);
  auto c = nlohmann::json::parse(testing::read_text_file(hf.file("config.json")));
  const std::pair<nlohmann::json, const char*> bad[] = {
      {{"full", "half", "full"}, "indexer_types[1] is \"half\""},
      {{"shared", "full", "full"}, "layer 0's indexer is \"shared\""},
      {{"full", "full"}, "'indexer_types' must be a list of 3 entries"}};
  for (const auto& [types, want] : bad) {
    nlohmann::json e = c;
    e["indexer_types"] = types;
    hf.write("config.json", e.dump());
    EXPECT_NE(load_error(hf.path()).find(want), std::string::npos) << load_error(hf.path());
  }
  TempDir dir;
  model::SynthOptions o;
  o.arch = "glm-dsa";
  o.n_layer = 6;
  o.index_top_k = 4;
  o.n_ctx = 256;
  const std::string path = dir.file("g.gguf");
  ASSERT_TRUE(model::synth_model(o, path).has_value());
  auto m = model::load_model(path);
  ASSERT_TRUE(m.has_value()) << m.error().message;
  std::vector<bool> shared;
  for (const auto& L : (*m)->spec.layers) shared.push_back(L.idx_shared);
  EXPECT_EQ(shared, (std::vector<bool>{false, false, false, true, true, true}));
  const std::string no_key_long = testing::edited_gguf(dir, "l.gguf", path, [](auto& w) {
    w.remove_key("glm-dsa.attention.indexer.types");
    w.set_u32("glm-dsa.context_length", 1048576);
  });
  auto l = model::load_model(no_key_long);
  ASSERT_TRUE(l.has_value()) << l.error().message;
  for (size_t il = 0; il < 6; ++il) EXPECT_EQ((*l)->spec.layers[il].idx_shared, shared[il]) << il;
  const std::string no_key = testing::edited_gguf(
      dir, "n.gguf", path, [](auto& w) { w.remove_key("glm-dsa.attention.indexer.types"); });
  EXPECT_NE(load_error(no_key).find("missing tensor 'blk.3.indexer.attn_q_b.weight'"),
            std::string::npos)
      << load_error(no_key);
  const std::string first = testing::edited_gguf(dir, "f.gguf", path, [](auto& w) {
    w.set_array_u32("glm-dsa.attention.indexer.types", std::vector<uint32_t>{0, 1, 1, 0, 0, 0});
  });
  EXPECT_NE(load_error(first).find("layer 0's indexer is shared"), std::string::npos)
      << load_error(first);
}

TEST(Deepseek, V32WithoutItsIndexerIsRefusedByName) {
  TempDir dir;
  write_checkpoint(dir, {.arch = "DeepseekV32ForCausalLM", .index_topk = 6}, 11);
  auto c = nlohmann::json::parse(testing::read_text_file(dir.file("config.json")));
  c.erase("index_topk");
  dir.write("config.json", c.dump());
  EXPECT_NE(load_error(dir.path()).find("index_topk"), std::string::npos) << load_error(dir.path());
  TempDir no_q;
  write_checkpoint(no_q, {.arch = "DeepseekV32ForCausalLM", .q_lora = 0, .index_topk = 6}, 11);
  EXPECT_NE(
      load_error(no_q.path()).find("the sparse-attention indexer needs MLA with a compressed q"),
      std::string::npos)
      << load_error(no_q.path());
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
