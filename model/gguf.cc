// GGUF parsing with every read bounds-checked: a hostile file gets an InputError, never an
// out-of-bounds read or an unbounded allocation.
#include "model/gguf.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>

#include <sys/mman.h>
#include <sys/stat.h>

#include "base/check.h"

namespace troupe::model {

MappedFile::MappedFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) TROUPE_INPUT_ERROR("%s: cannot open: %s", path.c_str(), std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    TROUPE_INPUT_ERROR("%s: cannot stat: %s", path.c_str(), std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    TROUPE_INPUT_ERROR("%s: not a regular file", path.c_str());
  }
  size_ = static_cast<uint64_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      TROUPE_INPUT_ERROR("%s: cannot map %llu bytes: %s", path.c_str(),
                         static_cast<unsigned long long>(size_), std::strerror(e));
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

int gguf_scalar_size(GgufType t) {
  switch (t) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kBool:
      return 1;
    case GgufType::kU16:
    case GgufType::kI16:
      return 2;
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kF32:
      return 4;
    case GgufType::kU64:
    case GgufType::kI64:
    case GgufType::kF64:
      return 8;
    default:
      return 0;
  }
}

std::string_view gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::kU8:
      return "u8";
    case GgufType::kI8:
      return "i8";
    case GgufType::kU16:
      return "u16";
    case GgufType::kI16:
      return "i16";
    case GgufType::kU32:
      return "u32";
    case GgufType::kI32:
      return "i32";
    case GgufType::kF32:
      return "f32";
    case GgufType::kBool:
      return "bool";
    case GgufType::kString:
      return "string";
    case GgufType::kArray:
      return "array";
    case GgufType::kU64:
      return "u64";
    case GgufType::kI64:
      return "i64";
    case GgufType::kF64:
      return "f64";
  }
  return "?";
}

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr uint64_t kMaxDims = 4;

int scalar_size(GgufType t) { return gguf_scalar_size(t); }

bool valid_type(uint32_t t) { return t <= 12; }

// A float element read as an integer: converting NaN or a value outside int64's range is
// undefined behaviour, so saturate (NaN reads as 0).
int64_t saturate_i64(double v) {
  if (std::isnan(v)) return 0;
  if (v >= 9223372036854775808.0) return std::numeric_limits<int64_t>::max();
  if (v < -9223372036854775808.0) return std::numeric_limits<int64_t>::min();
  return static_cast<int64_t>(v);
}

// Reads little-endian fields from [p, end) and throws with the file name and offset on overrun.
class Cursor {
 public:
  Cursor(const uint8_t* base, uint64_t size, const std::string& name)
      : base_(base), size_(size), name_(name) {}
  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }
  const uint8_t* here() const { return base_ + pos_; }

  void need(uint64_t n, const char* what) const {
    if (n > remaining())
      TROUPE_INPUT_ERROR("%s: truncated at byte %llu reading %s (need %llu bytes, %llu left)",
                         name_.c_str(), static_cast<unsigned long long>(pos_), what,
                         static_cast<unsigned long long>(n),
                         static_cast<unsigned long long>(remaining()));
  }
  template <class T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string_view read_string(const char* what) {
    uint64_t n = read<uint64_t>(what);
    need(n, what);
    std::string_view s(reinterpret_cast<const char*>(base_ + pos_), n);
    pos_ += n;
    return s;
  }
  void skip(uint64_t n, const char* what) {
    need(n, what);
    pos_ += n;
  }

 private:
  const uint8_t* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const std::string& name_;
};

}  // namespace

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kU16:
    case GgufType::kI16:
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kU64:
    case GgufType::kI64:
      return true;
    default:
      return false;
  }
}

