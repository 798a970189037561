// engine_bench: prefill and decode speed of the CPU engine on a model file, beside the machine's
// measured memory bandwidth (decode is bound by reading every active weight once per step).
// Usage: engine_bench MODEL [--threads 1,2] [--prefill 512] [--decode 32] [--batch 16] [--runs 5]
//                     [--context 16]   (prompt tokens of each decoding sequence)
//                     [--kv-type f32|f16|bf16]   (what the KV cache stores)
//                     [--weights map|memory|rows|tiles|both]   (both: map and memory side by
//                     side in one run; memory: a copy as troupe makes one for the CPU engine,
//                     matrices in 16-row tiles where the kernels read them (int8 types and
//                     packed int4; F16, BF16, FP4 with AVX-512; model/weight_tiles.h); rows: that
//                     copy without tiles; tiles: rows and memory side by side)
//                     [--as i4_packed|f8_e4m3|nvfp4]   (every float matrix but the embedding and
//                     routers, in memory as packed int4 with a bf16 scale per 32 columns, as a
//                     compressed-tensors W4A16 checkpoint loads, or as FP8 E4M3 with an f32
//                     scale per 128 x 128 block, as DeepSeek-V3's; then measured as "map" unless
//                     --weights asks for copies)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "bench/detail/args.h"
#include "bench/detail/cpu_info.h"
#include "bench/detail/median.h"
#include "bench/detail/membw.h"
#include "bench/detail/peaks.h"
#include "compute/engine.h"
#include "compute/matmul.h"
#include "compute/thread_pool.h"
#include "model/model.h"

using namespace troupe;
using bench::median;
using Clock = std::chrono::steady_clock;

