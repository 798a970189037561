// GGUF v3 serialisation: little-endian header, metadata, tensor infos, then aligned tensor data
// streamed through a bounded buffer.
#include "model/gguf_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "base/check.h"

namespace troupe::model {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF"
constexpr uint32_t kVersion = 3;
constexpr uint64_t kDefaultAlignment = 32;
constexpr uint64_t kChunkBytes = 16ull << 20;  // tensor data goes out in pieces of about this size

template <class T>
void put(std::vector<uint8_t>& out, T v) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}

void put_string(std::vector<uint8_t>& out, std::string_view s) {
  put<uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

uint64_t align_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

int elem_size(GgufType t) { return gguf_scalar_size(t); }

// Owns a file descriptor; writes everything or throws naming the path.
class OutFile {
 public:
  explicit OutFile(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) TROUPE_INPUT_ERROR("%s: cannot create: %s", path.c_str(), std::strerror(errno));
  }
  ~OutFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  OutFile(const OutFile&) = delete;
  OutFile& operator=(const OutFile&) = delete;

  void write(const uint8_t* p, uint64_t n) {
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, std::min<uint64_t>(n, 1u << 30));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) TROUPE_INPUT_ERROR("%s: write failed: %s", path_.c_str(), std::strerror(errno));
      p += w;
      n -= static_cast<uint64_t>(w);
      written_ += static_cast<uint64_t>(w);
    }
  }
  void pad_to(uint64_t alignment) {
    static const uint8_t kZeros[4096] = {};
    uint64_t n = align_up(written_, alignment) - written_;
    while (n > 0) {
      const uint64_t k = std::min<uint64_t>(n, sizeof(kZeros));
      write(kZeros, k);
      n -= k;
    }
  }
  void close() {
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0)
      TROUPE_INPUT_ERROR("%s: close failed: %s", path_.c_str(), std::strerror(errno));
  }
  uint64_t written() const { return written_; }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t written_ = 0;
};

}  // namespace

// --- metadata ---

void GgufWriter::set_raw(std::string_view key, GgufType type, std::vector<uint8_t> payload) {
  TROUPE_CHECK(!key.empty(), "GGUF metadata key must not be empty");
  for (Kv& kv : kv_) {
    if (kv.key == key) {
      kv.type = type;
      kv.payload = std::move(payload);
      return;
    }
  }
  kv_.push_back(Kv{std::string(key), type, std::move(payload)});
}

#define TROUPE_GGUF_SCALAR_SETTER(fn, ctype, gtype)    \
  void GgufWriter::fn(std::string_view key, ctype v) { \
    std::vector<uint8_t> p;                            \
    put<ctype>(p, v);                                  \
    set_raw(key, gtype, std::move(p));                 \
  }
TROUPE_GGUF_SCALAR_SETTER(set_u8, uint8_t, GgufType::kU8)
TROUPE_GGUF_SCALAR_SETTER(set_i8, int8_t, GgufType::kI8)
TROUPE_GGUF_SCALAR_SETTER(set_u16, uint16_t, GgufType::kU16)
TROUPE_GGUF_SCALAR_SETTER(set_i16, int16_t, GgufType::kI16)
TROUPE_GGUF_SCALAR_SETTER(set_u32, uint32_t, GgufType::kU32)
TROUPE_GGUF_SCALAR_SETTER(set_i32, int32_t, GgufType::kI32)
TROUPE_GGUF_SCALAR_SETTER(set_u64, uint64_t, GgufType::kU64)
TROUPE_GGUF_SCALAR_SETTER(set_i64, int64_t, GgufType::kI64)
TROUPE_GGUF_SCALAR_SETTER(set_f32, float, GgufType::kF32)
TROUPE_GGUF_SCALAR_SETTER(set_f64, double, GgufType::kF64)
#undef TROUPE_GGUF_SCALAR_SETTER

void GgufWriter::set_bool(std::string_view key, bool v) {
  set_raw(key, GgufType::kBool, {static_cast<uint8_t>(v ? 1 : 0)});
}

void GgufWriter::set_string(std::string_view key, std::string_view v) {
  std::vector<uint8_t> p;
  put_string(p, v);
  set_raw(key, GgufType::kString, std::move(p));
}

