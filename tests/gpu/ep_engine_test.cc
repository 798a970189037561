// Data-parallel attention with expert parallelism (GpuEngineOptions::ep): two or four GpuEngine
// ranks, each stepping its own sequences on its own KV pool and holding a share of the experts,
// their MoE rows exchanged by all-to-all (the one-GPU stand-in group: every rank on GPU 0, one
// thread each). Every sequence's logits are bitwise those of one GpuEngine running all the
// sequences; a rank with no sequence in a step still serves its experts. MoE models of
// ../shared only (a dense model has nothing to exchange).
#include <cstring>
#include <exception>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "compute/engine.h"
#include "compute/kv_pools.h"
#include "gpu/collective.h"
#include "gpu/dp_engine.h"
#include "gpu/engine.h"
#include "gpu/runtime.h"
#include "tests/compute/engine_test_util.h"
#include "tests/gpu/engine_test_util.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_support.h"

namespace troupe::gpu {
namespace {

using namespace enginetest;  // NOLINT(google-build-using-namespace): the test helpers

const char* const kMoeModels[] = {
    "models/synth/mixtral-moe/model.gguf", "models/synth/qwen3moe/model.gguf",
    "models/synth/qwen2moe/model.gguf", "models/synth/deepseek2/model.gguf"};

class EpEngineModel : public GpuModelTest {};

// Sequence i's tokens and the rank it lives on; a script step lists (sequence, tokens, logits).
struct Plan {
  std::vector<std::vector<int32_t>> toks;
  std::vector<int> rank_of;
  Script script;
};

Plan make_plan(int64_t V, int ranks) {
  Plan p;
  for (int i = 0; i < 5; ++i) p.toks.push_back(make_tokens(24, V, 70 + static_cast<uint32_t>(i)));
  // Sequences 0, 3 on rank 0; 1, 4 on rank 1; 2 on the last rank (rank 1 with two ranks).
  p.rank_of = {0, 1, ranks - 1, 0, 1};
  p.script = {{{0, 9, Logits::kAll}, {1, 4, Logits::kLast}, {2, 13, Logits::kAll}},
              {{0, 1, Logits::kLast}, {3, 7, Logits::kAll}},  // ranks 1.. have nothing here
              {{1, 6, Logits::kAll}, {2, 1, Logits::kLast}, {4, 11, Logits::kLast}}};
  for (int s = 0; s < 3; ++s)
    p.script.push_back({{0, 1, Logits::kLast},
                        {1, 1, Logits::kLast},
                        {2, 1, Logits::kLast},
                        {3, 1, Logits::kLast},
                        {4, 1, Logits::kLast}});
  return p;
}

// Runs the plan with each sequence on its rank, every rank stepping at every script step (with
// its part, possibly empty); returns the logits rows each sequence received, in order.
std::vector<std::vector<float>> run_ranks(std::vector<std::unique_ptr<GpuEngine>>& engines,
                                          const Plan& p) {
  const size_t n = engines.size();
  std::vector<std::vector<float>> got(p.toks.size());
  std::vector<std::unique_ptr<Seq>> by_seq(p.toks.size());
  for (size_t i = 0; i < p.toks.size(); ++i)
    by_seq[i] =
        std::make_unique<Seq>(engines[static_cast<size_t>(p.rank_of[i])]->blocks(), p.toks[i]);
  for (size_t s = 0; s < p.script.size(); ++s) {
    std::vector<std::vector<SeqStep>> steps(n);
    std::vector<std::vector<Part>> parts(n);
    for (const Part& part : p.script[s]) {
      const auto r = static_cast<size_t>(p.rank_of[static_cast<size_t>(part.seq)]);
      steps[r].push_back(by_seq[static_cast<size_t>(part.seq)]->next(part.n, part.logits));
      parts[r].push_back(part);
    }
    // Every rank's step checked before any starts (a refusing rank would leave the rest waiting).
    for (size_t r = 0; r < n; ++r) {
      StepResult probe;
      const Status v = engines[r]->check_step(steps[r], &probe, nullptr, nullptr);
      EXPECT_TRUE(v.has_value()) << "rank " << r << ": " << message(v);
      if (!v.has_value()) return {};
    }
    std::vector<StepResult> res(n);
    std::vector<Status> st(n, Status{Ok{}});
    std::vector<std::thread> threads;
    for (size_t r = 0; r < n; ++r)
      threads.emplace_back([&, r] {
        if (cudaSetDevice(0) != cudaSuccess) {
          st[r] = Error{1, "cudaSetDevice(0) failed"};
          return;
        }
        st[r] = engines[r]->step(steps[r], &res[r]);
      });
    for (std::thread& t : threads) t.join();
    for (size_t r = 0; r < n; ++r) {
      EXPECT_TRUE(st[r].has_value()) << "step " << s << " rank " << r << ": " << message(st[r]);
      if (!st[r].has_value()) return {};
      for (size_t i = 0; i < parts[r].size(); ++i) {
        const Part& part = parts[r][i];
        auto& out = got[static_cast<size_t>(part.seq)];
        if (res[r].row_count[i] > 0) {
          const float* row = res[r].row(i);
          out.insert(out.end(), row, row + res[r].row_count[i] * res[r].n_vocab);
        }
        by_seq[static_cast<size_t>(part.seq)]->advance(part.n);
      }
    }
  }
  return got;
}

TEST_P(EpEngineModel, RanksGiveTheOneGpuEnginesBitsForEverySequence) {
  auto one = make_gpu(model_, small_options());
  ASSERT_TRUE(one);
  for (int ranks : {2, 4}) {
    if (model_->spec.n_expert % ranks != 0) continue;
    const Plan p = make_plan(V_, ranks);
    const auto want = run_script(*one, p.toks, p.script);
    ASSERT_EQ(want.size(), p.toks.size());
    GpuEngineOptions o = small_options();
    const size_t a2a = static_cast<size_t>(ranks * o.max_step_tokens * model_->spec.n_expert_used *
                                           model_->spec.n_embd) *
                       sizeof(float);
    TROUPE_CUDA_CHECK(cudaSetDevice(0));
    auto group = make_local_group(ranks, 64, a2a);
    std::vector<std::unique_ptr<GpuEngine>> engines;
    for (int r = 0; r < ranks; ++r) {
      o.ep = group[static_cast<size_t>(r)].get();
      auto e = GpuEngine::create(model_, o);
      ASSERT_TRUE(e.has_value()) << e.error().message;
      engines.push_back(std::move(*e));
    }
    const auto got = run_ranks(engines, p);
    ASSERT_EQ(got.size(), p.toks.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_FALSE(got[i].empty()) << "sequence " << i;
      EXPECT_TRUE(bit_equal(got[i], want[i]))
          << ranks << " ranks: sequence " << i << " (on rank " << p.rank_of[i]
          << ") differs from the one-GPU engine";
    }
    // Each rank holds its share of the experts only.
    EXPECT_LT(engines[0]->weight_bytes(), one->weight_bytes());
    engines.clear();
  }
}

TEST_P(EpEngineModel, RefusesAGroupTheExpertsDoNotDivide) {
  const int64_t ne = model_->spec.n_expert;
  int ranks = 3;
  while (ne % ranks == 0) ++ranks;
  TROUPE_CUDA_CHECK(cudaSetDevice(0));
  auto group = make_local_group(ranks, 64, 1 << 20);
  GpuEngineOptions o = small_options();
  o.ep = group[0].get();
  auto e = GpuEngine::create(model_, o);
  ASSERT_FALSE(e.has_value());
  EXPECT_NE(e.error().message.find("do not divide over " + std::to_string(ranks)),
            std::string::npos)
      << e.error().message;
}

TEST_P(EpEngineModel, DpEngineGivesTheOneGpuEnginesBits) {
  // GpuDpEngine over 2 stand-in ranks, its block ids handed out by compute::KvPools (one pool per
  // rank, as the scheduler does): every sequence's logits are the one-GPU engine's, bitwise.
  if (model_->spec.n_expert % 2 != 0) GTEST_SKIP() << "odd expert count";
  GpuEngineOptions o = small_options();
  o.kv_num_blocks = 64;
  auto dp = GpuDpEngine::create(model_, o, {0, 0});
  ASSERT_TRUE(dp.has_value()) << dp.error().message;
  EXPECT_EQ((*dp)->blocks_per_rank(), 32);
  compute::KvBlockManagerConfig kc;
  kc.num_blocks = 64;
  kc.block_size = kBlockSize;
  kc.enable_prefix_cache = false;
  compute::KvPools pools(kc, 2);
  const Plan p = make_plan(V_, 2);
  auto one = make_gpu(model_, small_options());
  ASSERT_TRUE(one);
  const auto want = run_script(*one, p.toks, p.script);
  std::vector<std::vector<float>> got(p.toks.size());
  std::vector<int64_t> len(p.toks.size(), 0);
  for (size_t i = 0; i < p.toks.size(); ++i)
    ASSERT_TRUE(pools.add_sequence(static_cast<int64_t>(i), p.toks[i]).has_value());
  for (size_t s = 0; s < p.script.size(); ++s) {
    std::vector<SeqStep> steps;
    std::vector<std::vector<int32_t>> tables;
    tables.reserve(p.script[s].size());
    for (const Part& part : p.script[s]) {
      const auto i = static_cast<size_t>(part.seq);
      ASSERT_TRUE(pools.reserve(part.seq, len[i] + part.n));
      const auto t = pools.block_table(part.seq);
      tables.emplace_back(t.begin(), t.end());
      SeqStep st;
      st.pos0 = len[i];
      st.tokens = std::span<const int32_t>(p.toks[i].data() + len[i], static_cast<size_t>(part.n));
      st.blocks = tables.back();
      st.logits = part.logits;
      steps.push_back(st);
    }
    StepResult r;
    const Status st = (*dp)->step(steps, &r);
    ASSERT_TRUE(st.has_value()) << "step " << s << ": " << message(st);
    for (size_t k = 0; k < steps.size(); ++k) {
      const auto i = static_cast<size_t>(p.script[s][k].seq);
      if (r.row_count[k] > 0)
        got[i].insert(got[i].end(), r.row(k), r.row(k) + r.row_count[k] * r.n_vocab);
      len[i] += p.script[s][k].n;
    }
  }
  std::set<int64_t> ranks_used;
  for (size_t i = 0; i < p.toks.size(); ++i) {
    ranks_used.insert(pools.pool_of(static_cast<int64_t>(i)));
    EXPECT_TRUE(bit_equal(got[i], want[i]))
        << "sequence " << i << " on rank " << pools.pool_of(static_cast<int64_t>(i));
  }
  EXPECT_EQ(ranks_used.size(), 2u) << "both ranks got sequences";
  // A sequence with blocks on both ranks is refused before anything runs.
  SeqStep bad;
  const std::vector<int32_t> split = {0, 40};
  bad.tokens = std::span<const int32_t>(p.toks[0].data(), 20);
  bad.blocks = split;
  StepResult r;
  const Status refused = (*dp)->step({&bad, 1}, &r);
  ASSERT_FALSE(refused.has_value());
  EXPECT_NE(refused.error().message.find("block id 40 is not on rank 0"), std::string::npos)
      << refused.error().message;
}

INSTANTIATE_TEST_SUITE_P(MoeArchitectures, EpEngineModel, ::testing::ValuesIn(kMoeModels),
                         [](const auto& info) {
                           return ::troupe::testing::model_param_name(info.param);
                         });

}  // namespace
}  // namespace troupe::gpu
