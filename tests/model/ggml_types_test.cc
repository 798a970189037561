// The K-quant block layouts, checked against a second formulation of each format: the value
// order written as nested loops over 128-value halves, 32-value quarters and bit shifts (the
// way the format is usually described), rather than dequantize_row's per-element indexing.
#include "model/ggml_types.h"

#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace troupe::model {
namespace {

// Q3_K's scale packing, case by case: scales 0-3 take bits 0-1 of bytes 8-11 as their top
// bits, 4-7 bits 2-3, 8-11 (low bits in the high nibbles of bytes 0-3) bits 4-5, 12-15 (high
// nibbles of bytes 4-7) bits 6-7.
int q3k_scale_by_cases(const uint8_t* p, int g) {
  int v = 0;
  if (g < 4) {
    v = (p[g] & 0xF) | (p[g + 8] & 3) << 4;
  } else if (g < 8) {
    v = (p[g] & 0xF) | (p[g + 4] >> 2 & 3) << 4;
  } else if (g < 12) {
    v = (p[g - 8] >> 4) | (p[g] >> 4 & 3) << 4;
  } else {
    v = (p[g - 8] >> 4) | (p[g - 4] >> 6 & 3) << 4;
  }
  return v - 32;
}

TEST(GgmlTypes, Q3KScalesFollowTheFormatsFourCases) {
  std::mt19937 rng(1);
  for (int trial = 0; trial < 200; ++trial) {
    uint8_t p[12];
    for (uint8_t& b : p) b = static_cast<uint8_t>(rng());
    int8_t s[16];
    q3k_scales(p, s);
    for (int g = 0; g < 16; ++g) ASSERT_EQ(s[g], q3k_scale_by_cases(p, g)) << "scale " << g;
  }
}

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> b(n);
  for (uint8_t& v : b) v = static_cast<uint8_t>(rng());
  return b;
}

TEST(GgmlTypes, Q2KDequantizesAsTheFormatLoops) {
  std::vector<uint8_t> bytes = random_bytes(sizeof(BlockQ2_K), 2);
  auto* b = reinterpret_cast<BlockQ2_K*>(bytes.data());
  b->d = fp32_to_fp16(0.25f);
  b->dmin = fp32_to_fp16(0.125f);
  float got[kQK_K];
  dequantize_row(GgmlType::kQ2_K, b, got, kQK_K);
  int out = 0, is = 0;
  for (int half = 0; half < 2; ++half) {
    const uint8_t* q = b->qs + 32 * half;
    for (int shift = 0; shift < 8; shift += 2) {
      for (int sub = 0; sub < 2; ++sub, ++is) {  // 16 values per scale
        const float dl = 0.25f * static_cast<float>(b->scales[is] & 0xF);
        const float ml = 0.125f * static_cast<float>(b->scales[is] >> 4);
        for (int l = 16 * sub; l < 16 * sub + 16; ++l, ++out)
          ASSERT_EQ(got[out], dl * static_cast<float>(q[l] >> shift & 3) - ml) << out;
      }
    }
  }
}

TEST(GgmlTypes, Q3KDequantizesAsTheFormatLoops) {
  std::vector<uint8_t> bytes = random_bytes(sizeof(BlockQ3_K), 3);
  auto* b = reinterpret_cast<BlockQ3_K*>(bytes.data());
  b->d = fp32_to_fp16(0.5f);
  float got[kQK_K];
  dequantize_row(GgmlType::kQ3_K, b, got, kQK_K);
  int out = 0, is = 0;
  uint8_t m = 1;  // the hmask bit, one per 32-value quarter, across both halves
  for (int half = 0; half < 2; ++half) {
    const uint8_t* q = b->qs + 32 * half;
    for (int shift = 0; shift < 8; shift += 2, m = static_cast<uint8_t>(m << 1)) {
      for (int sub = 0; sub < 2; ++sub, ++is) {
        const float dl = 0.5f * static_cast<float>(q3k_scale_by_cases(b->scales, is));
        for (int l = 16 * sub; l < 16 * sub + 16; ++l, ++out) {
          const int v = (q[l] >> shift & 3) - ((b->hmask[l] & m) ? 0 : 4);
          ASSERT_EQ(got[out], dl * static_cast<float>(v)) << out;
        }
      }
    }
  }
}

TEST(GgmlTypes, Q5KDequantizesAsTheFormatLoops) {
  std::vector<uint8_t> bytes = random_bytes(sizeof(BlockQ5_K), 5);
  auto* b = reinterpret_cast<BlockQ5_K*>(bytes.data());
  b->d = fp32_to_fp16(0.5f);
  b->dmin = fp32_to_fp16(2.f);
  float got[kQK_K];
  dequantize_row(GgmlType::kQ5_K, b, got, kQK_K);
  int out = 0;
  uint8_t u1 = 1, u2 = 2;  // the qh bits of the low and high nibbles of each 64 values
  const uint8_t* ql = b->qs;
  for (int j = 0; j < 4;
       ++j, ql += 32, u1 = static_cast<uint8_t>(u1 << 2), u2 = static_cast<uint8_t>(u2 << 2)) {
    // The 6-bit scale and min of sub-block i, as Q4_K packs them.
    auto scale_min = [&](int i, float* sc, float* mn) {
      const uint8_t* s = b->scales;
      const int a = i < 4 ? (s[i] & 63) : ((s[i + 4] & 0xF) | (s[i - 4] >> 6) << 4);
      const int c = i < 4 ? (s[i + 4] & 63) : ((s[i + 4] >> 4) | (s[i] >> 6) << 4);
      *sc = 0.5f * static_cast<float>(a);
      *mn = 2.f * static_cast<float>(c);
    };
    float d1, m1, d2, m2;
    scale_min(2 * j, &d1, &m1);
    scale_min(2 * j + 1, &d2, &m2);
    for (int l = 0; l < 32; ++l, ++out) {
      const int v = (ql[l] & 0xF) + ((b->qh[l] & u1) ? 16 : 0);
      ASSERT_EQ(got[out], d1 * static_cast<float>(v) - m1) << out;
    }
    for (int l = 0; l < 32; ++l, ++out) {
      const int v = (ql[l] >> 4) + ((b->qh[l] & u2) ? 16 : 0);
      ASSERT_EQ(got[out], d2 * static_cast<float>(v) - m2) << out;
    }
  }
}

}  // namespace
}  // namespace troupe::model
