// MoE kernels and their host launchers (see gpu/moe.h). Every kernel is deterministic: each
// output is written by one thread, and the only cross-thread combinations are integer sums,
// max/argmax with an exact tie rule, and ballot prefix counts — none depends on timing.
// Floating-point expressions that the CPU rounds step by step use __fmul_rn/__fadd_rn where nvcc
// could otherwise contract them into an FMA.
// clang-format off: the own header first (clang-format does not see .cu files as sources)
#include "gpu/moe.h"
// clang-format on

#include <cuda_runtime.h>

#include <cmath>
#include <vector>

#include "base/check.h"
#include "gpu/gemm.h"
#include "gpu/runtime.h"

namespace troupe::gpu {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kScatterThreads = 256;
constexpr int kScatterWarps = kScatterThreads / 32;
constexpr int64_t kMaxEntries = int64_t{1} << 30;  // n_tok * k, so int indices never overflow

long long ll(int64_t v) { return static_cast<long long>(v); }

// ---------------------------------------------------------------------------------------------
// Routing: one warp per token.

struct RouteParams {
  int n_expert, k, n_group, n_group_used;
  int softmax, norm_topk, group_limited, group_max;
  float routed_scale;
};

/// True when (va, ia) comes before (vb, ib) in std::stable_sort by value descending over ids in
/// ascending order: the larger value, and on equal values the smaller id. ia/ib < 0 = empty.
__device__ __forceinline__ bool ranks_before(float va, int ia, float vb, int ib) {
  if (ib < 0) return ia >= 0;
  if (ia < 0) return false;
  if (va > vb) return true;
  if (vb > va) return false;
  return ia < ib;
}

/// The best untaken index of vals[0, n) by ranks_before, the same on every lane.
/// REQUIRES: all 32 lanes of the warp call it; vals/taken are visible to the warp (__syncwarp).
__device__ int warp_argmax(const float* vals, const unsigned char* taken, int n, int lane) {
  float bv = 0.0f;
  int bi = -1;
  for (int i = lane; i < n; i += 32) {  // ascending: on equal values the first one stays
    if (taken[i]) continue;
    const float v = vals[i];
    if (bi < 0 || v > bv) {
      bv = v;
      bi = i;
    }
  }
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(kFullMask, bv, off);
    const int oi = __shfl_xor_sync(kFullMask, bi, off);
    if (ranks_before(ov, oi, bv, bi)) {
      bv = ov;
      bi = oi;
    }
  }
  return __shfl_sync(kFullMask, bi, 0);  // lane 0's answer for all (NaN would break the order)
}

size_t route_smem_bytes(const RouteParams& p) {
  return (2 * static_cast<size_t>(p.n_expert) + static_cast<size_t>(p.n_group)) * sizeof(float) +
         static_cast<size_t>(p.k) * sizeof(int) + static_cast<size_t>(p.n_expert) +
         static_cast<size_t>(p.n_group);
}

