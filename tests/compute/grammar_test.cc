// Tests of compute/grammar.h: GBNF compiled and matched against independent oracles (std::regex
// for regular grammars, a counter for balanced brackets), UTF-8 classes byte for byte, the errors
// the compiler names, and token masks (the sorted walk) against a token-by-token check on random
// and real vocabularies.
#include "compute/grammar.h"

#include <cmath>
#include <cstdint>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "compute/grammar_sampling.h"
#include "compute/sampler.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "tests/test_support.h"

namespace troupe::compute {
namespace {

std::shared_ptr<const Grammar> compile(const std::string& src) {
  auto g = Grammar::compile(src);
  EXPECT_TRUE(g.has_value()) << (g ? "" : g.error().message) << "\n" << src;
  return g ? *g : nullptr;
}

// The whole text is a sentence of the grammar.
bool matches(const std::shared_ptr<const Grammar>& g, std::string_view text) {
  GrammarMatcher m(g);
  return m.accept_bytes(text) && m.can_end();
}
// The text can begin a sentence.
bool prefix(const std::shared_ptr<const Grammar>& g, std::string_view text) {
  GrammarMatcher m(g);
  return m.accept_bytes(text);
}

std::string compile_error(const std::string& src, GrammarLimits lim = {}) {
  auto g = Grammar::compile(src, lim);
  return g ? "(compiled)" : g.error().message;
}

// Every string over `alphabet` up to `max_len` characters.
std::vector<std::string> all_strings(const std::string& alphabet, size_t max_len) {
  std::vector<std::string> out{""};
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i].size() == max_len) continue;
    for (char c : alphabet) out.push_back(out[i] + c);
  }
  return out;
}

TEST(GrammarTest, RegularGrammarsMatchWhatStdRegexMatches) {
  struct Case {
    std::string gbnf, regex, alphabet;
  };
  const Case cases[] = {
      {R"(root ::= ("a" | "bc")* "d"?)", "(a|bc)*d?", "abcd"},
      {R"(root ::= [a-c]+ "-" [^a-c]{2,3})", "[a-c]+-[^a-c]{2,3}", "ab-xy"},
      {"root ::= x{3} | x{0,1} \"b\"\nx ::= \"a\"", "aaa|a?b", "ab"},
      {R"(root ::= ("ab"){2,} "c")", "(ab){2,}c", "abc"},
      {"# comment\nroot ::= item (\",\" item)*  # trailing\nitem ::= [0-9]+\n", "[0-9]+(,[0-9]+)*",
       "01,"},
      {R"(root ::= "a" ("b" | "") "c"?)", "ab?c?", "abc"},
      {R"(root ::= ([ab] [ab]?)+)", "([ab][ab]?)+", "abc"},
      {R"(root ::= 'q' "\x41" [\-x])", "qA[-x]", "qAx-"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.gbnf);
    auto g = compile(c.gbnf);
    ASSERT_TRUE(g);
    const std::regex re(c.regex);
    for (const auto& s : all_strings(c.alphabet, 7))
      ASSERT_EQ(matches(g, s), std::regex_match(s, re)) << "'" << s << "'";
  }
}

TEST(GrammarTest, ContextFreeGrammarMatchesBalancedBrackets) {
  auto g = compile("root ::= (\"(\" root \")\" | \"[\" root \"]\")*");
  ASSERT_TRUE(g);
  // How many brackets s leaves open, or -1 when one closes what it did not open.
  auto open_count = [](const std::string& s) {
    std::string stack;
    for (char c : s) {
      if (c == '(' || c == '[') {
        stack += c;
      } else {
        if (stack.empty() || stack.back() != (c == ')' ? '(' : '[')) return -1;
        stack.pop_back();
      }
    }
    return static_cast<int>(stack.size());
  };
  auto balanced = [&](const std::string& s) { return open_count(s) == 0; };
  auto can_balance = [&](const std::string& s) { return open_count(s) >= 0; };
  for (const auto& s : all_strings("()[]", 8)) {
    ASSERT_EQ(matches(g, s), balanced(s)) << s;
    ASSERT_EQ(prefix(g, s), can_balance(s)) << s;
  }
  // Deep nesting: the stack grows with the input, right recursion does not.
  std::string deep(300, '(');
  deep += std::string(300, ')');
  EXPECT_TRUE(matches(g, deep));
  GrammarMatcher flat(compile(R"(root ::= [a]*)"));
  ASSERT_TRUE(flat.accept_bytes(std::string(100000, 'a')));
  EXPECT_TRUE(flat.can_end());
}

