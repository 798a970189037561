// Kernels and host launchers of gpu/ops.h (contracts there). Where a result must equal the CPU's,
// the f32 arithmetic uses the __f*_rn intrinsics: nvcc would otherwise contract a * b + c into
// an FMA, which the CPU build (no -mfma in compute/ and model/) never does.
#include <cuda_fp16.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <limits>

#include "base/check.h"
#include "gpu/ops.h"
#include "gpu/runtime.h"
#include "model/rope.h"

namespace troupe::gpu {
namespace {

using model::GgmlType;

constexpr unsigned kFullMask = 0xFFFFFFFFu;
constexpr int kElemThreads = 256;            // element-wise kernels
constexpr int64_t kMaxElemBlocks = 1 << 20;  // grid-stride loops cover the rest
constexpr int kNormThreads = 256;            // add_rms_norm: one block per row
constexpr int kEmbedThreads = 256;           // embed_rows: one block per token
constexpr int kRopeWarps = 4;                // rope_qkv_write: one block per token

#define OPS_REQUIRE(cond, ...)         \
  do {                                 \
    if (!(cond)) [[unlikely]]          \
      TROUPE_INPUT_ERROR(__VA_ARGS__); \
  } while (0)

long long ll(int64_t v) { return static_cast<long long>(v); }

int elem_blocks(int64_t n) {
  const int64_t blocks = (n + kElemThreads - 1) / kElemThreads;
  return static_cast<int>(blocks < kMaxElemBlocks ? blocks : kMaxElemBlocks);
}

__device__ __forceinline__ float nan_f32() { return __int_as_float(0x7FC00000); }

// ---- device helpers: unaligned little-endian loads, f16 scales, the K-quant scale packing ----

__device__ __forceinline__ uint32_t load_u16(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8);
}
__device__ __forceinline__ uint32_t load_u32(const uint8_t* p) {
  return load_u16(p) | (load_u16(p + 2) << 16);
}
// Exact for every f16 value (as model::fp16_to_fp32).
__device__ __forceinline__ float f16_bits_to_f32(uint32_t h) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h)));
}

// model/ggml_types.cc get_scale_min_k4: 6-bit scale and min number j (0..7) of a Q4_K block.
__device__ __forceinline__ void scale_min_k4(int j, const uint8_t* q, uint32_t* sc, uint32_t* m) {
  if (j < 4) {
    *sc = q[j] & 63u;
    *m = q[j + 4] & 63u;
  } else {
    *sc = (q[j + 4] & 0xFu) | ((static_cast<uint32_t>(q[j - 4]) >> 6) << 4);
    *m = (static_cast<uint32_t>(q[j + 4]) >> 4) | ((static_cast<uint32_t>(q[j]) >> 6) << 4);
  }
}

