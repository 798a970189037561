// Tests of model/image_preprocess.cc: the golden encoder inputs libmtmd (llama.cpp 18ef86ece)
// computed from the shared PNGs, for LLaVA (bicubic, grey-ish padding) and Gemma 3 (bilinear,
// black padding), must come out bit-identical; plus the corner cases of the resize and pad.
#include <cmath>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "model/image.h"
#include "tests/test_support.h"

namespace troupe::model {
namespace {

using nlohmann::json;

// The preprocessing block of a golden case.json as our parameters. The JSON numbers are the
// float32 values printed to 8 significant digits, so float(double(text)) restores them exactly.
ImagePreprocess params_of(const json& pre) {
  ImagePreprocess p;
  p.image_size = pre.at("target_size").at(0).get<int32_t>();
  EXPECT_EQ(pre.at("target_size").at(1).get<int32_t>(), p.image_size);
  const std::string algo = pre.at("resize_algorithm").get<std::string>();
  EXPECT_TRUE(algo.rfind("bicubic", 0) == 0 || algo.rfind("bilinear", 0) == 0) << algo;
  p.resize = algo.rfind("bicubic", 0) == 0 ? ImagePreprocess::Resize::kBicubic
                                           : ImagePreprocess::Resize::kBilinear;
  for (int c = 0; c < 3; ++c) {
    p.pad_rgb[c] = pre.at("pad_color_rgb").at(c).get<uint8_t>();
    p.mean[c] = static_cast<float>(pre.at("image_mean").at(c).get<double>());
    p.std[c] = static_cast<float>(pre.at("image_std").at(c).get<double>());
  }
  return p;
}

// Runs one golden case directory: decode its image, check the fit geometry and the encoder
// input. Returns the number of values that are not bit-identical.
size_t check_case(const std::string& shared, const std::string& dir) {
  SCOPED_TRACE(dir);
  const json c = json::parse(testing::read_text_file(dir + "/case.json"));
  const json& pre = c.at("preprocessing");
  const ImagePreprocess p = params_of(pre);
  std::string image = c.at("image_file").get<std::string>();  // "shared/golden/vlm/images/..."
  image = shared + image.substr(image.find('/'));
  auto img = read_image_file(image);
  EXPECT_TRUE(img.has_value()) << img.error().message;
  if (!img.has_value()) return 1;

  const FitGeometry g = fit_geometry(img->width, img->height, p.image_size);
  EXPECT_EQ(g.width, pre.at("fit_size_wh").at(0).get<int32_t>());
  EXPECT_EQ(g.height, pre.at("fit_size_wh").at(1).get<int32_t>());
  EXPECT_EQ(g.offset_x, pre.at("paste_offset_xy").at(0).get<int32_t>());
  EXPECT_EQ(g.offset_y, pre.at("paste_offset_xy").at(1).get<int32_t>());

  const std::vector<float> got = preprocess_image(*img, p);
  const std::vector<float> want = testing::read_f32_file(dir + "/preprocessed.f32");
  EXPECT_EQ(got.size(), want.size());
  size_t differ = 0;
  float max_diff = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) {
      ++differ;
      max_diff = std::max(max_diff, std::fabs(got[i] - want[i]));
    }
  }
  EXPECT_EQ(differ, 0u) << "values differing: " << differ << " of " << want.size()
                        << ", max abs diff " << max_diff;
  return differ;
}

std::vector<std::string> case_dirs(const std::string& root, const std::string& prefix) {
  std::vector<std::string> dirs;
  for (const auto& e : std::filesystem::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0 && testing::file_exists(e.path().string() + "/case.json")) {
      dirs.push_back(e.path().string());
    }
  }
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

TEST(ImageGolden, LlavaPreprocessIsBitExact) {
  TROUPE_SHARED_OR_SKIP(shared);
  const auto dirs = case_dirs(shared + "/golden/vlm", "llava-tiny__");
  ASSERT_EQ(dirs.size(), 3u);
  for (const auto& d : dirs) check_case(shared, d);
}

