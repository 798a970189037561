// Vision towers in Hugging Face form (model/hf_vision.cc): the LlavaForConditionalGeneration twin
// of ../shared's synthetic LLaVA pair (tests/llava_hf_twin.h) gives the spec and the very bits of
// its mmproj GGUF, in both of transformers' layouts; configs troupe cannot run are refused with
// the key or tensor named. (Its logits against the reference: vision_test.cc.)
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "compute/vision_encoder.h"
#include "model/image.h"
#include "model/model.h"
#include "model/synth.h"
#include "model/vision.h"
#include "tests/compute/engine_test_util.h"
#include "tests/gemma3_hf_twin.h"
#include "tests/hf_twin_model.h"
#include "tests/llava_hf_twin.h"
#include "tests/test_support.h"

namespace troupe::compute {
namespace {

using nlohmann::json;

std::vector<float> encode(const std::shared_ptr<const model::VisionModel>& vm,
                          const model::Image& image) {
  auto enc = VisionEncoder::create(vm, 2);
  EXPECT_TRUE(enc) << enc.error().message;
  if (!enc) return {};
  auto rows = (*enc)->encode(image);
  EXPECT_TRUE(rows) << rows.error().message;
  return rows ? *rows : std::vector<float>{};
}

TEST(HfVision, LlavaTwinGivesTheSpecAndTheBitsOfItsMmproj) {
  TROUPE_SHARED_OR_SKIP(shared);
  auto gguf = model::load_vision_model(shared + "/models/synth/llava-tiny/mmproj.gguf");
  ASSERT_TRUE(gguf) << gguf.error().message;
  const model::VisionSpec& g = (*gguf)->spec;
  for (auto layout : {testing::LlavaLayout::kBefore452, testing::LlavaLayout::kAfter452}) {
    testing::TempDir dir;
    ASSERT_NO_FATAL_FAILURE(testing::write_llava_hf_twin(shared, dir, layout));
    auto hf = model::load_vision_model(dir.path());  // a directory: the Hugging Face reader
    ASSERT_TRUE(hf) << hf.error().message;
    const model::VisionSpec& h = (*hf)->spec;
    EXPECT_EQ(h.projector, g.projector);
    EXPECT_EQ(h.act, g.act);
    EXPECT_EQ(h.image_size, g.image_size);
    EXPECT_EQ(h.patch_size, g.patch_size);
    EXPECT_EQ(h.n_embd, g.n_embd);
    EXPECT_EQ(h.n_ff, g.n_ff);
    EXPECT_EQ(h.n_head, g.n_head);
    EXPECT_EQ(h.eps, g.eps);
    EXPECT_EQ(h.mean, g.mean);
    EXPECT_EQ(h.std, g.std);
    EXPECT_EQ(h.n_layer_run, g.n_layer_run);
    EXPECT_EQ(h.layers.size(), g.layers.size());
    EXPECT_EQ(h.n_embd_out, g.n_embd_out);
    EXPECT_EQ(h.n_image_tokens(), g.n_image_tokens());
    EXPECT_EQ(h.pre_ln_w.present(), g.pre_ln_w.present());
    EXPECT_FALSE(h.post_ln_w.present());  // LLaVA reads hidden states, before post_layernorm
    for (const char* png : {"checker_50x40.png", "circles_64x64.png", "gradient_32x32.png"}) {
      SCOPED_TRACE(png);
      auto image = model::read_image_file(shared + "/golden/vlm/images/" + png);
      ASSERT_TRUE(image) << image.error().message;
      const auto want = encode(*gguf, *image);
      ASSERT_FALSE(want.empty());
      EXPECT_TRUE(bit_equal(encode(*hf, *image), want));
    }
    // The text half of the directory is the language model.
    auto text = model::load_model(dir.path());
    ASSERT_TRUE(text) << text.error().message;
    EXPECT_EQ((*text)->spec.n_embd, h.n_embd_out);
    EXPECT_EQ((*text)->spec.n_layer, 4);
  }
}

// Released checkpoints store F16 (LLaVA 1.5) or BF16 (Gemma 3): norms, biases and the class
// token become f32, matrices are computed as stored. The rows stay within the rounding of the
// weights of the f32 ones, and the language model reads the same types.
TEST(HfVision, HalfPrecisionCheckpointsRun) {
  TROUPE_SHARED_OR_SKIP(shared);
  auto gguf = model::load_vision_model(shared + "/models/synth/llava-tiny/mmproj.gguf");
  ASSERT_TRUE(gguf) << gguf.error().message;
  auto image = model::read_image_file(shared + "/golden/vlm/images/circles_64x64.png");
  ASSERT_TRUE(image) << image.error().message;
  const auto want = encode(*gguf, *image);
  ASSERT_FALSE(want.empty());
  for (const char* dtype : {"F16", "BF16"}) {
    SCOPED_TRACE(dtype);
    testing::TempDir dir;
    ASSERT_NO_FATAL_FAILURE(
        testing::write_llava_hf_twin(shared, dir, testing::LlavaLayout::kAfter452, dtype));
    auto hf = model::load_vision_model(dir.path());
    ASSERT_TRUE(hf) << hf.error().message;
    const model::GgmlType type =
        std::string(dtype) == "F16" ? model::GgmlType::kF16 : model::GgmlType::kBF16;
    EXPECT_EQ((*hf)->spec.layers[0].q_w.type, type);
    EXPECT_EQ((*hf)->spec.mm0_w.type, type);
    EXPECT_EQ((*hf)->spec.layers[0].ln1_w.type, model::GgmlType::kF32);
    const auto got = encode(*hf, *image);
    ASSERT_EQ(got.size(), want.size());
    double mx = 0, d = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      mx = std::max(mx, std::fabs(static_cast<double>(want[i])));
      d = std::max(d, std::fabs(static_cast<double>(got[i]) - want[i]));
    }
    const double err = d / mx;
    std::printf("%s checkpoint: image rows max|d|/max|ref| = %.3g\n", dtype, err);
    EXPECT_GT(err, 0.0);  // rounded weights: not the f32 bits
    EXPECT_LT(err, std::string(dtype) == "F16" ? 5e-3 : 5e-2);
    auto text = model::load_model(dir.path());
    ASSERT_TRUE(text) << text.error().message;
    EXPECT_EQ((*text)->spec.layers[0].wq.type, type);
  }
}

// Gemma3ForConditionalGeneration with its SigLIP tower: the twin of a synthesized f32 pair (the
// soft-embedding norm stored as w - 1, the projection as x @ W, no preprocessor_config.json: the
// mean and deviation at Gemma 3's 0.5) gives the mmproj's spec and bits in both layouts.
TEST(HfVision, Gemma3TwinGivesTheSpecAndTheBitsOfItsMmproj) {
  TROUPE_SHARED_OR_SKIP(shared);
  testing::TempDir dir;
  const std::string text = testing::synth_arch(dir, "gemma3", 51);
  model::MmprojSynthOptions o;
  o.projector = "gemma3";
  o.image_size = 32;
  o.patch_size = 4;
  o.n_embd = 64;
  o.n_ff = 128;
  o.n_layer = 2;
  o.n_layer_used = 0;
  o.n_head = 4;
  o.proj_dim = 128;
  o.merge = 2;
  o.dtype = model::GgmlType::kF32;
  o.seed = 52;
  const std::string mmproj = dir.file("mmproj.gguf");
  const Status made = model::synth_mmproj(o, mmproj);
  ASSERT_TRUE(made) << made.error().message;
  auto gguf = model::load_vision_model(mmproj);
  ASSERT_TRUE(gguf) << gguf.error().message;
  const model::VisionSpec& g = (*gguf)->spec;
  for (const std::string prefix : {"language_model.model.", "model.language_model."}) {
    SCOPED_TRACE(prefix);
    testing::TempDir hf;
    ASSERT_NO_FATAL_FAILURE(testing::write_gemma3_hf_twin(text, hf, prefix, mmproj));
    auto vm = model::load_vision_model(hf.path());
    ASSERT_TRUE(vm) << vm.error().message;
    const model::VisionSpec& h = (*vm)->spec;
    EXPECT_EQ(h.projector, model::Projector::kGemma3);
    EXPECT_EQ(h.act, g.act);
    EXPECT_EQ(h.eps, g.eps);
    EXPECT_EQ(h.mean, g.mean);
    EXPECT_EQ(h.std, g.std);
    EXPECT_EQ(h.merge, g.merge);
    EXPECT_EQ(h.n_layer_run, g.n_layer_run);
    EXPECT_EQ(h.n_embd_out, g.n_embd_out);
    EXPECT_EQ(h.n_image_tokens(), g.n_image_tokens());
    EXPECT_TRUE(h.post_ln_w.present());
    for (const char* png : {"checker_50x40.png", "gradient_32x32.png"}) {
      SCOPED_TRACE(png);
      auto image = model::read_image_file(shared + "/golden/vlm/images/" + png);
      ASSERT_TRUE(image) << image.error().message;
      const auto want = encode(*gguf, *image);
      ASSERT_FALSE(want.empty());
      EXPECT_TRUE(bit_equal(encode(*vm, *image), want));
    }
    // Pooling needs a square number of tokens whose side divides the patches a side (8).
    json c = json::parse(testing::read_text_file(hf.file("config.json")));
    for (int tokens : {5, 9}) {
      c["mm_tokens_per_image"] = tokens;
      hf.write("config.json", c.dump());
      auto bad = model::load_vision_model(hf.path());
      ASSERT_FALSE(bad);
      EXPECT_NE(bad.error().message.find("mm_tokens_per_image " + std::to_string(tokens) +
                                         " is not the square of a divisor of the 8 patches"),
                std::string::npos)
          << bad.error().message;
    }
  }
}

// Each edit of the twin's config.json or preprocessor_config.json, and the error it must give.
struct BadConfig {
  const char* file;
  std::function<void(json&)> edit;
  const char* error;
};

TEST(HfVision, ConfigsTroupeCannotRunAreRefusedNamingWhy) {
  TROUPE_SHARED_OR_SKIP(shared);
  const std::vector<BadConfig> cases = {
      {"config.json", [](json& c) { c["architectures"] = {"LlavaNextForConditionalGeneration"}; },
       "'LlavaNextForConditionalGeneration' has no vision tower troupe reads"},
      {"config.json", [](json& c) { c["vision_feature_select_strategy"] = "full"; },
       "vision_feature_select_strategy 'full' is not supported"},
      {"config.json",
       [](json& c) {
         c["vision_feature_layer"] = {1, 0};
       },
       "vision_feature_layer must list its layers in increasing order"},
      {"config.json", [](json& c) { c["vision_feature_layer"] = -4; },
       "vision_feature_layer -4 is outside the 3 hidden states"},
      {"config.json", [](json& c) { c["projector_hidden_act"] = "relu"; },
       "projector_hidden_act \"relu\" is not supported"},
      {"config.json", [](json& c) { c["vision_config"]["model_type"] = "siglip_vision_model"; },
       "vision_config.model_type 'siglip_vision_model' is not supported"},
      {"config.json", [](json& c) { c["vision_config"]["num_hidden_layers"] = 3; },
       "missing tensor 'vision_tower.vision_model.encoder.layers.2.layer_norm1.weight'"},
      {"config.json", [](json& c) { c["vision_config"]["num_hidden_layers"] = 1; },
       "more ViT blocks than vision_config.num_hidden_layers = 1"},
      {"config.json", [](json& c) { c["vision_config"]["image_size"] = 30; },
       "image size 30 is not a multiple of the patch size 8"},
      {"config.json", [](json& c) { c["vision_config"]["hidden_size"] = 32; },
       "tensor 'vision_tower.vision_model.embeddings.patch_embedding.weight' has shape [64, 3, 8, "
       "8], expected [32, 3, 8, 8]"},
      {"config.json", [](json& c) { c["vision_config"]["layer_norm_eps"] = "small"; },
       "vision_config.layer_norm_eps must be a number in (0, 1)"},
      {"preprocessor_config.json",
       [](json& p) {
         p["image_std"] = {0.5, 0.0, 0.5};
       },
       "image_std must be positive"},
      {"preprocessor_config.json", [](json& p) { p["image_mean"] = {0.5}; },
       "\"image_mean\" must be a list of 3 numbers"},
  };
  testing::TempDir dir;
  ASSERT_NO_FATAL_FAILURE(testing::write_llava_hf_twin(shared, dir));
  for (const BadConfig& c : cases) {
    SCOPED_TRACE(c.error);
    const std::string good = testing::read_text_file(dir.file(c.file));
    json j = json::parse(good);
    c.edit(j);
    dir.write(c.file, j.dump());
    auto vm = model::load_vision_model(dir.path());
    ASSERT_FALSE(vm);
    EXPECT_NE(vm.error().message.find(c.error), std::string::npos) << vm.error().message;
    EXPECT_NE(vm.error().message.find(dir.path()), std::string::npos) << vm.error().message;
    dir.write(c.file, good);
  }
  ASSERT_TRUE(model::load_vision_model(dir.path()));  // every edit undone
  // A directory without config.json says so.
  testing::TempDir empty;
  auto none = model::load_vision_model(empty.path());
  ASSERT_FALSE(none);
  EXPECT_NE(none.error().message.find("no config.json"), std::string::npos) << none.error().message;
}

// A LLaVA checkpoint whose language model troupe has no defaults for is refused by its
// model_type, naming the file, and the known ones still load.
TEST(HfVision, AnUnknownLlavaTextModelIsRefusedByName) {
  TROUPE_SHARED_OR_SKIP(shared);
  testing::TempDir dir;
  ASSERT_NO_FATAL_FAILURE(testing::write_llava_hf_twin(shared, dir));
  const std::string good = testing::read_text_file(dir.file("config.json"));
  json j = json::parse(good);
  j["text_config"]["model_type"] = "phi3";
  dir.write("config.json", j.dump());
  auto text = model::load_model(dir.path());
  ASSERT_FALSE(text);
  EXPECT_NE(text.error().message.find("text_config.model_type 'phi3' is not supported for "
                                      "LlavaForConditionalGeneration"),
            std::string::npos)
      << text.error().message;
  EXPECT_NE(text.error().message.find(dir.file("config.json")), std::string::npos)
      << text.error().message;
  dir.write("config.json", good);
  EXPECT_TRUE(model::load_model(dir.path()));
}

}  // namespace
}  // namespace troupe::compute
