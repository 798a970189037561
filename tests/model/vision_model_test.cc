// The mmproj (vision encoder) reader: the shared LLaVA-style and Gemma 3 files load with the
// shapes their metadata promise, and each kind of bad file gets an error naming the file and
// the key or tensor at fault.
#include <string>

#include <gtest/gtest.h>

#include "model/vision.h"
#include "tests/edited_model.h"
#include "tests/test_support.h"

namespace troupe::model {
namespace {

TEST(VisionModel, LlavaTinyLoads) {
  TROUPE_SHARED_OR_SKIP(shared);
  auto m = load_vision_model(shared + "/models/synth/llava-tiny/mmproj.gguf");
  ASSERT_TRUE(m) << m.error().message;
  const VisionSpec& s = (*m)->spec;
  EXPECT_EQ(s.projector, Projector::kMlp);
  EXPECT_EQ(s.act, VisionAct::kGelu);
  EXPECT_EQ(s.image_size, 32);
  EXPECT_EQ(s.patch_size, 8);
  EXPECT_EQ(s.n_pos(), 17);  // 16 patches and the class token
  EXPECT_EQ(s.n_image_tokens(), 16);
  EXPECT_EQ(s.n_layer_run, 2);  // clip.vision.feature_layer = [2]: both blocks
  EXPECT_EQ(s.n_embd_out, 128);
  const ImagePreprocess p = s.preprocess();
  EXPECT_EQ(p.resize, ImagePreprocess::Resize::kBicubic);
  EXPECT_EQ(p.pad_rgb, (std::array<uint8_t, 3>{122, 116, 104}));
}

TEST(VisionModel, TinyGemma3Loads) {
  TROUPE_SHARED_OR_SKIP(shared);
  auto m = load_vision_model(shared + "/models/tinygemma3-mmproj/mmproj-tinygemma3.gguf");
  ASSERT_TRUE(m) << m.error().message;
  const VisionSpec& s = (*m)->spec;
  EXPECT_EQ(s.projector, Projector::kGemma3);
  EXPECT_EQ(s.n_pos(), 256);  // no class token
  EXPECT_EQ(s.n_image_tokens(), 256);
  EXPECT_EQ(s.n_layer_run, 4);
  EXPECT_TRUE(s.post_ln_w.present());
  EXPECT_EQ(s.input_proj.rows(), 128);
  EXPECT_EQ(s.preprocess().resize, ImagePreprocess::Resize::kBilinear);
  EXPECT_EQ(s.preprocess().pad_rgb, (std::array<uint8_t, 3>{0, 0, 0}));
}

// Loads an edited copy of the LLaVA-style mmproj and expects an error containing `what`.
void expect_refused(const std::string& shared, const std::function<void(GgufWriter&)>& edit,
                    const std::string& what, const std::vector<testing::ExtraTensor>& extra = {},
                    const std::vector<std::string>& drop = {}) {
  testing::TempDir dir;
  const std::string path = testing::edited_gguf(
      dir, "mmproj.gguf", shared + "/models/synth/llava-tiny/mmproj.gguf", edit, extra, drop);
  ASSERT_FALSE(path.empty());
  auto m = load_vision_model(path);
  ASSERT_FALSE(m) << "loaded although: " << what;
  EXPECT_NE(m.error().message.find(what), std::string::npos) << m.error().message;
  EXPECT_NE(m.error().message.find(path), std::string::npos) << m.error().message;
}

// LLaVA 1.5's files say projection_dim 768 (CLIP's own projection) while the projector writes
// 4096-wide rows: the width comes from the projector's tensors, as llama.cpp takes it.
TEST(VisionModel, OutputWidthComesFromTheProjector) {
  TROUPE_SHARED_OR_SKIP(shared);
  testing::TempDir dir;
  const std::string path =
      testing::edited_gguf(dir, "mmproj.gguf", shared + "/models/synth/llava-tiny/mmproj.gguf",
                           [](GgufWriter& w) { w.set_u32("clip.vision.projection_dim", 768); });
  auto m = load_vision_model(path);
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ((*m)->spec.n_embd_out, 128);
}

TEST(VisionModel, BadFilesAreRefusedWithTheirReason) {
  TROUPE_SHARED_OR_SKIP(shared);
  auto none = [](GgufWriter&) {};
  expect_refused(
      shared, [](GgufWriter& w) { w.set_string("clip.projector_type", "resampler"); },
      "projector type 'resampler' is not supported");
  expect_refused(
      shared, [](GgufWriter& w) { w.set_string("general.architecture", "llama"); },
      "not a vision encoder");
  expect_refused(
      shared, [](GgufWriter& w) { w.set_bool("clip.has_vision_encoder", false); },
      "has no vision encoder");
  expect_refused(
      shared, [](GgufWriter& w) { w.set_u32("clip.vision.image_size", 30); },
      "not a multiple of the patch size");
  expect_refused(
      shared, [](GgufWriter& w) { w.set_u32("clip.vision.attention.head_count", 5); },
      "not a multiple of the head count");
  expect_refused(
      shared, [](GgufWriter& w) { w.set_u32("clip.vision.block_count", 3); },
      "block_count is 3 but the file has 2 blocks");
  expect_refused(
      shared,
      [](GgufWriter& w) {
        const float s[3] = {0.5f, 0.f, 0.5f};
        w.set_array_f32("clip.vision.image_std", s);
      },
      "image_std must be positive");
  expect_refused(
      shared,
      [](GgufWriter& w) {
        const float s[2] = {0.5f, 0.5f};
        w.set_array_f32("clip.vision.image_mean", s);
      },
      "image_mean must be an array of 3");
  expect_refused(
      shared,
      [](GgufWriter& w) {
        const int32_t f[1] = {7};
        w.set_array_i32("clip.vision.feature_layer", f);
      },
      "feature layer 7 is outside 0..2");
  expect_refused(
      shared, [](GgufWriter& w) { w.set_bool("clip.use_silu", true); },
      "both clip.use_gelu and clip.use_silu");
  expect_refused(
      shared,
      [](GgufWriter& w) {
        const int32_t grid[4] = {336, 672, 672, 336};
        w.set_array_i32("clip.vision.image_grid_pinpoints", grid);
      },
      "LLaVA-1.6 tiling");
  expect_refused(
      shared, [](GgufWriter& w) { w.remove_key("clip.vision.patch_size"); },
      "clip.vision.patch_size");
  expect_refused(shared, none, "missing tensor 'v.blk.1.attn_q.weight'", {},
                 {"v.blk.1.attn_q.weight"});
  expect_refused(shared, none, "tensor 'v.class_embd' has shape [63]",
                 {{"v.class_embd", std::vector<float>(63, 0.f)}}, {"v.class_embd"});
  expect_refused(shared, none, "needs the class token", {}, {"v.class_embd"});
  expect_refused(shared, none, "missing tensor 'mm.0.weight'", {}, {"mm.0.weight"});
}

}  // namespace
}  // namespace troupe::model
