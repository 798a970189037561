// matmul with FP8 E4M3 block-scaled weights on every SIMD path this CPU runs: each output equals,
// bit for bit, the same path's output for an F32 matrix holding the nearest floats to
// fp8 * scale (computed here from the format's definition); batch and thread invariance; NaN
// codes reach only their row; bad scale layouts get a clear error.
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/check.h"
#include "compute/detail/matmul_kernels.h"
#include "compute/matmul.h"
#include "compute/thread_pool.h"
#include "model/model.h"
#include "tests/compute/matmul_test_util.h"
#include "tests/fp8_model.h"

namespace troupe::compute {
namespace {

using model::GgmlType;
using model::WeightView;
using namespace matmultest;  // NOLINT(google-build-using-namespace): the test helpers

// An FP8 matrix with random codes (no NaN) and scales, and its exact f32 twin.
struct F8Matrix {
  std::vector<uint8_t> codes;
  std::vector<float> scales, exact;
  WeightView f8, f32;
};

F8Matrix make_f8(int64_t rows, int64_t cols, int64_t br, int64_t bc, uint32_t seed) {
  std::mt19937 rng(seed);
  F8Matrix m;
  m.codes.resize(static_cast<size_t>(rows * cols));
  for (auto& c : m.codes) {
    do {
      c = static_cast<uint8_t>(rng() & 0xff);
    } while ((c & 0x7f) == 0x7f);
  }
  const int64_t gr = (rows + br - 1) / br, gc = (cols + bc - 1) / bc;
  std::uniform_real_distribution<float> uni(0.5f, 2.f);
  m.scales.resize(static_cast<size_t>(gr * gc));
  for (auto& s : m.scales) s = uni(rng) / 448.f * (rng() % 2 ? 1.f : -1.f);
  m.exact.resize(m.codes.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const auto i = static_cast<size_t>(r * cols + c);
      m.exact[i] = static_cast<float>(testing::e4m3_value(m.codes[i]) *
                                      m.scales[static_cast<size_t>(r / br * gc + c / bc)]);
    }
  m.f8.name = "test.f8";
  m.f8.type = GgmlType::kF8_E4M3;
  m.f8.ne[0] = cols;
  m.f8.ne[1] = rows;
  m.f8.data = m.codes.data();
  m.f8.scales = m.scales.data();
  m.f8.scale_block[0] = br;
  m.f8.scale_block[1] = bc;
  m.f8.scale_stride = gc;
  m.f32 = f32_view(m.exact, rows, cols);
  return m;
}

TEST(MatmulF8, EqualsTheExactF32TwinOnEveryPath) {
  ThreadPool pool(2);
  // Blocks that cut rows and columns (partial last blocks both ways), and DeepSeek's 128 x 128.
  const struct {
    int64_t rows, cols, br, bc;
  } shapes[] = {{37, 200, 16, 32}, {9, 48, 128, 128}, {130, 272, 128, 128}, {16, 16, 1, 16}};
  for (const auto& sh : shapes) {
    const F8Matrix m = make_f8(sh.rows, sh.cols, sh.br, sh.bc, 7);
    for (const auto* ks : kernel_sets()) {
      for (int64_t n_tok : {1, 2, 5, 13, 48}) {
        SCOPED_TRACE(std::string(ks->name) + " " + std::to_string(sh.rows) + "x" +
                     std::to_string(sh.cols) + " n_tok " + std::to_string(n_tok));
        const auto x = random_x(n_tok, sh.cols, 11);
        const auto want = run(*ks, m.f32, x, n_tok, nullptr);
        expect_bits(run(*ks, m.f8, x, n_tok, nullptr), want, "1 thread");
        expect_bits(run(*ks, m.f8, x, n_tok, &pool), want, "2 threads");
        // Batch invariance: token 0 alone.
        const auto one = run(*ks, m.f8, x, 1, nullptr);
        EXPECT_EQ(std::memcmp(one.data(), want.data(), one.size() * sizeof(float)), 0);
      }
    }
  }
}

TEST(MatmulF8, SharedTargetsEqualSeparateCalls) {
  ThreadPool pool(2);
  const F8Matrix a = make_f8(64, 128, 16, 32, 1), b = make_f8(48, 128, 128, 128, 2);
  for (const auto* ks : kernel_sets()) {
    SCOPED_TRACE(ks->name);
    const int64_t n_tok = 6;
    const auto x = random_x(n_tok, 128, 3);
    std::vector<float> ya(static_cast<size_t>(n_tok * 64)), yb(static_cast<size_t>(n_tok * 48));
    const MatmulTarget targets[] = {{a.f8, ya.data(), 64}, {b.f8, yb.data(), 48}};
    detail::matmul_shared_with(*ks, targets, x.data(), 128, n_tok, &pool);
    expect_bits(ya, run(*ks, a.f32, x, n_tok, nullptr), "target a");
    expect_bits(yb, run(*ks, b.f32, x, n_tok, nullptr), "target b");
  }
}

TEST(MatmulF8, NanCodeReachesOnlyItsRow) {
  for (const auto* ks : kernel_sets()) {
    for (uint8_t nan : {uint8_t{0x7f}, uint8_t{0xff}}) {
      SCOPED_TRACE(std::string(ks->name) + " code " + std::to_string(nan));
      F8Matrix m = make_f8(12, 96, 4, 32, 5);
      const auto x = random_x(3, 96, 6);
      const auto clean = run(*ks, m.f8, x, 3, nullptr);
      m.codes[static_cast<size_t>(5 * 96 + 70)] = nan;  // row 5
      const auto y = run(*ks, m.f8, x, 3, nullptr);
      for (int64_t t = 0; t < 3; ++t)
        for (int64_t r = 0; r < 12; ++r) {
          const auto i = static_cast<size_t>(t * 12 + r);
          if (r == 5)
            EXPECT_TRUE(std::isnan(y[i])) << "token " << t;
          else
            EXPECT_EQ(y[i], clean[i]) << "token " << t << " row " << r;
        }
    }
  }
}

TEST(MatmulF8, GetRowIsTheExactProduct) {
  const F8Matrix m = make_f8(20, 80, 8, 16, 9);
  std::vector<float> row(80);
  for (int64_t r = 0; r < 20; ++r) {
    get_row(m.f8, r, row.data());
    EXPECT_EQ(std::memcmp(row.data(), m.exact.data() + r * 80, 80 * sizeof(float)), 0) << r;
  }
}

TEST(MatmulF8, UnusableScalesAreRefused) {
  F8Matrix m = make_f8(8, 64, 4, 32, 3);
  const auto x = random_x(1, 64, 4);
  auto error_of = [&](const WeightView& w) { return matmul_error(w, x); };
  WeightView w = m.f8;
  w.scales = nullptr;
  EXPECT_NE(error_of(w).find("matmul: weight test.f8 is f8_e4m3 without usable scales"),
            std::string::npos)
      << error_of(w);
  w = m.f8;
  w.scale_block[1] = 24;  // lanes would straddle blocks
  EXPECT_NE(error_of(w).find("columns per block must be a multiple of 16"), std::string::npos)
      << error_of(w);
  w = m.f8;
  w.scale_stride = 1;  // 64 columns in blocks of 32 need 2 per block row
  EXPECT_NE(error_of(w).find("without usable scales"), std::string::npos) << error_of(w);
  // dequantize_row cannot see the scales.
  std::vector<float> row(64);
  EXPECT_THROW(model::dequantize_row(GgmlType::kF8_E4M3, m.codes.data(), row.data(), 64),
               InputError);
}

}  // namespace
}  // namespace troupe::compute
