// Phi3ForCausalLM (Phi-3, Phi-3.5-mini, Phi-4, Phi-4-mini) through the engine: stories260K's
// Hugging Face weights with q, k and v fused into qkv_proj and gate and up into gate_up_proj,
// plain and with Phi-4-mini's parts (rotary on part of each head, LongRoPE, a sliding window).
// The logits are held to the independent float64 forward pass of tests/hf_moe_reference.h.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/gguf.h"
#include "model/gguf_writer.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "model/synth.h"
#include "tests/compute/engine_test_util.h"
#include "tests/hf_moe_reference.h"
#include "tests/safetensors_writer.h"
#include "tests/test_support.h"

namespace troupe::compute {
namespace {

using nlohmann::json;
using testing::TempDir;

// stories260K's Hugging Face directory rewritten into `dir` in Phi-3's layout: per layer the
// rows of q_proj, k_proj and v_proj one after the other in self_attn.qkv_proj, and those of
// gate_proj and up_proj in mlp.gate_up_proj; config.json as `edit` leaves it after naming the
// class. The tokenizer files are copied.
void as_phi3(const std::string& src, const TempDir& dir, const std::function<void(json&)>& edit) {
  std::ifstream in(src + "/config.json");
  json config = json::parse(in);
  config["architectures"] = {"Phi3ForCausalLM"};
  config["model_type"] = "phi3";
  config["sliding_window"] = nullptr;
  edit(config);
  dir.write("config.json", config.dump(2));
  for (const char* f : {"tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"})
    std::filesystem::copy_file(src + "/" + f, dir.file(f),
                               std::filesystem::copy_options::overwrite_existing);
  auto st = model::SafetensorsSet::open_dir(src);
  ASSERT_TRUE(st.has_value()) << st.error().message;
  std::map<std::string, testing::StTensor> out;
  auto bytes = [](const model::SafetensorsTensor& t) {
    return std::string(reinterpret_cast<const char*>(t.data), t.nbytes);
  };
  // Rows appended in the order of `parts` (each [rows, E], row-major): one [sum of rows, E].
  auto fuse = [&](const std::string& to, const std::vector<std::string>& parts) {
    testing::StTensor f{to, "", {0, 0}, ""};
    for (const std::string& name : parts) {
      const model::SafetensorsTensor* t = (*st)->find(name);
      ASSERT_NE(t, nullptr) << name;
      f.dtype = t->dtype;
      f.shape = {f.shape[0] + t->shape[0], t->shape[1]};
      f.bytes += bytes(*t);
    }
    out[to] = f;
  };
  for (const auto& [tensor_name, t] : (*st)->tensors()) {
    const std::string& name = tensor_name;  // (clang 14: no bindings in lambdas)
    const auto at = [&](const std::string& part) { return name.find(part) != std::string::npos; };
    if (at("self_attn.q_proj.") || at("self_attn.k_proj.") || at("self_attn.v_proj.") ||
        at("mlp.gate_proj.") || at("mlp.up_proj."))
      continue;
    out[name] = {name, t->dtype, t->shape, bytes(*t)};
  }
  for (int l = 0; l < config["num_hidden_layers"].get<int>(); ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    fuse(p + "self_attn.qkv_proj.weight",
         {p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight",
          p + "self_attn.v_proj.weight"});
    fuse(p + "mlp.gate_up_proj.weight", {p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"});
  }
  std::vector<testing::StTensor> list;
  for (auto& [name, t] : out) list.push_back(std::move(t));
  dir.write("model.safetensors", testing::safetensors_image(list));
}

// Phi-4-mini's parts at stories260K's size: rotary on half of each 8-wide head (2 pairs),
// LongRoPE with a 512-position model trained at 64 (attention factor sqrt(1 + ln 8 / ln 64)),
// and a window of 16 positions.
void phi4_mini_parts(json& c) {
  c["partial_rotary_factor"] = 0.5;
  c["original_max_position_embeddings"] = 64;
  c["rope_scaling"] = {
      {"type", "longrope"}, {"short_factor", {1.0, 2.5}}, {"long_factor", {3.0, 7.0}}};
  c["sliding_window"] = 16;
}

TEST(Phi3, HuggingFaceFormMatchesTheFloat64ReferencePlainAndWithPhi4MinisParts) {
  TROUPE_SHARED_OR_SKIP(shared);
  const std::string src = shared + "/models/hf/stories260K";
  auto llama = model::load_model(src);
  ASSERT_TRUE(llama.has_value()) << llama.error().message;
  const int32_t vocab = static_cast<int32_t>((*llama)->spec.n_vocab);
  const std::vector<int32_t> prompt = prompt_of(40, vocab, 61);
  const std::vector<float> full = prompt_logits(*llama, prompt);

  // Fused projections, whole-head rotary, no scaling, no window: Llama's logits, bit for bit
  // (the fused matrices are read as views of their rows).
  TempDir plain;
  ASSERT_NO_FATAL_FAILURE(as_phi3(src, plain, [](json&) {}));
  auto p = model::load_model(plain.path());
  ASSERT_TRUE(p.has_value()) << p.error().message;
  EXPECT_TRUE(bit_equal(prompt_logits(*p, prompt), full));
  expect_near_reference(full, testing::phi3_reference_logits(plain.path(), prompt), vocab);

  TempDir mini;
  ASSERT_NO_FATAL_FAILURE(as_phi3(src, mini, phi4_mini_parts));
  auto m = model::load_model(mini.path());
  ASSERT_TRUE(m.has_value()) << m.error().message;
  const model::ModelSpec& s = (*m)->spec;
  EXPECT_EQ(s.n_rot, 4);
  EXPECT_EQ(s.rope_freq_factors, (std::vector<float>{1.0f, 2.5f}));  // short_factor
  EXPECT_DOUBLE_EQ(s.rope_scaling.attn_factor, std::sqrt(1 + std::log(8.0) / std::log(64.0)));
  for (const model::LayerSpec& L : s.layers) EXPECT_EQ(L.window, 16);
  const std::vector<float> got = prompt_logits(*m, prompt);
  const std::vector<double> ref = testing::phi3_reference_logits(mini.path(), prompt);
  expect_near_reference(got, ref, vocab);
  expect_engine_near_reference(*m, prompt, ref);  // KV blocks of 4 and 16 under the window
  expect_batch_invariant(*m);
  EXPECT_FALSE(bit_equal(got, full));

  // An attention_factor in rope_scaling wins over the computed one; "su" is LongRoPE's old name.
  TempDir named;
  ASSERT_NO_FATAL_FAILURE(as_phi3(src, named, [](json& c) {
    phi4_mini_parts(c);
    c["rope_scaling"]["type"] = "su";
    c["rope_scaling"]["attention_factor"] = 1.5;
  }));
  auto n = model::load_model(named.path());
  ASSERT_TRUE(n.has_value()) << n.error().message;
  EXPECT_DOUBLE_EQ((*n)->spec.rope_scaling.attn_factor, 1.5);
  expect_near_reference(prompt_logits(*n, prompt),
                        testing::phi3_reference_logits(named.path(), prompt), vocab);
}

// The Phi-3 directory `hf` (as_phi3's) as llama.cpp's converter would write it: GGUF arch phi3,
// the fused matrices under attn_qkv and ffn_up (gate rows first) with their rows as stored,
// LongRoPE's factors as rope_factors_short/long.weight and its attention factor as
// rope.scaling.attn_factor; the vocabulary copied from stories260K's GGUF. Returns the path.
std::string phi3_gguf(const std::string& shared, const std::string& hf, const TempDir& dir) {
  std::ifstream in(hf + "/config.json");
  const json c = json::parse(in);
  auto vocab = model::GgufFile::open(shared + "/models/stories260K/stories260K.gguf");
  EXPECT_TRUE(vocab.has_value());
  auto st = model::SafetensorsSet::open_dir(hf);
  EXPECT_TRUE(st.has_value());
  if (!vocab || !st) return "";
  model::GgufWriter w;
  for (const auto& [key, value] : (*vocab)->metadata())
    if (key.starts_with("tokenizer.")) w.copy_value(key, value);
  w.set_string("general.architecture", "phi3");
  const auto u32 = [&](const std::string& key, int64_t v) {
    w.set_u32("phi3." + key, static_cast<uint32_t>(v));
  };
  const int64_t D = c["head_dim"].get<int64_t>();
  const int64_t rot =
      static_cast<int64_t>(static_cast<double>(D) * c.value("partial_rotary_factor", 1.0));
  u32("context_length", c["max_position_embeddings"].get<int64_t>());
  u32("embedding_length", c["hidden_size"].get<int64_t>());
  u32("feed_forward_length", c["intermediate_size"].get<int64_t>());
  u32("block_count", c["num_hidden_layers"].get<int64_t>());
  u32("attention.head_count", c["num_attention_heads"].get<int64_t>());
  u32("attention.head_count_kv", c["num_key_value_heads"].get<int64_t>());
  u32("rope.dimension_count", rot);
  w.set_f32("phi3.attention.layer_norm_rms_epsilon", c["rms_norm_eps"].get<float>());
  w.set_f32("phi3.rope.freq_base", c["rope_theta"].get<float>());
  if (!c["sliding_window"].is_null()) u32("attention.sliding_window", c["sliding_window"]);
  std::vector<float> shrt, lng;
  if (!c["rope_scaling"].is_null()) {
    const double orig = c["original_max_position_embeddings"].get<double>();
    const double ratio = c["max_position_embeddings"].get<double>() / orig;
    u32("rope.scaling.original_context_length", static_cast<int64_t>(orig));
    w.set_f32("phi3.rope.scaling.attn_factor",
              static_cast<float>(std::sqrt(1 + std::log(ratio) / std::log(orig))));
    for (const auto& x : c["rope_scaling"]["short_factor"]) shrt.push_back(x.get<float>());
    for (const auto& x : c["rope_scaling"]["long_factor"]) lng.push_back(x.get<float>());
    const int64_t n[1] = {static_cast<int64_t>(shrt.size())};
    EXPECT_TRUE(w.add_tensor_f32("rope_factors_long.weight", model::GgmlType::kF32, n, lng));
    EXPECT_TRUE(w.add_tensor_f32("rope_factors_short.weight", model::GgmlType::kF32, n, shrt));
  }
  const std::vector<std::pair<std::string, std::string>> names = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"self_attn.qkv_proj.weight", "attn_qkv.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"mlp.gate_up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},
  };
  for (const auto& [name, t] : (*st)->tensors()) {
    std::string to;
    if (name == "model.embed_tokens.weight") to = "token_embd.weight";
    if (name == "model.norm.weight") to = "output_norm.weight";
    for (const auto& [hf_part, gguf_part] : names) {
      const size_t at = name.find(hf_part);
      if (name.starts_with("model.layers.") && at != std::string::npos)
        to = "blk." + name.substr(13, at - 13) + gguf_part;
    }
    EXPECT_FALSE(to.empty()) << name;
    EXPECT_EQ(t->dtype, "F32") << name;
    std::vector<int64_t> ne(t->shape.rbegin(), t->shape.rend());  // ggml order: columns first
    EXPECT_TRUE(
        w.add_tensor(to, model::GgmlType::kF32, ne, std::span<const uint8_t>(t->data, t->nbytes))
            .has_value())
        << to;
  }
  const std::string path = dir.file("phi3.gguf");
  auto written = w.write(path);
  EXPECT_TRUE(written.has_value()) << written.error().message;
  return path;
}

// The same models in llama.cpp's GGUF form: the Hugging Face form's logits, bit for bit, and with
// Phi-4-mini's parts within the float64 reference's bound.
TEST(Phi3, GgufFormGivesTheHuggingFaceFormsLogits) {
  TROUPE_SHARED_OR_SKIP(shared);
  const std::string src = shared + "/models/hf/stories260K";
  for (const bool parts : {false, true}) {
    TempDir hf, gguf;
    ASSERT_NO_FATAL_FAILURE(as_phi3(src, hf, [&](json& c) {
      if (parts) phi4_mini_parts(c);
    }));
    const std::string path = phi3_gguf(shared, hf.path(), gguf);
    ASSERT_FALSE(path.empty());
    auto g = model::load_model(path);
    ASSERT_TRUE(g.has_value()) << g.error().message;
    auto h = model::load_model(hf.path());
    ASSERT_TRUE(h.has_value()) << h.error().message;
    const model::ModelSpec& s = (*g)->spec;
    EXPECT_EQ(s.rope_style, model::RopeStyle::kNeox);
    EXPECT_EQ(s.n_rot, parts ? 4 : 8);
    EXPECT_EQ(s.rope_freq_factors, (*h)->spec.rope_freq_factors);
    EXPECT_EQ(s.rope_freq_factors_long, (*h)->spec.rope_freq_factors_long);
    EXPECT_EQ(s.rope_long_after, (*h)->spec.rope_long_after);
    EXPECT_EQ(s.layers[0].window, parts ? 16 : 0);
    const std::vector<int32_t> prompt = prompt_of(40, static_cast<int32_t>(s.n_vocab), 61);
    const std::vector<float> got = prompt_logits(*g, prompt);
    if (!parts) {
      EXPECT_TRUE(bit_equal(got, prompt_logits(*h, prompt)));
      continue;
    }
    // The file keeps the attention factor as an f32 (config.json's is computed in double): the
    // logits then differ in their last bits, and stay within the reference's bound.
    EXPECT_EQ(s.rope_scaling.attn_factor,
              static_cast<double>(static_cast<float>((*h)->spec.rope_scaling.attn_factor)));
    expect_near_reference(got, testing::phi3_reference_logits(hf.path(), prompt),
                          static_cast<int32_t>(s.n_vocab));
    expect_batch_invariant(*g);
  }
}

// LongRoPE's long factors: an engine set for sequences longer than the original context rotates
// every position with them (as llama.cpp set to such a context, and transformers over a prompt
// that long in one pass); one set for shorter sequences, or not told, with the short ones.
TEST(Phi3, LongFactorsAboveTheOriginalContext) {
  TROUPE_SHARED_OR_SKIP(shared);
  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(as_phi3(shared + "/models/hf/stories260K", dir, [](json& c) {
    phi4_mini_parts(c);
    c["original_max_position_embeddings"] = 16;  // 512 / 16: attention factor 1.5
  }));
  auto m = model::load_model(dir.path());
  ASSERT_TRUE(m.has_value()) << m.error().message;
  const model::ModelSpec& s = (*m)->spec;
  EXPECT_EQ(s.rope_long_after, 16);
  EXPECT_EQ(s.rope_freq_factors_long, (std::vector<float>{3.0f, 7.0f}));
  EXPECT_DOUBLE_EQ(s.rope_scaling.attn_factor, 1.5);
  const int32_t vocab = static_cast<int32_t>(s.n_vocab);
  const std::vector<int32_t> prompt = prompt_of(40, vocab, 61);
  const std::vector<int32_t> first16(prompt.begin(), prompt.begin() + 16);
  const std::vector<double> ref_long = testing::phi3_reference_logits(dir.path(), prompt);
  const std::vector<double> ref_short = testing::phi3_reference_logits(dir.path(), first16);
  auto run = [&](int64_t max_positions, const std::vector<int32_t>& p,
                 const std::vector<int64_t>& chunks) {
    EngineOptions o;
    o.max_tokens_in_cache = 64;
    o.kv_block_size = 4;
    o.max_positions = max_positions;
    auto eng = Engine::create(*m, o);
    EXPECT_TRUE(eng.has_value());
    return eng ? run_chunks(**eng, p, chunks) : std::vector<float>{};
  };
  const std::vector<float> long40 = run(40, prompt, {40});
  expect_near_reference(long40, ref_long, vocab);
  EXPECT_TRUE(bit_equal(long40, run(512, prompt, {7, 33})));  // any context above 16, any chunks
  EXPECT_TRUE(bit_equal(long40, run(17, prompt, {1})));
  for (const int64_t short_context : {int64_t{0}, int64_t{16}})
    expect_near_reference(run(short_context, first16, {16}), ref_short, vocab);
  // The long factors differ from the short ones from the first rotated position on.
  const std::vector<float> short16 = run(16, first16, {16});
  EXPECT_TRUE(std::equal(short16.begin(), short16.begin() + vocab, long40.begin()));  // position 0
  EXPECT_FALSE(std::equal(short16.begin() + vocab, short16.end(), long40.begin() + vocab));
}

// `troupe synth --arch phi3`: loaded with its LongRoPE (the short factors, the attention factor),
// its window and its fused matrices, and batch- and chunk-invariant.
TEST(Phi3, SynthesizedModelLoadsAsWrittenAndIsBatchInvariant) {
  TempDir dir;
  model::SynthOptions o;
  o.arch = "phi3";
  o.n_layer = 2;
  o.n_ctx = 1024;
  o.sliding_window = 8;
  o.seed = 7;
  ASSERT_TRUE(model::synth_model(o, dir.file("phi3.gguf")).has_value());
  auto m = model::load_model(dir.file("phi3.gguf"));
  ASSERT_TRUE(m.has_value()) << m.error().message;
  const model::ModelSpec& s = (*m)->spec;
  EXPECT_EQ(s.arch, model::Arch::kLlama);
  EXPECT_EQ(s.rope_style, model::RopeStyle::kNeox);
  EXPECT_EQ(s.n_rot, 12);
  ASSERT_EQ(s.rope_freq_factors.size(), 6u);
  EXPECT_FLOAT_EQ(s.rope_freq_factors[1], 1.05f);  // the short factors
  EXPECT_FLOAT_EQ(static_cast<float>(s.rope_scaling.attn_factor),
                  static_cast<float>(std::sqrt(1 + std::log(4.0) / std::log(256.0))));
  for (const model::LayerSpec& L : s.layers) {
    EXPECT_EQ(L.window, 8);
    EXPECT_EQ(L.wq.rows(), 128);
    EXPECT_EQ(L.wk.rows(), 32);
    EXPECT_EQ(L.ffn_gate.rows(), 256);
    EXPECT_EQ(L.ffn_up.rows(), 256);
  }
  expect_batch_invariant(*m);
}

TEST(Phi3, BadLongRopeFactorsAreRefusedByName) {
  TROUPE_SHARED_OR_SKIP(shared);
  const std::string src = shared + "/models/hf/stories260K";
  const std::vector<std::pair<std::function<void(json&)>, std::string>> cases = {
      {[](json& c) {
         c["rope_scaling"]["short_factor"] = {1.0, 2.0, 3.0};
       },
       "longrope short_factor must be a list of 2 numbers (one per rotary pair)"},
      {[](json& c) { c["rope_scaling"].erase("long_factor"); },
       "longrope long_factor must be a list of 2 numbers"},
      {[](json& c) {
         c["rope_scaling"]["short_factor"] = {1.0, -2.0};
       },
       "longrope short_factor holds -2.0; each must be a finite number > 0"},
  };
  for (const auto& [change, want] : cases) {
    TempDir dir;
    const std::function<void(json&)>& edit = change;  // (clang 14: no bindings in lambdas)
    ASSERT_NO_FATAL_FAILURE(as_phi3(src, dir, [&](json& c) {
      phi4_mini_parts(c);
      edit(c);
    }));
    auto m = model::load_model(dir.path());
    ASSERT_FALSE(m.has_value()) << want;
    EXPECT_NE(m.error().message.find(want), std::string::npos) << m.error().message;
  }
}

}  // namespace
}  // namespace troupe::compute
