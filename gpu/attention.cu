// Paged attention kernels (see attention.h): one templated FlashAttention-style kernel serves the
// prefill (q_len > 1) and the split-K decode (q_len == 1) of GQA and MLA, plus the split combine.
// Host launchers validate, pick the template for the head size and enqueue on the caller's stream.
//
// Work split. The "rows" of a (sequence, kv head) are its q_len tokens times the `group` query
// heads that share the kv head (MLA: all heads share the one latent "kv head"), row = token *
// group + head_in_group, so K/V tiles loaded once serve every head of the group. A block of 4
// warps owns kRows = 4 * RW rows (RW per warp); it walks key tiles of 32 positions (one key per
// lane for Q.K, two output dims per lane and pair for P.V) with an online softmax in the log2
// domain and f32 accumulation. Q (f32), K and V (bf16) tiles live in shared memory.
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "base/check.h"
#include "gpu/attention.h"
#include "gpu/runtime.h"

namespace troupe::gpu {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kTileKeys = 32;   // keys per tile: one per lane in Q.K
constexpr int kMinChunk = 256;  // decode: keys per split, at least
constexpr int kMaxSplits = 64;  // decode: splits per sequence, at most
constexpr int kMaxHeadDim = 256;
constexpr int kMaxLoraRank = 512;
constexpr int kMaxRopeDim = 64;
constexpr int64_t kSlotPast = -1;  // position past the block's key range: zeros, masked anyway
constexpr int64_t kSlotBad = -2;   // block table entry out of range: NaN, so the bug shows
constexpr uint32_t kBf16NanPair = 0x7FC07FC0u;
constexpr float kLog2e = 1.4426950408889634f;

// Kernel arguments (one struct, passed by value). Element strides; all offsets computed in int64.
struct Params {
  const __nv_bfloat16* q;  // [n_tok, n_head, dk]
  int64_t q_tok_stride;    // n_head * dk
  int32_t dk, dv;          // runtime widths (<= the template's DK, DV)
  int32_t n_head, n_head_kv, group;
  const __nv_bfloat16* k;  // element (slot, kv head, d) at slot * k_slot_stride + h * k_head_stride
  const __nv_bfloat16* v;  // same for V (MLA: V is K's first dv columns; v unused)
  int64_t k_slot_stride, k_head_stride, v_slot_stride, v_head_stride;
  int64_t num_slots;
  int32_t block_size;
  const int32_t* q_start;
  const int32_t* q_len;
  const int32_t* pos0;
  const int32_t* block_table;  // [n_seqs, max_blocks]
  int32_t max_blocks;
  int32_t n_seqs;
  int64_t n_tok;
  float scale_log2;        // softmax scale * log2(e): scores live in the log2 domain
  void* out;               // [n_tok, n_head, dv] of the output type
  int64_t out_tok_stride;  // n_head * dv
  float* ws_o;             // decode partials f32 [n_seqs, max_splits, n_head, dv]
  float* ws_ml;            // f32 [n_seqs, max_splits, n_head, 2]: running max (log2), sum
  int32_t max_splits;
  bool vec_q, vec_kv;  // rows are whole 16-byte chunks, 16-byte aligned: vector loads
};

// Keys per decode split: depends on kv_len alone (batch invariance), at most kMaxSplits splits.
__host__ __device__ inline int64_t decode_chunk(int64_t kv_len) {
  int64_t c = kMinChunk;
  while ((kv_len + c - 1) / c > kMaxSplits) c *= 2;
  return c;
}

int64_t max_splits_for(int64_t max_kv_len) {
  const int64_t s = (max_kv_len + kMinChunk - 1) / kMinChunk;
  return s < 1 ? 1 : (s > kMaxSplits ? kMaxSplits : s);
}

// Shared-memory layout of one block; every part starts 16-byte aligned.
template <int DK, int DV, int RW, bool kVInK>
struct Tile {
  static_assert(DK % 8 == 0 && DV % 2 == 0 && DV <= DK, "tile widths");
  static constexpr int kRows = kWarps * RW;
  static constexpr int kKStride = DK + 8;  // bf16 per key row; +16 bytes spreads the banks
  static constexpr int kVStride = kVInK ? kKStride : DV + 8;
  static constexpr size_t kQBytes = size_t{kRows} * DK * sizeof(float);
  static constexpr size_t kKBytes = size_t{kTileKeys} * kKStride * sizeof(__nv_bfloat16);
  static constexpr size_t kVBytes =
      kVInK ? 0 : size_t{kTileKeys} * kVStride * sizeof(__nv_bfloat16);
  static constexpr size_t kPBytes = size_t{kWarps} * RW * kTileKeys * sizeof(float);
  static constexpr size_t kSlotBytes = size_t{kTileKeys} * sizeof(int64_t);
  static constexpr size_t kBytes = kQBytes + kKBytes + kVBytes + kPBytes + kSlotBytes;
  static_assert(kQBytes % 16 == 0 && kKBytes % 16 == 0 && kVBytes % 16 == 0 && kPBytes % 16 == 0);
};

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

// Butterfly sum: every lane ends with the same bits (fp addition is commutative).
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// bf16 pair packed in a 32-bit word (element 0 in the low half) to f32: exact.
__device__ __forceinline__ float bf_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

// 8 bf16 at src (element d of a row of `width`), zeros past the width.
// REQUIRES: d < width; when vec, width % 8 == 0 and src 16-byte aligned.
__device__ __forceinline__ uint4 load8(const __nv_bfloat16* src, int d, int width, bool vec) {
  if (vec) return *reinterpret_cast<const uint4*>(src);
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t lo = d + 2 * i < width ? __bfloat16_as_ushort(src[2 * i]) : 0u;
    const uint32_t hi = d + 2 * i + 1 < width ? __bfloat16_as_ushort(src[2 * i + 1]) : 0u;
    w[i] = lo | (hi << 16);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Loads the 32 key rows of a tile (columns [0, D), zeros past `width`) into dst, row stride
// `stride`. Coalesced: consecutive threads read consecutive 16-byte chunks of a row.
template <int D>
__device__ __forceinline__ void load_tile(__nv_bfloat16* dst, int stride, const __nv_bfloat16* base,
                                          int64_t slot_stride, int width, bool vec,
                                          const int64_t* slots, int tid) {
  constexpr int kChunks = D / 8;
  constexpr int kTotal = kTileKeys * kChunks;
  constexpr int kIters = (kTotal + kThreads - 1) / kThreads;
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int idx = tid + it * kThreads;
    if (kTotal % kThreads == 0 || idx < kTotal) {
      const int j = idx / kChunks;
      const int d = (idx % kChunks) * 8;
      const int64_t slot = slots[j];
      uint4 w = make_uint4(0u, 0u, 0u, 0u);
      if (slot >= 0) {
        if (d < width) w = load8(base + slot * slot_stride + d, d, width, vec);
      } else if (slot == kSlotBad) {
        w = make_uint4(kBf16NanPair, kBf16NanPair, kBf16NanPair, kBf16NanPair);
      }
      *reinterpret_cast<uint4*>(dst + j * stride + d) = w;
    }
  }
}

template <typename OutT>
__device__ __forceinline__ void store_out(OutT* p, float x) {
  if constexpr (sizeof(OutT) == sizeof(float)) {
    *p = x;
  } else {
    *p = __float2bfloat16(x);
  }
}

// One block: rows [row0, row0 + kRows) of (sequence, kv head) against keys [k_begin, k_end).
// Prefill (kDecode false): grid (row tiles, n_head_kv, n_seqs); skips q_len == 1 sequences;
// writes normalized rows to out. Decode: grid (splits, row tiles, n_head_kv * n_seqs); only
// q_len == 1 sequences; writes unnormalized partials, max and sum to the workspace.
// Every early return below depends only on blockIdx, so whole blocks leave together and no
// __syncthreads is skipped by part of a block.
template <int DK, int DV, int RW, bool kVInK, bool kDecode, typename OutT>
__global__ void __launch_bounds__(kThreads) attn_kernel(const Params p) {
  using T = Tile<DK, DV, RW, kVInK>;
  constexpr int kPairs = DV / 2;
  constexpr int kNP = (kPairs + 31) / 32;  // output pairs per lane

  extern __shared__ __align__(16) unsigned char smem[];
  float* qs = reinterpret_cast<float*>(smem);                               // [kRows][DK]
  __nv_bfloat16* ks = reinterpret_cast<__nv_bfloat16*>(smem + T::kQBytes);  // [32][kKStride]
  __nv_bfloat16* vs = kVInK ? ks : reinterpret_cast<__nv_bfloat16*>(smem + T::kQBytes + T::kKBytes);
  float* ps = reinterpret_cast<float*>(smem + T::kQBytes + T::kKBytes + T::kVBytes);
  int64_t* slots =
      reinterpret_cast<int64_t*>(smem + T::kQBytes + T::kKBytes + T::kVBytes + T::kPBytes);

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  const int warp = tid >> 5;

  int seq, kvh, split;
  int64_t row0;
  if constexpr (kDecode) {
    split = static_cast<int>(blockIdx.x);
    row0 = static_cast<int64_t>(blockIdx.y) * T::kRows;
    kvh = static_cast<int>(blockIdx.z % static_cast<unsigned>(p.n_head_kv));
    seq = static_cast<int>(blockIdx.z / static_cast<unsigned>(p.n_head_kv));
  } else {
    split = 0;
    row0 = static_cast<int64_t>(blockIdx.x) * T::kRows;
    kvh = static_cast<int>(blockIdx.y);
    seq = static_cast<int>(blockIdx.z);
  }
  if (seq >= p.n_seqs) return;
  const int64_t q_len = p.q_len[seq];
  const int64_t pos0 = p.pos0[seq];
  if (q_len < 1 || pos0 < 0) return;
  if (kDecode != (q_len == 1)) return;  // the other kernel handles this sequence
  const int64_t kv_len = pos0 + q_len;
  const int64_t n_rows = q_len * p.group;
  if (row0 >= n_rows) return;
  const int64_t q_start = p.q_start[seq];

  int64_t k_begin = 0, k_end = 0;
  if constexpr (kDecode) {
    const int64_t chunk = decode_chunk(kv_len);
    k_begin = static_cast<int64_t>(split) * chunk;
    if (k_begin >= kv_len) return;
    k_end = min(kv_len, k_begin + chunk);
  } else {
    const int64_t last_row = min(n_rows, row0 + T::kRows) - 1;
    k_end = pos0 + last_row / p.group + 1;  // keys past the block's last position are masked
  }

  // Q tile -> f32 shared memory, zeros for padding columns and rows past the sequence.
  for (int idx = tid; idx < T::kRows * (DK / 8); idx += kThreads) {
    const int r = idx / (DK / 8);
    const int d = (idx % (DK / 8)) * 8;
    const int64_t row = row0 + r;
    uint4 w = make_uint4(0u, 0u, 0u, 0u);
    if (row < n_rows && d < p.dk) {
      const int64_t tok = q_start + row / p.group;
      const int64_t h = static_cast<int64_t>(kvh) * p.group + row % p.group;
      if (tok >= 0 && tok < p.n_tok)
        w = load8(p.q + tok * p.q_tok_stride + h * p.dk + d, d, p.dk, p.vec_q);
    }
    float4* dst = reinterpret_cast<float4*>(qs + r * DK + d);
    dst[0] = make_float4(bf_lo(w.x), bf_hi(w.x), bf_lo(w.y), bf_hi(w.y));
    dst[1] = make_float4(bf_lo(w.z), bf_hi(w.z), bf_lo(w.w), bf_hi(w.w));
  }

  // This warp's rows: position (causal limit) or -1 for a row that does not exist.
  int64_t row_pos[RW];
  int64_t warp_max_pos = -1;
#pragma unroll
  for (int rr = 0; rr < RW; ++rr) {
    const int64_t row = row0 + warp * RW + rr;
    const int64_t tok = q_start + row / p.group;
    const bool ok = row < n_rows && tok >= 0 && tok < p.n_tok;
    row_pos[rr] = ok ? pos0 + row / p.group : -1;
    warp_max_pos = max(warp_max_pos, row_pos[rr]);
  }

  const float kNegInf = -INFINITY;
  float m[RW], l[RW];  // running max (log2 domain, same in every lane); this lane's partial sum
  float2 acc[RW][kNP];
#pragma unroll
  for (int rr = 0; rr < RW; ++rr) {
    m[rr] = kNegInf;
    l[rr] = 0.f;
#pragma unroll
    for (int c = 0; c < kNP; ++c) acc[rr][c] = make_float2(0.f, 0.f);
  }
  const float* qw = qs + warp * RW * DK;
  float* pw = ps + warp * RW * kTileKeys;

  for (int64_t kb = k_begin; kb < k_end; kb += kTileKeys) {
    __syncthreads();  // the previous tile's K, V and slots are no longer read
    if (tid < kTileKeys) {
      const int64_t pos = kb + tid;
      int64_t slot = kSlotPast;
      if (pos < k_end) {
        slot = kSlotBad;
        const int64_t b = pos / p.block_size;
        if (b < p.max_blocks) {
          const int64_t id = p.block_table[static_cast<int64_t>(seq) * p.max_blocks + b];
          const int64_t s = id * p.block_size + pos % p.block_size;
          if (id >= 0 && s < p.num_slots) slot = s;
        }
      }
      slots[tid] = slot;
    }
    __syncthreads();
    load_tile<DK>(ks, T::kKStride, p.k + kvh * p.k_head_stride, p.k_slot_stride, p.dk, p.vec_kv,
                  slots, tid);
    if constexpr (!kVInK)
      load_tile<DV>(vs, T::kVStride, p.v + kvh * p.v_head_stride, p.v_slot_stride, p.dv, p.vec_kv,
                    slots, tid);
    __syncthreads();  // also publishes the Q tile on the first pass

    // A tile entirely past this warp's rows would leave m, l and acc bitwise unchanged
    // (alpha = 1, p = 0): skip it. The condition is warp-uniform, so the shuffles are safe.
    if (warp_max_pos >= kb) {
      // S = Q K^T for key kb + lane; d ascending: a fixed order per (row, key).
      float s[RW];
#pragma unroll
      for (int rr = 0; rr < RW; ++rr) s[rr] = 0.f;
      const __nv_bfloat16* krow = ks + lane * T::kKStride;
#pragma unroll 4
      for (int d = 0; d < DK; d += 8) {
        const uint4 w = *reinterpret_cast<const uint4*>(krow + d);
        const float k0 = bf_lo(w.x), k1 = bf_hi(w.x), k2 = bf_lo(w.y), k3 = bf_hi(w.y);
        const float k4 = bf_lo(w.z), k5 = bf_hi(w.z), k6 = bf_lo(w.w), k7 = bf_hi(w.w);
#pragma unroll
        for (int rr = 0; rr < RW; ++rr) {
          const float4 a = *reinterpret_cast<const float4*>(qw + rr * DK + d);
          const float4 b = *reinterpret_cast<const float4*>(qw + rr * DK + d + 4);
          float x = s[rr];
          x = fmaf(a.x, k0, x);
          x = fmaf(a.y, k1, x);
          x = fmaf(a.z, k2, x);
          x = fmaf(a.w, k3, x);
          x = fmaf(b.x, k4, x);
          x = fmaf(b.y, k5, x);
          x = fmaf(b.z, k6, x);
          x = fmaf(b.w, k7, x);
          s[rr] = x;
        }
      }
      // Online softmax. m_use guards exp2(-inf - -inf) while a row has seen no key yet; alpha
      // is exactly 1 when the max did not move, so a fully masked tile changes no bit. The
      // product is rounded on its own (__fmul_rn: no contraction into the subtraction below).
      const int64_t key = kb + lane;
#pragma unroll
      for (int rr = 0; rr < RW; ++rr) {
        const bool valid = key <= row_pos[rr] && key < k_end;
        const float sc = valid ? __fmul_rn(s[rr], p.scale_log2) : kNegInf;
        const float m_new = fmaxf(m[rr], warp_max(sc));
        const float m_use = m_new == kNegInf ? 0.f : m_new;
        const float alpha = m_new == m[rr] ? 1.f : exp2f(m[rr] - m_use);
        const float pr = exp2f(sc - m_use);
        l[rr] = fmaf(l[rr], alpha, pr);
        m[rr] = m_new;
#pragma unroll
        for (int c = 0; c < kNP; ++c) {
          acc[rr][c].x *= alpha;
          acc[rr][c].y *= alpha;
        }
        pw[rr * kTileKeys + lane] = pr;
      }
      __syncwarp();
      // O += P V, keys ascending; lane owns output pairs lane, lane + 32, ...
#pragma unroll 2
      for (int j = 0; j < kTileKeys; j += 4) {
        float pj[RW][4];
#pragma unroll
        for (int rr = 0; rr < RW; ++rr) {
          const float4 t = *reinterpret_cast<const float4*>(pw + rr * kTileKeys + j);
          pj[rr][0] = t.x;
          pj[rr][1] = t.y;
          pj[rr][2] = t.z;
          pj[rr][3] = t.w;
        }
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
          const __nv_bfloat16* vrow = vs + (j + jj) * T::kVStride;
#pragma unroll
          for (int c = 0; c < kNP; ++c) {
            const int pi = lane + 32 * c;
            if (kPairs % 32 == 0 || pi < kPairs) {
              const uint32_t w = *reinterpret_cast<const uint32_t*>(vrow + 2 * pi);
              const float v0 = bf_lo(w), v1 = bf_hi(w);
#pragma unroll
              for (int rr = 0; rr < RW; ++rr) {
                acc[rr][c].x = fmaf(pj[rr][jj], v0, acc[rr][c].x);
                acc[rr][c].y = fmaf(pj[rr][jj], v1, acc[rr][c].y);
              }
            }
          }
        }
      }
      __syncwarp();
    }
  }

#pragma unroll
  for (int rr = 0; rr < RW; ++rr) {
    const float l_tot = warp_sum(l[rr]);  // every lane: outside the row test below
    if (row_pos[rr] < 0) continue;
    const int64_t row = row0 + warp * RW + rr;
    const int64_t h = static_cast<int64_t>(kvh) * p.group + row % p.group;
    if constexpr (kDecode) {
      const int64_t base = (static_cast<int64_t>(seq) * p.max_splits + split) * p.n_head + h;
      float* o = p.ws_o + base * p.dv;
#pragma unroll
      for (int c = 0; c < kNP; ++c) {
        const int d = 2 * (lane + 32 * c);
        if (d < p.dv) o[d] = acc[rr][c].x;
        if (d + 1 < p.dv) o[d + 1] = acc[rr][c].y;
      }
      if (lane == 0) {
        p.ws_ml[base * 2] = m[rr];
        p.ws_ml[base * 2 + 1] = l_tot;
      }
    } else {
      const int64_t tok = q_start + row / p.group;
      OutT* o = static_cast<OutT*>(p.out) + tok * p.out_tok_stride + h * p.dv;
      const float inv = 1.f / l_tot;
#pragma unroll
      for (int c = 0; c < kNP; ++c) {
        const int d = 2 * (lane + 32 * c);
        if (d < p.dv) store_out(o + d, acc[rr][c].x * inv);
        if (d + 1 < p.dv) store_out(o + d + 1, acc[rr][c].y * inv);
      }
    }
  }
}

