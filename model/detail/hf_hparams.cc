// config.json → hyperparameters, family and MoE layers (model/detail/hf_hparams.h). Defaults
// are those of the transformers config classes; the semantics those llama.cpp's GGUF converter
// gives each family.
#include "model/detail/hf_hparams.h"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "base/check.h"

namespace troupe::model::detail {
namespace {

using nlohmann::json;

constexpr int64_t kMaxLayers = 4096;

class HparamsReader {
 public:
  explicit HparamsReader(const HfConfig& cfg) : cfg_(cfg) {}

  HfHparams read() {
    const std::string arch = read_family();
    read_common(arch);
    if (mla()) {
      read_mla(arch == "DeepseekV32ForCausalLM" || glm_dsa_);
    } else if (h_.family == HfFamily::kDeepseekV4) {
      read_deepseek_v4();
    } else {
      read_attention(arch);
      read_moe_counts();
    }
    // Phi-3 keeps LongRoPE's original context beside max_position_embeddings, not in
    // rope_scaling.
    if (h_.family == HfFamily::kPhi3 &&
        !rope_params_.contains("original_max_position_embeddings") &&
        cfg_.has("original_max_position_embeddings"))
      rope_params_["original_max_position_embeddings"] =
          cfg_.get_int("original_max_position_embeddings");
    apply_hf_rope_scaling(rope_params_, cfg_.path(), mla(), h_.spec);
    // DeepSeek-V4's compressed layers take YaRN's frequencies without its magnitude factor.
    if (h_.family == HfFamily::kDeepseekV4) h_.spec.rope_scaling.attn_factor = v4_attention_factor_;
    ModelSpec& s = h_.spec;
    if (s.n_expert > 0 && (s.n_expert_used <= 0 || s.n_ff_exp <= 0))
      TROUPE_INPUT_ERROR("%s: MoE model needs num_experts_per_tok and the expert FFN width",
                         cfg_.path().c_str());
    mark_moe_layers();
    return std::move(h_);
  }

 private:
  bool mla() const {
    return h_.family == HfFamily::kDeepseekV2 || h_.family == HfFamily::kDeepseekV3;
  }

  /// The class name from "architectures"; sets the family.
  std::string read_family() {
    const json* archs = cfg_.find("architectures");
    if (!archs || !archs->is_array() || archs->empty() || !(*archs)[0].is_string())
      TROUPE_INPUT_ERROR("%s: missing \"architectures\" (a list of class names)",
                         cfg_.path().c_str());
    const std::string arch = (*archs)[0].get<std::string>();
    static const std::pair<const char*, HfFamily> kFamilies[] = {
        {"LlamaForCausalLM", HfFamily::kLlama},
        {"MistralForCausalLM", HfFamily::kLlama},  // Llama's, with an optional sliding window
        {"Phi3ForCausalLM", HfFamily::kPhi3},
        {"Ernie4_5ForCausalLM", HfFamily::kErnie45},
        {"Ernie4_5_MoeForCausalLM", HfFamily::kErnie45},
        {"MixtralForCausalLM", HfFamily::kMixtral},
        {"Qwen2ForCausalLM", HfFamily::kQwen2},
        {"Qwen3ForCausalLM", HfFamily::kQwen3},
        {"Qwen2MoeForCausalLM", HfFamily::kQwen2Moe},
        {"Qwen3MoeForCausalLM", HfFamily::kQwen3Moe},
        {"DeepseekV2ForCausalLM", HfFamily::kDeepseekV2},
        {"DeepseekV3ForCausalLM", HfFamily::kDeepseekV3},
        {"DeepseekV32ForCausalLM", HfFamily::kDeepseekV3},  // V3 with the sparse attention
        {"GlmMoeDsaForCausalLM", HfFamily::kDeepseekV3},    // GLM-5: V3.2's layers (read_mla)
        {"DeepseekV4ForCausalLM", HfFamily::kDeepseekV4},
        {"Glm4MoeForCausalLM", HfFamily::kGlm4Moe},
        {"MiniMaxM2ForCausalLM", HfFamily::kMinimaxM2},
        {"BailingMoeV2ForCausalLM", HfFamily::kBailingMoeV2},
        {"GptOssForCausalLM", HfFamily::kGptOss},
        {"Gemma3ForCausalLM", HfFamily::kGemma3},
        {"Llama4ForCausalLM", HfFamily::kLlama4},
        {"Qwen3NextForCausalLM", HfFamily::kQwen3Next},
        {"Qwen3_5MoeForCausalLM", HfFamily::kQwen3Next},
        {"Qwen3_5ForCausalLM", HfFamily::kQwen3Next},
    };
    for (const auto& [name, family] : kFamilies) {
      if (arch == name) {
        h_.family = family;
        h_.qwen35 = arch.rfind("Qwen3_5", 0) == 0;
        ernie_moe_ = arch == "Ernie4_5_MoeForCausalLM";
        glm_dsa_ = arch == "GlmMoeDsaForCausalLM";
        return arch;
      }
    }
    std::string known;
    for (const auto& [name, family] : kFamilies)
      known += std::string(known.empty() ? "" : ", ") + name;
    TROUPE_INPUT_ERROR("%s: architecture '%s' is not supported (troupe reads %s)",
                       cfg_.path().c_str(), arch.c_str(), known.c_str());
  }

  /// Widths, counts, norm epsilon and RoPE base shared by all families.
  void read_common(const std::string& arch) {
    ModelSpec& s = h_.spec;
    const bool mixtral = h_.family == HfFamily::kMixtral;
    const bool glm = h_.family == HfFamily::kGlm4Moe;
    const bool minimax = h_.family == HfFamily::kMinimaxM2;
    const bool oss = h_.family == HfFamily::kGptOss;
    const bool gemma = h_.family == HfFamily::kGemma3;
    const bool llama4 = h_.family == HfFamily::kLlama4;
    s.name = cfg_.get_string_or("_name_or_path", cfg_.get_string_or("model_type", arch));

    // Gemma names its activation hidden_activation (GELU's tanh form); the others SiLU.
    const std::string want = gemma ? "gelu_pytorch_tanh" : "silu";
    const char* act_key =
        gemma && cfg_.has("hidden_activation") ? "hidden_activation" : "hidden_act";
    const std::string act = cfg_.get_string_or(act_key, want);
    if (act != want)
      TROUPE_INPUT_ERROR("%s: %s '%s' is not supported for %s (only %s)", cfg_.path().c_str(),
                         act_key, act.c_str(), arch.c_str(), want.c_str());
    const bool ernie = h_.family == HfFamily::kErnie45;
    h_.tied = cfg_.get_bool_or("tie_word_embeddings", gemma || ernie);
    s.n_vocab = cfg_.get_dim("vocab_size");
    s.n_embd = cfg_.get_dim("hidden_size");
    s.n_layer = cfg_.get_dim("num_hidden_layers");
    if (s.n_layer > kMaxLayers)
      TROUPE_INPUT_ERROR("%s: num_hidden_layers %lld is out of range", cfg_.path().c_str(),
                         static_cast<long long>(s.n_layer));
    s.n_head = cfg_.get_dim("num_attention_heads");
    s.n_head_kv = cfg_.has("num_key_value_heads") ? cfg_.get_dim("num_key_value_heads") : s.n_head;
    if (s.n_head % s.n_head_kv != 0)
      TROUPE_INPUT_ERROR(
          "%s: num_attention_heads %lld is not a multiple of num_key_value_heads "
          "%lld",
          cfg_.path().c_str(), static_cast<long long>(s.n_head),
          static_cast<long long>(s.n_head_kv));
    s.n_ctx_train = cfg_.get_int_or("max_position_embeddings", 2048);
    s.rms_eps = static_cast<float>(cfg_.get_float_or(
        "rms_norm_eps", mixtral || glm || oss || llama4 || glm_dsa_ ? 1e-5 : 1e-6));
    s.rope_theta = static_cast<float>(read_rope(mixtral || gemma  ? 1e6
                                                : oss             ? 150000.0
                                                : llama4 || ernie ? 500000.0
                                                                  : 10000.0));
    // MiniMax-M2 and gpt-oss have no dense FFN: intermediate_size is each expert's width.
    // Llama 4's dense layers are intermediate_size_mlp wide (intermediate_size: an expert's).
    s.n_ff = minimax || oss ? 0
             : llama4       ? cfg_.get_int_or("intermediate_size_mlp", 0)
                            : cfg_.get_int_or("intermediate_size", 0);
    if (cfg_.get_bool_or("mlp_bias", false))
      TROUPE_INPUT_ERROR("%s: mlp_bias is not supported", cfg_.path().c_str());
  }