// grid: one block of 32 threads per token. Shared: probs, selp [n_expert] f32; gscore [n_group]
// f32; chosen [k] int; taken [n_expert], gkeep [n_group] bytes (floats first: 4-byte aligned).
__global__ void route_kernel(RouteParams p, const float* __restrict__ logits,
                             const float* __restrict__ bias, int32_t* __restrict__ ids,
                             float* __restrict__ weights) {
  extern __shared__ float smem[];
  __shared__ float s_inv;
  const int ne = p.n_expert;
  float* probs = smem;
  float* selp = probs + ne;
  float* gscore = selp + ne;
  int* chosen = reinterpret_cast<int*>(gscore + p.n_group);
  unsigned char* taken = reinterpret_cast<unsigned char*>(chosen + p.k);
  unsigned char* gkeep = taken + ne;

  const int lane = static_cast<int>(threadIdx.x);
  const int64_t t = blockIdx.x;
  const float* lg = logits + t * ne;

  if (p.softmax) {
    float mx = -INFINITY;
    for (int e = lane; e < ne; e += 32) mx = fmaxf(mx, lg[e]);
    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, off));
    for (int e = lane; e < ne; e += 32) probs[e] = expf(lg[e] - mx);
    __syncwarp();
    if (lane == 0) {
      double sum = 0;  // in expert order, in double: the CPU's sum
      for (int e = 0; e < ne; ++e) sum += probs[e];
      s_inv = static_cast<float>(1.0 / sum);
    }
    __syncwarp();
    const float inv = s_inv;
    for (int e = lane; e < ne; e += 32) probs[e] = __fmul_rn(probs[e], inv);
  } else {
    for (int e = lane; e < ne; e += 32) probs[e] = 1.0f / (1.0f + expf(-lg[e]));
  }
  for (int e = lane; e < ne; e += 32) {
    selp[e] = __fadd_rn(probs[e], bias ? bias[e] : 0.0f);
    taken[e] = 0;
  }
  __syncwarp();

  if (p.group_limited) {
    const int per = ne / p.n_group;
    for (int g = lane; g < p.n_group; g += 32) {
      float b1 = -INFINITY, b2 = -INFINITY;  // the group's two best, as the CPU scans them
      for (int e = g * per; e < (g + 1) * per; ++e) {
        const float v = selp[e];
        if (v > b1) {
          b2 = b1;
          b1 = v;
        } else if (v > b2) {
          b2 = v;
        }
      }
      gscore[g] = p.group_max ? b1 : __fadd_rn(b1, b2);
      gkeep[g] = 0;
    }
    __syncwarp();
    for (int j = 0; j < p.n_group_used; ++j) {
      const int g = warp_argmax(gscore, gkeep, p.n_group, lane);
      if (lane == 0 && g >= 0) gkeep[g] = 1;
      __syncwarp();
    }
    for (int e = lane; e < ne; e += 32)
      if (!gkeep[e / per]) selp[e] = -INFINITY;
    __syncwarp();
  }

  for (int j = 0; j < p.k; ++j) {
    const int e = warp_argmax(selp, taken, ne, lane);
    if (lane == 0) {
      chosen[j] = e;
      if (e >= 0) taken[e] = 1;
    }
    __syncwarp();
  }

  if (lane == 0) {
    double wsum = 0;
    for (int j = 0; j < p.k; ++j) wsum += probs[chosen[j]];
    const float fsum = static_cast<float>(wsum);
    for (int j = 0; j < p.k; ++j) {
      float w = probs[chosen[j]];
      if (p.norm_topk) w = __fdiv_rn(w, fsum);
      w = __fmul_rn(w, p.routed_scale);
      ids[t * p.k + j] = chosen[j];
      weights[t * p.k + j] = w;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Permutation: a counting sort, one block per expert.

// grid: n_expert blocks of kScatterThreads. counts[e] = #{i : ids[i] == e}.
__global__ void count_kernel(const int32_t* __restrict__ ids, int n, int32_t* __restrict__ counts) {
  __shared__ int warp_sums[kScatterWarps];
  const int e = static_cast<int>(blockIdx.x);
  int c = 0;
  for (int i = static_cast<int>(threadIdx.x); i < n; i += kScatterThreads) c += ids[i] == e;
  for (int off = 16; off > 0; off >>= 1) c += __shfl_xor_sync(kFullMask, c, off);
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = c;
  __syncthreads();
  if (threadIdx.x == 0) {
    int total = 0;
    for (int w = 0; w < kScatterWarps; ++w) total += warp_sums[w];
    counts[e] = total;
  }
}

// grid: 1 x 1. offsets = exclusive prefix sum of counts, offsets[n_expert] = total.
__global__ void offsets_kernel(const int32_t* __restrict__ counts, int n_expert,
                               int32_t* __restrict__ offsets) {
  int32_t at = 0;
  offsets[0] = 0;
  for (int e = 0; e < n_expert; ++e) {
    at += counts[e];
    offsets[e + 1] = at;
  }
}

// grid: n_expert blocks of kScatterThreads. Walks the entries in order, kScatterThreads at a time;
// an entry's row is its expert's offset + the matches before it (earlier chunks, earlier warps,
// earlier lanes by ballot): entry order within each expert, with no atomics.
__global__ void scatter_kernel(const int32_t* __restrict__ ids, int n,
                               const int32_t* __restrict__ counts,
                               const int32_t* __restrict__ offsets, int32_t* __restrict__ row_entry,
                               int32_t* __restrict__ entry_row) {
  __shared__ int warp_tot[kScatterWarps];
  const int e = static_cast<int>(blockIdx.x);
  if (counts[e] == 0) return;  // the same for the whole block
  const int base = offsets[e];
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int warp = static_cast<int>(threadIdx.x >> 5);
  const unsigned lanes_before = (1u << lane) - 1u;
  int running = 0;
  for (int c0 = 0; c0 < n; c0 += kScatterThreads) {
    const int i = c0 + static_cast<int>(threadIdx.x);
    const bool hit = i < n && ids[i] == e;
    const unsigned ballot = __ballot_sync(kFullMask, hit);
    if (lane == 0) warp_tot[warp] = __popc(ballot);
    __syncthreads();
    int before = 0, total = 0;
    for (int w = 0; w < kScatterWarps; ++w) {
      const int v = warp_tot[w];
      if (w < warp) before += v;
      total += v;
    }
    if (hit) {
      const int row = base + running + before + __popc(ballot & lanes_before);
      row_entry[row] = i;
      entry_row[i] = row;
    }
    running += total;
    __syncthreads();  // warp_tot is rewritten by the next chunk
  }
}

// grid: one block per sorted row. x_sorted[r] = x[row_entry[r] / k] for r < offsets[n_expert].
__global__ void gather_kernel(const int32_t* __restrict__ row_entry,
                              const int32_t* __restrict__ offsets, int n_expert, int k,
                              const __nv_bfloat16* __restrict__ x, int64_t d,
                              __nv_bfloat16* __restrict__ x_sorted, int vec16) {
  const int r = static_cast<int>(blockIdx.x);
  if (r >= offsets[n_expert]) return;  // rows of out-of-range ids were never assigned
  const int64_t tok = row_entry[r] / k;
  if (vec16) {  // d % 8 == 0 and both bases 16-byte aligned: 8 bf16 per load
    const uint4* src = reinterpret_cast<const uint4*>(x + tok * d);
    uint4* dst = reinterpret_cast<uint4*>(x_sorted + static_cast<int64_t>(r) * d);
    for (int64_t j = threadIdx.x; j < d / 8; j += blockDim.x) dst[j] = src[j];
  } else {
    const __nv_bfloat16* src = x + tok * d;
    __nv_bfloat16* dst = x_sorted + static_cast<int64_t>(r) * d;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) dst[j] = src[j];
  }
}

// ---------------------------------------------------------------------------------------------
// Expert FFN activation and the combine.

// Grid-stride. out = bf16(silu(g) * u) with silu(g) = g / (1 + exp(-g)) (engine.cc's silu).
__global__ void swiglu_kernel(const float* __restrict__ g, const float* __restrict__ u,
                              __nv_bfloat16* __restrict__ out, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const float gv = g[i];
    const float s = gv / (1.0f + expf(-gv));
    out[i] = __float2bfloat16(__fmul_rn(s, u[i]));
  }
}

