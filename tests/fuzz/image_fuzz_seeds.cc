// Writes the image fuzzer's seed corpus: small PNGs in every layout the decoder handles (each
// colour type and bit depth, palette with tRNS, Adam7), JPEGs (baseline, progressive, 4:2:0,
// grey, Adobe CMYK), and truncations of some of them. Fails when a seed does not decode.
// Usage: image_fuzz_seeds DIR
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include "model/image.h"
#include "tests/image_writers.h"

namespace {

using troupe::testing::JpegSpec;
using troupe::testing::PngSpec;

std::vector<uint8_t> bytes(size_t n, unsigned seed) {
  std::vector<uint8_t> v(n);
  uint32_t s = seed;
  for (auto& b : v) {
    s = s * 1664525u + 1013904223u;
    b = static_cast<uint8_t>(s >> 24);
  }
  return v;
}

bool save(const std::filesystem::path& dir, const std::string& name, const std::string& data,
          bool must_decode) {
  if (data.empty()) {
    std::fprintf(stderr, "image_fuzz_seeds: %s: the encoder failed\n", name.c_str());
    return false;
  }
  if (must_decode) {
    std::span<const uint8_t> b(reinterpret_cast<const uint8_t*>(data.data()), data.size());
    auto img = troupe::model::decode_image(b, name);
    if (!img.has_value()) {
      std::fprintf(stderr, "image_fuzz_seeds: %s\n", img.error().message.c_str());
      return false;
    }
  }
  std::ofstream(dir / name, std::ios::binary) << data;
  return true;
}

std::vector<std::pair<std::string, PngSpec>> png_specs() {
  std::vector<std::pair<std::string, PngSpec>> out;
  auto add = [&](const std::string& name, int color, int depth, bool interlaced) {
    PngSpec s;
    s.width = 11;
    s.height = 7;
    s.color_type = color;
    s.bit_depth = depth;
    s.interlaced = interlaced;
    s.samples =
        bytes(troupe::testing::png_row_bytes(s) * s.height, static_cast<unsigned>(out.size()));
    if (color == PNG_COLOR_TYPE_PALETTE) {
      for (int i = 0; i < (1 << depth); ++i) {
        s.palette.push_back({static_cast<png_byte>(i * 7), static_cast<png_byte>(255 - i), 9});
      }
      s.palette_alpha = {0, 200};
    }
    out.emplace_back(name, s);
  };
  add("rgb8.png", PNG_COLOR_TYPE_RGB, 8, false);
  add("rgb16-adam7.png", PNG_COLOR_TYPE_RGB, 16, true);
  add("rgba8.png", PNG_COLOR_TYPE_RGB_ALPHA, 8, false);
  add("rgba16.png", PNG_COLOR_TYPE_RGB_ALPHA, 16, false);
  add("grey1.png", PNG_COLOR_TYPE_GRAY, 1, false);
  add("grey4-adam7.png", PNG_COLOR_TYPE_GRAY, 4, true);
  add("grey16.png", PNG_COLOR_TYPE_GRAY, 16, false);
  add("greyalpha8.png", PNG_COLOR_TYPE_GRAY_ALPHA, 8, false);
  add("palette2.png", PNG_COLOR_TYPE_PALETTE, 2, false);
  add("palette8-adam7.png", PNG_COLOR_TYPE_PALETTE, 8, true);
  return out;
}

std::vector<std::pair<std::string, JpegSpec>> jpeg_specs() {
  std::vector<std::pair<std::string, JpegSpec>> out;
  auto add = [&](const std::string& name, J_COLOR_SPACE space, int comps, bool prog, bool full) {
    JpegSpec j;
    j.width = 19;
    j.height = 13;
    j.space = space;
    j.components = comps;
    j.quality = 90;
    j.progressive = prog;
    j.full_chroma = full;
    j.samples = bytes(size_t{19} * 13 * comps, static_cast<unsigned>(100 + out.size()));
    out.emplace_back(name, j);
  };
  add("baseline444.jpg", JCS_RGB, 3, false, true);
  add("baseline420.jpg", JCS_RGB, 3, false, false);
  add("progressive.jpg", JCS_RGB, 3, true, false);
  add("grey.jpg", JCS_GRAYSCALE, 1, false, true);
  add("cmyk.jpg", JCS_CMYK, 4, false, true);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: image_fuzz_seeds DIR\n");
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);
  bool ok = true;
  for (const auto& [name, spec] : png_specs()) {
    const std::string png = troupe::testing::encode_png(spec);
    ok &= save(dir, name, png, true);
    if (name == "rgb8.png") {  // cut in IHDR, in IDAT and before IEND
      for (size_t cut : {size_t{20}, png.size() / 2, png.size() - 12}) {
        ok &= save(dir, "cut" + std::to_string(cut) + "-" + name, png.substr(0, cut), false);
      }
    }
  }
  for (const auto& [name, spec] : jpeg_specs()) {
    const std::string jpg = troupe::testing::encode_jpeg(spec);
    ok &= save(dir, name, jpg, true);
    if (name == "progressive.jpg") {
      ok &= save(dir, "cut-" + name, jpg.substr(0, jpg.size() / 2), false);
    }
  }
  return ok ? 0 : 1;
}
