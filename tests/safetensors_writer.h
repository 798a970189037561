// Writing safetensors files in tests and fuzzers: tensors given as bytes, laid out in order
// behind an 8-byte aligned JSON header. Header-only, no test framework.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace troupe::testing {

/// One tensor of a safetensors file being written.
struct StTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

/// A safetensors image of `tensors` (in order; 8-byte aligned header).
inline std::string safetensors_image(const std::vector<StTensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const StTensor& t : tensors) {
    const size_t begin = data.size();
    data += t.bytes;
    header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {begin, data.size()}}};
  }
  std::string h = header.dump();
  while (h.size() % 8 != 0) h += ' ';
  std::string out(8, '\0');
  const uint64_t len = h.size();
  std::memcpy(out.data(), &len, 8);
  return out + h + data;
}

inline std::string f32_bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

}  // namespace troupe::testing
