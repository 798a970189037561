// Pre-tokenizer splitters for byte-level BPE: hand-written matchers that reproduce, piece for
// piece, the regex sets llama.cpp applies for each tokenizer.ggml.pre (its custom GPT-2/Llama-3
// splitters and its std::regex fallbacks, including their "collapsed" category semantics).
// Pure functions; any thread may call them.
#include <algorithm>
#include <utility>

#include "model/detail/tokenizer_vocab.h"
#include "model/detail/unicode.h"

namespace troupe::model::detail {

namespace {

struct Range {
  uint32_t lo, hi;
};

// Character classes spelled out literally in DeepSeek's regexes.
// "[A-Za-zµÀ-ÖØ-öø-ƺ...𞤀-𞥃]": the cased letters of an older Unicode.
constexpr Range kDeepseekLetters[] = {
    {0x41, 0x5A},       {0x61, 0x7A},       {0xB5, 0xB5},       {0xC0, 0xD6},
    {0xD8, 0xF6},       {0xF8, 0x1BA},      {0x1BC, 0x1BF},     {0x1C4, 0x293},
    {0x295, 0x2AF},     {0x370, 0x373},     {0x376, 0x377},     {0x37B, 0x37D},
    {0x37F, 0x37F},     {0x386, 0x386},     {0x388, 0x38A},     {0x38C, 0x38C},
    {0x38E, 0x3A1},     {0x3A3, 0x3F5},     {0x3F7, 0x481},     {0x48A, 0x52F},
    {0x531, 0x556},     {0x10A0, 0x10C5},   {0x13A0, 0x13F5},   {0x13F8, 0x13FD},
    {0x1C90, 0x1CBA},   {0x1CBD, 0x1CBF},   {0x1D00, 0x1D2B},   {0x1D6B, 0x1D77},
    {0x1D79, 0x1D9A},   {0x1E00, 0x1F15},   {0x1F18, 0x1F1D},   {0x1F20, 0x1F45},
    {0x1F48, 0x1F4D},   {0x1F50, 0x1F57},   {0x1F59, 0x1F59},   {0x1F5B, 0x1F5B},
    {0x1F5D, 0x1F5D},   {0x1F5F, 0x1F7D},   {0x1F80, 0x1FB4},   {0x1FB6, 0x1FBC},
    {0x1FBE, 0x1FBE},   {0x1FC2, 0x1FC4},   {0x1FC6, 0x1FCC},   {0x1FD0, 0x1FD3},
    {0x1FD6, 0x1FDB},   {0x1FE0, 0x1FEC},   {0x1FF2, 0x1FF4},   {0x1FF6, 0x1FFC},
    {0x2102, 0x2102},   {0x2107, 0x2107},   {0x210A, 0x2113},   {0x2115, 0x2115},
    {0x2119, 0x211D},   {0x2124, 0x2124},   {0x2126, 0x2126},   {0x2128, 0x2128},
    {0x212A, 0x212D},   {0x212F, 0x2134},   {0x2139, 0x2139},   {0x213C, 0x213F},
    {0x2145, 0x2149},   {0x214E, 0x214E},   {0x2183, 0x2184},   {0x2C00, 0x2C7B},
    {0x2C7E, 0x2CE4},   {0x2CEB, 0x2CEE},   {0x2CF2, 0x2CF3},   {0xA640, 0xA66D},
    {0xA680, 0xA69B},   {0xA722, 0xA76F},   {0xA771, 0xA787},   {0xA78B, 0xA78E},
    {0xAB70, 0xABBF},   {0xFB00, 0xFB06},   {0xFB13, 0xFB17},   {0xFF21, 0xFF3A},
    {0xFF41, 0xFF5A},   {0x10400, 0x1044F}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB},
    {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF}, {0x1E900, 0x1E943},
};
// "[!-/:-~！-／：-～‘-‟　-。]"
constexpr Range kDeepseekPunct[] = {{0x21, 0x2F},     {0x3A, 0x7E},     {0xFF01, 0xFF0F},
                                    {0xFF1A, 0xFF5E}, {0x2018, 0x201F}, {0x3000, 0x3002}};
// "[一-龥ࠀ-一가-퟿]"
constexpr Range kDeepseekCjk[] = {{0x4E00, 0x9FA5}, {0x800, 0x4E00}, {0xAC00, 0xD7FF}};
// "[一-龥぀-ゟ゠-ヿ]"
constexpr Range kDeepseekV3Cjk[] = {{0x4E00, 0x9FA5}, {0x3040, 0x309F}, {0x30A0, 0x30FF}};

template <size_t N>
bool in_ranges(const Range (&ranges)[N], uint32_t cp) {
  for (const Range& r : ranges) {
    if (cp >= r.lo && cp <= r.hi) return true;
  }
  return false;
}

/// One fragment's codepoints as a regex sees them: positions past `end` do not exist.
struct Span {
  const uint32_t* cps;
  size_t end;
  uint32_t at(size_t i) const { return cps[i]; }
  uint16_t flags(size_t i) const { return i < end ? cp_flags(cps[i]) : 0; }
  bool ws(size_t i) const { return (flags(i) & kCpWhitespace) != 0; }
  bool letter(size_t i) const { return (flags(i) & kCpLetter) != 0; }
  bool number(size_t i) const { return (flags(i) & kCpNumber) != 0; }
  bool newline(size_t i) const { return i < end && (cps[i] == '\r' || cps[i] == '\n'); }
  // [^\s\p{L}\p{N}]
  bool other(size_t i) const {
    uint16_t f = flags(i);
    return f != 0 && (f & (kCpWhitespace | kCpLetter | kCpNumber)) == 0;
  }
  template <class Pred>
  size_t run(size_t i, Pred pred) const {
    size_t j = i;
    while (j < end && pred(j)) ++j;
    return j - i;
  }
};

// llama.cpp evaluates some regexes on a "collapsed" text in which ASCII keeps its own class lists;
// these differ from Unicode only in that '~' is neither \p{P} nor \p{S}.
bool collapsed_punct(const Span& s, size_t i) {
  if (i >= s.end) return false;
  uint32_t c = s.at(i);
  if (c < 128) return (s.flags(i) & kCpPunctuation) != 0;
  return (s.flags(i) & (kCpPunctuation | kCpWhitespace)) == kCpPunctuation;
}
bool collapsed_symbol(const Span& s, size_t i) {
  if (i >= s.end) return false;
  uint32_t c = s.at(i);
  if (c < 128) return c != '~' && (s.flags(i) & kCpSymbol) != 0;
  return (s.flags(i) & (kCpSymbol | kCpWhitespace)) == kCpSymbol;
}
bool is_ascii_alpha(uint32_t c) { return (c | 0x20) >= 'a' && (c | 0x20) <= 'z'; }

// 's|'t|'re|'ve|'m|'ll|'d, optionally case-insensitive; returns the length or 0.
size_t match_contraction(const Span& s, size_t p, bool any_case) {
  if (s.at(p) != '\'' || p + 1 >= s.end) return 0;
  auto lower = [&](size_t i) -> uint32_t {
    uint32_t c = s.at(i);
    return any_case && c >= 'A' && c <= 'Z' ? c + 32 : c;
  };
  uint32_t c1 = lower(p + 1);
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
  if (p + 2 >= s.end) return 0;
  uint32_t c2 = lower(p + 2);
  if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
  return 0;
}

// \s*[\r\n]+|\s+(?!\S)|\s+ (with_newline_rule) or \s+(?!\S)|\s+ at p.
size_t match_whitespace(const Span& s, size_t p, bool with_newline_rule) {
  size_t k = s.run(p, [&](size_t i) { return s.ws(i); });
  if (k == 0) return 0;
  if (with_newline_rule) {
    for (size_t j = p + k; j > p; --j) {
      if (s.newline(j - 1)) return j - p;
    }
  }
  if (p + k < s.end && k > 1) return k - 1;  // leave the last space to the next word
  return k;
}

// The alternatives Llama-3, Qwen2, Kimi-K2 and o200k end with:
// \p{N}{1,max_digits}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ at p
// (o200k, `slash`: [\r\n/]* after the punctuation).
size_t match_numbers_punct_space(const Span& s, size_t p, size_t max_digits, bool slash = false) {
  if (s.number(p)) return std::min(max_digits, s.run(p, [&](size_t i) { return s.number(i); }));
  const size_t q = s.at(p) == ' ' ? p + 1 : p;
  if (s.other(q)) {
    size_t j = q + s.run(q, [&](size_t i) { return s.other(i); });
    j += s.run(j, [&](size_t i) { return s.newline(i) || (slash && s.at(i) == '/'); });
    return j - p;
  }
  return match_whitespace(s, p, true);
}

// GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
size_t match_gpt2(const Span& s, size_t p) {
  if (size_t n = match_contraction(s, p, false)) return n;
  const size_t q = s.at(p) == ' ' ? p + 1 : p;
  if (s.letter(q)) return q - p + s.run(q, [&](size_t i) { return s.letter(i); });
  if (s.number(q)) return q - p + s.run(q, [&](size_t i) { return s.number(i); });
  if (s.other(q)) return q - p + s.run(q, [&](size_t i) { return s.other(i); });
  return match_whitespace(s, p, false);
}

// Llama-3 (max_digits 3) and Qwen2 (max_digits 1):
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,N}| ?[^\s\p{L}\p{N}]+[\r\n]*|
// \s*[\r\n]+|\s+(?!\S)|\s+
size_t match_llama3(const Span& s, size_t p, size_t max_digits) {
  if (size_t n = match_contraction(s, p, true)) return n;
  if (s.letter(p)) return s.run(p, [&](size_t i) { return s.letter(i); });
  if (!s.newline(p) && !s.number(p) && s.letter(p + 1)) {
    return 1 + s.run(p + 1, [&](size_t i) { return s.letter(i); });
  }
  return match_numbers_punct_space(s, p, max_digits);
}