// Merges the decode splits of one (sequence, head) in split order. Grid (n_head, n_seqs).
template <typename OutT>
__global__ void __launch_bounds__(kThreads) combine_kernel(const Params p) {
  __shared__ float weight[kMaxSplits];
  __shared__ float inv_sum;
  __shared__ int n_used;
  const int h = static_cast<int>(blockIdx.x);
  const int seq = static_cast<int>(blockIdx.y);
  if (seq >= p.n_seqs) return;
  const int64_t pos0 = p.pos0[seq];
  if (p.q_len[seq] != 1 || pos0 < 0) return;  // block-uniform
  const int64_t kv_len = pos0 + 1;
  const int64_t chunk = decode_chunk(kv_len);
  const int64_t n = (kv_len + chunk - 1) / chunk;
  const int64_t base0 = static_cast<int64_t>(seq) * p.max_splits;  // split 0 of this sequence
  if (threadIdx.x == 0) {
    if (n > p.max_splits) {  // context beyond AttnBatch::max_kv_len: no partials exist
      inv_sum = std::numeric_limits<float>::quiet_NaN();
      n_used = 0;
    } else {
      float mx = -INFINITY;
      for (int64_t i = 0; i < n; ++i) mx = fmaxf(mx, p.ws_ml[((base0 + i) * p.n_head + h) * 2]);
      const float m_use = mx == -INFINITY ? 0.f : mx;
      float sum = 0.f;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t b = ((base0 + i) * p.n_head + h) * 2;
        const float e = exp2f(p.ws_ml[b] - m_use);
        weight[i] = e;
        sum = fmaf(p.ws_ml[b + 1], e, sum);
      }
      inv_sum = 1.f / sum;
      n_used = static_cast<int>(n);
    }
  }
  __syncthreads();
  const int64_t tok = p.q_start[seq];
  if (tok < 0 || tok >= p.n_tok) return;
  OutT* o = static_cast<OutT*>(p.out) + tok * p.out_tok_stride + static_cast<int64_t>(h) * p.dv;
  const int nu = n_used;
  const float inv = inv_sum;
  for (int d = static_cast<int>(threadIdx.x); d < p.dv; d += kThreads) {
    float x = 0.f;
    for (int i = 0; i < nu; ++i)
      x = fmaf(p.ws_o[((base0 + i) * p.n_head + h) * p.dv + d], weight[i], x);
    store_out(o + d, x * inv);
  }
}

