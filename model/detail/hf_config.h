// config.json of a Hugging Face model directory: typed access whose errors name the file and the
// key, and the rope-scaling section turned into ModelSpec fields. Used by model/hf_model.cc and
// model/hf_vision.cc.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "model/model_spec.h"

namespace troupe::model::detail {

inline constexpr int64_t kMaxDim = int64_t{1} << 24;  // any one hyperparameter (vocab, width)

/// Whether `path` names a regular file (a model directory's config.json, tokenizer, ...).
bool file_exists(const std::string& path);

/// The JSON document at `path`; throws InputError naming the file when unreadable or invalid.
nlohmann::json read_json_file(const std::string& path);

/// Typed access to config.json; a JSON null counts as absent. Errors name the file and the key.
class HfConfig {
 public:
  HfConfig(nlohmann::json j, std::string path);
  const std::string& path() const { return path_; }
  const nlohmann::json* find(const std::string& key) const;
  bool has(const std::string& key) const { return find(key) != nullptr; }

  /// An integer in [0, kMaxDim].
  int64_t get_int(const std::string& key) const;
  int64_t get_int_or(const std::string& key, int64_t def) const {
    return has(key) ? get_int(key) : def;
  }
  /// A positive dimension.
  int64_t get_dim(const std::string& key) const;
  double get_float_or(const std::string& key, double def) const;
  bool get_bool_or(const std::string& key, bool def) const;
  std::string get_string_or(const std::string& key, const std::string& def) const;

 private:
  nlohmann::json j_;
  std::string path_;
};

/// tokenizer_config.json "chat_template" (a string, or a list of {name, template} where the
/// "default" entry is used), else chat_template.jinja; "" when none.
std::string read_hf_chat_template(const std::string& dir);

/// transformers' rope scaling (`rope_scaling` and `rope_parameters`, merged into `params`):
/// default, linear, llama3 (per-pair divisors) and yarn (DeepSeek's form, with mscale_all_dim on
/// the attention logits, when `mla`). Needs s.n_rot, s.rope_theta and s.n_ctx_train set.
/// Anything else throws InputError naming `path` and the kind.
void apply_hf_rope_scaling(const nlohmann::json& params, const std::string& path, bool mla,
                           ModelSpec& s);

}  // namespace troupe::model::detail
