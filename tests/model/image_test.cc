// Tests of model/image.cc, the PNG/JPEG decoder: the golden PNGs against the RGB bytes libmtmd
// (stb_image) decoded from them, every PNG layout against the RGB stb_image would give, a JPEG
// round trip, and one test per kind of bad input, each asserting the error names the input.
#include "model/image.h"

#include <cstring>

#include "tests/image_writers.h"
#include "tests/test_support.h"

namespace troupe::model {
namespace {

using testing::encode_jpeg;
using testing::encode_png;
using testing::encode_rgb_png;
using testing::JpegSpec;
using testing::PngSpec;

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE((haystack).find(needle), std::string::npos) << "message: " << (haystack)

std::span<const uint8_t> as_bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

Result<Image> decode(const std::string& bytes, const ImageLimits& limits = {}) {
  return decode_image(as_bytes(bytes), "pic.png", limits);
}

// The error of decoding `bytes` as "pic.png"; fails the test when it decodes.
Error decode_error(const std::string& bytes, const ImageLimits& limits = {}) {
  auto r = decode(bytes, limits);
  EXPECT_FALSE(r.has_value()) << "decoded a " << r->width << "x" << r->height << " image";
  if (r.has_value()) return Error{};
  EXPECT_EQ(r.error().message.rfind("pic.png: ", 0), 0u) << r.error().message;
  EXPECT_EQ(r.error().message.find('\n'), std::string::npos) << r.error().message;
  return r.error();
}

// Deterministic test samples: a byte pattern that exercises every bit.
std::vector<uint8_t> pattern(size_t n, unsigned seed) {
  std::vector<uint8_t> v(n);
  uint32_t s = seed * 2654435761u + 1;
  for (auto& b : v) {
    s = s * 1664525u + 1013904223u;
    b = static_cast<uint8_t>(s >> 24);
  }
  return v;
}

// A 23x17 image: odd sizes make every Adam7 pass partial.
constexpr int kW = 23, kH = 17;

PngSpec spec(int color_type, int depth, std::vector<uint8_t> samples) {
  PngSpec s;
  s.width = kW;
  s.height = kH;
  s.color_type = color_type;
  s.bit_depth = depth;
  s.samples = std::move(samples);
  return s;
}

// Decodes `s` and checks it gives `expected_rgb`.
void expect_decodes_to(const PngSpec& s, const std::vector<uint8_t>& expected_rgb) {
  const std::string png = encode_png(s);
  ASSERT_FALSE(png.empty());
  auto img = decode(png);
  ASSERT_TRUE(img.has_value()) << img.error().message;
  EXPECT_EQ(img->width, s.width);
  EXPECT_EQ(img->height, s.height);
  EXPECT_EQ(img->rgb, expected_rgb);
}

TEST(ImageGolden, PngDecodesToLibmtmdBytes) {
  TROUPE_SHARED_OR_SKIP(shared);
  for (const char* name : {"checker_50x40", "circles_64x64", "gradient_32x32"}) {
    SCOPED_TRACE(name);
    const std::string dir = shared + "/golden/vlm/llava-tiny__" + std::string(name) + "__look";
    auto img = read_image_file(shared + "/golden/vlm/images/" + name + ".png");
    ASSERT_TRUE(img.has_value()) << img.error().message;
    const std::string want = testing::read_text_file(dir + "/image_rgb.u8");
    ASSERT_EQ(img->rgb.size(), want.size());
    EXPECT_EQ(std::memcmp(img->rgb.data(), want.data(), want.size()), 0);
  }
}

TEST(ImagePng, Rgb8AndInterlaced) {
  const std::vector<uint8_t> rgb = pattern(kW * kH * 3, 1);
  PngSpec s = spec(PNG_COLOR_TYPE_RGB, 8, rgb);
  expect_decodes_to(s, rgb);
  s.interlaced = true;
  expect_decodes_to(s, rgb);
}

TEST(ImagePng, SixteenBitKeepsHighByte) {
  const std::vector<uint8_t> be16 = pattern(kW * kH * 3 * 2, 2);  // big-endian samples
  std::vector<uint8_t> want(kW * kH * 3);
  for (size_t i = 0; i < want.size(); ++i) want[i] = be16[2 * i];  // stb_image: v >> 8
  PngSpec s = spec(PNG_COLOR_TYPE_RGB, 16, be16);
  expect_decodes_to(s, want);
  s.interlaced = true;
  expect_decodes_to(s, want);
}

TEST(ImagePng, GreyIsReplicatedAndLowDepthsScaled) {
  const std::vector<uint8_t> grey = pattern(kW * kH, 3);
  std::vector<uint8_t> want(kW * kH * 3);
  for (size_t i = 0; i < grey.size(); ++i)
    want[3 * i] = want[3 * i + 1] = want[3 * i + 2] = grey[i];
  expect_decodes_to(spec(PNG_COLOR_TYPE_GRAY, 8, grey), want);
  // 1-, 2- and 4-bit grey scale by 255, 85 and 17 (stb_image's depth scale table).
  for (int depth : {1, 2, 4}) {
    SCOPED_TRACE(depth);
    PngSpec s = spec(PNG_COLOR_TYPE_GRAY, depth, {});
    s.samples = pattern(testing::png_row_bytes(s) * kH, 4);
    const int per_byte = 8 / depth, max = (1 << depth) - 1;
    const size_t row_bytes = testing::png_row_bytes(s);
    std::vector<uint8_t> expect(kW * kH * 3);
    for (int y = 0; y < kH; ++y) {
      for (int x = 0; x < kW; ++x) {
        const uint8_t byte = s.samples[y * row_bytes + x / per_byte];
        const int v = (byte >> (8 - depth * (x % per_byte + 1))) & max;
        for (int c = 0; c < 3; ++c)
          expect[3 * (y * kW + x) + c] = static_cast<uint8_t>(v * 255 / max);
      }
    }
    expect_decodes_to(s, expect);
  }
}

TEST(ImagePng, AlphaIsDroppedNotComposited) {
  const std::vector<uint8_t> ga = pattern(kW * kH * 2, 5);
  std::vector<uint8_t> want(kW * kH * 3);
  for (size_t i = 0; i < kW * kH; ++i) want[3 * i] = want[3 * i + 1] = want[3 * i + 2] = ga[2 * i];
  expect_decodes_to(spec(PNG_COLOR_TYPE_GRAY_ALPHA, 8, ga), want);

  std::vector<uint8_t> rgba = pattern(kW * kH * 4, 6);
  rgba[3] = 0;  // a fully transparent pixel keeps its colour
  for (size_t i = 0; i < kW * kH; ++i) std::memcpy(&want[3 * i], &rgba[4 * i], 3);
  expect_decodes_to(spec(PNG_COLOR_TYPE_RGB_ALPHA, 8, rgba), want);
  PngSpec s16 = spec(PNG_COLOR_TYPE_RGB_ALPHA, 16, pattern(kW * kH * 8, 7));
  for (size_t i = 0; i < kW * kH; ++i) {
    for (int c = 0; c < 3; ++c) want[3 * i + c] = s16.samples[8 * i + 2 * c];
  }
  expect_decodes_to(s16, want);
}

TEST(ImagePng, PaletteIsExpandedAndTrnsIgnored) {
  PngSpec s = spec(PNG_COLOR_TYPE_PALETTE, 8, {});
  const std::vector<uint8_t> colours = pattern(16 * 3, 8);
  for (int i = 0; i < 16; ++i)
    s.palette.push_back({colours[3 * i], colours[3 * i + 1], colours[3 * i + 2]});
  s.samples = pattern(kW * kH, 9);
  for (auto& idx : s.samples) idx %= 16;
  std::vector<uint8_t> want(kW * kH * 3);
  for (size_t i = 0; i < s.samples.size(); ++i)
    std::memcpy(&want[3 * i], &colours[3 * s.samples[i]], 3);
  expect_decodes_to(s, want);
  s.palette_alpha = {0, 128, 255, 7};  // tRNS: stb_image drops the alpha it gives
  expect_decodes_to(s, want);
  s.interlaced = true;
  expect_decodes_to(s, want);

  // 4-bit indices, two a byte.
  PngSpec s4 = spec(PNG_COLOR_TYPE_PALETTE, 4, {});
  s4.palette = s.palette;
  s4.samples = pattern(testing::png_row_bytes(s4) * kH, 10);
  const size_t row_bytes = testing::png_row_bytes(s4);
  for (int y = 0; y < kH; ++y) {
    for (int x = 0; x < kW; ++x) {
      const int idx = (s4.samples[y * row_bytes + x / 2] >> (x % 2 ? 0 : 4)) & 15;
      std::memcpy(&want[3 * (y * kW + x)], &colours[3 * idx], 3);
    }
  }
  expect_decodes_to(s4, want);

  // An index past the palette: stb_image reads uninitialised memory there; we give black.
  // libpng will not write one, so write a 201-colour palette and cut the PLTE chunk to 16.
  s.interlaced = false;
  s.palette_alpha.clear();
  s.samples[5] = 200;
  s.palette.resize(201, png_color{1, 2, 3});
  std::string png = encode_png(s);
  const size_t plte = testing::png_find_chunk(png, "PLTE");
  ASSERT_NE(plte, std::string::npos);
  png = png.substr(0, plte) + testing::png_chunk("PLTE", png.substr(plte + 8, 16 * 3)) +
        png.substr(plte + 12 + 201 * 3);
  auto img = decode(png);
  ASSERT_TRUE(img.has_value()) << img.error().message;
  for (size_t i = 0; i < s.samples.size(); ++i) {
    std::memcpy(&want[3 * i], &colours[3 * (s.samples[i] % 16)], 3);
  }
  std::memset(&want[3 * 5], 0, 3);
  EXPECT_EQ(img->rgb, want);
}

TEST(ImagePng, TrnsColourAndGammaAreIgnored) {
  const std::vector<uint8_t> rgb = pattern(kW * kH * 3, 11);
  PngSpec s = spec(PNG_COLOR_TYPE_RGB, 8, rgb);
  s.has_trns_color = true;
  s.trns_color.red = rgb[0], s.trns_color.green = rgb[1], s.trns_color.blue = rgb[2];
  s.gamma = 1.0 / 2.2;
  expect_decodes_to(s, rgb);
}

// ---- bad input ----

std::string valid_png() { return encode_rgb_png(kW, kH, pattern(kW * kH * 3, 12)); }

TEST(ImageBadInput, EmptyIsRefused) {
  Error e = decode_error("");
  EXPECT_EQ(e.code, static_cast<int>(ImageErrc::kUnknownFormat));
  EXPECT_HAS(e.message, "empty");
  EXPECT_EQ(to_string(ImageErrc::kUnknownFormat), "unknown_format");
}

TEST(ImageBadInput, UnknownMagicIsRefusedWithItsFirstBytes) {
  Error e = decode_error(std::string("GIF89a\x01\x00\x01\x00", 10));
  EXPECT_EQ(e.code, static_cast<int>(ImageErrc::kUnknownFormat));
  EXPECT_HAS(e.message, "unknown image format (first bytes 47 49 46 38 39 61 01 00)");
}

TEST(ImageBadInput, TruncatedPngIsRefusedAtEveryCut) {
  const std::string png = valid_png();
  const size_t idat = testing::png_find_chunk(png, "IDAT");
  ASSERT_NE(idat, std::string::npos);
  // In the signature, inside IHDR, after IHDR, inside IDAT, before IEND, 1 byte short.
  for (size_t cut :
       {size_t{4}, size_t{8}, size_t{20}, idat, idat + 30, png.size() - 12, png.size() - 1}) {
    SCOPED_TRACE(cut);
    Error e = decode_error(png.substr(0, cut));
    EXPECT_EQ(e.code, static_cast<int>(ImageErrc::kCorrupt));
    EXPECT_HAS(e.message, "PNG: truncated");
  }
}

TEST(ImageBadInput, BadPngSignatureIsRefused) {
  std::string png = valid_png();
  png[6] = '\n';  // "\x89PNG\r\n\n\n": the classic text-mode transfer damage
  Error e = decode_error(png);
  EXPECT_EQ(e.code, static_cast<int>(ImageErrc::kCorrupt));
  EXPECT_HAS(e.message, "PNG: ");
}

TEST(ImageBadInput, CrcErrorsAreRefused) {
  const std::string png = valid_png();
  std::string bad_ihdr = png;
  bad_ihdr[8 + 8 + 13] ^= 1;  // the IHDR CRC
  EXPECT_HAS(decode_error(bad_ihdr).message, "IHDR: CRC error");
  // The IDAT CRC (zlib checks the data itself first, so damage the CRC, not the data).
  std::string bad_idat = png;
  bad_idat[testing::png_find_chunk(png, "IEND") - 1] ^= 1;  // IDAT is the chunk before IEND
  EXPECT_HAS(decode_error(bad_idat).message, "IDAT: CRC error");
}

TEST(ImageBadInput, CorruptCompressedDataIsRefused) {
  // Damage the deflate stream but give the chunk a correct CRC: zlib must catch it.
  const std::string png = valid_png();
  const size_t idat = testing::png_find_chunk(png, "IDAT");
  const uint32_t len =
      (static_cast<uint8_t>(png[idat]) << 24) | (static_cast<uint8_t>(png[idat + 1]) << 16) |
      (static_cast<uint8_t>(png[idat + 2]) << 8) | static_cast<uint8_t>(png[idat + 3]);
  std::string data = png.substr(idat + 8, len);
  for (size_t i = 2; i < data.size(); i += 3) data[i] = static_cast<char>(data[i] ^ 0xA5);
  const std::string bad =
      png.substr(0, idat) + testing::png_chunk("IDAT", data) + png.substr(idat + 12 + len);
  Error e = decode_error(bad);
  EXPECT_EQ(e.code, static_cast<int>(ImageErrc::kCorrupt));
  EXPECT_HAS(e.message, "PNG: ");
}

// A PNG whose IHDR claims w x h with a tiny IDAT: refused from the header, before a pixel
// buffer of w * h * 3 bytes (30 GB for 100000 x 100000) is allocated.
std::string huge_png(uint32_t w, uint32_t h) {
  auto be32 = [](uint32_t v) {
    return std::string{static_cast<char>(v >> 24), static_cast<char>(v >> 16),
                       static_cast<char>(v >> 8), static_cast<char>(v)};
  };
  const std::string ihdr = be32(w) + be32(h) + std::string("\x08\x02\x00\x00\x00", 5);
  return std::string("\x89PNG\r\n\x1a\n", 8) + testing::png_chunk("IHDR", ihdr) +
         testing::png_chunk("IDAT", std::string("\x78\x9c\x03\x00\x00\x00\x00\x01", 8)) +
         testing::png_chunk("IEND", "");
}

TEST(ImageBadInput, HugeDimensionsAreRefusedFromTheHeader) {
  Error side = decode_error(huge_png(100000, 100000));
  EXPECT_EQ(side.code, static_cast<int>(ImageErrc::kTooLarge));
  EXPECT_HAS(side.message, "image is 100000x100000 pixels, over the limit of 32768 pixels a side");
  Error area = decode_error(huge_png(20000, 20000));
  EXPECT_EQ(area.code, static_cast<int>(ImageErrc::kTooLarge));
  EXPECT_HAS(area.message, "20000x20000 = 400000000 pixels, over the limit of 67108864");
  Error custom = decode_error(valid_png(), ImageLimits{.max_pixels = 100, .max_side = 32768});
  EXPECT_EQ(custom.code, static_cast<int>(ImageErrc::kTooLarge));
  Error zero = decode_error(huge_png(0, 5));
  EXPECT_EQ(zero.code, static_cast<int>(ImageErrc::kCorrupt));  // libpng: "width is zero"
  EXPECT_HAS(zero.message, "zero");
}

// ---- JPEG ----

// A smooth 64x48 RGB picture: what JPEG keeps well.
std::vector<uint8_t> smooth_rgb(int w, int h) {
  std::vector<uint8_t> rgb(size_t{3} * w * h);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      uint8_t* p = &rgb[3 * (static_cast<size_t>(y) * w + x)];
      p[0] = static_cast<uint8_t>(40 + 3 * x);
      p[1] = static_cast<uint8_t>(30 + 4 * y);
      p[2] = static_cast<uint8_t>(200 - x - y);
    }
  }
  return rgb;
}