namespace {

double now_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

// One engine step; a failure is printed (the bench then exits 1).
bool run_step(compute::Engine& eng, std::span<const compute::SeqStep> steps,
              compute::StepResult* res) {
  auto r = eng.step(steps, res);
  if (!r) std::fprintf(stderr, "engine_bench: step failed: %s\n", r.error().message.c_str());
  return static_cast<bool>(r);
}

// Weights one decode token reads: every matrix, except embeddings (one row) and, for MoE
// layers, only the experts a token uses; in bytes and in multiply-adds (parameters).
struct PerToken {
  double bytes = 0, params = 0;
};
PerToken weights_per_token(const model::ModelSpec& s) {
  PerToken t;
  auto add = [&](const model::WeightView& w, double times) {
    t.bytes += times * static_cast<double>(w.nbytes());
    if (w.scales != nullptr)  // a scaled type's scale grid is read too
      t.bytes += times * static_cast<double>(w.scale_grid_rows() * w.scale_stride * w.ne[2] *
                                             model::scale_bytes(w.scale_type));
    t.params += times * static_cast<double>(w.rows() * w.cols() * w.ne[2]);
  };
  add(s.output, 1);
  if (s.hc_head_fn.present()) add(s.hc_head_fn, 1);
  t.bytes += static_cast<double>(s.token_embd.row_bytes());
  for (const auto& L : s.layers) {
    for (const model::WeightView* w :
         {&L.wq, &L.wk, &L.wv, &L.wo, &L.wq_a, &L.wq_b, &L.wkv_a, &L.wk_b, &L.wv_b, &L.ffn_gate,
          &L.ffn_up, &L.ffn_down, &L.router, &L.shared.gate, &L.shared.up, &L.shared.down,
          &L.ssm_in, &L.ssm_qkv, &L.ssm_z, &L.ssm_ba, &L.ssm_beta, &L.ssm_alpha,
          // the sparse attention's indexers (V3.2's, V4's) and DeepSeek-V4's other parts
          &L.idx_wq_b, &L.idx_wk, &L.idx_proj, &L.idx_cmp_kv, &L.idx_cmp_gate, &L.wo_a, &L.cmp_kv,
          &L.cmp_gate, &L.hc_attn_fn, &L.hc_ffn_fn})
      if (w->present()) add(*w, 1);
    if (L.is_moe && !L.experts.empty()) {
      const auto& e = L.experts[0];
      for (const model::WeightView* w : {&e.gate, &e.up, &e.down})
        add(*w, static_cast<double>(s.n_expert_used));
    }
  }
  return t;
}

// The kernels' arithmetic: int8 dot products for quantized weights, f32 FMA for float ones
// (and for FP8 and packed int4, which the kernels widen to floats).
bool int8_kernels(const model::ModelSpec& s) {
  const model::GgmlType t = s.layers.empty() ? s.output.type : s.layers[0].wo.type;
  return t != model::GgmlType::kF32 && t != model::GgmlType::kF16 && t != model::GgmlType::kBF16 &&
         t != model::GgmlType::kF8_E4M3 && t != model::GgmlType::kI4_PACKED &&
         t != model::GgmlType::kFP4_PACKED;
}

// The E2M1 code nearest to v (ties to the smaller magnitude), saturating at +-6.
uint8_t nearest_e2m1(float v) {
  int best = 0;
  for (int c = 1; c < 8; ++c)
    if (std::fabs(model::kE2M1Values[c] - std::fabs(v)) <
        std::fabs(model::kE2M1Values[best] - std::fabs(v)))
      best = c;
  return static_cast<uint8_t>(best != 0 && v < 0 ? best + 8 : best);
}

// `m` with every f32/f16/bf16 matrix except the embedding and the routers (and those whose rows
// are not whole groups of 32) requantized, as `as` says:
//   - i4_packed: per 32 columns a bf16 scale amax / 7.5 and q = round(x / scale) clamped to
//     [-8, 7], as compressed-tensors' symmetric int4 observer;
//   - f8_e4m3: per block of 128 x 128 an f32 scale amax / 448 and q the nearest E4M3 value of
//     x / scale, as DeepSeek-V3's FP8 checkpoints (weight_scale_inv);
//   - nvfp4: per matrix (stack) a global scale g = amax / (6 * 448), per 16 columns the E4M3
//     scale nearest amax_16 / 6 / g, and q the nearest E2M1 value of x / (scale * g), as
//     ModelOpt's NVFP4 checkpoints (weight_scale, weight_scale_2).
std::shared_ptr<const model::Model> requantized(const std::shared_ptr<const model::Model>& m,
                                                const std::string& as) {
  const bool f8 = as == "f8_e4m3", nv = as == "nvfp4";
  auto out = std::make_shared<model::Model>(*m);
  out->storage.push_back(m);
  int converted = 0;
  model::for_each_weight(out->spec, [&](model::WeightView& w) {
    const bool is_float = w.type == model::GgmlType::kF32 || w.type == model::GgmlType::kF16 ||
                          w.type == model::GgmlType::kBF16;
    // Matrices only (not norms), and not the router, which the engine reads as floats.
    if (!w.present() || !is_float || w.cols() % 32 != 0 || w.rows() < 2 ||
        w.name == "token_embd.weight" || w.name.find("ffn_gate_inp") != std::string::npos)
      return;
    const int64_t rows = w.rows(), cols = w.cols(), n_mat = w.ne[2];
    // The scale grid: one block of br x bc per scale, per stacked matrix.
    const int64_t br = f8 ? 128 : 1, bc = f8 ? 128 : nv ? 16 : 32;
    const int64_t grid_rows = (rows + br - 1) / br, grid_cols = (cols + bc - 1) / bc;
    const size_t n_scales = static_cast<size_t>(n_mat * grid_rows * grid_cols);
    auto packed = std::shared_ptr<uint8_t[]>(new uint8_t[static_cast<size_t>(
        n_mat * rows *
        model::row_bytes(f8 ? model::GgmlType::kF8_E4M3 : model::GgmlType::kI4_PACKED, cols))]);
    auto f32_scales = std::shared_ptr<float[]>(new float[f8 ? n_scales : 0]);
    auto bf16_scales = std::shared_ptr<uint16_t[]>(new uint16_t[f8 || nv ? 0 : n_scales]);
    auto fp8_scales = std::shared_ptr<uint8_t[]>(new uint8_t[nv ? n_scales : 0]);
    std::vector<float> block(static_cast<size_t>(br * cols));  // a block row of one matrix
    float global = 1.f;  // nvfp4: amax / (6 * 448) of the whole matrix (stack)
    if (nv) {
      float amax = 0;
      for (int64_t mat = 0; mat < n_mat; ++mat)
        for (int64_t r = 0; r < rows; ++r) {
          model::dequantize_view_row(n_mat > 1 ? w.slice(mat) : w, r, block.data());
          for (int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(block[c]));
        }
      if (amax > 0) global = amax / (6.f * 448.f);
    }
    for (int64_t mat = 0; mat < n_mat; ++mat) {
      const model::WeightView one = n_mat > 1 ? w.slice(mat) : w;
      for (int64_t gr = 0; gr < grid_rows; ++gr) {
        const int64_t r0 = gr * br, nr = std::min(br, rows - r0);
        for (int64_t i = 0; i < nr; ++i)
          model::dequantize_view_row(one, r0 + i, block.data() + i * cols);
        for (int64_t gc = 0; gc < grid_cols; ++gc) {
          const int64_t c0 = gc * bc, nc = std::min(bc, cols - c0);
          float amax = 0;
          for (int64_t i = 0; i < nr; ++i)
            for (int64_t c = c0; c < c0 + nc; ++c)
              amax = std::max(amax, std::fabs(block[static_cast<size_t>(i * cols + c)]));
          const size_t si = static_cast<size_t>((mat * grid_rows + gr) * grid_cols + gc);
          float sc;
          if (f8) {
            sc = f32_scales[si] = amax > 0 ? amax / 448.f : 1.f;
          } else if (nv) {
            fp8_scales[si] = model::fp32_to_fp8_e4m3(amax / 6.f / global);
            sc = model::fp8_e4m3_to_fp32(fp8_scales[si]) * global;
          } else {
            bf16_scales[si] = model::fp32_to_bf16(amax > 0 ? amax / 7.5f : 1.f);
            sc = model::bf16_to_fp32(bf16_scales[si]);
          }
          for (int64_t i = 0; i < nr; ++i) {
            const int64_t r = mat * rows + r0 + i;
            const float* x = block.data() + i * cols;
            for (int64_t c = c0; c < c0 + nc; ++c) {
              const float v = sc != 0 ? x[c] / sc : 0.f;
              if (nv) {
                const uint8_t q = nearest_e2m1(v);
                uint8_t& b = packed[static_cast<size_t>((r * cols + c) / 2)];
                b = static_cast<uint8_t>(c % 2 == 0 ? q : (b & 15) | q << 4);
              } else if (f8) {
                packed[static_cast<size_t>(r * cols + c)] = model::fp32_to_fp8_e4m3(v);
              } else {
                const int q = static_cast<int>(std::clamp(std::nearbyint(v), -8.f, 7.f)) + 8;
                uint8_t& b = packed[static_cast<size_t>((r * cols + c) / 2)];
                b = static_cast<uint8_t>(c % 2 == 0 ? q : (b & 15) | q << 4);
              }
            }
          }
        }
      }
    }
    w.type = f8   ? model::GgmlType::kF8_E4M3
             : nv ? model::GgmlType::kFP4_PACKED
                  : model::GgmlType::kI4_PACKED;
    w.layout = model::WeightLayout::kRows;
    w.data = packed.get();
    w.scales = f8   ? static_cast<const void*>(f32_scales.get())
               : nv ? static_cast<const void*>(fp8_scales.get())
                    : bf16_scales.get();
    w.scale_type = f8   ? model::GgmlType::kF32
                   : nv ? model::GgmlType::kF8_E4M3
                        : model::GgmlType::kBF16;
    w.scale_mul = nv ? global : 1.f;
    w.scale_block[0] = br;
    w.scale_block[1] = bc;
    w.scale_stride = grid_cols;
    out->storage.push_back(packed);
    out->storage.push_back(f32_scales);
    out->storage.push_back(bf16_scales);
    out->storage.push_back(fp8_scales);
    ++converted;
  });
  std::printf("requantized %d matrices to %s (%s)\n", converted, as.c_str(),
              f8   ? "f32 scale per 128 x 128 block"
              : nv ? "e4m3 scale per 16 columns, f32 per matrix"
                   : "bf16 scale per 32 columns");
  return out;
}

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& t : v) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  const char* usage =
      "usage: engine_bench MODEL [--threads 1,2] [--prefill 512] [--decode 32] [--batch 16] "
      "[--runs 5] [--context 16] [--kv-type f32|f16|bf16] [--weights map|memory|rows|tiles|both] "
      "[--as i4_packed|f8_e4m3|nvfp4]";
  bench::model_arg_or_usage(argc, argv, usage);
  std::string path = argv[1];
  std::vector<int> threads = {1, 2};
  int64_t n_prefill = 512, n_decode = 32, batch = 16, ctx = 16;
  int runs = 5;
  std::string weights = "both";
  bool weights_given = false;
  std::string as;
  compute::KvType kv_type = compute::KvType::kF32;
  const char* tool = "engine_bench";
  for (int i = 2; i < argc; ++i) {
    const std::string k = argv[i];
    bench::known_option(tool, k,
                        {"--threads", "--prefill", "--decode", "--batch", "--runs", "--context",
                         "--weights", "--kv-type", "--as"},
                        usage);
    const std::string v = bench::value_arg(tool, argc, argv, i);
    if (k == "--threads") {
      threads.clear();
      for (const int64_t n : bench::int_list_arg(tool, k, v, 1, 1024))
        threads.push_back(static_cast<int>(n));
    } else if (k == "--prefill") {
      n_prefill = bench::int_arg(tool, k, v, 1, int64_t{1} << 20);
    } else if (k == "--decode") {
      n_decode = bench::int_arg(tool, k, v, 1, int64_t{1} << 20);
    } else if (k == "--batch") {
      batch = bench::int_arg(tool, k, v, 0, 4096);
    } else if (k == "--runs") {
      runs = static_cast<int>(bench::int_arg(tool, k, v, 1, 1000));
    } else if (k == "--context") {
      ctx = bench::int_arg(tool, k, v, 1, int64_t{1} << 20);
    } else if (k == "--weights") {
      weights = v;
      weights_given = true;
    } else if (k == "--kv-type") {
      const auto t = compute::parse_kv_type(v);
      if (!t) {
        std::fprintf(stderr, "engine_bench: --kv-type takes f32, f16 or bf16\n");
        return 2;
      }
      kv_type = *t;
    } else if (k == "--as") {
      if (v != "i4_packed" && v != "f8_e4m3" && v != "nvfp4") {
        std::fprintf(stderr, "engine_bench: --as takes i4_packed, f8_e4m3 or nvfp4\n");
        return 2;
      }
      as = v;
    }
  }
  const std::string cpu = bench::cpu_description();
