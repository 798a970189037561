// `troupe synth` options resolved against each architecture's defaults, with a check per flag,
// and the hyperparameter keys written from them (model/detail/synth_config.h).
#include "model/detail/synth_config.h"

#include <cmath>
#include <vector>

#include "base/check.h"
#include "model/gguf_writer.h"
#include "model/model_spec.h"

namespace troupe::model::detail {
namespace {

void check_positive(const char* flag, int64_t v) {
  if (v <= 0 || v > (int64_t{1} << 24))
    TROUPE_INPUT_ERROR("%s must be between 1 and %lld, got %lld", flag,
                       static_cast<long long>(int64_t{1} << 24), static_cast<long long>(v));
}

SynthArch parse_arch(const std::string& a) {
  if (a == "llama") return SynthArch::kLlama;
  if (a == "mixtral") return SynthArch::kMixtral;
  if (a == "qwen3moe") return SynthArch::kQwen3Moe;
  if (a == "qwen2moe") return SynthArch::kQwen2Moe;
  if (a == "deepseek2" || a == "deepseek32" || a == "glm-dsa") return SynthArch::kDeepseek2;
  if (a == "qwen2") return SynthArch::kQwen2;
  if (a == "qwen3") return SynthArch::kQwen3;
  if (a == "glm4moe") return SynthArch::kGlm4Moe;
  if (a == "minimax-m2") return SynthArch::kMinimaxM2;
  if (a == "bailingmoe2") return SynthArch::kBailingMoe2;
  if (a == "gpt-oss") return SynthArch::kGptOss;
  if (a == "gemma3") return SynthArch::kGemma3;
  if (a == "llama4") return SynthArch::kLlama4;
  if (a == "qwen3next") return SynthArch::kQwen3Next;
  if (a == "qwen35moe") return SynthArch::kQwen35Moe;
  if (a == "qwen35") return SynthArch::kQwen35;
  if (a == "phi3") return SynthArch::kPhi3;
  if (a == "ernie4_5") return SynthArch::kErnie45;
  if (a == "ernie4_5-moe") return SynthArch::kErnie45Moe;
  TROUPE_INPUT_ERROR(
      "unknown --arch '%s' (llama, mixtral, qwen2, qwen3, qwen2moe, qwen3moe, deepseek2, "
      "deepseek32, glm-dsa, glm4moe, minimax-m2, bailingmoe2, gpt-oss, gemma3, llama4, qwen3next, "
      "qwen35moe, qwen35, phi3, ernie4_5, ernie4_5-moe)",
      a.c_str());
}

// Rejects options the architecture does not use (beyond the common ones).
void check_applicable(const SynthOptions& o, SynthArch arch) {
  struct Use {
    const char* flag;
    bool set;
    uint32_t archs;  // bit per SynthArch
  };
  constexpr uint32_t kL = 1, kX = 2, kQ3 = 4, kQ2 = 8, kDs = 16, kQ2d = 32, kQ3d = 64, kG = 128,
                     kM = 256, kB = 512, kO = 1024, kGe = 2048, kL4 = 4096, kQn = 8192,
                     kQ5m = 16384, kQ5 = 32768, kP3 = 65536, kE = 131072, kEm = 262144,
                     kHybrid = kQn | kQ5m | kQ5;
  const Use uses[] = {
      {"--n-head-kv", o.n_head_kv.has_value(),
       kL | kX | kQ3 | kQ2 | kQ2d | kQ3d | kG | kM | kB | kO | kGe | kL4 | kHybrid | kP3 | kE |
           kEm},
      {"--head-dim", o.head_dim.has_value(), kQ3 | kQ3d | kG | kM | kO | kGe | kHybrid | kE | kEm},
      {"--n-expert", o.n_expert.has_value(),
       kX | kQ3 | kQ2 | kDs | kG | kM | kB | kO | kL4 | kQn | kQ5m | kEm},
      {"--n-expert-used", o.n_expert_used.has_value(),
       kX | kQ3 | kQ2 | kDs | kG | kM | kB | kO | kL4 | kQn | kQ5m | kEm},
      {"--n-ff-exp", o.n_ff_exp.has_value(),
       kQ3 | kQ2 | kDs | kG | kB | kO | kL4 | kQn | kQ5m | kEm},
      {"--linear-k-heads", o.linear_k_heads.has_value(), kHybrid},
      {"--linear-v-heads", o.linear_v_heads.has_value(), kHybrid},
      {"--linear-head-dim", o.linear_head_dim.has_value(), kHybrid},
      {"--full-attn-interval", o.full_attn_interval.has_value(), kHybrid},
      {"--moe-layer-step", o.moe_layer_step.has_value(), kL4 | kEm},
      {"--index-top-k", o.index_top_k.has_value(), kDs},
      {"--index-heads", o.index_heads.has_value(), kDs},
      {"--index-dim", o.index_dim.has_value(), kDs},
      {"--sliding-window", o.sliding_window.has_value(), kO | kGe | kP3},
      {"--n-ff-shexp", o.n_ff_shexp.has_value(), kQ2 | kQn | kQ5m},
      {"--n-expert-shared", o.n_expert_shared.has_value(), kDs | kG | kB | kEm},
      {"--n-dense-lead", o.n_dense_lead.has_value(), kDs | kG | kB | kEm},
      {"--n-group", o.n_group.has_value(), kDs | kB},
      {"--n-group-used", o.n_group_used.has_value(), kDs | kB},
      {"--q-lora-rank", o.q_lora_rank.has_value(), kDs},
      {"--kv-lora-rank", o.kv_lora_rank.has_value(), kDs},
      {"--qk-rope-dim", o.qk_rope_dim.has_value(), kDs},
      {"--qk-nope-dim", o.qk_nope_dim.has_value(), kDs},
      {"--v-head-dim", o.v_head_dim.has_value(), kDs},
      {"--gating", o.gating.has_value(), kDs},
      {"--expert-weights-norm", o.expert_weights_norm.has_value(), kDs | kG | kB},
      {"--expert-weights-scale", o.expert_weights_scale.has_value(), kDs | kG | kB},
  };
  const auto bit = static_cast<uint32_t>(1u << static_cast<unsigned>(arch));
  for (const Use& u : uses)
    if (u.set && (u.archs & bit) == 0)
      TROUPE_INPUT_ERROR("%s does not apply to --arch %s", u.flag, o.arch.c_str());
}

// Sizes every architecture has, and per-head widths of standard attention.
void resolve_common(const SynthOptions& o, SynthConfig& c) {
  const bool ds = c.arch == SynthArch::kDeepseek2;
  const bool llama =
      c.arch == SynthArch::kLlama || c.arch == SynthArch::kMixtral || c.arch == SynthArch::kLlama4;
  const bool ernie = c.arch == SynthArch::kErnie45 || c.arch == SynthArch::kErnie45Moe;
  const bool gemma = c.arch == SynthArch::kGemma3;
  c.n_embd = o.n_embd.value_or(128);
  // Gemma 3: seven layers by default, so that both kinds are there (layer 5 is global).
  c.n_layer = o.n_layer.value_or(gemma ? 7 : 4);
  c.n_head = o.n_head.value_or(8);
  // Default GQA: a quarter of the heads (8 -> 2, as in ../shared's models; 32 -> 8).
  c.n_head_kv = ds ? 1 : o.n_head_kv.value_or(c.n_head % 4 == 0 ? c.n_head / 4 : c.n_head);
  const bool minimax = c.arch == SynthArch::kMinimaxM2;
  c.n_ff = o.n_ff.value_or(c.arch == SynthArch::kMixtral || minimax ? 32 : 256);
  c.rope_theta = o.rope_theta.value_or(c.arch == SynthArch::kLlama4 || ernie ? 5e5f
                                       : llama || ds                         ? 1e4f
                                                                             : 1e6f);
  c.rms_eps = o.rms_eps.value_or(llama || ernie || c.arch == SynthArch::kGlm4Moe ? 1e-5f : 1e-6f);
  check_positive("--n-embd", c.n_embd);
  check_positive("--n-layer", c.n_layer);
  check_positive("--n-head", c.n_head);
  check_positive("--n-head-kv", c.n_head_kv);
  check_positive("--n-ff", c.n_ff);
  if (!(c.rope_theta > 0) || !std::isfinite(c.rope_theta))
    TROUPE_INPUT_ERROR("--rope-theta must be positive");
  if (!(c.rms_eps > 0) || !(c.rms_eps < 1)) TROUPE_INPUT_ERROR("--rms-eps must be in (0, 1)");
  if (c.n_head % c.n_head_kv != 0)
    TROUPE_INPUT_ERROR("--n-head %lld is not a multiple of --n-head-kv %lld",
                       static_cast<long long>(c.n_head), static_cast<long long>(c.n_head_kv));
  if (o.n_ctx <= 0 || o.n_ctx > (int64_t{1} << 24)) TROUPE_INPUT_ERROR("bad context length");
  if (ds) return;  // MLA widths come from resolve_mla
  const bool qwen3next = c.arch == SynthArch::kQwen3Next || c.arch == SynthArch::kQwen35Moe ||
                         c.arch == SynthArch::kQwen35;
  if (c.arch == SynthArch::kQwen3Moe || c.arch == SynthArch::kQwen3 ||
      c.arch == SynthArch::kGlm4Moe || minimax || c.arch == SynthArch::kGptOss || gemma ||
      qwen3next) {
    // Qwen3, GLM and MiniMax heads are often wider than n_embd/n_head (30B-A3B: 2048/32 heads
    // of 128; GLM-4.5-Air: 4096/96 of 128; MiniMax-M2: 3072/48 of 128): twice by default, any
    // with --head-dim.
    c.head_dim = o.head_dim.value_or(std::max<int64_t>(2, 2 * c.n_embd / c.n_head));
  } else if (ernie) {  // ERNIE-4.5-0.3B's heads are twice n_embd / n_head, the MoE models' not
    const int64_t per = std::max<int64_t>(2, c.n_embd / c.n_head);
    c.head_dim = o.head_dim.value_or(c.arch == SynthArch::kErnie45 ? 2 * per : per);
  } else {
    if (c.n_embd % c.n_head != 0)
      TROUPE_INPUT_ERROR("--n-embd %lld is not a multiple of --n-head %lld",
                         static_cast<long long>(c.n_embd), static_cast<long long>(c.n_head));
    c.head_dim = c.n_embd / c.n_head;
  }
  check_positive("--head-dim", c.head_dim);
  if (c.head_dim % 2 != 0)
    TROUPE_INPUT_ERROR("head width %lld must be even for rope", static_cast<long long>(c.head_dim));
  // GLM and MiniMax-M2 rotate half of each head (partial_rotary_factor 0.5, rotary_dim 64 of
  // 128).
  const bool half = c.arch == SynthArch::kGlm4Moe || minimax || c.arch == SynthArch::kBailingMoe2;
  // Qwen3-Next a quarter (partial_rotary_factor 0.25, 64 of 256).
  // Phi-4-mini three quarters (partial_rotary_factor 0.75, 96 of 128).
  c.rope_dim = half                         ? c.head_dim / 2 / 2 * 2
               : qwen3next                  ? c.head_dim / 4 / 2 * 2
               : c.arch == SynthArch::kPhi3 ? c.head_dim * 3 / 4 / 2 * 2
                                            : c.head_dim;
  if (c.rope_dim < 2) TROUPE_INPUT_ERROR("--head-dim must be at least 4 for %s", o.arch.c_str());
}

void resolve_moe(const SynthOptions& o, SynthConfig& c) {
  if (c.arch == SynthArch::kLlama || c.arch == SynthArch::kQwen2 || c.arch == SynthArch::kQwen3 ||
      c.arch == SynthArch::kGemma3 || c.arch == SynthArch::kQwen35 || c.arch == SynthArch::kPhi3 ||
      c.arch == SynthArch::kErnie45)
    return;
  const bool ds = c.arch == SynthArch::kDeepseek2 || c.arch == SynthArch::kGlm4Moe ||
                  c.arch == SynthArch::kBailingMoe2;
  const bool llama4 = c.arch == SynthArch::kLlama4;  // Scout and Maverick route to one expert
  c.n_expert = o.n_expert.value_or(ds ? 16 : 8);
  c.n_expert_used = o.n_expert_used.value_or(ds ? 4 : llama4 ? 1 : 2);
  check_positive("--n-expert", c.n_expert);
  check_positive("--n-expert-used", c.n_expert_used);
  if (c.n_expert > 4096) TROUPE_INPUT_ERROR("--n-expert must be at most 4096");
  if (c.n_expert_used > c.n_expert)
    TROUPE_INPUT_ERROR("--n-expert-used %lld exceeds --n-expert %lld",
                       static_cast<long long>(c.n_expert_used), static_cast<long long>(c.n_expert));
  // Mixtral's and MiniMax-M2's experts are feed_forward_length wide.
  c.n_ff_exp = c.arch == SynthArch::kMixtral || c.arch == SynthArch::kMinimaxM2
                   ? c.n_ff
                   : o.n_ff_exp.value_or(32);
  check_positive("--n-ff-exp", c.n_ff_exp);
  if (llama4 || c.arch == SynthArch::kErnie45Moe) {
    // Maverick's interleaving by default, so that both kinds of layer are there; ERNIE's
    // released models have experts in every layer after the first (21B-A3B) or third.
    c.moe_step = o.moe_layer_step.value_or(llama4 ? 2 : 1);
    if (c.moe_step <= 0 || c.moe_step > c.n_layer)
      TROUPE_INPUT_ERROR("--moe-layer-step must be between 1 and --n-layer");
  }
  if (c.arch == SynthArch::kErnie45Moe) {  // 21B-A3B: two shared experts, the first layer dense
    c.n_expert_shared = o.n_expert_shared.value_or(2);
    c.n_dense_lead = o.n_dense_lead.value_or(1);
    if (c.n_expert_shared < 0 || c.n_expert_shared > 64)
      TROUPE_INPUT_ERROR("--n-expert-shared must be between 0 and 64");
    if (c.n_dense_lead < 0 || c.n_dense_lead > c.n_layer)
      TROUPE_INPUT_ERROR("--n-dense-lead must be between 0 and --n-layer");
  }
  if (c.arch == SynthArch::kQwen2Moe || c.arch == SynthArch::kQwen3Next ||
      c.arch == SynthArch::kQwen35Moe) {
    c.n_ff_shexp = o.n_ff_shexp.value_or(64);
    check_positive("--n-ff-shexp", c.n_ff_shexp);
  }
}

// Qwen3-Next's Gated DeltaNet: 2 key heads and 4 value heads of 32 by default (the 80B's 16 and
// 32 of 128, scaled down), full attention every fourth layer.
void resolve_linear_attention(const SynthOptions& o, SynthConfig& c) {
  c.lin_k_heads = o.linear_k_heads.value_or(2);
  c.lin_v_heads = o.linear_v_heads.value_or(2 * c.lin_k_heads);
  c.lin_dim = o.linear_head_dim.value_or(32);
  c.full_every = o.full_attn_interval.value_or(4);
  check_positive("--linear-k-heads", c.lin_k_heads);
  check_positive("--linear-v-heads", c.lin_v_heads);
  check_positive("--linear-head-dim", c.lin_dim);
  if (c.lin_v_heads % c.lin_k_heads != 0)
    TROUPE_INPUT_ERROR("--linear-v-heads %lld is not a multiple of --linear-k-heads %lld",
                       static_cast<long long>(c.lin_v_heads),
                       static_cast<long long>(c.lin_k_heads));
  if (c.full_every <= 0 || c.full_every > c.n_layer)
    TROUPE_INPUT_ERROR("--full-attn-interval must be between 1 and --n-layer");
}

// DeepSeek-V3's routing (GLM-4.5's too): shared experts, leading dense layers, group-limited
// sigmoid routing with a selection bias.
void resolve_sigmoid_routing(const SynthOptions& o, SynthConfig& c) {
  const bool glm = c.arch == SynthArch::kGlm4Moe;
  c.n_dense_lead = o.n_dense_lead.value_or(1);
  c.n_expert_shared = o.n_expert_shared.value_or(1);
  c.n_group = o.n_group.value_or(glm ? 1 : 4);  // GLM-4.5 routes without groups
  c.n_group_used = o.n_group_used.value_or(glm ? 1 : 2);
  const std::string gating = o.gating.value_or("sigmoid");
  if (gating != "sigmoid" && gating != "softmax")
    TROUPE_INPUT_ERROR("--gating must be softmax or sigmoid, got '%s'", gating.c_str());
  c.sigmoid = gating == "sigmoid";
  c.w_norm = o.expert_weights_norm.value_or(true);
  c.w_scale = o.expert_weights_scale.value_or(2.5f);
  check_positive("--n-group", c.n_group);
  check_positive("--n-group-used", c.n_group_used);
  if (c.n_expert_shared < 0 || c.n_expert_shared > 64)
    TROUPE_INPUT_ERROR("--n-expert-shared must be between 0 and 64");
  if (c.n_dense_lead < 0 || c.n_dense_lead > c.n_layer)
    TROUPE_INPUT_ERROR("--n-dense-lead must be between 0 and --n-layer");
  if (c.n_expert % c.n_group != 0)
    TROUPE_INPUT_ERROR("--n-expert %lld is not a multiple of --n-group %lld",
                       static_cast<long long>(c.n_expert), static_cast<long long>(c.n_group));
  if (c.n_group_used > c.n_group) TROUPE_INPUT_ERROR("--n-group-used exceeds --n-group");
  if (c.n_expert_used > c.n_group_used * (c.n_expert / c.n_group))
    TROUPE_INPUT_ERROR("--n-expert-used %lld exceeds the %lld experts of %lld used groups",
                       static_cast<long long>(c.n_expert_used),
                       static_cast<long long>(c.n_group_used * (c.n_expert / c.n_group)),
                       static_cast<long long>(c.n_group_used));
  if (!(c.w_scale > 0) || !std::isfinite(c.w_scale))
    TROUPE_INPUT_ERROR("--expert-weights-scale must be positive");
  if (glm) c.n_nextn = 1;  // as every released GLM-4.5 checkpoint
}

// DeepSeek-V2/V3: latent attention widths, then the routing.
void resolve_mla(const SynthOptions& o, SynthConfig& c) {
  c.q_lora = o.q_lora_rank.value_or(64);
  c.kv_lora = o.kv_lora_rank.value_or(32);
  c.rope_dim = o.qk_rope_dim.value_or(16);
  c.nope_dim = o.qk_nope_dim.value_or(32);
  c.v_dim = o.v_head_dim.value_or(32);
  if (c.q_lora < 0 || c.q_lora > (int64_t{1} << 24))
    TROUPE_INPUT_ERROR("--q-lora-rank must be 0 (no q compression) or positive");
  check_positive("--kv-lora-rank", c.kv_lora);
  check_positive("--qk-rope-dim", c.rope_dim);
  check_positive("--qk-nope-dim", c.nope_dim);
  check_positive("--v-head-dim", c.v_dim);
  if (c.rope_dim % 2 != 0) TROUPE_INPUT_ERROR("--qk-rope-dim must be even");
  c.head_dim = c.nope_dim + c.rope_dim;
  if (o.arch == "deepseek32" || o.arch == "glm-dsa") {  // the indexer: 4 heads of 2 x rotary
    if (c.q_lora == 0) TROUPE_INPUT_ERROR("--arch %s needs --q-lora-rank above 0", o.arch.c_str());
    c.index_top_k = o.index_top_k.value_or(2048);
    check_positive("--index-top-k", c.index_top_k);
    c.index_heads = o.index_heads.value_or(4);
    c.index_dim = o.index_dim.value_or(2 * c.rope_dim);
    check_positive("--index-heads", c.index_heads);
    if (c.index_dim < c.rope_dim || c.index_dim > (int64_t{1} << 16))
      TROUPE_INPUT_ERROR("--index-dim must be between --qk-rope-dim and 65536");
  } else if (o.index_top_k || o.index_heads || o.index_dim) {
    TROUPE_INPUT_ERROR(
        "--index-top-k, --index-heads and --index-dim apply to --arch deepseek32 and glm-dsa");
  }
  resolve_sigmoid_routing(o, c);
}

}  // namespace

SynthConfig resolve_synth_config(const SynthOptions& o) {
  SynthConfig c{};
  c.arch = parse_arch(o.arch);
  check_applicable(o, c.arch);
  c.gguf_arch = c.arch == SynthArch::kLlama || c.arch == SynthArch::kMixtral ? "llama" : o.arch;
  if (o.arch == "deepseek32" || o.arch == "glm-dsa") c.gguf_arch = o.arch;
  resolve_common(o, c);
  resolve_moe(o, c);
  if (c.arch == SynthArch::kDeepseek2) resolve_mla(o, c);
  if (c.arch == SynthArch::kQwen3Next || c.arch == SynthArch::kQwen35Moe ||
      c.arch == SynthArch::kQwen35)
    resolve_linear_attention(o, c);
  if (c.arch == SynthArch::kGlm4Moe || c.arch == SynthArch::kBailingMoe2)
    resolve_sigmoid_routing(o, c);
  if (c.arch == SynthArch::kGptOss || c.arch == SynthArch::kGemma3) {
    c.n_swa = o.sliding_window.value_or(8);
    check_positive("--sliding-window", c.n_swa);
  }
  if (c.arch == SynthArch::kPhi3) {  // Phi-4-mini has no window; Phi-3-mini-4k's is 2047
    c.n_swa = o.sliding_window.value_or(0);
    if (c.n_swa < 0) TROUPE_INPUT_ERROR("--sliding-window must not be negative");
  }
  return c;
}

uint32_t synth_file_type(
    GgmlType t) {  // llama_ftype: all f32, mostly f16 / q4_0 / q8_0 / bf16 / ...
  switch (t) {
    case GgmlType::kF16:
      return 1;
    case GgmlType::kQ4_0:
      return 2;
    case GgmlType::kQ4_1:
      return 3;
    case GgmlType::kQ5_0:
      return 8;
    case GgmlType::kQ5_1:
      return 9;
    case GgmlType::kQ8_0:
      return 7;
    case GgmlType::kBF16:
      return 32;
    case GgmlType::kIQ4_NL:
      return 25;
    case GgmlType::kIQ4_XS:
      return 30;
    case GgmlType::kMXFP4:
      return 38;  // mostly MXFP4 (llama.cpp's "MXFP4 MoE")
    case GgmlType::kQ2_K:
      return 10;
    case GgmlType::kQ3_K:
      return 11;  // mostly Q3_K (small)
    case GgmlType::kQ4_K:
      return 14;  // mostly Q4_K (small)
    case GgmlType::kQ5_K:
      return 16;  // mostly Q5_K (small)
    case GgmlType::kQ6_K:
      return 18;
    default:
      return 0;
  }
}

bool synth_indexer_shared(const SynthConfig& c, int64_t il) {
  return c.gguf_arch == "glm-dsa" && ModelSpec::glm52_indexer_shared(il);
}

int64_t phi3_original_context(int64_t n_ctx) { return std::max<int64_t>(2, n_ctx / 4); }

float phi3_attn_factor(int64_t n_ctx) {
  const double orig = static_cast<double>(phi3_original_context(n_ctx));
  const double ratio = static_cast<double>(n_ctx) / orig;
  return ratio <= 1 ? 1.f : static_cast<float>(std::sqrt(1 + std::log(ratio) / std::log(orig)));
}

void write_synth_hparams(GgufWriter& w, const SynthConfig& c, const SynthOptions& o,
                         int64_t n_vocab) {
  const std::string k = c.gguf_arch + ".";
  auto u32 = [&](const char* key, int64_t v) { w.set_u32(k + key, static_cast<uint32_t>(v)); };
  u32("context_length", o.n_ctx);
  u32("embedding_length", c.n_embd);
  u32("block_count", c.n_layer);
  u32("feed_forward_length", c.n_ff);
  u32("attention.head_count", c.n_head);
  w.set_f32(k + "rope.freq_base", c.rope_theta);
  w.set_f32(k + "attention.layer_norm_rms_epsilon", c.rms_eps);
  u32("vocab_size", n_vocab);
  u32("attention.head_count_kv", c.n_head_kv);
  // Key groups several architectures write (llama.cpp's names; the order is each file's).
  auto head_dims = [&] {
    u32("attention.key_length", c.head_dim);
    u32("attention.value_length", c.head_dim);
  };
  auto experts = [&] {  // expert width first, as llama.cpp's DeepSeek-style converters
    u32("expert_feed_forward_length", c.n_ff_exp);
    u32("expert_count", c.n_expert);
    u32("expert_used_count", c.n_expert_used);
  };
  auto shared_and_weights = [&](int64_t gating) {
    u32("expert_shared_count", c.n_expert_shared);
    w.set_f32(k + "expert_weights_scale", c.w_scale);
    w.set_bool(k + "expert_weights_norm", c.w_norm);
    u32("expert_gating_func", gating);
  };
  auto groups = [&] {
    u32("expert_group_count", c.n_group);
    u32("expert_group_used_count", c.n_group_used);
  };
  switch (c.arch) {
    case SynthArch::kLlama:
    case SynthArch::kQwen2:
      u32("rope.dimension_count", c.rope_dim);
      break;
    case SynthArch::kMixtral:
      u32("rope.dimension_count", c.rope_dim);
      u32("expert_count", c.n_expert);
      u32("expert_used_count", c.n_expert_used);
      break;
    case SynthArch::kQwen3:
      u32("rope.dimension_count", c.rope_dim);
      head_dims();
      break;
    case SynthArch::kQwen3Moe:
      u32("rope.dimension_count", c.rope_dim);
      head_dims();
      u32("expert_count", c.n_expert);
      u32("expert_used_count", c.n_expert_used);
      u32("expert_feed_forward_length", c.n_ff_exp);
      break;
    case SynthArch::kQwen2Moe:
      u32("rope.dimension_count", c.rope_dim);
      u32("expert_count", c.n_expert);
      u32("expert_used_count", c.n_expert_used);
      u32("expert_feed_forward_length", c.n_ff_exp);
      u32("expert_shared_feed_forward_length", c.n_ff_shexp);
      break;
    case SynthArch::kMinimaxM2:
      u32("rope.dimension_count", c.rope_dim);
      head_dims();
      experts();
      u32("expert_gating_func", 2);
      break;
    case SynthArch::kGptOss:
      u32("rope.dimension_count", c.rope_dim);
      head_dims();
      u32("attention.sliding_window", c.n_swa);
      experts();
      break;
    case SynthArch::kLlama4:  // llama.cpp's converter: Llama's keys, then these
      u32("rope.dimension_count", c.rope_dim);
      u32("attention.key_length", c.head_dim);
      u32("expert_count", c.n_expert);
      u32("expert_used_count", c.n_expert_used);
      u32("interleave_moe_layer_step", c.moe_step);
      u32("expert_feed_forward_length", c.n_ff_exp);
      break;
    case SynthArch::kQwen3Next:
    case SynthArch::kQwen35Moe:
    case SynthArch::kQwen35:
      u32("rope.dimension_count", c.rope_dim);
      head_dims();
      if (c.arch != SynthArch::kQwen35) {
        experts();
        u32("expert_shared_feed_forward_length", c.n_ff_shexp);
      }
      if (c.arch != SynthArch::kQwen3Next) {  // Qwen3.5's multimodal rope: text, t = h = w
        const auto pairs = static_cast<int32_t>(c.rope_dim / 2);
        w.set_array_i32(k + "rope.dimension_sections",
                        std::vector<int32_t>{(pairs + 2) / 3, (pairs + 1) / 3, pairs / 3, 0});
      }
      u32("ssm.conv_kernel", 4);
      u32("ssm.state_size", c.lin_dim);
      u32("ssm.group_count", c.lin_k_heads);
      u32("ssm.time_step_rank", c.lin_v_heads);
      u32("ssm.inner_size", c.lin_v_heads * c.lin_dim);
      u32("full_attention_interval", c.full_every);
      break;
    case SynthArch::kPhi3:
      u32("rope.dimension_count", c.rope_dim);
      // LongRoPE over a quarter of the context (Phi-4-mini: 4096 of 131072), and its factor.
      u32("rope.scaling.original_context_length", phi3_original_context(o.n_ctx));
      w.set_f32(k + "rope.scaling.attn_factor", phi3_attn_factor(o.n_ctx));
      if (c.n_swa > 0) u32("attention.sliding_window", c.n_swa);
      break;
    case SynthArch::kErnie45:  // llama.cpp's converter: the keys of its config, then these
    case SynthArch::kErnie45Moe:
      head_dims();
      if (c.arch == SynthArch::kErnie45) break;
      u32("expert_count", c.n_expert);
      u32("expert_used_count", c.n_expert_used);
      u32("interleave_moe_layer_step", c.moe_step);
      u32("leading_dense_block_count", c.n_dense_lead);
      u32("expert_feed_forward_length", c.n_ff_exp);
      u32("expert_shared_count", c.n_expert_shared);
      if (c.n_expert_shared > 0)
        u32("expert_shared_feed_forward_length", c.n_ff_exp * c.n_expert_shared);
      break;
    case SynthArch::kGemma3:  // llama.cpp's converter writes no rope.dimension_count
      head_dims();
      u32("attention.sliding_window", c.n_swa);
      break;
    case SynthArch::kBailingMoe2:
      u32("rope.dimension_count", c.rope_dim);
      u32("leading_dense_block_count", c.n_dense_lead);
      u32("expert_shared_feed_forward_length", c.n_ff_exp * c.n_expert_shared);
      experts();
      shared_and_weights(2);
      groups();
      break;
    case SynthArch::kGlm4Moe:
      u32("block_count", c.n_layer + c.n_nextn);
      u32("nextn_predict_layers", c.n_nextn);
      u32("rope.dimension_count", c.rope_dim);
      head_dims();
      u32("leading_dense_block_count", c.n_dense_lead);
      experts();
      shared_and_weights(2);
      break;
    case SynthArch::kDeepseek2:
      // MLA is stored as MQA over the latent: key/value_length describe the cache rows,
      // the _mla variants the decompressed heads (llama.cpp's convention).
      u32("leading_dense_block_count", c.n_dense_lead);
      u32("attention.q_lora_rank", c.q_lora);
      u32("attention.kv_lora_rank", c.kv_lora);
      u32("attention.key_length", c.kv_lora + c.rope_dim);
      u32("attention.value_length", c.kv_lora);
      u32("attention.key_length_mla", c.nope_dim + c.rope_dim);
      u32("attention.value_length_mla", c.v_dim);
      experts();
      shared_and_weights(c.sigmoid ? 2 : 1);
      groups();
      u32("rope.dimension_count", c.rope_dim);
      if (c.index_top_k > 0) {
        u32("attention.indexer.head_count", c.index_heads);
        u32("attention.indexer.key_length", c.index_dim);
        u32("attention.indexer.top_k", c.index_top_k);
      }
      if (c.gguf_arch == "glm-dsa") {
        std::vector<uint32_t> types;
        for (int64_t il = 0; il < c.n_layer; ++il)
          types.push_back(synth_indexer_shared(c, il) ? 0 : 1);
        w.set_array_u32(k + "attention.indexer.types", types);
      }
      break;
  }
}

}  // namespace troupe::model::detail
