// Tokenizer::from_hf_dir's loader: a Hugging Face tokenizer.json (byte-level BPE), SentencePiece
// tokenizer.model (read with a minimal protobuf reader) or tiktoken.model (Kimi-K2's; the
// ranks are read in tokenizer_tiktoken.cc), plus tokenizer_config.json, turned into
// the same VocabSpec a GGUF conversion (convert_hf_to_gguf.py) would produce.
// Reads the files once; the returned tokenizer keeps nothing from them.
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/check.h"
#include "model/detail/tokenizer_vocab.h"
#include "model/tokenizer.h"

namespace troupe::model::detail {

namespace {

using nlohmann::json;

bool file_exists(const std::string& path) { return std::ifstream(path).good(); }

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) TROUPE_INPUT_ERROR("%s: cannot open", path.c_str());
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) TROUPE_INPUT_ERROR("%s: read error", path.c_str());
  return ss.str();
}

json read_json(const std::string& path) {
  try {
    return json::parse(read_file(path));
  } catch (const json::exception& e) {
    TROUPE_INPUT_ERROR("%s: invalid JSON: %s", path.c_str(), e.what());
  }
}

// A token given in tokenizer_config.json as a string or as {"content": ...}.
std::optional<std::string> token_content(const json& config, const char* key) {
  if (!config.is_object() || !config.contains(key)) return std::nullopt;
  const json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return v["content"].get<std::string>();
  }
  return std::nullopt;
}

std::optional<bool> config_bool(const json& config, const char* key) {
  if (config.is_object() && config.contains(key) && config[key].is_boolean()) {
    return config[key].get<bool>();
  }
  return std::nullopt;
}

std::optional<int64_t> id_of(const VocabSpec& spec, const std::optional<std::string>& text) {
  if (!text) return std::nullopt;
  for (size_t i = 0; i < spec.tokens.size(); ++i) {
    if (spec.tokens[i] == *text) return static_cast<int64_t>(i);
  }
  return std::nullopt;
}

// convert_hf_to_gguf.py's does_token_look_special.
bool looks_special(const std::string& t) {
  auto starts = [&](std::string_view p) {
    return t.size() >= p.size() && t.compare(0, p.size(), p) == 0;
  };
  auto ends = [&](std::string_view s) {
    return t.size() >= s.size() && t.compare(t.size() - s.size(), s.size(), s) == 0;
  };
  return t == "<pad>" || t == "<mask>" || t == "<2mass>" || t == "[@BOS@]" ||
         (starts("<|") && ends("|>")) || (starts("<\xef\xbd\x9c") && ends("\xef\xbd\x9c>")) ||
         (starts("<unused") && ends(">"));
}

void apply_config_specials(const json& config, VocabSpec* spec) {
  if (auto id = id_of(*spec, token_content(config, "bos_token"))) spec->bos_id = id;
  if (auto id = id_of(*spec, token_content(config, "eos_token"))) spec->eos_id = id;
  if (auto id = id_of(*spec, token_content(config, "unk_token"))) spec->unk_id = id;
  if (auto v = config_bool(config, "add_bos_token")) spec->add_bos = v;
  if (auto v = config_bool(config, "add_eos_token")) spec->add_eos = v;
}

// ---- tokenizer.json ----------------------------------------------------------------------------

// The Split regexes of known pre-tokenizers, recognised by their distinctive parts.
std::optional<std::string> pre_from_splits(const std::vector<std::string>& re) {
  const std::string kLlama3 =
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
      "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  const std::string kQwen2 =
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
      "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  const std::string kQwen35 =
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| "
      "?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  const std::string kGpt2 =
      "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
  // tiktoken's o200k (gpt-oss's o200k_harmony, GPT-4o), as its tokenizer.json writes it.
  const std::string kO200k =
      "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}"
      "\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}"
      "\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}"
      "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  // Mistral's Tekken (Mistral Nemo, Small 3, Ministral, Devstral, Magistral).
  const std::string kTekken =
      "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}"
      "\\p{M}]+|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}"
      "\\p{Lo}\\p{M}]*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  if (re.size() == 1 && re[0] == kLlama3) return "llama-bpe";
  if (re.size() == 1 && re[0] == kO200k) return "gpt-4o";
  if (re.size() == 1 && re[0] == kTekken) return "tekken";
  if (re.size() == 1 && re[0] == kQwen2) return "qwen2";
  if (re.size() == 1 && re[0] == kQwen35) return "qwen35";
  if (re.size() == 1 && (re[0] == kGpt2 || re[0] + "|\\s+" == kGpt2)) return "gpt-2";
  if (re.size() == 6 && re[0] == "[\r\n]" && re[1].rfind("\\s?[A-Za-z\xc2\xb5", 0) == 0 &&
      re[3] == "\\s+$" && re[5] == "\\p{N}+") {
    return "deepseek-llm";
  }
  if (re.size() == 3 && re[0] == "\\p{N}{1,3}" &&
      re[1] == "[\xe4\xb8\x80-\xe9\xbe\xa5\xe3\x81\x80-\xe3\x82\x9f\xe3\x82\xa0-\xe3\x83\xbf]+") {
    return "deepseek-v3";
  }
  return std::nullopt;
}

