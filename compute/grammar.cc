// GBNF compiler (text -> rules of byte sets) and the matcher's parse-stack walk.
#include "compute/grammar.h"

#include <algorithm>
#include <cstring>
#include <unordered_map>
#include <utility>

#include "base/check.h"
#include "model/detail/unicode.h"
#include "model/tokenizer.h"

namespace troupe::compute {

namespace {

Error grammar_error(int line, const std::string& what) {
  return make_error(0, strfmt("grammar line %d: %s", line, what.c_str()));
}

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-';
}

// A code point range [lo, hi] of one UTF-8 length as byte ranges, one per byte of the encoding:
// each range of the input splits until every byte position varies independently.
struct ByteRange {
  uint8_t lo, hi;
};
using ByteSeq = std::vector<ByteRange>;

int utf8_length(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

std::string encode(uint32_t cp) {
  std::string s;
  model::detail::append_utf8(&s, cp);
  return s;
}

void split_same_length(uint32_t lo, uint32_t hi, std::vector<ByteSeq>& out) {
  const int n = utf8_length(lo);
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (uint32_t{1} << (6 * i)) - 1;  // the low 6i bits: the last i bytes
    if ((lo & ~m) == (hi & ~m)) continue;
    if ((lo & m) != 0) {  // lo does not start a whole block of the last i bytes
      split_same_length(lo, lo | m, out);
      split_same_length((lo | m) + 1, hi, out);
      return;
    }
    if ((hi & m) != m) {  // hi does not end one
      split_same_length(lo, (hi & ~m) - 1, out);
      split_same_length(hi & ~m, hi, out);
      return;
    }
  }
  const std::string a = encode(lo), b = encode(hi);
  ByteSeq seq;
  for (size_t k = 0; k < a.size(); ++k) seq.push_back({uint8_t(a[k]), uint8_t(b[k])});
  out.push_back(std::move(seq));
}

// Code point ranges (sorted, disjoint, no surrogates) as UTF-8 byte sequences.
std::vector<ByteSeq> utf8_sequences(const std::vector<std::pair<uint32_t, uint32_t>>& ranges) {
  static const uint32_t kEnds[] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
  std::vector<ByteSeq> out;
  for (auto [lo, hi] : ranges) {
    uint32_t start = 0;
    for (uint32_t end : kEnds) {
      const uint32_t a = std::max(lo, start), b = std::min(hi, end);
      if (a <= b) split_same_length(a, b, out);
      start = end + 1;
    }
  }
  return out;
}

// Sorts and merges ranges; complements them (within the scalar values) when negated; removes the
// surrogates either way.
std::vector<std::pair<uint32_t, uint32_t>> normalize_class(
    std::vector<std::pair<uint32_t, uint32_t>> r, bool negated) {
  std::sort(r.begin(), r.end());
  std::vector<std::pair<uint32_t, uint32_t>> merged;
  for (auto p : r) {
    if (!merged.empty() && p.first <= merged.back().second + 1)
      merged.back().second = std::max(merged.back().second, p.second);
    else
      merged.push_back(p);
  }
  if (negated) {
    std::vector<std::pair<uint32_t, uint32_t>> c;
    uint32_t next = 0;
    for (auto p : merged) {
      if (p.first > next) c.push_back({next, p.first - 1});
      next = p.second + 1;
    }
    if (next <= 0x10FFFF) c.push_back({next, 0x10FFFF});
    merged = std::move(c);
  }
  std::vector<std::pair<uint32_t, uint32_t>> out;
  for (auto p : merged) {
    if (p.second < 0xD800 || p.first > 0xDFFF) {
      out.push_back(p);
      continue;
    }
    if (p.first < 0xD800) out.push_back({p.first, 0xD7FF});
    if (p.second > 0xDFFF) out.push_back({0xE000, p.second});
  }
  return out;
}

}  // namespace

// Parses GBNF into rules whose alternatives are runs of Elems (kEnd added when flattened).
class GrammarBuilder {
 public:
  GrammarBuilder(std::string_view src, GrammarLimits lim) : s_(src), lim_(lim) {}

  Result<std::shared_ptr<const Grammar>> build() {
    if (s_.size() > lim_.max_source_bytes) {
      return make_error(0, strfmt("grammar: %zu bytes, more than the limit of %zu", s_.size(),
                                  lim_.max_source_bytes));
    }
    if (auto st = parse(); !st) return st.error();
    for (size_t r = 0; r < names_.size(); ++r) {
      if (!defined_[r] && !names_[r].empty())
        return grammar_error(first_use_[r], "rule '" + names_[r] + "' is used but not defined");
    }
    auto root = rule_ids_.find("root");
    if (root == rule_ids_.end() || !defined_[size_t(root->second)])
      return make_error(0, "grammar: no rule named 'root' (the start rule)");
    if (auto st = check_left_recursion(); !st) return st.error();
    auto g = std::make_shared<Grammar>();
    g->limits_ = lim_;
    g->root_ = root->second;
    g->names_ = names_;
    g->sets_ = std::move(sets_);
    g->rules_.resize(bodies_.size());
    size_t total = 0;
    for (const auto& alts : bodies_)
      for (const auto& alt : alts) total += alt.size() + 1;
    if (total > lim_.max_elements) {
      return make_error(0, strfmt("grammar: %zu symbols once expanded, more than the limit of %zu",
                                  total, lim_.max_elements));
    }
    g->elems_.reserve(total);
    for (size_t r = 0; r < bodies_.size(); ++r) {
      for (const auto& alt : bodies_[r]) {
        g->rules_[r].push_back(static_cast<int32_t>(g->elems_.size()));
        g->elems_.insert(g->elems_.end(), alt.begin(), alt.end());
        g->elems_.push_back({Grammar::Kind::kEnd, 0});
      }
    }
    return std::shared_ptr<const Grammar>(std::move(g));
  }

