// Tokenizer tests: llama.cpp's golden tokenizations (shared/golden/tokenizer/*.jsonl and the
// vocab .inp/.out vectors), Hugging Face loaders against their GGUF twins, special tokens,
// StreamDecoder, and one test per malformed-vocabulary error.
#include "model/tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "model/gguf.h"
#include "tests/test_support.h"
#include "tests/vocab_texts.h"

namespace troupe::model {
namespace {

using Ids = std::vector<int32_t>;

std::unique_ptr<GgufFile> open_gguf(const std::string& path) {
  auto f = GgufFile::open(path);
  EXPECT_TRUE(f.has_value()) << (f ? "" : f.error().message);
  return f ? std::move(*f) : nullptr;
}

std::unique_ptr<Tokenizer> load_gguf(const std::string& path) {
  auto f = open_gguf(path);
  if (!f) return nullptr;
  auto t = Tokenizer::from_gguf(*f);
  EXPECT_TRUE(t.has_value()) << (t ? "" : t.error().message);
  return t ? std::move(*t) : nullptr;
}

std::unique_ptr<Tokenizer> load_hf(const std::string& dir) {
  auto t = Tokenizer::from_hf_dir(dir);
  EXPECT_TRUE(t.has_value()) << (t ? "" : t.error().message);
  return t ? std::move(*t) : nullptr;
}

// llama.cpp test-tokenizer-0 vectors: inputs separated by "\n__ggml_vocab_test__\n", one line
// of ids per input.
struct VocabCase {
  std::string text;
  Ids ids;
};

std::vector<VocabCase> read_vocab_cases(const std::string& gguf_path) {
  const std::string inp = testing::read_text_file(gguf_path + ".inp");
  const std::string out = testing::read_text_file(gguf_path + ".out");
  const std::vector<std::string> texts = testing::split_vocab_texts(inp);
  std::vector<VocabCase> cases;
  size_t line_start = 0;
  for (const std::string& text : texts) {
    size_t eol = out.find('\n', line_start);
    if (eol == std::string::npos) eol = out.size();
    Ids ids;
    int v = 0, n = 0;
    const char* p = out.c_str() + line_start;
    const char* end = out.c_str() + eol;
    while (p < end && std::sscanf(p, "%d%n", &v, &n) == 1) {
      ids.push_back(v);
      p += n;
    }
    cases.push_back({text, ids});
    line_start = eol + 1;
  }
  return cases;
}

struct GoldenLine {
  std::string text;
  Ids with_special;
  Ids without_special;
  std::string detok;
  std::string vocab_file;
};

std::vector<GoldenLine> read_golden(const std::string& path) {
  std::vector<GoldenLine> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line);
    lines.push_back({j["text"].get<std::string>(), j["ids_add_special"].get<Ids>(),
                     j["ids_no_special"].get<Ids>(), j["detok_no_special"].get<std::string>(),
                     j["vocab_file"].get<std::string>()});
  }
  return lines;
}

// "shared/models/x.gguf" -> "<shared dir>/models/x.gguf"
std::string shared_path(const std::string& shared, const std::string& rel) {
  return shared + "/" + (rel.rfind("shared/", 0) == 0 ? rel.substr(7) : rel);
}

void check_golden(const std::string& shared, const std::string& name) {
  const auto lines = read_golden(shared + "/golden/tokenizer/" + name + ".jsonl");
  ASSERT_EQ(lines.size(), 20u);
  auto tok = load_gguf(shared_path(shared, lines[0].vocab_file));
  ASSERT_NE(tok, nullptr);
  for (const GoldenLine& g : lines) {
    EXPECT_EQ(tok->encode(g.text, true), g.with_special) << name << ": " << g.text;
    EXPECT_EQ(tok->encode(g.text, false), g.without_special) << name << ": " << g.text;
    EXPECT_EQ(tok->decode(g.without_special), g.detok) << name << ": " << g.text;
  }
}

TEST(TokenizerGolden, LlamaSpm) {
  TROUPE_SHARED_OR_SKIP(shared);
  check_golden(shared, "llama-spm");
}
TEST(TokenizerGolden, Phi3) {
  TROUPE_SHARED_OR_SKIP(shared);
  check_golden(shared, "phi-3");
}
TEST(TokenizerGolden, Gpt2) {
  TROUPE_SHARED_OR_SKIP(shared);
  check_golden(shared, "gpt-2");
}
TEST(TokenizerGolden, DeepseekLlm) {
  TROUPE_SHARED_OR_SKIP(shared);
  check_golden(shared, "deepseek-llm");
}
TEST(TokenizerGolden, Stories260K) {
  TROUPE_SHARED_OR_SKIP(shared);
  check_golden(shared, "stories260K");
}

