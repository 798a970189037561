// PNG (libpng) and JPEG (libjpeg-turbo) decoding from memory into 8-bit RGB, the way
// stb_image's stbi_load_from_memory(..., 3) gives it to llama.cpp's libmtmd. Limits are checked
// from the header before the pixel buffer is allocated.
// Both libraries report errors by longjmp. Each decode therefore runs in a function whose frame
// holds no C++ object with a destructor, and everything the library touches (its state, our
// cursor, the message) lives in a plain struct owned by a normal C++ caller.
#include "model/image.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <exception>

#include <sys/stat.h>

#include "base/check.h"

// TROUPE_NO_IMAGE_CODECS: a TROUPE_GPU_ONLY build on a machine without libpng or libjpeg
// (model/CMakeLists.txt); decode_image then refuses every input.
#ifndef TROUPE_NO_IMAGE_CODECS
// jpeglib.h needs FILE and size_t declared before it (<cstdio> above).
// clang-format off
#include <png.h>
#include <jpeglib.h>
#include <jerror.h>
// clang-format on
#endif

namespace troupe::model {

namespace {

constexpr uint8_t kPngMagic[4] = {0x89, 'P', 'N', 'G'};  // libpng checks the other 4 bytes
constexpr uint8_t kJpegMagic[3] = {0xFF, 0xD8, 0xFF};
constexpr int64_t kMaxFileBytes = int64_t{1} << 30;

Error image_error(ImageErrc code, std::string message) {
  return Error{static_cast<int>(code), std::move(message)};
}

#ifdef TROUPE_NO_IMAGE_CODECS

Result<Image> decode_png(std::span<const uint8_t> /*bytes*/, std::string_view what,
                         const ImageLimits& /*limits*/) {
  return image_error(ImageErrc::kUnsupported,
                     strfmt("%s: this build has no PNG decoder (libpng was not found)",
                            std::string(what).c_str()));
}

Result<Image> decode_jpeg(std::span<const uint8_t> /*bytes*/, std::string_view what,
                          const ImageLimits& /*limits*/) {
  return image_error(ImageErrc::kUnsupported,
                     strfmt("%s: this build has no JPEG decoder (libjpeg was not found)",
                            std::string(what).c_str()));
}

#else  // TROUPE_NO_IMAGE_CODECS

constexpr int kMaxJpegScans = 1000;  // a progressive JPEG needs ~10; thousands only cost time
constexpr size_t kMessageBytes = 256;

// Grows the caller's buffer without letting std::bad_alloc cross a frame that libpng or
// libjpeg may longjmp over.
bool try_resize(std::vector<uint8_t>* v, size_t n) noexcept {
  try {
    v->resize(n);
    return true;
  } catch (...) {
    return false;
  }
}

// True when w x h is acceptable; else writes why not into msg (for "<what>: <why>"). Plain
// snprintf: it runs in frames that libpng and libjpeg may longjmp over.
bool check_size(uint64_t w, uint64_t h, const ImageLimits& limits, char* msg, size_t msg_bytes) {
  auto uw = static_cast<unsigned long long>(w), uh = static_cast<unsigned long long>(h);
  if (w == 0 || h == 0) {
    std::snprintf(msg, msg_bytes, "image is %llux%llu pixels (zero-size)", uw, uh);
    return false;
  }
  if (w > static_cast<uint64_t>(limits.max_side) || h > static_cast<uint64_t>(limits.max_side)) {
    std::snprintf(msg, msg_bytes, "image is %llux%llu pixels, over the limit of %d pixels a side",
                  uw, uh, limits.max_side);
    return false;
  }
  if (w * h > static_cast<uint64_t>(limits.max_pixels)) {
    std::snprintf(msg, msg_bytes, "image is %llux%llu = %llu pixels, over the limit of %lld", uw,
                  uh, uw * uh, static_cast<long long>(limits.max_pixels));
    return false;
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// PNG

// All state of one PNG decode. Plain data only (see the file comment).
struct PngJob {
  const uint8_t* data = nullptr;
  size_t size = 0;
  size_t pos = 0;  // next byte libpng reads
  ImageLimits limits;
  std::vector<uint8_t>* samples = nullptr;  // caller's buffer: [height][width][channels]
  png_structp png = nullptr;
  png_infop info = nullptr;
  uint32_t width = 0, height = 0;
  int channels = 0;  // 1: grey or palette index, 2: grey+alpha, 3: RGB, 4: RGBA
  bool is_palette = false;
  png_color palette[256] = {};
  int num_palette = 0;
  ImageErrc code = ImageErrc::kCorrupt;
  char message[kMessageBytes] = {};
  char warning[kMessageBytes] = {};  // the first warning, which says what "Invalid IHDR" means
};

[[noreturn]] void on_png_error(png_structp png, png_const_charp msg) {
  auto* job = static_cast<PngJob*>(png_get_error_ptr(png));
  if (job->message[0] == '\0') std::snprintf(job->message, sizeof job->message, "%s", msg);
  png_longjmp(png, 1);
}

// Warnings concern ancillary chunks (a bad CRC in tEXt, an unknown sRGB profile): libpng
// drops the chunk and goes on, as stb_image ignores them. The first is kept because libpng
// explains a bad IHDR in warnings ("Image width is zero in IHDR") before its error.
void on_png_warning(png_structp png, png_const_charp msg) {
  auto* job = static_cast<PngJob*>(png_get_error_ptr(png));
  if (job->warning[0] == '\0') std::snprintf(job->warning, sizeof job->warning, "%s", msg);
}

void on_png_read(png_structp png, png_bytep out, size_t n) {
  auto* job = static_cast<PngJob*>(png_get_io_ptr(png));
  if (n > job->size - job->pos) {
    std::snprintf(job->message, sizeof job->message,
                  "truncated: the data ends at byte %zu, %zu more needed", job->size,
                  n - (job->size - job->pos));
    png_error(png, job->message);
  }
  std::memcpy(out, job->data + job->pos, n);
  job->pos += n;
}

// Reads the header, checks it against the limits and sets up the transforms that leave 8-bit
// samples in their file layout. Returns the number of interlace passes, 0 when refused.
int setup_png(PngJob* job) {
  png_uint_32 w = 0, h = 0;
  int depth = 0, color = 0;
  png_get_IHDR(job->png, job->info, &w, &h, &depth, &color, nullptr, nullptr, nullptr);
  job->width = w;
  job->height = h;
  if (!check_size(w, h, job->limits, job->message, sizeof job->message)) {
    job->code = ImageErrc::kTooLarge;
    return 0;
  }
  // stb_image keeps the high byte of a 16-bit sample: png_set_strip_16 does exactly that
  // (png_set_scale_16 would round instead).
  if (depth == 16) png_set_strip_16(job->png);
  if (color == PNG_COLOR_TYPE_PALETTE) {
    // Indices one per byte; we look them up ourselves so that tRNS never becomes alpha.
    png_set_packing(job->png);
    png_colorp plte = nullptr;
    png_get_PLTE(job->png, job->info, &plte, &job->num_palette);
    if (job->num_palette > 256) job->num_palette = 256;
    if (plte != nullptr) std::memcpy(job->palette, plte, sizeof(png_color) * job->num_palette);
    job->is_palette = true;
  } else if (color == PNG_COLOR_TYPE_GRAY && depth < 8) {
    // Scales 1/2/4-bit grey by 255/85/17, as stb_image's depth scale table.
    png_set_expand_gray_1_2_4_to_8(job->png);
  }
  // Samples per pixel in the file: 1 grey or palette index, 2 grey+alpha, 3 RGB, 4 RGBA.
  job->channels = png_get_channels(job->png, job->info);
  return png_set_interlace_handling(job->png);
}

// Decodes job->data into *job->samples. False with job->message on error.
// NOTE: no C++ object with a destructor may live in this frame (libpng longjmps into it).
bool run_png(PngJob* job) {
  job->png = png_create_read_struct(PNG_LIBPNG_VER_STRING, job, on_png_error, on_png_warning);
  if (job->png != nullptr) job->info = png_create_info_struct(job->png);
  if (job->info == nullptr) {
    png_destroy_read_struct(&job->png, nullptr, nullptr);
    std::snprintf(job->message, sizeof job->message, "libpng could not start (out of memory)");
    return false;
  }
  if (setjmp(png_jmpbuf(job->png))) {
    png_destroy_read_struct(&job->png, &job->info, nullptr);
    return false;
  }
  png_set_read_fn(job->png, job, on_png_read);
  png_read_info(job->png, job->info);
  int passes = setup_png(job);
  if (passes > 0) {
    png_read_update_info(job->png, job->info);
    size_t row_bytes = png_get_rowbytes(job->png, job->info);
    if (row_bytes != size_t{job->width} * job->channels) {
      png_error(job->png, "unexpected row size after transforms");  // a libpng surprise
    }
    if (!try_resize(job->samples, row_bytes * job->height)) {
      job->code = ImageErrc::kTooLarge;
      png_error(job->png, "out of memory for the pixels");
    }
    // Interlaced images take 7 passes over the same rows, each filling in more pixels.
    for (int pass = 0; pass < passes; ++pass) {
      for (uint32_t y = 0; y < job->height; ++y) {
        png_read_row(job->png, job->samples->data() + y * row_bytes, nullptr);
      }
    }
    png_read_end(job->png, nullptr);  // checks the chunks after the image data up to IEND
  }
  png_destroy_read_struct(&job->png, &job->info, nullptr);
  return passes > 0;
}

// The decoded samples to RGB as stb_image converts to 3 channels: grey is replicated, alpha
// dropped without compositing, palette indices looked up (an index past the palette is black).
std::vector<uint8_t> png_to_rgb(const PngJob& job) {
  const std::vector<uint8_t>& s = *job.samples;
  size_t n = size_t{job.width} * job.height;
  std::vector<uint8_t> rgb(n * 3);
  for (size_t i = 0; i < n; ++i) {
    uint8_t* out = &rgb[i * 3];
    const uint8_t* in = &s[i * job.channels];
    if (job.is_palette) {
      if (in[0] < job.num_palette) {
        const png_color& c = job.palette[in[0]];
        out[0] = c.red, out[1] = c.green, out[2] = c.blue;
      }
    } else if (job.channels <= 2) {
      out[0] = out[1] = out[2] = in[0];
    } else {
      out[0] = in[0], out[1] = in[1], out[2] = in[2];
    }
  }
  return rgb;
}

Result<Image> decode_png(std::span<const uint8_t> bytes, std::string_view what,
                         const ImageLimits& limits) {
  std::vector<uint8_t> samples;
  PngJob job;
  job.data = bytes.data();
  job.size = bytes.size();
  job.limits = limits;
  job.samples = &samples;
  if (!run_png(&job)) {
    const char* kind = job.code == ImageErrc::kCorrupt ? "PNG: " : "";
    std::string why = job.message;
    if (why.find("IHDR") != std::string::npos && job.warning[0] != '\0') {
      why += strfmt(" (%s)", job.warning);
    }
    return image_error(job.code, strfmt("%s: %s%s", std::string(what).c_str(), kind, why.c_str()));
  }
  Image img;
  img.width = static_cast<int32_t>(job.width);
  img.height = static_cast<int32_t>(job.height);
  img.rgb = png_to_rgb(job);
  return img;
}

// ---------------------------------------------------------------------------------------------
// JPEG
// NOTE: JPEG output is not bit-exact with llama.cpp: stb_image has its own IDCT and chroma
// upsampling, and decoders legitimately differ by a few levels per sample. PNG is exact.

// All state of one JPEG decode. Plain data only (see the file comment).
struct JpegJob {
  const uint8_t* data = nullptr;
  size_t size = 0;
  ImageLimits limits;
  std::vector<uint8_t>* samples = nullptr;  // caller's buffer: [height][width][3 or 4]
  jpeg_decompress_struct cinfo;
  jpeg_error_mgr err;
  jpeg_progress_mgr progress;
  std::jmp_buf jump;
  uint32_t width = 0, height = 0;
  bool cmyk = false;  // samples are Adobe (inverted) CMYK
  ImageErrc code = ImageErrc::kCorrupt;
  char message[kMessageBytes] = {};
};

[[noreturn]] void on_jpeg_error(j_common_ptr cinfo) {
  auto* job = static_cast<JpegJob*>(cinfo->client_data);
  if (job->message[0] == '\0') (*cinfo->err->format_message)(cinfo, job->message);
  std::longjmp(job->jump, 1);
}

// libjpeg only warns about damaged entropy data and then invents the missing pixels (grey for a
// truncated file). Those warnings are errors here; harmless ones (junk between markers, an
// unknown JFIF revision) are ignored.
void on_jpeg_message(j_common_ptr cinfo, int level) {
  if (level >= 0) return;  // trace output
  switch (cinfo->err->msg_code) {
    case JWRN_JPEG_EOF:
    case JWRN_HIT_MARKER:
    case JWRN_MUST_RESYNC:
    case JWRN_HUFF_BAD_CODE:
    case JWRN_ARITH_BAD_CODE:
      on_jpeg_error(cinfo);
    default:
      return;
  }
}

// Bounds the time a hostile progressive JPEG can take (each scan re-reads the coefficients).
void on_jpeg_progress(j_common_ptr cinfo) {
  auto* d = reinterpret_cast<j_decompress_ptr>(cinfo);
  if (d->input_scan_number > kMaxJpegScans) {
    auto* job = static_cast<JpegJob*>(cinfo->client_data);
    std::snprintf(job->message, sizeof job->message, "progressive JPEG with more than %d scans",
                  kMaxJpegScans);
    on_jpeg_error(cinfo);
  }
}

// Checks the header against the limits and picks the output colour space. False when refused.
bool setup_jpeg(JpegJob* job) {
  j_decompress_ptr cinfo = &job->cinfo;
  if (!check_size(cinfo->image_width, cinfo->image_height, job->limits, job->message,
                  sizeof job->message)) {
    job->code = ImageErrc::kTooLarge;
    return false;
  }
  switch (cinfo->jpeg_color_space) {
    case JCS_GRAYSCALE:
    case JCS_YCbCr:
    case JCS_RGB:
      cinfo->out_color_space = JCS_RGB;
      return true;
    case JCS_CMYK:
    case JCS_YCCK:  // libjpeg turns YCCK into CMYK
      cinfo->out_color_space = JCS_CMYK;
      job->cmyk = true;
      return true;
    default:
      std::snprintf(job->message, sizeof job->message,
                    "JPEG colour space %d with %d components is not supported",
                    static_cast<int>(cinfo->jpeg_color_space), cinfo->num_components);
      job->code = ImageErrc::kUnsupported;
      return false;
  }
}

// Decodes job->data into *job->samples. False with job->message on error.
// NOTE: no C++ object with a destructor may live in this frame (libjpeg longjmps into it).
bool run_jpeg(JpegJob* job) {
  j_decompress_ptr cinfo = &job->cinfo;
  std::memset(cinfo, 0, sizeof *cinfo);  // jpeg_destroy is then safe even if create fails
  cinfo->err = jpeg_std_error(&job->err);
  job->err.error_exit = on_jpeg_error;
  job->err.emit_message = on_jpeg_message;
  cinfo->client_data = job;
  if (setjmp(job->jump)) {
    jpeg_destroy_decompress(cinfo);
    return false;
  }
  jpeg_create_decompress(cinfo);
  job->progress.progress_monitor = on_jpeg_progress;
  cinfo->progress = &job->progress;
  jpeg_mem_src(cinfo, job->data, static_cast<unsigned long>(job->size));
  jpeg_read_header(cinfo, TRUE);
  bool ok = setup_jpeg(job);
  if (ok) {
    jpeg_start_decompress(cinfo);
    job->width = cinfo->output_width;
    job->height = cinfo->output_height;
    size_t row_bytes = size_t{cinfo->output_width} * cinfo->output_components;
    if (!try_resize(job->samples, row_bytes * cinfo->output_height)) {
      std::snprintf(job->message, sizeof job->message, "out of memory for the pixels");
      job->code = ImageErrc::kTooLarge;
      std::longjmp(job->jump, 1);
    }
    while (cinfo->output_scanline < cinfo->output_height) {
      JSAMPROW row = job->samples->data() + size_t{cinfo->output_scanline} * row_bytes;
      jpeg_read_scanlines(cinfo, &row, 1);
    }
    jpeg_finish_decompress(cinfo);  // reads up to EOI: a file cut after the last row fails here
  }
  jpeg_destroy_decompress(cinfo);
  return ok;
}

// x * y / 255 rounded, as stb_image's blinn_8x8.
uint8_t mul_div255(unsigned x, unsigned y) {
  unsigned t = x * y + 128;
  return static_cast<uint8_t>((t + (t >> 8)) >> 8);
}

// Adobe CMYK (stored inverted, so C is really 255 - cyan) to RGB as stb_image does: R = C*K/255.
std::vector<uint8_t> cmyk_to_rgb(const std::vector<uint8_t>& cmyk) {
  std::vector<uint8_t> rgb(cmyk.size() / 4 * 3);
  for (size_t i = 0, n = cmyk.size() / 4; i < n; ++i) {
    const uint8_t* in = &cmyk[i * 4];
    for (int c = 0; c < 3; ++c) rgb[i * 3 + c] = mul_div255(in[c], in[3]);
  }
  return rgb;
}

Result<Image> decode_jpeg(std::span<const uint8_t> bytes, std::string_view what,
                          const ImageLimits& limits) {
  std::vector<uint8_t> samples;
  JpegJob job;
  job.data = bytes.data();
  job.size = bytes.size();
  job.limits = limits;
  job.samples = &samples;
  if (!run_jpeg(&job)) {
    const char* kind = job.code == ImageErrc::kCorrupt ? "JPEG: " : "";
    return image_error(job.code, strfmt("%s: %s%s", std::string(what).c_str(), kind, job.message));
  }
  Image img;
  img.width = static_cast<int32_t>(job.width);
  img.height = static_cast<int32_t>(job.height);
  img.rgb = job.cmyk ? cmyk_to_rgb(samples) : std::move(samples);
  return img;
}

#endif  // TROUPE_NO_IMAGE_CODECS

bool starts_with(std::span<const uint8_t> bytes, std::span<const uint8_t> magic) {
  return bytes.size() >= magic.size() && std::memcmp(bytes.data(), magic.data(), magic.size()) == 0;
}

std::string first_bytes_hex(std::span<const uint8_t> bytes) {
  std::string out;
  for (size_t i = 0; i < bytes.size() && i < 8; ++i) out += strfmt(i ? " %02x" : "%02x", bytes[i]);
  return out;
}

}  // namespace

std::string_view to_string(ImageErrc e) {
  switch (e) {
    case ImageErrc::kUnknownFormat:
      return "unknown_format";
    case ImageErrc::kCorrupt:
      return "corrupt";
    case ImageErrc::kTooLarge:
      return "too_large";
    case ImageErrc::kUnsupported:
      return "unsupported";
    case ImageErrc::kIo:
      return "io";
  }
  return "unknown";
}

Result<Image> decode_image(std::span<const uint8_t> bytes, std::string_view what,
                           const ImageLimits& limits) {
  try {
    if (bytes.empty()) {
      return image_error(
          ImageErrc::kUnknownFormat,
          strfmt("%s: empty (0 bytes); expected a PNG or JPEG image", std::string(what).c_str()));
    }
    if (starts_with(bytes, kPngMagic)) return decode_png(bytes, what, limits);
    if (starts_with(bytes, kJpegMagic)) return decode_jpeg(bytes, what, limits);
    return image_error(ImageErrc::kUnknownFormat,
                       strfmt("%s: unknown image format (first bytes %s); expected PNG or JPEG",
                              std::string(what).c_str(), first_bytes_hex(bytes).c_str()));
  } catch (const std::exception& e) {  // std::bad_alloc converting a large image
    return image_error(ImageErrc::kTooLarge,
                       strfmt("%s: cannot decode: %s", std::string(what).c_str(), e.what()));
  }
}

Result<std::string> read_image_bytes(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return image_error(ImageErrc::kIo,
                       strfmt("%s: cannot open: %s", path.c_str(), std::strerror(errno)));
  }
  struct stat st {};
  std::string problem;
  if (::fstat(fd, &st) != 0) {
    problem = strfmt("cannot stat: %s", std::strerror(errno));
  } else if (!S_ISREG(st.st_mode)) {
    problem = "not a regular file";
  } else if (st.st_size > kMaxFileBytes) {
    problem = strfmt("%lld bytes, over the %lld-byte limit for an image file",
                     static_cast<long long>(st.st_size), static_cast<long long>(kMaxFileBytes));
  }
  std::string bytes;
  if (problem.empty()) {
    bytes.resize(static_cast<size_t>(st.st_size));
    size_t got = 0;
    while (got < bytes.size()) {
      ssize_t n = ::read(fd, bytes.data() + got, bytes.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        problem =
            n < 0 ? strfmt("read failed: %s", std::strerror(errno)) : "file shrank while read";
        break;
      }
      got += static_cast<size_t>(n);
    }
  }
  ::close(fd);
  if (!problem.empty()) return image_error(ImageErrc::kIo, path + ": " + problem);
  return bytes;
}

Result<Image> read_image_file(const std::string& path, const ImageLimits& limits) {
  auto bytes = read_image_bytes(path);
  if (!bytes) return bytes.error();
  return decode_image(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes->data()), bytes->size()),
      path, limits);
}

}  // namespace troupe::model
