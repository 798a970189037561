// Kernels and host launchers of gpu/sample.h. The device code follows compute/sampler.cc step
// by step (names in comments refer to it); see sample.h for why each sum is exact or ordered.
// Block-wide control flow is uniform: every branch that contains a barrier depends only on values
// all threads of the block share (row parameters, block reductions, shared-memory broadcasts).
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "base/check.h"
#include "base/rng.h"
#include "gpu/runtime.h"
#include "gpu/sample.h"

namespace troupe::gpu {
namespace {

constexpr unsigned kFullMask = 0xFFFFFFFFu;
constexpr int kThreads = 512;  // one block per row
constexpr int kWarps = kThreads / 32;
constexpr int kNumBuckets = 88 * 32 + 1;  // sampler.cc: kMaxNats * kBucketsPerNat + 1
constexpr int kTile = 2048;               // positions per tile of the sequential walks
constexpr int kMaxTiles = static_cast<int>(kMaxSampleVocab / kTile);
constexpr int kSmemSort = 2048;  // keys sorted in shared memory; more sort in the workspace
constexpr int kEdgeLinear = 64;  // sampler.cc nucleus_edge: ranges this small are walked
constexpr uint64_t kPadKey = ~uint64_t{0};  // sorts after every real key
constexpr float kInf = std::numeric_limits<float>::infinity();

static_assert(kMaxSampleVocab % kTile == 0);
static_assert(kTile % 32 == 0 && kThreads % 32 == 0);

// Shared memory of one block. The union's members live in different phases of a row: the top-p
// bucket histogram, then the radix-select counts (top-k), then the walks' tiles and checkpoints.
struct WalkSmem {
  float tile[kTile];       // weights of positions [t * kTile, (t + 1) * kTile)
  double ckpt[kMaxTiles];  // running sum after each tile
};
union PhaseSmem {
  double hist[kNumBuckets];
  unsigned int radix[256];
  WalkSmem walk;
};
struct SampleSmem {
  PhaseSmem u;
  uint64_t sort[kSmemSort];
  unsigned long long red[kWarps];  // reduction scratch (bit patterns of the reduced type)
  unsigned long long bcast;        // broadcast slot
  unsigned int counter;            // gather counter
};

__device__ __forceinline__ int tid() { return static_cast<int>(threadIdx.x); }
__device__ __forceinline__ int lane() { return static_cast<int>(threadIdx.x) & 31; }
__device__ __forceinline__ int warp_idx() { return static_cast<int>(threadIdx.x) >> 5; }

// ---- value helpers (sampler.cc) ----

// prepare(): NaN logits become -inf.
__device__ __forceinline__ float clean(float v) { return v != v ? -kInf : v; }

// order_key(): float bits -> int32 with the same order (self-inverse); -0 sorts below +0.
__device__ __forceinline__ int32_t order_key(int32_t bits) {
  return bits ^ ((bits >> 31) & 0x7FFFFFFF);
}

// exp_nonpos(), operation for operation (the __f*_rn forms keep nvcc from fusing into FMAs).
__device__ __forceinline__ float exp_nonpos(float x) {
  constexpr uint32_t kMinus87Bits = 0xC2AE0000u;
  const uint32_t bits = __float_as_uint(x);
  const uint32_t keep = static_cast<uint32_t>(bits > kMinus87Bits) - 1u;
  const float xc = __uint_as_float((bits & keep) | (kMinus87Bits & ~keep));
  constexpr float kLog2e = 1.44269504f;
  constexpr float kRound = 12582912.0f;
  const float n = __fsub_rn(__fadd_rn(__fmul_rn(xc, kLog2e), kRound), kRound);
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  const float r = __fsub_rn(__fsub_rn(xc, __fmul_rn(n, kLn2Hi)), __fmul_rn(n, kLn2Lo));
  float p = 1.0f / 720;
  p = __fadd_rn(__fmul_rn(p, r), 1.0f / 120);
  p = __fadd_rn(__fmul_rn(p, r), 1.0f / 24);
  p = __fadd_rn(__fmul_rn(p, r), 1.0f / 6);
  p = __fadd_rn(__fmul_rn(p, r), 0.5f);
  p = __fadd_rn(__fmul_rn(p, r), 1.0f);
  p = __fadd_rn(__fmul_rn(p, r), 1.0f);
  const uint32_t scale_bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  const float y = __fmul_rn(p, __uint_as_float(scale_bits));
  return __uint_as_float(__float_as_uint(y) & keep);
}

// logit_bucket(): 1/32 nat per bucket below the maximum, everything at 88 nats or more last.
__device__ __forceinline__ int logit_bucket(float max_logit, float v) {
  float d = __fsub_rn(max_logit, v);
  if (88.0f < d) d = 88.0f;  // std::min(d, 88.f)
  return static_cast<int>(__fmul_rn(d, 32.0f));
}

// Draw-order key: smaller = better() (higher logit, then lower id); +0 and -0 are one logit as
// in better()'s float comparisons. Unique per token; never kPadKey (that would be a NaN logit).
__device__ __forceinline__ uint64_t rank_key(float v, int64_t id) {
  uint32_t b = __float_as_uint(v);
  if ((b & 0x7FFFFFFFu) == 0) b = 0;
  const uint32_t ascending = (b & 0x80000000u) != 0 ? ~b : (b | 0x80000000u);
  return (static_cast<uint64_t>(~ascending) << 32) | static_cast<uint32_t>(id);
}
__device__ __forceinline__ float key_logit(uint64_t key) {
  const uint32_t ascending = ~static_cast<uint32_t>(key >> 32);
  return __uint_as_float((ascending & 0x80000000u) != 0 ? (ascending & 0x7FFFFFFFu) : ~ascending);
}
__device__ __forceinline__ int32_t key_id(uint64_t key) {
  return static_cast<int32_t>(key & 0xFFFFFFFFu);
}

// ---- block-wide primitives (every thread of the block calls them; they end on a barrier) ----

// Thread 0's `v` to every thread.
template <class T>
__device__ T block_bcast(T v, SampleSmem& sh) {
  static_assert(sizeof(T) <= sizeof(unsigned long long));
  if (tid() == 0) {
    unsigned long long bits = 0;
    memcpy(&bits, &v, sizeof(T));
    sh.bcast = bits;
  }
  __syncthreads();
  const unsigned long long bits = sh.bcast;
  __syncthreads();
  T out;
  memcpy(&out, &bits, sizeof(T));
  return out;
}

__device__ __forceinline__ unsigned long long min_u64(unsigned long long a, unsigned long long b) {
  return a < b ? a : b;
}

// Minimum over the block (order-free).
__device__ unsigned long long block_min_u64(unsigned long long v, unsigned long long* red) {
  for (int off = 16; off > 0; off >>= 1) v = min_u64(v, __shfl_xor_sync(kFullMask, v, off));
  if (lane() == 0) red[warp_idx()] = v;
  __syncthreads();
  unsigned long long r = red[0];
  for (int w = 1; w < kWarps; ++w) r = min_u64(r, red[w]);
  __syncthreads();
  return r;
}

// Maximum over the block (order-free).
__device__ int32_t block_max_i32(int32_t v, SampleSmem& sh) {
  for (int off = 16; off > 0; off >>= 1) v = max(v, __shfl_xor_sync(kFullMask, v, off));
  if (lane() == 0) sh.red[warp_idx()] = static_cast<unsigned long long>(static_cast<uint32_t>(v));
  __syncthreads();
  int32_t r = static_cast<int32_t>(static_cast<uint32_t>(sh.red[0]));
  for (int w = 1; w < kWarps; ++w)
    r = max(r, static_cast<int32_t>(static_cast<uint32_t>(sh.red[w])));
  __syncthreads();
  return r;
}

// Sum over the block in a fixed tree. Used only where every partial sum is exact (one top-p
// bucket), so the tree's order cannot show.
__device__ double block_sum_exact(double v, SampleSmem& sh) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kFullMask, v, off);
  if (lane() == 0) sh.red[warp_idx()] = static_cast<unsigned long long>(__double_as_longlong(v));
  __syncthreads();
  double r = __longlong_as_double(static_cast<long long>(sh.red[0]));
  for (int w = 1; w < kWarps; ++w) r += __longlong_as_double(static_cast<long long>(sh.red[w]));
  __syncthreads();
  return r;
}