// Element c of a row stored as `type`: the value model::dequantize_row computes, with the same
// float operations in the same order.
__device__ float dequant_element(GgmlType type, const uint8_t* row, int64_t c) {
  switch (type) {
    case GgmlType::kF32:
      return __uint_as_float(load_u32(row + 4 * c));
    case GgmlType::kF16:
      return f16_bits_to_f32(load_u16(row + 2 * c));
    case GgmlType::kBF16:
      return __uint_as_float(load_u16(row + 2 * c) << 16);
    case GgmlType::kQ8_0: {  // {f16 d; int8 qs[32]}: y = float(q) * d
      const uint8_t* b = row + (c / model::kQK8_0) * 34;
      const int j = static_cast<int>(c % model::kQK8_0);
      const float d = f16_bits_to_f32(load_u16(b));
      const int q = static_cast<int8_t>(b[2 + j]);
      return __fmul_rn(static_cast<float>(q), d);
    }
    case GgmlType::kQ4_0: {  // {f16 d; u8 qs[16]}: low nibble = element j, high = j + 16
      const uint8_t* b = row + (c / model::kQK4_0) * 18;
      const int j = static_cast<int>(c % model::kQK4_0);
      const float d = f16_bits_to_f32(load_u16(b));
      const uint32_t byte = b[2 + (j & 15)];
      const int q = static_cast<int>(j < 16 ? (byte & 0xFu) : (byte >> 4)) - 8;
      return __fmul_rn(static_cast<float>(q), d);
    }
    case GgmlType::kQ4_1:    // {f16 d, m; u8 qs[16]}: q * d + m
    case GgmlType::kQ5_0:    // {f16 d; u8 qh[4]; u8 qs[16]}: (q - 16) * d, bit j of qh: q's bit 4
    case GgmlType::kQ5_1: {  // {f16 d, m; u8 qh[4]; u8 qs[16]}: q * d + m
      const bool has_m = type != GgmlType::kQ5_0, five = type != GgmlType::kQ4_1;
      const int bytes = type == GgmlType::kQ4_1 ? 20 : type == GgmlType::kQ5_0 ? 22 : 24;
      const uint8_t* b = row + (c / model::kQK4_0) * bytes;
      const int j = static_cast<int>(c % model::kQK4_0);
      const uint32_t byte = b[bytes - 16 + (j & 15)];
      uint32_t q = j < 16 ? (byte & 0xFu) : (byte >> 4);
      if (five) q |= ((static_cast<uint32_t>(b[(has_m ? 4 : 2) + j / 8]) >> (j % 8)) & 1u) << 4;
      const float v = __fmul_rn(static_cast<float>(static_cast<int>(q) - (has_m ? 0 : 16)),
                                f16_bits_to_f32(load_u16(b)));
      return has_m ? __fadd_rn(v, f16_bits_to_f32(load_u16(b + 2))) : v;
    }
    case GgmlType::kIQ4_NL:    // {f16 d; u8 qs[16]}: d * kIQ4Values[index]
    case GgmlType::kIQ4_XS: {  // {f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]}
      const bool xs = type == GgmlType::kIQ4_XS;
      const int64_t per = xs ? model::kQK_K : model::kQK4_0;
      const uint8_t* b = row + (c / per) * (xs ? 136 : 18);
      const int e = static_cast<int>(c % per), sub = e / 32, j = e % 32;
      float dl = f16_bits_to_f32(load_u16(b));
      if (xs) {  // model::iq4xs_scale
        const uint32_t low = (static_cast<uint32_t>(b[4 + sub / 2]) >> (4 * (sub % 2))) & 0xFu;
        const uint32_t high = (load_u16(b + 2) >> (2 * sub)) & 3u;
        dl = __fmul_rn(dl, static_cast<float>(static_cast<int>(low | (high << 4)) - 32));
      }
      const uint32_t byte = b[(xs ? 8 + 16 * sub : 2) + (j & 15)];
      const uint32_t idx = j < 16 ? (byte & 0xFu) : (byte >> 4);
      constexpr int8_t kValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                      1,    13,   25,  38,  53,  69,  89,  113};
      return __fmul_rn(dl, static_cast<float>(kValues[idx]));
    }
    case GgmlType::kQ2_K: {  // {u8 scales[16]; u8 qs[64]; f16 d, dmin}
      const uint8_t* b = row + (c / model::kQK_K) * 84;
      const int e = static_cast<int>(c % model::kQK_K);
      const int n = e / 128, j = (e / 32) % 4, l = e % 32;
      const uint32_t sc = b[e / 16];
      const uint32_t q = (static_cast<uint32_t>(b[16 + 32 * n + l]) >> (2 * j)) & 3u;
      const float dl = __fmul_rn(f16_bits_to_f32(load_u16(b + 80)), static_cast<float>(sc & 0xFu));
      const float ml = __fmul_rn(f16_bits_to_f32(load_u16(b + 82)), static_cast<float>(sc >> 4));
      return __fsub_rn(__fmul_rn(dl, static_cast<float>(q)), ml);
    }
    case GgmlType::kQ3_K: {  // {u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d}
      const uint8_t* b = row + (c / model::kQK_K) * 110;
      const int e = static_cast<int>(c % model::kQK_K);
      const int n = e / 128, j = (e / 32) % 4, l = e % 32, g = e / 16;
      const uint8_t* p = b + 96;  // model::q3k_scales
      const uint32_t low = g < 8 ? (p[g] & 0xFu) : (static_cast<uint32_t>(p[g - 8]) >> 4);
      const uint32_t high = (static_cast<uint32_t>(p[8 + g % 4]) >> (2 * (g / 4))) & 3u;
      const int s = static_cast<int>(low | (high << 4)) - 32;
      const uint32_t u = ((static_cast<uint32_t>(b[32 + 32 * n + l]) >> (2 * j)) & 3u) |
                         (((static_cast<uint32_t>(b[l]) >> (4 * n + j)) & 1u) << 2);
      const float ds = __fmul_rn(f16_bits_to_f32(load_u16(b + 108)), static_cast<float>(s));
      return __fmul_rn(ds, static_cast<float>(static_cast<int>(u) - 4));
    }
    case GgmlType::kQ4_K: {  // {f16 d, dmin; u8 scales[12]; u8 qs[128]}
      const uint8_t* b = row + (c / model::kQK_K) * 144;
      const int j = static_cast<int>(c % model::kQK_K);
      const float d = f16_bits_to_f32(load_u16(b));
      const float dmin = f16_bits_to_f32(load_u16(b + 2));
      const int chunk = j / 64, within = j % 64, l = within % 32;
      uint32_t sc, m;
      scale_min_k4(2 * chunk + (within >= 32 ? 1 : 0), b + 4, &sc, &m);
      const float dl = __fmul_rn(d, static_cast<float>(sc));
      const float ml = __fmul_rn(dmin, static_cast<float>(m));
      const uint32_t byte = b[16 + chunk * 32 + l];
      const uint32_t q = within < 32 ? (byte & 0xFu) : (byte >> 4);
      return __fsub_rn(__fmul_rn(dl, static_cast<float>(q)), ml);
    }
    case GgmlType::kQ5_K: {  // {f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}
      const uint8_t* b = row + (c / model::kQK_K) * 176;
      const int j = static_cast<int>(c % model::kQK_K);
      const float d = f16_bits_to_f32(load_u16(b));
      const float dmin = f16_bits_to_f32(load_u16(b + 2));
      const int sub = j / 32, l = j % 32;  // bit `sub` of qh[l] is the value's top bit
      uint32_t sc, m;
      scale_min_k4(sub, b + 4, &sc, &m);
      const float dl = __fmul_rn(d, static_cast<float>(sc));
      const float ml = __fmul_rn(dmin, static_cast<float>(m));
      const uint32_t byte = b[48 + (sub / 2) * 32 + l];
      const uint32_t q = ((sub % 2 == 0) ? (byte & 0xFu) : (byte >> 4)) |
                         (((static_cast<uint32_t>(b[16 + l]) >> sub) & 1u) << 4);
      return __fsub_rn(__fmul_rn(dl, static_cast<float>(q)), ml);
    }
    case GgmlType::kQ6_K: {  // {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}
      const uint8_t* b = row + (c / model::kQK_K) * 210;
      const int j = static_cast<int>(c % model::kQK_K);
      const int half = j / 128, quarter = (j % 128) / 32, l = j % 32;
      const uint32_t ql = b[64 * half + l + 32 * (quarter & 1)];
      const uint32_t low = quarter >= 2 ? (ql >> 4) : (ql & 0xFu);
      const uint32_t high = (static_cast<uint32_t>(b[128 + 32 * half + l]) >> (2 * quarter)) & 3u;
      const int q = static_cast<int>(low | (high << 4)) - 32;
      const int s = static_cast<int8_t>(b[192 + 8 * half + l / 16 + 2 * quarter]);
      const float d = f16_bits_to_f32(load_u16(b + 208));
      return __fmul_rn(__fmul_rn(d, static_cast<float>(s)), static_cast<float>(q));
    }
    default:
      return nan_f32();  // unreachable: the launcher accepts only the types above
  }
}

