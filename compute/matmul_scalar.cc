// The scalar kernels: the fallback on CPUs without AVX2, and the reference every SIMD kernel is
// tested against (besides dequantize_row). Tiled Q8_0/Q4_0/Q4_K/Q5_K/Q6_K here define the bits the
// VNNI tile kernels must give (ActTile32, ActTileK, ActTileQ6K in detail/matmul_kernels.h).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "compute/detail/matmul_kernels.h"
#include "compute/detail/ops.h"
#include "model/weight_tiles.h"

namespace troupe::compute::detail {
namespace {

using model::BlockQ4_0;
using model::BlockQ4_K;
using model::BlockQ5_K;
using model::BlockQ6_K;
using model::BlockQ8_0;
using model::fp16_to_fp32;
using model::kQK_K;

const uint8_t* untiled_row(model::GgmlType type, const MatmulJob& j, int64_t r);

// Float weights: convert one row (exactly) and dot it with every token. kTiled: F16, BF16,
// F8_E4M3, I4_PACKED or FP4_PACKED in 16-row tiles (model/weight_tiles.h), each row taken out of
// its tile first.
template <model::GgmlType kType, bool kTiled = false>
void float_rows(const MatmulJob& j, int64_t r0, int64_t r1) {
  thread_local std::vector<float> buf;
  float* row = scratch(buf, j.cols);
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* src = kTiled ? untiled_row(kType, j, r) : j.w + r * j.w_row_bytes;
    const float* wr = row;
    if constexpr (kType == model::GgmlType::kF32) {
      wr = reinterpret_cast<const float*>(src);
    } else if constexpr (kType == model::GgmlType::kF8_E4M3 ||
                         kType == model::GgmlType::kI4_PACKED ||
                         kType == model::GgmlType::kFP4_PACKED) {
      thread_local std::vector<float> tmp;
      const float* sc = j.scale_row(r, scratch(tmp, j.w_scale_stride));
      model::dequantize_scaled_row(kType, src, sc, j.w_scale_cols, j.cols, row);
    } else {
      model::dequantize_row(kType, src, row, j.cols);
    }
    for (int64_t t = 0; t < j.n_tok; ++t) {
      const auto* x = reinterpret_cast<const float*>(j.act + t * j.act_stride);
      j.y[t * j.y_stride + r] = dot(wr, x, j.cols);  // fixed order (detail/ops.h)
    }
  }
}

// int8 quantization of n activations with scale amax/127, rounding to nearest even.
// Returns the scale; NaN when a value is NaN or infinite, so that it reaches the output.
float quantize_int8(const float* x, int n, int8_t* q) {
  float amax = 0.f;
  bool finite = true;
  for (int i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    finite = finite && a <= FLT_MAX;
    amax = std::max(amax, a);
  }
  if (!finite) {
    std::memset(q, 0, static_cast<size_t>(n));
    return NAN;
  }
  // A block this small (amax < 127 / FLT_MAX) would scale to infinity: it quantizes to zeros,
  // as on every SIMD path.
  const float inv = amax > 0.f ? 127.f / amax : 0.f;
  const float id = inv <= FLT_MAX ? inv : 0.f;
  for (int i = 0; i < n; ++i) q[i] = static_cast<int8_t>(std::nearbyint(x[i] * id));
  return amax / 127.f;
}

// Activations for 32-element weight blocks: per block a float scale and 32 int8.

int64_t act32_bytes(int64_t cols) { return cols / 32 * static_cast<int64_t>(sizeof(ActBlock32)); }

void quantize_act32(const float* x, int64_t cols, uint8_t* out) {
  auto* a = reinterpret_cast<ActBlock32*>(out);
  for (int64_t b = 0; b < cols / 32; ++b) a[b].d = quantize_int8(x + b * 32, 32, a[b].q);
}

// One row of a 32-value block type (nb blocks at src) as int8 values wq[32 nb], block scales
// wd[nb] and, for Q4_1 and Q5_1, block offsets wm[nb]: signed values for Q8_0, Q4_0, Q5_0 and
// IQ4_NL, the unsigned q for Q4_1 and Q5_1.
template <model::GgmlType kType>
void decode_blocks32(const uint8_t* src, int64_t nb, int8_t* wq, float* wd,
                     [[maybe_unused]] float* wm) {
  using model::GgmlType;
  for (int64_t b = 0; b < nb; ++b) {
    int8_t* q = wq + b * 32;
    if constexpr (kType == GgmlType::kQ8_0) {
      const auto& blk = reinterpret_cast<const BlockQ8_0*>(src)[b];
      wd[b] = fp16_to_fp32(blk.d);
      std::memcpy(q, blk.qs, 32);
    } else if constexpr (kType == GgmlType::kIQ4_NL) {
      const auto& blk = reinterpret_cast<const model::BlockIQ4_NL*>(src)[b];
      wd[b] = fp16_to_fp32(blk.d);
      model::iq4_values32(blk.qs, q);
    } else {  // unsigned q: Q4_0, Q5_0 (less their zero) and Q4_1, Q5_1 (as stored)
      const auto& blk = reinterpret_cast<const Block32<kType>*>(src)[b];
      wd[b] = fp16_to_fp32(blk.d);
      const uint8_t* qh = nullptr;
      if constexpr (blocks32_five(kType)) qh = blk.qh;
      if constexpr (blocks32_min(kType)) wm[b] = fp16_to_fp32(blk.m);
      uint8_t u[32];
      model::nibble_values32(blk.qs, qh, u);
      for (int i = 0; i < 32; ++i) q[i] = static_cast<int8_t>(u[i] + blocks32_init(kType));
    }
  }
}

// Activations of the tiled kernels (ActTile32, matmul_kernels.h).
template <model::GgmlType kType>
void quantize_act_tile32(const float* x, int64_t cols, uint8_t* out) {
  auto* a = reinterpret_cast<ActTile32*>(out);
  for (int64_t b = 0; b < cols / 32; ++b) {
    const float d = quantize_int8(x + b * 32, 32, a[b].q);
    int32_t sum = 0;
    for (int i = 0; i < 32; ++i) sum += a[b].q[i];
    finish_act_tile32(a[b], tile_init(kType), sum, d);
  }
}

// Row r of a tiled job in its ggml bytes (model::untile_row), in this thread's scratch.
const uint8_t* untiled_row(model::GgmlType type, const MatmulJob& j, int64_t r) {
  thread_local std::vector<uint8_t> buf;
  uint8_t* row = scratch(buf, j.w_row_bytes);
  model::untile_row(type, j.w + r / model::kTileRows * model::kTileRows * j.w_row_bytes,
                    j.w_row_bytes, r % model::kTileRows, row);
  return row;
}

// The 32-value block types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL), each row decoded to int8
// values and block scales, then an exact integer dot per block, scaled and summed in block order
// (Q4_1 and Q5_1 add the block offset times the activations' sum). kTiled: the matrix is in 16-row
// tiles (model/weight_tiles.h) and each output is ActTile32's recurrence, the reference for the
// SIMD tile kernels, which give the same bits (the exact dot of the signed values is their
// ActTile32::start less M's bits, plus the unsigned dot).
template <model::GgmlType kType, bool kTiled = false>
void blocks32_rows(const MatmulJob& j, int64_t r0, int64_t r1) {
  thread_local std::vector<int8_t> qbuf;
  thread_local std::vector<float> dbuf, mbuf;
  const int64_t nb = j.cols / 32;
  int8_t* wq = scratch(qbuf, j.cols);
  float* wd = scratch(dbuf, nb);
  float* wm = scratch(mbuf, nb);
  for (int64_t r = r0; r < r1; ++r) {
    decode_blocks32<kType>(kTiled ? untiled_row(kType, j, r) : j.w + r * j.w_row_bytes, nb, wq, wd,
                           wm);
    for (int64_t t = 0; t < j.n_tok; ++t) {
      using Act = std::conditional_t<kTiled, ActTile32, ActBlock32>;
      const auto* a = reinterpret_cast<const Act*>(j.act + t * j.act_stride);
      float acc = 0.f;
      for (int64_t b = 0; b < nb; ++b) {
        int32_t dot = 0;
        [[maybe_unused]] int32_t sum = 0;
        for (int k = 0; k < 32; ++k) {
          dot += wq[b * 32 + k] * a[b].q[k];
          if constexpr (!kTiled && blocks32_min(kType)) sum += a[b].q[k];
        }
        if constexpr (kTiled) {
          const float t = static_cast<float>(dot) * a[b].d;
          acc = std::fma(t, wd[b], acc);
          if constexpr (blocks32_min(kType)) acc = std::fma(a[b].dsum, wm[b], acc);
        } else {
          acc += static_cast<float>(dot) * a[b].d * wd[b];
          if constexpr (blocks32_min(kType)) acc += static_cast<float>(sum) * a[b].d * wm[b];
        }
      }
      j.y[t * j.y_stride + r] = acc;
    }
  }
}

// Activations of the Q4_K tile kernels (ActTileK, matmul_kernels.h).
void quantize_act_tilek(const float* x, int64_t cols, uint8_t* out) {
  auto* a = reinterpret_cast<ActTileK*>(out);
  for (int64_t s = 0; s < cols / kQK_K; ++s) {
    a[s].d = quantize_int8(x + s * kQK_K, kQK_K, a[s].q);
    for (int j = 0; j < 8; ++j) {
      int32_t sum = 0;
      for (int i = 0; i < 32; ++i) sum += a[s].q[32 * j + i];
      a[s].xsum[kTileKSumSlot[j]] = static_cast<int16_t>(sum);
    }
  }
}

// Activations for K-quant weights: per 256 values a float scale and 256 int8.
struct ActBlockK {
  float d;
  int8_t q[kQK_K];
};

int64_t actk_bytes(int64_t cols) { return cols / kQK_K * static_cast<int64_t>(sizeof(ActBlockK)); }

void quantize_actk(const float* x, int64_t cols, uint8_t* out) {
  auto* a = reinterpret_cast<ActBlockK*>(out);
  for (int64_t b = 0; b < cols / kQK_K; ++b) a[b].d = quantize_int8(x + b * kQK_K, kQK_K, a[b].q);
}

// The values (Q4_K: 4 bits, Q5_K: 5) of nsb super-blocks, in value order, into wq[256 nsb].
template <class Block>
void decode_k_quants(const Block* blk, int64_t nsb, uint8_t* wq) {
  for (int64_t s = 0; s < nsb; ++s) {
    for (int p = 0; p < 4; ++p) {
      for (int i = 0; i < 32; ++i) {
        wq[s * kQK_K + p * 64 + i] = blk[s].qs[p * 32 + i] & 0xF;
        wq[s * kQK_K + p * 64 + 32 + i] = blk[s].qs[p * 32 + i] >> 4;
      }
    }
    if constexpr (std::is_same_v<Block, BlockQ5_K>) {  // bit sb of qh[i]: value 32 sb + i's top
      for (int sb = 0; sb < 8; ++sb)
        for (int i = 0; i < 32; ++i)
          wq[s * kQK_K + 32 * sb + i] |= static_cast<uint8_t>(((blk[s].qh[i] >> sb) & 1) << 4);
    }
  }
}

// Q4_K and Q5_K: value = d*sc[j]*q - dmin*m[j] over 8 sub-blocks of 32, q in [0, 15] (Q4_K) or
// [0, 31] (Q5_K). Rows: the exact integers tot = sum_j sc[j]*dot_j(q, x) and msum =
// sum_j m[j]*sum_j(x). kTiled: the matrix is in 16-row tiles and each output is ActTileK's
// recurrence, the reference for the SIMD tile kernels, which give the same bits (the activation
// sub-block sums come with ActTileK).
template <model::GgmlType kType, bool kTiled = false>
void kquant_rows(const MatmulJob& j, int64_t r0, int64_t r1) {
  using Block = std::conditional_t<kType == model::GgmlType::kQ5_K, BlockQ5_K, BlockQ4_K>;
  thread_local std::vector<uint8_t> qbuf, sbuf;
  const int64_t nsb = j.cols / kQK_K;
  uint8_t* wq = scratch(qbuf, j.cols);
  uint8_t* sc = scratch(sbuf, 16 * nsb);  // per super-block 8 scales, then 8 mins
  for (int64_t r = r0; r < r1; ++r) {
    const auto* blk =
        reinterpret_cast<const Block*>(kTiled ? untiled_row(kType, j, r) : j.w + r * j.w_row_bytes);
    decode_k_quants(blk, nsb, wq);
    for (int64_t s = 0; s < nsb; ++s) q4k_scales_mins(blk[s].scales, sc + 16 * s, sc + 16 * s + 8);
    for (int64_t t = 0; t < j.n_tok; ++t) {
      using Act = std::conditional_t<kTiled, ActTileK, ActBlockK>;
      const auto* a = reinterpret_cast<const Act*>(j.act + t * j.act_stride);
      float acc = 0.f;
      for (int64_t s = 0; s < nsb; ++s) {
        const float d = fp16_to_fp32(blk[s].d), dmin = fp16_to_fp32(blk[s].dmin);
        int32_t tot = 0, msum = 0;
        for (int sb = 0; sb < 8; ++sb) {
          int32_t dot = 0, xsum = 0;
          for (int k = 0; k < 32; ++k) dot += wq[s * kQK_K + 32 * sb + k] * a[s].q[32 * sb + k];
          if constexpr (kTiled) {
            xsum = a[s].xsum[kTileKSumSlot[sb]];
          } else {
            for (int k = 0; k < 32; ++k) xsum += a[s].q[32 * sb + k];
          }
          tot += sc[16 * s + sb] * dot;
          msum += sc[16 * s + 8 + sb] * xsum;
        }
        if constexpr (kTiled) {
          const float u = d * static_cast<float>(tot);
          acc = std::fma(std::fma(-static_cast<float>(msum), dmin, u), a[s].d, acc);
        } else {
          acc += a[s].d * (d * static_cast<float>(tot) - dmin * static_cast<float>(msum));
        }
      }
      j.y[t * j.y_stride + r] = acc;
    }
  }
}

// Q2_K, Q3_K and IQ4_XS, each row decoded once (all its tokens then use it) into values wq
// and per-group integer scales sc (and mins mn). Q2_K, per group g of 16: value =
// d*sc[g]*q - dmin*mn[g], q in [0, 3]; Q3_K: d*sc[g]*(u - 4), u in [0, 7], sc signed; IQ4_XS,
// per group g of 32: d*sc[g]*v, v from model::kIQ4Values. Rows: the exact integers
// tot = sum_g sc[g]*(dot_g(values, x) + off*sum_g(x)) (off: Q3_K -4, else 0) and, for Q2_K,
// msum = sum_g mn[g]*sum_g(x).
template <model::GgmlType kType>
void low_bit_rows(const MatmulJob& j, int64_t r0, int64_t r1) {
  using model::GgmlType;
  constexpr bool kQ2 = kType == GgmlType::kQ2_K, kQ3 = kType == GgmlType::kQ3_K;
  constexpr int kGroup = kType == GgmlType::kIQ4_XS ? 32 : 16, kGroups = kQK_K / kGroup;
  constexpr int kOff = kQ3 ? -4 : 0;
  using Block = std::conditional_t<kQ2, model::BlockQ2_K,
                                   std::conditional_t<kQ3, model::BlockQ3_K, model::BlockIQ4_XS>>;
  thread_local std::vector<int8_t> qbuf, sbuf, mbuf;
  const int64_t nsb = j.cols / kQK_K;
  int8_t* wq = scratch(qbuf, j.cols);
  int8_t* sc = scratch(sbuf, kGroups * nsb);
  int8_t* mn = scratch(mbuf, kGroups * nsb);
  for (int64_t r = r0; r < r1; ++r) {
    const auto* blk = reinterpret_cast<const Block*>(j.w + r * j.w_row_bytes);
    for (int64_t s = 0; s < nsb; ++s) {
      const Block& b = blk[s];
      int8_t* q = wq + s * kQK_K;
      if constexpr (kType == GgmlType::kIQ4_XS) {
        for (int g = 0; g < kGroups; ++g) {
          model::iq4_values32(b.qs + 16 * g, q + 32 * g);
          sc[kGroups * s + g] = static_cast<int8_t>(model::iq4xs_scale(b, g));
        }
      } else {
        uint8_t u[kQK_K];
        if constexpr (kQ3) {
          model::low_bit_values(b.qs, b.hmask, u);
        } else {
          model::low_bit_values(b.qs, nullptr, u);
        }
        std::memcpy(q, u, kQK_K);  // values 0-7: the same bytes as int8
        if constexpr (kQ3) {
          model::q3k_scales(b.scales, sc + kGroups * s);
        } else {
          for (int g = 0; g < kGroups; ++g) {
            sc[kGroups * s + g] = static_cast<int8_t>(b.scales[g] & 0xF);
            mn[kGroups * s + g] = static_cast<int8_t>(b.scales[g] >> 4);
          }
        }
      }
    }
    for (int64_t t = 0; t < j.n_tok; ++t) {
      const auto* a = reinterpret_cast<const ActBlockK*>(j.act + t * j.act_stride);
      float acc = 0.f;
      for (int64_t s = 0; s < nsb; ++s) {
        int32_t tot = 0, msum = 0;
        for (int g = 0; g < kGroups; ++g) {
          int32_t dot = 0, xsum = 0;
          for (int i = 0; i < kGroup; ++i) {
            dot += wq[s * kQK_K + kGroup * g + i] * a[s].q[kGroup * g + i];
            xsum += a[s].q[kGroup * g + i];
          }
          tot += sc[kGroups * s + g] * (dot + kOff * xsum);
          if constexpr (kQ2) msum += mn[kGroups * s + g] * xsum;
        }
        const float d = fp16_to_fp32(blk[s].d);
        if constexpr (kQ2) {
          acc += a[s].d * (d * static_cast<float>(tot) -
                           fp16_to_fp32(blk[s].dmin) * static_cast<float>(msum));
        } else {
          acc += a[s].d * d * static_cast<float>(tot);
        }
      }
      j.y[t * j.y_stride + r] = acc;
    }
  }
}

// Activations of the Q6_K tile kernels (ActTileQ6K, matmul_kernels.h).
void quantize_act_tileq6k(const float* x, int64_t cols, uint8_t* out) {
  auto* a = reinterpret_cast<ActTileQ6K*>(out);
  for (int64_t s = 0; s < cols / kQK_K; ++s) {
    a[s].d = quantize_int8(x + s * kQK_K, kQK_K, a[s].q);
    finish_act_tileq6k(a[s]);
  }
}

// The 6-bit values (0-63, as stored) of nsb Q6_K super-blocks, in value order, into wq[256 nsb].
void decode_q6k_quants(const BlockQ6_K* blk, int64_t nsb, uint8_t* wq) {
  for (int64_t s = 0; s < nsb; ++s) {
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = blk[s].ql + 64 * h;
      const uint8_t* qh = blk[s].qh + 32 * h;
      uint8_t* q = wq + s * kQK_K + 128 * h;
      for (int l = 0; l < 32; ++l) {
        q[l] = static_cast<uint8_t>((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4));
        q[l + 32] = static_cast<uint8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4));
        q[l + 64] = static_cast<uint8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
        q[l + 96] = static_cast<uint8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
      }
    }
  }
}

