// MoeForward::run_dispatch (gpu/moe_dispatch.cc): a DeepSeek-V3-like MoE layer (sigmoid routing
// with groups, a gated shared expert) whose 16 experts are spread over a group of 2 or 4 ranks,
// each rank routing its own tokens (one rank has none): every rank's output is bitwise the
// one-GPU layer's (MoeForward::run with every expert) for the same tokens. Through the one-GPU
// stand-in group (all ranks on GPU 0, one thread each) and, with two or more GPUs, through NCCL.
#include <cuda_bf16.h>

#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "base/check.h"
#include "gpu/collective.h"
#include "gpu/comm.h"
#include "gpu/gemm.h"
#include "gpu/moe.h"
#include "gpu/runtime.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/group_test_util.h"

namespace troupe::gpu {
namespace {

using testing::random_floats;
using testing::round_bf16;
using testing::to_bf16;

constexpr int64_t kExperts = 16, kK = 4, kD = 64, kFf = 32;

MoeRouting routing() {
  MoeRouting r;
  r.n_expert = kExperts;
  r.k = kK;
  r.gating = model::Gating::kSigmoid;
  r.norm_topk = true;
  r.routed_scale = 2.5f;
  r.n_group = 4;
  r.n_group_used = 2;
  return r;
}

// The layer's inputs for `n` tokens and its weights (host).
struct Layer {
  int64_t n = 0;
  std::vector<float> logits, bias, x, shared, gate_logit, gate, up, down;
  explicit Layer(int64_t tokens) : n(tokens) {
    logits = random_floats(static_cast<size_t>(n * kExperts), 1, -3.f, 3.f);
    bias = random_floats(kExperts, 2, -0.05f, 0.05f);
    x = round_bf16(random_floats(static_cast<size_t>(n * kD), 3));
    shared = random_floats(static_cast<size_t>(n * kD), 4, -0.5f, 0.5f);
    gate_logit = random_floats(static_cast<size_t>(n), 5, -2.f, 2.f);
    gate = random_floats(static_cast<size_t>(kExperts * kFf * kD), 6, -0.2f, 0.2f);
    up = random_floats(static_cast<size_t>(kExperts * kFf * kD), 7, -0.2f, 0.2f);
    down = random_floats(static_cast<size_t>(kExperts * kD * kFf), 8, -0.2f, 0.2f);
  }
};

// One rank's (or the whole layer's) device state: GEMM workspace, scratch, streams.
struct Device {
  DeviceBuffer<uint8_t> ws{Gemm::kDefaultWorkspaceBytes};
  Gemm gemm{ws.get(), ws.size()};
  Arena arena{size_t{64} << 20};
  StreamPair streams;
  MoeForward fwd{routing(), &gemm};
};

template <class T>
DeviceBuffer<T> device_copy(const std::vector<T>& v) {
  DeviceBuffer<T> b(v.size());
  b.upload(v);
  return b;
}

// Tokens [t0, t0 + n) of the layer through rank `rank` of `group` (experts [rank * EC, + EC)),
// or through all experts with run() when group is null. Returns y [n, d].
std::vector<float> run_tokens(const Layer& L, int64_t t0, int64_t n, Collective* group) {
  Device dev;
  const int64_t P = group ? group->size() : 1, EC = kExperts / P,
                e0 = group ? group->rank() * EC : 0;
  auto slice = [&](const std::vector<float>& v, int64_t width) {
    return std::vector<float>(v.begin() + t0 * width, v.begin() + (t0 + n) * width);
  };
  auto d_logits = device_copy(n ? slice(L.logits, kExperts) : std::vector<float>(1));
  auto d_bias = device_copy(L.bias);
  auto d_x = device_copy(to_bf16(n ? slice(L.x, kD) : std::vector<float>(kD)));
  auto d_shared = device_copy(n ? slice(L.shared, kD) : std::vector<float>(kD));
  auto d_gl = device_copy(n ? slice(L.gate_logit, 1) : std::vector<float>(1));
  const size_t per = kFf * kD;
  auto part = [&](const std::vector<float>& w) {
    return std::vector<float>(w.begin() + static_cast<ptrdiff_t>(e0 * per),
                              w.begin() + static_cast<ptrdiff_t>((e0 + EC) * per));
  };
  auto d_gate = device_copy(to_bf16(part(L.gate)));
  auto d_up = device_copy(to_bf16(part(L.up)));
  auto d_down = device_copy(to_bf16(part(L.down)));
  DeviceBuffer<float> d_y(static_cast<size_t>(std::max<int64_t>(n, 1) * kD));
  d_y.fill_bytes(0xFF);
  MoeForwardArgs a;
  a.n_tok = n;
  a.x = d_x.get();
  a.router_logits = d_logits.get();
  a.router_bias = d_bias.get();
  a.experts = {d_gate.get(), d_up.get(), d_down.get(), EC, kD, kFf};
  a.expert_begin = e0;
  a.shared_out = d_shared.get();
  a.shared_gate_logit = d_gl.get();
  a.y = d_y.get();
  if (group) {
    dev.fwd.run_dispatch(a, *group, dev.arena, dev.streams.compute());
    group->synchronize(dev.streams.compute());
  } else {
    dev.fwd.run(a, dev.arena, dev.streams.compute());
    TROUPE_CUDA_CHECK(cudaStreamSynchronize(dev.streams.compute()));
  }
  EXPECT_EQ(dev.arena.used(), 0u) << "scratch not given back";
  auto y = d_y.download();
  y.resize(static_cast<size_t>(n * kD));
  return y;
}

// Every rank (its own thread, on devices[rank]) runs its token range; each result must be the
// one-GPU layer's rows bitwise.
void check_group(std::vector<std::unique_ptr<Collective>>& group, const std::vector<int>& devices,
                 const std::vector<int64_t>& tokens) {
  int64_t total = 0;
  for (int64_t t : tokens) total += t;
  const Layer L(total);
  TROUPE_CUDA_CHECK(cudaSetDevice(devices[0]));
  const std::vector<float> want = run_tokens(L, 0, total, nullptr);
  const size_t n = group.size();
  std::vector<std::vector<float>> got(n);
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  int64_t t0 = 0;
  for (size_t r = 0; r < n; ++r) {
    threads.emplace_back([&, r, t0] {
      try {
        TROUPE_CUDA_CHECK(cudaSetDevice(devices[r]));
        got[r] = run_tokens(L, t0, tokens[r], group[r].get());
      } catch (const std::exception& e) {
        errors[r] = e.what();
        group[r]->abort();
      }
    });
    t0 += tokens[r];
  }
  for (std::thread& t : threads) t.join();
  t0 = 0;
  for (size_t r = 0; r < n; ++r) {
    EXPECT_EQ(errors[r], "") << "rank " << r;
    const size_t bytes = static_cast<size_t>(tokens[r] * kD) * sizeof(float);
    ASSERT_EQ(got[r].size() * sizeof(float), bytes) << "rank " << r;
    EXPECT_TRUE(bytes == 0 || std::memcmp(got[r].data(), want.data() + t0 * kD, bytes) == 0)
        << "rank " << r << ": its " << tokens[r] << " tokens differ from the one-GPU layer";
    t0 += tokens[r];
  }
}

TEST(MoeDispatch, StandInGroupGivesTheOneGpuLayerBitwise) {
  TROUPE_REQUIRE_GPU();
  const size_t a2a = size_t{64} * 4 * kK * kD * sizeof(float);  // ample for these token counts
  for (const std::vector<int64_t>& tokens :
       {std::vector<int64_t>{23, 14}, std::vector<int64_t>{9, 0, 31, 5}}) {
    TROUPE_CUDA_CHECK(cudaSetDevice(0));
    auto group = make_local_group(static_cast<int>(tokens.size()), 1024, a2a);
    check_group(group, std::vector<int>(tokens.size(), 0), tokens);
  }
}

TEST(MoeDispatch, NcclGroupGivesTheOneGpuLayerBitwise) {
  TROUPE_REQUIRE_GPU();
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
  n = n >= 4 ? 4 : n >= 2 ? 2 : n;
  if (n < 2)
    GTEST_SKIP() << "one GPU: an NCCL group needs one GPU per rank; the stand-in test covers the "
                    "same dispatch";
  auto group = testing::nccl_test_group(n, 1024);
  std::vector<int> devices;
  for (int r = 0; r < n; ++r) devices.push_back(r);
  for (const auto& g : group) ASSERT_TRUE(g) << "a rank did not join";
  std::vector<int64_t> tokens(static_cast<size_t>(n), 11);
  tokens[1] = 0;
  check_group(group, devices, tokens);
  destroy_group(group);
}

TEST(MoeDispatch, RefusesExpertsThatAreNotTheRanksShare) {
  TROUPE_REQUIRE_GPU();
  TROUPE_CUDA_CHECK(cudaSetDevice(0));
  auto group = make_local_group(2, 64, 4096);
  Device dev;
  MoeForwardArgs a;
  DeviceBuffer<__nv_bfloat16> w(static_cast<size_t>(kExperts * kFf * kD));
  a.experts = {w.get(), w.get(), w.get(), kExperts / 2, kD, kFf};
  a.expert_begin = 0;  // rank 1 owns [8, 16)
  try {
    dev.fwd.run_dispatch(a, *group[1], dev.arena, dev.streams.compute());
    ADD_FAILURE() << "rank 1 ran with rank 0's experts";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 of 2 must hold experts [8, 16)"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace troupe::gpu
