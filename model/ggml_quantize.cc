// Scalar reference quantization into ggml's block types (model/ggml_types.h quantize_row): the
// fits each type's scales come from. Used by the GGUF writer, `troupe synth` and the tests.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/check.h"
#include "model/ggml_types.h"

namespace troupe::model {
namespace {

// A max-min fit of n values onto `levels` + 1 steps from an offset at or below zero: the step
// and the offset's magnitude (the min the K-quants store).
void range_fit(const float* x, int n, float levels, float* step, float* min) {
  float lo = 0.f, hi = -INFINITY;
  for (int l = 0; l < n; ++l) {
    lo = std::fmin(lo, x[l]);
    hi = std::fmax(hi, x[l]);
  }
  *step = (hi - lo) / levels;
  *min = -lo;
}

// The value of largest magnitude among n, with its sign (0 for none): the block scales that put
// it at a format's most negative level.
float signed_absmax(const float* x, int n) {
  float amax = 0.f, vmax = 0.f;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      vmax = x[i];
    }
  }
  return vmax;
}

// Q4_K and Q5_K: per sub-block of 32 a 6-bit scale and a 6-bit min (offset below zero), both
// relative to the super-block's f16 d and dmin, and values q in [0, kMax]. A plain max-min fit
// per sub-block (no search): good enough for synthetic models and tests; real models come
// quantized. Gives d, dmin, the packed scales and the 256 values.
template <int kMax>
void fit_k_superblock(const float* x, uint16_t* d16, uint16_t* dmin16, uint8_t* scales,
                      uint8_t* q) {
  float scale[8], mins[8], max_scale = 0.f, max_min = 0.f;
  for (int j = 0; j < 8; ++j) {
    range_fit(x + 32 * j, 32, static_cast<float>(kMax), &scale[j], &mins[j]);
    max_scale = std::fmax(max_scale, scale[j]);
    max_min = std::fmax(max_min, mins[j]);
  }
  *d16 = fp32_to_fp16(max_scale / 63.f);
  *dmin16 = fp32_to_fp16(max_min / 63.f);
  const float d = fp16_to_fp32(*d16), dmin = fp16_to_fp32(*dmin16);
  uint8_t sc[8], mn[8];
  for (int j = 0; j < 8; ++j) {
    sc[j] = static_cast<uint8_t>(d > 0.f ? std::clamp(std::lround(scale[j] / d), 0L, 63L) : 0);
    mn[j] = static_cast<uint8_t>(dmin > 0.f ? std::clamp(std::lround(mins[j] / dmin), 0L, 63L) : 0);
    const float step = d * sc[j], off = dmin * mn[j];
    for (int l = 0; l < 32; ++l)
      q[32 * j + l] =
          static_cast<uint8_t>(step > 0.f ? std::clamp(std::lround((x[32 * j + l] + off) / step),
                                                       0L, static_cast<long>(kMax))
                                          : 0);
  }
  for (int j = 0; j < 4; ++j) {  // the packing get_scale_min_k4 reads
    scales[j] = static_cast<uint8_t>(sc[j] | (sc[j + 4] >> 4) << 6);
    scales[j + 4] = static_cast<uint8_t>(mn[j] | (mn[j + 4] >> 4) << 6);
    scales[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xF) | (mn[j + 4] & 0xF) << 4);
  }
}

// The low 4 bits of 256 values as Q4_K and Q5_K store them: qs[32p + l] holds value 64p + l
// in its low nibble and 64p + 32 + l in its high one.
void pack_k_nibbles(const uint8_t* q, uint8_t* qs) {
  for (int p = 0; p < 4; ++p)
    for (int l = 0; l < 32; ++l)
      qs[32 * p + l] =
          static_cast<uint8_t>((q[64 * p + l] & 0xF) | (q[64 * p + 32 + l] & 0xF) << 4);
}

void quant_q4_k(const float* x, BlockQ4_K* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    uint8_t q[kQK_K];
    fit_k_superblock<15>(x, &y[i].d, &y[i].dmin, y[i].scales, q);
    pack_k_nibbles(q, y[i].qs);
  }
}

