// Hugging Face directory → Model: config.json + safetensors (zero-copy views where possible) +
// tokenizer, with the same ModelSpec semantics llama.cpp's GGUF converter would produce.
// Llama/Mixtral q/k rows stay in HF's rotate_half order (RopeStyle::kNeox instead of a
// permutation); DeepSeek kv_b_proj is split into wk_b/wv_b buffers owned by Model::storage.
// FP8 weights (detail/hf_fp8.h: DeepSeek's block-scaled form and compressed-tensors'
// float-quantized one) and compressed-tensors int4 ones (detail/hf_compressed.h) stay views of
// their stored values with their scales; the few the loader rearranges or keeps in f32
// (kv_b_proj, norms, routers) become f32.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include <nlohmann/json.hpp>
#include <sys/stat.h>

#include "base/check.h"
#include "model/detail/hf_compressed.h"
#include "model/detail/hf_config.h"
#include "model/detail/hf_fp8.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "model/tokenizer.h"

namespace troupe::model {

namespace {

using detail::HfConfig;
using detail::read_json_file;
using nlohmann::json;

constexpr int64_t kMaxLayers = 4096;

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  return out + "]";
}

enum class Family : uint8_t {
  kLlama,
  kMixtral,
  kQwen2,
  kQwen3,
  kQwen2Moe,
  kQwen3Moe,
  kDeepseekV2,
  kDeepseekV3
};

// Builds the ModelSpec; converted tensors go into buffers appended to `storage`.
class HfSpecBuilder {
 public:
  HfSpecBuilder(const SafetensorsSet& st, const HfConfig& cfg,
                std::vector<std::shared_ptr<const void>>& storage)
      : st_(st), cfg_(cfg), storage_(storage) {}

  ModelSpec build() {
    read_hparams();
    ModelSpec& s = s_;
    s.token_embd = take("model.embed_tokens.weight", "token_embd.weight", {s.n_vocab, s.n_embd});
    s.output_norm = take_f32("model.norm.weight", "output_norm.weight", {s.n_embd});
    if (cfg_.get_bool_or("tie_word_embeddings", false)) {
      s.output = s.token_embd;
    } else {
      if (!st_.find("lm_head.weight") && !detail::is_packed(st_, "lm_head.weight"))
        TROUPE_INPUT_ERROR("%s: no 'lm_head.weight' and tie_word_embeddings is not true",
                           cfg_.path().c_str());
      s.output = take("lm_head.weight", "output.weight", {s.n_vocab, s.n_embd});
    }
    s.layers.resize(static_cast<size_t>(s.n_layer));
    for (int64_t il = 0; il < s.n_layer; ++il) build_layer(il, s.layers[static_cast<size_t>(il)]);
    return std::move(s_);
  }

 private:
  // ---- hyperparameters ----

  void read_hparams() {
    fp8_ = detail::read_fp8_format(cfg_);
    compressed_ = detail::read_compressed_format(cfg_);
    if (compressed_.fp8.on) fp8_ = compressed_.fp8;
    const std::string arch = read_family();
    read_common(arch);
    if (is_mla_family()) {
      read_mla_hparams();
    } else {
      read_attention(arch);
      read_moe_counts();
    }
    detail::apply_hf_rope_scaling(rope_params_, cfg_.path(), is_mla_family(), s_);
    if (s_.n_expert > 0 && (s_.n_expert_used <= 0 || s_.n_ff_exp <= 0))
      TROUPE_INPUT_ERROR("%s: MoE model needs num_experts_per_tok and the expert FFN width",
                         cfg_.path().c_str());
    mark_moe_layers();
  }

  bool is_mla_family() const { return fam_ == Family::kDeepseekV2 || fam_ == Family::kDeepseekV3; }

