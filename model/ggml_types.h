// Tensor element types in ggml/GGUF numbering, their block layouts, and scalar conversions.
// Used by the readers, the writer, compute kernels and tests. No threads, no state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace troupe::model {

/// ggml's type ids; the numbers are the on-disk values and never change.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ4_NL = 20,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kBF16 = 30,
  kMXFP4 = 39,  ///< OCP microscaling FP4 (gpt-oss's experts): E2M1 values, a power-of-two scale
  /// troupe's own, never in a GGUF file (ids from kFirstTroupeOnlyType): FP8 E4M3 ("e4m3fn":
  /// no infinities, S.1111.111 is NaN), one byte per value, times a scale per block of values
  /// that the WeightView carries (Hugging Face "fp8" checkpoints: model/hf_fp8.h).
  kF8_E4M3 = 1000,
  /// Signed 4-bit integers in [-8, 7], stored plus 8, eight to a little-endian 32-bit word
  /// (value i of a word in bits 4i..4i+3), times a scale per group of columns that the
  /// WeightView carries (compressed-tensors "pack-quantized" int4 checkpoints, such as
  /// Kimi-K2-Thinking's experts: model/detail/hf_compressed.h).
  kI4_PACKED = 1001,
  /// FP4 E2M1 values (kE2M1Values), two to a byte, the low nibble first (value 2j in byte j's
  /// low nibble, 2j + 1 in its high one), times a scale per group of columns that the WeightView
  /// carries as kE8M0 bytes: Hugging Face's MXFP4 checkpoints (gpt-oss's `*_blocks` and
  /// `*_scales`), read in place.
  kFP4_PACKED = 1002,
  /// A scale type only: one byte e per scale, the power of two 2^(e - 127) (OCP E8M0; 255 is NaN).
  kE8M0 = 1003,
};
/// Type ids from here on exist only in memory; the GGUF reader and writer refuse them.
inline constexpr uint32_t kFirstTroupeOnlyType = 1000;

struct TypeTraits {
  std::string_view name;  // "f32", "q4_K", ...
  int64_t block_elems;    // elements per block (1 for plain types)
  int64_t block_bytes;    // bytes per block
  bool supported;         // troupe can compute with it (read and dequantize)
};

/// Traits of a type id as read from a file; nullopt for an id ggml does not define.
std::optional<TypeTraits> type_traits(uint32_t type_id);
/// Name for messages ("q8_0"); "type#N" for an unknown id.
std::string type_name(uint32_t type_id);
inline std::string type_name(GgmlType t) { return type_name(static_cast<uint32_t>(t)); }

/// Bytes of a row of n elements; requires n to be a multiple of the block size.
int64_t row_bytes(GgmlType t, int64_t n);