// Qwen3.5:
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|
// ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*| \s*[\r\n]+|\s+(?!\S)|\s+ Qwen2's with marks joining the letters of
// a word and leaving the punctuation runs. (A mark at p is the optional prefix as well as the run's
// first character: the same match either way.)
size_t match_qwen35(const Span& s, size_t p) {
  if (size_t n = match_contraction(s, p, true)) return n;
  auto word = [&](size_t i) {
    const uint16_t f = s.flags(i);
    return (f & (kCpLetter | kCpMark)) != 0 && (f & kCpWhitespace) == 0;
  };
  if (word(p)) return s.run(p, word);
  if (!s.newline(p) && !s.number(p) && word(p + 1)) return 1 + s.run(p + 1, word);
  if (s.number(p)) return 1;
  const size_t q = s.at(p) == ' ' ? p + 1 : p;
  auto other = [&](size_t i) {
    const uint16_t f = s.flags(i);
    return f != 0 && (f & (kCpWhitespace | kCpLetter | kCpMark | kCpNumber)) == 0;
  };
  if (other(q)) {
    size_t j = q + s.run(q, other);
    j += s.run(j, [&](size_t i) { return s.newline(i); });
    return j - p;
  }
  return match_whitespace(s, p, true);
}

// DeepSeek-V3's third regex:
// [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|
//  ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
size_t match_deepseek_v3(const Span& s, size_t p) {
  const uint32_t c = s.at(p);
  const bool ascii_punct = c >= 0x21 && c <= 0x7E && !is_ascii_alpha(c) && !(c >= '0' && c <= '9');
  if (ascii_punct && p + 1 < s.end && is_ascii_alpha(s.at(p + 1))) {
    return 1 + s.run(p + 1, [&](size_t i) { return is_ascii_alpha(s.at(i)); });
  }
  auto letter_or_mark = [&](size_t i) {
    return i < s.end && (s.flags(i) & (kCpLetter | kCpMark)) != 0 &&
           (s.flags(i) & kCpWhitespace) == 0;
  };
  auto punct_or_symbol = [&](size_t i) { return collapsed_punct(s, i) || collapsed_symbol(s, i); };
  const bool prefix_ok =
      !s.newline(p) && !s.letter(p) && !collapsed_punct(s, p) && !collapsed_symbol(s, p);
  if (prefix_ok && letter_or_mark(p + 1)) return 1 + s.run(p + 1, letter_or_mark);
  if (letter_or_mark(p)) return s.run(p, letter_or_mark);
  const size_t q = c == ' ' ? p + 1 : p;
  if (punct_or_symbol(q)) {
    size_t j = q + s.run(q, punct_or_symbol);
    j += s.run(j, [&](size_t i) { return s.newline(i); });
    return j - p;
  }
  return match_whitespace(s, p, true);
}