template <typename Kernel>
void launch(Kernel kernel, dim3 grid, size_t smem_bytes, const Params& p, cudaStream_t stream) {
  if (smem_bytes > 48 * 1024)
    TROUPE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem_bytes)));
  kernel<<<grid, kThreads, smem_bytes, stream>>>(p);
  TROUPE_CUDA_CHECK_LAUNCH();
}

// Prefill over the batch (when some q_len may exceed 1), then decode and combine (when some
// q_len may be 1). RWP / RWD: rows per warp of the prefill / decode kernel.
template <int DK, int DV, int RWP, int RWD, bool kVInK>
void run_attention(const Params& p, const AttnBatch& b, AttnOut out_type, cudaStream_t stream) {
  if (b.max_q_len > 1) {
    using T = Tile<DK, DV, RWP, kVInK>;
    const int64_t tiles = (static_cast<int64_t>(b.max_q_len) * p.group + T::kRows - 1) / T::kRows;
    const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(p.n_head_kv),
                    static_cast<unsigned>(b.n_seqs));
    if (out_type == AttnOut::kF32)
      launch(attn_kernel<DK, DV, RWP, kVInK, false, float>, grid, T::kBytes, p, stream);
    else
      launch(attn_kernel<DK, DV, RWP, kVInK, false, __nv_bfloat16>, grid, T::kBytes, p, stream);
  }
  if (b.min_q_len == 1) {
    using T = Tile<DK, DV, RWD, kVInK>;
    const int64_t tiles = (static_cast<int64_t>(p.group) + T::kRows - 1) / T::kRows;
    const dim3 grid(static_cast<unsigned>(p.max_splits), static_cast<unsigned>(tiles),
                    static_cast<unsigned>(p.n_head_kv * b.n_seqs));
    launch(attn_kernel<DK, DV, RWD, kVInK, true, float>, grid, T::kBytes, p, stream);
    const dim3 cgrid(static_cast<unsigned>(p.n_head), static_cast<unsigned>(b.n_seqs));
    if (out_type == AttnOut::kF32)
      launch(combine_kernel<float>, cgrid, 0, p, stream);
    else
      launch(combine_kernel<__nv_bfloat16>, cgrid, 0, p, stream);
  }
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// Checks shared by GQA and MLA. `fn` prefixes every message; dv sizes the workspace.
void validate_common(const char* fn, const AttnBatch& b, const void* q, const void* out,
                     AttnOut out_type, int32_t n_head, int32_t n_head_kv, int32_t dv,
                     int64_t num_slots, int32_t block_size, const void* workspace,
                     size_t workspace_bytes) {
  if (b.n_seqs < 0) TROUPE_INPUT_ERROR("%s: batch.n_seqs %d is negative", fn, b.n_seqs);
  if (b.n_seqs == 0) return;
  if (b.n_seqs > 65535) TROUPE_INPUT_ERROR("%s: batch.n_seqs %d exceeds 65535", fn, b.n_seqs);
  if (!q || !out) TROUPE_INPUT_ERROR("%s: q and out must be device pointers, got null", fn);
  if (!b.q_start || !b.q_len || !b.pos0 || !b.block_table)
    TROUPE_INPUT_ERROR("%s: batch.q_start, q_len, pos0 and block_table must be device arrays", fn);
  if (out_type != AttnOut::kBf16 && out_type != AttnOut::kF32)
    TROUPE_INPUT_ERROR("%s: out_type %d is not kBf16 or kF32", fn, static_cast<int>(out_type));
  if (n_head < 1) TROUPE_INPUT_ERROR("%s: n_head %d must be >= 1", fn, n_head);
  if (static_cast<int64_t>(n_head_kv) * b.n_seqs > 65535)
    TROUPE_INPUT_ERROR("%s: n_head_kv %d * n_seqs %d exceeds 65535 (decode grid)", fn, n_head_kv,
                       b.n_seqs);
  if (block_size < 1) TROUPE_INPUT_ERROR("%s: kv.block_size %d must be >= 1", fn, block_size);
  if (num_slots < 1)
    TROUPE_INPUT_ERROR("%s: kv.num_slots %lld must be >= 1", fn, static_cast<long long>(num_slots));
  if (b.max_q_len < 1 || b.min_q_len < 1 || b.min_q_len > b.max_q_len)
    TROUPE_INPUT_ERROR("%s: batch q_len bounds [%d, %d] must satisfy 1 <= min_q_len <= max_q_len",
                       fn, b.min_q_len, b.max_q_len);
  if (b.n_tok < b.max_q_len || b.n_tok < b.n_seqs)
    TROUPE_INPUT_ERROR("%s: batch.n_tok %lld is less than max_q_len %d or n_seqs %d", fn,
                       static_cast<long long>(b.n_tok), b.max_q_len, b.n_seqs);
  if (b.max_kv_len < b.max_q_len)
    TROUPE_INPUT_ERROR("%s: batch.max_kv_len %d is less than max_q_len %d", fn, b.max_kv_len,
                       b.max_q_len);
  if (b.max_blocks_per_seq < 1 ||
      static_cast<int64_t>(b.max_blocks_per_seq) * block_size < b.max_kv_len)
    TROUPE_INPUT_ERROR(
        "%s: block table rows of %d blocks of %d positions cannot hold max_kv_len %d", fn,
        b.max_blocks_per_seq, block_size, b.max_kv_len);
  if (static_cast<int64_t>(b.max_q_len) * n_head > std::numeric_limits<int32_t>::max())
    TROUPE_INPUT_ERROR("%s: max_q_len %d * n_head %d exceeds the prefill grid", fn, b.max_q_len,
                       n_head);
  if (b.min_q_len == 1) {
    const size_t need = paged_attention_workspace_bytes(b.n_seqs, n_head, dv, b.max_kv_len);
    if (!workspace || workspace_bytes < need)
      TROUPE_INPUT_ERROR("%s: split-K workspace of %zu bytes at %p is too small: %zu needed", fn,
                         workspace_bytes, workspace, need);
    if (!aligned16(workspace))
      TROUPE_INPUT_ERROR("%s: workspace %p is not 16-byte aligned", fn, workspace);
  }
}

