// Scalar reference conversions for ggml tensor types: type traits, f16/bf16, dequantization.
// Quantization (the other direction) is in ggml_quantize.cc.
#include "model/ggml_types.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "base/check.h"

namespace troupe::model {

std::optional<TypeTraits> type_traits(uint32_t id) {
  switch (id) {
    case 0:
      return TypeTraits{"f32", 1, 4, true};
    case 1:
      return TypeTraits{"f16", 1, 2, true};
    case 2:
      return TypeTraits{"q4_0", 32, 18, true};
    case 3:
      return TypeTraits{"q4_1", 32, 20, true};
    case 6:
      return TypeTraits{"q5_0", 32, 22, true};
    case 7:
      return TypeTraits{"q5_1", 32, 24, true};
    case 8:
      return TypeTraits{"q8_0", 32, 34, true};
    case 9:
      return TypeTraits{"q8_1", 32, 36, false};
    case 10:
      return TypeTraits{"q2_K", 256, 84, true};
    case 11:
      return TypeTraits{"q3_K", 256, 110, true};
    case 12:
      return TypeTraits{"q4_K", 256, 144, true};
    case 13:
      return TypeTraits{"q5_K", 256, 176, true};
    case 14:
      return TypeTraits{"q6_K", 256, 210, true};
    case 15:
      return TypeTraits{"q8_K", 256, 292, false};
    case 20:
      return TypeTraits{"iq4_nl", 32, 18, true};
    case 23:
      return TypeTraits{"iq4_xs", 256, 136, true};
    case 24:
      return TypeTraits{"i8", 1, 1, false};
    case 25:
      return TypeTraits{"i16", 1, 2, false};
    case 26:
      return TypeTraits{"i32", 1, 4, false};
    case 27:
      return TypeTraits{"i64", 1, 8, false};
    case 28:
      return TypeTraits{"f64", 1, 8, false};
    case 30:
      return TypeTraits{"bf16", 1, 2, true};
    case 39:
      return TypeTraits{"mxfp4", 32, 17, true};
    case static_cast<uint32_t>(GgmlType::kF8_E4M3):
      return TypeTraits{"f8_e4m3", 1, 1, true};
    case static_cast<uint32_t>(GgmlType::kI4_PACKED):
      return TypeTraits{"i4_packed", 8, 4, true};
    case static_cast<uint32_t>(GgmlType::kFP4_PACKED):
      return TypeTraits{"fp4_packed", 16, 8, true};
    case static_cast<uint32_t>(GgmlType::kE8M0):
      return TypeTraits{"e8m0", 1, 1, false};
    default:
      return std::nullopt;
  }
}

std::string type_name(uint32_t id) {
  auto t = type_traits(id);
  return t ? std::string(t->name) : "type#" + std::to_string(id);
}

int64_t row_bytes(GgmlType t, int64_t n) {
  auto tr = type_traits(static_cast<uint32_t>(t));
  TROUPE_CHECK(tr.has_value(), "unknown type %u", static_cast<unsigned>(t));
  TROUPE_CHECK(n % tr->block_elems == 0, "row of %lld not a multiple of %lld",
               static_cast<long long>(n), static_cast<long long>(tr->block_elems));
  return n / tr->block_elems * tr->block_bytes;
}

float fp16_to_fp32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      mant &= 0x3ffu;
      u = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t fp32_to_fp16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (absx < 0x38800000u) {                                      // result is subnormal or zero
    if (absx < 0x33000000u) return static_cast<uint16_t>(sign);  // < half of smallest subnormal
    uint32_t e = absx >> 23;
    uint32_t m = (absx & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;  // 113 - e + 13
    uint32_t r = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t r = absx + 0xc8000000u;  // rebias exponent: (e - 112) << 23
  uint32_t lsb = (r >> 13) & 1u;
  r += 0xfffu + lsb;
  return static_cast<uint16_t>(sign | (r >> 13));
}

uint16_t fp32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 64);  // quiet NaN
  return static_cast<uint16_t>((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
}

float fp8_e4m3_to_fp32(uint8_t b) {
  const int mag = b & 0x7f;
  if (mag == 0x7f) return std::numeric_limits<float>::quiet_NaN();
  const int exp = mag >> 3, man = mag & 7;
  // Subnormal (exp 0): man/8 * 2^-6; normal: (1 + man/8) * 2^(exp - 7). Both exact in float.
  const float v = exp == 0 ? std::ldexp(static_cast<float>(man), -9)
                           : std::ldexp(static_cast<float>(8 + man), exp - 10);
  return (b & 0x80) != 0 ? -v : v;
}

const float* fp8_e4m3_values() {
  static const auto kValues = [] {
    std::array<float, 256> v{};
    for (int b = 0; b < 256; ++b)
      v[static_cast<size_t>(b)] = fp8_e4m3_to_fp32(static_cast<uint8_t>(b));
    return v;
  }();
  return kValues.data();
}

uint8_t fp32_to_fp8_e4m3(float v) {
  if (std::isnan(v)) return 0x7f;
  const float* e4m3 = fp8_e4m3_values();  // codes 0..0x7e: the non-negative values, increasing
  const float a = std::min(std::fabs(v), 448.f);
  const auto hi = static_cast<int>(std::lower_bound(e4m3, e4m3 + 0x7e, a) - e4m3);  // e4m3[hi] >= a
  int code = hi;
  if (hi > 0 && e4m3[hi] != a) {
    const float below = a - e4m3[hi - 1], above = e4m3[hi] - a;  // exact near a tie
    code = below < above ? hi - 1 : above < below ? hi : (hi % 2 == 0 ? hi : hi - 1);
  }
  return static_cast<uint8_t>(code | (std::signbit(v) ? 0x80 : 0));
}

void dequantize_scaled_row(GgmlType t, const uint8_t* q, const float* scales,
                           int64_t cols_per_scale, int64_t n, float* out) {
  TROUPE_CHECK(t == GgmlType::kF8_E4M3 || t == GgmlType::kI4_PACKED || t == GgmlType::kFP4_PACKED,
               "dequantize_scaled_row: %s has no separate scales", type_name(t).c_str());
  const float* fp8 = fp8_e4m3_values();
  for (int64_t c0 = 0, b = 0; c0 < n; c0 += cols_per_scale, ++b) {
    const float s = scales[b];
    const int64_t c1 = std::min(n, c0 + cols_per_scale);
    if (t == GgmlType::kF8_E4M3) {
      for (int64_t c = c0; c < c1; ++c) out[c] = fp8[q[c]] * s;
    } else if (t == GgmlType::kFP4_PACKED) {
      for (int64_t c = c0; c < c1; ++c) out[c] = kE2M1Values[(q[c / 2] >> (4 * (c % 2))) & 15] * s;
    } else {
      for (int64_t c = c0; c < c1; ++c)
        out[c] = static_cast<float>(((q[c / 2] >> (4 * (c % 2))) & 15) - 8) * s;
    }
  }
}

float e8m0_to_fp32(uint8_t e) {
  if (e == 255) return std::numeric_limits<float>::quiet_NaN();
  const uint32_t bits = e == 0 ? uint32_t{0x00400000} : static_cast<uint32_t>(e) << 23;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

namespace detail {

#if defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
#define TROUPE_SCALE_CLONES [[gnu::target_clones("avx512f", "avx2", "default")]]
#else
#define TROUPE_SCALE_CLONES
#endif

// E4M3 scale codes as floats times k (or over k, `divide`), k being a global scale times 2^120
// (over: times 2^-120). One branch-free pass, compiled for AVX-512, AVX2 and x86-64 and chosen by
// the loader from the CPU (GCC/Clang function multi-versioning): the kernels convert a row's
// scales at every tile, and a table lookup with a second pass, or this loop at x86-64's width,
// took a third of a one-token NVFP4 product's time. The code's bits moved into a float's (sign
// to bit 31, exponent and mantissa to bits 26..20) are exactly fp8 * 2^-120 (an E4M3 subnormal
// an f32 subnormal); times or over k (exact: a power of two times the global scale, in range
// where the caller uses this) that rounds fp8 * mul / div once. NaN's codes (S.1111.111) become
// NaN by OR-ing a quiet NaN's bits in.
TROUPE_SCALE_CLONES
void e4m3_scales_scaled(const uint8_t* p, int64_t n, float* out, float k, bool divide) {
  const auto widen = [](uint32_t c) {
    return std::bit_cast<float>((c & 0x80u) << 24 | (c & 0x7fu) << 20);
  };
  const auto nan_bits = [](uint32_t c) { return (0u - (((c & 0x7fu) + 1) >> 7)) & 0x7fc00000u; };
  if (divide) {
    for (int64_t i = 0; i < n; ++i)
      out[i] = std::bit_cast<float>(std::bit_cast<uint32_t>(widen(p[i]) / k) | nan_bits(p[i]));
  } else {
    for (int64_t i = 0; i < n; ++i)
      out[i] = std::bit_cast<float>(std::bit_cast<uint32_t>(widen(p[i]) * k) | nan_bits(p[i]));
  }
}

}  // namespace detail

void scales_to_f32(const void* scales, GgmlType type, int64_t n, float* out, float mul, float div) {
  const auto* p = static_cast<const uint8_t*>(scales);
  TROUPE_CHECK(mul == 1.0f || div == 1.0f, "a global scale both multiplies and divides");
  if (type == GgmlType::kF8_E4M3 && std::fabs(mul) < 0x1p7f && std::fabs(div) >= 0x1p-6f &&
      std::isfinite(div)) {
    // NVFP4's scales, a row at a time in the kernels (detail::e4m3_scales_scaled).
    if (div != 1.0f) {
      detail::e4m3_scales_scaled(p, n, out, div * 0x1p-120f, true);
    } else {
      detail::e4m3_scales_scaled(p, n, out, mul * 0x1p120f, false);
    }
    return;
  }
  if (mul != 1.0f || div != 1.0f) {
    scales_to_f32(scales, type, n, out);
    if (div != 1.0f) {
      for (int64_t i = 0; i < n; ++i) out[i] /= div;
    } else {
      for (int64_t i = 0; i < n; ++i) out[i] *= mul;
    }
    return;
  }
  if (type == GgmlType::kF32) {
    std::memcpy(out, p, static_cast<size_t>(n) * 4);
    return;
  }
  if (type == GgmlType::kE8M0) {
    for (int64_t i = 0; i < n; ++i) out[i] = e8m0_to_fp32(p[i]);
    return;
  }
  if (type == GgmlType::kF8_E4M3) {
    const float* v = fp8_e4m3_values();
    for (int64_t i = 0; i < n; ++i) out[i] = v[p[i]];
    return;
  }
  uint16_t h;
  if (type == GgmlType::kBF16) {
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(&h, p + 2 * i, 2);
      out[i] = bf16_to_fp32(h);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(&h, p + 2 * i, 2);
      out[i] = fp16_to_fp32(h);
    }
  }
}

namespace {

void get_scale_min_k4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// Q4_0, Q4_1, Q5_0 and Q5_1: per block of 32 a scale d and (Q4_1, Q5_1: kZero 0) an offset m,
// values d * (q - kZero) + m.
template <class Block, bool kFive, int kZero>
void dequant_nibbles32(const Block* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += 32) {
    const float d = fp16_to_fp32(x[i].d);
    float m = 0.f;
    const uint8_t* qh = nullptr;
    if constexpr (kZero == 0) m = fp16_to_fp32(x[i].m);
    if constexpr (kFive) qh = x[i].qh;
    uint8_t u[32];
    nibble_values32(x[i].qs, qh, u);
    for (int j = 0; j < 32; ++j) {
      const float v = static_cast<float>(u[j] - kZero) * d;  // then + m: never one FMA
      y[j] = kZero == 0 ? v + m : v;
    }
  }
}

void dequant_q8_0(const BlockQ8_0* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    for (int j = 0; j < kQK8_0; ++j) y[j] = static_cast<float>(x[i].qs[j]) * d;
    y += kQK8_0;
  }
}

void dequant_q4_k(const BlockQ4_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* q = x[i].qs;
    const float d = fp16_to_fp32(x[i].d);
    const float mn = fp16_to_fp32(x[i].dmin);
    int is = 0;
    uint8_t sc, m;
    for (int j = 0; j < kQK_K; j += 64) {
      get_scale_min_k4(is + 0, x[i].scales, &sc, &m);
      const float d1 = d * sc, m1 = mn * m;
      get_scale_min_k4(is + 1, x[i].scales, &sc, &m);
      const float d2 = d * sc, m2 = mn * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
      q += 32;
      is += 2;
    }
  }
}