// Number of i in [0, n) with pred(i).
template <class Pred>
__device__ int64_t block_count(int64_t n, const Pred& pred) {
  int64_t total = 0;
  for (int64_t base = 0; base < n; base += kThreads) {
    const int64_t i = base + tid();
    total += __syncthreads_count(i < n && pred(i));
  }
  return total;
}

// Ascending bitonic sort of a[0, n2), n2 a power of two, in shared or global memory (the
// barrier orders both for the block). Each compare-exchange pair (i, i ^ j) belongs to the
// thread with the smaller index, so no two threads write one element in a stage.
__device__ void bitonic_sort(uint64_t* a, int64_t n2) {
  for (int64_t k = 2; k <= n2; k <<= 1) {
    for (int64_t j = k >> 1; j > 0; j >>= 1) {
      for (int64_t i = tid(); i < n2; i += kThreads) {
        const int64_t ixj = i ^ j;
        if (ixj > i) {
          const uint64_t ai = a[i], aj = a[ixj];
          const bool up = (i & k) == 0;
          if (up ? ai > aj : ai < aj) {
            a[i] = aj;
            a[ixj] = ai;
          }
        }
      }
      __syncthreads();
    }
  }
}

// Sorts ws[0, m) ascending (draw order). REQUIRES: ws holds next_pow2(m) elements.
__device__ void sort_keys(uint64_t* ws, int64_t m, SampleSmem& sh) {
  int64_t n2 = 1;
  while (n2 < m) n2 <<= 1;
  if (n2 <= kSmemSort) {
    for (int64_t i = tid(); i < n2; i += kThreads) sh.sort[i] = i < m ? ws[i] : kPadKey;
    __syncthreads();
    bitonic_sort(sh.sort, n2);
    for (int64_t i = tid(); i < m; i += kThreads) ws[i] = sh.sort[i];
  } else {
    for (int64_t i = m + tid(); i < n2; i += kThreads) ws[i] = kPadKey;
    __syncthreads();
    bitonic_sort(ws, n2);
  }
  __syncthreads();
}