struct CombineParams {
  int64_t d;
  int k;
  const float* expert_out;
  const int32_t* entry_row;
  const float* weights;
  const float* shared_out;
  const float* shared_gate_logit;
  float* y;
};

// grid: one block per token.
__global__ void combine_kernel(CombineParams p) {
  const int64_t t = blockIdx.x;
  const float* w = p.weights + t * p.k;
  const int32_t* rows = p.entry_row + t * p.k;
  float g = 1.0f;
  if (p.shared_gate_logit) g = 1.0f / (1.0f + expf(-p.shared_gate_logit[t]));
  for (int64_t j = threadIdx.x; j < p.d; j += blockDim.x) {
    float acc = __fmul_rn(p.expert_out[static_cast<int64_t>(rows[0]) * p.d + j], w[0]);
    for (int s = 1; s < p.k; ++s)
      acc = __fadd_rn(acc, __fmul_rn(p.expert_out[static_cast<int64_t>(rows[s]) * p.d + j], w[s]));
    if (p.shared_out) acc = __fadd_rn(acc, __fmul_rn(p.shared_out[t * p.d + j], g));
    p.y[t * p.d + j] = acc;
  }
}

unsigned grid_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 65536 ? (blocks > 0 ? blocks : 1) : 65536);
}

void validate_weights(const MoeExpertWeights& w) {
  if (w.n_expert < 1 || w.n_expert > MoeRouting::kMaxExperts || w.d < 8 || w.d_ff < 8 ||
      w.d % 8 != 0 || w.d_ff % 8 != 0)
    TROUPE_INPUT_ERROR(
        "MoE experts: need 1 <= n_expert <= %lld and d, d_ff positive multiples of 8 (16-byte "
        "aligned rows for the expert GEMMs), got n_expert=%lld d=%lld d_ff=%lld",
        ll(MoeRouting::kMaxExperts), ll(w.n_expert), ll(w.d), ll(w.d_ff));
  if (!w.gate || !w.up || !w.down)
    TROUPE_INPUT_ERROR("MoE experts: null weight pointer (gate=%p up=%p down=%p)",
                       static_cast<const void*>(w.gate), static_cast<const void*>(w.up),
                       static_cast<const void*>(w.down));
}

}  // namespace