// ---- kernels ----

// Thread mapping: a grid-stride loop over the rows * cols output elements, one element per
// thread per step; each thread decodes its element from its block (re-reading the block's
// scales: this runs once at weight upload, so simple beats fast).
__global__ void __launch_bounds__(kElemThreads)
    dequantize_kernel(const uint8_t* src, GgmlType type, int64_t rows, int64_t cols,
                      int64_t row_bytes, __nv_bfloat16* out) {
  const int64_t total = rows * cols;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += stride) {
    const int64_t r = e / cols, c = e % cols;
    out[e] = __float2bfloat16_rn(dequant_element(type, src + r * row_bytes, c));
  }
}

// Thread mapping: one block per token (blockIdx.x); its threads stride over the n_embd columns.
__global__ void __launch_bounds__(kEmbedThreads)
    embed_kernel(const __nv_bfloat16* table, int64_t n_vocab, int64_t n_embd, const int32_t* ids,
                 float* hidden) {
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  float* dst = hidden + t * n_embd;
  if (id < 0 || id >= n_vocab) {
    for (int64_t c = threadIdx.x; c < n_embd; c += blockDim.x) dst[c] = nan_f32();
    return;
  }
  const __nv_bfloat16* src = table + static_cast<int64_t>(id) * n_embd;
  for (int64_t c = threadIdx.x; c < n_embd; c += blockDim.x) dst[c] = __bfloat162float(src[c]);
}

// Sum over a warp with a fixed xor butterfly; every lane gets the bit-identical total (each step
// adds the same two operands on both partner lanes).
__device__ __forceinline__ double warp_sum(double v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kFullMask, v, off);
  return v;
}

