// gpt-oss's Hugging Face experts. In its released checkpoints (quantization_config
// {"quant_method": "mxfp4"}) each stacked expert matrix X of torch shape [n_expert, rows, cols]
// is stored as two U8 tensors:
//   X_blocks  [n_expert, rows, cols / 32, 16]: E2M1 codes, two to a byte, low nibble first;
//   X_scales  [n_expert, rows, cols / 32]:     one E8M0 exponent per 32 values of a row;
// (the OCP microscaling FP4 format), read in place as GgmlType::kFP4_PACKED views. gate_up's rows
// alternate gate, up. Checkpoints saved after dequantization instead hold X as a plain
// [n_expert, cols_in, cols_out] tensor (the product x @ X), which is transposed into memory.
// Used by model/hf_model.cc only.
#pragma once

#include <cstdint>
#include <string>

#include "model/detail/hf_config.h"
#include "model/model_spec.h"
#include "model/safetensors.h"

namespace troupe::model::detail {

/// Whether quantization_config says "mxfp4".
bool is_mxfp4(const HfConfig& cfg);

/// The MXFP4 stack `base` ("..._blocks" and "..._scales") of n_expert matrices [rows, cols] as
/// one 3-D FP4_PACKED view named `view_name` (slice(e) gives expert e's), checked: both tensors
/// exist with dtype U8 and exactly the shapes above, cols a multiple of 32. Throws InputError
/// naming the tensor. Scale bytes are not scanned: a 255 (E8M0's NaN) makes its rows' outputs
/// NaN, as a non-finite GGUF block scale does.
WeightView mxfp4_stack_view(const SafetensorsSet& st, const std::string& base, int64_t n_expert,
                            int64_t rows, int64_t cols, const std::string& config_path,
                            const std::string& view_name);

}  // namespace troupe::model::detail