// ---- the sequential walks: the CPU's left-to-right double sums over the draw order ----
// weight(pos) for pos in [0, len) is the f32 weight of the survivor at draw position pos (0 for
// a position that is not a survivor: adding +0.0 leaves a non-negative double unchanged, which
// is why the CPU's skipped and zero-weight tokens and our non-survivors all agree). Warp 0 adds
// the weights of one 32-position chunk one by one (shuffles, unrolled); chunks without a
// positive weight are skipped. The whole block computes each tile's weights first.

// Fills the tile of positions [base, base + kTile) (0 beyond len).
template <class WeightFn>
__device__ void fill_tile(const WeightFn& weight, int64_t base, int64_t len, SampleSmem& sh) {
  for (int j = tid(); j < kTile; j += kThreads) {
    const int64_t pos = base + j;
    sh.u.walk.tile[j] = pos < len ? weight(pos) : 0.0f;
  }
  __syncthreads();
}

struct WalkTotal {
  double total;      // sum of all weights, left to right
  int64_t last_pos;  // last position with a positive weight; -1 if none
};

// Pass 1: the total, and the running sum after every tile (sh.u.walk.ckpt) for walk_find.
// REQUIRES len <= kMaxSampleVocab.
template <class WeightFn>
__device__ WalkTotal walk_total(const WeightFn& weight, int64_t len, SampleSmem& sh) {
  const int64_t num_tiles = (len + kTile - 1) / kTile;
  double cum = 0;     // warp 0's running sum (identical in its lanes)
  int64_t last = -1;  // warp 0
  for (int64_t t = 0; t < num_tiles; ++t) {
    const int64_t base = t * kTile;
    fill_tile(weight, base, len, sh);
    if (warp_idx() == 0) {
      for (int c = 0; c < kTile; c += 32) {
        const float w = sh.u.walk.tile[c + lane()];
        const unsigned mask = __ballot_sync(kFullMask, w > 0.0f);
        if (mask == 0) continue;
#pragma unroll
        for (int j = 0; j < 32; ++j)
          cum = __dadd_rn(cum, static_cast<double>(__shfl_sync(kFullMask, w, j)));
        last = base + c + (31 - __clz(static_cast<int>(mask)));
      }
      if (lane() == 0) sh.u.walk.ckpt[t] = cum;
    }
    __syncthreads();
  }
  WalkTotal out;
  out.total = block_bcast(cum, sh);
  out.last_pos = block_bcast(last, sh);
  return out;
}

