// Hugging Face directory → Model: config.json + safetensors (zero-copy views where possible) +
// tokenizer, with the same ModelSpec semantics llama.cpp's GGUF converter would produce.
// Llama/Mixtral q/k rows stay in HF's rotate_half order (RopeStyle::kNeox instead of a
// permutation); DeepSeek kv_b_proj is split into wk_b/wv_b buffers owned by Model::storage.
// FP8 weights (detail/hf_fp8.h: DeepSeek's block-scaled form and compressed-tensors'
// float-quantized one) and compressed-tensors int4 ones (detail/hf_compressed.h) stay views of
// their stored values with their scales; the few the loader rearranges or keeps in f32
// (kv_b_proj, norms, routers) become f32. gpt-oss's MXFP4 experts stay views too
// (detail/hf_mxfp4.h), and NVFP4 weights (ModelOpt's and compressed-tensors', detail/hf_nvfp4.h).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

#include <nlohmann/json.hpp>

#include "base/check.h"
#include "model/detail/hf_compressed.h"
#include "model/detail/hf_config.h"
#include "model/detail/hf_fp8.h"
#include "model/detail/hf_hparams.h"
#include "model/detail/hf_mxfp4.h"
#include "model/detail/hf_nvfp4.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "model/tokenizer.h"

namespace troupe::model {

namespace {

using detail::HfConfig;
using Family = detail::HfFamily;
using detail::read_json_file;
using nlohmann::json;

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  return out + "]";
}

// Builds the ModelSpec; converted tensors go into buffers appended to `storage`.
class HfSpecBuilder {
 public:
  /// `prefix`: where the decoder's tensors are ("model.", or a multimodal checkpoint's
  /// language model's).
  HfSpecBuilder(const SafetensorsSet& st, const HfConfig& cfg,
                std::vector<std::shared_ptr<const void>>& storage, std::string prefix)
      : st_(st), cfg_(cfg), storage_(storage), prefix_(std::move(prefix)) {}