  /// Standard (non-MLA) attention: head size, RoPE layout, biases and q/k norms.
  void read_attention(const std::string& arch) {
    ModelSpec& s = h_.spec;
    const HfFamily f = h_.family;
    // Ernie4_5Config's default is 128 (its 0.3B: 16 heads of 128 over 1024); the MoE config
    // class has none (hidden_size / heads).
    const int64_t head_dim = cfg_.has("head_dim") ? cfg_.get_dim("head_dim")
                             : f == HfFamily::kGemma3 || f == HfFamily::kQwen3Next
                                 ? 256  // their configs' default
                             : arch == "Ernie4_5ForCausalLM" ? 128
                                                             : s.n_embd / s.n_head;
    if (head_dim <= 0) TROUPE_INPUT_ERROR("%s: head size is 0", cfg_.path().c_str());
    s.head_dim_k = s.head_dim_v = head_dim;
    if (f == HfFamily::kMinimaxM2 || (f == HfFamily::kBailingMoeV2 && cfg_.has("rotary_dim"))) {
      s.n_rot = cfg_.has("rotary_dim") ? cfg_.get_dim("rotary_dim") : head_dim;
    } else {
      // GLM-4.5 rotates half of each head, Qwen3-Next a quarter (their config classes'
      // defaults); Qwen3.5 says so in rope_parameters.
      const auto in_params = rope_params_.find("partial_rotary_factor");
      const double partial =
          cfg_.has("partial_rotary_factor") || in_params == rope_params_.end() ||
                  !in_params->is_number()
              ? cfg_.get_float_or("partial_rotary_factor", f == HfFamily::kGlm4Moe     ? 0.5
                                                           : f == HfFamily::kQwen3Next ? 0.25
                                                                                       : 1.0)
              : in_params->get<double>();
      if (!(partial > 0 && partial <= 1))
        TROUPE_INPUT_ERROR("%s: partial_rotary_factor %g must be in (0, 1]", cfg_.path().c_str(),
                           partial);
      s.n_rot = static_cast<int64_t>(static_cast<double>(head_dim) * partial);
    }
    // HF applies rotate_half to q/k rows as stored; GGUF permutes Llama rows instead. Llama 4
    // rotates adjacent pairs (complex products), as GGUF's unpermuted rows; so does ERNIE 4.5
    // (its rotate_half pairs x[2i] with x[2i+1]).
    s.rope_style =
        f == HfFamily::kLlama4 || f == HfFamily::kErnie45 ? RopeStyle::kNormal : RopeStyle::kNeox;
    // Qwen2 and Qwen2-MoE always have q/k/v biases (their attention_bias key does not exist);
    // GLM has them when attention_bias says so (o_proj never has one).
    if (f == HfFamily::kQwen2 || f == HfFamily::kQwen2Moe) {
      h_.attention_bias = true;
    } else if (f == HfFamily::kGlm4Moe) {
      h_.attention_bias = cfg_.get_bool_or("attention_bias", false);
    } else if (f == HfFamily::kGptOss) {
      // gpt-oss: q, k, v and o all carry biases when attention_bias (its default).
      h_.attention_bias = h_.output_bias = cfg_.get_bool_or("attention_bias", true);
    } else if (f == HfFamily::kErnie45) {
      // use_bias puts a bias on every projection, the MLPs' and the head's too; no released
      // checkpoint sets it.
      if (cfg_.get_bool_or("use_bias", false))
        TROUPE_INPUT_ERROR("%s: use_bias true (biases on every projection) is not supported",
                           cfg_.path().c_str());
    } else if (f == HfFamily::kBailingMoeV2) {
      h_.attention_bias = cfg_.get_bool_or("use_qkv_bias", false);
      if (cfg_.get_bool_or("use_bias", false))
        TROUPE_INPUT_ERROR("%s: use_bias (an output projection bias) is not supported",
                           cfg_.path().c_str());
    } else if (cfg_.get_bool_or("attention_bias", false)) {
      TROUPE_INPUT_ERROR("%s: attention_bias is not supported for %s (no output bias)",
                         cfg_.path().c_str(), arch.c_str());
    }
    h_.qk_norm = f == HfFamily::kQwen3 || f == HfFamily::kQwen3Moe || f == HfFamily::kGemma3 ||
                 f == HfFamily::kQwen3Next ||
                 (f == HfFamily::kGlm4Moe && cfg_.get_bool_or("use_qk_norm", false)) ||
                 ((f == HfFamily::kMinimaxM2 || f == HfFamily::kBailingMoeV2) &&
                  cfg_.get_bool_or("use_qk_norm", true));
    if (f == HfFamily::kLlama || f == HfFamily::kMixtral || f == HfFamily::kPhi3)
      read_mistral_window();
    if (f == HfFamily::kMinimaxM2) {
      const std::string type = cfg_.get_string_or("qk_norm_type", "per_layer");
      if (type != "per_layer")
        TROUPE_INPUT_ERROR("%s: qk_norm_type '%s' is not supported (per_layer)",
                           cfg_.path().c_str(), type.c_str());
    }
  }

  /// Mistral's and Mixtral's `sliding_window` (Mistral-7B-v0.1's 4096; null or absent in the
  /// later releases): every layer attends to the last that many positions, its own included,
  /// as transformers' mask does. LlamaForCausalLM has no such key. (llama.cpp's converter drops
  /// it: a GGUF of these attends to the whole context.)
  void read_mistral_window() {
    if (!cfg_.has("sliding_window")) return;
    const int64_t window = cfg_.get_int("sliding_window");
    if (window <= 0)
      TROUPE_INPUT_ERROR("%s: sliding_window must be positive, got %lld", cfg_.path().c_str(),
                         static_cast<long long>(window));
    h_.window.assign(static_cast<size_t>(h_.spec.n_layer), window);
  }

  /// Expert counts and routing of the non-MLA families.
  void read_moe_counts() {
    ModelSpec& s = h_.spec;
    switch (h_.family) {
      case HfFamily::kLlama:
      case HfFamily::kPhi3:
        s.arch = Arch::kLlama;
        s.n_ff_exp = s.n_ff;  // as the GGUF reader: llama-arch experts have the FFN width
        s.norm_topk = true;
        break;
      case HfFamily::kMixtral:
        s.arch = Arch::kLlama;
        s.n_expert = cfg_.get_dim("num_local_experts");
        s.n_expert_used = cfg_.get_dim("num_experts_per_tok");
        s.n_ff_exp = s.n_ff;
        s.norm_topk = true;  // MixtralSparseMoeBlock always renormalizes the top-k
        break;
      case HfFamily::kQwen2:
      case HfFamily::kQwen3:
        s.arch = h_.family == HfFamily::kQwen2 ? Arch::kQwen2 : Arch::kQwen3;
        // Qwen2's sliding window applies only where use_sliding_window is set (never in the
        // released checkpoints); troupe attends to the whole context.
        if (cfg_.get_bool_or("use_sliding_window", false))
          TROUPE_INPUT_ERROR("%s: use_sliding_window is not supported", cfg_.path().c_str());
        break;
      case HfFamily::kQwen2Moe:
      case HfFamily::kQwen3Moe:
        s.arch = h_.family == HfFamily::kQwen2Moe ? Arch::kQwen2Moe : Arch::kQwen3Moe;
        s.n_expert = cfg_.get_int_or("num_experts", 0);
        s.n_expert_used = cfg_.get_int_or("num_experts_per_tok", 0);
        s.n_ff_exp = cfg_.get_int_or("moe_intermediate_size", 0);
        s.norm_topk = cfg_.get_bool_or("norm_topk_prob", false);
        if (h_.family == HfFamily::kQwen2Moe) {
          s.n_ff_shexp = cfg_.get_int_or("shared_expert_intermediate_size", 0);
          s.n_expert_shared = s.n_ff_shexp > 0 ? 1 : 0;
        }
        break;
      case HfFamily::kGlm4Moe:
        s.arch = Arch::kGlm4Moe;
        read_sigmoid_routing(/*glm=*/true);
        h_.router_bias = true;
        break;
      case HfFamily::kMinimaxM2:
        read_minimax_m2();
        break;
      case HfFamily::kBailingMoeV2:
        read_bailing_moe_v2();
        break;
      case HfFamily::kGptOss:
        read_gpt_oss();
        break;
      case HfFamily::kGemma3:
        read_gemma3();
        break;
      case HfFamily::kErnie45:
        read_ernie45();
        break;
      case HfFamily::kLlama4:
        read_llama4();
        break;
      case HfFamily::kQwen3Next:
        read_qwen3next();
        break;
      case HfFamily::kDeepseekV2:
      case HfFamily::kDeepseekV3:
        break;  // read_mla
      case HfFamily::kDeepseekV4:
        break;  // read_deepseek_v4
    }
  }