 private:
  using Elem = Grammar::Elem;
  using Seq = std::vector<Elem>;

  // ---- lexing ----
  bool at_end() const { return i_ >= s_.size(); }
  char peek(size_t k = 0) const { return i_ + k < s_.size() ? s_[i_ + k] : '\0'; }
  void advance() {
    if (s_[i_] == '\n') ++line_;
    ++i_;
  }
  // Skips spaces, newlines and comments.
  void skip_space() {
    while (!at_end()) {
      const char c = peek();
      if (c == '#') {
        while (!at_end() && peek() != '\n') advance();
      } else if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
        advance();
      } else {
        break;
      }
    }
  }
  std::string_view name_at(size_t at) const {
    size_t e = at;
    while (e < s_.size() && is_name_char(s_[e])) ++e;
    return s_.substr(at, e - at);
  }
  // Whether a rule definition (`name ::=`) starts at the current position.
  bool definition_ahead() const {
    const auto n = name_at(i_);
    if (n.empty()) return false;
    size_t k = i_ + n.size();
    while (k < s_.size() && (s_[k] == ' ' || s_[k] == '\t')) ++k;
    return s_.substr(k, 3) == "::=";
  }

  Status parse() {
    skip_space();
    if (at_end()) return make_error(0, "grammar: empty (expected rules like root ::= ...)");
    while (!at_end()) {
      const auto n = name_at(i_);
      if (n.empty()) {
        return grammar_error(line_, strfmt("expected a rule name, got '%c'", peek()));
      }
      if (!definition_ahead()) {
        return grammar_error(line_, "expected '::=' after rule name '" + std::string(n) + "'");
      }
      const int32_t r = rule_id(n);
      if (defined_[size_t(r)])
        return grammar_error(line_, "rule '" + std::string(n) + "' is defined twice");
      defined_[size_t(r)] = true;
      i_ += n.size();
      while (peek() == ' ' || peek() == '\t') advance();
      i_ += 3;
      auto alts = parse_alternatives(0);
      if (!alts) return alts.error();
      bodies_[size_t(r)] = std::move(*alts);
      skip_space();
    }
    return Ok{};
  }

  int32_t rule_id(std::string_view name) {
    auto it = rule_ids_.find(std::string(name));
    if (it != rule_ids_.end()) return it->second;
    const int32_t id = new_rule(std::string(name));
    rule_ids_.emplace(std::string(name), id);
    return id;
  }
  int32_t new_rule(std::string name) {
    names_.push_back(std::move(name));
    bodies_.emplace_back();
    defined_.push_back(false);
    first_use_.push_back(line_);
    return static_cast<int32_t>(names_.size() - 1);
  }
  // An anonymous rule holding `alts` (groups, repetitions, multi-byte classes).
  int32_t anon_rule(std::vector<Seq> alts) {
    const int32_t id = new_rule("");
    defined_[size_t(id)] = true;
    bodies_[size_t(id)] = std::move(alts);
    return id;
  }

  Status count(size_t n) {
    elements_ += n;
    if (elements_ > lim_.max_elements) {
      return grammar_error(
          line_, strfmt("more than the limit of %zu symbols once expanded", lim_.max_elements));
    }
    return Ok{};
  }

  // alternatives := sequence ('|' sequence)*; ends at ')' (depth > 0), at the next definition or
  // at the end of the text.
  Result<std::vector<Seq>> parse_alternatives(int depth) {
    if (depth > 64) return grammar_error(line_, "groups nested more than 64 deep");
    std::vector<Seq> alts(1);
    for (;;) {
      skip_space();
      if (at_end()) break;
      const char c = peek();
      if (c == '|') {
        advance();
        alts.emplace_back();
        continue;
      }
      if (c == ')') {
        if (depth == 0) return grammar_error(line_, "unbalanced ')'");
        break;
      }
      if (depth == 0 && definition_ahead()) break;
      auto item = parse_item(depth);
      if (!item) return item.error();
      auto rep = parse_repetition(std::move(*item));
      if (!rep) return rep.error();
      if (auto st = count(rep->size()); !st) return st.error();
      alts.back().insert(alts.back().end(), rep->begin(), rep->end());
    }
    return alts;
  }

  // One item: literal, class, '.', rule reference or group. Returns its elements.
  Result<Seq> parse_item(int depth) {
    const char c = peek();
    if (c == '"' || c == '\'') return parse_literal();
    if (c == '[') return parse_class();
    if (c == '.') {
      advance();
      return class_elems({{0, 0x10FFFF}}, false);
    }
    if (c == '(') {
      const int open_line = line_;
      advance();
      auto alts = parse_alternatives(depth + 1);
      if (!alts) return alts.error();
      if (peek() != ')') return grammar_error(open_line, "'(' is never closed");
      advance();
      if (alts->size() == 1) return std::move((*alts)[0]);
      return Seq{{Grammar::Kind::kRule, anon_rule(std::move(*alts))}};
    }
    const auto n = name_at(i_);
    if (c == ':') {
      return grammar_error(line_, "unexpected ':' (a rule is defined as name ::= ...)");
    }
    if (n.empty()) return grammar_error(line_, strfmt("unexpected character '%c'", c));
    const int32_t r = rule_id(n);
    i_ += n.size();
    return Seq{{Grammar::Kind::kRule, r}};
  }

  // Postfix *, +, ?, {n}, {n,}, {n,m} applied to `item`.
  Result<Seq> parse_repetition(Seq item) {
    for (;;) {
      const char c = peek();
      int64_t lo = 0, hi = -1;  // hi -1: unbounded
      if (c == '*') {
        advance();
      } else if (c == '+') {
        advance();
        lo = 1;
      } else if (c == '?') {
        advance();
        hi = 1;
      } else if (c == '{') {
        advance();
        auto a = parse_count();
        if (!a) return a.error();
        lo = *a;
        if (peek() == '}') {
          hi = lo;
        } else if (peek() == ',') {
          advance();
          while (peek() == ' ') advance();
          if (peek() != '}') {
            auto b = parse_count();
            if (!b) return b.error();
            hi = *b;
            if (hi < lo)
              return grammar_error(
                  line_, strfmt("{%lld,%lld}: max below min", (long long)lo, (long long)hi));
          }
        }
        if (peek() != '}') return grammar_error(line_, "expected '}' closing a repetition");
        advance();
      } else {
        return item;
      }
      auto r = repeat(std::move(item), lo, hi);
      if (!r) return r.error();
      item = std::move(*r);
    }
  }
  Result<int64_t> parse_count() {
    while (peek() == ' ') advance();
    if (!(peek() >= '0' && peek() <= '9')) return grammar_error(line_, "expected a count in {}");
    int64_t v = 0;
    while (peek() >= '0' && peek() <= '9') {
      v = v * 10 + (peek() - '0');
      if (v > lim_.max_repeat) {
        return grammar_error(
            line_, strfmt("repetition count above the limit of %lld", (long long)lim_.max_repeat));
      }
      advance();
    }
    while (peek() == ' ') advance();
    return v;
  }

  // x{lo,hi}: lo copies of x, then x* (hi = -1) or hi - lo nested optional copies. x becomes one
  // symbol first (a rule when it has several elements), so each copy is one element.
  Result<Seq> repeat(Seq item, int64_t lo, int64_t hi) {
    Elem x = item.size() == 1 ? item[0] : Elem{Grammar::Kind::kRule, anon_rule({std::move(item)})};
    Seq out(static_cast<size_t>(lo), x);
    if (auto st = count(out.size()); !st) return st.error();
    if (hi < 0) {
      // star ::= x star | (empty): right recursion, which the matcher walks as a loop.
      const int32_t star = anon_rule({});
      bodies_[size_t(star)] = {Seq{x, {Grammar::Kind::kRule, star}}, Seq{}};
      out.push_back({Grammar::Kind::kRule, star});
    } else if (hi > lo) {
      // opt_k ::= x opt_(k-1) | (empty), opt_1 ::= x | (empty)
      int32_t prev = -1;
      for (int64_t k = 0; k < hi - lo; ++k) {
        Seq first{x};
        if (prev >= 0) first.push_back({Grammar::Kind::kRule, prev});
        prev = anon_rule({std::move(first), Seq{}});
        if (auto st = count(3); !st) return st.error();
      }
      out.push_back({Grammar::Kind::kRule, prev});
    }
    return out;
  }

  // ---- terminals ----
  Result<uint32_t> parse_hex(int digits) {
    uint32_t v = 0;
    for (int k = 0; k < digits; ++k) {
      const char c = peek();
      int d = -1;
      if (c >= '0' && c <= '9') d = c - '0';
      if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
      if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
      if (d < 0) return grammar_error(line_, strfmt("expected %d hex digits in an escape", digits));
      v = v * 16 + uint32_t(d);
      advance();
    }
    return v;
  }
  // One character of a literal or class (after any backslash), as a code point; raw bytes of
  // the text are read as UTF-8. is_byte: a \xHH escape (one byte, not a code point).
  Result<uint32_t> parse_char(bool* is_byte) {
    *is_byte = false;
    if (at_end()) return grammar_error(line_, "unterminated literal or class");
    const unsigned char c = static_cast<unsigned char>(peek());
    if (c == '\\') {
      advance();
      if (at_end()) return grammar_error(line_, "unterminated escape");
      const char e = peek();
      advance();
      switch (e) {
        case 'n':
          return uint32_t{'\n'};
        case 'r':
          return uint32_t{'\r'};
        case 't':
          return uint32_t{'\t'};
        case '\\':
        case '"':
        case '\'':
        case '[':
        case ']':
        case '-':
        case '^':
        case '/':
          return uint32_t(static_cast<unsigned char>(e));
        case 'x':
          *is_byte = true;
          return parse_hex(2);
        case 'u':
          return parse_hex(4);
        case 'U':
          return parse_hex(8);
        default:
          return grammar_error(line_, strfmt("unknown escape '\\%c'", e));
      }
    }
    if (c == '\n') return grammar_error(line_, "a newline inside a literal or class");
    if (c < 0x80) {
      advance();
      return uint32_t{c};
    }
    // A UTF-8 sequence in the grammar's text.
    const int n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
    if (n == 0 || i_ + size_t(n) > s_.size())
      return grammar_error(line_, "the grammar's text is not valid UTF-8");
    uint32_t cp = c & (0x7F >> n);
    advance();
    for (int k = 1; k < n; ++k) {
      const unsigned char b = static_cast<unsigned char>(peek());
      if ((b & 0xC0) != 0x80) return grammar_error(line_, "the grammar's text is not valid UTF-8");
      cp = (cp << 6) | (b & 0x3F);
      advance();
    }
    return cp;
  }
  Status check_scalar(uint32_t cp) {
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
      return grammar_error(line_, strfmt("U+%04X is not a Unicode scalar value", cp));
    return Ok{};
  }

  Elem bytes_elem(ByteRange r) {
    Grammar::ByteSet set;
    for (unsigned b = r.lo; b <= r.hi; ++b) set.add(uint8_t(b));
    return set_elem(set);
  }
  Elem set_elem(const Grammar::ByteSet& set) {
    auto it = set_ids_.find(key_of(set));
    if (it != set_ids_.end()) return {Grammar::Kind::kBytes, it->second};
    const int32_t id = static_cast<int32_t>(sets_.size());
    sets_.push_back(set);
    set_ids_.emplace(key_of(set), id);
    return {Grammar::Kind::kBytes, id};
  }
  static std::string key_of(const Grammar::ByteSet& s) {
    return std::string(reinterpret_cast<const char*>(s.bits), sizeof s.bits);
  }

  Result<Seq> parse_literal() {
    const char quote = peek();
    advance();
    Seq out;
    while (peek() != quote) {
      bool is_byte = false;
      auto cp = parse_char(&is_byte);
      if (!cp) return cp.error();
      std::string bytes;
      if (is_byte) {
        bytes = std::string(1, static_cast<char>(*cp));
      } else {
        if (auto st = check_scalar(*cp); !st) return st.error();
        model::detail::append_utf8(&bytes, *cp);
      }
      for (unsigned char b : bytes) out.push_back(bytes_elem({b, b}));
    }
    advance();
    return out;
  }

  Result<Seq> parse_class() {
    advance();  // [
    bool negated = false;
    if (peek() == '^') {
      negated = true;
      advance();
    }
    std::vector<std::pair<uint32_t, uint32_t>> ranges;
    Grammar::ByteSet raw_bytes;  // \xHH escapes of bytes >= 0x80: matched as single bytes
    bool has_raw = false;
    while (peek() != ']') {
      bool lo_byte = false;
      auto lo = parse_char(&lo_byte);
      if (!lo) return lo.error();
      uint32_t hi = *lo;
      bool hi_byte = lo_byte;
      if (peek() == '-' && peek(1) != ']') {
        advance();
        auto h = parse_char(&hi_byte);
        if (!h) return h.error();
        hi = *h;
        if (hi < *lo)
          return grammar_error(line_, strfmt("class range %X-%X is backwards", *lo, hi));
      }
      if ((lo_byte && *lo >= 0x80) || (hi_byte && hi >= 0x80)) {
        if (negated) return grammar_error(line_, "a negated class may not hold \\x80-\\xFF bytes");
        for (uint32_t b = *lo; b <= hi && b <= 0xFF; ++b) raw_bytes.add(uint8_t(b));
        has_raw = true;
        continue;
      }
      if (auto st = check_scalar(hi); !st) return st.error();
      ranges.push_back({*lo, hi});
    }
    advance();  // ]
    auto seq = class_elems(std::move(ranges), negated);
    if (!has_raw) return seq;
    // Raw bytes join the one-byte alternatives.
    if (seq.size() == 1 && seq[0].kind == Grammar::Kind::kBytes) {
      Grammar::ByteSet s = sets_[size_t(seq[0].arg)];
      for (int w = 0; w < 4; ++w) s.bits[w] |= raw_bytes.bits[w];
      return Seq{set_elem(s)};
    }
    const int32_t r = anon_rule({Seq{set_elem(raw_bytes)}, seq});
    return Seq{{Grammar::Kind::kRule, r}};
  }

  // A class as elements: one byte set when every member is one byte, else a rule whose
  // alternatives are the one-byte members (one set) and each multi-byte sequence.
  Seq class_elems(std::vector<std::pair<uint32_t, uint32_t>> ranges, bool negated) {
    const auto seqs = utf8_sequences(normalize_class(std::move(ranges), negated));
    Grammar::ByteSet one;
    std::vector<Seq> alts;
    bool any_one = false;
    for (const auto& s : seqs) {
      if (s.size() == 1) {
        for (unsigned b = s[0].lo; b <= s[0].hi; ++b) one.add(uint8_t(b));
        any_one = true;
        continue;
      }
      Seq alt;
      for (auto r : s) alt.push_back(bytes_elem(r));
      alts.push_back(std::move(alt));
    }
    if (alts.empty()) return Seq{set_elem(one)};  // (an empty set matches nothing)
    if (any_one) alts.insert(alts.begin(), Seq{set_elem(one)});
    const auto key = std::string(reinterpret_cast<const char*>(&negated), 1) + class_key(seqs);
    if (auto it = class_rules_.find(key); it != class_rules_.end())
      return Seq{{Grammar::Kind::kRule, it->second}};
    const int32_t r = anon_rule(std::move(alts));
    class_rules_.emplace(key, r);
    return Seq{{Grammar::Kind::kRule, r}};
  }
  static std::string class_key(const std::vector<ByteSeq>& seqs) {
    std::string k;
    for (const auto& s : seqs) {
      for (auto r : s) {
        k += char(r.lo);
        k += char(r.hi);
      }
      k += '|';
    }
    return k;
  }

  // ---- checks ----
  // Refuses rules that can reach themselves without consuming a byte.
  Status check_left_recursion() {
    const size_t n = bodies_.size();
    std::vector<uint8_t> nullable(n, 0);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (const auto& alt : bodies_[r]) {
          bool all = true;
          for (const auto& e : alt) {
            if (e.kind == Grammar::Kind::kBytes || !nullable[size_t(e.arg)]) {
              all = false;
              break;
            }
          }
          if (all) {
            nullable[r] = 1;
            changed = true;
            break;
          }
        }
      }
    }
    // Edges r -> s: s can come first in r (after nullable rules only).
    std::vector<std::vector<int32_t>> first(n);
    for (size_t r = 0; r < n; ++r) {
      for (const auto& alt : bodies_[r]) {
        for (const auto& e : alt) {
          if (e.kind == Grammar::Kind::kBytes) break;
          first[r].push_back(e.arg);
          if (!nullable[size_t(e.arg)]) break;
        }
      }
    }
    // Iterative DFS for a cycle (0 unseen, 1 on the path, 2 done).
    std::vector<uint8_t> mark(n, 0);
    std::vector<int32_t> parent(n, -1);
    for (size_t s = 0; s < n; ++s) {
      if (mark[s]) continue;
      std::vector<std::pair<int32_t, size_t>> stack{{int32_t(s), 0}};
      mark[s] = 1;
      while (!stack.empty()) {
        auto& [r, k] = stack.back();
        if (k == first[size_t(r)].size()) {
          mark[size_t(r)] = 2;
          stack.pop_back();
          continue;
        }
        const int32_t t = first[size_t(r)][k++];
        if (mark[size_t(t)] == 1) {
          // The cycle: t ... r -> t. Name it by the rules with names on it.
          std::string path;
          bool on = false;
          for (const auto& fr : stack) {
            if (fr.first == t) on = true;
            if (on) path += display_name(fr.first) + " -> ";
          }
          path += display_name(t);
          return make_error(0, "grammar: rule '" + display_name(t) +
                                   "' is left-recursive (it can reach itself without consuming "
                                   "input: " +
                                   path + ")");
        }
        if (mark[size_t(t)] == 0) {
          mark[size_t(t)] = 1;
          stack.push_back({t, 0});
        }
      }
    }
    return Ok{};
  }
  std::string display_name(int32_t r) const {
    return names_[size_t(r)].empty() ? "(group #" + std::to_string(r) + ")" : names_[size_t(r)];
  }

  std::string_view s_;
  GrammarLimits lim_;
  size_t i_ = 0;
  int line_ = 1;
  size_t elements_ = 0;
  std::unordered_map<std::string, int32_t> rule_ids_;
  std::vector<std::string> names_;
  std::vector<std::vector<Seq>> bodies_;
  std::vector<bool> defined_;
  std::vector<int> first_use_;
  std::vector<Grammar::ByteSet> sets_;
  std::unordered_map<std::string, int32_t> set_ids_;
  std::unordered_map<std::string, int32_t> class_rules_;
};

