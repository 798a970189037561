// tiktoken vocabularies (Hugging Face directories with tiktoken.model instead of tokenizer.json,
// e.g. Kimi-K2): one "base64(bytes) rank" line per token, read into the same byte-level BPE
// VocabSpec a GGUF conversion holds. Tokens are spelled with GPT-2's byte characters; the merges
// are derived from the ranks as the GGUF converter derives them (each token of two or more
// bytes, encoded with only the lower ranks, ends as exactly two parts: that pair merges at the
// token's rank). Reads the file once; nothing is kept.
#include <algorithm>
#include <fstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/base64.h"
#include "base/check.h"
#include "model/detail/tokenizer_vocab.h"
#include "model/detail/unicode.h"

namespace troupe::model::detail {

namespace {

constexpr int64_t kMaxTokens = int64_t{1} << 24;

std::string byte_chars(std::string_view bytes) {
  std::string s;
  for (char c : bytes) s += gpt2_byte_to_utf8(static_cast<uint8_t>(c));
  return s;
}

}  // namespace

VocabSpec spec_from_tiktoken(const std::string& path, const std::string& pre) {
  std::ifstream in(path, std::ios::binary);
  if (!in) TROUPE_INPUT_ERROR("%s: cannot read", path.c_str());
  std::vector<std::string> by_rank;  // bytes of rank r ("" = no token)
  std::vector<bool> present;
  std::unordered_map<std::string, int64_t> rank_of;
  std::string line, bytes;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    const size_t sp = line.find(' ');
    if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos)
      TROUPE_INPUT_ERROR("%s:%lld: expected \"<base64 bytes> <rank>\"", path.c_str(),
                         static_cast<long long>(line_no));
    if (!base64_decode(std::string_view(line).substr(0, sp), &bytes))
      TROUPE_INPUT_ERROR("%s:%lld: token bytes are not valid base64", path.c_str(),
                         static_cast<long long>(line_no));
    const std::string rank_text = line.substr(sp + 1);
    int64_t rank = 0;
    for (char c : rank_text) {
      if (c < '0' || c > '9' || rank >= kMaxTokens)
        TROUPE_INPUT_ERROR("%s:%lld: rank \"%s\" is not an integer below 2^24", path.c_str(),
                           static_cast<long long>(line_no), rank_text.c_str());
      rank = rank * 10 + (c - '0');
    }
    if (rank_text.empty() || rank >= kMaxTokens)
      TROUPE_INPUT_ERROR("%s:%lld: rank \"%s\" is not an integer below 2^24", path.c_str(),
                         static_cast<long long>(line_no), rank_text.c_str());
    if (static_cast<int64_t>(by_rank.size()) <= rank) {
      by_rank.resize(static_cast<size_t>(rank + 1));
      present.resize(static_cast<size_t>(rank + 1), false);
    }
    if (present[static_cast<size_t>(rank)])
      TROUPE_INPUT_ERROR("%s:%lld: rank %lld appears twice", path.c_str(),
                         static_cast<long long>(line_no), static_cast<long long>(rank));
    if (!rank_of.emplace(bytes, rank).second)
      TROUPE_INPUT_ERROR("%s:%lld: the same bytes appear twice (ranks %lld and %lld)", path.c_str(),
                         static_cast<long long>(line_no), static_cast<long long>(rank_of[bytes]),
                         static_cast<long long>(rank));
    present[static_cast<size_t>(rank)] = true;
    by_rank[static_cast<size_t>(rank)] = bytes;
  }
  if (rank_of.empty()) TROUPE_INPUT_ERROR("%s: no tokens", path.c_str());

  VocabSpec spec;
  spec.source = path;
  spec.kind = VocabKind::kBpe;
  spec.pre = pre;
  const size_t n = by_rank.size();
  spec.tokens.resize(n);
  spec.types.assign(n, static_cast<int32_t>(TokenAttr::kNormal));
  for (size_t r = 0; r < n; ++r) {
    if (present[r]) {
      spec.tokens[r] = byte_chars(by_rank[r]);
    } else {
      spec.tokens[r] = "[PAD" + std::to_string(r) + "]";
      spec.types[r] = static_cast<int32_t>(TokenAttr::kUnused);
    }
  }
  // Merges in rank order: BPE over a token's bytes with the ranks below its own.
  std::vector<std::string> parts;
  for (size_t r = 0; r < n; ++r) {
    if (!present[r] || by_rank[r].size() < 2) continue;
    const std::string& b = by_rank[r];
    parts.clear();
    for (char c : b) parts.emplace_back(1, c);
    for (;;) {
      int64_t best = -1;
      size_t at = 0;
      for (size_t i = 0; i + 1 < parts.size(); ++i) {
        auto it = rank_of.find(parts[i] + parts[i + 1]);
        if (it != rank_of.end() && it->second < static_cast<int64_t>(r) &&
            (best < 0 || it->second < best)) {
          best = it->second;
          at = i;
        }
      }
      if (best < 0) break;
      parts[at] += parts[at + 1];
      parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(at) + 1);
    }
    if (parts.size() == 2) spec.merges.push_back(byte_chars(parts[0]) + " " + byte_chars(parts[1]));
  }
  return spec;
}

}  // namespace troupe::model::detail
