// Communicator (NCCL): the id survives its 128-byte serialization; bad rank/size is refused
// before NCCL runs; with one rank all-reduce is the identity and all-to-all copies to self; with
// two GPUs (one thread each) sums and per-peer blocks arrive exactly (values are small integers,
// exact in f32 and bf16, so every comparison is bitwise).
#include "gpu/comm.h"

#include <exception>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "base/check.h"
#include "gpu/runtime.h"
#include "tests/gpu/gpu_test_util.h"

namespace troupe::gpu {
namespace {

using testing::from_bf16;
using testing::to_bf16;

TEST(CommId, RoundTripsThrough128Bytes) {
  std::vector<uint8_t> raw(CommId::kBytes);
  std::iota(raw.begin(), raw.end(), uint8_t{3});
  const CommId id = CommId::from_bytes(raw);
  const auto back = id.as_bytes();
  EXPECT_EQ(std::vector<uint8_t>(back.begin(), back.end()), raw);
  EXPECT_EQ(CommId::from_bytes(id.as_bytes()), id);
  try {
    CommId::from_bytes(std::vector<uint8_t>(127));
    ADD_FAILURE() << "a 127-byte id was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("expected 128 bytes"), std::string::npos) << e.what();
  }
}

TEST(Communicator, RefusesRankOutsideSizeBeforeCallingNccl) {
  try {
    Communicator c(CommId{}, 2, 2);
    ADD_FAILURE() << "rank 2 of 2 was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("rank=2 size=2"), std::string::npos) << e.what();
  }
}

TEST(Communicator, SingleRankAllReduceIsTheIdentity) {
  TROUPE_REQUIRE_GPU();
  StreamPair streams;
  Communicator comm(CommId::create(), 0, 1);
  EXPECT_EQ(comm.rank(), 0);
  EXPECT_EQ(comm.size(), 1);
  std::vector<float> v(1000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 97) * 0.25f - 7.f;
  DeviceBuffer<float> f(v.size());
  f.upload(v);
  DeviceBuffer<__nv_bfloat16> b(v.size());
  b.upload(to_bf16(v));
  comm.all_reduce_sum(f.get(), f.size(), streams.comm());
  comm.all_reduce_sum(b.get(), b.size(), streams.comm());
  TROUPE_CUDA_CHECK(cudaStreamSynchronize(streams.comm()));
  comm.check_async_error();
  EXPECT_EQ(f.download(), v);
  EXPECT_EQ(from_bf16(b.download()), v);
}

TEST(Communicator, SingleRankAllToAllCopiesToSelf) {
  TROUPE_REQUIRE_GPU();
  StreamPair streams;
  Communicator comm(CommId::create(), 0, 1);
  std::vector<float> v(37);
  std::iota(v.begin(), v.end(), 1.f);
  DeviceBuffer<float> send(v.size()), recv(v.size());
  send.upload(v);
  recv.fill_bytes(0xFF);
  const std::vector<size_t> counts = {v.size()};
  comm.all_to_all(send.get(), counts, recv.get(), counts, CommType::kF32, streams.comm());
  TROUPE_CUDA_CHECK(cudaStreamSynchronize(streams.comm()));
  EXPECT_EQ(recv.download(), v);
  // Nothing to send is a no-op, not an error.
  const std::vector<size_t> none = {0};
  comm.all_to_all(send.get(), none, recv.get(), none, CommType::kF32, streams.comm());
  TROUPE_CUDA_CHECK(cudaStreamSynchronize(streams.comm()));
  comm.check_async_error();
  try {
    const std::vector<size_t> two = {1, 1};
    comm.all_to_all(send.get(), two, recv.get(), two, CommType::kF32, streams.comm());
    ADD_FAILURE() << "two counts for one rank were accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("one count per rank"), std::string::npos) << e.what();
  }
}

/// What rank `from` sends to rank `to` in the two-GPU test: count and the i-th value.
size_t count_of(int from, int to) { return static_cast<size_t>(3 + 2 * from + to); }
float value_of(int from, int to, size_t i) {
  return static_cast<float>(from * 1000 + to * 100) + static_cast<float>(i);
}

TEST(Communicator, TwoGpusAllReduceAndAllToAll) {
  TROUPE_REQUIRE_GPU();
  int n_dev = 0;
  TROUPE_CUDA_CHECK(cudaGetDeviceCount(&n_dev));
  if (n_dev < 2) GTEST_SKIP() << "needs 2 CUDA devices, found " << n_dev;
  const CommId id = CommId::create();
  constexpr int kRanks = 2;
  std::vector<std::string> errors(kRanks);
  std::vector<std::vector<float>> sums(kRanks), sums_bf16(kRanks), received(kRanks);
  const size_t n = 4099;
  auto rank_main = [&](int rank) {
    try {
      TROUPE_CUDA_CHECK(cudaSetDevice(rank));
      StreamPair streams;
      Communicator comm(id, rank, kRanks);
      // all-reduce: rank r holds (i % 50) + r: the sum is 2 * (i % 50) + 1, exact in both types.
      std::vector<float> v(n);
      for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i % 50 + static_cast<size_t>(rank));
      DeviceBuffer<float> f(n);
      f.upload(v);
      DeviceBuffer<__nv_bfloat16> b(n);
      b.upload(to_bf16(v));
      comm.all_reduce_sum(f.get(), n, streams.comm());
      comm.all_reduce_sum(b.get(), n, streams.comm());
      // all-to-all with different counts per direction.
      std::vector<size_t> send_counts(kRanks), recv_counts(kRanks);
      std::vector<float> send;
      for (int p = 0; p < kRanks; ++p) {
        send_counts[static_cast<size_t>(p)] = count_of(rank, p);
        recv_counts[static_cast<size_t>(p)] = count_of(p, rank);
        for (size_t i = 0; i < count_of(rank, p); ++i) send.push_back(value_of(rank, p, i));
      }
      const size_t recv_total = std::accumulate(recv_counts.begin(), recv_counts.end(), size_t{0});
      DeviceBuffer<float> ds(send.size()), dr(recv_total);
      ds.upload(send);
      dr.fill_bytes(0xFF);
      comm.all_to_all(ds.get(), send_counts, dr.get(), recv_counts, CommType::kF32, streams.comm());
      TROUPE_CUDA_CHECK(cudaStreamSynchronize(streams.comm()));
      comm.check_async_error();
      sums[static_cast<size_t>(rank)] = f.download();
      sums_bf16[static_cast<size_t>(rank)] = from_bf16(b.download());
      received[static_cast<size_t>(rank)] = dr.download();
    } catch (const std::exception& e) {
      errors[static_cast<size_t>(rank)] = e.what();
    }
  };
  std::thread t0(rank_main, 0), t1(rank_main, 1);
  t0.join();
  t1.join();
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
    std::vector<float> want_sum(n), want_recv;
    for (size_t i = 0; i < n; ++i) want_sum[i] = static_cast<float>(2 * (i % 50) + 1);
    for (int p = 0; p < kRanks; ++p)
      for (size_t i = 0; i < count_of(p, r); ++i) want_recv.push_back(value_of(p, r, i));
    EXPECT_EQ(sums[static_cast<size_t>(r)], want_sum) << "rank " << r;
    EXPECT_EQ(sums_bf16[static_cast<size_t>(r)], want_sum) << "rank " << r;
    EXPECT_EQ(received[static_cast<size_t>(r)], want_recv) << "rank " << r;
  }
}

}  // namespace
}  // namespace troupe::gpu
