// NVIDIA NVFP4 Hugging Face checkpoints: FP4 E2M1 weights, two to a byte (the low nibble first),
// an FP8 E4M3 scale per 16 columns and one f32 global scale per tensor, in the two forms they
// ship in:
//  - ModelOpt (NVIDIA's own "-FP4" / "-NVFP4" releases): config.json's quantization_config
//    {"quant_method": "modelopt", "quant_algo": "NVFP4", ...}, or without one, the file
//    hf_quant_config.json: {"quantization": {"quant_algo": "NVFP4", "group_size": 16, ...}}.
//    A quantized linear layer X has X.weight (U8 [rows, cols / 2]), X.weight_scale (F8_E4M3
//    [rows, cols / 16]) and X.weight_scale_2 (F32, one value): a weight is
//    E2M1(q) * (scale * weight_scale_2).
//  - compressed-tensors "nvfp4-pack-quantized" (llm-compressor): X.weight_packed (U8),
//    X.weight_scale (F8_E4M3) and X.weight_global_scale (F32, one value): a weight is
//    E2M1(q) * (scale / weight_global_scale). Its config is read by detail/hf_compressed.h.
// Both become GgmlType::kFP4_PACKED views straight into the mapping with F8_E4M3 scales and the
// global scale in WeightView::scale_mul or scale_div, so that each group's scale is the float
// nearest that product or quotient, and each weight the float nearest E2M1(q) times it.
// Activations stay f32 (the checkpoints' FP4 activation scheme is not applied, as on GPUs
// without FP4 arithmetic). Layers left unquantized (the head, routers, often attention) are read
// as stored. Used by model/hf_model.cc only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/detail/hf_config.h"
#include "model/model_spec.h"
#include "model/safetensors.h"

namespace troupe::model::detail {

enum class Nvfp4Kind : uint8_t { kNone, kModelOpt, kCompressed };

/// ModelOpt's NVFP4 declaration: config.json's quantization_config with quant_method "modelopt",
/// else `dir`/hf_quant_config.json when it exists. kNone when neither declares ModelOpt; a
/// ModelOpt declaration of another algorithm, or of a group size other than 16, throws InputError
/// naming the file and the field.
Nvfp4Kind read_modelopt_format(const HfConfig& cfg, const std::string& dir);

/// The NVFP4 weight "X.weight" (weight_name, of torch shape `shape`: [rows, cols]) as an
/// FP4_PACKED view named `view_name`; `kind` says which tensors hold it (above). Checked: the
/// dtypes and shapes above, cols a multiple of 16, and a finite global scale (nonzero where it
/// divides). Throws InputError naming the tensor. The group scales are not scanned (a sixteenth
/// of the values; a node reads only its own): a NaN one makes its rows' outputs NaN.
WeightView nvfp4_view(const SafetensorsSet& st, const std::string& weight_name,
                      const std::vector<int64_t>& shape, Nvfp4Kind kind,
                      const std::string& view_name);

}  // namespace troupe::model::detail
