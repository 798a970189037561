// Synthetic random-weight models in llama.cpp's GGUF conventions (llama, Mixtral-style MoE,
// Qwen3-MoE, Qwen2-MoE, DeepSeek-V2/V3 with MLA): deterministic for a seed, any size, streamed to
// disk with several threads. Used by `troupe synth`, `troupe demo`, tests and benchmarks.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/result.h"
#include "model/ggml_types.h"

namespace troupe::model {

/// What to generate. Unset optionals take the architecture's default (the shapes of
/// ../shared/models/synth/<arch>); options that an architecture does not use must stay unset.
struct SynthOptions {
  std::string arch = "llama";  // llama | mixtral | qwen2 | qwen3 | qwen2moe | qwen3moe | deepseek2
                               // | glm4moe | minimax-m2 | bailingmoe2 | gpt-oss | gemma3
                               // | llama4 | deepseek32 (deepseek2 with V3.2's indexer)
                               // | glm-dsa (GLM-5.2's: deepseek32's layers, shared indexers)
                               // | qwen3next | qwen35moe | qwen35 | phi3 | ernie4_5
                               // | ernie4_5-moe | deepseek4 (a Hugging Face directory:
                               //   model/detail/synth_deepseek4.h)
  std::string name;            // general.name; default "synth-<arch>"
  std::optional<int64_t> n_embd, n_layer, n_head, n_head_kv, n_ff;
  std::optional<int64_t> head_dim;  // qwen3moe: per-head q/k/v width
  std::optional<int64_t> n_expert, n_expert_used, n_ff_exp, n_ff_shexp;
  std::optional<int64_t> n_expert_shared, n_dense_lead;  // deepseek2, glm4moe, bailingmoe2
  std::optional<int64_t> n_group, n_group_used;          // deepseek2, bailingmoe2
  std::optional<int64_t> sliding_window;                 // gpt-oss (every other layer's)
  std::optional<int64_t> moe_layer_step;                 // llama4: interleave_moe_layer_step
  std::optional<int64_t> index_top_k;             // deepseek32, glm-dsa: positions kept (2048)
  std::optional<int64_t> index_heads, index_dim;  // deepseek32, glm-dsa: the indexer's sizes
  // qwen3next: the linear attention's key heads, value heads and head width (2, 4, 32), and
  // every how many layers one has full attention (4).
  std::optional<int64_t> linear_k_heads, linear_v_heads, linear_head_dim, full_attn_interval;
  std::optional<int64_t> q_lora_rank, kv_lora_rank, qk_rope_dim, qk_nope_dim, v_head_dim;
  std::optional<std::string> gating;          // deepseek2: "softmax" | "sigmoid"
  std::optional<bool> expert_weights_norm;    // deepseek2, glm4moe
  std::optional<float> expert_weights_scale;  // deepseek2, glm4moe
  std::optional<float> rope_theta, rms_eps;
  std::optional<int64_t> n_vocab;   // built-in vocabulary size (merges added, then padding)
  int64_t n_ctx = 2048;             // <arch>.context_length
  GgmlType dtype = GgmlType::kF32;  // for matrices; norms, biases and routers stay f32
  // --dtype q4_k_m / q5_k_m: dtype q4_K / q5_K, with Q6_K for the output head and for attn_v and
  // ffn_down(_exps) in every other layer (from 0) -- the shape of the K-quant mixes real files
  // ship.
  bool k_mix = false;
  uint64_t seed = 1;
  std::string vocab_donor;   // a GGUF whose tokenizer.* keys are copied; "" = built-in
  int num_threads = 0;       // 0 = all cores
  std::string command_line;  // recorded as general.synth.command when not empty
};

struct SynthSummary {
  std::string arch;   // GGUF architecture ("llama (mixtral-style MoE)" for mixtral)
  std::string dtype;  // --dtype, e.g. "q4_0"
  int64_t num_params = 0;
  uint64_t num_bytes = 0;  // file size
  int64_t n_vocab = 0;
  int num_tensors = 0;
  double seconds = 0;
  /// One line per tensor kind stored in another type than asked (row not a block multiple).
  std::vector<std::string> notes;
  std::string line() const;  // "llama q4_0: 1.10 B params, 619.83 MB, ... in 3.1 s"
};

/// Generates the model described by `opts` into `out_path`.
Result<SynthSummary> synth_model_summary(const SynthOptions& opts, const std::string& out_path);
/// The same, without the summary.
Status synth_model(const SynthOptions& opts, const std::string& out_path);

/// A synthetic vision encoder: a llama.cpp mmproj GGUF (general.architecture "clip") holding a
/// ViT and an "mlp" (LLaVA) or "gemma3" projector with random weights, deterministic for a seed.
/// The defaults are the shape of LLaVA 1.5's encoder (CLIP ViT-L/14 at 336 pixels, the output
/// of block 23 of 24 projected to a 4096-wide text model).
struct MmprojSynthOptions {
  std::string projector = "mlp";  // mlp | gemma3
  int64_t image_size = 336, patch_size = 14;
  int64_t n_embd = 1024, n_ff = 4096, n_layer = 24, n_head = 16;
  int64_t n_layer_used = 23;        // mlp: clip.vision.feature_layer (blocks run), 0 = all
  int64_t proj_dim = 4096;          // the text model's width
  int64_t merge = 1;                // gemma3: the pooling kernel
  GgmlType dtype = GgmlType::kF16;  // matrices (the patch embedding stays f16 when quantized)
  uint64_t seed = 1;
};
/// Writes the encoder `opts` describes to `out_path`. Errors: a bad shape or projector.
Status synth_mmproj(const MmprojSynthOptions& opts, const std::string& out_path);

/// The built-in byte-level BPE vocabulary (GPT-2 byte tokens, merges learnt from an embedded
/// English text, <|bos|>, <|eos|>, the `extra_control` tokens (Gemma 3's <start_of_image> and
/// <end_of_image>), then <|reserved_N|> padding up to n_vocab when given).
struct BuiltinVocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> token_types;  // 1 normal, 3 control
  std::vector<std::string> merges;   // "a b", in rank order
  int32_t bos_id = 0;
  int32_t eos_id = 0;
};
BuiltinVocab builtin_vocab(std::optional<int64_t> n_vocab = std::nullopt,
                           const std::vector<std::string>& extra_control = {});

/// Parses "f32", "f16", "bf16", "q8_0", "q4_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k" (or
/// "q2_K" ... "q6_K"), "iq4_nl", "iq4_xs", "mxfp4"; nullopt otherwise.
std::optional<GgmlType> parse_synth_dtype(const std::string& s);
/// The same, also taking "q4_k_m" and "q5_k_m" (or "q4_K_M", "q5_K_M"): Q4_K or Q5_K with
/// SynthOptions::k_mix.
bool parse_synth_dtype(const std::string& s, SynthOptions* o);

}  // namespace troupe::model