// IQ4_NL: value = d * kIQ4Values[index]; IQ4_XS likewise per sub-block of 32 with
// d * (its signed scale).
void dequant_iq4_32(float dl, const uint8_t* qs, float* y) {
  int8_t v[32];
  iq4_values32(qs, v);
  for (int j = 0; j < 32; ++j) y[j] = dl * static_cast<float>(v[j]);
}

void dequant_iq4_nl(const BlockIQ4_NL* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += 32) dequant_iq4_32(fp16_to_fp32(x[i].d), x[i].qs, y);
}

void dequant_mxfp4(const BlockMXFP4* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += 32) {
    int8_t v[32];
    mxfp4_values32(x[i].qs, v);
    const float d = mxfp4_scale(x[i].e);
    for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(v[j]);
  }
}

void dequant_iq4_xs(const BlockIQ4_XS* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    for (int j = 0; j < 8; ++j, y += 32)
      dequant_iq4_32(d * static_cast<float>(iq4xs_scale(x[i], j)), x[i].qs + 16 * j, y);
  }
}

// Q2_K and Q3_K: a scale per group of 16 (g = e / 16), values as low_bit_values gives them.

// Q2_K: value = d * (scales[g] & 15) * q - dmin * (scales[g] >> 4), q in [0, 3].
void dequant_q2_k(const BlockQ2_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(x[i].d), mn = fp16_to_fp32(x[i].dmin);
    uint8_t q[kQK_K];
    low_bit_values(x[i].qs, nullptr, q);
    for (int e = 0; e < kQK_K; ++e) {
      const uint8_t sc = x[i].scales[e / 16];
      const float dl = d * static_cast<float>(sc & 0xF), ml = mn * static_cast<float>(sc >> 4);
      *y++ = dl * static_cast<float>(q[e]) - ml;
    }
  }
}

