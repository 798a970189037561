// ModelSpec: a decoder described independently of its file format. GGUF and Hugging Face
// readers both produce one; the compute engine consumes it. Weight views point into memory
// that the owning Model keeps alive (a file mapping or a converted buffer).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/ggml_types.h"

namespace troupe::model {

/// How a view's bytes are ordered. kRows is ggml's (and every file's). kTiles16 exists only in
/// memory (model/weight_tiles.h): a matrix of an int8-kernel type whose rows go 16 at a time,
/// block by block, so that one 64-byte load holds the same 4 columns of 16 rows (the CPU's int8
/// kernels), or of F16 or BF16 whose rows go 4 at a time, 16 columns by 16 (the CPU's float
/// kernels: one stream). The byte count is the same; row(r) is meaningful only for kRows.
enum class WeightLayout : uint8_t { kRows = 0, kTiles16 = 1 };

/// A read-only view of a weight matrix (or stack of matrices) in its stored type.
/// Layout as ggml: ne[0] is the row length (input features), ne[1] the number of rows (output
/// features), ne[2] the number of stacked matrices (experts or heads). Rows are contiguous
/// (layout kRows; see WeightLayout).
struct WeightView {
  std::string name;  // the GGUF-convention name, for messages
  GgmlType type = GgmlType::kF32;
  int64_t ne[3] = {0, 1, 1};
  const uint8_t* data = nullptr;
  WeightLayout layout = WeightLayout::kRows;
  /// kF8_E4M3, kI4_PACKED and kFP4_PACKED only: value (r, c) of matrix i is q * scale, the scale
  /// being element r / scale_block[0] * scale_stride + c / scale_block[1] of `scales` (stored as
  /// scale_type: F32, BF16, F16, E8M0 or F8_E4M3; model::scales_to_f32): one scale per block of
  /// scale_block[0] rows x scale_block[1] columns, row-major, one such grid per stacked matrix
  /// (slice() moves to matrix i's).
  const void* scales = nullptr;
  GgmlType scale_type = GgmlType::kF32;
  int64_t scale_block[2] = {0, 0};
  int64_t scale_stride = 0;
  /// A global scale of the whole tensor (NVFP4): each stored scale s stands for the float
  /// nearest s * scale_mul / scale_div (one of the two is 1: ModelOpt's weight_scale_2
  /// multiplies, compressed-tensors' weight_global_scale divides).
  float scale_mul = 1.0f, scale_div = 1.0f;

  /// A scaled view of n_mat stacked rows x cols matrices of `type` at `data`, each row with a
  /// scale (stored as scale_type) per `group` columns at `scales` (the Hugging Face readers' int4,
  /// MXFP4 and NVFP4 weights).
  static WeightView grouped(std::string name, GgmlType type, int64_t rows, int64_t cols,
                            int64_t n_mat, const uint8_t* data, const void* scales,
                            GgmlType scale_type, int64_t group) {
    WeightView v;
    v.name = std::move(name);
    v.type = type;
    v.ne[0] = cols;
    v.ne[1] = rows;
    v.ne[2] = n_mat;
    v.data = data;
    v.scales = scales;
    v.scale_type = scale_type;
    v.scale_block[0] = 1;
    v.scale_block[1] = group;
    v.scale_stride = cols / group;
    return v;
  }

