// GGUF → ModelSpec mapping and spec validation.
#include "model/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/check.h"
#include "model/gguf.h"
#include "model/rope.h"

namespace troupe::model {

const char* arch_name(Arch a) {
  switch (a) {
    case Arch::kLlama:
      return "llama";
    case Arch::kQwen2Moe:
      return "qwen2moe";
    case Arch::kQwen3Moe:
      return "qwen3moe";
    case Arch::kDeepseek2:
      return "deepseek2";
    case Arch::kQwen2:
      return "qwen2";
    case Arch::kQwen3:
      return "qwen3";
    case Arch::kGlm4Moe:
      return "glm4moe";
    case Arch::kMinimaxM2:
      return "minimax-m2";
    case Arch::kBailingMoe2:
      return "bailingmoe2";
    case Arch::kGptOss:
      return "gpt-oss";
    case Arch::kGemma3:
      return "gemma3";
    case Arch::kLlama4:
      return "llama4";
    case Arch::kQwen3Next:
      return "qwen3next";
    case Arch::kQwen35:
      return "qwen35";
    case Arch::kQwen35Moe:
      return "qwen35moe";
    case Arch::kDeepseek4:
      return "deepseek4";
  }
  return "?";
}

WeightView view_of(const TensorInfo& t) {
  WeightView v;
  v.name = t.name;
  v.type = t.type;
  v.ne[0] = t.ne[0];
  v.ne[1] = t.ne[1];
  v.ne[2] = t.ne[2] * t.ne[3];
  v.data = t.data;
  return v;
}

namespace {

class GgufSpecBuilder {
 public:
  explicit GgufSpecBuilder(const GgufFile& g) : g_(g) {}

  WeightView req(const std::string& name) const {
    const TensorInfo* t = g_.find_tensor(name);
    if (!t) TROUPE_INPUT_ERROR("%s: missing tensor '%s'", g_.path().c_str(), name.c_str());
    return view_of(*t);
  }
  WeightView opt(const std::string& name) const {
    const TensorInfo* t = g_.find_tensor(name);
    return t ? view_of(*t) : WeightView{};
  }
  bool has(const std::string& name) const { return g_.find_tensor(name) != nullptr; }