void quant_q5_k(const float* x, BlockQ5_K* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    uint8_t q[kQK_K];
    fit_k_superblock<31>(x, &y[i].d, &y[i].dmin, y[i].scales, q);
    pack_k_nibbles(q, y[i].qs);
    for (int l = 0; l < 32; ++l) {  // bit j of qh[l]: the top bit of value 32j + l
      uint8_t h = 0;
      for (int j = 0; j < 8; ++j) h = static_cast<uint8_t>(h | (q[32 * j + l] >> 4) << j);
      y[i].qh[l] = h;
    }
  }
}

// 32 unsigned values u into Q4_0's nibble order at qs and (qh non-null) their bit 4 into qh.
void pack_nibbles32(const uint8_t* u, uint8_t* qs, uint8_t* qh) {
  uint32_t h = 0;
  for (int j = 0; j < 16; ++j) {
    qs[j] = static_cast<uint8_t>((u[j] & 0xF) | (u[j + 16] & 0xF) << 4);
    h |= static_cast<uint32_t>(u[j] >> 4) << j | static_cast<uint32_t>(u[j + 16] >> 4) << (j + 16);
  }
  if (qh != nullptr) std::memcpy(qh, &h, 4);
}

// Q4_1 and Q5_1: a max-min fit per block, value = d * q + m with m the block's minimum.
template <class Block, int kMax>
void quant_min32(const float* x, Block* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 32) {
    float lo = INFINITY, hi = -INFINITY;
    for (int j = 0; j < 32; ++j) {
      lo = std::fmin(lo, x[j]);
      hi = std::fmax(hi, x[j]);
    }
    y[i].d = fp32_to_fp16((hi - lo) / static_cast<float>(kMax));
    y[i].m = fp32_to_fp16(lo);
    const float d = fp16_to_fp32(y[i].d), m = fp16_to_fp32(y[i].m);
    uint8_t u[32];
    for (int j = 0; j < 32; ++j)
      u[j] = static_cast<uint8_t>(
          d > 0.f ? std::clamp(std::lround((x[j] - m) / d), 0L, static_cast<long>(kMax)) : 0);
    if constexpr (kMax == 15) {
      pack_nibbles32(u, y[i].qs, nullptr);
    } else {
      pack_nibbles32(u, y[i].qs, y[i].qh);
    }
  }
}

// Q5_0: the scale puts the block's value of largest magnitude at -16 (as Q4_0 does with -8).
void quant_q5_0(const float* x, BlockQ5_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 32) {
    y[i].d = fp32_to_fp16(signed_absmax(x, 32) / -16.f);
    const float d = fp16_to_fp32(y[i].d);
    uint8_t u[32];
    for (int j = 0; j < 32; ++j)
      u[j] =
          static_cast<uint8_t>(16 + (d != 0.f ? std::clamp(std::lround(x[j] / d), -16L, 15L) : 0));
    pack_nibbles32(u, y[i].qs, y[i].qh);
  }
}

// Per group of 16 values the scale that puts the group's value of largest magnitude at `lowest`
// (as Q4_0 does with -8) into scale[16]; returns the one of largest magnitude among them.
float signed_group_scales(const float* x, float lowest, float* scale) {
  float big = 0.f;
  for (int g = 0; g < 16; ++g) {
    scale[g] = signed_absmax(x + 16 * g, 16) / lowest;
    if (std::fabs(scale[g]) > std::fabs(big)) big = scale[g];
  }
  return big;
}

// The IQ4 index of x / step: the nearest of kIQ4Values (step 0: the index of 1, nearest 0).
uint8_t iq4_index(float x, float step) {
  const float v = step != 0.f ? x / step : 0.f;
  int best = 0;
  for (int k = 1; k < 16; ++k)
    if (std::fabs(v - kIQ4Values[k]) < std::fabs(v - kIQ4Values[best])) best = k;
  return static_cast<uint8_t>(best);
}

