// GpuEngine (gpu/engine.h) against the CPU engine and the golden references of ../shared, and its
// invariances, bitwise: a sequence alone or in a batch, prefilled in one chunk or in chunks of
// more than one token, with CUDA graphs on or off, and a whole model against two pipeline stages
// chained through hidden states. Bad steps are rejected with compute::Engine's messages.
// Without a GPU only CreateWithoutGpuSaysWhy runs; every other test skips.
//
// Tolerances: tests/gpu/engine_test_util.h.
#include "gpu/engine.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "compute/engine.h"
#include "gpu/runtime.h"
#include "tests/compute/engine_test_util.h"
#include "tests/gpu/engine_test_util.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_support.h"

namespace troupe::gpu {
namespace {

using compute::SeqStep;
using compute::StepResult;
using Logits = compute::SeqStep::Logits;

using namespace enginetest;  // NOLINT(google-build-using-namespace): the test helpers

// ---- without a GPU ----------------------------------------------------------------------------

TEST(GpuEngine, CreateWithoutGpuSaysWhy) {
  std::string why;
  if (gpu_available(&why)) GTEST_SKIP() << "a GPU is present: the other GpuEngine tests run";
  auto empty = GpuEngine::create(std::make_shared<model::Model>(), GpuEngineOptions{});
  ASSERT_FALSE(empty.has_value());
  EXPECT_NE(empty.error().message.find("no usable CUDA GPU"), std::string::npos)
      << empty.error().message;
  EXPECT_EQ(empty.error().code, static_cast<int>(Errc::kNoDevice));
  auto none = GpuEngine::create(nullptr, GpuEngineOptions{});
  ASSERT_FALSE(none.has_value());
  EXPECT_NE(none.error().message.find("no model"), std::string::npos) << none.error().message;
  const std::string shared = troupe::testing::shared_dir();
  if (!shared.empty()) {
    auto model = compute::load_model_for_test(shared + "/models/stories260K/stories260K.gguf");
    ASSERT_TRUE(model);
    auto e = GpuEngine::create(model, GpuEngineOptions{});
    ASSERT_FALSE(e.has_value());
    EXPECT_NE(e.error().message.find("no usable CUDA GPU"), std::string::npos) << e.error().message;
  }
}

// A model whose int8 matrices were tiled for the CPU kernels is refused with the reason, before
// any GPU is touched (runs everywhere).
TEST(GpuEngine, RefusesWeightsInCpuTiles) {
  auto m = std::make_shared<model::Model>();
  static const uint8_t bytes[16 * 18] = {};
  model::LayerSpec layer;
  layer.wq.name = "blk.0.attn_q.weight";
  layer.wq.type = model::GgmlType::kQ4_0;
  layer.wq.ne[0] = 32;
  layer.wq.ne[1] = 16;
  layer.wq.data = bytes;
  layer.wq.layout = model::WeightLayout::kTiles16;
  m->spec.layers.push_back(layer);
  auto e = GpuEngine::create(m, GpuEngineOptions{});
  ASSERT_FALSE(e.has_value());
  EXPECT_NE(e.error().message.find("blk.0.attn_q.weight was put in 16-row tiles"),
            std::string::npos)
      << e.error().message;
  EXPECT_EQ(e.error().code, static_cast<int>(Errc::kBadInput));
}

// ---- against the CPU engine, and invariances (per model) --------------------------------------

class GpuEngineModel : public GpuModelTest {};

TEST_P(GpuEngineModel, LogitsMatchCpuEngine) {
  // Two sequences prefilled together (every row), then five decode steps together.
  const std::vector<std::vector<int32_t>> toks = {make_tokens(25, V_, 11), make_tokens(18, V_, 12)};
  Script script = {{{0, 20, Logits::kAll}, {1, 13, Logits::kAll}}};
  for (int i = 0; i < 5; ++i) script.push_back({{0, 1, Logits::kLast}, {1, 1, Logits::kLast}});
  compute::EngineOptions co;
  co.n_threads = 4;
  co.max_tokens_in_cache = 1024;
  co.kv_block_size = kBlockSize;
  auto cpu = compute::Engine::create(model_, co);
  ASSERT_TRUE(cpu.has_value()) << cpu.error().message;
  auto gpu = make_gpu(model_, small_options());
  ASSERT_TRUE(gpu);
  const auto want = run_script(**cpu, toks, script);
  const auto got = run_script(*gpu, toks, script);
  ASSERT_EQ(want.size(), 2u);
  ASSERT_EQ(got.size(), 2u);
  RowStats st;
  for (size_t s = 0; s < 2; ++s) {
    ASSERT_EQ(got[s].size(), want[s].size());
    ASSERT_EQ(want[s].size(), static_cast<size_t>(V_) * (s == 0 ? 25 : 18));
    for (size_t r = 0; r < want[s].size() / static_cast<size_t>(V_); ++r)
      compare_row(&got[s][r * static_cast<size_t>(V_)], &want[s][r * static_cast<size_t>(V_)], V_,
                  &st);
  }
  expect_stats(st, moe_, std::string("vs CPU ") + GetParam());
  EXPECT_GT(gpu->last_step_ms(), 0.f);
  EXPECT_GT(gpu->weight_bytes(), 0u);
  EXPECT_GT(gpu->kv_bytes(), 0u);
}

// Scaled rotary frequencies (YaRN, with a cos/sin magnitude) and a multiplied attention scale
// reach the GPU's tables and kernels as they reach the CPU engine (model/rope.h): a dense model
// with full-head rotation and an MLA model with a rope part.
TEST(GpuEngineRope, ScaledRopeMatchesCpuEngine) {
  TROUPE_REQUIRE_GPU();
  TROUPE_SHARED_OR_SKIP(shared);
  for (const char* path :
       {"models/stories260K/stories260K.gguf", "models/synth/deepseek2/model.gguf"}) {
    auto base = compute::load_model_for_test(shared + "/" + path);
    ASSERT_TRUE(base) << path;
    auto edited = std::make_shared<model::Model>(*base);
    model::RopeScaling& sc = edited->spec.rope_scaling;
    sc.type = model::RopeScalingType::kYarn;
    sc.factor = 4;
    sc.orig_ctx = 16;
    sc.attn_factor = 1.25;
    edited->spec.kq_scale_mult = 1.2;
    const std::shared_ptr<const model::Model> m = edited;
    const int64_t V = m->spec.n_vocab;
    const std::vector<std::vector<int32_t>> toks = {make_tokens(40, V, 21)};
    Script script = {{{0, 36, Logits::kAll}}};
    for (int i = 0; i < 4; ++i) script.push_back({{0, 1, Logits::kLast}});
    compute::EngineOptions co;
    co.n_threads = 4;
    co.max_tokens_in_cache = 1024;
    co.kv_block_size = kBlockSize;
    auto cpu = compute::Engine::create(m, co);
    ASSERT_TRUE(cpu.has_value()) << cpu.error().message;
    auto gpu = make_gpu(m, small_options());
    ASSERT_TRUE(gpu);
    const auto want = run_script(**cpu, toks, script);
    const auto got = run_script(*gpu, toks, script);
    ASSERT_EQ(got.size(), 1u);
    ASSERT_EQ(got[0].size(), want[0].size());
    RowStats st;
    for (size_t r = 0; r < want[0].size() / static_cast<size_t>(V); ++r)
      compare_row(&got[0][r * static_cast<size_t>(V)], &want[0][r * static_cast<size_t>(V)], V,
                  &st);
    expect_stats(st, has_moe(m->spec), std::string("scaled rope vs CPU ") + path);
  }
}

TEST_P(GpuEngineModel, BatchAndChunkInvariantBitwise) {
  auto gpu = make_gpu(model_, small_options());
  ASSERT_TRUE(gpu);
  expect_batch_and_chunk_invariant(*gpu, V_);
}

TEST_P(GpuEngineModel, CudaGraphsOnOffBitwise) {
  const std::vector<std::vector<int32_t>> toks = {make_tokens(40, V_, 21), make_tokens(40, V_, 22),
                                                  make_tokens(40, V_, 23)};
  Script script = {{{0, 10, Logits::kLast}, {1, 17, Logits::kLast}, {2, 5, Logits::kLast}}};
  // Decode: three sequences (contexts crossing a block boundary: new graph keys), then two, then
  // three again with one asking for no logits.
  for (int i = 0; i < 9; ++i)
    script.push_back({{0, 1, Logits::kLast}, {1, 1, Logits::kLast}, {2, 1, Logits::kLast}});
  for (int i = 0; i < 3; ++i) script.push_back({{0, 1, Logits::kLast}, {2, 1, Logits::kLast}});
  for (int i = 0; i < 3; ++i)
    script.push_back({{0, 1, Logits::kLast}, {1, 1, Logits::kNone}, {2, 1, Logits::kLast}});
  GpuEngineOptions on = small_options(), off = small_options();
  on.cuda_graphs = true;
  off.cuda_graphs = false;
  auto g_on = make_gpu(model_, on);
  auto g_off = make_gpu(model_, off);
  ASSERT_TRUE(g_on && g_off);
  const auto a = run_script(*g_on, toks, script);
  const auto b = run_script(*g_off, toks, script);
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t s = 0; s < 3; ++s) EXPECT_TRUE(bit_equal(a[s], b[s])) << "sequence " << s;
  EXPECT_EQ(g_off->num_graphs(), 0u);
  if (moe_) {
    EXPECT_EQ(g_on->num_graphs(), 0u) << "MoE layers sync the host: no graphs";
  } else {
    EXPECT_GE(g_on->num_graphs(), 2u);
    EXPECT_EQ(g_on->graph_error(), "");
  }
}

TEST_P(GpuEngineModel, PipelineStagesBitwise) {
  const int64_t E = model_->spec.n_embd, NL = model_->spec.n_layer;
  ASSERT_GE(NL, 2);
  const std::vector<std::vector<int32_t>> toks = {make_tokens(26, V_, 9)};
  Script script;
  for (int64_t at = 0; at < 23; at += 6)
    script.push_back({{0, std::min<int64_t>(6, 23 - at), Logits::kAll}});
  for (int i = 0; i < 3; ++i) script.push_back({{0, 1, Logits::kLast}});
  auto whole = make_gpu(model_, small_options());
  ASSERT_TRUE(whole);
  const auto ref = run_script(*whole, toks, script);
  ASSERT_EQ(ref.size(), 1u);

  GpuEngineOptions o0 = small_options(), o1 = small_options();
  o0.range = {0, 1, true, false};
  o1.range = {1, NL, false, true};
  auto s0 = make_gpu(model_, o0);
  auto s1 = make_gpu(model_, o1);
  ASSERT_TRUE(s0 && s1);
  Seq q0(s0->blocks(), toks[0]), q1(s1->blocks(), toks[0]);
  std::vector<float> got, hidden;
  for (const auto& step : script) {
    const Part& p = step[0];
    SeqStep a = q0.next(p.n, p.logits), b = q1.next(p.n, p.logits);
    StepResult r0, r1;
    const Status st0 = s0->step({&a, 1}, &r0, nullptr, &hidden);
    ASSERT_TRUE(st0.has_value()) << message(st0);
    ASSERT_EQ(static_cast<int64_t>(hidden.size()), p.n * E);
    EXPECT_TRUE(r0.logits.empty());
    const Status st1 = s1->step({&b, 1}, &r1, hidden.data());
    ASSERT_TRUE(st1.has_value()) << message(st1);
    got.insert(got.end(), r1.logits.begin(), r1.logits.end());
    q0.advance(p.n);
    q1.advance(p.n);
  }
  EXPECT_TRUE(bit_equal(ref[0], got));
}

INSTANTIATE_TEST_SUITE_P(AllArchitectures, GpuEngineModel, ::testing::ValuesIn(kModels),
                         [](const auto& info) {
                           return ::troupe::testing::model_param_name(info.param);
                         });

// ---- golden greedy tokens ---------------------------------------------------------------------

// The prompt in one chunk, then the reference's greedy tokens one at a time (teacher forcing):
// top-1 must be the reference's token wherever its recorded margin is clear of the bf16 error.
TEST(GpuEngineGolden, GreedyTokensMatchWhereMarginsAreClear) {
  TROUPE_REQUIRE_GPU();
  TROUPE_SHARED_OR_SKIP(shared);
  namespace fs = std::filesystem;
  using nlohmann::json;
  int cases = 0;
  for (const char* name : {"stories260K", "llama-dense", "llama-dense-f16", "mixtral-moe",
                           "qwen2moe", "qwen3moe", "deepseek2"}) {
    const fs::path dir = fs::path(shared) / "golden" / name;
    if (!fs::exists(dir)) continue;
    std::vector<fs::path> case_dirs;
    for (const auto& c : fs::directory_iterator(dir))
      if (fs::exists(c.path() / "case.json")) case_dirs.push_back(c.path());
    std::sort(case_dirs.begin(), case_dirs.end());
    for (const fs::path& cd : case_dirs) {
      const std::string what = std::string(name) + "/" + cd.filename().string();
      SCOPED_TRACE(what);
      const json j = json::parse(troupe::testing::read_text_file((cd / "case.json").string()));
      std::string mf = j.at("model_file").get<std::string>();
      if (mf.rfind("shared/", 0) == 0) mf = mf.substr(7);
      auto model = compute::load_model_for_test(shared + "/" + mf);
      ASSERT_TRUE(model) << mf;
      const int64_t V = model->spec.n_vocab;
      const auto prompt = j.at("prompt_tokens").get<std::vector<int32_t>>();
      const auto greedy = j.at("greedy_tokens").get<std::vector<int32_t>>();
      const auto margins = j.at("diagnostics").at("greedy_margins").get<std::vector<double>>();
      const auto ref = troupe::testing::read_f32_file((cd / "step_logits.f32").string());
      ASSERT_GE(ref.size(), greedy.size() * static_cast<size_t>(V));
      ASSERT_EQ(margins.size(), greedy.size());

      GpuEngineOptions o;  // the default workspace sizes
      o.max_tokens_in_cache = 256;
      auto eng = make_gpu(model, o);
      ASSERT_TRUE(eng);
      std::vector<int32_t> all = prompt;
      all.insert(all.end(), greedy.begin(), greedy.end());
      Seq seq(eng->blocks(), all);
      RowStats st;
      int clear = 0, clear_wrong = 0;
      int64_t n = static_cast<int64_t>(prompt.size());
      for (size_t s = 0; s < greedy.size(); ++s) {
        SeqStep step = seq.next(n, Logits::kLast);
        StepResult r;
        const Status ok = eng->step({&step, 1}, &r);
        ASSERT_TRUE(ok.has_value()) << message(ok);
        seq.advance(n);
        n = 1;
        const float* row = r.row(0);
        const float* want = &ref[s * static_cast<size_t>(V)];
        const int within_before = st.within;
        compare_row(row, want, V, &st);
        double mx = 0;
        for (int64_t i = 0; i < V; ++i) mx = std::max(mx, std::fabs(static_cast<double>(want[i])));
        if (st.within > within_before && margins[s] > kMarginFrac * mx) {
          ++clear;
          if (argmax(row, V) != greedy[s]) {
            ++clear_wrong;
            ADD_FAILURE() << what << " step " << s << ": top-1 " << argmax(row, V) << ", reference "
                          << greedy[s] << " (margin " << margins[s] << ")";
          }
        }
      }
      std::printf("[gpu-engine] golden %s: %d clear greedy steps, %d wrong\n", what.c_str(), clear,
                  clear_wrong);
      expect_stats(st, has_moe(model->spec), "golden " + what);
      ++cases;
    }
  }
  EXPECT_GE(cases, 21) << "expected 7 models x 3 cases under golden/";
}

// ---- bad steps and options --------------------------------------------------------------------

class GpuEngineErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    TROUPE_REQUIRE_GPU();
    TROUPE_SHARED_OR_SKIP(shared);
    model_ = compute::load_model_for_test(shared + "/models/stories260K/stories260K.gguf");
    ASSERT_TRUE(model_);
  }
  std::shared_ptr<const model::Model> model_;
};