Params common_params(const AttnBatch& b, int32_t n_head, void* out, void* workspace, int32_t dv) {
  Params p{};
  p.n_head = n_head;
  p.q_start = b.q_start;
  p.q_len = b.q_len;
  p.pos0 = b.pos0;
  p.block_table = b.block_table;
  p.max_blocks = b.max_blocks_per_seq;
  p.n_seqs = b.n_seqs;
  p.n_tok = b.n_tok;
  p.out = out;
  p.dv = dv;
  p.out_tok_stride = static_cast<int64_t>(n_head) * dv;
  p.max_splits = static_cast<int32_t>(max_splits_for(b.max_kv_len));
  if (b.min_q_len == 1) {
    p.ws_o = static_cast<float*>(workspace);
    p.ws_ml = p.ws_o + static_cast<int64_t>(b.n_seqs) * p.max_splits * n_head * dv;
  }
  return p;
}

}  // namespace

int32_t attention_decode_chunk(int32_t kv_len) {
  return static_cast<int32_t>(decode_chunk(kv_len));
}

size_t paged_attention_workspace_bytes(int32_t n_seqs, int32_t n_head, int32_t head_dim_v,
                                       int32_t max_kv_len) {
  if (n_seqs <= 0 || n_head <= 0 || head_dim_v <= 0) return 0;
  const size_t rows = static_cast<size_t>(n_seqs) *
                      static_cast<size_t>(max_splits_for(max_kv_len)) * static_cast<size_t>(n_head);
  return rows * (static_cast<size_t>(head_dim_v) + 2) * sizeof(float);
}