// 32 values at step dl into IQ4 nibbles (low: values 0-15, high: 16-31).
void pack_iq4_32(const float* x, float dl, uint8_t* qs) {
  for (int j = 0; j < 16; ++j)
    qs[j] = static_cast<uint8_t>(iq4_index(x[j], dl) | iq4_index(x[j + 16], dl) << 4);
}

// The scale that puts a block's value of largest magnitude at -127 (kIQ4Values[0]).
float iq4_block_scale(const float* x, int n) { return signed_absmax(x, n) / -127.f; }

void quant_iq4_nl(const float* x, BlockIQ4_NL* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 32) {
    y[i].d = fp32_to_fp16(iq4_block_scale(x, 32));
    pack_iq4_32(x, fp16_to_fp32(y[i].d), y[i].qs);
  }
}

// MXFP4: as llama.cpp's quantizer, the scale 2^(e - 128) that puts the block's largest magnitude
// in [8, 16) of the doubled values (those past 12 saturate), each value the nearest of
// kMXFP4Values (ties: the first).
void quant_mxfp4(const float* x, BlockMXFP4* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 32) {
    float amax = 0.f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    int e = 0;
    if (amax > 0.f) e = std::clamp(static_cast<int>(std::floor(std::log2(amax))) - 2 + 127, 0, 254);
    y[i].e = static_cast<uint8_t>(e);
    const float d = mxfp4_scale(y[i].e);
    auto nearest = [&](float v) {
      int best = 0;
      for (int k = 1; k < 16; ++k)
        if (std::fabs(d * kMXFP4Values[k] - v) < std::fabs(d * kMXFP4Values[best] - v)) best = k;
      return static_cast<uint8_t>(best);
    };
    for (int j = 0; j < 16; ++j)
      y[i].qs[j] = static_cast<uint8_t>(nearest(x[j]) | nearest(x[j + 16]) << 4);
  }
}

// IQ4_XS: per sub-block of 32 the IQ4_NL scale, relative to the super-block's f16 d as a
// signed 6-bit integer; d puts the scale of largest magnitude at -32.
void quant_iq4_xs(const float* x, BlockIQ4_XS* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    float scale[8], big = 0.f;
    for (int j = 0; j < 8; ++j) {
      scale[j] = iq4_block_scale(x + 32 * j, 32);
      if (std::fabs(scale[j]) > std::fabs(big)) big = scale[j];
    }
    y[i].d = fp32_to_fp16(big / -32.f);
    const float d = fp16_to_fp32(y[i].d);
    y[i].scales_h = 0;
    std::memset(y[i].scales_l, 0, sizeof y[i].scales_l);
    for (int j = 0; j < 8; ++j) {
      const long s = d != 0.f ? std::clamp(std::lround(scale[j] / d), -32L, 31L) : 0;
      const int us = static_cast<int>(s) + 32;  // the packing iq4xs_scale reads
      y[i].scales_l[j / 2] |= static_cast<uint8_t>((us & 0xF) << (4 * (j % 2)));
      y[i].scales_h = static_cast<uint16_t>(y[i].scales_h | (us >> 4) << (2 * j));
      pack_iq4_32(x + 32 * j, d * static_cast<float>(s), y[i].qs + 16 * j);
    }
  }
}

