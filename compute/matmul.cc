// matmul(): run-time SIMD dispatch, activation preparation and threading. The scalar kernels
// live in matmul_scalar.cc, the SIMD ones in matmul_avx2.cc and the *_avx512.cc files (see
// detail/matmul_kernels.h).
#include "compute/matmul.h"

#include <cpuid.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "base/check.h"
#include "compute/detail/matmul_kernels.h"
#include "compute/thread_pool.h"
#include "model/model.h"
#include "model/weight_tiles.h"

namespace troupe::compute {
namespace detail {

const TypeKernels* KernelSet::find(model::GgmlType t, model::WeightLayout layout) const {
  using model::GgmlType;
  const TypeKernels* k = nullptr;
  if (layout == model::WeightLayout::kTiles16) {
    if (t == GgmlType::kQ8_0) k = &q8_0_t16;
    if (t == GgmlType::kQ4_0) k = &q4_0_t16;
    if (t == GgmlType::kQ4_1) k = &q4_1_t16;
    if (t == GgmlType::kQ5_0) k = &q5_0_t16;
    if (t == GgmlType::kQ5_1) k = &q5_1_t16;
    if (t == GgmlType::kQ4_K) k = &q4_k_t16;
    if (t == GgmlType::kQ5_K) k = &q5_k_t16;
    if (t == GgmlType::kQ6_K) k = &q6_k_t16;
    if (t == GgmlType::kF16) k = &f16_t16;
    if (t == GgmlType::kBF16) k = &bf16_t16;
    if (t == GgmlType::kF8_E4M3) k = &f8_t16;
    if (t == GgmlType::kI4_PACKED) k = &i4_t16;
    if (t == GgmlType::kFP4_PACKED) k = &fp4_t16;
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
    case GgmlType::kF8_E4M3:
      k = &f8;
      break;
    case GgmlType::kI4_PACKED:
      k = &i4;
      break;
    case GgmlType::kFP4_PACKED:
      k = &fp4;
      break;
    case GgmlType::kQ8_0:
      k = &q8_0;
      break;
    case GgmlType::kQ4_0:
      k = &q4_0;
      break;
    case GgmlType::kQ4_1:
      k = &q4_1;
      break;
    case GgmlType::kQ5_0:
      k = &q5_0;
      break;
    case GgmlType::kQ5_1:
      k = &q5_1;
      break;
    case GgmlType::kIQ4_NL:
      k = &iq4_nl;
      break;
    case GgmlType::kMXFP4:
      k = &mxfp4;
      break;
    case GgmlType::kIQ4_XS:
      k = &iq4_xs;
      break;
    case GgmlType::kQ2_K:
      k = &q2_k;
      break;
    case GgmlType::kQ3_K:
      k = &q3_k;
      break;
    case GgmlType::kQ4_K:
      k = &q4_k;
      break;
    case GgmlType::kQ5_K:
      k = &q5_k;
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

// --- dispatch ---

bool cpu_has_f16c() {
  // Clang 14's __builtin_cpu_supports does not know "f16c": ask cpuid (leaf 1, ecx bit 29).
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
}

bool cpu_has_avx_vnni() {
  // AVX-VNNI (VEX-encoded vpdpbusd): cpuid leaf 7, subleaf 1, eax bit 4.
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid_count(7, 1, &a, &b, &c, &d) != 0 && (a & (1u << 4)) != 0;
}

struct CpuSets {
  const KernelSet* sets[8];
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
  if (avx2 && cpu_has_avx_vnni()) s.sets[s.n++] = &avx2_kernels(true);
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
    // env: TROUPE_SIMD = scalar | avx2 | avx2-vnni | avx512 | avx512-novnni | avx512-vnni (without
    // GFNI) | avx512-vnni-gfni (default: the best this CPU runs). Lets tests and benchmarks pin a
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
  const bool nibbles =
      w.type == model::GgmlType::kI4_PACKED || w.type == model::GgmlType::kFP4_PACKED;
  if (w.scaled() && (w.scales == nullptr || w.scale_block[0] <= 0 || w.scale_block[1] <= 0 ||
                     w.scale_block[1] % kScaleColsMultiple != 0 ||
                     w.scale_stride < (w.cols() + w.scale_block[1] - 1) / w.scale_block[1] ||
                     (nibbles && w.cols() % kScaleColsMultiple != 0)))
    TROUPE_INPUT_ERROR(
        "matmul: weight %s is %s without usable scales (blocks of %lld x %lld, %lld per "
        "block row, %lld columns; columns per block%s must be a multiple of %lld)",
        w.name.c_str(), model::type_name(w.type).c_str(), static_cast<long long>(w.scale_block[0]),
        static_cast<long long>(w.scale_block[1]), static_cast<long long>(w.scale_stride),
        static_cast<long long>(w.cols()), nibbles ? " and columns" : "",
        static_cast<long long>(kScaleColsMultiple));
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

// A thread's share of run_rows' work units, [lo, hi) packed in one word (lo in the low half)
// so that its owner (from the front) and a thief (from the back) change it by compare-exchange.
struct alignas(64) UnitRange {
  std::atomic<uint64_t> v{0};

  static uint64_t pack(int64_t lo, int64_t hi) {
    return static_cast<uint64_t>(lo) | static_cast<uint64_t>(hi) << 32;
  }
  static int64_t lo(uint64_t v) { return static_cast<int64_t>(v & 0xFFFFFFFFu); }
  static int64_t hi(uint64_t v) { return static_cast<int64_t>(v >> 32); }
};

// The output rows of jobs[i] (rows[i] of them) in one pool run, in units of one row tile
// numbered across the jobs (job i's are [first[i], first[i + 1])). Each thread owns a contiguous
// share and takes it from the front, so its weights stream as one sequence: the kernels'
// prefetches run on from one call into the next. It takes `step` units at a time, and near the
// end of its share half of what is left, so the last takes are single units. A thread whose
// share is done takes the back half of the largest share left (work stealing) while any has 2
// units or more, so a slower or descheduled thread does not hold up the rest, while the streams
// stay long. Threads then finish within about one unit of each other. (Before, all threads
// took chunks of a quarter of a share from one counter: each chunk restarted a stream, and
// batch-1 decode was 5-8 % slower; docs/benchmarks.md "Engine, session 29". Until session 30
// the owner took 1/32 of its share at a time to the end and a thief left shares of one step:
// threads finished twice as far apart, "Engine, session 30".) Who computes a row never changes
// how: results stay bit-identical.
void run_rows(const TypeKernels& k, std::span<const MatmulJob> jobs, std::span<const int64_t> rows,
              int n_threads, ThreadPool* pool) {
  TROUPE_CHECK(jobs.size() == rows.size() && !jobs.empty(), "matmul: %zu jobs, %zu row counts",
               jobs.size(), rows.size());
  const int64_t tile = std::max(1, k.row_tile);
  thread_local std::vector<int64_t> first_of;  // reused: no allocation per call
  first_of.assign(jobs.size() + 1, 0);
  const std::span<int64_t> first(first_of);
  for (size_t i = 0; i < jobs.size(); ++i) first[i + 1] = first[i] + (rows[i] + tile - 1) / tile;
  const int64_t units = first[jobs.size()];
  TROUPE_CHECK(units < (int64_t{1} << 31), "matmul: %lld row tiles in one product",
               static_cast<long long>(units));
  const int64_t step = std::max<int64_t>(1, units / (8 * n_threads));

  thread_local std::unique_ptr<UnitRange[]> ranges;
  thread_local int capacity = 0;
  if (capacity < n_threads) {
    ranges = std::make_unique<UnitRange[]>(static_cast<size_t>(n_threads));
    capacity = n_threads;
  }
  for (int t = 0; t < n_threads; ++t)
    ranges[t].v.store(UnitRange::pack(units * t / n_threads, units * (t + 1) / n_threads),
                      std::memory_order_relaxed);
  UnitRange* shares = ranges.get();

  auto compute = [&](int64_t u0, int64_t u1) {
    // The job holding unit u0: the last whose first unit is <= u0.
    auto i =
        static_cast<size_t>(std::upper_bound(first.begin(), first.end(), u0) - first.begin() - 1);
    while (u0 < u1) {
      while (u0 >= first[i + 1]) ++i;
      const int64_t u_end = std::min(u1, first[i + 1]);
      k.rows(jobs[i], (u0 - first[i]) * tile, std::min(rows[i], (u_end - first[i]) * tile));
      u0 = u_end;
    }
  };
  // Moves the back half of the largest other share into `mine` (empty), unless every other
  // share is a single unit or none; false when there was none to take.
  auto steal = [&](int idx, int nt, UnitRange& mine) {
    for (;;) {
      int victim = -1;
      int64_t most = 1;
      uint64_t seen = 0;
      for (int d = 1; d < nt; ++d) {
        const int t = (idx + d) % nt;
        const uint64_t w = shares[t].v.load(std::memory_order_acquire);
        if (UnitRange::hi(w) - UnitRange::lo(w) > most) {
          victim = t;
          most = UnitRange::hi(w) - UnitRange::lo(w);
          seen = w;
        }
      }
      if (victim < 0) return false;
      const int64_t lo = UnitRange::lo(seen), hi = UnitRange::hi(seen), mid = hi - most / 2;
      if (shares[victim].v.compare_exchange_strong(seen, UnitRange::pack(lo, mid),
                                                   std::memory_order_acq_rel)) {
        mine.v.store(UnitRange::pack(mid, hi), std::memory_order_release);
        return true;
      }
    }
  };
  pool->run([&](int idx, int nt) {
    UnitRange& mine = shares[idx];
    do {
      uint64_t v = mine.v.load(std::memory_order_acquire);
      while (UnitRange::lo(v) < UnitRange::hi(v)) {
        const int64_t lo = UnitRange::lo(v), left = UnitRange::hi(v) - lo;
        const int64_t n = std::min(step, std::max<int64_t>(1, left / 2));
        if (mine.v.compare_exchange_weak(v, UnitRange::pack(lo + n, UnitRange::hi(v)),
                                         std::memory_order_acq_rel)) {
          compute(lo, lo + n);
          v = mine.v.load(std::memory_order_acquire);
        }
      }
    } while (steal(idx, nt, mine));
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
  set_job_weight(job, w);
  job.y = y;
  job.y_stride = y_stride;
  prepare_activations(k, x, x_stride, cols, n_tok, n_threads, pool, &job);

  if (n_threads == 1 || rows * n_tok * cols < kMinParallelMacs) {
    k.rows(job, 0, rows);
    return;
  }
  if (rows >= 2 * k.row_tile * n_threads) {  // split output rows
    run_rows(k, {&job, 1}, {&rows, 1}, n_threads, pool);
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

namespace {

// matmul_many_with for products of one type and layout.
void many_of_one_type(const KernelSet& ks, std::span<const MatmulProduct> ps, ThreadPool* pool) {
  const int n_threads = pool != nullptr ? pool->size() : 1;
  // One run for all where their row tiles together give each thread two or more. A product
  // of few rows joins the others (MLA's per-head matrices: 128 rows each, 2 x 128 of them in
  // a DeepSeek-V3 layer, were one pool run each).
  bool together = n_threads > 1 && ps.size() > 1;
  int64_t macs = 0, units = 0;
  for (const MatmulProduct& p : ps) {
    if (!together) break;
    const model::WeightView& w = *p.w;
    const TypeKernels* k = ks.find(w.type, w.layout);
    together = k != nullptr && w.type == ps[0].w->type && w.layout == ps[0].w->layout &&
               w.cols() > 0 && w.rows() > 0 && p.n_tok > 0 && p.x_stride >= w.cols() &&
               p.y_stride >= w.rows();
    if (!together) break;
    macs += w.rows() * w.cols() * p.n_tok;
    const int64_t tile = std::max(1, k->row_tile);
    units += (w.rows() + tile - 1) / tile;
  }
  if (!together || macs < kMinParallelMacs || units < 2 * n_threads) {
    for (const MatmulProduct& p : ps)
      matmul_with(ks, *p.w, p.x, p.x_stride, p.n_tok, p.y, p.y_stride, pool);
    return;
  }
  const TypeKernels& k = kernels_for(ks, *ps[0].w);
  for (const MatmulProduct& p : ps.subspan(1)) kernels_for(ks, *p.w);  // (F8: the scales)
  // The jobs, and for quantized weights each input's activation rows in one scratch: a product
  // with the same input as the one before it (gate and up of one expert) shares its rows.
  thread_local std::vector<MatmulJob> jobs;
  thread_local std::vector<int64_t> rows;
  struct QuantRow {
    const float* x;
    int64_t offset;  // in the activation scratch
    int64_t cols;
  };
  thread_local std::vector<QuantRow> to_quantize;
  thread_local std::vector<int64_t> act_at;  // job i's activation rows in the scratch
  jobs.assign(ps.size(), MatmulJob{});
  rows.assign(ps.size(), 0);
  act_at.assign(ps.size(), 0);
  to_quantize.clear();
  int64_t act_bytes = 0, values = 0;
  auto same_input = [&](size_t i) {
    return i > 0 && ps[i].x == ps[i - 1].x && ps[i].x_stride == ps[i - 1].x_stride &&
           ps[i].n_tok == ps[i - 1].n_tok && ps[i].w->cols() == ps[i - 1].w->cols();
  };
  for (size_t i = 0; i < ps.size(); ++i) {
    const MatmulProduct& p = ps[i];
    MatmulJob& j = jobs[i];
    j.cols = p.w->cols();
    j.n_tok = p.n_tok;
    if (k.quantize == nullptr) {
      j.act = reinterpret_cast<const uint8_t*>(p.x);
      j.act_stride = p.x_stride * static_cast<int64_t>(sizeof(float));
    } else if (same_input(i)) {
      act_at[i] = act_at[i - 1];
      j.act_stride = jobs[i - 1].act_stride;
    } else {
      j.act_stride = k.act_row_bytes(j.cols);
      act_at[i] = act_bytes;
      for (int64_t t = 0; t < p.n_tok; ++t)
        to_quantize.push_back({p.x + t * p.x_stride, act_bytes + t * j.act_stride, j.cols});
      act_bytes += p.n_tok * j.act_stride;
      values += p.n_tok * j.cols;
    }
    set_job_weight(j, *p.w);
    j.y = p.y;
    j.y_stride = p.y_stride;
    rows[i] = p.w->rows();
  }
  if (k.quantize != nullptr) {
    uint8_t* act = act_scratch(act_bytes);
    for (size_t i = 0; i < jobs.size(); ++i) jobs[i].act = act + act_at[i];
    const QuantRow* rows_q = to_quantize.data();  // (the lambda may run on other threads)
    auto quantize = [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const QuantRow& q = rows_q[r];
        k.quantize(q.x, q.cols, act + q.offset);
      }
    };
    const auto n_rows = static_cast<int64_t>(to_quantize.size());
    if (n_rows > 1 && values >= kMinParallelQuant)
      pool->parallel_for(n_rows, 1, quantize);
    else
      quantize(0, n_rows);
  }
  run_rows(k, jobs, rows, n_threads, pool);
}

}  // namespace

void matmul_many_with(const KernelSet& ks, std::span<const MatmulProduct> ps, ThreadPool* pool) {
  // One run per type and layout, the products of each in their order (so that gate and up of
  // one expert stay neighbours).
  bool one_type = true;
  for (const MatmulProduct& p : ps)
    one_type = one_type && p.w->type == ps[0].w->type && p.w->layout == ps[0].w->layout;
  if (one_type) {
    many_of_one_type(ks, ps, pool);
    return;
  }
  std::vector<MatmulProduct> group;
  std::vector<bool> done(ps.size(), false);
  for (size_t i = 0; i < ps.size(); ++i) {
    if (done[i]) continue;
    group.clear();
    for (size_t j = i; j < ps.size(); ++j)
      if (!done[j] && ps[j].w->type == ps[i].w->type && ps[j].w->layout == ps[i].w->layout) {
        group.push_back(ps[j]);
        done[j] = true;
      }
    many_of_one_type(ks, group, pool);
  }
}

void matmul_shared_with(const KernelSet& ks, std::span<const MatmulTarget> targets, const float* x,
                        int64_t x_stride, int64_t n_tok, ThreadPool* pool) {
  thread_local std::vector<MatmulProduct> ps;
  ps.clear();
  for (const MatmulTarget& t : targets) ps.push_back({&t.w, x, x_stride, n_tok, t.y, t.y_stride});
  matmul_many_with(ks, ps, pool);
}

}  // namespace detail

void get_row(const model::WeightView& w, int64_t r, float* out) {
  if (w.layout == model::WeightLayout::kRows) {
    model::dequantize_view_row(w, r, out);
    return;
  }
  thread_local std::vector<uint8_t> row;
  model::untile_row(w, 0, r, detail::scratch(row, w.row_bytes()));
  model::dequantize_view_row(w, r, row.data(), out);
}

bool weight_tiles_supported() {
  const detail::KernelSet& ks = detail::active_kernels();
  return ks.q8_0_t16.rows != nullptr && ks.q4_0_t16.rows != nullptr &&
         ks.q4_1_t16.rows != nullptr && ks.q5_0_t16.rows != nullptr &&
         ks.q5_1_t16.rows != nullptr && ks.q4_k_t16.rows != nullptr &&
         ks.q5_k_t16.rows != nullptr && ks.q6_k_t16.rows != nullptr && ks.f16_t16.rows != nullptr &&
         ks.bf16_t16.rows != nullptr && std::string_view(ks.name) != "scalar";
}

model::TileTypes tiled_weight_types() { return detail::tiled_types(detail::active_kernels()); }

namespace detail {
model::TileTypes tiled_types(const KernelSet& ks) {
  model::TileTypes types;
  if (std::string_view(ks.name) == "scalar") return types;  // its tile kernels are the slow ones
  using model::GgmlType;
  const std::pair<GgmlType, const detail::TypeKernels*> own[] = {
      {GgmlType::kQ8_0, &ks.q8_0_t16},     {GgmlType::kQ4_0, &ks.q4_0_t16},
      {GgmlType::kQ4_1, &ks.q4_1_t16},     {GgmlType::kQ5_0, &ks.q5_0_t16},
      {GgmlType::kQ5_1, &ks.q5_1_t16},     {GgmlType::kQ4_K, &ks.q4_k_t16},
      {GgmlType::kQ5_K, &ks.q5_k_t16},     {GgmlType::kQ6_K, &ks.q6_k_t16},
      {GgmlType::kF16, &ks.f16_t16},       {GgmlType::kBF16, &ks.bf16_t16},
      {GgmlType::kF8_E4M3, &ks.f8_t16},    {GgmlType::kI4_PACKED, &ks.i4_t16},
      {GgmlType::kFP4_PACKED, &ks.fp4_t16}};
  for (const auto& [t, k] : own)
    if (k->rows != nullptr) types.add(t);
  return types;
}
}  // namespace detail

void matmul(const model::WeightView& w, const float* x, int64_t x_stride, int64_t n_tok, float* y,
            int64_t y_stride, ThreadPool* pool) {
  detail::matmul_with(detail::active_kernels(), w, x, x_stride, n_tok, y, y_stride, pool);
}

void matmul_shared(std::span<const MatmulTarget> targets, const float* x, int64_t x_stride,
                   int64_t n_tok, ThreadPool* pool) {
  detail::matmul_shared_with(detail::active_kernels(), targets, x, x_stride, n_tok, pool);
}

void matmul_many(std::span<const MatmulProduct> products, ThreadPool* pool) {
  detail::matmul_many_with(detail::active_kernels(), products, pool);
}

const char* simd_level() {
  const char* name = detail::active_kernels().name;
  const std::string_view n(name);
  return n.starts_with("avx512") ? "avx512" : n.starts_with("avx2") ? "avx2" : name;
}

}  // namespace troupe::compute
