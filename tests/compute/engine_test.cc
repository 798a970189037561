// Batch invariance and determinism of the engine: a sequence's logits are bit-identical alone or
// in any batch, prefilled in one chunk, several chunks or token by token, with 1 or 2 threads.
#include "compute/engine.h"

#include <cstring>
#include <random>
#include <string>
#include <tuple>

#include "compute/thread_pool.h"
#include "model/synth.h"
#include "tests/compute/engine_test_util.h"
#include "tests/test_support.h"

namespace troupe::compute {
namespace {

std::vector<int32_t> make_tokens(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& t : v) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  return v;
}

// A model, and what its KV cache stores: rounding K and V to f16 or bf16 when they are written
// keeps every invariance (the rounding of a value depends on that value alone).
class EngineInvariance : public ::testing::TestWithParam<std::tuple<const char*, KvType>> {};

TEST_P(EngineInvariance, LogitsBitIdenticalAcrossBatchingChunkingAndThreads) {
  TROUPE_SHARED_OR_SKIP(shared);
  auto model = load_model_for_test(shared + "/" + std::get<0>(GetParam()));
  ASSERT_TRUE(model);
  const int64_t V = model->spec.n_vocab;
  EngineOptions o1;
  o1.max_tokens_in_cache = 1024;
  o1.kv_type = std::get<1>(GetParam());
  EngineOptions o2 = o1;
  o2.n_threads = 2;
  auto e1 = Engine::create(model, o1);
  auto e2 = Engine::create(model, o2);
  ASSERT_TRUE(e1 && e2);
  const auto a = make_tokens(29, V, 1), b = make_tokens(11, V, 2), c = make_tokens(40, V, 3);

  const auto ref = run_chunks(**e1, a, {29});
  ASSERT_EQ(ref.size(), a.size() * static_cast<size_t>(V));
  EXPECT_TRUE(bit_equal(ref, run_chunks(**e1, a, {5, 7, 3}))) << "chunked prefill";
  EXPECT_TRUE(bit_equal(ref, run_chunks(**e1, a, {1}))) << "token by token";
  EXPECT_TRUE(bit_equal(ref, run_chunks(**e2, a, {29}))) << "2 threads";
  EXPECT_TRUE(bit_equal(ref, run_chunks(**e2, a, {4, 1, 9}))) << "2 threads, chunked";
  // Many threads: attention splits one token's query heads into smaller pieces (head_part).
  EngineOptions o8 = o1;
  o8.n_threads = 8;
  auto e8 = Engine::create(model, o8);
  ASSERT_TRUE(e8);
  EXPECT_TRUE(bit_equal(ref, run_chunks(**e8, a, {1}))) << "8 threads, token by token";

  // `a` prefilled in chunks of 8 inside steps that also carry other sequences: `b` decoding one
  // token at a time after its prompt, and `c` prefilling with a different chunk size.
  for (Engine* eng : {e1->get(), e2->get()}) {
    Sequence sa(*eng), sb(*eng), sc(*eng);
    ASSERT_TRUE(sa.reserve(29) && sb.reserve(11) && sc.reserve(40));
    std::vector<float> got;
    size_t ia = 0, ib = 0, ic = 0;
    while (ia < a.size()) {
      std::vector<SeqStep> steps;
      std::vector<int64_t> adv;
      // Put `a` in the middle of the batch so its rows sit at a varying offset.
      if (ib < b.size()) {
        const int64_t n = ib == 0 ? 6 : 1;
        steps.push_back(sb.next({b.data() + ib, static_cast<size_t>(n)}, SeqStep::Logits::kLast));
        adv.push_back(n);
      }
      const int64_t na = std::min<int64_t>(8, static_cast<int64_t>(a.size() - ia));
      const size_t a_idx = steps.size();
      steps.push_back(sa.next({a.data() + ia, static_cast<size_t>(na)}, SeqStep::Logits::kAll));
      if (ic < c.size()) {
        const int64_t n = std::min<int64_t>(13, static_cast<int64_t>(c.size() - ic));
        steps.push_back(sc.next({c.data() + ic, static_cast<size_t>(n)}, SeqStep::Logits::kLast));
      }
      StepResult r;
      ASSERT_TRUE(eng->step(steps, &r).has_value());
      got.insert(got.end(), r.row(a_idx), r.row(a_idx) + na * V);
      size_t k = 0;
      if (ib < b.size()) {
        sb.advance(adv[0]);
        ib += static_cast<size_t>(adv[0]);
        ++k;
      }
      sa.advance(na);
      ia += static_cast<size_t>(na);
      if (ic < c.size()) {
        const int64_t n = std::min<int64_t>(13, static_cast<int64_t>(c.size() - ic));
        sc.advance(n);
        ic += static_cast<size_t>(n);
      }
    }
    EXPECT_TRUE(bit_equal(ref, got)) << "mixed batch, threads=" << eng->n_threads();
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllArchitectures, EngineInvariance,
    ::testing::Combine(::testing::Values("models/stories260K/stories260K.gguf",
                                         "models/synth/llama-dense-f16/model.gguf",
                                         "models/synth/mixtral-moe/model.gguf",
                                         "models/synth/qwen2moe/model.gguf",
                                         "models/synth/qwen3moe/model.gguf",
                                         "models/synth/deepseek2/model.gguf"),
                       ::testing::Values(KvType::kF32, KvType::kF16, KvType::kBF16)),
    [](const auto& info) {
      const KvType kv = std::get<1>(info.param);
      return ::troupe::testing::model_param_name(std::get<0>(info.param)) +
             (kv == KvType::kF32 ? "" : "_kv_" + std::string(kv_type_name(kv)));
    });

// Multi-head latent attention with many heads and no query compression (DeepSeek-V2-Lite's
// form: q from h directly, beside the KV latent's projection), at sizes where every head's
// absorbed products run together on two threads even for one token (16 x 128 x 32 multiply-adds
// each way, twice matmul.cc's kMinParallelMacs): the same bits as one thread, chunked or not,
// and beside another sequence.
TEST(Engine, MlaWithManyHeadsAndNoQueryCompressionIsBatchInvariant) {
  testing::TempDir dir;
  model::SynthOptions o;
  o.arch = "deepseek2";
  o.dtype = model::GgmlType::kQ8_0;
  o.n_embd = 128;
  o.n_layer = 2;
  o.n_head = 16;
  o.q_lora_rank = 0;
  o.kv_lora_rank = 128;
  o.qk_rope_dim = 16;
  o.qk_nope_dim = 32;
  o.v_head_dim = 32;
  const std::string path = dir.file("mla.gguf");
  ASSERT_TRUE(model::synth_model(o, path).has_value());
  auto m = load_model_for_test(path);
  ASSERT_TRUE(m);
  ASSERT_TRUE(m->spec.is_mla());
  ASSERT_FALSE(m->spec.layers[0].wq_a.present());
  expect_batch_invariant(m);
}

TEST(Engine, RejectsBadSteps) {
  TROUPE_SHARED_OR_SKIP(shared);
  auto model = load_model_for_test(shared + "/models/stories260K/stories260K.gguf");
  ASSERT_TRUE(model);
  EngineOptions o;
  o.max_tokens_in_cache = 64;
  auto e = Engine::create(model, o);
  ASSERT_TRUE(e);
  Sequence seq(**e);
  ASSERT_TRUE(seq.reserve(4));
  StepResult r;
  std::vector<int32_t> bad = {1, 512};
  SeqStep st = seq.next(bad, SeqStep::Logits::kLast);
  auto s1 = (*e)->step({&st, 1}, &r);
  ASSERT_FALSE(s1.has_value());
  EXPECT_NE(s1.error().message.find("token id 512 is outside the vocabulary"), std::string::npos)
      << s1.error().message;
  std::vector<int32_t> many(40, 1);
  SeqStep st2 = seq.next(many, SeqStep::Logits::kLast);
  auto s2 = (*e)->step({&st2, 1}, &r);
  ASSERT_FALSE(s2.has_value());
  EXPECT_NE(s2.error().message.find("needs 3 KV blocks"), std::string::npos) << s2.error().message;
  SeqStep empty = seq.next({}, SeqStep::Logits::kLast);
  EXPECT_FALSE((*e)->step({&empty, 1}, &r).has_value());
}

TEST(Engine, PoolExhaustionIsReported) {
  TROUPE_SHARED_OR_SKIP(shared);
  auto model = load_model_for_test(shared + "/models/stories260K/stories260K.gguf");
  ASSERT_TRUE(model);
  EngineOptions o;
  o.kv_num_blocks = 2;
  o.kv_block_size = 16;
  auto e = Engine::create(model, o);
  ASSERT_TRUE(e);
  Sequence a(**e), b(**e);
  EXPECT_TRUE(a.reserve(20));
  EXPECT_FALSE(b.reserve(20));
  EXPECT_EQ((*e)->blocks().num_free(), 0);
}

TEST(Engine, RejectsBadOptions) {
  TROUPE_SHARED_OR_SKIP(shared);
  auto model = load_model_for_test(shared + "/models/stories260K/stories260K.gguf");
  EngineOptions o;
  o.n_threads = 0;
  auto e = Engine::create(model, o);
  ASSERT_FALSE(e);
  EXPECT_NE(e.error().message.find("thread count"), std::string::npos);
}

}  // namespace
}  // namespace troupe::compute