  ModelSpec build() {
    ModelSpec s;
    const std::string arch = g_.get_string("general.architecture");
    if (arch == "llama") {
      s.arch = Arch::kLlama;
    } else if (arch == "phi3") {  // Phi-3, Phi-3.5-mini, Phi-4, Phi-4-mini: read_phi3
      s.arch = Arch::kLlama;
      phi3_ = true;
    } else if (arch == "ernie4_5" || arch == "ernie4_5-moe") {  // ERNIE 4.5: read_ernie45
      s.arch = Arch::kLlama;
      ernie_ = true;
    } else if (arch == "qwen2moe") {
      s.arch = Arch::kQwen2Moe;
    } else if (arch == "qwen3moe") {
      s.arch = Arch::kQwen3Moe;
    } else if (arch == "deepseek2" || arch == "deepseek32" || arch == "glm-dsa") {
      s.arch = Arch::kDeepseek2;  // V3.2 and GLM-5 (glm-dsa): with the lightning indexer
    } else if (arch == "qwen2") {
      s.arch = Arch::kQwen2;
    } else if (arch == "qwen3") {
      s.arch = Arch::kQwen3;
    } else if (arch == "glm4moe") {
      s.arch = Arch::kGlm4Moe;
    } else if (arch == "minimax-m2") {
      s.arch = Arch::kMinimaxM2;
    } else if (arch == "bailingmoe2") {
      s.arch = Arch::kBailingMoe2;
    } else if (arch == "gpt-oss") {
      s.arch = Arch::kGptOss;
    } else if (arch == "gemma3") {
      s.arch = Arch::kGemma3;
    } else if (arch == "llama4") {
      s.arch = Arch::kLlama4;
    } else if (arch == "qwen3next") {
      s.arch = Arch::kQwen3Next;
    } else if (arch == "qwen35") {
      s.arch = Arch::kQwen35;
    } else if (arch == "qwen35moe") {
      s.arch = Arch::kQwen35Moe;
    } else if (arch == "clip") {
      TROUPE_INPUT_ERROR(
          "%s: this is a vision encoder (mmproj), not a language model: pass it "
          "with --mmproj beside the language model",
          g_.path().c_str());
    } else {
      TROUPE_INPUT_ERROR(
          "%s: architecture '%s' is not supported (troupe runs llama, mixtral, phi3, ernie4_5, "
          "ernie4_5-moe, qwen2, qwen3, qwen2moe, qwen3moe, deepseek2, deepseek32, glm-dsa, "
          "glm4moe, minimax-m2, bailingmoe2, gpt-oss, gemma3, llama4, qwen3next, qwen35, "
          "qwen35moe)",
          g_.path().c_str(), arch.c_str());
    }
    const std::string p = arch + ".";
    s.name = g_.get_string_or("general.name", "");
    s.n_embd = g_.get_int(p + "embedding_length");
    s.n_layer = g_.get_int(p + "block_count");
    // GLM's multi-token-prediction layers are stored after the decoder's (block_count counts
    // them); troupe does not run them, so it never maps them.
    const int64_t n_nextn = g_.get_int_or(p + "nextn_predict_layers", 0);
    if (n_nextn < 0 || n_nextn >= s.n_layer)
      TROUPE_INPUT_ERROR("%s: nextn_predict_layers %lld must be below block_count %lld",
                         g_.path().c_str(), static_cast<long long>(n_nextn),
                         static_cast<long long>(s.n_layer));
    s.n_layer -= n_nextn;
    s.n_head = g_.get_int(p + "attention.head_count");
    s.n_head_kv = g_.get_int_or(p + "attention.head_count_kv", s.n_head);
    s.n_ff = g_.get_int_or(p + "feed_forward_length", 0);
    s.n_ctx_train = g_.get_int_or(p + "context_length", 2048);
    s.rope_theta = static_cast<float>(g_.get_float_or(p + "rope.freq_base", 10000.0));
    s.rms_eps = static_cast<float>(g_.get_float_or(p + "attention.layer_norm_rms_epsilon", 1e-5));
    if (s.n_embd <= 0 || s.n_layer <= 0 || s.n_head <= 0 || s.n_head_kv <= 0 ||
        s.n_layer > 100000 || s.n_head > 100000)
      TROUPE_INPUT_ERROR(
          "%s: bad hyperparameters (n_embd %lld, n_layer %lld, n_head %lld, "
          "n_head_kv %lld)",
          g_.path().c_str(), static_cast<long long>(s.n_embd), static_cast<long long>(s.n_layer),
          static_cast<long long>(s.n_head), static_cast<long long>(s.n_head_kv));
    if (s.n_head % s.n_head_kv != 0)
      TROUPE_INPUT_ERROR("%s: head_count %lld is not a multiple of head_count_kv %lld",
                         g_.path().c_str(), static_cast<long long>(s.n_head),
                         static_cast<long long>(s.n_head_kv));
    s.head_dim_k = g_.get_int_or(p + "attention.key_length", s.n_embd / s.n_head);
    s.head_dim_v = g_.get_int_or(p + "attention.value_length", s.n_embd / s.n_head);
    s.n_rot = g_.get_int_or(p + "rope.dimension_count", s.head_dim_k);
    // llama.cpp stores Llama's q/k rows permuted for its normal rope; Qwen's as HF has them.
    // Llama 4's are as HF has them, which rotates adjacent pairs too.
    // Phi-3's rows are as HF has them, like Qwen's.
    s.rope_style =
        (s.arch == Arch::kLlama && !phi3_) || s.arch == Arch::kDeepseek2 || s.arch == Arch::kLlama4
            ? RopeStyle::kNormal
            : RopeStyle::kNeox;
    const bool qwen35 = s.arch == Arch::kQwen35 || s.arch == Arch::kQwen35Moe;
    if (qwen35) {
      check_text_mrope(s, p);
    } else if (g_.find(p + "rope.dimension_sections")) {
      TROUPE_INPUT_ERROR(
          "%s: multimodal rope (rope.dimension_sections, as GLM-4.5V) is not supported",
          g_.path().c_str());
    }
    read_rope_scaling(s, p);
    if (phi3_) read_phi3(s, p);
    s.n_expert = g_.get_int_or(p + "expert_count", 0);
    s.n_expert_used = g_.get_int_or(p + "expert_used_count", 0);
    s.n_ff_exp = g_.get_int_or(p + "expert_feed_forward_length", s.n_ff);
    s.n_expert_shared = g_.get_int_or(p + "expert_shared_count", 0);
    s.n_ff_shexp = g_.get_int_or(p + "expert_shared_feed_forward_length", 0);
    s.n_leading_dense = g_.get_int_or(p + "leading_dense_block_count", 0);
    s.routed_scale = static_cast<float>(g_.get_float_or(p + "expert_weights_scale", 1.0));
    // GLM and MiniMax-M2 route by sigmoid scores (llama.cpp's default for glm4moe).
    const bool sigmoid_default = s.arch == Arch::kGlm4Moe || s.arch == Arch::kMinimaxM2 ||
                                 s.arch == Arch::kBailingMoe2 || arch == "glm-dsa";
    const int64_t gating = g_.get_int_or(p + "expert_gating_func", sigmoid_default ? 2 : 1);
    s.gating = gating == 2 ? Gating::kSigmoid : Gating::kSoftmax;
    s.n_group = g_.get_int_or(p + "expert_group_count", 1);
    s.n_group_used = g_.get_int_or(p + "expert_group_used_count", s.n_group);
    // A softmax-gated deepseek2 file is DeepSeek-V2 (V2, V2.5, Coder-V2; V3 gates by sigmoid),
    // whose group_limited_greedy ranks groups by their best score. llama.cpp's graph sums the
    // two best for every model; troupe follows the model's own definition.
    const bool deepseek_v2 = s.arch == Arch::kDeepseek2 && s.gating == Gating::kSoftmax;
    if (deepseek_v2) s.group_score = GroupScore::kMax;
    switch (s.arch) {
      case Arch::kLlama:
        s.norm_topk = true;
        break;
      case Arch::kQwen3Moe:
      case Arch::kMinimaxM2:  // llama.cpp's graph always renormalizes MiniMax-M2's top-k
        s.norm_topk = true;
        break;
      case Arch::kQwen2Moe:
        s.norm_topk = false;
        break;
      case Arch::kGemma3:
        read_gemma3(s, p);
        [[fallthrough]];
      case Arch::kQwen2:
      case Arch::kQwen3:
        if (s.n_expert != 0)
          TROUPE_INPUT_ERROR("%s: a dense %s model with %lld experts", g_.path().c_str(),
                             arch.c_str(), static_cast<long long>(s.n_expert));
        break;
      case Arch::kDeepseek2:
      case Arch::kGlm4Moe:
      case Arch::kBailingMoe2:
        s.norm_topk = g_.get_bool_or(p + "expert_weights_norm", false);
        if (deepseek_v2) apply_v2_gate_weights(s);
        break;
      case Arch::kLlama4:
        read_llama4(s, p);
        break;
      case Arch::kQwen3Next:
      case Arch::kQwen35:
      case Arch::kQwen35Moe:
        read_qwen3next(s, p);
        break;
      case Arch::kGptOss:  // llama.cpp's graph: softmax over the top-k logits, clamped SwiGLU
        s.gating = Gating::kSoftmaxTopk;
        s.norm_topk = false;
        s.ffn_act = FfnAct::kSwigluOai;
        window_ = g_.get_int(p + "attention.sliding_window");
        if (window_ <= 0)
          TROUPE_INPUT_ERROR("%s: %sattention.sliding_window must be positive, got %lld",
                             g_.path().c_str(), p.c_str(), static_cast<long long>(window_));
        break;
      case Arch::kDeepseek4:  // read from Hugging Face checkpoints only
        TROUPE_INPUT_ERROR("%s: DeepSeek-V4 is read from its Hugging Face checkpoint",
                           g_.path().c_str());
    }
    if (ernie_) read_ernie45(s, p, arch == "ernie4_5-moe");
    if (s.arch == Arch::kDeepseek2) {
      s.q_lora_rank = g_.get_int_or(p + "attention.q_lora_rank", 0);
      s.kv_lora_rank = g_.get_int(p + "attention.kv_lora_rank");
      s.qk_rope_dim = s.n_rot;
      const int64_t k_mla = g_.get_int_or(p + "attention.key_length_mla", s.head_dim_k);
      s.v_head_dim = g_.get_int_or(p + "attention.value_length_mla", s.head_dim_v);
      s.qk_nope_dim = k_mla - s.qk_rope_dim;
      s.head_dim_k = k_mla;
      s.head_dim_v = s.v_head_dim;
      s.n_head_kv = 1;
      if (arch == "deepseek32" || arch == "glm-dsa") {  // the lightning indexer
        s.idx_n_head = g_.get_int(p + "attention.indexer.head_count");
        s.idx_head_dim = g_.get_int(p + "attention.indexer.key_length");
        s.idx_top_k = g_.get_int(p + "attention.indexer.top_k");
        if (s.idx_top_k <= 0)
          TROUPE_INPUT_ERROR("%s: %sattention.indexer.top_k must be positive, got %lld",
                             g_.path().c_str(), p.c_str(), ll(s.idx_top_k));
      }
      if (arch == "glm-dsa") {  // GLM-5 rotates its indexer in neighbouring pairs
        s.idx_rope_neox = false;
        read_glm_indexer_types(s, p);
      }
    }

    s.token_embd = req("token_embd.weight");
    s.n_vocab = s.token_embd.rows();
    s.output_norm = req("output_norm.weight");
    s.output = has("output.weight") ? req("output.weight") : s.token_embd;

    s.layers.resize(static_cast<size_t>(s.n_layer));
    for (int64_t il = 0; il < s.n_layer; ++il)
      build_layer(s, il, s.layers[static_cast<size_t>(il)]);
    return s;
  }

