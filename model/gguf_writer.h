// GGUF v3 writer: collects metadata and tensor declarations, then streams the file to disk one
// tensor chunk at a time (tensor bytes come from caller memory or a fill callback, never a second
// whole-file copy). Used by `troupe synth`, tests and the fuzzer's seed corpus. Not thread-safe;
// a fill callback may use threads of its own.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"
#include "model/ggml_types.h"
#include "model/gguf.h"

namespace troupe::model {

/// Writes rows [row_begin, row_begin + num_rows) of a tensor into dst, in the tensor's stored
/// type. A "row" is ne[0] elements; a tensor has ne[1]*ne[2]*ne[3] rows. Throwing aborts write().
using TensorFill = std::function<void(int64_t row_begin, int64_t num_rows, uint8_t* dst)>;

class GgufWriter {
 public:
  /// Longest tensor name ggml accepts (GGML_MAX_NAME - 1).
  static constexpr size_t kMaxTensorName = 63;

  GgufWriter() = default;
  GgufWriter(const GgufWriter&) = delete;
  GgufWriter& operator=(const GgufWriter&) = delete;

  // --- metadata: setting an existing key replaces its value and keeps its position ---
  void set_u8(std::string_view key, uint8_t v);
  void set_i8(std::string_view key, int8_t v);
  void set_u16(std::string_view key, uint16_t v);
  void set_i16(std::string_view key, int16_t v);
  void set_u32(std::string_view key, uint32_t v);
  void set_i32(std::string_view key, int32_t v);
  void set_u64(std::string_view key, uint64_t v);
  void set_i64(std::string_view key, int64_t v);
  void set_f32(std::string_view key, float v);
  void set_f64(std::string_view key, double v);
  void set_bool(std::string_view key, bool v);
  void set_string(std::string_view key, std::string_view v);
  /// Numeric array: `count` little-endian elements of `elem` (not string, not array) at data.
  void set_array(std::string_view key, GgufType elem, const void* data, uint64_t count);
  void set_array_i32(std::string_view key, std::span<const int32_t> v);
  void set_array_u32(std::string_view key, std::span<const uint32_t> v);
  void set_array_f32(std::string_view key, std::span<const float> v);
  void set_array_bool(std::string_view key, std::span<const bool> v);
  void set_string_array(std::string_view key, std::span<const std::string> v);
  void set_string_array(std::string_view key, std::span<const std::string_view> v);
  /// Copies a value read by GgufFile (any type, arrays included) under `key`.
  void copy_value(std::string_view key, const GgufValue& v);
  /// Sets general.alignment (a power of two); tensor offsets follow it. Default 32.
  void set_alignment(uint32_t alignment);
  bool has_key(std::string_view key) const;
  void remove_key(std::string_view key);
  size_t num_keys() const { return kv_.size(); }

  // --- tensors, written in the order added; shape as ggml: ne[0] innermost, 1 to 4 dims ---
  /// A tensor whose bytes (row_bytes(type, ne[0]) * rows) the caller keeps alive until write().
  Status add_tensor(std::string_view name, GgmlType type, std::span<const int64_t> shape,
                    std::span<const uint8_t> data);
  /// A tensor produced on demand by `fill` during write(), in chunks of whole rows.
  Status add_tensor(std::string_view name, GgmlType type, std::span<const int64_t> shape,
                    TensorFill fill);
  /// Float data (caller-owned, ne elements) converted to `type` while writing
  /// (f32, f16, bf16, q8_0, q4_0).
  Status add_tensor_f32(std::string_view name, GgmlType type, std::span<const int64_t> shape,
                        std::span<const float> data);
  size_t num_tensors() const { return tensors_.size(); }
  /// Bytes the file will have (header, padding and data), given what was added so far.
  uint64_t file_size() const;

  /// Writes everything to `path` (through `path`.tmp, renamed on success). Errors name the path.
  Status write(const std::string& path) const;
  /// The header and metadata only: what write() puts before the tensor data (for tests).
  std::vector<uint8_t> header_bytes() const;

 private:
  struct Kv {
    std::string key;
    GgufType type;
    std::vector<uint8_t> payload;  // the value as serialised after the type field
  };
  struct Tensor {
    std::string name;
    GgmlType type;
    int n_dims;
    int64_t ne[4];
    uint64_t nbytes;
    std::span<const uint8_t> bytes;  // caller-owned data, or empty when `fill` produces it
    TensorFill fill;
  };
  void set_raw(std::string_view key, GgufType type, std::vector<uint8_t> payload);
  Status add(std::string_view name, GgmlType type, std::span<const int64_t> shape,
             std::span<const uint8_t> bytes, TensorFill fill);
  uint64_t alignment() const;
  /// Offsets of each tensor in the data section, and the data section's padded size.
  std::vector<uint64_t> offsets(uint64_t* data_bytes) const;

  std::vector<Kv> kv_;
  std::vector<Tensor> tensors_;
};

}  // namespace troupe::model