__device__ __forceinline__ void store_out(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_out(__nv_bfloat16* p, float v) {
  *p = __float2bfloat16_rn(v);
}

// The CPU's rms scale from a double sum of squares: 1 / sqrt(float(sum / n) + eps).
__device__ __forceinline__ float rms_scale(double sum_sq, int64_t n, float eps) {
  const float mean = __double2float_rn(__ddiv_rn(sum_sq, static_cast<double>(n)));
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
}

// Thread mapping: one block of kNormThreads per row (blockIdx.x). Thread i owns columns
// i, i + kNormThreads, ...: it adds delta, writes the residual back and accumulates its squares
// (exact products, double sums); a fixed tree (warp butterfly, then the 8 warp sums in warp
// order) gives the row's sum; then each thread scales its own columns (which it wrote itself,
// so no barrier is needed between the two passes beyond the reduction's).
template <class Out>
__global__ void __launch_bounds__(kNormThreads)
    add_rms_norm_kernel(float* residual, const float* delta, const float* weight, int64_t width,
                        float eps, Out* out) {
  __shared__ double s_warp[kNormThreads / 32];
  const int64_t row = blockIdx.x;
  float* x = residual + row * width;
  const float* dl = delta != nullptr ? delta + row * width : nullptr;
  double ss = 0;
  for (int64_t i = threadIdx.x; i < width; i += kNormThreads) {
    float v = x[i];
    if (dl != nullptr) {
      v = __fadd_rn(v, dl[i]);
      x[i] = v;
    }
    const double vd = v;
    ss = __dadd_rn(ss, __dmul_rn(vd, vd));
  }
  ss = warp_sum(ss);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  if (lane == 0) s_warp[warp] = ss;
  __syncthreads();
  double total = lane < kNormThreads / 32 ? s_warp[lane] : 0.0;
  total = warp_sum(total);
  const float scale = rms_scale(total, width, eps);
  Out* o = out + row * width;
  for (int64_t i = threadIdx.x; i < width; i += kNormThreads)
    store_out(o + i, __fmul_rn(__fmul_rn(x[i], scale), weight[i]));
}

// Thread mapping: one block per token (blockIdx.x) of kRopeWarps warps. Warp w handles heads
// w, w + kRopeWarps, ... of the token's n_head + 2 n_head_kv heads (q, then k, then v). A head
// is staged in the warp's slice of shared memory (f32 [head_dim]): lane l loads (and normalizes)
// dims l, l + 32, ...; after __syncwarp, lane l rotates pairs l, l + 32, ... and writes bf16.
__global__ void __launch_bounds__(kRopeWarps * 32) rope_qkv_kernel(RopeQkvArgs a) {
  extern __shared__ float s_heads[];  // f32 [kRopeWarps, head_dim]
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t D = a.head_dim, H = a.n_head, HK = a.n_head_kv;
  const int64_t n_heads_all = H + 2 * HK;
  const int64_t half = a.n_rot / 2;
  float* buf = s_heads + warp * D;
  const int64_t t = blockIdx.x;
  const int32_t pos = a.positions[t];
  const int64_t slot = a.slots[t];
  const int64_t num_slots = a.kv.num_blocks * a.kv.block_size;
  const bool bad = (a.n_rot > 0 && (pos < 0 || pos >= a.max_pos)) || slot >= num_slots;
  const bool write_kv = slot >= 0 && slot < num_slots;
  const float* x_tok = a.qkv + t * n_heads_all * D;
  const float* cs = bad || a.n_rot == 0 ? nullptr : a.rope_cos + static_cast<int64_t>(pos) * half;
  const float* sn = bad || a.n_rot == 0 ? nullptr : a.rope_sin + static_cast<int64_t>(pos) * half;
  for (int64_t h = warp; h < n_heads_all; h += kRopeWarps) {  // warp-uniform
    const bool is_q = h < H, is_k = !is_q && h < H + HK;
    __nv_bfloat16* dst;
    if (is_q) {
      dst = a.q_out + (t * H + h) * D;
    } else if (!write_kv) {
      continue;
    } else if (is_k) {
      dst = a.kv.k + (slot * HK + (h - H)) * D;
    } else {
      dst = a.kv.v + (slot * HK + (h - H - HK)) * D;
    }
    if (bad) {
      for (int64_t d = lane; d < D; d += 32) dst[d] = __float2bfloat16_rn(nan_f32());
      continue;
    }
    const float* xh = x_tok + h * D;
    const float* bh = a.bias != nullptr ? a.bias + h * D : nullptr;
    const float* nw = is_q ? a.q_norm : (is_k ? a.k_norm : nullptr);
    double ss = 0;
    for (int64_t d = lane; d < D; d += 32) {
      float v = xh[d];
      if (bh != nullptr) v = __fadd_rn(v, bh[d]);
      buf[d] = v;
      const double vd = v;
      ss = __dadd_rn(ss, __dmul_rn(vd, vd));
    }
    if (nw != nullptr) {
      const float scale = rms_scale(warp_sum(ss), D, a.norm_eps);
      for (int64_t d = lane; d < D; d += 32) buf[d] = __fmul_rn(__fmul_rn(buf[d], scale), nw[d]);
    }
    __syncwarp();
    if ((is_q || is_k) && half > 0) {
      for (int64_t i = lane; i < half; i += 32) {
        const int64_t ia = a.neox ? i : 2 * i;
        const int64_t ib = a.neox ? i + half : 2 * i + 1;
        const float x0 = buf[ia], x1 = buf[ib], c = cs[i], s = sn[i];
        dst[ia] = __float2bfloat16_rn(__fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s)));
        dst[ib] = __float2bfloat16_rn(__fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c)));
      }
      for (int64_t d = 2 * half + lane; d < D; d += 32) dst[d] = __float2bfloat16_rn(buf[d]);
    } else {
      for (int64_t d = lane; d < D; d += 32) dst[d] = __float2bfloat16_rn(buf[d]);
    }
    __syncwarp();  // the next head overwrites buf
  }
}

