// image_chat_bench: a two-turn chat about one picture through the actor system with its image
// encoder (actors/encoder.h), then a third turn that swaps the picture: the wall time of each
// turn and how many prompt positions it computed. Turn 2 resends the picture behind turn 1's text;
// the encoder's cache skips encoding it and the prefix cache skips recomputing its positions.
// Turn 3 pays for both again. Each run starts a fresh cluster (empty caches).
// Without --model/--mmproj it synthesizes a LLaVA-1.5-shaped pair into a temporary folder: the
// CLIP ViT-L/14-336 encoder (F16, as shipped) and a 4096-wide Llama decoder of --layers layers
// (Q8_0), so that the numbers have the shape of a real 7B LLaVA with fewer layers.
// Usage: image_chat_bench [--model GGUF --mmproj GGUF] [--layers N] [--threads N] [--runs N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/local_cluster.h"
#include "actors/plan.h"
#include "bench/detail/args.h"
#include "bench/detail/median.h"
#include "bench/detail/pictures.h"
#include "model/model.h"
#include "model/synth.h"
#include "model/vision.h"

namespace {

using namespace troupe;  // NOLINT(google-build-using-namespace): a benchmark's main file
using bench::median;
using Clock = std::chrono::steady_clock;

[[noreturn]] void die(const std::string& why) {
  std::fprintf(stderr, "image_chat_bench: %s\n", why.c_str());
  std::exit(1);
}

struct Turn {
  double seconds = 0;
  int64_t prompt = 0, hit = 0;
  std::string text;
};

int64_t prefix_hits(actors::LocalCluster& lc) {
  return nlohmann::json::parse(lc.stats_json())["scheduler"]["prefix_hit_tokens"].get<int64_t>();
}

Turn turn(actors::LocalCluster& lc, const std::string& prompt, const std::string& image) {
  actors::GenerateRequest r;
  r.prompt = prompt;
  r.image_files = std::make_shared<const std::vector<std::string>>(1, image);
  r.max_tokens = 16;
  r.sampling.ignore_eos = true;
  const int64_t before = prefix_hits(lc);
  const auto t0 = Clock::now();
  const auto res = lc.generate(r);
  Turn t;
  t.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!res.ok()) die(res.error);
  t.prompt = static_cast<int64_t>(res.prompt_tokens.size());
  t.hit = prefix_hits(lc) - before;
  t.text = res.text;
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string usage =
      "usage: image_chat_bench [--model GGUF --mmproj GGUF] [--layers N] [--threads N] "
      "[--runs N]";
  std::string model_path, mmproj_path;
  int layers = 4, threads = 2, runs = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool more = i + 1 < argc;
    if (a == "--model" && more) {
      model_path = argv[++i];
    } else if (a == "--mmproj" && more) {
      mmproj_path = argv[++i];
    } else if (a == "--layers" && more) {
      layers = static_cast<int>(bench::int_arg("image_chat_bench", a, argv[++i], 1, 1024));
    } else if (a == "--threads" && more) {
      threads = static_cast<int>(bench::int_arg("image_chat_bench", a, argv[++i], 1, 1024));
    } else if (a == "--runs" && more) {
      runs = static_cast<int>(bench::int_arg("image_chat_bench", a, argv[++i], 1, 1000));
    } else if (a == "--help" || a == "-h") {
      std::printf("%s\n", usage.c_str());
      return 0;
    } else {
      bench::usage_error("image_chat_bench",
                         "unknown option or missing value '" + a + "'; " + usage);
    }
  }
  const auto dir = std::filesystem::temp_directory_path() / "troupe_image_chat_bench";
  if (model_path.empty() != mmproj_path.empty()) die("give both --model and --mmproj, or neither");
  if (model_path.empty()) {
    std::filesystem::create_directories(dir);
    model_path = (dir / "llava-shaped.gguf").string();
    mmproj_path = (dir / "clip-l-336.gguf").string();
    model::SynthOptions so;
    so.n_embd = 4096;
    so.n_layer = layers;
    so.n_head = 32;
    so.n_head_kv = 32;
    so.n_ff = 11008;
    so.dtype = model::GgmlType::kQ8_0;
    if (auto s = model::synth_model(so, model_path); !s) die(s.error().message);
    if (auto s = model::synth_mmproj(model::MmprojSynthOptions{}, mmproj_path); !s)
      die(s.error().message);
  }
  auto m = model::load_model(model_path);
  if (!m) die(m.error().message);
  auto vm = model::load_vision_model(mmproj_path);
  if (!vm) die(vm.error().message);
  actors::Plan plan = actors::even_plan(model_path, 1, 0);
  plan.scheduler.max_model_len = 1024;
  plan.scheduler.max_sequences = 2;
  for (auto& s : plan.stages) s.threads = threads;
  if (auto s = actors::resolve_plan(plan, (*m)->spec); !s) die(s.error().message);
  actors::ClusterOptions opts;
  opts.vision = *vm;
  opts.vision_threads = threads;
  const std::string cat = bench::picture(1), dog = bench::picture(2);
  const std::string turn1 = "USER: <__media__>\nWhat is in this picture? ASSISTANT:";
  std::printf("%s (%lld layers, width %lld) + %s; %d threads; 16 tokens per turn\n",
              std::filesystem::path(model_path).filename().c_str(),
              static_cast<long long>((*m)->spec.n_layer), static_cast<long long>((*m)->spec.n_embd),
              std::filesystem::path(mmproj_path).filename().c_str(), threads);
  std::vector<double> t1, t2, t3;
  Turn a, b, c;
  for (int r = 0; r < runs; ++r) {
    auto lc = actors::LocalCluster::start(plan, *m, opts);
    if (!lc) die(lc.error().message);
    a = turn(**lc, turn1, cat);
    const std::string turn2 = turn1 + a.text + " USER: And what colour is it? ASSISTANT:";
    b = turn(**lc, turn2, cat);
    c = turn(**lc, turn2, dog);
    t1.push_back(a.seconds);
    t2.push_back(b.seconds);
    t3.push_back(c.seconds);
  }
  const auto line = [&](const char* what, const Turn& t, const std::vector<double>& s) {
    std::printf("  %-38s %7.3f s (median of %d)  prompt %4lld positions, %4lld from the cache\n",
                what, median(s), runs, static_cast<long long>(t.prompt),
                static_cast<long long>(t.hit));
  };
  line("turn 1 (new picture)", a, t1);
  line("turn 2 (same picture, longer text)", b, t2);
  line("turn 2 text with another picture", c, t3);
  std::printf("  turn 2 / turn 1: %.3f; other picture / turn 1: %.3f\n", median(t2) / median(t1),
              median(t3) / median(t1));
  return 0;
}
