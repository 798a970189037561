// compressed-tensors Hugging Face checkpoints: quantization_config (int4 "pack-quantized" and FP8
// "float-quantized" groups) and the int4 weight_packed / weight_scale / weight_shape triples.
#include "model/detail/hf_compressed.h"

#include <cstring>

#include "base/check.h"

namespace troupe::model::detail {

using json = nlohmann::json;

namespace {

bool absent(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null();
}

// Absent, null or {} (how compressed-tensors writes "none" for its optional sections).
bool absent_or_empty(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() || (it->is_object() && it->empty());
}

std::string field(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() ? std::string("(absent)") : it->dump();
}

// obj[key] as a string, `def` when absent or null; anything else throws naming `where`.key.
std::string string_or(const json& obj, const char* key, const std::string& def, const char* path,
                      const std::string& where) {
  if (absent(obj, key)) return def;
  const json& v = obj[key];
  if (!v.is_string())
    TROUPE_INPUT_ERROR("%s: %s%s%s must be a string, got %s", path, where.c_str(),
                       where.empty() ? "" : ".", key, v.dump().c_str());
  return v.get<std::string>();
}

// Fields both weight schemes share: symmetric, quantized ahead of time, in column order.
void check_common_weight_fields(const json& w, const char* path, const std::string& where,
                                const char* kind) {
  auto sym = w.find("symmetric");
  if (sym == w.end() || !sym->is_boolean() || !sym->get<bool>())
    TROUPE_INPUT_ERROR(
        "%s: %s.weights.symmetric is %s; asymmetric %s (with zero points) is not supported", path,
        where.c_str(), field(w, "symmetric").c_str(), kind);
  if (!absent(w, "dynamic") && !(w["dynamic"].is_boolean() && !w["dynamic"].get<bool>()))
    TROUPE_INPUT_ERROR("%s: %s.weights.dynamic is %s; weights must be quantized ahead of time",
                       path, where.c_str(), field(w, "dynamic").c_str());
  // "static" activation order reorders columns offline; "group"/"weight" need a g_idx.
  if (!absent(w, "actorder") && !(w["actorder"].is_string() && w["actorder"] == "static") &&
      !(w["actorder"].is_boolean() && !w["actorder"].get<bool>()))
    TROUPE_INPUT_ERROR(
        "%s: %s.weights.actorder %s is not supported (columns reordered by a g_idx); "
        "null or \"static\" is",
        path, where.c_str(), field(w, "actorder").c_str());
}

// An int4 group's columns per scale (0: one per row); throws naming `where`.
int64_t read_int4_scheme(const json& w, const char* path, const std::string& where) {
  auto num_bits = w.find("num_bits");
  if (num_bits == w.end() || !num_bits->is_number_integer() || *num_bits != 4)
    TROUPE_INPUT_ERROR(
        "%s: %s.weights.num_bits is %s; troupe reads 4-bit pack-quantized int weights", path,
        where.c_str(), field(w, "num_bits").c_str());
  check_common_weight_fields(w, path, where, "int4");
  if (!absent(w, "block_structure"))
    TROUPE_INPUT_ERROR("%s: %s.weights.block_structure %s is not supported", path, where.c_str(),
                       field(w, "block_structure").c_str());
  const std::string strategy = string_or(w, "strategy", "", path, where + ".weights");
  if (strategy == "channel") return 0;
  if (strategy != "group")
    TROUPE_INPUT_ERROR(
        "%s: %s.weights.strategy is %s; troupe reads \"group\" and \"channel\" int4 "
        "weights",
        path, where.c_str(), field(w, "strategy").c_str());
  auto gs = w.find("group_size");
  if (gs == w.end() || !gs->is_number_integer() || gs->get<int64_t>() < 16 ||
      gs->get<int64_t>() > kMaxDim || gs->get<int64_t>() % 16 != 0)
    TROUPE_INPUT_ERROR(
        "%s: %s.weights.group_size is %s; troupe needs a positive multiple of 16 (a scale "
        "per 16, 32, 64, 128... columns)",
        path, where.c_str(), field(w, "group_size").c_str());
  return gs->get<int64_t>();
}

// An FP8 group's scale layout (scale tensors "W_scale"); throws naming `where`.
Fp8Format read_fp8_scheme(const json& w, const char* path, const std::string& where) {
  auto num_bits = w.find("num_bits");
  if (num_bits == w.end() || !num_bits->is_number_integer() || *num_bits != 8)
    TROUPE_INPUT_ERROR(
        "%s: %s.weights.num_bits is %s; troupe reads 8-bit (E4M3) float-quantized weights", path,
        where.c_str(), field(w, "num_bits").c_str());
  check_common_weight_fields(w, path, where, "fp8");
  Fp8Format f;
  f.on = true;
  f.scale_suffix = "_scale";
  const std::string strategy = string_or(w, "strategy", "", path, where + ".weights");
  if (strategy == "channel") {
    f.scales = Fp8Format::Scales::kRow;
  } else if (strategy == "tensor") {
    f.scales = Fp8Format::Scales::kTensor;
  } else if (strategy == "block") {
    auto b = w.find("block_structure");
    if (b == w.end() || !b->is_array() || b->size() != 2 || !(*b)[0].is_number_integer() ||
        !(*b)[1].is_number_integer() || (*b)[0].get<int64_t>() < 1 ||
        (*b)[0].get<int64_t>() > kMaxDim || (*b)[1].get<int64_t>() < 16 ||
        (*b)[1].get<int64_t>() > kMaxDim || (*b)[1].get<int64_t>() % 16 != 0)
      TROUPE_INPUT_ERROR(
          "%s: %s.weights.block_structure is %s; troupe needs [rows, columns] with columns a "
          "positive multiple of 16",
          path, where.c_str(), field(w, "block_structure").c_str());
    f.block_rows = (*b)[0].get<int64_t>();
    f.block_cols = (*b)[1].get<int64_t>();
  } else {
    TROUPE_INPUT_ERROR(
        "%s: %s.weights.strategy is %s; troupe reads \"channel\", \"tensor\" and \"block\" "
        "fp8 weights",
        path, where.c_str(), field(w, "strategy").c_str());
  }
  return f;
}

// An NVFP4 group (detail/hf_nvfp4.h): 4-bit float weights, a scale per 16 columns under a
// global one ("tensor_group"). Its activations' FP4 scheme, if any, is not applied: they stay f32,
// as FP8 checkpoints' dynamic ones do. Throws naming `where`.
void read_nvfp4_scheme(const json& g, const char* path, const std::string& where) {
  const json& w = g["weights"];
  check_common_weight_fields(w, path, where, "nvfp4");
  const std::string strategy = string_or(w, "strategy", "", path, where + ".weights");
  if (strategy != "tensor_group")
    TROUPE_INPUT_ERROR(
        "%s: %s.weights.strategy is %s; NVFP4 weights are \"tensor_group\" (a scale per 16 "
        "columns and one per tensor)",
        path, where.c_str(), field(w, "strategy").c_str());
  auto gs = w.find("group_size");
  if (gs == w.end() || !gs->is_number_integer() || *gs != 16)
    TROUPE_INPUT_ERROR("%s: %s.weights.group_size is %s; NVFP4 scales groups of 16 columns", path,
                       where.c_str(), field(w, "group_size").c_str());
  if (!absent(g, "output_activations"))
    TROUPE_INPUT_ERROR("%s: %s quantizes output activations; troupe does not", path, where.c_str());
}

bool same_scales(const Fp8Format& a, const Fp8Format& b) {
  return a.scales == b.scales && a.block_rows == b.block_rows && a.block_cols == b.block_cols;
}

}  // namespace

CompressedFormat read_compressed_format(const HfConfig& cfg) {
  CompressedFormat f;
  const json* q = cfg.find("quantization_config");
  if (q == nullptr || !q->is_object()) return f;
  auto method = q->find("quant_method");
  if (method == q->end() || !method->is_string() || *method != "compressed-tensors") return f;
  const char* path = cfg.path().c_str();
  // "mixed-precision" marks a checkpoint whose groups name their own formats (checked below).
  const std::string format = string_or(*q, "format", "", path, "quantization_config");
  if (format != "pack-quantized" && format != "float-quantized" &&
      format != "nvfp4-pack-quantized" && format != "mixed-precision")
    TROUPE_INPUT_ERROR(
        "%s: compressed-tensors format %s is not supported (troupe reads \"pack-quantized\" "
        "int4, \"float-quantized\" fp8 and \"nvfp4-pack-quantized\")",
        path, field(*q, "format").c_str());
  if (!absent(*q, "quantization_status") && (*q)["quantization_status"] != "compressed")
    TROUPE_INPUT_ERROR("%s: quantization_status %s: the weights are not stored compressed", path,
                       field(*q, "quantization_status").c_str());
  for (const char* section : {"sparsity_config", "transform_config"})
    if (!absent_or_empty(*q, section))
      TROUPE_INPUT_ERROR("%s: compressed-tensors %s is not supported", path, section);
  if (!absent(*q, "kv_cache_scheme"))
    TROUPE_INPUT_ERROR(
        "%s: compressed-tensors kv_cache_scheme is not supported (troupe keeps the KV cache "
        "unquantized)",
        path);
  auto groups = q->find("config_groups");
  if (groups == q->end() || !groups->is_object() || groups->empty())
    TROUPE_INPUT_ERROR("%s: compressed-tensors quantization_config needs config_groups", path);
  for (const auto& [name, g] : groups->items()) {
    const std::string where = "config_groups." + name;
    if (!g.is_object()) TROUPE_INPUT_ERROR("%s: %s must be an object", path, where.c_str());
    if (absent(g, "weights") || !g["weights"].is_object())
      TROUPE_INPUT_ERROR("%s: %s has no weights scheme (an object)", path, where.c_str());
    const json& w = g["weights"];
    const std::string type = string_or(w, "type", "int", path, where + ".weights");
    const std::string gformat = string_or(g, "format", format, path, where);
    if (type == "int") {
      if (gformat != "pack-quantized")
        TROUPE_INPUT_ERROR(
            "%s: %s.format \"%s\" is not supported for int weights (only \"pack-quantized\")", path,
            where.c_str(), gformat.c_str());
      // Activations stay f32: a W4A8 scheme's int8 activations would be another model.
      if (!absent(g, "input_activations") || !absent(g, "output_activations"))
        TROUPE_INPUT_ERROR(
            "%s: %s quantizes activations; troupe reads weight-only (W4A16) int4 schemes and "
            "keeps activations in f32",
            path, where.c_str());
      const int64_t group = read_int4_scheme(w, path, where);
      if (f.int4 && group != f.group)
        TROUPE_INPUT_ERROR(
            "%s: config groups quantize with different group sizes (%lld and %lld columns); "
            "troupe needs one int4 scheme",
            path, static_cast<long long>(f.group), static_cast<long long>(group));
      f.int4 = true;
      f.group = group;
    } else if (type == "float" && w.contains("num_bits") && w["num_bits"] == 4) {
      if (gformat != "nvfp4-pack-quantized")
        TROUPE_INPUT_ERROR(
            "%s: %s.format \"%s\" is not supported for 4-bit float weights (only "
            "\"nvfp4-pack-quantized\")",
            path, where.c_str(), gformat.c_str());
      read_nvfp4_scheme(g, path, where);
      f.nvfp4 = true;
    } else if (type == "float") {
      if (gformat != "float-quantized")
        TROUPE_INPUT_ERROR(
            "%s: %s.format \"%s\" is not supported for float weights (only "
            "\"float-quantized\")",
            path, where.c_str(), gformat.c_str());
      // Dynamic (per-token) FP8 activations are computed in f32 instead, as for DeepSeek's FP8;
      // a static input scale would be part of the model's arithmetic.
      if (!absent(g, "output_activations"))
        TROUPE_INPUT_ERROR("%s: %s quantizes output activations; troupe does not", path,
                           where.c_str());
      if (!absent(g, "input_activations")) {
        const json& a = g["input_activations"];
        if (!a.is_object() || !a.contains("dynamic") || !a["dynamic"].is_boolean() ||
            !a["dynamic"].get<bool>())
          TROUPE_INPUT_ERROR(
              "%s: %s.input_activations has static scales (%s); troupe reads dynamic ones (and "
              "keeps activations in f32)",
              path, where.c_str(), a.dump().c_str());
      }
      const Fp8Format fp8 = read_fp8_scheme(w, path, where);
      if (f.fp8.on && !same_scales(fp8, f.fp8))
        TROUPE_INPUT_ERROR(
            "%s: config groups quantize fp8 weights with different scale layouts; troupe "
            "needs one fp8 scheme",
            path);
      f.fp8 = fp8;
    } else {
      TROUPE_INPUT_ERROR(
          "%s: %s.weights.type is %s; troupe reads \"int\" (4-bit) and \"float\" (8-bit) "
          "weights",
          path, where.c_str(), field(w, "type").c_str());
    }
  }
  f.on = true;
  return f;
}

bool is_packed(const SafetensorsSet& st, const std::string& weight_name) {
  return st.find(weight_name + "_packed") != nullptr;
}

bool is_packed_nvfp4(const SafetensorsSet& st, const std::string& weight_name,
                     const CompressedFormat& f) {
  const SafetensorsTensor* p = st.find(weight_name + "_packed");
  return f.nvfp4 && p != nullptr && p->dtype == "U8";
}

WeightView packed_int4_view(const SafetensorsSet& st, const std::string& weight_name,
                            const std::vector<int64_t>& shape, const CompressedFormat& f,
                            const std::string& config_path, const std::string& view_name) {
  const std::string pname = weight_name + "_packed";
  const SafetensorsTensor* p = st.find(pname);
  TROUPE_CHECK(p != nullptr, "no %s", pname.c_str());
  const char* file = p->file->c_str();
  if (!f.int4 && f.nvfp4)
    TROUPE_INPUT_ERROR(
        "%s: tensor '%s' is %s; %s declares NVFP4 (\"nvfp4-pack-quantized\"), whose packed "
        "weights are U8",
        file, pname.c_str(), p->dtype.c_str(), config_path.c_str());
  if (!f.int4)
    TROUPE_INPUT_ERROR(
        "%s: tensor '%s' is packed but %s has no compressed-tensors \"pack-quantized\" "
        "quantization_config (which says how its values are scaled)",
        file, pname.c_str(), config_path.c_str());
  if (shape.size() != 2)
    TROUPE_INPUT_ERROR("%s: '%s' is packed, but the model needs it with shape of %zu dimensions",
                       file, pname.c_str(), shape.size());
  const int64_t rows = shape[0], cols = shape[1];
  const int64_t group = f.group > 0 ? f.group : cols;
  if (cols % 16 != 0 || cols % group != 0)
    TROUPE_INPUT_ERROR(
        "%s: '%s' has %lld columns; packed int4 needs a multiple of 16 and of the group "
        "size %lld",
        file, pname.c_str(), static_cast<long long>(cols), static_cast<long long>(group));
  if (p->dtype != "I32" || p->shape != std::vector<int64_t>{rows, cols / 8})
    TROUPE_INPUT_ERROR(
        "%s: '%s' is %s %s; %lld x %lld int4 values packed eight to a word need I32 "
        "[%lld, %lld]",
        file, pname.c_str(), p->dtype.c_str(), p->shape_string().c_str(),
        static_cast<long long>(rows), static_cast<long long>(cols), static_cast<long long>(rows),
        static_cast<long long>(cols / 8));
  for (const char* extra : {"_zero_point", "_g_idx"})
    if (st.find(weight_name + extra) != nullptr)
      TROUPE_INPUT_ERROR(
          "%s: '%s%s' exists: %s int4 weights are not supported (symmetric, in column "
          "order)",
          file, weight_name.c_str(), extra,
          std::string(extra) == "_zero_point" ? "asymmetric" : "reordered");
  if (const SafetensorsTensor* s = st.find(weight_name + "_shape")) {
    bool ok = (s->dtype == "I32" || s->dtype == "I64") && s->num_elements() == 2;
    int64_t dims[2] = {0, 0};
    for (int i = 0; ok && i < 2; ++i) {
      if (s->dtype == "I32") {
        int32_t v;
        std::memcpy(&v, s->data + 4 * i, 4);
        dims[i] = v;
      } else {
        std::memcpy(&dims[i], s->data + 8 * i, 8);
      }
    }
    if (!ok || dims[0] != rows || dims[1] != cols)
      TROUPE_INPUT_ERROR(
          "%s: '%s_shape' is %s %s holding [%lld, %lld]; the model needs [%lld, %lld]",
          s->file->c_str(), weight_name.c_str(), s->dtype.c_str(), s->shape_string().c_str(),
          static_cast<long long>(dims[0]), static_cast<long long>(dims[1]),
          static_cast<long long>(rows), static_cast<long long>(cols));
  }
  const std::string sname = weight_name + "_scale";
  const SafetensorsTensor* s = st.find(sname);
  if (s == nullptr)
    TROUPE_INPUT_ERROR("%s: packed weight '%s' has no scales ('%s' is missing)", file,
                       pname.c_str(), sname.c_str());
  if (s->shape != std::vector<int64_t>{rows, cols / group})
    TROUPE_INPUT_ERROR(
        "%s: scales '%s' have shape %s; %lld x %lld weights with a scale per %lld columns "
        "need [%lld, %lld]",
        s->file->c_str(), sname.c_str(), s->shape_string().c_str(), static_cast<long long>(rows),
        static_cast<long long>(cols), static_cast<long long>(group), static_cast<long long>(rows),
        static_cast<long long>(cols / group));
  if (!s->supported || s->type == GgmlType::kF8_E4M3)
    TROUPE_INPUT_ERROR("%s: scales '%s' have dtype %s; troupe reads F32, BF16 or F16 scales",
                       s->file->c_str(), sname.c_str(), s->dtype.c_str());
  return WeightView::grouped(view_name, GgmlType::kI4_PACKED, rows, cols, 1, p->data, s->data,
                             s->type, group);
}

}  // namespace troupe::model::detail
