// libFuzzer entry for the image decoder (model/image.cc, libpng and libjpeg-turbo behind it):
// decodes the input and, when it decodes, checks the image and preprocesses it to a small encoder
// input with both resize algorithms (model/image_preprocess.cc). An error must be one line that
// names the input. Built by tests/fuzz/CMakeLists.txt; run by scripts/fuzz-smoke.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include "model/image.h"

namespace {

using troupe::model::Image;
using troupe::model::ImagePreprocess;

constexpr const char* kWhat = "fuzz input";

void require(bool ok) {
  if (!ok) std::abort();  // a broken contract: report as a crash
}

// Smaller than the defaults so that one input stays in the fuzzer's time and memory budget.
const troupe::model::ImageLimits kLimits{.max_pixels = int64_t{1} << 22, .max_side = 4096};

volatile float g_sink = 0;

void preprocess(const Image& img, ImagePreprocess::Resize resize, int32_t size) {
  const ImagePreprocess p{.image_size = size,
                          .resize = resize,
                          .pad_rgb = {122, 116, 104},
                          .mean = {0.5f, 0.5f, 0.5f},
                          .std = {0.25f, 0.5f, 1.0f}};
  const std::vector<float> v = troupe::model::preprocess_image(img, p);
  require(v.size() == size_t{3} * size * size);
  float s = 0;
  for (float x : v) {
    require(x >= -2.0f && x <= 2.0f);  // (u8/255 - 0.5) / 0.25 at most
    s += x;
  }
  g_sink = g_sink + s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto r = troupe::model::decode_image(std::span<const uint8_t>(data, size), kWhat, kLimits);
  if (!r.has_value()) {
    const std::string& m = r.error().message;
    require(m.rfind(std::string(kWhat) + ": ", 0) == 0);
    require(m.find('\n') == std::string::npos);
    return 0;
  }
  const Image& img = *r;
  require(img.width > 0 && img.height > 0 && img.width <= kLimits.max_side &&
          img.height <= kLimits.max_side);
  require(int64_t{img.width} * img.height <= kLimits.max_pixels);
  require(img.rgb.size() == size_t{3} * img.width * img.height);
  preprocess(img, ImagePreprocess::Resize::kBicubic, 8);
  preprocess(img, ImagePreprocess::Resize::kBilinear, 7);
  return 0;
}