// Q6_K: value = d*sc[g]*(q - 32) over 16 groups of 16, q in [0, 63]. Rows: the exact integer
// sum_g sc[g]*dot_g(q - 32, x) per super-block. kTiled: the matrix is in 16-row tiles and each
// output is ActTileQ6K's recurrence, the reference for the SIMD tile kernels, which give the
// same bits.
template <bool kTiled = false>
void q6k_rows(const MatmulJob& j, int64_t r0, int64_t r1) {
  thread_local std::vector<uint8_t> qbuf;
  const int64_t nsb = j.cols / kQK_K;
  uint8_t* wq = scratch(qbuf, j.cols);
  for (int64_t r = r0; r < r1; ++r) {
    const auto* blk = reinterpret_cast<const BlockQ6_K*>(
        kTiled ? untiled_row(model::GgmlType::kQ6_K, j, r) : j.w + r * j.w_row_bytes);
    decode_q6k_quants(blk, nsb, wq);
    for (int64_t t = 0; t < j.n_tok; ++t) {
      using Act = std::conditional_t<kTiled, ActTileQ6K, ActBlockK>;
      const auto* a = reinterpret_cast<const Act*>(j.act + t * j.act_stride);
      float acc = 0.f;
      for (int64_t s = 0; s < nsb; ++s) {
        const uint8_t* q = wq + s * kQK_K;
        const float d = fp16_to_fp32(blk[s].d);
        int32_t tot = 0;
        float u = -0.f;  // -0 + v_0 is v_0, whatever its sign
        for (int g = 0; g < 16; ++g) {
          int32_t dot = 0;
          for (int i = 0; i < 16; ++i) dot += q[16 * g + i] * a[s].q[16 * g + i];
          if constexpr (kTiled) {
            const auto tg = static_cast<int32_t>(static_cast<uint32_t>(dot) +
                                                 static_cast<uint32_t>(a[s].start[g]) -
                                                 static_cast<uint32_t>(kTileMagicBits));
            const float ds = d * static_cast<float>(blk[s].scales[g]);
            const float v = std::fma(kTileMagic + static_cast<float>(tg), ds, -kTileMagic * ds);
            u += v;
          } else {
            int32_t xsum = 0;
            for (int i = 0; i < 16; ++i) xsum += a[s].q[16 * g + i];
            tot += blk[s].scales[g] * (dot - 32 * xsum);
          }
        }
        if constexpr (kTiled) {
          acc = std::fma(u, a[s].d, acc);
        } else {
          acc += a[s].d * d * static_cast<float>(tot);
        }
      }
      j.y[t * j.y_stride + r] = acc;
    }
  }
}

}  // namespace