TEST(GrammarTest, ClassesMatchWellFormedUtf8Only) {
  auto any = compile("root ::= .");
  auto not_quote = compile(R"(root ::= [^"\\])");
  auto greek = compile(R"(root ::= [α-ω])");
  auto emoji = compile(R"(root ::= [\U0001F600-\U0001F64F] "\u00e9")");
  ASSERT_TRUE(any && not_quote && greek && emoji);
  for (const char* ok : {"a", "\x7f", "\xc2\x80", "\xdf\xbf", "\xe0\xa0\x80", "\xed\x9f\xbf",
                         "\xee\x80\x80", "\xef\xbf\xbf", "\xf0\x90\x80\x80", "\xf4\x8f\xbf\xbf"}) {
    EXPECT_TRUE(matches(any, ok)) << ok;
  }
  // Overlong forms, surrogates, beyond U+10FFFF, stray continuation bytes, truncated sequences.
  for (const char* bad :
       {"\xc0\x80", "\xc1\xbf", "\xe0\x80\x80", "\xed\xa0\x80", "\xed\xbf\xbf", "\xf0\x80\x80\x80",
        "\xf4\x90\x80\x80", "\xf5\x80\x80\x80", "\x80", "\xff", "\xe2\x82"}) {
    EXPECT_FALSE(matches(any, bad)) << ::testing::PrintToString(std::string(bad));
  }
  EXPECT_TRUE(matches(not_quote, "\xe2\x82\xac"));  // €
  EXPECT_FALSE(matches(not_quote, "\""));
  EXPECT_FALSE(matches(not_quote, "\\"));
  EXPECT_TRUE(matches(greek, "λ"));
  EXPECT_FALSE(matches(greek, "Λ"));
  EXPECT_TRUE(matches(emoji, "😀é"));
  EXPECT_FALSE(matches(emoji, "😀e"));
  EXPECT_FALSE(matches(emoji, "🙐é"));  // U+1F650
  // Every code point of a range and none outside it: [Ѐ-ӿ] (two-byte) and [ࠀ-ᅟ] (three-byte).
  auto cyr = compile("root ::= [\\u0400-\\u04FF]");
  ASSERT_TRUE(cyr);
  for (uint32_t cp = 0x300; cp < 0x600; ++cp) {
    std::string s;
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
    ASSERT_EQ(matches(cyr, s), cp >= 0x400 && cp <= 0x4FF) << cp;
  }
  auto wide = compile("root ::= [\\u0800-\\u115F]");
  ASSERT_TRUE(wide);
  for (uint32_t cp = 0x700; cp < 0x1200; ++cp) {
    std::string s;
    if (cp < 0x800) {
      s += char(0xC0 | (cp >> 6));
    } else {
      s += char(0xE0 | (cp >> 12));
      s += char(0x80 | ((cp >> 6) & 0x3F));
    }
    s += char(0x80 | (cp & 0x3F));
    ASSERT_EQ(matches(wide, s), cp >= 0x800 && cp <= 0x115F) << cp;
  }
}