  /// DeepSeek-V3's routing, which GLM-4.5 shares: routed and shared experts, leading dense
  /// layers, sigmoid scores with a selection bias, group-limited top-k (groups ranked by their
  /// two best), optional renormalization, a routed scale. DeepSeek-V2's differs: softmax scores,
  /// topk_method greedy or group_limited_greedy (groups ranked by their best), and weights
  /// renormalized or scaled, never both.
  void read_sigmoid_routing(bool glm) {
    ModelSpec& s = h_.spec;
    const bool v3 = glm || h_.family == HfFamily::kDeepseekV3;
    s.n_expert = cfg_.get_int_or("n_routed_experts", 0);
    s.n_expert_used = cfg_.get_int_or("num_experts_per_tok", 0);
    s.n_ff_exp = cfg_.get_int_or("moe_intermediate_size", 0);
    s.n_expert_shared = cfg_.get_int_or("n_shared_experts", glm || glm_dsa_ ? 1 : 0);
    s.n_ff_shexp = s.n_ff_exp * s.n_expert_shared;
    // GlmMoeDsaConfig's default: three dense layers (GLM-5's).
    s.n_leading_dense = std::min(cfg_.get_int_or("first_k_dense_replace", glm        ? 1
                                                                          : glm_dsa_ ? 3
                                                                                     : 0),
                                 s.n_layer);
    s.routed_scale = static_cast<float>(cfg_.get_float_or("routed_scaling_factor", 1.0));
    s.norm_topk = cfg_.get_bool_or("norm_topk_prob", v3);
    // GLM's router has no such keys: always sigmoid scores and DeepSeek-V3's group limit.
    const std::string scoring =
        glm ? "sigmoid" : cfg_.get_string_or("scoring_func", v3 ? "sigmoid" : "softmax");
    if (scoring == "sigmoid") {
      s.gating = Gating::kSigmoid;
    } else if (scoring == "softmax") {
      s.gating = Gating::kSoftmax;
    } else {
      TROUPE_INPUT_ERROR("%s: scoring_func '%s' is not supported (softmax, sigmoid)",
                         cfg_.path().c_str(), scoring.c_str());
    }
    const std::string topk_method =
        glm ? "noaux_tc" : cfg_.get_string_or("topk_method", v3 ? "noaux_tc" : "greedy");
    // Each family's own gate knows only its methods (V3's raises on any other).
    const bool known = v3 ? topk_method == "noaux_tc"
                          : topk_method == "greedy" || topk_method == "group_limited_greedy";
    if (!known)
      TROUPE_INPUT_ERROR("%s: topk_method '%s' is not supported for %s (%s)", cfg_.path().c_str(),
                         topk_method.c_str(), v3 ? "DeepSeek-V3" : "DeepSeek-V2",
                         v3 ? "noaux_tc" : "greedy, group_limited_greedy");
    if (topk_method == "greedy") {
      s.n_group = s.n_group_used = 1;  // no group limit, whatever n_group says
    } else {
      s.n_group = std::max<int64_t>(1, cfg_.get_int_or("n_group", 1));
      s.n_group_used = std::max<int64_t>(1, cfg_.get_int_or("topk_group", s.n_group));
      // DeepSeek-V2's groups are ranked by their best score, V3's by their two best summed.
      if (topk_method == "group_limited_greedy") s.group_score = GroupScore::kMax;
    }
    // DeepSeek-V2's gate (the modeling_deepseek.py its checkpoints ship) either renormalizes the
    // chosen weights (top_k > 1 and norm_topk_prob) or multiplies them by routed_scaling_factor,
    // never both; V3's does both.
    if (h_.family == HfFamily::kDeepseekV2) apply_v2_gate_weights(s);
  }

  /// MiniMax-M2: every layer routes over experts of intermediate_size with sigmoid scores,
  /// a selection bias and renormalized weights. MiniMax-Text-01's lightning attention and
  /// DeepNorm residual factors share the config class; they are refused.
  void read_minimax_m2() {
    ModelSpec& s = h_.spec;
    const char* path = cfg_.path().c_str();
    s.arch = Arch::kMinimaxM2;
    s.n_expert = cfg_.get_dim("num_local_experts");
    s.n_expert_used = cfg_.get_dim("num_experts_per_tok");
    s.n_ff_exp = cfg_.get_dim("intermediate_size");
    s.gating = Gating::kSigmoid;
    s.norm_topk = true;
    const std::string scoring = cfg_.get_string_or("scoring_func", "sigmoid");
    if (scoring != "sigmoid")
      TROUPE_INPUT_ERROR("%s: scoring_func '%s' is not supported for MiniMax-M2 (sigmoid)", path,
                         scoring.c_str());
    h_.router_bias = cfg_.get_bool_or("use_routing_bias", true);
    if (cfg_.get_int_or("shared_intermediate_size", 0) != 0)
      TROUPE_INPUT_ERROR(
          "%s: shared_intermediate_size > 0 (a shared expert) is not supported "
          "for MiniMax-M2",
          path);
    if (const json* types = cfg_.find("attn_type_list")) {
      if (!types->is_array()) TROUPE_INPUT_ERROR("%s: 'attn_type_list' must be a list", path);
      for (const json& t : *types)
        if (!t.is_number_integer() || t.get<int64_t>() != 1)
          TROUPE_INPUT_ERROR(
              "%s: attn_type_list holds %s: only full attention (1) is supported, not "
              "lightning attention",
              path, t.dump().c_str());
    }
    if (cfg_.get_bool_or("postnorm", false))
      TROUPE_INPUT_ERROR("%s: postnorm is not supported", path);
    if (cfg_.get_bool_or("use_grouped_topk", false))
      TROUPE_INPUT_ERROR("%s: use_grouped_topk is not supported for MiniMax-M2", path);
    if (cfg_.get_float_or("routed_scaling_factor", 1.0) != 1.0)
      TROUPE_INPUT_ERROR("%s: routed_scaling_factor other than 1 is not supported for MiniMax-M2",
                         path);
  }

  /// Ling-2.0: DeepSeek-V3's routing under other keys; the group limit always applies.
  void read_bailing_moe_v2() {
    ModelSpec& s = h_.spec;
    const char* path = cfg_.path().c_str();
    s.arch = Arch::kBailingMoe2;
    s.n_expert = cfg_.get_int_or("num_experts", 0);
    s.n_expert_used = cfg_.get_int_or("num_experts_per_tok", 0);
    s.n_ff_exp = cfg_.get_int_or("moe_intermediate_size", 0);
    s.n_expert_shared = cfg_.get_int_or("num_shared_experts", 0);
    s.n_ff_shexp = s.n_ff_exp * s.n_expert_shared;
    s.n_leading_dense = std::min(cfg_.get_int_or("first_k_dense_replace", 0), s.n_layer);
    s.routed_scale = static_cast<float>(cfg_.get_float_or("routed_scaling_factor", 1.0));
    s.norm_topk = cfg_.get_bool_or("norm_topk_prob", true) && s.n_expert_used > 1;
    const std::string scoring = cfg_.get_string_or("score_function", "sigmoid");
    if (scoring != "sigmoid")
      TROUPE_INPUT_ERROR("%s: score_function '%s' is not supported (sigmoid)", path,
                         scoring.c_str());
    s.gating = Gating::kSigmoid;
    s.n_group = std::max<int64_t>(1, cfg_.get_int_or("n_group", 1));
    s.n_group_used = std::max<int64_t>(1, cfg_.get_int_or("topk_group", s.n_group));
    h_.router_bias = cfg_.get_bool_or("moe_router_enable_expert_bias", true);
  }

  /// ERNIE 4.5. Ernie4_5ForCausalLM is Llama's dense decoder. Ernie4_5_MoeForCausalLM routes by
  /// a softmax over moe_num_experts (moe_gate_act), picks the moe_k best by probability plus
  /// moe_statics.e_score_correction_bias and weights them by their probabilities renormalized;
  /// moe_num_shared_experts shared experts are one MLP that many times moe_intermediate_size
  /// wide, added ungated. Which layers: mark_moe_layers. Defaults: Ernie4_5_MoeConfig's (the
  /// 21B-A3B's).
  void read_ernie45() {
    ModelSpec& s = h_.spec;
    const char* path = cfg_.path().c_str();
    s.arch = Arch::kLlama;
    s.n_ff_exp = s.n_ff;
    s.norm_topk = true;
    if (!ernie_moe_) return;
    s.n_expert = cfg_.get_int_or("moe_num_experts", 64);
    s.n_expert_used = cfg_.get_int_or("moe_k", 6);
    s.n_ff_exp = cfg_.get_int_or("moe_intermediate_size", 1536);
    s.n_expert_shared = cfg_.get_int_or("moe_num_shared_experts", 2);
    s.gating = Gating::kSoftmax;  // the selection bias: read when the checkpoint has one
    if (s.n_expert <= 0 || s.n_expert > 65536 || s.n_expert_used <= 0 ||
        s.n_expert_used > s.n_expert)
      TROUPE_INPUT_ERROR("%s: moe_k %lld must be in 1..moe_num_experts (%lld)", path,
                         static_cast<long long>(s.n_expert_used),
                         static_cast<long long>(s.n_expert));
    if (s.n_expert_shared < 0 || s.n_expert_shared > 64)
      TROUPE_INPUT_ERROR("%s: moe_num_shared_experts %lld must be in 0..64", path,
                         static_cast<long long>(s.n_expert_shared));
    s.n_ff_shexp = s.n_ff_exp * s.n_expert_shared;
    const std::string act = cfg_.get_string_or("moe_gate_act", "softmax");
    if (act != "softmax")
      TROUPE_INPUT_ERROR("%s: moe_gate_act '%s' is not supported (softmax)", path, act.c_str());
  }

