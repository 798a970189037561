// matmul with FP4_PACKED weights (Hugging Face's MXFP4 layout: E2M1 codes two to a byte, low
// nibble first, one E8M0 scale byte per 32 columns) on every SIMD path this CPU runs: each output
// equals, bit for bit, the same path's output for an F32 matrix holding value * scale computed
// here from the OCP definitions; batch and thread invariance; get_row; the E8M0 extremes; bad
// layouts get a clear error. GGUF's MXFP4 blocks likewise against their dequantized values.
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

// E2M1 from its bits (OCP MX v1.0): sign, 2 exponent bits (bias 1), 1 mantissa bit; exponent 0
// is subnormal (0 or 0.5).
double e2m1(int code) {
  const int e = (code >> 1) & 3, m = code & 1;
  const double mag = e == 0 ? 0.5 * m : std::ldexp(1.0 + 0.5 * m, e - 1);
  return (code & 8) != 0 ? -mag : mag;
}

struct Fp4Matrix {
  std::string codes, scales;  // nibbles, E8M0 bytes
  std::vector<float> exact;
  WeightView fp4, f32;
};

// Random codes, scale exponents around 2^0 (and every 7th block at an extreme of the range).
Fp4Matrix make_fp4(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  Fp4Matrix m;
  const int64_t nb = cols / 32;
  std::vector<int> q(static_cast<size_t>(rows * cols));
  for (auto& v : q) v = static_cast<int>(rng() % 16);
  for (size_t i = 0; i < q.size(); i += 2)
    m.codes.push_back(static_cast<char>(q[i] | q[i + 1] << 4));
  for (int64_t b = 0; b < rows * nb; ++b) {
    int e = 120 + static_cast<int>(rng() % 14);
    if (b % 7 == 3) e = b % 2 != 0 ? 0 : 254;  // 2^-127 (a subnormal float) and 2^127
    m.scales.push_back(static_cast<char>(e));
  }
  m.exact.resize(q.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const auto i = static_cast<size_t>(r * cols + c);
      const auto e = static_cast<uint8_t>(m.scales[static_cast<size_t>(r * nb + c / 32)]);
      m.exact[i] = static_cast<float>(std::ldexp(e2m1(q[i]), e - 127));  // exact in float
      if (m.exact[i] == 0.f) m.exact[i] = 0.f;                           // -0 reads as 0
    }
  m.fp4.name = "test.fp4";
  m.fp4.type = GgmlType::kFP4_PACKED;
  m.fp4.ne[0] = cols;
  m.fp4.ne[1] = rows;
  m.fp4.data = reinterpret_cast<const uint8_t*>(m.codes.data());
  m.fp4.scales = m.scales.data();
  m.fp4.scale_type = GgmlType::kE8M0;
  m.fp4.scale_block[0] = 1;
  m.fp4.scale_block[1] = 32;
  m.fp4.scale_stride = nb;
  m.f32 = f32_view(m.exact, rows, cols);
  return m;
}

TEST(MatmulFp4, EqualsTheExactF32TwinOnEveryPath) {
  ThreadPool pool(2);
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{37, 256}, {9, 64}, {130, 2880}}) {
    const Fp4Matrix m = make_fp4(rows, cols, 7);
    for (const auto* ks : kernel_sets()) {
      for (int64_t n_tok : {1, 2, 5, 13, 48}) {
        SCOPED_TRACE(std::string(ks->name) + " " + std::to_string(rows) + "x" +
                     std::to_string(cols) + " n_tok " + std::to_string(n_tok));
        const auto x = random_x(n_tok, cols, 11);
        const auto want = run(*ks, m.f32, x, n_tok, nullptr);
        expect_bits(run(*ks, m.fp4, x, n_tok, nullptr), want, "1 thread");
        expect_bits(run(*ks, m.fp4, x, n_tok, &pool), want, "2 threads");
        const auto one = run(*ks, m.fp4, x, 1, nullptr);
        EXPECT_EQ(std::memcmp(one.data(), want.data(), one.size() * sizeof(float)), 0);
      }
    }
  }
}