  /// The class name from "architectures"; sets fam_.
  std::string read_family() {
    const json* archs = cfg_.find("architectures");
    if (!archs || !archs->is_array() || archs->empty() || !(*archs)[0].is_string())
      TROUPE_INPUT_ERROR("%s: missing \"architectures\" (a list of class names)",
                         cfg_.path().c_str());
    const std::string arch = (*archs)[0].get<std::string>();
    if (arch == "LlamaForCausalLM") {
      fam_ = Family::kLlama;
    } else if (arch == "MixtralForCausalLM") {
      fam_ = Family::kMixtral;
    } else if (arch == "Qwen2ForCausalLM") {
      fam_ = Family::kQwen2;
    } else if (arch == "Qwen3ForCausalLM") {
      fam_ = Family::kQwen3;
    } else if (arch == "Qwen2MoeForCausalLM") {
      fam_ = Family::kQwen2Moe;
    } else if (arch == "Qwen3MoeForCausalLM") {
      fam_ = Family::kQwen3Moe;
    } else if (arch == "DeepseekV2ForCausalLM") {
      fam_ = Family::kDeepseekV2;
    } else if (arch == "DeepseekV3ForCausalLM") {
      fam_ = Family::kDeepseekV3;
    } else {
      TROUPE_INPUT_ERROR(
          "%s: architecture '%s' is not supported (troupe reads LlamaForCausalLM, "
          "MixtralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen2MoeForCausalLM, "
          "Qwen3MoeForCausalLM, DeepseekV2ForCausalLM, DeepseekV3ForCausalLM)",
          cfg_.path().c_str(), arch.c_str());
    }
    return arch;
  }

  /// Widths, counts, norm epsilon and RoPE base shared by all families (defaults as the
  /// transformers config classes).
  void read_common(const std::string& arch) {
    ModelSpec& s = s_;
    const bool mixtral = fam_ == Family::kMixtral;
    s.name = cfg_.get_string_or("_name_or_path", cfg_.get_string_or("model_type", arch));

    const std::string act = cfg_.get_string_or("hidden_act", "silu");
    if (act != "silu")
      TROUPE_INPUT_ERROR("%s: hidden_act '%s' is not supported (only silu)", cfg_.path().c_str(),
                         act.c_str());
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
    s.rms_eps = static_cast<float>(cfg_.get_float_or("rms_norm_eps", mixtral ? 1e-5 : 1e-6));
    s.rope_theta = static_cast<float>(read_rope(mixtral ? 1e6 : 10000.0));
    s.n_ff = cfg_.get_int_or("intermediate_size", 0);
    if (cfg_.get_bool_or("mlp_bias", false))
      TROUPE_INPUT_ERROR("%s: mlp_bias is not supported", cfg_.path().c_str());
  }

  /// Standard (non-MLA) attention: head size and RoPE layout.
  void read_attention(const std::string& arch) {
    ModelSpec& s = s_;
    const int64_t head_dim = cfg_.has("head_dim") ? cfg_.get_dim("head_dim") : s.n_embd / s.n_head;
    if (head_dim <= 0) TROUPE_INPUT_ERROR("%s: head size is 0", cfg_.path().c_str());
    s.head_dim_k = s.head_dim_v = head_dim;
    const double partial = cfg_.get_float_or("partial_rotary_factor", 1.0);
    s.n_rot = static_cast<int64_t>(static_cast<double>(head_dim) * partial);
    // HF applies rotate_half to q/k rows as stored; GGUF permutes Llama rows instead.
    s.rope_style = RopeStyle::kNeox;
    // Qwen2 and Qwen2-MoE always have q/k/v biases (their attention_bias key does not exist).
    if (fam_ != Family::kQwen2 && fam_ != Family::kQwen2Moe &&
        cfg_.get_bool_or("attention_bias", false))
      TROUPE_INPUT_ERROR("%s: attention_bias is not supported for %s (no output bias)",
                         cfg_.path().c_str(), arch.c_str());
  }

