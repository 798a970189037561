// Options of `troupe synth` resolved against each architecture's defaults and checked: the
// hyperparameters model/synth.cc writes and plans tensors from. Used by model/synth.cc only.
#pragma once

#include <cstdint>
#include <string>

#include "model/gguf_writer.h"
#include "model/synth.h"

namespace troupe::model::detail {

// kQwen2 and kQwen3: the dense Qwen2 (q/k/v biases) and Qwen3 (per-head q/k RMSNorm) decoders,
// the attention of kQwen2Moe and kQwen3Moe with one SwiGLU FFN.
// kGlm4Moe: GLM-4.5's decoder (Qwen2's biased attention with Qwen3's q/k norms and rope on half
// of each head, DeepSeek-V3's routing) plus its multi-token-prediction layer, stored after the
// decoder's as the converted checkpoints have it. kMinimaxM2: MiniMax-M2 (q/k RMSNorm over all
// heads at once, rope on half of each head, sigmoid routing with a bias, experts only).
// kBailingMoe2: Ling-2.0 (one fused q/k/v matrix, per-head q/k norms, rope on half of each
// head, DeepSeek-V3's group-limited sigmoid routing with shared experts). kGptOss: gpt-oss
// (biases everywhere, attention sinks, a sliding window on even layers, biased experts with the
// clamped SwiGLU, softmax over the top-k logits). kGemma3: Gemma 3's text decoder (per-head q/k
// norms, norms after attention and after the FFN, GELU FFN, tied embeddings, five sliding-window
// layers to each global one). kLlama4: Llama 4 (three chunked rope layers to each global NoPE
// one, a sigmoid top-1 router weighting the expert's input, a shared expert, MoE layers every
// --moe-layer-step-th, the others dense; rope_freqs from Scout's llama3 scaling). kQwen3Next:
// Qwen3-Next (three Gated DeltaNet layers to each gated full-attention one, q/k norms, NeoX rope
// on a quarter of each head, softmax top-k experts in every layer plus a gated shared expert).
// kQwen35Moe and kQwen35: Qwen3.5's MoE and dense text decoders as llama.cpp's converter writes
// them (Qwen3-Next's layers with b and a apart, value heads in tiled order, the multimodal rope's
// sections; qwen35 with a dense FFN). kPhi3: Phi-4-mini's decoder (q, k and v in one matrix,
// ffn_up holding the gate's rows then up's, NeoX rope on three quarters of each head, LongRoPE's
// two factor tensors and attention factor, an optional sliding window). kErnie45 and
// kErnie45Moe: ERNIE 4.5's decoders (Llama's, with tied embeddings; the MoE model's experts from
// --n-dense-lead on, every --moe-layer-step-th layer, routed by a softmax with a selection bias,
// beside ungated shared experts).
enum class SynthArch {
  kLlama,
  kMixtral,
  kQwen3Moe,
  kQwen2Moe,
  kDeepseek2,
  kQwen2,
  kQwen3,
  kGlm4Moe,
  kMinimaxM2,
  kBailingMoe2,
  kGptOss,
  kGemma3,
  kLlama4,
  kQwen3Next,
  kQwen35Moe,
  kQwen35,
  kPhi3,
  kErnie45,
  kErnie45Moe
};

struct SynthConfig {
  SynthArch arch;
  std::string gguf_arch;
  int64_t n_embd, n_layer, n_head, n_head_kv, n_ff, head_dim;
  int64_t n_expert = 0, n_expert_used = 0, n_ff_exp = 0, n_ff_shexp = 0;
  int64_t n_expert_shared = 0, n_dense_lead = 0, n_group = 1, n_group_used = 1;
  int64_t q_lora = 0, kv_lora = 0, rope_dim = 0, nope_dim = 0, v_dim = 0;
  int64_t n_nextn = 0;   // glm4moe: multi-token-prediction layers after the decoder's
  int64_t n_swa = 0;     // gpt-oss, gemma3: the sliding window
  int64_t moe_step = 1;  // llama4, ernie4_5-moe: every moe_step-th layer has experts
  int64_t index_top_k = 0, index_heads = 0, index_dim = 0;  // deepseek32: the indexer
  // qwen3next: Gated DeltaNet key heads, value heads, their width; the full-attention interval
  int64_t lin_k_heads = 0, lin_v_heads = 0, lin_dim = 0, full_every = 0;
  bool sigmoid = false, w_norm = false;
  float w_scale = 1.f;
  float rope_theta, rms_eps;
};

/// The options with every default filled in; throws InputError naming the flag that is wrong.
SynthConfig resolve_synth_config(const SynthOptions& o);

/// Phi-3's LongRoPE in a synthesized file of context n_ctx: the original context (a quarter of
/// it) and the attention factor sqrt(1 + ln(n_ctx / original) / ln(original)).
int64_t phi3_original_context(int64_t n_ctx);
float phi3_attn_factor(int64_t n_ctx);

/// glm-dsa (GLM-5.2's layout): layer il has no indexer of its own and reuses the last full
/// layer's choice (ModelSpec::glm52_indexer_shared, llama.cpp's GLM-5.2 pattern).
bool synth_indexer_shared(const SynthConfig& c, int64_t il);

/// general.file_type (llama_ftype) of a file whose matrices are mostly `t`.
uint32_t synth_file_type(GgmlType t);
/// Writes the architecture's hyperparameter keys (llama.cpp's names, each file's order).
void write_synth_hparams(GgufWriter& w, const SynthConfig& c, const SynthOptions& o,
                         int64_t n_vocab);

}  // namespace troupe::model::detail