void GgufWriter::set_array(std::string_view key, GgufType elem, const void* data, uint64_t count) {
  const int es = elem_size(elem);
  TROUPE_CHECK(es > 0, "set_array: element type %s is not numeric",
               std::string(gguf_type_name(elem)).c_str());
  std::vector<uint8_t> p;
  p.reserve(12 + count * static_cast<uint64_t>(es));
  put<uint32_t>(p, static_cast<uint32_t>(elem));
  put<uint64_t>(p, count);
  const auto* b = static_cast<const uint8_t*>(data);
  if (elem == GgufType::kBool) {
    for (uint64_t k = 0; k < count; ++k) p.push_back(b[k] != 0 ? 1 : 0);
  } else if (count > 0) {
    p.insert(p.end(), b, b + count * static_cast<uint64_t>(es));
  }
  set_raw(key, GgufType::kArray, std::move(p));
}

void GgufWriter::set_array_i32(std::string_view key, std::span<const int32_t> v) {
  set_array(key, GgufType::kI32, v.data(), v.size());
}
void GgufWriter::set_array_u32(std::string_view key, std::span<const uint32_t> v) {
  set_array(key, GgufType::kU32, v.data(), v.size());
}
void GgufWriter::set_array_f32(std::string_view key, std::span<const float> v) {
  set_array(key, GgufType::kF32, v.data(), v.size());
}
void GgufWriter::set_array_bool(std::string_view key, std::span<const bool> v) {
  std::vector<uint8_t> b(v.size());
  for (size_t k = 0; k < v.size(); ++k) b[k] = v[k] ? 1 : 0;
  set_array(key, GgufType::kBool, b.data(), b.size());
}

namespace {
template <class S>
std::vector<uint8_t> string_array_payload(std::span<const S> v) {
  std::vector<uint8_t> p;
  uint64_t total = 12;
  for (const S& s : v) total += 8 + s.size();
  p.reserve(total);
  put<uint32_t>(p, static_cast<uint32_t>(GgufType::kString));
  put<uint64_t>(p, v.size());
  for (const S& s : v) put_string(p, s);
  return p;
}
}  // namespace

void GgufWriter::set_string_array(std::string_view key, std::span<const std::string> v) {
  set_raw(key, GgufType::kArray, string_array_payload(v));
}
void GgufWriter::set_string_array(std::string_view key, std::span<const std::string_view> v) {
  set_raw(key, GgufType::kArray, string_array_payload(v));
}

void GgufWriter::copy_value(std::string_view key, const GgufValue& v) {
  switch (v.type) {
    case GgufType::kU8:
      return set_u8(key, static_cast<uint8_t>(v.u));
    case GgufType::kI8:
      return set_i8(key, static_cast<int8_t>(v.i));
    case GgufType::kU16:
      return set_u16(key, static_cast<uint16_t>(v.u));
    case GgufType::kI16:
      return set_i16(key, static_cast<int16_t>(v.i));
    case GgufType::kU32:
      return set_u32(key, static_cast<uint32_t>(v.u));
    case GgufType::kI32:
      return set_i32(key, static_cast<int32_t>(v.i));
    case GgufType::kU64:
      return set_u64(key, v.u);
    case GgufType::kI64:
      return set_i64(key, v.i);
    case GgufType::kF32:
      return set_f32(key, static_cast<float>(v.f));
    case GgufType::kF64:
      return set_f64(key, v.f);
    case GgufType::kBool:
      return set_bool(key, v.u != 0);
    case GgufType::kString:
      return set_string(key, v.str);
    case GgufType::kArray:
      if (v.elem_type == GgufType::kString) return set_string_array(key, std::span(v.strings));
      return set_array(key, v.elem_type, v.data, v.count);
  }
  TROUPE_CHECK(false, "copy_value: bad type %u", static_cast<unsigned>(v.type));
}

void GgufWriter::set_alignment(uint32_t alignment) {
  TROUPE_CHECK(alignment >= 8 && (alignment & (alignment - 1)) == 0,
               "alignment %u is not a power of two from 8 (GGUF requires a multiple of 8)",
               alignment);
  set_u32("general.alignment", alignment);
}

bool GgufWriter::has_key(std::string_view key) const {
  return std::any_of(kv_.begin(), kv_.end(), [&](const Kv& kv) { return kv.key == key; });
}

void GgufWriter::remove_key(std::string_view key) {
  std::erase_if(kv_, [&](const Kv& kv) { return kv.key == key; });
}

