// Tokenizer::from_gguf (tokenizer.ggml.* metadata -> VocabSpec) and StreamDecoder.
// from_gguf reads the file's metadata once; the tokenizer it returns does not keep the file.
#include "model/tokenizer.h"

#include "base/check.h"
#include "model/detail/tokenizer_vocab.h"
#include "model/detail/unicode.h"
#include "model/gguf.h"

namespace troupe::model {

namespace {

using detail::VocabKind;
using detail::VocabSpec;

const GgufValue& require_array(const GgufFile& f, std::string_view key) {
  const GgufValue* v = f.find(key);
  if (v == nullptr) {
    TROUPE_INPUT_ERROR("%s: missing %.*s", f.path().c_str(), static_cast<int>(key.size()),
                       key.data());
  }
  if (v->type != GgufType::kArray) {
    TROUPE_INPUT_ERROR("%s: %.*s is a %s, not an array", f.path().c_str(),
                       static_cast<int>(key.size()), key.data(),
                       std::string(gguf_type_name(v->type)).c_str());
  }
  return *v;
}

const GgufValue* optional_array(const GgufFile& f, std::string_view key) {
  return f.find(key) ? &require_array(f, key) : nullptr;
}

std::vector<std::string> read_strings(const GgufFile& f, std::string_view key) {
  const GgufValue& v = require_array(f, key);
  if (v.elem_type != GgufType::kString) {
    TROUPE_INPUT_ERROR("%s: %.*s holds %s, not strings", f.path().c_str(),
                       static_cast<int>(key.size()), key.data(),
                       std::string(gguf_type_name(v.elem_type)).c_str());
  }
  return std::vector<std::string>(v.strings.begin(), v.strings.end());
}

void require_numeric(const GgufFile& f, std::string_view key, const GgufValue& v) {
  if (v.elem_type == GgufType::kString || v.elem_type == GgufType::kArray) {
    TROUPE_INPUT_ERROR("%s: %.*s holds %s, not numbers", f.path().c_str(),
                       static_cast<int>(key.size()), key.data(),
                       std::string(gguf_type_name(v.elem_type)).c_str());
  }
}

std::optional<int64_t> optional_int(const GgufFile& f, std::string_view key) {
  if (!f.find(key)) return std::nullopt;
  return f.get_int(key);
}

std::optional<bool> optional_bool(const GgufFile& f, std::string_view key) {
  if (!f.find(key)) return std::nullopt;
  return f.get_bool(key);
}

VocabSpec spec_from_gguf(const GgufFile& f) {
  VocabSpec spec;
  spec.source = f.path();
  const std::string model = f.get_string("tokenizer.ggml.model");
  if (model == "llama") {
    spec.kind = VocabKind::kSpm;
  } else if (model == "gpt2") {
    spec.kind = VocabKind::kBpe;
  } else {
    TROUPE_INPUT_ERROR("%s: unsupported tokenizer.ggml.model \"%s\"", f.path().c_str(),
                       model.c_str());
  }
  spec.pre = f.get_string_or("tokenizer.ggml.pre", "");
  spec.tokens = read_strings(f, "tokenizer.ggml.tokens");
  if (const GgufValue* s = optional_array(f, "tokenizer.ggml.scores")) {
    require_numeric(f, "tokenizer.ggml.scores", *s);
    spec.scores.resize(s->count);
    for (uint64_t i = 0; i < s->count; ++i) spec.scores[i] = static_cast<float>(s->array_f64(i));
  }
  if (const GgufValue* t = optional_array(f, "tokenizer.ggml.token_type")) {
    require_numeric(f, "tokenizer.ggml.token_type", *t);
    spec.types.resize(t->count);
    for (uint64_t i = 0; i < t->count; ++i) {
      spec.types[i] = static_cast<int32_t>(t->array_i64(i));
    }
  }
  if (spec.kind == VocabKind::kBpe) spec.merges = read_strings(f, "tokenizer.ggml.merges");
  spec.bos_id = optional_int(f, "tokenizer.ggml.bos_token_id");
  spec.eos_id = optional_int(f, "tokenizer.ggml.eos_token_id");
  spec.eot_id = optional_int(f, "tokenizer.ggml.eot_token_id");
  spec.eom_id = optional_int(f, "tokenizer.ggml.eom_token_id");
  spec.unk_id = optional_int(f, "tokenizer.ggml.unknown_token_id");
  spec.sep_id = optional_int(f, "tokenizer.ggml.seperator_token_id");
  spec.pad_id = optional_int(f, "tokenizer.ggml.padding_token_id");
  spec.fim_pre_id = optional_int(f, "tokenizer.ggml.fim_pre_token_id");
  spec.fim_suf_id = optional_int(f, "tokenizer.ggml.fim_suf_token_id");
  spec.fim_mid_id = optional_int(f, "tokenizer.ggml.fim_mid_token_id");
  spec.fim_pad_id = optional_int(f, "tokenizer.ggml.fim_pad_token_id");
  spec.fim_rep_id = optional_int(f, "tokenizer.ggml.fim_rep_token_id");
  spec.fim_sep_id = optional_int(f, "tokenizer.ggml.fim_sep_token_id");
  spec.add_bos = optional_bool(f, "tokenizer.ggml.add_bos_token");
  spec.add_eos = optional_bool(f, "tokenizer.ggml.add_eos_token");
  spec.add_space_prefix = optional_bool(f, "tokenizer.ggml.add_space_prefix");
  spec.model_name = f.get_string_or("general.name", "");
  return spec;
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_gguf(const GgufFile& gguf) {
  try {
    return detail::build_tokenizer(spec_from_gguf(gguf));
  } catch (const InputError& e) {
    return make_error(0, e.what());
  }
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_hf_dir(const std::string& dir) {
  return detail::load_hf_tokenizer(dir);
}

std::string StreamDecoder::push(int32_t id) {
  // Generated text continues a prompt, so every piece keeps its leading space (decode() drops
  // the SentencePiece prefix space of a sequence's first token; a stream has no first token).
  pending_ += tok_.token_to_piece(id, render_special_);
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    const int n = detail::utf8_valid_prefix(std::string_view(pending_).substr(i));
    if (n < 0) break;  // an incomplete character: wait for its remaining bytes
    if (n == 0) {
      detail::append_utf8(&out, detail::kReplacementChar);
      ++i;
      continue;
    }
    out.append(pending_, i, static_cast<size_t>(n));
    i += static_cast<size_t>(n);
  }
  pending_.erase(0, i);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  if (!pending_.empty()) detail::append_utf8(&out, detail::kReplacementChar);
  pending_.clear();
  return out;
}

}  // namespace troupe::model
