// The K-quant block layouts, checked against a second formulation of each format: the value
// order written as nested loops over 128-value halves, 32-value quarters and bit shifts (the
// way the format is usually described), rather than dequantize_row's per-element indexing.
#include "model/ggml_types.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
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

// The IQ4 value table as the format defines it, and IQ4_XS written as the format's loops.
constexpr int kIQ4Table[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                               1,    13,   25,  38,  53,  69,  89,  113};

TEST(GgmlTypes, IQ4XSDequantizesAsTheFormatLoops) {
  std::vector<uint8_t> bytes = random_bytes(2 * sizeof(BlockIQ4_XS), 7);
  auto* blocks = reinterpret_cast<BlockIQ4_XS*>(bytes.data());
  blocks[0].d = fp32_to_fp16(0.5f);
  blocks[1].d = fp32_to_fp16(-0.25f);
  float got[2 * kQK_K];
  dequantize_row(GgmlType::kIQ4_XS, blocks, got, 2 * kQK_K);
  int out = 0;
  for (int i = 0; i < 2; ++i) {
    const BlockIQ4_XS& b = blocks[i];
    const uint8_t* qs = b.qs;
    for (int ib = 0; ib < 8; ++ib, qs += 16) {
      const int ls = ((b.scales_l[ib / 2] >> 4 * (ib % 2)) & 0xF) | ((b.scales_h >> 2 * ib) & 3)
                                                                        << 4;
      const float dl = fp16_to_fp32(b.d) * static_cast<float>(ls - 32);
      for (int j = 0; j < 16; ++j)
        ASSERT_EQ(got[out + j], dl * static_cast<float>(kIQ4Table[qs[j] & 0xF])) << out + j;
      for (int j = 0; j < 16; ++j)
        ASSERT_EQ(got[out + 16 + j], dl * static_cast<float>(kIQ4Table[qs[j] >> 4])) << out + j;
      out += 32;
    }
  }
}

TEST(GgmlTypes, IQ4NLDequantizesAsTheFormatLoops) {
  std::vector<uint8_t> bytes = random_bytes(3 * sizeof(BlockIQ4_NL), 8);
  auto* blocks = reinterpret_cast<BlockIQ4_NL*>(bytes.data());
  for (int i = 0; i < 3; ++i) blocks[i].d = fp32_to_fp16(0.125f * static_cast<float>(i + 1));
  float got[96];
  dequantize_row(GgmlType::kIQ4_NL, blocks, got, 96);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 16; ++j) {
      const float d = 0.125f * static_cast<float>(i + 1);
      ASSERT_EQ(got[32 * i + j], d * static_cast<float>(kIQ4Table[blocks[i].qs[j] & 0xF]));
      ASSERT_EQ(got[32 * i + 16 + j], d * static_cast<float>(kIQ4Table[blocks[i].qs[j] >> 4]));
    }
}