int max_abs_diff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  int m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

JpegSpec jpeg_spec(int w, int h, J_COLOR_SPACE space, int components, std::vector<uint8_t> s) {
  JpegSpec j;
  j.width = w;
  j.height = h;
  j.space = space;
  j.components = components;
  j.samples = std::move(s);
  return j;
}

TEST(ImageJpeg, RoundTripIsWithinAFewLevels) {
  // Decoders differ by a few levels (IDCT, upsampling), so JPEG is never bit-exact with
  // stb_image; against our own encoder at quality 100 the error is the codec's alone.
  const std::vector<uint8_t> rgb = smooth_rgb(64, 48);
  for (bool progressive : {false, true}) {
    for (bool full_chroma : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "progressive " << progressive << " 444 " << full_chroma);
      JpegSpec j = jpeg_spec(64, 48, JCS_RGB, 3, rgb);
      j.progressive = progressive;
      j.full_chroma = full_chroma;
      auto img = decode_image(as_bytes(encode_jpeg(j)), "pic.jpg");
      ASSERT_TRUE(img.has_value()) << img.error().message;
      ASSERT_EQ(img->width, 64);
      ASSERT_EQ(img->height, 48);
      // Measured: 3 at 4:4:4, 5 with 4:2:0 chroma (the upsampled chroma adds its own error).
      EXPECT_LE(max_abs_diff(img->rgb, rgb), full_chroma ? 3 : 6);
    }
  }
}

