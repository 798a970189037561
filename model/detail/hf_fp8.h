// Hugging Face FP8 checkpoints with block scales (DeepSeek-V3/R1, Kimi-K2, the Qwen3 "-FP8"
// releases): config.json's quantization_config {"quant_method": "fp8", "fmt": "e4m3",
// "weight_block_size": [rows, cols]}, and beside each F8_E4M3 weight W the tensor
// "W_scale_inv" of ceil(rows / block rows) x ceil(cols / block cols) scales; a value is
// fp8 * its block's scale (the "_inv" is the quantizer's: the scale multiplies). DeepSeek-V4's
// checkpoints call the grid of "X.weight" "X.scale" and store it as F8_E8M0 (powers of two,
// "scale_fmt": "ue8m0"). Used by model/hf_model.cc only.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "model/detail/hf_config.h"
#include "model/model_spec.h"
#include "model/safetensors.h"

namespace troupe::model::detail {

struct Fp8Format {
  bool on = false;  // quantization_config says fp8 (or compressed-tensors float-quantized)
  /// How the scales cover a weight: blocks of block_rows x block_cols (a grid of
  /// ceil(rows / block_rows) x ceil(cols / block_cols)), one per row ([rows, 1]), or one per
  /// tensor ([1], [1, 1] or a scalar).
  enum class Scales : uint8_t { kBlock, kRow, kTensor };
  Scales scales = Scales::kBlock;
  int64_t block_rows = 0;  // kBlock: weight_block_size
  int64_t block_cols = 0;
  /// The scale tensor of weight "W" is "W" + this: DeepSeek's "_scale_inv", compressed-tensors'
  /// "_scale".
  std::string scale_suffix = "_scale_inv";
};

/// quantization_config of config.json: absent (or null), or "compressed-tensors"
/// (detail/hf_compressed.h), gives `on` false; "fp8" with fmt e4m3
/// (the default) and a weight_block_size whose column count is a multiple of 16 gives its block.
/// Any other method, format or block, or a malformed field, throws InputError naming the file.
Fp8Format read_fp8_format(const HfConfig& cfg);

/// Allocates model-owned, 64-byte aligned memory.
using Allocator = std::function<uint8_t*(uint64_t bytes)>;

/// The scales of the F8_E4M3 tensor `t` ([rows, cols], or [n] as one row), checked: the file
/// declares fp8, "<name><scale_suffix>" (or DeepSeek-V4's "<stem>.scale") exists with the shape
/// `f` gives, is F32, BF16, F16 or F8_E8M0,
/// and every scale is finite with magnitude at most 2^64; the scale blocks' columns are a
/// multiple of 16 (the kernels' lanes). F32 and aligned: a pointer into the
/// mapping; else converted to f32 in `alloc`'d memory. Throws InputError naming the tensor.
const float* fp8_scales(const SafetensorsSet& st, const SafetensorsTensor& t, const Fp8Format& f,
                        const std::string& config_path, const Allocator& alloc);

/// Sets w's scales (and block shape) for the F8_E4M3 tensor t; w.type must already be kF8_E4M3.
void attach_fp8_scales(const SafetensorsSet& st, const SafetensorsTensor& t, const Fp8Format& f,
                       const std::string& config_path, const Allocator& alloc, WeightView& w);

}  // namespace troupe::model::detail
