// gpu/sample: the GPU picks exactly the token compute::Sampler picks, draw after draw, for the
// same logits and seed: greedy (ties, NaN, all -inf), temperature alone, top-k (heap-sized and
// beyond the shared-memory sort), top-p (peaked, flat and tied logits: the edge-bucket replay),
// min-p, +inf logits; rows do not depend on the batch or the workspace; the host half keeps the
// RNG in step with the CPU's; bad input is refused on the host (those tests need no GPU).
// Tolerance: none. Every token must equal the CPU's (see gpu/sample.h for why that holds).
#include "gpu/sample.h"

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/check.h"
#include "compute/sampler.h"
#include "gpu/runtime.h"
#include "tests/gpu/gpu_test_util.h"

namespace troupe::gpu {
namespace {

using compute::Sampler;
using compute::SamplingParams;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

void expect_input_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no InputError; expected one mentioning '" << needle << "'";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// ---- logits ----

// LLM-like: a normal body, a few strong candidates, a long tail.
std::vector<float> peaked_logits(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> body(0.f, 2.5f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = body(rng);
  std::uniform_int_distribution<int64_t> pick(0, n - 1);
  for (int i = 0; i < 8; ++i)
    v[static_cast<size_t>(pick(rng))] = 9.f + static_cast<float>(i) * 0.7f;
  return v;
}

// A few tokens far apart (probabilities well separated), the rest far below.
std::vector<float> separated_logits(int64_t n, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(n), -30.f);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> pick(0, n - 1);
  for (int i = 0; i < 5; ++i) v[static_cast<size_t>(pick(rng))] = static_cast<float>(i) * 1.5f;
  return v;
}

// Values on a coarse grid: many exact ties, many tokens per top-p bucket.
std::vector<float> tied_logits(int64_t n, uint64_t seed) {
  std::vector<float> v = testing::random_floats(static_cast<size_t>(n), seed, -4.f, 4.f);
  for (auto& x : v) x = std::round(x * 2.f) / 2.f;
  return v;
}

// ---- the comparison ----

struct Request {
  std::string name;
  SamplingParams params;
  std::vector<float> logits;  // f32 [n_vocab]
  int draws = 16;             // consecutive tokens from one RNG stream
};

// Samples every request `draws` times on the CPU (one Sampler per request) and on the GPU (one
// row per draw, all requests in one launch) and expects the same tokens, and the same RNG state
// at the end. workspace_rows: how many rows the GPU samples at once.
void expect_same_tokens(const std::vector<Request>& reqs, int64_t workspace_rows = 8) {
  ASSERT_FALSE(reqs.empty());
  const int64_t n_vocab = static_cast<int64_t>(reqs[0].logits.size());
  std::vector<int32_t> want;
  std::vector<SampleRow> rows;
  std::vector<float> logits;
  std::vector<std::string> what;
  for (const Request& q : reqs) {
    ASSERT_EQ(static_cast<int64_t>(q.logits.size()), n_vocab);
    Sampler cpu(q.params);
    compute::SamplerState state = Sampler::seeded_state(q.params.seed);
    for (int d = 0; d < q.draws; ++d) {
      rows.push_back(make_sample_row(q.params, state));
      want.push_back(cpu.sample(q.logits, {}));
      logits.insert(logits.end(), q.logits.begin(), q.logits.end());
      what.push_back(q.name + " draw " + std::to_string(d) + " u " + std::to_string(rows.back().u));
    }
    EXPECT_TRUE(state == cpu.state()) << q.name << ": the RNG left the CPU's stream";
  }
  const auto num_rows = static_cast<int64_t>(rows.size());
  DeviceBuffer<float> d_logits(logits.size());
  d_logits.upload(logits);
  DeviceBuffer<SampleRow> d_rows(rows.size());
  d_rows.upload(rows);
  const int64_t per_row = sample_workspace_per_row(n_vocab);
  DeviceBuffer<uint64_t> ws(static_cast<size_t>(per_row * workspace_rows));
  ws.fill_bytes(0xFF);
  DeviceBuffer<int32_t> tokens(rows.size());
  tokens.fill_bytes(0xFF);
  sample_rows(d_logits.get(), num_rows, n_vocab, d_rows.get(), ws.get(),
              static_cast<int64_t>(ws.size()), tokens.get(), nullptr);
  TROUPE_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<int32_t> got = tokens.download();
  int bad = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    if (got[r] != want[r] && ++bad <= 10)
      ADD_FAILURE() << what[r] << ": GPU token " << got[r] << ", CPU token " << want[r];
  }
  EXPECT_EQ(bad, 0) << "of " << rows.size() << " draws";
}

SamplingParams params(float temperature, int32_t top_k, float top_p, float min_p, uint64_t seed) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  p.seed = seed;
  return p;
}