__device__ __forceinline__ float swiglu_value(float g, float u) {
  const float silu = __fdiv_rn(g, __fadd_rn(1.0f, expf(-g)));
  return __fmul_rn(silu, u);
}

// Thread mapping (all element-wise kernels below): a grid-stride loop, one element per thread
// per step.
__global__ void __launch_bounds__(kElemThreads)
    swiglu_fused_kernel(const float* gate_up, int64_t num_rows, int64_t n_ff, __nv_bfloat16* out) {
  const int64_t total = num_rows * n_ff;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += stride) {
    const int64_t r = e / n_ff, i = e % n_ff;
    const float* row = gate_up + r * 2 * n_ff;
    out[e] = __float2bfloat16_rn(swiglu_value(row[i], row[n_ff + i]));
  }
}

__global__ void __launch_bounds__(kElemThreads)
    swiglu_split_kernel(const float* gate, const float* up, int64_t total, __nv_bfloat16* out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += stride)
    out[e] = __float2bfloat16_rn(swiglu_value(gate[e], up[e]));
}

__global__ void __launch_bounds__(kElemThreads)
    add_inplace_kernel(float* x, const float* delta, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride)
    x[e] = __fadd_rn(x[e], delta[e]);
}

__global__ void __launch_bounds__(kElemThreads)
    f32_to_bf16_kernel(const float* in, int64_t n, __nv_bfloat16* out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride)
    out[e] = __float2bfloat16_rn(in[e]);
}

__global__ void __launch_bounds__(kElemThreads)
    bf16_to_f32_kernel(const __nv_bfloat16* in, int64_t n, float* out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride)
    out[e] = __bfloat162float(in[e]);
}

// ---- host-side validation helpers ----

// rows * cols without overflow (both >= 0).
bool fits_product(int64_t a, int64_t b) {
  return a == 0 || b <= std::numeric_limits<int64_t>::max() / a;
}

template <class Out>
void add_rms_norm_impl(float* residual, const float* delta, const float* weight, int64_t num_rows,
                       int64_t width, float eps, Out* out, cudaStream_t stream) {
  OPS_REQUIRE(num_rows >= 0 && num_rows <= INT_MAX,
              "add_rms_norm: num_rows must be in [0, %d], got %lld", INT_MAX, ll(num_rows));
  OPS_REQUIRE(width >= 1 && width <= kMaxNormWidth,
              "add_rms_norm: width must be in [1, %lld], got %lld", ll(kMaxNormWidth), ll(width));
  OPS_REQUIRE(std::isfinite(eps) && eps >= 0, "add_rms_norm: eps must be finite and >= 0, got %g",
              static_cast<double>(eps));
  if (num_rows == 0) return;
  OPS_REQUIRE(residual != nullptr && weight != nullptr && out != nullptr,
              "add_rms_norm: residual, weight and out must not be null");
  add_rms_norm_kernel<Out><<<static_cast<unsigned>(num_rows), kNormThreads, 0, stream>>>(
      residual, delta, weight, width, eps, out);
  TROUPE_CUDA_CHECK_LAUNCH();
}