class TokenizerVocabVectors : public ::testing::TestWithParam<const char*> {};

TEST_P(TokenizerVocabVectors, MatchLlamaCppTestVectors) {
  TROUPE_SHARED_OR_SKIP(shared);
  const std::string path = shared + "/models/llama.cpp-vocab/ggml-vocab-" + GetParam() + ".gguf";
  auto tok = load_gguf(path);
  ASSERT_NE(tok, nullptr);
  const auto cases = read_vocab_cases(path);
  ASSERT_EQ(cases.size(), 46u);
  for (const VocabCase& c : cases) EXPECT_EQ(tok->encode(c.text, false), c.ids) << c.text;
}

INSTANTIATE_TEST_SUITE_P(Tokenizer, TokenizerVocabVectors,
                         ::testing::Values("llama-spm", "phi-3", "gpt-2", "deepseek-llm"));

TEST(TokenizerHf, Gpt2TokenizerJsonMatchesGguf) {
  TROUPE_SHARED_OR_SKIP(shared);
  const std::string gguf = shared + "/models/llama.cpp-vocab/ggml-vocab-gpt-2.gguf";
  auto from_gguf = load_gguf(gguf);
  auto from_hf = load_hf(shared + "/models/hf/gpt2-tokenizer");
  ASSERT_NE(from_gguf, nullptr);
  ASSERT_NE(from_hf, nullptr);
  EXPECT_EQ(from_hf->model_kind(), "gpt2");
  EXPECT_EQ(from_hf->n_vocab(), from_gguf->n_vocab());
  EXPECT_EQ(from_hf->bos_id(), 50256);
  EXPECT_EQ(from_hf->eos_id(), 50256);
  EXPECT_FALSE(from_hf->add_bos());
  EXPECT_TRUE(from_hf->is_eog(50256));
  for (const VocabCase& c : read_vocab_cases(gguf)) {
    EXPECT_EQ(from_hf->encode(c.text, false), c.ids) << c.text;
    EXPECT_EQ(from_hf->encode(c.text, true), from_gguf->encode(c.text, true)) << c.text;
    EXPECT_EQ(from_hf->decode(c.ids), from_gguf->decode(c.ids)) << c.text;
  }
}

TEST(TokenizerHf, SentencePieceModelMatchesGguf) {
  TROUPE_SHARED_OR_SKIP(shared);
  auto from_gguf = load_gguf(shared + "/models/stories260K/stories260K.gguf");
  auto from_hf = load_hf(shared + "/models/hf/stories260K");
  ASSERT_NE(from_gguf, nullptr);
  ASSERT_NE(from_hf, nullptr);
  EXPECT_EQ(from_hf->model_kind(), "llama");
  EXPECT_EQ(from_hf->n_vocab(), 512);
  EXPECT_EQ(from_hf->bos_id(), 1);
  EXPECT_EQ(from_hf->eos_id(), 2);
  EXPECT_TRUE(from_hf->add_bos());
  std::vector<std::string> texts;
  for (const auto& g : read_golden(shared + "/golden/tokenizer/stories260K.jsonl")) {
    EXPECT_EQ(from_hf->encode(g.text, true), g.with_special) << g.text;
    texts.push_back(g.text);
  }
  for (const auto& c :
       read_vocab_cases(shared + "/models/llama.cpp-vocab/ggml-vocab-llama-spm.gguf")) {
    texts.push_back(c.text);
  }
  for (const std::string& t : texts) {
    const Ids ids = from_gguf->encode(t, true);
    EXPECT_EQ(from_hf->encode(t, true), ids) << t;
    EXPECT_EQ(from_hf->encode(t, true, true), from_gguf->encode(t, true, true)) << t;
    EXPECT_EQ(from_hf->decode(ids), from_gguf->decode(ids)) << t;
  }
}