void validate_attention_args(const AttnArgs& a) {
  const char* fn = "paged_attention";
  if (a.batch.n_seqs == 0) return;
  if (!a.kv.k || !a.kv.v) TROUPE_INPUT_ERROR("%s: kv.k and kv.v must be device pointers", fn);
  if (a.kv.head_dim < 1 || a.kv.head_dim > kMaxHeadDim)
    TROUPE_INPUT_ERROR("%s: kv.head_dim %d is outside 1..%d", fn, a.kv.head_dim, kMaxHeadDim);
  if (a.kv.n_head_kv < 1 || a.n_head < 1 || a.n_head % a.kv.n_head_kv != 0)
    TROUPE_INPUT_ERROR("%s: n_head %d is not a positive multiple of kv.n_head_kv %d", fn, a.n_head,
                       a.kv.n_head_kv);
  if (!(a.scale >= 0.f) || !std::isfinite(a.scale))
    TROUPE_INPUT_ERROR("%s: scale %g must be finite and >= 0 (0: 1/sqrt(head_dim))", fn,
                       static_cast<double>(a.scale));
  validate_common(fn, a.batch, a.q, a.out, a.out_type, a.n_head, a.kv.n_head_kv, a.kv.head_dim,
                  a.kv.num_slots, a.kv.block_size, a.workspace, a.workspace_bytes);
}