  /// gpt-oss: every layer routes (softmax over the chosen experts' biased logits) to experts of
  /// intermediate_size with the clamped SwiGLU; layer_types says which layers attend through
  /// the sliding window (HF's default: the even ones, as llama.cpp's GGUF).
  void read_gpt_oss() {
    ModelSpec& s = h_.spec;
    const char* path = cfg_.path().c_str();
    s.arch = Arch::kGptOss;
    s.n_expert = cfg_.get_dim("num_local_experts");
    s.n_expert_used = cfg_.has("num_experts_per_tok") ? cfg_.get_dim("num_experts_per_tok")
                                                      : cfg_.get_dim("experts_per_token");
    s.n_ff_exp = cfg_.get_dim("intermediate_size");
    s.gating = Gating::kSoftmaxTopk;
    s.norm_topk = false;
    s.ffn_act = FfnAct::kSwigluOai;
    const double limit = cfg_.get_float_or("swiglu_limit", 7.0);
    if (!(limit > 0 && limit < 1e30))
      TROUPE_INPUT_ERROR("%s: swiglu_limit %g must be positive and finite", path, limit);
    s.act_limit = static_cast<float>(limit);
    const int64_t window = cfg_.get_int_or("sliding_window", 128);
    h_.window.assign(static_cast<size_t>(s.n_layer), 0);
    const std::vector<bool> layers =
        read_layer_types(s.n_layer, [](int64_t il) { return il % 2 == 0; });
    for (int64_t il = 0; il < s.n_layer; ++il) {
      const bool sliding = layers[static_cast<size_t>(il)];
      if (sliding && window <= 0)
        TROUPE_INPUT_ERROR("%s: sliding_window must be positive, got %lld", path,
                           static_cast<long long>(window));
      if (sliding) h_.window[static_cast<size_t>(il)] = window;
    }
  }

  /// Gemma 3's text decoder: embeddings times sqrt(hidden_size), GELU FFN, queries scaled by
  /// query_pre_attn_scalar^-1/2, sliding-window layers (layer_types, or every layer but each
  /// sliding_window_pattern-th) rotating with rope_local_base_freq unscaled, an optional final
  /// logit soft cap. Attention-logit soft-capping (Gemma 2's) is refused.
  void read_gemma3() {
    ModelSpec& s = h_.spec;
    const char* path = cfg_.path().c_str();
    s.arch = Arch::kGemma3;
    s.ffn_act = FfnAct::kGeluTanh;
    s.embd_scale = std::sqrt(static_cast<float>(s.n_embd));
    s.rope_theta_local = static_cast<float>(cfg_.get_float_or("rope_local_base_freq", 10000.0));
    const double qpas =
        cfg_.get_float_or("query_pre_attn_scalar", static_cast<double>(s.head_dim_k));
    if (!(qpas > 0 && std::isfinite(qpas)))
      TROUPE_INPUT_ERROR("%s: query_pre_attn_scalar %g must be positive", path, qpas);
    s.kq_scale_mult = std::sqrt(static_cast<double>(s.head_dim_k) / qpas);
    const json* cap = cfg_.find("attn_logit_softcapping");
    if (cap != nullptr && !cap->is_null())
      TROUPE_INPUT_ERROR("%s: attn_logit_softcapping is not supported (Gemma 2's)", path);
    const json* fcap = cfg_.find("final_logit_softcapping");
    if (fcap != nullptr && !fcap->is_null()) {
      if (!fcap->is_number() || !(fcap->get<double>() > 0))
        TROUPE_INPUT_ERROR("%s: final_logit_softcapping must be null or positive, got %s", path,
                           fcap->dump().c_str());
      s.final_logit_softcap = fcap->get<float>();
    }
    const int64_t window = cfg_.get_int_or("sliding_window", 4096);
    const int64_t pattern = cfg_.get_int_or("sliding_window_pattern", 6);
    if (pattern < 1) TROUPE_INPUT_ERROR("%s: sliding_window_pattern must be positive", path);
    h_.window.assign(static_cast<size_t>(s.n_layer), 0);
    const std::vector<bool> sliding =
        read_layer_types(s.n_layer, [&](int64_t il) { return (il + 1) % pattern != 0; });
    for (int64_t il = 0; il < s.n_layer; ++il) {
      if (!sliding[static_cast<size_t>(il)]) continue;
      if (window <= 0)
        TROUPE_INPUT_ERROR("%s: sliding_window must be positive, got %lld", path,
                           static_cast<long long>(window));
      h_.window[static_cast<size_t>(il)] = window;
    }
  }

  /// Llama 4: a sigmoid top-k router whose weight scales the expert's input, one shared expert
  /// as wide as a routed one, MoE layers moe_layers (or every interleave_moe_layer_step-th);
  /// no_rope_layers (or every fourth) rotate, attend within chunks of attention_chunk_size
  /// (layer_types, when given, says which layers do) and, when use_qk_norm, norm q and k without
  /// weights; the others' queries take the attention temperature.
  void read_llama4() {
    ModelSpec& s = h_.spec;
    const char* path = cfg_.path().c_str();
    const auto L = static_cast<size_t>(s.n_layer);
    s.arch = Arch::kLlama4;
    s.n_expert = cfg_.get_dim("num_local_experts");
    s.n_expert_used = cfg_.get_int_or("num_experts_per_tok", 1);
    s.n_ff_exp = s.n_ff_shexp = cfg_.get_dim("intermediate_size");
    s.n_expert_shared = 1;
    s.gating = Gating::kSigmoid;
    s.norm_topk = false;
    s.moe_weight_input = true;
    // Meta's released configs give attn_temperature_tuning as a number (4): transformers takes
    // its truth.
    const json* tuning = cfg_.find("attn_temperature_tuning");
    const bool tune = tuning != nullptr && tuning->is_number()
                          ? tuning->get<double>() != 0
                          : cfg_.get_bool_or("attn_temperature_tuning", true);
    if (tune) {
      s.attn_temp_scale = static_cast<float>(cfg_.get_float_or("attn_scale", 0.1));
      s.attn_temp_floor = cfg_.get_int_or("floor_scale", 8192);
      if (s.attn_temp_floor <= 0 || !std::isfinite(s.attn_temp_scale))
        TROUPE_INPUT_ERROR("%s: floor_scale %lld must be positive and attn_scale finite", path,
                           static_cast<long long>(s.attn_temp_floor));
    }
    h_.qk_l2_norm = cfg_.get_bool_or("use_qk_norm", true);
    const int64_t chunk = cfg_.get_int_or("attention_chunk_size", 8192);
    if (chunk <= 0)
      TROUPE_INPUT_ERROR("%s: attention_chunk_size must be positive, got %lld", path,
                         static_cast<long long>(chunk));
    const int64_t interval = cfg_.get_int_or("no_rope_layer_interval", 4);
    if (interval <= 0) TROUPE_INPUT_ERROR("%s: no_rope_layer_interval must be positive", path);
    h_.nope.assign(L, false);
    h_.chunk.assign(L, 0);
    const json* rope_layers = cfg_.find("no_rope_layers");
    if (rope_layers != nullptr && (!rope_layers->is_array() || rope_layers->size() != L))
      TROUPE_INPUT_ERROR("%s: 'no_rope_layers' must be a list of %lld entries", path,
                         static_cast<long long>(s.n_layer));
    const json* types = cfg_.find("layer_types");
    if (types != nullptr && (!types->is_array() || types->size() != L))
      TROUPE_INPUT_ERROR("%s: 'layer_types' must be a list of %lld entries", path,
                         static_cast<long long>(s.n_layer));
    for (size_t il = 0; il < L; ++il) {
      bool rope = (il + 1) % static_cast<size_t>(interval) != 0;
      if (rope_layers != nullptr) {  // 1: this layer rotates
        const json& v = (*rope_layers)[il];
        if (!v.is_number_integer() || (v.get<int64_t>() != 0 && v.get<int64_t>() != 1))
          TROUPE_INPUT_ERROR("%s: no_rope_layers[%zu] must be 0 or 1, got %s", path, il,
                             v.dump().c_str());
        rope = v.get<int64_t>() == 1;
      }
      bool chunked = rope;
      if (types != nullptr) {
        const json& t = (*types)[il];
        if (t != "chunked_attention" && t != "full_attention")
          TROUPE_INPUT_ERROR(
              "%s: layer_types[%zu] is %s; troupe reads \"chunked_attention\" and "
              "\"full_attention\" for Llama 4",
              path, il, t.dump().c_str());
        chunked = t == "chunked_attention";
      }
      h_.nope[il] = !rope;
      h_.chunk[il] = chunked ? chunk : 0;
    }
  }

