// DeepSeek-V4 (Hugging Face DeepseekV4ForCausalLM, in the names its checkpoints are stored
// under) through the engine, against the independent float64 forward pass of
// tests/deepseek_v4_reference.h on random-weight checkpoints (tests/deepseek_v4_model.h): the
// hyper-connection streams, attention over a sliding window plus compressed entries (overlapping
// ratio-4 windows chosen by the lightning indexer, plain ratio-m windows all attended), sinks,
// the grouped output, sqrt-softplus and token-id routing, the clamped SwiGLU. Windows of 8 and
// rates of 4 and 8 over ~50 tokens: every kind of entry and choice is in play.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/model.h"
#include "model/safetensors.h"
#include "model/synth.h"
#include "tests/compute/engine_test_util.h"
#include "tests/deepseek_v4_model.h"
#include "tests/deepseek_v4_reference.h"
#include "tests/fp8_model.h"
#include "tests/safetensors_writer.h"
#include "tests/test_support.h"

namespace troupe::compute {
namespace {

using testing::TempDir;
using testing::V4Options;

std::vector<double> reference(const std::string& dir, const std::vector<int32_t>& tokens) {
  std::vector<double> flat;
  for (const auto& row : testing::deepseek_v4_ref::logits(dir, tokens))
    flat.insert(flat.end(), row.begin(), row.end());
  return flat;
}

std::shared_ptr<const model::Model> load(const std::string& dir) {
  auto m = model::load_model(dir);
  EXPECT_TRUE(m.has_value()) << m.error().message;
  return m ? *m : nullptr;
}

void edit_config(const TempDir& dir, const std::function<void(nlohmann::json&)>& edit) {
  std::ifstream in(dir.file("config.json"));
  nlohmann::json c = nlohmann::json::parse(in);
  edit(c);
  dir.write("config.json", c.dump(2));
}

TEST(DeepseekV4, ReadsTheCheckpointsLayout) {
  TempDir dir;
  V4Options o;
  testing::write_deepseek_v4(dir.path(), o);
  auto m = load(dir.path());
  ASSERT_TRUE(m);
  const model::ModelSpec& s = m->spec;
  EXPECT_EQ(s.arch, model::Arch::kDeepseek4);
  EXPECT_EQ(s.hc_mult, 4);
  EXPECT_EQ(s.hidden_width(), 4 * s.n_embd);
  EXPECT_EQ(s.n_head_kv, 1);
  EXPECT_EQ(s.head_dim_k, 64);
  EXPECT_EQ(s.n_rot, 16);
  EXPECT_EQ(s.o_groups, 2);
  EXPECT_EQ(s.gating, model::Gating::kSqrtSoftplus);
  EXPECT_EQ(s.ffn_act, model::FfnAct::kSiluClamp);
  EXPECT_FLOAT_EQ(s.rope_theta, 160000.0f);  // the compressing layers' base
  EXPECT_FLOAT_EQ(s.rope_theta_local, 10000.0f);
  EXPECT_EQ(s.rope_scaling.type, model::RopeScalingType::kYarn);
  EXPECT_EQ(s.rope_scaling.attn_factor, 1.0);  // no YaRN magnitude factor
  ASSERT_EQ(s.layers.size(), 4u);
  for (size_t il = 0; il < 4; ++il) {
    const model::LayerSpec& L = s.layers[il];
    EXPECT_EQ(L.window, 8) << il;
    EXPECT_EQ(L.compress, il % 2 == 0 ? 4 : 8) << il;
    EXPECT_EQ(L.compress_overlap, il % 2 == 0) << il;
    EXPECT_EQ(L.idx_wq_b.present(), il % 2 == 0) << il;
    EXPECT_FALSE(L.local_rope) << il;
    EXPECT_EQ(L.hash_experts.present(), il == 0) << il;
    EXPECT_EQ(L.router_bias.present(), il != 0) << il;
    EXPECT_TRUE(L.is_moe) << il;
  }
  // Each position's KV row: key, entry and two projections of 2 x 64, then the indexer's 5 x 32.
  EXPECT_EQ(s.kv_k_width(), 64 + 64 * 5 + 32 * 5);
}

TEST(DeepseekV4, MatchesTheReference) {
  TempDir dir;
  V4Options o;
  testing::write_deepseek_v4(dir.path(), o);
  auto m = load(dir.path());
  ASSERT_TRUE(m);
  const std::vector<int32_t> prompt = prompt_of(50, static_cast<int32_t>(o.vocab), 11);
  expect_engine_near_reference(m, prompt, reference(dir.path(), prompt));
}

TEST(DeepseekV4, IsBatchInvariant) {
  TempDir dir;
  testing::write_deepseek_v4(dir.path(), V4Options{});
  auto m = load(dir.path());
  ASSERT_TRUE(m);
  expect_batch_invariant(m);
}

// Sliding-only layers (their own rope base), the older compress_ratios (rates 4 and 128 over
// 140 positions: one heavily compressed entry), I64 token tables, two hash layers, a clamp that
// bites and no YaRN.
TEST(DeepseekV4, OtherLayoutsMatchTheReference) {
  TempDir dir;
  V4Options o;
  o.layer_types = {"sliding_attention", "compressed_sparse_attention",
                   "heavily_compressed_attention", "sliding_attention"};
  o.legacy_ratios = true;
  o.tid2eid_i64 = true;
  o.num_hash_layers = 2;
  o.swiglu_limit = 0.5;
  o.yarn = false;
  o.index_topk = 8;
  o.seed = 5;
  testing::write_deepseek_v4(dir.path(), o);
  auto m = load(dir.path());
  ASSERT_TRUE(m);
  EXPECT_TRUE(m->spec.layers[0].local_rope);
  EXPECT_EQ(m->spec.layers[2].compress, 128);
  const std::vector<int32_t> prompt = prompt_of(140, static_cast<int32_t>(o.vocab), 13);
  EngineOptions eo;
  eo.max_tokens_in_cache = 256;
  eo.kv_block_size = 16;
  auto eng = Engine::create(m, eo);
  ASSERT_TRUE(eng.has_value()) << eng.error().message;
  const std::vector<float> got = run_chunks(**eng, prompt, {64, 1, 75});
  expect_near_reference(got, reference(dir.path(), prompt), o.vocab);
}

// bf16 rows are not the f32 cache's bits, but near the reference: with every entry attended,
// since a rounded index key may tip the indexer's choice (a jump no tolerance bounds).
TEST(DeepseekV4, HalfPrecisionKvStaysNearTheReference) {
  TempDir dir;
  V4Options vo;
  vo.index_topk = 100;
  testing::write_deepseek_v4(dir.path(), vo);
  auto m = load(dir.path());
  ASSERT_TRUE(m);
  const std::vector<int32_t> prompt = prompt_of(30, 256, 7);
  EngineOptions o;
  o.max_tokens_in_cache = 128;
  o.kv_type = KvType::kBF16;
  auto eng = Engine::create(m, o);
  ASSERT_TRUE(eng.has_value()) << eng.error().message;
  expect_near_reference(run_chunks(**eng, prompt, {30}), reference(dir.path(), prompt), 256, 3e-2,
                        false);
}

// As DeepSeek-V4-Flash ships its attention and shared experts (and, in its FP8 form, its routed
// experts): F8_E4M3 with a power-of-two F8_E8M0 grid "X.scale" beside each "X.weight"
// (quantization_config scale_fmt "ue8m0"). Logits bit for bit those of the f32 twin holding
// fp8 x scale; with o_lora_rank 16 under blocks of 32 rows, wo_a's groups cut its scale blocks and
// it is read as that exact f32.
TEST(DeepseekV4, Ue8m0Fp8CheckpointGivesItsTwinsLogits) {
  for (const int64_t o_lora : {32, 16}) {
    SCOPED_TRACE("o_lora_rank " + std::to_string(o_lora));
    TempDir src;
    V4Options o;
    o.o_lora = o_lora;
    testing::write_deepseek_v4(src.path(), o);
    const testing::Fp8Copy fp8(
        src.path(), 32, 32,
        [](const std::string& name) {
          return name.find(".attn.w") != std::string::npos ||
                 name.find(".experts.") != std::string::npos ||
                 name.find("shared_experts") != std::string::npos;
        },
        "ue8m0");
    EXPECT_GT(fp8.quantized(), 20);
    auto q = load(fp8.fp8_path());
    ASSERT_TRUE(q);
    EXPECT_EQ(q->spec.layers[1].wq_b.type, model::GgmlType::kF8_E4M3);
    EXPECT_EQ(q->spec.layers[1].wo_a.type,
              o_lora == 32 ? model::GgmlType::kF8_E4M3 : model::GgmlType::kF32);
    const std::vector<int32_t> prompt = prompt_of(40, 256, 9);
    expect_quantized_logits(prompt_logits(q, prompt), prompt_logits(fp8.twin_path(), prompt),
                            prompt_logits(src.path(), prompt), 0);
  }
}

// FP4 (E2M1) magnitudes by code 0..7; codes 8..15 are their negatives.
constexpr double kE2m1[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};

/// The checkpoint in in_dir with each routed expert matrix "...ffn.experts.E.wK.weight" (F32)
/// in DeepSeek-V4's FP4 form into `out` (I8 [rows, cols / 2], value 2j in byte j's low nibble,
/// 2j + 1 in its high one; F8_E8M0 "...wK.scale" [rows, cols / 32], the power of two at or above
/// a group's amax / 6), or with `exact` the f32 values that form decodes to. Everything else is
/// copied as it is.
void write_fp4_experts(const std::string& in_dir, const TempDir& out, bool exact) {
  auto set = model::SafetensorsSet::open_dir(in_dir);
  ASSERT_TRUE(set.has_value()) << set.error().message;
  std::vector<testing::StTensor> tensors;
  for (const auto& [name, t] : (*set)->tensors()) {
    const std::string bytes(reinterpret_cast<const char*>(t->data), t->nbytes);
    if (name.find(".ffn.experts.") == std::string::npos || !name.ends_with(".weight")) {
      tensors.push_back({name, t->dtype, t->shape, bytes});
      continue;
    }
    ASSERT_EQ(t->dtype, "F32") << name;
    const int64_t rows = t->shape[0], cols = t->shape[1];
    std::vector<float> v(static_cast<size_t>(rows * cols)), twin(v.size());
    std::memcpy(v.data(), t->data, v.size() * 4);
    std::string codes(static_cast<size_t>(rows * cols / 2), '\0');
    std::string scales(static_cast<size_t>(rows * cols / 32), '\0');
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t g = 0; g < cols / 32; ++g) {
        double amax = 0;
        for (int64_t c = g * 32; c < (g + 1) * 32; ++c)
          amax =
              std::max(amax, std::fabs(static_cast<double>(v[static_cast<size_t>(r * cols + c)])));
        const int ex = amax > 0 ? static_cast<int>(std::ceil(std::log2(amax / 6.0))) : 0;
        scales[static_cast<size_t>(r * cols / 32 + g)] = static_cast<char>(127 + ex);
        for (int64_t c = g * 32; c < (g + 1) * 32; ++c) {
          const auto i = static_cast<size_t>(r * cols + c);
          const double x = std::ldexp(static_cast<double>(v[i]), -ex);
          int best = 0;
          for (int k = 1; k < 8; ++k)
            if (std::fabs(std::fabs(x) - kE2m1[k]) < std::fabs(std::fabs(x) - kE2m1[best]))
              best = k;
          const int code = best | (x < 0 && best != 0 ? 8 : 0);
          twin[i] = static_cast<float>(std::ldexp((code & 8 ? -1 : 1) * kE2m1[code & 7], ex));
          char& byte = codes[i / 2];
          byte = static_cast<char>(i % 2 == 0 ? (byte & 0xf0) | code : (byte & 0x0f) | (code << 4));
        }
      }
    if (exact) {
      tensors.push_back({name, "F32", t->shape, testing::f32_bytes(twin)});
    } else {
      tensors.push_back({name, "I8", {rows, cols / 2}, codes});
      tensors.push_back(
          {name.substr(0, name.size() - 7) + ".scale", "F8_E8M0", {rows, cols / 32}, scales});
    }
  }
  std::ifstream in(in_dir + "/config.json");
  nlohmann::json c = nlohmann::json::parse(in);
  if (!exact) c["expert_dtype"] = "fp4";
  out.write("config.json", c.dump(2));
  out.write("model.safetensors", testing::safetensors_image(tensors));
}

// DeepSeek-V4-Flash's released form: FP8 attention and shared experts (ue8m0 grids), FP4 routed
// experts read in place. Logits bit for bit those of the f32 twin of both encodings.
TEST(DeepseekV4, Fp4ExpertsGiveTheirTwinsLogits) {
  TempDir src, packed, twin;
  testing::write_deepseek_v4(src.path(), V4Options{});
  const testing::Fp8Copy fp8(
      src.path(), 32, 32,
      [](const std::string& name) {
        return name.find(".attn.w") != std::string::npos ||
               name.find("shared_experts") != std::string::npos;
      },
      "ue8m0");
  write_fp4_experts(fp8.fp8_path(), packed, false);
  write_fp4_experts(fp8.twin_path(), twin, true);
  auto q = load(packed.path());
  ASSERT_TRUE(q);
  EXPECT_EQ(q->spec.layers[2].experts[5].down.type, model::GgmlType::kFP4_PACKED);
  EXPECT_EQ(q->spec.layers[2].shared.up.type, model::GgmlType::kF8_E4M3);
  const std::vector<int32_t> prompt = prompt_of(40, 256, 5);
  expect_quantized_logits(prompt_logits(q, prompt), prompt_logits(twin.path(), prompt),
                          prompt_logits(src.path(), prompt), 0);
  // A packed matrix without its scales is refused by name.
  TempDir broken;
  {
    auto set = model::SafetensorsSet::open_dir(packed.path());
    ASSERT_TRUE(set.has_value());
    std::vector<testing::StTensor> kept;
    for (const auto& [name, t] : (*set)->tensors())
      if (name != "layers.1.ffn.experts.3.w2.scale")
        kept.push_back({name, t->dtype, t->shape,
                        std::string(reinterpret_cast<const char*>(t->data), t->nbytes)});
    std::ifstream in(packed.file("config.json"));
    broken.write("config.json", std::string(std::istreambuf_iterator<char>(in), {}));
    broken.write("model.safetensors", testing::safetensors_image(kept));
  }
  const std::string err = load_error(broken.path());
  EXPECT_NE(err.find("'layers.1.ffn.experts.3.w2.weight' is I8"), std::string::npos) << err;
  EXPECT_NE(err.find("missing"), std::string::npos) << err;
}

// `troupe synth --arch deepseek4`: V4-Flash's layout at a small size (layers: heavily compressed
// three times, then compressed-sparse; rates 128 and 4), in f32 and bf16, as the reference reads
// it; 140 positions reach a heavily compressed entry. Same options and seed, same bytes.
TEST(DeepseekV4, SynthWritesWhatTheReferenceReads) {
  for (const model::GgmlType dtype : {model::GgmlType::kF32, model::GgmlType::kBF16}) {
    SCOPED_TRACE(model::type_name(dtype));
    TempDir dir, again;
    model::SynthOptions o;
    o.arch = "deepseek4";
    o.n_embd = 64;
    o.n_head = 4;
    o.head_dim = 32;
    o.q_lora_rank = 32;
    o.index_heads = 2;
    o.index_top_k = 4;
    o.sliding_window = 8;
    o.n_vocab = 300;
    o.dtype = dtype;
    o.seed = 3;
    auto sum = model::synth_model_summary(o, dir.path());
    ASSERT_TRUE(sum.has_value()) << sum.error().message;
    ASSERT_TRUE(model::synth_model(o, again.path()).has_value());
    std::ifstream a(dir.file("model.safetensors"), std::ios::binary),
        b(again.file("model.safetensors"), std::ios::binary);
    EXPECT_TRUE(
        std::equal(std::istreambuf_iterator<char>(a), {}, std::istreambuf_iterator<char>(b), {}));
    auto m = load(dir.path());
    ASSERT_TRUE(m);
    ASSERT_EQ(m->spec.layers.size(), 4u);
    EXPECT_EQ(m->spec.layers[2].compress, 128);
    EXPECT_TRUE(m->spec.layers[3].compress_overlap);
    const std::vector<int32_t> prompt = prompt_of(140, 300, 17);
    EngineOptions eo;
    eo.max_tokens_in_cache = 256;
    auto eng = Engine::create(m, eo);
    ASSERT_TRUE(eng.has_value()) << eng.error().message;
    expect_near_reference(run_chunks(**eng, prompt, {140}), reference(dir.path(), prompt), 300);
  }
  model::SynthOptions bad;
  bad.arch = "deepseek4";
  bad.n_ff = 64;
  TempDir d;
  auto r = model::synth_model_summary(bad, d.path());
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message.find("--arch deepseek4 takes"), std::string::npos);
}

