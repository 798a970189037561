// Safetensors parsing with every field checked before use: a hostile file gets an InputError
// naming the file and the problem, never an out-of-bounds read, a crash or an unbounded
// allocation. Sharded directories are resolved through model.safetensors.index.json.
#include "model/safetensors.h"

#include <algorithm>

#include <nlohmann/json.hpp>
#include <sys/stat.h>

#include "base/check.h"
#include "model/gguf.h"

namespace troupe::model {

namespace {

using nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // as the reference implementation
constexpr int kMaxJsonDepth = 64;                   // a tensor header needs 3

struct DtypeInfo {
  std::string_view name;
  uint64_t size;  // bytes per element
  bool supported;
  GgmlType type;
};

// Every byte-sized dtype the format defines; only the float ones can become weights (F8_E4M3
// with its block scales: model/detail/hf_fp8.h).
constexpr DtypeInfo kDtypes[] = {
    {"F32", 4, true, GgmlType::kF32},
    {"F16", 2, true, GgmlType::kF16},
    {"BF16", 2, true, GgmlType::kBF16},
    {"F64", 8, false, GgmlType::kF64},
    {"I64", 8, false, GgmlType::kI64},
    {"U64", 8, false, GgmlType::kI64},
    {"I32", 4, false, GgmlType::kI32},
    {"U32", 4, false, GgmlType::kI32},
    {"I16", 2, false, GgmlType::kI16},
    {"U16", 2, false, GgmlType::kI16},
    {"I8", 1, false, GgmlType::kI8},
    {"U8", 1, false, GgmlType::kI8},
    {"BOOL", 1, false, GgmlType::kI8},
    {"F8_E4M3", 1, true, GgmlType::kF8_E4M3},
    {"F8_E5M2", 1, false, GgmlType::kI8},
    {"F8_E8M0", 1, false, GgmlType::kI8},
    // Two E2M1 values to a byte (PyTorch's float4_e2m1fn_x2): one element per byte.
    {"F4", 1, false, GgmlType::kI8},
};

const DtypeInfo* find_dtype(std::string_view s) {
  for (const DtypeInfo& d : kDtypes)
    if (d.name == s) return &d;
  return nullptr;
}

// Rejects nesting deeper than kMaxJsonDepth before the JSON parser sees the text.
void check_depth(std::string_view text, const std::string& file) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > kMaxJsonDepth)
        TROUPE_INPUT_ERROR("%s: header JSON nests deeper than %d levels", file.c_str(),
                           kMaxJsonDepth);
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
}

uint64_t get_u64(const json& v, const std::string& file, const std::string& tensor,
                 const char* what) {
  if (!v.is_number_unsigned())
    TROUPE_INPUT_ERROR("%s: tensor '%s': %s must be non-negative integers, got %s", file.c_str(),
                       tensor.c_str(), what, v.dump().c_str());
  return v.get<uint64_t>();
}

