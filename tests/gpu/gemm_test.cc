// Gemm (cuBLASLt): y = x W^T against a double-accumulated CPU reference on the same bf16 inputs,
// for aligned and odd shapes, padded leading dimensions, bias and the fused residual add; rows
// bitwise identical for M = 1, 7, 128 and 300; argument checks with their messages (no GPU).
// Tolerance: products of bf16 values are exact in f32, so the only error is the f32 accumulation:
// |err| <= K * u * sum_k |x_k w_k| (u = 2^-24), times 4 for tensor cores that truncate when they
// align addends; the test uses that bound's largest value over the output as atol, plus
// rtol 2^-8 for a bf16 output (one rounding, <= 2^-8 relative) or 1e-6 for f32.
#include "gpu/gemm.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/check.h"
#include "gpu/runtime.h"
#include "tests/gpu/gpu_test_util.h"

namespace troupe::gpu {
namespace {

using testing::all_close;
using testing::from_bf16;
using testing::random_floats;
using testing::round_bf16;
using testing::to_bf16;

struct Case {
  int64_t m, n, k;
  int64_t ldx = 0, ldw = 0, ldy = 0;  // 0 = dense
  GemmOut out = GemmOut::kF32;
  bool bias = false;
  bool accumulate = false;
};

std::string name_of(const Case& c) {
  return strfmt("m=%lld n=%lld k=%lld ldx=%lld ldw=%lld ldy=%lld out=%s bias=%d acc=%d",
                static_cast<long long>(c.m), static_cast<long long>(c.n),
                static_cast<long long>(c.k), static_cast<long long>(c.ldx),
                static_cast<long long>(c.ldw), static_cast<long long>(c.ldy),
                c.out == GemmOut::kF32 ? "f32" : "bf16", c.bias, c.accumulate);
}

/// The output buffer of either type, read back as f32.
struct OutBuffer {
  GemmOut type;
  DeviceBuffer<float> f32;
  DeviceBuffer<__nv_bfloat16> bf16;
  OutBuffer(GemmOut t, size_t n) : type(t) {
    if (t == GemmOut::kF32)
      f32 = DeviceBuffer<float>(n);
    else
      bf16 = DeviceBuffer<__nv_bfloat16>(n);
  }
  void* get() { return type == GemmOut::kF32 ? static_cast<void*>(f32.get()) : bf16.get(); }
  void poison() { type == GemmOut::kF32 ? f32.fill_bytes(0xFF) : bf16.fill_bytes(0xFF); }
  void upload(const std::vector<float>& v) {
    type == GemmOut::kF32 ? f32.upload(v) : bf16.upload(to_bf16(v));
  }
  std::vector<float> download() const {
    return type == GemmOut::kF32 ? f32.download() : from_bf16(bf16.download());
  }
};

/// Runs one case on the GPU and checks it against the CPU reference, including that nothing
/// outside the [m, n] window of the ldy-strided output was written.
void check_case(Gemm& gemm, const Case& c, uint64_t seed, cudaStream_t stream) {
  SCOPED_TRACE(name_of(c));
  const int64_t ldx = c.ldx ? c.ldx : c.k, ldw = c.ldw ? c.ldw : c.k, ldy = c.ldy ? c.ldy : c.n;
  const auto x = round_bf16(random_floats(static_cast<size_t>(c.m * ldx), seed));
  const auto w = round_bf16(random_floats(static_cast<size_t>(c.n * ldw), seed + 1));
  auto bias = random_floats(static_cast<size_t>(c.n), seed + 2);
  if (c.out == GemmOut::kBf16) bias = round_bf16(bias);
  const auto residual = random_floats(static_cast<size_t>(c.m * ldy), seed + 3, -4.f, 4.f);

  DeviceBuffer<__nv_bfloat16> dx(x.size()), dw(w.size());
  dx.upload(to_bf16(x));
  dw.upload(to_bf16(w));
  OutBuffer db(c.out, bias.size()), dy(c.out, residual.size());
  db.upload(bias);
  if (c.accumulate)
    dy.upload(residual);
  else
    dy.poison();

  GemmArgs a;
  a.m = c.m;
  a.n = c.n;
  a.k = c.k;
  a.x = dx.get();
  a.ldx = c.ldx;
  a.w = dw.get();
  a.ldw = c.ldw;
  a.y = dy.get();
  a.ldy = c.ldy;
  a.y_type = c.out;
  a.bias = c.bias ? db.get() : nullptr;
  a.accumulate = c.accumulate;
  gemm.run(a, stream);
  TROUPE_CUDA_CHECK(cudaStreamSynchronize(stream));
  const std::vector<float> got_all = dy.download();

  std::vector<float> got, want;
  double bound = 0;
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      double s = 0, abs_sum = 0;
      for (int64_t kk = 0; kk < c.k; ++kk) {
        const double p = static_cast<double>(x[static_cast<size_t>(i * ldx + kk)]) *
                         static_cast<double>(w[static_cast<size_t>(j * ldw + kk)]);
        s += p;
        abs_sum += std::fabs(p);
      }
      if (c.bias) s += bias[static_cast<size_t>(j)];
      if (c.accumulate) s += residual[static_cast<size_t>(i * ldy + j)];
      bound = std::max(bound, abs_sum);
      want.push_back(static_cast<float>(s));
      got.push_back(got_all[static_cast<size_t>(i * ldy + j)]);
    }
    for (int64_t j = c.n; j < ldy; ++j) {  // the padding of each output row
      const float v = got_all[static_cast<size_t>(i * ldy + j)];
      if (c.accumulate)  // (accumulate implies an f32 output)
        ASSERT_EQ(v, residual[static_cast<size_t>(i * ldy + j)])
            << "padding overwritten at row " << i << " col " << j;
      else
        ASSERT_TRUE(std::isnan(v)) << "padding written at row " << i << " col " << j;
    }
  }
  const float atol =
      static_cast<float>(4.0 * static_cast<double>(c.k) * std::ldexp(1.0, -24) * bound) + 1e-6f;
  const float rtol = c.out == GemmOut::kBf16 ? std::ldexp(1.0f, -8) : 1e-6f;
  EXPECT_TRUE(all_close(got, want, rtol, atol, "gemm y"));
}

class GemmGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!gpu_available(&why)) GTEST_SKIP() << "no usable CUDA GPU: " << why;
    ws_ = std::make_unique<DeviceBuffer<uint8_t>>(Gemm::kDefaultWorkspaceBytes);
    gemm_ = std::make_unique<Gemm>(ws_->get(), ws_->size());
    streams_ = std::make_unique<StreamPair>();
  }
  cudaStream_t stream() const { return streams_->compute(); }
  std::unique_ptr<DeviceBuffer<uint8_t>> ws_;
  std::unique_ptr<Gemm> gemm_;
  std::unique_ptr<StreamPair> streams_;
};

TEST_F(GemmGpu, MatchesCpuReferenceOnAlignedShapes) {
  TROUPE_REQUIRE_GPU();
  const Case cases[] = {
      {1, 8, 16},    {7, 24, 40},   {33, 72, 136},  {128, 256, 512},
      {3, 512, 128}, {200, 64, 64}, {64, 96, 1024},
  };
  uint64_t seed = 100;
  for (Case c : cases) {
    check_case(*gemm_, c, seed += 10, stream());
    c.out = GemmOut::kBf16;
    check_case(*gemm_, c, seed += 10, stream());
  }
}

TEST_F(GemmGpu, OddShapesAndPaddedLeadingDimensions) {
  TROUPE_REQUIRE_GPU();
  // Rows aligned to 2, 4 or 8 bytes only: cuBLASLt runs them with narrower loads.
  const Case cases[] = {
      {5, 17, 33},                                 // odd everything: 2-byte rows
      {3, 13, 7},                                  // tiny, k < 8
      {64, 100, 200},                              // 8-byte rows (multiples of 4)
      {9, 40, 64, 80, 0, 48},                      // padded x and y rows
      {11, 24, 30, 32, 40, 0},                     // padded x and w rows
      {4, 30, 16, 0, 0, 37, GemmOut::kBf16},       // odd ldy with a bf16 output
      {6, 21, 12, 0, 0, 25, GemmOut::kF32, true},  // bias, padded odd ldy
  };
  uint64_t seed = 500;
  for (const Case& c : cases) check_case(*gemm_, c, seed += 10, stream());
}