  /// Whether values carry a separate scale grid (kF8_E4M3, kI4_PACKED, kFP4_PACKED).
  bool scaled() const {
    return type == GgmlType::kF8_E4M3 || type == GgmlType::kI4_PACKED ||
           type == GgmlType::kFP4_PACKED;
  }
  /// Row r's scale_stride scales (stored as scale_type; model::scales_to_f32 reads them).
  const uint8_t* row_scales(int64_t r) const {
    return static_cast<const uint8_t*>(scales) +
           r / scale_block[0] * scale_stride * scale_bytes(scale_type);
  }
  bool present() const { return data != nullptr; }
  int64_t cols() const { return ne[0]; }
  int64_t rows() const { return ne[1]; }
  int64_t row_bytes() const { return model::row_bytes(type, ne[0]); }
  const uint8_t* row(int64_t r) const { return data + r * row_bytes(); }
  uint64_t nbytes() const { return static_cast<uint64_t>(row_bytes() * ne[1] * ne[2]); }
  /// Block rows of one matrix's scale grid.
  int64_t scale_grid_rows() const {
    return scale_block[0] > 0 ? (ne[1] + scale_block[0] - 1) / scale_block[0] : 0;
  }
  /// Rows [r0, r0 + n) of a 2-D view (a fused matrix's parts); a scaled view's r0 and n must be
  /// whole scale blocks of rows (the caller checks).
  WeightView row_range(int64_t r0, int64_t n, std::string part_name) const {
    WeightView v = *this;
    v.name = std::move(part_name);
    v.ne[1] = n;
    v.data = data + r0 * row_bytes();
    if (scales != nullptr)
      v.scales = static_cast<const uint8_t*>(scales) +
                 r0 / scale_block[0] * scale_stride * scale_bytes(scale_type);
    return v;
  }
  /// The i-th matrix of a 3-D stack as a 2-D view.
  WeightView slice(int64_t i) const {
    WeightView v = *this;
    v.ne[2] = 1;
    v.data = data + i * row_bytes() * ne[1];
    if (scales != nullptr)
      v.scales = static_cast<const uint8_t*>(scales) +
                 i * scale_grid_rows() * scale_stride * scale_bytes(scale_type);
    v.name = name + "[" + std::to_string(i) + "]";
    return v;
  }
};

enum class Arch : uint8_t {
  kLlama = 0,      ///< Llama family, dense or Mixtral-style MoE (GGUF arch "llama")
  kQwen2Moe = 1,   ///< Qwen2-MoE: qkv bias, shared expert with a sigmoid gate
  kQwen3Moe = 2,   ///< Qwen3-MoE: per-head q/k RMSNorm, normalized top-k
  kDeepseek2 = 3,  ///< DeepSeek-V2/V3: MLA, shared experts, sigmoid/group routing
  kQwen2 = 4,      ///< Qwen2 / Qwen2.5 dense: q/k/v biases, NeoX rope
  kQwen3 = 5,      ///< Qwen3 dense: per-head q/k RMSNorm, NeoX rope
  /// GLM-4.5/4.6 MoE: GQA with q/k/v biases, optional per-head q/k RMSNorm and NeoX rope on part
  /// of each head; DeepSeek-V3's routing (sigmoid, selection bias, shared experts)
  kGlm4Moe = 6,
  /// MiniMax-M2: GQA with q/k RMSNorm over all heads at once, NeoX rope on part of each head,
  /// sigmoid routing with a selection bias over experts only (no dense layers, no shared expert)
  kMinimaxM2 = 7,
  /// Ling-2.0 (BailingMoeV2: Ling-mini/flash-2.0, Ling-1T): GQA from one fused q/k/v matrix,
  /// per-head q/k RMSNorm, NeoX rope on part of each head; DeepSeek-V3's routing
  kBailingMoe2 = 8,
  /// OpenAI gpt-oss: GQA with biases everywhere, learned attention sinks, a sliding window on
  /// every other layer; experts with biases and a clamped SwiGLU, softmax over the chosen
  /// experts' logits
  kGptOss = 9,
  /// Google Gemma 3 (text): GQA with per-head q/k RMSNorm, norms after attention and after the
  /// FFN too, embeddings scaled by sqrt(n_embd), a GELU-gated FFN, five sliding-window layers
  /// (their own unscaled rope base) to every global one
  kGemma3 = 10,
  /// Meta's Llama 4 (Scout, Maverick): three chunked-attention rope layers to every global
  /// NoPE one (whose queries are scaled up far into the context), weightless q/k norms, a
  /// sigmoid top-1 router whose weight scales the expert's input, a shared expert, dense and MoE
  /// layers interleaved
  kLlama4 = 11,
  /// Qwen3-Next (and Qwen3-Coder-Next): three Gated DeltaNet linear-attention layers (a
  /// recurrent state per sequence instead of KV) to every full-attention one, whose output is
  /// gated by a sigmoid of a second half of its q projection; per-head q/k RMSNorm, NeoX rope on
  /// a quarter of each head; softmax top-k experts plus a sigmoid-gated shared expert
  kQwen3Next = 12,
  /// Qwen3.5 (dense) and Qwen3.5-MoE text decoders: Qwen3-Next's layers, with b and a as two
  /// projections and, in llama.cpp's GGUF, the value heads in tiled order (ModelSpec::ssm_tiled);
  /// text positions only (their multimodal rope then equals NeoX rope on the rotated quarter)
  kQwen35 = 13,
  kQwen35Moe = 14,
  /// DeepSeek-V4 (V4-Flash, V4-Pro): hc_mult residual streams mixed by manifold-constrained
  /// hyper-connections; attention of one shared key-and-value head over a sliding window plus
  /// compressed entries (every ratio-th position's window pooled into one; ratio-4 layers choose
  /// theirs with a lightning indexer), per-head sinks, a grouped low-rank output projection;
  /// sqrt-softplus routing, the first layers' experts chosen by token id, clamped SwiGLU
  kDeepseek4 = 15,
};
const char* arch_name(Arch a);

enum class RopeStyle : uint8_t {
  kNormal = 0,  ///< rotate adjacent pairs (x0,x1),(x2,x3)... (GGUF Llama, DeepSeek)
  kNeox = 1,    ///< rotate (x_i, x_{i+n/2}) (Qwen, and Llama weights straight from HF)
};

/// How router logits become expert weights: kSoftmax (over all experts, then the top-k),
/// kSigmoid (each alone), kSoftmaxTopk (top-k of the logits, then a softmax over those k: gpt-oss).
/// kSqrtSoftplus (DeepSeek-V4): each alone, sqrt(softplus(logit)).
enum class Gating : uint8_t { kSoftmax = 0, kSigmoid = 1, kSoftmaxTopk = 2, kSqrtSoftplus = 3 };

/// A group's score in group-limited routing: the sum of its two best selection scores
/// (DeepSeek-V3's noaux_tc, GLM-4.5, Ling-2.0; llama.cpp's graph for every model) or its best
/// one (DeepSeek-V2's group_limited_greedy: V2, V2.5, Coder-V2).
enum class GroupScore : uint8_t { kTopTwoSum = 0, kMax = 1 };

/// The FFN's gated activation: kSilu: silu(gate) * up; kSwigluOai (gpt-oss): with
/// g = min(gate, limit), u = clamp(up, -limit, limit): g * sigmoid(alpha * g) * (u + 1);
/// kGeluTanh (Gemma): gelu(gate) * up, GELU's tanh form
/// 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))); kSiluClamp (DeepSeek-V4):
/// silu(min(gate, limit)) * clamp(up, -limit, limit).
enum class FfnAct : uint8_t { kSilu = 0, kSwigluOai = 1, kGeluTanh = 2, kSiluClamp = 3 };

/// How a model stretches its rotary frequencies past its training context (model/rope.h).
enum class RopeScalingType : uint8_t {
  kNone = 0,
  kLinear = 1,  ///< every frequency divided by `factor` (position interpolation)
  kYarn = 2,    ///< YaRN: low frequencies interpolated, high ones kept, a ramp between
};

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 1.0;       ///< linear, YaRN: how many times the original context
  int64_t orig_ctx = 0;      ///< YaRN: the context the model was trained at
  double beta_fast = 32.0;   ///< YaRN: rotations over orig_ctx above which a pair is kept
  double beta_slow = 1.0;    ///< YaRN: rotations below which a pair is fully interpolated
  bool truncate = true;      ///< YaRN: round the ramp's ends to whole pairs
  double attn_factor = 1.0;  ///< multiplies every rotated pair's cos and sin (YaRN's magnitude)
};

