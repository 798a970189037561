// Tokenizers: SentencePiece-style BPE (GGUF "llama" vocab: scores + byte fallback) and byte-level
// BPE (GGUF "gpt2" vocab with the GPT-2, Llama-3, Qwen2 and DeepSeek pre-tokenizers), loaded from
// GGUF metadata or from a Hugging Face tokenizer.json / SentencePiece tokenizer.model.
// A Tokenizer is immutable after construction; any thread may use it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"

namespace troupe::model {

class GgufFile;

enum class TokenAttr : uint8_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  /// From GGUF metadata (tokenizer.ggml.*). Errors name the file and the key.
  static Result<std::unique_ptr<Tokenizer>> from_gguf(const GgufFile& gguf);
  /// From a Hugging Face model directory: tokenizer.json, else tokenizer.model (SentencePiece
  /// protobuf); special tokens and add_bos from tokenizer_config.json when present.
  static Result<std::unique_ptr<Tokenizer>> from_hf_dir(const std::string& dir);

  /// Encodes text. add_special: prepend BOS (and append EOS) as the vocabulary asks.
  /// parse_special: recognise control/user-defined token texts such as "<|im_start|>" in text.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special,
                                      bool parse_special = false) const = 0;
  /// The bytes of one token as text (byte tokens give their byte, "▁" becomes a space).
  /// Control tokens give "" unless render_special.
  virtual std::string token_to_piece(int32_t id, bool render_special = false) const = 0;
  /// Decodes a whole sequence like llama_detokenize(remove_special=false, unparse_special=false):
  /// for SentencePiece vocabularies one leading space after BOS is removed.
  virtual std::string decode(std::span<const int32_t> ids) const = 0;

  virtual int32_t n_vocab() const = 0;
  virtual int32_t bos_id() const = 0;         // -1 when none
  virtual int32_t eos_id() const = 0;         // -1 when none
  virtual bool is_eog(int32_t id) const = 0;  // end of generation (eos, eot, ...)
  virtual bool add_bos() const = 0;
  virtual std::string model_kind() const = 0;  // "llama" (SPM) or "gpt2" (byte-level BPE)
  virtual std::string_view token_text(int32_t id) const = 0;  // raw vocabulary entry
  /// The id whose vocabulary entry is exactly `text` (e.g. "<|im_start|>"), or -1.
  virtual int32_t find_token(std::string_view /*text*/) const { return -1; }
  /// The token's type; kUnused for ids out of range.
  virtual TokenAttr token_attr(int32_t /*id*/) const { return TokenAttr::kNormal; }
};

/// Turns a stream of generated token ids into text without ever emitting a partial UTF-8
/// sequence: bytes of an incomplete character are held back until it completes. The stream
/// continues a prompt, so pieces keep their leading spaces.
class StreamDecoder {
 public:
  /// render_special: control tokens give their text (as markers to parse) instead of "".
  explicit StreamDecoder(const Tokenizer& tok, bool render_special = false)
      : tok_(tok), render_special_(render_special) {}
  /// Appends a token; returns the text that is now complete (possibly empty).
  std::string push(int32_t id);
  /// Returns what is still held back (invalid bytes become U+FFFD).
  std::string flush();

 private:
  const Tokenizer& tok_;
  bool render_special_ = false;
  std::string pending_;
};

}  // namespace troupe::model