  /// Expert counts and routing of Llama/Mixtral/Qwen (softmax gating).
  void read_moe_counts() {
    ModelSpec& s = s_;
    switch (fam_) {
      case Family::kLlama:
        s.arch = Arch::kLlama;
        s.n_ff_exp = s.n_ff;  // as the GGUF reader: llama-arch experts have the FFN width
        s.norm_topk = true;
        break;
      case Family::kMixtral:
        s.arch = Arch::kLlama;
        s.n_expert = cfg_.get_dim("num_local_experts");
        s.n_expert_used = cfg_.get_dim("num_experts_per_tok");
        s.n_ff_exp = s.n_ff;
        s.norm_topk = true;  // MixtralSparseMoeBlock always renormalizes the top-k
        break;
      case Family::kQwen2:
      case Family::kQwen3:
        s.arch = fam_ == Family::kQwen2 ? Arch::kQwen2 : Arch::kQwen3;
        // Qwen2's sliding window applies only where use_sliding_window is set (never in the
        // released checkpoints); troupe attends to the whole context.
        if (cfg_.get_bool_or("use_sliding_window", false))
          TROUPE_INPUT_ERROR("%s: use_sliding_window is not supported", cfg_.path().c_str());
        break;
      case Family::kQwen2Moe:
      case Family::kQwen3Moe:
        s.arch = fam_ == Family::kQwen2Moe ? Arch::kQwen2Moe : Arch::kQwen3Moe;
        s.n_expert = cfg_.get_int_or("num_experts", 0);
        s.n_expert_used = cfg_.get_int_or("num_experts_per_tok", 0);
        s.n_ff_exp = cfg_.get_int_or("moe_intermediate_size", 0);
        s.norm_topk = cfg_.get_bool_or("norm_topk_prob", false);
        if (fam_ == Family::kQwen2Moe) {
          s.n_ff_shexp = cfg_.get_int_or("shared_expert_intermediate_size", 0);
          s.n_expert_shared = s.n_ff_shexp > 0 ? 1 : 0;
        }
        break;
      case Family::kDeepseekV2:
      case Family::kDeepseekV3:
        break;  // read_mla_hparams
    }
  }

  /// Which layers are MoE: Qwen decoder_sparse_step / mlp_only_layers; DeepSeek
  /// first_k_dense_replace / moe_layer_freq; Mixtral all.
  void mark_moe_layers() {
    ModelSpec& s = s_;
    is_moe_.assign(static_cast<size_t>(s.n_layer), s.n_expert > 0);
    if (s.n_expert > 0 && (fam_ == Family::kQwen2Moe || fam_ == Family::kQwen3Moe)) {
      const int64_t step = std::max<int64_t>(1, cfg_.get_int_or("decoder_sparse_step", 1));
      std::vector<int64_t> mlp_only;
      if (const json* m = cfg_.find("mlp_only_layers")) {
        if (!m->is_array())
          TROUPE_INPUT_ERROR("%s: 'mlp_only_layers' must be a list", cfg_.path().c_str());
        for (const json& x : *m)
          if (x.is_number_integer()) mlp_only.push_back(x.get<int64_t>());
      }
      for (int64_t il = 0; il < s.n_layer; ++il)
        is_moe_[static_cast<size_t>(il)] =
            (il + 1) % step == 0 &&
            std::find(mlp_only.begin(), mlp_only.end(), il) == mlp_only.end();
    } else if (s.n_expert > 0 && is_mla()) {
      const int64_t freq = std::max<int64_t>(1, cfg_.get_int_or("moe_layer_freq", 1));
      for (int64_t il = 0; il < s.n_layer; ++il)
        is_moe_[static_cast<size_t>(il)] = il >= s.n_leading_dense && il % freq == 0;
    }
    if (!is_mla()) {  // count the leading dense layers (0 for a dense model, as GGUF)
      s.n_leading_dense = 0;
      while (s.n_expert > 0 && s.n_leading_dense < s.n_layer &&
             !is_moe_[static_cast<size_t>(s.n_leading_dense)])
        ++s.n_leading_dense;
    }
  }

  // rope_theta from the classic key or transformers' newer rope_parameters; the scaling
  // parameters are kept for detail::apply_hf_rope_scaling(), which needs the rotary width.
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

