// `troupe synth --arch deepseek4`: a deterministic random-weight DeepSeek-V4 checkpoint as a
// Hugging Face directory (model/detail/synth_deepseek4.h), streamed to disk tensor by tensor.
#include "model/detail/synth_deepseek4.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/check.h"
#include "model/detail/synth_random.h"
#include "model/ggml_types.h"

namespace troupe::model::detail {
namespace {

using nlohmann::json;

// One tensor to write: its name, safetensors dtype and shape, and how its values are made.
struct V4Tensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  enum class Fill : uint8_t { kMatrix, kNorm, kPlusMinus, kOnes, kTable } fill = Fill::kMatrix;
  float scale = 1.0f;  // kMatrix: the values' standard deviation; kPlusMinus: their bound
  int64_t count() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  int64_t bytes() const { return count() * (dtype == "F32" || dtype == "I32" ? 4 : 2); }
};

struct Shape {
  int64_t V, E, L, H, D, R, ql, G, ol, N, K, F, S, hc, Hi, Di, top, window;
};

int64_t opt(const std::optional<int64_t>& v, int64_t def) { return v ? *v : def; }

Shape resolve(const SynthOptions& o) {
  // Options of other architectures have no meaning here.
  if (o.n_ff || o.n_ff_shexp || o.n_dense_lead || o.n_group || o.n_group_used || o.moe_layer_step ||
      o.linear_k_heads || o.linear_v_heads || o.linear_head_dim || o.full_attn_interval ||
      o.kv_lora_rank || o.qk_nope_dim || o.v_head_dim || o.gating || o.expert_weights_norm ||
      o.expert_weights_scale || (o.n_head_kv && *o.n_head_kv != 1) || !o.vocab_donor.empty() ||
      o.k_mix)
    TROUPE_INPUT_ERROR(
        "--arch deepseek4 takes --n-embd, --n-layer, --n-head, --head-dim, --n-expert, "
        "--n-expert-used, --n-ff-exp, --n-expert-shared, --q-lora-rank, --qk-rope-dim, "
        "--index-heads, --index-dim, --index-top-k, --sliding-window, --n-vocab, --rope-theta, "
        "--rms-eps, --dtype f32|f16|bf16 and --seed (one key-and-value head, no vocabulary donor)");
  Shape s{};
  s.V = opt(o.n_vocab, 512);
  s.E = opt(o.n_embd, 256);
  s.L = opt(o.n_layer, 4);
  s.H = opt(o.n_head, 8);
  s.D = opt(o.head_dim, 64);
  s.R = opt(o.qk_rope_dim, 16);
  // V4-Flash's proportions: q_lora_rank and o_lora_rank a quarter of hidden_size, 8 heads per
  // output group (64 heads in 8 groups).
  s.ql = opt(o.q_lora_rank, std::max<int64_t>(16, s.E / 4));
  s.G = s.H >= 8 && s.H % 8 == 0 ? s.H / 8 : 1;
  s.ol = std::max<int64_t>(16, s.E / 4);
  s.N = opt(o.n_expert, 8);
  s.K = opt(o.n_expert_used, 2);
  s.F = opt(o.n_ff_exp, s.E / 2);
  s.S = opt(o.n_expert_shared, 1);
  s.hc = 4;
  s.Hi = opt(o.index_heads, 4);
  s.Di = opt(o.index_dim, 32);
  s.top = opt(o.index_top_k, 16);
  s.window = opt(o.sliding_window, 32);
  const bool ok = s.V >= 4 && s.V <= (int64_t{1} << 24) && s.E >= 16 && s.E % 16 == 0 && s.L >= 1 &&
                  s.L <= 1024 && s.H >= 1 && s.D >= 2 && s.R >= 2 && s.R % 2 == 0 && s.R <= s.D &&
                  s.ql >= 1 && s.N >= 1 && s.K >= 1 && s.K <= s.N && s.F >= 1 && s.S >= 0 &&
                  s.Hi >= 1 && s.Di >= s.R && s.top >= 1 && s.window >= 1 && (s.H * s.D) % s.G == 0;
  if (!ok)
    TROUPE_INPUT_ERROR(
        "--arch deepseek4: bad shape (n_embd a multiple of 16, qk_rope_dim even and at most "
        "head_dim and index_dim, 1 <= n_expert_used <= n_expert; got n_embd %lld, head_dim "
        "%lld, qk_rope_dim %lld, index_dim %lld, %lld of %lld experts)",
        static_cast<long long>(s.E), static_cast<long long>(s.D), static_cast<long long>(s.R),
        static_cast<long long>(s.Di), static_cast<long long>(s.K), static_cast<long long>(s.N));
  return s;
}

// DeepseekV4Config's pattern: two heavily compressed layers, then compressed-sparse and heavily
// compressed in turn; as `compress_ratios` (4 and 128).
std::vector<int64_t> ratios(int64_t L) {
  std::vector<int64_t> r;
  for (int64_t il = 0; il < L; ++il) r.push_back(il >= 2 && (il - 2) % 2 == 1 ? 4 : 128);
  return r;
}

json config(const SynthOptions& o, const Shape& s) {
  json c;
  c["architectures"] = {"DeepseekV4ForCausalLM"};
  c["model_type"] = "deepseek_v4";
  c["vocab_size"] = s.V;
  c["hidden_size"] = s.E;
  c["num_hidden_layers"] = s.L;
  c["num_attention_heads"] = s.H;
  c["num_key_value_heads"] = 1;
  c["head_dim"] = s.D;
  c["qk_rope_head_dim"] = s.R;
  c["q_lora_rank"] = s.ql;
  c["o_groups"] = s.G;
  c["o_lora_rank"] = s.ol;
  c["compress_ratios"] = ratios(s.L);
  c["rope_theta"] = o.rope_theta ? static_cast<double>(*o.rope_theta) : 10000.0;
  c["compress_rope_theta"] = 160000.0;
  c["rope_scaling"] = {{"type", "yarn"},
                       {"factor", 16},
                       {"original_max_position_embeddings", 65536},
                       {"beta_fast", 32},
                       {"beta_slow", 1}};
  c["max_position_embeddings"] = std::max<int64_t>(o.n_ctx, 1);
  c["hc_mult"] = s.hc;
  c["hc_sinkhorn_iters"] = 20;
  c["hc_eps"] = 1e-6;
  c["num_hash_layers"] = std::min<int64_t>(3, s.L);
  c["swiglu_limit"] = 10.0;
  c["sliding_window"] = s.window;
  c["index_n_heads"] = s.Hi;
  c["index_head_dim"] = s.Di;
  c["index_topk"] = s.top;
  c["n_routed_experts"] = s.N;
  c["n_shared_experts"] = s.S;
  c["num_experts_per_tok"] = s.K;
  c["moe_intermediate_size"] = s.F;
  c["scoring_func"] = "sqrtsoftplus";
  c["norm_topk_prob"] = true;
  c["routed_scaling_factor"] = 1.5;
  c["rms_norm_eps"] = o.rms_eps ? static_cast<double>(*o.rms_eps) : 1e-6;
  c["tie_word_embeddings"] = false;
  c["hidden_act"] = "silu";
  c["bos_token_id"] = 0;
  c["eos_token_id"] = 1;
  c["synth"] = {{"seed", o.seed}, {"command", o.command_line}};
  return c;
}

std::vector<V4Tensor> plan(const Shape& s, const std::string& mat) {
  using Fill = V4Tensor::Fill;
  std::vector<V4Tensor> t;
  auto m = [&](const std::string& name, int64_t rows, int64_t cols, float gain = 1.0f) {
    t.push_back(
        {name, mat, {rows, cols}, Fill::kMatrix, gain / std::sqrt(static_cast<float>(cols))});
  };
  auto f = [&](const std::string& name, std::vector<int64_t> shape, Fill fill, float scale = 1) {
    t.push_back({name, "F32", std::move(shape), fill, scale});
  };
  const int64_t mix = (2 + s.hc) * s.hc;
  t.push_back({"embed.weight", mat, {s.V, s.E}, Fill::kMatrix, 1.0f});
  const std::vector<int64_t> r = ratios(s.L);
  for (int64_t il = 0; il < s.L; ++il) {
    const std::string p = "layers." + std::to_string(il) + ".";
    f(p + "attn_norm.weight", {s.E}, Fill::kNorm);
    f(p + "ffn_norm.weight", {s.E}, Fill::kNorm);
    for (const char* hc : {"hc_attn_", "hc_ffn_"}) {
      f(p + hc + "fn", {mix, s.hc * s.E}, Fill::kMatrix,
        0.5f / std::sqrt(static_cast<float>(s.hc * s.E)));
      f(p + hc + "base", {mix}, Fill::kPlusMinus, 0.5f);
      f(p + hc + "scale", {3}, Fill::kOnes);
    }
    const std::string a = p + "attn.";
    m(a + "wq_a.weight", s.ql, s.E);
    f(a + "q_norm.weight", {s.ql}, Fill::kNorm);
    m(a + "wq_b.weight", s.H * s.D, s.ql);
    m(a + "wkv.weight", s.D, s.E);
    f(a + "kv_norm.weight", {s.D}, Fill::kNorm);
    m(a + "wo_a.weight", s.G * s.ol, s.H * s.D / s.G);
    m(a + "wo_b.weight", s.E, s.G * s.ol);
    f(a + "attn_sink", {s.H}, Fill::kPlusMinus, 1.0f);
    const int64_t rate = r[static_cast<size_t>(il)], coff = rate == 4 ? 2 : 1;
    m(a + "compressor.wkv.weight", coff * s.D, s.E);
    m(a + "compressor.wgate.weight", coff * s.D, s.E, 2.0f);
    f(a + "compressor.ape", {rate, coff * s.D}, Fill::kPlusMinus, 0.5f);
    f(a + "compressor.norm.weight", {s.D}, Fill::kNorm);
    if (rate == 4) {
      m(a + "indexer.wq_b.weight", s.Hi * s.Di, s.ql);
      m(a + "indexer.weights_proj.weight", s.Hi, s.E);
      m(a + "indexer.compressor.wkv.weight", 2 * s.Di, s.E);
      m(a + "indexer.compressor.wgate.weight", 2 * s.Di, s.E, 2.0f);
      f(a + "indexer.compressor.ape", {rate, 2 * s.Di}, Fill::kPlusMinus, 0.5f);
      f(a + "indexer.compressor.norm.weight", {s.Di}, Fill::kNorm);
    }
    const std::string x = p + "ffn.";
    f(x + "gate.weight", {s.N, s.E}, Fill::kMatrix, 2.0f / std::sqrt(static_cast<float>(s.E)));
    if (il < std::min<int64_t>(3, s.L))
      t.push_back({x + "gate.tid2eid", "I32", {s.V, s.K}, Fill::kTable, 0});
    else
      f(x + "gate.bias", {s.N}, Fill::kPlusMinus, 0.1f);
    for (int64_t e = 0; e < s.N; ++e) {
      const std::string ex = x + "experts." + std::to_string(e) + ".";
      m(ex + "w1.weight", s.F, s.E);
      m(ex + "w3.weight", s.F, s.E);
      m(ex + "w2.weight", s.E, s.F);
    }
    if (s.S > 0) {
      m(x + "shared_experts.w1.weight", s.F * s.S, s.E);
      m(x + "shared_experts.w3.weight", s.F * s.S, s.E);
      m(x + "shared_experts.w2.weight", s.E, s.F * s.S);
    }
  }
  f("norm.weight", {s.E}, Fill::kNorm);
  m("head.weight", s.V, s.E);
  f("hc_head_fn", {s.hc, s.hc * s.E}, Fill::kMatrix,
    0.5f / std::sqrt(static_cast<float>(s.hc * s.E)));
  f("hc_head_base", {s.hc}, Fill::kPlusMinus, 0.5f);
  f("hc_head_scale", {1}, Fill::kOnes);
  return t;
}

// Row r of tensor t (its last dimension's values) into `out` as t.dtype's bytes.
void fill_row(const V4Tensor& t, int64_t r, int64_t cols, uint64_t seed, int64_t n_expert,
              std::vector<uint8_t>& out) {
  uint64_t st = hash_name(t.name) ^ (seed * 0x9e3779b97f4a7c15ull) ^ static_cast<uint64_t>(r);
  std::vector<float> v(static_cast<size_t>(cols));
  for (int64_t c = 0; c < cols; ++c) {
    const uint64_t z = splitmix64(st);
    const float u = static_cast<float>(z >> 40) / static_cast<float>(1 << 24) * 2 - 1;  // [-1,1)
    switch (t.fill) {
      case V4Tensor::Fill::kMatrix:
        v[static_cast<size_t>(c)] = normalish(z) * t.scale;
        break;
      case V4Tensor::Fill::kNorm:
        v[static_cast<size_t>(c)] = 1.0f + 0.2f * u;
        break;
      case V4Tensor::Fill::kPlusMinus:
        v[static_cast<size_t>(c)] = t.scale * u;
        break;
      case V4Tensor::Fill::kOnes:
        v[static_cast<size_t>(c)] = 1.0f;
        break;
      case V4Tensor::Fill::kTable:
        break;
    }
  }
  if (t.fill == V4Tensor::Fill::kTable) {  // cols distinct experts for this token
    std::vector<int32_t> ids;
    while (static_cast<int64_t>(ids.size()) < cols) {
      const auto e = static_cast<int32_t>(splitmix64(st) % static_cast<uint64_t>(n_expert));
      if (std::find(ids.begin(), ids.end(), e) == ids.end()) ids.push_back(e);
    }
    out.resize(static_cast<size_t>(cols) * 4);
    std::memcpy(out.data(), ids.data(), out.size());
    return;
  }
  if (t.dtype == "F32") {
    out.resize(static_cast<size_t>(cols) * 4);
    std::memcpy(out.data(), v.data(), out.size());
    return;
  }
  out.resize(static_cast<size_t>(cols) * 2);
  for (int64_t c = 0; c < cols; ++c) {
    const uint16_t b = t.dtype == "BF16" ? fp32_to_bf16(v[static_cast<size_t>(c)])
                                         : fp32_to_fp16(v[static_cast<size_t>(c)]);
    std::memcpy(out.data() + c * 2, &b, 2);
  }
}

}  // namespace