struct ExpertFfn {
  WeightView gate, up, down;  // gate/up: [n_ff_exp rows, n_embd cols]; down: [n_embd, n_ff_exp]
  WeightView gate_b, up_b, down_b;  // optional f32 biases [n_ff_exp], [n_ff_exp], [n_embd]
  /// Instead of gate and up: one matrix [2 * n_ff_exp rows, n_embd] whose row 2i is gate row i
  /// and row 2i + 1 up row i (gpt-oss's Hugging Face layout, read in place).
  WeightView gate_up;
  /// The FFN's width: gate's rows, or half of gate_up's.
  int64_t width() const { return gate_up.present() ? gate_up.rows() / 2 : gate.rows(); }
};

struct LayerSpec {
  WeightView attn_norm;  // f32 [n_embd]
  // Standard attention (absent for MLA).
  WeightView wq, wk, wv, wo;
  WeightView bq, bk, bv;  // optional biases (Qwen2)
  // Optional q/k RMSNorm weights: per head [head_dim] (Qwen3, GLM), or over all heads of a
  // token at once [n_head * head_dim] and [n_head_kv * head_dim] (MiniMax-M2).
  WeightView q_norm, k_norm;
  WeightView bo;  // optional output projection bias [n_embd] (gpt-oss)
  // Optional f32 [n_embd] RMSNorms of the attention's and the FFN's outputs before each joins
  // the residual stream (Gemma 3).
  WeightView attn_post_norm, ffn_post_norm;
  bool local_rope = false;  // rotate with ModelSpec::rope_theta_local, unscaled (Gemma 3)
  WeightView sinks;         // optional f32 [n_head]: each head's sink logit, an extra softmax term
  int64_t window = 0;       // > 0: each query attends to its last `window` positions only
  // Llama 4: a layer without rotary (NoPE; its queries take ModelSpec's temperature), a layer
  // whose queries see only their own chunk of `chunk` positions (chunked attention), and q and
  // k heads RMS-normed without weights after rotary.
  bool nope = false;
  int64_t chunk = 0;
  bool qk_l2_norm = false;
  // Multi-head latent attention (DeepSeek2).
  WeightView wq_a, q_a_norm, wq_b;  // wq_a [q_lora, n_embd]; wq_b [n_head*(nope+rope), q_lora]
  WeightView wkv_a;                 // [kv_lora + rope, n_embd]
  WeightView kv_a_norm;             // [kv_lora]
  WeightView wk_b;                  // [n_head] x [kv_lora rows, nope cols]
  WeightView wv_b;                  // [n_head] x [v_dim rows, kv_lora cols]
  // DeepSeek-V3.2's sparse attention (DSA): the lightning indexer, which picks the positions a
  // query attends to once it sees more than ModelSpec::idx_top_k.
  WeightView idx_wq_b;                  // [idx_n_head * idx_head_dim rows, q_lora cols]
  WeightView idx_wk;                    // [idx_head_dim rows, n_embd cols]
  WeightView idx_k_norm, idx_k_norm_b;  // f32 [idx_head_dim]: the keys' LayerNorm
  WeightView idx_proj;                  // [idx_n_head rows, n_embd cols]: per-head weights
  // GLM-5.2: the layer has no indexer of its own and reuses the positions chosen by the last
  // layer before it that has one (the first layer never shares).
  bool idx_shared = false;
  // Qwen3-Next's full attention: wq's rows hold, per head, the query and then as many gate rows;
  // the attention's output is multiplied by sigmoid(gate) before wo (head_dim_k == head_dim_v).
  bool attn_gate = false;
  // Gated DeltaNet linear attention (Qwen3-Next): no KV; each sequence carries a state of
  // ModelSpec::ssm_state_floats() per such layer (the engine's recurrent state slots). wo is the
  // layer's out_proj [n_embd rows, nv * dv cols]. With nk key heads of dk, nv value heads of dv
  // (r = nv / nk per key head) and conv_dim = 2 nk dk + nv dv:
  bool recurrent = false;
  WeightView ssm_in;    // [2 nk dk + 2 nv dv rows]: per key head its q, k, v (r heads), z (r heads)
  WeightView ssm_qkv;   // or: [conv_dim rows]: every head's q, then k, then v
  WeightView ssm_z;     //     with [nv dv rows]: the output gate z
  WeightView ssm_ba;    // [2 nv rows]: per key head, its r value heads' b, then their a
  WeightView ssm_beta;  // or (Qwen3.5): [nv rows] b, per value head
  WeightView ssm_alpha;  //     with [nv rows] a
  WeightView ssm_conv;   // f32 [conv_dim rows, kernel cols]: the causal depthwise convolution
  WeightView ssm_dt;     // f32 [nv]: added to a before softplus
  WeightView ssm_a;      // f32 [nv]: -exp(A_log), the decay rate
  WeightView ssm_norm;   // f32 [dv]: the gated RMSNorm of each head's output
  WeightView ffn_norm;
  // Dense FFN (SwiGLU).
  WeightView ffn_gate, ffn_up, ffn_down;
  // Mixture of experts.
  bool is_moe = false;
  WeightView router;               // [n_expert rows, n_embd cols]
  WeightView router_bias;          // optional [n_expert] (selection bias, DeepSeek-V3)
  WeightView router_logit_bias;    // optional [n_expert]: added to the router's logits (gpt-oss)
  std::vector<ExpertFfn> experts;  // n_expert entries
  ExpertFfn shared;                // optional shared expert(s), merged as one FFN
  WeightView shared_gate;          // optional [1 row, n_embd]: sigmoid gate of the shared expert
  // DeepSeek-V4's hash routing: I32 [n_expert_used cols, n_vocab rows], the experts of each
  // input token (its first layers); the router then only weighs them.
  WeightView hash_experts;