  /// Qwen3-Next: softmax top-k experts (renormalized when norm_topk_prob) beside a shared
  /// expert with a sigmoid gate; Gated DeltaNet sizes (linear_num_key_heads of
  /// linear_key_head_dim, linear_num_value_heads of linear_value_head_dim, a convolution of
  /// linear_conv_kernel_dim); layer_types "linear_attention" / "full_attention", by default full
  /// attention every full_attention_interval-th layer.
  void read_qwen3next() {
    ModelSpec& s = h_.spec;
    const char* path = cfg_.path().c_str();
    s.n_expert = cfg_.get_int_or("num_experts", 0);
    s.arch = !h_.qwen35 ? Arch::kQwen3Next : s.n_expert > 0 ? Arch::kQwen35Moe : Arch::kQwen35;
    if (h_.qwen35) check_mrope_sections();
    s.n_expert_used = cfg_.get_int_or("num_experts_per_tok", 0);
    s.n_ff_exp = cfg_.get_int_or("moe_intermediate_size", 0);
    s.norm_topk = cfg_.get_bool_or("norm_topk_prob", true);
    s.n_ff_shexp = cfg_.get_int_or("shared_expert_intermediate_size", 0);
    s.n_expert_shared = s.n_ff_shexp > 0 ? 1 : 0;
    s.ssm_k_heads = cfg_.get_int_or("linear_num_key_heads", 16);
    s.ssm_v_heads = cfg_.get_int_or("linear_num_value_heads", 32);
    s.ssm_k_dim = cfg_.get_int_or("linear_key_head_dim", 128);
    s.ssm_v_dim = cfg_.get_int_or("linear_value_head_dim", 128);
    s.ssm_conv_kernel = cfg_.get_int_or("linear_conv_kernel_dim", 4);
    constexpr int64_t kMax = 65536;
    if (s.ssm_k_heads <= 0 || s.ssm_v_heads <= 0 || s.ssm_k_dim <= 0 || s.ssm_v_dim <= 0 ||
        s.ssm_k_heads > kMax || s.ssm_v_heads > kMax || s.ssm_k_dim > kMax || s.ssm_v_dim > kMax ||
        s.ssm_conv_kernel < 1 || s.ssm_conv_kernel > 64 || s.ssm_v_heads % s.ssm_k_heads != 0)
      TROUPE_INPUT_ERROR(
          "%s: bad linear attention (linear_num_key_heads %lld of linear_key_head_dim %lld, "
          "linear_num_value_heads %lld of linear_value_head_dim %lld, linear_conv_kernel_dim "
          "%lld): value heads must be a multiple of key heads, the kernel 1..64",
          path, static_cast<long long>(s.ssm_k_heads), static_cast<long long>(s.ssm_k_dim),
          static_cast<long long>(s.ssm_v_heads), static_cast<long long>(s.ssm_v_dim),
          static_cast<long long>(s.ssm_conv_kernel));
    const int64_t every = cfg_.get_int_or("full_attention_interval", 4);
    if (every <= 0) TROUPE_INPUT_ERROR("%s: full_attention_interval must be positive", path);
    h_.recurrent = read_layer_types(
        s.n_layer, [&](int64_t il) { return (il + 1) % every != 0; }, "linear_attention");
  }

  /// Qwen3.5's multimodal rope (interleaved sections of the rotated pairs for time, height and
  /// width): a text position's three coordinates are equal, so it is NeoX rope on the rotated
  /// part, if the sections cover exactly its n_rot / 2 pairs.
  void check_mrope_sections() {
    const ModelSpec& s = h_.spec;
    const auto it = rope_params_.find("mrope_section");
    if (it == rope_params_.end()) return;  // the config class's default [11, 11, 10]
    int64_t pairs = 0;
    bool ok = it->is_array() && it->size() <= 4;
    for (const json& x : ok ? *it : json::array()) {
      ok = ok && x.is_number_integer() && x.get<int64_t>() >= 0;
      if (ok) pairs += x.get<int64_t>();
    }
    if (!ok || pairs != s.n_rot / 2)
      TROUPE_INPUT_ERROR(
          "%s: rope_parameters.mrope_section %s must be up to 4 counts summing to the %lld rotated "
          "pairs of a head (head_dim %lld x partial_rotary_factor)",
          cfg_.path().c_str(), it->dump().c_str(), static_cast<long long>(s.n_rot / 2),
          static_cast<long long>(s.head_dim_k));
  }

  /// Per layer: whether layer_types (when present) says `kind` ("full_attention" the other
  /// choice), else `pattern_default`'s answer.
  template <class Fn>
  std::vector<bool> read_layer_types(int64_t n_layer, const Fn& pattern_default,
                                     const char* kind = "sliding_attention") {
    const char* path = cfg_.path().c_str();
    const json* types = cfg_.find("layer_types");
    if (types != nullptr && (!types->is_array() || types->size() != static_cast<size_t>(n_layer)))
      TROUPE_INPUT_ERROR("%s: 'layer_types' must be a list of %lld entries", path,
                         static_cast<long long>(n_layer));
    std::vector<bool> out(static_cast<size_t>(n_layer));
    for (int64_t il = 0; il < n_layer; ++il) {
      bool of_kind = pattern_default(il);
      if (types != nullptr) {
        const json& t = (*types)[static_cast<size_t>(il)];
        if (t != kind && t != "full_attention")
          TROUPE_INPUT_ERROR(
              "%s: layer_types[%lld] is %s; troupe reads \"%s\" and "
              "\"full_attention\"",
              path, static_cast<long long>(il), t.dump().c_str(), kind);
        of_kind = t == kind;
      }
      out[static_cast<size_t>(il)] = of_kind;
    }
    return out;
  }

  /// Which layers are MoE: Qwen decoder_sparse_step / mlp_only_layers; DeepSeek
  /// first_k_dense_replace / moe_layer_freq; GLM first_k_dense_replace; Llama 4 moe_layers /
  /// interleave_moe_layer_step; Mixtral all.
  void mark_moe_layers() {
    ModelSpec& s = h_.spec;
    std::vector<bool>& is_moe = h_.is_moe;
    is_moe.assign(static_cast<size_t>(s.n_layer), s.n_expert > 0);
    const HfFamily f = h_.family;
    if (s.n_expert > 0 &&
        (f == HfFamily::kQwen2Moe || f == HfFamily::kQwen3Moe || f == HfFamily::kQwen3Next)) {
      const int64_t step = std::max<int64_t>(1, cfg_.get_int_or("decoder_sparse_step", 1));
      std::vector<int64_t> mlp_only;
      if (const json* m = cfg_.find("mlp_only_layers")) {
        if (!m->is_array())
          TROUPE_INPUT_ERROR("%s: 'mlp_only_layers' must be a list", cfg_.path().c_str());
        for (const json& x : *m)
          if (x.is_number_integer()) mlp_only.push_back(x.get<int64_t>());
      }
      for (int64_t il = 0; il < s.n_layer; ++il)
        is_moe[static_cast<size_t>(il)] =
            (il + 1) % step == 0 &&
            std::find(mlp_only.begin(), mlp_only.end(), il) == mlp_only.end();
    } else if (f == HfFamily::kLlama4) {
      mark_llama4_moe_layers();
    } else if (f == HfFamily::kErnie45 && s.n_expert > 0) {
      mark_ernie45_moe_layers();
    } else if (s.n_expert > 0 &&
               (mla() || f == HfFamily::kGlm4Moe || f == HfFamily::kBailingMoeV2)) {
      const int64_t freq = mla() ? std::max<int64_t>(1, cfg_.get_int_or("moe_layer_freq", 1)) : 1;
      for (int64_t il = 0; il < s.n_layer; ++il)
        is_moe[static_cast<size_t>(il)] = il >= s.n_leading_dense && il % freq == 0;
      if (const json* types = glm_dsa_ ? cfg_.find("mlp_layer_types") : nullptr) {
        // GLM-5's per-layer list ("dense" or "sparse") says it outright.
        if (!types->is_array() || types->size() != static_cast<size_t>(s.n_layer))
          TROUPE_INPUT_ERROR("%s: 'mlp_layer_types' must be a list of %lld entries",
                             cfg_.path().c_str(), static_cast<long long>(s.n_layer));
        for (int64_t il = 0; il < s.n_layer; ++il) {
          const json& t = (*types)[static_cast<size_t>(il)];
          if (t != "dense" && t != "sparse")
            TROUPE_INPUT_ERROR("%s: mlp_layer_types[%lld] is %s (\"dense\" or \"sparse\")",
                               cfg_.path().c_str(), static_cast<long long>(il), t.dump().c_str());
          is_moe[static_cast<size_t>(il)] = t == "sparse";
        }
      }
    }
    // Leading dense layers (0 when dense, as GGUF) where the config does not name them; Llama
    // 4's dense layers are interleaved, none leading (as its GGUF).
    if (!mla() && f != HfFamily::kGlm4Moe && f != HfFamily::kBailingMoeV2 &&
        f != HfFamily::kLlama4) {
      s.n_leading_dense = 0;
      while (s.n_expert > 0 && s.n_leading_dense < s.n_layer &&
             !is_moe[static_cast<size_t>(s.n_leading_dense)])
        ++s.n_leading_dense;
    }
  }