// Kimi-K2: Moonshot's pattern (tokenization_kimi.py of the released model) --
//   [\p{Han}]+
//   |[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+C?
//   |[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*C?
//   |\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// with C = (?i:'s|'t|'re|'ve|'m|'ll|'d): words split where case turns ("getUserName" -> get,
// User, Name) and Han runs apart from other letters. (llama.cpp's kimi-k2 splitter takes any
// run of non-Han letters as one word; this follows the model's own tokenizer.)
// tiktoken's o200k (gpt-oss, GPT-4o), `kimi` false, is the same without the Han rules and with
// [\r\n/]* after a punctuation run. Mistral's Tekken, `tekken` (and `kimi` false), is o200k
// without the contractions (C) and with one digit a number (\p{N}):
//   [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+
//   |[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*
//   |\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
// (llama.cpp's tekken approximates the case classes by [^a-z] and [^A-Z] among letters, which
// splits words of non-ASCII capitals differently; this follows the model's own tokenizer.)
size_t match_cased_words(const Span& s, size_t p, bool kimi, bool tekken = false) {
  const uint16_t han_bit = kimi ? kCpHan : 0;
  auto han = [&](size_t i) { return (s.flags(i) & han_bit) != 0; };
  if (han(p)) return s.run(p, han);
  // U = Lu Lt Lm Lo M and L = Ll Lm Lo M (for Kimi-K2 both without Han).
  auto in_u = [&](size_t i) {
    const uint16_t f = s.flags(i);
    return (f & han_bit) == 0 &&
           ((f & kCpMark) != 0 || ((f & kCpLetter) != 0 && (f & kCpLower) == 0));
  };
  auto in_l = [&](size_t i) {
    const uint16_t f = s.flags(i);
    return (f & han_bit) == 0 &&
           ((f & kCpMark) != 0 || ((f & kCpLetter) != 0 && (f & kCpUpper) == 0));
  };
  // U*L+C? (greedy U*, giving back characters until L+ can start) or U+L*C?: the end of the
  // match at q, or 0.
  auto contraction = [&](size_t end) {
    return end < s.end && !tekken ? end + match_contraction(s, end, true) : end;
  };
  auto lower_word = [&](size_t q) -> size_t {
    for (size_t k = s.run(q, in_u) + 1; k-- > 0;) {
      if (in_l(q + k)) return contraction(q + k + s.run(q + k, in_l));
    }
    return 0;
  };
  auto upper_word = [&](size_t q) -> size_t {
    const size_t a = s.run(q, in_u);
    return a == 0 ? 0 : contraction(q + a + s.run(q + a, in_l));
  };
  // Each alternative first with the optional prefix character, then without, in order.
  const bool prefix = p < s.end && !s.newline(p) && !s.letter(p) && !s.number(p);
  if (prefix) {
    if (size_t e = lower_word(p + 1)) return e - p;
  }
  if (size_t e = lower_word(p)) return e - p;
  if (prefix) {
    if (size_t e = upper_word(p + 1)) return e - p;
  }
  if (size_t e = upper_word(p)) return e - p;
  return match_numbers_punct_space(s, p, tekken ? 1 : 3, !kimi);
}