uint64_t GgufWriter::alignment() const {
  for (const Kv& kv : kv_) {
    if (kv.key != "general.alignment") continue;
    uint64_t a = 0;
    const int es = elem_size(kv.type);
    if (es > 0 && kv.type != GgufType::kF32 && kv.type != GgufType::kF64 &&
        kv.type != GgufType::kBool) {
      std::memcpy(&a, kv.payload.data(), static_cast<size_t>(es));  // little-endian host
    }
    TROUPE_CHECK(a >= 8 && (a & (a - 1)) == 0 && a <= (1u << 20),
                 "general.alignment must be an unsigned power of two from 8 to 1 MiB");
    return a;
  }
  return kDefaultAlignment;
}

// --- tensors ---

Status GgufWriter::add(std::string_view name, GgmlType type, std::span<const int64_t> shape,
                       std::span<const uint8_t> bytes, TensorFill fill) {
  const std::string n(name);
  if (n.empty()) return Error{1, "tensor name is empty"};
  if (n.size() > kMaxTensorName)
    return Error{1, strfmt("tensor '%s': name longer than %zu bytes", n.c_str(), kMaxTensorName)};
  for (const Tensor& t : tensors_)
    if (t.name == n) return Error{1, strfmt("duplicate tensor '%s'", n.c_str())};
  if (shape.empty() || shape.size() > 4)
    return Error{
        1, strfmt("tensor '%s' has %zu dimensions (1 to 4 allowed)", n.c_str(), shape.size())};
  auto tr = type_traits(static_cast<uint32_t>(type));
  if (!tr || static_cast<uint32_t>(type) >= kFirstTroupeOnlyType)
    return Error{1,
                 strfmt("tensor '%s': type %s has no GGUF id", n.c_str(), type_name(type).c_str())};
  Tensor t{n, type, static_cast<int>(shape.size()), {1, 1, 1, 1}, 0, bytes, std::move(fill)};
  uint64_t total = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] <= 0 || shape[d] > (int64_t{1} << 40))
      return Error{1, strfmt("tensor '%s' dimension %zu is %lld", n.c_str(), d,
                             static_cast<long long>(shape[d]))};
    if (total > (uint64_t{1} << 50) / static_cast<uint64_t>(shape[d]))
      return Error{1, strfmt("tensor '%s' has too many elements", n.c_str())};
    total *= static_cast<uint64_t>(shape[d]);
    t.ne[d] = shape[d];
  }
  if (t.ne[0] % tr->block_elems != 0)
    return Error{1, strfmt("tensor '%s': row of %lld elements is not a multiple of the %s block "
                           "size %lld",
                           n.c_str(), static_cast<long long>(t.ne[0]),
                           std::string(tr->name).c_str(), static_cast<long long>(tr->block_elems))};
  t.nbytes =
      total / static_cast<uint64_t>(tr->block_elems) * static_cast<uint64_t>(tr->block_bytes);
  if (!t.fill && t.bytes.size() != t.nbytes)
    return Error{1, strfmt("tensor '%s' (%s): %zu bytes given, %llu needed", n.c_str(),
                           std::string(tr->name).c_str(), t.bytes.size(),
                           static_cast<unsigned long long>(t.nbytes))};
  tensors_.push_back(std::move(t));
  return Ok{};
}

Status GgufWriter::add_tensor(std::string_view name, GgmlType type, std::span<const int64_t> shape,
                              std::span<const uint8_t> data) {
  return add(name, type, shape, data, nullptr);
}

Status GgufWriter::add_tensor(std::string_view name, GgmlType type, std::span<const int64_t> shape,
                              TensorFill fill) {
  if (!fill)
    return Error{
        1, strfmt("tensor '%.*s': no fill function", static_cast<int>(name.size()), name.data())};
  return add(name, type, shape, {}, std::move(fill));
}

