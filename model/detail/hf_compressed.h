// compressed-tensors checkpoints (llm-compressor's format) with int4 weights ("pack-quantized":
// the W4A16 releases, and Kimi-K2-Thinking, whose routed experts ship this way) or FP8 ones
// ("float-quantized": F8_E4M3 "X.weight" with "X.weight_scale", read as detail/hf_fp8.h reads
// DeepSeek's), or both ("mixed-precision"). For int4, config.json's
// quantization_config {"quant_method": "compressed-tensors", "format": "pack-quantized",
// "config_groups": {...: {"weights": {"num_bits": 4, "type": "int", "symmetric": true,
// "strategy": "group", "group_size": g}}}}. Each quantized linear layer X has, instead of
// "X.weight":
//   X.weight_packed  I32 [rows, cols / 8]: value c of a row in bits 4(c % 8).. of word c / 8,
//                    stored as q + 8 (q in [-8, 7]);
//   X.weight_scale   [rows, cols / g] (strategy "group") or [rows, 1] ("channel"): F32, BF16 or
//                    F16; the weight is q * scale;
//   X.weight_shape   (optional) [rows, cols].
// They become GgmlType::kI4_PACKED views straight into the mapping, scales in their stored type.
// NVFP4 groups ("nvfp4-pack-quantized": 4-bit float weights, strategy "tensor_group", groups of
// 16) are read by detail/hf_nvfp4.h. Used by model/hf_model.cc only.
#pragma once

#include <cstdint>
#include <string>

#include "model/detail/hf_config.h"
#include "model/detail/hf_fp8.h"
#include "model/model_spec.h"
#include "model/safetensors.h"

namespace troupe::model::detail {

struct CompressedFormat {
  bool on = false;     // quantization_config says compressed-tensors
  bool int4 = false;   // a "pack-quantized" int4 group:
  int64_t group = 0;   //   columns per scale; 0 for one scale per row (strategy "channel")
  bool nvfp4 = false;  // an "nvfp4-pack-quantized" group (detail/hf_nvfp4.h)
  Fp8Format fp8;       // a "float-quantized" FP8 group (fp8.on): scales "W_scale" per channel,
                       //   tensor or block
};

/// quantization_config of config.json: absent, or another quant_method, gives `on` false.
/// "compressed-tensors" groups must each be the pack-quantized, symmetric int4 scheme above
/// (weights only), NVFP4 weights (any activation scheme: activations stay f32), or symmetric FP8
/// E4M3 weights ("float-quantized", scales per channel, tensor or block; dynamic input
/// activations are allowed and computed in f32, as DeepSeek's FP8) --
/// one int4 and one FP8 scheme at most ("mixed-precision" checkpoints hold both), no KV-cache
/// quantization, no sparsity, no activation reordering: anything else throws InputError naming
/// the file and the field.
CompressedFormat read_compressed_format(const HfConfig& cfg);

/// Whether "X.weight" (weight_name) is stored packed: "X.weight_packed" exists.
bool is_packed(const SafetensorsSet& st, const std::string& weight_name);
/// Whether it is packed NVFP4: "X.weight_packed" is U8 and the config declares NVFP4.
bool is_packed_nvfp4(const SafetensorsSet& st, const std::string& weight_name,
                     const CompressedFormat& f);

/// The packed weight "X.weight" (weight_name) of torch shape `shape` ([rows, cols]) as an
/// I4_PACKED view named `view_name`, checked: the file declares the format, the packed words,
/// scales and shape tensors have the dtypes and shapes above, there is no zero point (asymmetric)
/// or g_idx (activation order), and cols is a multiple of 16 and of the group. Throws InputError
/// naming the tensor. The scale values are not scanned (they are an eighth of the weights' bytes,
/// and a node reads only its own): like a GGUF block scale, a non-finite one makes its rows'
/// outputs non-finite.
WeightView packed_int4_view(const SafetensorsSet& st, const std::string& weight_name,
                            const std::vector<int64_t>& shape, const CompressedFormat& f,
                            const std::string& config_path, const std::string& view_name);

}  // namespace troupe::model::detail
