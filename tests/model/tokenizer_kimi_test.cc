// Kimi-K2's tokenizer in a real byte-level BPE vocabulary: the GPT-2 vocabulary GGUF given
// tokenizer.ggml.pre = "kimi-k2" loads, round-trips text, and never lets a token cross a boundary
// of Kimi-K2's pieces (the splits themselves: tokenizer_pretok_test.cc); the same vocabulary
// written as a tiktoken.model (Kimi-K2's Hugging Face form) tokenizes exactly like that GGUF,
// its merges derived from the ranks; malformed tiktoken files get errors naming file and line.
#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/detail/tokenizer_vocab.h"
#include "model/detail/unicode.h"
#include "model/gguf.h"
#include "model/gguf_writer.h"
#include "model/tokenizer.h"
#include "tests/edited_model.h"
#include "tests/test_support.h"

namespace troupe::model {
namespace {

// Byte offsets at which Kimi-K2's pre-tokenizer ends a piece of `text`.
std::vector<size_t> piece_ends(const std::string& text) {
  const std::vector<uint32_t> cps = detail::utf8_to_codepoints(text);
  std::vector<size_t> lengths;
  detail::pre_split(detail::PreTokenizer::kKimiK2, cps, &lengths);
  std::vector<size_t> ends;
  size_t cp = 0, bytes = 0;
  for (size_t len : lengths) {
    for (size_t i = cp; i < cp + len; ++i) {
      std::string u;
      detail::append_utf8(&u, cps[i]);
      bytes += u.size();
    }
    cp += len;
    ends.push_back(bytes);
  }
  return ends;
}

TEST(TokenizerKimi, Gpt2VocabularyWithKimiPiecesRoundTripsAndKeepsPieceBoundaries) {
  TROUPE_SHARED_OR_SKIP(shared);
  testing::TempDir dir;
  const std::string path = testing::edited_gguf(
      dir, "kimi.gguf", shared + "/models/llama.cpp-vocab/ggml-vocab-gpt-2.gguf",
      [](GgufWriter& w) { w.set_string("tokenizer.ggml.pre", "kimi-k2"); });
  ASSERT_FALSE(path.empty());
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.has_value()) << f.error().message;
  auto tok = Tokenizer::from_gguf(**f);
  ASSERT_TRUE(tok.has_value()) << tok.error().message;
  for (const std::string text :
       {"getUserName said: I'M HERE, don't panic!", "\u4f60\u597d\u4e16\u754chello World 12345",
        "XMLHttpRequest\n\n  indented\tcode();", "caf\u00e9 na\u0131\u0308ve \u00dcBER"}) {
    SCOPED_TRACE(text);
    const std::vector<int32_t> ids = (*tok)->encode(text, /*add_special=*/false);
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ((*tok)->decode(ids), text);
    // Every piece end is a token end.
    std::vector<size_t> token_ends;
    size_t at = 0;
    for (int32_t id : ids) token_ends.push_back(at += (*tok)->token_to_piece(id).size());
    for (size_t e : piece_ends(text))
      EXPECT_NE(std::find(token_ends.begin(), token_ends.end(), e), token_ends.end())
          << "no token ends at byte " << e;
  }
  // camelCase splits where llama.cpp's kimi-k2 splitter would not: "get" | "User" | "Name".
  const std::vector<int32_t> ids = (*tok)->encode("getUserName", false);
  std::string joined;
  std::vector<std::string> pieces;
  for (int32_t id : ids) pieces.push_back((*tok)->token_to_piece(id));
  ASSERT_GE(pieces.size(), 3u);
  for (const std::string& p : pieces) joined += p;
  EXPECT_EQ(joined, "getUserName");
  EXPECT_EQ(piece_ends("getUserName"), (std::vector<size_t>{3, 7, 11}));
}

// ---- tiktoken.model ----

std::string base64(const std::string& bytes) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t w = static_cast<uint8_t>(bytes[i]) << 16;
    if (i + 1 < bytes.size()) w |= static_cast<uint8_t>(bytes[i + 1]) << 8;
    if (i + 2 < bytes.size()) w |= static_cast<uint8_t>(bytes[i + 2]);
    out += kAlphabet[w >> 18 & 63];
    out += kAlphabet[w >> 12 & 63];
    out += i + 1 < bytes.size() ? kAlphabet[w >> 6 & 63] : '=';
    out += i + 2 < bytes.size() ? kAlphabet[w & 63] : '=';
  }
  return out;
}