/// One regex of a set: returns the length of the match starting at p, or 0.
using Matcher = size_t (*)(const Span& s, size_t p);

/// Applies one regex to every current piece like llama.cpp's std::regex_iterator loop: each match
/// becomes a piece, and so does each non-empty stretch between matches.
void split_stage(const std::vector<uint32_t>& cps, Matcher match, std::vector<size_t>* pieces) {
  std::vector<size_t> out;
  out.reserve(pieces->size() * 2);
  size_t start = 0;
  for (size_t len : *pieces) {
    const Span s{cps.data(), start + len};
    size_t gap = start;
    size_t p = start;
    while (p < s.end) {
      size_t n = match(s, p);
      if (n == 0) {
        ++p;
        continue;
      }
      if (p > gap) out.push_back(p - gap);
      out.push_back(n);
      p += n;
      gap = p;
    }
    if (s.end > gap) out.push_back(s.end - gap);
    start += len;
  }
  *pieces = std::move(out);
}

// \s+$ matches at most once per piece: the trailing whitespace run (handled apart so that long
// inner runs of spaces cost linear time).
void split_trailing_whitespace(const std::vector<uint32_t>& cps, std::vector<size_t>* pieces) {
  std::vector<size_t> out;
  out.reserve(pieces->size() * 2);
  size_t start = 0;
  for (size_t len : *pieces) {
    size_t t = start + len;
    while (t > start && (cp_flags(cps[t - 1]) & kCpWhitespace)) --t;
    if (t > start) out.push_back(t - start);
    if (t < start + len) out.push_back(start + len - t);
    start += len;
  }
  *pieces = std::move(out);
}

