// matmul_bench: compute::matmul for every supported weight type on a 2048x5632 and a 5632x2048
// matrix (rows x cols) at n_tok 1, 16 and 512 with 1 and 2 threads. Batch-1 decode is
// reported as weight GB/s against the measured memory bandwidth (weights are streamed from
// DRAM: the bench cycles through copies larger than the last-level cache); larger batches as
// GFLOP/s against a measured FMA peak. Every figure is the median of >= 5 timed passes.
// FP4_PACKED runs with gpt-oss's scales (an E8M0 byte per 32 columns) and as NVFP4 ("nvfp4": an
// E4M3 byte per 16 columns under a global scale; GB/s counts the FP4 bytes only, the scales add an
// eighth). Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, F16, BF16, F8_E4M3, I4_PACKED and
// FP4_PACKED also run in 16-row tiles (model/weight_tiles.h), named q8_0/t16 etc., the layout the
// CPU engine's weights copy uses where the SIMD level reads it fast (compute::tiled_weight_types);
// quantized types also report GOP/s against the measured int8 dot-product peak.
// Usage: matmul_bench [--tokens 1,16,512] [--shapes 2048x5632,5632x2048] [--cold-mib 320]
//        [type ...]
//        (types: f32 f16 f16/t16 bf16 bf16/t16 f8_e4m3 f8_e4m3/t16 i4_packed i4_packed/t16
//        q8_0 q4_0 q8_0/t16 q4_0/t16 q4_1 q4_1/t16 q5_0 q5_0/t16 q5_1 q5_1/t16 iq4_nl mxfp4
//        fp4_packed fp4_packed/t16 nvfp4 nvfp4/t16 q2_K q3_K iq4_xs q4_K q4_K/t16 q5_K q5_K/t16
//        q6_K q6_K/t16; default all, an unknown name is refused; n_tok values up to 512, 1 always
//        timed; --cold-mib: what the copies cycled through for cold weights add up to, at least the
//        last-level cache -- 1 makes a quick smoke run)
//        TROUPE_SIMD=scalar|avx2|avx2-vnni|avx512|avx512-novnni|avx512-vnni (no GFNI) pins the
//        kernel path (see compute/matmul.cc).
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "base/huge_pages.h"
#include "bench/detail/args.h"
#include "bench/detail/cpu_info.h"
#include "bench/detail/membw.h"
#include "bench/detail/peaks.h"
#include "compute/matmul.h"
#include "compute/thread_pool.h"
#include "model/ggml_types.h"
#include "model/model_spec.h"
#include "model/weight_tiles.h"