  // DeepSeek-V4 (Arch::kDeepseek4). The hyper-connections before the attention and before the
  // FFN: fn [(2 + hc) hc rows, hc n_embd cols], base f32 [(2 + hc) hc], scale f32 [3].
  WeightView hc_attn_fn, hc_attn_base, hc_attn_scale, hc_ffn_fn, hc_ffn_base, hc_ffn_scale;
  // The attention: wq_a, q_a_norm, wq_b as MLA's (q heads of head_dim_k); wkv_a [head_dim_k rows,
  // n_embd] and kv_a_norm [head_dim_k]: the one key-and-value head; wo_a [o_groups] x
  // [o_lora_rank rows, n_head head_dim_k / o_groups cols], then wo [n_embd, o_groups o_lora_rank];
  // sinks. `window` is the sliding window over the raw rows.
  WeightView wo_a;
  // Compressed entries (compress > 0): one per `compress` positions, pooled from the projections
  // cmp_kv and cmp_gate [coff head_dim_k rows, n_embd] by a softmax over the window (gate plus
  // cmp_ape f32 [compress rows, coff head_dim_k]), RMS-normed by cmp_norm f32 [head_dim_k];
  // with compress_overlap (coff 2) each entry also pools the window before (first halves).
  int64_t compress = 0;
  bool compress_overlap = false;
  WeightView cmp_kv, cmp_gate, cmp_ape, cmp_norm;
  // The indexer of an overlapping layer: its own pooled keys (idx_cmp_*, idx_head_dim wide),
  // queries from idx_wq_b, head weights from idx_proj.
  WeightView idx_cmp_kv, idx_cmp_gate, idx_cmp_ape, idx_cmp_norm;
};