TEST(ImageJpeg, GreyAndCmykBecomeRgb) {
  std::vector<uint8_t> grey(32 * 24);
  for (size_t i = 0; i < grey.size(); ++i) grey[i] = static_cast<uint8_t>(i % 32 * 6 + i / 32);
  auto g = decode_image(as_bytes(encode_jpeg(jpeg_spec(32, 24, JCS_GRAYSCALE, 1, grey))), "g.jpg");
  ASSERT_TRUE(g.has_value()) << g.error().message;
  std::vector<uint8_t> grey_rgb(grey.size() * 3);
  for (size_t i = 0; i < grey.size(); ++i) {
    EXPECT_EQ(g->rgb[3 * i], g->rgb[3 * i + 1]);
    EXPECT_EQ(g->rgb[3 * i], g->rgb[3 * i + 2]);
    grey_rgb[3 * i] = grey_rgb[3 * i + 1] = grey_rgb[3 * i + 2] = grey[i];
  }
  EXPECT_LE(max_abs_diff(g->rgb, grey_rgb), 2);

  // Adobe CMYK is stored inverted: R = C * K / 255. With K = 255, RGB comes back as C, M, Y.
  const std::vector<uint8_t> rgb = smooth_rgb(32, 24);
  std::vector<uint8_t> cmyk(32 * 24 * 4);
  for (size_t i = 0; i < 32 * 24; ++i) {
    std::memcpy(&cmyk[4 * i], &rgb[3 * i], 3);
    cmyk[4 * i + 3] = 255;
  }
  auto c = decode_image(as_bytes(encode_jpeg(jpeg_spec(32, 24, JCS_CMYK, 4, cmyk))), "c.jpg");
  ASSERT_TRUE(c.has_value()) << c.error().message;
  EXPECT_LE(max_abs_diff(c->rgb, rgb), 4);
}