// Maps tokenizer.json's pre_tokenizer to a tokenizer.ggml.pre name; nullopt if not byte-level.
std::optional<std::string> pre_from_json(const json& pt, const std::string& path) {
  if (!pt.is_object()) return std::nullopt;
  const std::string type = pt.value("type", "");
  if (type == "ByteLevel") {
    if (pt.value("add_prefix_space", false)) {
      TROUPE_INPUT_ERROR("%s: ByteLevel pre_tokenizer with add_prefix_space is not supported",
                         path.c_str());
    }
    if (!pt.value("use_regex", true)) {
      TROUPE_INPUT_ERROR("%s: ByteLevel pre_tokenizer without a regex is not supported",
                         path.c_str());
    }
    return "gpt-2";
  }
  if (type != "Sequence" || !pt.contains("pretokenizers") || !pt["pretokenizers"].is_array()) {
    return std::nullopt;
  }
  std::vector<std::string> splits;
  bool byte_level = false;
  for (const json& p : pt["pretokenizers"]) {
    const std::string t = p.value("type", "");
    if (t == "Split" && p.contains("pattern") && p["pattern"].contains("Regex")) {
      splits.push_back(p["pattern"]["Regex"].get<std::string>());
    } else if (t == "ByteLevel") {
      byte_level = true;
      if (p.value("use_regex", true))
        splits.push_back(
            "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+");
    } else {
      TROUPE_INPUT_ERROR("%s: unsupported pre_tokenizer step \"%s\"", path.c_str(), t.c_str());
    }
  }
  if (!byte_level) return std::nullopt;
  auto pre = pre_from_splits(splits);
  if (!pre) {
    TROUPE_INPUT_ERROR("%s: unsupported pre_tokenizer regex \"%s\"", path.c_str(),
                       splits.empty() ? "" : splits[0].c_str());
  }
  return pre;
}

