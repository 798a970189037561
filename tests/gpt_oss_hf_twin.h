// Test helpers for gpt-oss in Hugging Face form (GptOssForCausalLM), which ../shared has no files
// of: the twin of a synthesized "gpt-oss" GGUF (llama.cpp's conventions), written by reversing
// the names and the repacking llama.cpp's converter applies. Its experts are written either as
// the released checkpoints store them (quantization_config "mxfp4": U8 `*_blocks` holding E2M1
// codes two to a byte, low nibble first, and U8 `*_scales` holding one E8M0 exponent per 32
// values; gate and up rows alternating in one gate_up matrix) or as a dequantized checkpoint
// does (F32 [n_expert, in, out], the product x @ W). Everything else is F32. Header-only; for
// test binaries that link troupe_model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/ggml_types.h"
#include "model/gguf.h"
#include "model/gguf_writer.h"
#include "model/synth.h"
#include "tests/fp8_model.h"
#include "tests/test_support.h"

namespace troupe::testing {

/// The f32 twin of the GGUF at `gguf`, written to `out`: every tensor of another type
/// dequantized (exactly, for MXFP4), the metadata copied.
inline void write_dequantized_gguf(const std::string& gguf, const std::string& out) {
  auto g = model::GgufFile::open(gguf);
  ASSERT_TRUE(g.has_value()) << g.error().message;
  model::GgufWriter w;
  for (const auto& [key, value] : (*g)->metadata()) w.copy_value(key, value);
  std::vector<std::vector<float>> values;  // alive until write(): the writer reads them then
  values.reserve((*g)->tensors().size());
  for (const model::TensorInfo& t : (*g)->tensors()) {
    const std::vector<int64_t> shape(t.ne, t.ne + t.n_dims);
    if (t.type == model::GgmlType::kF32) {
      ASSERT_TRUE(w.add_tensor(t.name, t.type, shape, {t.data, static_cast<size_t>(t.nbytes)}));
      continue;
    }
    std::vector<float>& v = values.emplace_back(t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3]);
    model::dequantize_row(t.type, t.data, v.data(), static_cast<int64_t>(v.size()));
    ASSERT_TRUE(w.add_tensor_f32(t.name, model::GgmlType::kF32, shape, v));
  }
  ASSERT_TRUE(w.write(out).has_value());
}

/// A synthesized gpt-oss GGUF with every matrix in MXFP4 (synth --dtype mxfp4, its defaults
/// otherwise), as `dir`/mxfp4.gguf.
inline std::string synth_gpt_oss_mxfp4(const TempDir& dir, uint64_t seed) {
  model::SynthOptions o;
  o.arch = "gpt-oss";
  o.seed = seed;
  o.n_ctx = 256;
  o.dtype = model::GgmlType::kMXFP4;
  const std::string path = dir.file("mxfp4.gguf");
  const Status st = model::synth_model(o, path);
  EXPECT_TRUE(st.has_value()) << st.error().message;
  return path;
}

enum class OssExperts { kMxfp4, kDense };

/// config.json of the twin: the GGUF's hyperparameters under GptOssConfig's keys.
inline nlohmann::json gpt_oss_twin_config(const model::GgufFile& g, OssExperts experts) {
  const std::string a = "gpt-oss.";
  const int64_t n_layer = g.get_int(a + "block_count");
  std::vector<std::string> types;
  for (int64_t il = 0; il < n_layer; ++il)
    types.push_back(il % 2 == 0 ? "sliding_attention" : "full_attention");
  nlohmann::json c = {{"architectures", {"GptOssForCausalLM"}},
                      {"model_type", "gpt_oss"},
                      {"vocab_size", g.find_tensor("token_embd.weight")->ne[1]},
                      {"hidden_size", g.get_int(a + "embedding_length")},
                      {"num_hidden_layers", n_layer},
                      {"num_attention_heads", g.get_int(a + "attention.head_count")},
                      {"num_key_value_heads", g.get_int(a + "attention.head_count_kv")},
                      {"head_dim", g.get_int(a + "attention.key_length")},
                      {"rope_theta", g.get_float(a + "rope.freq_base")},
                      {"rms_norm_eps", g.get_float(a + "attention.layer_norm_rms_epsilon")},
                      {"max_position_embeddings", g.get_int(a + "context_length")},
                      {"num_local_experts", g.get_int(a + "expert_count")},
                      {"num_experts_per_tok", g.get_int(a + "expert_used_count")},
                      {"experts_per_token", g.get_int(a + "expert_used_count")},
                      {"intermediate_size", g.get_int(a + "expert_feed_forward_length")},
                      {"sliding_window", g.get_int(a + "attention.sliding_window")},
                      {"layer_types", types},
                      {"attention_bias", true},
                      {"swiglu_limit", 7.0},
                      {"hidden_act", "silu"},
                      {"tie_word_embeddings", false}};
  if (experts == OssExperts::kMxfp4)
    c["quantization_config"] = {{"quant_method", "mxfp4"},
                                {"modules_to_not_convert",
                                 {"model.layers.*.self_attn", "model.layers.*.mlp.router",
                                  "model.embed_tokens", "lm_head"}}};
  return c;
}