// GGUF's MXFP4 (17-byte blocks, value j and j + 16 sharing a byte) runs the same float
// arithmetic on its exact values: bit for bit an F32 matrix holding model::dequantize_row's.
TEST(MatmulFp4, GgufMxfp4EqualsTheExactF32TwinOnEveryPath) {
  ThreadPool pool(2);
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{37, 256}, {9, 64}, {130, 2880}}) {
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> uni(-3.f, 3.f);
    const int64_t rb = model::row_bytes(GgmlType::kMXFP4, cols);
    std::vector<uint8_t> bytes(static_cast<size_t>(rows * rb));
    std::vector<float> row(static_cast<size_t>(cols)), exact(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r) {
      for (auto& v : row) v = uni(rng) * std::ldexp(1.f, static_cast<int>(rng() % 9) - 4);
      model::quantize_row(GgmlType::kMXFP4, row.data(), bytes.data() + r * rb, cols);
      model::dequantize_row(GgmlType::kMXFP4, bytes.data() + r * rb, exact.data() + r * cols, cols);
    }
    WeightView w;
    w.name = "test.mxfp4";
    w.type = GgmlType::kMXFP4;
    w.ne[0] = cols;
    w.ne[1] = rows;
    w.data = bytes.data();
    const WeightView f32 = f32_view(exact, rows, cols);
    for (const auto* ks : kernel_sets()) {
      for (int64_t n_tok : {1, 3, 16, 48}) {
        SCOPED_TRACE(std::string(ks->name) + " " + std::to_string(rows) + "x" +
                     std::to_string(cols) + " n_tok " + std::to_string(n_tok));
        const auto x = random_x(n_tok, cols, 13);
        const auto want = run(*ks, f32, x, n_tok, nullptr);
        expect_bits(run(*ks, w, x, n_tok, nullptr), want, "1 thread");
        expect_bits(run(*ks, w, x, n_tok, &pool), want, "2 threads");
      }
    }
  }
}

// NVFP4: an E4M3 scale per 16 columns and one global scale, which multiplies (ModelOpt's
// weight_scale_2) or divides (compressed-tensors' weight_global_scale). The twin holds, from the
// definitions and in double precision (exact here, then rounded once to float), each group's
// scale float(e4m3 * g) or float(e4m3 / g), and each value float(E2M1 * that scale).
TEST(MatmulFp4, Nvfp4EqualsTheExactF32TwinOnEveryPath) {
  ThreadPool pool(2);
  for (const bool divide : {false, true}) {
    const int64_t rows = 37, cols = 272;  // 17 groups: not a whole number of 32 or 128 columns
    const float global = divide ? 448.f * 6.f / 3.3f : 3.3f / (448.f * 6.f);
    std::mt19937 rng(21);
    std::vector<int> q(static_cast<size_t>(rows * cols));
    for (auto& v : q) v = static_cast<int>(rng() % 16);
    std::string codes, scales;
    for (size_t i = 0; i < q.size(); i += 2)
      codes.push_back(static_cast<char>(q[i] | q[i + 1] << 4));
    for (int64_t b = 0; b < rows * cols / 16; ++b) {
      // Positive, as a quantizer's amax-based scales are (a zero value then reads as +0).
      int c = static_cast<int>(rng() % 128);
      if (c == 0x7f) c = 0x08;                        // NaN's code: the smallest normal instead
      if (b % 11 == 5) c = b % 2 != 0 ? 0x01 : 0x7e;  // the smallest subnormal and 448
      scales.push_back(static_cast<char>(c));
    }
    std::vector<float> exact(q.size());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const auto i = static_cast<size_t>(r * cols + c);
        const double s = testing::e4m3_value(
            static_cast<uint8_t>(scales[static_cast<size_t>(r * cols / 16 + c / 16)]));
        const auto g = static_cast<float>(divide ? s / global : s * global);
        // -0 (code 8) reads as +0; a zero scale gives the negative codes -0.
        exact[i] = static_cast<float>((q[i] == 8 ? 0.0 : e2m1(q[i])) * static_cast<double>(g));
      }
    WeightView w;
    w.name = "test.nvfp4";
    w.type = GgmlType::kFP4_PACKED;
    w.ne[0] = cols;
    w.ne[1] = rows;
    w.data = reinterpret_cast<const uint8_t*>(codes.data());
    w.scales = scales.data();
    w.scale_type = GgmlType::kF8_E4M3;
    w.scale_block[0] = 1;
    w.scale_block[1] = 16;
    w.scale_stride = cols / 16;
    (divide ? w.scale_div : w.scale_mul) = global;
    const WeightView f32 = f32_view(exact, rows, cols);
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
      get_row(w, r, row.data());
      ASSERT_EQ(std::memcmp(row.data(), exact.data() + r * cols, row.size() * sizeof(float)), 0)
          << "row " << r << (divide ? " (divides)" : " (multiplies)");
    }
    for (const auto* ks : kernel_sets()) {
      for (int64_t n_tok : {1, 3, 16, 48}) {
        SCOPED_TRACE(std::string(ks->name) + (divide ? " divides" : " multiplies") + " n_tok " +
                     std::to_string(n_tok));
        const auto x = random_x(n_tok, cols, 23);
        const auto want = run(*ks, f32, x, n_tok, nullptr);
        expect_bits(run(*ks, w, x, n_tok, nullptr), want, "1 thread");
        expect_bits(run(*ks, w, x, n_tok, &pool), want, "2 threads");
      }
    }
  }
}