TEST(DeepseekV4, BadCheckpointsAreRefusedByName) {
  TempDir dir;
  testing::write_deepseek_v4(dir.path(), V4Options{});
  auto with = [&](const std::function<void(nlohmann::json&)>& edit) {
    TempDir d;
    testing::write_deepseek_v4(d.path(), V4Options{});
    edit_config(d, edit);
    return load_error(d.path());
  };
  EXPECT_NE(with([](nlohmann::json& c) {
              c["layer_types"][1] = "full_attention";
            }).find("layer_types[1] is 'full_attention'"),
            std::string::npos);
  EXPECT_NE(with([](nlohmann::json& c) {
              c["num_key_value_heads"] = 2;
            }).find("one shared key-and-value head"),
            std::string::npos);
  EXPECT_NE(
      with([](nlohmann::json& c) { c["scoring_func"] = "softmax"; }).find("scoring_func 'softmax'"),
      std::string::npos);
  EXPECT_NE(with([](nlohmann::json& c) { c["o_groups"] = 3; }).find("o_groups 3"),
            std::string::npos);
  // A layer whose compressor is missing (the config says it compresses).
  EXPECT_NE(with([](nlohmann::json& c) {
              c["layer_types"][3] = "compressed_sparse_attention";
            }).find("layers.3.attn.compressor.wkv.weight"),
            std::string::npos);
  EXPECT_EQ(load_error(dir.path()), "loaded");
}

}  // namespace
}  // namespace troupe::compute