// GPT-2's tokenizer.json vocabulary as tiktoken ranks (id = rank; <|endoftext|>, 50256, as a
// special token after them, with a gap of reserved ids before a second one), in a Kimi-style
// Hugging Face directory.
void write_tiktoken_dir(const std::string& shared, const testing::TempDir& dir) {
  std::ifstream in(shared + "/models/hf/gpt2-tokenizer/tokenizer.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  std::vector<std::string> lines;
  for (const auto& [text, id] : j["model"]["vocab"].items()) {
    if (text == "<|endoftext|>") continue;
    std::string bytes;
    for (uint32_t cp : detail::utf8_to_codepoints(text)) {
      const int b = detail::gpt2_codepoint_to_byte(cp);
      ASSERT_GE(b, 0) << text;
      bytes.push_back(static_cast<char>(b));
    }
    lines.push_back(base64(bytes) + " " + std::to_string(id.get<int>()));
  }
  std::string file;
  for (const std::string& l : lines) file += l + "\n";
  dir.write("tiktoken.model", file);
  dir.write("tokenization_kimi.py",
            "# the model's tokenizer code (its presence names the pattern)\n");
  dir.write("tokenizer_config.json",
            R"({"added_tokens_decoder": {"50256": {"content": "<|endoftext|>", "special": true},)"
            R"( "50260": {"content": "<|im_end|>", "special": true}},)"
            R"( "eos_token": "<|endoftext|>", "tokenizer_class": "TikTokenTokenizer"})");
}

TEST(TokenizerKimi, TiktokenFileTokenizesLikeTheGgufVocabulary) {
  TROUPE_SHARED_OR_SKIP(shared);
  testing::TempDir dir, hf;
  write_tiktoken_dir(shared, hf);
  auto tik = Tokenizer::from_hf_dir(hf.path());
  ASSERT_TRUE(tik.has_value()) << tik.error().message;
  const std::string path = testing::edited_gguf(
      dir, "kimi.gguf", shared + "/models/llama.cpp-vocab/ggml-vocab-gpt-2.gguf",
      [](GgufWriter& w) { w.set_string("tokenizer.ggml.pre", "kimi-k2"); });
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.has_value()) << f.error().message;
  auto gguf = Tokenizer::from_gguf(**f);
  ASSERT_TRUE(gguf.has_value()) << gguf.error().message;
  EXPECT_EQ((*tik)->n_vocab(), 50261);
  EXPECT_EQ((*tik)->eos_id(), 50256);
  EXPECT_EQ((*tik)->token_to_piece(50258, /*render_special=*/true), "<|reserved_token_50258|>");
  EXPECT_EQ((*tik)->token_to_piece(50260, true), "<|im_end|>");
  std::vector<std::string> texts = {"getUserName said: I'M HERE, don't panic!",
                                    "\u4f60\u597d\u4e16\u754chello World 12345",
                                    "XMLHttpRequest\n\n  indented\tcode();"};
  std::ifstream golden(shared + "/golden/tokenizer/gpt-2.jsonl");
  for (std::string line; std::getline(golden, line);)
    texts.push_back(nlohmann::json::parse(line).at("text").get<std::string>());
  for (const std::string& text : texts) {
    SCOPED_TRACE(text);
    EXPECT_EQ((*tik)->encode(text, false), (*gguf)->encode(text, false));
  }
  // The special token is parsed when asked.
  EXPECT_EQ((*tik)->encode("a<|im_end|>", false, /*parse_special=*/true).back(), 50260);
}

std::string tiktoken_error(const std::string& file, bool with_code = true) {
  testing::TempDir d;
  d.write("tiktoken.model", file);
  if (with_code) d.write("tokenization_kimi.py", "");
  auto t = Tokenizer::from_hf_dir(d.path());
  EXPECT_FALSE(t.has_value());
  if (t) return "";
  const std::string prefix = d.path() + "/";
  std::string m = t.error().message;
  return m.starts_with(prefix) ? m.substr(prefix.size()) : m;
}

TEST(TokenizerKimi, MalformedTiktokenFiles) {
  EXPECT_EQ(tiktoken_error("YQ== 0\n", /*with_code=*/false),
            "tiktoken.model: a tiktoken vocabulary's split pattern is in its model's code; troupe "
            "knows Kimi-K2's (tokenization_kimi.py), which this directory does not have");
  EXPECT_EQ(tiktoken_error("YQ== 0\nYg==\n"),
            "tiktoken.model:2: expected \"<base64 bytes> <rank>\"");
  EXPECT_EQ(tiktoken_error("YQ== 0\nY!== 1\n"),
            "tiktoken.model:2: token bytes are not valid base64");
  EXPECT_EQ(tiktoken_error("YQ= 0\n"), "tiktoken.model:1: token bytes are not valid base64");
  EXPECT_EQ(tiktoken_error("YQ== x1\n"),
            "tiktoken.model:1: rank \"x1\" is not an integer below 2^24");
  EXPECT_EQ(tiktoken_error("YQ== 99999999999\n"),
            "tiktoken.model:1: rank \"99999999999\" is not an integer below 2^24");
  EXPECT_EQ(tiktoken_error("YQ== 0\nYg== 0\n"), "tiktoken.model:2: rank 0 appears twice");
  EXPECT_EQ(tiktoken_error("YQ== 0\nYQ== 1\n"),
            "tiktoken.model:2: the same bytes appear twice (ranks 0 and 1)");
  EXPECT_EQ(tiktoken_error("\n\n"), "tiktoken.model: no tokens");
}

}  // namespace
}  // namespace troupe::model
