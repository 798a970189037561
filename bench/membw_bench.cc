// membw_bench: the machine's memory read bandwidth (the roofline for batch-1 decode), with 1
// and 2 threads through compute::ThreadPool. Prints the median of >= 5 timed passes.
// Usage: membw_bench [buffer_MiB (default 1024)] [passes (default 9)]
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "compute/matmul.h"
#include "compute/thread_pool.h"

namespace {

using troupe::compute::ThreadPool;

// Sums 64-bit words, reading 8 sections of [p, p + n) in lockstep with software prefetch:
// one sequential stream per core leaves DRAM bandwidth unused (as few misses in flight as
// the hardware prefetcher keeps), and the matmul kernels stream several rows at once too.
__attribute__((target("avx2"))) uint64_t read_sum_avx2(const uint64_t* p, int64_t n) {
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

uint64_t read_sum_plain(const uint64_t* p, int64_t n) {
  uint64_t s[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) s[k] += p[i + k];
  for (; i < n; ++i) s[0] += p[i];
  return s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t mib = argc > 1 ? std::atoll(argv[1]) : 1024;
  const int passes = std::max(5, argc > 2 ? std::atoi(argv[2]) : 9);
  const bool avx2 = __builtin_cpu_supports("avx2");
#ifdef NDEBUG
  const char* build = "release (NDEBUG)";
#else
  const char* build = "DEBUG (asserts on): numbers are not representative";
#endif
  std::printf("membw_bench: buffer %lld MiB, %d passes, median; simd %s; build %s\n",
              static_cast<long long>(mib), passes, avx2 ? "avx2" : "sse2", build);
  const int64_t n_words = mib * (1 << 20) / 8;
  auto* buf = static_cast<uint64_t*>(std::aligned_alloc(64, static_cast<size_t>(n_words) * 8));
  if (buf == nullptr) {
    std::fprintf(stderr, "allocation of %lld MiB failed\n", static_cast<long long>(mib));
    return 1;
  }
  for (int threads = 1; threads <= 2; ++threads) {
    ThreadPool pool(threads);
    // First touch by the thread that will read each half (matters on NUMA machines).
    pool.parallel_for(n_words, 1 << 12, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) buf[i] = static_cast<uint64_t>(i);
    });
    std::vector<double> gbs;
    volatile uint64_t sink = 0;
    for (int p = 0; p < passes + 1; ++p) {
      std::vector<uint64_t> sums(static_cast<size_t>(threads));
      const auto t0 = std::chrono::steady_clock::now();
      pool.run([&](int idx, int nt) {
        const int64_t b = n_words * idx / nt / 64 * 64, e = n_words * (idx + 1) / nt / 64 * 64;
        sums[static_cast<size_t>(idx)] =
            avx2 ? read_sum_avx2(buf + b, e - b) : read_sum_plain(buf + b, e - b);
      });
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      for (uint64_t v : sums) sink = sink + v;
      if (p > 0) gbs.push_back(static_cast<double>(n_words) * 8 / s / 1e9);  // pass 0: warm-up
    }
    std::sort(gbs.begin(), gbs.end());
    std::printf("read bandwidth, %d thread%s: median %.1f GB/s (min %.1f, max %.1f)\n", threads,
                threads > 1 ? "s" : " ", median(gbs), gbs.front(), gbs.back());
  }
  std::free(buf);
  return 0;
}
