// matmul: every weight type on every SIMD path this CPU runs, against dequantize_row with a
// double-precision dot; batch invariance (bit-identical outputs whatever the batch, the
// thread count or the rows computed together); odd sizes; NaN propagation.
#include "compute/matmul.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "base/check.h"
#include "compute/detail/matmul_kernels.h"
#include "compute/thread_pool.h"
#include "tests/compute/matmul_test_util.h"
#include "tests/kquant_blocks.h"
#include "tests/test_support.h"

namespace troupe::compute {
namespace {

using model::GgmlType;
using model::WeightView;
using namespace matmultest;  // NOLINT(google-build-using-namespace): the test helpers

constexpr GgmlType kTypes[] = {
    GgmlType::kF32,  GgmlType::kF16,    GgmlType::kBF16,   GgmlType::kQ8_0,
    GgmlType::kQ4_0, GgmlType::kQ4_1,   GgmlType::kQ5_0,   GgmlType::kQ5_1,
    GgmlType::kQ2_K, GgmlType::kQ3_K,   GgmlType::kQ4_K,   GgmlType::kQ5_K,
    GgmlType::kQ6_K, GgmlType::kIQ4_NL, GgmlType::kIQ4_XS, GgmlType::kMXFP4};

// f32 activations and FMA accumulation (MXFP4: its exact values, as the float types).
bool is_float(GgmlType t) {
  return t == GgmlType::kF32 || t == GgmlType::kF16 || t == GgmlType::kBF16 ||
         t == GgmlType::kMXFP4;
}

int64_t block_elems(GgmlType t) {
  return model::type_traits(static_cast<uint32_t>(t))->block_elems;
}

// A weight matrix owning its bytes.
struct Weights {
  std::vector<uint8_t> bytes;
  WeightView view;
};

Weights make_weights(GgmlType t, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  Weights w;
  w.view.name = "test." + model::type_name(t);
  w.view.type = t;
  w.view.ne[0] = cols;
  w.view.ne[1] = rows;
  const int64_t rb = model::row_bytes(t, cols);
  w.bytes.resize(static_cast<size_t>(rb * rows + 64));
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* dst = w.bytes.data() + r * rb;
    if (model::type_traits(static_cast<uint32_t>(t))->block_elems == model::kQK_K) {
      ::troupe::testing::random_kquant_row(t, dst, cols, rng);
    } else {
      for (auto& v : row) v = uni(rng);
      model::quantize_row(t, row.data(), dst, cols);
    }
  }
  w.view.data = w.bytes.data();
  return w;
}

// Reference: dequantized row, double dot. Also returns sum |w_k x_k| (the error scale).
void reference(const WeightView& w, const float* x, int64_t n_tok, std::vector<double>& y,
               std::vector<double>& scale) {
  const int64_t rows = w.rows(), cols = w.cols();
  y.assign(static_cast<size_t>(n_tok * rows), 0);
  scale.assign(y.size(), 0);
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    model::dequantize_row(w.type, w.row(r), row.data(), cols);
    for (int64_t t = 0; t < n_tok; ++t) {
      double s = 0, a = 0;
      for (int64_t k = 0; k < cols; ++k) {
        const double p = static_cast<double>(row[static_cast<size_t>(k)]) * x[t * cols + k];
        s += p;
        a += std::fabs(p);
      }
      y[static_cast<size_t>(t * rows + r)] = s;
      scale[static_cast<size_t>(t * rows + r)] = a;
    }
  }
}

// Error bound relative to sum |w_k x_k|: f32 accumulation for float weights; for quantized
// weights the int8 activations (error <= amax/254 per value, about 1/127 of that sum).
double tolerance(GgmlType t) { return is_float(t) ? 2e-6 : 1.2e-2; }

void expect_near_reference(const detail::KernelSet& ks, GgmlType t, int64_t rows, int64_t cols,
                           int64_t n_tok, ThreadPool* pool) {
  SCOPED_TRACE(std::string(ks.name) + " " + model::type_name(t) + " rows=" + std::to_string(rows) +
               " cols=" + std::to_string(cols) + " n_tok=" + std::to_string(n_tok));
  const Weights w = make_weights(t, rows, cols, 7 + static_cast<uint32_t>(rows * cols));
  const auto x = random_x(n_tok, cols, 11);
  std::vector<double> ref, scale;
  reference(w.view, x.data(), n_tok, ref, scale);
  const auto y = run(ks, w.view, x, n_tok, pool);
  int bad = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    const double err = std::fabs(y[i] - ref[i]);
    if (!(err <= tolerance(t) * scale[i] + 1e-30) && ++bad <= 5) {
      ADD_FAILURE() << "element " << i << ": got " << y[i] << ", want " << ref[i] << " (err "
                    << err / scale[i] << " of sum|wx|)";
    }
  }
  EXPECT_EQ(bad, 0);
}