// Pass 2: the first position whose running sum is > target (strict) or >= target; -1 if none.
// REQUIRES walk_total(weight, len) just ran (its checkpoints are intact). The position found
// always has a positive weight: the running sum only changes there.
template <class WeightFn>
__device__ int64_t walk_find(const WeightFn& weight, int64_t len, double target, bool strict,
                             SampleSmem& sh) {
  const int64_t num_tiles = (len + kTile - 1) / kTile;
  const auto passes = [&](double cum) { return strict ? cum > target : cum >= target; };
  int64_t tile = -1;  // the first tile whose end sum passes (the sums never decrease)
  if (warp_idx() == 0) {
    for (int64_t t0 = 0; t0 < num_tiles; t0 += 32) {
      const int64_t t = t0 + lane();
      const unsigned mask = __ballot_sync(kFullMask, t < num_tiles && passes(sh.u.walk.ckpt[t]));
      if (mask != 0) {
        tile = t0 + __ffs(static_cast<int>(mask)) - 1;
        break;
      }
    }
  }
  tile = block_bcast(tile, sh);
  if (tile < 0) return -1;
  const int64_t base = tile * kTile;
  fill_tile(weight, base, len, sh);
  int64_t found = -1;
  if (warp_idx() == 0) {
    double cum = tile == 0 ? 0.0 : sh.u.walk.ckpt[tile - 1];
    for (int c = 0; c < kTile && found < 0; c += 32) {
      const float w = sh.u.walk.tile[c + lane()];
      if (__ballot_sync(kFullMask, w > 0.0f) == 0) continue;
      for (int j = 0; j < 32; ++j) {
        cum = __dadd_rn(cum, static_cast<double>(__shfl_sync(kFullMask, w, j)));
        if (passes(cum)) {
          found = base + c + j;
          break;
        }
      }
    }
  }
  return block_bcast(found, sh);
}

// sample() steps 7-8 on a walk: target = u * total; the first survivor whose running sum
// exceeds it, else the last positive one (u * total rounded up to the total).
template <class WeightFn>
__device__ int64_t draw_position(const WeightFn& weight, int64_t len, double u, SampleSmem& sh) {
  const WalkTotal t = walk_total(weight, len, sh);
  const int64_t pos = walk_find(weight, len, __dmul_rn(u, t.total), /*strict=*/true, sh);
  return pos >= 0 ? pos : t.last_pos;
}

// ---- the cases of Sampler::truncate() ----

// Greedy: argmax(), ties to the lowest id; NaN is -inf.
__device__ int32_t greedy_token(const float* x, int64_t n, unsigned long long* red) {
  unsigned long long best = kPadKey;
  for (int64_t i = tid(); i < n; i += kThreads) best = min_u64(best, rank_key(clean(x[i]), i));
  return key_id(block_min_u64(best, red));
}

// max_logit == +inf: the +inf tokens in id order, equally likely, cut by top-k (first k by id)
// and top-p (the first ceil(top_p * count) of them); min-p does not apply (truncate() returns
// first). Every running sum is a small integer, so the pick is floor(u * m) (at most m - 1).
__device__ int32_t sample_inf(const float* x, int64_t n, const SampleRow& p, bool use_top_k,
                              bool use_top_p, SampleSmem& sh) {
  const auto is_inf = [&](int64_t i) { return x[i] == kInf; };
  const int64_t count = block_count(n, is_inf);
  int64_t m = use_top_k && count > p.top_k ? static_cast<int64_t>(p.top_k) : count;
  if (use_top_p) {
    const double target = __dmul_rn(static_cast<double>(p.top_p), static_cast<double>(m));
    int64_t keep = static_cast<int64_t>(ceil(target));
    if (keep < 1) keep = 1;
    if (keep < m) m = keep;
  }
  int64_t r = static_cast<int64_t>(floor(__dmul_rn(p.u, static_cast<double>(m))));
  if (r > m - 1) r = m - 1;
  // The r-th (from 0) +inf token in id order: the first id where the count of +inf tokens
  // so far exceeds r.
  const auto weight = [&](int64_t i) { return x[i] == kInf ? 1.0f : 0.0f; };
  walk_total(weight, n, sh);
  const int64_t pos = walk_find(weight, n, static_cast<double>(r), /*strict=*/true, sh);
  return static_cast<int32_t>(pos >= 0 ? pos : 0);
}

