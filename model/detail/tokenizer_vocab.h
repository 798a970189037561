// The tokenizers' shared internals: VocabSpec (what a GGUF or Hugging Face source provides), Vocab
// (the validated, indexed vocabulary) and the SentencePiece / byte-level BPE / pre-splitter entry
// points. Behaviour follows llama.cpp's llama-vocab.cpp (commit 18ef86ece). A Vocab is immutable
// once built; any thread may read it.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/result.h"
#include "model/tokenizer.h"

namespace troupe::model::detail {

/// llama.cpp's per-token attribute bits (llama_token_attr).
enum TokenAttrBits : uint16_t {
  kAttrUndefined = 0,
  kAttrUnknown = 1 << 0,
  kAttrUnused = 1 << 1,
  kAttrNormal = 1 << 2,
  kAttrControl = 1 << 3,
  kAttrUserDefined = 1 << 4,
  kAttrByte = 1 << 5,
  kAttrLstrip = 1 << 7,
  kAttrRstrip = 1 << 8,
};

enum class VocabKind : uint8_t { kSpm, kBpe };

/// The pre-tokenizer regex sets of llama.cpp that we implement (tokenizer.ggml.pre).
enum class PreTokenizer : uint8_t {
  kDefault,
  kGpt2,
  kLlama3,
  kQwen2,
  kDeepseekLlm,
  kDeepseekV3,
  kKimiK2,
  kGpt4o,   ///< tiktoken's o200k (gpt-oss, GPT-4o; llama.cpp's "gpt-4o")
  kQwen35,  ///< Qwen3.5's: Qwen2's with combining marks (\p{M}) kept with their letters
  kTekken,  ///< Mistral's Tekken (Mistral Nemo, Small 3, Ministral): o200k's without
            ///< contractions, one digit a number
};

/// Raw vocabulary as read from a file, before validation. Optional fields take llama.cpp's
/// defaults for the vocabulary kind when absent.
struct VocabSpec {
  std::string source;  // file name, prefixed to every error
  VocabKind kind = VocabKind::kSpm;
  std::string pre;  // tokenizer.ggml.pre; "" means "default"
  std::vector<std::string> tokens;
  std::vector<float> scores;        // empty, or one per token
  std::vector<int32_t> types;       // empty, or one TokenAttr value per token
  std::vector<std::string> merges;  // "left right", rank = index (BPE only)
  std::optional<int64_t> bos_id, eos_id, eot_id, eom_id, unk_id, sep_id, pad_id;
  std::optional<int64_t> fim_pre_id, fim_suf_id, fim_mid_id, fim_pad_id, fim_rep_id, fim_sep_id;
  std::optional<bool> add_bos, add_eos, add_space_prefix;
  std::string model_name;  // general.name: phi-3 vocabularies strip spaces after special tokens
};

/// Heterogeneous string hashing so that maps keyed by std::string_view accept any string.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

/// A BPE merge: rank (lower merges first) and the symbol the pair becomes.
struct BpeMerge {
  int32_t rank = 0;
  int32_t result = 0;
};

struct Vocab {
  VocabKind kind = VocabKind::kSpm;
  PreTokenizer pre = PreTokenizer::kDefault;
  std::vector<std::string> text;  // id -> vocabulary entry
  std::vector<float> score;
  std::vector<uint16_t> attr;      // TokenAttrBits
  std::vector<std::string> piece;  // id -> token_to_piece(render_special = true)
  std::unordered_map<std::string_view, int32_t, StringHash, std::equal_to<>> ids;  // into `text`

  // BPE: symbols are token ids, then merge results that are not tokens (n_vocab + i).
  std::unordered_map<uint64_t, BpeMerge> merges;  // (left symbol << 32 | right symbol)
  std::array<int32_t, 256> byte_symbol{};         // symbol of each byte's GPT-2 character, or -1
  std::array<int32_t, 256> raw_byte_token{};      // token whose text is that single byte, or -1
  // SPM: the token of each byte (<0xXX>, else the one-byte text), or -1.
  std::array<int32_t, 256> byte_token{};

  bool add_bos = false;
  bool add_eos = false;
  bool add_space_prefix = false;
  bool clean_spaces = false;
  bool ignore_merges = false;
  int32_t bos = -1, eos = -1, eot = -1, eom = -1, unk = -1;
  std::vector<int32_t> special_tokens;  // control, user-defined and unknown ids, longest text first
  std::vector<bool> eog;                // id -> end of generation

  int32_t n_vocab() const { return static_cast<int32_t>(text.size()); }
  int32_t find(std::string_view s) const {
    auto it = ids.find(s);
    return it == ids.end() ? -1 : it->second;
  }
};

/// Validates `spec` and builds the tokenizer. Errors name spec.source and the problem.
Result<std::unique_ptr<Tokenizer>> build_tokenizer(VocabSpec spec);

/// Tokenizer::from_hf_dir's body (tokenizer_hf.cc). from_hf_dir itself is defined in tokenizer.cc
/// so that it is linked whenever the tokenizer is.
Result<std::unique_ptr<Tokenizer>> load_hf_tokenizer(const std::string& dir);

/// A tiktoken.model file ("base64(bytes) rank" lines) as byte-level BPE with pre-tokenizer `pre`:
/// tokens spelled with GPT-2's byte characters, ids = ranks (a missing rank: an unused
/// "[PAD<id>]"), merges derived from the ranks (tokenizer_tiktoken.cc). Throws InputError naming
/// the file and line.
VocabSpec spec_from_tiktoken(const std::string& path, const std::string& pre);

/// What a tokenizer.ggml.pre name selects in llama.cpp: the regex set and vocabulary flags.
struct PreTokenizerInfo {
  PreTokenizer pre = PreTokenizer::kDefault;
  bool clean_spaces = true;    // decode() drops spaces before ?!., and some apostrophes
  bool ignore_merges = false;  // a word that is itself a token is not merged
  bool add_bos = false;        // default for tokenizer.ggml.add_bos_token
};
/// nullopt when the name is not one we implement.
std::optional<PreTokenizerInfo> pre_tokenizer_info(std::string_view name);

/// Splits codepoints into pre-tokenizer words; appends each word's length (in codepoints).
void pre_split(PreTokenizer pre, const std::vector<uint32_t>& cps, std::vector<size_t>* lengths);

/// Appends the tokens of one raw-text fragment (llm_tokenizer_spm_session / _bpe_session).
void spm_tokenize(const Vocab& vocab, std::string_view text, std::vector<int32_t>* out);
void bpe_tokenize(const Vocab& vocab, std::string_view text, std::vector<int32_t>* out);

/// BPE token text (GPT-2 characters) back to bytes, as llama.cpp's llama_decode_text.
std::string gpt2_decode_text(std::string_view text);

}  // namespace troupe::model::detail
