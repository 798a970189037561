// attention_bench: the CPU attention kernel (compute/vec_ops.h attend_heads) over a paged KV cache
// laid out as the engine keeps it (compute/kv_cache.h), for one decoding token: the query heads of
// each KV head together, as a decode step hands them to one thread. Prints the time per layer, the
// multiply-adds per second against the machine's f32 FMA peak, and the K/V bytes read per second
// against its read bandwidth (both measured here, one thread). Each timed pass runs every layer
// once, as a decode step does, so that the K/V rows of a long context come from memory, not from
// the caches. The keys are laid out as the engine keeps them (by dimension,
// KvCacheConfig::k_by_dim) or, with --k-layout rows, in rows as MLA keeps them; "rows,dims" times
// both side by side. --mla LORA,ROPE times multi-head latent attention instead (DeepSeek-V3:
// --heads 128 --mla 512,64): one KV head whose keys are LORA + ROPE wide and whose values are
// the keys' first LORA values, read from the same rows. Usage: attention_bench
// [--context 512,4096] [--heads 32] [--kv-heads 4] [--head-dim 64] [--mla LORA,ROPE]
// [--layers 22] [--kv-type f32,f16,bf16] [--k-layout dims|rows|rows,dims] [--runs 7]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "bench/detail/args.h"
#include "bench/detail/membw.h"
#include "bench/detail/peaks.h"
#include "compute/kv_cache.h"
#include "compute/matmul.h"
#include "compute/thread_pool.h"
#include "compute/vec_ops.h"