TEST(ImageGolden, Gemma3PreprocessIsBitExact) {
  TROUPE_SHARED_OR_SKIP(shared);
  const auto dirs = case_dirs(shared + "/golden/vlm-encoder/tinygemma3", "");
  ASSERT_EQ(dirs.size(), 3u);
  for (const auto& d : dirs) check_case(shared, d);
}

Image make_image(int32_t w, int32_t h, unsigned seed) {
  Image img;
  img.width = w;
  img.height = h;
  img.rgb.resize(size_t{3} * w * h);
  uint32_t s = seed;
  for (auto& b : img.rgb) {
    s = s * 1664525u + 1013904223u;
    b = static_cast<uint8_t>(s >> 24);
  }
  return img;
}

TEST(ImageFit, GeometryRoundsUpInFloat32AndCentres) {
  auto expect = [](int32_t w, int32_t h, int32_t s, FitGeometry want) {
    const FitGeometry g = fit_geometry(w, h, s);
    EXPECT_EQ(g.width, want.width) << w << "x" << h << " in " << s;
    EXPECT_EQ(g.height, want.height) << w << "x" << h << " in " << s;
    EXPECT_EQ(g.offset_x, want.offset_x) << w << "x" << h << " in " << s;
    EXPECT_EQ(g.offset_y, want.offset_y) << w << "x" << h << " in " << s;
  };
  expect(50, 40, 32, {32, 26, 0, 3});  // 40 * 0.64f = 25.6 -> 26
  expect(40, 50, 32, {26, 32, 3, 0});
  expect(64, 64, 32, {32, 32, 0, 0});
  expect(16, 16, 32, {32, 32, 0, 0});   // upscaled
  expect(1, 1000, 32, {1, 32, 15, 0});  // ceil keeps a sliver at least a pixel wide
  expect(336, 200, 336, {336, 200, 0, 68});
  expect(333, 1000, 336, {112, 336, 112, 0});  // 333 * 0.336f = 111.888 -> 112
  expect(13, 26, 224, {113, 224, 55, 0});      // float32 rounding: 112 in double
}

TEST(ImageFit, SquareTargetSizeIsCopiedOtherSizesResized) {
  const Image sq = make_image(32, 32, 1);
  for (auto algo : {ImagePreprocess::Resize::kBicubic, ImagePreprocess::Resize::kBilinear}) {
    EXPECT_EQ(fit_and_pad(sq, 32, algo, {1, 2, 3}).rgb, sq.rgb);
  }
  // 32x20 fits at its own size; llama.cpp still runs the resize, which at scale 1 is the
  // identity for both algorithms, then pads 6 rows above and below.
  const Image wide = make_image(32, 20, 2);
  const Image bicubic = fit_and_pad(wide, 32, ImagePreprocess::Resize::kBicubic, {9, 8, 7});
  const Image bilinear = fit_and_pad(wide, 32, ImagePreprocess::Resize::kBilinear, {9, 8, 7});
  for (const Image* img : {&bicubic, &bilinear}) {
    EXPECT_EQ(std::memcmp(&img->rgb[3 * 32 * 6], wide.rgb.data(), wide.rgb.size()), 0);
    EXPECT_EQ(img->width, 32);
    EXPECT_EQ(img->height, 32);
    for (int y : {0, 5, 26, 31}) {  // rows 0-5 and 26-31 are padding
      EXPECT_EQ(img->rgb[3 * 32 * y + 0], 9);
      EXPECT_EQ(img->rgb[3 * 32 * y + 1], 8);
      EXPECT_EQ(img->rgb[3 * 32 * y + 2], 7);
    }
  }
}

TEST(ImageResize, SameSizeIsTheIdentity) {
  const Image img = make_image(13, 7, 3);
  EXPECT_EQ(resize_bicubic(img, 13, 7).rgb, img.rgb);
  EXPECT_EQ(resize_bilinear(img, 13, 7).rgb, img.rgb);
}