void check_elementwise(const char* what, int64_t n, const void* a, const void* b) {
  OPS_REQUIRE(n >= 0, "%s: element count must be >= 0, got %lld", what, ll(n));
  OPS_REQUIRE(n == 0 || (a != nullptr && b != nullptr), "%s: null pointer with %lld elements", what,
              ll(n));
}

}  // namespace

bool dequantize_supported(model::GgmlType t) {
  switch (t) {
    case model::GgmlType::kF32:
    case model::GgmlType::kF16:
    case model::GgmlType::kBF16:
    case model::GgmlType::kQ8_0:
    case model::GgmlType::kQ4_0:
    case model::GgmlType::kQ4_1:
    case model::GgmlType::kQ5_0:
    case model::GgmlType::kQ5_1:
    case model::GgmlType::kIQ4_NL:
    case model::GgmlType::kIQ4_XS:
    case model::GgmlType::kQ2_K:
    case model::GgmlType::kQ3_K:
    case model::GgmlType::kQ4_K:
    case model::GgmlType::kQ5_K:
    case model::GgmlType::kQ6_K:
      return true;
    default:
      return false;
  }
}

// ---- launchers ----

void dequantize_to_bf16(const void* src, size_t src_bytes, GgmlType type, int64_t rows,
                        int64_t cols, __nv_bfloat16* out, cudaStream_t stream) {
  OPS_REQUIRE(dequantize_supported(type),
              "dequantize_to_bf16: type %s is not supported (f32, f16, bf16, q8_0, q4_0, q4_1, "
              "q5_0, q5_1, q2_K, "
              "q3_K, q4_K, q5_K, q6_K, iq4_nl, iq4_xs are)",
              model::type_name(type).c_str());
  OPS_REQUIRE(rows >= 0 && cols >= 0, "dequantize_to_bf16: shape [%lld, %lld] is negative",
              ll(rows), ll(cols));
  const auto traits = model::type_traits(static_cast<uint32_t>(type));
  OPS_REQUIRE(cols % traits->block_elems == 0,
              "dequantize_to_bf16: cols (%lld) must be a multiple of %lld for %s", ll(cols),
              ll(traits->block_elems), model::type_name(type).c_str());
  OPS_REQUIRE(fits_product(rows, cols), "dequantize_to_bf16: [%lld, %lld] overflows int64",
              ll(rows), ll(cols));
  if (rows == 0 || cols == 0) return;
  const int64_t row_bytes = cols / traits->block_elems * traits->block_bytes;
  OPS_REQUIRE(fits_product(rows, row_bytes) &&
                  static_cast<uint64_t>(rows * row_bytes) <= static_cast<uint64_t>(src_bytes),
              "dequantize_to_bf16: [%lld, %lld] %s needs %lld bytes, src has %zu", ll(rows),
              ll(cols), model::type_name(type).c_str(), ll(rows * row_bytes), src_bytes);
  OPS_REQUIRE(src != nullptr && out != nullptr, "dequantize_to_bf16: null src or out");
  dequantize_kernel<<<elem_blocks(rows * cols), kElemThreads, 0, stream>>>(
      static_cast<const uint8_t*>(src), type, rows, cols, row_bytes, out);
  TROUPE_CUDA_CHECK_LAUNCH();
}

void embed_rows(const __nv_bfloat16* table, int64_t n_vocab, int64_t n_embd,
                const int32_t* token_ids, int64_t num_tokens, float* hidden, cudaStream_t stream) {
  OPS_REQUIRE(n_vocab >= 1 && n_embd >= 1, "embed_rows: table shape [%lld, %lld] is empty",
              ll(n_vocab), ll(n_embd));
  OPS_REQUIRE(fits_product(n_vocab, n_embd), "embed_rows: [%lld, %lld] overflows int64",
              ll(n_vocab), ll(n_embd));
  OPS_REQUIRE(num_tokens >= 0 && num_tokens <= INT_MAX,
              "embed_rows: num_tokens must be in [0, %d], got %lld", INT_MAX, ll(num_tokens));
  OPS_REQUIRE(fits_product(num_tokens, n_embd), "embed_rows: [%lld, %lld] overflows int64",
              ll(num_tokens), ll(n_embd));
  if (num_tokens == 0) return;
  OPS_REQUIRE(table != nullptr && token_ids != nullptr && hidden != nullptr,
              "embed_rows: null table, token_ids or hidden");
  embed_kernel<<<static_cast<unsigned>(num_tokens), kEmbedThreads, 0, stream>>>(
      table, n_vocab, n_embd, token_ids, hidden);
  TROUPE_CUDA_CHECK_LAUNCH();
}

