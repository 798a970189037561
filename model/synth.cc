// Synthetic model generation: the tensor plan in llama.cpp's naming and order, seeded weights
// (splitmix64 per row, so any thread count gives the same bytes). Option defaults and checks per
// architecture are in detail/synth_config.cc, the built-in byte-level vocabulary in synth_vocab.cc.
#include "model/synth.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <thread>

#include "base/check.h"
#include "model/detail/synth_config.h"
#include "model/detail/synth_deepseek4.h"
#include "model/detail/synth_random.h"
#include "model/gguf.h"
#include "model/gguf_writer.h"
#include "model/rope.h"

namespace troupe::model {

std::optional<GgmlType> parse_synth_dtype(const std::string& s) {
  if (s == "f32") return GgmlType::kF32;
  if (s == "f16") return GgmlType::kF16;
  if (s == "bf16") return GgmlType::kBF16;
  if (s == "q8_0") return GgmlType::kQ8_0;
  if (s == "q4_0") return GgmlType::kQ4_0;
  if (s == "q4_1") return GgmlType::kQ4_1;
  if (s == "q5_0") return GgmlType::kQ5_0;
  if (s == "q5_1") return GgmlType::kQ5_1;
  if (s == "iq4_nl") return GgmlType::kIQ4_NL;
  if (s == "iq4_xs") return GgmlType::kIQ4_XS;
  if (s == "mxfp4") return GgmlType::kMXFP4;
  if (s == "q2_k" || s == "q2_K") return GgmlType::kQ2_K;
  if (s == "q3_k" || s == "q3_K") return GgmlType::kQ3_K;
  if (s == "q4_k" || s == "q4_K") return GgmlType::kQ4_K;
  if (s == "q5_k" || s == "q5_K") return GgmlType::kQ5_K;
  if (s == "q6_k" || s == "q6_K") return GgmlType::kQ6_K;
  return std::nullopt;
}

bool parse_synth_dtype(const std::string& s, SynthOptions* o) {
  const bool mix4 = s == "q4_k_m" || s == "q4_K_M", mix5 = s == "q5_k_m" || s == "q5_K_M";
  const bool mix = mix4 || mix5;
  const std::optional<GgmlType> t =
      mix4 ? GgmlType::kQ4_K : (mix5 ? GgmlType::kQ5_K : parse_synth_dtype(s));
  if (!t) return false;
  o->dtype = *t;
  o->k_mix = mix;
  return true;
}

namespace {

using Config = detail::SynthConfig;
using detail::hash_name;
using detail::normalish;
using detail::splitmix64;
using detail::SynthArch;

// ---------------------------------------------------------------------------------------------
// The tensor plan.

enum class Init : uint8_t { kNormal, kNorm, kEmbedding };

struct PlannedTensor {
  std::string name;
  std::vector<int64_t> shape;
  GgmlType type;
  Init init;
  float std_dev;
  const std::vector<bool>* quiet_rows = nullptr;  // rows drawn with kQuietScale * std_dev
  std::vector<float> values = {};  // not empty: the tensor's exact contents (f32, one row)
};

// Output rows of control and unused tokens are drawn this much smaller, so that random-weight
// generation rarely picks <|eos|> or a reserved token and runs on with text tokens.
constexpr float kQuietScale = 0.05f;

class Planner {
 public:
  Planner(GgmlType dtype, bool k_mix, std::vector<std::string>* notes)
      : dtype_(dtype), k_mix_(k_mix), notes_(notes) {}