// The k-th smallest rank key (k from 1) among the finite logits, by radix select over 8-bit
// digits from the top. REQUIRES 1 <= k <= their count. Counts are integers: order-free.
__device__ uint64_t radix_select(const float* x, int64_t n, int64_t k, SampleSmem& sh) {
  uint64_t prefix = 0;
  int64_t k_rem = k;
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int j = tid(); j < 256; j += kThreads) sh.u.radix[j] = 0;
    __syncthreads();
    const uint64_t hi_mask = shift == 56 ? 0 : (~uint64_t{0} << (shift + 8));
    for (int64_t i = tid(); i < n; i += kThreads) {
      const float v = clean(x[i]);
      if (v == -kInf) continue;
      const uint64_t key = rank_key(v, i);
      if ((key & hi_mask) == prefix) atomicAdd(&sh.u.radix[(key >> shift) & 255u], 1u);
    }
    __syncthreads();
    uint64_t next_prefix = 0;
    int64_t next_k = 0;
    if (tid() == 0) {
      int64_t before = 0;
      int d = 0;
      for (; d < 255; ++d) {
        const int64_t c = sh.u.radix[d];
        if (before + c >= k_rem) break;
        before += c;
      }
      next_prefix = prefix | (static_cast<uint64_t>(d) << shift);
      next_k = k_rem - before;
    }
    prefix = block_bcast(next_prefix, sh);
    k_rem = block_bcast(next_k, sh);
  }
  return prefix;
}

// Appends the rank keys of the tokens i < n with pred(i, v) (v = the cleaned logit) to ws, in
// no particular order; returns how many. The caller sorts them.
template <class Pred>
__device__ int64_t gather_keys(const float* x, int64_t n, const Pred& pred, uint64_t* ws,
                               SampleSmem& sh) {
  if (tid() == 0) sh.counter = 0;
  __syncthreads();
  for (int64_t i = tid(); i < n; i += kThreads) {
    const float v = clean(x[i]);
    if (pred(i, v)) ws[atomicAdd(&sh.counter, 1u)] = rank_key(v, i);
  }
  __syncthreads();
  const int64_t count = sh.counter;
  __syncthreads();
  return count;
}

// top-k (select_top), then top-p on the sorted survivors (cut_top_p_sorted), then min-p
// (cut_min_p), then the draw in rank order.
__device__ int32_t sample_top_k(const float* x, int64_t n, const SampleRow& p, float max_logit,
                                bool use_top_p, uint64_t* ws, SampleSmem& sh) {
  const int64_t k = p.top_k;
  const int64_t finite = block_count(n, [&](int64_t i) { return clean(x[i]) != -kInf; });
  const uint64_t threshold = finite > k ? radix_select(x, n, k, sh) : kPadKey;
  const int64_t m0 = gather_keys(
      x, n, [&](int64_t i, float v) { return v != -kInf && rank_key(v, i) <= threshold; }, ws, sh);
  sort_keys(ws, m0, sh);
  int64_t m = m0;
  if (use_top_p) {
    const float front = key_logit(ws[0]);
    const auto weight = [&](int64_t pos) {
      return exp_nonpos(__fsub_rn(key_logit(ws[pos]), front));
    };
    const WalkTotal z = walk_total(weight, m0, sh);
    const double target = __dmul_rn(static_cast<double>(p.top_p), z.total);
    const int64_t cut = walk_find(weight, m0, target, /*strict=*/false, sh);
    if (cut >= 0) m = cut + 1;
  }
  if (p.log_min_p > -kInf) {  // the survivors are a prefix: logits fall along the rank order
    const int64_t mm = m;
    m = block_count(
        mm, [&](int64_t pos) { return __fsub_rn(key_logit(ws[pos]), max_logit) >= p.log_min_p; });
  }
  const auto weight = [&](int64_t pos) {
    return exp_nonpos(__fdiv_rn(__fsub_rn(key_logit(ws[pos]), max_logit), p.temperature));
  };
  const int64_t pos = draw_position(weight, m, p.u, sh);
  return key_id(ws[pos >= 0 ? pos : 0]);
}

