// NVFP4 Hugging Face weights (model/detail/hf_nvfp4.h): ModelOpt's declaration and the
// weight / weight_scale / global scale triples of both forms.
#include "model/detail/hf_nvfp4.h"

#include <cmath>
#include <cstring>

#include "base/check.h"

namespace troupe::model::detail {

using json = nlohmann::json;

namespace {

// NVFP4 scales one group of this many columns.
constexpr int64_t kGroup = 16;

std::string dump_or_absent(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() ? std::string("(absent)") : it->dump();
}

// A ModelOpt quantization object (config.json's quantization_config or hf_quant_config.json's
// "quantization"): NVFP4 with groups of 16, else InputError naming `path` and `where`.
void check_modelopt(const json& q, const char* path, const std::string& where) {
  auto algo = q.find("quant_algo");
  if (algo == q.end() || !algo->is_string() || *algo != "NVFP4")
    TROUPE_INPUT_ERROR(
        "%s: %squant_algo is %s; troupe reads ModelOpt's \"NVFP4\" checkpoints (FP8 ones as "
        "\"fp8\" or compressed-tensors)",
        path, where.c_str(), dump_or_absent(q, "quant_algo").c_str());
  // The group size may stand at the top or in each config group's weights.
  auto check_group = [&](const json& obj, const std::string& at) {
    auto g = obj.find("group_size");
    if (g == obj.end() || g->is_null()) return;
    if (!g->is_number_integer() || *g != kGroup)
      TROUPE_INPUT_ERROR("%s: %sgroup_size is %s; NVFP4 scales groups of 16 columns", path,
                         at.c_str(), g->dump().c_str());
  };
  check_group(q, where);
  auto groups = q.find("config_groups");
  if (groups != q.end() && groups->is_object())
    for (const auto& [name, grp] : groups->items())
      if (grp.is_object() && grp.contains("weights") && grp["weights"].is_object())
        check_group(grp["weights"], where + "config_groups." + name + ".weights.");
}

const SafetensorsTensor& need(const SafetensorsSet& st, const std::string& name,
                              const std::string& of, const char* file) {
  const SafetensorsTensor* t = st.find(name);
  if (t == nullptr)
    TROUPE_INPUT_ERROR("%s: NVFP4 weight '%s' has no '%s'", file, of.c_str(), name.c_str());
  return *t;
}

std::string shape_of(std::initializer_list<int64_t> dims) {
  std::string s = "[";
  for (const int64_t d : dims) s += (s.size() > 1 ? ", " : "") + std::to_string(d);
  return s + "]";
}

}  // namespace

Nvfp4Kind read_modelopt_format(const HfConfig& cfg, const std::string& dir) {
  if (const json* q = cfg.find("quantization_config")) {
    if (!q->is_object()) return Nvfp4Kind::kNone;  // detail/hf_fp8.h reports it
    auto method = q->find("quant_method");
    if (method == q->end() || !method->is_string() || *method != "modelopt")
      return Nvfp4Kind::kNone;
    check_modelopt(*q, cfg.path().c_str(), "quantization_config.");
    return Nvfp4Kind::kModelOpt;
  }
  const std::string side = dir + "/hf_quant_config.json";
  if (!file_exists(side)) return Nvfp4Kind::kNone;
  const json j = read_json_file(side);
  if (!j.is_object() || !j.contains("quantization") || !j["quantization"].is_object())
    TROUPE_INPUT_ERROR("%s: no \"quantization\" object (ModelOpt's hf_quant_config.json)",
                       side.c_str());
  check_modelopt(j["quantization"], side.c_str(), "quantization.");
  return Nvfp4Kind::kModelOpt;
}

WeightView nvfp4_view(const SafetensorsSet& st, const std::string& weight_name,
                      const std::vector<int64_t>& shape, Nvfp4Kind kind,
                      const std::string& view_name) {
  TROUPE_CHECK(kind != Nvfp4Kind::kNone, "nvfp4_view without a format");
  const bool modelopt = kind == Nvfp4Kind::kModelOpt;
  const std::string base = weight_name.substr(0, weight_name.size() - 7);  // without ".weight"
  const std::string dname = modelopt ? weight_name : weight_name + "_packed";
  const SafetensorsTensor* d = st.find(dname);
  TROUPE_CHECK(d != nullptr, "no %s", dname.c_str());
  const char* file = d->file->c_str();
  if (shape.size() != 2)
    TROUPE_INPUT_ERROR("%s: '%s' is NVFP4, but the model needs it with %zu dimensions", file,
                       dname.c_str(), shape.size());
  const int64_t rows = shape[0], cols = shape[1];
  if (cols % kGroup != 0)
    TROUPE_INPUT_ERROR("%s: '%s' has %lld columns; NVFP4 needs a multiple of 16", file,
                       dname.c_str(), static_cast<long long>(cols));
  if (d->dtype != "U8" || d->shape != std::vector<int64_t>{rows, cols / 2})
    TROUPE_INPUT_ERROR("%s: '%s' is %s %s; %lld x %lld FP4 values two to a byte need U8 %s", file,
                       dname.c_str(), d->dtype.c_str(), d->shape_string().c_str(),
                       static_cast<long long>(rows), static_cast<long long>(cols),
                       shape_of({rows, cols / 2}).c_str());
  const SafetensorsTensor& s = need(st, base + ".weight_scale", dname, file);
  if (s.dtype != "F8_E4M3" || s.shape != std::vector<int64_t>{rows, cols / kGroup})
    TROUPE_INPUT_ERROR(
        "%s: scales '%s' are %s %s; NVFP4's %lld x %lld weights need F8_E4M3 %s (one per 16 "
        "columns)",
        s.file->c_str(), s.name.c_str(), s.dtype.c_str(), s.shape_string().c_str(),
        static_cast<long long>(rows), static_cast<long long>(cols),
        shape_of({rows, cols / kGroup}).c_str());
  const SafetensorsTensor& g =
      need(st, base + (modelopt ? ".weight_scale_2" : ".weight_global_scale"), dname, file);
  if (g.dtype != "F32" || g.num_elements() != 1)
    TROUPE_INPUT_ERROR("%s: global scale '%s' is %s %s; NVFP4 needs one F32 value", g.file->c_str(),
                       g.name.c_str(), g.dtype.c_str(), g.shape_string().c_str());
  float global;
  std::memcpy(&global, g.data, sizeof global);
  if (!std::isfinite(global) || (!modelopt && global == 0.0f))
    TROUPE_INPUT_ERROR("%s: global scale '%s' is %g; it must be finite%s", g.file->c_str(),
                       g.name.c_str(), static_cast<double>(global),
                       modelopt ? "" : " and nonzero (the group scales are divided by it)");
  WeightView v = WeightView::grouped(view_name, GgmlType::kFP4_PACKED, rows, cols, 1, d->data,
                                     s.data, GgmlType::kF8_E4M3, kGroup);
  (modelopt ? v.scale_mul : v.scale_div) = global;
  return v;
}

}  // namespace troupe::model::detail