// ---- tests ----

TEST(GpuSample, ArgmaxMatchesCpuGreedy) {
  TROUPE_REQUIRE_GPU();
  const int64_t n = 5000;
  std::vector<std::vector<float>> rows;
  rows.push_back(peaked_logits(n, 1));
  rows.push_back(tied_logits(n, 2));  // ties: the lowest id wins
  std::vector<float> r(n, -kInf);
  rows.push_back(r);  // all -inf: 0
  r.assign(n, kNaN);
  rows.push_back(r);  // all NaN: 0
  r = peaked_logits(n, 3);
  r[10] = kNaN;
  r[4000] = 50.f;
  r[4001] = 50.f;
  rows.push_back(r);  // NaN ignored, tie at the max
  r.assign(n, 0.f);
  r[7] = -0.f;
  r[3] = -0.f;
  rows.push_back(r);  // +0 and -0 are one value: id 0 wins
  r = peaked_logits(n, 4);
  r[77] = kInf;
  r[99] = kInf;
  rows.push_back(r);  // first +inf
  std::vector<float> flat;
  std::vector<int32_t> want;
  SamplingParams greedy;
  for (const auto& row : rows) {
    flat.insert(flat.end(), row.begin(), row.end());
    Sampler cpu(greedy);
    want.push_back(cpu.sample(row, {}));
  }
  DeviceBuffer<float> d_logits(flat.size());
  d_logits.upload(flat);
  DeviceBuffer<int32_t> tokens(rows.size());
  tokens.fill_bytes(0xFF);
  argmax_rows(d_logits.get(), static_cast<int64_t>(rows.size()), n, tokens.get(), nullptr);
  TROUPE_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(tokens.download(), want);
  // The same rows through sample_rows with temperature 0.
  std::vector<Request> reqs;
  for (size_t i = 0; i < rows.size(); ++i)
    reqs.push_back({"greedy row " + std::to_string(i), greedy, rows[i], 1});
  expect_same_tokens(reqs);
}

TEST(GpuSample, TemperatureOnlyMatchesCpu) {
  TROUPE_REQUIRE_GPU();
  const int64_t n = 32000;
  expect_same_tokens({
      {"t=1 peaked", params(1.0f, 0, 1, 0, 11), peaked_logits(n, 11), 24},
      {"t=0.7 peaked", params(0.7f, 0, 1, 0, 12), peaked_logits(n, 12), 24},
      {"t=2.5 tied", params(2.5f, 0, 1, 0, 13), tied_logits(n, 13), 24},
      {"t=0.01 separated", params(0.01f, 0, 1, 0, 14), separated_logits(n, 14), 8},
  });
}

TEST(GpuSample, WellSeparatedProbabilitiesMatchCpu) {
  TROUPE_REQUIRE_GPU();
  const int64_t n = 1000;
  expect_same_tokens({
      {"plain", params(1.0f, 0, 1, 0, 21), separated_logits(n, 21), 32},
      {"top-k 3", params(1.0f, 3, 1, 0, 22), separated_logits(n, 22), 32},
      {"top-p 0.8", params(1.0f, 0, 0.8f, 0, 23), separated_logits(n, 23), 32},
  });
}