// Q2_K: per group of 16 a 4-bit scale and a 4-bit min (offset below zero) relative to the
// super-block's f16 d and dmin, values q in [0, 3]: a plain max-min fit per group.
void quant_q2_k(const float* x, BlockQ2_K* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    float scale[16], mins[16], max_scale = 0.f, max_min = 0.f;
    for (int g = 0; g < 16; ++g) {
      range_fit(x + 16 * g, 16, 3.f, &scale[g], &mins[g]);
      max_scale = std::fmax(max_scale, scale[g]);
      max_min = std::fmax(max_min, mins[g]);
    }
    y[i].d = fp32_to_fp16(max_scale / 15.f);
    y[i].dmin = fp32_to_fp16(max_min / 15.f);
    const float d = fp16_to_fp32(y[i].d), dmin = fp16_to_fp32(y[i].dmin);
    std::memset(y[i].qs, 0, sizeof y[i].qs);
    for (int g = 0; g < 16; ++g) {
      const long sc = d > 0.f ? std::clamp(std::lround(scale[g] / d), 0L, 15L) : 0;
      const long mn = dmin > 0.f ? std::clamp(std::lround(mins[g] / dmin), 0L, 15L) : 0;
      y[i].scales[g] = static_cast<uint8_t>(sc | mn << 4);
      const float step = d * static_cast<float>(sc), off = dmin * static_cast<float>(mn);
      for (int l = 0; l < 16; ++l) {
        const int e = 16 * g + l;
        const long q = step > 0.f ? std::clamp(std::lround((x[e] + off) / step), 0L, 3L) : 0;
        y[i].qs[32 * (e / 128) + e % 32] |= static_cast<uint8_t>(q << (2 * ((e / 32) % 4)));
      }
    }
  }
}

// Q3_K: per group of 16 a signed 6-bit scale relative to the super-block's f16 d, values in
// [-4, 3]; each group's scale puts its value of largest magnitude at -4 (as Q4_0 does with -8).
void quant_q3_k(const float* x, BlockQ3_K* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    float scale[16];
    y[i].d = fp32_to_fp16(signed_group_scales(x, -4.f, scale) / -32.f);
    const float d = fp16_to_fp32(y[i].d);
    std::memset(y[i].qs, 0, sizeof y[i].qs);
    std::memset(y[i].hmask, 0, sizeof y[i].hmask);
    std::memset(y[i].scales, 0, sizeof y[i].scales);
    for (int g = 0; g < 16; ++g) {
      const long s = d != 0.f ? std::clamp(std::lround(scale[g] / d), -32L, 31L) : 0;
      const int us = static_cast<int>(s) + 32;  // the packing q3k_scales reads
      y[i].scales[g % 8] |= static_cast<uint8_t>((us & 0xF) << (g < 8 ? 0 : 4));
      y[i].scales[8 + g % 4] |= static_cast<uint8_t>((us >> 4) << (2 * (g / 4)));
      const float step = d * static_cast<float>(s);
      for (int l = 0; l < 16; ++l) {
        const int e = 16 * g + l, n = e / 128, j = (e / 32) % 4;
        const long q = step != 0.f ? std::clamp(std::lround(x[e] / step), -4L, 3L) : 0;
        const int u = static_cast<int>(q) + 4;
        y[i].qs[32 * n + e % 32] |= static_cast<uint8_t>((u & 3) << (2 * j));
        y[i].hmask[e % 32] |= static_cast<uint8_t>((u >> 2) << (4 * n + j));
      }
    }
  }
}

// Q6_K: per group of 16 a signed 8-bit scale relative to the super-block's f16 d, values
// q - 32 in [-32, 31]; each group's scale puts its value of largest magnitude at -32 (as Q4_0
// does with -8).
void quant_q6_k(const float* x, BlockQ6_K* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    float scale[16];
    y[i].d = fp32_to_fp16(signed_group_scales(x, -32.f, scale) / -128.f);
    const float d = fp16_to_fp32(y[i].d);
    uint8_t q[kQK_K];
    for (int g = 0; g < 16; ++g) {
      const long sc = d != 0.f ? std::clamp(std::lround(scale[g] / d), -128L, 127L) : 0;
      y[i].scales[g] = static_cast<int8_t>(sc);
      const float step = d * static_cast<float>(sc);
      for (int l = 0; l < 16; ++l)
        q[16 * g + l] = static_cast<uint8_t>(
            32 + (step != 0.f ? std::clamp(std::lround(x[16 * g + l] / step), -32L, 31L) : 0));
    }
    for (int h = 0; h < 2; ++h) {  // the layout dequant_q6_k reads
      const uint8_t* v = q + 128 * h;
      for (int l = 0; l < 32; ++l) {
        y[i].ql[64 * h + l] = static_cast<uint8_t>((v[l] & 0xF) | (v[l + 64] & 0xF) << 4);
        y[i].ql[64 * h + 32 + l] = static_cast<uint8_t>((v[l + 32] & 0xF) | (v[l + 96] & 0xF) << 4);
        y[i].qh[32 * h + l] = static_cast<uint8_t>(v[l] >> 4 | (v[l + 32] >> 4) << 2 |
                                                   (v[l + 64] >> 4) << 4 | (v[l + 96] >> 4) << 6);
      }
    }
  }
}

}  // namespace