TEST(TokenizerSpecial, ParseSpecialMatchesControlTokensOnlyWhenAsked) {
  TROUPE_SHARED_OR_SKIP(shared);
  auto tok = load_gguf(shared + "/models/llama.cpp-vocab/ggml-vocab-llama-spm.gguf");
  ASSERT_NE(tok, nullptr);
  const Ids parsed = tok->encode("<s>Hello</s>", false, true);
  ASSERT_GE(parsed.size(), 3u);
  EXPECT_EQ(parsed.front(), 1);
  EXPECT_EQ(parsed.back(), 2);
  // After a special token the SentencePiece space prefix is added again: "▁Hello".
  EXPECT_EQ(Ids(parsed.begin() + 1, parsed.end() - 1), tok->encode("Hello", false));
  const Ids plain = tok->encode("<s>Hello</s>", false, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 1), 0);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 2), 0);
  EXPECT_EQ(tok->decode(plain), "<s>Hello</s>");
  // Control tokens render only on request.
  EXPECT_EQ(tok->token_to_piece(1), "");
  EXPECT_EQ(tok->token_to_piece(1, true), "<s>");
  EXPECT_EQ(tok->find_token("</s>"), 2);
  EXPECT_EQ(tok->token_attr(2), TokenAttr::kControl);
}

TEST(TokenizerSpecial, Gpt2EndOfTextAndLongestMatchFirst) {
  TROUPE_SHARED_OR_SKIP(shared);
  auto tok = load_gguf(shared + "/models/llama.cpp-vocab/ggml-vocab-gpt-2.gguf");
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->encode("a<|endoftext|>b", false, true), (Ids{64, 50256, 65}));
  EXPECT_NE(tok->encode("a<|endoftext|>b", false, false), (Ids{64, 50256, 65}));
  EXPECT_TRUE(tok->is_eog(50256));
  EXPECT_FALSE(tok->is_eog(64));
}

TEST(TokenizerSpecial, Phi3EndOfGenerationAndRstrip) {
  TROUPE_SHARED_OR_SKIP(shared);
  auto tok = load_gguf(shared + "/models/llama.cpp-vocab/ggml-vocab-phi-3.gguf");
  ASSERT_NE(tok, nullptr);
  EXPECT_TRUE(tok->is_eog(32000));   // <|endoftext|>, also eos
  EXPECT_TRUE(tok->is_eog(32007));   // <|end|>
  EXPECT_FALSE(tok->is_eog(32010));  // <|user|>
  // Phi-3 strips the spaces after its special tokens (rstrip).
  const Ids a = tok->encode("<|user|>   Hi", false, true);
  const Ids b = tok->encode("<|user|>Hi", false, true);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.front(), 32010);
}

TEST(TokenizerStream, HoldsBackPartialUtf8) {
  TROUPE_SHARED_OR_SKIP(shared);
  auto tok = load_gguf(shared + "/models/stories260K/stories260K.gguf");
  ASSERT_NE(tok, nullptr);
  // 512 pieces: the emoji falls back to four byte tokens.
  const std::string emoji = "\xF0\x9F\x98\x80";
  const Ids ids = tok->encode("a" + emoji + "b", false);
  StreamDecoder dec(*tok);
  std::string all;
  std::vector<std::string> chunks;
  for (int32_t id : ids) {
    chunks.push_back(dec.push(id));
    all += chunks.back();
  }
  all += dec.flush();
  // A stream continues a prompt: the SentencePiece prefix space of the first piece stays.
  EXPECT_EQ(all, " a" + emoji + "b");
  EXPECT_EQ(" " + tok->decode(ids), all);
  // No chunk ends inside a character.
  for (const std::string& c : chunks) {
    EXPECT_TRUE(c.empty() || c.find('\xF0') == std::string::npos ||
                c.find(emoji) != std::string::npos)
        << "partial emoji emitted";
  }
  int empty_chunks = 0;
  for (const std::string& c : chunks) empty_chunks += c.empty();
  EXPECT_GE(empty_chunks, 3);  // the first three bytes of the emoji wait for the fourth

  StreamDecoder partial(*tok);
  std::string got;
  for (size_t i = 0; i + 2 < ids.size(); ++i) got += partial.push(ids[i]);  // stop mid-emoji
  EXPECT_EQ(got, " a");
  EXPECT_EQ(partial.flush(), "\xEF\xBF\xBD");
}