TEST(GpuSample, TopKMatchesCpu) {
  TROUPE_REQUIRE_GPU();
  const int64_t n = 32000;
  expect_same_tokens({
      {"k=40", params(0.8f, 40, 1, 0, 31), peaked_logits(n, 31), 24},
      {"k=1", params(1.0f, 1, 1, 0, 32), peaked_logits(n, 32), 4},
      {"k=40 tied", params(1.0f, 40, 1, 0, 33), tied_logits(n, 33), 24},
      {"k=3000 (global sort)", params(1.3f, 3000, 1, 0, 34), peaked_logits(n, 34), 8},
      {"k=5000 + top-p 0.9", params(1.0f, 5000, 0.9f, 0, 35), tied_logits(n, 35), 8},
      {"k=50 + top-p 0.7", params(0.9f, 50, 0.7f, 0, 36), peaked_logits(n, 36), 24},
      {"k=n (off)", params(1.0f, static_cast<int32_t>(n), 1, 0, 37), peaked_logits(n, 37), 8},
  });
}

TEST(GpuSample, TopPMatchesCpu) {
  TROUPE_REQUIRE_GPU();
  const int64_t n = 32000;
  expect_same_tokens({
      {"p=0.9 peaked", params(1.0f, 0, 0.9f, 0, 41), peaked_logits(n, 41), 24},
      {"p=0.95 t=1.5 peaked", params(1.5f, 0, 0.95f, 0, 42), peaked_logits(n, 42), 24},
      {"p=0.5 tied (big edge bucket)", params(1.0f, 0, 0.5f, 0, 43), tied_logits(n, 43), 24},
      {"p=0.3 flat (global sort)", params(1.0f, 0, 0.3f, 0, 44), std::vector<float>(n, 1.f), 24},
      {"p=0.999 peaked", params(0.8f, 0, 0.999f, 0, 45), peaked_logits(n, 45), 24},
  });
}

TEST(GpuSample, MinPMatchesCpu) {
  TROUPE_REQUIRE_GPU();
  const int64_t n = 32000;
  expect_same_tokens({
      {"min-p 0.05", params(1.0f, 0, 1, 0.05f, 51), peaked_logits(n, 51), 24},
      {"min-p 0.1 + top-p 0.9", params(1.2f, 0, 0.9f, 0.1f, 52), peaked_logits(n, 52), 24},
      {"min-p 0.02 + top-k 100", params(1.0f, 100, 1, 0.02f, 53), tied_logits(n, 53), 24},
      {"min-p 1", params(1.0f, 0, 1, 1.0f, 54), tied_logits(n, 54), 8},
  });
}

TEST(GpuSample, NonFiniteLogitsMatchCpu) {
  TROUPE_REQUIRE_GPU();
  const int64_t n = 4096;
  std::vector<float> with_inf = peaked_logits(n, 61);
  for (int64_t i : {5, 17, 300, 301, 2000, 4095}) with_inf[static_cast<size_t>(i)] = kInf;
  std::vector<float> with_nan = peaked_logits(n, 62);
  for (int64_t i = 0; i < n; i += 3) with_nan[static_cast<size_t>(i)] = i % 2 ? kNaN : -kInf;
  expect_same_tokens({
      {"+inf plain", params(1.0f, 0, 1, 0, 61), with_inf, 16},
      {"+inf top-k 4", params(1.0f, 4, 1, 0, 62), with_inf, 16},
      {"+inf top-p 0.5", params(1.0f, 0, 0.5f, 0, 63), with_inf, 16},
      {"+inf top-k 5 top-p 0.6", params(1.0f, 5, 0.6f, 0.1f, 64), with_inf, 16},
      {"NaN and -inf, top-p", params(1.0f, 0, 0.9f, 0, 65), with_nan, 16},
      {"NaN and -inf, top-k", params(1.0f, 20, 1, 0, 66), with_nan, 16},
      {"all -inf", params(1.0f, 0, 0.9f, 0, 67), std::vector<float>(n, -kInf), 2},
      {"all NaN", params(1.0f, 10, 1, 0, 68), std::vector<float>(n, kNaN), 2},
  });
}