int64_t test_cols(GgmlType t) {
  switch (block_elems(t)) {
    case 1:
      return 533;  // a partial SIMD chunk at the end
    case 32:
      return 32 * 17;  // an odd number of blocks
    default:
      return 256 * 3;
  }
}

TEST(Matmul, SimdLevelIsKnown) {
  const std::string level = simd_level();
  EXPECT_TRUE(level == "avx512" || level == "avx2" || level == "scalar") << level;
  EXPECT_EQ(kernel_sets().back()->name, std::string("scalar"));
}

TEST(Matmul, MatchesReferenceOnEveryPath) {
  ThreadPool pool(2);
  for (const auto* ks : kernel_sets())
    for (GgmlType t : kTypes) expect_near_reference(*ks, t, 37, test_cols(t), 7, &pool);
}

TEST(Matmul, OddSizesMatchReference) {
  for (const auto* ks : kernel_sets()) {
    for (GgmlType t : kTypes) {
      const int64_t b = block_elems(t);
      for (int64_t cols : {b, 2 * b, 3 * b}) {
        for (int64_t rows : {1, 5}) expect_near_reference(*ks, t, rows, cols, 3, nullptr);
      }
      if (b == 1) {
        for (int64_t cols : {1, 7, 15, 16, 17, 31, 33})
          expect_near_reference(*ks, t, 6, cols, 5, nullptr);
      }
    }
  }
}

// Quantized paths quantize activations the same way at every level, so the SIMD kernels
// must agree with the scalar ones far more tightly than with the f32 reference.
TEST(Matmul, QuantizedSimdMatchesScalarKernels) {
  const auto sets = kernel_sets();
  const detail::KernelSet& scalar = *sets.back();
  for (const auto* ks : sets) {
    for (GgmlType t : kTypes) {
      if (is_float(t) || ks == &scalar) continue;
      SCOPED_TRACE(std::string(ks->name) + " " + model::type_name(t));
      const int64_t cols = test_cols(t), rows = 19, n_tok = 5;
      const Weights w = make_weights(t, rows, cols, 3);
      const auto x = random_x(n_tok, cols, 5);
      std::vector<double> ref, scale;
      reference(w.view, x.data(), n_tok, ref, scale);
      const auto a = run(*ks, w.view, x, n_tok, nullptr);
      const auto b = run(scalar, w.view, x, n_tok, nullptr);
      for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 2e-5 * scale[i]) << i;
    }
  }
}

// y[t][o] must not depend on n_tok, the thread count, or which other rows (tokens or weight
// rows) are computed in the same call.
TEST(Matmul, BatchInvariant) {
  ThreadPool pool2(2), pool3(3);
  ThreadPool* pools[] = {nullptr, &pool2, &pool3};
  constexpr int64_t kMaxTok = 33;
  for (const auto* ks : kernel_sets()) {
    for (GgmlType t : kTypes) {
      SCOPED_TRACE(std::string(ks->name) + " " + model::type_name(t));
      const int64_t cols = test_cols(t), rows = 45;
      const Weights w = make_weights(t, rows, cols, 21);
      const auto x = random_x(kMaxTok, cols, 23);
      const auto full = run(*ks, w.view, x, kMaxTok, nullptr);
      for (ThreadPool* pool : pools) {
        for (int64_t n_tok : {1, 3, 16, 33}) {
          const auto y = run(*ks, w.view, x, n_tok, pool);
          ASSERT_EQ(std::memcmp(y.data(), full.data(), y.size() * sizeof(float)), 0)
              << "n_tok=" << n_tok << " threads=" << (pool ? pool->size() : 1);
        }
      }
      // Token 0 inside a different batch, at another position.
      std::vector<float> other = random_x(9, cols, 99);
      std::copy(x.begin(), x.begin() + cols, other.begin() + 5 * cols);
      const auto y_other = run(*ks, w.view, other, 9, &pool2);
      ASSERT_EQ(std::memcmp(y_other.data() + 5 * rows, full.data(), rows * sizeof(float)), 0);
      // A slice of weight rows (other tile positions, other row neighbours).
      for (int64_t r0 : {1, 3, 7}) {
        WeightView part = w.view;
        part.data = w.view.row(r0);
        part.ne[1] = 5;
        const auto y = run(*ks, part, x, 2, &pool2);
        for (int64_t tk = 0; tk < 2; ++tk)
          ASSERT_EQ(std::memcmp(y.data() + tk * 5, full.data() + tk * rows + r0, 5 * sizeof(float)),
                    0)
              << "rows from " << r0;
      }
    }
  }
}