struct ModelSpec {
  Arch arch = Arch::kLlama;
  std::string name;
  int64_t n_vocab = 0;
  int64_t n_embd = 0;
  int64_t n_layer = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim_k = 0;  // per-head key width (MLA: nope + rope)
  int64_t head_dim_v = 0;  // per-head value width
  int64_t n_ff = 0;        // dense FFN width
  int64_t n_rot = 0;       // rotated dims per head (MLA: the rope part)
  float rope_theta = 10000.f;
  RopeStyle rope_style = RopeStyle::kNormal;
  RopeScaling rope_scaling;
  /// Divisor of each rotary pair's frequency ([n_rot / 2]; empty: none): GGUF's
  /// rope_freqs.weight, or computed from Hugging Face's "llama3" rope scaling.
  std::vector<float> rope_freq_factors;
  /// LongRoPE (Phi-3): the divisors for a context longer than rope_long_after positions
  /// ([n_rot / 2]; empty: none). rope_frequencies() takes them instead of rope_freq_factors (the
  /// short ones) when the engine's max_positions exceeds rope_long_after, as llama.cpp does by
  /// its context size.
  std::vector<float> rope_freq_factors_long;
  int64_t rope_long_after = 0;
  /// Multiplies the attention logits' 1/sqrt(head_dim_k) (DeepSeek's YaRN: mscale squared;
  /// Gemma 3 27B: its query_pre_attn_scalar).
  double kq_scale_mult = 1.0;
  /// The rope base of layers with local_rope (Gemma 3's sliding layers), which take no scaling
  /// and no frequency factors.
  float rope_theta_local = 10000.f;
  /// Token embeddings are multiplied by this (Gemma: sqrt(n_embd)).
  float embd_scale = 1.0f;
  /// > 0: logits become c * tanh(logits / c).
  float final_logit_softcap = 0.0f;
  float rms_eps = 1e-5f;
  int64_t n_ctx_train = 0;

