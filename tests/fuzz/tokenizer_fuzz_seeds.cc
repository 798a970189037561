// Writes the tokenizer fuzzer's seed corpus from llama.cpp's tokenizer test texts in ../shared
// (models/llama.cpp-vocab/*.inp: texts separated by "__ggml_vocab_test__" lines): each text once
// per vocabulary of tokenizer_fuzz.cc, behind a selector byte that also varies the flags.
// Usage: tokenizer_fuzz_seeds SHARED_DIR OUT_DIR
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/vocab_texts.h"

namespace {

constexpr int kVocabs = 5;  // tokenizer_fuzz.cc loads five

std::vector<std::string> texts(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(in)), {});
  return troupe::testing::split_vocab_texts(all);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: tokenizer_fuzz_seeds SHARED_DIR OUT_DIR\n");
    return 2;
  }
  const std::filesystem::path in = std::filesystem::path(argv[1]) / "models/llama.cpp-vocab";
  const std::filesystem::path out(argv[2]);
  std::filesystem::create_directories(out);
  // One vocabulary's texts are enough: they are the same list for every vocabulary.
  const std::vector<std::string> all = texts((in / "ggml-vocab-llama-spm.gguf.inp").string());
  if (all.size() < 2) {
    std::fprintf(stderr, "tokenizer_fuzz_seeds: no texts in %s\n", in.c_str());
    return 1;
  }
  int n = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    for (int v = 0; v < kVocabs; ++v) {
      const char selector = static_cast<char>(v + kVocabs * static_cast<int>((i + v) % 4));
      std::ofstream f(out / ("text" + std::to_string(i) + "_v" + std::to_string(v)),
                      std::ios::binary);
      f.put(selector);
      f.write(all[i].data(), static_cast<std::streamsize>(all[i].size()));
      ++n;
    }
  }
  std::printf("tokenizer_fuzz_seeds: %d seeds\n", n);
  return 0;
}