// Several matrices on one input (q/k/v, gate/up) in one run: each output bit-identical to its
// own matmul, whatever the thread count; a matrix of another type or width among them too.
TEST(Matmul, SharedInputMatchesSeparateProducts) {
  ThreadPool pool2(2), pool3(3);
  ThreadPool* pools[] = {nullptr, &pool2, &pool3};
  for (const auto* ks : kernel_sets()) {
    for (GgmlType t : kTypes) {
      SCOPED_TRACE(std::string(ks->name) + " " + model::type_name(t));
      const int64_t cols = test_cols(t);
      // Row counts: a big one (split across threads), a small one, an odd one.
      const Weights a = make_weights(t, 96, cols, 31), b = make_weights(t, 40, cols, 32),
                    c = make_weights(t, 37, cols, 33);
      // A fourth of another type (or width): its own section, or matmul() alone.
      const GgmlType other = t == GgmlType::kF32 ? GgmlType::kF16 : GgmlType::kF32;
      const Weights d = make_weights(other, 48, cols, 34);
      for (int64_t n_tok : {1, 5, 33}) {
        const auto x = random_x(n_tok, cols, 35);
        for (ThreadPool* pool : pools) {
          for (const bool mixed : {false, true}) {
            std::vector<const Weights*> ws = {&a, &b, &c};
            if (mixed) ws.push_back(&d);
            std::vector<std::vector<float>> ys;
            std::vector<MatmulTarget> targets;
            ys.reserve(ws.size());
            for (const Weights* w : ws) {
              ys.emplace_back(static_cast<size_t>(n_tok * (w->view.rows() + 3)), -7.f);
              targets.push_back({w->view, ys.back().data(), w->view.rows() + 3});
            }
            detail::matmul_shared_with(*ks, targets, x.data(), cols, n_tok, pool);
            for (size_t i = 0; i < ws.size(); ++i) {
              const int64_t rows = ws[i]->view.rows(), ys_stride = rows + 3;
              const auto want = run(*ks, ws[i]->view, x, n_tok, nullptr);
              for (int64_t tk = 0; tk < n_tok; ++tk) {
                ASSERT_EQ(std::memcmp(ys[i].data() + tk * ys_stride, want.data() + tk * rows,
                                      rows * sizeof(float)),
                          0)
                    << "target " << i << " n_tok=" << n_tok << " mixed=" << mixed
                    << " threads=" << (pool ? pool->size() : 1);
                for (int64_t k = rows; k < ys_stride; ++k)
                  ASSERT_EQ(ys[i][static_cast<size_t>(tk * ys_stride + k)], -7.f);
              }
            }
          }
        }
      }
    }
  }
}