  // A matrix (2-D or stacked 3-D) in the requested type. Rows that do not fit its blocks take
  // the 32-value type llama.cpp's quantizer puts in its place (model files of widths off the
  // 256-value super-block, e.g. 896, hold these), else f16.
  void matrix(std::string name, std::vector<int64_t> shape) {
    GgmlType t = k_mix_ && mixed_up(name) ? GgmlType::kQ6_K : dtype_;
    if (shape[0] % block_elems(t) != 0) {
      const GgmlType want = t;
      t = shape[0] % block_elems(fallback_of(t)) == 0 ? fallback_of(t) : GgmlType::kF16;
      note_fallback(name, shape[0], want, t);
    }
    const float sd = 1.f / std::sqrt(static_cast<float>(shape[0]));
    tensors_.push_back({std::move(name), std::move(shape), t, Init::kNormal, sd});
  }
  void embedding(std::string name, std::vector<int64_t> shape) {
    matrix(std::move(name), std::move(shape));
    tensors_.back().init = Init::kEmbedding;
    tensors_.back().std_dev = 1.f;
  }
  // f32 weights: norms (~1), biases and routers (normal with the given spread).
  void norm(std::string name, int64_t n) {
    tensors_.push_back({std::move(name), {n}, GgmlType::kF32, Init::kNorm, 0.05f});
  }
  void f32(std::string name, std::vector<int64_t> shape, float sd) {
    tensors_.push_back({std::move(name), std::move(shape), GgmlType::kF32, Init::kNormal, sd});
  }
  // An f32 vector of given values.
  void values(std::string name, std::vector<float> v) {
    const auto n = static_cast<int64_t>(v.size());
    tensors_.push_back({std::move(name), {n}, GgmlType::kF32, Init::kNormal, 0.f});
    tensors_.back().values = std::move(v);
  }
  PlannedTensor& last() { return tensors_.back(); }
  std::vector<PlannedTensor> take() { return std::move(tensors_); }