// top-p without top-k (select_nucleus), then min-p, then the draw in id order.
__device__ int32_t sample_nucleus(const float* x, int64_t n, const SampleRow& p, float max_logit,
                                  uint64_t* ws, SampleSmem& sh) {
  // Mass per bucket. Each bucket's f32 weights lie within a factor e^(1/32) of each other (two
  // binades at most), so with fewer than 2^28 of them every partial sum is exact in double:
  // the order of the atomic adds cannot change a bit.
  for (int j = tid(); j < kNumBuckets; j += kThreads) sh.u.hist[j] = 0.0;
  __syncthreads();
  for (int64_t i = tid(); i < n; i += kThreads) {
    const float v = clean(x[i]);
    const float w = exp_nonpos(__fsub_rn(v, max_logit));
    if (w > 0.0f) atomicAdd(&sh.u.hist[logit_bucket(max_logit, v)], static_cast<double>(w));
  }
  __syncthreads();
  // Warp 0, in bucket order as the CPU: z, the target, and the bucket where the nucleus ends.
  // A zero bucket changes neither sum, and never ends the nucleus (base + 0 < target holds
  // while scanning), so all-zero chunks are skipped.
  double target = 0, base = 0;
  int edge_bucket = kNumBuckets;
  if (warp_idx() == 0) {
    double z = 0;
    for (int c = 0; c < kNumBuckets; c += 32) {
      const double mass = c + lane() < kNumBuckets ? sh.u.hist[c + lane()] : 0.0;
      if (__ballot_sync(kFullMask, mass != 0.0) == 0) continue;
#pragma unroll
      for (int j = 0; j < 32; ++j) z = __dadd_rn(z, __shfl_sync(kFullMask, mass, j));
    }
    target = __dmul_rn(static_cast<double>(p.top_p), z);
    for (int c = 0; c < kNumBuckets && edge_bucket == kNumBuckets; c += 32) {
      const double mass = c + lane() < kNumBuckets ? sh.u.hist[c + lane()] : 0.0;
      if (__ballot_sync(kFullMask, mass != 0.0) == 0) continue;
      for (int j = 0; j < 32; ++j) {
        const double mj = __shfl_sync(kFullMask, mass, j);
        if (!(__dadd_rn(base, mj) < target)) {
          edge_bucket = c + j;
          break;
        }
        base = __dadd_rn(base, mj);
      }
    }
  }
  target = block_bcast(target, sh);
  base = block_bcast(base, sh);
  edge_bucket = block_bcast(edge_bucket, sh);
  // The nucleus' last token (nucleus_edge): sort the edge bucket by rank, then replay the
  // CPU's weighted quickselect. Its halves are rank intervals of the sorted bucket whatever
  // nth_element's arrangement, and their masses are exact, so each decision is the CPU's.
  const auto top_p_weight = [&](float v) { return exp_nonpos(__fsub_rn(v, max_logit)); };
  uint64_t edge_key = kPadKey;  // edge_bucket == kNumBuckets: every token with weight survives
  if (edge_bucket < kNumBuckets) {
    const int64_t count = gather_keys(
        x, n,
        [&](int64_t, float v) {
          return top_p_weight(v) > 0.0f && logit_bucket(max_logit, v) == edge_bucket;
        },
        ws, sh);
    sort_keys(ws, count, sh);
    int64_t lo = 0, hi = count;
    while (hi - lo > kEdgeLinear) {
      const int64_t mid = lo + (hi - lo) / 2;
      double part = 0;
      for (int64_t pos = lo + tid(); pos < mid; pos += kThreads)
        part += static_cast<double>(top_p_weight(key_logit(ws[pos])));
      const double left = block_sum_exact(part, sh);
      if (__dadd_rn(base, left) >= target) {
        hi = mid;
      } else {
        base = __dadd_rn(base, left);
        lo = mid;
      }
    }
    int64_t edge_pos = hi - 1;
    if (warp_idx() == 0) {
      double cum = base;
      bool done = false;
      for (int64_t c0 = lo; c0 < hi && !done; c0 += 32) {
        const int64_t pos = c0 + lane();
        const float w = pos < hi ? top_p_weight(key_logit(ws[pos])) : 0.0f;
        for (int j = 0; j < 32 && c0 + j < hi; ++j) {
          cum = __dadd_rn(cum, static_cast<double>(__shfl_sync(kFullMask, w, j)));
          if (cum >= target) {
            edge_pos = c0 + j;
            done = true;
            break;
          }
        }
      }
    }
    edge_pos = block_bcast(edge_pos, sh);
    edge_key = ws[edge_pos];
    __syncthreads();  // ws is rewritten by nothing below, but keep phases separated
  }
  const auto weight = [&](int64_t i) {
    const float v = clean(x[i]);
    if (!(top_p_weight(v) > 0.0f)) return 0.0f;
    const int b = logit_bucket(max_logit, v);
    if (b > edge_bucket || (b == edge_bucket && rank_key(v, i) > edge_key)) return 0.0f;
    const float d = __fsub_rn(v, max_logit);
    if (!(d >= p.log_min_p)) return 0.0f;
    return exp_nonpos(__fdiv_rn(d, p.temperature));
  };
  return static_cast<int32_t>(draw_position(weight, n, p.u, sh));
}