// Q3_K: value = d * s[g] * (u - 4), u in [0, 7].
void dequant_q3_k(const BlockQ3_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    int8_t s[16];
    q3k_scales(x[i].scales, s);
    uint8_t u[kQK_K];
    low_bit_values(x[i].qs, x[i].hmask, u);
    for (int e = 0; e < kQK_K; ++e)
      *y++ = d * static_cast<float>(s[e / 16]) * static_cast<float>(u[e] - 4);
  }
}

// Q5_K: Q4_K's scales and mins with a fifth bit per value: bit j of qh[l] is the top bit of
// value 32 * j + l.
void dequant_q5_k(const BlockQ5_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    const float mn = fp16_to_fp32(x[i].dmin);
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      get_scale_min_k4(j, x[i].scales, &sc, &m);
      const float dj = d * sc, mj = mn * m;
      const uint8_t* q = x[i].qs + 32 * (j / 2);
      for (int l = 0; l < 32; ++l) {
        const int lo = j % 2 == 0 ? q[l] & 0xF : q[l] >> 4;
        const int v = lo | ((x[i].qh[l] >> j) & 1) << 4;
        *y++ = dj * static_cast<float>(v) - mj;
      }
    }
  }
}

void dequant_q6_k(const BlockQ6_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    const uint8_t* ql = x[i].ql;
    const uint8_t* qh = x[i].qh;
    const int8_t* sc = x[i].scales;
    for (int n = 0; n < kQK_K; n += 128) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = static_cast<int8_t>((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = static_cast<int8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = static_cast<int8_t>((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = static_cast<int8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l + 0] = d * static_cast<float>(sc[is + 0]) * static_cast<float>(q1);
        y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
      y += 128;
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
}

}  // namespace

void dequantize_row(GgmlType t, const void* src, float* out, int64_t n) {
  switch (t) {
    case GgmlType::kF32:
      std::memcpy(out, src, static_cast<size_t>(n) * 4);
      return;
    case GgmlType::kF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) out[i] = fp16_to_fp32(s[i]);
      return;
    }
    case GgmlType::kBF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_fp32(s[i]);
      return;
    }
    case GgmlType::kQ4_0:
      return dequant_nibbles32<BlockQ4_0, false, 8>(static_cast<const BlockQ4_0*>(src), out,
                                                    n / kQK4_0);
    case GgmlType::kQ4_1:
      return dequant_nibbles32<BlockQ4_1, false, 0>(static_cast<const BlockQ4_1*>(src), out,
                                                    n / kQK4_0);
    case GgmlType::kQ5_0:
      return dequant_nibbles32<BlockQ5_0, true, 16>(static_cast<const BlockQ5_0*>(src), out,
                                                    n / kQK4_0);
    case GgmlType::kQ5_1:
      return dequant_nibbles32<BlockQ5_1, true, 0>(static_cast<const BlockQ5_1*>(src), out,
                                                   n / kQK4_0);
    case GgmlType::kQ8_0:
      return dequant_q8_0(static_cast<const BlockQ8_0*>(src), out, n / kQK8_0);
    case GgmlType::kIQ4_NL:
      return dequant_iq4_nl(static_cast<const BlockIQ4_NL*>(src), out, n / kQK4_0);
    case GgmlType::kMXFP4:
      return dequant_mxfp4(static_cast<const BlockMXFP4*>(src), out, n / kQK4_0);
    case GgmlType::kIQ4_XS:
      return dequant_iq4_xs(static_cast<const BlockIQ4_XS*>(src), out, n / kQK_K);
    case GgmlType::kQ2_K:
      return dequant_q2_k(static_cast<const BlockQ2_K*>(src), out, n / kQK_K);
    case GgmlType::kQ3_K:
      return dequant_q3_k(static_cast<const BlockQ3_K*>(src), out, n / kQK_K);
    case GgmlType::kQ4_K:
      return dequant_q4_k(static_cast<const BlockQ4_K*>(src), out, n / kQK_K);
    case GgmlType::kQ5_K:
      return dequant_q5_k(static_cast<const BlockQ5_K*>(src), out, n / kQK_K);
    case GgmlType::kQ6_K:
      return dequant_q6_k(static_cast<const BlockQ6_K*>(src), out, n / kQK_K);
    case GgmlType::kF8_E4M3:
    case GgmlType::kI4_PACKED:
    case GgmlType::kFP4_PACKED:
      TROUPE_INPUT_ERROR("%s rows need their scales (dequantize_view_row)", type_name(t).c_str());
    default:
      TROUPE_INPUT_ERROR("tensor type %s is not supported yet", type_name(t).c_str());
  }
}

}  // namespace troupe::model