 private:
  static int64_t block_elems(GgmlType t) {
    return type_traits(static_cast<uint32_t>(t))->block_elems;
  }
  // What llama.cpp's quantizer writes for a 256-value type whose rows do not fit it.
  static GgmlType fallback_of(GgmlType t) {
    switch (t) {
      case GgmlType::kQ2_K:
      case GgmlType::kQ3_K:
      case GgmlType::kIQ4_XS:
        return GgmlType::kIQ4_NL;
      case GgmlType::kQ4_K:
        return GgmlType::kQ5_0;
      case GgmlType::kQ5_K:
        return GgmlType::kQ5_1;
      case GgmlType::kQ6_K:
        return GgmlType::kQ8_0;
      default:
        return GgmlType::kF16;
    }
  }
  void note_fallback(const std::string& name, int64_t row, GgmlType want, GgmlType got) {
    // One note per tensor kind: "blk.3.attn_k_b.weight" -> "attn_k_b.weight".
    std::string kind = name;
    if (kind.rfind("blk.", 0) == 0) kind = kind.substr(kind.find('.', 4) + 1);
    auto it = std::find(kinds_.begin(), kinds_.end(), kind);
    if (it != kinds_.end()) return;
    kinds_.push_back(kind);
    notes_->push_back(
        strfmt("%s: row of %lld is not a multiple of the %s block (%lld): stored as %s",
               kind.c_str(), static_cast<long long>(row), type_name(want).c_str(),
               static_cast<long long>(block_elems(want)), type_name(got).c_str()));
  }
  // Which matrices a K-quant mix keeps in Q6_K (SynthOptions::k_mix).
  static bool mixed_up(const std::string& name) {
    if (name == "output.weight") return true;
    int layer = -1;
    if (std::sscanf(name.c_str(), "blk.%d.", &layer) != 1 || layer % 2 != 0) return false;
    return name.find(".attn_v.") != std::string::npos ||
           name.find(".ffn_down.") != std::string::npos ||
           name.find(".ffn_down_exps.") != std::string::npos;
  }
  GgmlType dtype_;
  bool k_mix_;
  std::vector<std::string>* notes_;
  std::vector<std::string> kinds_;
  std::vector<PlannedTensor> tensors_;
};

void plan_moe_experts(Planner& p, const std::string& b, int64_t e, int64_t f, int64_t x) {
  p.matrix(b + "ffn_gate_exps.weight", {e, f, x});
  p.matrix(b + "ffn_up_exps.weight", {e, f, x});
  p.matrix(b + "ffn_down_exps.weight", {f, e, x});
}

void plan_dense_ffn(Planner& p, const std::string& b, int64_t e, int64_t f,
                    const std::string& suffix = "") {
  p.matrix(b + "ffn_gate" + suffix + ".weight", {e, f});
  p.matrix(b + "ffn_up" + suffix + ".weight", {e, f});
  p.matrix(b + "ffn_down" + suffix + ".weight", {f, e});
}

// A Gated DeltaNet layer (Qwen3-Next) as llama.cpp's converter writes it: q, k and v of every
// head in one matrix, the output gate z in another, b and a interleaved per key head, the
// convolution f32, the decay rates as -exp(A_log), the gated norm's weight as stored.
// Qwen3.5's: b and a as two matrices (and every value head in tiled order, which random
// weights do not show).
void plan_linear_attention(Planner& p, const std::string& b, const Config& c) {
  const int64_t e = c.n_embd, kw = c.lin_k_heads * c.lin_dim, vw = c.lin_v_heads * c.lin_dim;
  p.matrix(b + "attn_qkv.weight", {e, 2 * kw + vw});
  p.matrix(b + "attn_gate.weight", {e, vw});
  if (c.arch == SynthArch::kQwen3Next) {
    p.matrix(b + "ssm_ba.weight", {e, 2 * c.lin_v_heads});
  } else {
    p.matrix(b + "ssm_beta.weight", {e, c.lin_v_heads});
    p.matrix(b + "ssm_alpha.weight", {e, c.lin_v_heads});
  }
  p.f32(b + "ssm_conv1d.weight", {4, 2 * kw + vw}, 0.5f);
  p.f32(b + "ssm_dt.bias", {c.lin_v_heads}, 0.5f);
  // A_log of 0.1 ... 1.6 (transformers draws it from log U(1, 16)): slow and fast decay.
  std::vector<float> a(static_cast<size_t>(c.lin_v_heads));
  for (size_t h = 0; h < a.size(); ++h)
    a[h] = -std::exp(0.1f + 1.5f * static_cast<float>(h) / static_cast<float>(a.size()));
  p.values(b + "ssm_a", std::move(a));
  p.norm(b + "ssm_norm.weight", c.lin_dim);
  p.matrix(b + "ssm_out.weight", {vw, e});
}

// The extra tensors of a multi-token-prediction layer (GLM's "nextn" block, llama.cpp names):
// troupe never runs them, but real files carry them.
void plan_nextn(Planner& p, const std::string& b, int64_t e) {
  p.matrix(b + "nextn.eh_proj.weight", {2 * e, e});
  p.norm(b + "nextn.enorm.weight", e);
  p.norm(b + "nextn.hnorm.weight", e);
  p.norm(b + "nextn.shared_head_norm.weight", e);
}

std::vector<PlannedTensor> plan_tensors(const Config& c, int64_t n_vocab, GgmlType dtype,
                                        bool k_mix, const std::vector<bool>* quiet_rows,
                                        std::vector<std::string>* notes) {
  Planner p(dtype, k_mix, notes);
  const int64_t e = c.n_embd;
  const float router_sd = 1.f / std::sqrt(static_cast<float>(e));
  p.embedding("token_embd.weight", {e, n_vocab});
  p.norm("output_norm.weight", e);
  const bool gemma = c.arch == SynthArch::kGemma3;
  const bool ernie = c.arch == SynthArch::kErnie45 || c.arch == SynthArch::kErnie45Moe;
  if (!gemma && !ernie) {  // Gemma and ERNIE (0.3B, 21B-A3B) tie their heads to the embedding
    p.matrix("output.weight", {e, n_vocab});
    p.last().quiet_rows = quiet_rows;
  }
  const bool llama4 = c.arch == SynthArch::kLlama4;
  // Llama 4 Scout's llama3 rope scaling, as llama.cpp's converter stores it: one divisor per
  // rotary pair.
  if (llama4)
    p.values("rope_freqs.weight",
             llama3_freq_factors(c.rope_dim, c.rope_theta, 16.0, 1.0, 1.0, 8192));
  const bool phi3 = c.arch == SynthArch::kPhi3;
  if (phi3) {  // LongRoPE's divisors per rotary pair, short ones near 1, long ones larger
    std::vector<float> shrt, lng;
    for (int64_t i = 0; i < c.rope_dim / 2; ++i) {
      shrt.push_back(1.f + 0.05f * static_cast<float>(i));
      lng.push_back(1.f + 1.5f * static_cast<float>(i));
    }
    p.values("rope_factors_long.weight", lng);
    p.values("rope_factors_short.weight", shrt);
  }
  for (int64_t il = 0; il < c.n_layer + c.n_nextn; ++il) {
    const std::string b = "blk." + std::to_string(il) + ".";
    p.norm(b + "attn_norm.weight", e);
    const bool qwen3next = c.arch == SynthArch::kQwen3Next || c.arch == SynthArch::kQwen35Moe ||
                           c.arch == SynthArch::kQwen35;
    if (qwen3next && (il + 1) % c.full_every != 0) {
      plan_linear_attention(p, b, c);
    } else if (c.arch == SynthArch::kDeepseek2) {
      const int64_t qk = c.nope_dim + c.rope_dim;
      if (c.q_lora > 0) {
        p.matrix(b + "attn_q_a.weight", {e, c.q_lora});
        p.norm(b + "attn_q_a_norm.weight", c.q_lora);
        p.matrix(b + "attn_q_b.weight", {c.q_lora, c.n_head * qk});
      } else {
        p.matrix(b + "attn_q.weight", {e, c.n_head * qk});
      }
      p.matrix(b + "attn_kv_a_mqa.weight", {e, c.kv_lora + c.rope_dim});
      p.norm(b + "attn_kv_a_norm.weight", c.kv_lora);
      p.matrix(b + "attn_k_b.weight", {c.nope_dim, c.kv_lora, c.n_head});
      p.matrix(b + "attn_v_b.weight", {c.kv_lora, c.v_dim, c.n_head});
      p.matrix(b + "attn_output.weight", {c.n_head * c.v_dim, e});
      if (c.index_top_k > 0 && !synth_indexer_shared(c, il)) {  // the lightning indexer
        p.matrix(b + "indexer.attn_q_b.weight", {c.q_lora, c.index_heads * c.index_dim});
        p.matrix(b + "indexer.attn_k.weight", {e, c.index_dim});
        p.norm(b + "indexer.k_norm.weight", c.index_dim);
        p.f32(b + "indexer.k_norm.bias", {c.index_dim}, 0.05f);
        p.f32(b + "indexer.proj.weight", {e, c.index_heads}, router_sd);
      }
    } else {
      const int64_t q = c.n_head * c.head_dim, kv = c.n_head_kv * c.head_dim;
      if (c.arch == SynthArch::kBailingMoe2 || phi3) {  // one fused matrix: q, k, v rows
        p.matrix(b + "attn_qkv.weight", {e, q + 2 * kv});
      } else {
        // Qwen3-Next: each head's query rows, then its output gate's.
        p.matrix(b + "attn_q.weight", {e, qwen3next ? 2 * q : q});
        p.matrix(b + "attn_k.weight", {e, kv});
        p.matrix(b + "attn_v.weight", {e, kv});
      }
      if (c.arch == SynthArch::kQwen2Moe || c.arch == SynthArch::kQwen2 ||
          c.arch == SynthArch::kGlm4Moe || c.arch == SynthArch::kGptOss) {
        p.f32(b + "attn_q.bias", {q}, 0.02f);
        p.f32(b + "attn_k.bias", {kv}, 0.02f);
        p.f32(b + "attn_v.bias", {kv}, 0.02f);
      }
      p.matrix(b + "attn_output.weight", {q, e});
      if (c.arch == SynthArch::kGptOss) {
        p.f32(b + "attn_output.bias", {e}, 0.02f);
        p.f32(b + "attn_sinks.weight", {c.n_head}, 1.0f);
      }
      if (c.arch == SynthArch::kQwen3Moe || c.arch == SynthArch::kQwen3 ||
          c.arch == SynthArch::kGlm4Moe || c.arch == SynthArch::kBailingMoe2 || gemma ||
          qwen3next) {
        p.norm(b + "attn_q_norm.weight", c.head_dim);
        p.norm(b + "attn_k_norm.weight", c.head_dim);
      } else if (c.arch == SynthArch::kMinimaxM2) {  // over all heads at once
        p.norm(b + "attn_q_norm.weight", q);
        p.norm(b + "attn_k_norm.weight", kv);
      }
    }
    // GLM's and gpt-oss's converters name the norm before the FFN after HF's
    // post_attention_layernorm.
    const bool post = c.arch == SynthArch::kGlm4Moe || c.arch == SynthArch::kGptOss || qwen3next;
    if (gemma) p.norm(b + "post_attention_norm.weight", e);  // of the attention's output
    p.norm(b + (post ? "post_attention_norm.weight" : "ffn_norm.weight"), e);
    if (il >= c.n_layer) plan_nextn(p, b, e);
    const bool dense = c.n_expert == 0 || il < c.n_dense_lead || (il + 1) % c.moe_step != 0;
    if (dense && phi3) {  // ffn_up: the gate's rows, then up's
      p.matrix(b + "ffn_up.weight", {e, 2 * c.n_ff});
      p.matrix(b + "ffn_down.weight", {c.n_ff, e});
      continue;
    }
    if (dense) {
      plan_dense_ffn(p, b, e, c.n_ff);
      if (gemma) p.norm(b + "post_ffw_norm.weight", e);
      continue;
    }
    // Routers stay f32, as llama.cpp's quantizer leaves them.
    p.f32(b + "ffn_gate_inp.weight", {e, c.n_expert}, router_sd);
    if ((c.arch == SynthArch::kDeepseek2 && c.sigmoid) || c.arch == SynthArch::kGlm4Moe ||
        c.arch == SynthArch::kMinimaxM2 || c.arch == SynthArch::kBailingMoe2 || ernie)
      p.f32(b + "exp_probs_b.bias", {c.n_expert}, 0.01f);
    plan_moe_experts(p, b, e, c.n_ff_exp, c.n_expert);
    if (c.arch == SynthArch::kGptOss) {  // biases on the router's logits and on every expert
      p.f32(b + "ffn_gate_inp.bias", {c.n_expert}, 0.5f);
      p.f32(b + "ffn_gate_exps.bias", {c.n_ff_exp, c.n_expert}, 0.1f);
      p.f32(b + "ffn_up_exps.bias", {c.n_ff_exp, c.n_expert}, 0.1f);
      p.f32(b + "ffn_down_exps.bias", {e, c.n_expert}, 0.1f);
    }
    if (c.arch == SynthArch::kQwen2Moe || qwen3next) {
      p.f32(b + "ffn_gate_inp_shexp.weight", {e}, router_sd);
      plan_dense_ffn(p, b, e, c.n_ff_shexp, "_shexp");
    } else if (llama4) {  // one shared expert as wide as a routed one
      plan_dense_ffn(p, b, e, c.n_ff_exp, "_shexp");
    } else if ((c.arch == SynthArch::kDeepseek2 || c.arch == SynthArch::kGlm4Moe ||
                c.arch == SynthArch::kBailingMoe2 || ernie) &&
               c.n_expert_shared > 0) {
      plan_dense_ffn(p, b, e, c.n_ff_exp * c.n_expert_shared, "_shexp");
    }
  }
  return p.take();
}

// ---------------------------------------------------------------------------------------------
// Metadata.

struct VocabInfo {
  int64_t n_vocab = 0;
  std::vector<bool> quiet;  // control or unused tokens
};

// Control (3) and unused (5) entries of a tokenizer.ggml.token_type array.
std::vector<bool> quiet_tokens(const GgufValue* types, int64_t n_vocab) {
  std::vector<bool> q(static_cast<size_t>(n_vocab), false);
  if (!types || types->type != GgufType::kArray || types->elem_type == GgufType::kString) return q;
  for (uint64_t i = 0; i < types->count && i < q.size(); ++i) {
    const int64_t t = types->array_i64(i);
    q[i] = t == 3 || t == 5;
  }
  return q;
}

// Writes the vocabulary keys.
VocabInfo write_vocab(GgufWriter& w, const SynthOptions& o) {
  if (!o.vocab_donor.empty()) {
    auto donor = GgufFile::open(o.vocab_donor);
    if (!donor.has_value()) TROUPE_INPUT_ERROR("--vocab-donor: %s", donor.error().message.c_str());
    const GgufValue* toks = (*donor)->find("tokenizer.ggml.tokens");
    if (!toks || toks->type != GgufType::kArray || toks->elem_type != GgufType::kString ||
        toks->count == 0)
      TROUPE_INPUT_ERROR("--vocab-donor %s has no tokenizer.ggml.tokens string array",
                         o.vocab_donor.c_str());
    const int64_t n = static_cast<int64_t>(toks->count);
    if (o.n_vocab && *o.n_vocab != n)
      TROUPE_INPUT_ERROR("--n-vocab %lld differs from the donor's %lld tokens",
                         static_cast<long long>(*o.n_vocab), static_cast<long long>(n));
    for (const auto& [key, value] : (*donor)->metadata())
      if (key.rfind("tokenizer.", 0) == 0) w.copy_value(key, value);
    return {n, quiet_tokens((*donor)->find("tokenizer.ggml.token_type"), n)};
  }
  if (o.n_vocab && (*o.n_vocab < 258 || *o.n_vocab > (int64_t{1} << 22)))
    TROUPE_INPUT_ERROR("--n-vocab must be between 258 and %lld for the built-in vocabulary",
                       static_cast<long long>(int64_t{1} << 22));
  // Gemma 3 brackets each image with two control tokens (compute/multimodal_prompt.h).
  const BuiltinVocab v = o.arch == "gemma3"
                             ? builtin_vocab(o.n_vocab, {"<start_of_image>", "<end_of_image>"})
                             : builtin_vocab(o.n_vocab);
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", "gpt-2");
  w.set_string_array("tokenizer.ggml.tokens", v.tokens);
  w.set_array_i32("tokenizer.ggml.token_type", v.token_types);
  w.set_string_array("tokenizer.ggml.merges", v.merges);
  w.set_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(v.bos_id));
  w.set_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(v.eos_id));
  w.set_bool("tokenizer.ggml.add_bos_token", true);
  w.set_bool("tokenizer.ggml.add_eos_token", false);
  VocabInfo info{static_cast<int64_t>(v.tokens.size()), {}};
  for (int32_t t : v.token_types) info.quiet.push_back(t == 3 || t == 5);
  return info;
}