std::optional<VocabSpec> spec_from_tokenizer_json(const std::string& path, const json& config) {
  const json j = read_json(path);
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object()) {
    TROUPE_INPUT_ERROR("%s: no \"model\" object", path.c_str());
  }
  const json& model = j["model"];
  const std::string type = model.value("type", "BPE");
  const json pre_tokenizer = j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json();
  auto pre = type == "BPE" ? pre_from_json(pre_tokenizer, path) : std::nullopt;
  if (!pre) return std::nullopt;  // not byte-level BPE: the caller may try tokenizer.model

  VocabSpec spec;
  spec.source = path;
  spec.kind = VocabKind::kBpe;
  spec.pre = *pre;
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    TROUPE_INPUT_ERROR("%s: model has no \"vocab\" object", path.c_str());
  }
  std::vector<std::pair<std::string, int64_t>> entries;
  int64_t max_id = -1;
  for (const auto& [text, id] : model["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (1 << 24)) {
      TROUPE_INPUT_ERROR("%s: vocab entry \"%s\" has a bad id", path.c_str(), text.c_str());
    }
    entries.emplace_back(text, id.get<int64_t>());
    max_id = std::max(max_id, id.get<int64_t>());
  }
  const json added = j.contains("added_tokens") && j["added_tokens"].is_array() ? j["added_tokens"]
                                                                                : json::array();
  for (const json& a : added) {
    if (!a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
        !a["content"].is_string() || a["id"].get<int64_t>() < 0 ||
        a["id"].get<int64_t>() >= (1 << 24)) {
      TROUPE_INPUT_ERROR("%s: malformed added_tokens entry %s", path.c_str(), a.dump().c_str());
    }
    max_id = std::max(max_id, a["id"].get<int64_t>());
  }
  const size_t n = static_cast<size_t>(max_id + 1);
  spec.tokens.assign(n, std::string());
  spec.types.assign(n, static_cast<int32_t>(TokenAttr::kUnused));
  std::vector<bool> seen(n, false);
  for (auto& [text, id] : entries) {
    if (seen[id])
      TROUPE_INPUT_ERROR("%s: id %lld appears twice in vocab", path.c_str(),
                         static_cast<long long>(id));
    seen[id] = true;
    spec.tokens[id] = std::move(text);
    spec.types[id] = static_cast<int32_t>(TokenAttr::kNormal);
  }
  for (const json& a : added) {
    const int64_t id = a["id"].get<int64_t>();
    const std::string content = a["content"].get<std::string>();
    seen[id] = true;
    spec.tokens[id] = content;
    const bool special = a.value("special", false) || looks_special(content);
    spec.types[id] = static_cast<int32_t>(special ? TokenAttr::kControl : TokenAttr::kUserDefined);
  }
  for (size_t i = 0; i < n; ++i) {
    if (!seen[i]) spec.tokens[i] = "[PAD" + std::to_string(i) + "]";
  }
  if (!model.contains("merges") || !model["merges"].is_array()) {
    TROUPE_INPUT_ERROR("%s: model has no \"merges\" array", path.c_str());
  }
  for (const json& m : model["merges"]) {
    if (m.is_string()) {
      spec.merges.push_back(m.get<std::string>());
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      spec.merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
    } else {
      TROUPE_INPUT_ERROR("%s: malformed merge %s", path.c_str(), m.dump().c_str());
    }
  }
  // A TemplateProcessing post-processor that starts with a special token adds it as BOS.
  if (j.contains("post_processor") && j["post_processor"].is_object() &&
      j["post_processor"].value("type", "") == "TemplateProcessing" &&
      j["post_processor"].contains("single") && j["post_processor"]["single"].is_array() &&
      !j["post_processor"]["single"].empty()) {
    const json& first = j["post_processor"]["single"][0];
    if (first.contains("SpecialToken") && first["SpecialToken"].contains("id")) {
      if (auto id = id_of(spec, first["SpecialToken"]["id"].get<std::string>())) {
        spec.bos_id = id;
        spec.add_bos = true;
      }
    }
  }
  apply_config_specials(config, &spec);
  return spec;
}

// ---- tokenizer.model (SentencePiece ModelProto) -----------------------------------------------

class ProtoReader {
 public:
  ProtoReader(std::string_view data, const std::string& path, size_t base)
      : data_(data), path_(path), base_(base) {}

  bool done() const { return pos_ >= data_.size(); }

  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= data_.size()) fail("truncated varint");
      const uint8_t b = static_cast<uint8_t>(data_[pos_++]);
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if ((b & 0x80) == 0) return v;
    }
    fail("varint longer than 10 bytes");
  }

  // Reads a field key; returns its number and sets *wire.
  uint32_t key(uint32_t* wire) {
    const uint64_t k = varint();
    *wire = static_cast<uint32_t>(k & 7);
    if ((k >> 3) == 0 || (k >> 3) > 0x1FFFFFFF) fail("bad field number");
    return static_cast<uint32_t>(k >> 3);
  }

  std::string_view bytes(size_t* offset) {
    const uint64_t n = varint();
    if (n > data_.size() - pos_) fail("length-delimited field runs past its message");
    *offset = base_ + pos_;
    std::string_view s = data_.substr(pos_, n);
    pos_ += n;
    return s;
  }

  uint32_t fixed32() {
    if (data_.size() - pos_ < 4) fail("truncated fixed32");
    uint32_t v;
    std::memcpy(&v, data_.data() + pos_, 4);
    pos_ += 4;
    return v;
  }

  void skip(uint32_t wire) {
    size_t unused;
    switch (wire) {
      case 0:
        varint();
        break;
      case 1:
        if (data_.size() - pos_ < 8) fail("truncated fixed64");
        pos_ += 8;
        break;
      case 2:
        bytes(&unused);
        break;
      case 5:
        fixed32();
        break;
      default:
        fail("unsupported wire type " + std::to_string(wire));
    }
  }

  void expect(uint32_t wire, uint32_t want, const char* what) {
    if (wire != want) fail(std::string("wrong wire type for ") + what);
  }

  [[noreturn]] void fail(const std::string& what) const {
    TROUPE_INPUT_ERROR("%s: bad protobuf at byte %zu: %s", path_.c_str(), base_ + pos_,
                       what.c_str());
  }

 private:
  std::string_view data_;
  const std::string& path_;
  size_t base_;
  size_t pos_ = 0;
};

