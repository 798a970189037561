// cluster_bench: generated tokens/s of the in-process actor system with continuous batching at
// 1, 4, 16 and 64 concurrent requests; the share of time spent outside compute (actors, messages,
// scheduling); and the prefix cache's hit rate and speed-up on requests sharing a system prompt.
// Usage: cluster_bench MODEL [--stages N] [--shards M] [--threads T] [--gen G] [--prompt P]
//                            [--concurrency 1,4,16,64]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/local_cluster.h"
#include "actors/plan.h"
#include "bench/detail/args.h"
#include "compute/matmul.h"

using namespace troupe;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& t : v) t = static_cast<int32_t>(3 + rng() % static_cast<uint32_t>(vocab - 3));
  return v;
}

struct RunStats {
  double wall = 0, tokens = 0, step_wall = 0, step_compute = 0, hit = 0, query = 0;
};

RunStats run(const actors::Plan& plan, std::shared_ptr<const model::Model> m,
             const std::vector<actors::GenerateRequest>& warmup,
             const std::vector<actors::GenerateRequest>& reqs) {
  auto lc = actors::LocalCluster::start(plan, m);
  if (!lc) {
    std::fprintf(stderr, "cluster_bench: %s\n", lc.error().message.c_str());
    std::exit(1);
  }
  if (!warmup.empty()) (*lc)->generate_many(warmup);
  const auto before = nlohmann::json::parse((*lc)->stats_json())["scheduler"];
  const double t0 = now_s();
  const auto res = (*lc)->generate_many(reqs);
  RunStats r;
  r.wall = now_s() - t0;
  for (const auto& x : res) {
    if (!x.ok()) {
      std::fprintf(stderr, "cluster_bench: request failed: %s\n", x.error.c_str());
      std::exit(1);
    }
    r.tokens += static_cast<double>(x.tokens.size());
  }
  const auto after = nlohmann::json::parse((*lc)->stats_json())["scheduler"];
  r.step_wall =
      after["step_wall_seconds"].get<double>() - before["step_wall_seconds"].get<double>();
  r.step_compute =
      after["step_compute_seconds"].get<double>() - before["step_compute_seconds"].get<double>();
  r.hit = after["prefix_hit_tokens"].get<double>() - before["prefix_hit_tokens"].get<double>();
  r.query =
      after["prefix_query_tokens"].get<double>() - before["prefix_query_tokens"].get<double>();
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const char* tool = "cluster_bench";
  const char* usage =
      "usage: cluster_bench MODEL [--stages N] [--shards M] [--threads T] [--gen G] [--prompt P] "
      "[--concurrency 1,4,16,64]";
  bench::model_arg_or_usage(argc, argv, usage);
  const std::string path = argv[1];
  int64_t stages = 1, shards = 0, gen = 32, prompt = 32;
  int threads = 2;
  std::vector<int> conc = {1, 4, 16, 64};
  for (int i = 2; i < argc; ++i) {
    const std::string k = argv[i];
    bench::known_option(tool, k,
                        {"--stages", "--shards", "--threads", "--gen", "--prompt", "--concurrency"},
                        usage);
    const std::string v = bench::value_arg(tool, argc, argv, i);
    if (k == "--stages") {
      stages = bench::int_arg(tool, k, v, 1, 64);
    } else if (k == "--shards") {
      shards = bench::int_arg(tool, k, v, 0, 64);
    } else if (k == "--threads") {
      threads = static_cast<int>(bench::int_arg(tool, k, v, 1, 1024));
    } else if (k == "--gen") {
      gen = bench::int_arg(tool, k, v, 1, 1 << 20);
    } else if (k == "--prompt") {
      prompt = bench::int_arg(tool, k, v, 1, 1 << 20);
    } else {  // --concurrency
      conc.clear();
      for (const int64_t c : bench::int_list_arg(tool, k, v, 1, 4096))
        conc.push_back(static_cast<int>(c));
    }
  }
#ifdef NDEBUG
  const char* build = "release";
#else
  const char* build = "DEBUG (numbers are not meaningful)";
#endif
  std::printf("cluster_bench: %u hardware threads, simd %s, build %s\n",
              std::thread::hardware_concurrency(), compute::simd_level(), build);
  auto m = model::load_model(path);
  if (!m) {
    std::fprintf(stderr, "cluster_bench: %s\n", m.error().message.c_str());
    return 1;
  }
  const auto& spec = (*m)->spec;
  auto make_plan = [&](int64_t microbatches, bool prefix) {
    actors::Plan p = actors::even_plan(path, stages, shards);
    for (auto& s : p.stages) s.threads = threads;
    for (auto& s : p.expert_shards) s.threads = threads;
    p.scheduler.max_sequences = 64;
    p.scheduler.max_tokens_per_step = 512;
    p.scheduler.max_model_len = 1024;
    p.scheduler.microbatches = microbatches;
    p.scheduler.prefix_cache = prefix;
    for (auto& s : p.stages) s.kv_blocks = 64 * 1024 / 16;
    if (auto st = actors::resolve_plan(p, spec); !st) {
      std::fprintf(stderr, "cluster_bench: %s\n", st.error().message.c_str());
      std::exit(1);
    }
    return p;
  };
  std::printf(
      "model %s: %s, %lld layers; plan: %lld stage(s), %lld expert shard(s), %d threads "
      "each; prompt %lld tokens, %lld generated per request\n",
      path.c_str(), model::arch_name(spec.arch), (long long)spec.n_layer, (long long)stages,
      (long long)shards, threads, (long long)prompt, (long long)gen);
  std::printf("%-12s %12s %10s %18s %18s\n", "concurrency", "tokens/s", "wall s", "outside compute",
              "(per step)");
  for (int k : conc) {
    std::vector<actors::GenerateRequest> reqs;
    for (int i = 0; i < k; ++i) {
      actors::GenerateRequest r;
      r.prompt_tokens = random_tokens(prompt, spec.n_vocab, static_cast<uint32_t>(1000 + i));
      r.max_tokens = gen;
      r.sampling.ignore_eos = true;
      reqs.push_back(std::move(r));
    }
    // One micro-batch, so that each step's wall time is its compute plus the actor overhead.
    const RunStats s = run(make_plan(1, false), *m, {}, reqs);
    std::printf("%-12d %12.1f %10.2f %17.1f%% %17.1f%%\n", k, s.tokens / s.wall, s.wall,
                100.0 * (1.0 - s.step_compute / s.wall),
                100.0 * (1.0 - s.step_compute / s.step_wall));
  }
  if (spec.has_recurrent_layers()) {  // resolve_plan turns the cache off for these models
    std::printf(
        "prefix cache: off for this model (its linear-attention layers keep a state per "
        "sequence, which cached KV blocks do not hold)\n");
    return 0;
  }
  // Shared system prompt: a 256-token prefix common to 16 requests, each adding 16 of its own.
  const auto system = random_tokens(256, spec.n_vocab, 7);
  std::vector<actors::GenerateRequest> reqs, warm;
  for (int i = 0; i < 16; ++i) {
    actors::GenerateRequest r;
    r.prompt_tokens = system;
    const auto own = random_tokens(16, spec.n_vocab, static_cast<uint32_t>(2000 + i));
    r.prompt_tokens.insert(r.prompt_tokens.end(), own.begin(), own.end());
    r.max_tokens = 16;
    r.sampling.ignore_eos = true;
    reqs.push_back(std::move(r));
  }
  warm.push_back(reqs[0]);  // the first request of the day puts the system prompt in the cache
  warm[0].prompt_tokens.back() ^= 1;
  const RunStats on = run(make_plan(2, true), *m, warm, reqs);
  const RunStats off = run(make_plan(2, false), *m, warm, reqs);
  std::printf(
      "shared 256-token system prompt, 16 requests: prefix cache on %.2f s (hit rate %.0f%%), "
      "off %.2f s: speed-up %.2fx\n",
      on.wall, on.query > 0 ? 100.0 * on.hit / on.query : 0.0, off.wall, off.wall / on.wall);
  return 0;
}
