// PNG and JPEG encoders (libpng and libjpeg-turbo, memory to memory) and a PNG chunk editor, for
// the image decoder's tests (tests/model/image_test.cc) and fuzz seeds (tests/fuzz/). Test-only:
// a library error returns an empty string.
#pragma once

#include <png.h>

#include <csetjmp>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

// jpeglib.h needs FILE and size_t declared before it.
// clang-format off
#include <cstdio>
#include <jpeglib.h>
// clang-format on

namespace troupe::testing {

/// A PNG to write: samples as libpng takes them (rows of ceil(width * channels * depth / 8)
/// bytes, 16-bit samples big-endian, sub-byte samples packed from the high bit).
struct PngSpec {
  int width = 0;
  int height = 0;
  int color_type = PNG_COLOR_TYPE_RGB;
  int bit_depth = 8;
  bool interlaced = false;  // Adam7
  std::vector<uint8_t> samples;
  std::vector<png_color> palette;      // PLTE, for PNG_COLOR_TYPE_PALETTE
  std::vector<uint8_t> palette_alpha;  // tRNS for a palette
  bool has_trns_color = false;         // tRNS for grey / RGB: this colour is transparent
  png_color_16 trns_color{};
  double gamma = 0;  // writes a gAMA chunk when > 0
};

inline int png_channels(int color_type) {
  switch (color_type) {
    case PNG_COLOR_TYPE_GRAY_ALPHA:
      return 2;
    case PNG_COLOR_TYPE_RGB:
      return 3;
    case PNG_COLOR_TYPE_RGB_ALPHA:
      return 4;
    default:
      return 1;
  }
}

inline size_t png_row_bytes(const PngSpec& s) {
  return (static_cast<size_t>(s.width) * png_channels(s.color_type) * s.bit_depth + 7) / 8;
}

namespace detail {

inline void png_append(png_structp png, png_bytep data, size_t n) {
  static_cast<std::string*>(png_get_io_ptr(png))->append(reinterpret_cast<const char*>(data), n);
}
inline void png_flush(png_structp) {}

// No object with a destructor in this frame: libpng longjmps into it on error.
inline bool write_png(const PngSpec* s, std::string* out, png_bytep* rows) {
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    return false;
  }
  png_set_write_fn(png, out, png_append, png_flush);
  png_set_IHDR(png, info, static_cast<png_uint_32>(s->width), static_cast<png_uint_32>(s->height),
               s->bit_depth, s->color_type,
               s->interlaced ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  if (!s->palette.empty()) {
    png_set_PLTE(png, info, s->palette.data(), static_cast<int>(s->palette.size()));
  }
  if (!s->palette_alpha.empty()) {
    png_set_tRNS(png, info, s->palette_alpha.data(), static_cast<int>(s->palette_alpha.size()),
                 nullptr);
  }
  if (s->has_trns_color) png_set_tRNS(png, info, nullptr, 0, &s->trns_color);
  if (s->gamma > 0) png_set_gAMA(png, info, s->gamma);
  png_write_info(png, info);
  png_write_image(png, rows);  // writes the 7 Adam7 passes itself when interlaced
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return true;
}

}  // namespace detail

/// The PNG file for `s`, or "" when libpng refuses it.
inline std::string encode_png(const PngSpec& s) {
  std::string out;
  std::vector<png_bytep> rows(static_cast<size_t>(s.height));
  std::vector<uint8_t> samples = s.samples;  // libpng wants non-const rows
  samples.resize(png_row_bytes(s) * s.height);
  for (int y = 0; y < s.height; ++y) rows[y] = samples.data() + y * png_row_bytes(s);
  return detail::write_png(&s, &out, rows.data()) ? out : std::string();
}

/// An 8-bit RGB PNG of width x height from interleaved rgb.
inline std::string encode_rgb_png(int width, int height, const std::vector<uint8_t>& rgb) {
  PngSpec s;
  s.width = width;
  s.height = height;
  s.samples = rgb;
  return encode_png(s);
}

/// A JPEG to write: interleaved samples in `space` (JCS_GRAYSCALE, JCS_RGB or JCS_CMYK; CMYK is
/// written with an Adobe marker, as libjpeg does).
struct JpegSpec {
  int width = 0;
  int height = 0;
  int components = 3;
  J_COLOR_SPACE space = JCS_RGB;
  int quality = 100;
  bool full_chroma = true;  // 4:4:4 instead of libjpeg's default 4:2:0
  bool progressive = false;
  std::vector<uint8_t> samples;
};

namespace detail {

struct JpegWriteErr {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
};

[[noreturn]] inline void jpeg_write_fail(j_common_ptr cinfo) {
  std::longjmp(reinterpret_cast<JpegWriteErr*>(cinfo->err)->jump, 1);
}

// No object with a destructor in this frame: libjpeg longjmps into it on error.
inline bool write_jpeg(const JpegSpec* s, jpeg_compress_struct* c, JpegWriteErr* err,
                       unsigned char** buf, unsigned long* size) {
  c->err = jpeg_std_error(&err->mgr);
  err->mgr.error_exit = jpeg_write_fail;
  if (setjmp(err->jump)) {
    jpeg_destroy_compress(c);
    return false;
  }
  jpeg_create_compress(c);
  jpeg_mem_dest(c, buf, size);
  c->image_width = static_cast<JDIMENSION>(s->width);
  c->image_height = static_cast<JDIMENSION>(s->height);
  c->input_components = s->components;
  c->in_color_space = s->space;
  jpeg_set_defaults(c);
  jpeg_set_quality(c, s->quality, TRUE);
  if (s->full_chroma) {
    for (int i = 0; i < c->num_components; ++i) {
      c->comp_info[i].h_samp_factor = 1;
      c->comp_info[i].v_samp_factor = 1;
    }
  }
  if (s->progressive) jpeg_simple_progression(c);
  jpeg_start_compress(c, TRUE);
  const size_t stride = static_cast<size_t>(s->width) * s->components;
  while (c->next_scanline < c->image_height) {
    JSAMPROW row = const_cast<JSAMPROW>(s->samples.data() + c->next_scanline * stride);
    jpeg_write_scanlines(c, &row, 1);
  }
  jpeg_finish_compress(c);
  jpeg_destroy_compress(c);
  return true;
}

}  // namespace detail

/// The JPEG file for `s`, or "" when libjpeg refuses it.
inline std::string encode_jpeg(const JpegSpec& s) {
  jpeg_compress_struct c{};
  detail::JpegWriteErr err{};
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  bool ok = detail::write_jpeg(&s, &c, &err, &buf, &size);
  std::string out = ok ? std::string(reinterpret_cast<const char*>(buf), size) : std::string();
  std::free(buf);
  return out;
}

/// The CRC-32 of PNG chunks (ISO 3309, as zlib's crc32).
inline uint32_t png_crc(const uint8_t* p, size_t n) {
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
  }
  return c ^ 0xffffffffu;
}

/// One PNG chunk: 4-byte big-endian length, type, data and a correct CRC.
inline std::string png_chunk(const std::string& type, const std::string& data) {
  auto be32 = [](uint32_t v) {
    return std::string{static_cast<char>(v >> 24), static_cast<char>(v >> 16),
                       static_cast<char>(v >> 8), static_cast<char>(v)};
  };
  std::string body = type + data;
  return be32(static_cast<uint32_t>(data.size())) + body +
         be32(png_crc(reinterpret_cast<const uint8_t*>(body.data()), body.size()));
}

/// The byte offset of the first chunk of `type` in a PNG file (at its length field), or npos.
inline size_t png_find_chunk(const std::string& png, const std::string& type) {
  size_t pos = 8;
  while (pos + 8 <= png.size()) {
    auto len = static_cast<size_t>(
        (static_cast<uint8_t>(png[pos]) << 24) | (static_cast<uint8_t>(png[pos + 1]) << 16) |
        (static_cast<uint8_t>(png[pos + 2]) << 8) | static_cast<uint8_t>(png[pos + 3]));
    if (png.compare(pos + 4, 4, type) == 0) return pos;
    pos += 12 + len;
  }
  return std::string::npos;
}

}  // namespace troupe::testing