// A step whose last position gives logits (the tests below vary the rest).
SeqStep last_step(int64_t pos0, std::span<const int32_t> tokens, std::span<const int32_t> blocks) {
  SeqStep st;
  st.pos0 = pos0;
  st.tokens = tokens;
  st.blocks = blocks;
  st.logits = Logits::kLast;
  return st;
}

TEST_F(GpuEngineErrors, RejectsBadStepsWithTheCpuMessages) {
  GpuEngineOptions o = small_options();
  o.max_tokens_in_cache = 64;  // 4 blocks
  o.max_step_tokens = 48;
  o.max_step_seqs = 2;
  auto e = make_gpu(model_, o);
  ASSERT_TRUE(e);
  std::vector<int32_t> blocks;
  ASSERT_TRUE(e->blocks().allocate(1, &blocks));
  auto expect_error = [&](const SeqStep* steps, size_t n, const std::string& text) {
    StepResult r;
    const Status s = e->step({steps, n}, &r);
    ASSERT_FALSE(s.has_value()) << "expected: " << text;
    EXPECT_NE(s.error().message.find(text), std::string::npos) << s.error().message;
  };
  const std::vector<int32_t> bad_token = {1, 512};
  SeqStep st = last_step(0, bad_token, blocks);
  expect_error(&st, 1, "token id 512 is outside the vocabulary");
  const std::vector<int32_t> many(40, 1);
  st = last_step(0, many, blocks);
  expect_error(&st, 1, "needs 3 KV blocks");
  st = last_step(0, {}, blocks);
  expect_error(&st, 1, "has no tokens");
  const std::vector<int32_t> one = {1};
  st = last_step(-1, one, blocks);
  expect_error(&st, 1, "negative position");
  const std::vector<int32_t> bad_block = {99};
  st = last_step(0, one, bad_block);
  expect_error(&st, 1, "block id 99 out of range");
  const std::vector<int32_t> four = {0, 1, 2, 3, 0};  // repeats a block: past the pool's 64 slots
  st = last_step(64, one, four);
  expect_error(&st, 1, "beyond the KV pool");
  const std::vector<int32_t> image = {SeqStep::kEmbedded};
  const std::vector<float> row(static_cast<size_t>(model_->spec.n_embd));
  st = last_step(0, image, blocks);
  st.embd = row;
  expect_error(&st, 1, "embedded (image) positions");
  st = last_step(0, one, blocks);
  st.non_causal = true;
  expect_error(&st, 1, "non-causal");
  const SeqStep three[3] = {last_step(0, one, blocks), last_step(0, one, blocks),
                            last_step(0, one, blocks)};
  expect_error(three, 3, "max_step_seqs");
  const std::vector<int32_t> thirty(30, 1);
  std::vector<int32_t> b2, b3;
  ASSERT_TRUE(e->blocks().allocate(2, &b2));
  ASSERT_TRUE(e->blocks().allocate(1, &b3));
  b3.push_back(b2[0]);  // not a real sharing, only long enough for the size check
  const SeqStep big[2] = {last_step(0, thirty, b2), last_step(0, thirty, b3)};
  expect_error(big, 2, "max_step_tokens");
  // A good step still works after the rejected ones.
  st = last_step(0, one, blocks);
  StepResult r;
  const Status ok = e->step({&st, 1}, &r);
  ASSERT_TRUE(ok.has_value()) << message(ok);
  ASSERT_EQ(r.logits.size(), static_cast<size_t>(model_->spec.n_vocab));
  for (float x : r.logits) ASSERT_TRUE(std::isfinite(x));
}