 private:
  // llama.cpp's keys: rope.scaling.{type,factor,original_context_length,attn_factor,
  // yarn_beta_fast,yarn_beta_slow,yarn_log_multiplier}, the older rope.scale_linear, and the
  // per-pair divisors rope_freqs.weight (Llama 3.1 and later).
  void read_rope_scaling(ModelSpec& s, const std::string& p) const {
    const char* path = g_.path().c_str();
    RopeScaling& sc = s.rope_scaling;
    const std::string type = g_.get_string_or(p + "rope.scaling.type", "");
    // As llama.cpp: the factor falls back to the older rope.scale_linear key, 0 means unset, and
    // a missing type means "linear"; "none" never scales, whatever the factor (llama.cpp's
    // context sets the frequency scale to 1 for it).
    const std::string factor_key =
        g_.find(p + "rope.scaling.factor") || !g_.find(p + "rope.scale_linear")
            ? p + "rope.scaling.factor"
            : p + "rope.scale_linear";
    sc.factor = g_.get_float_or(factor_key, 0.0);
    if (sc.factor == 0.0) sc.factor = 1.0;
    const double af = g_.get_float_or(p + "rope.scaling.attn_factor", 1.0);
    const double log_mul = g_.get_float_or(p + "rope.scaling.yarn_log_multiplier", 0.0);
    if (type.empty() || type == "none" || type == "linear") {
      if (type == "none") sc.factor = 1.0;
      if (sc.factor != 1.0) sc.type = RopeScalingType::kLinear;
      // llama.cpp multiplies cos and sin by attn_factor (DeepSeek's graph replaces it).
      if (af != 1.0 && s.arch == Arch::kDeepseek2)
        TROUPE_INPUT_ERROR(
            "%s: rope.scaling.attn_factor %g without YaRN is not supported for "
            "deepseek2",
            path, af);
      sc.attn_factor = af;
    } else if (type == "yarn") {
      sc.type = RopeScalingType::kYarn;
      sc.orig_ctx = g_.get_int_or(p + "rope.scaling.original_context_length", s.n_ctx_train);
      sc.beta_fast = g_.get_float_or(p + "rope.scaling.yarn_beta_fast", 32.0);
      sc.beta_slow = g_.get_float_or(p + "rope.scaling.yarn_beta_slow", 1.0);
      if (s.arch == Arch::kDeepseek2) {
        // DeepSeek's YaRN leaves cos/sin at their size and puts the magnitude term, squared,
        // on the attention scale (its reference code's mscale_all_dim = log_mul / 0.1).
        const double m = af * (1.0 + log_mul * std::log(sc.factor));
        s.kq_scale_mult = m * m;
      } else {
        if (log_mul != 0.0)
          TROUPE_INPUT_ERROR(
              "%s: rope.scaling.yarn_log_multiplier %g is supported only for deepseek2", path,
              log_mul);
        sc.attn_factor = af * yarn_mscale(sc.factor);
      }
    } else {
      TROUPE_INPUT_ERROR("%s: rope scaling '%s' is not supported (none, linear, yarn)", path,
                         type.c_str());
    }
    s.rope_freq_factors = pair_divisors("rope_freqs.weight", s);
  }

  /// The f32 tensor `name` of one divisor per rotary pair, copied; empty when the file lacks it.
  std::vector<float> pair_divisors(const char* name, const ModelSpec& s) const {
    const TensorInfo* t = g_.find_tensor(name);
    if (!t) return {};
    if (t->type != GgmlType::kF32 || t->ne[0] != s.n_rot / 2 || t->ne[1] * t->ne[2] * t->ne[3] != 1)
      TROUPE_INPUT_ERROR(
          "%s: tensor '%s' must be f32 [%lld] (one divisor per rotary pair), got %s [%lld, %lld]",
          g_.path().c_str(), name, ll(s.n_rot / 2), type_name(t->type).c_str(), ll(t->ne[0]),
          ll(t->ne[1] * t->ne[2] * t->ne[3]));
    std::vector<float> out(static_cast<size_t>(t->ne[0]));
    std::memcpy(out.data(), t->data, out.size() * sizeof(float));
    return out;
  }

  /// Phi-3 as llama.cpp's converter stores it, run as transformers defines it: LongRoPE's
  /// per-pair divisors in rope_factors_short.weight and rope_factors_long.weight (the long ones
  /// for a context above rope.scaling.original_context_length, as llama.cpp picks them), cos
  /// and sin times rope.scaling.attn_factor (read_rope_scaling); attention.sliding_window, when
  /// set, on every layer (transformers' mask); fused attn_qkv, and ffn_up holding the gate's rows
  /// then up's (build_layer).
  void read_phi3(ModelSpec& s, const std::string& p) {
    const char* path = g_.path().c_str();
    std::vector<float> shrt = pair_divisors("rope_factors_short.weight", s);
    std::vector<float> lng = pair_divisors("rope_factors_long.weight", s);
    if (shrt.empty() != lng.empty())
      TROUPE_INPUT_ERROR("%s: rope_factors_short.weight and rope_factors_long.weight come together",
                         path);
    if (!shrt.empty()) {
      if (!s.rope_freq_factors.empty())
        TROUPE_INPUT_ERROR("%s: rope_freqs.weight beside LongRoPE's factors", path);
      s.rope_freq_factors = std::move(shrt);
      s.rope_freq_factors_long = std::move(lng);
      s.rope_long_after = g_.get_int_or(p + "rope.scaling.original_context_length", s.n_ctx_train);
    }
    window_ = g_.get_int_or(p + "attention.sliding_window", 0);
    if (window_ < 0)
      TROUPE_INPUT_ERROR("%s: %sattention.sliding_window must not be negative, got %lld", path,
                         p.c_str(), ll(window_));
  }

  /// Gemma 3 as llama.cpp runs it: embeddings times sqrt(n_embd), GELU FFN; with a sliding
  /// window, five window layers (rope base 10000, unscaled) to every global one; without one,
  /// the optional final logit soft cap; the 27B model (62 layers) scales queries by
  /// 1/sqrt(n_embd / n_head) rather than 1/sqrt(head size).
  void read_gemma3(ModelSpec& s, const std::string& p) {
    s.ffn_act = FfnAct::kGeluTanh;
    s.embd_scale = std::sqrt(static_cast<float>(s.n_embd));
    s.rope_theta_local = 10000.f;
    window_ = g_.get_int_or(p + "attention.sliding_window", 0);
    if (window_ < 0)
      TROUPE_INPUT_ERROR("%s: %sattention.sliding_window must not be negative, got %lld",
                         g_.path().c_str(), p.c_str(), ll(window_));
    if (window_ == 0)
      s.final_logit_softcap =
          static_cast<float>(g_.get_float_or(p + "final_logit_softcapping", 0.0));
    if (s.n_layer == 62)
      s.kq_scale_mult = std::sqrt(static_cast<double>(s.head_dim_k)) /
                        std::sqrt(static_cast<double>(s.n_embd / s.n_head));
  }

  /// GLM-5's attention.indexer.types (idx_full_): per layer "full" (1) or "shared" (0: the layer
  /// has no indexer and reuses the top-k of the last full one before it, GLM-5.2's). Absent, as
  /// llama.cpp: every layer full in a file trained for under 1M positions (GLM-5, 5.1), else
  /// GLM-5.2's pattern (layers 0 and 1 full, then one of every four from layer 2).
  void read_glm_indexer_types(const ModelSpec& s, const std::string& p) {
    const char* path = g_.path().c_str();
    const auto n = static_cast<size_t>(s.n_layer);
    idx_full_.assign(n, true);
    const GgufValue* v = g_.find(p + "attention.indexer.types");
    if (v == nullptr) {
      if (s.n_ctx_train >= 1048576)
        for (size_t il = 0; il < n; ++il)
          idx_full_[il] = !ModelSpec::glm52_indexer_shared(static_cast<int64_t>(il));
      return;
    }
    if (v->type != GgufType::kArray || v->count != static_cast<uint64_t>(n))
      TROUPE_INPUT_ERROR("%s: %sattention.indexer.types must hold an entry per layer (%lld)", path,
                         p.c_str(), ll(s.n_layer));
    for (size_t il = 0; il < n; ++il) {
      const bool str = v->elem_type == GgufType::kString;
      idx_full_[il] = str ? v->strings[il] == "full" : v->array_i64(il) != 0;
      if (str && !idx_full_[il] && v->strings[il] != "shared")
        TROUPE_INPUT_ERROR("%s: %sattention.indexer.types[%zu] is '%.*s' (full or shared)", path,
                           p.c_str(), il, static_cast<int>(v->strings[il].size()),
                           v->strings[il].data());
    }
    if (n > 0 && !idx_full_[0])
      TROUPE_INPUT_ERROR("%s: layer 0's indexer is shared, but no full layer precedes it", path);
  }

