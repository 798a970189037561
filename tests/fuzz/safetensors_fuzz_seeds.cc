// Writes the safetensors fuzzer's seed corpus: small valid files (F32, F16 and BF16 tensors, a
// scalar, an unsupported dtype, metadata, an empty file of tensors) and truncations of them.
// Exits non-zero when the reader refuses a seed, so the seeds stay valid as the reader changes.
// Usage: safetensors_fuzz_seeds DIR
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "model/safetensors.h"

namespace {

// The file: an 8-byte little-endian header length, the JSON header, then `data_bytes` bytes.
std::vector<uint8_t> image(const std::string& header, size_t data_bytes) {
  std::vector<uint8_t> b(8);
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) b[static_cast<size_t>(i)] = static_cast<uint8_t>(n >> (8 * i));
  b.insert(b.end(), header.begin(), header.end());
  for (size_t i = 0; i < data_bytes; ++i) b.push_back(static_cast<uint8_t>(i * 37 + 11));
  return b;
}

int g_failures = 0;

void save(const std::filesystem::path& dir, const std::string& name, const std::vector<uint8_t>& b,
          bool truncations) {
  auto ok = troupe::model::SafetensorsFile::parse(b, name);
  if (!ok) {
    std::fprintf(stderr, "safetensors_fuzz_seeds: %s\n", ok.error().message.c_str());
    ++g_failures;
  }
  auto write = [&](const std::string& file, size_t n) {
    std::ofstream out(dir / file, std::ios::binary);
    out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(n));
  };
  write(name, b.size());
  if (!truncations) return;
  for (size_t k = 1; k <= 3; ++k) write(name + ".cut" + std::to_string(k), b.size() * k / 4);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: safetensors_fuzz_seeds DIR\n");
    return 2;
  }
  const std::filesystem::path dir(argv[1]);
  std::filesystem::create_directories(dir);
  save(dir, "three_types",
       image(R"({"__metadata__":{"format":"pt"},)"
             R"("a.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
             R"("b.weight":{"dtype":"F16","shape":[4],"data_offsets":[24,32]},)"
             R"("c":{"dtype":"BF16","shape":[2,2],"data_offsets":[32,40]}})",
             40),
       true);
  save(dir, "scalar_and_i64",
       image(R"({"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]},)"
             R"("ids":{"dtype":"I64","shape":[2],"data_offsets":[4,20]}})",
             20),
       true);
  save(dir, "padded_header",
       image(R"({"x":{"dtype":"BF16","shape":[1,4],"data_offsets":[0,8]}}      )", 8), false);
  save(dir, "no_tensors", image(R"({"__metadata__":{"a":"b","c":"d"}})", 0), false);
  return g_failures == 0 ? 0 : 1;
}