// --- scalar conversions (IEEE half and bfloat16) ---
float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);  // round to nearest even, like F16C's default
inline float bf16_to_fp32(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t fp32_to_bf16(float f);  // round to nearest even; NaN stays NaN
/// Bytes of one scale of a WeightView (stored as F32, BF16, F16, E8M0 or F8_E4M3).
inline int64_t scale_bytes(GgmlType type) {
  return type == GgmlType::kF32 ? 4 : type == GgmlType::kE8M0 || type == GgmlType::kF8_E4M3 ? 1 : 2;
}
/// An E8M0 scale: 2^(e - 127), exact (subnormal for e = 0); NaN for 255.
float e8m0_to_fp32(uint8_t e);
/// Scales [0, n) stored as `type` (F32, BF16, F16, E8M0 or F8_E4M3) into out as floats (the
/// kernels convert a row's scales once per tile with this). With `mul` or `div` (a tensor's
/// global scale, WeightView::scale_mul / scale_div; at most one of them other than 1), each is
/// float(stored) * mul / div: the exact product or quotient rounded once.
void scales_to_f32(const void* scales, GgmlType type, int64_t n, float* out, float mul = 1.0f,
                   float div = 1.0f);
/// FP8 E4M3 (OCP "e4m3fn": bias 7, subnormals, no infinities; 0x7F and 0xFF are NaN), exactly.
float fp8_e4m3_to_fp32(uint8_t b);
/// fp8_e4m3_to_fp32 of every code, indexed by the code (a table built once).
const float* fp8_e4m3_values();
/// The E4M3 code nearest to v (ties to the even code), saturating at +-448; NaN for NaN.
uint8_t fp32_to_fp8_e4m3(float v);

// --- block layouts (as ggml stores them) ---
constexpr int kQK4_0 = 32;
constexpr int kQK8_0 = 32;
constexpr int kQK_K = 256;
constexpr int kKScaleSize = 12;

#pragma pack(push, 1)
struct BlockQ4_0 {
  uint16_t d;              // f16 scale
  uint8_t qs[kQK4_0 / 2];  // nibbles: low = element j, high = element j+16
};
/// Q4_1: value = d * q + m, q in [0, 15] (Q4_0's nibble order).
struct BlockQ4_1 {
  uint16_t d, m;
  uint8_t qs[kQK4_0 / 2];
};
/// Q5_0: value = d * (q - 16), q in [0, 31]: Q4_0's nibbles, and bit j of the little-endian
/// word qh the top bit of value j.
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[kQK4_0 / 2];
};
/// Q5_1: value = d * q + m, q in [0, 31] laid out as in Q5_0.
struct BlockQ5_1 {
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[kQK4_0 / 2];
};
struct BlockQ8_0 {
  uint16_t d;  // f16 scale
  int8_t qs[kQK8_0];
};
struct BlockQ4_K {
  uint16_t d;                   // f16 super-block scale for the quantized scales
  uint16_t dmin;                // f16 super-block scale for the quantized mins
  uint8_t scales[kKScaleSize];  // 8 scales and 8 mins, 6 bits each
  uint8_t qs[kQK_K / 2];
};
struct BlockQ5_K {
  uint16_t d, dmin;
  uint8_t scales[kKScaleSize];
  uint8_t qh[kQK_K / 8];
  uint8_t qs[kQK_K / 2];
};
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];  // low 4 bits
  uint8_t qh[kQK_K / 4];  // high 2 bits
  int8_t scales[kQK_K / 16];
  uint16_t d;  // f16 super-block scale
};
/// IQ4_NL: 32 values as indices into kIQ4Values (low nibble = value j, high = j + 16), times d.
struct BlockIQ4_NL {
  uint16_t d;
  uint8_t qs[kQK4_0 / 2];
};
/// IQ4_XS: 256 values in 8 sub-blocks of 32, each IQ4_NL-like with its own 6-bit scale
/// (stored + 32: low 4 bits in scales_l, nibble j/2 by parity, top 2 in scales_h bits 2j).
/// MXFP4: 32 E2M1 values as indices into kMXFP4Values (twice the FP4 value; low nibble = value
/// j, high = j + 16), times the scale 2^(e - 128) (half the E8M0 scale, undoing the doubling).
struct BlockMXFP4 {
  uint8_t e;
  uint8_t qs[kQK4_0 / 2];
};
struct BlockIQ4_XS {
  uint16_t d;
  uint16_t scales_h;
  uint8_t scales_l[kQK_K / 64];
  uint8_t qs[kQK_K / 2];
};
struct BlockQ2_K {
  uint8_t scales[kQK_K / 16];
  uint8_t qs[kQK_K / 4];
  uint16_t d, dmin;
};
struct BlockQ3_K {
  uint8_t hmask[kQK_K / 8];
  uint8_t qs[kQK_K / 4];
  uint8_t scales[12];
  uint16_t d;
};
#pragma pack(pop)
static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ2_K) == 84);
static_assert(sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockIQ4_NL) == 18);
static_assert(sizeof(BlockMXFP4) == 17);
static_assert(sizeof(BlockIQ4_XS) == 136);

/// The 16 non-uniformly spaced values the IQ4 types index (as int8, times the block scale).
inline constexpr int8_t kIQ4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                          1,    13,   25,  38,  53,  69,  89,  113};
/// IQ4_XS sub-block j's signed scale (stored - 32).
inline int iq4xs_scale(const BlockIQ4_XS& b, int j) {
  return ((b.scales_l[j / 2] >> (4 * (j % 2)) & 0xF) | (b.scales_h >> (2 * j) & 3) << 4) - 32;
}

/// The values of 32 IQ4 indices (16 bytes: low nibbles values 0-15, high nibbles 16-31).
/// FP4 E2M1's values {0, 0.5, 1, 1.5, 2, 3, 4, 6} and their negatives, doubled (MXFP4).
inline constexpr int8_t kMXFP4Values[16] = {0, 1,  2,  3,  4,  6,  8,  12,
                                            0, -1, -2, -3, -4, -6, -8, -12};