// No top-k or top-p: the min-p survivors (or every token above -inf) in id order.
__device__ int32_t sample_plain(const float* x, int64_t n, const SampleRow& p, float max_logit,
                                SampleSmem& sh) {
  const auto weight = [&](int64_t i) {
    const float v = clean(x[i]);
    const float d = __fsub_rn(v, max_logit);
    if (v == -kInf || !(d >= p.log_min_p)) return 0.0f;
    return exp_nonpos(__fdiv_rn(d, p.temperature));
  };
  return static_cast<int32_t>(draw_position(weight, n, p.u, sh));
}

__device__ int32_t sample_row(const float* x, int64_t n, const SampleRow& p, uint64_t* ws,
                              SampleSmem& sh) {
  if (!(p.temperature > 0.0f)) return greedy_token(x, n, sh.red);
  // max_of(): the largest order key (NaN already -inf).
  int32_t best = order_key(static_cast<int32_t>(__float_as_uint(-kInf)));
  for (int64_t i = tid(); i < n; i += kThreads)
    best = max(best, order_key(static_cast<int32_t>(__float_as_uint(clean(x[i])))));
  const float max_logit = __int_as_float(order_key(block_max_i32(best, sh)));
  if (max_logit == -kInf) return 0;
  const bool use_top_k = p.top_k > 0 && p.top_k < n;
  const bool use_top_p = p.top_p < 1.0f;
  if (max_logit == kInf) return sample_inf(x, n, p, use_top_k, use_top_p, sh);
  if (use_top_k) return sample_top_k(x, n, p, max_logit, use_top_p, ws, sh);
  if (use_top_p) return sample_nucleus(x, n, p, max_logit, ws, sh);
  return sample_plain(x, n, p, max_logit, sh);
}

// ---- kernels ----

// Thread mapping: one block of kThreads per row (blockIdx.x), rows independent.
__global__ void __launch_bounds__(kThreads)
    argmax_kernel(const float* logits, int64_t n_vocab, int32_t* tokens) {
  __shared__ unsigned long long red[kWarps];
  const int64_t r = blockIdx.x;
  const int32_t tok = greedy_token(logits + r * n_vocab, n_vocab, red);
  if (tid() == 0) tokens[r] = tok;
}

// Thread mapping: block b samples rows b, b + gridDim.x, ... with kThreads threads each, using
// workspace slice b (ws_per_row uint64). Each row is computed from its logits and SampleRow
// alone: the slice and the grid size do not change any result.
__global__ void __launch_bounds__(kThreads)
    sample_kernel(const float* logits, int64_t num_rows, int64_t n_vocab, const SampleRow* rows,
                  uint64_t* workspace, int64_t ws_per_row, int32_t* tokens) {
  __shared__ SampleSmem sh;
  uint64_t* ws = workspace + static_cast<int64_t>(blockIdx.x) * ws_per_row;
  for (int64_t r = blockIdx.x; r < num_rows; r += gridDim.x) {
    const SampleRow p = rows[r];
    const int32_t tok = sample_row(logits + r * n_vocab, n_vocab, p, ws, sh);
    if (tid() == 0) tokens[r] = tok;
    __syncthreads();  // the next row reuses shared memory and the workspace
  }
}