struct SentencePieceModel {
  std::vector<std::string> pieces;
  std::vector<float> scores;
  std::vector<int32_t> types;
  int64_t unk_id = 0, bos_id = 1, eos_id = 2;
  bool add_dummy_prefix = true;
};

void parse_piece(std::string_view msg, size_t base, const std::string& path,
                 SentencePieceModel* m) {
  ProtoReader r(msg, path, base);
  std::string piece;
  float score = 0.0f;
  int32_t type = static_cast<int32_t>(TokenAttr::kNormal);
  while (!r.done()) {
    uint32_t wire;
    const uint32_t field = r.key(&wire);
    size_t off;
    if (field == 1) {
      r.expect(wire, 2, "piece");
      piece = std::string(r.bytes(&off));
    } else if (field == 2) {
      r.expect(wire, 5, "score");
      const uint32_t bits = r.fixed32();
      std::memcpy(&score, &bits, 4);
    } else if (field == 3) {
      r.expect(wire, 0, "type");
      type = static_cast<int32_t>(r.varint());
    } else {
      r.skip(wire);
    }
  }
  m->pieces.push_back(std::move(piece));
  m->scores.push_back(score);
  m->types.push_back(type);
}

SentencePieceModel parse_sentencepiece(const std::string& path) {
  const std::string data = read_file(path);
  SentencePieceModel m;
  ProtoReader r(data, path, 0);
  while (!r.done()) {
    uint32_t wire;
    const uint32_t field = r.key(&wire);
    size_t off;
    if (field == 1) {  // repeated SentencePiece pieces
      r.expect(wire, 2, "pieces");
      std::string_view msg = r.bytes(&off);
      parse_piece(msg, off, path, &m);
    } else if (field == 2) {  // TrainerSpec
      r.expect(wire, 2, "trainer_spec");
      std::string_view msg = r.bytes(&off);
      ProtoReader t(msg, path, off);
      while (!t.done()) {
        uint32_t w;
        const uint32_t f = t.key(&w);
        if (w == 0 && (f == 40 || f == 41 || f == 42)) {
          const auto v = static_cast<int64_t>(static_cast<int32_t>(t.varint()));
          (f == 40 ? m.unk_id : f == 41 ? m.bos_id : m.eos_id) = v;
        } else {
          t.skip(w);
        }
      }
    } else if (field == 3) {  // NormalizerSpec
      r.expect(wire, 2, "normalizer_spec");
      std::string_view msg = r.bytes(&off);
      ProtoReader ns(msg, path, off);
      while (!ns.done()) {
        uint32_t w;
        const uint32_t f = ns.key(&w);
        if (f == 3 && w == 0) {
          m.add_dummy_prefix = ns.varint() != 0;
        } else {
          ns.skip(w);
        }
      }
    } else {
      r.skip(wire);
    }
  }
  if (m.pieces.empty()) TROUPE_INPUT_ERROR("%s: bad protobuf: no pieces", path.c_str());
  return m;
}

VocabSpec spec_from_sentencepiece(const std::string& path, const json& config) {
  SentencePieceModel m = parse_sentencepiece(path);
  VocabSpec spec;
  spec.source = path;
  spec.kind = VocabKind::kSpm;
  spec.tokens = std::move(m.pieces);
  spec.scores = std::move(m.scores);
  spec.types = std::move(m.types);
  for (int32_t& t : spec.types) {
    if (t < 1 || t > 6) t = static_cast<int32_t>(TokenAttr::kNormal);
  }
  if (m.unk_id >= 0) spec.unk_id = m.unk_id;
  if (m.bos_id >= 0) spec.bos_id = m.bos_id;
  if (m.eos_id >= 0) spec.eos_id = m.eos_id;
  spec.add_space_prefix = m.add_dummy_prefix;
  // added_tokens_decoder re-types tokens as convert_hf_to_gguf.py does.
  if (config.is_object() && config.contains("added_tokens_decoder") &&
      config["added_tokens_decoder"].is_object()) {
    for (const auto& [key, tok] : config["added_tokens_decoder"].items()) {
      char* end = nullptr;
      const long id = std::strtol(key.c_str(), &end, 10);
      if (end == key.c_str() || *end != '\0' || id < 0 ||
          static_cast<size_t>(id) >= spec.tokens.size())
        continue;
      if (!tok.is_object() || !tok.contains("content") || !tok["content"].is_string()) continue;
      std::string content = tok["content"].get<std::string>();
      const int32_t old_type = spec.types[id];
      if (old_type == static_cast<int32_t>(TokenAttr::kUnknown) ||
          old_type == static_cast<int32_t>(TokenAttr::kControl)) {
        continue;  // already special; keep SentencePiece's own type
      }
      if (tok.value("special", false) || looks_special(content)) {
        spec.types[id] = static_cast<int32_t>(TokenAttr::kControl);
      } else {
        spec.types[id] = static_cast<int32_t>(TokenAttr::kUserDefined);
        for (size_t p; (p = content.find("\xe2\x96\x81")) != std::string::npos;)
          content.replace(p, 3, " ");
      }
      spec.scores[id] = -1000.0f;
      spec.tokens[id] = std::move(content);
    }
  }
  apply_config_specials(config, &spec);
  return spec;
}