TEST_F(GemmGpu, BiasEpilogue) {
  TROUPE_REQUIRE_GPU();
  check_case(*gemm_, {9, 64, 96, 0, 0, 0, GemmOut::kF32, true}, 900, stream());
  check_case(*gemm_, {9, 64, 96, 0, 0, 0, GemmOut::kBf16, true}, 910, stream());
  check_case(*gemm_, {130, 200, 256, 0, 0, 0, GemmOut::kBf16, true}, 920, stream());
}

TEST_F(GemmGpu, AccumulateAddsIntoTheF32Output) {
  TROUPE_REQUIRE_GPU();
  check_case(*gemm_, {7, 48, 64, 0, 0, 0, GemmOut::kF32, false, true}, 1000, stream());
  check_case(*gemm_, {130, 256, 512, 0, 0, 0, GemmOut::kF32, false, true}, 1010, stream());
  check_case(*gemm_, {5, 40, 64, 0, 0, 56, GemmOut::kF32, true, true}, 1020, stream());
}

/// Row m of y must not depend on M: the same rows computed in batches of 1, 7, 128 and 300
/// (and a single row from the middle) are bitwise equal.
void check_batch_invariance(Gemm& gemm, GemmOut out, bool bias, bool accumulate,
                            cudaStream_t stream) {
  SCOPED_TRACE(strfmt("out=%s bias=%d accumulate=%d", out == GemmOut::kF32 ? "f32" : "bf16", bias,
                      accumulate));
  const int64_t n = 384, k = 1024, m_all = 300;
  const auto x = to_bf16(random_floats(static_cast<size_t>(m_all * k), 7));
  const auto w = to_bf16(random_floats(static_cast<size_t>(n * k), 8));
  const auto b = random_floats(static_cast<size_t>(n), 9);
  const auto residual = random_floats(static_cast<size_t>(m_all * n), 10);
  DeviceBuffer<__nv_bfloat16> dx(x.size()), dw(w.size());
  dx.upload(x);
  dw.upload(w);
  OutBuffer db(out, b.size());
  db.upload(b);
  const size_t elem = out == GemmOut::kF32 ? 4 : 2;

  auto run_rows = [&](int64_t row0, int64_t m) {
    OutBuffer dy(out, static_cast<size_t>(m * n));
    if (accumulate)
      dy.upload(std::vector<float>(residual.begin() + row0 * n, residual.begin() + (row0 + m) * n));
    else
      dy.poison();
    GemmArgs a;
    a.m = m;
    a.n = n;
    a.k = k;
    a.x = dx.get() + row0 * k;
    a.w = dw.get();
    a.y = dy.get();
    a.y_type = out;
    a.bias = bias ? db.get() : nullptr;
    a.accumulate = accumulate;
    gemm.run(a, stream);
    TROUPE_CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<uint8_t> raw(static_cast<size_t>(m * n) * elem);
    TROUPE_CUDA_CHECK(cudaMemcpy(raw.data(), dy.get(), raw.size(), cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (float v : dy.download()) bad += !std::isfinite(v);
    EXPECT_EQ(bad, 0u) << "unwritten or non-finite outputs for M=" << m;
    return raw;
  };
  const std::vector<uint8_t> all = run_rows(0, m_all);
  const size_t row_bytes = static_cast<size_t>(n) * elem;
  for (int64_t m : {1, 7, 128}) {
    const std::vector<uint8_t> part = run_rows(0, m);
    for (int64_t i = 0; i < m; ++i)
      EXPECT_EQ(0, std::memcmp(part.data() + i * row_bytes, all.data() + i * row_bytes, row_bytes))
          << "row " << i << " differs between M=" << m << " and M=" << m_all;
  }
  const std::vector<uint8_t> one = run_rows(57, 1);
  EXPECT_EQ(0, std::memcmp(one.data(), all.data() + 57 * row_bytes, row_bytes))
      << "row 57 alone differs from row 57 of M=" << m_all;
}

TEST_F(GemmGpu, RowsAreBitwiseIdenticalForAnyBatchSize) {
  TROUPE_REQUIRE_GPU();
  check_batch_invariance(*gemm_, GemmOut::kF32, false, false, stream());
  check_batch_invariance(*gemm_, GemmOut::kBf16, false, false, stream());
  check_batch_invariance(*gemm_, GemmOut::kBf16, true, false, stream());
  check_batch_invariance(*gemm_, GemmOut::kF32, true, true, stream());
  // One pinned algorithm per key, whatever M was: 4 keys, 4 lines.
  const std::string info = gemm_->debug_string();
  size_t lines = 0;
  for (char ch : info) lines += ch == '\n';
  EXPECT_EQ(lines, 4u) << info;
}

TEST_F(GemmGpu, DebugStringNamesThePinnedAlgorithm) {
  TROUPE_REQUIRE_GPU();
  check_case(*gemm_, {16, 64, 32}, 1200, stream());
  const std::string info = gemm_->debug_string();
  std::printf("gemm pick: %s", info.c_str());
  EXPECT_NE(info.find("n=64 k=32 out=f32"), std::string::npos) << info;
  EXPECT_NE(info.find("algo="), std::string::npos) << info;
  EXPECT_EQ(info.find("splitk=2"), std::string::npos) << info;
}

// ---- argument checks: no GPU needed -----------------------------------------------------------

GemmArgs valid_args() {
  GemmArgs a;
  a.m = 4;
  a.n = 8;
  a.k = 16;
  a.x = reinterpret_cast<const __nv_bfloat16*>(uintptr_t{0x10000});
  a.w = reinterpret_cast<const __nv_bfloat16*>(uintptr_t{0x20000});
  a.y = reinterpret_cast<void*>(uintptr_t{0x30000});
  return a;
}

void expect_input_error(const GemmArgs& a, const std::string& needle) {
  try {
    validate_gemm_args(a);
    ADD_FAILURE() << "accepted; expected an error containing '" << needle << "'";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Gemm, CublasLtLoadsWithEveryEntryPoint) {
  // No GPU needed: the library is loaded at first use, not linked, and a missing library or
  // entry point would otherwise only show on a GPU machine.
  EXPECT_EQ(cublaslt_load_error(), "");
}

TEST(Gemm, RejectsBadArgumentsWithClearMessages) {
  EXPECT_NO_THROW(validate_gemm_args(valid_args()));
  GemmArgs a = valid_args();
  a.m = 0;
  EXPECT_NO_THROW(validate_gemm_args(a));  // an empty batch is a no-op
  a = valid_args();
  a.k = 0;
  expect_input_error(a, "k >= 1");
  a = valid_args();
  a.m = -1;
  expect_input_error(a, "m=-1");
  a = valid_args();
  a.ldx = 15;
  expect_input_error(a, "ldx=15");
  a = valid_args();
  a.ldy = 7;
  expect_input_error(a, "ldy=7");
  a = valid_args();
  a.w = nullptr;
  expect_input_error(a, "null pointer");
  a = valid_args();
  a.x = reinterpret_cast<const __nv_bfloat16*>(uintptr_t{0x10002});
  expect_input_error(a, "x must be 16-byte aligned");
  a = valid_args();
  a.bias = reinterpret_cast<const void*>(uintptr_t{0x40008});
  expect_input_error(a, "bias must be 16-byte aligned");
  a = valid_args();
  a.y_type = GemmOut::kBf16;
  a.accumulate = true;
  expect_input_error(a, "accumulate");
}

}  // namespace
}  // namespace troupe::gpu