MoeRouting MoeRouting::from_spec(const model::ModelSpec& s) {
  MoeRouting r;
  r.n_expert = s.n_expert;
  r.k = s.n_expert_used;
  r.gating = s.gating;
  r.norm_topk = s.norm_topk;
  r.routed_scale = s.routed_scale;
  r.n_group = s.n_group;
  r.n_group_used = s.n_group_used;
  r.group_score = s.group_score;
  return r;
}

void validate_moe_routing(const MoeRouting& r) {
  if (r.n_expert < 1 || r.n_expert > MoeRouting::kMaxExperts)
    TROUPE_INPUT_ERROR("MoE routing: n_expert must be in [1, %lld], got %lld",
                       ll(MoeRouting::kMaxExperts), ll(r.n_expert));
  if (r.k < 1 || r.k > r.n_expert || r.k > MoeRouting::kMaxK)
    TROUPE_INPUT_ERROR(
        "MoE routing: k (experts per token) must be in [1, min(n_expert=%lld, %lld)]"
        ", got %lld",
        ll(r.n_expert), ll(MoeRouting::kMaxK), ll(r.k));
  if (r.gating != model::Gating::kSoftmax && r.gating != model::Gating::kSigmoid)
    TROUPE_INPUT_ERROR("MoE routing: unknown gating %d", static_cast<int>(r.gating));
  if (r.n_group < 1 || r.n_group > MoeRouting::kMaxGroups || r.n_group_used < 1 ||
      r.n_group_used > r.n_group)
    TROUPE_INPUT_ERROR(
        "MoE routing: need 1 <= n_group <= %lld and 1 <= n_group_used <= n_group, got n_group=%lld "
        "n_group_used=%lld",
        ll(MoeRouting::kMaxGroups), ll(r.n_group), ll(r.n_group_used));
  if (r.n_group > 1 && r.n_group_used < r.n_group && r.n_expert % r.n_group != 0)
    TROUPE_INPUT_ERROR(
        "MoE routing: group-limited routing needs n_expert (%lld) to be a multiple of n_group "
        "(%lld)",
        ll(r.n_expert), ll(r.n_group));
}