Status GgufWriter::add_tensor_f32(std::string_view name, GgmlType type,
                                  std::span<const int64_t> shape, std::span<const float> data) {
  uint64_t total = 1;
  for (int64_t d : shape) total *= d > 0 ? static_cast<uint64_t>(d) : 0;
  if (shape.empty() || data.size() != total)
    return Error{1, strfmt("tensor '%.*s': %zu floats given for its shape",
                           static_cast<int>(name.size()), name.data(), data.size())};
  if (type != GgmlType::kF32 && type != GgmlType::kF16 && type != GgmlType::kBF16 &&
      type != GgmlType::kQ8_0 && type != GgmlType::kQ4_0)
    return Error{1, strfmt("tensor '%.*s': cannot convert floats to %s",
                           static_cast<int>(name.size()), name.data(), type_name(type).c_str())};
  const int64_t ne0 = shape[0];
  const float* src = data.data();
  TensorFill fill = [type, ne0, src](int64_t row0, int64_t rows, uint8_t* dst) {
    const int64_t rb = row_bytes(type, ne0);
    for (int64_t r = 0; r < rows; ++r)
      quantize_row(type, src + (row0 + r) * ne0, dst + r * rb, ne0);
  };
  return add(name, type, shape, {}, std::move(fill));
}

std::vector<uint64_t> GgufWriter::offsets(uint64_t* data_bytes) const {
  const uint64_t a = alignment();
  std::vector<uint64_t> out;
  out.reserve(tensors_.size());
  uint64_t at = 0;
  for (const Tensor& t : tensors_) {
    out.push_back(at);
    at = align_up(at + t.nbytes, a);
  }
  if (data_bytes) *data_bytes = at;
  return out;
}

std::vector<uint8_t> GgufWriter::header_bytes() const {
  std::vector<uint8_t> h;
  put<uint32_t>(h, kMagic);
  put<uint32_t>(h, kVersion);
  put<uint64_t>(h, tensors_.size());
  put<uint64_t>(h, kv_.size());
  for (const Kv& kv : kv_) {
    put_string(h, kv.key);
    put<uint32_t>(h, static_cast<uint32_t>(kv.type));
    h.insert(h.end(), kv.payload.begin(), kv.payload.end());
  }
  const std::vector<uint64_t> offs = offsets(nullptr);
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const Tensor& t = tensors_[i];
    put_string(h, t.name);
    put<uint32_t>(h, static_cast<uint32_t>(t.n_dims));
    for (int d = 0; d < t.n_dims; ++d) put<uint64_t>(h, static_cast<uint64_t>(t.ne[d]));
    put<uint32_t>(h, static_cast<uint32_t>(t.type));
    put<uint64_t>(h, offs[i]);
  }
  return h;
}

uint64_t GgufWriter::file_size() const {
  uint64_t data = 0;
  offsets(&data);
  const uint64_t a = alignment();
  // ggml pads the header to the alignment even with no tensors; so do we.
  return align_up(header_bytes().size(), a) + data;
}

Status GgufWriter::write(const std::string& path) const {
  const std::string tmp = path + ".tmp";
  try {
    const uint64_t a = alignment();
    OutFile out(tmp);
    const std::vector<uint8_t> header = header_bytes();
    out.write(header.data(), header.size());
    out.pad_to(a);
    const uint64_t data_start = out.written();
    const std::vector<uint64_t> offs = offsets(nullptr);
    std::vector<uint8_t> buf;
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const Tensor& t = tensors_[i];
      TROUPE_CHECK(out.written() - data_start == offs[i], "tensor '%s' offset drifted",
                   t.name.c_str());
      if (!t.fill) {
        out.write(t.bytes.data(), t.bytes.size());
      } else {
        const int64_t rows = t.ne[1] * t.ne[2] * t.ne[3];
        const int64_t rb = row_bytes(t.type, t.ne[0]);
        const int64_t chunk_rows =
            std::max<int64_t>(1, static_cast<int64_t>(kChunkBytes) / std::max<int64_t>(rb, 1));
        buf.resize(static_cast<size_t>(std::min(chunk_rows, rows) * rb));
        for (int64_t r = 0; r < rows; r += chunk_rows) {
          const int64_t n = std::min(chunk_rows, rows - r);
          t.fill(r, n, buf.data());
          out.write(buf.data(), static_cast<uint64_t>(n * rb));
        }
      }
      out.pad_to(a);
    }
    out.close();
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
      TROUPE_INPUT_ERROR("%s: cannot rename from %s: %s", path.c_str(), tmp.c_str(),
                         std::strerror(errno));
    return Ok{};
  } catch (const std::exception& e) {
    ::unlink(tmp.c_str());
    std::string msg = e.what();
    if (msg.find(path) == std::string::npos) msg = path + ": " + msg;
    return Error{1, msg};
  }
}

}  // namespace troupe::model