SafetensorsTensor parse_entry(const std::string& name, const json& e, const std::string& file,
                              const uint8_t* data, uint64_t data_size) {
  if (!e.is_object())
    TROUPE_INPUT_ERROR("%s: tensor '%s': entry is not a JSON object", file.c_str(), name.c_str());
  auto dt = e.find("dtype");
  auto sh = e.find("shape");
  auto off = e.find("data_offsets");
  if (dt == e.end() || !dt->is_string())
    TROUPE_INPUT_ERROR("%s: tensor '%s': missing or non-string \"dtype\"", file.c_str(),
                       name.c_str());
  if (sh == e.end() || !sh->is_array())
    TROUPE_INPUT_ERROR("%s: tensor '%s': missing or non-array \"shape\"", file.c_str(),
                       name.c_str());
  if (off == e.end() || !off->is_array() || off->size() != 2)
    TROUPE_INPUT_ERROR("%s: tensor '%s': \"data_offsets\" must be an array [begin, end]",
                       file.c_str(), name.c_str());

  SafetensorsTensor t;
  t.name = name;
  t.dtype = dt->get<std::string>();
  const DtypeInfo* info = find_dtype(t.dtype);
  if (!info)
    TROUPE_INPUT_ERROR("%s: tensor '%s': unknown dtype '%s'", file.c_str(), name.c_str(),
                       t.dtype.c_str());
  t.supported = info->supported;
  t.type = info->type;

  uint64_t count = 1;
  bool overflow = false;
  for (const json& d : *sh) {
    const uint64_t n = get_u64(d, file, name, "shape entries");
    if (n > static_cast<uint64_t>(INT64_MAX)) overflow = true;
    t.shape.push_back(static_cast<int64_t>(n));
    if (__builtin_mul_overflow(count, n, &count)) overflow = true;
  }
  uint64_t expect_bytes = 0;
  if (overflow || __builtin_mul_overflow(count, info->size, &expect_bytes))
    TROUPE_INPUT_ERROR("%s: tensor '%s': shape %s overflows", file.c_str(), name.c_str(),
                       sh->dump().c_str());

  const uint64_t begin = get_u64((*off)[0], file, name, "data_offsets");
  const uint64_t end = get_u64((*off)[1], file, name, "data_offsets");
  if (begin > end)
    TROUPE_INPUT_ERROR("%s: tensor '%s': data_offsets [%llu, %llu] end before they begin",
                       file.c_str(), name.c_str(), static_cast<unsigned long long>(begin),
                       static_cast<unsigned long long>(end));
  if (end > data_size)
    TROUPE_INPUT_ERROR(
        "%s: tensor '%s': data_offsets [%llu, %llu] out of range: the data "
        "buffer holds %llu bytes",
        file.c_str(), name.c_str(), static_cast<unsigned long long>(begin),
        static_cast<unsigned long long>(end), static_cast<unsigned long long>(data_size));
  if (end - begin != expect_bytes)
    TROUPE_INPUT_ERROR(
        "%s: tensor '%s': shape %s of %s needs %llu bytes but data_offsets "
        "[%llu, %llu] span %llu",
        file.c_str(), name.c_str(), t.shape_string().c_str(), t.dtype.c_str(),
        static_cast<unsigned long long>(expect_bytes), static_cast<unsigned long long>(begin),
        static_cast<unsigned long long>(end), static_cast<unsigned long long>(end - begin));
  t.data = data + begin;
  t.nbytes = expect_bytes;
  return t;
}

bool is_regular_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace

int64_t SafetensorsTensor::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string SafetensorsTensor::shape_string() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

SafetensorsFile::~SafetensorsFile() = default;

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  try {
    std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
    f->path_ = path;
    f->map_ = std::make_unique<MappedFile>(path);
    f->parse_all(f->map_->data(), f->map_->size());
    return f;
  } catch (const std::exception& e) {
    return Error{1, e.what()};
  }
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::parse(std::span<const uint8_t> bytes,
                                                                const std::string& name) {
  try {
    std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
    f->path_ = name;
    f->parse_all(bytes.data(), bytes.size());
    return f;
  } catch (const std::exception& e) {
    return Error{1, e.what()};
  }
}

void SafetensorsFile::parse_all(const uint8_t* base, uint64_t size) {
  const std::string& file = path_;
  if (size < 8)
    TROUPE_INPUT_ERROR("%s: file too small (%llu bytes) to hold the 8-byte header length",
                       file.c_str(), static_cast<unsigned long long>(size));
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | base[i];  // little-endian
  if (header_len > size - 8)
    TROUPE_INPUT_ERROR(
        "%s: header length %llu exceeds the file size (%llu bytes after the "
        "length field)",
        file.c_str(), static_cast<unsigned long long>(header_len),
        static_cast<unsigned long long>(size - 8));
  if (header_len > kMaxHeaderBytes)
    TROUPE_INPUT_ERROR("%s: header length %llu exceeds the %llu-byte limit", file.c_str(),
                       static_cast<unsigned long long>(header_len),
                       static_cast<unsigned long long>(kMaxHeaderBytes));
  const std::string_view text(reinterpret_cast<const char*>(base + 8), header_len);
  if (text.empty() || text[0] != '{')
    TROUPE_INPUT_ERROR("%s: header is not a JSON object (does not start with '{')", file.c_str());
  check_depth(text, file);
  json header;
  try {
    header = json::parse(text);
  } catch (const json::exception& e) {
    TROUPE_INPUT_ERROR("%s: header is not valid JSON: %s", file.c_str(), e.what());
  }
  if (!header.is_object()) TROUPE_INPUT_ERROR("%s: header is not a JSON object", file.c_str());

  const uint8_t* data = base + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object())
        TROUPE_INPUT_ERROR("%s: __metadata__ is not a JSON object", file.c_str());
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string())
          TROUPE_INPUT_ERROR("%s: __metadata__ value '%s' is not a string", file.c_str(),
                             m.key().c_str());
        metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    tensors_.push_back(parse_entry(it.key(), *it, file, data, data_size));
    tensors_.back().file = &path_;
  }
  // nlohmann's object is a std::map, so tensors_ is sorted by name already.

  // No two tensors may share bytes (empty tensors occupy none).
  std::vector<const SafetensorsTensor*> by_offset;
  for (const SafetensorsTensor& t : tensors_)
    if (t.nbytes > 0) by_offset.push_back(&t);
  std::sort(
      by_offset.begin(), by_offset.end(),
      [](const SafetensorsTensor* a, const SafetensorsTensor* b) { return a->data < b->data; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const SafetensorsTensor* a = by_offset[i - 1];
    const SafetensorsTensor* b = by_offset[i];
    if (a->data + a->nbytes > b->data) {
      auto off = [&](const SafetensorsTensor* t) {
        return static_cast<unsigned long long>(t->data - data);
      };
      TROUPE_INPUT_ERROR("%s: tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap",
                         file.c_str(), a->name.c_str(), off(a), off(a) + a->nbytes, b->name.c_str(),
                         off(b), off(b) + b->nbytes);
    }
  }
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  auto it =
      std::lower_bound(tensors_.begin(), tensors_.end(), name,
                       [](const SafetensorsTensor& t, std::string_view n) { return t.name < n; });
  return it != tensors_.end() && it->name == name ? &*it : nullptr;
}

