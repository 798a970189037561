// The machine's memory read bandwidth, measured one way for every benchmark that reports a
// fraction of it (membw_bench, matmul_bench, engine_bench): the roofline of batch-1 decode.
// Each thread reads its part of a buffer (advised to use huge pages, as the engine's weights in
// memory are) in three ways, and the fastest counts: the best plain read this code knows, so
// that a kernel's fraction of it is a fraction of what the machine gives, not of a weaker loop.
//   - 8 sections in lockstep with a software prefetch per line 4 KiB ahead (more misses in
//     flight than the hardware prefetcher keeps for one stream: the best on session 7's host);
//   - the same 8 sections without software prefetch;
//   - one stream with one prefetch per 4 KiB page, two pages ahead (the hardware prefetchers
//     do not follow a stream into the next page: the best on session 30's host, where the
//     first way read ~30 % less; docs/benchmarks.md "Engine, session 30").
// 256-bit loads where the CPU has AVX2.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <vector>

#include "base/huge_pages.h"
#include "compute/detail/page_ahead.h"
#include "compute/thread_pool.h"

namespace troupe::bench {

/// The ways of reading (see the top of this file); kPlain where the CPU lacks AVX2.
enum class ReadWay { kSectionsPrefetch, kSections, kPagePrefetch, kPlain };

inline const char* read_way_name(ReadWay w) {
  switch (w) {
    case ReadWay::kSectionsPrefetch:
      return "8 sections, prefetch per line";
    case ReadWay::kSections:
      return "8 sections";
    case ReadWay::kPagePrefetch:
      return "1 stream, prefetch per page";
    case ReadWay::kPlain:
      return "plain";
  }
  return "?";
}

template <bool kPrefetch>
__attribute__((target("avx2"))) inline uint64_t read_sections_avx2(const uint64_t* p, int64_t n) {
  constexpr int kStreams = 8;
  const int64_t sec = n / kStreams / 8 * 8;
  __m256i acc[kStreams];
  for (auto& a : acc) a = _mm256_setzero_si256();
  for (int64_t i = 0; i < sec; i += 8) {  // 64 bytes of each section per iteration
    for (int s = 0; s < kStreams; ++s) {
      const uint64_t* q = p + s * sec + i;
      if constexpr (kPrefetch)
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

// One stream, 128 bytes per iteration; at the start of every page, a prefetch into L2 of the
// page the tile kernels' prefetch_page_ahead would fetch (p is 64-byte aligned, as the probe's
// parts are).
__attribute__((target("avx2"))) inline uint64_t read_pages_avx2(const uint64_t* p, int64_t n) {
  using compute::detail::kPageAhead, compute::detail::kPageBytes;
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const uint64_t* q = p + i;
    if (reinterpret_cast<uintptr_t>(q) % kPageBytes == 0)
      _mm_prefetch(reinterpret_cast<const char*>(q) + kPageAhead, _MM_HINT_T1);
    a0 = _mm256_add_epi64(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(q)));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(q + 4)));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(q + 8)));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(q + 12)));
  }
  const __m256i a = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
  uint64_t v[4];
  std::memcpy(v, &a, sizeof(v));
  uint64_t r = v[0] + v[1] + v[2] + v[3];
  for (; i < n; ++i) r += p[i];
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
  double median = 0, min = 0, max = 0;  // GB/s over the timed passes of the fastest way
  ReadWay way = ReadWay::kPlain;        // that way
};

inline uint64_t read_sum(ReadWay way, const uint64_t* p, int64_t n) {
  switch (way) {
    case ReadWay::kSectionsPrefetch:
      return read_sections_avx2<true>(p, n);
    case ReadWay::kSections:
      return read_sections_avx2<false>(p, n);
    case ReadWay::kPagePrefetch:
      return read_pages_avx2(p, n);
    case ReadWay::kPlain:
      break;
  }
  return read_sum_plain(p, n);
}

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

  /// Reads the buffer `passes` times after one untimed pass in each way this CPU has, and
  /// returns each way's figures in ReadWay order. Empty if the buffer could not be allocated.
  std::vector<ReadBandwidth> measure_each(int passes) {
    std::vector<ReadBandwidth> out;
    if (!buf_ || passes < 1) return out;
    if (!membw_uses_avx2()) {
      out.push_back(measure_one(ReadWay::kPlain, passes));
      return out;
    }
    for (ReadWay way : {ReadWay::kSectionsPrefetch, ReadWay::kSections, ReadWay::kPagePrefetch})
      out.push_back(measure_one(way, passes));
    return out;
  }

  /// measure_each's fastest way (the highest median): the figure the benches judge against.
  /// Zero GB/s if the buffer could not be allocated.
  ReadBandwidth measure(int passes) { return fastest(measure_each(passes)); }

  static ReadBandwidth fastest(const std::vector<ReadBandwidth>& each) {
    ReadBandwidth best;
    for (const ReadBandwidth& bw : each)
      if (bw.median > best.median) best = bw;
    return best;
  }

 private:
  ReadBandwidth measure_one(ReadWay way, int passes) {
    const uint64_t* buf = buf_.get();
    std::vector<double> gbs;
    std::vector<uint64_t> sums(static_cast<size_t>(pool_.size()));
    volatile uint64_t sink = 0;
    for (int p = 0; p < passes + 1; ++p) {
      const auto t0 = std::chrono::steady_clock::now();
      pool_.run([&](int idx, int nt) {
        const int64_t b = n_ * idx / nt / 64 * 64, e = n_ * (idx + 1) / nt / 64 * 64;
        sums[static_cast<size_t>(idx)] = read_sum(way, buf + b, e - b);
      });
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      for (uint64_t v : sums) sink = sink + v;
      if (p > 0) gbs.push_back(static_cast<double>(bytes_) / s / 1e9);  // pass 0: warm-up
    }
    std::sort(gbs.begin(), gbs.end());
    return {gbs[gbs.size() / 2], gbs.front(), gbs.back(), way};
  }

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