size_t m_gpt2(const Span& s, size_t p) { return match_gpt2(s, p); }
size_t m_llama3(const Span& s, size_t p) { return match_llama3(s, p, 3); }
size_t m_qwen2(const Span& s, size_t p) { return match_llama3(s, p, 1); }
size_t m_qwen35(const Span& s, size_t p) { return match_qwen35(s, p); }
size_t m_deepseek_v3(const Span& s, size_t p) { return match_deepseek_v3(s, p); }
size_t m_kimi_k2(const Span& s, size_t p) { return match_cased_words(s, p, true); }
size_t m_gpt4o(const Span& s, size_t p) { return match_cased_words(s, p, false); }
size_t m_tekken(const Span& s, size_t p) { return match_cased_words(s, p, false, true); }
size_t m_newline(const Span& s, size_t p) { return s.newline(p) ? 1 : 0; }
size_t m_number_run(const Span& s, size_t p) {
  return s.run(p, [&](size_t i) { return s.number(i); });
}
size_t m_number_upto3(const Span& s, size_t p) { return std::min<size_t>(3, m_number_run(s, p)); }
// Regexes without \p{..} run on std::wregex in llama.cpp, over text in which every non-ASCII
// whitespace character was replaced by U+000B; so no literal class ever matches those characters.
template <const auto& kClass>
bool in_wide_class(const Span& s, size_t i) {
  uint32_t c = s.at(i);
  return in_ranges(kClass, c) && !(c > 0x7F && (s.flags(i) & kCpWhitespace));
}
template <const auto& kClass>
size_t m_class_run(const Span& s, size_t p) {
  return s.run(p, [&](size_t i) { return in_wide_class<kClass>(s, i); });
}
// \s?[class]+
template <const auto& kClass>
size_t m_space_class_run(const Span& s, size_t p) {
  if (s.ws(p) && p + 1 < s.end && in_wide_class<kClass>(s, p + 1)) {
    return 1 + m_class_run<kClass>(s, p + 1);
  }
  return m_class_run<kClass>(s, p);
}
// [\p{P}\$\+<=>\^~\|]+
size_t m_default_punct(const Span& s, size_t p) {
  return s.run(p, [&](size_t i) {
    uint32_t c = s.at(i);
    return collapsed_punct(s, i) || c == '$' || c == '+' || c == '<' || c == '=' || c == '>' ||
           c == '^' || c == '~' || c == '|';
  });
}
// [0-9][0-9][0-9]
size_t m_three_digits(const Span& s, size_t p) {
  auto digit = [&](size_t i) { return i < s.end && s.at(i) >= '0' && s.at(i) <= '9'; };
  return digit(p) && digit(p + 1) && digit(p + 2) ? 3 : 0;
}

}  // namespace