TEST(GrammarTest, ErrorsNameTheProblemAndLine) {
  EXPECT_EQ(compile_error(""), "grammar: empty (expected rules like root ::= ...)");
  EXPECT_EQ(compile_error("item ::= \"a\""), "grammar: no rule named 'root' (the start rule)");
  EXPECT_EQ(compile_error("root ::= a\n\nb ::= \"x\""),
            "grammar line 1: rule 'a' is used but not defined");
  EXPECT_EQ(compile_error("root ::= \"a\"\nroot ::= \"b\""),
            "grammar line 2: rule 'root' is defined twice");
  EXPECT_EQ(compile_error("root ::= \"a\n\""),
            "grammar line 1: a newline inside a literal or class");
  EXPECT_EQ(compile_error("root ::= (\"a\"\n  | \"b\""), "grammar line 1: '(' is never closed");
  EXPECT_EQ(compile_error("root ::= \"a\" )"), "grammar line 1: unbalanced ')'");
  EXPECT_EQ(compile_error("root ::= \"\\q\""), "grammar line 1: unknown escape '\\q'");
  EXPECT_EQ(compile_error("root ::= [z-a]"), "grammar line 1: class range 7A-61 is backwards");
  EXPECT_EQ(compile_error("root ::= \"a\"{3,2}"), "grammar line 1: {3,2}: max below min");
  EXPECT_EQ(compile_error("root ::= \"\\uD800\""),
            "grammar line 1: U+D800 is not a Unicode scalar value");
  EXPECT_EQ(compile_error("root ::= \"a\"\nx :: \"b\""),
            "grammar line 2: unexpected ':' (a rule is defined as name ::= ...)");
  EXPECT_EQ(compile_error("root ::= \"a\" @"), "grammar line 1: unexpected character '@'");
  EXPECT_EQ(compile_error("root ::= \"a\"{5000}"),
            "grammar line 1: repetition count above the limit of 4096");
  // Left recursion: direct, through another rule, and through a rule that can be empty.
  EXPECT_EQ(compile_error("root ::= root \"a\" | \"b\""),
            "grammar: rule 'root' is left-recursive (it can reach itself without consuming input: "
            "root -> root)");
  EXPECT_EQ(
      compile_error("root ::= x\nx ::= y \"a\"\ny ::= x | \"b\""),
      "grammar: rule 'x' is left-recursive (it can reach itself without consuming input: x -> "
      "y -> x)");
  EXPECT_NE(compile_error("root ::= e root \"a\" | \"b\"\ne ::= \"x\"?").find("left-recursive"),
            std::string::npos);
  EXPECT_NE(compile_error("root ::= (\"a\"?)*").find("left-recursive"), std::string::npos);
  GrammarLimits small;
  small.max_elements = 50;
  EXPECT_EQ(compile_error("root ::= \"a\"{100}", small),
            "grammar line 1: more than the limit of 50 symbols once expanded");
  small.max_source_bytes = 4;
  EXPECT_EQ(compile_error("root ::= \"a\"", small), "grammar: 12 bytes, more than the limit of 4");
  EXPECT_EQ(compile_error("root ::= [\\xC3] [\\xA9]"), "(compiled)");  // raw bytes in classes
}

TEST(GrammarTest, HeadLimitStopsAnAmbiguousGrammar) {
  GrammarLimits lim;
  lim.max_heads = 64;
  // After n "a"s, 2^n stacks remember which closers ("b" or "c") each way still owes.
  auto g = Grammar::compile("root ::= \"a\" root \"b\" | \"a\" root \"c\" | \"\"", lim);
  ASSERT_TRUE(g) << g.error().message;
  GrammarMatcher m(*g);
  int taken = 0;
  while (taken < 20 && m.accept_bytes("a")) ++taken;
  EXPECT_EQ(taken, 4);  // 3 x 2^n heads: 48 after 4, 96 would pass the limit
  // Equal stacks made by different ways are one stack: an ambiguous but small grammar is not.
  auto flat = Grammar::compile("root ::= x*\nx ::= \"a\" y*\ny ::= \"a\" z*\nz ::= \"a\"", lim);
  ASSERT_TRUE(flat) << flat.error().message;
  GrammarMatcher f(*flat);
  EXPECT_TRUE(f.accept_bytes(std::string(200, 'a')));
  EXPECT_TRUE(f.can_end());
}

// A fixed generator for the random tests.
struct Rng {
  uint64_t s = 0x9E3779B97F4A7C15ull;
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  size_t below(size_t n) { return static_cast<size_t>(next() % n); }
};

