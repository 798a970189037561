// gpt-oss's MXFP4 expert tensors (model/detail/hf_mxfp4.h).
#include "model/detail/hf_mxfp4.h"

#include <nlohmann/json.hpp>

#include "base/check.h"

namespace troupe::model::detail {

bool is_mxfp4(const HfConfig& cfg) {
  const nlohmann::json* q = cfg.find("quantization_config");
  if (q == nullptr || !q->is_object()) return false;
  auto m = q->find("quant_method");
  return m != q->end() && m->is_string() && *m == "mxfp4";
}

WeightView mxfp4_stack_view(const SafetensorsSet& st, const std::string& base, int64_t n_expert,
                            int64_t rows, int64_t cols, const std::string& config_path,
                            const std::string& view_name) {
  const char* dir = config_path.c_str();
  if (cols % 32 != 0)
    TROUPE_INPUT_ERROR("%s: MXFP4 '%s' has rows of %lld values, not a multiple of 32", dir,
                       base.c_str(), static_cast<long long>(cols));
  const int64_t nb = cols / 32;
  auto tensor = [&](const std::string& name, const std::vector<int64_t>& shape) {
    const SafetensorsTensor* t = st.find(name);
    if (t == nullptr)
      TROUPE_INPUT_ERROR("%s: missing tensor '%s' (quantization_config says mxfp4)", dir,
                         name.c_str());
    if (t->dtype != "U8" || t->shape != shape) {
      std::string want = "[";
      for (size_t i = 0; i < shape.size(); ++i) want += (i ? ", " : "") + std::to_string(shape[i]);
      TROUPE_INPUT_ERROR("%s: MXFP4 tensor '%s' is %s %s, expected U8 %s]", t->file->c_str(),
                         name.c_str(), t->dtype.c_str(), t->shape_string().c_str(), want.c_str());
    }
    return t;
  };
  const SafetensorsTensor* blocks = tensor(base + "_blocks", {n_expert, rows, nb, 16});
  const SafetensorsTensor* scales = tensor(base + "_scales", {n_expert, rows, nb});
  return WeightView::grouped(view_name, GgmlType::kFP4_PACKED, rows, cols, n_expert, blocks->data,
                             scales->data, GgmlType::kE8M0, 32);
}

}  // namespace troupe::model::detail