  void read_mla_hparams() {
    ModelSpec& s = s_;
    const bool v3 = fam_ == Family::kDeepseekV3;
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

    s.n_expert = cfg_.get_int_or("n_routed_experts", 0);
    s.n_expert_used = cfg_.get_int_or("num_experts_per_tok", 0);
    s.n_ff_exp = cfg_.get_int_or("moe_intermediate_size", 0);
    s.n_expert_shared = cfg_.get_int_or("n_shared_experts", 0);
    s.n_ff_shexp = s.n_ff_exp * s.n_expert_shared;
    s.n_leading_dense = std::min(cfg_.get_int_or("first_k_dense_replace", 0), s.n_layer);
    s.routed_scale = static_cast<float>(cfg_.get_float_or("routed_scaling_factor", 1.0));
    s.norm_topk = cfg_.get_bool_or("norm_topk_prob", v3);
    const std::string scoring = cfg_.get_string_or("scoring_func", v3 ? "sigmoid" : "softmax");
    if (scoring == "sigmoid") {
      s.gating = Gating::kSigmoid;
    } else if (scoring == "softmax") {
      s.gating = Gating::kSoftmax;
    } else {
      TROUPE_INPUT_ERROR("%s: scoring_func '%s' is not supported (softmax, sigmoid)",
                         cfg_.path().c_str(), scoring.c_str());
    }
    const std::string topk_method = cfg_.get_string_or("topk_method", v3 ? "noaux_tc" : "greedy");
    if (topk_method == "greedy") {
      s.n_group = s.n_group_used = 1;  // no group limit, whatever n_group says
    } else {
      s.n_group = std::max<int64_t>(1, cfg_.get_int_or("n_group", 1));
      s.n_group_used = std::max<int64_t>(1, cfg_.get_int_or("topk_group", s.n_group));
    }
  }

  bool is_mla() const { return s_.arch == Arch::kDeepseek2; }

  // ---- layers ----

  void build_layer(int64_t il, LayerSpec& L) {
    const ModelSpec& s = s_;
    const std::string h = "model.layers." + std::to_string(il) + ".";
    const std::string g = "blk." + std::to_string(il) + ".";
    const int64_t E = s.n_embd;
    L.attn_norm = take_f32(h + "input_layernorm.weight", g + "attn_norm.weight", {E});
    L.ffn_norm = take_f32(h + "post_attention_layernorm.weight", g + "ffn_norm.weight", {E});
    const std::string a = h + "self_attn.";
    if (is_mla()) {
      build_mla(a, g, L);
    } else {
      const int64_t q = s.n_head * s.head_dim_k;
      const int64_t k = s.n_head_kv * s.head_dim_k;
      const int64_t v = s.n_head_kv * s.head_dim_v;
      L.wq = take(a + "q_proj.weight", g + "attn_q.weight", {q, E});
      L.wk = take(a + "k_proj.weight", g + "attn_k.weight", {k, E});
      L.wv = take(a + "v_proj.weight", g + "attn_v.weight", {v, E});
      L.wo = take(a + "o_proj.weight", g + "attn_output.weight", {E, s.n_head * s.head_dim_v});
      if (s_.arch == Arch::kQwen2Moe || s_.arch == Arch::kQwen2) {
        L.bq = take_f32(a + "q_proj.bias", g + "attn_q.bias", {q});
        L.bk = take_f32(a + "k_proj.bias", g + "attn_k.bias", {k});
        L.bv = take_f32(a + "v_proj.bias", g + "attn_v.bias", {v});
      }
      if (s_.arch == Arch::kQwen3Moe || s_.arch == Arch::kQwen3) {
        L.q_norm = take_f32(a + "q_norm.weight", g + "attn_q_norm.weight", {s.head_dim_k});
        L.k_norm = take_f32(a + "k_norm.weight", g + "attn_k_norm.weight", {s.head_dim_k});
      }
    }
    L.is_moe = is_moe_[static_cast<size_t>(il)];
    if (L.is_moe) {
      build_moe(h, g, L);
    } else {
      const std::string m = h + "mlp.";
      if (s.n_ff <= 0)
        TROUPE_INPUT_ERROR("%s: layer %lld is dense but intermediate_size is missing",
                           cfg_.path().c_str(), static_cast<long long>(il));
      L.ffn_gate = take(m + "gate_proj.weight", g + "ffn_gate.weight", {s.n_ff, E});
      L.ffn_up = take(m + "up_proj.weight", g + "ffn_up.weight", {s.n_ff, E});
      L.ffn_down = take(m + "down_proj.weight", g + "ffn_down.weight", {E, s.n_ff});
    }
  }

