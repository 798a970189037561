// config.json of a Hugging Face model directory → the hyperparameters of a ModelSpec (no
// weights yet), the model family, and which layers are MoE: everything model/hf_model.cc needs
// before it looks at a tensor. Used by model/hf_model.cc only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/detail/hf_config.h"
#include "model/model_spec.h"

namespace troupe::model::detail {

/// The "architectures" class a directory names.
enum class HfFamily : uint8_t {
  kLlama,
  kMixtral,
  kQwen2,
  kQwen3,
  kQwen2Moe,
  kQwen3Moe,
  kDeepseekV2,
  kDeepseekV3,
  kGlm4Moe,       ///< Glm4MoeForCausalLM (GLM-4.5, GLM-4.5-Air, GLM-4.6)
  kMinimaxM2,     ///< MiniMaxM2ForCausalLM (MiniMax-M2)
  kBailingMoeV2,  ///< BailingMoeV2ForCausalLM (Ling-mini-2.0, Ling-flash-2.0, Ling-1T)
  kGptOss,        ///< GptOssForCausalLM (gpt-oss-20b, gpt-oss-120b)
  kGemma3,        ///< Gemma3ForCausalLM (Gemma 3's text decoders: 270M, 1B)
  kLlama4,        ///< Llama4ForCausalLM (the text decoder of Llama 4 Scout and Maverick)
  kQwen3Next,     ///< Qwen3NextForCausalLM (Qwen3-Next-80B-A3B, Qwen3-Coder-Next), and
                  ///< Qwen3.5's text decoders (Qwen3_5MoeForCausalLM, Qwen3_5ForCausalLM:
                  ///< HfHparams::qwen35)
  kPhi3,          ///< Phi3ForCausalLM (Phi-3, Phi-3.5-mini, Phi-4, Phi-4-mini): Llama's decoder
                  ///< with fused qkv_proj and gate_up_proj, partial rotary, LongRoPE
  kErnie45,       ///< Ernie4_5ForCausalLM (ERNIE-4.5-0.3B) and Ernie4_5_MoeForCausalLM
                  ///< (ERNIE-4.5-21B-A3B, -300B-A47B): Llama's decoder with interleaved rotary;
                  ///< softmax routing with a selection bias, shared experts
  kDeepseekV4,    ///< DeepseekV4ForCausalLM (DeepSeek-V4-Flash, -Pro): read_deepseek_v4
};

struct HfHparams {
  HfFamily family = HfFamily::kLlama;
  ModelSpec spec;                ///< hyperparameters only: no weights, no layers
  std::vector<bool> is_moe;      ///< per layer
  bool attention_bias = false;   ///< q/k/v projections carry biases
  bool qk_norm = false;          ///< q/k RMSNorm weights
  bool router_bias = false;      ///< every router has a selection bias (required)
  bool output_bias = false;      ///< o_proj carries a bias (gpt-oss)
  std::vector<int64_t> window;   ///< per layer: sliding window (0: the whole context)
  std::vector<bool> nope;        ///< per layer: no rotary (Llama 4)
  std::vector<int64_t> chunk;    ///< per layer: attention chunk (0: none; Llama 4)
  bool qk_l2_norm = false;       ///< weightless q/k norms on the rotary layers (Llama 4)
  std::vector<bool> recurrent;   ///< per layer: Gated DeltaNet linear attention (Qwen3-Next)
  std::vector<bool> idx_shared;  ///< per layer: reuses an earlier indexer's choice (GLM-5.2)
  /// DeepSeek-V4, per layer: positions per compressed entry (0: none), whether entries overlap
  /// the window before (compressed sparse attention, with its indexer), hash-routed experts.
  std::vector<int64_t> compress;
  std::vector<bool> compress_overlap, hash_moe;
  /// Qwen3.5's layout of the same layers: in_proj_qkv, in_proj_z, in_proj_b and in_proj_a apart
  /// (value heads grouped by key head, as Qwen3-Next's), experts stacked or one by one.
  bool qwen35 = false;
  bool tied = false;  ///< tie_word_embeddings, with the family's default
};

/// Reads and checks every hyperparameter; throws InputError naming the file and the key.
HfHparams read_hf_hparams(const HfConfig& cfg);

/// The configuration of the text decoder config.json describes: for Gemma 3, its settings over
/// Gemma3TextConfig's defaults (which its released files leave out), taken from text_config for
/// the multimodal Gemma3ForConditionalGeneration (then *multimodal is set and the result names
/// Gemma3ForCausalLM; quantization_config carries over); for LlavaForConditionalGeneration, its
/// text_config over the defaults of its model_type (llama, mistral; qwen2 as given), also
/// *multimodal; for Llama4ForConditionalGeneration, its text_config over Llama4TextConfig's
/// defaults, also *multimodal; for Qwen3_5MoeForConditionalGeneration and
/// Qwen3_5ForConditionalGeneration, their text_config (as Qwen3_5MoeForCausalLM,
/// Qwen3_5ForCausalLM), also *multimodal; any other config as it is. A LLaVA text model_type troupe
/// cannot run is an InputError naming `path`.
nlohmann::json text_decoder_config(nlohmann::json config, const std::string& path,
                                   bool* multimodal);

}  // namespace troupe::model::detail