  /// ERNIE 4.5 as llama.cpp converts it: Llama's graph (q/k rows as the checkpoint has them,
  /// which rotate adjacent pairs), and for ernie4_5-moe experts from leading_dense_block_count
  /// on, every interleave_moe_layer_step-th layer (required), routed by a softmax with the
  /// selection bias exp_probs_b, the top-k renormalized (llama.cpp's graph, whatever
  /// expert_gating_func says), beside ungated shared experts read at their tensors' width.
  void read_ernie45(ModelSpec& s, const std::string& p, bool moe) {
    if (!moe) {
      if (s.n_expert != 0)
        TROUPE_INPUT_ERROR("%s: a dense ernie4_5 model with %lld experts", g_.path().c_str(),
                           ll(s.n_expert));
      return;
    }
    if (s.n_expert <= 0)
      TROUPE_INPUT_ERROR("%s: an ernie4_5-moe model without experts", g_.path().c_str());
    s.gating = Gating::kSoftmax;
    moe_step_ = g_.get_int(p + "interleave_moe_layer_step");
    if (moe_step_ <= 0 || moe_step_ > s.n_layer)
      TROUPE_INPUT_ERROR("%s: %sinterleave_moe_layer_step %lld must be in 1..%lld",
                         g_.path().c_str(), p.c_str(), ll(moe_step_), ll(s.n_layer));
  }

  /// Llama 4 as llama.cpp runs it: a sigmoid router (top-k, not renormalized) whose weight
  /// scales the expert's input; MoE layers every interleave_moe_layer_step-th, the others dense;
  /// three chunked-attention rope layers to every global NoPE one, with the chunk, and the NoPE
  /// layers' query temperature, fixed at llama.cpp's values (Scout's and Maverick's: 8192
  /// positions; a scale of 0.1 every 8192). The q/k norms are as llama.cpp decides them: off for
  /// 128 experts (Maverick's use_qk_norm is false), on otherwise. A file whose
  /// attention.sliding_window is 0 (MobileLLM-R1, dense) is refused: llama.cpp runs its last
  /// layer without rotary, which its checkpoints do not.
  void read_llama4(ModelSpec& s, const std::string& p) {
    s.gating = Gating::kSigmoid;
    s.norm_topk = false;
    s.moe_weight_input = true;
    s.n_expert_shared = 1;  // one, as wide as a routed expert (llama.cpp's tensor shapes)
    s.n_ff_shexp = s.n_ff_exp;
    s.attn_temp_scale = 0.1f;
    s.attn_temp_floor = 8192;
    moe_step_ = g_.get_int(p + "interleave_moe_layer_step");
    if (moe_step_ <= 0 || moe_step_ > s.n_layer)
      TROUPE_INPUT_ERROR("%s: %sinterleave_moe_layer_step %lld must be in 1..%lld",
                         g_.path().c_str(), p.c_str(), ll(moe_step_), ll(s.n_layer));
    if (s.n_expert <= 0)
      TROUPE_INPUT_ERROR("%s: a llama4 model without experts (MobileLLM) is not supported",
                         g_.path().c_str());
    if (g_.find(p + "attention.sliding_window") && g_.get_int(p + "attention.sliding_window") == 0)
      TROUPE_INPUT_ERROR(
          "%s: llama4 without chunked attention (%sattention.sliding_window 0: MobileLLM) is "
          "not supported",
          g_.path().c_str(), p.c_str());
  }

  /// Qwen3-Next as llama.cpp runs it: the Gated DeltaNet's sizes from the ssm.* keys (key
  /// heads: group_count, of state_size; value heads: time_step_rank, of inner_size / heads),
  /// the layers attention.recurrent_layers names linear (else every full_attention_interval-th,
  /// default 4, full attention), experts in every layer
  /// with a softmax router whose top-k weights are renormalized, and a gated shared expert.
  void read_qwen3next(ModelSpec& s, const std::string& p) {
    s.norm_topk = true;
    s.n_expert_shared = 1;
    s.ssm_conv_kernel = g_.get_int(p + "ssm.conv_kernel");
    s.ssm_k_dim = g_.get_int(p + "ssm.state_size");
    s.ssm_k_heads = g_.get_int(p + "ssm.group_count");
    s.ssm_v_heads = g_.get_int(p + "ssm.time_step_rank");
    const int64_t inner = g_.get_int(p + "ssm.inner_size");
    if (s.ssm_conv_kernel < 1 || s.ssm_conv_kernel > 64 || s.ssm_k_dim <= 0 || s.ssm_k_heads <= 0 ||
        s.ssm_v_heads <= 0 || s.ssm_k_dim > 65536 || s.ssm_v_heads > 65536 || inner <= 0 ||
        inner % s.ssm_v_heads != 0 || s.ssm_v_heads % s.ssm_k_heads != 0)
      TROUPE_INPUT_ERROR(
          "%s: bad linear-attention sizes (%sssm.conv_kernel %lld, state_size %lld, group_count "
          "%lld, time_step_rank %lld, inner_size %lld): value heads must be a multiple of the "
          "key heads and divide inner_size",
          g_.path().c_str(), p.c_str(), ll(s.ssm_conv_kernel), ll(s.ssm_k_dim), ll(s.ssm_k_heads),
          ll(s.ssm_v_heads), ll(inner));
    s.ssm_v_dim = inner / s.ssm_v_heads;
    // Which layers are linear: attention.recurrent_layers (one flag per layer; multi-token
    // prediction layers after the decoder's may follow), else all but every
    // full_attention_interval-th.
    recurrent_.assign(static_cast<size_t>(s.n_layer), false);
    if (const GgufValue* v = g_.find(p + "attention.recurrent_layers")) {
      if (v->type != GgufType::kArray || v->elem_type == GgufType::kString ||
          v->count < static_cast<uint64_t>(s.n_layer))
        TROUPE_INPUT_ERROR("%s: %sattention.recurrent_layers must hold a flag per layer (%lld)",
                           g_.path().c_str(), p.c_str(), ll(s.n_layer));
      for (int64_t il = 0; il < s.n_layer; ++il)
        recurrent_[static_cast<size_t>(il)] = v->array_i64(static_cast<uint64_t>(il)) != 0;
    } else {
      const int64_t every = g_.get_int_or(p + "full_attention_interval", 4);
      if (every <= 0 || every > s.n_layer)
        TROUPE_INPUT_ERROR("%s: %sfull_attention_interval %lld must be in 1..%lld",
                           g_.path().c_str(), p.c_str(), ll(every), ll(s.n_layer));
      for (int64_t il = 0; il < s.n_layer; ++il)
        recurrent_[static_cast<size_t>(il)] = (il + 1) % every != 0;
    }
    // Qwen3.5's converter tiles the value heads (llama.cpp's graph then repeats key heads
    // whole instead of each in place).
    s.ssm_tiled = s.arch != Arch::kQwen3Next;
    if (s.arch == Arch::kQwen35 && s.n_expert != 0)
      TROUPE_INPUT_ERROR("%s: a dense qwen35 model with %lld experts", g_.path().c_str(),
                         ll(s.n_expert));
    if (s.arch != Arch::kQwen35 && s.n_expert <= 0)
      TROUPE_INPUT_ERROR("%s: a %s model without experts is not supported", g_.path().c_str(),
                         arch_name(s.arch));
  }

  /// Qwen3.5's rope is multimodal (rope.dimension_sections: interleaved sections of the rotated
  /// pairs for time, height and width). A text position has all three equal, and then the
  /// rotation is NeoX rope on the n_rot rotated values: troupe runs text only, so it needs the
  /// sections to cover exactly the n_rot / 2 pairs, the fourth empty.
  void check_text_mrope(const ModelSpec& s, const std::string& p) const {
    const GgufValue* v = g_.find(p + "rope.dimension_sections");
    if (v == nullptr) return;
    int64_t sum = 0;
    bool ok = v->type == GgufType::kArray && v->elem_type != GgufType::kString && v->count >= 3 &&
              v->count <= 4;
    for (uint64_t i = 0; ok && i < v->count; ++i) {
      const int64_t n = v->array_i64(i);
      ok = n >= 0 && (i < 3 || n == 0);
      sum += n;
    }
    if (!ok || sum != s.n_rot / 2)
      TROUPE_INPUT_ERROR(
          "%s: %srope.dimension_sections must be 3 or 4 counts of rotated pairs (the fourth 0) "
          "summing to rope.dimension_count / 2 = %lld",
          g_.path().c_str(), p.c_str(), ll(s.n_rot / 2));
  }