  ModelSpec build() {
    read_hparams();
    if (fam_ == Family::kDeepseekV4) return build_v4();
    ModelSpec& s = s_;
    s.token_embd = take(prefix_ + (fam_ == Family::kBailingMoeV2 ? "word_embeddings.weight"
                                                                 : "embed_tokens.weight"),
                        "token_embd.weight", {s.n_vocab, s.n_embd});
    s.output_norm = take_norm(prefix_ + "norm.weight", "output_norm.weight", {s.n_embd});
    if (tied_) {
      s.output = s.token_embd;
    } else {
      // A multimodal checkpoint of transformers before 4.52 keeps its head beside the decoder.
      const std::string head =
          prefix_ == "language_model.model." ? "language_model.lm_head.weight" : "lm_head.weight";
      if (!st_.find(head) && !detail::is_packed(st_, head))
        TROUPE_INPUT_ERROR("%s: no '%s' and tie_word_embeddings is not true", cfg_.path().c_str(),
                           head.c_str());
      s.output = take(head, "output.weight", {s.n_vocab, s.n_embd});
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
    nvfp4_ = detail::read_modelopt_format(cfg_, dir_of_config());
    if (compressed_.nvfp4) nvfp4_ = detail::Nvfp4Kind::kCompressed;
    detail::HfHparams h = detail::read_hf_hparams(cfg_);
    s_ = std::move(h.spec);
    fam_ = h.family;
    is_moe_ = std::move(h.is_moe);
    attention_bias_ = h.attention_bias;
    qk_norm_ = h.qk_norm;
    router_bias_ = h.router_bias;
    output_bias_ = h.output_bias;
    window_ = std::move(h.window);
    nope_ = std::move(h.nope);
    chunk_ = std::move(h.chunk);
    qk_l2_norm_ = h.qk_l2_norm;
    recurrent_ = std::move(h.recurrent);
    idx_shared_ = std::move(h.idx_shared);
    compress_ = std::move(h.compress);
    compress_overlap_ = std::move(h.compress_overlap);
    hash_moe_ = std::move(h.hash_moe);
    qwen35_ = h.qwen35;
    tied_ = h.tied;
  }

  bool is_mla() const { return s_.arch == Arch::kDeepseek2; }

  // ---- layers ----

  void build_layer(int64_t il, LayerSpec& L) {
    const ModelSpec& s = s_;
    const std::string h = prefix_ + "layers." + std::to_string(il) + ".";
    const std::string g = "blk." + std::to_string(il) + ".";
    const int64_t E = s.n_embd;
    L.attn_norm = take_norm(h + "input_layernorm.weight", g + "attn_norm.weight", {E});
    if (fam_ == Family::kGemma3) {
      // Gemma normalizes the attention's and the FFN's outputs too; post_attention_layernorm
      // is the first of those, not the FFN's input norm.
      L.attn_post_norm =
          take_norm(h + "post_attention_layernorm.weight", g + "post_attention_norm.weight", {E});
      L.ffn_norm = take_norm(h + "pre_feedforward_layernorm.weight", g + "ffn_norm.weight", {E});
      L.ffn_post_norm =
          take_norm(h + "post_feedforward_layernorm.weight", g + "post_ffw_norm.weight", {E});
    } else {
      L.ffn_norm = take_norm(h + "post_attention_layernorm.weight", g + "ffn_norm.weight", {E});
    }
    const std::string a = h + "self_attn.";
    // GLM-5.2: no indexer of its own (build_mla reads none).
    L.idx_shared = !idx_shared_.empty() && idx_shared_[static_cast<size_t>(il)];
    if (!recurrent_.empty() && recurrent_[static_cast<size_t>(il)]) {
      build_linear_attention(h + "linear_attn.", g, L);
    } else if (is_mla()) {
      build_mla(a, g, L);
    } else if (fam_ == Family::kBailingMoeV2) {
      build_fused_attention(h + "attention.", g, L);
    } else if (fam_ == Family::kPhi3) {
      build_phi3_attention(a, g, L);
    } else {
      const int64_t q = s.n_head * s.head_dim_k;
      const int64_t k = s.n_head_kv * s.head_dim_k;
      const int64_t v = s.n_head_kv * s.head_dim_v;
      // Qwen3-Next: each head's q rows, then its output gate's.
      L.attn_gate = fam_ == Family::kQwen3Next;
      L.wq = take(a + "q_proj.weight", g + "attn_q.weight", {L.attn_gate ? 2 * q : q, E});
      L.wk = take(a + "k_proj.weight", g + "attn_k.weight", {k, E});
      L.wv = take(a + "v_proj.weight", g + "attn_v.weight", {v, E});
      L.wo = take(a + "o_proj.weight", g + "attn_output.weight", {E, s.n_head * s.head_dim_v});
      if (attention_bias_) {
        L.bq = take_f32(a + "q_proj.bias", g + "attn_q.bias", {q});
        L.bk = take_f32(a + "k_proj.bias", g + "attn_k.bias", {k});
        L.bv = take_f32(a + "v_proj.bias", g + "attn_v.bias", {v});
      }
      if (output_bias_) L.bo = take_f32(a + "o_proj.bias", g + "attn_output.bias", {E});
      if (fam_ == Family::kGptOss)
        L.sinks = take_f32(a + "sinks", g + "attn_sinks.weight", {s.n_head});
      if (qk_norm_) {  // MiniMax-M2's span all heads at once, the others' one head
        const bool wide = fam_ == Family::kMinimaxM2;
        L.q_norm =
            take_norm(a + "q_norm.weight", g + "attn_q_norm.weight", {wide ? q : s.head_dim_k});
        L.k_norm =
            take_norm(a + "k_norm.weight", g + "attn_k_norm.weight", {wide ? k : s.head_dim_k});
      }
    }
    if (!window_.empty()) L.window = window_[static_cast<size_t>(il)];
    // Gemma 3's window layers rotate with their own base (gpt-oss's with the model's).
    L.local_rope = fam_ == Family::kGemma3 && L.window > 0;
    if (!nope_.empty()) {  // Llama 4
      L.nope = nope_[static_cast<size_t>(il)];
      L.chunk = chunk_[static_cast<size_t>(il)];
      L.qk_l2_norm = qk_l2_norm_ && !L.nope;
    }
    L.is_moe = is_moe_[static_cast<size_t>(il)];
    if (L.is_moe) {
      build_moe(h, g, L);
    } else {
      const std::string m = h + (fam_ == Family::kLlama4 ? "feed_forward." : "mlp.");
      if (s.n_ff <= 0)
        TROUPE_INPUT_ERROR("%s: layer %lld is dense but intermediate_size is missing",
                           cfg_.path().c_str(), static_cast<long long>(il));
      if (fam_ == Family::kPhi3) {
        // gate_up_proj [2 * I, E]: the gate's rows, then up's (views of its rows).
        WeightView w = take(m + "gate_up_proj.weight", g + "ffn_up.weight", {2 * s.n_ff, E});
        if (w.scaled() && s.n_ff % w.scale_block[0] != 0) w = to_f32(w);
        L.ffn_gate = w.row_range(0, s.n_ff, g + "ffn_up.weight[gate]");
        L.ffn_up = w.row_range(s.n_ff, s.n_ff, g + "ffn_up.weight[up]");
      } else {
        L.ffn_gate = take(m + "gate_proj.weight", g + "ffn_gate.weight", {s.n_ff, E});
        L.ffn_up = take(m + "up_proj.weight", g + "ffn_up.weight", {s.n_ff, E});
      }
      L.ffn_down = take(m + "down_proj.weight", g + "ffn_down.weight", {E, s.n_ff});
    }
  }

  /// Qwen3-Next's Gated DeltaNet, as llama.cpp's converter would store it except for the input
  /// projection, read in place in its own layout (in_proj_qkvz: per key head q, k, v, z; the
  /// engine takes it as ssm_in); A_log becomes the decay rate -exp(A_log) in f32. Qwen3.5 keeps
  /// q, k and v (all q heads, all k heads, all v heads), z, b and a in four projections, each
  /// read in place; its value heads stay grouped by key head (llama.cpp's converter tiles them).
  void build_linear_attention(const std::string& a, const std::string& g, LayerSpec& L) {
    const ModelSpec& s = s_;
    const int64_t E = s.n_embd, nv = s.ssm_v_heads, vw = nv * s.ssm_v_dim;
    const int64_t C = s.ssm_conv_dim(), K = s.ssm_conv_kernel;
    L.recurrent = true;
    if (qwen35_) {
      L.ssm_qkv = take(a + "in_proj_qkv.weight", g + "attn_qkv.weight", {C, E});
      L.ssm_z = take(a + "in_proj_z.weight", g + "attn_gate.weight", {vw, E});
      L.ssm_beta = take(a + "in_proj_b.weight", g + "ssm_beta.weight", {nv, E});
      L.ssm_alpha = take(a + "in_proj_a.weight", g + "ssm_alpha.weight", {nv, E});
    } else {
      L.ssm_in = take(a + "in_proj_qkvz.weight", g + "ssm_in.weight", {C + vw, E});
      L.ssm_ba = take(a + "in_proj_ba.weight", g + "ssm_ba.weight", {2 * nv, E});
    }
    L.ssm_conv =
        with_shape(take_f32(a + "conv1d.weight", g + "ssm_conv1d.weight", {C, 1, K}), {C, K});
    L.ssm_dt = take_f32(a + "dt_bias", g + "ssm_dt.bias", {nv});
    const WeightView a_log = take_f32(a + "A_log", g + "ssm_a", {nv});
    auto* rate = reinterpret_cast<float*>(alloc(static_cast<uint64_t>(nv) * sizeof(float)));
    for (int64_t h = 0; h < nv; ++h)
      rate[h] = -std::exp(reinterpret_cast<const float*>(a_log.data)[h]);
    L.ssm_a = make_view(g + "ssm_a", GgmlType::kF32, {nv}, reinterpret_cast<const uint8_t*>(rate));
    L.ssm_norm = take_f32(a + "norm.weight", g + "ssm_norm.weight", {s.ssm_v_dim});
    L.wo = take(a + "out_proj.weight", g + "ssm_out.weight", {E, vw});
  }

  /// The fused matrix `hf_name` [(H + 2 Hkv) * D, E], q, k and v rows in that order, as views of
  /// its rows in L.wq, L.wk and L.wv (blk.N.attn_qkv.weight in GGUF's names: `g` is blk.N.).
  void split_fused_qkv(const std::string& hf_name, const std::string& g, LayerSpec& L) {
    const ModelSpec& s = s_;
    const int64_t q = s.n_head * s.head_dim_k, k = s.n_head_kv * s.head_dim_k,
                  v = s.n_head_kv * s.head_dim_v;
    WeightView w = take(hf_name, g + "attn_qkv.weight", {q + k + v, s.n_embd});
    // Parts that would cut a block of scaled rows become exact f32 (as kv_b_proj).
    if (w.scaled() && (q % w.scale_block[0] != 0 || (q + k) % w.scale_block[0] != 0)) w = to_f32(w);
    L.wq = w.row_range(0, q, g + "attn_qkv.weight[q]");
    L.wk = w.row_range(q, k, g + "attn_qkv.weight[k]");
    L.wv = w.row_range(q + k, v, g + "attn_qkv.weight[v]");
  }

  /// Phi-3's attention: qkv_proj (split_fused_qkv), o_proj the output projection; no biases, no
  /// q/k norms.
  void build_phi3_attention(const std::string& a, const std::string& g, LayerSpec& L) {
    const ModelSpec& s = s_;
    split_fused_qkv(a + "qkv_proj.weight", g, L);
    L.wo = take(a + "o_proj.weight", g + "attn_output.weight", {s.n_embd, s.n_head * s.head_dim_v});
  }

  /// Ling-2.0's attention: query_key_value (split_fused_qkv; its bias, when use_qkv_bias,
  /// converted and split), dense is the output projection, query/key_layernorm the per-head
  /// norms.
  void build_fused_attention(const std::string& a, const std::string& g, LayerSpec& L) {
    const ModelSpec& s = s_;
    const int64_t q = s.n_head * s.head_dim_k, k = s.n_head_kv * s.head_dim_k,
                  v = s.n_head_kv * s.head_dim_v;
    split_fused_qkv(a + "query_key_value.weight", g, L);
    L.wo = take(a + "dense.weight", g + "attn_output.weight", {s.n_embd, q});
    if (attention_bias_) {
      const WeightView b = take_f32(a + "query_key_value.bias", g + "attn_qkv.bias", {q + k + v});
      auto part = [&](int64_t c0, int64_t n) {
        return make_view(b.name, GgmlType::kF32, {n}, b.data + c0 * 4);
      };
      L.bq = part(0, q);
      L.bk = part(q, k);
      L.bv = part(q + k, v);
    }
    if (qk_norm_) {
      L.q_norm = take_f32(a + "query_layernorm.weight", g + "attn_q_norm.weight", {s.head_dim_k});
      L.k_norm = take_f32(a + "key_layernorm.weight", g + "attn_k_norm.weight", {s.head_dim_k});
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
    if (!s.has_indexer() || L.idx_shared) return;
    const std::string x = a + "indexer.", gx = g + "indexer.";
    const int64_t Hi = s.idx_n_head, Di = s.idx_head_dim;
    L.idx_wq_b = take(x + "wq_b.weight", gx + "attn_q_b.weight", {Hi * Di, s.q_lora_rank});
    L.idx_wk = take(x + "wk.weight", gx + "attn_k.weight", {Di, E});
    L.idx_k_norm = take_f32(x + "k_norm.weight", gx + "k_norm.weight", {Di});
    L.idx_k_norm_b = take_f32(x + "k_norm.bias", gx + "k_norm.bias", {Di});
    L.idx_proj = take(x + "weights_proj.weight", gx + "proj.weight", {Hi, E});
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
    if (fam_ == Family::kGptOss) return build_gpt_oss_moe(h + "mlp.", g, L);
    if (fam_ == Family::kLlama4) return build_llama4_moe(h + "feed_forward.", g, L);
    const ModelSpec& s = s_;
    const int64_t E = s.n_embd;
    // Mixtral's names (block_sparse_moe, w1/w3/w2), which MiniMax-M2 keeps.
    const bool mixtral = fam_ == Family::kMixtral || fam_ == Family::kMinimaxM2;
    const std::string m = h + (mixtral ? "block_sparse_moe." : "mlp.");
    L.router = take_f32(m + "gate.weight", g + "ffn_gate_inp.weight", {s.n_expert, E});
    // DeepSeek's selection bias is optional (V2 has none); GLM's router always has one,
    // MiniMax-M2's when use_routing_bias (stored beside the router, not in it), Ling's when
    // moe_router_enable_expert_bias.
    // ERNIE 4.5's, when it has one, sits in moe_statics as [1, N].
    const bool ernie = fam_ == Family::kErnie45;
    const std::string bias = fam_ == Family::kMinimaxM2      ? m + "e_score_correction_bias"
                             : fam_ == Family::kBailingMoeV2 ? m + "gate.expert_bias"
                             : ernie ? m + "moe_statics.e_score_correction_bias"
                                     : m + "gate.e_score_correction_bias";
    const SafetensorsTensor* bias_t = st_.find(bias);
    if (router_bias_ || ((is_mla() || ernie) && bias_t))
      L.router_bias =
          take_f32(bias, g + "exp_probs_b.bias",
                   ernie && bias_t->shape.size() == 2 ? std::vector<int64_t>{1, s.n_expert}
                                                      : std::vector<int64_t>{s.n_expert});
    L.experts.resize(static_cast<size_t>(s.n_expert));
    if (qwen35_ &&
        (st_.find(m + "experts.gate_up_proj") || st_.find(m + "experts.gate_up_proj.weight"))) {
      build_stacked_experts(m + "experts.", g, L);
    } else {
      build_expert_list(m, g, mixtral, L);
    }
    if (s.n_ff_shexp > 0) {
      const std::string x =
          m + (is_mla() || fam_ == Family::kGlm4Moe || fam_ == Family::kBailingMoeV2 || ernie
                   ? "shared_experts."
                   : "shared_expert.");
      const int64_t S = s.n_ff_shexp;
      L.shared.gate = take(x + "gate_proj.weight", g + "ffn_gate_shexp.weight", {S, E});
      L.shared.up = take(x + "up_proj.weight", g + "ffn_up_shexp.weight", {S, E});
      L.shared.down = take(x + "down_proj.weight", g + "ffn_down_shexp.weight", {E, S});
      if (s.arch == Arch::kQwen2Moe || s.arch == Arch::kQwen3Next || s.arch == Arch::kQwen35Moe)
        L.shared_gate =
            take_f32(m + "shared_expert_gate.weight", g + "ffn_gate_inp_shexp.weight", {1, E});
    }
  }

  /// Experts one by one: m + "experts.{e}.{gate,up,down}_proj.weight" (Mixtral's w1, w3, w2).
  void build_expert_list(const std::string& m, const std::string& g, bool mixtral, LayerSpec& L) {
    const int64_t E = s_.n_embd, F = s_.n_ff_exp;
    for (int64_t e = 0; e < s_.n_expert; ++e) {
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
  }

  /// Qwen3.5's stacked experts (transformers' fused form): x + "gate_up_proj" [N, 2F, E], each
  /// expert's gate rows then its up rows, and x + "down_proj" [N, E, F], read in place (each
  /// expert's slice is its [out, in] matrix); with or without a ".weight" suffix.
  void build_stacked_experts(const std::string& x, const std::string& g, LayerSpec& L) {
    const int64_t E = s_.n_embd, F = s_.n_ff_exp, N = s_.n_expert;
    auto named = [&](const std::string& base) { return st_.find(base) ? base : base + ".weight"; };
    const WeightView gate_up =
        take(named(x + "gate_up_proj"), g + "ffn_gate_up_exps.weight", {N, 2 * F, E});
    const WeightView down = take(named(x + "down_proj"), g + "ffn_down_exps.weight", {N, E, F});
    split_stacked_experts(gate_up, down, g, L);
  }

  /// Expert e's gate and up: rows [0, F) and [F, 2F) of gate_up's e-th matrix; its down: down's
  /// e-th. Views, nothing copied.
  void split_stacked_experts(const WeightView& gate_up, const WeightView& down,
                             const std::string& g, LayerSpec& L) {
    const int64_t F = s_.n_ff_exp;
    L.experts.resize(static_cast<size_t>(s_.n_expert));
    for (int64_t e = 0; e < s_.n_expert; ++e) {
      ExpertFfn& X = L.experts[static_cast<size_t>(e)];
      const std::string idx = strfmt("[%lld]", static_cast<long long>(e));
      const WeightView both = gate_up.slice(e);
      X.gate = both.row_range(0, F, g + "ffn_gate_exps.weight" + idx);
      X.up = both.row_range(F, F, g + "ffn_up_exps.weight" + idx);
      X.down = down.slice(e);
    }
  }

  /// gpt-oss: router with a bias over its logits; experts stacked per layer, gate and up in
  /// one matrix with alternating rows, every matrix with a bias. MXFP4 blocks and scales are
  /// read in place; a dequantized checkpoint's [n_expert, in, out] matrices are transposed into
  /// memory (as the rows the kernels read).
  void build_gpt_oss_moe(const std::string& m, const std::string& g, LayerSpec& L) {
    const ModelSpec& s = s_;
    const int64_t E = s.n_embd, F = s.n_ff_exp, N = s.n_expert;
    L.router = take_f32(m + "router.weight", g + "ffn_gate_inp.weight", {N, E});
    L.router_logit_bias = take_f32(m + "router.bias", g + "ffn_gate_inp.bias", {N});
    const std::string x = m + "experts.";
    WeightView gate_up, down;
    if (detail::is_mxfp4(cfg_)) {
      gate_up = detail::mxfp4_stack_view(st_, x + "gate_up_proj", N, 2 * F, E, cfg_.path(),
                                         g + "ffn_gate_up_exps.weight");
      down = detail::mxfp4_stack_view(st_, x + "down_proj", N, E, F, cfg_.path(),
                                      g + "ffn_down_exps.weight");
    } else {
      gate_up = transposed_stack(x + "gate_up_proj", g + "ffn_gate_up_exps.weight", N, E, 2 * F);
      down = transposed_stack(x + "down_proj", g + "ffn_down_exps.weight", N, F, E);
    }
    // Biases: gate_up's [N, 2F] split into gate's (even) and up's (odd) entries.
    const WeightView gub =
        take_f32(x + "gate_up_proj_bias", g + "ffn_gate_up_exps.bias", {N, 2 * F});
    const WeightView db = take_f32(x + "down_proj_bias", g + "ffn_down_exps.bias", {N, E});
    auto* gb = reinterpret_cast<float*>(alloc(static_cast<uint64_t>(N * F) * 4));
    auto* ub = reinterpret_cast<float*>(alloc(static_cast<uint64_t>(N * F) * 4));
    const auto* src = reinterpret_cast<const float*>(gub.data);
    for (int64_t i = 0; i < N * F; ++i) {
      gb[i] = src[2 * i];
      ub[i] = src[2 * i + 1];
    }
    L.experts.resize(static_cast<size_t>(N));
    for (int64_t e = 0; e < N; ++e) {
      ExpertFfn& X = L.experts[static_cast<size_t>(e)];
      const std::string idx = strfmt("[%lld]", static_cast<long long>(e));
      X.gate_up = gate_up.slice(e);
      X.down = down.slice(e);
      X.gate_b = make_view(g + "ffn_gate_exps.bias" + idx, GgmlType::kF32, {F},
                           reinterpret_cast<const uint8_t*>(gb + e * F));
      X.up_b = make_view(g + "ffn_up_exps.bias" + idx, GgmlType::kF32, {F},
                         reinterpret_cast<const uint8_t*>(ub + e * F));
      X.down_b = db.row_range(e, 1, db.name + idx);
    }
  }

  /// Llama 4: a router; experts stacked per layer as x @ W matrices (gate_up_proj [N, E, 2F]:
  /// gate's F outputs, then up's), transposed into memory; one shared expert.
  void build_llama4_moe(const std::string& m, const std::string& g, LayerSpec& L) {
    const ModelSpec& s = s_;
    const int64_t E = s.n_embd, F = s.n_ff_exp, N = s.n_expert;
    L.router = take_f32(m + "router.weight", g + "ffn_gate_inp.weight", {N, E});
    const std::string x = m + "experts.";
    const WeightView gate_up =
        transposed_stack(x + "gate_up_proj", g + "ffn_gate_up_exps.weight", N, E, 2 * F);
    const WeightView down = transposed_stack(x + "down_proj", g + "ffn_down_exps.weight", N, F, E);
    split_stacked_experts(gate_up, down, g, L);
    const std::string sh = m + "shared_expert.";
    L.shared.gate = take(sh + "gate_proj.weight", g + "ffn_gate_shexp.weight", {F, E});
    L.shared.up = take(sh + "up_proj.weight", g + "ffn_up_shexp.weight", {F, E});
    L.shared.down = take(sh + "down_proj.weight", g + "ffn_down_shexp.weight", {E, F});
  }

  /// The stacked [n, in, out] matrices `hf_name` (x @ W per matrix) as n row-major [out, in]
  /// matrices in model-owned memory, in their stored float type.
  WeightView transposed_stack(const std::string& hf_name, const std::string& gguf_name, int64_t n,
                              int64_t in, int64_t out) {
    const SafetensorsTensor& t = find(hf_name, {n, in, out});
    if (t.type == GgmlType::kF8_E4M3)
      TROUPE_INPUT_ERROR(
          "%s: tensor '%s' is F8_E4M3; troupe reads stacked experts (gpt-oss's, Llama 4's) as "
          "F32, F16 or BF16 (gpt-oss's also as MXFP4)",
          t.file->c_str(), hf_name.c_str());
    const auto es = static_cast<size_t>(row_bytes(t.type, 1));
    uint8_t* dst = alloc(static_cast<uint64_t>(n * in * out) * es);
    // In 64 x 64 tiles, so that both sides stay in cache (1.5-1.8x the plain loop's 3 GB/s for
    // bf16 on the 2-core VM).
    constexpr int64_t kTile = 64;
    for (int64_t m = 0; m < n; ++m) {
      const uint8_t* a = t.data + static_cast<size_t>(m * in * out) * es;
      uint8_t* b = dst + static_cast<size_t>(m * in * out) * es;
      for (int64_t r0 = 0; r0 < out; r0 += kTile)
        for (int64_t c0 = 0; c0 < in; c0 += kTile)
          for (int64_t r = r0; r < std::min(out, r0 + kTile); ++r)
            for (int64_t c = c0; c < std::min(in, c0 + kTile); ++c)
              std::memcpy(b + static_cast<size_t>(r * in + c) * es,
                          a + static_cast<size_t>(c * out + r) * es, es);
    }
    return make_view(gguf_name, t.type, {in, out, n}, dst);
  }

  // ---- DeepSeek-V4 ----

  /// DeepSeek-V4 in the names its checkpoints are stored under (DeepSeek's own: embed, head,
  /// layers.N.attn.wq_a, layers.N.ffn.experts.E.w1, hc_attn_fn, ...; transformers renames them
  /// only in memory), with or without a leading "model.".
  ModelSpec build_v4() {
    ModelSpec& s = s_;
    const int64_t E = s.n_embd, hc = s.hc_mult;
    const std::string p = st_.find(prefix_ + "embed.weight") != nullptr ? prefix_ : "";
    s.token_embd = take(p + "embed.weight", "token_embd.weight", {s.n_vocab, E});
    s.output_norm = take_f32(p + "norm.weight", "output_norm.weight", {E});
    s.output = tied_ ? s.token_embd : take(p + "head.weight", "output.weight", {s.n_vocab, E});
    s.hc_head_fn = take_f32(p + "hc_head_fn", "output_hc_fn.weight", {hc, hc * E});
    s.hc_head_base = take_f32(p + "hc_head_base", "output_hc_base.weight", {hc});
    s.hc_head_scale = take_f32(p + "hc_head_scale", "output_hc_scale.weight", {1});
    s.layers.resize(static_cast<size_t>(s.n_layer));
    for (int64_t il = 0; il < s.n_layer; ++il)
      build_v4_layer(p + "layers." + std::to_string(il) + ".", il,
                     s.layers[static_cast<size_t>(il)]);
    return std::move(s_);
  }

  void build_v4_layer(const std::string& h, int64_t il, LayerSpec& L) {
    const ModelSpec& s = s_;
    const int64_t E = s.n_embd, hc = s.hc_mult, mix = (2 + hc) * hc, D = s.head_dim_k;
    const auto i = static_cast<size_t>(il);
    const std::string g = "blk." + std::to_string(il) + ".";
    L.attn_norm = take_f32(h + "attn_norm.weight", g + "attn_norm.weight", {E});
    L.ffn_norm = take_f32(h + "ffn_norm.weight", g + "ffn_norm.weight", {E});
    L.hc_attn_fn = take_f32(h + "hc_attn_fn", g + "hc_attn_fn.weight", {mix, hc * E});
    L.hc_attn_base = take_f32(h + "hc_attn_base", g + "hc_attn_base.weight", {mix});
    L.hc_attn_scale = take_f32(h + "hc_attn_scale", g + "hc_attn_scale.weight", {3});
    L.hc_ffn_fn = take_f32(h + "hc_ffn_fn", g + "hc_ffn_fn.weight", {mix, hc * E});
    L.hc_ffn_base = take_f32(h + "hc_ffn_base", g + "hc_ffn_base.weight", {mix});
    L.hc_ffn_scale = take_f32(h + "hc_ffn_scale", g + "hc_ffn_scale.weight", {3});
    const std::string a = h + "attn.";
    L.wq_a = take(a + "wq_a.weight", g + "attn_q_a.weight", {s.q_lora_rank, E});
    L.q_a_norm = take_f32(a + "q_norm.weight", g + "attn_q_a_norm.weight", {s.q_lora_rank});
    L.wq_b = take(a + "wq_b.weight", g + "attn_q_b.weight", {s.n_head * D, s.q_lora_rank});
    L.wkv_a = take(a + "wkv.weight", g + "attn_kv.weight", {D, E});
    L.kv_a_norm = take_f32(a + "kv_norm.weight", g + "attn_kv_a_norm.weight", {D});
    // wo_a's groups are its consecutive blocks of o_lora_rank rows (a 3-D view); scale blocks
    // that straddle two groups become exact f32 first (as kv_b_proj).
    const int64_t per_group = s.n_head * D / s.o_groups;
    WeightView wo_a = take(a + "wo_a.weight", g + "attn_output_a.weight",
                           {s.o_groups * s.o_lora_rank, per_group});
    if (wo_a.scaled() && s.o_lora_rank % wo_a.scale_block[0] != 0) wo_a = to_f32(wo_a);
    L.wo_a = with_shape(wo_a, {s.o_groups, s.o_lora_rank, per_group});
    L.wo = take(a + "wo_b.weight", g + "attn_output_b.weight", {E, s.o_groups * s.o_lora_rank});
    L.sinks = take_f32(a + "attn_sink", g + "attn_sinks.weight", {s.n_head});
    L.window = window_[i];
    L.compress = compress_[i];
    L.compress_overlap = compress_overlap_[i];
    // Sliding-only layers rotate with rope_theta, unscaled; compressing ones with the model's.
    L.local_rope = L.compress == 0;
    if (L.compress > 0) {
      const int64_t coff = L.compress_overlap ? 2 : 1;
      const std::string c = a + "compressor.", gc = g + "attn_compressor_";
      L.cmp_kv = take(c + "wkv.weight", gc + "kv.weight", {coff * D, E});
      L.cmp_gate = take(c + "wgate.weight", gc + "gate.weight", {coff * D, E});
      L.cmp_ape = take_f32(c + "ape", gc + "ape.weight", {L.compress, coff * D});
      L.cmp_norm = take_f32(c + "norm.weight", gc + "norm.weight", {D});
    }
    if (L.compress_overlap) {
      const int64_t Di = s.idx_head_dim, Hi = s.idx_n_head;
      const std::string x = a + "indexer.", gx = g + "indexer.";
      L.idx_wq_b = take(x + "wq_b.weight", gx + "attn_q_b.weight", {Hi * Di, s.q_lora_rank});
      L.idx_proj = take(x + "weights_proj.weight", gx + "proj.weight", {Hi, E});
      L.idx_cmp_kv = take(x + "compressor.wkv.weight", gx + "compressor_kv.weight", {2 * Di, E});
      L.idx_cmp_gate =
          take(x + "compressor.wgate.weight", gx + "compressor_gate.weight", {2 * Di, E});
      L.idx_cmp_ape =
          take_f32(x + "compressor.ape", gx + "compressor_ape.weight", {L.compress, 2 * Di});
      L.idx_cmp_norm = take_f32(x + "compressor.norm.weight", gx + "compressor_norm.weight", {Di});
    }
    // The experts: every layer's.
    const std::string m = h + "ffn.";
    const int64_t N = s.n_expert;
    L.is_moe = true;
    L.router = take_f32(m + "gate.weight", g + "ffn_gate_inp.weight", {N, E});
    if (hash_moe_[i]) {
      L.hash_experts = take_expert_ids(m + "gate.tid2eid", g + "ffn_gate_tid2eid.weight");
    } else {
      L.router_bias = take_f32(m + "gate.bias", g + "exp_probs_b.bias", {N});
    }
    L.experts.resize(static_cast<size_t>(N));
    const int64_t E2 = s.n_embd, F = s.n_ff_exp;
    for (int64_t e = 0; e < N; ++e) {
      const std::string x = m + "experts." + std::to_string(e) + ".";
      const std::string idx = strfmt("[%lld]", static_cast<long long>(e));
      ExpertFfn& X = L.experts[static_cast<size_t>(e)];
      X.gate = take_v4(x + "w1.weight", g + "ffn_gate_exps.weight" + idx, F, E2);
      X.up = take_v4(x + "w3.weight", g + "ffn_up_exps.weight" + idx, F, E2);
      X.down = take_v4(x + "w2.weight", g + "ffn_down_exps.weight" + idx, E2, F);
    }
    if (s.n_ff_shexp > 0) {
      const std::string x = m + "shared_experts.";
      const int64_t S = s.n_ff_shexp;
      L.shared.gate = take_v4(x + "w1.weight", g + "ffn_gate_shexp.weight", S, E);
      L.shared.up = take_v4(x + "w3.weight", g + "ffn_up_shexp.weight", S, E);
      L.shared.down = take_v4(x + "w2.weight", g + "ffn_down_shexp.weight", E, S);
    }
  }

  /// A [rows, cols] matrix of a DeepSeek-V4 FFN: as take(), or DeepSeek's FP4 form (its routed
  /// experts as released: "expert_dtype": "fp4"), read in place as a kFP4_PACKED view: "X.weight"
  /// I8 (or F4, or U8) [rows, cols / 2], two E2M1 codes to a byte, the lower nibble first, and
  /// "X.scale" F8_E8M0 [rows, cols / 32], a power of two per 32 values of a row.
  WeightView take_v4(const std::string& hf_name, const std::string& gguf_name, int64_t rows,
                     int64_t cols) {
    const SafetensorsTensor* t = st_.find(hf_name);
    if (t == nullptr || (t->dtype != "I8" && t->dtype != "U8" && t->dtype != "F4"))
      return take(hf_name, gguf_name, {rows, cols});
    const std::string sname = hf_name.substr(0, hf_name.size() - 7) + ".scale";
    const SafetensorsTensor* sc = st_.find(sname);
    const std::vector<int64_t> want = {rows, cols / 2}, want_s = {rows, cols / 32};
    const std::string got_s = sc == nullptr ? "missing" : sc->dtype + " " + sc->shape_string();
    if (cols % 32 != 0 || t->shape != want || sc == nullptr || sc->dtype != "F8_E8M0" ||
        sc->shape != want_s)
      TROUPE_INPUT_ERROR(
          "%s: '%s' is %s %s: as packed FP4 it must be [%lld, %lld] beside "
          "F8_E8M0 scales '%s' [%lld, %lld] (%s)",
          t->file->c_str(), hf_name.c_str(), t->dtype.c_str(), t->shape_string().c_str(),
          static_cast<long long>(rows), static_cast<long long>(cols / 2), sname.c_str(),
          static_cast<long long>(rows), static_cast<long long>(cols / 32), got_s.c_str());
    return WeightView::grouped(gguf_name, GgmlType::kFP4_PACKED, rows, cols, 1, t->data, sc->data,
                               GgmlType::kE8M0, 32);
  }

  /// A hash layer's token-to-experts table [n_vocab, n_expert_used] as I32 (stored as I32 or
  /// I64), every id checked to name an expert.
  WeightView take_expert_ids(const std::string& hf_name, const std::string& gguf_name) {
    const ModelSpec& s = s_;
    const SafetensorsTensor* t = st_.find(hf_name);
    if (!t) TROUPE_INPUT_ERROR("%s: missing tensor '%s'", dir_of_config().c_str(), hf_name.c_str());
    const std::vector<int64_t> shape = {s.n_vocab, s.n_expert_used};
    if ((t->dtype != "I32" && t->dtype != "I64") || t->shape != shape)
      TROUPE_INPUT_ERROR(
          "%s: tensor '%s' is %s %s; expected I32 or I64 %s (n_vocab x "
          "num_experts_per_tok)",
          t->file->c_str(), hf_name.c_str(), t->dtype.c_str(), t->shape_string().c_str(),
          shape_str(shape).c_str());
    const int64_t n = s.n_vocab * s.n_expert_used;
    auto* ids = reinterpret_cast<int32_t*>(alloc(static_cast<uint64_t>(n) * 4));
    const bool wide = t->dtype == "I64";
    for (int64_t j = 0; j < n; ++j) {
      int64_t v;
      if (wide) {
        std::memcpy(&v, t->data + j * 8, 8);
      } else {
        int32_t v32;
        std::memcpy(&v32, t->data + j * 4, 4);
        v = v32;
      }
      if (v < 0 || v >= s.n_expert)
        TROUPE_INPUT_ERROR("%s: tensor '%s' routes token %lld to expert %lld, outside 0..%lld",
                           t->file->c_str(), hf_name.c_str(),
                           static_cast<long long>(j / s.n_expert_used), static_cast<long long>(v),
                           static_cast<long long>(s.n_expert - 1));
      ids[j] = static_cast<int32_t>(v);
    }
    return make_view(gguf_name, GgmlType::kI32, {s.n_expert_used, s.n_vocab},
                     reinterpret_cast<const uint8_t*>(ids));
  }

  // ---- tensors ----

  /// The tensor `hf_name`, which must have exactly `shape` and a supported dtype.
  const SafetensorsTensor& find(const std::string& hf_name, const std::vector<int64_t>& shape) {
    const SafetensorsTensor* t = st_.find(hf_name);
    if (!t) TROUPE_INPUT_ERROR("%s: missing tensor '%s'", dir_of_config().c_str(), hf_name.c_str());
    // The dtype first: a packed tensor's shape is not the matrix's.
    if (!t->supported)
      TROUPE_INPUT_ERROR(
          "%s: tensor '%s' has dtype %s; troupe reads F32, F16, BF16, F8_E4M3 "
          "(block-scaled fp8), packed int4 (compressed-tensors) and U8 NVFP4 (declared by "
          "ModelOpt or compressed-tensors)",
          t->file->c_str(), hf_name.c_str(), t->dtype.c_str());
    if (t->shape != shape)
      TROUPE_INPUT_ERROR("%s: tensor '%s' has shape %s, expected %s from config.json",
                         t->file->c_str(), hf_name.c_str(), t->shape_string().c_str(),
                         shape_str(shape).c_str());
    return *t;
  }

  /// Whether `hf_name` is stored as NVFP4 (ModelOpt's U8 weight, or compressed-tensors' U8
  /// packed one).
  bool is_nvfp4(const std::string& hf_name) const {
    if (nvfp4_ == detail::Nvfp4Kind::kModelOpt) {
      const SafetensorsTensor* t = st_.find(hf_name);
      return t != nullptr && t->dtype == "U8";
    }
    return st_.find(hf_name) == nullptr && detail::is_packed_nvfp4(st_, hf_name, compressed_);
  }

  /// A view straight into the mapping (a copy only when the data is misaligned for its type).
  WeightView take(const std::string& hf_name, const std::string& gguf_name,
                  const std::vector<int64_t>& shape) {
    if (is_nvfp4(hf_name)) return detail::nvfp4_view(st_, hf_name, shape, nvfp4_, gguf_name);
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
    if (is_nvfp4(hf_name) || (st_.find(hf_name) == nullptr && detail::is_packed(st_, hf_name)))
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

  /// An RMSNorm weight as f32: as stored, or for Gemma and Qwen3-Next 1 + the stored value
  /// (their norms multiply by 1 + w; llama.cpp's converter adds the 1 likewise).
  WeightView take_norm(const std::string& hf_name, const std::string& gguf_name,
                       const std::vector<int64_t>& shape) {
    WeightView v = take_f32(hf_name, gguf_name, shape);
    if (fam_ != Family::kGemma3 && fam_ != Family::kQwen3Next) return v;
    const auto n = static_cast<size_t>(v.ne[0] * v.ne[1] * v.ne[2]);
    auto* out = reinterpret_cast<float*>(alloc(n * sizeof(float)));
    const auto* in = reinterpret_cast<const float*>(v.data);
    for (size_t i = 0; i < n; ++i) out[i] = 1.0f + in[i];
    v.data = reinterpret_cast<const uint8_t*>(out);
    return v;
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
  const std::string prefix_;
  Family fam_ = Family::kLlama;
  bool attention_bias_ = false, qk_norm_ = false, router_bias_ = false, output_bias_ = false;
  std::vector<int64_t> window_;    // per layer (gpt-oss, Gemma 3)
  std::vector<bool> nope_;         // per layer (Llama 4)
  std::vector<int64_t> chunk_;     // per layer (Llama 4)
  bool qk_l2_norm_ = false;        // Llama 4
  std::vector<bool> recurrent_;    // per layer (Qwen3-Next)
  std::vector<bool> idx_shared_;   // per layer: no indexer of its own (GLM-5.2)
  std::vector<int64_t> compress_;  // per layer (DeepSeek-V4)
  std::vector<bool> compress_overlap_, hash_moe_;
  bool qwen35_ = false;  // Qwen3.5's names for the linear layers' projections
  bool tied_ = false;
  detail::Fp8Format fp8_;
  detail::CompressedFormat compressed_;  // compressed-tensors (its FP8 scheme, if any, in fp8_)
  detail::Nvfp4Kind nvfp4_ = detail::Nvfp4Kind::kNone;  // ModelOpt's or compressed-tensors
  ModelSpec s_;
  std::vector<bool> is_moe_;
};

}  // namespace

Result<std::shared_ptr<const Model>> load_hf_model(const std::string& dir) {
  try {
    const std::string config_path = dir + "/config.json";
    if (!detail::file_exists(config_path))
      return Error{1, dir + ": not a Hugging Face model directory (no config.json)"};
    bool multimodal = false;
    HfConfig cfg(detail::text_decoder_config(read_json_file(config_path), config_path, &multimodal),
                 config_path);

    auto st = SafetensorsSet::open_dir(dir);
    if (!st) return st.error();
    std::shared_ptr<const SafetensorsSet> weights(std::move(*st));
    // A multimodal checkpoint's decoder: "language_model.model." (transformers before 4.52) or
    // "model.language_model." (after); its vision tower is read by load_hf_vision_model.
    std::string prefix = "model.";
    if (multimodal)
      prefix = weights->find("language_model.model.embed_tokens.weight") != nullptr
                   ? "language_model.model."
                   : "model.language_model.";

    auto m = std::make_shared<Model>();
    m->path = dir;
    m->format = "hf";
    m->storage.push_back(weights);
    HfSpecBuilder builder(*weights, cfg, m->storage, prefix);
    m->spec = builder.build();
    validate_spec(m->spec, dir);

    if (detail::file_exists(dir + "/tokenizer.json") ||
        detail::file_exists(dir + "/tokenizer.model") ||
        detail::file_exists(dir + "/tiktoken.model")) {
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
