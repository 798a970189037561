// libFuzzer target: grammars (compute/grammar.h). The input is a GBNF source, a NUL byte, and
// bytes to match. The source is compiled (small limits); when it compiles, the bytes are fed one
// at a time, and at each step the token mask over a fixed vocabulary must equal the token-by-token
// check. Any crash, hang, sanitizer report or disagreement is a finding; compile errors are fine.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "compute/grammar.h"

namespace {

const troupe::compute::TokenVocab& vocab() {
  static const troupe::compute::TokenVocab v = [] {
    std::vector<std::string> pieces;
    for (int b = 0; b < 256; ++b) pieces.push_back(std::string(1, static_cast<char>(b)));
    for (const char* p :
         {"{\"", "\":", "\",\"", "true", "null", "false", "\"}",          "  ",    "\n  ", "ab",
          "abc", "0.",  "12",    "-1",   "é",    "€",     "\xF0\x9F\x98", "\\u00", "[{",   "}]"})
      pieces.push_back(p);
    pieces.push_back("");  // a control token
    pieces.push_back("");  // the end token
    return troupe::compute::TokenVocab(pieces, {static_cast<int32_t>(pieces.size() - 1)});
  }();
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  const std::string_view source = in.substr(0, nul);
  const std::string_view text = nul == std::string_view::npos ? "" : in.substr(nul + 1);
  troupe::compute::GrammarLimits lim;
  lim.max_elements = 20000;
  lim.max_repeat = 64;
  lim.max_heads = 256;
  auto g = troupe::compute::Grammar::compile(source, lim);
  if (!g) {
    if (g.error().message.empty()) std::abort();
    return 0;
  }
  troupe::compute::GrammarMatcher m(*g);
  std::vector<uint8_t> mask;
  for (size_t i = 0; i <= text.size() && i < 64; ++i) {
    const int64_t n = m.fill_mask(vocab(), &mask);
    if (n < 0) break;  // past max_walk_states: the mask is unknown (said so)
    int64_t count = 0;
    for (int32_t id = 0; id < vocab().size(); ++id) {
      if ((mask[size_t(id)] != 0) != m.allows(vocab(), id)) {
        std::fprintf(stderr, "grammar_fuzz: mask and allows() disagree on token %d\n", id);
        std::abort();
      }
      count += mask[size_t(id)];
    }
    if (count != n) std::abort();
    if (i == text.size() || !m.accept_bytes(text.substr(i, 1))) break;
  }
  (void)m.state_key();
  return 0;
}