void launch_moe_route(const MoeRouting& r, const float* logits, const float* bias, int64_t n_tok,
                      int32_t* ids, float* weights, cudaStream_t stream) {
  validate_moe_routing(r);
  if (n_tok < 0 || n_tok * r.k > kMaxEntries)
    TROUPE_INPUT_ERROR("MoE routing: n_tok must be in [0, %lld / k], got %lld", ll(kMaxEntries),
                       ll(n_tok));
  if (n_tok == 0) return;
  if (!logits || !ids || !weights)
    TROUPE_INPUT_ERROR("MoE routing: null pointer (logits=%p ids=%p weights=%p)",
                       static_cast<const void*>(logits), static_cast<void*>(ids),
                       static_cast<void*>(weights));
  RouteParams p;
  p.n_expert = static_cast<int>(r.n_expert);
  p.k = static_cast<int>(r.k);
  p.n_group = static_cast<int>(r.n_group);
  p.n_group_used = static_cast<int>(r.n_group_used);
  p.softmax = r.gating == model::Gating::kSoftmax;
  p.norm_topk = r.norm_topk;
  p.group_limited = r.n_group > 1 && r.n_group_used < r.n_group;
  p.group_max = r.group_score == model::GroupScore::kMax;
  p.routed_scale = r.routed_scale;
  route_kernel<<<static_cast<unsigned>(n_tok), 32, route_smem_bytes(p), stream>>>(p, logits, bias,
                                                                                  ids, weights);
  TROUPE_CUDA_CHECK_LAUNCH();
}

void launch_moe_permute(const int32_t* ids, int64_t n_tok, int64_t k, int64_t n_expert,
                        const __nv_bfloat16* x, int64_t d, __nv_bfloat16* x_sorted,
                        const MoePermutation& out, cudaStream_t stream) {
  if (n_tok < 0 || k < 1 || k > MoeRouting::kMaxK || n_tok * k > kMaxEntries)
    TROUPE_INPUT_ERROR(
        "MoE permute: need n_tok >= 0, 1 <= k <= %lld, n_tok * k <= %lld, got "
        "n_tok=%lld k=%lld",
        ll(MoeRouting::kMaxK), ll(kMaxEntries), ll(n_tok), ll(k));
  if (n_expert < 1 || n_expert > MoeRouting::kMaxExperts || d < 1)
    TROUPE_INPUT_ERROR(
        "MoE permute: need 1 <= n_expert <= %lld and d >= 1, got n_expert=%lld "
        "d=%lld",
        ll(MoeRouting::kMaxExperts), ll(n_expert), ll(d));
  if (!out.counts || !out.offsets)
    TROUPE_INPUT_ERROR("MoE permute: null counts or offsets (counts=%p offsets=%p)",
                       static_cast<void*>(out.counts), static_cast<void*>(out.offsets));
  const int n = static_cast<int>(n_tok * k);
  if (n > 0 && (!ids || !x || !x_sorted || !out.row_entry || !out.entry_row))
    TROUPE_INPUT_ERROR(
        "MoE permute: null pointer (ids=%p x=%p x_sorted=%p row_entry=%p entry_row=%p)",
        static_cast<const void*>(ids), static_cast<const void*>(x), static_cast<void*>(x_sorted),
        static_cast<void*>(out.row_entry), static_cast<void*>(out.entry_row));
  const unsigned ne = static_cast<unsigned>(n_expert);
  count_kernel<<<ne, kScatterThreads, 0, stream>>>(ids, n, out.counts);
  TROUPE_CUDA_CHECK_LAUNCH();
  offsets_kernel<<<1, 1, 0, stream>>>(out.counts, static_cast<int>(n_expert), out.offsets);
  TROUPE_CUDA_CHECK_LAUNCH();
  if (n == 0) return;
  scatter_kernel<<<ne, kScatterThreads, 0, stream>>>(ids, n, out.counts, out.offsets, out.row_entry,
                                                     out.entry_row);
  TROUPE_CUDA_CHECK_LAUNCH();
  const int vec16 = d % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(x_sorted) % 16 == 0;
  gather_kernel<<<static_cast<unsigned>(n), 128, 0, stream>>>(
      out.row_entry, out.offsets, static_cast<int>(n_expert), static_cast<int>(k), x, d, x_sorted,
      vec16);
  TROUPE_CUDA_CHECK_LAUNCH();
}