  /// ERNIE 4.5 MoE: layer l has experts when moe_layer_start_index <= l <= moe_layer_end_index
  /// (-1: the last layer) and (l + 1) % moe_layer_interval == 0.
  void mark_ernie45_moe_layers() {
    const char* path = cfg_.path().c_str();
    const int64_t n = h_.spec.n_layer;
    const int64_t start = cfg_.get_int_or("moe_layer_start_index", 1);
    const json* e = cfg_.find("moe_layer_end_index");
    const int64_t end =
        e == nullptr || (e->is_number_integer() && e->get<int64_t>() == -1)  // the last layer
            ? n - 1
            : cfg_.get_int("moe_layer_end_index");
    const int64_t step = cfg_.get_int_or("moe_layer_interval", 1);
    if (step <= 0 || step > n)
      TROUPE_INPUT_ERROR("%s: moe_layer_interval %lld must be in 1..%lld", path,
                         static_cast<long long>(step), static_cast<long long>(n));
    for (int64_t il = 0; il < n; ++il)
      h_.is_moe[static_cast<size_t>(il)] = il >= start && il <= end && (il + 1) % step == 0;
  }

  void mark_llama4_moe_layers() {
    const char* path = cfg_.path().c_str();
    const int64_t n = h_.spec.n_layer;
    const int64_t step = cfg_.get_int_or("interleave_moe_layer_step", 1);
    if (step <= 0 || step > n)
      TROUPE_INPUT_ERROR("%s: interleave_moe_layer_step %lld must be in 1..%lld", path,
                         static_cast<long long>(step), static_cast<long long>(n));
    std::vector<bool>& is_moe = h_.is_moe;
    for (int64_t il = 0; il < n; ++il) is_moe[static_cast<size_t>(il)] = (il + 1) % step == 0;
    const json* m = cfg_.find("moe_layers");
    if (m == nullptr || m->is_null()) return;
    if (!m->is_array()) TROUPE_INPUT_ERROR("%s: 'moe_layers' must be a list", path);
    is_moe.assign(static_cast<size_t>(n), false);
    for (const json& x : *m) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= n)
        TROUPE_INPUT_ERROR("%s: moe_layers entry %s is not a layer index below %lld", path,
                           x.dump().c_str(), static_cast<long long>(n));
      is_moe[static_cast<size_t>(x.get<int64_t>())] = true;
    }
  }

  // rope_theta from the classic key or transformers' newer rope_parameters; the scaling
  // parameters are kept for apply_hf_rope_scaling(), which needs the rotary width.
  double read_rope(double def_theta) {
    double theta = cfg_.get_float_or("rope_theta", def_theta);
    const json* params = cfg_.find("rope_parameters");
    const json* scaling = cfg_.find("rope_scaling");
    for (const json* p : {scaling, params}) {
      if (!p) continue;
      if (!p->is_object())
        TROUPE_INPUT_ERROR("%s: rope_scaling/rope_parameters must be an object",
                           cfg_.path().c_str());
      for (const auto& [k, v] : p->items()) rope_params_[k] = v;
      auto th = p->find("rope_theta");
      if (th != p->end() && th->is_number()) theta = th->get<double>();
    }
    return theta;
  }