  // Mixture of experts.
  int64_t n_expert = 0;
  int64_t n_expert_used = 0;
  int64_t n_ff_exp = 0;
  int64_t n_expert_shared = 0;
  int64_t n_ff_shexp = 0;
  int64_t n_leading_dense = 0;
  Gating gating = Gating::kSoftmax;
  bool norm_topk = false;    // renormalize the selected weights to sum to 1
  float routed_scale = 1.f;  // multiply routed weights (DeepSeek-V3 routed_scaling_factor)
  int64_t n_group = 1;       // expert groups for group-limited routing
  int64_t n_group_used = 1;
  GroupScore group_score = GroupScore::kTopTwoSum;  // how groups are ranked
  FfnAct ffn_act = FfnAct::kSilu;
  float act_alpha = 1.702f;  // kSwigluOai
  float act_limit = 7.0f;    // kSwigluOai
  /// The router's weight multiplies the expert's input instead of its output (Llama 4).
  bool moe_weight_input = false;
  /// > 0: NoPE layers' queries at position p are multiplied by
  /// log(floor((p + 1) / attn_temp_floor) + 1) * attn_temp_scale + 1 (Llama 4).
  float attn_temp_scale = 0.0f;
  int64_t attn_temp_floor = 0;

  // Multi-head latent attention.
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_dim = 0;
  int64_t qk_rope_dim = 0;
  int64_t v_head_dim = 0;
  // DeepSeek-V3.2's indexer (0: none): its heads, their width (the first n_rot rotated, NeoX
  // style; GLM-5's in neighbouring pairs: idx_rope_neox false), how many positions a query keeps.
  int64_t idx_n_head = 0, idx_head_dim = 0, idx_top_k = 0;
  bool idx_rope_neox = true;
  /// GLM-5.2's default pattern of shared indexers (llama.cpp's, for a file that does not list
  /// them): layers 0 and 1 full, then from layer 2 one full layer in four.
  static bool glm52_indexer_shared(int64_t il) { return il >= 2 && (il - 2) % 4 != 0; }
  // DeepSeek-V4: residual streams (0: the plain residual), Sinkhorn iterations and epsilon of
  // the hyper-connections; the final collapse of the streams (hc_head_fn [hc rows, hc n_embd],
  // base f32 [hc], scale f32 [1]); the grouped output projection's groups and their width.
  int64_t hc_mult = 0, hc_sinkhorn_iters = 0;
  float hc_eps = 0.0f;
  WeightView hc_head_fn, hc_head_base, hc_head_scale;
  int64_t o_groups = 0, o_lora_rank = 0;
  // Gated DeltaNet (0: none): key heads and width, value heads and width, convolution kernel.
  int64_t ssm_k_heads = 0, ssm_k_dim = 0, ssm_v_heads = 0, ssm_v_dim = 0, ssm_conv_kernel = 0;
  /// Value head h reads key head h % ssm_k_heads (llama.cpp's Qwen3.5 files, whose converter
  /// tiles the value heads) instead of h / (ssm_v_heads / ssm_k_heads) (the checkpoints' order).
  bool ssm_tiled = false;