TEST(ImageBadInput, TruncatedJpegIsRefused) {
  const std::string jpg = encode_jpeg(jpeg_spec(64, 48, JCS_RGB, 3, smooth_rgb(64, 48)));
  ASSERT_GT(jpg.size(), 400u);
  for (size_t cut : {size_t{3}, size_t{20}, jpg.size() / 2, jpg.size() - 2}) {
    SCOPED_TRACE(cut);
    auto r = decode_image(as_bytes(jpg.substr(0, cut)), "pic.jpg");
    ASSERT_FALSE(r.has_value());
    EXPECT_EQ(r.error().code, static_cast<int>(ImageErrc::kCorrupt));
    EXPECT_EQ(r.error().message.rfind("pic.jpg: JPEG: ", 0), 0u) << r.error().message;
  }
  auto garbage = decode_image(as_bytes(std::string("\xFF\xD8\xFF\x00garbage", 11)), "pic.jpg");
  ASSERT_FALSE(garbage.has_value());
  EXPECT_HAS(garbage.error().message, "pic.jpg: JPEG: ");
}

TEST(ImageFile, ReadsAFileAndNamesAMissingOne) {
  testing::TempDir dir;
  const std::vector<uint8_t> rgb = pattern(kW * kH * 3, 13);
  const std::string path = dir.write("a.png", encode_rgb_png(kW, kH, rgb));
  auto img = read_image_file(path);
  ASSERT_TRUE(img.has_value()) << img.error().message;
  EXPECT_EQ(img->rgb, rgb);

  auto missing = read_image_file(dir.file("missing.png"));
  ASSERT_FALSE(missing.has_value());
  EXPECT_EQ(missing.error().code, static_cast<int>(ImageErrc::kIo));
  EXPECT_HAS(missing.error().message, dir.file("missing.png") + ": cannot open: No such file");
  auto directory = read_image_file(dir.path());
  ASSERT_FALSE(directory.has_value());
  EXPECT_HAS(directory.error().message, "not a regular file");
  const std::string bad = dir.write("bad.png", "\x89PNG\r\n");
  auto truncated = read_image_file(bad);
  ASSERT_FALSE(truncated.has_value());
  EXPECT_HAS(truncated.error().message, bad + ": PNG: truncated");
}

}  // namespace
}  // namespace troupe::model