  // A Gated DeltaNet layer (Qwen3-Next), from either of llama.cpp's layouts of its input
  // projection: ssm_in (per key head q, k, v, z, as Hugging Face's in_proj_qkvz) or attn_qkv
  // and attn_gate (all q, k, v; then z).
  void build_linear_attention(const std::string& b, LayerSpec& L) const {
    L.recurrent = true;
    if (has(b + "ssm_in.weight")) {
      L.ssm_in = req(b + "ssm_in.weight");
    } else {
      L.ssm_qkv = req(b + "attn_qkv.weight");
      L.ssm_z = req(b + "attn_gate.weight");
    }
    if (has(b + "ssm_beta.weight")) {  // Qwen3.5: b and a apart, per value head
      L.ssm_beta = req(b + "ssm_beta.weight");
      L.ssm_alpha = req(b + "ssm_alpha.weight");
    } else {
      L.ssm_ba = req(b + "ssm_ba.weight");
    }
    L.ssm_conv = req(b + "ssm_conv1d.weight");
    L.ssm_dt = req(b + "ssm_dt.bias");
    L.ssm_a = req(b + "ssm_a");
    L.ssm_norm = req(b + "ssm_norm.weight");
    L.wo = req(b + "ssm_out.weight");
  }

  void build_layer(const ModelSpec& s, int64_t il, LayerSpec& L) const {
    const std::string b = "blk." + std::to_string(il) + ".";
    L.attn_norm = req(b + "attn_norm.weight");
    // Qwen3-Next and Qwen3.5: linear layers, gated full ones, a gated shared expert.
    const bool hybrid =
        s.arch == Arch::kQwen3Next || s.arch == Arch::kQwen35 || s.arch == Arch::kQwen35Moe;
    if (hybrid && recurrent_[static_cast<size_t>(il)]) {
      build_linear_attention(b, L);
    } else if (s.arch == Arch::kDeepseek2) {
      if (s.q_lora_rank > 0) {
        L.wq_a = req(b + "attn_q_a.weight");
        L.q_a_norm = req(b + "attn_q_a_norm.weight");
        L.wq_b = req(b + "attn_q_b.weight");
      } else {
        L.wq = req(b + "attn_q.weight");
      }
      L.wkv_a = req(b + "attn_kv_a_mqa.weight");
      L.kv_a_norm = req(b + "attn_kv_a_norm.weight");
      if (!has(b + "attn_k_b.weight"))
        TROUPE_INPUT_ERROR(
            "%s: '%sattn_kv_b.weight' (pre-MLA layout) is not supported; "
            "re-convert with split attn_k_b/attn_v_b",
            g_.path().c_str(), b.c_str());
      L.wk_b = req(b + "attn_k_b.weight");
      L.wv_b = req(b + "attn_v_b.weight");
      L.idx_shared = !idx_full_.empty() && !idx_full_[static_cast<size_t>(il)];
      if (s.has_indexer() && !L.idx_shared) {
        L.idx_wq_b = req(b + "indexer.attn_q_b.weight");
        L.idx_wk = req(b + "indexer.attn_k.weight");
        L.idx_k_norm = req(b + "indexer.k_norm.weight");
        L.idx_k_norm_b = req(b + "indexer.k_norm.bias");
        L.idx_proj = req(b + "indexer.proj.weight");
      }
    } else {
      L.attn_gate = hybrid;
      if (!has(b + "attn_q.weight") && has(b + "attn_qkv.weight")) {
        split_qkv(s, b, L);  // one fused matrix (Ling-2.0's)
      } else {
        L.wq = req(b + "attn_q.weight");
        L.wk = req(b + "attn_k.weight");
        L.wv = req(b + "attn_v.weight");
        L.bq = opt(b + "attn_q.bias");
        L.bk = opt(b + "attn_k.bias");
        L.bv = opt(b + "attn_v.bias");
      }
      const bool need_qk_norm = s.arch == Arch::kMinimaxM2 || s.arch == Arch::kGemma3 || hybrid;
      L.q_norm = need_qk_norm ? req(b + "attn_q_norm.weight") : opt(b + "attn_q_norm.weight");
      L.k_norm = need_qk_norm ? req(b + "attn_k_norm.weight") : opt(b + "attn_k_norm.weight");
    }
    if (!L.recurrent) L.wo = req(b + "attn_output.weight");
    // gpt-oss's sinks and biases are part of its arithmetic (llama.cpp requires them).
    const bool oss = s.arch == Arch::kGptOss;
    L.bo = oss ? req(b + "attn_output.bias") : opt(b + "attn_output.bias");
    L.sinks = oss ? req(b + "attn_sinks.weight") : opt(b + "attn_sinks.weight");
    // gpt-oss: a sliding window on every other layer, from the first (llama.cpp's pattern 2).
    if (s.arch == Arch::kGptOss && il % 2 == 0) L.window = window_;
    if (phi3_) L.window = window_;
    if (s.arch == Arch::kLlama4) {
      // llama.cpp's pattern 4: layers 3, 7, ... are global and NoPE.
      L.nope = (il + 1) % 4 == 0;
      L.chunk = L.nope ? 0 : 8192;
      L.qk_l2_norm = !L.nope && s.n_expert != 128;
    }
    if (s.arch == Arch::kGemma3) {
      L.attn_post_norm = req(b + "post_attention_norm.weight");
      L.ffn_post_norm = req(b + "post_ffw_norm.weight");
      // Five sliding-window layers, then a global one (llama.cpp's pattern 6).
      if (window_ > 0 && (il + 1) % 6 != 0) {
        L.window = window_;
        L.local_rope = true;
      }
    }
    // GLM's and gpt-oss's converters name the norm before the FFN after HF's
    // post_attention_layernorm.
    const bool post = s.arch == Arch::kGlm4Moe || s.arch == Arch::kGptOss || hybrid;
    L.ffn_norm = req(b + (post ? "post_attention_norm.weight" : "ffn_norm.weight"));
    const bool moe = s.n_expert > 0 && il >= s.n_leading_dense && (il + 1) % moe_step_ == 0;
    L.is_moe = moe;
    if (!moe && phi3_ && !has(b + "ffn_gate.weight")) {
      // Phi-3's ffn_up [n_embd, 2 n_ff]: the gate's rows, then up's.
      const WeightView w = req(b + "ffn_up.weight");
      if (w.rows() != 2 * s.n_ff)
        TROUPE_INPUT_ERROR(
            "%s: tensor '%sffn_up.weight' has %lld rows, expected 2 x %lld (the "
            "gate's and up's)",
            g_.path().c_str(), b.c_str(), ll(w.rows()), ll(s.n_ff));
      L.ffn_gate = w.row_range(0, s.n_ff, b + "ffn_up.weight[gate]");
      L.ffn_up = w.row_range(s.n_ff, s.n_ff, b + "ffn_up.weight[up]");
      L.ffn_down = req(b + "ffn_down.weight");
      return;
    }
    if (!moe) {
      L.ffn_gate = req(b + "ffn_gate.weight");
      L.ffn_up = req(b + "ffn_up.weight");
      L.ffn_down = req(b + "ffn_down.weight");
      return;
    }
    L.router = req(b + "ffn_gate_inp.weight");
    L.router_logit_bias =
        s.arch == Arch::kGptOss ? req(b + "ffn_gate_inp.bias") : opt(b + "ffn_gate_inp.bias");
    L.router_bias = s.arch == Arch::kGlm4Moe || s.arch == Arch::kMinimaxM2
                        ? req(b + "exp_probs_b.bias")
                        : opt(b + "exp_probs_b.bias");
    L.experts.resize(static_cast<size_t>(s.n_expert));
    if (has(b + "ffn_gate_exps.weight")) {
      const WeightView g = req(b + "ffn_gate_exps.weight");
      const WeightView u = req(b + "ffn_up_exps.weight");
      const WeightView d = req(b + "ffn_down_exps.weight");
      // Per-expert biases (gpt-oss): [width, n_expert], expert e's the e-th row.
      auto bias = [&](const char* n) { return s.arch == Arch::kGptOss ? req(b + n) : opt(b + n); };
      const WeightView gb = bias("ffn_gate_exps.bias"), ub = bias("ffn_up_exps.bias"),
                       db = bias("ffn_down_exps.bias");
      for (const WeightView* x : {&gb, &ub, &db})
        if (x->present() && (x->type != GgmlType::kF32 || x->ne[1] != s.n_expert || x->ne[2] != 1))
          TROUPE_INPUT_ERROR("%s: tensor '%s' must be f32 [width, %lld experts]", g_.path().c_str(),
                             x->name.c_str(), static_cast<long long>(s.n_expert));
      for (int64_t e = 0; e < s.n_expert; ++e) {
        if (g.ne[2] != s.n_expert || u.ne[2] != s.n_expert || d.ne[2] != s.n_expert)
          TROUPE_INPUT_ERROR("%s: %sffn_*_exps has %lld experts, expected %lld", g_.path().c_str(),
                             b.c_str(), static_cast<long long>(g.ne[2]),
                             static_cast<long long>(s.n_expert));
        auto& E = L.experts[static_cast<size_t>(e)];
        E.gate = g.slice(e);
        E.up = u.slice(e);
        E.down = d.slice(e);
        if (gb.present()) E.gate_b = gb.row_range(e, 1, gb.name + strfmt("[%lld]", ll(e)));
        if (ub.present()) E.up_b = ub.row_range(e, 1, ub.name + strfmt("[%lld]", ll(e)));
        if (db.present()) E.down_b = db.row_range(e, 1, db.name + strfmt("[%lld]", ll(e)));
      }
    } else {  // older per-expert layout: blk.N.ffn_gate.E.weight
      for (int64_t e = 0; e < s.n_expert; ++e) {
        auto& E = L.experts[static_cast<size_t>(e)];
        const std::string es = strfmt(".%lld.weight", static_cast<long long>(e));
        E.gate = req(b + "ffn_gate" + es);
        E.up = req(b + "ffn_up" + es);
        E.down = req(b + "ffn_down" + es);
      }
    }
    if (s.arch == Arch::kLlama4 || hybrid || has(b + "ffn_gate_shexp.weight")) {
      L.shared.gate = req(b + "ffn_gate_shexp.weight");  // Llama 4 and Qwen3-Next need it
      L.shared.up = req(b + "ffn_up_shexp.weight");
      L.shared.down = req(b + "ffn_down_shexp.weight");
      L.shared_gate =
          hybrid ? req(b + "ffn_gate_inp_shexp.weight") : opt(b + "ffn_gate_inp_shexp.weight");
    }
  }

