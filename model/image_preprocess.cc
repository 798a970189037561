// Resize, fit-and-pad and normalisation of RGB images for vision encoders, reproducing the
// float32 arithmetic of llama.cpp's tools/mtmd img_tool (commit 18ef86ece) operation by
// operation so that the encoder input is bit-identical to libmtmd's.
// NOTE: this file is compiled with -ffp-contract=off (model/CMakeLists.txt): llama.cpp's build of
// this code has no FMA (no -march), and a fused a*b+c rounds once where it rounds twice, which
// would move some bytes by one level after truncation.
#include <algorithm>
#include <cmath>

#include "base/check.h"
#include "model/image.h"

namespace troupe::model {

namespace {

void check_resize_args(const Image& src, int32_t width, int32_t height) {
  TROUPE_CHECK(
      src.width > 0 && src.height > 0 && src.rgb.size() == size_t{3} * src.width * src.height,
      "image of %dx%d with %zu bytes", src.width, src.height, src.rgb.size());
  TROUPE_CHECK(width > 0 && height > 0, "resize to %dx%d", width, height);
}

Image blank(int32_t width, int32_t height) {
  Image img;
  img.width = width;
  img.height = height;
  img.rgb.resize(size_t{3} * width * height);
  return img;
}

// One step of the ViT.cpp cubic: the value at fraction t in [0, 1) between p1 and p2 of four
// samples p0..p3 one apart. The coefficients are formed in double (llama.cpp writes them as
// double literals times float differences) and stored as float; the polynomial is then
// evaluated in float, left to right, exactly as there.
float cubic(float p0, float p1, float p2, float p3, float t) {
  float d0 = p0 - p1;
  float d2 = p2 - p1;
  float d3 = p3 - p1;
  float a0 = p1;
  auto a1 = static_cast<float>(-1.0 / 3 * d0 + d2 - 1.0 / 6 * d3);
  auto a2 = static_cast<float>(1.0 / 2 * d0 + 1.0 / 2 * d2);
  auto a3 = static_cast<float>(-1.0 / 6 * d0 - 1.0 / 2 * d2 + 1.0 / 6 * d3);
  return a0 + a1 * t + a2 * t * t + a3 * t * t * t;
}

// Linear interpolation as llama.cpp's: s + (e - s) * t in float.
float lerp(float s, float e, float t) { return s + (e - s) * t; }

}  // namespace

Image resize_bicubic(const Image& src, int32_t width, int32_t height) {
  check_resize_args(src, width, height);
  const int32_t nx = src.width, ny = src.height;
  Image dst = blank(width, height);
  // Source step per destination pixel, float32. Position j maps to tx * j: no half-pixel
  // centring, so the image shifts by up to a pixel towards the top-left; that is the reference.
  const float tx = static_cast<float>(nx) / static_cast<float>(width);
  const float ty = static_cast<float>(ny) / static_cast<float>(height);
  auto at = [&](int32_t x, int32_t y, int c) -> float {
    x = std::clamp(x, 0, nx - 1);
    y = std::clamp(y, 0, ny - 1);
    return src.rgb[(size_t{3} * (static_cast<size_t>(y) * nx + x)) + c];
  };
  for (int32_t i = 0; i < height; ++i) {
    const auto y = static_cast<int32_t>(ty * static_cast<float>(i));
    const float dy = ty * static_cast<float>(i) - static_cast<float>(y);
    for (int32_t j = 0; j < width; ++j) {
      const auto x = static_cast<int32_t>(tx * static_cast<float>(j));
      const float dx = tx * static_cast<float>(j) - static_cast<float>(x);
      for (int c = 0; c < 3; ++c) {
        float col[4];  // the cubic along x on rows y-1 .. y+2
        for (int r = 0; r < 4; ++r) {
          int32_t yy = y - 1 + r;
          col[r] = cubic(at(x - 1, yy, c), at(x, yy, c), at(x + 1, yy, c), at(x + 2, yy, c), dx);
        }
        float v = cubic(col[0], col[1], col[2], col[3], dy);
        // Round half away from zero (std::round), clamp, then store as a byte.
        v = std::min(std::max(std::round(v), 0.0f), 255.0f);
        dst.rgb[(size_t{3} * (static_cast<size_t>(i) * width + j)) + c] = static_cast<uint8_t>(v);
      }
    }
  }
  return dst;
}

Image resize_bilinear(const Image& src, int32_t width, int32_t height) {
  check_resize_args(src, width, height);
  const int32_t nx = src.width, ny = src.height;
  Image dst = blank(width, height);
  // Align-corners step (n_src - 1) / (n_dst - 1) in float32: the first and last destination
  // pixels sit exactly on the first and last source pixels. A 1-pixel destination samples the
  // first source pixel.
  const float x_ratio =
      width > 1 ? static_cast<float>(nx - 1) / static_cast<float>(width - 1) : 0.0f;
  const float y_ratio =
      height > 1 ? static_cast<float>(ny - 1) / static_cast<float>(height - 1) : 0.0f;
  auto at = [&](int32_t x, int32_t y, int c) -> float {
    return src.rgb[(size_t{3} * (static_cast<size_t>(y) * nx + x)) + c];
  };
  for (int32_t y = 0; y < height; ++y) {
    const float py = y_ratio * static_cast<float>(y);
    // The last row lands on n_src - 1 exactly: step back to n_src - 2 with weight 1 so that the
    // second sample stays inside. A 1-pixel source uses its only row twice.
    const int32_t y0 = std::max(std::min(static_cast<int32_t>(py), ny - 2), 0);
    const float fy = py - static_cast<float>(y0);
    const int32_t y1 = std::min(y0 + 1, ny - 1);
    for (int32_t x = 0; x < width; ++x) {
      const float px = x_ratio * static_cast<float>(x);
      const int32_t x0 = std::max(std::min(static_cast<int32_t>(px), nx - 2), 0);
      const float fx = px - static_cast<float>(x0);
      const int32_t x1 = std::min(x0 + 1, nx - 1);
      for (int c = 0; c < 3; ++c) {
        float top = lerp(at(x0, y0, c), at(x1, y0, c), fx);
        float bottom = lerp(at(x0, y1, c), at(x1, y1, c), fx);
        // Truncation, not rounding: a float -> uint8 conversion, as there.
        dst.rgb[(size_t{3} * (static_cast<size_t>(y) * width + x)) + c] =
            static_cast<uint8_t>(lerp(top, bottom, fy));
      }
    }
  }
  return dst;
}

FitGeometry fit_geometry(int32_t width, int32_t height, int32_t size) {
  TROUPE_CHECK(width > 0 && height > 0 && size > 0, "fit %dx%d into %d", width, height, size);
  // float32 as llama.cpp, rounding included: a 13x26 image fits in 224 as 113x224 in float
  // (13 * (224.0f / 26) lands a hair above 112) but as 112x224 in double.
  const float scale = std::min(static_cast<float>(size) / static_cast<float>(width),
                               static_cast<float>(size) / static_cast<float>(height));
  FitGeometry g;
  g.width = std::min(static_cast<int32_t>(std::ceil(static_cast<float>(width) * scale)), size);
  g.height = std::min(static_cast<int32_t>(std::ceil(static_cast<float>(height) * scale)), size);
  g.offset_x = (size - g.width) / 2;
  g.offset_y = (size - g.height) / 2;
  return g;
}

Image fit_and_pad(const Image& src, int32_t size, ImagePreprocess::Resize resize,
                  std::array<uint8_t, 3> pad_rgb) {
  check_resize_args(src, size, size);
  if (src.width == size && src.height == size) return src;  // llama.cpp copies, never resizes
  const FitGeometry g = fit_geometry(src.width, src.height, size);
  const Image fitted = resize == ImagePreprocess::Resize::kBicubic
                           ? resize_bicubic(src, g.width, g.height)
                           : resize_bilinear(src, g.width, g.height);
  Image dst = blank(size, size);
  for (size_t i = 0; i < dst.rgb.size(); i += 3)
    std::copy(pad_rgb.begin(), pad_rgb.end(), &dst.rgb[i]);
  for (int32_t y = 0; y < g.height; ++y) {
    const uint8_t* row = &fitted.rgb[size_t{3} * y * g.width];
    uint8_t* out =
        &dst.rgb[size_t{3} * ((static_cast<size_t>(y) + g.offset_y) * size + g.offset_x)];
    std::copy(row, row + size_t{3} * g.width, out);
  }
  return dst;
}

std::vector<float> normalize_planar(const Image& img, std::array<float, 3> mean,
                                    std::array<float, 3> std) {
  TROUPE_CHECK(img.rgb.size() == size_t{3} * img.width * img.height,
               "image of %dx%d with %zu bytes", img.width, img.height, img.rgb.size());
  const size_t plane = static_cast<size_t>(img.width) * img.height;
  std::vector<float> out(3 * plane);
  for (size_t i = 0; i < plane; ++i) {
    for (size_t c = 0; c < 3; ++c) {
      // Two roundings, as llama.cpp: u8 / 255.0f, minus mean, then a true division by std
      // (multiplying by 1/std would differ in the last bit for some values).
      const float v = static_cast<float>(img.rgb[3 * i + c]) / 255.0f;
      out[c * plane + i] = (v - mean[c]) / std[c];
    }
  }
  return out;
}

std::vector<float> preprocess_image(const Image& img, const ImagePreprocess& p) {
  return normalize_planar(fit_and_pad(img, p.image_size, p.resize, p.pad_rgb), p.mean, p.std);
}

}  // namespace troupe::model