Result<std::shared_ptr<const Grammar>> Grammar::compile(std::string_view source,
                                                        GrammarLimits limits) {
  return GrammarBuilder(source, limits).build();
}

// ---- TokenVocab ----

TokenVocab::TokenVocab(std::vector<std::string> pieces, std::vector<int32_t> eog)
    : pieces_(std::move(pieces)), eog_flag_(pieces_.size(), 0) {
  for (int32_t id : eog) {
    if (id < 0 || size_t(id) >= pieces_.size() || eog_flag_[size_t(id)]) continue;
    eog_flag_[size_t(id)] = 1;
    eog_.push_back(id);
  }
  std::sort(eog_.begin(), eog_.end());
  for (size_t i = 0; i < pieces_.size(); ++i)
    if (!pieces_[i].empty() && !eog_flag_[i]) order_.push_back(static_cast<int32_t>(i));
  std::sort(order_.begin(), order_.end(), [&](int32_t a, int32_t b) {
    const auto& pa = pieces_[size_t(a)];
    const auto& pb = pieces_[size_t(b)];
    return pa != pb ? pa < pb : a < b;
  });
  lcp_.assign(order_.size(), 0);
  for (size_t i = 1; i < order_.size(); ++i) {
    const auto& a = pieces_[size_t(order_[i - 1])];
    const auto& b = pieces_[size_t(order_[i])];
    size_t k = 0;
    while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
    lcp_[i] = static_cast<uint32_t>(k);
  }
}