  void build_mla(const std::string& a, const std::string& g, LayerSpec& L) {
    const ModelSpec& s = s_;
    const int64_t E = s.n_embd;
    const int64_t qk = s.qk_nope_dim + s.qk_rope_dim;
    if (s.q_lora_rank > 0) {
      L.wq_a = take(a + "q_a_proj.weight", g + "attn_q_a.weight", {s.q_lora_rank, E});
      L.q_a_norm =
          take_f32(a + "q_a_layernorm.weight", g + "attn_q_a_norm.weight", {s.q_lora_rank});
      L.wq_b = take(a + "q_b_proj.weight", g + "attn_q_b.weight", {s.n_head * qk, s.q_lora_rank});
    } else {
      L.wq = take(a + "q_proj.weight", g + "attn_q.weight", {s.n_head * qk, E});
    }
    L.wkv_a = take(a + "kv_a_proj_with_mqa.weight", g + "attn_kv_a_mqa.weight",
                   {s.kv_lora_rank + s.qk_rope_dim, E});
    L.kv_a_norm =
        take_f32(a + "kv_a_layernorm.weight", g + "attn_kv_a_norm.weight", {s.kv_lora_rank});
    L.wo = take(a + "o_proj.weight", g + "attn_output.weight", {E, s.n_head * s.v_head_dim});
    split_kv_b(a + "kv_b_proj.weight", g, L);
  }

  // kv_b_proj [n_head * (nope + v), kv_lora] → wk_b: per head the nope rows transposed
  // (ggml ne [nope, kv_lora, n_head]); wv_b: per head the v rows (ne [kv_lora, v, n_head]).
  // The exact split llama.cpp's converter makes into attn_k_b / attn_v_b.
  void split_kv_b(const std::string& hf_name, const std::string& g, LayerSpec& L) {
    const ModelSpec& s = s_;
    const int64_t H = s.n_head, nope = s.qk_nope_dim, vd = s.v_head_dim, r = s.kv_lora_rank;
    WeightView w = take(hf_name, g + "attn_kv_b.weight", {H * (nope + vd), r});
    if (w.scaled()) w = to_f32(w);  // per-head transposes would cut the scale blocks
    const GgmlType type = w.type;
    const uint8_t* data = w.data;
    const auto es = static_cast<size_t>(row_bytes(type, 1));
    uint8_t* kb = alloc(static_cast<uint64_t>(H * r * nope) * es);
    uint8_t* vb = alloc(static_cast<uint64_t>(H * vd * r) * es);
    for (int64_t h = 0; h < H; ++h) {
      const uint8_t* head = data + static_cast<size_t>(h * (nope + vd) * r) * es;
      for (int64_t d = 0; d < nope; ++d)
        for (int64_t c = 0; c < r; ++c)
          std::memcpy(kb + static_cast<size_t>((h * r + c) * nope + d) * es,
                      head + static_cast<size_t>(d * r + c) * es, es);
      std::memcpy(vb + static_cast<size_t>(h * vd * r) * es,
                  head + static_cast<size_t>(nope * r) * es, static_cast<size_t>(vd * r) * es);
    }
    L.wk_b = make_view(g + "attn_k_b.weight", type, {nope, r, H}, kb);
    L.wv_b = make_view(g + "attn_v_b.weight", type, {r, vd, H}, vb);
  }

  void build_moe(const std::string& h, const std::string& g, LayerSpec& L) {
    const ModelSpec& s = s_;
    const int64_t E = s.n_embd, F = s.n_ff_exp;
    const bool mixtral = fam_ == Family::kMixtral;
    const std::string m = h + (mixtral ? "block_sparse_moe." : "mlp.");
    L.router = take_f32(m + "gate.weight", g + "ffn_gate_inp.weight", {s.n_expert, E});
    if (is_mla() && st_.find(m + "gate.e_score_correction_bias"))
      L.router_bias =
          take_f32(m + "gate.e_score_correction_bias", g + "exp_probs_b.bias", {s.n_expert});
    L.experts.resize(static_cast<size_t>(s.n_expert));
    for (int64_t e = 0; e < s.n_expert; ++e) {
      const std::string x = m + "experts." + std::to_string(e) + ".";
      const std::string idx = strfmt("[%lld]", static_cast<long long>(e));
      ExpertFfn& X = L.experts[static_cast<size_t>(e)];
      X.gate = take(x + (mixtral ? "w1" : "gate_proj") + ".weight",
                    g + "ffn_gate_exps.weight" + idx, {F, E});
      X.up = take(x + (mixtral ? "w3" : "up_proj") + ".weight", g + "ffn_up_exps.weight" + idx,
                  {F, E});
      X.down = take(x + (mixtral ? "w2" : "down_proj") + ".weight",
                    g + "ffn_down_exps.weight" + idx, {E, F});
    }
    if (s.n_ff_shexp > 0) {
      const std::string x = m + (is_mla() ? "shared_experts." : "shared_expert.");
      const int64_t S = s.n_ff_shexp;
      L.shared.gate = take(x + "gate_proj.weight", g + "ffn_gate_shexp.weight", {S, E});
      L.shared.up = take(x + "up_proj.weight", g + "ffn_up_shexp.weight", {S, E});
      L.shared.down = take(x + "down_proj.weight", g + "ffn_down_shexp.weight", {E, S});
      if (s.arch == Arch::kQwen2Moe)
        L.shared_gate =
            take_f32(m + "shared_expert_gate.weight", g + "ffn_gate_inp_shexp.weight", {1, E});
    }
  }

