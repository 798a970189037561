// FP8 block-scaled Hugging Face weights: quantization_config and the *_scale_inv grids.
#include "model/detail/hf_fp8.h"

#include <cmath>

#include "base/check.h"
#include "model/model.h"

namespace troupe::model::detail {

using json = nlohmann::json;

namespace {

// A tensor as a matrix: [rows, cols], or one row of a 1-D tensor.
void matrix_shape(const SafetensorsTensor& t, int64_t* rows, int64_t* cols) {
  if (t.shape.size() == 2) {
    *rows = t.shape[0];
    *cols = t.shape[1];
  } else if (t.shape.size() == 1) {
    *rows = 1;
    *cols = t.shape[0];
  } else {
    TROUPE_INPUT_ERROR(
        "%s: F8_E4M3 tensor '%s' has shape %s; block scales need 1 or 2 "
        "dimensions",
        t.file->c_str(), t.name.c_str(), t.shape_string().c_str());
  }
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

Fp8Format read_fp8_format(const HfConfig& cfg) {
  Fp8Format f;
  const json* q = cfg.find("quantization_config");
  if (q == nullptr) return f;
  const char* path = cfg.path().c_str();
  if (!q->is_object()) TROUPE_INPUT_ERROR("%s: quantization_config must be an object", path);
  auto method = q->find("quant_method");
  if (method == q->end() || !method->is_string())
    TROUPE_INPUT_ERROR("%s: quantization_config.quant_method is missing or not a string", path);
  // detail/hf_compressed.h, detail/hf_mxfp4.h, detail/hf_nvfp4.h
  if (*method == "compressed-tensors" || *method == "mxfp4" || *method == "modelopt") return f;
  if (*method != "fp8")
    TROUPE_INPUT_ERROR(
        "%s: quantization_config.quant_method '%s' is not supported (troupe reads "
        "unquantized F32/F16/BF16 checkpoints, block-scaled \"fp8\" ones, "
        "\"compressed-tensors\" int4, fp8 and nvfp4 ones, ModelOpt's NVFP4 ones and gpt-oss's "
        "\"mxfp4\" experts)",
        path, method->get<std::string>().c_str());
  // "float8_e4m3fn" is PyTorch's name for the same format (MiniMax-M2's config uses it).
  auto fmt = q->find("fmt");
  if (fmt != q->end() && !fmt->is_null() &&
      (!fmt->is_string() || (*fmt != "e4m3" && *fmt != "float8_e4m3fn")))
    TROUPE_INPUT_ERROR(
        "%s: quantization_config.fmt %s is not supported (only \"e4m3\", also written "
        "\"float8_e4m3fn\")",
        path, fmt->dump().c_str());
  auto block = q->find("weight_block_size");
  if (block == q->end() || block->is_null())
    TROUPE_INPUT_ERROR(
        "%s: quantization_config \"fp8\" without weight_block_size (one scale per "
        "tensor) is not supported; troupe reads block-scaled fp8",
        path);
  if (!block->is_array() || block->size() != 2 || !(*block)[0].is_number_integer() ||
      !(*block)[1].is_number_integer())
    TROUPE_INPUT_ERROR("%s: quantization_config.weight_block_size must be two integers, got %s",
                       path, block->dump().c_str());
  f.block_rows = (*block)[0].get<int64_t>();
  f.block_cols = (*block)[1].get<int64_t>();
  if (f.block_rows < 1 || f.block_rows > kMaxDim || f.block_cols < 16 || f.block_cols > kMaxDim ||
      f.block_cols % 16 != 0)
    TROUPE_INPUT_ERROR(
        "%s: quantization_config.weight_block_size [%lld, %lld] is not supported "
        "(rows >= 1, columns a positive multiple of 16)",
        path, static_cast<long long>(f.block_rows), static_cast<long long>(f.block_cols));
  f.on = true;
  return f;
}

namespace {

// The block shape of f's scales for a [rows, cols] weight.
void scale_block(const Fp8Format& f, int64_t rows, int64_t cols, int64_t* br, int64_t* bc) {
  switch (f.scales) {
    case Fp8Format::Scales::kBlock:
      *br = f.block_rows;
      *bc = f.block_cols;
      return;
    case Fp8Format::Scales::kRow:
      *br = 1;
      *bc = cols;
      return;
    case Fp8Format::Scales::kTensor:
      *br = rows;
      *bc = cols;
      return;
  }
}

}  // namespace

const float* fp8_scales(const SafetensorsSet& st, const SafetensorsTensor& t, const Fp8Format& f,
                        const std::string& config_path, const Allocator& alloc) {
  if (!f.on)
    TROUPE_INPUT_ERROR(
        "%s: tensor '%s' is F8_E4M3 but %s has no quantization_config \"fp8\" "
        "(which says how its values are scaled)",
        t.file->c_str(), t.name.c_str(), config_path.c_str());
  int64_t rows = 0, cols = 0;
  matrix_shape(t, &rows, &cols);
  std::string sname = t.name + f.scale_suffix;
  const SafetensorsTensor* s = st.find(sname);
  // DeepSeek-V4's checkpoints name the grid of "X.weight" "X.scale".
  if (s == nullptr && t.name.ends_with(".weight")) {
    const std::string v4 = t.name.substr(0, t.name.size() - 7) + ".scale";
    s = st.find(v4);
    if (s != nullptr) sname = v4;
  }
  if (s == nullptr)
    TROUPE_INPUT_ERROR("%s: F8_E4M3 tensor '%s' has no scales ('%s' is missing)", t.file->c_str(),
                       t.name.c_str(), sname.c_str());
  int64_t br = 0, bc = 0;
  scale_block(f, rows, cols, &br, &bc);
  if (bc % 16 != 0)
    TROUPE_INPUT_ERROR(
        "%s: F8_E4M3 tensor '%s' has %lld columns per scale; troupe needs a multiple of 16",
        t.file->c_str(), t.name.c_str(), static_cast<long long>(bc));
  const int64_t grid_rows = ceil_div(rows, br), grid_cols = ceil_div(cols, bc);
  bool shape_ok = false;
  if (f.scales == Fp8Format::Scales::kTensor) {
    shape_ok = s->num_elements() == 1 && s->shape.size() <= 2;
  } else {
    const std::vector<int64_t> want = t.shape.size() == 2
                                          ? std::vector<int64_t>{grid_rows, grid_cols}
                                          : std::vector<int64_t>{grid_cols};
    shape_ok = s->shape == want;
  }
  if (!shape_ok)
    TROUPE_INPUT_ERROR(
        "%s: scales '%s' have shape %s; %s with blocks of %lld x %lld needs [%lld, "
        "%lld]",
        s->file->c_str(), sname.c_str(), s->shape_string().c_str(), t.shape_string().c_str(),
        static_cast<long long>(br), static_cast<long long>(bc), static_cast<long long>(grid_rows),
        static_cast<long long>(grid_cols));
  // F8_E8M0 (DeepSeek-V4's "ue8m0" scales): each byte a power of two.
  const bool e8m0 = s->dtype == "F8_E8M0";
  if (!e8m0 && (!s->supported || s->type == GgmlType::kF8_E4M3))
    TROUPE_INPUT_ERROR(
        "%s: scales '%s' have dtype %s; troupe reads F32, BF16, F16 or F8_E8M0 scales",
        s->file->c_str(), sname.c_str(), s->dtype.c_str());
  const auto n = static_cast<size_t>(grid_rows * grid_cols);
  const float* out = nullptr;
  if (s->type == GgmlType::kF32 && reinterpret_cast<uintptr_t>(s->data) % alignof(float) == 0) {
    out = reinterpret_cast<const float*>(s->data);
  } else {
    auto* conv = reinterpret_cast<float*>(alloc(n * sizeof(float)));
    scales_to_f32(s->data, e8m0 ? GgmlType::kE8M0 : s->type, static_cast<int64_t>(n), conv);
    out = conv;
  }
  for (size_t i = 0; i < n; ++i)
    if (!(std::fabs(out[i]) <= 0x1p64f))
      TROUPE_INPUT_ERROR(
          "%s: scales '%s': scale %zu is %g (must be finite, at most 2^64 in "
          "magnitude)",
          s->file->c_str(), sname.c_str(), i, static_cast<double>(out[i]));
  return out;
}

void attach_fp8_scales(const SafetensorsSet& st, const SafetensorsTensor& t, const Fp8Format& f,
                       const std::string& config_path, const Allocator& alloc, WeightView& w) {
  int64_t rows = 0, cols = 0;
  matrix_shape(t, &rows, &cols);
  w.scales = fp8_scales(st, t, f, config_path, alloc);
  scale_block(f, rows, cols, &w.scale_block[0], &w.scale_block[1]);
  w.scale_stride = ceil_div(cols, w.scale_block[1]);
}

}  // namespace troupe::model::detail