TEST(TokenizerRoundTrip, EightKilobytesOfMixedText) {
  TROUPE_SHARED_OR_SKIP(shared);
  auto tok = load_gguf(shared + "/models/llama.cpp-vocab/ggml-vocab-deepseek-llm.gguf");
  auto spm = load_gguf(shared + "/models/llama.cpp-vocab/ggml-vocab-llama-spm.gguf");
  ASSERT_NE(tok, nullptr);
  ASSERT_NE(spm, nullptr);
  std::string text;
  while (text.size() < 8192)
    text += "Once upon a time, there was a little girl named Lily. 123 \xe4\xbd\xa0\xe5\xa5\xbd! ";
  for (const Tokenizer* t : {tok.get(), spm.get()}) {
    // Speed is measured in bench/, not asserted here: this pins the 8 KB round trip.
    const Ids ids = t->encode(text, false);
    EXPECT_FALSE(ids.empty());
    EXPECT_EQ(t->decode(ids), text);
  }
}

// ---- malformed vocabularies ---------------------------------------------------------------------

// A minimal GGUF v3 writer for vocabulary-only files.
class GgufBuilder {
 public:
  void str(const std::string& key, const std::string& v) {
    header(key, 8);
    put_str(v);
  }
  void u32(const std::string& key, uint32_t v) {
    header(key, 4);
    put(v);
  }
  void strs(const std::string& key, const std::vector<std::string>& v) {
    header(key, 9);
    put(uint32_t{8});
    put(uint64_t{v.size()});
    for (const auto& s : v) put_str(s);
  }
  void f32s(const std::string& key, const std::vector<float>& v) {
    header(key, 9);
    put(uint32_t{6});
    put(uint64_t{v.size()});
    for (float f : v) put(f);
  }
  std::unique_ptr<GgufFile> build() {
    std::vector<uint8_t> out;
    auto append = [&](const void* p, size_t n) {
      out.insert(out.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
    };
    append("GGUF", 4);
    const uint32_t version = 3;
    const uint64_t n_tensors = 0;
    append(&version, 4);
    append(&n_tensors, 8);
    append(&n_kv_, 8);
    out.insert(out.end(), body_.begin(), body_.end());
    while (out.size() % 32) out.push_back(0);
    image_ = std::move(out);
    auto f = GgufFile::parse(image_, "bad.gguf");
    EXPECT_TRUE(f.has_value()) << (f ? "" : f.error().message);
    return f ? std::move(*f) : nullptr;
  }

 private:
  template <class T>
  void put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    body_.insert(body_.end(), p, p + sizeof(T));
  }
  void put_str(const std::string& s) {
    put(uint64_t{s.size()});
    body_.insert(body_.end(), s.begin(), s.end());
  }
  void header(const std::string& key, uint32_t type) {
    put_str(key);
    put(type);
    ++n_kv_;
  }
  std::vector<uint8_t> body_;
  std::vector<uint8_t> image_;
  uint64_t n_kv_ = 0;
};

std::string gguf_error(GgufBuilder& b) {
  auto f = b.build();
  if (!f) return "<gguf did not parse>";
  auto t = Tokenizer::from_gguf(*f);
  return t.has_value() ? "<no error>" : t.error().message;
}

TEST(TokenizerErrors, MissingTokensArray) {
  GgufBuilder b;
  b.str("tokenizer.ggml.model", "llama");
  EXPECT_EQ(gguf_error(b), "bad.gguf: missing tokenizer.ggml.tokens");
}

TEST(TokenizerErrors, MissingModelKey) {
  GgufBuilder b;
  b.strs("tokenizer.ggml.tokens", {"a"});
  EXPECT_NE(gguf_error(b).find("tokenizer.ggml.model"), std::string::npos);
}

TEST(TokenizerErrors, TokensNotStrings) {
  GgufBuilder b;
  b.str("tokenizer.ggml.model", "llama");
  b.f32s("tokenizer.ggml.tokens", {1.0f});
  EXPECT_EQ(gguf_error(b), "bad.gguf: tokenizer.ggml.tokens holds f32, not strings");
}

TEST(TokenizerErrors, ScoresLengthMismatch) {
  GgufBuilder b;
  b.str("tokenizer.ggml.model", "llama");
  b.strs("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>"});
  b.f32s("tokenizer.ggml.scores", {0.0f, 0.0f});
  EXPECT_EQ(gguf_error(b), "bad.gguf: 2 scores for 3 tokens");
}