// Products with their own inputs in one run (an MoE layer's experts): each output bit-identical
// to its own matmul, whatever the thread count; more than four products; inputs shared by
// neighbours (gate and up of one expert) or not; token counts and strides of their
// own; one of another type among them runs in a section of its own.
TEST(Matmul, ManyProductsMatchSeparateProducts) {
  ThreadPool pool2(2), pool3(3);
  ThreadPool* pools[] = {nullptr, &pool2, &pool3};
  for (const auto* ks : kernel_sets()) {
    for (GgmlType t : kTypes) {
      SCOPED_TRACE(std::string(ks->name) + " " + model::type_name(t));
      const int64_t cols = test_cols(t);
      const Weights a = make_weights(t, 96, cols, 41), b = make_weights(t, 64, cols, 42),
                    c = make_weights(t, 37, cols, 43);
      const GgmlType other = t == GgmlType::kF32 ? GgmlType::kF16 : GgmlType::kF32;
      const Weights d = make_weights(other, 48, cols, 44);
      // Inputs: x0 one token, x1 five tokens at stride cols + 4, x2 three tokens, x3 enough
      // tokens for the activations to be prepared on the pool.
      const int64_t n3 = (1 << 16) / cols + 1;
      const auto x0 = random_x(1, cols, 45), x2 = random_x(3, cols, 47),
                 x3 = random_x(n3, cols, 48);
      std::vector<float> x1(static_cast<size_t>(5 * (cols + 4)), NAN);
      {
        const auto dense = random_x(5, cols, 46);
        for (int64_t tk = 0; tk < 5; ++tk)
          std::copy_n(dense.begin() + tk * cols, cols, x1.begin() + tk * (cols + 4));
      }
      struct Spec {
        const Weights* w;
        const float* x;
        int64_t x_stride, n_tok;
      };
      for (const bool mixed : {false, true}) {
        std::vector<Spec> specs = {{&a, x0.data(), cols, 1},     {&b, x0.data(), cols, 1},
                                   {&c, x1.data(), cols + 4, 5}, {&a, x1.data(), cols + 4, 5},
                                   {&b, x2.data(), cols, 3},     {&c, x2.data(), cols, 3},
                                   {&b, x3.data(), cols, n3}};
        if (mixed) specs.insert(specs.begin() + 2, {&d, x2.data(), cols, 3});
        for (ThreadPool* pool : pools) {
          std::vector<std::vector<float>> ys;
          std::vector<MatmulProduct> products;
          ys.reserve(specs.size());
          for (const Spec& sp : specs) {
            const int64_t stride = sp.w->view.rows() + 3;
            ys.emplace_back(static_cast<size_t>(sp.n_tok * stride), -7.f);
            products.push_back(
                {&sp.w->view, sp.x, sp.x_stride, sp.n_tok, ys.back().data(), stride});
          }
          detail::matmul_many_with(*ks, products, pool);
          for (size_t i = 0; i < specs.size(); ++i) {
            const Spec& sp = specs[i];
            const int64_t rows = sp.w->view.rows(), stride = rows + 3;
            std::vector<float> x(static_cast<size_t>(sp.n_tok * cols));
            for (int64_t tk = 0; tk < sp.n_tok; ++tk)
              std::copy_n(sp.x + tk * sp.x_stride, cols, x.begin() + tk * cols);
            const auto want = run(*ks, sp.w->view, x, sp.n_tok, nullptr);
            for (int64_t tk = 0; tk < sp.n_tok; ++tk) {
              ASSERT_EQ(std::memcmp(ys[i].data() + tk * stride, want.data() + tk * rows,
                                    rows * sizeof(float)),
                        0)
                  << "product " << i << " mixed=" << mixed
                  << " threads=" << (pool ? pool->size() : 1);
              for (int64_t k = rows; k < stride; ++k)
                ASSERT_EQ(ys[i][static_cast<size_t>(tk * stride + k)], -7.f);
            }
          }
        }
      }
    }
  }
}

// Many products of few rows each, every one on its own input row (MLA's per-head matrices at
// one token, its inputs interleaved in one row of all heads): one run shares out their row tiles
// although none has enough to split, and each output is bit-identical to its own matmul.
TEST(Matmul, ManySmallProductsShareOneRun) {
  ThreadPool pool2(2), pool4(4);
  ThreadPool* pools[] = {&pool2, &pool4};
  for (const auto* ks : kernel_sets()) {
    for (GgmlType t : kTypes) {
      SCOPED_TRACE(std::string(ks->name) + " " + model::type_name(t));
      const int64_t cols = test_cols(t), heads = 12;
      std::vector<Weights> ws;
      for (int64_t h = 0; h < heads; ++h)
        ws.push_back(make_weights(t, h % 3 == 2 ? 20 : 16, cols, 60 + static_cast<uint32_t>(h)));
      for (const int64_t n_tok : {1, 3}) {
        const int64_t x_stride = heads * cols;  // token row: every head's input in turn
        const auto x = random_x(n_tok, x_stride, 61);
        for (ThreadPool* pool : pools) {
          const int64_t y_stride = heads * 20 + 1;
          std::vector<float> y(static_cast<size_t>(n_tok * y_stride), -7.f);
          std::vector<MatmulProduct> products;
          for (int64_t h = 0; h < heads; ++h)
            products.push_back({&ws[static_cast<size_t>(h)].view, x.data() + h * cols, x_stride,
                                n_tok, y.data() + h * 20, y_stride});
          detail::matmul_many_with(*ks, products, pool);
          for (int64_t h = 0; h < heads; ++h) {
            const WeightView& w = ws[static_cast<size_t>(h)].view;
            std::vector<float> xh(static_cast<size_t>(n_tok * cols));
            for (int64_t tk = 0; tk < n_tok; ++tk)
              std::copy_n(x.begin() + tk * x_stride + h * cols, cols, xh.begin() + tk * cols);
            const auto want = run(*ks, w, xh, n_tok, nullptr);
            for (int64_t tk = 0; tk < n_tok; ++tk) {
              ASSERT_EQ(std::memcmp(y.data() + tk * y_stride + h * 20, want.data() + tk * w.rows(),
                                    static_cast<size_t>(w.rows()) * sizeof(float)),
                        0)
                  << "head " << h << " n_tok=" << n_tok << " threads=" << pool->size();
              for (int64_t k = w.rows(); k < 20; ++k)
                ASSERT_EQ(y[static_cast<size_t>(tk * y_stride + h * 20 + k)], -7.f);
            }
          }
        }
      }
    }
  }
}