void validate_attention_mla_args(const AttnMlaArgs& a) {
  const char* fn = "paged_attention_mla";
  if (a.batch.n_seqs == 0) return;
  if (!a.kv.kv) TROUPE_INPUT_ERROR("%s: kv.kv must be a device pointer", fn);
  if (a.kv.kv_lora_rank < 1 || a.kv.kv_lora_rank > kMaxLoraRank)
    TROUPE_INPUT_ERROR("%s: kv.kv_lora_rank %d is outside 1..%d", fn, a.kv.kv_lora_rank,
                       kMaxLoraRank);
  if (a.kv.rope_dim < 0 || a.kv.rope_dim > kMaxRopeDim)
    TROUPE_INPUT_ERROR("%s: kv.rope_dim %d is outside 0..%d", fn, a.kv.rope_dim, kMaxRopeDim);
  if (!(a.scale > 0.f) || !std::isfinite(a.scale))
    TROUPE_INPUT_ERROR("%s: scale %g must be finite and > 0 (1/sqrt(qk_nope_dim + qk_rope_dim))",
                       fn, static_cast<double>(a.scale));
  validate_common(fn, a.batch, a.q, a.out, a.out_type, a.n_head, 1, a.kv.kv_lora_rank,
                  a.kv.num_slots, a.kv.block_size, a.workspace, a.workspace_bytes);
}