// MXFP4 (OCP microscaling FP4, gpt-oss's experts), from the format's definition: E2M1 values
// {0, 0.5, 1, 1.5, 2, 3, 4, 6} with a sign bit (nibble 8 is -0), times 2^(e - 127).
TEST(GgmlTypes, Mxfp4DequantizesAsTheFormatDefines) {
  const double kE2M1[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (int e : {0, 1, 2, 100, 127, 130, 252}) {  // (from 253, 6 units pass float's range)
    BlockMXFP4 blk{};
    blk.e = static_cast<uint8_t>(e);
    for (int j = 0; j < 16; ++j) blk.qs[j] = static_cast<uint8_t>(j | (15 - j) << 4);
    float got[32];
    dequantize_row(GgmlType::kMXFP4, &blk, got, 32);
    for (int j = 0; j < 32; ++j) {
      const int nib = j < 16 ? j : 15 - (j - 16);
      const double want = (nib & 8 ? -1 : 1) * kE2M1[nib & 7] * std::ldexp(1.0, e - 127);
      ASSERT_EQ(static_cast<double>(got[j]), want) << "e " << e << " value " << j;
    }
  }
  EXPECT_EQ(type_name(GgmlType::kMXFP4), "mxfp4");
  EXPECT_EQ(row_bytes(GgmlType::kMXFP4, 64), 34);
}

// The MXFP4 writer: values on the block's grid come back exactly; others within half a step of
// the grid (the largest gap, 2 units of 2^(e-127) between 4 and 6, so 1 unit), past the top
// they saturate at 6 units.
TEST(GgmlTypes, Mxfp4WriterRoundTrips) {
  // Block 0: E2M1 values in units of 0.25, the largest 6 units (so the scale is 0.25).
  const float kE2M1[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  std::vector<float> src(64);
  for (int i = 0; i < 32; ++i)
    src[static_cast<size_t>(i)] = (i % 3 == 1 ? -0.25f : 0.25f) * kE2M1[(i * 5 + 7) % 8];
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.f, 3.f);
  for (int i = 32; i < 64; ++i) src[static_cast<size_t>(i)] = normal(rng);
  std::vector<uint8_t> q(static_cast<size_t>(row_bytes(GgmlType::kMXFP4, 64)));
  quantize_row(GgmlType::kMXFP4, src.data(), q.data(), 64);
  float back[64];
  dequantize_row(GgmlType::kMXFP4, q.data(), back, 64);
  for (int i = 0; i < 32; ++i) ASSERT_EQ(back[i], src[static_cast<size_t>(i)]) << i;
  const auto* blk = reinterpret_cast<const BlockMXFP4*>(q.data()) + 1;
  const double unit = std::ldexp(1.0, blk->e - 127);
  for (int i = 32; i < 64; ++i) {
    const double x = src[static_cast<size_t>(i)];
    const double clipped = std::clamp(x, -6 * unit, 6 * unit);
    ASSERT_LE(std::fabs(back[i] - clipped), unit + 1e-12) << i;
  }
}

// The IQ4 writers (synth's iq4_nl and iq4_xs): every value within the table's largest half-gap
// (12 of 127, plus 14 above its top, 113) of its block's step, plus IQ4_XS's 6-bit scale
// rounding; all-zero blocks stay zero.
TEST(GgmlTypes, IQ4WritersRoundTripWithinTheTable) {
  std::mt19937 rng(12);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> src(1024);
  for (size_t i = 0; i < src.size(); ++i)
    src[i] = normal(rng) * std::pow(10.f, static_cast<float>((i / 32) % 3) - 1.f);
  std::fill(src.begin() + 256, src.begin() + 512, 0.f);
  for (GgmlType t : {GgmlType::kIQ4_NL, GgmlType::kIQ4_XS}) {
    std::vector<uint8_t> q(static_cast<size_t>(row_bytes(t, 1024)));
    quantize_row(t, src.data(), q.data(), 1024);
    std::vector<float> back(src.size());
    dequantize_row(t, q.data(), back.data(), 1024);
    double err2 = 0, ref2 = 0;
    for (int b = 0; b < 32; ++b) {
      float gmax = 0.f, smax = 0.f;  // this block's and its super-block's largest magnitude
      for (int i = 0; i < 32; ++i) gmax = std::max(gmax, std::fabs(src[32 * b + i]));
      for (int i = 0; i < 256; ++i) smax = std::max(smax, std::fabs(src[256 * (b / 8) + i]));
      const float tol = t == GgmlType::kIQ4_NL ? 0.12f * gmax : 0.12f * gmax + 0.02f * smax;
      for (int i = 0; i < 32; ++i) {
        const size_t k = static_cast<size_t>(32 * b + i);
        ASSERT_LE(std::fabs(back[k] - src[k]), tol) << type_name(t) << " value " << k;
        err2 += (back[k] - src[k]) * (back[k] - src[k]);
        ref2 += src[k] * src[k];
      }
    }
    for (int i = 256; i < 512; ++i) ASSERT_EQ(back[static_cast<size_t>(i)], 0.f) << type_name(t);
    std::printf("%s: RMS error %.4f of the RMS value\n", type_name(t).c_str(),
                std::sqrt(err2 / ref2));
    EXPECT_LT(std::sqrt(err2 / ref2), 0.1) << type_name(t);  // measured 8 %
  }
}

// Q4_1, Q5_0 and Q5_1 as the format is usually written: element j and j + 16 from byte j's
// nibbles, their fifth bits shifted out of the qh word as (qh >> j) << 4 and qh >> (j + 12),
// each masked with 0x10.
TEST(GgmlTypes, Blocks32WithOffsetsAndFifthBitsDequantizeAsTheFormatLoops) {
  for (GgmlType t : {GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1}) {
    const int64_t bb = type_traits(static_cast<uint32_t>(t))->block_bytes;
    std::vector<uint8_t> bytes = random_bytes(static_cast<size_t>(3 * bb), 9);
    for (int i = 0; i < 3; ++i) {  // sane scales and offsets: d = (i + 1) / 8, m = -(i + 1) / 4
      const uint16_t d = fp32_to_fp16(0.125f * static_cast<float>(i + 1));
      const uint16_t m = fp32_to_fp16(-0.25f * static_cast<float>(i + 1));
      std::memcpy(bytes.data() + i * bb, &d, 2);
      if (t != GgmlType::kQ5_0) std::memcpy(bytes.data() + i * bb + 2, &m, 2);
    }
    float got[96];
    dequantize_row(t, bytes.data(), got, 96);
    for (int i = 0; i < 3; ++i) {
      const uint8_t* b = bytes.data() + i * bb;
      const float d = 0.125f * static_cast<float>(i + 1), m = -0.25f * static_cast<float>(i + 1);
      const uint8_t* qs = b + bb - 16;  // the nibbles end every block
      uint32_t qh = 0;
      if (t != GgmlType::kQ4_1) std::memcpy(&qh, b + (t == GgmlType::kQ5_0 ? 2 : 4), 4);
      for (int j = 0; j < 16; ++j) {
        const int x0 = (qs[j] & 0x0F) | static_cast<int>(((qh >> j) << 4) & 0x10);
        const int x1 = (qs[j] >> 4) | static_cast<int>((qh >> (j + 12)) & 0x10);
        const float want0 =
            t == GgmlType::kQ5_0 ? static_cast<float>(x0 - 16) * d : static_cast<float>(x0) * d + m;
        const float want1 =
            t == GgmlType::kQ5_0 ? static_cast<float>(x1 - 16) * d : static_cast<float>(x1) * d + m;
        ASSERT_EQ(got[32 * i + j], want0) << type_name(t) << " block " << i << " value " << j;
        ASSERT_EQ(got[32 * i + 16 + j], want1) << type_name(t) << " block " << i << " value " << j;
      }
    }
  }
}

// The writers of Q4_1, Q5_0 and Q5_1: every value within half a step of its block (Q5_0, which
// puts its value of largest magnitude at -16 steps: 1/16 of that magnitude; Q4_1 and Q5_1, a
// max-min fit: (max - min) / 15 or / 31), plus the f16 rounding of scale and offset; all-zero
// blocks stay zero.
TEST(GgmlTypes, Blocks32WritersRoundTripWithinHalfAStep) {
  std::mt19937 rng(13);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> src(1024);
  for (size_t i = 0; i < src.size(); ++i)
    src[i] = normal(rng) * std::pow(10.f, static_cast<float>((i / 32) % 3) - 1.f) +
             (i / 64 % 2 == 0 ? 0.f : 0.5f);  // some blocks off-centre
  std::fill(src.begin() + 256, src.begin() + 320, 0.f);
  for (GgmlType t : {GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1}) {
    std::vector<uint8_t> q(static_cast<size_t>(row_bytes(t, 1024)));
    quantize_row(t, src.data(), q.data(), 1024);
    std::vector<float> back(src.size());
    dequantize_row(t, q.data(), back.data(), 1024);
    for (int b = 0; b < 32; ++b) {
      float lo = 0.f, hi = 0.f, amax = 0.f;
      for (int i = 0; i < 32; ++i) {
        const float v = src[static_cast<size_t>(32 * b + i)];
        lo = i == 0 ? v : std::min(lo, v);
        hi = i == 0 ? v : std::max(hi, v);
        amax = std::max(amax, std::fabs(v));
      }
      // The step, and the f16 rounding of the scale and offset (2^-11 relative) on top.
      const float step =
          t == GgmlType::kQ5_0 ? amax / 16.f : (hi - lo) / (t == GgmlType::kQ4_1 ? 15.f : 31.f);
      const float slack = (amax + std::fabs(lo) + (hi - lo)) / 1024.f;
      for (int i = 0; i < 32; ++i) {
        const size_t k = static_cast<size_t>(32 * b + i);
        // Q5_0 stops at +15 steps on the side opposite its largest magnitude (at -16 steps).
        const float clamp =
            t == GgmlType::kQ5_0 ? std::max(0.f, std::fabs(src[k]) - 15.5f * step) : 0.f;
        ASSERT_LE(std::fabs(back[k] - src[k]), step / 2 + clamp + slack)
            << type_name(t) << " value " << k;
      }
    }
    for (int i = 256; i < 320; ++i) ASSERT_EQ(back[static_cast<size_t>(i)], 0.f) << type_name(t);
  }
}

}  // namespace
}  // namespace troupe::model
