// `troupe synth --arch deepseek4` (model/synth.h's synth_model_summary): a deterministic
// random-weight DeepSeek-V4 checkpoint as a Hugging Face directory, config.json and
// model.safetensors in DeepSeek's own tensor names (troupe reads no GGUF form of V4): V4-Flash's
// layout (compress_ratios two heavily compressed layers then compressed-sparse and heavily
// compressed in turn, rates 4 and 128; four hyper-connection streams; the first three layers
// hash-routed; YaRN on the compressed layers' rope) at the size the options give. Matrices f32,
// f16 or bf16; norms, hyper-connections, position biases and routers f32; token tables I32. No
// tokenizer. Used by model/synth.cc only.
#pragma once

#include <string>

#include "base/result.h"
#include "model/synth.h"

namespace troupe::model::detail {

/// Writes the checkpoint `o` describes into the directory `out_dir` (created if missing).
/// Errors: an option of another architecture, a bad shape or dtype, an unwritable directory.
Result<SynthSummary> synth_deepseek4(const SynthOptions& o, const std::string& out_dir);

}  // namespace troupe::model::detail