  // ---- tensors ----

  /// The tensor `hf_name`, which must have exactly `shape` and a supported dtype.
  const SafetensorsTensor& find(const std::string& hf_name, const std::vector<int64_t>& shape) {
    const SafetensorsTensor* t = st_.find(hf_name);
    if (!t) TROUPE_INPUT_ERROR("%s: missing tensor '%s'", dir_of_config().c_str(), hf_name.c_str());
    if (t->shape != shape)
      TROUPE_INPUT_ERROR("%s: tensor '%s' has shape %s, expected %s from config.json",
                         t->file->c_str(), hf_name.c_str(), t->shape_string().c_str(),
                         shape_str(shape).c_str());
    if (!t->supported)
      TROUPE_INPUT_ERROR(
          "%s: tensor '%s' has dtype %s; troupe reads F32, F16, BF16, F8_E4M3 "
          "(block-scaled fp8) and packed int4 (compressed-tensors)",
          t->file->c_str(), hf_name.c_str(), t->dtype.c_str());
    return *t;
  }

  /// A view straight into the mapping (a copy only when the data is misaligned for its type).
  WeightView take(const std::string& hf_name, const std::string& gguf_name,
                  const std::vector<int64_t>& shape) {
    if (st_.find(hf_name) == nullptr && detail::is_packed(st_, hf_name))
      return detail::packed_int4_view(st_, hf_name, shape, compressed_, cfg_.path(), gguf_name);
    const SafetensorsTensor& t = find(hf_name, shape);
    const uint8_t* data = t.data;
    const auto align = static_cast<uintptr_t>(row_bytes(t.type, 1));
    if (reinterpret_cast<uintptr_t>(data) % align != 0) {
      uint8_t* copy = alloc(t.nbytes);
      std::memcpy(copy, data, t.nbytes);
      data = copy;
    }
    WeightView v = make_view(gguf_name, t.type, ggml_shape(shape), data);
    if (t.type == GgmlType::kF8_E4M3)
      detail::attach_fp8_scales(st_, t, fp8_, cfg_.path(), allocator(), v);
    return v;
  }

  /// A scaled view (F8, I4) as f32 values in model-owned memory, each the nearest float to
  /// q * scale as the kernels compute it.
  WeightView to_f32(const WeightView& w) {
    auto* out =
        reinterpret_cast<float*>(alloc(static_cast<uint64_t>(w.rows() * w.cols()) * sizeof(float)));
    for (int64_t r = 0; r < w.rows(); ++r) dequantize_view_row(w, r, out + r * w.cols());
    return make_view(w.name, GgmlType::kF32, {w.cols(), w.rows()},
                     reinterpret_cast<const uint8_t*>(out));
  }

  detail::Allocator allocator() {
    return [this](uint64_t bytes) { return alloc(bytes); };
  }