TEST(ImageResize, BilinearAlignsCorners) {
  // The four corner pixels of the destination are the source's corners, whatever the scale.
  const Image img = make_image(50, 40, 8);
  for (auto [w, h] : {std::pair{32, 26}, std::pair{7, 3}, std::pair{97, 61}}) {
    const Image r = resize_bilinear(img, w, h);
    auto px = [](const Image& im, int x, int y) {
      return &im.rgb[3 * (size_t{1} * y * im.width + x)];
    };
    EXPECT_EQ(std::memcmp(px(r, 0, 0), px(img, 0, 0), 3), 0);
    EXPECT_EQ(std::memcmp(px(r, w - 1, 0), px(img, 49, 0), 3), 0);
    EXPECT_EQ(std::memcmp(px(r, 0, h - 1), px(img, 0, 39), 3), 0);
    EXPECT_EQ(std::memcmp(px(r, w - 1, h - 1), px(img, 49, 39), 3), 0);
  }
}

TEST(ImageResize, ConstantImagesStayConstant) {
  Image grey = make_image(9, 5, 4);
  for (size_t i = 0; i < grey.rgb.size(); ++i) grey.rgb[i] = static_cast<uint8_t>(100 + i % 3);
  for (auto [w, h] : {std::pair{4, 3}, std::pair{20, 11}, std::pair{1, 1}}) {
    const Image c = resize_bicubic(grey, w, h);
    const Image l = resize_bilinear(grey, w, h);
    for (size_t i = 0; i < c.rgb.size(); ++i) {
      EXPECT_EQ(c.rgb[i], 100 + i % 3);
      EXPECT_EQ(l.rgb[i], 100 + i % 3);
    }
  }
}

TEST(ImageResize, OnePixelSourcesAreSafe) {
  // llama.cpp's bilinear reads one past a 1-pixel row; ours repeats the edge (ASan checks).
  for (auto [w, h] : {std::pair{1, 1}, std::pair{1, 9}, std::pair{9, 1}}) {
    const Image src = make_image(w, h, 5);
    EXPECT_EQ(resize_bilinear(src, 16, 16).rgb.size(), 16u * 16 * 3);
    EXPECT_EQ(resize_bicubic(src, 16, 16).rgb.size(), 16u * 16 * 3);
    EXPECT_EQ(preprocess_image(src, {.image_size = 8,
                                     .resize = ImagePreprocess::Resize::kBilinear,
                                     .pad_rgb = {0, 0, 0},
                                     .mean = {0.5f, 0.5f, 0.5f},
                                     .std = {0.5f, 0.5f, 0.5f}})
                  .size(),
              3u * 8 * 8);
  }
  const Image one = make_image(1, 1, 6);
  const Image up = resize_bilinear(one, 3, 2);
  for (size_t i = 0; i < up.rgb.size(); ++i) EXPECT_EQ(up.rgb[i], one.rgb[i % 3]);
}

TEST(ImageNormalize, PlanarDivisionInFloat32) {
  Image img = make_image(3, 2, 7);
  const std::array<float, 3> mean = {0.48145467f, 0.45782751f, 0.40821072f};
  const std::array<float, 3> stdev = {0.26862955f, 0.26130259f, 0.2757771f};
  const std::vector<float> v = normalize_planar(img, mean, stdev);
  ASSERT_EQ(v.size(), 18u);
  for (int c = 0; c < 3; ++c) {
    for (int i = 0; i < 6; ++i) {
      const float u = static_cast<float>(img.rgb[3 * i + c]) / 255.0f;
      const float want = (u - mean[c]) / stdev[c];
      EXPECT_EQ(std::memcmp(&v[c * 6 + i], &want, 4), 0) << "channel " << c << " pixel " << i;
    }
  }
}

}  // namespace
}  // namespace troupe::model