std::shared_ptr<const TokenVocab> TokenVocab::of(const model::Tokenizer& tok) {
  std::vector<std::string> pieces(static_cast<size_t>(tok.n_vocab()));
  std::vector<int32_t> eog;
  for (int32_t i = 0; i < tok.n_vocab(); ++i) {
    if (tok.is_eog(i)) eog.push_back(i);
    const auto attr = tok.token_attr(i);
    if (attr == model::TokenAttr::kControl || attr == model::TokenAttr::kUnused ||
        attr == model::TokenAttr::kUnknown)
      continue;
    pieces[size_t(i)] = tok.token_to_piece(i);
  }
  return std::make_shared<const TokenVocab>(std::move(pieces), std::move(eog));
}

// ---- GrammarDfa ----

namespace {

uint64_t node_key(int32_t pos, int32_t parent) {
  return (uint64_t(uint32_t(pos)) << 32) | uint32_t(parent);
}

// The matcher's own nodes: a vector where equal nodes are made once (as in a GrammarDfa), so
// equal stacks are one stack and count once against max_heads, wherever they are made.
struct VectorArena {
  explicit VectorArena(std::vector<StackNode>& nodes) : v(nodes) {
    ids.reserve(v.size() * 2);
    for (size_t i = 0; i < v.size(); ++i) ids.emplace(node_key(v[i].pos, v[i].parent), int32_t(i));
  }
  int32_t add(int32_t pos, int32_t parent) {
    auto [it, fresh] = ids.emplace(node_key(pos, parent), static_cast<int32_t>(v.size()));
    if (fresh) v.push_back({pos, parent});
    return it->second;
  }
  const StackNode& node(int32_t id) const { return v[size_t(id)]; }
  std::vector<StackNode>& v;
  std::unordered_map<uint64_t, int32_t> ids;
};

// A move packed in 32 bits: the next state + 1 (0: not made yet), and three flags.
constexpr uint32_t kStateMask = (uint32_t{1} << 28) - 1;
constexpr uint32_t kAccept = uint32_t{1} << 28;  // a way ended the grammar on this byte
constexpr uint32_t kCutBit = uint32_t{1} << 29;  // a way popped below a cut
constexpr uint32_t kOver = uint32_t{1} << 30;    // more stacks than max_heads

}  // namespace

