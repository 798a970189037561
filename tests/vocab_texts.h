// llama.cpp's tokenizer test texts (models/llama.cpp-vocab/*.inp in ../shared): each input is
// followed by a "\n__ggml_vocab_test__\n" line. Users: tests/model/tokenizer_test.cc and the
// tokenizer fuzzer's seed writer (tests/fuzz/tokenizer_fuzz_seeds.cc). No gtest here.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace troupe::testing {

/// The inputs of an .inp file's contents, in order (what follows the last separator is not one).
inline std::vector<std::string> split_vocab_texts(std::string_view inp) {
  constexpr std::string_view kSep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  size_t pos = 0;
  for (size_t hit; (hit = inp.find(kSep, pos)) != std::string_view::npos; pos = hit + kSep.size())
    texts.emplace_back(inp.substr(pos, hit - pos));
  return texts;
}

}  // namespace troupe::testing