  WeightView token_embd;  // [n_vocab rows, n_embd cols]
  WeightView output_norm;
  WeightView output;  // [n_vocab rows, n_embd cols]; equals token_embd when tied
  std::vector<LayerSpec> layers;

  bool is_mla() const { return arch == Arch::kDeepseek2; }
  bool is_v4() const { return arch == Arch::kDeepseek4; }
  /// Floats of one token's state between layers: hc_mult streams of n_embd (DeepSeek-V4), else
  /// n_embd.
  int64_t hidden_width() const { return (hc_mult > 0 ? hc_mult : 1) * n_embd; }
  /// Width of one token's K and V cache rows per layer (MLA: the compressed latent + rope key).
  /// (DeepSeek-V4: v4_row_width(), all of it K.)
  int64_t kv_k_width() const {
    return is_v4()    ? v4_row_width()
           : is_mla() ? kv_lora_rank + qk_rope_dim
                      : n_head_kv * head_dim_k;
  }
  /// (MLA: the indexer's key, when there is one.)
  int64_t kv_v_width() const {
    return is_v4() ? 0 : is_mla() ? idx_head_dim : n_head_kv * head_dim_v;
  }
  /// Where the fields of DeepSeek-V4's KV row of one position in layer L start, in values: its
  /// key at 0 (head_dim_k); in a compressing layer the entry of the window the position ends
  /// (head_dim_k), then the compressor's kv and gate projections of it (coff head_dim_k each,
  /// coff 2 with overlap); with an indexer its entry (idx_head_dim), then its kv and gate
  /// projections (2 idx_head_dim each). `end`: the row's width in that layer.
  struct V4Row {
    int64_t entry = 0, proj = 0, ientry = 0, iproj = 0, end = 0;
  };
  V4Row v4_row(const LayerSpec& L) const {
    const int64_t D = head_dim_k, coff = L.compress_overlap ? 2 : 1;
    V4Row r;
    r.entry = D;
    r.proj = 2 * D;
    r.ientry = r.proj + 2 * coff * D;
    r.iproj = r.ientry + idx_head_dim;
    r.end = L.compress_overlap ? r.iproj + 4 * idx_head_dim : L.compress > 0 ? r.ientry : D;
    return r;
  }
  /// The widest layer's V4 row: the KV cache's row width.
  int64_t v4_row_width() const {
    int64_t most = head_dim_k;
    for (const LayerSpec& L : layers) most = std::max(most, v4_row(L).end);
    return most;
  }
  bool has_indexer() const { return idx_top_k > 0; }
  /// Linear-attention sizes are set (Qwen3-Next's family, whatever its layers are).
  bool has_recurrent() const { return ssm_v_heads > 0; }
  /// Some layer is linear attention: the model keeps a recurrent state per sequence.
  bool has_recurrent_layers() const {
    for (const LayerSpec& L : layers)
      if (L.recurrent) return true;
    return false;
  }
  /// Channels of the linear attention's convolution: every q, k and v value.
  int64_t ssm_conv_dim() const { return 2 * ssm_k_heads * ssm_k_dim + ssm_v_heads * ssm_v_dim; }
  /// Floats of one sequence's state in one linear-attention layer: the convolution's last
  /// kernel - 1 inputs, then each value head's dk x dv matrix.
  int64_t ssm_state_floats() const {
    return (ssm_conv_kernel - 1) * ssm_conv_dim() + ssm_v_heads * ssm_k_dim * ssm_v_dim;
  }
};

/// DeepSeek-V2's gate (the modeling_deepseek.py its checkpoints ship) either renormalizes the
/// chosen weights (top_k > 1 and norm_topk_prob) or multiplies them by routed_scaling_factor,
/// never both (V3's does both): sets spec's norm_topk and routed_scale so.
void apply_v2_gate_weights(ModelSpec& spec);

/// Checks that every weight the architecture needs is present with the right shape; throws
/// InputError naming the tensor, the expected and the actual shape.
void validate_spec(const ModelSpec& spec, const std::string& source);

}  // namespace troupe::model