Result<SynthSummary> synth_deepseek4(const SynthOptions& o, const std::string& out_dir) {
  try {
    const auto t0 = std::chrono::steady_clock::now();
    const Shape s = resolve(o);
    const std::string mat = o.dtype == GgmlType::kF32    ? "F32"
                            : o.dtype == GgmlType::kBF16 ? "BF16"
                            : o.dtype == GgmlType::kF16  ? "F16"
                                                         : "";
    if (mat.empty())
      TROUPE_INPUT_ERROR("--arch deepseek4 writes f32, f16 or bf16 matrices, not %s",
                         type_name(o.dtype).c_str());
    std::error_code ec;
    std::filesystem::create_directories(out_dir, ec);
    if (ec)
      TROUPE_INPUT_ERROR("%s: cannot create the output directory: %s", out_dir.c_str(),
                         ec.message().c_str());
    const std::vector<V4Tensor> tensors = plan(s, mat);
    json header = json::object();
    int64_t at = 0, params = 0;
    for (const V4Tensor& t : tensors) {
      header[t.name] = {
          {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {at, at + t.bytes()}}};
      at += t.bytes();
      params += t.count();
    }
    header["__metadata__"] = {{"format", "pt"}};
    std::string h = header.dump();
    while (h.size() % 8 != 0) h += ' ';
    const std::string path = out_dir + "/model.safetensors";
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out) TROUPE_INPUT_ERROR("%s: cannot write", path.c_str());
    const uint64_t hlen = h.size();
    out.write(reinterpret_cast<const char*>(&hlen), 8);
    out.write(h.data(), static_cast<std::streamsize>(h.size()));
    std::vector<uint8_t> row;
    for (const V4Tensor& t : tensors) {
      const int64_t cols = t.shape.back(), rows = t.count() / cols;
      for (int64_t r = 0; r < rows; ++r) {
        fill_row(t, r, cols, o.seed, s.N, row);
        out.write(reinterpret_cast<const char*>(row.data()),
                  static_cast<std::streamsize>(row.size()));
      }
    }
    out.close();
    if (!out) TROUPE_INPUT_ERROR("%s: write failed", path.c_str());
    std::ofstream cfg(out_dir + "/config.json", std::ios::trunc);
    cfg << config(o, s).dump(2) << "\n";
    if (!cfg) TROUPE_INPUT_ERROR("%s/config.json: write failed", out_dir.c_str());
    SynthSummary sum;
    sum.arch = "deepseek4 (Hugging Face form)";
    sum.dtype = type_name(o.dtype);
    sum.num_params = params;
    sum.num_bytes = 8 + hlen + static_cast<uint64_t>(at);
    sum.n_vocab = s.V;
    sum.num_tensors = static_cast<int>(tensors.size());
    sum.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    sum.notes.push_back("no tokenizer: prompts go in as token ids (--prompt-tokens)");
    return sum;
  } catch (const std::exception& e) {
    return Error{1, e.what()};
  }
}

}  // namespace troupe::model::detail