void quantize_row(GgmlType t, const float* src, void* dst, int64_t n) {
  switch (t) {
    case GgmlType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case GgmlType::kF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = fp32_to_fp16(src[i]);
      return;
    }
    case GgmlType::kBF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = fp32_to_bf16(src[i]);
      return;
    }
    case GgmlType::kQ8_0: {
      auto* y = static_cast<BlockQ8_0*>(dst);
      for (int64_t b = 0; b < n / kQK8_0; ++b) {
        const float* x = src + b * kQK8_0;
        float amax = 0.f;
        for (int j = 0; j < kQK8_0; ++j) amax = std::fmax(amax, std::fabs(x[j]));
        const float d = amax / 127.f;
        const float id = d != 0.f ? 1.f / d : 0.f;
        y[b].d = fp32_to_fp16(d);
        for (int j = 0; j < kQK8_0; ++j) y[b].qs[j] = static_cast<int8_t>(std::lround(x[j] * id));
      }
      return;
    }
    case GgmlType::kQ4_0: {
      auto* y = static_cast<BlockQ4_0*>(dst);
      for (int64_t b = 0; b < n / kQK4_0; ++b) {
        const float* x = src + b * kQK4_0;
        const float d = signed_absmax(x, kQK4_0) / -8.f;  // as ggml does
        const float id = d != 0.f ? 1.f / d : 0.f;
        y[b].d = fp32_to_fp16(d);
        for (int j = 0; j < kQK4_0 / 2; ++j) {
          const int x0 = std::min(15, static_cast<int>(x[j] * id + 8.5f));
          const int x1 = std::min(15, static_cast<int>(x[j + kQK4_0 / 2] * id + 8.5f));
          y[b].qs[j] = static_cast<uint8_t>(x0 | (x1 << 4));
        }
      }
      return;
    }
    case GgmlType::kQ4_1:
      return quant_min32<BlockQ4_1, 15>(src, static_cast<BlockQ4_1*>(dst), n / kQK4_0);
    case GgmlType::kQ5_0:
      return quant_q5_0(src, static_cast<BlockQ5_0*>(dst), n / kQK4_0);
    case GgmlType::kQ5_1:
      return quant_min32<BlockQ5_1, 31>(src, static_cast<BlockQ5_1*>(dst), n / kQK4_0);
    case GgmlType::kIQ4_NL:
      return quant_iq4_nl(src, static_cast<BlockIQ4_NL*>(dst), n / kQK4_0);
    case GgmlType::kMXFP4:
      return quant_mxfp4(src, static_cast<BlockMXFP4*>(dst), n / kQK4_0);
    case GgmlType::kIQ4_XS:
      return quant_iq4_xs(src, static_cast<BlockIQ4_XS*>(dst), n / kQK_K);
    case GgmlType::kQ2_K:
      return quant_q2_k(src, static_cast<BlockQ2_K*>(dst), n / kQK_K);
    case GgmlType::kQ3_K:
      return quant_q3_k(src, static_cast<BlockQ3_K*>(dst), n / kQK_K);
    case GgmlType::kQ4_K:
      return quant_q4_k(src, static_cast<BlockQ4_K*>(dst), n / kQK_K);
    case GgmlType::kQ5_K:
      return quant_q5_k(src, static_cast<BlockQ5_K*>(dst), n / kQK_K);
    case GgmlType::kQ6_K:
      return quant_q6_k(src, static_cast<BlockQ6_K*>(dst), n / kQK_K);
    default:
      TROUPE_INPUT_ERROR("cannot write tensor type %s", type_name(t).c_str());
  }
}

}  // namespace troupe::model
