// The machine's memory read bandwidth, measured one way for every benchmark that reports a
// fraction of it (membw_bench, matmul_bench, engine_bench): the roofline of batch-1 decode.
// Each thread sums its part of a buffer in 8 sections read in lockstep with software prefetch
// (one sequential stream per core leaves DRAM bandwidth unused: as few misses in flight as the
// hardware prefetcher keeps), 256-bit loads where the CPU has AVX2, over memory advised to use
// huge pages, as the engine's weights in memory do. The best plain read this code knows: a
// kernel's fraction of it is a fraction of what the machine gives, not of a weaker loop.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

#include "base/huge_pages.h"
#include "compute/thread_pool.h"

namespace troupe::bench {

__attribute__((target("avx2"))) inline uint64_t read_sum_avx2(const uint64_t* p, int64_t n) {
  constexpr int kStreams = 8;
  const int64_t sec = n / kStreams / 8 * 8;
  __m256i acc[kStreams];
  for (auto& a : acc) a = _mm256_setzero_si256();
  for (int64_t i = 0; i < sec; i += 8) {  // 64 bytes of each section per iteration
    for (int s = 0; s < kStreams; ++s) {
      const uint64_t* q = p + s * sec + i;
      _mm_prefetch(reinterpret_cast<const char*>(q + 512), _MM_HINT_T0);  // 4 KiB ahead
      acc[s] = _mm256_add_epi64(acc[s], _mm256_load_si256(reinterpret_cast<const __m256i*>(q)));
      acc[s] = _mm256_add_epi64(acc[s], _mm256_load_si256(reinterpret_cast<const __m256i*>(q + 4)));
    }
  }
  uint64_t r = 0;
  for (auto& a : acc) {
    uint64_t v[4];
    std::memcpy(v, &a, sizeof(v));
    r += v[0] + v[1] + v[2] + v[3];
  }
  for (int64_t i = kStreams * sec; i < n; ++i) r += p[i];
  return r;
}

inline uint64_t read_sum_plain(const uint64_t* p, int64_t n) {
  uint64_t s[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) s[k] += p[i + k];
  for (; i < n; ++i) s[0] += p[i];
  return s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}

inline bool membw_uses_avx2() { return __builtin_cpu_supports("avx2"); }

struct ReadBandwidth {
  double median = 0, min = 0, max = 0;  // GB/s over the timed passes
};

/// A buffer of `mib` MiB that `measure` reads with the pool's threads, each its own part (first
/// touched by the thread that reads it). Kept between measurements, so that a benchmark can
/// measure the bandwidth right next to each of its timed runs (it moves by ±30 % over minutes
/// on a shared VM) without paying for fresh pages every time.
class ReadBandwidthProbe {
 public:
  ReadBandwidthProbe(compute::ThreadPool& pool, int64_t mib)
      : pool_(pool), n_(mib * (int64_t{1} << 20) / 8), bytes_(static_cast<size_t>(n_) * 8) {
    std::shared_ptr<uint8_t> mem = map_huge_pages(bytes_);
    if (!mem) return;
    buf_ = std::shared_ptr<uint64_t>(mem, reinterpret_cast<uint64_t*>(mem.get()));
    uint64_t* buf = buf_.get();
    pool_.parallel_for(n_, 1 << 12, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) buf[i] = static_cast<uint64_t>(i);
    });
  }

  /// Reads the buffer `passes` times after one untimed pass. Zero GB/s if the buffer could not
  /// be allocated.
  ReadBandwidth measure(int passes) {
    if (!buf_ || passes < 1) return {};
    const uint64_t* buf = buf_.get();
    const bool avx2 = membw_uses_avx2();
    std::vector<double> gbs;
    std::vector<uint64_t> sums(static_cast<size_t>(pool_.size()));
    volatile uint64_t sink = 0;
    for (int p = 0; p < passes + 1; ++p) {
      const auto t0 = std::chrono::steady_clock::now();
      pool_.run([&](int idx, int nt) {
        const int64_t b = n_ * idx / nt / 64 * 64, e = n_ * (idx + 1) / nt / 64 * 64;
        sums[static_cast<size_t>(idx)] =
            avx2 ? read_sum_avx2(buf + b, e - b) : read_sum_plain(buf + b, e - b);
      });
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      for (uint64_t v : sums) sink = sink + v;
      if (p > 0) gbs.push_back(static_cast<double>(bytes_) / s / 1e9);  // pass 0: warm-up
    }
    std::sort(gbs.begin(), gbs.end());
    return {gbs[gbs.size() / 2], gbs.front(), gbs.back()};
  }

 private:
  compute::ThreadPool& pool_;
  int64_t n_;
  size_t bytes_;
  std::shared_ptr<uint64_t> buf_;  // base/huge_pages.h
};

/// Reads a buffer of `mib` MiB `passes` times (after one untimed pass) with the pool's threads.
/// Zero GB/s if the buffer cannot be allocated.
inline ReadBandwidth measure_read_bandwidth(compute::ThreadPool& pool, int64_t mib, int passes) {
  ReadBandwidthProbe probe(pool, mib);
  return probe.measure(passes);
}

}  // namespace troupe::bench