TEST(GpuSample, LargeVocabularyMatchesCpu) {
  TROUPE_REQUIRE_GPU();
  const int64_t n = 151936;  // Qwen's vocabulary
  expect_same_tokens({
      {"plain", params(1.0f, 0, 1, 0, 71), peaked_logits(n, 71), 4},
      {"top-k 20 top-p 0.8", params(0.7f, 20, 0.8f, 0, 72), peaked_logits(n, 72), 4},
      {"top-p 0.95", params(1.0f, 0, 0.95f, 0, 73), peaked_logits(n, 73), 4},
  });
}

TEST(GpuSample, RowsDoNotDependOnBatchOrWorkspace) {
  TROUPE_REQUIRE_GPU();
  const int64_t n = 8000;
  const std::vector<Request> reqs = {
      {"top-p", params(1.0f, 0, 0.9f, 0, 81), peaked_logits(n, 81), 6},
      {"top-k", params(1.0f, 30, 1, 0, 82), tied_logits(n, 82), 6},
      {"plain", params(0.9f, 0, 1, 0, 83), peaked_logits(n, 83), 6},
  };
  expect_same_tokens(reqs, 1);   // one row at a time, one workspace slice
  expect_same_tokens(reqs, 64);  // every row at once
  for (const Request& q : reqs) expect_same_tokens({q}, 2);
}

TEST(GpuSample, MakeSampleRowKeepsTheRngInStepWithTheCpu) {
  const std::vector<float> logits = peaked_logits(100, 91);
  for (float temperature : {0.0f, 0.8f}) {
    SamplingParams p = params(temperature, 0, 1, 0, 1234);
    Sampler cpu(p);
    compute::SamplerState state = Sampler::seeded_state(p.seed);
    for (int i = 0; i < 5; ++i) {
      const SampleRow row = make_sample_row(p, state);
      cpu.sample(logits, {});
      EXPECT_TRUE(state == cpu.state()) << "temperature " << temperature << " step " << i;
      if (temperature > 0) {
        EXPECT_GE(row.u, 0.0);
        EXPECT_LT(row.u, 1.0);
      }
    }
  }
}

TEST(GpuSample, MakeSampleRowTakesTheCpusLogOfMinP) {
  compute::SamplerState state = Sampler::seeded_state(5);
  for (float min_p : {1e-30f, 0.003f, 0.02f, 0.05f, 0.1f, 0.3333f, 0.77f, 1.0f}) {
    const SampleRow row = make_sample_row(params(1.0f, 0, 1, min_p, 5), state);
    EXPECT_EQ(row.log_min_p, std::log(min_p)) << "min_p " << min_p;  // sampler.cc cut_min_p
  }
  EXPECT_EQ(make_sample_row(params(1.0f, 0, 1, 0, 5), state).log_min_p, -kInf);
}

TEST(GpuSample, MakeSampleRowRefusesPenalties) {
  SamplingParams p = params(1.0f, 0, 1, 0, 1);
  p.repetition_penalty = 1.1f;
  EXPECT_FALSE(gpu_sampler_supports(p));
  compute::SamplerState state = Sampler::seeded_state(1);
  expect_input_error([&] { make_sample_row(p, state); }, "penalties are not supported");
}

TEST(GpuSample, MakeSampleRowRefusesInvalidParams) {
  SamplingParams p = params(1.0f, 0, 1.5f, 0, 1);
  compute::SamplerState state = Sampler::seeded_state(1);
  expect_input_error([&] { make_sample_row(p, state); }, "top_p must be in (0, 1]");
}

TEST(GpuSample, SampleRowsRefusesSmallWorkspace) {
  expect_input_error(
      [] { sample_rows(nullptr, 1, 1000, nullptr, nullptr, 1000, nullptr, nullptr); },
      "workspace of 1000 elements is smaller than one row's 1024");
}

TEST(GpuSample, ArgmaxRefusesHugeVocabulary) {
  expect_input_error([] { argmax_rows(nullptr, 1, kMaxSampleVocab + 1, nullptr, nullptr); },
                     "n_vocab must be in [1, 1048576], got 1048577");
}

}  // namespace
}  // namespace troupe::gpu