  /// DeepSeek-V4, with DeepseekV4Config's defaults (V4-Flash's): every layer MoE (the first
  /// num_hash_layers, or mlp_layer_types' "hash_moe", choosing experts by token id), one shared
  /// key-and-value head of head_dim, a sliding window in every layer and, by layer_types (or the
  /// older compress_ratios), compressed entries: "compressed_sparse_attention" every
  /// compress_rates' rate (4) positions, overlapping the window before, chosen by the indexer;
  /// "heavily_compressed_attention" every 128, all attended. Rotary: the last qk_rope_head_dim
  /// values of a head in neighbouring pairs, rope_theta in sliding-only layers, compress_rope_theta
  /// with the YaRN of rope_scaling (no magnitude factor) in compressing ones: the engine's
  /// local rope and its model rope. The MTP block (num_nextn_predict_layers) is not read.
  void read_deepseek_v4() {
    ModelSpec& s = h_.spec;
    const char* path = cfg_.path().c_str();
    const auto L = static_cast<size_t>(s.n_layer);
    s.arch = Arch::kDeepseek4;
    s.rope_style = RopeStyle::kNormal;
    const int64_t D = cfg_.has("head_dim") ? cfg_.get_dim("head_dim") : 512;
    s.head_dim_k = s.head_dim_v = D;
    if (s.n_head_kv != 1 && cfg_.has("num_key_value_heads"))
      TROUPE_INPUT_ERROR(
          "%s: num_key_value_heads %lld: DeepSeek-V4 has one shared key-and-value "
          "head",
          path, static_cast<long long>(s.n_head_kv));
    s.n_head_kv = 1;
    if (cfg_.has("qk_rope_head_dim")) {
      s.n_rot = cfg_.get_dim("qk_rope_head_dim");
    } else {
      const double partial = cfg_.get_float_or("partial_rotary_factor", 64.0 / 512.0);
      s.n_rot = static_cast<int64_t>(static_cast<double>(D) * partial);
    }
    if (s.n_rot <= 0 || s.n_rot % 2 != 0 || s.n_rot > D)
      TROUPE_INPUT_ERROR("%s: qk_rope_head_dim %lld must be even and in 2..head_dim (%lld)", path,
                         static_cast<long long>(s.n_rot), static_cast<long long>(D));
    s.q_lora_rank = cfg_.get_int_or("q_lora_rank", 1024);
    s.o_groups = cfg_.get_int_or("o_groups", 8);
    s.o_lora_rank = cfg_.get_int_or("o_lora_rank", 1024);
    if (s.q_lora_rank <= 0 || s.o_lora_rank <= 0 || s.o_groups <= 0 ||
        (s.n_head * D) % s.o_groups != 0)
      TROUPE_INPUT_ERROR(
          "%s: q_lora_rank %lld and o_lora_rank %lld must be positive and o_groups "
          "%lld must divide num_attention_heads x head_dim (%lld)",
          path, static_cast<long long>(s.q_lora_rank), static_cast<long long>(s.o_lora_rank),
          static_cast<long long>(s.o_groups), static_cast<long long>(s.n_head * D));
    if (cfg_.get_bool_or("attention_bias", false))
      TROUPE_INPUT_ERROR("%s: attention_bias is not supported for DeepSeek-V4", path);
    // Hyper-connections.
    s.hc_mult = cfg_.get_int_or("hc_mult", 4);
    s.hc_sinkhorn_iters = cfg_.get_int_or("hc_sinkhorn_iters", 20);
    s.hc_eps = static_cast<float>(cfg_.get_float_or("hc_eps", 1e-6));
    if (s.hc_mult < 1 || s.hc_mult > 64 || s.hc_sinkhorn_iters < 1 || s.hc_sinkhorn_iters > 1000 ||
        !(s.hc_eps >= 0))
      TROUPE_INPUT_ERROR(
          "%s: hc_mult %lld must be in 1..64, hc_sinkhorn_iters %lld in 1..1000 and "
          "hc_eps non-negative",
          path, static_cast<long long>(s.hc_mult), static_cast<long long>(s.hc_sinkhorn_iters));
    // Attention kinds.
    int64_t csa = 4, hca = 128;
    if (const json* rates = cfg_.find("compress_rates")) {
      if (!rates->is_object()) TROUPE_INPUT_ERROR("%s: 'compress_rates' must be an object", path);
      auto rate = [&](const char* key, int64_t def) {
        auto it = rates->find(key);
        return it != rates->end() && it->is_number_integer() ? it->get<int64_t>() : def;
      };
      csa = rate("compressed_sparse_attention", csa);
      hca = rate("heavily_compressed_attention", hca);
    }
    csa = cfg_.get_int_or("compress_rate_csa", csa);
    hca = cfg_.get_int_or("compress_rate_hca", hca);
    if (csa < 1 || csa > 65536 || hca < 1 || hca > 65536)
      TROUPE_INPUT_ERROR("%s: compression rates %lld and %lld must be in 1..65536", path,
                         static_cast<long long>(csa), static_cast<long long>(hca));
    std::vector<std::string> types(L);
    if (const json* lt = cfg_.find("layer_types")) {
      if (!lt->is_array() || lt->size() < L)
        TROUPE_INPUT_ERROR("%s: 'layer_types' must be a list of %lld entries", path,
                           static_cast<long long>(s.n_layer));
      for (size_t il = 0; il < L; ++il)
        types[il] = (*lt)[il].is_string() ? (*lt)[il].get<std::string>() : (*lt)[il].dump();
    } else if (const json* cr = cfg_.find("compress_ratios")) {
      if (!cr->is_array() || cr->size() < L)
        TROUPE_INPUT_ERROR("%s: 'compress_ratios' must be a list of %lld entries", path,
                           static_cast<long long>(s.n_layer));
      for (size_t il = 0; il < L; ++il) {
        const json& r = (*cr)[il];
        const int64_t v = r.is_number_integer() ? r.get<int64_t>() : -1;
        if (v != 0 && v != 4 && v != 128)
          TROUPE_INPUT_ERROR("%s: compress_ratios[%zu] is %s (0, 4 or 128)", path, il,
                             r.dump().c_str());
        types[il] = v == 0   ? "sliding_attention"
                    : v == 4 ? "compressed_sparse_attention"
                             : "heavily_compressed_attention";
      }
    } else {  // DeepseekV4Config's: two heavily compressed layers, then CSA and HCA in turn
      for (size_t il = 0; il < L; ++il)
        types[il] = il >= 2 && (il - 2) % 2 == 1 ? "compressed_sparse_attention"
                                                 : "heavily_compressed_attention";
    }
    const int64_t window = cfg_.get_int_or("sliding_window", 128);
    if (window < 1)
      TROUPE_INPUT_ERROR("%s: sliding_window must be positive, got %lld", path,
                         static_cast<long long>(window));
    h_.window.assign(L, window);
    h_.compress.assign(L, 0);
    h_.compress_overlap.assign(L, false);
    for (size_t il = 0; il < L; ++il) {
      if (types[il] == "compressed_sparse_attention") {
        h_.compress[il] = csa;
        h_.compress_overlap[il] = true;
      } else if (types[il] == "heavily_compressed_attention") {
        h_.compress[il] = hca;
      } else if (types[il] != "sliding_attention") {
        TROUPE_INPUT_ERROR(
            "%s: layer_types[%zu] is '%s' (sliding_attention, "
            "compressed_sparse_attention or heavily_compressed_attention)",
            path, il, types[il].c_str());
      }
    }
    s.idx_n_head = cfg_.get_int_or("index_n_heads", 64);
    s.idx_head_dim = cfg_.get_int_or("index_head_dim", 128);
    s.idx_top_k = cfg_.get_int_or("index_topk", 512);
    if (s.idx_n_head < 1 || s.idx_head_dim < s.n_rot || s.idx_top_k < 1)
      TROUPE_INPUT_ERROR(
          "%s: index_n_heads %lld and index_topk %lld must be positive and "
          "index_head_dim %lld at least qk_rope_head_dim",
          path, static_cast<long long>(s.idx_n_head), static_cast<long long>(s.idx_top_k),
          static_cast<long long>(s.idx_head_dim));
    // Rotary: rope_parameters' "main" and "compress" (as transformers saves them), else
    // rope_theta, compress_rope_theta and rope_scaling.
    json compress = json::object();
    double main_theta = s.rope_theta;
    if (rope_params_.contains("compress") && rope_params_["compress"].is_object()) {
      compress = rope_params_["compress"];
      if (rope_params_.contains("main") && rope_params_["main"].is_object() &&
          rope_params_["main"].contains("rope_theta"))
        main_theta = rope_params_["main"]["rope_theta"].get<double>();
    } else {
      for (const auto& [k, v] : rope_params_.items())
        if (k != "main" && k != "rope_theta") compress[k] = v;
    }
    const double ctheta = compress.contains("rope_theta") && compress["rope_theta"].is_number()
                              ? compress["rope_theta"].get<double>()
                              : cfg_.get_float_or("compress_rope_theta", 160000.0);
    if (!(main_theta > 0) || !(ctheta > 0))
      TROUPE_INPUT_ERROR("%s: rope_theta and compress_rope_theta must be positive", path);
    s.rope_theta_local = static_cast<float>(main_theta);
    s.rope_theta = static_cast<float>(ctheta);
    v4_attention_factor_ =
        compress.contains("attention_factor") && compress["attention_factor"].is_number()
            ? compress["attention_factor"].get<double>()
            : 1.0;
    rope_params_ = compress;
    // Experts.
    s.n_expert = cfg_.get_int_or("n_routed_experts", 256);
    s.n_expert_used = cfg_.get_int_or("num_experts_per_tok", 6);
    s.n_ff_exp = cfg_.get_int_or("moe_intermediate_size", 2048);
    s.n_expert_shared = cfg_.get_int_or("n_shared_experts", 1);
    if (s.n_expert < 1 || s.n_expert > 65536 || s.n_expert_used < 1 ||
        s.n_expert_used > s.n_expert || s.n_expert_shared < 0 || s.n_expert_shared > 64)
      TROUPE_INPUT_ERROR(
          "%s: num_experts_per_tok %lld must be in 1..n_routed_experts (%lld) and "
          "n_shared_experts in 0..64",
          path, static_cast<long long>(s.n_expert_used), static_cast<long long>(s.n_expert));
    s.n_ff_shexp = s.n_ff_exp * s.n_expert_shared;
    s.routed_scale = static_cast<float>(cfg_.get_float_or("routed_scaling_factor", 1.5));
    s.norm_topk = true;  // DeepseekV4's routers always renormalize the chosen weights
    const std::string scoring = cfg_.get_string_or("scoring_func", "sqrtsoftplus");
    if (scoring == "sqrtsoftplus") {
      s.gating = Gating::kSqrtSoftplus;
    } else if (scoring == "sigmoid") {
      s.gating = Gating::kSigmoid;
    } else {
      TROUPE_INPUT_ERROR(
          "%s: scoring_func '%s' is not supported for DeepSeek-V4 (sqrtsoftplus, "
          "sigmoid)",
          path, scoring.c_str());
    }
    const double limit = cfg_.get_float_or("swiglu_limit", 10.0);
    if (!(limit > 0 && limit < 1e30))
      TROUPE_INPUT_ERROR("%s: swiglu_limit %g must be positive and finite", path, limit);
    s.ffn_act = FfnAct::kSiluClamp;
    s.act_limit = static_cast<float>(limit);
    h_.hash_moe.assign(L, false);
    if (const json* mt = cfg_.find("mlp_layer_types")) {
      if (!mt->is_array() || mt->size() < L)
        TROUPE_INPUT_ERROR("%s: 'mlp_layer_types' must be a list of %lld entries", path,
                           static_cast<long long>(s.n_layer));
      for (size_t il = 0; il < L; ++il) {
        const json& t = (*mt)[il];
        if (t != "hash_moe" && t != "moe")
          TROUPE_INPUT_ERROR("%s: mlp_layer_types[%zu] is %s (\"hash_moe\" or \"moe\")", path, il,
                             t.dump().c_str());
        h_.hash_moe[il] = t == "hash_moe";
      }
    } else {
      const int64_t n_hash = cfg_.get_int_or("num_hash_layers", 3);
      for (size_t il = 0; il < L; ++il) h_.hash_moe[il] = static_cast<int64_t>(il) < n_hash;
    }
  }

  void read_mla(bool sparse) {
    ModelSpec& s = h_.spec;
    s.arch = Arch::kDeepseek2;
    s.q_lora_rank = cfg_.get_int_or("q_lora_rank", 0);
    s.kv_lora_rank = cfg_.get_dim("kv_lora_rank");
    s.qk_nope_dim = cfg_.get_dim("qk_nope_head_dim");
    s.qk_rope_dim = cfg_.get_dim("qk_rope_head_dim");
    s.v_head_dim = cfg_.get_dim("v_head_dim");
    s.head_dim_k = s.qk_nope_dim + s.qk_rope_dim;
    s.head_dim_v = s.v_head_dim;
    s.n_rot = s.qk_rope_dim;
    s.n_head_kv = 1;  // the latent is shared by all heads (as llama.cpp's "MLA as MQA" GGUF)
    // DeepSeek checkpoints store the rope rows of q_b_proj / kv_a_proj_with_mqa as interleaved
    // pairs; modeling_deepseek (and transformers with rope_interleave, the default) de-interleave
    // them before rotate_half, which is pair rotation on the stored order: GGUF's kNormal.
    s.rope_style =
        cfg_.get_bool_or("rope_interleave", true) ? RopeStyle::kNormal : RopeStyle::kNeox;
    if (cfg_.get_bool_or("attention_bias", false))
      TROUPE_INPUT_ERROR("%s: attention_bias is not supported for DeepSeek", cfg_.path().c_str());
    if (sparse) {  // DeepSeek-V3.2's lightning indexer
      s.idx_n_head = cfg_.get_dim("index_n_heads");
      s.idx_head_dim = cfg_.get_dim("index_head_dim");
      s.idx_top_k = cfg_.get_dim("index_topk");
      // GLM-5 rotates its indexer's queries and keys in neighbouring pairs (transformers'
      // GlmMoeDsaIndexer, llama.cpp's glm-dsa graph), DeepSeek-V3.2 in halves.
      if (glm_dsa_) {
        s.idx_rope_neox = false;
        read_glm_indexer_types();
      }
    }
    read_sigmoid_routing(/*glm=*/false);
  }

