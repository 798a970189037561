// vision_bench: one image through a vision encoder (compute::VisionEncoder) with 1 and 2 threads:
// seconds per image (median of the runs) and GFLOP/s against the measured f32 FMA peak.
// Without --mmproj it synthesizes the shapes of two released encoders into a temporary folder:
// LLaVA 1.5's CLIP ViT-L/14-336 (577 positions, 23 of 24 blocks, MLP projector to 4096) and
// Gemma 3's SigLIP at 896 pixels (4096 positions, 27 blocks, 4x4 pooling to 256 rows of 2560),
// both F16 as their mmproj files ship.
// With --hf, the LLaVA encoder is also written as a Hugging Face LlavaForConditionalGeneration
// directory (its tensors as stored: tests/llava_hf_twin.h) and both forms are loaded and run side
// by side: load time, the first image after loading (its pages fetched), and the rows' bits.
// Usage: vision_bench [--mmproj FILE] [--runs N] [--threads 1,2] [--only llava|gemma3] [--hf]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "bench/detail/args.h"
#include "bench/detail/peaks.h"
#include "compute/matmul.h"
#include "compute/thread_pool.h"
#include "compute/vision_encoder.h"
#include "model/synth.h"
#include "model/vision.h"
#include "tests/llava_hf_twin.h"

