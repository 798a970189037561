// libFuzzer entry for the tokenizers (model/tokenizer*.cc) on untrusted text: a client's prompt
// reaches the tokenizer as bytes, valid UTF-8 or not. The first byte picks a vocabulary (the
// llama.cpp test vocabularies of ../shared: SentencePiece and byte-level BPE with their
// pre-tokenizers, the GPT-2 one with Kimi-K2's, and a tokenizer.json) and the flags; the rest is
// the text. Checks: every id is in the vocabulary; decoding the ids works; a StreamDecoder fed the
// ids one by one never emits a partial UTF-8 sequence and, with its flush, gives valid UTF-8. The
// input read as ids is decoded too (a client may send token ids). Needs ../shared (or
// $TROUPE_SHARED_DIR): without it the fuzzer stops at start with a message (scripts/fuzz-smoke then
// skips it).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "model/gguf.h"
#include "model/gguf_writer.h"
#include "model/tokenizer.h"

namespace {

using troupe::model::GgufFile;
using troupe::model::StreamDecoder;
using troupe::model::Tokenizer;

struct Vocab {
  std::unique_ptr<GgufFile> gguf;  // the tokenizer reads its metadata while it is built
  std::unique_ptr<Tokenizer> tok;
};
std::vector<Vocab>* g_vocabs = nullptr;
volatile uint64_t g_sink = 0;

void require(bool ok) {
  if (!ok) std::abort();
}

// Whether `s` is well-formed UTF-8 (no overlongs, surrogates or code points past U+10FFFF).
// Written out here rather than model/detail/unicode.h's utf8_valid_prefix: StreamDecoder itself
// uses that one, and the oracle must not share the code it checks.
bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<uint8_t>(s[i]);
    size_t n = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      n = 1;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    for (size_t k = 1; k <= n; ++k) {
      if (i + k >= s.size()) return false;
      const auto d = static_cast<uint8_t>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    const uint32_t min[] = {0, 0x80, 0x800, 0x10000};
    if (cp < min[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n + 1;
  }
  return true;
}

std::string shared_dir() {
  if (const char* env = std::getenv("TROUPE_SHARED_DIR"); env && *env) return env;
  return "../shared";
}

void load(const std::string& path) {
  Vocab v;
  if (path.ends_with(".gguf")) {
    auto g = GgufFile::open(path);
    if (!g) {
      std::fprintf(stderr, "tokenizer_fuzz: %s\n", g.error().message.c_str());
      std::exit(1);
    }
    v.gguf = std::move(*g);
    auto t = Tokenizer::from_gguf(*v.gguf);
    if (!t) {
      std::fprintf(stderr, "tokenizer_fuzz: %s\n", t.error().message.c_str());
      std::exit(1);
    }
    v.tok = std::move(*t);
  } else {
    auto t = Tokenizer::from_hf_dir(path);
    if (!t) {
      std::fprintf(stderr, "tokenizer_fuzz: %s\n", t.error().message.c_str());
      std::exit(1);
    }
    v.tok = std::move(*t);
  }
  g_vocabs->push_back(std::move(v));
}

// The GPT-2 vocabulary with Kimi-K2's pre-tokenizer (written to a temporary file, loaded, and
// removed): the kimi-k2 splitter on arbitrary text.
void load_as_kimi(const std::string& gpt2) {
  auto g = GgufFile::open(gpt2);
  if (!g) {
    std::fprintf(stderr, "tokenizer_fuzz: %s\n", g.error().message.c_str());
    std::exit(1);
  }
  troupe::model::GgufWriter w;
  for (const auto& [key, value] : (*g)->metadata()) w.copy_value(key, value);
  w.set_string("tokenizer.ggml.pre", "kimi-k2");
  char path[] = "/tmp/tokenizer_fuzz_kimi_XXXXXX.gguf";
  const int fd = mkstemps(path, 5);
  if (fd < 0) {
    std::perror("tokenizer_fuzz: mkstemps");
    std::exit(1);
  }
  close(fd);
  auto st = w.write(path);
  if (!st) {
    std::fprintf(stderr, "tokenizer_fuzz: %s\n", st.error().message.c_str());
    std::exit(1);
  }
  load(path);
  std::remove(path);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const std::string dir = shared_dir();
  const std::string vocab = dir + "/models/llama.cpp-vocab/";
  if (!std::filesystem::exists(vocab)) {
    std::fprintf(stderr, "tokenizer_fuzz: %s not found (set TROUPE_SHARED_DIR)\n", vocab.c_str());
    std::exit(77);
  }
  g_vocabs = new std::vector<Vocab>();
  for (const char* name : {"llama-spm", "phi-3", "gpt-2", "deepseek-llm"})
    load(vocab + "ggml-vocab-" + name + ".gguf");
  load_as_kimi(vocab + "ggml-vocab-gpt-2.gguf");
  load(dir + "/models/hf/gpt2-tokenizer");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const Tokenizer& tok = *(*g_vocabs)[data[0] % g_vocabs->size()].tok;
  const unsigned flags = data[0] / static_cast<unsigned>(g_vocabs->size());
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  const int32_t n_vocab = tok.n_vocab();

  const std::vector<int32_t> ids = tok.encode(text, (flags & 1) != 0, (flags & 2) != 0);
  for (int32_t id : ids) require(id >= 0 && id < n_vocab);
  const std::string back = tok.decode(ids);

  StreamDecoder stream(tok);
  std::string streamed;
  for (int32_t id : ids) {
    const std::string piece = stream.push(id);
    require(valid_utf8(piece));
    streamed += piece;
  }
  streamed += stream.flush();
  require(valid_utf8(streamed));

  // The same bytes as token ids (what a client may send instead of text).
  std::vector<int32_t> as_ids(text.size() / 4);
  for (size_t i = 0; i < as_ids.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, text.data() + 4 * i, 4);
    as_ids[i] = static_cast<int32_t>(u % static_cast<uint32_t>(n_vocab));
  }
  StreamDecoder stream2(tok);
  for (int32_t id : as_ids) require(valid_utf8(stream2.push(id)));
  require(valid_utf8(stream2.flush()));
  g_sink = g_sink + back.size() + tok.decode(as_ids).size() + streamed.size();
  return 0;
}
