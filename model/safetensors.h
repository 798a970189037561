// Safetensors reader: memory-maps .safetensors files (one, or the shards of a
// model.safetensors.index.json) and exposes zero-copy tensor views. Used by the Hugging Face model
// loader (model/hf_model.cc) and tests. Every header field is validated; immutable after open.
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

/// One tensor as the file stores it: row-major, shape outermost first (PyTorch order), so a
/// torch.nn.Linear weight is [out_features, in_features].
struct SafetensorsTensor {
  std::string name;
  std::string dtype;       // as written: "F32", "BF16", "I64", ...
  bool supported = false;  // F32, F16, BF16 or F8_E4M3 (then `type` is meaningful)
  GgmlType type = GgmlType::kF32;
  std::vector<int64_t> shape;     // may be empty (a scalar)
  const uint8_t* data = nullptr;  // into the file mapping
  uint64_t nbytes = 0;
  const std::string* file = nullptr;  // path of the file holding it (owned by the reader)

  int64_t num_elements() const;
  std::string shape_string() const;  // "[512, 64]"
};

/// One .safetensors file.
class SafetensorsFile {
 public:
  /// Maps and validates `path`. Errors name the file and the problem (header length beyond the
  /// file, bad JSON, unknown dtype, shape/byte-size mismatch, offsets out of range or overlapping).
  static Result<std::unique_ptr<SafetensorsFile>> open(const std::string& path);
  /// Parses an in-memory image; `bytes` must outlive the result.
  static Result<std::unique_ptr<SafetensorsFile>> parse(std::span<const uint8_t> bytes,
                                                        const std::string& name);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, std::string, std::less<>>& metadata() const { return metadata_; }
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }  // sorted by name
  const SafetensorsTensor* find(std::string_view name) const;

 private:
  SafetensorsFile() = default;
  void parse_all(const uint8_t* base, uint64_t size);

  std::string path_;
  std::unique_ptr<MappedFile> map_;
  std::map<std::string, std::string, std::less<>> metadata_;
  std::vector<SafetensorsTensor> tensors_;
};

/// The weights of a Hugging Face model directory: model.safetensors.index.json and its shards
/// (each file mapped once), else model.safetensors.
class SafetensorsSet {
 public:
  /// Errors name the file and the problem (missing shard, a tensor the index places in a file
  /// that lacks it, one tensor in two shards, a shard path leaving the directory).
  static Result<std::unique_ptr<SafetensorsSet>> open_dir(const std::string& dir);
  /// One file (no index).
  static Result<std::unique_ptr<SafetensorsSet>> open_file(const std::string& path);

  const SafetensorsTensor* find(std::string_view name) const;
  const std::map<std::string, const SafetensorsTensor*, std::less<>>& tensors() const {
    return index_;
  }
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  SafetensorsSet() = default;
  void add_file(std::unique_ptr<SafetensorsFile> f);

  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsTensor*, std::less<>> index_;
};

}  // namespace troupe::model
