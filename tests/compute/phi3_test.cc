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

#include "model/model.h"
#include "model/safetensors.h"
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
  for (const auto& [name, t] : (*st)->tensors()) {
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
  for (const auto& [edit, want] : cases) {
    TempDir dir;
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