void paged_attention(const AttnArgs& a, cudaStream_t stream) {
  validate_attention_args(a);
  if (a.batch.n_seqs == 0) return;
  const int32_t hd = a.kv.head_dim;
  Params p = common_params(a.batch, a.n_head, a.out, a.workspace, hd);
  p.q = a.q;
  p.q_tok_stride = static_cast<int64_t>(a.n_head) * hd;
  p.dk = hd;
  p.n_head_kv = a.kv.n_head_kv;
  p.group = a.n_head / a.kv.n_head_kv;
  p.k = a.kv.k;
  p.v = a.kv.v;
  p.k_slot_stride = p.v_slot_stride = static_cast<int64_t>(a.kv.n_head_kv) * hd;
  p.k_head_stride = p.v_head_stride = hd;
  p.num_slots = a.kv.num_slots;
  p.block_size = a.kv.block_size;
  const float scale = a.scale > 0.f ? a.scale : 1.f / std::sqrt(static_cast<float>(hd));
  p.scale_log2 = scale * kLog2e;
  p.vec_q = hd % 8 == 0 && aligned16(a.q);
  p.vec_kv = hd % 8 == 0 && aligned16(a.kv.k) && aligned16(a.kv.v);
  const AttnBatch& b = a.batch;
  if (hd <= 8) {
    run_attention<8, 8, 8, 2, false>(p, b, a.out_type, stream);
  } else if (hd <= 16) {
    run_attention<16, 16, 8, 2, false>(p, b, a.out_type, stream);
  } else if (hd <= 32) {
    run_attention<32, 32, 8, 2, false>(p, b, a.out_type, stream);
  } else if (hd <= 64) {
    run_attention<64, 64, 8, 2, false>(p, b, a.out_type, stream);
  } else if (hd <= 128) {
    run_attention<128, 128, 8, 2, false>(p, b, a.out_type, stream);
  } else {
    run_attention<256, 256, 4, 2, false>(p, b, a.out_type, stream);
  }
}