namespace troupe::compute {
namespace {

// Sends each expert's rows to one of two ExpertCompute instances (each with its own pool), as an
// expert-shard split would.
class SplitExperts : public ExpertRunner {
 public:
  explicit SplitExperts(std::shared_ptr<const model::Model> m)
      : p1_(1), p2_(2), a_(m, &p1_), b_(m, &p2_) {}
  void run(int64_t layer, std::span<const ExpertTask> tasks) override {
    std::vector<ExpertTask> even, odd;
    for (const auto& t : tasks) (t.expert % 2 == 0 ? even : odd).push_back(t);
    a_.run(layer, even);
    b_.run(layer, odd);
    ++calls;
  }
  int calls = 0;

 private:
  ThreadPool p1_, p2_;
  ExpertCompute a_, b_;
};

class EngineSplit : public ::testing::TestWithParam<const char*> {};

TEST_P(EngineSplit, PipelineStagesAndExpertShardsAreBitIdentical) {
  TROUPE_SHARED_OR_SKIP(shared);
  auto model = load_model_for_test(shared + "/" + GetParam());
  ASSERT_TRUE(model);
  const int64_t V = model->spec.n_vocab, E = model->spec.n_embd, NL = model->spec.n_layer;
  EngineOptions o;
  o.max_tokens_in_cache = 256;
  auto whole = Engine::create(model, o);
  ASSERT_TRUE(whole);
  const auto toks = make_tokens(23, V, 9);
  const auto ref = run_chunks(**whole, toks, {23});

  // Stage 0: layers [0, 1) with the embedding; stage 1: [1, NL) with the head.
  EngineOptions o0 = o, o1 = o;
  o0.range = {0, 1, true, false};
  o1.range = {1, NL, false, true};
  SplitExperts split(model);
  o1.expert_runner = &split;
  o1.n_threads = 2;
  auto s0 = Engine::create(model, o0);
  auto s1 = Engine::create(model, o1);
  ASSERT_TRUE(s0 && s1);
  Sequence q0(**s0), q1(**s1);
  ASSERT_TRUE(q0.reserve(23) && q1.reserve(23));
  std::vector<float> got, hidden;
  for (int64_t at = 0; at < 23;) {
    const int64_t n = std::min<int64_t>(6, 23 - at);
    std::span<const int32_t> chunk(toks.data() + at, static_cast<size_t>(n));
    SeqStep a = q0.next(chunk, SeqStep::Logits::kAll), b = q1.next(chunk, SeqStep::Logits::kAll);
    StepResult r0, r1;
    ASSERT_TRUE((*s0)->step({&a, 1}, &r0, nullptr, &hidden).has_value());
    ASSERT_EQ(static_cast<int64_t>(hidden.size()), n * E);
    ASSERT_TRUE((*s1)->step({&b, 1}, &r1, hidden.data()).has_value());
    got.insert(got.end(), r1.logits.begin(), r1.logits.end());
    q0.advance(n);
    q1.advance(n);
    at += n;
  }
  EXPECT_TRUE(bit_equal(ref, got));
  if (model->spec.n_expert > 0) {
    EXPECT_GT(split.calls, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    MoeAndDense, EngineSplit,
    ::testing::Values("models/synth/mixtral-moe/model.gguf", "models/synth/deepseek2/model.gguf",
                      "models/synth/qwen2moe/model.gguf", "models/stories260K/stories260K.gguf"),
    [](const auto& info) { return ::troupe::testing::model_param_name(info.param); });

TEST(Engine, StageWithoutEmbeddingNeedsHiddenStates) {
  TROUPE_SHARED_OR_SKIP(shared);
  auto model = load_model_for_test(shared + "/models/stories260K/stories260K.gguf");
  EngineOptions o;
  o.range = {2, 5, false, true};
  o.max_tokens_in_cache = 32;
  auto e = Engine::create(model, o);
  ASSERT_TRUE(e);
  Sequence q(**e);
  ASSERT_TRUE(q.reserve(1));
  const int32_t t = 1;
  SeqStep st = q.next({&t, 1}, SeqStep::Logits::kLast);
  StepResult r;
  auto s = (*e)->step({&st, 1}, &r);
  ASSERT_FALSE(s.has_value());
  EXPECT_NE(s.error().message.find("hidden states are required"), std::string::npos);
  o.range = {3, 9, true, true};
  auto bad = Engine::create(model, o);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("layer range [3, 9) is not inside [0, 5)"), std::string::npos);
}

}  // namespace
}  // namespace troupe::compute
