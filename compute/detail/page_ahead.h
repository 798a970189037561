// How far ahead a stream read prefetches, shared by the batch-1 tile kernels
// (prefetch_page_ahead below, for AVX-512 and AVX2 alike) and the bandwidth probe that judges them
// (bench/detail/membw.h), so that the roofline is measured with the kernels' own distance.
// The hardware prefetchers of the hosts measured follow a stream within a 4 KiB page but not
// into the next one; one software prefetch per page, two pages ahead, restarts them early
// (docs/benchmarks.md "Engine, session 30").
#pragma once

#include <cstdint>

namespace troupe::compute::detail {

inline constexpr int64_t kPageBytes = 4096;
inline constexpr int64_t kPageAhead = 2 * kPageBytes;
// A tile's only pass of 2-6 tokens streams too, with too little arithmetic per byte to hide the
// wait: besides the page prefetch, each line some KiB on into L1. The best distance measured
// differs by kernel family: kStreamAhead for the AVX-512 int8 tiles (rounded up to whole
// records), kStreamAheadFar for the AVX2 int8 tiles and the AVX-512 F16/BF16 quads
// (docs/benchmarks.md "Engine, session 43" and "session 44").
inline constexpr int64_t kStreamAhead = 4608;
inline constexpr int64_t kStreamAheadFar = 6912;
// Streaming passes with more work per byte (each int8 and K-quant kernel's kL2StreamTok tokens or
// more, 2-4 by type and set; the F16/BF16 quads from 2) also fetch every line kStreamAheadL2 on
// into L2 first, so that their L1 prefetches find it there. On an AMD Zen 4 host, where L1
// prefetches from DRAM held such passes to a third to a half of the bandwidth, they ran
// 1.0-2.3x faster with it (docs/benchmarks.md "Engine, session 45"); Q8_0's 2-3 tokens, the
// least work per byte, ran slower.
inline constexpr int64_t kStreamAheadL2 = 3 * kPageBytes;

/// Records of `rec` bytes that cover a distance of `bytes`: a prefetch distance rounded up to
/// whole records.
constexpr int64_t records_for(int64_t bytes, int64_t rec) { return (bytes + rec - 1) / rec; }

// In an unnamed namespace, as simd_hsum.h: files built for AVX2 and for AVX-512 include these, and
// each keeps its own copy.
namespace {  // NOLINT(google-build-namespaces)

// Software prefetches into L1 and L2 that the compiler keeps: g++ 12 dropped every
// _mm_prefetch of the Q4_K tile kernel once an address depended on the pass (TilePass), and
// batch-1 decode lost a quarter of its speed.
inline void prefetch_l1(const void* p) {
  __asm__ volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p)));
}
inline void prefetch_l2(const void* p) {
  __asm__ volatile("prefetcht1 %0" : : "m"(*static_cast<const char*>(p)));
}

// A stream read record by record: when the record [p, p + len) ends in another 4 KiB page than
// it starts, one prefetch into L2 of that page's start kPageAhead bytes on.
// Batch-1 Q4_0 decode ~30 % faster than with no software prefetch, and the best read loop
// found on this host (docs/benchmarks.md "Engine, session 30").
inline void prefetch_page_ahead(const uint8_t* p, int64_t len) {
  constexpr auto kPage = static_cast<uintptr_t>(kPageBytes);
  const auto a = reinterpret_cast<uintptr_t>(p), e = a + static_cast<uintptr_t>(len);
  if (a / kPage != e / kPage)
    prefetch_l2(reinterpret_cast<const uint8_t*>((e & ~(kPage - 1)) + kPageAhead));
}

}  // namespace

}  // namespace troupe::compute::detail