// ---------------------------------------------------------------------------------------------
// Weights.

void fill_row(const PlannedTensor& t, uint64_t tensor_seed, int64_t row, float* out) {
  uint64_t s = tensor_seed ^ (static_cast<uint64_t>(row) * 0xd1b54a32d192ed03ull);
  splitmix64(s);
  const int64_t n = t.shape[0];
  const bool quiet = t.quiet_rows && static_cast<size_t>(row) < t.quiet_rows->size() &&
                     (*t.quiet_rows)[static_cast<size_t>(row)];
  const float sd = quiet ? t.std_dev * kQuietScale : t.std_dev;
  if (!t.values.empty()) {
    std::copy(t.values.begin(), t.values.end(), out);
    return;
  }
  switch (t.init) {
    case Init::kNorm:
      for (int64_t j = 0; j < n; ++j) out[j] = 1.f + sd * normalish(splitmix64(s));
      break;
    case Init::kNormal:
    case Init::kEmbedding:
      for (int64_t j = 0; j < n; ++j) out[j] = sd * normalish(splitmix64(s));
      break;
  }
}

// Runs body(begin, end) over [0, n) split across up to `threads` threads.
template <class F>
void parallel_rows(int64_t n, int threads, int64_t min_per_thread, F&& body) {
  const int64_t t =
      std::max<int64_t>(1, std::min<int64_t>(threads, n / std::max<int64_t>(1, min_per_thread)));
  if (t <= 1) {
    body(0, n);
    return;
  }
  std::vector<std::thread> pool;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) {
    pool.emplace_back([&, i] {
      try {
        body(n * i / t, n * (i + 1) / t);
      } catch (...) {
        errors[static_cast<size_t>(i)] = std::current_exception();
      }
    });
  }
  for (auto& th : pool) th.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

