// Mistral's Hugging Face forms through the engine: MistralForCausalLM (Mistral 7B, Nemo, Small 3,
// Devstral, Magistral) and the decoder of Mistral3ForConditionalGeneration (Mistral Small 3.1 and
// 3.2), with and without a sliding window. The weights are stories260K's Hugging Face form under
// each class's names; the logits are held to the independent float64 forward pass of
// tests/hf_moe_reference.h, which reads the window from config.json.
#include <filesystem>
#include <fstream>
#include <functional>
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

// stories260K's Hugging Face directory rewritten into `dir`: config.json as `edit` leaves it and
// the same tensors, under Mistral3ForConditionalGeneration's names ("language_model.model.*",
// transformers before 4.52) when `mistral3`. The tokenizer files are copied.
void rewrite(const std::string& src, const TempDir& dir, const std::function<void(json&)>& edit,
             bool mistral3 = false) {
  std::ifstream in(src + "/config.json");
  json config = json::parse(in);
  edit(config);
  dir.write("config.json", config.dump(2));
  for (const char* f : {"tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"})
    std::filesystem::copy_file(src + "/" + f, dir.file(f),
                               std::filesystem::copy_options::overwrite_existing);
  auto st = model::SafetensorsSet::open_dir(src);
  EXPECT_TRUE(st.has_value()) << st.error().message;
  std::vector<testing::StTensor> out;
  for (const auto& [name, t] : (*st)->tensors()) {
    std::string to = name;
    if (mistral3) to = "language_model." + name;  // model.* -> language_model.model.*
    out.push_back(
        {to, t->dtype, t->shape, std::string(reinterpret_cast<const char*>(t->data), t->nbytes)});
  }
  dir.write("model.safetensors", testing::safetensors_image(out));
}

void as_mistral(json& c, int64_t window) {
  c["architectures"] = {"MistralForCausalLM"};
  c["model_type"] = "mistral";
  c["sliding_window"] = window > 0 ? json(window) : json(nullptr);
}

// Mistral3ForConditionalGeneration's config: the decoder's keys in text_config (with `window`,
// or none: MistralConfig's default then applies), a vision tower's in vision_config.
void as_mistral3(json& c, int64_t window) {
  json text = c;
  text.erase("architectures");
  text.erase("torch_dtype");
  text["model_type"] = "mistral";
  if (window >= 0) text["sliding_window"] = window > 0 ? json(window) : json(nullptr);
  c = {{"architectures", {"Mistral3ForConditionalGeneration"}},
       {"model_type", "mistral3"},
       {"text_config", text},
       {"vision_config", {{"model_type", "pixtral"}, {"hidden_size", 1024}}},
       {"image_token_index", 10},
       {"spatial_merge_size", 2}};
}

TEST(Mistral, HuggingFaceFormsMatchTheFloat64ReferenceWithAndWithoutTheirWindow) {
  TROUPE_SHARED_OR_SKIP(shared);
  const std::string src = shared + "/models/hf/stories260K";
  auto llama = model::load_model(src);
  ASSERT_TRUE(llama.has_value()) << llama.error().message;
  const int32_t vocab = static_cast<int32_t>((*llama)->spec.n_vocab);
  const std::vector<int32_t> prompt = prompt_of(40, vocab, 61);
  const std::vector<float> full = prompt_logits(*llama, prompt);
  const size_t V = static_cast<size_t>(vocab);

  // Without a window: Llama's decoder, bit for bit.
  TempDir plain;
  rewrite(src, plain, [](json& c) { as_mistral(c, 0); });
  EXPECT_TRUE(bit_equal(prompt_logits(plain.path(), prompt), full));
  expect_near_reference(full, testing::mistral_reference_logits(plain.path(), prompt), vocab);

  // A window of 8 positions: the first 8 rows as before, every later one different, each within
  // the reference's bound.
  TempDir windowed;
  rewrite(src, windowed, [](json& c) { as_mistral(c, 8); });
  auto m = model::load_model(windowed.path());
  ASSERT_TRUE(m.has_value()) << m.error().message;
  for (const model::LayerSpec& L : (*m)->spec.layers) EXPECT_EQ(L.window, 8);
  const std::vector<float> got = prompt_logits(*m, prompt);
  const std::vector<double> ref = testing::mistral_reference_logits(windowed.path(), prompt);
  expect_near_reference(got, ref, vocab);
  expect_engine_near_reference(*m, prompt, ref);  // KV blocks of 4 and 16 under the window
  expect_batch_invariant(*m);
  for (size_t i = 0; i < prompt.size(); ++i) {
    const bool same =
        std::equal(got.begin() + i * V, got.begin() + (i + 1) * V, full.begin() + i * V);
    EXPECT_EQ(same, i < 8) << "position " << i;
  }

  // Mistral Small 3.1's class: the same decoder under language_model.model.*.
  TempDir small31;
  rewrite(
      src, small31, [](json& c) { as_mistral3(c, 8); }, true);
  EXPECT_TRUE(bit_equal(prompt_logits(small31.path(), prompt), got));
  // Its text_config without the key takes MistralConfig's default window, 4096.
  TempDir defaulted;
  rewrite(
      src, defaulted, [](json& c) { as_mistral3(c, -1); }, true);
  auto d = model::load_model(defaulted.path());
  ASSERT_TRUE(d.has_value()) << d.error().message;
  for (const model::LayerSpec& L : (*d)->spec.layers) EXPECT_EQ(L.window, 4096);
  EXPECT_TRUE(bit_equal(prompt_logits(*d, prompt), full));  // 40 positions: inside it

  // A window that is not positive is refused by name.
  TempDir bad;
  rewrite(src, bad, [](json& c) {
    as_mistral(c, 0);
    c["sliding_window"] = 0;
  });
  auto refused = model::load_model(bad.path());
  ASSERT_FALSE(refused.has_value());
  EXPECT_NE(refused.error().message.find("sliding_window must be positive, got 0"),
            std::string::npos)
      << refused.error().message;
}

}  // namespace
}  // namespace troupe::compute
