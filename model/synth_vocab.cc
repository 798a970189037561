// The built-in byte-level BPE vocabulary of `troupe synth` and the demo model (builtin_vocab in
// synth.h): merges learnt from a short original text, GPT-2 byte tokens, special tokens.
#include <algorithm>
#include <cctype>
#include <map>
#include <unordered_map>

#include "model/synth.h"

namespace troupe::model {

// ---------------------------------------------------------------------------------------------
// Built-in vocabulary.

namespace {

// Original text written for troupe (no third-party source); BPE merges are learnt from it.
constexpr const char* kVocabText =
    "Once upon a time there was a little town by the sea. The people of the town went out in "
    "their boats every morning, and they came back in the evening with fish for the market. "
    "A girl named Mia lived in a small house near the harbour with her mother and her old grey "
    "cat. Every day she walked along the water and looked at the ships. She wanted to see what "
    "was on the other side of the sea. One morning the wind was strong and the sky was dark. "
    "Her mother said that nobody should go out on the water that day. Mia stayed at home and "
    "read a book about the stars. In the book there were stories of sailors who found their way "
    "at night by looking at the sky. When the storm was over, the sun came out and the water was "
    "calm again. Mia ran down to the harbour, where an old man was fixing his nets. He told her "
    "that the sea is like a friend: it can be kind and it can be angry, but it is always there. "
    "He showed her how to tie a knot, how to read the wind, and how to find the north star. "
    "The next summer Mia learned to sail a small boat of her own. At first she stayed close to "
    "the shore, and then she went a little further every week. She saw birds that followed the "
    "fish, and she saw the light of the town from far away. In the evening she told her mother "
    "everything she had seen, and her mother listened with a smile. Years later, Mia became the "
    "best sailor in the town. Children came to her house to hear her stories, and she taught "
    "them what the old man had taught her. The town grew, new houses were built on the hill, "
    "and a school was opened near the market. The teachers wrote numbers on the board: one, "
    "two, three, ten, twenty, one hundred. The children counted the boats in the harbour and "
    "the days of the year. They learned that a week has seven days and a year has twelve months. "
    "In the spring the fields were green, in the summer the air was warm, in the autumn the "
    "leaves turned red and brown, and in the winter the snow covered the roofs. People worked "
    "hard, but they also made music and played games together. On the first day of every month "
    "there was a market with bread, cheese, apples, and fresh fish. Travellers came from other "
    "towns to sell cloth, tools, and books. They brought news about the world: a new road was "
    "being built through the mountains, a bridge had been finished over the river, and a "
    "library was open to anyone who wanted to learn. Mia often thought about how small things "
    "can change a life. A book about the stars, a kind word from an old man, a boat on a calm "
    "morning. She wrote these thoughts in a notebook, and one day she gave the notebook to a "
    "young boy who wanted to be a sailor too. The boy asked her: what is the most important "
    "thing to know about the sea? She thought for a long time, and then she said: be patient, "
    "watch the sky, listen to the wind, and always come home before dark. The boy smiled, put "
    "the notebook in his bag, and walked down to the water. \"I will remember,\" he said. "
    "It's a simple story, but it's true: we learn from each other, and we pass it on.\n";

// GPT-2's byte-to-unicode table, in its token order: printable bytes first, then the others
// mapped to U+0100 and up.
std::vector<std::pair<uint8_t, std::string>> gpt2_byte_tokens() {
  auto utf8 = [](uint32_t cp) {
    std::string s;
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else {  // all code points here are below U+0800
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    return s;
  };
  auto printable = [](int b) {
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  };
  std::vector<std::pair<uint8_t, std::string>> out;
  for (int b = 0; b < 256; ++b)
    if (printable(b)) out.emplace_back(static_cast<uint8_t>(b), utf8(static_cast<uint32_t>(b)));
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b)
    if (!printable(b)) out.emplace_back(static_cast<uint8_t>(b), utf8(next++));
  return out;
}

// Splits text roughly as GPT-2's pre-tokenizer does (contractions, " ?letters", " ?digits",
// " ?other"); whitespace runs are dropped since they never join words here.
std::vector<std::string> pretokenize(const std::string& text) {
  auto is_alpha = [](char c) { return std::isalpha(static_cast<unsigned char>(c)) != 0; };
  auto is_digit = [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; };
  auto is_space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  std::vector<std::string> words;
  size_t i = 0;
  while (i < text.size()) {
    if (text[i] == '\'' && i + 1 < text.size() && std::strchr("stmd", text[i + 1])) {
      words.push_back(text.substr(i, 2));
      i += 2;
      continue;
    }
    size_t j = i;
    if (text[j] == ' ' && j + 1 < text.size() && !is_space(text[j + 1])) ++j;
    if (j >= text.size() || is_space(text[j])) {
      i = j + 1;
      continue;
    }
    const char c = text[j];
    size_t k = j + 1;
    if (is_alpha(c)) {
      while (k < text.size() && is_alpha(text[k])) ++k;
    } else if (is_digit(c)) {
      while (k < text.size() && is_digit(text[k])) ++k;
    } else {
      while (k < text.size() && !is_alpha(text[k]) && !is_digit(text[k]) && !is_space(text[k]) &&
             text[k] != '\'')
        ++k;
    }
    words.push_back(text.substr(i, k - i));
    i = k;
  }
  return words;
}

}  // namespace

BuiltinVocab builtin_vocab(std::optional<int64_t> n_vocab,
                           const std::vector<std::string>& extra_control) {
  BuiltinVocab v;
  const auto bytes = gpt2_byte_tokens();
  std::string byte_str[256];
  for (const auto& [b, s] : bytes) {
    byte_str[b] = s;
    v.tokens.push_back(s);
    v.token_types.push_back(1);
  }
  std::unordered_map<std::string, int32_t> token_id;
  for (size_t i = 0; i < v.tokens.size(); ++i) token_id[v.tokens[i]] = static_cast<int32_t>(i);

  // Merges until the vocabulary (plus <|bos|> and <|eos|>) reaches the target; default 512.
  const int64_t target = n_vocab.value_or(512);
  std::map<std::string, int64_t> word_count;  // ordered: deterministic
  for (const std::string& w : pretokenize(kVocabText)) ++word_count[w];
  std::vector<std::pair<std::vector<int32_t>, int64_t>> words;
  for (const auto& [w, n] : word_count) {
    std::vector<int32_t> syms;
    for (unsigned char c : w) syms.push_back(token_id[byte_str[c]]);
    words.emplace_back(std::move(syms), n);
  }
  std::unordered_map<uint64_t, int64_t> pair_count;
  const auto specials = static_cast<int64_t>(2 + extra_control.size());
  while (static_cast<int64_t>(v.tokens.size()) + specials < target) {
    pair_count.clear();
    for (const auto& [syms, n] : words)
      for (size_t k = 0; k + 1 < syms.size(); ++k)
        pair_count[(static_cast<uint64_t>(syms[k]) << 32) | static_cast<uint32_t>(syms[k + 1])] +=
            n;
    if (pair_count.empty()) break;
    uint64_t best = 0;
    int64_t best_n = 0;
    for (const auto& [p, n] : pair_count)  // highest count; ties go to the smallest id pair
      if (n > best_n || (n == best_n && p < best)) best = p, best_n = n;
    const int32_t a = static_cast<int32_t>(best >> 32),
                  b = static_cast<int32_t>(best & 0xffffffffu);
    const std::string merged = v.tokens[static_cast<size_t>(a)] + v.tokens[static_cast<size_t>(b)];
    v.merges.push_back(v.tokens[static_cast<size_t>(a)] + " " + v.tokens[static_cast<size_t>(b)]);
    auto [it, fresh] = token_id.emplace(merged, static_cast<int32_t>(v.tokens.size()));
    if (fresh) {
      v.tokens.push_back(merged);
      v.token_types.push_back(1);
    }
    const int32_t m = it->second;
    for (auto& [syms, n] : words) {
      size_t out = 0;
      for (size_t k = 0; k < syms.size(); ++k) {
        if (k + 1 < syms.size() && syms[k] == a && syms[k + 1] == b) {
          syms[out++] = m;
          ++k;
        } else {
          syms[out++] = syms[k];
        }
      }
      syms.resize(out);
    }
  }
  v.bos_id = static_cast<int32_t>(v.tokens.size());
  v.tokens.push_back("<|bos|>");
  v.token_types.push_back(3);
  v.eos_id = static_cast<int32_t>(v.tokens.size());
  v.tokens.push_back("<|eos|>");
  v.token_types.push_back(3);
  for (const std::string& t : extra_control) {
    v.tokens.push_back(t);
    v.token_types.push_back(3);
  }
  for (int64_t k = 0; static_cast<int64_t>(v.tokens.size()) < target; ++k) {
    v.tokens.push_back("<|reserved_" + std::to_string(k) + "|>");
    v.token_types.push_back(3);
  }
  return v;
}

}  // namespace troupe::model