TEST(TokenizerErrors, EmptyVocabulary) {
  GgufBuilder b;
  b.str("tokenizer.ggml.model", "llama");
  b.strs("tokenizer.ggml.tokens", {});
  EXPECT_EQ(gguf_error(b), "bad.gguf: the vocabulary has no tokens");
}

TEST(TokenizerErrors, UnsupportedModel) {
  GgufBuilder b;
  b.str("tokenizer.ggml.model", "bert");
  b.strs("tokenizer.ggml.tokens", {"a"});
  EXPECT_EQ(gguf_error(b), "bad.gguf: unsupported tokenizer.ggml.model \"bert\"");
}

TEST(TokenizerErrors, MergeNamesUnknownToken) {
  GgufBuilder b;
  b.str("tokenizer.ggml.model", "gpt2");
  b.str("tokenizer.ggml.pre", "gpt-2");
  b.strs("tokenizer.ggml.tokens", {"a", "b", "ab"});
  b.strs("tokenizer.ggml.merges", {"a b", "ab c"});
  EXPECT_EQ(gguf_error(b), "bad.gguf: merge 1 (\"ab c\") names unknown token \"c\"");
}

TEST(TokenizerErrors, MergeWithoutSpace) {
  GgufBuilder b;
  b.str("tokenizer.ggml.model", "gpt2");
  b.strs("tokenizer.ggml.tokens", {"a", "b"});
  b.strs("tokenizer.ggml.merges", {"ab"});
  EXPECT_EQ(gguf_error(b), "bad.gguf: merge 0 (\"ab\") is not two tokens separated by a space");
}

TEST(TokenizerErrors, MissingMerges) {
  GgufBuilder b;
  b.str("tokenizer.ggml.model", "gpt2");
  b.strs("tokenizer.ggml.tokens", {"a", "b"});
  EXPECT_EQ(gguf_error(b), "bad.gguf: missing tokenizer.ggml.merges");
}

TEST(TokenizerErrors, UnsupportedPreTokenizer) {
  GgufBuilder b;
  b.str("tokenizer.ggml.model", "gpt2");
  b.str("tokenizer.ggml.pre", "klingon");
  b.strs("tokenizer.ggml.tokens", {"a", "b"});
  b.strs("tokenizer.ggml.merges", {"a b"});
  EXPECT_EQ(gguf_error(b), "bad.gguf: unsupported pre-tokenizer \"klingon\"");
}

TEST(TokenizerErrors, AddBosWithoutBosToken) {
  GgufBuilder b;
  b.str("tokenizer.ggml.model", "llama");
  b.strs("tokenizer.ggml.tokens", {"a"});  // default BOS id 1 is out of range
  EXPECT_EQ(gguf_error(b), "bad.gguf: add_bos_token is set but there is no BOS token");
}

TEST(TokenizerErrors, TinyValidVocabularies) {
  GgufBuilder b;
  b.str("tokenizer.ggml.model", "gpt2");
  b.str("tokenizer.ggml.pre", "gpt-2");
  b.strs("tokenizer.ggml.tokens", {"a", "b", "ab", "c"});
  b.strs("tokenizer.ggml.merges", {"a b"});
  auto f = b.build();
  ASSERT_NE(f, nullptr);
  auto t = Tokenizer::from_gguf(*f);
  ASSERT_TRUE(t.has_value()) << t.error().message;
  EXPECT_EQ((*t)->encode("abc", false), (Ids{2, 3}));
  EXPECT_EQ((*t)->decode(Ids{2, 3}), "abc");
}

using testing::TempDir;

std::string hf_error(const TempDir& d) {
  auto t = Tokenizer::from_hf_dir(d.path());
  return t.has_value() ? "<no error>" : t.error().message;
}

TEST(TokenizerErrors, BadProtobufTruncatedField) {
  TempDir d;
  // Field 1 (pieces), length 100, but only 2 bytes follow.
  d.write("tokenizer.model", std::string("\x0a\x64\x0a\x00", 4));
  EXPECT_EQ(hf_error(d),
            d.path() +
                "/tokenizer.model: bad protobuf at byte 2: length-delimited field runs "
                "past its message");
}