void add_rms_norm(float* residual, const float* delta, const float* weight, int64_t num_rows,
                  int64_t width, float eps, __nv_bfloat16* out, cudaStream_t stream) {
  add_rms_norm_impl(residual, delta, weight, num_rows, width, eps, out, stream);
}

void add_rms_norm(float* residual, const float* delta, const float* weight, int64_t num_rows,
                  int64_t width, float eps, float* out, cudaStream_t stream) {
  add_rms_norm_impl(residual, delta, weight, num_rows, width, eps, out, stream);
}

RopeTable make_rope_table(int64_t max_pos, int64_t n_rot, float theta_base) {
  OPS_REQUIRE(n_rot >= 2 && n_rot % 2 == 0,
              "make_rope_table: n_rot must be even and >= 2, got %lld", ll(n_rot));
  OPS_REQUIRE(std::isfinite(theta_base) && theta_base > 0,
              "make_rope_table: theta_base must be finite and > 0, got %g",
              static_cast<double>(theta_base));
  model::ModelSpec s;  // only the rotary fields matter here
  s.n_rot = n_rot;
  s.rope_theta = theta_base;
  const model::RopeFrequencies f = model::rope_frequencies(s);
  return make_rope_table(max_pos, f.inv_freq, f.mscale);
}

RopeTable make_rope_table(int64_t max_pos, const std::vector<double>& inv_freq, double mscale) {
  const int64_t half = static_cast<int64_t>(inv_freq.size());
  OPS_REQUIRE(max_pos >= 1, "make_rope_table: max_pos must be >= 1, got %lld", ll(max_pos));
  OPS_REQUIRE(half >= 1, "make_rope_table: no rotary pairs");
  OPS_REQUIRE(std::isfinite(mscale) && mscale > 0,
              "make_rope_table: mscale must be finite and > 0, got %g", mscale);
  OPS_REQUIRE(fits_product(max_pos, half) && max_pos * half <= (int64_t{1} << 34),
              "make_rope_table: [%lld, %lld] is too large", ll(max_pos), ll(half));
  RopeTable t;
  t.max_pos = max_pos;
  t.n_rot = 2 * half;
  t.cos.resize(static_cast<size_t>(max_pos * half));
  t.sin.resize(static_cast<size_t>(max_pos * half));
  std::vector<int64_t> positions(static_cast<size_t>(max_pos));
  for (int64_t p = 0; p < max_pos; ++p) positions[static_cast<size_t>(p)] = p;
  // compute/engine.cc's values: the same function computes them.
  model::rope_cos_sin(model::RopeFrequencies{inv_freq, mscale}, positions, t.cos.data(),
                      t.sin.data());
  return t;
}

void rope_qkv_write(const RopeQkvArgs& a, cudaStream_t stream) {
  OPS_REQUIRE(a.num_tokens >= 0 && a.num_tokens <= INT_MAX,
              "rope_qkv_write: num_tokens must be in [0, %d], got %lld", INT_MAX, ll(a.num_tokens));
  OPS_REQUIRE(
      a.n_head >= 1 && a.n_head_kv >= 1 && a.n_head <= (1 << 16) && a.n_head_kv <= (1 << 16),
      "rope_qkv_write: n_head (%lld) and n_head_kv (%lld) must be in [1, 65536]", ll(a.n_head),
      ll(a.n_head_kv));
  OPS_REQUIRE(a.head_dim >= 1 && a.head_dim <= kMaxHeadDim,
              "rope_qkv_write: head_dim must be in [1, %lld], got %lld", ll(kMaxHeadDim),
              ll(a.head_dim));
  OPS_REQUIRE(a.n_rot >= 0 && a.n_rot % 2 == 0 && a.n_rot <= a.head_dim,
              "rope_qkv_write: n_rot must be even and in [0, head_dim = %lld], got %lld",
              ll(a.head_dim), ll(a.n_rot));
  OPS_REQUIRE(std::isfinite(a.norm_eps) && a.norm_eps >= 0,
              "rope_qkv_write: norm_eps must be finite and >= 0, got %g",
              static_cast<double>(a.norm_eps));
  OPS_REQUIRE(a.kv.n_head_kv == a.n_head_kv && a.kv.head_dim == a.head_dim,
              "rope_qkv_write: cache is [n_head_kv %lld, head_dim %lld], the heads are "
              "[%lld, %lld]",
              ll(a.kv.n_head_kv), ll(a.kv.head_dim), ll(a.n_head_kv), ll(a.head_dim));
  OPS_REQUIRE(a.kv.num_blocks >= 0 && a.kv.block_size >= 1 &&
                  fits_product(a.kv.num_blocks, a.kv.block_size) &&
                  fits_product(a.kv.num_blocks * a.kv.block_size, a.n_head_kv * a.head_dim),
              "rope_qkv_write: cache of %lld blocks of %lld slots is invalid", ll(a.kv.num_blocks),
              ll(a.kv.block_size));
  if (a.n_rot > 0)
    OPS_REQUIRE(a.max_pos >= 1 && a.rope_cos != nullptr && a.rope_sin != nullptr,
                "rope_qkv_write: n_rot = %lld needs rope_cos, rope_sin and max_pos >= 1 (got "
                "%lld)",
                ll(a.n_rot), ll(a.max_pos));
  if (a.num_tokens == 0) return;
  OPS_REQUIRE(
      a.qkv != nullptr && a.positions != nullptr && a.slots != nullptr && a.q_out != nullptr,
      "rope_qkv_write: null qkv, positions, slots or q_out");
  OPS_REQUIRE(a.kv.num_blocks == 0 || (a.kv.k != nullptr && a.kv.v != nullptr),
              "rope_qkv_write: null cache pointers");
  const size_t smem = static_cast<size_t>(kRopeWarps * a.head_dim) * sizeof(float);
  rope_qkv_kernel<<<static_cast<unsigned>(a.num_tokens), kRopeWarps * 32, smem, stream>>>(a);
  TROUPE_CUDA_CHECK_LAUNCH();
}