TEST_F(GpuEngineErrors, StageWithoutEmbeddingOrHeadNeedsHiddenStates) {
  GpuEngineOptions o = small_options();
  o.range = {2, 5, false, true};
  auto e = make_gpu(model_, o);
  ASSERT_TRUE(e);
  std::vector<int32_t> blocks;
  ASSERT_TRUE(e->blocks().allocate(1, &blocks));
  const std::vector<int32_t> one = {1};
  SeqStep st = last_step(0, one, blocks);
  StepResult r;
  const Status s = e->step({&st, 1}, &r);
  ASSERT_FALSE(s.has_value());
  EXPECT_NE(s.error().message.find("hidden states are required"), std::string::npos)
      << s.error().message;
  o.range = {0, 2, true, false};
  auto e2 = make_gpu(model_, o);
  ASSERT_TRUE(e2);
  std::vector<int32_t> blocks2;
  ASSERT_TRUE(e2->blocks().allocate(1, &blocks2));
  st.blocks = blocks2;
  const Status s2 = e2->step({&st, 1}, &r);
  ASSERT_FALSE(s2.has_value());
  EXPECT_NE(s2.error().message.find("a hidden-state buffer is required"), std::string::npos)
      << s2.error().message;
}

TEST_F(GpuEngineErrors, RejectsBadOptions) {
  GpuEngineOptions o = small_options();
  o.kv_block_size = 0;
  auto a = GpuEngine::create(model_, o);
  ASSERT_FALSE(a.has_value());
  EXPECT_NE(a.error().message.find("block size"), std::string::npos) << a.error().message;
  o = small_options();
  o.range = {3, 2, true, true};
  auto b = GpuEngine::create(model_, o);
  ASSERT_FALSE(b.has_value());
  EXPECT_NE(b.error().message.find("layer range"), std::string::npos) << b.error().message;
  o = small_options();
  o.device = 1000;
  auto c = GpuEngine::create(model_, o);
  ASSERT_FALSE(c.has_value());
  EXPECT_NE(c.error().message.find("does not exist"), std::string::npos) << c.error().message;
  o = small_options();
  o.max_tokens_in_cache = int64_t{1} << 46;  // more positions than int32 indices reach
  auto d = GpuEngine::create(model_, o);
  ASSERT_FALSE(d.has_value());
  EXPECT_NE(d.error().message.find("positions"), std::string::npos) << d.error().message;
  o = small_options();
  o.max_tokens_in_cache = int64_t{1} << 30;  // a 640 GiB KV pool: more than any GPU has
  auto f = GpuEngine::create(model_, o);
  ASSERT_FALSE(f.has_value());
  EXPECT_NE(f.error().message.find("out of device memory"), std::string::npos) << f.error().message;
  EXPECT_EQ(f.error().code, static_cast<int>(Errc::kOutOfMemory));
}

}  // namespace
}  // namespace troupe::gpu