void SafetensorsSet::add_file(std::unique_ptr<SafetensorsFile> f) {
  for (const SafetensorsTensor& t : f->tensors()) {
    auto [it, inserted] = index_.emplace(t.name, &t);
    if (!inserted)
      TROUPE_INPUT_ERROR("%s: tensor '%s' is also in %s", f->path().c_str(), t.name.c_str(),
                         it->second->file->c_str());
  }
  files_.push_back(std::move(f));
}

Result<std::unique_ptr<SafetensorsSet>> SafetensorsSet::open_file(const std::string& path) {
  try {
    auto f = SafetensorsFile::open(path);
    if (!f) return f.error();
    std::unique_ptr<SafetensorsSet> set(new SafetensorsSet());
    set->add_file(std::move(*f));
    return set;
  } catch (const std::exception& e) {
    return Error{1, e.what()};
  }
}

Result<std::unique_ptr<SafetensorsSet>> SafetensorsSet::open_dir(const std::string& dir) {
  try {
    const std::string index_path = dir + "/model.safetensors.index.json";
    if (!is_regular_file(index_path)) {
      const std::string single = dir + "/model.safetensors";
      if (!is_regular_file(single))
        TROUPE_INPUT_ERROR("%s: no model.safetensors or model.safetensors.index.json", dir.c_str());
      return open_file(single);
    }
    MappedFile map(index_path);
    const std::string_view text(reinterpret_cast<const char*>(map.data()), map.size());
    check_depth(text, index_path);
    json index;
    try {
      index = json::parse(text);
    } catch (const json::exception& e) {
      TROUPE_INPUT_ERROR("%s: not valid JSON: %s", index_path.c_str(), e.what());
    }
    auto wm = index.is_object() ? index.find("weight_map") : index.end();
    if (wm == index.end() || !wm->is_object())
      TROUPE_INPUT_ERROR("%s: missing \"weight_map\" object", index_path.c_str());

    std::map<std::string, size_t> shard_of;  // file name -> position in files_
    std::unique_ptr<SafetensorsSet> set(new SafetensorsSet());
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      if (!it->is_string())
        TROUPE_INPUT_ERROR("%s: weight_map entry '%s' is not a file name", index_path.c_str(),
                           it.key().c_str());
      const std::string shard = it->get<std::string>();
      if (shard.empty() || shard[0] == '/' || shard.find("..") != std::string::npos)
        TROUPE_INPUT_ERROR(
            "%s: weight_map entry '%s' names '%s', which is not a file inside "
            "the model directory",
            index_path.c_str(), it.key().c_str(), shard.c_str());
      if (shard_of.count(shard)) continue;
      auto f = SafetensorsFile::open(dir + "/" + shard);
      if (!f) return f.error();
      shard_of[shard] = set->files_.size();
      set->add_file(std::move(*f));
    }
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      const SafetensorsFile& f = *set->files_[shard_of.at(it->get<std::string>())];
      if (!f.find(it.key()))
        TROUPE_INPUT_ERROR("%s: weight_map places '%s' in %s, which does not hold it",
                           index_path.c_str(), it.key().c_str(), f.path().c_str());
    }
    return set;
  } catch (const std::exception& e) {
    return Error{1, e.what()};
  }
}

const SafetensorsTensor* SafetensorsSet::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

}  // namespace troupe::model
