// Pre-tokenizer splitter tests: for each regex set, words as llama.cpp's regexes (with their
// std::regex "collapsed" class semantics) split them. The expectations come from a Python re
// oracle that spells each \p{..} class out for the characters of the input.
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
  EXPECT_FALSE(pre_tokenizer_info("qwen2")->clean_spaces);
  EXPECT_EQ(pre_tokenizer_info("deepseek-v3")->pre, P::kDeepseekV3);
  EXPECT_EQ(pre_tokenizer_info("")->pre, P::kDefault);
  EXPECT_FALSE(pre_tokenizer_info("no-such-pre"));
}

TEST(TokenizerUnicode, ClassesAndLenientUtf8) {
  EXPECT_TRUE(cp_flags('a') & kCpLetter);
  EXPECT_TRUE(cp_flags(0x0663) & kCpNumber);  // ARABIC-INDIC DIGIT THREE
  EXPECT_TRUE(cp_flags(0x3000) & kCpWhitespace);
  EXPECT_FALSE(cp_flags(0x1C) & kCpWhitespace);  // not White_Space, unlike str.isspace()
  EXPECT_EQ(cp_flags(0x0378), kCpUndefined);     // unassigned
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