TEST(TokenizerErrors, BadProtobufTruncatedVarint) {
  TempDir d;
  // Unknown field 9 (varint) whose value never ends.
  d.write("tokenizer.model", std::string("\x48\xff", 2));
  EXPECT_EQ(hf_error(d), d.path() + "/tokenizer.model: bad protobuf at byte 2: truncated varint");
}

TEST(TokenizerErrors, BadProtobufWrongWireType) {
  TempDir d;
  // Field 1 (pieces) must be length-delimited, not a varint.
  d.write("tokenizer.model", std::string("\x08\x01", 2));
  EXPECT_EQ(hf_error(d),
            d.path() + "/tokenizer.model: bad protobuf at byte 1: wrong wire type for pieces");
}

TEST(TokenizerErrors, BadProtobufNoPieces) {
  TempDir d;
  d.write("tokenizer.model", std::string("\x48\x01", 2));
  EXPECT_EQ(hf_error(d), d.path() + "/tokenizer.model: bad protobuf: no pieces");
}

TEST(TokenizerErrors, HfDirWithoutTokenizer) {
  TempDir d;
  EXPECT_EQ(hf_error(d), d.path() + ": no tokenizer.json, tokenizer.model or tiktoken.model");
}

TEST(TokenizerErrors, TokenizerJsonInvalid) {
  TempDir d;
  d.write("tokenizer.json", "{not json");
  EXPECT_EQ(hf_error(d).rfind(d.path() + "/tokenizer.json: invalid JSON", 0), 0u) << hf_error(d);
}

TEST(TokenizerErrors, TokenizerJsonMergeNamesUnknownToken) {
  TempDir d;
  d.write("tokenizer.json",
          R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2},
              "merges": ["a b", "a x"]},
              "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false}})");
  EXPECT_EQ(hf_error(d), d.path() + "/tokenizer.json: merge 1 (\"a x\") names unknown token \"x\"");
}

TEST(TokenizerErrors, TokenizerJsonMissingVocab) {
  TempDir d;
  d.write("tokenizer.json",
          R"({"model": {"type": "BPE", "merges": []}, "pre_tokenizer": {"type": "ByteLevel"}})");
  EXPECT_EQ(hf_error(d), d.path() + "/tokenizer.json: model has no \"vocab\" object");
}

TEST(TokenizerHf, SplitRegexSelectsLlama3PreTokenizer) {
  TempDir d;
  // Llama-3's Split regex groups digits by three, and its vocabulary skips merges for words that
  // are tokens already; with GPT-2's regex "123456" would be one word of six byte tokens.
  const std::string vocab =
      R"("vocab": {"1": 0, "2": 1, "3": 2, "4": 3, "5": 4, "6": 5, "123": 6, "456": 7},)";
  const std::string llama3 = R"json({"type": "Split", "pattern": {"Regex":
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
      "behavior": "Isolated", "invert": false})json";
  d.write("tokenizer.json", R"({"model": {"type": "BPE", )" + vocab + R"( "merges": []},
      "pre_tokenizer": {"type": "Sequence", "pretokenizers": [)" +
                                llama3 + R"(,
        {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]}})");
  d.write("tokenizer_config.json", R"({"add_bos_token": false})");
  auto tok = Tokenizer::from_hf_dir(d.path());
  ASSERT_TRUE(tok.has_value()) << tok.error().message;
  EXPECT_EQ((*tok)->encode("123456", true), (Ids{6, 7}));

  d.write("tokenizer.json", R"({"model": {"type": "BPE", )" + vocab + R"( "merges": []},
      "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false}})");
  auto gpt2 = Tokenizer::from_hf_dir(d.path());
  ASSERT_TRUE(gpt2.has_value()) << gpt2.error().message;
  EXPECT_EQ((*gpt2)->encode("123456", true), (Ids{0, 1, 2, 3, 4, 5}));
}