/// The Hugging Face name of a gpt-oss GGUF tensor other than the stacked experts and their
/// biases; "" for those.
inline std::string gpt_oss_hf_name(const std::string& g) {
  if (g == "token_embd.weight") return "model.embed_tokens.weight";
  if (g == "output_norm.weight") return "model.norm.weight";
  if (g == "output.weight") return "lm_head.weight";
  const size_t dot = g.find('.', 4);
  const std::string at = "model.layers." + g.substr(4, dot - 4) + ".", rest = g.substr(dot + 1);
  static const std::pair<const char*, const char*> kLayer[] = {
      {"attn_norm.weight", "input_layernorm.weight"},
      {"attn_q.weight", "self_attn.q_proj.weight"},
      {"attn_k.weight", "self_attn.k_proj.weight"},
      {"attn_v.weight", "self_attn.v_proj.weight"},
      {"attn_q.bias", "self_attn.q_proj.bias"},
      {"attn_k.bias", "self_attn.k_proj.bias"},
      {"attn_v.bias", "self_attn.v_proj.bias"},
      {"attn_output.weight", "self_attn.o_proj.weight"},
      {"attn_output.bias", "self_attn.o_proj.bias"},
      {"attn_sinks.weight", "self_attn.sinks"},
      {"post_attention_norm.weight", "post_attention_layernorm.weight"},
      {"ffn_gate_inp.weight", "mlp.router.weight"},
      {"ffn_gate_inp.bias", "mlp.router.bias"}};
  for (const auto& [from, to] : kLayer)
    if (rest == from) return at + to;
  return "";
}

namespace oss_twin {

/// The values of GGUF tensor t as f32 (dequantized when stored otherwise).
inline std::vector<float> values_of(const model::TensorInfo& t) {
  std::vector<float> v(static_cast<size_t>(t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3]));
  model::dequantize_row(t.type, t.data, v.data(), static_cast<int64_t>(v.size()));
  return v;
}

/// Row r (cols values) of matrix n of an MXFP4 stack as Hugging Face's 16 code bytes and one
/// scale byte per 32 values: GGUF's block keeps value j in byte j's low nibble and value j + 16
/// in its high one; HF's keeps values 2j and 2j + 1 in byte j's low and high nibbles.
inline void mxfp4_row_to_hf(const model::TensorInfo& t, int64_t n, int64_t r, std::string& codes,
                            std::string& scales) {
  const int64_t cols = t.ne[0], nb = cols / 32;
  const uint8_t* row = t.data + ((n * t.ne[1] + r) * nb) * 17;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = row + b * 17;
    scales.push_back(static_cast<char>(blk[0]));
    auto code = [&](int i) { return i < 16 ? blk[1 + i] & 15 : blk[1 + i - 16] >> 4; };
    for (int j = 0; j < 16; ++j)
      codes.push_back(static_cast<char>(code(2 * j) | code(2 * j + 1) << 4));
  }
}

}  // namespace oss_twin