// Every E4M3 scale code under global scales in and out of the one-pass conversion's range (it
// needs mul * 2^120 and div * 2^-120 exact): each the float nearest e4m3 * mul or e4m3 / div,
// NaN's codes NaN.
TEST(MatmulFp4, E4m3ScalesTimesAGlobalScaleRoundOnce) {
  std::vector<uint8_t> codes(256);
  for (int c = 0; c < 256; ++c) codes[static_cast<size_t>(c)] = static_cast<uint8_t>(c);
  std::vector<float> out(256);
  for (const bool divide : {false, true}) {
    for (const float g : {1.0f, 3.3f / 2688, 1e-40f, 100.f, 1000.f, 2688 / 3.3f, 1e-3f, 0.0f}) {
      if (divide && g == 0.0f) continue;
      model::scales_to_f32(codes.data(), GgmlType::kF8_E4M3, 256, out.data(), divide ? 1.0f : g,
                           divide ? g : 1.0f);
      for (int c = 0; c < 256; ++c) {
        if ((c & 0x7f) == 0x7f) {
          EXPECT_TRUE(std::isnan(out[static_cast<size_t>(c)])) << c;
          continue;
        }
        const double s = testing::e4m3_value(static_cast<uint8_t>(c));
        const auto want = static_cast<float>(divide ? s / g : s * g);
        EXPECT_EQ(std::memcmp(&out[static_cast<size_t>(c)], &want, 4), 0)
            << "code " << c << (divide ? " / " : " * ") << g << ": " << out[static_cast<size_t>(c)]
            << " want " << want;
      }
    }
  }
}

TEST(MatmulFp4, GetRowIsTheExactValue) {
  const Fp4Matrix m = make_fp4(20, 96, 9);
  std::vector<float> row(96);
  for (int64_t r = 0; r < 20; ++r) {
    get_row(m.fp4, r, row.data());
    EXPECT_EQ(std::memcmp(row.data(), m.exact.data() + r * 96, 96 * sizeof(float)), 0)
        << "row " << r;
  }
}

// Column c of a one-row matrix holds code c % 16 (low nibble first); an activation that picks
// column c gives E2M1(c) on every path; a scale byte of 255 (E8M0's NaN) makes the output NaN.
TEST(MatmulFp4, CodesNibbleOrderAndNanScale) {
  std::string codes;
  for (int c = 0; c < 32; c += 2)
    codes.push_back(static_cast<char>((c % 16) | ((c + 1) % 16) << 4));
  std::string scale(1, static_cast<char>(127));  // 2^0
  WeightView w;
  w.name = "order";
  w.type = GgmlType::kFP4_PACKED;
  w.ne[0] = 32;
  w.data = reinterpret_cast<const uint8_t*>(codes.data());
  w.scales = scale.data();
  w.scale_type = GgmlType::kE8M0;
  w.scale_block[0] = 1;
  w.scale_block[1] = 32;
  w.scale_stride = 1;
  std::vector<float> x(32 * 32, 0.f);
  for (int c = 0; c < 32; ++c) x[static_cast<size_t>(c * 32 + c)] = 1.f;
  for (const auto* ks : kernel_sets()) {
    const auto y = run(*ks, w, x, 32, nullptr);
    for (int c = 0; c < 32; ++c)
      EXPECT_EQ(y[static_cast<size_t>(c)], static_cast<float>(e2m1(c % 16)))
          << ks->name << " col " << c;
  }
  scale[0] = static_cast<char>(255);
  for (const auto* ks : kernel_sets())
    EXPECT_TRUE(std::isnan(run(*ks, w, x, 1, nullptr)[0])) << ks->name;
  EXPECT_TRUE(std::isnan(model::e8m0_to_fp32(255)));
  EXPECT_EQ(model::e8m0_to_fp32(0), std::ldexp(1.f, -127));
  EXPECT_EQ(model::e8m0_to_fp32(254), std::ldexp(1.f, 127));
}

TEST(MatmulFp4, UnusableLayoutsAreRefused) {
  Fp4Matrix m = make_fp4(8, 64, 3);
  const auto x = random_x(1, 64, 4);
  WeightView w = m.fp4;
  w.scales = nullptr;
  EXPECT_NE(matmul_error(w, x).find("matmul: weight test.fp4 is fp4_packed without usable scales"),
            std::string::npos)
      << matmul_error(w, x);
  std::vector<float> row(64);
  EXPECT_THROW(
      model::dequantize_row(GgmlType::kFP4_PACKED, reinterpret_cast<const uint8_t*>(m.codes.data()),
                            row.data(), 64),
      InputError);
}

}  // namespace
}  // namespace troupe::compute
