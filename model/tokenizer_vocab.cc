// Builds a validated Vocab from a VocabSpec (llama.cpp's llama_vocab::load rules: defaults per
// vocabulary kind, special-token detection, end-of-generation set, piece cache) and implements
// Tokenizer on it: special-token partitioning, encode and llama_detokenize-style decode.
// A built tokenizer is immutable; any thread may use it.
#include "model/detail/tokenizer_vocab.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <utility>

#include "base/check.h"
#include "model/detail/unicode.h"

namespace troupe::model::detail {

namespace {

constexpr std::string_view kSpaceMark = "\xe2\x96\x81";  // U+2581, SentencePiece's space

// Token texts that llama.cpp recognises as end-of-generation tokens.
constexpr std::string_view kEogTexts[] = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<\xef\xbd\x9c"
    "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
    "[e~[",
};
// Texts of fill-in-the-middle tokens; these become control tokens too.
constexpr std::string_view kFimTexts[] = {
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<PRE>",
    "\xe2\x96\x81<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<SUF>",
    "\xe2\x96\x81<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<MID>",
    "\xe2\x96\x81<MID>",
    "<|code_middle|>",
    "<|middle|>",
    "<\xef\xbd\x9c"
    "fim\xe2\x96\x81"
    "begin\xef\xbd\x9c>",
    "<\xef\xbd\x9c"
    "fim\xe2\x96\x81hole\xef\xbd\x9c>",
    "<\xef\xbd\x9c"
    "fim\xe2\x96\x81"
    "end\xef\xbd\x9c>",
};
// Fill-in-the-middle pad / repository / file-separator tokens also end generation.
constexpr std::string_view kFimEogTexts[] = {
    "<|fim_pad|>",   "<fim-pad>",  "<fim_pad>", "<PAD>",      "[PAD]",        "<|fim_repo|>",
    "<|repo_name|>", "<fim-repo>", "<REPO>",    "<reponame>", "<|file_sep|>",
};

uint16_t attr_from_type(int32_t type) {
  switch (static_cast<TokenAttr>(type)) {
    case TokenAttr::kNormal:
      return kAttrNormal;
    case TokenAttr::kUnknown:
      return kAttrUnknown;
    case TokenAttr::kControl:
      return kAttrControl;
    case TokenAttr::kUserDefined:
      return kAttrUserDefined;
    case TokenAttr::kUnused:
      return kAttrUnused;
    case TokenAttr::kByte:
      return kAttrByte;
  }
  return kAttrUndefined;
}

void replace_all(std::string* s, std::string_view from, std::string_view to) {
  std::string out;
  size_t pos = 0;
  for (size_t hit; (hit = s->find(from, pos)) != std::string::npos; pos = hit + from.size()) {
    out.append(*s, pos, hit - pos);
    out.append(to);
  }
  out.append(*s, pos);
  *s = std::move(out);
}

// The byte of a <0xXX> token, read like strtol(text.substr(3, 2), 16).
uint8_t byte_of_token(std::string_view text) {
  unsigned v = 0;
  for (size_t i = 3; i < 5 && i < text.size(); ++i) {
    const int c = std::tolower(static_cast<unsigned char>(text[i]));
    if (c >= '0' && c <= '9') {
      v = v * 16 + static_cast<unsigned>(c - '0');
    } else if (c >= 'a' && c <= 'f') {
      v = v * 16 + static_cast<unsigned>(c - 'a' + 10);
    } else {
      break;
    }
  }
  return static_cast<uint8_t>(v);
}

// llama.cpp's token_to_piece(special = true), cached per token.
std::string make_piece(const Vocab& v, int32_t id) {
  const uint16_t a = v.attr[id];
  const std::string& text = v.text[id];
  if (a & (kAttrUnknown | kAttrControl | kAttrUserDefined)) return text;
  if (a & kAttrNormal) {
    if (v.kind == VocabKind::kBpe) return gpt2_decode_text(text);
    std::string s = text;
    replace_all(&s, kSpaceMark, " ");
    return s;
  }
  if (a & kAttrByte) return std::string(1, static_cast<char>(byte_of_token(text)));
  return "";
}

// C isspace() in the "C" locale, as llama.cpp's lstrip/rstrip use it.
bool c_isspace(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

struct Fragment {
  int32_t token;  // -1: raw text
  size_t offset;
  size_t length;
};

class VocabTokenizer final : public Tokenizer {
 public:
  explicit VocabTokenizer(std::unique_ptr<Vocab> vocab) : v_(std::move(vocab)) {}

  std::vector<int32_t> encode(std::string_view text, bool add_special,
                              bool parse_special) const override {
    std::vector<int32_t> out;
    std::vector<Fragment> fragments;
    if (!text.empty()) fragments = partition(text, parse_special);
    if (add_special && v_->add_bos) out.push_back(v_->bos);
    if (v_->kind == VocabKind::kSpm) {
      bool prev_special = true;  // the first fragment gets the space prefix too
      std::string buf;
      for (const Fragment& f : fragments) {
        if (f.token >= 0) {
          out.push_back(f.token);
          prev_special = true;
          continue;
        }
        buf.clear();
        if (v_->add_space_prefix && prev_special) buf += kSpaceMark;
        for (char c : text.substr(f.offset, f.length)) {
          if (c == ' ') {
            buf += kSpaceMark;
          } else {
            buf.push_back(c);
          }
        }
        spm_tokenize(*v_, buf, &out);
        prev_special = false;
      }
    } else {
      for (const Fragment& f : fragments) {
        if (f.token >= 0) {
          out.push_back(f.token);
        } else {
          bpe_tokenize(*v_, text.substr(f.offset, f.length), &out);
        }
      }
    }
    if (add_special && v_->add_eos) out.push_back(v_->eos);
    return out;
  }

  std::string token_to_piece(int32_t id, bool render_special) const override {
    if (id < 0 || id >= v_->n_vocab()) return "";
    if (!render_special && (v_->attr[id] & (kAttrUnknown | kAttrControl))) return "";
    return v_->piece[id];
  }

  std::string decode(std::span<const int32_t> ids) const override {
    std::string text;
    bool remove_space = v_->add_space_prefix;
    for (int32_t id : ids) {
      std::string_view piece =
          id >= 0 && id < v_->n_vocab() && !(v_->attr[id] & (kAttrUnknown | kAttrControl))
              ? std::string_view(v_->piece[id])
              : std::string_view();
      if (remove_space && !piece.empty() && piece.front() == ' ') piece.remove_prefix(1);
      remove_space = false;
      text.append(piece);
    }
    if (v_->clean_spaces) clean_up_spaces(&text);
    return text;
  }

  int32_t n_vocab() const override { return v_->n_vocab(); }
  int32_t bos_id() const override { return v_->bos; }
  int32_t eos_id() const override { return v_->eos; }
  bool is_eog(int32_t id) const override { return id >= 0 && id < v_->n_vocab() && v_->eog[id]; }
  bool add_bos() const override { return v_->add_bos; }
  std::string model_kind() const override { return v_->kind == VocabKind::kSpm ? "llama" : "gpt2"; }
  std::string_view token_text(int32_t id) const override {
    return id >= 0 && id < v_->n_vocab() ? std::string_view(v_->text[id]) : std::string_view();
  }
  int32_t find_token(std::string_view text) const override { return v_->find(text); }
  TokenAttr token_attr(int32_t id) const override {
    if (id < 0 || id >= v_->n_vocab()) return TokenAttr::kUnused;
    const uint16_t a = v_->attr[id];
    if (a & kAttrUnknown) return TokenAttr::kUnknown;
    if (a & kAttrUnused) return TokenAttr::kUnused;
    if (a & kAttrControl) return TokenAttr::kControl;
    if (a & kAttrUserDefined) return TokenAttr::kUserDefined;
    if (a & kAttrByte) return TokenAttr::kByte;
    return TokenAttr::kNormal;
  }

 private:
  // tokenizer_st_partition: for each special token, longest first, split every raw fragment at
  // each of its occurrences. Control and unknown tokens count only when parse_special; user-defined
  // ones always do. Spaces next to a token with lstrip/rstrip are dropped.
  std::vector<Fragment> partition(std::string_view text, bool parse_special) const {
    std::vector<Fragment> frags{{-1, 0, text.size()}};
    bool present[256] = {};
    for (char c : text) present[static_cast<uint8_t>(c)] = true;
    std::vector<Fragment> next;
    for (int32_t id : v_->special_tokens) {
      const uint16_t a = v_->attr[id];
      if (!parse_special && (a & (kAttrControl | kAttrUnknown))) continue;
      const std::string& tok = v_->text[id];
      if (!present[static_cast<uint8_t>(tok[0])] || text.find(tok) == std::string_view::npos) {
        continue;
      }
      next.clear();
      for (const Fragment& f : frags) {
        if (f.token >= 0) {
          next.push_back(f);
          continue;
        }
        size_t off = f.offset, len = f.length;
        while (true) {
          const size_t hit = text.substr(0, off + len).find(tok, off);
          if (hit == std::string_view::npos) {
            if (len > 0) next.push_back({-1, off, len});
            break;
          }
          size_t left_len = hit - off;
          if (a & kAttrLstrip) {
            while (left_len > 0 && c_isspace(text[off + left_len - 1])) --left_len;
          }
          if (left_len > 0) next.push_back({-1, off, left_len});
          next.push_back({id, 0, 0});
          size_t right_off = hit + tok.size();
          size_t right_len = off + len - right_off;
          if (right_len == 0) break;
          if (a & kAttrRstrip) {
            while (right_len > 0 && c_isspace(text[right_off])) {
              ++right_off;
              --right_len;
            }
          }
          off = right_off;
          len = right_len;
        }
      }
      frags.swap(next);
    }
    return frags;
  }

  // llama_detokenize's clean_up_tokenization_spaces passes, byte for byte.
  static void clean_up_spaces(std::string* text) {
    std::string& t = *text;
    // " ?", " !", " .", " ," lose the space.
    size_t n = t.size(), w = n ? 1 : 0;
    for (size_t i = 1; i < n; ++i) {
      const char x = t[i];
      if (t[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) --w;
      t[w++] = x;
    }
    t.resize(w);
    // " ' " becomes "'".
    n = t.size();
    w = n ? 1 : 0;
    for (size_t i = 1; i < n; ++i) {
      const char x = t[i];
      if (x == '\'' && i + 1 < n && t[i - 1] == ' ' && t[i + 1] == ' ') {
        --w;
        t[++i] = '\0';
      }
      t[w++] = x;
    }
    t.resize(w);
    // " 's", " 'm", " 're", " 've" lose the space.
    n = t.size();
    w = n ? 1 : 0;
    for (size_t i = 1; i < n; ++i) {
      const char x = t[i];
      if (t[i - 1] == ' ' && x == '\'' && i + 1 < n) {
        const char x1 = t[i + 1];
        if (x1 == 's' || x1 == 'm') {
          --w;
        } else if (i + 2 < n &&
                   ((x1 == 'r' && t[i + 2] == 'e') || (x1 == 'v' && t[i + 2] == 'e'))) {
          --w;
        }
      }
      t[w++] = x;
    }
    t.resize(w);
  }

  std::unique_ptr<Vocab> v_;
};

// Builds the BPE merge table. Merge results that are not tokens get symbols past the vocabulary,
// so that merges may name them (llama.cpp matches merges by text, not by token).
void build_merges(const VocabSpec& spec, Vocab* v) {
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> extra;
  auto symbol_of = [&](std::string_view s) -> int32_t {
    const int32_t id = v->find(s);
    if (id >= 0) return id;
    auto it = extra.find(s);
    return it == extra.end() ? -1 : it->second;
  };
  const size_t n = spec.merges.size();
  std::vector<std::pair<std::string_view, std::string_view>> parts(n);
  std::vector<int32_t> results(n);
  std::string joined;
  for (size_t i = 0; i < n; ++i) {
    const std::string_view m = spec.merges[i];
    const size_t sp = m.find(' ', 1);
    if (sp == std::string_view::npos) {
      TROUPE_INPUT_ERROR("%s: merge %zu (\"%s\") is not two tokens separated by a space",
                         spec.source.c_str(), i, spec.merges[i].c_str());
    }
    parts[i] = {m.substr(0, sp), m.substr(sp + 1)};
    joined.assign(parts[i].first).append(parts[i].second);
    int32_t result = symbol_of(joined);
    if (result < 0) {
      result = v->n_vocab() + static_cast<int32_t>(extra.size());
      extra.emplace(joined, result);
    }
    results[i] = result;
  }
  v->merges.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const auto [left, right] = parts[i];
    const int32_t ls = symbol_of(left);
    const int32_t rs = symbol_of(right);
    if (ls < 0 || rs < 0) {
      const std::string unknown(ls < 0 ? left : right);
      TROUPE_INPUT_ERROR("%s: merge %zu (\"%s\") names unknown token \"%s\"", spec.source.c_str(),
                         i, spec.merges[i].c_str(), unknown.c_str());
    }
    const uint64_t key = (static_cast<uint64_t>(ls) << 32) | static_cast<uint32_t>(rs);
    v->merges.emplace(key, BpeMerge{static_cast<int32_t>(i), results[i]});  // first rank wins
  }
}

// Special-token ids: a file's value when in range, else the kind's default when in range.
int32_t pick_id(const std::optional<int64_t>& given, int32_t def, int32_t n_vocab) {
  if (def >= n_vocab) def = -1;
  if (given && *given >= 0 && *given < n_vocab) return static_cast<int32_t>(*given);
  return def;
}

void detect_special_tokens(const VocabSpec& spec, Vocab* v) {
  const int32_t n = v->n_vocab();
  v->eog.assign(n, false);
  auto mark_control = [&](int32_t id) { v->attr[id] |= kAttrControl; };
  for (std::string_view t : kFimTexts) {
    if (int32_t id = v->find(t); id >= 0) mark_control(id);
  }
  if (int32_t id = v->find("<|eom_id|>"); id >= 0) mark_control(id);
  auto mark_eog = [&](std::string_view t) {
    if (int32_t id = v->find(t); id >= 0) {
      v->eog[id] = true;
      mark_control(id);
    }
  };
  for (std::string_view t : kEogTexts) mark_eog(t);
  for (std::string_view t : kFimEogTexts) mark_eog(t);
  for (int32_t id = 0; id < n; ++id) {
    if ((v->attr[id] & kAttrControl) && v->text[id].find("unused") != std::string::npos) {
      v->attr[id] |= kAttrUnused;
    }
  }
  // gpt-oss: these structural tokens are always rendered.
  for (std::string_view t : {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"}) {
    if (int32_t id = v->find(t); id >= 0) v->attr[id] = kAttrUserDefined;
  }
  for (const auto& id_opt : {spec.fim_pad_id, spec.fim_rep_id, spec.fim_sep_id}) {
    const int32_t id = pick_id(id_opt, -1, n);
    if (id >= 0) v->eog[id] = true;
  }
  for (int32_t id : {v->eos, v->eot, v->eom}) {
    if (id >= 0) v->eog[id] = true;
  }
  // Harmony-style vocabularies end a turn with <|end|> but keep generating after it.
  const int32_t end_id = v->find("<|end|>");
  auto eog_text = [&](std::string_view s) {
    const int32_t id = v->find(s);
    return id >= 0 && v->eog[id];
  };
  if (end_id >= 0 && v->eog[end_id] &&
      ((eog_text("<|return|>") && eog_text("<|call|>")) ||
       ((eog_text("<|call|>") || eog_text("<|calls|>")) && eog_text("<|flush|>")))) {
    v->eog[end_id] = false;
    v->attr[end_id] = kAttrUserDefined;
  }
}

void set_strip_attributes(const VocabSpec& spec, Vocab* v) {
  std::string name = spec.model_name;
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (name.find("phi-3") == std::string::npos && name.find("phi3") == std::string::npos) return;
  // Phi-3 drops the spaces after its special tokens.
  for (int32_t id : v->special_tokens) v->attr[id] |= kAttrRstrip;
  auto set = [&](std::string_view text, bool on) {
    const int32_t id = v->find(text);
    if (id < 0) return;
    if (on) {
      v->attr[id] |= kAttrRstrip;
    } else {
      v->attr[id] &= static_cast<uint16_t>(~kAttrRstrip);
    }
  };
  set("</s>", true);
  for (std::string_view t : {"<unk>", "<s>", "<|endoftext|>"}) set(t, false);
}

std::unique_ptr<Vocab> build_vocab(VocabSpec& spec) {
  const char* src = spec.source.c_str();
  const size_t n = spec.tokens.size();
  if (n == 0) TROUPE_INPUT_ERROR("%s: the vocabulary has no tokens", src);
  if (n > static_cast<size_t>(INT32_MAX / 2))
    TROUPE_INPUT_ERROR("%s: too many tokens (%zu)", src, n);
  if (!spec.scores.empty() && spec.scores.size() != n) {
    TROUPE_INPUT_ERROR("%s: %zu scores for %zu tokens", src, spec.scores.size(), n);
  }
  if (!spec.types.empty() && spec.types.size() != n) {
    TROUPE_INPUT_ERROR("%s: %zu token types for %zu tokens", src, spec.types.size(), n);
  }
  auto v = std::make_unique<Vocab>();
  v->kind = spec.kind;
  PreTokenizerInfo info;
  if (spec.kind == VocabKind::kBpe) {
    auto found = pre_tokenizer_info(spec.pre);
    if (!found) TROUPE_INPUT_ERROR("%s: unsupported pre-tokenizer \"%s\"", src, spec.pre.c_str());
    info = *found;
  }
  v->pre = info.pre;

  v->text = std::move(spec.tokens);
  v->score = spec.scores.empty() ? std::vector<float>(n, 0.0f) : std::move(spec.scores);
  v->attr.assign(n, kAttrNormal);
  v->ids.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (v->text[i].empty()) v->text[i] = "[EMPTY_" + std::to_string(i) + "]";
    if (!spec.types.empty()) v->attr[i] = attr_from_type(spec.types[i]);
  }
  // Index after every text is final: the keys point into v->text.
  for (size_t i = 0; i < n; ++i) v->ids.emplace(v->text[i], static_cast<int32_t>(i));

  const int32_t nv = v->n_vocab();
  if (spec.kind == VocabKind::kSpm) {
    v->add_space_prefix = true;
    v->add_bos = true;
    v->bos = pick_id(spec.bos_id, 1, nv);
    v->eos = pick_id(spec.eos_id, 2, nv);
    v->unk = pick_id(spec.unk_id, 0, nv);
    static constexpr char kHex[] = "0123456789ABCDEF";
    for (int b = 0; b < 256; ++b) {
      const char name[7] = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>', 0};
      int32_t id = v->find(name);
      if (id < 0) id = v->find(std::string(1, static_cast<char>(b)));
      v->byte_token[b] = id;
    }
  } else {
    v->clean_spaces = info.clean_spaces;
    v->ignore_merges = info.ignore_merges;
    v->add_bos = info.add_bos;
    v->bos = pick_id(spec.bos_id, 11, nv);
    v->eos = pick_id(spec.eos_id, 11, nv);
    v->unk = pick_id(spec.unk_id, -1, nv);
    build_merges(spec, v.get());
    for (int b = 0; b < 256; ++b) {
      v->byte_symbol[b] = v->find(gpt2_byte_to_utf8(static_cast<uint8_t>(b)));
      v->raw_byte_token[b] = v->find(std::string(1, static_cast<char>(b)));
    }
  }
  v->eot = pick_id(spec.eot_id, -1, nv);
  v->eom = pick_id(spec.eom_id, -1, nv);
  if (spec.add_space_prefix) v->add_space_prefix = *spec.add_space_prefix;
  if (spec.add_bos) v->add_bos = *spec.add_bos;
  if (spec.add_eos) v->add_eos = *spec.add_eos;
  if (v->add_bos && v->bos < 0)
    TROUPE_INPUT_ERROR("%s: add_bos_token is set but there is no BOS token", src);
  if (v->add_eos && v->eos < 0)
    TROUPE_INPUT_ERROR("%s: add_eos_token is set but there is no EOS token", src);

  detect_special_tokens(spec, v.get());
  for (int32_t id = 0; id < nv; ++id) {
    if (v->attr[id] & (kAttrControl | kAttrUserDefined | kAttrUnknown))
      v->special_tokens.push_back(id);
  }
  std::stable_sort(v->special_tokens.begin(), v->special_tokens.end(),
                   [&](int32_t a, int32_t b) { return v->text[a].size() > v->text[b].size(); });
  v->piece.resize(n);
  for (int32_t id = 0; id < nv; ++id) v->piece[id] = make_piece(*v, id);
  set_strip_attributes(spec, v.get());
  return v;
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> build_tokenizer(VocabSpec spec) {
  try {
    return std::unique_ptr<Tokenizer>(new VocabTokenizer(build_vocab(spec)));
  } catch (const InputError& e) {
    return make_error(0, e.what());
  } catch (const std::bad_alloc&) {
    return make_error(0, spec.source + ": out of memory while building the vocabulary");
  }
}

}  // namespace troupe::model::detail
