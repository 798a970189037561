// kv_block_manager_bench: operations per second of KvBlockManager under a serving-like load:
// waves of requests that share a 512-token system prompt (prefix hits) with unique 128-token
// user parts, 32 decode steps each, then release; the pool fills and evicts. Median of 7 waves.
// Usage: kv_block_manager_bench
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "compute/kv_block_manager.h"

using troupe::compute::KvBlockManager;
using troupe::compute::KvBlockManagerConfig;

namespace {

constexpr int kWaves = 7;
constexpr int kSeqs = 256;    // live sequences per wave
constexpr int kSystem = 512;  // shared prefix tokens
constexpr int kUser = 128;    // unique tokens per request
constexpr int kDecode = 32;   // decode steps per request
constexpr int64_t kBlockSize = 16;
constexpr int64_t kNumBlocks = 8192;

using Clock = std::chrono::steady_clock;
double seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Rates {  // operations per second, one wave
  double add, reserve, commit, decode, free;
};

Rates run_wave(KvBlockManager& m, int wave, uint32_t* next_token) {
  std::vector<std::vector<int32_t>> toks(kSeqs);
  for (int s = 0; s < kSeqs; ++s) {
    for (int i = 0; i < kSystem; ++i) toks[s].push_back(i);
    for (int i = 0; i < kUser; ++i)
      toks[s].push_back(static_cast<int32_t>((*next_token)++ % 100000));
  }
  const int64_t base = static_cast<int64_t>(wave) * kSeqs;
  Rates r{};
  auto t0 = Clock::now();
  for (int s = 0; s < kSeqs; ++s)
    if (!m.add_sequence(base + s, toks[s]).has_value()) std::abort();
  r.add = kSeqs / seconds(t0);
  t0 = Clock::now();
  for (int s = 0; s < kSeqs; ++s)
    if (!m.reserve(base + s, kSystem + kUser)) std::abort();
  r.reserve = kSeqs / seconds(t0);
  t0 = Clock::now();
  for (int s = 0; s < kSeqs; ++s) m.commit(base + s, toks[s], kSystem + kUser);
  r.commit = kSeqs / seconds(t0);
  t0 = Clock::now();
  for (int step = 0; step < kDecode; ++step)
    for (int s = 0; s < kSeqs; ++s) {
      toks[s].push_back(step);
      const auto len = static_cast<int64_t>(toks[s].size());
      if (!m.reserve(base + s, len)) std::abort();
      m.commit(base + s, toks[s], len);
    }
  r.decode = static_cast<double>(kSeqs) * kDecode / seconds(t0);
  t0 = Clock::now();
  for (int s = 0; s < kSeqs; ++s) m.free_sequence(base + s);
  r.free = kSeqs / seconds(t0);
  return r;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main() {
#ifndef NDEBUG
  std::printf("WARNING: assertions on (not a Release build); timings are pessimistic\n");
#endif
  std::printf(
      "kv_block_manager_bench: %lld blocks of %lld tokens; waves of %d requests, "
      "%d shared + %d unique prompt tokens, %d decode steps; median of %d waves\n",
      static_cast<long long>(kNumBlocks), static_cast<long long>(kBlockSize), kSeqs, kSystem, kUser,
      kDecode, kWaves);
  KvBlockManagerConfig cfg;
  cfg.num_blocks = kNumBlocks;
  cfg.block_size = kBlockSize;
  KvBlockManager m(cfg);
  uint32_t next_token = 1000;
  std::vector<double> add, reserve, commit, decode, release;
  // Warm-up: one request computes the system prompt, then a wave fills the pool's cache.
  std::vector<int32_t> system(kSystem + 1);
  for (int i = 0; i <= kSystem; ++i) system[i] = i;
  if (!m.add_sequence(-1, system).has_value() || !m.reserve(-1, kSystem + 1)) std::abort();
  m.commit(-1, system, kSystem + 1);
  m.free_sequence(-1);
  run_wave(m, 0, &next_token);
  for (int w = 1; w <= kWaves; ++w) {
    const Rates r = run_wave(m, w, &next_token);
    add.push_back(r.add);
    reserve.push_back(r.reserve);
    commit.push_back(r.commit);
    decode.push_back(r.decode);
    release.push_back(r.free);
  }
  const auto st = m.stats();
  std::printf("  add_sequence (32-block prefix hit):   %10.0f /s\n", median(add));
  std::printf("  reserve (8 blocks):                   %10.0f /s\n", median(reserve));
  std::printf("  commit (8 blocks registered):         %10.0f /s\n", median(commit));
  std::printf("  decode step (reserve + commit 1 tok): %10.0f /s\n", median(decode));
  std::printf("  free_sequence (42 blocks):            %10.0f /s\n", median(release));
  std::printf("  prefix hit rate %.3f, evictions %llu, cached blocks %lld\n", st.prefix_hit_rate(),
              static_cast<unsigned long long>(st.evictions), static_cast<long long>(st.num_cached));
  return 0;
}