void swiglu(const float* gate_up, int64_t num_rows, int64_t n_ff, __nv_bfloat16* out,
            cudaStream_t stream) {
  OPS_REQUIRE(num_rows >= 0 && n_ff >= 0, "swiglu: shape [%lld, %lld] is negative", ll(num_rows),
              ll(n_ff));
  OPS_REQUIRE(fits_product(num_rows, 2 * n_ff), "swiglu: [%lld, 2 * %lld] overflows int64",
              ll(num_rows), ll(n_ff));
  check_elementwise("swiglu", num_rows * n_ff, gate_up, out);
  if (num_rows * n_ff == 0) return;
  swiglu_fused_kernel<<<elem_blocks(num_rows * n_ff), kElemThreads, 0, stream>>>(gate_up, num_rows,
                                                                                 n_ff, out);
  TROUPE_CUDA_CHECK_LAUNCH();
}

void swiglu(const float* gate, const float* up, int64_t num_rows, int64_t n_ff, __nv_bfloat16* out,
            cudaStream_t stream) {
  OPS_REQUIRE(num_rows >= 0 && n_ff >= 0, "swiglu: shape [%lld, %lld] is negative", ll(num_rows),
              ll(n_ff));
  OPS_REQUIRE(fits_product(num_rows, n_ff), "swiglu: [%lld, %lld] overflows int64", ll(num_rows),
              ll(n_ff));
  check_elementwise("swiglu", num_rows * n_ff, gate, out);
  check_elementwise("swiglu", num_rows * n_ff, up, out);
  if (num_rows * n_ff == 0) return;
  swiglu_split_kernel<<<elem_blocks(num_rows * n_ff), kElemThreads, 0, stream>>>(
      gate, up, num_rows * n_ff, out);
  TROUPE_CUDA_CHECK_LAUNCH();
}

void add_inplace(float* x, const float* delta, int64_t n, cudaStream_t stream) {
  check_elementwise("add_inplace", n, x, delta);
  if (n == 0) return;
  add_inplace_kernel<<<elem_blocks(n), kElemThreads, 0, stream>>>(x, delta, n);
  TROUPE_CUDA_CHECK_LAUNCH();
}

void cast_f32_to_bf16(const float* in, int64_t n, __nv_bfloat16* out, cudaStream_t stream) {
  check_elementwise("cast_f32_to_bf16", n, in, out);
  if (n == 0) return;
  f32_to_bf16_kernel<<<elem_blocks(n), kElemThreads, 0, stream>>>(in, n, out);
  TROUPE_CUDA_CHECK_LAUNCH();
}

void cast_bf16_to_f32(const __nv_bfloat16* in, int64_t n, float* out, cudaStream_t stream) {
  check_elementwise("cast_bf16_to_f32", n, in, out);
  if (n == 0) return;
  bf16_to_f32_kernel<<<elem_blocks(n), kElemThreads, 0, stream>>>(in, n, out);
  TROUPE_CUDA_CHECK_LAUNCH();
}

}  // namespace troupe::gpu