// ---- tiktoken.model ----------------------------------------------------------------------------

// A tiktoken vocabulary's split pattern is in the model's Python code, not in a data file: the
// directory must name code troupe knows. Kimi-K2: tokenization_kimi.py.
VocabSpec spec_from_tiktoken_dir(const std::string& dir, const json& config) {
  const std::string path = dir + "/tiktoken.model";
  bool kimi = file_exists(dir + "/tokenization_kimi.py");
  if (config.is_object() && config.contains("auto_map"))
    kimi = kimi || config["auto_map"].dump().find("tokenization_kimi") != std::string::npos;
  if (!kimi)
    TROUPE_INPUT_ERROR(
        "%s: a tiktoken vocabulary's split pattern is in its model's code; troupe "
        "knows Kimi-K2's (tokenization_kimi.py), which this directory does not have",
        path.c_str());
  VocabSpec spec = spec_from_tiktoken(path, "kimi-k2");
  // Special tokens follow the ranks: tokenizer_config.json's added_tokens_decoder names them,
  // the ids between unnamed ones are reserved (as tokenization_kimi.py names them).
  if (config.is_object() && config.contains("added_tokens_decoder") &&
      config["added_tokens_decoder"].is_object()) {
    for (const auto& [key, tok] : config["added_tokens_decoder"].items()) {
      char* end = nullptr;
      const long long id = std::strtoll(key.c_str(), &end, 10);
      if (end == key.c_str() || *end != '\0' || id < 0 || id >= (1 << 24) || !tok.is_object() ||
          !tok.contains("content") || !tok["content"].is_string())
        TROUPE_INPUT_ERROR("%s/tokenizer_config.json: malformed added_tokens_decoder entry \"%s\"",
                           dir.c_str(), key.c_str());
      const auto i = static_cast<size_t>(id);
      if (i < spec.tokens.size() && spec.types[i] != static_cast<int32_t>(TokenAttr::kUnused))
        continue;  // a rank's own token
      while (spec.tokens.size() <= i) {
        spec.tokens.push_back("<|reserved_token_" + std::to_string(spec.tokens.size()) + "|>");
        spec.types.push_back(static_cast<int32_t>(TokenAttr::kControl));
      }
      const std::string content = tok["content"].get<std::string>();
      spec.tokens[i] = content;
      spec.types[i] = static_cast<int32_t>(tok.value("special", false) || looks_special(content)
                                               ? TokenAttr::kControl
                                               : TokenAttr::kUserDefined);
    }
  }
  apply_config_specials(config, &spec);
  return spec;
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> load_hf_tokenizer(const std::string& dir) {
  try {
    const std::string config_path = dir + "/tokenizer_config.json";
    const json config = file_exists(config_path) ? read_json(config_path) : json::object();
    const std::string json_path = dir + "/tokenizer.json";
    const std::string model_path = dir + "/tokenizer.model";
    if (file_exists(json_path)) {
      if (auto spec = spec_from_tokenizer_json(json_path, config)) {
        return build_tokenizer(std::move(*spec));
      }
      if (!file_exists(model_path)) {
        return make_error(0,
                          json_path + ": only byte-level BPE tokenizer.json files are supported");
      }
    }
    if (file_exists(model_path))
      return build_tokenizer(spec_from_sentencepiece(model_path, config));
    const std::string tiktoken_path = dir + "/tiktoken.model";
    if (file_exists(tiktoken_path)) return build_tokenizer(spec_from_tiktoken_dir(dir, config));
    return make_error(0, dir + ": no tokenizer.json, tokenizer.model or tiktoken.model");
  } catch (const InputError& e) {
    return make_error(0, e.what());
  } catch (const json::exception& e) {
    return make_error(0, dir + ": malformed tokenizer files: " + e.what());
  }
}

}  // namespace troupe::model::detail
