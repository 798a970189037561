// SentencePiece-style BPE over a scored vocabulary (GGUF "llama" vocabularies), as llama.cpp's
// llm_tokenizer_spm_session: start from UTF-8 characters, repeatedly merge the adjacent pair whose
// concatenation is the highest-scoring token, then emit tokens, or byte tokens for leftovers.
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
  uint32_t offset;  // into the escaped text
  uint32_t size;    // bytes; 0 once merged into its left neighbour
};

struct Bigram {
  float score;
  int32_t left;
  int32_t right;
  uint32_t size;  // bytes of the pair when queued; a mismatch later means it is stale
};

// Highest score first; among equal scores the leftmost pair.
struct BigramOrder {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

class SpmSession {
 public:
  SpmSession(const Vocab& vocab, std::string_view text) : vocab_(vocab), text_(text) {}

  void run(std::vector<int32_t>* out) {
    for (size_t off = 0; off < text_.size();) {
      size_t n = std::min(utf8_len_from_lead(static_cast<uint8_t>(text_[off])), text_.size() - off);
      int32_t idx = static_cast<int32_t>(symbols_.size());
      symbols_.push_back({idx - 1, off + n == text_.size() ? -1 : idx + 1,
                          static_cast<uint32_t>(off), static_cast<uint32_t>(n)});
      off += n;
    }
    for (int32_t i = 1; i < static_cast<int32_t>(symbols_.size()); ++i) try_add(i - 1, i);

    while (!queue_.empty()) {
      Bigram b = queue_.top();
      queue_.pop();
      Symbol& left = symbols_[b.left];
      Symbol& right = symbols_[b.right];
      if (left.size == 0 || right.size == 0 || left.size + right.size != b.size) continue;
      left.size += right.size;
      right.size = 0;
      left.next = right.next;
      if (right.next >= 0) symbols_[right.next].prev = b.left;
      try_add(left.prev, b.left);
      try_add(b.left, left.next);
    }

    if (symbols_.empty()) return;
    for (int32_t i = 0; i != -1; i = symbols_[i].next) emit(symbols_[i], out);
  }

 private:
  std::string_view text_of(int32_t left, uint32_t size) const {
    return text_.substr(symbols_[left].offset, size);
  }

  void try_add(int32_t left, int32_t right) {
    if (left == -1 || right == -1) return;
    const uint32_t size = symbols_[left].size + symbols_[right].size;
    const int32_t id = vocab_.find(text_of(left, size));
    if (id < 0) return;
    queue_.push({vocab_.score[id], left, right, size});
  }

  // A final symbol is a token, or else (an unknown character) falls back to its bytes.
  void emit(const Symbol& s, std::vector<int32_t>* out) const {
    std::string_view piece = text_.substr(s.offset, s.size);
    const int32_t id = vocab_.find(piece);
    if (id >= 0) {
      out->push_back(id);
      return;
    }
    for (char c : piece) {
      // A byte with neither a <0xXX> nor a one-byte token becomes <unk> (llama.cpp would throw).
      int32_t byte_id = vocab_.byte_token[static_cast<uint8_t>(c)];
      if (byte_id < 0) byte_id = vocab_.unk;
      if (byte_id >= 0) out->push_back(byte_id);
    }
  }

  const Vocab& vocab_;
  std::string_view text_;
  std::vector<Symbol> symbols_;
  std::priority_queue<Bigram, std::vector<Bigram>, BigramOrder> queue_;
};

}  // namespace

void spm_tokenize(const Vocab& vocab, std::string_view text, std::vector<int32_t>* out) {
  SpmSession(vocab, text).run(out);
}

}  // namespace troupe::model::detail