double GgufValue::array_f64(uint64_t idx) const {
  const uint8_t* p = data + idx * static_cast<uint64_t>(scalar_size(elem_type));
  switch (elem_type) {
    case GgufType::kF32: {
      float v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case GgufType::kF64: {
      double v;
      std::memcpy(&v, p, 8);
      return v;
    }
    default:
      return static_cast<double>(array_i64(idx));
  }
}

int64_t GgufValue::array_i64(uint64_t idx) const {
  const uint8_t* p = data + idx * static_cast<uint64_t>(scalar_size(elem_type));
  switch (elem_type) {
    case GgufType::kU8:
    case GgufType::kBool:
      return *p;
    case GgufType::kI8:
      return static_cast<int8_t>(*p);
    case GgufType::kU16: {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return v;
    }
    case GgufType::kI16: {
      int16_t v;
      std::memcpy(&v, p, 2);
      return v;
    }
    case GgufType::kU32: {
      uint32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case GgufType::kI32: {
      int32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case GgufType::kU64: {
      uint64_t v;
      std::memcpy(&v, p, 8);
      return static_cast<int64_t>(v);
    }
    case GgufType::kI64: {
      int64_t v;
      std::memcpy(&v, p, 8);
      return v;
    }
    case GgufType::kF32: {
      float v;
      std::memcpy(&v, p, 4);
      return saturate_i64(v);
    }
    case GgufType::kF64: {
      double v;
      std::memcpy(&v, p, 8);
      return saturate_i64(v);
    }
    default:
      return 0;
  }
}

std::string TensorInfo::shape_string() const {
  std::string s = "[";
  for (int d = 0; d < n_dims; ++d) {
    if (d) s += ", ";
    s += std::to_string(ne[d]);
  }
  return s + "]";
}

GgufFile::~GgufFile() = default;

Result<std::unique_ptr<GgufFile>> GgufFile::open(const std::string& path) {
  try {
    std::unique_ptr<GgufFile> f(new GgufFile());
    f->path_ = path;
    f->map_ = std::make_unique<MappedFile>(path);
    f->base_ = f->map_->data();
    f->size_ = f->map_->size();
    f->parse_all();
    return f;
  } catch (const std::exception& e) {
    return Error{1, e.what()};
  }
}

Result<std::unique_ptr<GgufFile>> GgufFile::parse(std::span<const uint8_t> bytes,
                                                  const std::string& name) {
  try {
    std::unique_ptr<GgufFile> f(new GgufFile());
    f->path_ = name;
    f->base_ = bytes.data();
    f->size_ = bytes.size();
    f->parse_all();
    return f;
  } catch (const std::exception& e) {
    return Error{1, e.what()};
  }
}

static void read_value(Cursor& c, GgufType type, GgufValue& v, const std::string& file,
                       const std::string& key) {
  v.type = type;
  switch (type) {
    case GgufType::kU8:
      v.u = c.read<uint8_t>("u8 value");
      v.i = static_cast<int64_t>(v.u);
      break;
    case GgufType::kI8:
      v.i = c.read<int8_t>("i8 value");
      break;
    case GgufType::kU16:
      v.u = c.read<uint16_t>("u16 value");
      v.i = static_cast<int64_t>(v.u);
      break;
    case GgufType::kI16:
      v.i = c.read<int16_t>("i16 value");
      break;
    case GgufType::kU32:
      v.u = c.read<uint32_t>("u32 value");
      v.i = static_cast<int64_t>(v.u);
      break;
    case GgufType::kI32:
      v.i = c.read<int32_t>("i32 value");
      break;
    case GgufType::kU64:
      v.u = c.read<uint64_t>("u64 value");
      v.i = static_cast<int64_t>(v.u);
      break;
    case GgufType::kI64:
      v.i = c.read<int64_t>("i64 value");
      break;
    case GgufType::kF32:
      v.f = c.read<float>("f32 value");
      break;
    case GgufType::kF64:
      v.f = c.read<double>("f64 value");
      break;
    case GgufType::kBool: {
      uint8_t b = c.read<uint8_t>("bool value");
      if (b > 1)
        TROUPE_INPUT_ERROR("%s: key '%s': bool value %u is neither 0 nor 1", file.c_str(),
                           key.c_str(), b);
      v.u = b;
      v.i = b;
      break;
    }
    case GgufType::kString:
      v.str = c.read_string("string value");
      break;
    case GgufType::kArray: {
      uint32_t et = c.read<uint32_t>("array element type");
      if (!valid_type(et) || static_cast<GgufType>(et) == GgufType::kArray)
        TROUPE_INPUT_ERROR("%s: key '%s': invalid array element type %u", file.c_str(), key.c_str(),
                           et);
      v.elem_type = static_cast<GgufType>(et);
      v.count = c.read<uint64_t>("array length");
      if (v.elem_type == GgufType::kString) {
        // Each string needs at least its 8-byte length: bounds the allocation below.
        if (v.count > c.remaining() / 8)
          TROUPE_INPUT_ERROR("%s: key '%s': array of %llu strings exceeds the file", file.c_str(),
                             key.c_str(), static_cast<unsigned long long>(v.count));
        v.strings.reserve(v.count);
        for (uint64_t k = 0; k < v.count; ++k) v.strings.push_back(c.read_string("array string"));
      } else {
        const uint64_t es = static_cast<uint64_t>(scalar_size(v.elem_type));
        if (v.count > c.remaining() / es)
          TROUPE_INPUT_ERROR("%s: key '%s': array of %llu %s exceeds the file", file.c_str(),
                             key.c_str(), static_cast<unsigned long long>(v.count),
                             std::string(gguf_type_name(v.elem_type)).c_str());
        v.data = c.here();
        c.skip(v.count * es, "array data");
        if (v.elem_type == GgufType::kBool) {
          for (uint64_t k = 0; k < v.count; ++k)
            if (v.data[k] > 1)
              TROUPE_INPUT_ERROR("%s: key '%s': bool element %llu is %u", file.c_str(), key.c_str(),
                                 static_cast<unsigned long long>(k), v.data[k]);
        }
      }
      break;
    }
  }
}

void GgufFile::parse_all() {
  const char* fn = path_.c_str();
  Cursor c(base_, size_, path_);
  const uint32_t magic = c.read<uint32_t>("magic");
  if (magic != kMagic) TROUPE_INPUT_ERROR("%s: not a GGUF file (bad magic 0x%08x)", fn, magic);
  version_ = c.read<uint32_t>("version");
  if (version_ != 2 && version_ != 3)
    TROUPE_INPUT_ERROR("%s: unsupported GGUF version %u (troupe reads 2 and 3)", fn, version_);
  const uint64_t n_tensors = c.read<uint64_t>("tensor count");
  const uint64_t n_kv = c.read<uint64_t>("metadata count");
  // A key-value pair takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor info at least
  // 8 + 4 + 8 + 4 + 8. Counts beyond what the file can hold are rejected before any allocation.
  if (n_kv > c.remaining() / 13)
    TROUPE_INPUT_ERROR("%s: metadata count %llu exceeds the file size", fn,
                       static_cast<unsigned long long>(n_kv));
  if (n_tensors > c.remaining() / 32)
    TROUPE_INPUT_ERROR("%s: tensor count %llu exceeds the file size", fn,
                       static_cast<unsigned long long>(n_tensors));

  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key(c.read_string("metadata key"));
    if (key.empty())
      TROUPE_INPUT_ERROR("%s: metadata entry %llu has an empty key", fn,
                         static_cast<unsigned long long>(k));
    uint32_t type = c.read<uint32_t>("metadata type");
    if (!valid_type(type))
      TROUPE_INPUT_ERROR("%s: key '%s' has invalid value type %u", fn, key.c_str(), type);
    GgufValue v;
    read_value(c, static_cast<GgufType>(type), v, path_, key);
    if (kv_.count(key)) TROUPE_INPUT_ERROR("%s: duplicate metadata key '%s'", fn, key.c_str());
    kv_.emplace(std::move(key), std::move(v));
  }

  if (const GgufValue* a = find("general.alignment")) {
    // GGUF requires a multiple of 8; below that, tensor data could sit at addresses that its
    // 16-bit values (f16, block scales) cannot be read from.
    if (!a->is_integer() || a->i < 8 || a->i > (1 << 20) || (a->i & (a->i - 1)) != 0)
      TROUPE_INPUT_ERROR("%s: general.alignment must be a power of two from 8 to 1 MiB", fn);
    alignment_ = static_cast<uint64_t>(a->i);
  }

  tensors_.reserve(n_tensors);
  for (uint64_t t = 0; t < n_tensors; ++t) {
    TensorInfo ti;
    ti.name = std::string(c.read_string("tensor name"));
    const char* tn = ti.name.c_str();
    const uint32_t nd = c.read<uint32_t>("tensor dimension count");
    if (nd == 0 || nd > kMaxDims)
      TROUPE_INPUT_ERROR("%s: tensor '%s' has %u dimensions (1 to 4 allowed)", fn, tn, nd);
    ti.n_dims = static_cast<int>(nd);
    uint64_t total = 1;
    for (uint32_t d = 0; d < nd; ++d) {
      const uint64_t ne = c.read<uint64_t>("tensor dimension");
      if (ne == 0 || ne > (uint64_t{1} << 40))
        TROUPE_INPUT_ERROR("%s: tensor '%s' dimension %u is %llu", fn, tn, d,
                           static_cast<unsigned long long>(ne));
      if (total > (uint64_t{1} << 50) / ne)
        TROUPE_INPUT_ERROR("%s: tensor '%s' has too many elements", fn, tn);
      total *= ne;
      ti.ne[d] = static_cast<int64_t>(ne);
    }
    const uint32_t type = c.read<uint32_t>("tensor type");
    auto tr = type_traits(type);
    if (!tr || type >= kFirstTroupeOnlyType)
      TROUPE_INPUT_ERROR("%s: tensor '%s' has unknown type id %u", fn, tn, type);
    ti.type = static_cast<GgmlType>(type);
    if (ti.ne[0] % tr->block_elems != 0)
      TROUPE_INPUT_ERROR(
          "%s: tensor '%s' row of %lld elements is not a multiple of the %s block "
          "size %lld",
          fn, tn, static_cast<long long>(ti.ne[0]), std::string(tr->name).c_str(),
          static_cast<long long>(tr->block_elems));
    ti.nbytes =
        total / static_cast<uint64_t>(tr->block_elems) * static_cast<uint64_t>(tr->block_bytes);
    ti.offset = c.read<uint64_t>("tensor offset");
    if (ti.offset % alignment_ != 0)
      TROUPE_INPUT_ERROR("%s: tensor '%s' offset %llu is not a multiple of the alignment %llu", fn,
                         tn, static_cast<unsigned long long>(ti.offset),
                         static_cast<unsigned long long>(alignment_));
    if (tensor_index_.count(ti.name)) TROUPE_INPUT_ERROR("%s: duplicate tensor '%s'", fn, tn);
    tensor_index_.emplace(ti.name, tensors_.size());
    tensors_.push_back(std::move(ti));
  }

  data_offset_ = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
  if (n_tensors > 0 && data_offset_ > size_)
    TROUPE_INPUT_ERROR("%s: truncated: data section would start at byte %llu of %llu", fn,
                       static_cast<unsigned long long>(data_offset_),
                       static_cast<unsigned long long>(size_));
  for (TensorInfo& ti : tensors_) {
    const uint64_t avail = size_ - data_offset_;
    if (ti.offset > avail || ti.nbytes > avail - ti.offset)
      TROUPE_INPUT_ERROR(
          "%s: tensor '%s' (%s, %s, %llu bytes at data offset %llu) extends past "
          "the end of the file (%llu bytes)",
          fn, ti.name.c_str(), type_name(ti.type).c_str(), ti.shape_string().c_str(),
          static_cast<unsigned long long>(ti.nbytes), static_cast<unsigned long long>(ti.offset),
          static_cast<unsigned long long>(size_));
    ti.data = base_ + data_offset_ + ti.offset;
  }
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

const TensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {
[[noreturn]] void missing(const std::string& file, std::string_view key) {
  TROUPE_INPUT_ERROR("%s: missing metadata key '%.*s'", file.c_str(), static_cast<int>(key.size()),
                     key.data());
}
[[noreturn]] void wrong(const std::string& file, std::string_view key, const char* want,
                        GgufType got) {
  TROUPE_INPUT_ERROR("%s: metadata key '%.*s' should be %s, is %s", file.c_str(),
                     static_cast<int>(key.size()), key.data(), want,
                     std::string(gguf_type_name(got)).c_str());
}
}  // namespace

std::string GgufFile::get_string(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) missing(path_, key);
  if (v->type != GgufType::kString) wrong(path_, key, "a string", v->type);
  return std::string(v->str);
}
int64_t GgufFile::get_int(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) missing(path_, key);
  if (!v->is_integer()) wrong(path_, key, "an integer", v->type);
  return v->i;
}
double GgufFile::get_float(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) missing(path_, key);
  if (v->is_float()) return v->f;
  if (v->is_integer()) return static_cast<double>(v->i);
  wrong(path_, key, "a number", v->type);
}
bool GgufFile::get_bool(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) missing(path_, key);
  if (v->type != GgufType::kBool) wrong(path_, key, "a bool", v->type);
  return v->u != 0;
}
std::string GgufFile::get_string_or(std::string_view key, std::string_view def) const {
  return find(key) ? get_string(key) : std::string(def);
}
int64_t GgufFile::get_int_or(std::string_view key, int64_t def) const {
  return find(key) ? get_int(key) : def;
}
double GgufFile::get_float_or(std::string_view key, double def) const {
  return find(key) ? get_float(key) : def;
}
bool GgufFile::get_bool_or(std::string_view key, bool def) const {
  return find(key) ? get_bool(key) : def;
}

}  // namespace troupe::model