void run_moe_experts(Gemm& gemm, const MoeExpertWeights& w, std::span<const int32_t> offsets_host,
                     const __nv_bfloat16* x_sorted, float* out, Arena& arena, cudaStream_t stream) {
  validate_weights(w);
  const int64_t ne = w.n_expert, d = w.d, ff = w.d_ff;
  if (static_cast<int64_t>(offsets_host.size()) != ne + 1)
    TROUPE_INPUT_ERROR("MoE experts: offsets has %zu entries, expected n_expert + 1 = %lld",
                       offsets_host.size(), ll(ne + 1));
  if (offsets_host[0] != 0)
    TROUPE_INPUT_ERROR("MoE experts: offsets[0] must be 0, got %d", offsets_host[0]);
  for (int64_t e = 0; e < ne; ++e)
    if (offsets_host[e + 1] < offsets_host[e])
      TROUPE_INPUT_ERROR("MoE experts: offsets decrease at expert %lld (%d then %d)", ll(e),
                         offsets_host[e], offsets_host[e + 1]);
  const int64_t rows = offsets_host[ne];
  if (rows == 0) return;
  if (!x_sorted || !out)
    TROUPE_INPUT_ERROR("MoE experts: null pointer (x_sorted=%p out=%p)",
                       static_cast<const void*>(x_sorted), static_cast<void*>(out));
  ArenaScope scope(arena);
  float* gate = arena.allocate_n<float>(static_cast<size_t>(rows * ff), "moe gate f32");
  float* up = arena.allocate_n<float>(static_cast<size_t>(rows * ff), "moe up f32");
  __nv_bfloat16* act =
      arena.allocate_n<__nv_bfloat16>(static_cast<size_t>(rows * ff), "moe swiglu bf16");
  for (int64_t e = 0; e < ne; ++e) {
    const int64_t at = offsets_host[e], cnt = offsets_host[e + 1] - at;
    if (cnt == 0) continue;
    GemmArgs g;
    g.m = cnt;
    g.n = ff;
    g.k = d;
    g.x = x_sorted + at * d;
    g.w = w.gate + e * ff * d;
    g.y = gate + at * ff;
    g.y_type = GemmOut::kF32;
    gemm.run(g, stream);
    g.w = w.up + e * ff * d;
    g.y = up + at * ff;
    gemm.run(g, stream);
  }
  const int64_t n_act = rows * ff;
  swiglu_kernel<<<grid_for(n_act, 256), 256, 0, stream>>>(gate, up, act, n_act);
  TROUPE_CUDA_CHECK_LAUNCH();
  for (int64_t e = 0; e < ne; ++e) {
    const int64_t at = offsets_host[e], cnt = offsets_host[e + 1] - at;
    if (cnt == 0) continue;
    GemmArgs g;
    g.m = cnt;
    g.n = d;
    g.k = ff;
    g.x = act + at * ff;
    g.w = w.down + e * d * ff;
    g.y = out + at * d;
    g.y_type = GemmOut::kF32;
    gemm.run(g, stream);
  }
}