namespace {

using troupe::compute::ThreadPool;
using troupe::model::GgmlType;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// --- the machine's limits ---

// Read bandwidth over a 512 MiB buffer (bench/detail/membw.h, as membw_bench), GB/s.
double memory_bandwidth(ThreadPool& pool) {
  return troupe::bench::measure_read_bandwidth(pool, 512, 7).median;
}

// The f32 FMA peak (bench/detail/peaks.h), GFLOP/s.
double fma_peak(ThreadPool& pool, const std::string& level) {
  return troupe::bench::compute_peak(pool, level, troupe::bench::PeakKind::kF32Fma);
}

// --- weights ---

struct Matrix {
  // Each one rows x cols in `type`, all in one mapping advised to use huge pages
  // (base/huge_pages.h), as the engine's weights copy: 4 KiB pages change how a stream's
  // prefetches behave. A copy of 2 MiB or more starts on a huge-page boundary of the mapping;
  // smaller ones on a 4 KiB page (a huge page each would map 2 MiB per copy: a 64x256 Q4_0
  // matrix needs ~36000 copies to outgrow the caches).
  std::vector<uint8_t*> copies;
  std::shared_ptr<uint8_t> owner;
  troupe::model::WeightView view;
  int64_t bytes = 0;
  // f8_e4m3: one per 128 x 128 block; i4_packed: one per 32 columns, bf16 (all copies)
  std::shared_ptr<std::vector<float>> scales;
  std::shared_ptr<std::vector<uint16_t>> scales_bf16;
  std::shared_ptr<std::vector<uint8_t>> scales_u8;
};

Matrix make_matrix(GgmlType t, bool tiled, int64_t rows, int64_t cols, int64_t min_total_bytes,
                   bool nvfp4 = false) {
  Matrix m;
  m.view.name = "bench";
  m.view.type = t;
  m.view.ne[0] = cols;
  m.view.ne[1] = rows;
  m.bytes = m.view.row_bytes() * rows;
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  const uint64_t bytes = static_cast<uint64_t>(m.bytes);
  const uint64_t align = bytes >= troupe::kHugePageBytes ? troupe::kHugePageBytes : 4096;
  const uint64_t stride = (bytes + align - 1) / align * align;
  const uint64_t n_copies =
      std::max<uint64_t>(1, (static_cast<uint64_t>(min_total_bytes) + bytes - 1) / bytes);
  m.owner = troupe::map_huge_pages(n_copies * stride);
  if (m.owner == nullptr) {
    std::fprintf(stderr, "matmul_bench: cannot map %llu copies of %llu bytes\n",
                 static_cast<unsigned long long>(n_copies), static_cast<unsigned long long>(bytes));
    std::exit(1);
  }
  uint8_t* first = m.owner.get();
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* dst = first + r * m.view.row_bytes();
    if (t == GgmlType::kF8_E4M3) {  // as a checkpoint's: values up to its block's largest, rounded
      for (int64_t i = 0; i < cols; ++i) dst[i] = troupe::model::fp32_to_fp8_e4m3(448.f * uni(rng));
    } else if (t == GgmlType::kI4_PACKED || t == GgmlType::kFP4_PACKED) {  // random nibbles
      for (int64_t i = 0; i < m.view.row_bytes(); ++i) dst[i] = static_cast<uint8_t>(rng());
    } else if (troupe::model::type_traits(static_cast<uint32_t>(t))->block_elems ==
               troupe::model::kQK_K) {
      for (int64_t i = 0; i < m.view.row_bytes(); ++i) dst[i] = static_cast<uint8_t>(rng());
      const uint16_t d = troupe::model::fp32_to_fp16(1e-3f);
      for (int64_t b = 0; b < cols / troupe::model::kQK_K; ++b) {
        if (t == GgmlType::kQ4_K) {
          auto* blk = reinterpret_cast<troupe::model::BlockQ4_K*>(dst) + b;
          blk->d = blk->dmin = d;
        } else if (t == GgmlType::kQ5_K) {
          auto* blk = reinterpret_cast<troupe::model::BlockQ5_K*>(dst) + b;
          blk->d = blk->dmin = d;
        } else if (t == GgmlType::kQ2_K) {
          auto* blk = reinterpret_cast<troupe::model::BlockQ2_K*>(dst) + b;
          blk->d = blk->dmin = d;
        } else if (t == GgmlType::kQ3_K) {
          reinterpret_cast<troupe::model::BlockQ3_K*>(dst)[b].d = d;
        } else if (t == GgmlType::kIQ4_XS) {
          reinterpret_cast<troupe::model::BlockIQ4_XS*>(dst)[b].d = d;
        } else {
          reinterpret_cast<troupe::model::BlockQ6_K*>(dst)[b].d = d;
        }
      }
    } else {
      for (auto& v : row) v = uni(rng);
      troupe::model::quantize_row(t, row.data(), dst, cols);
    }
  }
  if (t == GgmlType::kF8_E4M3) {  // DeepSeek-V3's blocks (as Hugging Face fp8 checkpoints)
    const int64_t gr = (rows + 127) / 128, gc = (cols + 127) / 128;
    m.scales = std::make_shared<std::vector<float>>(static_cast<size_t>(gr * gc), 1.f / 448);
    m.view.scales = m.scales->data();
    m.view.scale_block[0] = m.view.scale_block[1] = 128;
    m.view.scale_stride = gc;
  }
  if (t == GgmlType::kI4_PACKED) {  // Kimi-K2-Thinking's experts: a bf16 scale per 32 columns
    m.scales_bf16 = std::make_shared<std::vector<uint16_t>>(static_cast<size_t>(rows * cols / 32),
                                                            troupe::model::fp32_to_bf16(1e-2f));
    m.view.scales = m.scales_bf16->data();
    m.view.scale_type = GgmlType::kBF16;
    m.view.scale_block[0] = 1;
    m.view.scale_block[1] = 32;
    m.view.scale_stride = cols / 32;
  }
  if (t == GgmlType::kFP4_PACKED && !nvfp4) {  // gpt-oss's experts: an E8M0 byte per 32
    m.scales_u8 =
        std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(rows * cols / 32), uint8_t{120});
    m.view.scales = m.scales_u8->data();
    m.view.scale_type = GgmlType::kE8M0;
    m.view.scale_block[0] = 1;
    m.view.scale_block[1] = 32;
    m.view.scale_stride = cols / 32;
  }
  if (nvfp4) {  // NVFP4 (ModelOpt): an E4M3 byte per 16 columns, times a global scale
    std::uniform_int_distribution<int> code(0x30, 0x58);  // 0.5 .. 16: normal E4M3 scales
    m.scales_u8 = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(rows * cols / 16));
    for (auto& c : *m.scales_u8) c = static_cast<uint8_t>(code(rng));
    m.view.scales = m.scales_u8->data();
    m.view.scale_type = GgmlType::kF8_E4M3;
    m.view.scale_block[0] = 1;
    m.view.scale_block[1] = 16;
    m.view.scale_stride = cols / 16;
    m.view.scale_mul = 1.0f / 2688;
  }
  if (tiled) {
    troupe::model::tile_in_place(t, first, rows, cols, 1);
    m.view.layout = troupe::model::WeightLayout::kTiles16;
  }
  m.copies.push_back(first);
  for (uint64_t i = 1; i < n_copies; ++i) {
    uint8_t* c = first + i * stride;
    std::memcpy(c, first, bytes);
    m.copies.push_back(c);
  }
  return m;
}