GrammarDfa::GrammarDfa(std::shared_ptr<const Grammar> grammar, size_t max_states)
    : g_(std::move(grammar)), max_states_(std::min<size_t>(max_states, kStateMask - 1)) {}

void GrammarDfa::clear() {
  nodes_.clear();
  node_ids_.clear();
  state_heads_.clear();
  state_ids_.clear();
  dense_.clear();
  sparse_.clear();
}

int32_t GrammarDfa::add(int32_t pos, int32_t parent) {
  auto [it, fresh] = node_ids_.emplace(node_key(pos, parent), static_cast<int32_t>(nodes_.size()));
  if (fresh) nodes_.push_back({pos, parent});
  return it->second;
}

int32_t GrammarDfa::state(std::vector<int32_t> heads) {
  std::sort(heads.begin(), heads.end());
  heads.erase(std::unique(heads.begin(), heads.end()), heads.end());
  std::string key(reinterpret_cast<const char*>(heads.data()), heads.size() * sizeof(int32_t));
  auto [it, fresh] = state_ids_.emplace(std::move(key), static_cast<int32_t>(state_heads_.size()));
  if (fresh) {
    state_heads_.push_back(std::move(heads));
    if (dense_.size() < kDense) {
      dense_.push_back(std::make_unique<uint32_t[]>(256));  // zeroed: no move made yet
    }
  }
  return it->second;
}

