// Kimi-K2's pre-tokenizer ("kimi-k2") in a real byte-level BPE vocabulary: the GPT-2 vocabulary
// GGUF given tokenizer.ggml.pre = "kimi-k2" loads, round-trips text, and never lets a token
// cross a boundary of Kimi-K2's pieces (the splits themselves: tokenizer_pretok_test.cc).
#include <algorithm>
#include <string>
#include <vector>

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace troupe::model