void free_matrix(Matrix& m) {
  m.copies.clear();
  m.owner.reset();
}

// Median seconds of one matmul, timing passes over all copies (cold weights).
double time_matmul(Matrix& m, const std::vector<float>& x, int64_t n_tok, std::vector<float>& y,
                   ThreadPool* pool, int passes) {
  std::vector<double> per_call;
  const int n_copies = static_cast<int>(m.copies.size());
  for (int pass = 0; pass <= passes; ++pass) {
    const auto t0 = Clock::now();
    for (int c = 0; c < n_copies; ++c) {
      m.view.data = m.copies[static_cast<size_t>(c)];
      troupe::compute::matmul(m.view, x.data(), n_tok, y.data(), pool);
    }
    if (pass > 0) per_call.push_back(seconds_since(t0) / n_copies);  // pass 0 warms up
  }
  return median(per_call);
}

// The weight types and layouts measured, in this order.
struct Kind {
  GgmlType type;
  bool tiled;
  bool nvfp4 = false;  // FP4_PACKED with NVFP4's scales instead of MXFP4's
};
constexpr Kind kKinds[] = {{GgmlType::kF32, false},
                           {GgmlType::kF16, false},
                           {GgmlType::kF16, true},
                           {GgmlType::kBF16, false},
                           {GgmlType::kBF16, true},
                           {GgmlType::kF8_E4M3, false},
                           {GgmlType::kF8_E4M3, true},
                           {GgmlType::kI4_PACKED, false},
                           {GgmlType::kI4_PACKED, true},
                           {GgmlType::kQ8_0, false},
                           {GgmlType::kQ4_0, false},
                           {GgmlType::kQ8_0, true},
                           {GgmlType::kQ4_0, true},
                           {GgmlType::kQ4_1, false},
                           {GgmlType::kQ4_1, true},
                           {GgmlType::kQ5_0, false},
                           {GgmlType::kQ5_0, true},
                           {GgmlType::kQ5_1, false},
                           {GgmlType::kQ5_1, true},
                           {GgmlType::kIQ4_NL, false},
                           {GgmlType::kMXFP4, false},
                           {GgmlType::kFP4_PACKED, false},
                           {GgmlType::kFP4_PACKED, true},
                           {GgmlType::kFP4_PACKED, false, true},
                           {GgmlType::kFP4_PACKED, true, true},
                           {GgmlType::kQ2_K, false},
                           {GgmlType::kQ3_K, false},
                           {GgmlType::kIQ4_XS, false},
                           {GgmlType::kQ4_K, false},
                           {GgmlType::kQ4_K, true},
                           {GgmlType::kQ5_K, false},
                           {GgmlType::kQ5_K, true},
                           {GgmlType::kQ6_K, false},
                           {GgmlType::kQ6_K, true}};

std::string kind_name(const Kind& k) {
  return (k.nvfp4 ? std::string("nvfp4") : troupe::model::type_name(k.type)) +
         (k.tiled ? "/t16" : "");
}

