// config.json access and the rope-scaling section (model/detail/hf_config.h).
#include "model/detail/hf_config.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include <sys/stat.h>

#include "base/check.h"
#include "model/rope.h"

namespace troupe::model::detail {

using nlohmann::json;

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) TROUPE_INPUT_ERROR("%s: cannot open", path.c_str());
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return json::parse(ss.str());
  } catch (const json::exception& e) {
    TROUPE_INPUT_ERROR("%s: not valid JSON: %s", path.c_str(), e.what());
  }
}

HfConfig::HfConfig(json j, std::string path) : j_(std::move(j)), path_(std::move(path)) {
  if (!j_.is_object()) TROUPE_INPUT_ERROR("%s: not a JSON object", path_.c_str());
}

const json* HfConfig::find(const std::string& key) const {
  auto it = j_.find(key);
  return it == j_.end() || it->is_null() ? nullptr : &*it;
}

int64_t HfConfig::get_int(const std::string& key) const {
  const json* v = find(key);
  if (!v) TROUPE_INPUT_ERROR("%s: missing key '%s'", path_.c_str(), key.c_str());
  if (!v->is_number_integer())
    TROUPE_INPUT_ERROR("%s: '%s' must be an integer, got %s", path_.c_str(), key.c_str(),
                       v->dump().c_str());
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(kMaxDim))
    TROUPE_INPUT_ERROR("%s: '%s' = %s is too large", path_.c_str(), key.c_str(), v->dump().c_str());
  const int64_t x = v->get<int64_t>();
  if (x < 0 || x > kMaxDim)
    TROUPE_INPUT_ERROR("%s: '%s' = %lld is out of range", path_.c_str(), key.c_str(),
                       static_cast<long long>(x));
  return x;
}

int64_t HfConfig::get_dim(const std::string& key) const {
  const int64_t x = get_int(key);
  if (x <= 0) TROUPE_INPUT_ERROR("%s: '%s' must be positive, got 0", path_.c_str(), key.c_str());
  return x;
}

double HfConfig::get_float_or(const std::string& key, double def) const {
  const json* v = find(key);
  if (!v) return def;
  if (!v->is_number())
    TROUPE_INPUT_ERROR("%s: '%s' must be a number, got %s", path_.c_str(), key.c_str(),
                       v->dump().c_str());
  return v->get<double>();
}

bool HfConfig::get_bool_or(const std::string& key, bool def) const {
  const json* v = find(key);
  if (!v) return def;
  if (!v->is_boolean())
    TROUPE_INPUT_ERROR("%s: '%s' must be true or false, got %s", path_.c_str(), key.c_str(),
                       v->dump().c_str());
  return v->get<bool>();
}

std::string HfConfig::get_string_or(const std::string& key, const std::string& def) const {
  const json* v = find(key);
  if (!v) return def;
  if (!v->is_string())
    TROUPE_INPUT_ERROR("%s: '%s' must be a string, got %s", path_.c_str(), key.c_str(),
                       v->dump().c_str());
  return v->get<std::string>();
}