  /// As take(), converted to F32 when stored otherwise (norms, biases, router: GGUF keeps
  /// these in F32 and the engine reads them as floats).
  WeightView take_f32(const std::string& hf_name, const std::string& gguf_name,
                      const std::vector<int64_t>& shape) {
    if (st_.find(hf_name) == nullptr && detail::is_packed(st_, hf_name))
      return with_shape(to_f32(take(hf_name, gguf_name, shape)), shape);
    const SafetensorsTensor& t = find(hf_name, shape);
    if (t.type == GgmlType::kF32) return take(hf_name, gguf_name, shape);
    if (t.type == GgmlType::kF8_E4M3)
      return with_shape(to_f32(take(hf_name, gguf_name, shape)), shape);
    const auto n = static_cast<size_t>(t.num_elements());
    auto* out = reinterpret_cast<float*>(alloc(n * sizeof(float)));
    for (size_t i = 0; i < n; ++i) {
      uint16_t bits;
      std::memcpy(&bits, t.data + 2 * i, 2);
      out[i] = t.type == GgmlType::kF16 ? fp16_to_fp32(bits) : bf16_to_fp32(bits);
    }
    return make_view(gguf_name, GgmlType::kF32, ggml_shape(shape),
                     reinterpret_cast<const uint8_t*>(out));
  }

  /// v with the ggml shape of `torch_shape` (a 1-D tensor's view is [n] rather than [n, 1]).
  static WeightView with_shape(WeightView v, const std::vector<int64_t>& torch_shape) {
    const std::vector<int64_t> ne = ggml_shape(torch_shape);
    for (size_t i = 0; i < 3; ++i) v.ne[i] = i < ne.size() ? ne[i] : 1;
    return v;
  }

  static std::vector<int64_t> ggml_shape(const std::vector<int64_t>& torch_shape) {
    std::vector<int64_t> ne(torch_shape.rbegin(), torch_shape.rend());
    return ne;
  }

  static WeightView make_view(const std::string& name, GgmlType type,
                              const std::vector<int64_t>& ne, const uint8_t* data) {
    WeightView v;
    v.name = name;
    v.type = type;
    for (size_t i = 0; i < 3; ++i) v.ne[i] = i < ne.size() ? ne[i] : 1;
    v.data = data;
    return v;
  }

  /// A 64-byte aligned buffer owned by the Model.
  uint8_t* alloc(uint64_t bytes) {
    const uint64_t rounded = std::max<uint64_t>(64, (bytes + 63) / 64 * 64);
    void* p = std::aligned_alloc(64, rounded);
    if (!p) throw std::bad_alloc();
    storage_.push_back(std::shared_ptr<const void>(p, std::free));
    return static_cast<uint8_t*>(p);
  }

  std::string dir_of_config() const {
    const std::string& p = cfg_.path();
    const size_t slash = p.rfind('/');
    return slash == std::string::npos ? std::string(".") : p.substr(0, slash);
  }

  const SafetensorsSet& st_;
  const HfConfig& cfg_;
  std::vector<std::shared_ptr<const void>>& storage_;
  Family fam_ = Family::kLlama;
  detail::Fp8Format fp8_;
  detail::CompressedFormat compressed_;  // compressed-tensors (its FP8 scheme, if any, in fp8_)
  json rope_params_ = json::object();    // rope_scaling and rope_parameters, merged
  ModelSpec s_;
  std::vector<bool> is_moe_;
};

}  // namespace

Result<std::shared_ptr<const Model>> load_hf_model(const std::string& dir) {
  try {
    const std::string config_path = dir + "/config.json";
    if (!file_exists(config_path))
      return Error{1, dir + ": not a Hugging Face model directory (no config.json)"};
    HfConfig cfg(read_json_file(config_path), config_path);

    auto st = SafetensorsSet::open_dir(dir);
    if (!st) return st.error();
    std::shared_ptr<const SafetensorsSet> weights(std::move(*st));

    auto m = std::make_shared<Model>();
    m->path = dir;
    m->format = "hf";
    m->storage.push_back(weights);
    HfSpecBuilder builder(*weights, cfg, m->storage);
    m->spec = builder.build();
    validate_spec(m->spec, dir);

    if (file_exists(dir + "/tokenizer.json") || file_exists(dir + "/tokenizer.model") ||
        file_exists(dir + "/tiktoken.model")) {
      auto tok = Tokenizer::from_hf_dir(dir);
      if (!tok) return tok.error();
      m->tokenizer = std::shared_ptr<const Tokenizer>(std::move(*tok));
    }
    m->chat_template = detail::read_hf_chat_template(dir);
    return std::shared_ptr<const Model>(std::move(m));
  } catch (const std::exception& e) {
    return Error{1, e.what()};
  }
}

}  // namespace troupe::model