TEST(Matmul, StridedInputAndOutput) {
  for (const auto* ks : kernel_sets()) {
    for (GgmlType t : {GgmlType::kF32, GgmlType::kQ4_0}) {
      const int64_t cols = 64, rows = 6, n_tok = 3, xs = 80, ys = 10;
      const Weights w = make_weights(t, rows, cols, 5);
      const auto x = random_x(n_tok, cols, 6);
      std::vector<float> xw(static_cast<size_t>(n_tok * xs), NAN);
      for (int64_t tk = 0; tk < n_tok; ++tk)
        std::copy_n(x.begin() + tk * cols, cols, xw.begin() + tk * xs);
      std::vector<float> y(static_cast<size_t>(n_tok * ys), -1.f);
      detail::matmul_with(*ks, w.view, xw.data(), xs, n_tok, y.data(), ys, nullptr);
      const auto dense = run(*ks, w.view, x, n_tok, nullptr);
      for (int64_t tk = 0; tk < n_tok; ++tk) {
        EXPECT_EQ(std::memcmp(y.data() + tk * ys, dense.data() + tk * rows, rows * sizeof(float)),
                  0);
        for (int64_t i = rows; i < ys; ++i) EXPECT_EQ(y[static_cast<size_t>(tk * ys + i)], -1.f);
      }
    }
  }
}

TEST(Matmul, NonFiniteInputPropagates) {
  for (const auto* ks : kernel_sets()) {
    for (GgmlType t : kTypes) {
      for (float bad :
           {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
        SCOPED_TRACE(std::string(ks->name) + " " + model::type_name(t) + " " + std::to_string(bad));
        const int64_t cols = test_cols(t), rows = 9, n_tok = 3;
        const Weights w = make_weights(t, rows, cols, 8);
        auto x = random_x(n_tok, cols, 9);
        const auto clean = run(*ks, w.view, x, n_tok, nullptr);
        x[static_cast<size_t>(cols + cols / 2)] = bad;  // token 1
        const auto y = run(*ks, w.view, x, n_tok, nullptr);
        for (int64_t r = 0; r < rows; ++r) {
          EXPECT_FALSE(std::isfinite(y[static_cast<size_t>(rows + r)])) << "row " << r;
          EXPECT_EQ(y[static_cast<size_t>(r)], clean[static_cast<size_t>(r)]);
          EXPECT_EQ(y[static_cast<size_t>(2 * rows + r)], clean[static_cast<size_t>(2 * rows + r)]);
        }
        if (std::isnan(bad)) {
          for (int64_t r = 0; r < rows; ++r)
            EXPECT_TRUE(std::isnan(y[static_cast<size_t>(rows + r)]));
        }
      }
    }
  }
}

TEST(Matmul, PublicEntryPointUsesTheActivePath) {
  const Weights w = make_weights(GgmlType::kQ8_0, 33, 256, 1);
  const auto x = random_x(4, 256, 2);
  std::vector<float> y(4 * 33);
  ThreadPool pool(2);
  matmul(w.view, x.data(), 4, y.data(), &pool);
  bool found = false;
  for (const auto* ks : kernel_sets()) {
    const auto z = run(*ks, w.view, x, 4, nullptr);
    found = found || std::memcmp(z.data(), y.data(), y.size() * sizeof(float)) == 0;
  }
  EXPECT_TRUE(found);
}

TEST(Matmul, UnsupportedTypeThrows) {
  std::vector<uint8_t> data(64);
  WeightView w;
  w.name = "blk.0.ffn_up.weight";
  w.type = GgmlType::kQ8_1;
  w.ne[0] = 32;
  w.ne[1] = 1;
  w.data = data.data();
  std::vector<float> x(32), y(1);
  try {
    matmul(w, x.data(), 1, y.data(), nullptr);
    FAIL() << "no throw";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("q8_1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("blk.0.ffn_up.weight"), std::string::npos) << e.what();
  }
}

TEST(Matmul, GetRowDequantizes) {
  const Weights w = make_weights(GgmlType::kQ4_K, 3, 256, 4);
  std::vector<float> a(256), b(256);
  get_row(w.view, 2, a.data());
  model::dequantize_row(GgmlType::kQ4_K, w.view.row(2), b.data(), 256);
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace troupe::compute
