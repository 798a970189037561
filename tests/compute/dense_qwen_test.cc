// Dense Qwen2 and Qwen3 (GGUF architectures "qwen2", "qwen3"; Hugging Face Qwen2ForCausalLM,
// Qwen3ForCausalLM). Their attention is Qwen2-MoE's (q/k/v biases) and Qwen3-MoE's (per-head q/k
// RMSNorm), which the golden cases check against an independent implementation; their FFN is
// one SwiGLU. So a MoE model with one expert, always routed with weight 1, rewritten as a dense
// file (its expert as the FFN) must give the MoE model's logits bit for bit; and the dense file
// converted to a Hugging Face directory must give them too.
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "compute/engine.h"
#include "model/gguf.h"
#include "model/gguf_writer.h"
#include "model/model.h"
#include "model/synth.h"
#include "tests/compute/engine_test_util.h"

namespace troupe::compute {
namespace {

namespace fs = std::filesystem;
using model::GgmlType;
using model::GgufFile;
using model::GgufWriter;

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return !a.empty() && a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class DenseQwen : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("troupe_qwen_" + std::string(GetParam()) + "_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    std::mt19937 rng(9);
    prompt_.resize(19);
    for (auto& t : prompt_) t = static_cast<int32_t>(rng() % 512);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string dense() const { return GetParam(); }  // "qwen2" or "qwen3"
  std::string moe() const { return dense() + "moe"; }

  // The MoE twin: one expert of the dense FFN width, f32.
  std::string make_moe() const {
    model::SynthOptions so;
    so.arch = moe();
    so.n_embd = 64;
    so.n_layer = 2;
    so.n_head = 4;
    so.n_head_kv = 2;
    so.n_expert = 1;
    so.n_expert_used = 1;
    so.n_ff_exp = 96;
    so.n_vocab = 512;
    so.seed = 3;
    so.num_threads = 2;
    const std::string path = (dir_ / "moe.gguf").string();
    auto made = model::synth_model_summary(so, path);
    EXPECT_TRUE(made.has_value()) << made.error().message;
    return path;
  }

  // Rewrites `src`: as the dense architecture (expert 0 as the FFN, router and shared expert
  // dropped) when `to_dense`; else the same MoE file with the shared expert's down projection
  // zeroed, so that it adds exactly 0 (Qwen2-MoE always has one).
  std::string rewrite(const std::string& src, bool to_dense, const std::string& name) {
    auto f = GgufFile::open(src);
    EXPECT_TRUE(f.has_value()) << f.error().message;
    GgufWriter w;
    const std::string from = moe() + ".", to = dense() + ".";
    for (const auto& [key, value] : (*f)->metadata()) {
      if (!to_dense) {
        w.copy_value(key, value);
      } else if (key == "general.architecture") {
        w.set_string(key, dense());
      } else if (key.rfind(from, 0) == 0) {
        const std::string rest = key.substr(from.size());
        if (rest.rfind("expert_", 0) == 0 || rest == "feed_forward_length") continue;
        w.copy_value(to + rest, value);
      } else {
        w.copy_value(key, value);
      }
    }
    if (to_dense)
      w.set_u32(to + "feed_forward_length",
                static_cast<uint32_t>((*f)->get_int(from + "expert_feed_forward_length")));
    zeros_.clear();
    for (const model::TensorInfo& t : (*f)->tensors()) {
      std::string n = t.name;
      std::vector<int64_t> shape(t.ne, t.ne + t.n_dims);
      if (to_dense && n.find("_exps") != std::string::npos) shape.resize(2);  // [.., .., 1]
      std::span<const uint8_t> bytes(t.data, static_cast<size_t>(t.nbytes));
      const bool shexp = n.find("_shexp") != std::string::npos;
      if (to_dense) {
        if (shexp || n.find("ffn_gate_inp") != std::string::npos) continue;
        const size_t at = n.find("_exps");
        if (at != std::string::npos) n.erase(at, 5);
      } else if (n.find("ffn_down_shexp") != std::string::npos) {
        zeros_.emplace_back(static_cast<size_t>(t.nbytes), 0);  // f32 +0
        bytes = zeros_.back();
      }
      EXPECT_TRUE(w.add_tensor(n, t.type, shape, bytes).has_value()) << n;
    }
    const std::string path = (dir_ / name).string();
    EXPECT_TRUE(w.write(path).has_value());
    return path;
  }

  // The dense GGUF (f32) as a Hugging Face directory: config.json and model.safetensors with the
  // same bytes under HF names (shapes reversed; Qwen's q/k rows are stored alike in both).
  std::string to_hf(const std::string& gguf) const {
    auto f = GgufFile::open(gguf);
    EXPECT_TRUE(f.has_value()) << f.error().message;
    const std::string p = dense() + ".";
    const bool q3 = dense() == "qwen3";
    nlohmann::json cfg = {{"architectures", {q3 ? "Qwen3ForCausalLM" : "Qwen2ForCausalLM"}},
                          {"hidden_size", (*f)->get_int(p + "embedding_length")},
                          {"num_hidden_layers", (*f)->get_int(p + "block_count")},
                          {"num_attention_heads", (*f)->get_int(p + "attention.head_count")},
                          {"num_key_value_heads", (*f)->get_int(p + "attention.head_count_kv")},
                          {"intermediate_size", (*f)->get_int(p + "feed_forward_length")},
                          {"vocab_size", (*f)->find_tensor("token_embd.weight")->ne[1]},
                          {"rms_norm_eps", (*f)->get_float(p + "attention.layer_norm_rms_epsilon")},
                          {"rope_theta", (*f)->get_float(p + "rope.freq_base")},
                          {"hidden_act", "silu"},
                          {"tie_word_embeddings", false}};
    if (q3) cfg["head_dim"] = (*f)->get_int(p + "attention.key_length");
    auto hf_name = [](const std::string& g) -> std::string {
      if (g == "token_embd.weight") return "model.embed_tokens.weight";
      if (g == "output_norm.weight") return "model.norm.weight";
      if (g == "output.weight") return "lm_head.weight";
      const size_t dot = g.find('.', 4);
      const std::string layer = "model.layers." + g.substr(4, dot - 4) + ".";
      const std::string rest = g.substr(dot + 1);
      static const std::pair<const char*, const char*> kMap[] = {
          {"attn_norm.weight", "input_layernorm.weight"},
          {"ffn_norm.weight", "post_attention_layernorm.weight"},
          {"attn_q.weight", "self_attn.q_proj.weight"},
          {"attn_k.weight", "self_attn.k_proj.weight"},
          {"attn_v.weight", "self_attn.v_proj.weight"},
          {"attn_q.bias", "self_attn.q_proj.bias"},
          {"attn_k.bias", "self_attn.k_proj.bias"},
          {"attn_v.bias", "self_attn.v_proj.bias"},
          {"attn_output.weight", "self_attn.o_proj.weight"},
          {"attn_q_norm.weight", "self_attn.q_norm.weight"},
          {"attn_k_norm.weight", "self_attn.k_norm.weight"},
          {"ffn_gate.weight", "mlp.gate_proj.weight"},
          {"ffn_up.weight", "mlp.up_proj.weight"},
          {"ffn_down.weight", "mlp.down_proj.weight"}};
      for (const auto& [from, to] : kMap)
        if (rest == from) return layer + to;
      ADD_FAILURE() << "no HF name for " << g;
      return g;
    };
    nlohmann::json header = nlohmann::json::object();
    std::string data;
    for (const model::TensorInfo& t : (*f)->tensors()) {
      EXPECT_EQ(t.type, GgmlType::kF32) << t.name;
      std::vector<int64_t> shape;  // HF lists the outermost dimension first
      for (int d = t.n_dims - 1; d >= 0; --d) shape.push_back(t.ne[d]);
      const size_t begin = data.size();
      data.append(reinterpret_cast<const char*>(t.data), static_cast<size_t>(t.nbytes));
      header[hf_name(t.name)] = {
          {"dtype", "F32"}, {"shape", shape}, {"data_offsets", {begin, data.size()}}};
    }
    std::string h = header.dump();
    while (h.size() % 8 != 0) h += ' ';
    const fs::path hf = dir_ / "hf";
    fs::create_directories(hf);
    std::ofstream(hf / "config.json") << cfg.dump(2);
    std::ofstream st(hf / "model.safetensors", std::ios::binary);
    const uint64_t len = h.size();
    st.write(reinterpret_cast<const char*>(&len), 8);
    st << h << data;
    return hf.string();
  }

  fs::path dir_;
  std::vector<int32_t> prompt_;
  std::vector<std::vector<uint8_t>> zeros_;  // rewrite()'s zeroed tensors, alive until written
};

TEST_P(DenseQwen, IsItsMoeTwinWithOneExpert) {
  std::string moe_path = make_moe();
  if (dense() == "qwen2") moe_path = rewrite(moe_path, false, "moe-no-shared.gguf");
  const std::string dense_path = rewrite(moe_path, true, "dense.gguf");
  auto d = model::load_model(dense_path);
  ASSERT_TRUE(d.has_value()) << d.error().message;
  EXPECT_STREQ(model::arch_name((*d)->spec.arch), dense().c_str());
  EXPECT_EQ((*d)->spec.n_expert, 0);
  EXPECT_FALSE((*d)->spec.layers[1].is_moe);
  EXPECT_EQ((*d)->spec.rope_style, model::RopeStyle::kNeox);
  const bool q2 = dense() == "qwen2";
  EXPECT_EQ((*d)->spec.layers[0].bq.present(), q2);
  EXPECT_EQ((*d)->spec.layers[0].q_norm.present(), !q2);

  const auto want = prompt_logits(moe_path, prompt_);
  const auto got = prompt_logits(*d, prompt_);
  ASSERT_FALSE(want.empty());
  EXPECT_TRUE(same_bits(got, want)) << "dense " << dense() << " against its one-expert twin";

  // The same model as a Hugging Face directory.
  auto hf = model::load_hf_model(to_hf(dense_path));
  ASSERT_TRUE(hf.has_value()) << hf.error().message;
  EXPECT_EQ((*hf)->spec.arch, (*d)->spec.arch);
  EXPECT_TRUE(same_bits(prompt_logits(*hf, prompt_), want)) << "Hugging Face " << dense();
}

INSTANTIATE_TEST_SUITE_P(Archs, DenseQwen, ::testing::Values("qwen2", "qwen3"));

TEST(DenseQwen, SynthMakesBothDenseArchitectures) {
  const fs::path dir = fs::temp_directory_path() / ("troupe_qsynth_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  for (const char* arch : {"qwen2", "qwen3"}) {
    model::SynthOptions so;
    so.arch = arch;
    so.n_layer = 2;
    so.dtype = GgmlType::kQ8_0;
    const std::string path = (dir / (std::string(arch) + ".gguf")).string();
    auto made = model::synth_model_summary(so, path);
    ASSERT_TRUE(made.has_value()) << made.error().message;
    auto m = model::load_model(path);
    ASSERT_TRUE(m.has_value()) << m.error().message;
    EXPECT_STREQ(model::arch_name((*m)->spec.arch), arch);
    EXPECT_FALSE(prompt_logits(*m, {1, 2, 3}).empty()) << arch;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace troupe::compute
