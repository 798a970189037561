// GGUF v2/v3 reader: memory-maps a file, validates every header field, and exposes metadata and
// zero-copy tensor views. Used by the model loader, `troupe inspect` and the tokenizers.
// A GgufFile is immutable after open; any thread may read it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"
#include "model/ggml_types.h"

namespace troupe::model {

class MappedFile;

/// GGUF metadata value types (on-disk numbering).
enum class GgufType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};
std::string_view gguf_type_name(GgufType t);
/// Bytes of one scalar of type t (1, 2, 4 or 8); 0 for strings and arrays.
int gguf_scalar_size(GgufType t);

/// One metadata value. Scalars are widened into the matching member; strings and string
/// arrays point into the mapping (valid while the GgufFile lives); numeric arrays keep a pointer
/// to their little-endian data in the mapping.
struct GgufValue {
  GgufType type = GgufType::kU8;
  uint64_t u = 0;  // unsigned scalars and bool
  int64_t i = 0;   // signed scalars
  double f = 0;    // float scalars
  std::string_view str;
  // arrays
  GgufType elem_type = GgufType::kU8;
  uint64_t count = 0;
  const uint8_t* data = nullptr;          // numeric array elements, unaligned
  std::vector<std::string_view> strings;  // string array elements

  bool is_integer() const;
  bool is_float() const { return type == GgufType::kF32 || type == GgufType::kF64; }
  /// Numeric array element i as double / int64 (bounds-checked by the caller).
  double array_f64(uint64_t idx) const;
  int64_t array_i64(uint64_t idx) const;
};

/// A tensor as stored: ne[0] is the innermost (contiguous) dimension, as in ggml.
struct TensorInfo {
  std::string name;
  GgmlType type = GgmlType::kF32;
  int n_dims = 0;
  int64_t ne[4] = {1, 1, 1, 1};
  uint64_t offset = 0;  // from the start of the data section
  const uint8_t* data = nullptr;
  uint64_t nbytes = 0;
  int64_t num_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  std::string shape_string() const;  // "[128, 512]"
};

class GgufFile {
 public:
  /// Maps and validates `path`. Errors name the file and the problem (truncated header,
  /// bad magic, unsupported version, a tensor past the end of the file, ...).
  static Result<std::unique_ptr<GgufFile>> open(const std::string& path);
  /// Parses an in-memory image (the fuzzer's entry point); `bytes` must outlive the result.
  static Result<std::unique_ptr<GgufFile>> parse(std::span<const uint8_t> bytes,
                                                 const std::string& name);
  ~GgufFile();

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  uint64_t file_size() const { return size_; }

  const std::map<std::string, GgufValue, std::less<>>& metadata() const { return kv_; }
  const GgufValue* find(std::string_view key) const;
  // Typed getters: throw InputError naming the file and key when missing or of the wrong type.
  std::string get_string(std::string_view key) const;
  int64_t get_int(std::string_view key) const;
  double get_float(std::string_view key) const;
  bool get_bool(std::string_view key) const;
  // Optional variants.
  std::string get_string_or(std::string_view key, std::string_view def) const;
  int64_t get_int_or(std::string_view key, int64_t def) const;
  double get_float_or(std::string_view key, double def) const;
  bool get_bool_or(std::string_view key, bool def) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;

 private:
  GgufFile() = default;
  void parse_all();

  std::string path_;
  std::unique_ptr<MappedFile> map_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::map<std::string, GgufValue, std::less<>> kv_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

/// A read-only memory mapping of a whole file. Shared by GGUF and safetensors readers.
class MappedFile {
 public:
  /// Throws InputError naming the file when it cannot be opened or mapped.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace troupe::model
