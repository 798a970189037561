// Images for vision encoders: PNG/JPEG decoding to 8-bit RGB and the resize, pad and normalize
// steps that turn a picture into an encoder input, matching llama.cpp's libmtmd (commit 18ef86ece,
// stb_image decoding and clip.cpp's img_tool). Used by the VLM request path and its tests.
// Every function here is pure: any thread may call any of them concurrently.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"

namespace troupe::model {

/// Error codes of the image functions (Error::code); numbers are never reused.
enum class ImageErrc : uint8_t {
  /// Neither PNG nor JPEG (by the first bytes), or empty.
  kUnknownFormat = 1,
  /// A PNG or JPEG that is truncated or corrupt (the decoder's message says where).
  kCorrupt = 2,
  /// Larger than ImageLimits allows.
  kTooLarge = 3,
  /// A valid file in a variant we do not decode (e.g. an unknown JPEG colour space).
  kUnsupported = 4,
  /// The file could not be read.
  kIo = 5,
};
std::string_view to_string(ImageErrc e);

/// An 8-bit RGB picture, rows top to bottom, pixels interleaved.
struct Image {
  int32_t width = 0;
  int32_t height = 0;
  std::vector<uint8_t> rgb;  // u8 [height][width][3]
};

/// Checked against the header before any pixel buffer is allocated.
struct ImageLimits {
  int64_t max_pixels = int64_t{64} << 20;  // width * height (64 Mi pixels)
  int32_t max_side = 32768;                // either side
};

/// Decodes a PNG or JPEG (detected by its magic bytes) into RGB as stb_image's
/// stbi_load_from_memory(..., 3) does, which is what libmtmd uses:
///  - PNG: 16-bit samples keep their high byte, palettes are expanded, grey becomes R=G=B,
///    alpha is dropped (not composited), tRNS and gAMA are ignored, interlacing is supported.
///    Output is bit-exact with stb_image. Stricter than stb: CRC and zlib checksum errors and a
///    missing IEND are errors.
///  - JPEG (libjpeg-turbo): grey and YCbCr become RGB, Adobe CMYK/YCCK are converted the way
///    stb_image does. Not bit-exact with stb_image (see image.cc); truncated data is an error.
/// `what` names the input in error messages ("cat.png", "image 2 of the request").
/// Errors (one line, starting with `what`): ImageErrc::kUnknownFormat, kCorrupt, kTooLarge,
/// kUnsupported.
Result<Image> decode_image(std::span<const uint8_t> bytes, std::string_view what,
                           const ImageLimits& limits = {});

/// Reads and decodes a file; errors name the path (a missing file is ImageErrc::kIo).
Result<Image> read_image_file(const std::string& path, const ImageLimits& limits = {});

/// The bytes of an image file, undecoded (for a cluster's encoder to decode): a regular file of
/// at most the image file size limit. Errors name the path (ImageErrc::kIo).
Result<std::string> read_image_bytes(const std::string& path);

// ---- Preprocessing (llama.cpp tools/mtmd img_tool and normalize, float32 throughout) ----
// REQUIRES for all: a non-empty input image and target sides > 0 (else InternalError).

/// Bicubic resize as llama.cpp's img_tool resize_bicubic (the ViT.cpp variant, not Pillow's):
/// source position (w_src/w_dst) * x with no half-pixel offset, a cubic through the 4
/// neighbours in x then in y with edge clamping, rounded to nearest and clamped to 0..255.
/// Resizing to the same size returns the input unchanged.
Image resize_bicubic(const Image& src, int32_t width, int32_t height);

/// Bilinear resize as llama.cpp's img_tool resize_bilinear at 18ef86ece: align-corners source
/// position ((w_src - 1) / (w_dst - 1)) * x in float32 (the corner pixels map onto each other),
/// lerp in x then y, truncated (not rounded) to uint8.
Image resize_bilinear(const Image& src, int32_t width, int32_t height);

/// Placement of a w x h image fitted inside size x size keeping its aspect (llama.cpp's
/// padded resize, "PAD_CEIL"): scale = min(size/w, size/h) in float32, new sides
/// min(ceil(side * scale), size), centred at ((size - new_w) / 2, (size - new_h) / 2).
struct FitGeometry {
  int32_t width = 0;
  int32_t height = 0;
  int32_t offset_x = 0;
  int32_t offset_y = 0;
};
FitGeometry fit_geometry(int32_t width, int32_t height, int32_t size);

/// What an encoder expects of its input: an image_size x image_size picture, the way to
/// resize into it, the colour of the padding and the per-channel normalisation.
struct ImagePreprocess {
  enum class Resize : uint8_t { kBicubic, kBilinear };
  int32_t image_size = 0;
  Resize resize = Resize::kBicubic;
  std::array<uint8_t, 3> pad_rgb{};
  std::array<float, 3> mean{};
  std::array<float, 3> std{};
};

/// Fits src inside size x size (fit_geometry), resizing with `resize`, onto a canvas of
/// pad_rgb. As in llama.cpp, an image that is already size x size is copied unchanged; any
/// other image is resized, even when fit_geometry gives its own size.
Image fit_and_pad(const Image& src, int32_t size, ImagePreprocess::Resize resize,
                  std::array<uint8_t, 3> pad_rgb);

/// v = u8 / 255.0f, then (v - mean[c]) / std[c] in float32 (a true division, as llama.cpp):
/// f32 planar [3][height][width].
std::vector<float> normalize_planar(const Image& img, std::array<float, 3> mean,
                                    std::array<float, 3> std);

/// fit_and_pad then normalize_planar: the encoder input, f32 [3][image_size][image_size].
std::vector<float> preprocess_image(const Image& img, const ImagePreprocess& p);

}  // namespace troupe::model
