// Tensor parallelism on the GPU: the group's ordered sum (gpu/collective.h) is bitwise the host's
// rank-order sum on every rank, from the local stand-in group and from NCCL across GPUs; an
// aborted group wakes its waiting ranks with an error instead of hanging; GpuTpEngine
// (gpu/tp_engine.h) with 2 and 4 ranks matches the CPU engine within the GPU engine's tolerances
// (tests/gpu/engine_test_util.h) for dense and every MoE architecture (experts split whole or by
// width), keeps batch and chunk invariance bitwise, gives the same bits with the micro-batch
// overlap on and off and through NCCL on two GPUs as through the one-GPU stand-in. Without a GPU
// only the device-list check runs; with one GPU the NCCL tests skip and say so (NCCL takes one
// rank per GPU).
#include "gpu/tp_engine.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "base/check.h"
#include "compute/engine.h"
#include "gpu/collective.h"
#include "gpu/comm.h"
#include "gpu/runtime.h"
#include "tests/compute/engine_test_util.h"
#include "tests/gpu/engine_test_util.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/group_test_util.h"
#include "tests/test_support.h"

namespace troupe::gpu {
namespace {

using namespace enginetest;  // NOLINT(google-build-using-namespace): the test helpers

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

// Values over many binades, so that a different summation order would change the bits.
std::vector<float> spread_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mant(-1.f, 1.f);
  std::uniform_int_distribution<int> ex(-12, 12);
  std::vector<float> v(n);
  for (float& x : v) x = std::ldexp(mant(rng), ex(rng));
  return v;
}

// Each rank's data for one round, and the host's rank-order sum of them.
struct Round {
  std::vector<std::vector<float>> parts;
  std::vector<float> sum;
};

Round make_round(int ranks, size_t count, uint32_t seed) {
  Round r;
  for (int p = 0; p < ranks; ++p)
    r.parts.push_back(spread_values(count, seed * 31 + static_cast<uint32_t>(p)));
  r.sum = r.parts[0];
  for (int p = 1; p < ranks; ++p)
    for (size_t i = 0; i < count; ++i) r.sum[i] += r.parts[static_cast<size_t>(p)][i];
  return r;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Every rank (one thread each, on devices[rank]) runs the rounds through its Collective and
// checks its result against the host's sum. Counts vary per round: slot reuse and uneven
// slices (count not a multiple of the group size) are both exercised.
void check_rounds(std::vector<std::unique_ptr<Collective>>& group, const std::vector<int>& devices,
                  const std::vector<size_t>& counts) {
  const int n = static_cast<int>(group.size());
  std::vector<Round> rounds;
  for (size_t k = 0; k < counts.size(); ++k)
    rounds.push_back(make_round(n, counts[k], static_cast<uint32_t>(k + 1)));
  std::vector<std::string> failures(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      const auto ru = static_cast<size_t>(r);
      try {
        TROUPE_CUDA_CHECK(cudaSetDevice(devices[ru]));
        StreamPair sp;
        for (size_t k = 0; k < rounds.size(); ++k) {
          DeviceBuffer<float> buf(counts[k]);
          buf.upload(rounds[k].parts[ru]);
          group[ru]->all_reduce_sum(buf.get(), counts[k], sp.comm());
          group[ru]->synchronize(sp.comm());
          if (!same_bits(buf.download(), rounds[k].sum))
            failures[ru] += "round " + std::to_string(k) + " (" + std::to_string(counts[k]) +
                            " floats) differs from the host's rank-order sum; ";
        }
      } catch (const std::exception& ex) {
        failures[ru] += ex.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < n; ++r)
    EXPECT_EQ(failures[static_cast<size_t>(r)], "") << "rank " << r << " of " << n;
}

// ---- without a GPU ----------------------------------------------------------------------------

TEST(GpuTpEngine, RefusesAMixedDeviceList) {
  // Checked before anything touches a GPU: runs everywhere.
  auto model = std::make_shared<model::Model>();
  auto e = GpuTpEngine::create(model, GpuEngineOptions{}, {0, 0, 1});
  ASSERT_FALSE(e.has_value());
  EXPECT_NE(e.error().message.find("not a mix"), std::string::npos) << e.error().message;
  EXPECT_EQ(e.error().code, static_cast<int>(Errc::kBadInput));
  auto none = GpuTpEngine::create(model, GpuEngineOptions{}, {});
  ASSERT_FALSE(none.has_value());
  EXPECT_NE(none.error().message.find("no devices"), std::string::npos) << none.error().message;
}

// ---- the ordered sum --------------------------------------------------------------------------

TEST(Collective, SumPartsIsTheHostsRankOrderSumBitwise) {
  TROUPE_REQUIRE_GPU();
  const size_t count = 100003, stride = 100096;
  const Round r = make_round(3, count, 7);
  std::vector<float> packed(3 * stride, std::nanf(""));
  for (size_t p = 0; p < 3; ++p)
    std::copy(r.parts[p].begin(), r.parts[p].end(), &packed[p * stride]);
  DeviceBuffer<float> parts(packed.size()), out(count);
  parts.upload(packed);
  out.fill_bytes(0xFF);
  launch_sum_parts(parts.get(), 3, stride, count, out.get(), nullptr);
  TROUPE_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(same_bits(out.download(), r.sum));
  // In place over the first part.
  launch_sum_parts(parts.get(), 3, stride, count, parts.get(), nullptr);
  TROUPE_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> first = parts.download();
  first.resize(count);
  EXPECT_TRUE(same_bits(first, r.sum));
  // The order matters for these values: the reverse order gives other bits somewhere.
  std::vector<float> reverse = r.parts[2];
  for (size_t i = 0; i < count; ++i) reverse[i] = (reverse[i] + r.parts[1][i]) + r.parts[0][i];
  EXPECT_FALSE(same_bits(reverse, r.sum)) << "the test values do not tell orders apart";
}

TEST(Collective, LocalGroupGivesEveryRankTheOrderedSum) {
  TROUPE_REQUIRE_GPU();
  TROUPE_CUDA_CHECK(cudaSetDevice(0));
  auto group = make_local_group(3, 5000);
  ASSERT_EQ(group.size(), 3u);
  EXPECT_EQ(group[1]->rank(), 1);
  EXPECT_EQ(group[1]->size(), 3);
  check_rounds(group, {0, 0, 0}, {5000, 1, 4097, 3, 5000, 77});
  try {
    std::vector<float> v(5001, 1.f);
    DeviceBuffer<float> buf(v.size());
    group[0]->all_reduce_sum(buf.get(), v.size(), nullptr);
    ADD_FAILURE() << "a sum over capacity was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("exceeds the group's 5000"), std::string::npos)
        << e.what();
  }
}

// Every rank sends rank p a block of (3 * r + p) % 5 * 1000 bytes (zeros included) whose bytes
// encode (sender, receiver, index); between two all-to-alls an all-reduce on the same group.
TEST(Collective, LocalAllToAllDeliversEveryBlockBetweenSums) {
  TROUPE_REQUIRE_GPU();
  TROUPE_CUDA_CHECK(cudaSetDevice(0));
  const int n = 3;
  auto group = make_local_group(n, 4096, 16384);
  auto bytes = [](int from, int to) { return static_cast<size_t>((3 * from + to) % 5) * 1000; };
  auto value = [](int from, int to, size_t i) {
    return static_cast<uint8_t>(from * 71 + to * 13 + static_cast<int>(i % 97));
  };
  const Round sums = make_round(n, 4096, 9);
  std::vector<std::string> failures(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      const auto ru = static_cast<size_t>(r);
      try {
        TROUPE_CUDA_CHECK(cudaSetDevice(0));
        StreamPair sp;
        std::vector<size_t> sb(n), rb(n);
        std::vector<uint8_t> send;
        for (int p = 0; p < n; ++p) {
          sb[static_cast<size_t>(p)] = bytes(r, p);
          rb[static_cast<size_t>(p)] = bytes(p, r);
          for (size_t i = 0; i < bytes(r, p); ++i) send.push_back(value(r, p, i));
        }
        std::vector<uint8_t> want;
        for (int q = 0; q < n; ++q)
          for (size_t i = 0; i < bytes(q, r); ++i) want.push_back(value(q, r, i));
        DeviceBuffer<uint8_t> d_send(send.size()), d_recv(want.size());
        d_send.upload(send);
        DeviceBuffer<float> sum(4096);
        sum.upload(sums.parts[ru]);
        for (int round = 0; round < 2; ++round) {
          d_recv.fill_bytes(0xAB);
          group[ru]->all_to_all(d_send.get(), sb, d_recv.get(), rb, sp.comm());
          if (round == 0) group[ru]->all_reduce_sum(sum.get(), 4096, sp.comm());
          group[ru]->synchronize(sp.comm());
          if (d_recv.download() != want)
            failures[ru] += "all-to-all round " + std::to_string(round) + " wrong; ";
        }
        if (!same_bits(sum.download(), sums.sum)) failures[ru] += "sum wrong; ";
      } catch (const std::exception& ex) {
        failures[ru] += ex.what();
        group[ru]->abort();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(failures[static_cast<size_t>(r)], "") << "rank " << r;
}

TEST(Collective, AbortWakesARankWaitingForItsPeers) {
  TROUPE_REQUIRE_GPU();
  TROUPE_CUDA_CHECK(cudaSetDevice(0));
  auto group = make_local_group(2, 64);
  std::atomic<bool> threw{false};
  std::string what;
  std::thread waiter([&] {
    try {
      TROUPE_CUDA_CHECK(cudaSetDevice(0));
      DeviceBuffer<float> buf(64);
      group[1]->all_reduce_sum(buf.get(), 64, nullptr);  // rank 0 never comes
    } catch (const DeviceError& e) {
      threw = true;
      what = e.what();
      EXPECT_EQ(e.code(), Errc::kStepFailed);
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  group[0]->abort();
  waiter.join();
  EXPECT_TRUE(threw);
  EXPECT_NE(what.find("aborted"), std::string::npos) << what;
  EXPECT_TRUE(group[1]->aborted());
  DeviceBuffer<float> buf(8);
  EXPECT_THROW(group[0]->all_reduce_sum(buf.get(), 8, nullptr), DeviceError);
}

TEST(Collective, NcclGroupGivesEveryRankTheOrderedSum) {
  TROUPE_REQUIRE_GPU();
  const int n = std::min(device_count(), 4);
  if (n < 2)
    GTEST_SKIP() << "one GPU: an NCCL group needs one GPU per rank (NCCL refuses two ranks on one "
                    "device); the local group tests cover the same sums";
  auto group = testing::nccl_test_group(n, 70000);
  std::vector<int> devices;
  for (int r = 0; r < n; ++r) devices.push_back(r);
  for (const auto& g : group) ASSERT_TRUE(g) << "a rank did not join";
  check_rounds(group, devices, {70000, 1, 65537, static_cast<size_t>(n) - 1, 70000});
  // Abort on one rank breaks the whole group: every rank's next call throws.
  group[0]->abort();
  for (const auto& g : group) EXPECT_TRUE(g->aborted());
  destroy_group(group);
}

// ---- the engine -------------------------------------------------------------------------------

class GpuTpEngineModel : public GpuModelTest {
 protected:
  std::unique_ptr<GpuTpEngine> make(std::vector<int> devices) {
    auto e = GpuTpEngine::create(model_, small_options(), std::move(devices));
    EXPECT_TRUE(e.has_value()) << (e.has_value() ? "" : e.error().message);
    return e.has_value() ? std::move(*e) : nullptr;
  }
};

// Two sequences prefilled together (every row), then five decode steps together.
std::vector<std::vector<float>> prefill_then_decode(GpuTpEngine& e, compute::Engine* cpu, int64_t V,
                                                    std::vector<std::vector<float>>* ref) {
  const std::vector<std::vector<int32_t>> toks = {make_tokens(25, V, 11), make_tokens(18, V, 12)};
  Script script = {{{0, 20, Logits::kAll}, {1, 13, Logits::kAll}}};
  for (int i = 0; i < 5; ++i) script.push_back({{0, 1, Logits::kLast}, {1, 1, Logits::kLast}});
  if (cpu) *ref = run_script(*cpu, toks, script);
  return run_script(e, toks, script);
}

TEST_P(GpuTpEngineModel, TwoAndFourRanksMatchCpuEngine) {
  compute::EngineOptions co;
  co.n_threads = 4;
  co.max_tokens_in_cache = 1024;
  co.kv_block_size = kBlockSize;
  auto cpu = compute::Engine::create(model_, co);
  ASSERT_TRUE(cpu.has_value()) << cpu.error().message;
  // MoE layers both ways: whole experts per rank (expert parallelism) and every expert's width
  // split.
  std::vector<bool> modes = {true};
  if (moe_) modes.push_back(false);
  for (int ranks : {2, 4}) {
    for (bool ep : modes) {
      GpuEngineOptions o = small_options();
      o.tp_expert_parallel = ep;
      const std::string what = std::to_string(ranks) + " ranks" +
                               (moe_ ? (ep ? ", experts split" : ", expert widths split") : "") +
                               " vs CPU " + GetParam();
      auto tp = GpuTpEngine::create(model_, o, std::vector<int>(ranks, 0));
      if (!tp.has_value() && tp.error().message.find("multiple of") != std::string::npos) {
        std::printf("[tp] %s: %s\n", what.c_str(), tp.error().message.c_str());
        EXPECT_EQ(tp.error().code, static_cast<int>(Errc::kBadInput));
        EXPECT_NE(ranks, 2) << "every test model divides over 2 ranks";
        continue;
      }
      ASSERT_TRUE(tp.has_value()) << tp.error().message;
      GpuTpEngine& e = **tp;
      EXPECT_EQ(e.size(), ranks);
      EXPECT_FALSE(e.uses_nccl());
      std::vector<std::vector<float>> want;
      const auto got = prefill_then_decode(e, cpu->get(), V_, &want);
      ASSERT_EQ(got.size(), 2u);
      RowStats st;
      for (size_t s = 0; s < 2; ++s) {
        ASSERT_EQ(got[s].size(), want[s].size());
        for (size_t r = 0; r < want[s].size() / static_cast<size_t>(V_); ++r)
          compare_row(&got[s][r * static_cast<size_t>(V_)], &want[s][r * static_cast<size_t>(V_)],
                      V_, &st);
      }
      expect_stats(st, moe_, what);
      // Each rank holds a share: the group's weights are not `ranks` whole copies.
      auto one = make_gpu(model_, small_options());
      ASSERT_TRUE(one);
      EXPECT_LT(e.rank(1).weight_bytes(), one->weight_bytes());
    }
  }
}

TEST_P(GpuTpEngineModel, BatchAndChunkInvariantBitwise) {
  auto e = make({0, 0});
  ASSERT_TRUE(e);
  expect_batch_and_chunk_invariant(*e, V_);
}

TEST_P(GpuTpEngineModel, NcclOnTwoGpusGivesTheStandInsBits) {
  if (device_count() < 2)
    GTEST_SKIP() << "one GPU: NCCL tensor parallelism needs two; the stand-in tests cover the "
                    "same code path";
  auto nccl = make({0, 1});
  auto local = make({0, 0});
  ASSERT_TRUE(nccl && local);
  EXPECT_TRUE(nccl->uses_nccl());
  const auto a = prefill_then_decode(*nccl, nullptr, V_, nullptr);
  const auto b = prefill_then_decode(*local, nullptr, V_, nullptr);
  ASSERT_EQ(a.size(), 2u);
  for (size_t s = 0; s < 2; ++s) EXPECT_TRUE(bit_equal(a[s], b[s])) << "sequence " << s;
}

TEST_P(GpuTpEngineModel, PipelineOfTensorParallelStagesMatchesOneStage) {
  // Layers split into two stages, each a 2-rank group, chained through hidden states: the same
  // bits as one 2-rank group over all layers (hidden states pass through f32 unchanged).
  const int64_t n_layer = model_->spec.n_layer;
  if (n_layer < 2) GTEST_SKIP() << "one layer";
  GpuEngineOptions o1 = small_options(), o2 = small_options();
  o1.range = {0, n_layer / 2, true, false};
  o2.range = {n_layer / 2, n_layer, false, true};
  auto s1 = GpuTpEngine::create(model_, o1, {0, 0});
  auto s2 = GpuTpEngine::create(model_, o2, {0, 0});
  auto whole = make({0, 0});
  ASSERT_TRUE(s1.has_value() && s2.has_value() && whole);
  // Two sequences (two micro-batches in each group), every row.
  const std::vector<int32_t> toks[2] = {make_tokens(12, V_, 5), make_tokens(7, V_, 6)};
  GpuTpEngine* engines[3] = {s1->get(), s2->get(), whole.get()};
  std::vector<int32_t> blocks[3][2];
  for (int e = 0; e < 3; ++e)
    for (int q = 0; q < 2; ++q) ASSERT_TRUE(engines[e]->blocks().allocate(1, &blocks[e][q]));
  auto steps = [&](int e) {
    std::vector<SeqStep> v(2);
    for (int q = 0; q < 2; ++q) {
      v[static_cast<size_t>(q)].pos0 = 0;
      v[static_cast<size_t>(q)].tokens = toks[q];
      v[static_cast<size_t>(q)].logits = Logits::kAll;
      v[static_cast<size_t>(q)].blocks = blocks[e][q];
    }
    return v;
  };
  StepResult r1, r2, r3;
  std::vector<float> hidden;
  const Status a = (*s1)->step(steps(0), &r1, nullptr, &hidden);
  ASSERT_TRUE(a.has_value()) << message(a);
  ASSERT_EQ(hidden.size(), 19 * static_cast<size_t>(model_->spec.n_embd));
  const Status b = (*s2)->step(steps(1), &r2, hidden.data(), nullptr);
  ASSERT_TRUE(b.has_value()) << message(b);
  const Status c = whole->step(steps(2), &r3);
  ASSERT_TRUE(c.has_value()) << message(c);
  EXPECT_EQ(r2.logits.size(), 19 * static_cast<size_t>(V_));
  EXPECT_EQ(r2.row_begin, r3.row_begin);
  EXPECT_EQ(r2.row_count, r3.row_count);
  EXPECT_TRUE(bit_equal(r2.logits, r3.logits));
}

TEST_P(GpuTpEngineModel, OverlappedMicroBatchesGiveTheBitsOfOneBatch) {
  // The same steps with the two-micro-batch overlap on and off: three sequences prefilling in
  // uneven chunks (the split falls at different sequences), then decoding together.
  GpuEngineOptions on = small_options(), off = small_options();
  on.tp_overlap = true;
  off.tp_overlap = false;
  auto a = GpuTpEngine::create(model_, on, {0, 0});
  auto b = GpuTpEngine::create(model_, off, {0, 0});
  ASSERT_TRUE(a.has_value() && b.has_value());
  const std::vector<std::vector<int32_t>> toks = {make_tokens(30, V_, 41), make_tokens(9, V_, 42),
                                                  make_tokens(30, V_, 43)};
  Script script = {{{0, 20, Logits::kAll}, {1, 3, Logits::kLast}, {2, 1, Logits::kAll}},
                   {{0, 2, Logits::kLast}, {1, 4, Logits::kAll}, {2, 25, Logits::kLast}}};
  for (int i = 0; i < 3; ++i)
    script.push_back({{0, 1, Logits::kLast}, {1, 1, Logits::kNone}, {2, 1, Logits::kLast}});
  const auto x = run_script(**a, toks, script);
  const auto y = run_script(**b, toks, script);
  ASSERT_EQ(x.size(), 3u);
  ASSERT_EQ(y.size(), 3u);
  for (size_t s = 0; s < 3; ++s) {
    EXPECT_FALSE(x[s].empty()) << "sequence " << s;
    EXPECT_TRUE(bit_equal(x[s], y[s])) << "sequence " << s;
  }
}

INSTANTIATE_TEST_SUITE_P(AllArchitectures, GpuTpEngineModel, ::testing::ValuesIn(kModels),
                         [](const auto& info) {
                           return ::troupe::testing::model_param_name(info.param);
                         });

}  // namespace
}  // namespace troupe::gpu
