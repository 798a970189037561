// Pre-tokenizer splitter tests: for each regex set, words as llama.cpp's regexes (with their
// std::regex "collapsed" class semantics) split them, and Kimi-K2's as the model's own pattern
// does, and o200k's (gpt-oss) as tiktoken's pattern does. The expectations come from a Python re
// oracle that spells each \p{..} class out for the characters of the input (for Kimi-K2 and
// o200k: scripts/pretok_oracle_kimi.py).
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/detail/tokenizer_vocab.h"
#include "model/detail/unicode.h"

namespace troupe::model::detail {
namespace {

using P = PreTokenizer;

struct SplitCase {
  PreTokenizer pre;
  const char* text;
  std::vector<std::string> words;
};

const SplitCase kCases[] = {
    // o200k (gpt-oss): expectations from scripts/pretok_oracle_kimi.py --gpt-4o.
    {P::kGpt4o, "Hello world", {"Hello", " world"}},
    {P::kGpt4o, "getUserName HTTPServer", {"get", "User", "Name", " HTTPServer"}},
    {P::kGpt4o, "\u4f60\u597d\u4e16\u754cabc", {"\u4f60\u597d\u4e16\u754cabc"}},
    {P::kGpt4o, "a/b\n/c", {"a", "/b", "\n", "/c"}},
    {P::kGpt4o, "!!\n/x", {"!!\n/", "x"}},
    {P::kGpt4o, "12345 don't I'M", {"123", "45", " don't", " I'M"}},
    {P::kGpt4o, "e\u0301 \u00e7a\u0301b", {"e\u0301", " \u00e7a\u0301b"}},
    {P::kGpt4o, "  \n\n  x ", {"  \n\n", " ", " x", " "}},
    {P::kGpt4o, "$100 + <tag> ^_^", {"$", "100", " +", " <", "tag", ">", " ^_^"}},
    {P::kGpt4o,
     "\u65e5\u672c\u8a9e\u30c6 \u30ab\u30bfABCdef",
     {"\u65e5\u672c\u8a9e\u30c6", " \u30ab\u30bfABCdef"}},
    {P::kGpt4o,
     "path/to/file.txt\n//comment",
     {"path", "/to", "/file", ".txt", "\n", "//", "comment"}},
    {P::kGpt4o, "\u3000abc\u3000 \u3000", {"\u3000abc", "\u3000 \u3000"}},
    {P::kGpt2, "Hello'S World's  \n\n  x", {"Hello", "'", "S", " World", "'s", "  \n\n ", " x"}},
    {P::kGpt2, "123456789 abc", {"123456789", " abc"}},
    {P::kGpt2, "a~b ~~c", {"a", "~", "b", " ~~", "c"}},
    {P::kGpt2, "e\u0301 \u00e7a\u0301b", {"e", "\u0301", " \u00e7a", "\u0301", "b"}},
    {P::kGpt2, "\u3000abc\u3000 \u3000", {"\u3000", "abc", "\u3000 \u3000"}},
    {P::kGpt2,
     "\u65e5\u672c\u8a9e\u30c6 \u30ab\u30bf",
     {"\u65e5\u672c\u8a9e\u30c6", " \u30ab\u30bf"}},
    {P::kGpt2, "$100 + <tag> ^_^", {"$", "100", " +", " <", "tag", ">", " ^_^"}},
    {P::kGpt2, "\r\n\r\n a \r\n", {"\r\n\r\n", " a", " \r\n"}},
    {P::kLlama3, "Hello'S World's  \n\n  x", {"Hello", "'S", " World", "'s", "  \n\n", " ", " x"}},
    {P::kLlama3, "123456789 abc", {"123", "456", "789", " abc"}},
    {P::kLlama3, "a~b ~~c", {"a", "~b", " ~~", "c"}},
    {P::kLlama3, "e\u0301 \u00e7a\u0301b", {"e", "\u0301", " \u00e7a", "\u0301b"}},
    {P::kLlama3, "\u3000abc\u3000 \u3000", {"\u3000abc", "\u3000 \u3000"}},
    {P::kLlama3,
     "\u65e5\u672c\u8a9e\u30c6 \u30ab\u30bf",
     {"\u65e5\u672c\u8a9e\u30c6", " \u30ab\u30bf"}},
    {P::kLlama3, "$100 + <tag> ^_^", {"$", "100", " +", " <", "tag", ">", " ^_^"}},
    {P::kLlama3, "\r\n\r\n a \r\n", {"\r\n\r\n", " a", " \r\n"}},
    {P::kQwen2, "Hello'S World's  \n\n  x", {"Hello", "'S", " World", "'s", "  \n\n", " ", " x"}},
    {P::kQwen2, "123456789 abc", {"1", "2", "3", "4", "5", "6", "7", "8", "9", " abc"}},
    {P::kQwen2, "a~b ~~c", {"a", "~b", " ~~", "c"}},
    {P::kQwen2, "e\u0301 \u00e7a\u0301b", {"e", "\u0301", " \u00e7a", "\u0301b"}},
    {P::kQwen2, "\u3000abc\u3000 \u3000", {"\u3000abc", "\u3000 \u3000"}},
    {P::kQwen2,
     "\u65e5\u672c\u8a9e\u30c6 \u30ab\u30bf",
     {"\u65e5\u672c\u8a9e\u30c6", " \u30ab\u30bf"}},
    {P::kQwen2, "$100 + <tag> ^_^", {"$", "1", "0", "0", " +", " <", "tag", ">", " ^_^"}},
    {P::kQwen2, "\r\n\r\n a \r\n", {"\r\n\r\n", " a", " \r\n"}},
    {P::kDeepseekLlm,
     "Hello'S World's  \n\n  x",
     {"Hello", "'", "S", " World", "'", "s", "  ", "\n", "\n", " ", " x"}},
    {P::kDeepseekLlm, "123456789 abc", {"123456789", " abc"}},
    {P::kDeepseekLlm, "a~b ~~c", {"a", "~", "b", " ~~", "c"}},
    {P::kDeepseekLlm, "e\u0301 \u00e7a\u0301b", {"e", "\u0301", " \u00e7", "a", "\u0301", "b"}},
    {P::kDeepseekLlm, "\u3000abc\u3000 \u3000", {"\u3000abc", "\u3000 \u3000"}},
    {P::kDeepseekLlm,
     "\u65e5\u672c\u8a9e\u30c6 \u30ab\u30bf",
     {"\u65e5\u672c\u8a9e\u30c6", " ", "\u30ab\u30bf"}},
    {P::kDeepseekLlm, "$100 + <tag> ^_^", {"$", "100", " +", " <", "tag", ">", " ^_^"}},
    {P::kDeepseekLlm, "\r\n\r\n a \r\n", {"\r", "\n", "\r", "\n", " a", " ", "\r", "\n"}},
    {P::kDeepseekV3,
     "Hello'S World's  \n\n  x",
     {"Hello", "'S", " World", "'s", "  \n\n", " ", " x"}},
    {P::kDeepseekV3, "123456789 abc", {"123", "456", "789", " abc"}},
    {P::kDeepseekV3, "a~b ~~c", {"a", "~b", " ", "~", "~c"}},
    {P::kDeepseekV3, "e\u0301 \u00e7a\u0301b", {"e\u0301", " \u00e7a\u0301b"}},
    {P::kDeepseekV3, "\u3000abc\u3000 \u3000", {"\u3000abc", "\u3000 \u3000"}},
    {P::kDeepseekV3,
     "\u65e5\u672c\u8a9e\u30c6 \u30ab\u30bf",
     {"\u65e5\u672c\u8a9e\u30c6", " ", "\u30ab\u30bf"}},
    {P::kDeepseekV3, "$100 + <tag> ^_^", {"$", "100", " +", " <", "tag", ">", " ^_^"}},
    {P::kDeepseekV3, "\r\n\r\n a \r\n", {"\r\n\r\n", " a", " \r\n"}},
    // Kimi-K2: expectations from scripts/pretok_oracle_kimi.py (Python re on Moonshot's pattern).
    {P::kKimiK2,
     "getUserName iPhone XMLHttpRequest",
     {"get", "User", "Name", " i", "Phone", " XMLHttp", "Request"}},
    {P::kKimiK2, "HELLO world ABCdef ABC123", {"HELLO", " world", " ABCdef", " ABC", "123"}},
    {P::kKimiK2,
     "I'M HERE'S don't WE'LL they've",
     {"I'M", " HERE'S", " don't", " WE'LL", " they've"}},
    {P::kKimiK2,
     "12345 3.14159 \u0663\u0664\u0665\u0666",
     {"123", "45", " ", "3", ".", "141", "59", " ", "\u0663\u0664\u0665", "\u0666"}},
    {P::kKimiK2,
     "\u4f60\u597d\u4e16\u754chello Hello\u4f60\u597d \u6f22\u5b57\u304b\u306a",
     {"\u4f60\u597d\u4e16\u754c", "hello", " Hello", "\u4f60\u597d", " ", "\u6f22\u5b57",
      "\u304b\u306a"}},
    {P::kKimiK2,
     "\u3072\u3089\u304c\u306a\u30ab\u30bf\u30ab\u30ca \uc548\ub155\ud558\uc138\uc694",
     {"\u3072\u3089\u304c\u306a\u30ab\u30bf\u30ab\u30ca", " \uc548\ub155\ud558\uc138\uc694"}},
    {P::kKimiK2,
     "\u0645\u0631\u062d\u0628\u0627 \u0628\u0643",
     {"\u0645\u0631\u062d\u0628\u0627", " \u0628\u0643"}},
    {P::kKimiK2,
     "e\u0301 \u00e7a\u0301b \u00dcn\u00efc\u00f6d\u00e9",
     {"e\u0301", " \u00e7a\u0301b", " \u00dcn\u00efc\u00f6d\u00e9"}},
    {P::kKimiK2, "a.b\n\nc  \n  x", {"a", ".b", "\n\n", "c", "  \n", " ", " x"}},
    {P::kKimiK2, "hello  world   ", {"hello", " ", " world", "   "}},
    {P::kKimiK2,
     "$100 + <tag> ^_^ #include",
     {"$", "100", " +", " <", "tag", ">", " ^_^", " #", "include"}},
    {P::kKimiK2, "\r\n\r\n a \r\n", {"\r\n\r\n", " a", " \r\n"}},
    {P::kKimiK2,
     "\u01c5ungla \u01c4UNGLA \u02b0h \u3005\u3007 \u2e80x",
     {"\u01c5ungla", " \u01c4UNGLA", " \u02b0h", " ", "\u3005\u3007", " \u2e80", "x"}},
    {P::kKimiK2,
     "foo_bar.baz(QUX) // \u00bfQu\u00e9?",
     {"foo", "_bar", ".baz", "(QUX", ")", " //", " \u00bf", "Qu\u00e9", "?"}},
    {P::kKimiK2, "\u3000abc\u3000 \u3000", {"\u3000abc", "\u3000 \u3000"}},
    {P::kKimiK2, "\u0301abc \u0301\u0301", {"\u0301abc", " \u0301\u0301"}},
    // Found by a differential run (7000 random strings, scripts/pretok_oracle_kimi.py): a mark
    // may be the prefix character, but the lower-case alternative without it comes first.
    {P::kKimiK2, "\u0301A", {"\u0301", "A"}},
    {P::kKimiK2,
     "2\u00e9#\u3005\u0301Z3\u0645",
     {"2", "\u00e9", "#", "\u3005", "\u0301", "Z", "3", "\u0645"}},
    {P::kKimiK2,
     "ZAaB\u06631.T\n\u0301S!",
     {"ZAa", "B", "\u06631", ".T", "\n", "\u0301", "S", "!"}},
    {P::kKimiK2, "\u0e01\u0e31\u0e01 A\u0308b", {"\u0e01\u0e31\u0e01", " A\u0308b"}},
    {P::kKimiK2, "x\u2160\u2161\u2162\u2163", {"x", "\u2160\u2161\u2162", "\u2163"}},
    // Qwen3.5's: combining marks stay in their words (decomposed Latin, Thai, Devanagari) and
    // leave the punctuation runs. Each expected split is what Python's `regex` module gives for
    // the pattern of Qwen3.5's tokenizer.json.
    {P::kQwen35, "e\u0301t\u00e9 na\u0308ive", {"e\u0301t\u00e9", " na\u0308ive"}},
    {P::kQwen35,
     "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a \u0e1c\u0e21",
     {"\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a", " \u0e1c\u0e21"}},
    {P::kQwen35,
     "\u0915\u093f\u0924\u093e\u092c, \u0939\u093f\u0902\u0926\u0940",
     {"\u0915\u093f\u0924\u093e\u092c", ",", " \u0939\u093f\u0902\u0926\u0940"}},
    {P::kQwen35, "x!\u0301?", {"x", "!\u0301", "?"}},
    {P::kQwen35, "a!!\u0301b", {"a", "!!", "\u0301b"}},
    {P::kQwen35, "a ?!\u0301\u0301", {"a", " ?!", "\u0301\u0301"}},
    {P::kQwen35, "12\u0661 ab", {"1", "2", "\u0661", " ab"}},
    {P::kQwen35, "I'M ok\n\n  x", {"I", "'M", " ok", "\n\n", " ", " x"}},
    {P::kQwen35, "a  \u0301\u0301 b.\u0301\n", {"a", " ", " \u0301\u0301", " b", ".\u0301", "\n"}},
    // Qwen2's splits the same word at its mark (which becomes the next piece's prefix).
    {P::kQwen2, "e\u0301t\u00e9", {"e", "\u0301t\u00e9"}},
    // Tekken (Mistral): each expectation is what Python's regex module gives for the pattern of
    // the models' tokenizer.json. o200k's cases with contractions and numbers split apart;
    // capitals beyond ASCII (llama.cpp's [^a-z] approximation would split "\u00c9COLE" as
    // "\u00c9", "COLE"), titlecase (\u01c5) and modifier letters (\u02b0).
    {P::kTekken, "Hello world", {"Hello", " world"}},
    {P::kTekken, "getUserName HTTPServer", {"get", "User", "Name", " HTTPServer"}},
    {P::kTekken, "12345 don't I'M", {"1", "2", "3", "4", "5", " don", "'t", " I", "'M"}},
    {P::kTekken,
     "\u00c9COLE \u00e9cole \u00c9cOLE",
     {"\u00c9COLE", " \u00e9cole", " \u00c9c", "OLE"}},
    {P::kTekken, "\u01c5ungla \u01c4UNGLA x\u02b0y", {"\u01c5ungla", " \u01c4UNGLA", " x\u02b0y"}},
    {P::kTekken, "e\u0301 \u00e7a\u0301b", {"e\u0301", " \u00e7a\u0301b"}},
    {P::kTekken, "a/b\n/c", {"a", "/b", "\n", "/c"}},
    {P::kTekken, "!!\n/x", {"!!\n/", "x"}},
    {P::kTekken, "  \n\n  x ", {"  \n\n", " ", " x", " "}},
    {P::kTekken, "$100 + <tag> ^_^", {"$", "1", "0", "0", " +", " <", "tag", ">", " ^_^"}},
    {P::kTekken, "\u4f60\u597d\u4e16\u754cabc", {"\u4f60\u597d\u4e16\u754cabc"}},
    {P::kTekken, "\u0661\u0662 3\u00bd", {"\u0661", "\u0662", " ", "3", "\u00bd"}},
    {P::kTekken, "x\u2019s we'll", {"x", "\u2019s", " we", "'ll"}},
};

std::vector<std::string> split_words(PreTokenizer pre, const std::string& text) {
  const std::vector<uint32_t> cps = utf8_to_codepoints(text);
  std::vector<size_t> lengths;
  pre_split(pre, cps, &lengths);
  std::vector<std::string> words;
  size_t start = 0;
  for (size_t len : lengths) {
    std::string w;
    for (size_t i = start; i < start + len; ++i) append_utf8(&w, cps[i]);
    words.push_back(w);
    start += len;
  }
  EXPECT_EQ(start, cps.size());
  return words;
}

TEST(TokenizerPreSplit, MatchesRegexSemantics) {
  for (const SplitCase& c : kCases) {
    EXPECT_EQ(split_words(c.pre, c.text), c.words)
        << "pre " << static_cast<int>(c.pre) << ": " << c.text;
  }
}

TEST(TokenizerPreSplit, NamesSelectRegexSetsAndFlags) {
  ASSERT_TRUE(pre_tokenizer_info("llama-bpe"));
  EXPECT_EQ(pre_tokenizer_info("llama-bpe")->pre, P::kLlama3);
  EXPECT_TRUE(pre_tokenizer_info("llama-bpe")->ignore_merges);
  EXPECT_TRUE(pre_tokenizer_info("llama-bpe")->add_bos);
  EXPECT_EQ(pre_tokenizer_info("qwen2")->pre, P::kQwen2);
  ASSERT_TRUE(pre_tokenizer_info("qwen35"));
  EXPECT_EQ(pre_tokenizer_info("qwen35")->pre, P::kQwen35);
  EXPECT_FALSE(pre_tokenizer_info("qwen35")->clean_spaces);
  EXPECT_FALSE(pre_tokenizer_info("qwen2")->clean_spaces);
  EXPECT_EQ(pre_tokenizer_info("deepseek-v3")->pre, P::kDeepseekV3);
  ASSERT_TRUE(pre_tokenizer_info("tekken"));  // as llama.cpp sets it
  EXPECT_EQ(pre_tokenizer_info("tekken")->pre, P::kTekken);
  EXPECT_FALSE(pre_tokenizer_info("tekken")->clean_spaces);
  EXPECT_TRUE(pre_tokenizer_info("tekken")->ignore_merges);
  EXPECT_TRUE(pre_tokenizer_info("tekken")->add_bos);
  ASSERT_TRUE(pre_tokenizer_info("gpt-4o"));
  EXPECT_EQ(pre_tokenizer_info("gpt-4o")->pre, P::kGpt4o);
  EXPECT_FALSE(pre_tokenizer_info("gpt-4o")->clean_spaces);
  EXPECT_FALSE(pre_tokenizer_info("gpt-4o")->ignore_merges);
  ASSERT_TRUE(pre_tokenizer_info("kimi-k2"));
  EXPECT_EQ(pre_tokenizer_info("kimi-k2")->pre, P::kKimiK2);
  EXPECT_TRUE(pre_tokenizer_info("kimi-k2")->ignore_merges);  // tiktoken's rule
  EXPECT_FALSE(pre_tokenizer_info("kimi-k2")->clean_spaces);
  EXPECT_EQ(pre_tokenizer_info("")->pre, P::kDefault);
  EXPECT_FALSE(pre_tokenizer_info("no-such-pre"));
}

TEST(TokenizerUnicode, ClassesAndLenientUtf8) {
  EXPECT_TRUE(cp_flags('a') & kCpLetter);
  EXPECT_TRUE(cp_flags(0x0663) & kCpNumber);  // ARABIC-INDIC DIGIT THREE
  EXPECT_TRUE(cp_flags(0x3000) & kCpWhitespace);
  EXPECT_FALSE(cp_flags(0x1C) & kCpWhitespace);  // not White_Space, unlike str.isspace()
  EXPECT_EQ(cp_flags(0x0378), kCpUndefined);     // unassigned
  // Letter sub-classes and the Han script (Kimi-K2's pattern).
  EXPECT_TRUE(cp_flags('A') & kCpUpper);
  EXPECT_TRUE(cp_flags(0x01C5) & kCpUpper);  // Lt
  EXPECT_TRUE(cp_flags('a') & kCpLower);
  EXPECT_FALSE(cp_flags(0x02B0) & (kCpUpper | kCpLower));           // Lm
  EXPECT_FALSE(cp_flags(0x3042) & (kCpUpper | kCpLower | kCpHan));  // hiragana: Lo, not Han
  EXPECT_TRUE(cp_flags(0x4E00) & kCpHan);
  EXPECT_TRUE(cp_flags(0x2E80) & kCpHan);   // a CJK radical: So, script Han
  EXPECT_TRUE(cp_flags(0x20000) & kCpHan);  // extension B (past the BMP table)
  EXPECT_FALSE(cp_flags('A') & kCpHan);
  EXPECT_EQ(cp_flags(0x110000), kCpUndefined);
  EXPECT_EQ(utf8_to_codepoints("a\xff\xe2\x82"),
            (std::vector<uint32_t>{'a', 0xFFFD, 0xFFFD, 0xFFFD}));
  EXPECT_EQ(utf8_valid_prefix("\xe2\x82"), -1);
  EXPECT_EQ(utf8_valid_prefix("\xe2\x82\xac"), 3);
  EXPECT_EQ(utf8_valid_prefix("\xc0\x80"), 0);
  EXPECT_EQ(gpt2_byte_to_utf8(' '), "\xc4\xa0");  // "Ġ"
  EXPECT_EQ(gpt2_codepoint_to_byte(0x120), ' ');
}

}  // namespace
}  // namespace troupe::model::detail
