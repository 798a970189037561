// The per-ISA matmul kernel tables behind compute/matmul.h, and the hooks tests use to run
// every SIMD path in one process. Private to compute/ (and its tests).
//
// Batch invariance (see matmul.h) rests on three rules every kernel here follows:
//  1. One output element y[t][o] is reduced in a fixed order that depends only on cols: the
//     same accumulator layout, the same steps, the same final horizontal sum, whatever tile
//     (rows x tokens) the element was computed in. Tiles are templates over their shape whose
//     per-element operation sequence is identical; only the reuse of loaded data differs.
//  2. Activation rows are prepared (quantized) row by row, each depending only on that row.
//  3. Threads split output rows or tokens, never the reduction dimension.
// NOTE: kernels never write a separate multiply followed by an add (g++ contracts that into an
// FMA, or not, depending on the surrounding code); they use explicit FMA intrinsics.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "compute/matmul.h"
#include "model/ggml_types.h"
#include "model/model_spec.h"
#include "model/weight_tiles.h"

namespace troupe::compute {
class ThreadPool;
}

namespace troupe::compute::detail {

/// One matmul call as a kernel sees it.
struct MatmulJob {
  const uint8_t* w = nullptr;  // weight rows in their stored type
  int64_t w_row_bytes = 0;
  int64_t cols = 0;
  const uint8_t* act = nullptr;  // prepared activation rows (f32 x for float weights)
  int64_t act_stride = 0;        // bytes between activation rows
  int64_t n_tok = 0;
  float* y = nullptr;  // f32 [n_tok, y_stride]
  int64_t y_stride = 0;
  // F8_E4M3, I4_PACKED and FP4_PACKED weights: their scale grid (model::WeightView::scales and its
  // shape).
  const uint8_t* w_scales = nullptr;
  model::GgmlType w_scale_type = model::GgmlType::kF32;
  int64_t w_scale_stride = 0;
  int64_t w_scale_rows = 0, w_scale_cols = 0;
  float w_scale_mul = 1.0f, w_scale_div = 1.0f;  // the tensor's global scale (NVFP4)
  /// Row r's scales as floats: [i] is the scale of columns i * w_scale_cols on. Aligned F32
  /// scales without a global one are read in place; others are converted into `tmp`
  /// (w_scale_stride floats), so that the kernels' loops read plain floats (no conversion call
  /// there, which would make the compiler spill their vector registers).
  const float* scale_row(int64_t r, float* tmp) const {
    const uint8_t* p =
        w_scales + r / w_scale_rows * w_scale_stride * model::scale_bytes(w_scale_type);
    if (w_scale_type == model::GgmlType::kF32 && reinterpret_cast<uintptr_t>(p) % 4 == 0 &&
        w_scale_mul == 1.0f && w_scale_div == 1.0f)
      return reinterpret_cast<const float*>(p);
    model::scales_to_f32(p, w_scale_type, w_scale_stride, tmp, w_scale_mul, w_scale_div);
    return tmp;
  }
};
/// The weight side of a job: data, row size and (F8, I4) scales of w.
inline void set_job_weight(MatmulJob& j, const model::WeightView& w) {
  j.w = w.data;
  j.w_row_bytes = w.row_bytes();
  j.w_scales = static_cast<const uint8_t*>(w.scales);
  j.w_scale_type = w.scale_type;
  j.w_scale_stride = w.scale_stride;
  j.w_scale_rows = w.scale_block[0];
  j.w_scale_cols = w.scale_block[1];
  j.w_scale_mul = w.scale_mul;
  j.w_scale_div = w.scale_div;
}
/// Columns per scale a scaled view (F8, I4, FP4) must have for the SIMD kernels (whose 8 or 16
/// lanes then never straddle two blocks): a multiple of this. I4 and FP4 rows must be such a
/// multiple too.
inline constexpr int64_t kScaleColsMultiple = 16;

/// The kernels for one weight type at one SIMD level.
struct TypeKernels {
  /// Bytes of one prepared activation row of `cols` values; null when the kernel reads f32
  /// activations directly (then `quantize` is null too).
  int64_t (*act_row_bytes)(int64_t cols) = nullptr;
  /// Prepares one activation row (cols floats) into act_row_bytes(cols) bytes at out (64-byte
  /// aligned). Non-finite values make their block's scale NaN, so they reach the output.
  void (*quantize)(const float* x, int64_t cols, uint8_t* out) = nullptr;
  /// Computes y[t][r] for every token t and rows r in [r0, r1).
  void (*rows)(const MatmulJob& job, int64_t r0, int64_t r1) = nullptr;
  /// Rows per micro-tile; thread chunks are aligned to it (speed only, never the result).
  int row_tile = 1;
};

/// All kernels of one SIMD level; a null `rows` means the type is not supported there.
/// The *_t16 kernels read matrices in 16-row tiles (model/weight_tiles.h); their `rows`
/// get r0 and r1 at multiples of row_tile: 16 (whole tiles) for the int8 types, 4 (whole
/// quads) for F16, BF16, F8_E4M3, I4_PACKED and FP4_PACKED (AVX2's I4_PACKED: 3, each row found
/// in its quad; AVX2's F8_E4M3: 4).
struct KernelSet {
  const char* name;  // "scalar", "avx2", "avx512", "avx512-vnni", "avx512-vnni-gfni"
  TypeKernels f32, f16, bf16, f8, i4, fp4, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k,
      q6_k, iq4_nl, iq4_xs, mxfp4;
  TypeKernels q8_0_t16, q4_0_t16, q4_1_t16, q5_0_t16, q5_1_t16, q4_k_t16, q5_k_t16, q6_k_t16,
      f16_t16, bf16_t16, f8_t16, i4_t16, fp4_t16;
  const TypeKernels* find(model::GgmlType t,
                          model::WeightLayout layout = model::WeightLayout::kRows) const;
};

/// Activations of the tiled kernels: one record per 32-value block of an activation row (the
/// int8 values and scale of quantize_int8, as for the row kernels, the scale rounded to 22
/// significant bits), rows padded to 64 bytes. Every kernel forms one output as: for each
/// block b in order, the exact integer dot s_b = sum_k w_k * x_k, then
/// acc = fma(float(s_b) * d_x, d_w, acc) from acc = 0 -- one scalar recurrence per output, so
/// any SIMD level that reads tiles gives the same bits. The SIMD kernels start the integer dot
/// from the bits of M = kTileMagic, which makes its int32 lanes the floats M + s_b (exact, as
/// |s_b| < 2^22), and (M + s_b) - M is float(s_b) exactly: no convert per block and token.
/// (d_x has 22 significant bits so that -M * d_x was exact when an FMA with it did the scaling,
/// before session 27; the rounding stays, as it decides the outputs' bits.)
inline constexpr float kTileMagic = 12582912.f;        // 1.5 * 2^23
inline constexpr int32_t kTileMagicBits = 0x4B400000;  // its bits
/// Q4_1 and Q5_1 (value d_w * q + m_w) then add the offset's term,
/// acc = fma(dsum, m_w, acc).
struct ActTile32 {
  int8_t q[32];
  int32_t start;  // the bits of M + kInit * sum(q): the weights' stored offset folded in
  float d;        // the scale, 22 significant bits
  float unused;   // keeps a record 48 bytes
  float dsum;     // d * sum(q), rounded once: what Q4_1 and Q5_1's offsets multiply
};
static_assert(sizeof(ActTile32) == 48);
/// Rounds an activation scale to 22 significant bits (NaN stays NaN).
inline float tile_act_scale(float d) {
  if (!(d == d)) return d;
  uint32_t u = 0;
  std::memcpy(&u, &d, sizeof u);
  u = (u + 2u) & ~3u;
  std::memcpy(&d, &u, sizeof d);
  return d;
}
/// The bits of M + offset (|offset| < 2^22): where a tile kernel's integer dot starts, so that
/// its int32 lanes read as the floats M + offset + dot.
inline int32_t tile_start(int32_t offset) {
  return static_cast<int32_t>(static_cast<uint32_t>(kTileMagicBits) +
                              static_cast<uint32_t>(offset));
}
/// Fills a record's start, d and dsum from its values' sum and quantize_int8's scale.
inline void finish_act_tile32(ActTile32& a, int init, int32_t sum, float d) {
  a.d = tile_act_scale(d);
  a.unused = 0.f;
  a.start = tile_start(init * sum);
  a.dsum = a.d * static_cast<float>(sum);
}
inline int64_t act_tile32_bytes(int64_t cols) {
  return (cols / 32 * static_cast<int64_t>(sizeof(ActTile32)) + 63) / 64 * 64;
}
/// Activations of the Q4_K and Q5_K tile kernels: one record per 256-value super-block (the int8
/// values and scale of quantize_int8 over 256, as for the Q4_K row kernels) and its 8 sub-blocks'
/// sums in the order 0, 2, 1, 3, 4, 6, 5, 7 (int16 pairs for vpdpwssd against the mins). Each
/// output is, per super-block s in order, with the exact integers tot = sum_j sc_j * dot_j(q, x)
/// (|tot| < 2^26) and msum = sum_j m_j * sum_j(x): u = d * float(tot) (float(tot) rounded to
/// nearest where |tot| > 2^24, as vcvtdq2ps does), acc = fma(fma(-float(msum), dmin, u), d_x, acc)
/// from acc = 0. The sub-blocks' scales multiply their integer dots (without VNNI, vpmaddwd by the
/// scale instead of by 1; with it, vpmulld), so a super-block and token costs one conversion and
/// three floating-point operations, not two per sub-block (docs/benchmarks.md "Engine,
/// session 42").
struct ActTileK {
  int8_t q[256];
  int16_t xsum[8];
  float d;
};
static_assert(sizeof(ActTileK) == 276);
/// Bytes of an activation row of one Rec per 256 values (ActTileK, ActTileQ6K), padded to 64.
template <class Rec>
inline int64_t act_records256_bytes(int64_t cols) {
  return (cols / 256 * static_cast<int64_t>(sizeof(Rec)) + 63) / 64 * 64;
}
/// Where sub-block j's sum sits in ActTileK::xsum.
inline constexpr int kTileKSumSlot[8] = {0, 2, 1, 3, 4, 6, 5, 7};

/// Activations of the Q6_K tile kernels: one record per 256-value super-block (the int8 values
/// and scale of quantize_int8 over 256, as for the Q6_K row kernels) and, per 16-value group g,
/// the bits of M - 32 * sum_g(x): the weights' stored offset of 32 folded into the start of the
/// group's integer dot. Each output is, per super-block s in order, with the exact integers
/// t_g = sum_{k in g} q_k * x_k - 32 * sum_g(x) (q_k in [0, 63] as stored) and the exact floats
/// ds_g = d_w * sc_g: v_g = fma(M + t_g, ds_g, -M * ds_g) (t_g * ds_g rounded once; |t_g| <
/// 2^18), u = -0 + v_0 + v_1 + ... + v_15 added in order, acc = fma(u, d_x, acc) from acc = 0. The
/// SIMD kernels start each group's dot from `start`, so its int32 lanes are the floats M + t_g.
struct ActTileQ6K {
  int8_t q[256];
  int32_t start[16];
  float d;
};
static_assert(sizeof(ActTileQ6K) == 324);
/// Fills a record's group starts from its int8 values.
inline void finish_act_tileq6k(ActTileQ6K& a) {
  for (int g = 0; g < 16; ++g) {
    int32_t sum = 0;
    for (int k = 0; k < 16; ++k) sum += a.q[16 * g + k];
    a.start[g] = tile_start(-32 * sum);
  }
}

/// The portable kernels' int8 activations of a 32-value block (matmul_scalar.cc's act32
/// format): the scale, then the values.
struct ActBlock32 {
  float d;
  int8_t q[32];
};

/// The 32-value block types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL) as the row kernels read them.
/// IQ4_NL has Q4_0's layout (its nibbles index model::kIQ4Values).
template <model::GgmlType t>
using Block32 = std::conditional_t<
    t == model::GgmlType::kQ8_0, model::BlockQ8_0,
    std::conditional_t<t == model::GgmlType::kQ4_1, model::BlockQ4_1,
                       std::conditional_t<t == model::GgmlType::kQ5_0, model::BlockQ5_0,
                                          std::conditional_t<t == model::GgmlType::kQ5_1,
                                                             model::BlockQ5_1, model::BlockQ4_0>>>>;
/// Weights read as signed int8 (Q8_0's values, IQ4_NL's looked-up ones); the others are
/// unsigned 4- or 5-bit q.
constexpr bool blocks32_signed(model::GgmlType t) {
  return t == model::GgmlType::kQ8_0 || t == model::GgmlType::kIQ4_NL;
}
/// Value d * q + m: an offset m per block (Q4_1, Q5_1).
constexpr bool blocks32_min(model::GgmlType t) {
  return t == model::GgmlType::kQ4_1 || t == model::GgmlType::kQ5_1;
}
/// q has a fifth bit from the block's qh word (Q5_0, Q5_1).
constexpr bool blocks32_five(model::GgmlType t) {
  return t == model::GgmlType::kQ5_0 || t == model::GgmlType::kQ5_1;
}
/// Value d * (q + init): Q4_0's -8 and Q5_0's -16, folded into the integer dot as init * sum(x).
constexpr int blocks32_init(model::GgmlType t) {
  return t == model::GgmlType::kQ4_0 ? -8 : t == model::GgmlType::kQ5_0 ? -16 : 0;
}

/// The offset of the unsigned weight bytes a tile stores (model/weight_tiles.h).
inline constexpr int tile_init(model::GgmlType t) {
  return t == model::GgmlType::kQ8_0 ? -128 : blocks32_init(t);
}

/// A scratch buffer per thread that only grows: kernels run hundreds of times per token.
template <typename T>
T* scratch(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  return v.data();
}

const KernelSet& scalar_kernels();
// Requires AVX2, FMA and F16C, and AVX-VNNI where asked (the 32-value block types' dots by
// vpdpbusd; the same bits).
const KernelSet& avx2_kernels(bool use_vnni = false);
/// The Q2_K, Q3_K and IQ4_XS row kernels of the AVX2 set (matmul_kquant_avx2.cc): sets rows and
/// row_tile of s->iq4_xs, q2_k and q3_k; the caller sets their activation format.
void avx2_kquant_rows(KernelSet* s);
/// The AVX2 tile kernels of the 32-value block types (matmul_tiles_avx2.cc; vnni: their dots by
/// AVX-VNNI, the same bits): sets rows and row_tile of s->q8_0_t16, q4_0_t16, q4_1_t16, q5_0_t16
/// and q5_1_t16 (reading tiles) and of s->q8_0 ... q5_1 (the same kernels reading ggml's rows);
/// the caller sets their activation format (ActTile32).
void avx2_tile_rows(bool vnni, KernelSet* s);
/// The same for Q4_K, Q5_K (ActTileK activations) and Q6_K (ActTileQ6K), tiles and rows,
/// matmul_tiles_k_avx2.cc.
void avx2_tile_rows_k(bool vnni, KernelSet* s);
/// Bytes per 256 values of the int8 K-quant activations, AVX2 and AVX-512 alike: 256 int8, 16
/// floats d*sum(x) over each group of 16, the float scale d, padding (each level's quantize_actk).
inline constexpr int64_t kActKBytes = 384;
// Requires AVX-512 F/BW/VL/DQ, and VNNI and GFNI where asked (GFNI only with VNNI).
const KernelSet& avx512_kernels(bool use_vnni, bool use_gfni = false);

/// The weight types whose tiles ks reads with kernels of its own (compute::tiled_weight_types for
/// the active set): the types a weight copy tiles. Its row kernels of these types give the bits
/// of its tile kernels (tests/compute/matmul_tiles_test.cc).
model::TileTypes tiled_types(const KernelSet& ks);

/// Every kernel set this CPU can run, best first (the first is what matmul() uses unless
/// TROUPE_SIMD says otherwise).
int supported_kernel_sets(const KernelSet** out, int max);

/// matmul() through a given kernel set (tests and benchmarks compare paths with it).
void matmul_with(const KernelSet& ks, const model::WeightView& w, const float* x, int64_t x_stride,
                 int64_t n_tok, float* y, int64_t y_stride, ThreadPool* pool);
void matmul_shared_with(const KernelSet& ks, std::span<const MatmulTarget> targets, const float* x,
                        int64_t x_stride, int64_t n_tok, ThreadPool* pool);
void matmul_many_with(const KernelSet& ks, std::span<const MatmulProduct> products,
                      ThreadPool* pool);

// --- helpers shared by the kernel files (inline; no ISA-specific code) ---

/// q4k_scales_mins eight values per 64-bit word, for the SIMD kernels: byte j of sc is sc[j], of
/// mn mn[j]. Bytes 0-3 of q hold sc[0..3] (low 6 bits) and the top bits of sc[4..7], bytes 4-7
/// the same for the mins, bytes 8-11 the low nibbles of sc[4..7] and of mn[4..7].
struct Q4kScaleBytes {
  uint64_t sc, mn;
};
inline Q4kScaleBytes q4k_scale_bytes(const uint8_t* q) {
  uint32_t u[3];
  std::memcpy(u, q, sizeof u);
  const uint32_t sc_hi = (u[2] & 0x0F0F0F0Fu) | ((u[0] >> 2) & 0x30303030u);
  const uint32_t mn_hi = ((u[2] >> 4) & 0x0F0F0F0Fu) | ((u[1] >> 2) & 0x30303030u);
  return {(u[0] & 0x3F3F3F3Fu) | uint64_t{sc_hi} << 32,
          (u[1] & 0x3F3F3F3Fu) | uint64_t{mn_hi} << 32};
}

/// Decodes the 6-bit scales and mins of a Q4_K block (8 of each).
inline void q4k_scales_mins(const uint8_t* q, uint8_t* sc, uint8_t* mn) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = q[j] & 63;
    mn[j] = q[j + 4] & 63;
    sc[j + 4] = static_cast<uint8_t>((q[j + 8] & 0xF) | ((q[j] >> 6) << 4));
    mn[j + 4] = static_cast<uint8_t>((q[j + 8] >> 4) | ((q[j + 4] >> 6) << 4));
  }
}

}  // namespace troupe::compute::detail