uint32_t& GrammarDfa::move(int32_t state, uint8_t byte) {
  if (size_t(state) < dense_.size()) return dense_[size_t(state)][byte];
  return sparse_[(uint64_t(uint32_t(state)) << 8) | byte];
}

// ---- GrammarMatcher ----

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar) : g_(std::move(grammar)) {
  TROUPE_CHECK(g_ != nullptr, "GrammarMatcher needs a grammar");
  nodes_.reserve(64);
  bool cut = false;
  VectorArena arena{nodes_};
  for (int32_t a : g_->alternatives(g_->root())) {
    if (!closure(a, -1, arena, heads_, accepting_, cut)) {
      heads_.clear();  // more than max_heads at the start: nothing can be matched
      accepting_ = false;
      break;
    }
  }
}

template <class Arena>
bool GrammarMatcher::closure(int32_t pos, int32_t parent, Arena& arena, std::vector<int32_t>& out,
                             bool& accepting, bool& cut) const {
  const auto& el = g_->elems();
  for (;;) {
    const Grammar::Elem e = el[size_t(pos)];
    if (e.kind == Grammar::Kind::kBytes) {
      for (int32_t h : out) {
        const Node& n = arena.node(h);
        if (n.pos == pos && n.parent == parent) return true;
      }
      if (out.size() >= g_->limits().max_heads) return false;
      out.push_back(arena.add(pos, parent));
      return true;
    }
    if (e.kind == Grammar::Kind::kEnd) {
      if (parent == kCut) {
        cut = true;
        return true;
      }
      if (parent < 0) {
        accepting = true;
        return true;
      }
      const Node p = arena.node(parent);
      pos = p.pos + 1;
      parent = p.parent;
      continue;
    }
    // A rule: each alternative continues at the next element here, or -- when this reference
    // ends its alternative -- wherever that alternative's end would continue (a tail call, so
    // right recursion does not grow the stack).
    int32_t cont = parent;
    if (el[size_t(pos) + 1].kind != Grammar::Kind::kEnd) cont = arena.add(pos, parent);
    for (int32_t a : g_->alternatives(e.arg))
      if (!closure(a, cont, arena, out, accepting, cut)) return false;
    return true;
  }
}

template <class Arena>
bool GrammarMatcher::step(Arena& arena, const std::vector<int32_t>& heads_in, uint8_t byte,
                          std::vector<int32_t>& heads, bool& accepting, bool& cut) const {
  const auto& el = g_->elems();
  const auto& sets = g_->byte_sets();
  heads.clear();
  accepting = false;
  for (int32_t h : heads_in) {
    const Node n = arena.node(h);
    if (!sets[size_t(el[size_t(n.pos)].arg)].has(byte)) continue;
    if (!closure(n.pos + 1, n.parent, arena, heads, accepting, cut)) return false;
  }
  return true;
}