namespace {

using namespace troupe;

using bench::split_commas;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> contexts = {512, 4096};
  int64_t heads = 32, kv_heads = 4, dim = 64, layers = 22, lora = 0;
  int runs = 7;
  std::vector<bool> by_dim = {true};
  bool layout_given = false;
  std::vector<compute::KvType> types = {compute::KvType::kF32, compute::KvType::kF16,
                                        compute::KvType::kBF16};
  const char* tool = "attention_bench";
  const char* usage =
      "usage: attention_bench [--context 512,4096] [--heads 32] [--kv-heads 4] [--head-dim 64] "
      "[--mla LORA,ROPE] [--layers 22] [--kv-type f32,f16,bf16] [--k-layout dims|rows|rows,dims] "
      "[--runs 7]";
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--help" || k == "-h") {
      std::printf("%s\n", usage);
      return 0;
    }
    bench::known_option(tool, k,
                        {"--context", "--heads", "--kv-heads", "--layers", "--head-dim", "--mla",
                         "--runs", "--kv-type", "--k-layout"},
                        usage);
    const std::string v = bench::value_arg(tool, argc, argv, i);
    if (k == "--context") {
      contexts = bench::int_list_arg(tool, k, v, 1, int64_t{1} << 22);
    } else if (k == "--heads") {
      heads = bench::int_arg(tool, k, v, 1, 1024);
    } else if (k == "--kv-heads") {
      kv_heads = bench::int_arg(tool, k, v, 1, 1024);
    } else if (k == "--layers") {
      layers = bench::int_arg(tool, k, v, 1, 1024);
    } else if (k == "--head-dim") {
      dim = bench::int_arg(tool, k, v, 1, 4096);
    } else if (k == "--mla") {
      const std::vector<int64_t> parts = bench::int_list_arg(tool, k, v, 0, 4096);
      if (parts.size() != 2 || parts[0] < 1)
        bench::usage_error(tool, "--mla takes LORA,ROPE (e.g. 512,64), got '" + v + "'");
      lora = parts[0];
      dim = lora + parts[1];
      kv_heads = 1;
    } else if (k == "--runs") {
      runs = static_cast<int>(bench::int_arg(tool, k, v, 1, 1000));
    } else if (k == "--kv-type") {
      types.clear();
      for (const auto& t : split_commas(v)) {
        const auto kt = compute::parse_kv_type(t);
        if (!kt) {
          std::fprintf(stderr, "attention_bench: --kv-type takes f32, f16 or bf16\n");
          return 2;
        }
        types.push_back(*kt);
      }
    } else if (k == "--k-layout") {
      by_dim.clear();
      layout_given = true;
      for (const auto& t : split_commas(v)) {
        if (t != "rows" && t != "dims") {
          std::fprintf(stderr, "attention_bench: --k-layout takes rows, dims or both\n");
          return 2;
        }
        by_dim.push_back(t == "dims");
      }
    }
  }
  if (lora > 0) {  // MLA keeps its keys in rows (its values are read from them)
    if (layout_given && std::find(by_dim.begin(), by_dim.end(), true) != by_dim.end()) {
      std::fprintf(stderr, "attention_bench: --mla keeps keys in rows (--k-layout rows)\n");
      return 2;
    }
    by_dim = {false};
  }
  if (heads < 1 || kv_heads < 1 || heads % kv_heads != 0 || dim < 1) {
    std::fprintf(stderr, "attention_bench: --heads must be a multiple of --kv-heads\n");
    return 2;
  }
  compute::ThreadPool pool(1);
  const double peak = bench::compute_peak(pool, compute::simd_level(), bench::PeakKind::kF32Fma);
  const double bw = bench::measure_read_bandwidth(pool, 512, 5).median;
  std::printf(
      "attention_bench: simd %s, one thread: f32 FMA peak %.0f GFLOP/s, read bandwidth "
      "%.1f GB/s\n",
      compute::simd_level(), peak, bw);
  if (lora > 0)
    std::printf(
        "shape: MLA, %lld query heads, keys %lld wide, values their first %lld; one token, %lld "
        "layers per pass (times per layer)\n",
        static_cast<long long>(heads), static_cast<long long>(dim), static_cast<long long>(lora),
        static_cast<long long>(layers));
  else
    std::printf(
        "shape: %lld query heads, %lld KV heads, head dim %lld; one token, %lld layers per "
        "pass (times per layer)\n",
        static_cast<long long>(heads), static_cast<long long>(kv_heads),
        static_cast<long long>(dim), static_cast<long long>(layers));
  std::printf("%-6s %-5s %8s %10s %10s %8s %10s %8s\n", "kv", "keys", "context", "us/layer",
              "GFLOP/s", "of_peak", "KV GB/s", "of_bw");
  const int64_t g = heads / kv_heads, kw = kv_heads * dim, dv = lora > 0 ? lora : dim;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (const int64_t n : contexts) {
    for (const compute::KvType type : types) {
      for (const bool dims : by_dim) {
        compute::KvCacheConfig c;
        c.n_layer = layers;
        c.k_width = kw;
        c.v_width = lora > 0 ? 0 : kw;
        c.heads = kv_heads;
        c.block_size = 16;
        c.num_blocks = (n + 15) / 16;
        c.type = type;
        c.k_by_dim = dims;
        compute::KvCache kv(c);
        const int64_t row_w = c.k_width + c.v_width;
        std::vector<float> row(static_cast<size_t>(row_w));
        // Blocks in a shuffled order, as a pool that has served other sequences hands them out.
        std::vector<int32_t> ids(static_cast<size_t>(c.num_blocks));
        for (size_t b = 0; b < ids.size(); ++b) ids[b] = static_cast<int32_t>(b);
        std::shuffle(ids.begin(), ids.end(), rng);
        for (int64_t l = 0; l < layers; ++l)
          for (int64_t p = 0; p < n; ++p) {
            for (auto& x : row) x = nd(rng);
            kv.store(l, ids[static_cast<size_t>(p / 16)], p % 16, 0, row.data(), row_w);
          }
        std::vector<std::vector<const void*>> layer_blocks(static_cast<size_t>(layers));
        for (int64_t l = 0; l < layers; ++l)
          for (int32_t id : ids) layer_blocks[static_cast<size_t>(l)].push_back(kv.block(l, id));
        std::vector<float> q(static_cast<size_t>(heads * dim)),
            out(static_cast<size_t>(heads * dv));
        for (auto& x : q) x = nd(rng);
        const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
        std::vector<double> t;
        for (int r = 0; r < runs + 1; ++r) {
          const double t0 = now_s();
          for (int64_t l = 0; l < layers; ++l)
            for (int64_t h = 0; h < kv_heads; ++h) {
              compute::KvView v;
              v.blocks = layer_blocks[static_cast<size_t>(l)].data();
              v.type = type;
              v.block_size = 16;
              v.k_offset = kv.k_offset(h);
              v.k_stride = kv.k_stride();
              v.v_offset = lora > 0 ? v.k_offset : kv.v_offset(h);  // MLA: values in the keys
              v.v_stride = lora > 0 ? v.k_stride : kv.v_stride();
              v.k_by_dim = dims;
              compute::attend_heads(&q[static_cast<size_t>(h * g * dim)], dim, g, dim, v, n, scale,
                                    dv, &out[static_cast<size_t>(h * g * dv)], dv);
            }
          if (r > 0) t.push_back(now_s() - t0);  // the first pass warms up
        }
        std::sort(t.begin(), t.end());
        const double s = t[t.size() / 2] / static_cast<double>(layers);
        const double flop = 2.0 * static_cast<double>(heads * n * (dim + dv));  // q.k and p.v
        const double bytes = static_cast<double>(n * row_w * compute::kv_type_bytes(type));
        std::printf("%-6s %-5s %8lld %10.1f %10.1f %7.0f%% %10.1f %7.0f%%\n",
                    std::string(compute::kv_type_name(type)).c_str(), dims ? "dims" : "rows",
                    static_cast<long long>(n), s * 1e6, flop / s / 1e9,
                    peak > 0 ? 100 * flop / s / 1e9 / peak : 0, bytes / s / 1e9,
                    bw > 0 ? 100 * bytes / s / 1e9 / bw : 0);
      }
    }
  }
  return 0;
}