void launch_moe_combine(const MoeCombineArgs& a, cudaStream_t stream) {
  if (a.n_tok < 0 || a.k < 1 || a.k > MoeRouting::kMaxK || a.d < 1 || a.n_tok * a.k > kMaxEntries)
    TROUPE_INPUT_ERROR(
        "MoE combine: need n_tok >= 0, 1 <= k <= %lld, d >= 1, got n_tok=%lld "
        "k=%lld d=%lld",
        ll(MoeRouting::kMaxK), ll(a.n_tok), ll(a.k), ll(a.d));
  if (a.shared_gate_logit && !a.shared_out)
    TROUPE_INPUT_ERROR("MoE combine: shared_gate_logit given without shared_out");
  if (a.n_tok == 0) return;
  if (!a.expert_out || !a.entry_row || !a.weights || !a.y)
    TROUPE_INPUT_ERROR("MoE combine: null pointer (expert_out=%p entry_row=%p weights=%p y=%p)",
                       static_cast<const void*>(a.expert_out),
                       static_cast<const void*>(a.entry_row), static_cast<const void*>(a.weights),
                       static_cast<void*>(a.y));
  CombineParams p;
  p.d = a.d;
  p.k = static_cast<int>(a.k);
  p.expert_out = a.expert_out;
  p.entry_row = a.entry_row;
  p.weights = a.weights;
  p.shared_out = a.shared_out;
  p.shared_gate_logit = a.shared_gate_logit;
  p.y = a.y;
  combine_kernel<<<static_cast<unsigned>(a.n_tok), 256, 0, stream>>>(p);
  TROUPE_CUDA_CHECK_LAUNCH();
}

MoeForward::MoeForward(const MoeRouting& routing, Gemm* gemm) : routing_(routing), gemm_(gemm) {
  validate_moe_routing(routing);
  if (!gemm) TROUPE_INPUT_ERROR("MoeForward: null Gemm");
  offsets_len_ = static_cast<size_t>(routing.n_expert + 1);
  TROUPE_CUDA_CHECK(
      cudaMallocHost(reinterpret_cast<void**>(&offsets_host_), offsets_len_ * sizeof(int32_t)));
  for (size_t i = 0; i < offsets_len_; ++i) offsets_host_[i] = 0;
  TROUPE_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&recv_counts_host_),
                                   static_cast<size_t>(routing.n_expert) * sizeof(int32_t)));
}

MoeForward::~MoeForward() {
  if (offsets_host_) cudaFreeHost(offsets_host_);
  if (recv_counts_host_) cudaFreeHost(recv_counts_host_);
}

void MoeForward::check_args(const MoeForwardArgs& a) const {
  const int64_t ne = routing_.n_expert;
  validate_weights(a.experts);
  const int64_t e0 = a.expert_begin, e1 = a.expert_begin + a.experts.n_expert;
  if (e0 < 0 || e1 > ne)
    TROUPE_INPUT_ERROR(
        "MoeForward: the weights hold experts [%lld, %lld), the routing has %lld experts", ll(e0),
        ll(e1), ll(ne));
  if (a.n_tok < 0 || a.n_tok * routing_.k > kMaxEntries)
    TROUPE_INPUT_ERROR("MoeForward: n_tok must be in [0, %lld / k], got %lld", ll(kMaxEntries),
                       ll(a.n_tok));
  if (a.shared_gate_logit && !a.shared_out)
    TROUPE_INPUT_ERROR("MoeForward: shared_gate_logit given without shared_out");
  if (a.n_tok > 0 && (!a.x || !a.router_logits || !a.y))
    TROUPE_INPUT_ERROR("MoeForward: null pointer (x=%p router_logits=%p y=%p)",
                       static_cast<const void*>(a.x), static_cast<const void*>(a.router_logits),
                       static_cast<void*>(a.y));
}