bool GrammarMatcher::accept_bytes(std::string_view bytes) {
  if (ended_) return bytes.empty();
  std::vector<Node> nodes = nodes_;
  VectorArena arena{nodes};
  std::vector<int32_t> heads = heads_, next;
  bool accepting = accepting_, cut = false;
  for (char c : bytes) {
    if (!step(arena, heads, static_cast<uint8_t>(c), next, accepting, cut)) return false;
    if (next.empty() && !accepting) return false;
    heads.swap(next);
  }
  nodes_ = std::move(nodes);
  heads_ = std::move(heads);
  accepting_ = accepting;
  compact();
  return true;
}

bool GrammarMatcher::accept_token(const TokenVocab& vocab, int32_t id) {
  if (id < 0 || id >= vocab.size() || ended_) return false;
  if (vocab.is_eog(id)) {
    if (!accepting_) return false;
    ended_ = true;
    heads_.clear();
    return true;
  }
  const auto& p = vocab.piece(id);
  if (p.empty()) return false;
  return accept_bytes(p);
}

bool GrammarMatcher::allows(const TokenVocab& vocab, int32_t id) const {
  if (id < 0 || id >= vocab.size() || ended_) return false;
  if (vocab.is_eog(id)) return accepting_;
  const auto& p = vocab.piece(id);
  if (p.empty()) return false;
  GrammarMatcher copy = *this;
  return copy.accept_bytes(p);
}

// Keeps only the nodes the heads reach, parents first.
void GrammarMatcher::compact() {
  if (nodes_.size() < 256 && nodes_.size() < 8 * heads_.size() + 64) return;
  std::vector<int32_t> remap(nodes_.size(), -1);
  std::vector<Node> kept;
  // Nodes are created after their parents, so increasing index order keeps parents first.
  std::vector<uint8_t> live(nodes_.size(), 0);
  for (int32_t h : heads_) {
    for (int32_t n = h; n >= 0 && !live[size_t(n)]; n = nodes_[size_t(n)].parent)
      live[size_t(n)] = 1;
  }
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (!live[i]) continue;
    const Node n = nodes_[i];
    remap[i] = static_cast<int32_t>(kept.size());
    kept.push_back({n.pos, n.parent < 0 ? -1 : remap[size_t(n.parent)]});
  }
  for (int32_t& h : heads_) h = remap[size_t(h)];
  nodes_ = std::move(kept);
}

uint32_t GrammarMatcher::dfa_move(GrammarDfa& dfa, int32_t state, uint8_t byte) const {
  if (const uint32_t m = dfa.move(state, byte)) return m;
  const std::vector<int32_t> in = dfa.state_heads_[size_t(state)];
  dfa.work_ += in.size();
  std::vector<int32_t> out;
  bool acc = false, cut = false;
  const bool within = step(dfa, in, byte, out, acc, cut);
  const int32_t next = dfa.state(within ? std::move(out) : std::vector<int32_t>{});
  const uint32_t m =
      (uint32_t(next) + 1) | (acc ? kAccept : 0) | (cut ? kCutBit : 0) | (within ? 0 : kOver);
  dfa.move(state, byte) = m;  // (taken again: making the state may have moved the map's slots)
  return m;
}

template <class Verdict>
bool GrammarMatcher::walk(const std::vector<Node>& nodes, const std::vector<int32_t>& heads,
                          const TokenVocab& vocab, const std::vector<int32_t>* subset,
                          GrammarDfa* shared, Verdict&& verdict) const {
  std::unique_ptr<GrammarDfa> own;
  if (!shared || shared->grammar() != g_) own = std::make_unique<GrammarDfa>(g_);
  GrammarDfa& dfa = own ? *own : *shared;
  if (dfa.num_states() >= dfa.max_states_) dfa.clear();
  // The start: each stack's nodes made in the DFA, bottom first.
  std::vector<int32_t> start;
  for (int32_t h : heads) {
    std::vector<int32_t> chain;
    for (int32_t n = h; n >= 0; n = nodes[size_t(n)].parent) chain.push_back(n);
    int32_t parent = nodes[size_t(chain.back())].parent;  // -1 (root) or kCut
    for (size_t j = chain.size(); j-- > 0;) parent = dfa.add(nodes[size_t(chain[j])].pos, parent);
    start.push_back(parent);
  }
  const int32_t empty = dfa.state({});
  const size_t most_states = dfa.num_states() + g_->limits().max_walk_states;
  const uint64_t most_work = dfa.work_ + g_->limits().max_walk_work;
  // Tokens in byte order: state[k] is the DFA state after a token's first k bytes, shared with
  // the next token as far as their common prefix goes; cut_at[k]: a way popped below a cut in
  // those bytes.
  const auto& order = vocab.order();
  const size_t n = subset ? subset->size() : order.size();
  auto order_at = [&](size_t i) { return subset ? size_t((*subset)[i]) : i; };
  auto common = [&](size_t i) -> size_t {  // bytes token i shares with token i - 1
    if (i == 0) return 0;
    if (!subset) return vocab.lcp()[i];
    const std::string& a = vocab.piece(order[order_at(i - 1)]);
    const std::string& b = vocab.piece(order[order_at(i)]);
    size_t k = 0;
    while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
    return k;
  };
  std::vector<int32_t> state(1, dfa.state(std::move(start)));
  std::vector<uint8_t> cut_at(1, 0);
  size_t valid = 0;  // state[0..valid] hold the last token's prefixes
  for (size_t i = 0; i < n;) {
    const size_t oi = order_at(i);
    const std::string& p = vocab.piece(order[oi]);
    size_t k = std::min(common(i), valid);
    bool ok = true;
    for (; k < p.size(); ++k) {
      if (state.size() <= k + 1) {
        state.push_back(0);
        cut_at.push_back(0);
      }
      const uint32_t m = dfa_move(dfa, state[k], static_cast<uint8_t>(p[k]));
      if (dfa.num_states() > most_states || dfa.work_ > most_work) return false;
      state[k + 1] = static_cast<int32_t>((m & kStateMask) - 1);
      cut_at[k + 1] = cut_at[k] || (m & (kCutBit | kOver)) != 0;
      if ((m & kOver) || (state[k + 1] == empty && !(m & kAccept))) {
        ok = false;
        break;
      }
    }
    if (ok) {
      verdict(oi, true, cut_at[p.size()] != 0);
      valid = p.size();
      ++i;
      continue;
    }
    // p[0..k] is refused: so is every following token that starts with it.
    const bool c = cut_at[k + 1] != 0;
    verdict(oi, false, c);
    valid = k;
    for (++i; i < n && common(i) > k; ++i) verdict(order_at(i), false, c);
  }
  return true;
}