void apply_hf_rope_scaling(const json& r, const std::string& path_str, bool mla, ModelSpec& s) {
  const char* path = path_str.c_str();
  std::string type = "default";
  for (const char* key : {"rope_type", "type"}) {
    auto t = r.find(key);
    if (t != r.end() && t->is_string()) {
      type = t->get<std::string>();
      break;
    }
  }
  const auto num = [&](const char* key, double def) {
    auto it = r.find(key);
    if (it == r.end() || it->is_null()) return def;
    if (!it->is_number())
      TROUPE_INPUT_ERROR("%s: rope scaling '%s' must be a number, got %s", path, key,
                         it->dump().c_str());
    return it->get<double>();
  };
  if (type == "default") return;
  const double ctx = static_cast<double>(s.n_ctx_train);  // max_position_embeddings
  const double orig = num("original_max_position_embeddings", ctx);
  // An explicit factor wins (as current transformers); without one, a YaRN config that gives
  // the original context means the ratio of the two contexts.
  const double factor =
      num("factor", r.contains("original_max_position_embeddings") && orig > 0 ? ctx / orig : 1.0);
  RopeScaling& sc = s.rope_scaling;
  sc.factor = factor;
  if (type == "linear") {
    if (factor != 1.0) sc.type = RopeScalingType::kLinear;
  } else if (type == "llama3") {
    const double low = num("low_freq_factor", 1.0), high = num("high_freq_factor", 4.0);
    // Equal factors (Llama 4's 1 and 1) leave no band between kept and divided frequencies.
    if (!(high >= low) || !(low > 0) || !(factor > 0) || !(orig > 0))
      TROUPE_INPUT_ERROR(
          "%s: llama3 rope scaling needs factor > 0, 0 < low_freq_factor <= high_freq_factor "
          "and original_max_position_embeddings > 0 (got %g, %g, %g, %g)",
          path, factor, low, high, orig);
    s.rope_freq_factors =
        llama3_freq_factors(s.n_rot, static_cast<double>(s.rope_theta), factor, low, high, orig);
  } else if (type == "yarn") {
    if (!(orig >= 1 && orig <= static_cast<double>(kMaxDim)))
      TROUPE_INPUT_ERROR("%s: YaRN original_max_position_embeddings %g must be in [1, %lld]", path,
                         orig, static_cast<long long>(kMaxDim));
    sc.type = RopeScalingType::kYarn;
    sc.orig_ctx = static_cast<int64_t>(orig);
    sc.beta_fast = num("beta_fast", 32.0);
    sc.beta_slow = num("beta_slow", 1.0);
    auto tr = r.find("truncate");
    if (tr != r.end() && tr->is_boolean()) sc.truncate = tr->get<bool>();
    const double mscale = num("mscale", 0.0), mscale_all_dim = num("mscale_all_dim", 0.0);
    double af = num("attention_factor", 0.0);
    if (af == 0.0)
      af = mscale != 0.0 && mscale_all_dim != 0.0
               ? yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
               : yarn_mscale(factor);
    sc.attn_factor = af;
    // DeepSeek's attention also scales its logits by the all-dims magnitude term, squared.
    if (mla && mscale_all_dim != 0.0) {
      const double m = yarn_mscale(factor, mscale_all_dim);
      s.kq_scale_mult = m * m;
    }
  } else if (type == "longrope" || type == "su") {
    // LongRoPE (Phi-3's 128k models, Phi-3.5-mini, Phi-4-mini): a divisor per rotary pair, and
    // cos and sin scaled by attention_factor, else by sqrt(1 + ln(ctx / orig) / ln(orig)).
    // transformers rotates with short_factor while a sequence is at most orig positions long and
    // with long_factor after; llama.cpp picks one set by its context size. troupe picks as
    // llama.cpp, by the longest sequence it is set to run (rope_frequencies' max_positions).
    const auto factors = [&](const char* key) {
      auto it = r.find(key);
      if (it == r.end() || !it->is_array() || static_cast<int64_t>(it->size()) != s.n_rot / 2)
        TROUPE_INPUT_ERROR("%s: longrope %s must be a list of %lld numbers (one per rotary pair)",
                           path, key, static_cast<long long>(s.n_rot / 2));
      std::vector<float> out;
      for (const json& x : *it) {
        if (!x.is_number() || !(x.get<double>() > 0) || !std::isfinite(x.get<double>()))
          TROUPE_INPUT_ERROR("%s: longrope %s holds %s; each must be a finite number > 0", path,
                             key, x.dump().c_str());
        out.push_back(static_cast<float>(x.get<double>()));
      }
      return out;
    };
    s.rope_freq_factors = factors("short_factor");
    s.rope_freq_factors_long = factors("long_factor");
    const bool has_orig = r.contains("original_max_position_embeddings");
    if (!(orig >= 2) || !(ctx >= 1))
      TROUPE_INPUT_ERROR("%s: longrope needs original_max_position_embeddings >= 2 (got %g)", path,
                         orig);
    const double ratio = has_orig ? ctx / orig : num("factor", 1.0);
    double af = num("attention_factor", 0.0);
    if (af == 0.0) af = ratio <= 1.0 ? 1.0 : std::sqrt(1.0 + std::log(ratio) / std::log(orig));
    if (!(af > 0) || !std::isfinite(af))
      TROUPE_INPUT_ERROR("%s: longrope attention_factor %g must be a finite number > 0", path, af);
    sc.factor = 1.0;
    sc.attn_factor = af;
    s.rope_long_after = static_cast<int64_t>(orig);
  } else {
    TROUPE_INPUT_ERROR(
        "%s: rope scaling '%s' is not supported (default, linear, llama3, yarn, longrope)", path,
        type.c_str());
  }
}

std::string read_hf_chat_template(const std::string& dir) {
  auto is_file = [](const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
  };
  const std::string tc = dir + "/tokenizer_config.json";
  if (is_file(tc)) {
    const nlohmann::json j = read_json_file(tc);
    auto it = j.is_object() ? j.find("chat_template") : j.end();
    if (it != j.end() && it->is_string()) return it->get<std::string>();
    if (it != j.end() && it->is_array()) {
      for (const nlohmann::json& e : *it)
        if (e.is_object() && e.value("name", "") == "default" && e.contains("template") &&
            e["template"].is_string())
          return e["template"].get<std::string>();
    }
  }
  const std::string jinja = dir + "/chat_template.jinja";
  if (is_file(jinja)) {
    std::ifstream in(jinja, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  return "";
}

}  // namespace troupe::model::detail