void paged_attention_mla(const AttnMlaArgs& a, cudaStream_t stream) {
  validate_attention_mla_args(a);
  if (a.batch.n_seqs == 0) return;
  const int32_t lora = a.kv.kv_lora_rank;
  const int32_t kw = lora + a.kv.rope_dim;
  Params p = common_params(a.batch, a.n_head, a.out, a.workspace, lora);
  p.q = a.q;
  p.q_tok_stride = static_cast<int64_t>(a.n_head) * kw;
  p.dk = kw;
  p.n_head_kv = 1;
  p.group = a.n_head;
  p.k = a.kv.kv;
  p.v = a.kv.kv;  // V = the latent part of the same rows; the kernel reads it from the K tile
  p.k_slot_stride = p.v_slot_stride = kw;
  p.k_head_stride = p.v_head_stride = 0;
  p.num_slots = a.kv.num_slots;
  p.block_size = a.kv.block_size;
  p.scale_log2 = a.scale * kLog2e;
  p.vec_q = kw % 8 == 0 && aligned16(a.q);
  p.vec_kv = kw % 8 == 0 && aligned16(a.kv.kv);
  const AttnBatch& b = a.batch;
  // Template widths: V = lora padded, K = V + 64 (rope_dim <= 64); padding columns are zero in
  // Q and K, and V's padding columns (rope values) only feed outputs that are never written.
  if (lora <= 32) {
    run_attention<96, 32, 8, 4, true>(p, b, a.out_type, stream);
  } else if (lora <= 64) {
    run_attention<128, 64, 8, 4, true>(p, b, a.out_type, stream);
  } else if (lora <= 128) {
    run_attention<192, 128, 8, 4, true>(p, b, a.out_type, stream);
  } else if (lora <= 256) {
    run_attention<320, 256, 4, 4, true>(p, b, a.out_type, stream);
  } else {
    run_attention<576, 512, 2, 4, true>(p, b, a.out_type, stream);
  }
}

}  // namespace troupe::gpu