#define SAMPLE_REQUIRE(cond, ...)      \
  do {                                 \
    if (!(cond)) [[unlikely]]          \
      TROUPE_INPUT_ERROR(__VA_ARGS__); \
  } while (0)

long long ll(int64_t v) { return static_cast<long long>(v); }

void check_shape(const char* what, int64_t num_rows, int64_t n_vocab) {
  SAMPLE_REQUIRE(num_rows >= 0 && num_rows <= INT_MAX, "%s: num_rows must be in [0, %d], got %lld",
                 what, INT_MAX, ll(num_rows));
  SAMPLE_REQUIRE(n_vocab >= 1 && n_vocab <= kMaxSampleVocab,
                 "%s: n_vocab must be in [1, %lld], got %lld", what, ll(kMaxSampleVocab),
                 ll(n_vocab));
}

}  // namespace

bool gpu_sampler_supports(const compute::SamplingParams& params) {
  const bool penalties = params.repetition_penalty != 1 || params.presence_penalty != 0 ||
                         params.frequency_penalty != 0;
  return params.penalty_last_n == 0 || !penalties;
}

double draw_uniform(compute::SamplerState& state) {
  return static_cast<double>(xoshiro256ss_next(state.s) >> 11) * 0x1.0p-53;
}

SampleRow make_sample_row(const compute::SamplingParams& params, compute::SamplerState& state) {
  const Status ok = params.validate();
  if (!ok) TROUPE_INPUT_ERROR("make_sample_row: %s", ok.error().message.c_str());
  SAMPLE_REQUIRE(gpu_sampler_supports(params),
                 "make_sample_row: repetition/presence/frequency penalties are not supported on "
                 "the GPU (sample this request with compute::Sampler)");
  SAMPLE_REQUIRE(state.s[0] != 0 || state.s[1] != 0 || state.s[2] != 0 || state.s[3] != 0,
                 "make_sample_row: SamplerState is all zeros");
  SampleRow row;
  row.temperature = params.temperature;
  row.top_k = params.top_k;
  row.top_p = params.top_p;
  // Sampler::cut_min_p's std::log(float) is glibc's logf; call it by that name so that no
  // overload set of the CUDA headers can route this through another function.
  row.log_min_p = params.min_p > 0 ? ::logf(params.min_p) : -kInf;
  if (params.temperature > 0) row.u = draw_uniform(state);
  return row;
}

int64_t sample_workspace_per_row(int64_t n_vocab) {
  int64_t n2 = 1;
  while (n2 < n_vocab) n2 <<= 1;
  return n2;
}

void argmax_rows(const float* logits, int64_t num_rows, int64_t n_vocab, int32_t* tokens,
                 cudaStream_t stream) {
  check_shape("argmax_rows", num_rows, n_vocab);
  if (num_rows == 0) return;
  SAMPLE_REQUIRE(logits != nullptr && tokens != nullptr, "argmax_rows: null logits or tokens");
  argmax_kernel<<<static_cast<unsigned>(num_rows), kThreads, 0, stream>>>(logits, n_vocab, tokens);
  TROUPE_CUDA_CHECK_LAUNCH();
}

void sample_rows(const float* logits, int64_t num_rows, int64_t n_vocab, const SampleRow* rows,
                 uint64_t* workspace, int64_t workspace_elems, int32_t* tokens,
                 cudaStream_t stream) {
  check_shape("sample_rows", num_rows, n_vocab);
  const int64_t per_row = sample_workspace_per_row(n_vocab);
  SAMPLE_REQUIRE(workspace_elems >= per_row,
                 "sample_rows: workspace of %lld elements is smaller than one row's %lld",
                 ll(workspace_elems), ll(per_row));
  if (num_rows == 0) return;
  SAMPLE_REQUIRE(logits != nullptr && rows != nullptr && workspace != nullptr && tokens != nullptr,
                 "sample_rows: null logits, rows, workspace or tokens");
  const int64_t slots = workspace_elems / per_row;
  const int64_t blocks = slots < num_rows ? slots : num_rows;
  sample_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      logits, num_rows, n_vocab, rows, workspace, per_row, tokens);
  TROUPE_CUDA_CHECK_LAUNCH();
}

}  // namespace troupe::gpu
