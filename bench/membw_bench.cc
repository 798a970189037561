// membw_bench: the machine's memory read bandwidth (the roofline for batch-1 decode), with 1
// and 2 threads through compute::ThreadPool, measured as bench/detail/membw.h says (the same
// measurement matmul_bench and engine_bench report fractions of): each way of reading, then the
// fastest. Median of >= 5 timed passes.
// Usage: membw_bench [buffer_MiB (default 1024)] [passes (default 9)]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "bench/detail/args.h"
#include "bench/detail/membw.h"
#include "compute/thread_pool.h"

int main(int argc, char** argv) {
  const char* tool = "membw_bench";
  if (argc > 1 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
    std::printf("usage: membw_bench [buffer_MiB (1024)] [passes (9, at least 5)]\n");
    return 0;
  }
  if (argc > 3) troupe::bench::usage_error(tool, "takes at most two values: buffer_MiB passes");
  const int64_t mib =
      argc > 1 ? troupe::bench::int_arg(tool, "buffer_MiB", argv[1], 1, 1 << 20) : 1024;
  const int passes =
      static_cast<int>(argc > 2 ? troupe::bench::int_arg(tool, "passes", argv[2], 5, 1000) : 9);
#ifdef NDEBUG
  const char* build = "release (NDEBUG)";
#else
  const char* build = "DEBUG (asserts on): numbers are not representative";
#endif
  std::printf("membw_bench: buffer %lld MiB, %d passes, median; simd %s; build %s\n",
              static_cast<long long>(mib), passes,
              troupe::bench::membw_uses_avx2() ? "avx2" : "sse2", build);
  namespace tb = troupe::bench;
  for (int threads = 1; threads <= 2; ++threads) {
    troupe::compute::ThreadPool pool(threads);
    tb::ReadBandwidthProbe probe(pool, mib);
    const std::vector<tb::ReadBandwidth> each = probe.measure_each(passes);
    if (each.empty()) {
      std::fprintf(stderr, "membw_bench: allocation of %lld MiB failed\n",
                   static_cast<long long>(mib));
      return 1;
    }
    for (const tb::ReadBandwidth& bw : each)
      std::printf("  %d thread%s, %-30s median %.1f GB/s (min %.1f, max %.1f)\n", threads,
                  threads > 1 ? "s" : " ", tb::read_way_name(bw.way), bw.median, bw.min, bw.max);
    const tb::ReadBandwidth best = tb::ReadBandwidthProbe::fastest(each);
    std::printf("read bandwidth, %d thread%s: median %.1f GB/s (min %.1f, max %.1f; %s)\n", threads,
                threads > 1 ? "s" : " ", best.median, best.min, best.max,
                tb::read_way_name(best.way));
  }
  return 0;
}
