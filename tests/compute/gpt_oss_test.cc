// OpenAI gpt-oss (GGUF "gpt-oss", llama.cpp's conventions) through the engine: a synthesized
// model against the independent float64 forward pass of tests/gpt_oss_reference.h. New parts it
// exercises: learned attention sinks, a sliding window on every other layer (prompts longer than
// the window, KV blocks smaller than it), biases on the output projection, the router's logits
// and every expert, the clamped SwiGLU, and a softmax over the chosen experts' logits. No
// ../shared golden case exists for this architecture.
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/gguf.h"
#include "model/gguf_writer.h"
#include "model/model.h"
#include "model/rope.h"
#include "model/safetensors.h"
#include "model/synth.h"
#include "tests/compute/engine_test_util.h"
#include "tests/edited_model.h"
#include "tests/gpt_oss_hf_twin.h"
#include "tests/gpt_oss_reference.h"
#include "tests/hf_twin_model.h"
#include "tests/test_support.h"

namespace troupe::compute {
namespace {

using testing::TempDir;

std::string synth_gpt_oss(const TempDir& dir, uint64_t seed = 13) {
  return testing::synth_arch(dir, "gpt-oss", seed);
}

TEST(GptOss, GgufMapsAsLlamaCpp) {
  TempDir dir;
  auto m = model::load_model(synth_gpt_oss(dir));
  ASSERT_TRUE(m.has_value()) << m.error().message;
  const model::ModelSpec& s = (*m)->spec;
  EXPECT_EQ(s.arch, model::Arch::kGptOss);
  EXPECT_STREQ(model::arch_name(s.arch), "gpt-oss");
  EXPECT_EQ(s.gating, model::Gating::kSoftmaxTopk);
  EXPECT_EQ(s.ffn_act, model::FfnAct::kSwigluOai);
  EXPECT_FALSE(s.norm_topk);
  EXPECT_EQ(s.rope_style, model::RopeStyle::kNeox);
  for (size_t il = 0; il < s.layers.size(); ++il) {
    const model::LayerSpec& L = s.layers[il];
    EXPECT_EQ(L.window, il % 2 == 0 ? 8 : 0) << il;  // llama.cpp's pattern: even layers
    EXPECT_EQ(L.sinks.cols(), s.n_head);
    EXPECT_TRUE(L.bo.present() && L.bq.present() && L.router_logit_bias.present());
    EXPECT_EQ(L.ffn_norm.name, "blk." + std::to_string(il) + ".post_attention_norm.weight");
    ASSERT_TRUE(L.is_moe);
    for (const model::ExpertFfn& X : L.experts) {
      EXPECT_EQ(X.gate_b.cols(), s.n_ff_exp);
      EXPECT_EQ(X.down_b.cols(), s.n_embd);
    }
    // Expert e's biases are row e of the stacked [width, n_expert] tensors.
    EXPECT_EQ(L.experts[3].up_b.data,
              L.experts[0].up_b.data + 3 * s.n_ff_exp * static_cast<int64_t>(sizeof(float)));
  }
}

// No golden case exists: the engine's logits are held to an independent float64 forward pass.
// 40 tokens over a window of 8, KV blocks of 4 and 16.
TEST(GptOss, EngineMatchesTheFloat64Reference) {
  TempDir dir;
  const std::string path = synth_gpt_oss(dir);
  auto m = model::load_model(path);
  ASSERT_TRUE(m.has_value()) << m.error().message;
  const int32_t vocab = static_cast<int32_t>((*m)->spec.n_vocab);
  const std::vector<int32_t> prompt = prompt_of(40, vocab, 19);
  expect_engine_near_reference(*m, prompt, testing::gpt_oss_reference_logits(path, prompt));
}

// The window and the sinks keep batch invariance: one chunk, several, token by token, 2 threads,
// and beside other sequences, bit for bit.
TEST(GptOss, LogitsBitIdenticalAcrossChunkingThreadsAndBatches) {
  TempDir dir;
  auto m = model::load_model(synth_gpt_oss(dir, 17));
  ASSERT_TRUE(m.has_value()) << m.error().message;
  expect_batch_invariant(*m);
}

// gpt-oss ships its experts in MXFP4. The same model with every matrix in MXFP4 (synth --dtype
// mxfp4) gives, bit for bit, the logits of its exact f32 twin (the MXFP4 values written as f32):
// the kernels multiply f32 activations by the exact values. Those are the float64 reference's
// within 1e-4.
TEST(GptOss, Mxfp4ModelEqualsItsExactF32Twin) {
  TempDir dir;
  const std::string path = testing::synth_gpt_oss_mxfp4(dir, 29);
  const std::string twin = dir.file("twin.gguf");
  testing::write_dequantized_gguf(path, twin);

  auto m = model::load_model(path);
  ASSERT_TRUE(m.has_value()) << m.error().message;
  EXPECT_EQ((*m)->spec.layers[1].experts[0].down.type, model::GgmlType::kMXFP4);
  const int64_t V = (*m)->spec.n_vocab;
  const std::vector<int32_t> prompt = prompt_of(24, static_cast<int32_t>(V), 5);
  const std::vector<float> got = prompt_logits(*m, prompt);
  EXPECT_TRUE(bit_equal(got, prompt_logits(twin, prompt)));
  expect_near_reference(got, testing::gpt_oss_reference_logits(twin, prompt), V);
}

// gpt-oss's released checkpoints: MXFP4 experts as U8 blocks and scales, gate and up rows
// alternating in one matrix, read in place (FP4_PACKED views of the file). The Hugging Face twin
// of an MXFP4 GGUF gives, bit for bit, the logits of the GGUF's exact f32 twin (the float
// kernels compute value * scale exactly), and those are the float64 reference's within 1e-4.
TEST(GptOss, HuggingFaceMxfp4CheckpointEqualsTheExactF32Gguf) {
  TempDir dir, hf;
  const std::string path = testing::synth_gpt_oss_mxfp4(dir, 41);
  const std::string twin = dir.file("f32.gguf");
  testing::write_dequantized_gguf(path, twin);
  testing::write_gpt_oss_hf_twin(path, hf, testing::OssExperts::kMxfp4);
  auto m = model::load_model(hf.path());
  ASSERT_TRUE(m.has_value()) << m.error().message;
  const model::ModelSpec& s = (*m)->spec;
  EXPECT_EQ(s.arch, model::Arch::kGptOss);
  EXPECT_EQ(s.gating, model::Gating::kSoftmaxTopk);
  EXPECT_EQ(s.ffn_act, model::FfnAct::kSwigluOai);
  EXPECT_EQ(s.act_limit, 7.0f);
  for (size_t il = 0; il < s.layers.size(); ++il) {
    const model::LayerSpec& L = s.layers[il];
    EXPECT_EQ(L.window, il % 2 == 0 ? 8 : 0) << il;
    EXPECT_TRUE(L.sinks.present() && L.bo.present() && L.router_logit_bias.present()) << il;
    const model::ExpertFfn &x0 = L.experts[0], &x1 = L.experts[1];
    EXPECT_EQ(x0.gate_up.type, model::GgmlType::kFP4_PACKED);
    EXPECT_EQ(x0.gate_up.scale_type, model::GgmlType::kE8M0);
    EXPECT_EQ(x0.down.type, model::GgmlType::kFP4_PACKED);
    EXPECT_FALSE(x0.gate.present() || x0.up.present());
    EXPECT_EQ(x0.width(), s.n_ff_exp);
    // Expert 1's matrix follows expert 0's in the file: a view, not a copy.
    EXPECT_EQ(x1.gate_up.data, x0.gate_up.data + 2 * s.n_ff_exp * s.n_embd / 2);
  }
  const int32_t V = static_cast<int32_t>(s.n_vocab);
  const std::vector<int32_t> prompt = prompt_of(30, V, 23);
  const std::vector<float> got = prompt_logits(*m, prompt);
  EXPECT_TRUE(bit_equal(got, prompt_logits(twin, prompt)));
  expect_near_reference(got, testing::gpt_oss_reference_logits(twin, prompt), V);
}

// A checkpoint saved after dequantization holds each layer's experts as [n_expert, in, out]
// matrices (x @ W): transposed into memory, gate and up still alternating, they give the GGUF's
// logits bit for bit.
TEST(GptOss, HuggingFaceDequantizedCheckpointEqualsTheGguf) {
  TempDir dir, hf;
  const std::string path = synth_gpt_oss(dir, 43);
  testing::write_gpt_oss_hf_twin(path, hf, testing::OssExperts::kDense);
  auto m = model::load_model(hf.path());
  ASSERT_TRUE(m.has_value()) << m.error().message;
  EXPECT_EQ((*m)->spec.layers[0].experts[2].gate_up.type, model::GgmlType::kF32);
  const std::vector<int32_t> prompt = prompt_of(30, static_cast<int32_t>((*m)->spec.n_vocab), 29);
  EXPECT_TRUE(bit_equal(prompt_logits(*m, prompt), prompt_logits(path, prompt)));
}

// GptOssConfig's keys: layer_types, swiglu_limit and the released models' YaRN (not truncated)
// are read; malformed ones and broken MXFP4 tensors are refused by name.
TEST(GptOss, HuggingFaceConfigAndTensorsChecked) {
  TempDir dir, hf;
  const std::string path = testing::synth_gpt_oss_mxfp4(dir, 47);
  testing::write_gpt_oss_hf_twin(path, hf, testing::OssExperts::kMxfp4);
  const std::string cfg_path = hf.file("config.json");
  const nlohmann::json base = nlohmann::json::parse(testing::read_text_file(cfg_path));
  auto with = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json c = base;
    edit(c);
    hf.write("config.json", c.dump());
    return hf.path();
  };
  {
    auto m = model::load_model(with([](nlohmann::json& c) {
      c["layer_types"] = std::vector<std::string>(4, "full_attention");
      c["swiglu_limit"] = 5.5;
      c["rope_scaling"] = {{"rope_type", "yarn"},
                           {"factor", 32.0},
                           {"beta_fast", 32.0},
                           {"beta_slow", 1.0},
                           {"original_max_position_embeddings", 4096},
                           {"truncate", false}};
      c["max_position_embeddings"] = 131072;
    }));
    ASSERT_TRUE(m.has_value()) << m.error().message;
    const model::ModelSpec& s = (*m)->spec;
    for (const model::LayerSpec& L : s.layers) EXPECT_EQ(L.window, 0);
    EXPECT_EQ(s.act_limit, 5.5f);
    EXPECT_EQ(s.rope_scaling.type, model::RopeScalingType::kYarn);
    EXPECT_FALSE(s.rope_scaling.truncate);
    EXPECT_DOUBLE_EQ(s.rope_scaling.attn_factor, 1.0 + 0.1 * std::log(32.0));
  }
  EXPECT_NE(load_error(with([](nlohmann::json& c) {
              c["layer_types"] = {"full_attention"};
            })).find("'layer_types' must be a list of 4 entries"),
            std::string::npos);
  EXPECT_NE(load_error(with([](nlohmann::json& c) {
              c["layer_types"][1] = "chunked_attention";
            })).find("layer_types[1] is \"chunked_attention\""),
            std::string::npos);
  // The tensors: one scale grid missing, then a blocks tensor of the wrong shape.
  auto st = model::SafetensorsFile::open(hf.file("model.safetensors"));
  ASSERT_TRUE(st.has_value()) << st.error().message;
  auto rewrite = [&](const std::function<bool(testing::StTensor&)>& keep) {
    std::vector<testing::StTensor> out;
    for (const model::SafetensorsTensor& t : (*st)->tensors()) {
      testing::StTensor x{t.name, t.dtype, t.shape,
                          std::string(reinterpret_cast<const char*>(t.data), t.nbytes)};
      if (keep(x)) out.push_back(std::move(x));
    }
    TempDir d;
    d.write("config.json", base.dump());
    d.write("model.safetensors", testing::safetensors_image(out));
    return load_error(d.path());
  };
  const std::string missing = rewrite(
      [](testing::StTensor& t) { return t.name != "model.layers.2.mlp.experts.down_proj_scales"; });
  EXPECT_NE(missing.find("missing tensor 'model.layers.2.mlp.experts.down_proj_scales' "
                         "(quantization_config says mxfp4)"),
            std::string::npos)
      << missing;
  const std::string shape = rewrite([](testing::StTensor& t) {
    if (t.name == "model.layers.1.mlp.experts.gate_up_proj_blocks") {
      t.shape = {t.shape[0], t.shape[1], t.shape[2] * 2, 8};
    }
    return true;
  });
  EXPECT_NE(shape.find("MXFP4 tensor 'model.layers.1.mlp.experts.gate_up_proj_blocks' is U8"),
            std::string::npos)
      << shape;
}

// A node copies its weights into memory and may then drop the file mapping: every view must move
// with the copy, gpt-oss's sinks and biases included, and the logits stay the same bits.
TEST(GptOss, WeightsCopiedToMemoryMoveEveryView) {
  TempDir dir;
  auto mapped = model::load_model(synth_gpt_oss(dir, 31));
  ASSERT_TRUE(mapped.has_value()) << mapped.error().message;
  auto copy = model::copy_weights_to_memory(*mapped, {}, 2);
  ASSERT_TRUE(copy.has_value()) << copy.error().message;
  const model::ModelSpec &a = (*mapped)->spec, &b = (*copy)->spec;
  auto moved = [](const model::WeightView& from, const model::WeightView& to) {
    ASSERT_TRUE(from.present() && to.present());
    EXPECT_NE(from.data, to.data) << from.name << " still points into the file";
    EXPECT_EQ(std::memcmp(from.data, to.data, from.nbytes()), 0) << from.name;
  };
  for (size_t il = 0; il < a.layers.size(); ++il) {
    const model::LayerSpec &x = a.layers[il], &y = b.layers[il];
    moved(x.bo, y.bo);
    moved(x.sinks, y.sinks);
    moved(x.router_logit_bias, y.router_logit_bias);
    for (size_t e = 0; e < x.experts.size(); ++e) {
      moved(x.experts[e].gate_b, y.experts[e].gate_b);
      moved(x.experts[e].up_b, y.experts[e].up_b);
      moved(x.experts[e].down_b, y.experts[e].down_b);
    }
  }
  const std::vector<int32_t> p = prompt_of(20, static_cast<int32_t>(a.n_vocab), 3);
  EXPECT_TRUE(bit_equal(prompt_logits(*mapped, p), prompt_logits(*copy, p)));
}

TEST(GptOss, BadFilesAreRefusedByName) {
  TempDir dir;
  const std::string src = synth_gpt_oss(dir);
  const std::string no_window = testing::edited_gguf(
      dir, "w0.gguf", src, [](auto& w) { w.set_u32("gpt-oss.attention.sliding_window", 0); });
  EXPECT_NE(load_error(no_window).find("gpt-oss.attention.sliding_window must be positive, got 0"),
            std::string::npos)
      << load_error(no_window);
  // One expert fewer in the file's header than the bias tensors have.
  const std::string fewer = testing::edited_gguf(
      dir, "e.gguf", src, [](auto& w) { w.set_u32("gpt-oss.expert_count", 7); });
  EXPECT_NE(load_error(fewer).find("must be f32 [width, 7 experts]"), std::string::npos)
      << load_error(fewer);
  // Without its sinks a file is not gpt-oss: refused, not run as plain attention.
  auto g = model::GgufFile::open(src);
  ASSERT_TRUE(g.has_value());
  model::GgufWriter w;
  for (const auto& [key, value] : (*g)->metadata()) w.copy_value(key, value);
  for (const model::TensorInfo& t : (*g)->tensors()) {
    if (t.name == "blk.1.attn_sinks.weight") continue;
    const std::vector<int64_t> shape(t.ne, t.ne + t.n_dims);
    ASSERT_TRUE(w.add_tensor(t.name, t.type, shape, {t.data, static_cast<size_t>(t.nbytes)}));
  }
  const std::string no_sinks = dir.file("no_sinks.gguf");
  ASSERT_TRUE(w.write(no_sinks).has_value());
  EXPECT_NE(load_error(no_sinks).find("missing tensor 'blk.1.attn_sinks.weight'"),
            std::string::npos)
      << load_error(no_sinks);
}

}  // namespace
}  // namespace troupe::compute
