// matmul(): run-time SIMD dispatch, activation preparation and threading; the scalar kernels
// (the fallback, and the path every other one is tested against besides dequantize_row).
// The SIMD kernels live in matmul_avx2.cc and matmul_avx512.cc (see detail/matmul_kernels.h).
#include "compute/matmul.h"

#include <cpuid.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string_view>
#include <type_traits>
#include <vector>

#include "base/check.h"
#include "compute/detail/matmul_kernels.h"
#include "compute/thread_pool.h"
#include "model/weight_tiles.h"

namespace troupe::compute {
namespace detail {

const TypeKernels* KernelSet::find(model::GgmlType t, model::WeightLayout layout) const {
  using model::GgmlType;
  const TypeKernels* k = nullptr;
  if (layout == model::WeightLayout::kTiles16) {
    if (t == GgmlType::kQ8_0) k = &q8_0_t16;
    if (t == GgmlType::kQ4_0) k = &q4_0_t16;
    if (t == GgmlType::kQ4_K) k = &q4_k_t16;
    if (k == nullptr) return nullptr;
    // A level without SIMD tile kernels reads tiles with the scalar ones (the same bits).
    return k->rows ? k : scalar_kernels().find(t, layout);
  }
  switch (t) {
    case GgmlType::kF32:
      k = &f32;
      break;
    case GgmlType::kF16:
      k = &f16;
      break;
    case GgmlType::kBF16:
      k = &bf16;
      break;
    case GgmlType::kQ8_0:
      k = &q8_0;
      break;
    case GgmlType::kQ4_0:
      k = &q4_0;
      break;
    case GgmlType::kQ4_K:
      k = &q4_k;
      break;
    case GgmlType::kQ6_K:
      k = &q6_k;
      break;
    default:
      return nullptr;
  }
  return k->rows ? k : nullptr;
}

namespace {

using model::BlockQ4_0;
using model::BlockQ4_K;
using model::BlockQ6_K;
using model::BlockQ8_0;
using model::fp16_to_fp32;
using model::kQK_K;

// --- scalar kernels ---

// A scratch buffer per thread that only grows: kernels run hundreds of times per token.
template <typename T>
T* scratch(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  return v.data();
}

// Fixed reduction order: 8 partial sums over i mod 8, combined pairwise at the end.
float dot_f32(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += a[i + k] * b[i + k];
  for (int k = 0; i < n; ++i, ++k) acc[k] += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

// Float weights: convert one row (exactly) and dot it with every token.
template <model::GgmlType kType>
void float_rows(const MatmulJob& j, int64_t r0, int64_t r1) {
  thread_local std::vector<float> buf;
  float* row = scratch(buf, j.cols);
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* src = j.w + r * j.w_row_bytes;
    const float* wr = row;
    if constexpr (kType == model::GgmlType::kF32) {
      wr = reinterpret_cast<const float*>(src);
    } else {
      model::dequantize_row(kType, src, row, j.cols);
    }
    for (int64_t t = 0; t < j.n_tok; ++t) {
      const auto* x = reinterpret_cast<const float*>(j.act + t * j.act_stride);
      j.y[t * j.y_stride + r] = dot_f32(wr, x, j.cols);
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
struct ActBlock32 {
  float d;
  int8_t q[32];
};

int64_t act32_bytes(int64_t cols) { return cols / 32 * static_cast<int64_t>(sizeof(ActBlock32)); }

void quantize_act32(const float* x, int64_t cols, uint8_t* out) {
  auto* a = reinterpret_cast<ActBlock32*>(out);
  for (int64_t b = 0; b < cols / 32; ++b) a[b].d = quantize_int8(x + b * 32, 32, a[b].q);
}

// Q8_0 and Q4_0: each row decoded to int8 values and block scales, then an exact integer dot
// per block, scaled and summed in block order.
// One Q8_0 or Q4_0 row (nb blocks at src) as int8 values wq[32 nb] and block scales wd[nb].
template <model::GgmlType kType>
void decode_blocks32(const uint8_t* src, int64_t nb, int8_t* wq, float* wd) {
  for (int64_t b = 0; b < nb; ++b) {
    int8_t* q = wq + b * 32;
    if constexpr (kType == model::GgmlType::kQ8_0) {
      const auto& blk = reinterpret_cast<const BlockQ8_0*>(src)[b];
      wd[b] = fp16_to_fp32(blk.d);
      std::memcpy(q, blk.qs, 32);
    } else {
      const auto& blk = reinterpret_cast<const BlockQ4_0*>(src)[b];
      wd[b] = fp16_to_fp32(blk.d);
      for (int i = 0; i < 16; ++i) {
        q[i] = static_cast<int8_t>((blk.qs[i] & 0xF) - 8);
        q[i + 16] = static_cast<int8_t>((blk.qs[i] >> 4) - 8);
      }
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

// Q8_0 and Q4_0, each row decoded to int8 values and block scales, then an exact integer dot
// per block, scaled and summed in block order. kTiled: the matrix is in 16-row tiles
// (model/weight_tiles.h) and each output is ActTile32's recurrence, the reference for the SIMD
// tile kernels, which give the same bits (the exact dot of the signed values is their
// ActTile32::start less M's bits, plus the unsigned dot).
template <model::GgmlType kType, bool kTiled = false>
void blocks32_rows(const MatmulJob& j, int64_t r0, int64_t r1) {
  thread_local std::vector<int8_t> qbuf;
  thread_local std::vector<float> dbuf;
  const int64_t nb = j.cols / 32;
  int8_t* wq = scratch(qbuf, j.cols);
  float* wd = scratch(dbuf, nb);
  for (int64_t r = r0; r < r1; ++r) {
    decode_blocks32<kType>(kTiled ? untiled_row(kType, j, r) : j.w + r * j.w_row_bytes, nb, wq, wd);
    for (int64_t t = 0; t < j.n_tok; ++t) {
      using Act = std::conditional_t<kTiled, ActTile32, ActBlock32>;
      const auto* a = reinterpret_cast<const Act*>(j.act + t * j.act_stride);
      float acc = 0.f;
      for (int64_t b = 0; b < nb; ++b) {
        int32_t dot = 0;
        for (int k = 0; k < 32; ++k) dot += wq[b * 32 + k] * a[b].q[k];
        if constexpr (kTiled) {
          const float t = std::fma(kTileMagic + static_cast<float>(dot), a[b].d, a[b].neg_md);
          acc = std::fma(t, wd[b], acc);
        } else {
          acc += static_cast<float>(dot) * a[b].d * wd[b];
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

// The 4-bit values of nsb Q4_K super-blocks, in value order, into wq[256 nsb].
void decode_q4k_quants(const BlockQ4_K* blk, int64_t nsb, uint8_t* wq) {
  for (int64_t s = 0; s < nsb; ++s) {
    for (int p = 0; p < 4; ++p) {
      for (int i = 0; i < 32; ++i) {
        wq[s * kQK_K + p * 64 + i] = blk[s].qs[p * 32 + i] & 0xF;
        wq[s * kQK_K + p * 64 + 32 + i] = blk[s].qs[p * 32 + i] >> 4;
      }
    }
  }
}

// Q4_K: value = d*sc[j]*q - dmin*m[j] over 8 sub-blocks of 32, q in [0, 15]. The integer
// parts are exact: sum_j sc[j]*dot_j(q, x) and sum_j m[j]*sum_j(x).
void q4k_rows(const MatmulJob& j, int64_t r0, int64_t r1) {
  thread_local std::vector<uint8_t> qbuf;
  const int64_t nsb = j.cols / kQK_K;
  uint8_t* wq = scratch(qbuf, j.cols);
  for (int64_t r = r0; r < r1; ++r) {
    const auto* blk = reinterpret_cast<const BlockQ4_K*>(j.w + r * j.w_row_bytes);
    decode_q4k_quants(blk, nsb, wq);
    for (int64_t t = 0; t < j.n_tok; ++t) {
      const auto* a = reinterpret_cast<const ActBlockK*>(j.act + t * j.act_stride);
      float acc = 0.f;
      for (int64_t s = 0; s < nsb; ++s) {
        uint8_t sc[8], mn[8];
        q4k_scales_mins(blk[s].scales, sc, mn);
        int32_t tot = 0, msum = 0;
        for (int sb = 0; sb < 8; ++sb) {
          int32_t isum = 0, xsum = 0;
          for (int i = 0; i < 32; ++i) {
            isum += wq[s * kQK_K + sb * 32 + i] * a[s].q[sb * 32 + i];
            xsum += a[s].q[sb * 32 + i];
          }
          tot += sc[sb] * isum;
          msum += mn[sb] * xsum;
        }
        const float d = fp16_to_fp32(blk[s].d), dmin = fp16_to_fp32(blk[s].dmin);
        acc += a[s].d * (d * static_cast<float>(tot) - dmin * static_cast<float>(msum));
      }
      j.y[t * j.y_stride + r] = acc;
    }
  }
}

// Q4_K in 16-row tiles, one output at a time: the reference for the SIMD tile kernels (the
// same bits: ActTileK's recurrence).
void tiles_rows_q4k(const MatmulJob& j, int64_t r0, int64_t r1) {
  thread_local std::vector<uint8_t> qbuf, sbuf;
  const int64_t nsb = j.cols / kQK_K;
  uint8_t* wq = scratch(qbuf, j.cols);
  uint8_t* sc = scratch(sbuf, 16 * nsb);  // per super-block 8 scales, then 8 mins
  for (int64_t r = r0; r < r1; ++r) {
    const auto* blk = reinterpret_cast<const BlockQ4_K*>(untiled_row(model::GgmlType::kQ4_K, j, r));
    decode_q4k_quants(blk, nsb, wq);
    for (int64_t s = 0; s < nsb; ++s) q4k_scales_mins(blk[s].scales, sc + 16 * s, sc + 16 * s + 8);
    for (int64_t t = 0; t < j.n_tok; ++t) {
      const auto* a = reinterpret_cast<const ActTileK*>(j.act + t * j.act_stride);
      float acc = 0.f;
      for (int64_t s = 0; s < nsb; ++s) {
        int32_t tot = 0, msum = 0;
        for (int sb = 0; sb < 8; ++sb) {
          int32_t dot = 0;
          for (int k = 0; k < 32; ++k) dot += wq[s * kQK_K + 32 * sb + k] * a[s].q[32 * sb + k];
          tot += sc[16 * s + sb] * dot;
          msum += sc[16 * s + 8 + sb] * a[s].xsum[kTileKSumSlot[sb]];
        }
        const float m2 = static_cast<float>(msum) * fp16_to_fp32(blk[s].dmin);
        acc = std::fma(std::fma(static_cast<float>(tot), fp16_to_fp32(blk[s].d), -m2), a[s].d, acc);
      }
      j.y[t * j.y_stride + r] = acc;
    }
  }
}

// Q6_K: value = d*sc[j]*(q - 32) over 16 sub-blocks of 16, q in [0, 63]; exact integer
// sum_j sc[j]*dot_j(q - 32, x) per super-block.
void q6k_rows(const MatmulJob& j, int64_t r0, int64_t r1) {
  thread_local std::vector<int8_t> qbuf;
  const int64_t nsb = j.cols / kQK_K;
  int8_t* wq = scratch(qbuf, j.cols);
  for (int64_t r = r0; r < r1; ++r) {
    const auto* blk = reinterpret_cast<const BlockQ6_K*>(j.w + r * j.w_row_bytes);
    for (int64_t s = 0; s < nsb; ++s) {
      for (int h = 0; h < 2; ++h) {
        const uint8_t* ql = blk[s].ql + 64 * h;
        const uint8_t* qh = blk[s].qh + 32 * h;
        int8_t* q = wq + s * kQK_K + 128 * h;
        for (int l = 0; l < 32; ++l) {
          q[l] = static_cast<int8_t>(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
          q[l + 32] = static_cast<int8_t>(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
          q[l + 64] = static_cast<int8_t>(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
          q[l + 96] = static_cast<int8_t>(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
        }
      }
    }
    for (int64_t t = 0; t < j.n_tok; ++t) {
      const auto* a = reinterpret_cast<const ActBlockK*>(j.act + t * j.act_stride);
      float acc = 0.f;
      for (int64_t s = 0; s < nsb; ++s) {
        int32_t tot = 0;
        for (int g = 0; g < 16; ++g) {
          int32_t isum = 0;
          for (int i = 0; i < 16; ++i) isum += wq[s * kQK_K + g * 16 + i] * a[s].q[g * 16 + i];
          tot += blk[s].scales[g] * isum;
        }
        acc += a[s].d * fp16_to_fp32(blk[s].d) * static_cast<float>(tot);
      }
      j.y[t * j.y_stride + r] = acc;
    }
  }
}

// --- dispatch ---

bool cpu_has_f16c() {
  // Clang 14's __builtin_cpu_supports does not know "f16c": ask cpuid (leaf 1, ecx bit 29).
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
}

struct CpuSets {
  const KernelSet* sets[6];
  int n = 0;
};

CpuSets detect_sets() {
  __builtin_cpu_init();
  const bool avx2 =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                      __builtin_cpu_supports("avx512dq");
  const bool vnni = avx512 && __builtin_cpu_supports("avx512vnni");
  const bool gfni = vnni && __builtin_cpu_supports("gfni");
  CpuSets s;
  if (gfni) s.sets[s.n++] = &avx512_kernels(true, true);
  if (vnni) s.sets[s.n++] = &avx512_kernels(true);
  if (avx512) s.sets[s.n++] = &avx512_kernels(false);
  if (avx2) s.sets[s.n++] = &avx2_kernels();
  s.sets[s.n++] = &scalar_kernels();
  return s;
}

const CpuSets& cpu_sets() {
  static const CpuSets s = detect_sets();
  return s;
}

// The kernel set of this process, chosen once.
const KernelSet& active_kernels() {
  static const KernelSet* chosen = [] {
    const CpuSets& s = cpu_sets();
    // env: TROUPE_SIMD = scalar | avx2 | avx512 | avx512-novnni | avx512-vnni (without GFNI)
    // | avx512-vnni-gfni (default: the best this CPU runs). Lets tests and benchmarks pin a
    // path; an unavailable one falls back to the best.
    const char* env = std::getenv("TROUPE_SIMD");
    if (env == nullptr || *env == '\0') return s.sets[0];
    const std::string_view want(env);
    for (int i = 0; i < s.n; ++i) {
      const std::string_view name(s.sets[i]->name);
      const bool match = want == name || (want == "avx512" && name.starts_with("avx512")) ||
                         (want == "avx512-novnni" && name == "avx512");
      if (match) return s.sets[i];
    }
    std::fprintf(stderr, "troupe: TROUPE_SIMD=%s is not available on this CPU; using %s\n", env,
                 s.sets[0]->name);
    return s.sets[0];
  }();
  return *chosen;
}

// Activation scratch of the calling thread: 64-byte aligned, grows, never shrinks.
uint8_t* act_scratch(int64_t bytes) {
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  thread_local std::unique_ptr<uint8_t, Free> buf;
  thread_local int64_t cap = 0;
  if (bytes > cap) {
    cap = (bytes + 4095) / 4096 * 4096;
    buf.reset(static_cast<uint8_t*>(std::aligned_alloc(64, static_cast<size_t>(cap))));
    TROUPE_CHECK(buf != nullptr, "out of memory for %lld activation bytes",
                 static_cast<long long>(cap));
  }
  return buf.get();
}

// Below this many multiply-adds a call stays on the calling thread: a hand-off costs ~1 us.
constexpr int64_t kMinParallelMacs = 1 << 15;
// Quantizing activations in parallel pays off only for many values.
constexpr int64_t kMinParallelQuant = 1 << 16;

}  // namespace

const KernelSet& scalar_kernels() {
  using model::GgmlType;
  static const KernelSet ks = [] {
    KernelSet k{};
    k.name = "scalar";
    k.f32.rows = float_rows<GgmlType::kF32>;
    k.f16.rows = float_rows<GgmlType::kF16>;
    k.bf16.rows = float_rows<GgmlType::kBF16>;
    for (TypeKernels* t : {&k.q8_0, &k.q4_0}) {
      t->act_row_bytes = act32_bytes;
      t->quantize = quantize_act32;
    }
    k.q8_0.rows = blocks32_rows<GgmlType::kQ8_0>;
    k.q4_0.rows = blocks32_rows<GgmlType::kQ4_0>;
    for (TypeKernels* t : {&k.q4_k, &k.q6_k}) {
      t->act_row_bytes = actk_bytes;
      t->quantize = quantize_actk;
    }
    k.q4_k.rows = q4k_rows;
    k.q6_k.rows = q6k_rows;
    for (TypeKernels* t : {&k.q8_0_t16, &k.q4_0_t16}) {
      t->act_row_bytes = act_tile32_bytes;
      t->row_tile = static_cast<int>(model::kTileRows);
    }
    k.q8_0_t16.quantize = quantize_act_tile32<GgmlType::kQ8_0>;
    k.q4_0_t16.quantize = quantize_act_tile32<GgmlType::kQ4_0>;
    k.q8_0_t16.rows = blocks32_rows<GgmlType::kQ8_0, true>;
    k.q4_0_t16.rows = blocks32_rows<GgmlType::kQ4_0, true>;
    k.q4_k_t16.act_row_bytes = act_tilek_bytes;
    k.q4_k_t16.quantize = quantize_act_tilek;
    k.q4_k_t16.rows = tiles_rows_q4k;
    k.q4_k_t16.row_tile = static_cast<int>(model::kTileRows);
    return k;
  }();
  return ks;
}

int supported_kernel_sets(const KernelSet** out, int max) {
  const CpuSets& s = cpu_sets();
  const int n = std::min(max, s.n);
  for (int i = 0; i < n; ++i) out[i] = s.sets[i];
  return n;
}

namespace {

const TypeKernels& kernels_for(const KernelSet& ks, const model::WeightView& w) {
  const TypeKernels* k = ks.find(w.type, w.layout);
  if (k == nullptr && w.layout != model::WeightLayout::kRows) {
    TROUPE_INPUT_ERROR("matmul: weight %s is %s in 16-row tiles, which the %s kernels cannot read",
                       w.name.c_str(), model::type_name(w.type).c_str(), ks.name);
  }
  if (k == nullptr) {
    TROUPE_INPUT_ERROR("matmul: weight %s has type %s, which troupe cannot multiply yet",
                       w.name.c_str(), model::type_name(w.type).c_str());
  }
  return *k;
}

// The activation side of a job: x quantized once (in this thread's scratch) for quantized
// weights, or x itself for float weights.
void prepare_activations(const TypeKernels& k, const float* x, int64_t x_stride, int64_t cols,
                         int64_t n_tok, int n_threads, ThreadPool* pool, MatmulJob* job) {
  job->cols = cols;
  job->n_tok = n_tok;
  if (k.quantize == nullptr) {
    job->act = reinterpret_cast<const uint8_t*>(x);
    job->act_stride = x_stride * static_cast<int64_t>(sizeof(float));
    return;
  }
  const int64_t bytes = k.act_row_bytes(cols);
  uint8_t* act = act_scratch(bytes * n_tok);
  auto quantize = [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) k.quantize(x + t * x_stride, cols, act + t * bytes);
  };
  if (n_threads > 1 && n_tok > 1 && n_tok * cols >= kMinParallelQuant) {
    pool->parallel_for(n_tok, 1, quantize);
  } else {
    quantize(0, n_tok);
  }
  job->act = act;
  job->act_stride = bytes;
}

// The output rows of jobs[i] (rows[i] of them) in one pool run. Rows go out in chunks (about 4
// per thread per job, whole tiles) from a shared counter, dynamically (a descheduled thread
// does not hold up the rest): that changes who computes a row, never how, so results stay
// bit-identical. Chunk c belongs to job i where first[i] <= c < first[i + 1].
void run_row_chunks(const TypeKernels& k, std::span<const MatmulJob> jobs,
                    std::span<const int64_t> rows, int n_threads, ThreadPool* pool) {
  TROUPE_CHECK(jobs.size() == rows.size() && jobs.size() <= kMaxSharedTargets,
               "matmul: %zu jobs, %zu row counts", jobs.size(), rows.size());
  std::array<int64_t, kMaxSharedTargets> chunk{};
  std::array<int64_t, kMaxSharedTargets + 1> first{};
  for (size_t i = 0; i < jobs.size(); ++i) {
    const int64_t c = (rows[i] + 4 * n_threads - 1) / (4 * n_threads);
    chunk[i] = (c + k.row_tile - 1) / k.row_tile * k.row_tile;
    first[i + 1] = first[i] + (rows[i] + chunk[i] - 1) / chunk[i];
  }
  const int64_t n_chunks = first[jobs.size()];
  std::atomic<int64_t> next{0};
  pool->run([&](int, int) {
    for (;;) {
      const int64_t c = next.fetch_add(1, std::memory_order_relaxed);
      if (c >= n_chunks) break;
      size_t i = 0;
      while (c >= first[i + 1]) ++i;
      const int64_t r0 = (c - first[i]) * chunk[i];
      k.rows(jobs[i], r0, std::min(rows[i], r0 + chunk[i]));
    }
  });
}

}  // namespace

void matmul_with(const KernelSet& ks, const model::WeightView& w, const float* x, int64_t x_stride,
                 int64_t n_tok, float* y, int64_t y_stride, ThreadPool* pool) {
  const int64_t rows = w.rows(), cols = w.cols();
  if (n_tok <= 0 || rows <= 0) return;
  const TypeKernels& k = kernels_for(ks, w);
  TROUPE_CHECK(x_stride >= cols && y_stride >= rows, "matmul %s: strides x %lld y %lld",
               w.name.c_str(), static_cast<long long>(x_stride), static_cast<long long>(y_stride));
  if (cols == 0) {
    for (int64_t t = 0; t < n_tok; ++t) std::fill_n(y + t * y_stride, rows, 0.f);
    return;
  }
  const int n_threads = pool != nullptr ? pool->size() : 1;

  MatmulJob job;
  job.w = w.data;
  job.w_row_bytes = w.row_bytes();
  job.y = y;
  job.y_stride = y_stride;
  prepare_activations(k, x, x_stride, cols, n_tok, n_threads, pool, &job);

  if (n_threads == 1 || rows * n_tok * cols < kMinParallelMacs) {
    k.rows(job, 0, rows);
    return;
  }
  if (rows >= 2 * k.row_tile * n_threads) {  // split output rows
    run_row_chunks(k, {&job, 1}, {&rows, 1}, n_threads, pool);
  } else {  // few rows, many tokens (a router, a gate): split tokens
    const int64_t chunk = std::max<int64_t>(1, n_tok / (4 * n_threads));
    std::atomic<int64_t> next{0};
    pool->run([&](int, int) {
      for (;;) {
        const int64_t t0 = next.fetch_add(chunk, std::memory_order_relaxed);
        if (t0 >= n_tok) break;
        MatmulJob part = job;
        part.act += t0 * job.act_stride;
        part.y += t0 * y_stride;
        part.n_tok = std::min(n_tok, t0 + chunk) - t0;
        k.rows(part, 0, rows);
      }
    });
  }
}

void matmul_shared_with(const KernelSet& ks, std::span<const MatmulTarget> targets, const float* x,
                        int64_t x_stride, int64_t n_tok, ThreadPool* pool) {
  const int n_threads = pool != nullptr ? pool->size() : 1;
  // One run for all only where each would split rows anyway, with one activation preparation.
  bool together =
      n_threads > 1 && n_tok > 0 && !targets.empty() && targets.size() <= kMaxSharedTargets;
  int64_t macs = 0;
  for (const MatmulTarget& t : targets) {
    if (!together) break;
    const TypeKernels* k = ks.find(t.w.type, t.w.layout);
    together = k != nullptr && t.w.type == targets[0].w.type && t.w.layout == targets[0].w.layout &&
               t.w.cols() == targets[0].w.cols() && t.w.cols() > 0 &&
               t.w.rows() >= 2 * k->row_tile * n_threads && x_stride >= t.w.cols() &&
               t.y_stride >= t.w.rows();
    macs += t.w.rows() * t.w.cols() * n_tok;
  }
  if (!together || macs < kMinParallelMacs) {
    for (const MatmulTarget& t : targets)
      matmul_with(ks, t.w, x, x_stride, n_tok, t.y, t.y_stride, pool);
    return;
  }
  const TypeKernels& k = kernels_for(ks, targets[0].w);
  MatmulJob shared;
  prepare_activations(k, x, x_stride, targets[0].w.cols(), n_tok, n_threads, pool, &shared);
  std::array<MatmulJob, kMaxSharedTargets> jobs;
  std::array<int64_t, kMaxSharedTargets> rows{};
  for (size_t i = 0; i < targets.size(); ++i) {
    const MatmulTarget& t = targets[i];
    jobs[i] = shared;
    jobs[i].w = t.w.data;
    jobs[i].w_row_bytes = t.w.row_bytes();
    jobs[i].y = t.y;
    jobs[i].y_stride = t.y_stride;
    rows[i] = t.w.rows();
  }
  run_row_chunks(k, {jobs.data(), targets.size()}, {rows.data(), targets.size()}, n_threads, pool);
}

}  // namespace detail

void get_row(const model::WeightView& w, int64_t r, float* out) {
  if (w.layout == model::WeightLayout::kRows) {
    model::dequantize_row(w.type, w.row(r), out, w.cols());
    return;
  }
  thread_local std::vector<uint8_t> row;
  model::untile_row(w, 0, r, detail::scratch(row, w.row_bytes()));
  model::dequantize_row(w.type, row.data(), out, w.cols());
}

bool int8_tiles_supported() {
  const detail::KernelSet& ks = detail::active_kernels();
  return ks.q8_0_t16.rows != nullptr && ks.q4_0_t16.rows != nullptr &&
         ks.q4_k_t16.rows != nullptr && std::string_view(ks.name) != "scalar";
}

void matmul(const model::WeightView& w, const float* x, int64_t x_stride, int64_t n_tok, float* y,
            int64_t y_stride, ThreadPool* pool) {
  detail::matmul_with(detail::active_kernels(), w, x, x_stride, n_tok, y, y_stride, pool);
}

void matmul_shared(std::span<const MatmulTarget> targets, const float* x, int64_t x_stride,
                   int64_t n_tok, ThreadPool* pool) {
  detail::matmul_shared_with(detail::active_kernels(), targets, x, x_stride, n_tok, pool);
}

const char* simd_level() {
  const char* name = detail::active_kernels().name;
  return std::string_view(name).starts_with("avx512") ? "avx512" : name;
}

}  // namespace troupe::compute