  // attn_qkv [n_embd, q + k + v rows] → views of its q, k and v rows (and of attn_qkv.bias).
  // With attn_gate, q's rows are twice as many (each head's query, then its gate).
  void split_qkv(const ModelSpec& s, const std::string& b, LayerSpec& L) const {
    const int64_t q = (L.attn_gate ? 2 : 1) * s.n_head * s.head_dim_k,
                  k = s.n_head_kv * s.head_dim_k, v = s.n_head_kv * s.head_dim_v;
    const WeightView w = req(b + "attn_qkv.weight");
    if (w.ne[1] != q + k + v || w.ne[2] != 1)
      TROUPE_INPUT_ERROR(
          "%s: tensor '%sattn_qkv.weight' has %lld rows, expected %lld (q %lld + "
          "k %lld + v %lld)",
          g_.path().c_str(), b.c_str(), static_cast<long long>(w.ne[1]),
          static_cast<long long>(q + k + v), static_cast<long long>(q), static_cast<long long>(k),
          static_cast<long long>(v));
    L.wq = w.row_range(0, q, b + "attn_qkv.weight[q]");
    L.wk = w.row_range(q, k, b + "attn_qkv.weight[k]");
    L.wv = w.row_range(q + k, v, b + "attn_qkv.weight[v]");
    const WeightView bias = opt(b + "attn_qkv.bias");
    if (!bias.present()) return;
    if (bias.type != GgmlType::kF32 || bias.ne[0] != q + k + v || bias.ne[1] != 1)
      TROUPE_INPUT_ERROR("%s: tensor '%sattn_qkv.bias' must be f32 [%lld]", g_.path().c_str(),
                         b.c_str(), static_cast<long long>(q + k + v));
    // A bias is one row: its parts are column ranges.
    auto part = [&](int64_t c0, int64_t n, const char* what) {
      WeightView p = bias;
      p.name = b + "attn_qkv.bias[" + what + "]";
      p.ne[0] = n;
      p.data = bias.data + c0 * static_cast<int64_t>(sizeof(float));
      return p;
    };
    L.bq = part(0, q, "q");
    L.bk = part(q, k, "k");
    L.bv = part(q + k, v, "v");
  }

  static long long ll(int64_t v) { return static_cast<long long>(v); }