const KernelSet& scalar_kernels() {
  using model::GgmlType;
  static const KernelSet ks = [] {
    KernelSet k{};
    k.name = "scalar";
    k.f32.rows = float_rows<GgmlType::kF32>;
    k.f16.rows = float_rows<GgmlType::kF16>;
    k.bf16.rows = float_rows<GgmlType::kBF16>;
    k.f16_t16.rows = float_rows<GgmlType::kF16, true>;
    k.bf16_t16.rows = float_rows<GgmlType::kBF16, true>;
    k.f8.rows = float_rows<GgmlType::kF8_E4M3>;
    k.f8_t16.rows = float_rows<GgmlType::kF8_E4M3, true>;
    k.i4.rows = float_rows<GgmlType::kI4_PACKED>;
    k.fp4.rows = float_rows<GgmlType::kFP4_PACKED>;
    k.i4_t16.rows = float_rows<GgmlType::kI4_PACKED, true>;
    k.fp4_t16.rows = float_rows<GgmlType::kFP4_PACKED, true>;
    // MXFP4's values times its power-of-two scales are exact floats: a float kernel.
    k.mxfp4.rows = float_rows<GgmlType::kMXFP4>;
    for (TypeKernels* t : {&k.q8_0, &k.q4_0, &k.q4_1, &k.q5_0, &k.q5_1, &k.iq4_nl}) {
      t->act_row_bytes = act32_bytes;
      t->quantize = quantize_act32;
    }
    k.q4_1.rows = blocks32_rows<GgmlType::kQ4_1>;
    k.q5_0.rows = blocks32_rows<GgmlType::kQ5_0>;
    k.q5_1.rows = blocks32_rows<GgmlType::kQ5_1>;
    k.iq4_nl.rows = blocks32_rows<GgmlType::kIQ4_NL>;
    k.q8_0.rows = blocks32_rows<GgmlType::kQ8_0>;
    k.q4_0.rows = blocks32_rows<GgmlType::kQ4_0>;
    for (TypeKernels* t : {&k.q2_k, &k.q3_k, &k.q4_k, &k.q5_k, &k.q6_k, &k.iq4_xs}) {
      t->act_row_bytes = actk_bytes;
      t->quantize = quantize_actk;
    }
    k.iq4_xs.rows = low_bit_rows<GgmlType::kIQ4_XS>;
    k.q2_k.rows = low_bit_rows<GgmlType::kQ2_K>;
    k.q3_k.rows = low_bit_rows<GgmlType::kQ3_K>;
    k.q4_k.rows = kquant_rows<GgmlType::kQ4_K>;
    k.q5_k.rows = kquant_rows<GgmlType::kQ5_K>;
    k.q6_k.rows = q6k_rows<false>;
    for (TypeKernels* t : {&k.q8_0_t16, &k.q4_0_t16, &k.q4_1_t16, &k.q5_0_t16, &k.q5_1_t16}) {
      t->act_row_bytes = act_tile32_bytes;
      t->row_tile = static_cast<int>(model::kTileRows);
    }
    k.q8_0_t16.quantize = quantize_act_tile32<GgmlType::kQ8_0>;
    k.q4_0_t16.quantize = quantize_act_tile32<GgmlType::kQ4_0>;
    k.q4_1_t16.quantize = quantize_act_tile32<GgmlType::kQ4_1>;
    k.q5_0_t16.quantize = quantize_act_tile32<GgmlType::kQ5_0>;
    k.q5_1_t16.quantize = quantize_act_tile32<GgmlType::kQ5_1>;
    k.q8_0_t16.rows = blocks32_rows<GgmlType::kQ8_0, true>;
    k.q4_0_t16.rows = blocks32_rows<GgmlType::kQ4_0, true>;
    k.q4_1_t16.rows = blocks32_rows<GgmlType::kQ4_1, true>;
    k.q5_0_t16.rows = blocks32_rows<GgmlType::kQ5_0, true>;
    k.q5_1_t16.rows = blocks32_rows<GgmlType::kQ5_1, true>;
    for (TypeKernels* t : {&k.q4_k_t16, &k.q5_k_t16}) {
      t->act_row_bytes = act_records256_bytes<ActTileK>;
      t->quantize = quantize_act_tilek;
      t->row_tile = static_cast<int>(model::kTileRows);
    }
    k.q4_k_t16.rows = kquant_rows<GgmlType::kQ4_K, true>;
    k.q5_k_t16.rows = kquant_rows<GgmlType::kQ5_K, true>;
    k.q6_k_t16.act_row_bytes = act_records256_bytes<ActTileQ6K>;
    k.q6_k_t16.quantize = quantize_act_tileq6k;
    k.q6_k_t16.rows = q6k_rows<true>;
    k.q6_k_t16.row_tile = static_cast<int>(model::kTileRows);
    return k;
  }();
  return ks;
}

}  // namespace troupe::compute::detail