namespace {

using namespace troupe;  // NOLINT(google-build-using-namespace): a benchmark's main file
using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Multiply-adds x 2 of one image: every matrix once per position it multiplies, and attention's
// two products (scores and the weighted sum of values) per block.
double image_flops(const model::VisionSpec& s) {
  const double N = static_cast<double>(s.n_pos()), E = static_cast<double>(s.n_embd);
  const double per_block = 4 * E * E + 2 * E * static_cast<double>(s.n_ff);
  double f = 2 * N * (3.0 * static_cast<double>(s.patch_size * s.patch_size) * E);
  f += static_cast<double>(s.n_layer_run) * (2 * N * per_block + 4 * N * N * E);
  const double rows = static_cast<double>(s.n_image_tokens());
  if (s.projector == model::Projector::kMlp) {
    f += 2 * rows * static_cast<double>(s.mm0_w.cols() * s.mm0_w.rows());
    if (s.mm2_w.present()) f += 2 * rows * static_cast<double>(s.mm2_w.cols() * s.mm2_w.rows());
  } else {
    f += 2 * rows * static_cast<double>(s.input_proj.cols() * s.input_proj.rows());
  }
  return f;
}

void run(const std::string& label, const std::string& path, int runs,
         const std::vector<int>& threads) {
  auto vm = model::load_vision_model(path);
  if (!vm) {
    std::fprintf(stderr, "vision_bench: %s\n", vm.error().message.c_str());
    std::exit(1);
  }
  const model::VisionSpec& s = (*vm)->spec;
  const int64_t S = s.image_size;
  std::vector<float> pixels(static_cast<size_t>(3 * S * S));
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<float>(i % 97) / 48.f - 1.f;
  const double gflop = image_flops(s) / 1e9;
  std::printf(
      "%s: %lldx%lld image, %lld positions, %lld blocks, %lld rows of %lld out; %.1f GFLOP "
      "per image\n",
      label.c_str(), static_cast<long long>(S), static_cast<long long>(S),
      static_cast<long long>(s.n_pos()), static_cast<long long>(s.n_layer_run),
      static_cast<long long>(s.n_image_tokens()), static_cast<long long>(s.n_embd_out), gflop);
  for (int t : threads) {
    auto enc = compute::VisionEncoder::create(*vm, t);
    compute::ThreadPool peak_pool(t);
    const double peak =
        bench::compute_peak(peak_pool, compute::simd_level(), bench::PeakKind::kF32Fma);
    std::vector<double> sec;
    for (int r = 0; r <= runs; ++r) {  // the first run warms the weights' pages up, untimed
      const auto t0 = Clock::now();
      auto out = (*enc)->encode(pixels);
      if (!out) {
        std::fprintf(stderr, "vision_bench: %s\n", out.error().message.c_str());
        std::exit(1);
      }
      if (r > 0) sec.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    const double m = median(sec);
    std::printf(
        "  %d thread%s: %.3f s per image (median of %d), %.1f GFLOP/s = %.0f%% of the "
        "measured f32 FMA peak %.1f GFLOP/s (%s)\n",
        t, t == 1 ? " " : "s", m, runs, gflop / m, 100 * gflop / m / peak, peak,
        compute::simd_level());
  }
}

// The mmproj GGUF at `gguf` and its Hugging Face form `hf`, alternated run by run: the time to
// load each (median), the first image after a load, and whether the rows are the same bits.
void compare_forms(const std::string& gguf, const std::string& hf, int runs, int threads) {
  std::vector<double> load[2], first[2];
  std::vector<float> rows[2];
  for (int r = 0; r < runs; ++r) {
    for (int f = 0; f < 2; ++f) {
      const auto t0 = Clock::now();
      auto vm = model::load_vision_model(f == 0 ? gguf : hf);
      if (!vm) {
        std::fprintf(stderr, "vision_bench: %s\n", vm.error().message.c_str());
        std::exit(1);
      }
      const auto t1 = Clock::now();
      const int64_t S = (*vm)->spec.image_size;
      std::vector<float> pixels(static_cast<size_t>(3 * S * S));
      for (size_t i = 0; i < pixels.size(); ++i)
        pixels[i] = static_cast<float>(i % 97) / 48.f - 1.f;
      auto enc = compute::VisionEncoder::create(*vm, threads);
      auto out = (*enc)->encode(pixels);
      if (!out) {
        std::fprintf(stderr, "vision_bench: %s\n", out.error().message.c_str());
        std::exit(1);
      }
      load[f].push_back(std::chrono::duration<double>(t1 - t0).count());
      first[f].push_back(std::chrono::duration<double>(Clock::now() - t1).count());
      rows[f] = std::move(*out);
    }
  }
  const bool same = rows[0].size() == rows[1].size() &&
                    std::memcmp(rows[0].data(), rows[1].data(), rows[0].size() * 4) == 0;
  for (int f = 0; f < 2; ++f)
    std::printf("  %-28s load %7.1f ms, first image %.3f s (%d thread%s; medians of %d)\n",
                f == 0 ? "mmproj GGUF:" : "Hugging Face directory:", 1e3 * median(load[f]),
                median(first[f]), threads, threads == 1 ? "" : "s", runs);
  std::printf("  rows of the two forms: %s\n", same ? "the same bits" : "DIFFERENT");
  if (!same) std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  std::string mmproj, only;
  bool hf = false;
  int runs = 3;
  std::vector<int> threads = {1, 2};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--mmproj" && i + 1 < argc) {
      mmproj = argv[++i];
    } else if (a == "--runs" && i + 1 < argc) {
      runs = static_cast<int>(bench::int_arg("vision_bench", a, argv[++i], 1, 1000));
    } else if (a == "--hf") {
      hf = true;
    } else if (a == "--only" && i + 1 < argc) {
      only = argv[++i];
    } else if (a == "--threads" && i + 1 < argc) {
      threads.clear();
      for (const int64_t t : bench::int_list_arg("vision_bench", a, argv[++i], 1, 1024))
        threads.push_back(static_cast<int>(t));
    } else {
      const bool help = a == "--help" || a == "-h";
      std::fprintf(help ? stdout : stderr,
                   "%susage: vision_bench [--mmproj FILE] [--runs N] [--threads 1,2] "
                   "[--only llava|gemma3] [--hf]\n",
                   help ? "" : ("vision_bench: unknown option '" + a + "'; ").c_str());
      return help ? 0 : 2;
    }
  }
  if (!mmproj.empty()) {
    run(mmproj, mmproj, runs, threads);
    return 0;
  }
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("troupe_vision_bench_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  if (only.empty() || only == "llava") {
    model::MmprojSynthOptions o;  // the defaults: CLIP ViT-L/14-336, LLaVA 1.5
    const std::string p = (dir / "llava.gguf").string();
    if (auto st = model::synth_mmproj(o, p); !st)
      return std::fprintf(stderr, "%s\n", st.error().message.c_str()), 1;
    run("LLaVA 1.5 CLIP ViT-L/14-336 (synthetic, f16)", p, runs, threads);
    if (hf) {
      const std::string d = (dir / "llava-hf").string();
      std::filesystem::create_directories(d);
      const std::string e = troupe::testing::llava_hf_files(
          "", p, "", d, troupe::testing::LlavaLayout::kAfter452, "stored");
      if (!e.empty()) return std::fprintf(stderr, "vision_bench: %s\n", e.c_str()), 1;
      std::printf("the same encoder as a Hugging Face directory:\n");
      compare_forms(p, d, runs, threads.back());
    }
  }
  if (only.empty() || only == "gemma3") {
    model::MmprojSynthOptions o;
    o.projector = "gemma3";
    o.image_size = 896;
    o.n_embd = 1152;
    o.n_ff = 4304;
    o.n_layer = 27;
    o.n_head = 16;
    o.proj_dim = 2560;
    o.merge = 4;
    const std::string p = (dir / "gemma3.gguf").string();
    if (auto st = model::synth_mmproj(o, p); !st)
      return std::fprintf(stderr, "%s\n", st.error().message.c_str()), 1;
    run("Gemma 3 SigLIP-896 (synthetic, f16; 4B's width)", p, runs, threads);
  }
  std::filesystem::remove_all(dir);
  return 0;
}
