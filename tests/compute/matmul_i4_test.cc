// matmul with packed int4 weights (compressed-tensors' pack-quantized layout, scales per group of
// columns in F32, BF16 or F16) on every SIMD path this CPU runs: each output equals, bit for bit,
// the same path's output for an F32 matrix holding q * scale (computed here from the layout's
// definition); batch and thread invariance; get_row; bad layouts get a clear error.
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
#include "tests/int4_model.h"

namespace troupe::compute {
namespace {

using model::GgmlType;
using model::WeightView;
using namespace matmultest;  // NOLINT(google-build-using-namespace): the test helpers

// A packed int4 matrix with random values and scales, and its exact f32 twin.
struct I4Matrix {
  std::string packed, scales;
  std::vector<float> exact;
  WeightView i4, f32;
};

I4Matrix make_i4(int64_t rows, int64_t cols, int64_t group, GgmlType scale_type, uint32_t seed) {
  std::mt19937 rng(seed);
  I4Matrix m;
  std::vector<int> q(static_cast<size_t>(rows * cols));
  for (auto& v : q) v = static_cast<int>(rng() % 16) - 8;
  m.packed = testing::pack_int4(q);
  const int64_t ng = cols / group;
  std::uniform_real_distribution<float> uni(0.5f, 2.f);
  std::vector<float> sc(static_cast<size_t>(rows * ng));
  for (auto& s : sc) {
    s = uni(rng) / 64.f * (rng() % 2 ? 1.f : -1.f);
    if (scale_type == GgmlType::kBF16) {
      const uint16_t b = testing::bf16_bits(s);
      s = testing::bf16_float(b);
      m.scales.append(reinterpret_cast<const char*>(&b), 2);
    } else if (scale_type == GgmlType::kF16) {
      const uint16_t h = model::fp32_to_fp16(s);
      s = model::fp16_to_fp32(h);
      m.scales.append(reinterpret_cast<const char*>(&h), 2);
    } else {
      s *= 1.f + 1e-6f * static_cast<float>(rng() % 1000);  // 24 significant bits
      m.scales.append(reinterpret_cast<const char*>(&s), 4);
    }
  }
  m.exact.resize(q.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const auto i = static_cast<size_t>(r * cols + c);
      // One rounding of the exact product, as the format defines the value.
      m.exact[i] = static_cast<float>(
          q[i] * static_cast<double>(sc[static_cast<size_t>(r * ng + c / group)]));
    }
  m.i4.name = "test.i4";
  m.i4.type = GgmlType::kI4_PACKED;
  m.i4.ne[0] = cols;
  m.i4.ne[1] = rows;
  m.i4.data = reinterpret_cast<const uint8_t*>(m.packed.data());
  m.i4.scales = m.scales.data();
  m.i4.scale_type = scale_type;
  m.i4.scale_block[0] = 1;
  m.i4.scale_block[1] = group;
  m.i4.scale_stride = ng;
  m.f32 = f32_view(m.exact, rows, cols);
  return m;
}

TEST(MatmulI4, EqualsTheExactF32TwinOnEveryPath) {
  ThreadPool pool(2);
  const struct {
    int64_t rows, cols, group;
    GgmlType scale;
  } shapes[] = {{37, 256, 32, GgmlType::kBF16},
                {9, 48, 16, GgmlType::kF32},
                {130, 384, 128, GgmlType::kF16},
                {5, 112, 112, GgmlType::kBF16}};  // one scale per row ("channel")
  for (const auto& sh : shapes) {
    const I4Matrix m = make_i4(sh.rows, sh.cols, sh.group, sh.scale, 7);
    for (const auto* ks : kernel_sets()) {
      for (int64_t n_tok : {1, 2, 5, 13, 48}) {
        SCOPED_TRACE(std::string(ks->name) + " " + std::to_string(sh.rows) + "x" +
                     std::to_string(sh.cols) + " group " + std::to_string(sh.group) + " n_tok " +
                     std::to_string(n_tok));
        const auto x = random_x(n_tok, sh.cols, 11);
        const auto want = run(*ks, m.f32, x, n_tok, nullptr);
        expect_bits(run(*ks, m.i4, x, n_tok, nullptr), want, "1 thread");
        expect_bits(run(*ks, m.i4, x, n_tok, &pool), want, "2 threads");
        const auto one = run(*ks, m.i4, x, 1, nullptr);
        EXPECT_EQ(std::memcmp(one.data(), want.data(), one.size() * sizeof(float)), 0);
      }
    }
  }
}

TEST(MatmulI4, SharedTargetsEqualSeparateCalls) {
  ThreadPool pool(2);
  const I4Matrix a = make_i4(64, 128, 32, GgmlType::kBF16, 1);
  const I4Matrix b = make_i4(48, 128, 64, GgmlType::kF32, 2);
  for (const auto* ks : kernel_sets()) {
    SCOPED_TRACE(ks->name);
    const int64_t n_tok = 6;
    const auto x = random_x(n_tok, 128, 3);
    std::vector<float> ya(static_cast<size_t>(n_tok * 64)), yb(static_cast<size_t>(n_tok * 48));
    const MatmulTarget targets[] = {{a.i4, ya.data(), 64}, {b.i4, yb.data(), 48}};
    detail::matmul_shared_with(*ks, targets, x.data(), 128, n_tok, &pool);
    expect_bits(ya, run(*ks, a.f32, x, n_tok, nullptr), "target a");
    expect_bits(yb, run(*ks, b.f32, x, n_tok, nullptr), "target b");
  }
}

TEST(MatmulI4, GetRowIsTheExactProduct) {
  for (GgmlType st : {GgmlType::kBF16, GgmlType::kF16, GgmlType::kF32}) {
    const I4Matrix m = make_i4(20, 96, 32, st, 9);
    std::vector<float> row(96);
    for (int64_t r = 0; r < 20; ++r) {
      get_row(m.i4, r, row.data());
      EXPECT_EQ(std::memcmp(row.data(), m.exact.data() + r * 96, 96 * sizeof(float)), 0)
          << model::type_name(st) << " row " << r;
    }
  }
}

TEST(MatmulI4, NibbleOrderIsLowFirst) {
  // Row 0 holds the values -8..7 in column order; an activation that picks column c gives it.
  std::vector<int> q(16);
  for (int c = 0; c < 16; ++c) q[static_cast<size_t>(c)] = c - 8;
  const std::string packed = testing::pack_int4(q);
  const float one = 1.f;
  WeightView w;
  w.name = "order";
  w.type = GgmlType::kI4_PACKED;
  w.ne[0] = 16;
  w.data = reinterpret_cast<const uint8_t*>(packed.data());
  w.scales = &one;
  w.scale_block[0] = 1;
  w.scale_block[1] = 16;
  w.scale_stride = 1;
  for (const auto* ks : kernel_sets()) {
    std::vector<float> x(16 * 16, 0.f);
    for (int c = 0; c < 16; ++c) x[static_cast<size_t>(c * 16 + c)] = 1.f;
    const auto y = run(*ks, w, x, 16, nullptr);
    for (int c = 0; c < 16; ++c)
      EXPECT_EQ(y[static_cast<size_t>(c)], static_cast<float>(c - 8)) << ks->name << " col " << c;
  }
}

TEST(MatmulI4, UnusableLayoutsAreRefused) {
  I4Matrix m = make_i4(8, 64, 32, GgmlType::kBF16, 3);
  const auto x = random_x(1, 64, 4);
  auto error_of = [&](const WeightView& w) { return matmul_error(w, x); };
  WeightView w = m.i4;
  w.scales = nullptr;
  EXPECT_NE(error_of(w).find("matmul: weight test.i4 is i4_packed without usable scales"),
            std::string::npos)
      << error_of(w);
  w = m.i4;
  w.scale_block[1] = 8;
  w.scale_stride = 8;
  EXPECT_NE(error_of(w).find("must be a multiple of 16"), std::string::npos) << error_of(w);
  w = m.i4;
  w.ne[0] = 40;  // groups of 16 fit, but rows must be whole multiples of 16 too
  w.scale_block[1] = 16;
  w.scale_stride = 3;
  EXPECT_NE(error_of(w).find("columns per block and columns must be a multiple of 16"),
            std::string::npos)
      << error_of(w);
  std::vector<float> row(64);
  EXPECT_THROW(
      model::dequantize_row(GgmlType::kI4_PACKED, reinterpret_cast<const uint8_t*>(m.packed.data()),
                            row.data(), 64),
      InputError);
}

}  // namespace
}  // namespace troupe::compute