  const GgufFile& g_;
  int64_t window_ = 0;           // gpt-oss's, Gemma 3's and Phi-3's sliding window
  bool phi3_ = false;            // GGUF arch phi3 (Arch::kLlama with Phi-3's layout)
  bool ernie_ = false;           // GGUF arch ernie4_5 or ernie4_5-moe (Arch::kLlama)
  std::vector<bool> idx_full_;   // glm-dsa: per layer, whether it runs its own indexer
  int64_t moe_step_ = 1;         // Llama 4, ERNIE 4.5: every moe_step_-th layer has experts
  std::vector<bool> recurrent_;  // Qwen3-Next, Qwen3.5: per layer, linear attention
};

[[noreturn]] void bad_shape(const std::string& src, const WeightView& w, int64_t c, int64_t r,
                            int64_t n) {
  TROUPE_INPUT_ERROR("%s: tensor '%s' has shape [%lld, %lld, %lld], expected [%lld, %lld, %lld]",
                     src.c_str(), w.name.c_str(), static_cast<long long>(w.ne[0]),
                     static_cast<long long>(w.ne[1]), static_cast<long long>(w.ne[2]),
                     static_cast<long long>(c), static_cast<long long>(r),
                     static_cast<long long>(n));
}

void expect(const std::string& src, const WeightView& w, int64_t cols, int64_t rows,
            int64_t n = 1) {
  if (!w.present())
    TROUPE_INPUT_ERROR("%s: missing a tensor of shape [%lld, %lld]", src.c_str(),
                       static_cast<long long>(cols), static_cast<long long>(rows));
  if (w.ne[0] != cols || w.ne[1] != rows || w.ne[2] != n) bad_shape(src, w, cols, rows, n);
  auto tr = type_traits(static_cast<uint32_t>(w.type));
  if (!tr || !tr->supported)
    TROUPE_INPUT_ERROR("%s: tensor '%s' has type %s, which troupe cannot compute with yet",
                       src.c_str(), w.name.c_str(), type_name(w.type).c_str());
}

void expect_opt(const std::string& src, const WeightView& w, int64_t cols, int64_t rows) {
  if (w.present()) expect(src, w, cols, rows);
}

}  // namespace

void apply_v2_gate_weights(ModelSpec& s) {
  if (s.norm_topk && s.n_expert_used > 1) {
    s.routed_scale = 1.f;
  } else {
    s.norm_topk = false;
  }
}

namespace {

// DeepSeek-V4's hyper-connections and attention (ModelSpec::is_v4).
void validate_v4_layer(const ModelSpec& s, const LayerSpec& L, const std::string& src) {
  const int64_t E = s.n_embd, hc = s.hc_mult, mix = (2 + hc) * hc, D = s.head_dim_k;
  for (const WeightView* fn : {&L.hc_attn_fn, &L.hc_ffn_fn}) expect(src, *fn, hc * E, mix);
  for (const WeightView* b : {&L.hc_attn_base, &L.hc_ffn_base}) expect(src, *b, mix, 1);
  for (const WeightView* sc : {&L.hc_attn_scale, &L.hc_ffn_scale}) expect(src, *sc, 3, 1);
  expect(src, L.wq_a, E, s.q_lora_rank);
  expect(src, L.q_a_norm, s.q_lora_rank, 1);
  expect(src, L.wq_b, s.q_lora_rank, s.n_head * D);
  expect(src, L.wkv_a, E, D);
  expect(src, L.kv_a_norm, D, 1);
  expect(src, L.wo_a, s.n_head * D / s.o_groups, s.o_lora_rank, s.o_groups);
  expect(src, L.wo, s.o_groups * s.o_lora_rank, E);
  expect(src, L.sinks, s.n_head, 1);
  if (L.window <= 0 || L.compress < 0 || (L.compress_overlap && L.compress == 0))
    TROUPE_INPUT_ERROR(
        "%s: a DeepSeek-V4 layer needs a positive window and a compression rate "
        "(got %lld, %lld)",
        src.c_str(), static_cast<long long>(L.window), static_cast<long long>(L.compress));
  if (L.compress > 0) {
    const int64_t coff = L.compress_overlap ? 2 : 1;
    expect(src, L.cmp_kv, E, coff * D);
    expect(src, L.cmp_gate, E, coff * D);
    expect(src, L.cmp_ape, coff * D, L.compress);
    expect(src, L.cmp_norm, D, 1);
  }
  if (L.compress_overlap) {
    const int64_t Di = s.idx_head_dim;
    expect(src, L.idx_wq_b, s.q_lora_rank, s.idx_n_head * Di);
    expect(src, L.idx_proj, E, s.idx_n_head);
    expect(src, L.idx_cmp_kv, E, 2 * Di);
    expect(src, L.idx_cmp_gate, E, 2 * Di);
    expect(src, L.idx_cmp_ape, 2 * Di, L.compress);
    expect(src, L.idx_cmp_norm, Di, 1);
  }
  if (L.hash_experts.present() &&
      (L.hash_experts.type != GgmlType::kI32 || L.hash_experts.cols() != s.n_expert_used ||
       L.hash_experts.rows() != s.n_vocab))
    TROUPE_INPUT_ERROR("%s: %s must be I32 [%lld, %lld]", src.c_str(), L.hash_experts.name.c_str(),
                       static_cast<long long>(s.n_vocab), static_cast<long long>(s.n_expert_used));
}

}  // namespace

void validate_spec(const ModelSpec& s, const std::string& src) {
  const int64_t E = s.n_embd;
  if (s.n_vocab <= 0) TROUPE_INPUT_ERROR("%s: empty vocabulary", src.c_str());
  if (s.n_rot <= 0 || s.n_rot % 2 != 0 || s.n_rot > s.head_dim_k)
    TROUPE_INPUT_ERROR("%s: rope dimension %lld must be even and at most the head size %lld",
                       src.c_str(), static_cast<long long>(s.n_rot),
                       static_cast<long long>(s.head_dim_k));
  if (!(s.rms_eps > 0) || !(s.rope_theta > 0))
    TROUPE_INPUT_ERROR("%s: rms epsilon and rope base must be positive", src.c_str());
  validate_rope_scaling(s, src);
  expect(src, s.token_embd, E, s.n_vocab);
  expect(src, s.output_norm, E, 1);
  expect(src, s.output, E, s.n_vocab);
  if (s.is_v4()) {
    if (s.hc_mult < 1 || s.o_groups < 1 || s.o_lora_rank < 1 || s.q_lora_rank < 1 ||
        s.n_head_kv != 1 || s.head_dim_k != s.head_dim_v || (s.n_head * s.head_dim_k) % s.o_groups)
      TROUPE_INPUT_ERROR(
          "%s: bad DeepSeek-V4 sizes (hc %lld, %lld output groups of %lld, q_lora "
          "%lld, %lld KV heads)",
          src.c_str(), static_cast<long long>(s.hc_mult), static_cast<long long>(s.o_groups),
          static_cast<long long>(s.o_lora_rank), static_cast<long long>(s.q_lora_rank),
          static_cast<long long>(s.n_head_kv));
    expect(src, s.hc_head_fn, s.hc_mult * E, s.hc_mult);
    expect(src, s.hc_head_base, s.hc_mult, 1);
    expect(src, s.hc_head_scale, 1, 1);
  }
  if (s.n_expert > 0) {
    if (s.n_expert_used <= 0 || s.n_expert_used > s.n_expert)
      TROUPE_INPUT_ERROR("%s: expert_used_count %lld must be in 1..expert_count %lld", src.c_str(),
                         static_cast<long long>(s.n_expert_used),
                         static_cast<long long>(s.n_expert));
    if (s.n_group <= 0 || s.n_expert % s.n_group != 0 || s.n_group_used <= 0 ||
        s.n_group_used > s.n_group)
      TROUPE_INPUT_ERROR("%s: bad expert groups (%lld groups, %lld used, %lld experts)",
                         src.c_str(), static_cast<long long>(s.n_group),
                         static_cast<long long>(s.n_group_used),
                         static_cast<long long>(s.n_expert));
    if (s.n_group > 1 && s.group_score == GroupScore::kTopTwoSum && s.n_expert / s.n_group < 2)
      TROUPE_INPUT_ERROR("%s: group-limited routing needs at least 2 experts per group",
                         src.c_str());
    if (s.n_group_used < s.n_group && s.n_expert_used > s.n_group_used * (s.n_expert / s.n_group))
      TROUPE_INPUT_ERROR("%s: %lld experts per token, but the %lld kept groups hold only %lld",
                         src.c_str(), static_cast<long long>(s.n_expert_used),
                         static_cast<long long>(s.n_group_used),
                         static_cast<long long>(s.n_group_used * (s.n_expert / s.n_group)));
  }
  if (s.attn_temp_scale != 0.0f && (!std::isfinite(s.attn_temp_scale) || s.attn_temp_floor <= 0))
    TROUPE_INPUT_ERROR("%s: attention temperature scale %g needs a positive floor (got %lld)",
                       src.c_str(), static_cast<double>(s.attn_temp_scale),
                       static_cast<long long>(s.attn_temp_floor));
  if (s.has_indexer() &&
      (!(s.is_mla() || s.is_v4()) || s.q_lora_rank <= 0 || s.idx_n_head <= 0 ||
       s.idx_head_dim < s.n_rot || s.idx_head_dim > 65536 || s.idx_n_head > 65536))
    TROUPE_INPUT_ERROR(
        "%s: the sparse-attention indexer needs MLA with a compressed q, heads and a head width "
        "of at least the rotary %lld (got %lld heads of %lld, q_lora %lld)",
        src.c_str(), static_cast<long long>(s.n_rot), static_cast<long long>(s.idx_n_head),
        static_cast<long long>(s.idx_head_dim), static_cast<long long>(s.q_lora_rank));
  for (size_t il = 0; il < s.layers.size(); ++il)
    if (s.layers[il].idx_shared && (!s.has_indexer() || il == 0))
      TROUPE_INPUT_ERROR("%s: layer %zu reuses an earlier indexer's choice, but %s", src.c_str(),
                         il, il == 0 ? "it is the first layer" : "the model has no indexer");
  if (static_cast<int64_t>(s.layers.size()) != s.n_layer)
    TROUPE_INPUT_ERROR("%s: %zu layers, expected %lld", src.c_str(), s.layers.size(),
                       static_cast<long long>(s.n_layer));
  if (s.has_recurrent_layers() &&
      (!s.has_recurrent() || s.ssm_k_heads <= 0 || s.ssm_k_dim <= 0 || s.ssm_v_dim <= 0 ||
       s.ssm_conv_kernel <= 0 || s.ssm_v_heads % s.ssm_k_heads != 0))
    TROUPE_INPUT_ERROR(
        "%s: bad linear-attention sizes (%lld key heads of %lld, %lld value heads of %lld, "
        "kernel %lld)",
        src.c_str(), static_cast<long long>(s.ssm_k_heads), static_cast<long long>(s.ssm_k_dim),
        static_cast<long long>(s.ssm_v_heads), static_cast<long long>(s.ssm_v_dim),
        static_cast<long long>(s.ssm_conv_kernel));
  for (const LayerSpec& L : s.layers) {
    expect(src, L.attn_norm, E, 1);
    if (L.recurrent) {
      const int64_t nv = s.ssm_v_heads, vw = nv * s.ssm_v_dim, conv = s.ssm_conv_dim();
      if (L.ssm_in.present()) {
        expect(src, L.ssm_in, E, conv + vw);
      } else {
        expect(src, L.ssm_qkv, E, conv);
        expect(src, L.ssm_z, E, vw);
      }
      if (L.ssm_beta.present()) {
        expect(src, L.ssm_beta, E, nv);
        expect(src, L.ssm_alpha, E, nv);
      } else {
        expect(src, L.ssm_ba, E, 2 * nv);
      }
      expect(src, L.ssm_conv, s.ssm_conv_kernel, conv);
      expect(src, L.ssm_dt, nv, 1);
      expect(src, L.ssm_a, nv, 1);
      expect(src, L.ssm_norm, s.ssm_v_dim, 1);
      expect(src, L.wo, vw, E);
    } else if (s.is_v4()) {
      validate_v4_layer(s, L, src);
    } else if (s.is_mla()) {
      const int64_t qk = s.qk_nope_dim + s.qk_rope_dim;
      if (L.wq_a.present()) {
        expect(src, L.wq_a, E, s.q_lora_rank);
        expect(src, L.q_a_norm, s.q_lora_rank, 1);
        expect(src, L.wq_b, s.q_lora_rank, s.n_head * qk);
      } else {
        expect(src, L.wq, E, s.n_head * qk);
      }
      expect(src, L.wkv_a, E, s.kv_lora_rank + s.qk_rope_dim);
      expect(src, L.kv_a_norm, s.kv_lora_rank, 1);
      expect(src, L.wk_b, s.qk_nope_dim, s.kv_lora_rank, s.n_head);
      expect(src, L.wv_b, s.kv_lora_rank, s.v_head_dim, s.n_head);
      expect(src, L.wo, s.n_head * s.v_head_dim, E);
      if (s.has_indexer() && !L.idx_shared) {
        expect(src, L.idx_wq_b, s.q_lora_rank, s.idx_n_head * s.idx_head_dim);
        expect(src, L.idx_wk, E, s.idx_head_dim);
        expect(src, L.idx_k_norm, s.idx_head_dim, 1);
        expect(src, L.idx_k_norm_b, s.idx_head_dim, 1);
        expect(src, L.idx_proj, E, s.idx_n_head);
      }
    } else {
      if (L.attn_gate && s.head_dim_k != s.head_dim_v)
        TROUPE_INPUT_ERROR("%s: gated attention needs equal key and value widths (%lld, %lld)",
                           src.c_str(), static_cast<long long>(s.head_dim_k),
                           static_cast<long long>(s.head_dim_v));
      expect(src, L.wq, E, (L.attn_gate ? 2 : 1) * s.n_head * s.head_dim_k);
      expect(src, L.wk, E, s.n_head_kv * s.head_dim_k);
      expect(src, L.wv, E, s.n_head_kv * s.head_dim_v);
      expect(src, L.wo, s.n_head * s.head_dim_v, E);
      expect_opt(src, L.bo, E, 1);
      expect_opt(src, L.sinks, s.n_head, 1);
      expect_opt(src, L.attn_post_norm, E, 1);
      expect_opt(src, L.ffn_post_norm, E, 1);
      if (L.window < 0) TROUPE_INPUT_ERROR("%s: negative sliding window", src.c_str());
      if (L.chunk < 0) TROUPE_INPUT_ERROR("%s: negative attention chunk", src.c_str());
      expect_opt(src, L.bq, s.n_head * s.head_dim_k, 1);
      expect_opt(src, L.bk, s.n_head_kv * s.head_dim_k, 1);
      expect_opt(src, L.bv, s.n_head_kv * s.head_dim_v, 1);
      // Per head, or over all heads at once (MiniMax-M2).
      const bool wide = L.q_norm.present() && L.q_norm.cols() != s.head_dim_k;
      expect_opt(src, L.q_norm, wide ? s.n_head * s.head_dim_k : s.head_dim_k, 1);
      expect_opt(src, L.k_norm, wide ? s.n_head_kv * s.head_dim_k : s.head_dim_k, 1);
    }
    expect(src, L.ffn_norm, E, 1);
    if (!L.is_moe) {
      expect(src, L.ffn_gate, E, s.n_ff);
      expect(src, L.ffn_up, E, s.n_ff);
      expect(src, L.ffn_down, s.n_ff, E);
      continue;
    }
    expect(src, L.router, E, s.n_expert);
    expect_opt(src, L.router_bias, s.n_expert, 1);
    expect_opt(src, L.router_logit_bias, s.n_expert, 1);
    for (const ExpertFfn& X : L.experts) {
      if (X.gate_up.present()) {
        expect(src, X.gate_up, E, 2 * s.n_ff_exp);
      } else {
        expect(src, X.gate, E, s.n_ff_exp);
        expect(src, X.up, E, s.n_ff_exp);
      }
      expect(src, X.down, s.n_ff_exp, E);
      expect_opt(src, X.gate_b, s.n_ff_exp, 1);
      expect_opt(src, X.up_b, s.n_ff_exp, 1);
      expect_opt(src, X.down_b, E, 1);
    }
    if (L.shared.gate.present()) {
      const int64_t f = L.shared.gate.rows();
      expect(src, L.shared.gate, E, f);
      expect(src, L.shared.up, E, f);
      expect(src, L.shared.down, f, E);
      expect_opt(src, L.shared_gate, E, 1);
    }
  }
}

ModelSpec spec_from_gguf(const GgufFile& g) {
  GgufSpecBuilder b(g);
  ModelSpec s = b.build();
  validate_spec(s, g.path());
  return s;
}

void dequantize_view_row(const WeightView& w, int64_t r, float* out) {
  dequantize_view_row(w, r, w.row(r), out);
}

void dequantize_view_row(const WeightView& w, int64_t r, const uint8_t* row, float* out) {
  if (!w.scaled()) {
    dequantize_row(w.type, row, out, w.cols());
    return;
  }
  TROUPE_CHECK(w.scales != nullptr && w.scale_block[0] > 0 && w.scale_block[1] > 0,
               "%s: %s view without its scales", w.name.c_str(), type_name(w.type).c_str());
  thread_local std::vector<float> sc;
  sc.resize(static_cast<size_t>(w.scale_stride));
  scales_to_f32(w.row_scales(r), w.scale_type, w.scale_stride, sc.data(), w.scale_mul, w.scale_div);
  dequantize_scaled_row(w.type, row, sc.data(), w.scale_block[1], w.cols(), out);
}

}  // namespace troupe::model