/// The Hugging Face form of the gpt-oss GGUF at `gguf` (config.json + model.safetensors) in
/// `dir`. kMxfp4 needs the GGUF's experts in MXFP4 (synth --dtype mxfp4); kDense takes any type.
inline void write_gpt_oss_hf_twin(const std::string& gguf, const TempDir& dir, OssExperts experts) {
  auto f = model::GgufFile::open(gguf);
  ASSERT_TRUE(f.has_value()) << f.error().message;
  const model::GgufFile& g = **f;
  ASSERT_EQ(g.get_string("general.architecture"), "gpt-oss");
  std::vector<StTensor> out;
  for (const model::TensorInfo& t : g.tensors()) {
    const std::string name = gpt_oss_hf_name(t.name);
    if (name.empty()) continue;
    std::vector<int64_t> shape(t.ne, t.ne + t.n_dims);
    std::reverse(shape.begin(), shape.end());  // ggml ne -> PyTorch order
    out.push_back({name, "F32", shape, f32_bytes(oss_twin::values_of(t))});
  }
  const int64_t n_layer = g.get_int("gpt-oss.block_count");
  for (int64_t il = 0; il < n_layer; ++il) {
    const std::string b = "blk." + std::to_string(il) + ".";
    const std::string x = "model.layers." + std::to_string(il) + ".mlp.experts.";
    const model::TensorInfo* gate = g.find_tensor(b + "ffn_gate_exps.weight");
    const model::TensorInfo* up = g.find_tensor(b + "ffn_up_exps.weight");
    const model::TensorInfo* down = g.find_tensor(b + "ffn_down_exps.weight");
    ASSERT_TRUE(gate && up && down) << b;
    const int64_t E = gate->ne[0], F = gate->ne[1], N = gate->ne[2];
    // Biases: gate's and up's alternate in one [N, 2F] tensor; down's as they are.
    const std::vector<float> gb = oss_twin::values_of(*g.find_tensor(b + "ffn_gate_exps.bias"));
    const std::vector<float> ub = oss_twin::values_of(*g.find_tensor(b + "ffn_up_exps.bias"));
    std::vector<float> gub(static_cast<size_t>(2 * N * F));
    for (size_t i = 0; i < gb.size(); ++i) {
      gub[2 * i] = gb[i];
      gub[2 * i + 1] = ub[i];
    }
    out.push_back({x + "gate_up_proj_bias", "F32", {N, 2 * F}, f32_bytes(gub)});
    out.push_back({x + "down_proj_bias",
                   "F32",
                   {N, E},
                   f32_bytes(oss_twin::values_of(*g.find_tensor(b + "ffn_down_exps.bias")))});
    if (experts == OssExperts::kMxfp4) {
      for (const model::TensorInfo* t : {gate, up, down})
        ASSERT_EQ(t->type, model::GgmlType::kMXFP4) << t->name;
      std::string codes, scales;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t r = 0; r < 2 * F; ++r)
          oss_twin::mxfp4_row_to_hf(r % 2 == 0 ? *gate : *up, n, r / 2, codes, scales);
      out.push_back({x + "gate_up_proj_blocks", "U8", {N, 2 * F, E / 32, 16}, codes});
      out.push_back({x + "gate_up_proj_scales", "U8", {N, 2 * F, E / 32}, scales});
      codes.clear();
      scales.clear();
      for (int64_t n = 0; n < N; ++n)
        for (int64_t r = 0; r < E; ++r) oss_twin::mxfp4_row_to_hf(*down, n, r, codes, scales);
      out.push_back({x + "down_proj_blocks", "U8", {N, E, F / 32, 16}, codes});
      out.push_back({x + "down_proj_scales", "U8", {N, E, F / 32}, scales});
      continue;
    }
    // Dequantized: gate_up [N, E, 2F] with column 2i gate's row i and 2i + 1 up's; down
    // [N, F, E], each the transpose of the rows the GGUF holds.
    const std::vector<float> gv = oss_twin::values_of(*gate), uv = oss_twin::values_of(*up),
                             dv = oss_twin::values_of(*down);
    std::vector<float> gu(static_cast<size_t>(N * E * 2 * F)), dt(static_cast<size_t>(N * F * E));
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < F; ++i)
        for (int64_t c = 0; c < E; ++c) {
          const auto src = static_cast<size_t>((n * F + i) * E + c);
          gu[static_cast<size_t>((n * E + c) * 2 * F + 2 * i)] = gv[src];
          gu[static_cast<size_t>((n * E + c) * 2 * F + 2 * i + 1)] = uv[src];
          dt[static_cast<size_t>((n * F + i) * E + c)] =
              dv[static_cast<size_t>((n * E + c) * F + i)];
        }
    out.push_back({x + "gate_up_proj", "F32", {N, E, 2 * F}, f32_bytes(gu)});
    out.push_back({x + "down_proj", "F32", {N, F, E}, f32_bytes(dt)});
  }
  dir.write("config.json", gpt_oss_twin_config(g, experts).dump(2));
  dir.write("model.safetensors", safetensors_image(out));
}

}  // namespace troupe::testing