/// FP4 E2M1's values by code (kFP4_PACKED); code 8, negative zero, reads as 0.
inline constexpr float kE2M1Values[16] = {0,    0.5f,  1,  1.5f,  2,  3,  4,  6,
                                          0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
/// An MXFP4 block's scale: 2^(e - 128), exact (subnormal for e < 2; e = 255 is not a NaN here).
inline float mxfp4_scale(uint8_t e) {
  const uint32_t bits = e < 2 ? uint32_t{0x00200000} << e : static_cast<uint32_t>(e - 1) << 23;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline void mxfp4_values32(const uint8_t* qs, int8_t* v) {
  for (int j = 0; j < 16; ++j) {
    v[j] = kMXFP4Values[qs[j] & 0xF];
    v[j + 16] = kMXFP4Values[qs[j] >> 4];
  }
}
inline void iq4_values32(const uint8_t* qs, int8_t* v) {
  for (int j = 0; j < 16; ++j) {
    v[j] = kIQ4Values[qs[j] & 0xF];
    v[j + 16] = kIQ4Values[qs[j] >> 4];
  }
}

/// The 32 unsigned values of a 32-value block with 4 or 5 bits (Q4_0, Q4_1: qh null; Q5_0, Q5_1:
/// qh their 4 high-bit bytes): value j < 16 is the low nibble of qs[j], value j + 16 its high
/// one, and bit j of the little-endian word qh is value j's bit 4.
inline void nibble_values32(const uint8_t* qs, const uint8_t* qh, uint8_t* u) {
  uint32_t h = 0;
  if (qh != nullptr) std::memcpy(&h, qh, 4);
  for (int j = 0; j < 16; ++j) {
    u[j] = static_cast<uint8_t>((qs[j] & 0xF) | (h >> j & 1) << 4);
    u[j + 16] = static_cast<uint8_t>((qs[j] >> 4) | (h >> (j + 16) & 1) << 4);
  }
}

/// The 256 unsigned values of a Q2_K (hmask null: [0, 3]) or Q3_K (hmask: [0, 7]) super-block:
/// value e = 128n + 32j + l is 2 bits of qs[32n + l] at bit 2j, and for Q3_K bit 4n + j of
/// hmask[l] as its bit 2.
inline void low_bit_values(const uint8_t* qs, const uint8_t* hmask, uint8_t* u) {
  for (int e = 0; e < 256; ++e) {
    const int n = e / 128, j = (e / 32) % 4, l = e % 32;
    int v = (qs[32 * n + l] >> (2 * j)) & 3;
    if (hmask != nullptr) v |= ((hmask[l] >> (4 * n + j)) & 1) << 2;
    u[e] = static_cast<uint8_t>(v);
  }
}

/// Q3_K's 16 6-bit group scales (stored + 32) from their 12 bytes, as 4 words of 4 bytes (word
/// k holds scales 4k..4k+3, still + 32): bytes 0-7 hold the low 4 bits of scales 0-7 (low
/// nibbles) and 8-15 (high nibbles); byte 8 + k holds the top 2 bits of scales k, k + 4, k + 8,
/// k + 12 at bits 0, 2, 4, 6. Branch-free, for the kernels' per-block decode.
inline void q3k_scale_words(const uint8_t* p, uint32_t* w) {
  uint32_t a, b, c;
  std::memcpy(&a, p, 4);
  std::memcpy(&b, p + 4, 4);
  std::memcpy(&c, p + 8, 4);
  constexpr uint32_t kLow = 0x0F0F0F0F, kTop = 0x03030303;
  w[0] = (a & kLow) | (c & kTop) << 4;
  w[1] = (b & kLow) | (c >> 2 & kTop) << 4;
  w[2] = (a >> 4 & kLow) | (c >> 4 & kTop) << 4;
  w[3] = (b >> 4 & kLow) | (c >> 6 & kTop) << 4;
}
/// The same as signed scales s[g] = stored - 32.
inline void q3k_scales(const uint8_t* p, int8_t* s) {
  uint32_t w[4];
  q3k_scale_words(p, w);
  for (int g = 0; g < 16; ++g)
    s[g] = static_cast<int8_t>(static_cast<int>(w[g / 4] >> (8 * (g % 4)) & 63) - 32);
}

/// Dequantizes n elements (a multiple of the block size) of type t into out.
/// Reference scalar code: used by tests and by paths that convert a few rows (embeddings).
/// Throws InputError for a type troupe cannot read, and for kF8_E4M3, whose scales are not in
/// the row (model::dequantize_view_row reads any view).
void dequantize_row(GgmlType t, const void* src, float* out, int64_t n);
/// n values of a row of scaled type t (kF8_E4M3, kI4_PACKED, kFP4_PACKED) at q, whose scales are
/// scales[c / cols_per_scale] (as floats): each the nearest float to q * scale (one multiply), as
/// every kernel computes them.
void dequantize_scaled_row(GgmlType t, const uint8_t* q, const float* scales,
                           int64_t cols_per_scale, int64_t n, float* out);

/// Quantizes n floats (a multiple of the block size) into dst, for the writer and synth.
/// Supported: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_K, q3_K, q4_K, q5_K, q6_K, iq4_nl,
/// iq4_xs. Throws InputError otherwise.
void quantize_row(GgmlType t, const float* src, void* dst, int64_t n);

}  // namespace troupe::model