// The walk's mask equals allows() token by token, at every step of a random walk through the
// grammar that picks allowed tokens.
void check_masks_along_walks(const std::shared_ptr<const Grammar>& g, const TokenVocab& vocab,
                             int walks, int max_steps, uint64_t seed) {
  Rng rng{seed};
  std::vector<uint8_t> mask;
  for (int w = 0; w < walks; ++w) {
    GrammarMatcher m(g);
    for (int step = 0; step < max_steps && !m.ended(); ++step) {
      const int64_t n = m.fill_mask(vocab, &mask);
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < vocab.size(); ++id) {
        ASSERT_EQ(mask[size_t(id)] != 0, m.allows(vocab, id))
            << "walk " << w << " step " << step << " token " << id << " '" << vocab.piece(id)
            << "'";
        if (mask[size_t(id)]) allowed.push_back(id);
      }
      ASSERT_EQ(n, static_cast<int64_t>(allowed.size()));
      if (allowed.empty()) break;
      const int32_t pick = allowed[rng.below(allowed.size())];
      ASSERT_TRUE(m.accept_token(vocab, pick));
    }
  }
}

const char* kJsonish = R"(
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null")
object ::= "{" ws ( string ":" ws value ws ("," ws string ":" ws value ws)* )? "}"
array  ::= "[" ws ( value ws ("," ws value ws)* )? "]"
string ::= "\"" ( [^"\\\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) )* "\""
number ::= "-"? ("0" | [1-9] [0-9]{0,15}) ("." [0-9]+)? ([eE] [-+]? [0-9]+)?
ws     ::= | " " | "\n" [ \t]{0,20}
)";

TEST(GrammarTest, MasksEqualTokenByTokenChecksOnARandomVocabulary) {
  Rng rng{7};
  const std::string alphabet = "{}[]\":,. \n0123456789-eEtrufalsn\\abcxyzé€";
  std::vector<std::string> pieces;
  std::set<std::string> seen;
  while (pieces.size() < 600) {
    std::string p;
    const size_t len = 1 + rng.below(5);
    for (size_t k = 0; k < len; ++k) p += alphabet[rng.below(alphabet.size())];
    pieces.push_back(p);  // duplicates and broken UTF-8 pieces included on purpose
  }
  for (int b = 0; b < 256; ++b) pieces.push_back(std::string(1, char(b)));  // byte tokens
  pieces.push_back("");                                                     // a control token
  pieces.push_back("");                                                     // the end token
  const int32_t eos = static_cast<int32_t>(pieces.size() - 1);
  TokenVocab vocab(pieces, {eos});
  auto g = compile(kJsonish);
  ASSERT_TRUE(g);
  check_masks_along_walks(g, vocab, 20, 60, 11);
  // Every walk that ends, ends with a JSON object the grammar accepts as a whole.
  GrammarMatcher m(g);
  std::vector<uint8_t> mask;
  m.fill_mask(vocab, &mask);
  EXPECT_FALSE(mask[size_t(eos)]);  // nothing written yet: the end token is not allowed
  ASSERT_TRUE(m.accept_bytes("{\"a\": [1, -2.5e3, \"x\\u00e9\"]}"));
  EXPECT_TRUE(m.can_end());
  EXPECT_FALSE(m.can_continue());
  EXPECT_EQ(m.fill_mask(vocab, &mask), 1);
  EXPECT_TRUE(mask[size_t(eos)]);
  EXPECT_TRUE(m.accept_token(vocab, eos));
  EXPECT_TRUE(m.ended());
  EXPECT_EQ(m.fill_mask(vocab, &mask), 0);
}

TEST(GrammarTest, AWalkPastItsStateLimitSaysSo) {
  GrammarLimits lim;
  lim.max_walk_states = 3;
  auto g = Grammar::compile(kJsonish, lim);
  ASSERT_TRUE(g) << g.error().message;
  std::vector<std::string> pieces = {"{", "\"", "a", "ab", "abc", "\"}", "x\":1}"};
  TokenVocab vocab(pieces, {});
  GrammarMatcher m(*g);
  ASSERT_TRUE(m.accept_bytes("{\"k"));
  std::vector<uint8_t> mask;
  EXPECT_EQ(m.fill_mask(vocab, &mask), -1);
  lim.max_walk_states = 1;  // a top walk inside a string makes few states: one is too few
  auto tight = Grammar::compile(kJsonish, lim);
  ASSERT_TRUE(tight);
  GrammarMatcher t(*tight);
  ASSERT_TRUE(t.accept_bytes("{\"k"));
  GrammarMatcher::TopMask top;
  bool refused = false;
  for (size_t i = 0; i < t.num_stacks(); ++i) refused |= !t.fill_top_mask(vocab, i, 3, &top);
  EXPECT_TRUE(refused);
  GrammarLimits little_work;
  little_work.max_walk_work = 2;  // stacks moved: the first token's bytes pass it
  auto busy = Grammar::compile(kJsonish, little_work);
  ASSERT_TRUE(busy);
  GrammarMatcher b(*busy);
  ASSERT_TRUE(b.accept_bytes("{\"k"));
  EXPECT_EQ(b.fill_mask(vocab, &mask), -1);
  lim.max_walk_states = 1000;
  auto roomy = Grammar::compile(kJsonish, lim);
  ASSERT_TRUE(roomy);
  GrammarMatcher r(*roomy);
  ASSERT_TRUE(r.accept_bytes("{\"k"));
  EXPECT_EQ(r.fill_mask(vocab, &mask), 6);  // all but "{"
}

TEST(GrammarTest, StateKeysAreEqualForEqualStates) {
  auto g = compile(kJsonish);
  ASSERT_TRUE(g);
  GrammarMatcher a(g), b(g), c(g);
  ASSERT_TRUE(a.accept_bytes("{\"ab"));
  ASSERT_TRUE(b.accept_bytes("{\"xyz"));
  ASSERT_TRUE(c.accept_bytes("{\"ab\": "));
  EXPECT_EQ(a.state_key(), b.state_key());  // inside the same string
  EXPECT_NE(a.state_key(), c.state_key());
  // A long string does not grow the state: the repetition is a loop.
  ASSERT_TRUE(b.accept_bytes(std::string(5000, 'q')));
  EXPECT_EQ(a.state_key(), b.state_key());
}

TEST(GrammarTest, MasksOnRealVocabularies) {
  TROUPE_SHARED_OR_SKIP(shared);
  for (const char* rel :
       {"/models/stories260K/stories260K.gguf", "/models/llama.cpp-vocab/ggml-vocab-gpt-2.gguf",
        "/models/llama.cpp-vocab/ggml-vocab-llama-spm.gguf"}) {
    SCOPED_TRACE(rel);
    auto file = model::GgufFile::open(shared + rel);
    ASSERT_TRUE(file) << file.error().message;
    auto tok = model::Tokenizer::from_gguf(**file);
    ASSERT_TRUE(tok) << tok.error().message;
    auto vocab = TokenVocab::of(**tok);
    auto g = compile(kJsonish);
    ASSERT_TRUE(g);
    check_masks_along_walks(g, *vocab, 2, vocab->size() > 10000 ? 6 : 30, 3);
  }
}

// GrammarSampling's draws (cached top masks, their undecided tokens, the greedy shortcut) equal
// the sampler's draws from logits masked by the whole walk, token for token, RNG state for RNG
// state, along whole replies.
void check_draws(const std::shared_ptr<const Grammar>& g, const std::string& source,
                 const std::shared_ptr<const TokenVocab>& vocab, float temperature, int frames,
                 int replies, int max_tokens) {
  GrammarSampling gs(vocab, size_t{64} << 20, frames);
  Rng rng{static_cast<uint64_t>(frames) * 977 + static_cast<uint64_t>(temperature * 10) + 1};
  std::vector<uint8_t> mask;
  for (int r = 0; r < replies; ++r) {
    SamplingParams p;
    p.temperature = temperature;
    p.top_p = 0.9f;
    p.seed = static_cast<uint64_t>(r) + 1;
    p.grammar = source;
    Sampler ours(p), reference(p);
    GrammarMatcher m(g);
    std::vector<int32_t> output;
    for (int t = 0; t < max_tokens; ++t) {
      std::vector<float> logits(static_cast<size_t>(vocab->size()));
      for (float& v : logits) v = static_cast<float>(rng.next() % 1000) * 0.01f;
      // Every other draw has its mask built ahead (as the stage does during the forward pass).
      if (t % 2 == 0) gs.prepare(1000 + r, p, output);
      auto got = gs.sample(1000 + r, p, output, ours, logits, {});
      ASSERT_TRUE(got) << got.error().message;
      m.fill_mask(*vocab, &mask);
      std::vector<float> masked = logits;
      for (size_t i = 0; i < masked.size(); ++i)
        if (!mask[i]) masked[i] = -INFINITY;
      const int32_t want = reference.sample(masked, {});
      ASSERT_EQ(*got, want) << "reply " << r << " token " << t;
      ASSERT_EQ(ours.state(), reference.state());
      ASSERT_TRUE(m.accept_token(*vocab, want));
      output.push_back(want);
      if (vocab->is_eog(want)) break;
    }
    gs.end_step();
  }
  EXPECT_GT(gs.stats().mask_hits + gs.stats().greedy_fast, 0);
  EXPECT_GT(gs.stats().prepared, 0);
}

TEST(GrammarSamplingTest, DrawsEqualTheWholeWalksMaskedDraws) {
  Rng rng{21};
  const std::string alphabet = "{}[]\":,. 0123456789-eEtrufalsn\\abcxyz";
  std::vector<std::string> pieces;
  while (pieces.size() < 400) {
    std::string p;
    const size_t len = 1 + rng.below(4);
    for (size_t k = 0; k < len; ++k) p += alphabet[rng.below(alphabet.size())];
    pieces.push_back(p);
  }
  for (int b = 0; b < 256; ++b) pieces.push_back(std::string(1, char(b)));
  pieces.push_back("");
  auto vocab =
      std::make_shared<const TokenVocab>(pieces, std::vector<int32_t>{int32_t(pieces.size() - 1)});
  auto g = compile(kJsonish);
  ASSERT_TRUE(g);
  for (int frames : {1, 2, 3, 6}) {
    SCOPED_TRACE(frames);
    check_draws(g, kJsonish, vocab, 0.0f, frames, 3, 40);
    check_draws(g, kJsonish, vocab, 1.0f, frames, 3, 40);
  }
}

TEST(GrammarSamplingTest, ErrorsNameTheReplyAndTheGrammar) {
  auto vocab = std::make_shared<const TokenVocab>(std::vector<std::string>{"a", "b", ""},
                                                  std::vector<int32_t>{2});
  GrammarSampling gs(vocab);
  SamplingParams p;
  p.grammar = "root ::= \"a\"+";
  Sampler s(p);
  const std::vector<float> logits = {0.f, 5.f, 1.f};
  auto a = gs.sample(1, p, {}, s, logits, {});
  ASSERT_TRUE(a) << a.error().message;
  EXPECT_EQ(*a, 0);  // "b" is better but not allowed
  const std::vector<int32_t> strayed = {0, 1};
  auto b = gs.sample(1, p, strayed, s, logits, {});
  ASSERT_FALSE(b);
  EXPECT_EQ(b.error().message, "the reply's token 1 (id 1, 'b') does not follow its grammar");
  p.grammar = "root ::= c";
  auto c = gs.sample(2, p, {}, s, logits, {});
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().message, "grammar line 1: rule 'c' is used but not defined");
  p.grammar = "root ::= \"z\"";  // no token writes a z
  auto z = gs.sample(3, p, {}, s, logits, {});
  ASSERT_FALSE(z);
  EXPECT_EQ(z.error().message,
            "the grammar allows no token of the vocabulary after the reply's 0 tokens");
  // After "a" the end token is allowed; a sequence is rebuilt when its reply is not the one kept.
  const std::vector<int32_t> one = {0};
  const std::vector<float> prefer_end = {0.f, 0.f, 9.f};
  p.grammar = "root ::= \"a\"+";
  auto e = gs.sample(1, p, one, s, prefer_end, {});
  ASSERT_TRUE(e) << e.error().message;
  EXPECT_EQ(*e, 2);
}

}  // namespace
}  // namespace troupe::compute