constexpr const char* kUsage =
    "usage: matmul_bench [--tokens 1,16,512] [--shapes 2048x5632,5632x2048] [--cold-mib 320] "
    "[type ...]";

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> want;
  std::vector<int64_t> tokens = {1, 16, 512};
  std::vector<std::array<int64_t, 2>> shapes = {{2048, 5632}, {5632, 2048}};  // rows x cols
  int64_t cold_mib = 320;
  const char* tool = "matmul_bench";
  namespace tb = troupe::bench;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf("%s\n", kUsage);
      return 0;
    } else if (a == "--tokens") {
      // n_tok values to time (1 is always timed first: the x_vs_n1 base).
      tokens = {1};
      for (const int64_t v : tb::int_list_arg(tool, a, tb::value_arg(tool, argc, argv, i), 1, 512))
        if (v > 1) tokens.push_back(v);
    } else if (a == "--shapes") {
      // rows x cols pairs, e.g. 2560x2048,2048x2048 (the engine's fused q/k/v and its o).
      shapes.clear();
      const std::string list = tb::value_arg(tool, argc, argv, i);
      for (const std::string& item : tb::split_commas(list)) {
        long long r = 0, c = 0;
        char tail = 0;
        if (std::sscanf(item.c_str(), "%lldx%lld%c", &r, &c, &tail) != 2 || r < 1 || c < 256 ||
            c % 256 != 0 || r > (1 << 20) || c > (1 << 20))
          tb::usage_error(
              tool, "--shapes wants ROWSxCOLS pairs (cols a multiple of 256), got '" + list + "'");
        shapes.push_back({r, c});
      }
    } else if (a == "--cold-mib") {
      // How much the copies of a matrix that the batch-1 passes cycle through add up to: more
      // than the last-level cache, so that the weights come from DRAM.
      cold_mib = tb::int_arg(tool, a, tb::value_arg(tool, argc, argv, i), 1, 65536);
    } else if (a.rfind("-", 0) == 0) {
      tb::usage_error(tool, "unknown option '" + a + "'; " + kUsage);
    } else {
      if (std::none_of(std::begin(kKinds), std::end(kKinds),
                       [&](const Kind& k) { return kind_name(k) == a; })) {
        std::string names;
        for (const Kind& k : kKinds) names += " " + kind_name(k);
        tb::usage_error(tool, "unknown type '" + a + "' (types:" + names + ")");
      }
      want.push_back(a);
    }
  }
  const std::string level = troupe::compute::simd_level();
#if defined(NDEBUG) && defined(__OPTIMIZE__)
  const char* build = "release (optimized, NDEBUG)";
  const bool release = true;
#else
  const char* build = "NOT RELEASE (no optimization or asserts on)";
  const bool release = false;