  /// GLM-5's indexer_types (HfHparams::idx_shared): per layer "full" (it runs its indexer) or
  /// "shared" (it has none and reuses the top-k of the last full layer before it: GLM-5.2), else
  /// index_topk_pattern's F and S, else index_topk_freq and index_skip_topk_offset (a layer is full
  /// when max(l - offset + 1, 0) is a multiple of freq; the defaults make every layer full, as
  /// GLM-5 and 5.1).
  void read_glm_indexer_types() {
    const char* path = cfg_.path().c_str();
    const int64_t n = h_.spec.n_layer;
    std::vector<bool> shared(static_cast<size_t>(n), false);
    auto entries = [&](const json& list, const char* key) {
      if (!list.is_array() || list.size() != static_cast<size_t>(n))
        TROUPE_INPUT_ERROR("%s: '%s' must be a list of %lld entries", path, key,
                           static_cast<long long>(n));
      for (size_t il = 0; il < list.size(); ++il) {
        const json& t = list[il];
        if (t != "full" && t != "shared" && t != "F" && t != "S")
          TROUPE_INPUT_ERROR("%s: %s[%zu] is %s (\"full\" or \"shared\")", path, key, il,
                             t.dump().c_str());
        shared[il] = t == "shared" || t == "S";
      }
    };
    if (const json* t = cfg_.find("indexer_types")) {
      entries(*t, "indexer_types");
    } else if (const json* pat = cfg_.find("index_topk_pattern")) {
      json list = json::array();
      if (pat->is_string())
        for (char ch : pat->get<std::string>()) list.push_back(std::string(1, ch));
      entries(pat->is_string() ? list : *pat, "index_topk_pattern");
    } else {
      const int64_t freq = std::max<int64_t>(1, cfg_.get_int_or("index_topk_freq", 1));
      const int64_t offset = cfg_.get_int_or("index_skip_topk_offset", 2);
      for (int64_t il = 0; il < n; ++il)
        shared[static_cast<size_t>(il)] = std::max<int64_t>(il - offset + 1, 0) % freq != 0;
    }
    if (n > 0 && shared[0])
      TROUPE_INPUT_ERROR("%s: layer 0's indexer is \"shared\", but no full layer precedes it",
                         path);
    h_.idx_shared = std::move(shared);
  }

  const HfConfig& cfg_;
  HfHparams h_;
  json rope_params_ = json::object();  // rope_scaling and rope_parameters, merged
  bool ernie_moe_ = false;             // Ernie4_5_MoeForCausalLM
  double v4_attention_factor_ = 1.0;   // DeepSeek-V4's compress rope: YaRN's cos/sin factor
  bool glm_dsa_ = false;               // GlmMoeDsaForCausalLM (GLM-5)
};

}  // namespace

HfHparams read_hf_hparams(const HfConfig& cfg) { return HparamsReader(cfg).read(); }

namespace {

// LlavaForConditionalGeneration's language model: text_config over the defaults of its
// model_type's config class (LLaVA 1.5's files give little more than the vocabulary size).
json llava_text_config(const json& config, const std::string& path) {
  auto tc = config.find("text_config");
  const json given = tc != config.end() && tc->is_object() ? *tc : json::object();
  const auto mt = given.find("model_type");
  const std::string type = mt != given.end() && mt->is_string() ? mt->get<std::string>() : "llama";
  json text;
  if (type == "llama") {  // LlamaConfig
    text = {{"architectures", {"LlamaForCausalLM"}},
            {"vocab_size", 32000},
            {"hidden_size", 4096},
            {"intermediate_size", 11008},
            {"num_hidden_layers", 32},
            {"num_attention_heads", 32},
            {"hidden_act", "silu"},
            {"max_position_embeddings", 2048},
            {"rms_norm_eps", 1e-6},
            {"rope_theta", 10000.0},
            {"tie_word_embeddings", false}};
  } else if (type == "mistral") {  // MistralConfig
    text = {{"architectures", {"MistralForCausalLM"}},
            {"vocab_size", 32000},
            {"hidden_size", 4096},
            {"intermediate_size", 14336},
            {"num_hidden_layers", 32},
            {"num_attention_heads", 32},
            {"num_key_value_heads", 8},
            {"hidden_act", "silu"},
            {"max_position_embeddings", 131072},
            {"rms_norm_eps", 1e-6},
            {"rope_theta", 10000.0},
            {"sliding_window", 4096},  // null in a text_config turns it off
            {"tie_word_embeddings", false}};
  } else if (type == "qwen2") {  // every key given: Qwen2Config's defaults are a 7B's
    text = {{"architectures", {"Qwen2ForCausalLM"}}};
  } else {
    TROUPE_INPUT_ERROR(
        "%s: text_config.model_type '%s' is not supported for LlavaForConditionalGeneration "
        "(troupe reads llama, mistral and qwen2 text models there)",
        path.c_str(), type.c_str());
  }
  for (auto it = given.begin(); it != given.end(); ++it)
    if (it.key() != "architectures") text[it.key()] = it.value();
  if (auto q = config.find("quantization_config"); q != config.end())
    text["quantization_config"] = *q;
  return text;
}

// A text decoder's config over its config class's defaults (`text`): the config itself for the
// causal class, else (the multimodal class) its text_config, renamed `causal` and keeping the
// checkpoint's quantization_config.
json over_defaults(json text, const json& config, bool conditional, const char* causal,
                   bool* multimodal) {
  if (!conditional) {
    text.update(config);
    return text;
  }
  *multimodal = true;
  auto tc = config.find("text_config");
  if (tc != config.end() && tc->is_object()) text.update(*tc);
  text["architectures"] = json::array({causal});
  if (auto q = config.find("quantization_config"); q != config.end())
    text["quantization_config"] = *q;
  return text;
}

}  // namespace

nlohmann::json text_decoder_config(nlohmann::json config, const std::string& path,
                                   bool* multimodal) {
  *multimodal = false;
  if (!config.is_object()) return config;
  auto archs = config.find("architectures");
  if (archs == config.end() || !archs->is_array() || archs->empty() || !(*archs)[0].is_string())
    return config;
  const std::string arch = (*archs)[0].get<std::string>();
  // Mistral3ForConditionalGeneration (Mistral Small 3.1 and 3.2): a Pixtral tower and a Mistral
  // decoder, laid out as LLaVA's.
  if (arch == "LlavaForConditionalGeneration" || arch == "Mistral3ForConditionalGeneration") {
    *multimodal = true;
    return llava_text_config(config, path);
  }
  if (arch == "Llama4ForConditionalGeneration" || arch == "Llama4ForCausalLM") {
    // Llama4TextConfig's defaults (transformers).
    const json text = {{"vocab_size", 202048},        {"hidden_size", 5120},
                       {"intermediate_size", 8192},   {"intermediate_size_mlp", 16384},
                       {"num_hidden_layers", 48},     {"num_attention_heads", 40},
                       {"num_key_value_heads", 8},    {"head_dim", 128},
                       {"hidden_act", "silu"},        {"max_position_embeddings", 131072},
                       {"rms_norm_eps", 1e-5},        {"rope_theta", 500000.0},
                       {"num_experts_per_tok", 1},    {"num_local_experts", 16},
                       {"tie_word_embeddings", false}};
    return over_defaults(text, config, arch != "Llama4ForCausalLM", "Llama4ForCausalLM",
                         multimodal);
  }
  if (arch == "Qwen3_5MoeForConditionalGeneration" || arch == "Qwen3_5ForConditionalGeneration") {
    // The decoder's keys are all in text_config (its config class's defaults are read as
    // Qwen3-Next's); the vision tower's in vision_config.
    const bool moe = arch == "Qwen3_5MoeForConditionalGeneration";
    return over_defaults(json::object(), config, true,
                         moe ? "Qwen3_5MoeForCausalLM" : "Qwen3_5ForCausalLM", multimodal);
  }
  if (arch != "Gemma3ForCausalLM" && arch != "Gemma3ForConditionalGeneration") return config;
  // Gemma3TextConfig's defaults (transformers), for the keys its released files leave out.
  const json text = {{"vocab_size", 262208},
                     {"hidden_size", 2304},
                     {"intermediate_size", 9216},
                     {"num_hidden_layers", 26},
                     {"num_attention_heads", 8},
                     {"num_key_value_heads", 4},
                     {"head_dim", 256},
                     {"hidden_activation", "gelu_pytorch_tanh"},
                     {"max_position_embeddings", 131072},
                     {"rms_norm_eps", 1e-6},
                     {"rope_theta", 1000000.0},
                     {"rope_local_base_freq", 10000.0},
                     {"query_pre_attn_scalar", 256},
                     {"sliding_window", 4096},
                     {"tie_word_embeddings", true}};
  return over_defaults(text, config, arch != "Gemma3ForCausalLM", "Gemma3ForCausalLM", multimodal);
}

}  // namespace troupe::model::detail
