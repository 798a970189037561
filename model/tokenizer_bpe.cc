// Byte-level BPE (GGUF "gpt2" vocabularies), as llama.cpp's llm_tokenizer_bpe_session: pre-split
// the text into words, map each word's bytes to GPT-2 characters, apply ranked merges (lowest rank
// first, leftmost on ties) with a priority queue, and emit the resulting tokens.
// Pure function of an immutable Vocab; any thread may call it.
#include <queue>
#include <vector>

#include "model/detail/tokenizer_vocab.h"
#include "model/detail/unicode.h"

namespace troupe::model::detail {

namespace {

struct Symbol {
  int32_t prev;
  int32_t next;
  int32_t sym;      // token id, n_vocab + i for a non-token merge result, -1 for none
  uint32_t offset;  // into the word's bytes
  uint32_t size;    // 0 once merged into its left neighbour
};

struct Bigram {
  int32_t rank;
  int32_t left;
  int32_t right;
  int32_t left_sym;
  int32_t right_sym;
  int32_t result;
};

// Lowest rank first; among equal ranks the leftmost pair.
struct BigramOrder {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  }
};

class BpeWordMerger {
 public:
  explicit BpeWordMerger(const Vocab& vocab) : vocab_(vocab) {}

  // Tokenizes one pre-split word given as raw UTF-8 bytes.
  void run(std::string_view word, std::vector<int32_t>* out) {
    if (vocab_.ignore_merges) {
      encoded_.clear();
      for (char c : word) encoded_ += gpt2_byte_to_utf8(static_cast<uint8_t>(c));
      int32_t id = vocab_.find(encoded_);
      if (id >= 0) {
        out->push_back(id);
        return;
      }
    }
    symbols_.clear();
    queue_ = {};
    const int32_t n = static_cast<int32_t>(word.size());
    for (int32_t i = 0; i < n; ++i) {
      symbols_.push_back({i - 1, i + 1 == n ? -1 : i + 1,
                          vocab_.byte_symbol[static_cast<uint8_t>(word[i])],
                          static_cast<uint32_t>(i), 1});
    }
    for (int32_t i = 1; i < n; ++i) try_add(i - 1, i);

    while (!queue_.empty()) {
      Bigram b = queue_.top();
      queue_.pop();
      Symbol& left = symbols_[b.left];
      Symbol& right = symbols_[b.right];
      if (left.size == 0 || right.size == 0) continue;
      if (left.sym != b.left_sym || right.sym != b.right_sym) continue;  // stale
      left.sym = b.result;
      left.size += right.size;
      right.size = 0;
      left.next = right.next;
      if (right.next >= 0) symbols_[right.next].prev = b.left;
      try_add(left.prev, b.left);
      try_add(b.left, left.next);
    }

    for (int32_t i = 0; i != -1 && n > 0; i = symbols_[i].next) emit(word, symbols_[i], out);
  }

 private:
  void try_add(int32_t left, int32_t right) {
    if (left == -1 || right == -1) return;
    const int32_t ls = symbols_[left].sym;
    const int32_t rs = symbols_[right].sym;
    if (ls < 0 || rs < 0) return;
    auto it = vocab_.merges.find((static_cast<uint64_t>(ls) << 32) | static_cast<uint32_t>(rs));
    if (it == vocab_.merges.end()) return;
    queue_.push({it->second.rank, left, right, ls, rs, it->second.result});
  }

  void emit(std::string_view word, const Symbol& s, std::vector<int32_t>* out) {
    if (s.sym >= 0 && s.sym < vocab_.n_vocab()) {
      out->push_back(s.sym);
      return;
    }
    // Not a token: llama.cpp looks each byte of the GPT-2-encoded text up as a one-byte token.
    encoded_.clear();
    for (char c : word.substr(s.offset, s.size)) {
      encoded_ += gpt2_byte_to_utf8(static_cast<uint8_t>(c));
    }
    for (char c : encoded_) {
      int32_t id = vocab_.raw_byte_token[static_cast<uint8_t>(c)];
      if (id >= 0) out->push_back(id);
    }
  }

  const Vocab& vocab_;
  std::vector<Symbol> symbols_;
  std::priority_queue<Bigram, std::vector<Bigram>, BigramOrder> queue_;
  std::string encoded_;
};

}  // namespace

void bpe_tokenize(const Vocab& vocab, std::string_view text, std::vector<int32_t>* out) {
  const std::vector<uint32_t> cps = utf8_to_codepoints(text);
  std::vector<size_t> lengths;
  pre_split(vocab.pre, cps, &lengths);
  BpeWordMerger merger(vocab);
  std::string word;
  size_t start = 0;
  for (size_t len : lengths) {
    word.clear();
    for (size_t i = start; i < start + len; ++i) append_utf8(&word, cps[i]);
    start += len;
    merger.run(word, out);
  }
}

std::string gpt2_decode_text(std::string_view text) {
  std::string out;
  size_t pos = 0;
  while (pos < text.size()) {
    const uint32_t cp = utf8_next(text, &pos);
    const int byte = gpt2_codepoint_to_byte(cp);
    if (byte >= 0) {
      out.push_back(static_cast<char>(byte));
      continue;
    }
    // As llama.cpp: an unmappable character is spelled out with the whole token text.
    std::string utf8;
    append_utf8(&utf8, cp);
    out += "[UNK_BYTE_0x";
    static constexpr char kHex[] = "0123456789abcdef";
    for (char c : utf8) {
      out.push_back(kHex[static_cast<uint8_t>(c) >> 4]);
      out.push_back(kHex[static_cast<uint8_t>(c) & 15]);
    }
    out.append(text.data(), text.size());
    out += "]";
  }
  return out;
}

}  // namespace troupe::model::detail