std::string display_arch(const Config& c) {
  return c.arch == SynthArch::kMixtral ? "llama (mixtral-style MoE)" : c.gguf_arch;
}

}  // namespace

std::string SynthSummary::line() const {
  auto human = [](double v, const char* const* units) {
    int u = 0;
    while (v >= 1000 && units[u + 1] != nullptr) v /= 1000, ++u;
    return strfmt(u == 0 ? "%.0f%s" : "%.2f %s", v, units[u]);
  };
  static const char* const kCounts[] = {"", "K", "M", "B", "T", nullptr};
  static const char* const kBytes[] = {" B", "kB", "MB", "GB", "TB", nullptr};
  return strfmt("%s %s: %s params, %s, %d tensors, n_vocab %lld, in %.2f s", arch.c_str(),
                dtype.c_str(), human(static_cast<double>(num_params), kCounts).c_str(),
                human(static_cast<double>(num_bytes), kBytes).c_str(), num_tensors,
                static_cast<long long>(n_vocab), seconds);
}

Result<SynthSummary> synth_model_summary(const SynthOptions& opts, const std::string& out_path) {
  if (opts.arch == "deepseek4" && !out_path.empty())
    return detail::synth_deepseek4(opts, out_path);  // a Hugging Face directory
  try {
    const auto t0 = std::chrono::steady_clock::now();
    if (out_path.empty()) TROUPE_INPUT_ERROR("no output path (--out)");
    if (!parse_synth_dtype(std::string(type_name(opts.dtype))))
      TROUPE_INPUT_ERROR(
          "--dtype %s cannot be generated (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, "
          "q3_k, q4_k, q5_k, q6_k, q4_k_m, q5_k_m, iq4_nl, iq4_xs, mxfp4)",
          type_name(opts.dtype).c_str());
    const Config c = detail::resolve_synth_config(opts);
    SynthSummary sum;
    sum.arch = display_arch(c);
    const bool q5 = opts.dtype == GgmlType::kQ5_K;
    if (opts.k_mix && opts.dtype != GgmlType::kQ4_K && !q5)
      TROUPE_INPUT_ERROR("a K-quant mix is made of q4_K or q5_K (--dtype q4_k_m or q5_k_m), not %s",
                         type_name(opts.dtype).c_str());
    sum.dtype = opts.k_mix ? (q5 ? "q5_K_M" : "q4_K_M") : type_name(opts.dtype);

    GgufWriter w;
    w.set_string("general.architecture", c.gguf_arch);
    const VocabInfo vocab = write_vocab(w, opts);
    const int64_t n_vocab = vocab.n_vocab;
    w.set_string("general.name", opts.name.empty() ? "synth-" + opts.arch : opts.name);
    // ggml's file types: 15 is Q4_K_M, 17 Q5_K_M.
    w.set_u32("general.file_type",
              opts.k_mix ? (q5 ? 17 : 15) : detail::synth_file_type(opts.dtype));
    detail::write_synth_hparams(w, c, opts, n_vocab);
    if (!opts.command_line.empty()) w.set_string("general.synth.command", opts.command_line);

    const std::vector<PlannedTensor> plan =
        plan_tensors(c, n_vocab, opts.dtype, opts.k_mix, &vocab.quiet, &sum.notes);
    const int threads = opts.num_threads > 0
                            ? opts.num_threads
                            : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    for (const PlannedTensor& t : plan) {
      int64_t elems = 1;
      for (int64_t d : t.shape) elems *= d;
      sum.num_params += elems;
      const uint64_t tseed = hash_name(t.name) ^ (opts.seed * 0x9e3779b97f4a7c15ull);
      const PlannedTensor* tp = &t;
      TensorFill fill = [tp, tseed, threads](int64_t row0, int64_t rows, uint8_t* dst) {
        const int64_t ne0 = tp->shape[0];
        const int64_t rb = row_bytes(tp->type, ne0);
        parallel_rows(rows, threads, std::max<int64_t>(1, (1 << 16) / ne0),
                      [&](int64_t r_begin, int64_t r_end) {
                        std::vector<float> buf(static_cast<size_t>(ne0));
                        for (int64_t r = r_begin; r < r_end; ++r) {
                          fill_row(*tp, tseed, row0 + r, buf.data());
                          quantize_row(tp->type, buf.data(), dst + r * rb, ne0);
                        }
                      });
      };
      Status st = w.add_tensor(t.name, t.type, t.shape, std::move(fill));
      if (!st.has_value()) TROUPE_INPUT_ERROR("%s", st.error().message.c_str());
    }
    sum.num_tensors = static_cast<int>(plan.size());
    sum.n_vocab = n_vocab;
    Status st = w.write(out_path);
    if (!st.has_value()) return st.error();
    sum.num_bytes = w.file_size();
    sum.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return sum;
  } catch (const std::exception& e) {
    return Error{1, e.what()};
  }
}

Status synth_model(const SynthOptions& opts, const std::string& out_path) {
  auto r = synth_model_summary(opts, out_path);
  if (!r.has_value()) return r.error();
  return Ok{};
}

}  // namespace troupe::model