// gpt-oss's tokenizer.json (o200k_harmony) names tiktoken's o200k regex: words split where case
// turns, so "getUser" is two words, "get" and "User"; as one word (GPT-2's regex) the merge
// "t U" would join across the case change.
TEST(TokenizerHf, SplitRegexSelectsO200kPreTokenizer) {
  TempDir d;
  const std::string vocab =
      R"("vocab": {"g": 0, "e": 1, "t": 2, "U": 3, "s": 4, "r": 5, "get": 6, "User": 7,
      "tU": 8, "ge": 9, "Us": 10, "Use": 11},)";
  const std::string o200k = R"json({"type": "Split", "pattern": {"Regex":
      "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
      "behavior": "Isolated", "invert": false})json";
  // "t U" ranks first: inside one word "getUser" it would win.
  d.write("tokenizer.json", R"({"model": {"type": "BPE", )" + vocab + R"( "merges": ["t U",
      "g e", "ge t", "U s", "Us e", "Use r"]},
      "pre_tokenizer": {"type": "Sequence", "pretokenizers": [)" +
                                o200k + R"(,
        {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]}})");
  d.write("tokenizer_config.json", R"({"add_bos_token": false})");
  auto tok = Tokenizer::from_hf_dir(d.path());
  ASSERT_TRUE(tok.has_value()) << tok.error().message;
  EXPECT_EQ((*tok)->encode("getUser", true), (Ids{6, 7}));
}

// Qwen3.5's tokenizer.json names its own regex: "e" with a combining acute (U+0301, bytes CC 81:
// "\u00cc\u0123" byte-encoded) and "t" are one word, whose merges join e and the mark; Qwen2's
// regex would start a new word at the mark.
TEST(TokenizerHf, SplitRegexSelectsQwen35PreTokenizer) {
  TempDir d;
  const std::string vocab =
      R"("vocab": {"e": 0, "\u00cc\u0123": 1, "e\u00cc\u0123": 2, "t": 3, "\u00cc": 4,
      "\u0123": 5},)";
  auto write = [&](const std::string& regex) {
    d.write("tokenizer.json", R"({"model": {"type": "BPE", )" + vocab +
                                  R"( "merges": ["\u00cc \u0123", "e \u00cc\u0123"]},
      "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern":
        {"Regex": ")" + regex + R"("}, "behavior": "Isolated", "invert": false},
        {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]}})");
  };
  d.write("tokenizer_config.json", R"({"add_bos_token": false})");
  write(
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+)");
  auto tok = Tokenizer::from_hf_dir(d.path());
  ASSERT_TRUE(tok.has_value()) << tok.error().message;
  EXPECT_EQ((*tok)->encode("e\u0301t", true), (Ids{2, 3}));
  write(
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+)");
  auto qwen2 = Tokenizer::from_hf_dir(d.path());
  ASSERT_TRUE(qwen2.has_value()) << qwen2.error().message;
  EXPECT_EQ((*qwen2)->encode("e\u0301t", true), (Ids{0, 1, 3}));
}

// Mistral's Tekken tokenizer.json: numbers split digit by digit, and a word that is itself a
// token is taken whole (tiktoken's rule, llama.cpp's ignore_merges for tekken), where o200k's
// regex keeps "12" together and merges "ab" only by a merge rule (there is none).
TEST(TokenizerHf, SplitRegexSelectsTekkenPreTokenizer) {
  TempDir d;
  auto write = [&](const std::string& regex) {
    d.write("tokenizer.json",
            R"({"model": {"type": "BPE", "vocab": {"1": 0, "2": 1, "12": 2, "a": 3, "b": 4,
      "ab": 5}, "merges": ["1 2"]},
      "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern":
        {"Regex": ")" +
                regex + R"("}, "behavior": "Isolated", "invert": false},
        {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]}})");
  };
  d.write("tokenizer_config.json", R"({"add_bos_token": false})");
  write(
      R"([^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+)");
  auto tok = Tokenizer::from_hf_dir(d.path());
  ASSERT_TRUE(tok.has_value()) << tok.error().message;
  EXPECT_EQ((*tok)->encode("12ab", true), (Ids{0, 1, 5}));
  write(
      R"([^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+)");
  auto o200k = Tokenizer::from_hf_dir(d.path());
  ASSERT_TRUE(o200k.has_value()) << o200k.error().message;
  EXPECT_EQ((*o200k)->encode("12ab", true), (Ids{2, 3, 4}));
}

TEST(TokenizerErrors, TokenizerJsonUnknownSplitRegex) {
  TempDir d;
  d.write("tokenizer.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
      "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "[a-z]+"}, "behavior": "Isolated"},
        {"type": "ByteLevel", "use_regex": false}]}})");
  EXPECT_EQ(hf_error(d), d.path() + "/tokenizer.json: unsupported pre_tokenizer regex \"[a-z]+\"");
}

}  // namespace
}  // namespace troupe::model
