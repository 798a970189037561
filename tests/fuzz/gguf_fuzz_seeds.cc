// Writes the GGUF fuzzer's seed corpus: small valid files from GgufWriter (every metadata type,
// every writable tensor type, custom alignment, version 2) and truncations of them.
// Usage: gguf_fuzz_seeds DIR
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "model/gguf_writer.h"

namespace {

using namespace troupe::model;

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), {});
}

void save(const std::filesystem::path& dir, const std::string& name,
          const std::vector<uint8_t>& b) {
  std::ofstream out(dir / name, std::ios::binary);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

bool emit(const GgufWriter& w, const std::filesystem::path& dir, const std::string& name,
          bool truncations) {
  const std::string path = (dir / (name + ".gguf")).string();
  auto st = w.write(path);
  if (!st.has_value()) {
    std::fprintf(stderr, "gguf_fuzz_seeds: %s\n", st.error().message.c_str());
    return false;
  }
  if (!truncations) return true;
  const std::vector<uint8_t> full = read_all(path);
  // A handful of cut points: inside the header, the metadata, the tensor infos and the data.
  for (size_t k = 1; k <= 6; ++k) {
    const size_t n = full.size() * k / 7;
    save(dir, name + ".cut" + std::to_string(n),
         std::vector<uint8_t>(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n)));
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: gguf_fuzz_seeds DIR\n");
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);
  bool ok = true;

  {  // every metadata type, no tensors
    GgufWriter w;
    w.set_string("general.architecture", "llama");
    w.set_u8("k.u8", 7);
    w.set_i8("k.i8", -7);
    w.set_u16("k.u16", 700);
    w.set_i16("k.i16", -700);
    w.set_u32("k.u32", 70000);
    w.set_i32("k.i32", -70000);
    w.set_u64("k.u64", 7000000000ull);
    w.set_i64("k.i64", -7000000000ll);
    w.set_f32("k.f32", 0.5f);
    w.set_f64("k.f64", -0.25);
    w.set_bool("k.bool", true);
    const std::vector<std::string> toks = {"<s>", "</s>", "a", "Ġthe", ""};
    w.set_string_array("tokenizer.ggml.tokens", toks);
    const std::vector<float> scores = {0.f, -1.f, -2.5f, 1e30f, -0.f};
    w.set_array_f32("tokenizer.ggml.scores", scores);
    const std::vector<int32_t> types = {3, 3, 1, 1, 6};
    w.set_array_i32("tokenizer.ggml.token_type", types);
    const bool flags[] = {true, false};
    w.set_array_bool("k.bools", flags);
    const double d[] = {1.0, -2.0};
    w.set_array("k.f64s", GgufType::kF64, d, 2);
    ok &= emit(w, dir, "metadata", true);
  }
  {  // one tensor of each writable type, 2-D and 3-D
    GgufWriter w;
    w.set_string("general.architecture", "llama");
    w.set_u32("llama.block_count", 1);
    std::vector<float> x(64 * 2);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 17) * 0.25f - 2.f;
    const int64_t s2[] = {64, 2};
    const int64_t s3[] = {32, 2, 2};
    ok &= w.add_tensor_f32("a.f32", GgmlType::kF32, s2, x).has_value();
    ok &= w.add_tensor_f32("a.f16", GgmlType::kF16, s3, x).has_value();
    ok &= w.add_tensor_f32("a.bf16", GgmlType::kBF16, s2, x).has_value();
    ok &= w.add_tensor_f32("a.q8_0", GgmlType::kQ8_0, s3, x).has_value();
    ok &= w.add_tensor_f32("a.q4_0", GgmlType::kQ4_0, s2, x).has_value();
    ok &= emit(w, dir, "tensors", true);
  }
  {  // custom alignment
    GgufWriter w;
    w.set_alignment(64);
    const std::vector<float> x(8, 1.f);
    const int64_t s[] = {8};
    ok &= w.add_tensor_f32("n1.weight", GgmlType::kF32, s, x).has_value();
    ok &= w.add_tensor_f32("n2.weight", GgmlType::kF32, s, x).has_value();
    ok &= emit(w, dir, "align64", false);
  }
  {  // q4_K/q6_K blocks (readable types the writer only stores raw)
    GgufWriter w;
    std::vector<uint8_t> q4k(144), q6k(210);
    for (size_t i = 0; i < q4k.size(); ++i) q4k[i] = static_cast<uint8_t>(i * 7);
    for (size_t i = 0; i < q6k.size(); ++i) q6k[i] = static_cast<uint8_t>(i * 5);
    const int64_t s[] = {256};
    ok &= w.add_tensor("k4", GgmlType::kQ4_K, s, q4k).has_value();
    ok &= w.add_tensor("k6", GgmlType::kQ6_K, s, q6k).has_value();
    ok &= emit(w, dir, "kquants", false);
    // The same as GGUF v2 (identical layout apart from the version field).
    std::vector<uint8_t> b = read_all((dir / "kquants.gguf").string());
    b[4] = 2;
    save(dir, "kquants_v2.gguf", b);
  }
  return ok ? 0 : 1;
}