void MoeForward::run(const MoeForwardArgs& a, Arena& arena, cudaStream_t stream) {
  const int64_t ne = routing_.n_expert, k = routing_.k, d = a.experts.d;
  check_args(a);
  const int64_t e0 = a.expert_begin, e1 = a.expert_begin + a.experts.n_expert;
  for (size_t i = 0; i < offsets_len_; ++i) offsets_host_[i] = 0;
  if (a.n_tok == 0) return;
  const int64_t n_ent = a.n_tok * k;
  ArenaScope scope(arena);
  int32_t* ids = arena.allocate_n<int32_t>(static_cast<size_t>(n_ent), "moe ids");
  float* weights = arena.allocate_n<float>(static_cast<size_t>(n_ent), "moe weights");
  MoePermutation perm;
  perm.counts = arena.allocate_n<int32_t>(static_cast<size_t>(ne), "moe counts");
  perm.offsets = arena.allocate_n<int32_t>(static_cast<size_t>(ne + 1), "moe offsets");
  perm.row_entry = arena.allocate_n<int32_t>(static_cast<size_t>(n_ent), "moe row_entry");
  perm.entry_row = arena.allocate_n<int32_t>(static_cast<size_t>(n_ent), "moe entry_row");
  __nv_bfloat16* x_sorted =
      arena.allocate_n<__nv_bfloat16>(static_cast<size_t>(n_ent * d), "moe x_sorted");
  float* expert_out = arena.allocate_n<float>(static_cast<size_t>(n_ent * d), "moe expert_out");

  launch_moe_route(routing_, a.router_logits, a.router_bias, a.n_tok, ids, weights, stream);
  launch_moe_permute(ids, a.n_tok, k, ne, a.x, d, x_sorted, perm, stream);
  // The host needs the per-expert counts to issue one GEMM per non-empty expert.
  TROUPE_CUDA_CHECK(cudaMemcpyAsync(offsets_host_, perm.offsets, offsets_len_ * sizeof(int32_t),
                                    cudaMemcpyDeviceToHost, stream));
  TROUPE_CUDA_CHECK(cudaStreamSynchronize(stream));
  TROUPE_CHECK(offsets_host_[ne] == n_ent,
               "MoE routing counted %d of %lld (token, slot) entries: an expert id is outside "
               "[0, %lld)",
               offsets_host_[ne], ll(n_ent), ll(ne));
  // This call's experts have the sorted rows [r0, r1); the others' rows are zero, so that they add
  // nothing to the weighted sum of the combine (w * 0 + s == s).
  const int64_t r0 = offsets_host_[e0], r1 = offsets_host_[e1];
  if (e0 == 0 && e1 == ne) {
    run_moe_experts(*gemm_, a.experts, offsets(), x_sorted, expert_out, arena, stream);
  } else {
    std::vector<int32_t> local(static_cast<size_t>(e1 - e0 + 1));
    for (int64_t e = e0; e <= e1; ++e)
      local[static_cast<size_t>(e - e0)] = offsets_host_[e] - static_cast<int32_t>(r0);
    run_moe_experts(*gemm_, a.experts, local, x_sorted + r0 * d, expert_out + r0 * d, arena,
                    stream);
    if (r0 > 0)
      TROUPE_CUDA_CHECK(
          cudaMemsetAsync(expert_out, 0, static_cast<size_t>(r0 * d) * sizeof(float), stream));
    if (r1 < n_ent)
      TROUPE_CUDA_CHECK(cudaMemsetAsync(
          expert_out + r1 * d, 0, static_cast<size_t>((n_ent - r1) * d) * sizeof(float), stream));
  }
  combine(a, expert_out, perm.entry_row, weights, stream);
}

void MoeForward::combine(const MoeForwardArgs& a, const float* expert_out, const int32_t* entry_row,
                         const float* weights, cudaStream_t stream) {
  MoeCombineArgs c;
  c.n_tok = a.n_tok;
  c.k = routing_.k;
  c.d = a.experts.d;
  c.expert_out = expert_out;
  c.entry_row = entry_row;
  c.weights = weights;
  c.shared_out = a.shared_out;
  c.shared_gate_logit = a.shared_gate_logit;
  c.y = a.y;
  launch_moe_combine(c, stream);
}

}  // namespace troupe::gpu