int64_t GrammarMatcher::fill_mask(const TokenVocab& vocab, std::vector<uint8_t>* allowed,
                                  GrammarDfa* dfa) const {
  allowed->assign(static_cast<size_t>(vocab.size()), 0);
  int64_t count = 0;
  if (ended_) return 0;
  if (accepting_) {
    for (int32_t id : vocab.eog()) (*allowed)[size_t(id)] = 1;
    count += static_cast<int64_t>(vocab.eog().size());
  }
  if (heads_.empty()) return count;
  const auto& order = vocab.order();
  const bool done = walk(nodes_, heads_, vocab, nullptr, dfa, [&](size_t oi, bool ok, bool) {
    if (!ok) return;
    (*allowed)[size_t(order[oi])] = 1;
    ++count;
  });
  return done ? count : -1;
}

int64_t GrammarMatcher::fill_mask_of(const TokenVocab& vocab, const std::vector<int32_t>& order_idx,
                                     std::vector<uint8_t>* allowed, GrammarDfa* dfa) const {
  if (ended_ || heads_.empty() || order_idx.empty()) return 0;
  int64_t count = 0;
  const auto& order = vocab.order();
  const bool done = walk(nodes_, heads_, vocab, &order_idx, dfa, [&](size_t oi, bool ok, bool) {
    if (!ok) return;
    (*allowed)[size_t(order[oi])] = 1;
    ++count;
  });
  return done ? count : -1;
}

bool GrammarMatcher::fill_top_mask(const TokenVocab& vocab, size_t stack, int frames, TopMask* out,
                                   GrammarDfa* dfa) const {
  out->allowed.assign(static_cast<size_t>(vocab.size()), 0);
  out->undecided.clear();
  out->allowed_count = 0;
  if (ended_ || stack >= heads_.size()) return true;
  // The stack's top `frames` nodes, the last one's parent kCut (or -1 where it is no deeper).
  std::vector<int32_t> chain;
  for (int32_t n = heads_[stack]; n >= 0 && int(chain.size()) < std::max(frames, 1);
       n = nodes_[size_t(n)].parent)
    chain.push_back(n);
  std::vector<Node> nodes;
  const int32_t below = nodes_[size_t(chain.back())].parent;
  int32_t parent = below < 0 ? below : kCut;
  for (size_t j = chain.size(); j-- > 0;) {
    nodes.push_back({nodes_[size_t(chain[j])].pos, parent});
    parent = static_cast<int32_t>(nodes.size() - 1);
  }
  const auto& order = vocab.order();
  return walk(nodes, {parent}, vocab, nullptr, dfa, [&](size_t oi, bool ok, bool cut) {
    if (ok) {
      out->allowed[size_t(order[oi])] = 1;
      ++out->allowed_count;
    } else if (cut) {
      out->undecided.push_back(static_cast<int32_t>(oi));
    }
  });
}

namespace {
// The positions of a stack from its head down, `frames` of them at most (0: all), with a mark
// when it goes deeper.
template <class Nodes>
std::string stack_text(const Nodes& nodes, int32_t head, int frames) {
  std::string s;
  int depth = 0;
  int32_t n = head;
  for (; n >= 0 && (frames <= 0 || depth < frames); n = nodes[size_t(n)].parent, ++depth) {
    const int32_t pos = nodes[size_t(n)].pos;
    s.append(reinterpret_cast<const char*>(&pos), sizeof pos);
  }
  if (n >= 0) s += '+';
  return s;
}
}  // namespace

std::string GrammarMatcher::stack_key(size_t i, int frames) const {
  return stack_text(nodes_, heads_[i], std::max(frames, 1));
}

std::string GrammarMatcher::state_key() const {
  std::vector<std::string> stacks;
  stacks.reserve(heads_.size());
  for (int32_t h : heads_) stacks.push_back(stack_text(nodes_, h, 0));
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  std::string key(1, accepting_ ? 'A' : 'a');
  key += ended_ ? 'E' : 'e';
  for (const auto& s : stacks) {
    const uint32_t len = static_cast<uint32_t>(s.size());
    key.append(reinterpret_cast<const char*>(&len), sizeof len);
    key += s;
  }
  return key;
}

}  // namespace troupe::compute