#endif
  std::printf("matmul_bench\n  cpu: %s, %u hardware threads\n  simd: %s\n  build: %s\n",
              troupe::bench::cpu_description().c_str(), std::thread::hardware_concurrency(),
              level.c_str(), build);
  if (!release) std::printf("  WARNING: not a Release build; these numbers mean nothing\n");

  ThreadPool pool1(1), pool2(2);
  ThreadPool* pools[2] = {&pool1, &pool2};
  double bw[2], peak[2], i8peak[2];
  for (int i = 0; i < 2; ++i) {
    bw[i] = memory_bandwidth(*pools[i]);
    peak[i] = fma_peak(*pools[i], level);
    i8peak[i] = troupe::bench::compute_peak(*pools[i], level, troupe::bench::PeakKind::kInt8Dot);
  }
  {
    // The hand-off cost every parallel section pays (workers spinning, as within a step).
    std::vector<double> us;
    for (int pass = 0; pass < 5; ++pass) {
      const auto t0 = Clock::now();
      for (int i = 0; i < 2000; ++i) pool2.run([](int, int) {});
      us.push_back(seconds_since(t0) / 2000 * 1e6);
    }
    std::printf("  thread pool: %.2f us per empty run (2 threads, median)\n", median(us));
  }
  std::printf("  memory read bandwidth: %.1f GB/s (1 thread), %.1f GB/s (2 threads)\n", bw[0],
              bw[1]);
  std::printf(
      "  f32 FMA peak (measured, best pass): %.0f GFLOP/s (1 thread), %.0f GFLOP/s (2 threads)\n",
      peak[0], peak[1]);
  std::printf(
      "  int8 dot peak (measured, best pass): %.0f GOP/s (1 thread), %.0f GOP/s (2 threads)\n\n",
      i8peak[0], i8peak[1]);

  std::printf("%-8s %-10s %5s %3s %9s %8s %8s %9s %9s %8s %7s %7s %9s\n", "type", "rows x cols",
              "n_tok", "thr", "ms", "GB/s", "of_bw", "hot_GB/s", "GFLOP/s", "of_peak", "of_i8",
              "hot_i8", "x_vs_n1");
  for (const Kind& kind : kKinds) {
    const GgmlType t = kind.type;
    const std::string name = kind_name(kind);
    const bool int8 = t != GgmlType::kF32 && t != GgmlType::kF16 && t != GgmlType::kBF16 &&
                      t != GgmlType::kF8_E4M3 && t != GgmlType::kI4_PACKED &&
                      t != GgmlType::kFP4_PACKED && t != GgmlType::kMXFP4;
    if (!want.empty() && std::find(want.begin(), want.end(), name) == want.end()) continue;
    for (const auto& shape : shapes) {
      const int64_t rows = shape[0], cols = shape[1];
      Matrix m = make_matrix(t, kind.tiled, rows, cols, cold_mib << 20, kind.nvfp4);
      std::mt19937 rng(7);
      std::uniform_real_distribution<float> uni(-1.f, 1.f);
      std::vector<float> x(static_cast<size_t>(512 * cols)), y(static_cast<size_t>(512 * rows));
      for (auto& v : x) v = uni(rng);
      for (int th = 0; th < 2; ++th) {
        double t1 = 0, hot_gbs = 0;
        for (int64_t n_tok : tokens) {
          const bool compute_bound = n_tok >= 64;  // one copy is enough
          Matrix single = m;
          single.copies.resize(1);
          const double s = time_matmul(compute_bound ? single : m, x, n_tok, y, pools[th],
                                       compute_bound ? 5 : 7);
          const double gbs = static_cast<double>(m.bytes) / s / 1e9;
          const double gflops = 2.0 * static_cast<double>(rows * cols * n_tok) / s / 1e9;
          if (n_tok == 1) t1 = s;
          char of_bw[16] = "", of_peak[16] = "", of_i8[16] = "", hot_i8[16] = "", speedup[16] = "";
          if (n_tok == 1) std::snprintf(of_bw, sizeof(of_bw), "%.0f%%", 100 * gbs / bw[th]);
          if (n_tok == 1) {
            // The same matmul on one copy, which stays in the caches after the first pass: the
            // kernel's own ceiling, with no DRAM traffic. Below the DRAM bandwidth, the kernel's
            // work -- not the memory -- limits batch-1 decode.
            Matrix hot = m;
            hot.copies.resize(1);
            hot_gbs = static_cast<double>(m.bytes) / time_matmul(hot, x, 1, y, pools[th], 21) / 1e9;
          }
          if (n_tok > 1) {
            if (peak[th] > 0)  // 0: not measured (scalar kernels)
              std::snprintf(of_peak, sizeof(of_peak), "%.0f%%", 100 * gflops / peak[th]);
            if (int8 && i8peak[th] > 0) {
              std::snprintf(of_i8, sizeof(of_i8), "%.0f%%", 100 * gflops / i8peak[th]);
              // The same on one cache-resident copy: what the kernel reaches when no weight
              // comes from DRAM, beside what it reaches streaming them (of_i8).
              const double hot_s =
                  compute_bound ? s : time_matmul(single, x, n_tok, y, pools[th], 21);
              const double hot_gops = 2.0 * static_cast<double>(rows * cols * n_tok) / hot_s / 1e9;
              std::snprintf(hot_i8, sizeof(hot_i8), "%.0f%%", 100 * hot_gops / i8peak[th]);
            }
            std::snprintf(speedup, sizeof(speedup), "%.1fx", t1 * static_cast<double>(n_tok) / s);
          }
          char hot_col[16] = "";
          if (n_tok == 1) std::snprintf(hot_col, sizeof(hot_col), "%.1f", hot_gbs);
          std::printf("%-8s %4lldx%-5lld %5lld %3d %9.3f %8.1f %8s %9s %9.1f %8s %7s %7s %9s\n",
                      name.c_str(), static_cast<long long>(rows), static_cast<long long>(cols),
                      static_cast<long long>(n_tok), th + 1, s * 1e3, gbs, of_bw, hot_col, gflops,
                      of_peak, of_i8, hot_i8, speedup);
          std::fflush(stdout);
        }
      }
      free_matrix(m);
    }
  }
  std::printf(
      "\nof_bw: weight bytes per second / measured bandwidth (same thread count); hot_GB/s:\n"
      "the same n_tok = 1 matmul on one cache-resident copy (the kernel's ceiling without DRAM);\n"
      "of_peak: 2*rows*cols*n_tok per second / measured f32 FMA peak; of_i8: the same against\n"
      "the measured int8 dot-product peak (quantized types); hot_i8: of_i8 of the same matmul on\n"
      "one cache-resident copy; x_vs_n1: per-token throughput relative to n_tok = 1.\n");
  return 0;
}