std::optional<PreTokenizerInfo> pre_tokenizer_info(std::string_view name) {
  struct Entry {
    std::string_view name;
    PreTokenizerInfo info;
  };
  using P = PreTokenizer;
  // The names llama.cpp maps to these regex sets, with the flags it sets for each.
  static constexpr Entry kEntries[] = {
      {"", {P::kDefault, true, false, false}},
      {"default", {P::kDefault, true, false, false}},
      {"gpt-2", {P::kGpt2, true, false, false}},
      {"phi-2", {P::kGpt2, true, false, false}},
      {"jina-es", {P::kGpt2, true, false, false}},
      {"jina-de", {P::kGpt2, true, false, false}},
      {"gigachat", {P::kGpt2, true, false, false}},
      {"jina-v2-es", {P::kGpt2, true, false, false}},
      {"jina-v2-de", {P::kGpt2, true, false, false}},
      {"a.x-4.0", {P::kGpt2, true, false, false}},
      {"mellum", {P::kGpt2, true, false, false}},
      {"modern-bert", {P::kGpt2, true, false, false}},
      {"exaone4", {P::kGpt2, true, false, false}},
      {"mpt", {P::kGpt2, true, false, false}},
      {"olmo", {P::kGpt2, true, false, false}},
      {"jais", {P::kGpt2, true, false, false}},
      {"trillion", {P::kGpt2, false, false, false}},
      {"granite-docling", {P::kGpt2, false, false, false}},
      {"llama3", {P::kLlama3, true, true, true}},
      {"llama-v3", {P::kLlama3, true, true, true}},
      {"llama-bpe", {P::kLlama3, true, true, true}},
      {"falcon3", {P::kLlama3, true, true, true}},
      {"falcon-h1", {P::kLlama3, true, true, true}},
      {"pixtral", {P::kLlama3, true, true, true}},
      {"midm-2.0", {P::kLlama3, true, true, true}},
      {"lfm2", {P::kLlama3, true, true, true}},
      {"dbrx", {P::kLlama3, true, false, false}},
      {"smaug-bpe", {P::kLlama3, true, false, false}},
      {"qwen2", {P::kQwen2, false, false, false}},
      {"deepseek-r1-qwen", {P::kQwen2, false, false, false}},
      {"hunyuan", {P::kQwen2, false, false, false}},
      {"megrez", {P::kQwen2, true, false, false}},
      {"stablelm2", {P::kQwen2, true, false, false}},
      {"qwen35", {P::kQwen35, false, false, false}},
      {"deepseek-llm", {P::kDeepseekLlm, false, false, false}},
      {"deepseek-v3", {P::kDeepseekV3, false, false, false}},
      {"hunyuan-dense", {P::kDeepseekV3, false, false, false}},
      // A tiktoken vocabulary: a word that is itself a token is that token (as tiktoken does;
      // llama.cpp does not set this for kimi-k2).
      {"kimi-k2", {P::kKimiK2, false, true, false}},
      {"gpt-4o", {P::kGpt4o, false, false, false}},
      {"llama4", {P::kGpt4o, false, false, false}},
      {"tekken", {P::kTekken, false, true, true}},
  };
  for (const Entry& e : kEntries) {
    if (e.name == name) return e.info;
  }
  return std::nullopt;
}

void pre_split(PreTokenizer pre, const std::vector<uint32_t>& cps, std::vector<size_t>* lengths) {
  if (cps.empty()) return;
  std::vector<size_t> pieces{cps.size()};
  switch (pre) {
    case PreTokenizer::kGpt2:
      split_stage(cps, m_gpt2, &pieces);
      break;
    case PreTokenizer::kLlama3:
      split_stage(cps, m_llama3, &pieces);
      break;
    case PreTokenizer::kQwen2:
      split_stage(cps, m_qwen2, &pieces);
      break;
    case PreTokenizer::kQwen35:
      split_stage(cps, m_qwen35, &pieces);
      break;
    case PreTokenizer::kDeepseekLlm:
      split_stage(cps, m_newline, &pieces);
      split_stage(cps, m_space_class_run<kDeepseekLetters>, &pieces);
      split_stage(cps, m_space_class_run<kDeepseekPunct>, &pieces);
      split_trailing_whitespace(cps, &pieces);
      split_stage(cps, m_class_run<kDeepseekCjk>, &pieces);
      split_stage(cps, m_number_run, &pieces);
      break;
    case PreTokenizer::kDeepseekV3:
      split_stage(cps, m_number_upto3, &pieces);
      split_stage(cps, m_class_run<kDeepseekV3Cjk>, &pieces);
      split_stage(cps, m_deepseek_v3, &pieces);
      break;
    case PreTokenizer::kKimiK2:
      split_stage(cps, m_kimi_k2, &pieces);
      break;
    case PreTokenizer::kGpt4o:
      split_stage(cps, m_gpt4o, &pieces);
      break;
    case PreTokenizer::kTekken:
      split_stage(cps, m_tekken, &pieces);
      break;
    case PreTokenizer::kDefault:
      split_stage(cps, m_default_punct, &pieces);
      split_stage(cps, m_gpt2, &pieces);
      split_stage(cps, m_number_run, &pieces);
      split_stage(cps, m_three_digits, &pieces);
      break;
  }
  lengths->insert(lengths->end(), pieces.begin(), pieces.end());
}

}  // namespace troupe::model::detail