#ifdef NDEBUG
  const char* build = "release";
#else
  const char* build = "DEBUG (asserts on: numbers are not meaningful)";
#endif
  std::printf("engine_bench: cpu %s, %u hardware threads, simd %s, build %s\n", cpu.c_str(),
              std::thread::hardware_concurrency(), compute::simd_level(), build);
  auto m = model::load_model(path);
  if (!m) {
    std::fprintf(stderr, "engine_bench: %s\n", m.error().message.c_str());
    return 1;
  }
  if (!as.empty()) {
    *m = requantized(*m, as);
    if (!weights_given) weights = "map";  // already in memory (a copy only if asked for)
  }
  const auto& s = (*m)->spec;
  const PerToken per_token = weights_per_token(s);
  const double wbytes = per_token.bytes;
  const bool int8 = int8_kernels(s);
  std::printf("model %s: %s, %lld layers, n_embd %lld, weights read per decode token %.1f MB\n",
              path.c_str(), model::arch_name(s.arch), (long long)s.n_layer, (long long)s.n_embd,
              wbytes / 1e6);
  // What attention reads per decoding token: K and V of every position it attends to, at the
  // middle of the decode (a sliding window aside).
  // Linear-attention layers (Qwen3-Next's) keep no KV: each sequence's state is read and
  // written once per token instead.
  const auto linear = static_cast<double>(
      std::count_if(s.layers.begin(), s.layers.end(), [](const auto& L) { return L.recurrent; }));
  const double kv_layers = static_cast<double>(s.n_layer) - linear;
  const double kv_row = static_cast<double>(s.kv_k_width() + s.kv_v_width()) *
                        static_cast<double>(compute::kv_type_bytes(kv_type));
  std::printf(
      "KV cache %s: %.1f KB per position, %.1f MB read per decode token at %lld positions\n",
      std::string(compute::kv_type_name(kv_type)).c_str(), kv_row * kv_layers / 1e3,
      kv_row * kv_layers * static_cast<double>(ctx + n_decode / 2) / 1e6,
      static_cast<long long>(ctx + n_decode / 2));
  if (linear > 0)
    std::printf(
        "recurrent state: %.1f MB per sequence (%.0f linear-attention layers), read and "
        "written once per decode token\n",
        static_cast<double>(s.ssm_state_floats()) * 4 * linear / 1e6, linear);
  // The weight storages to compare: the file mapping and/or a copy in huge-page memory.
  std::vector<std::pair<std::string, std::shared_ptr<const model::Model>>> variants;
  // "memory" is the copy as troupe makes it for CPU engines (the matrices of
  // compute::tiled_weight_types() in tiles); "rows" the same copy without tiles.
  if (weights == "map" || weights == "both") variants.push_back({"map", *m});
  for (const bool tiles : {false, true}) {
    const bool want = tiles ? (weights == "memory" || weights == "both" || weights == "tiles")
                            : (weights == "rows" || weights == "tiles");
    if (!want) continue;
    const double t0 = now_s();
    auto copy =
        model::copy_weights_to_memory(*m, {}, static_cast<int>(std::thread::hardware_concurrency()),
                                      tiles ? compute::tiled_weight_types() : model::TileTypes{});
    if (!copy) {
      std::fprintf(stderr, "engine_bench: %s\n", copy.error().message.c_str());
      return 1;
    }
    std::printf("weights copied to huge-page memory%s in %.2f s\n",
                tiles && !compute::tiled_weight_types().empty()
                    ? " (in tiles where the kernels read them fast)"
                    : "",
                now_s() - t0);
    variants.push_back({tiles ? "memory" : "rows", *copy});
  }
  if (variants.empty()) {
    std::fprintf(stderr, "engine_bench: --weights must be map, memory, rows, tiles or both\n");
    return 2;
  }
  std::printf("%-8s %-8s %-10s %12s %12s %10s %10s\n", "threads", "weights", "phase", "tokens/s",
              "ms/step", "GB/s", "roofline");
  std::printf(
      "(roofline: weight bytes read per decode token / the read bandwidth measured just before "
      "and after each run, median over the runs; for batched decode the last column is the "
      "speed-up over batch 1)\n");
  for (int nt : threads) {
    // The machine's read bandwidth with nt threads (bench/detail/membw.h, as membw_bench
    // measures it: 1 GiB), once up front (median of 5 passes) and again around every batch-1
    // decode run, whose roofline fraction is taken against the bandwidth of its own minutes.
    compute::ThreadPool probe_pool(nt);
    bench::ReadBandwidthProbe probe(probe_pool, 1024);
    const bench::ReadBandwidth first = probe.measure(5);
    const double bw = first.median;
    std::printf("%-8d %-8s %-10s %12s %12s %10.1f %10s  (%s)\n", nt, "-", "membw", "-", "-", bw,
                "100%", bench::read_way_name(first.way));
    // The arithmetic peak the batched decode is bound by (bench/detail/peaks.h).
    const double peak =
        bench::compute_peak(probe_pool, compute::simd_level(),
                            int8 ? bench::PeakKind::kInt8Dot : bench::PeakKind::kF32Fma);
    std::printf("%-8d %-8s %-10s %s peak %.0f GOP/s (best of 5 passes)\n", nt, "-", "peak",
                int8 ? "int8 dot-product" : "f32 FMA", peak);
    for (const auto& [wname, model] : variants) {
      const char* wn = wname.c_str();
      compute::EngineOptions o;
      o.n_threads = nt;
      o.kv_type = kv_type;
      // Whole blocks per sequence: a sequence of ctx + n_decode tokens holds that many rounded
      // up to the block size (with 16 sequences of 18 tokens, --prefill 4 --decode 2, a pool of
      // 16 x 18 + 64 tokens was 10 blocks short).
      const auto in_blocks = [&](int64_t n) {
        return (n + o.kv_block_size - 1) / o.kv_block_size * o.kv_block_size;
      };
      o.max_tokens_in_cache =
          std::max<int64_t>(in_blocks(n_prefill),
                            std::max<int64_t>(batch, 1) * in_blocks(ctx + n_decode)) +
          64;
      o.max_recurrent_seqs = std::max<int64_t>(o.max_recurrent_seqs, batch);  // Qwen3-Next's
      auto eng = compute::Engine::create(model, o);
      if (!eng) {
        std::fprintf(stderr, "engine_bench: %s\n", eng.error().message.c_str());
        return 1;
      }
      compute::StepResult res;
      // Prefill: one sequence of n_prefill tokens in one step.
      {
        const auto toks = random_tokens(n_prefill, s.n_vocab, 1);
        std::vector<double> t;
        for (int r = 0; r < runs; ++r) {
          compute::Sequence seq(**eng);
          seq.reserve(n_prefill);
          auto st = seq.next(toks, compute::SeqStep::Logits::kLast);
          const double t0 = now_s();
          if (!run_step(**eng, {&st, 1}, &res)) return 1;
          t.push_back(now_s() - t0);
        }
        const double sec = median(t);
        std::printf("%-8d %-8s %-10s %12.1f %12.1f %10s %10s\n", nt, wn, "prefill",
                    static_cast<double>(n_prefill) / sec, sec * 1e3, "-", "-");
      }
      // Decode with 1 and `batch` sequences: each prefilled with ctx tokens, then n_decode steps.
      double tps1 = 0;
      for (int64_t nb : {int64_t{1}, batch}) {
        if (nb < 1) continue;              // --batch 0: batch 1 only
        std::vector<double> t, bw_around;  // bw_around[r], [r + 1]: before and after run r
        std::vector<compute::ThreadPool::Stats> in_runs;  // the pool's time over run r
        const auto probe_now = [&] {
          bw_around.push_back(probe.measure(2).median);
          // Let the probe's workers stop polling before the engine's run.
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        };
        for (int r = 0; r < runs; ++r) {
          std::vector<std::unique_ptr<compute::Sequence>> seqs;
          std::vector<std::vector<int32_t>> toks;
          for (int64_t b = 0; b < nb; ++b) {
            seqs.push_back(std::make_unique<compute::Sequence>(**eng));
            seqs.back()->reserve(ctx + n_decode);
            toks.push_back(random_tokens(ctx + n_decode, s.n_vocab, static_cast<uint32_t>(b + 7)));
            auto st = seqs.back()->next({toks.back().data(), static_cast<size_t>(ctx)},
                                        compute::SeqStep::Logits::kLast);
            if (!run_step(**eng, {&st, 1}, &res)) return 1;
            seqs.back()->advance(ctx);
          }
          if (nb == 1 && r == 0) probe_now();
          const compute::ThreadPool::Stats before = (*eng)->pool().stats();
          const double t0 = now_s();
          for (int64_t d = 0; d < n_decode; ++d) {
            std::vector<compute::SeqStep> steps;
            for (int64_t b = 0; b < nb; ++b)
              steps.push_back(seqs[static_cast<size_t>(b)]->next(
                  {&toks[static_cast<size_t>(b)][static_cast<size_t>(ctx + d)], 1},
                  compute::SeqStep::Logits::kLast));
            if (!run_step(**eng, steps, &res)) return 1;
            for (auto& q : seqs) q->advance(1);
          }
          t.push_back((now_s() - t0) / static_cast<double>(n_decode));
          const compute::ThreadPool::Stats& after = (*eng)->pool().stats();
          in_runs.push_back(
              {after.runs - before.runs, after.run_s - before.run_s, after.wait_s - before.wait_s});
          if (nb == 1) probe_now();
        }
        const double step_s = median(t);
        const double tps = static_cast<double>(nb) / step_s;
        // Where a step's time went on the calling thread (ThreadPool::Stats), per step: in
        // parallel sections (of which waiting for the other threads) or alone (serial), each
        // the median over the runs.
        std::vector<double> sections, waiting, serial, n_sections;
        for (size_t r = 0; r < t.size(); ++r) {
          const double per = 1.0 / static_cast<double>(n_decode);
          sections.push_back(in_runs[r].run_s * per);
          waiting.push_back(in_runs[r].wait_s * per);
          serial.push_back(t[r] - in_runs[r].run_s * per);
          n_sections.push_back(static_cast<double>(in_runs[r].runs) * per);
        }
        const auto where = [&] {
          if (nt > 1)
            std::printf(
                "         (per step: %.0f parallel sections, %.0f us in them, of which %.0f us "
                "waiting for the other threads; %.0f us serial)\n",
                median(n_sections), median(sections) * 1e6, median(waiting) * 1e6,
                median(serial) * 1e6);
        };
        const double gbs = wbytes / step_s / 1e9;
        char phase[32];
        std::snprintf(phase, sizeof phase, "decode@%lld", (long long)nb);
        if (nb == 1) {
          tps1 = tps;
          // Each run against the mean of the bandwidth measured just before and after it.
          std::vector<double> frac;
          std::string runs_text;
          for (size_t r = 0; r < t.size(); ++r) {
            const double around = (bw_around[r] + bw_around[r + 1]) / 2;
            frac.push_back(wbytes / t[r] / 1e9 / around);
            char one[48];
            std::snprintf(one, sizeof one, "%s%.0f%% of %.1f", r ? ", " : "", 100 * frac.back(),
                          around);
            runs_text += one;
          }
          std::printf("%-8d %-8s %-10s %12.1f %12.2f %10.1f %9.0f%%\n", nt, wn, phase, tps,
                      step_s * 1e3, gbs, 100.0 * median(frac));
          std::printf("         (each run against the bandwidth around it: %s GB/s)\n",
                      runs_text.c_str());
          where();
        } else {
          // Weights are shared by the batch: the speed-up over batch 1, and the arithmetic
          // (2 operations per weight per token) against the peak.
          const double gops = 2 * per_token.params * static_cast<double>(nb) / step_s / 1e9;
          std::printf("%-8d %-8s %-10s %12.1f %12.2f %10s %9.1fx\n", nt, wn, phase, tps,
                      step_s * 1e3, "-", tps / tps1);
          if (peak > 0)
            std::printf("         (%.0f GOP/s of weight arithmetic: %.0f%% of the %s peak)\n", gops,
                        100 * gops / peak, int8 ? "int8" : "f32 FMA");
          where();
        }
      }
    }
  }
  return 0;
}
