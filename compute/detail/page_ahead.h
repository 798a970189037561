// How far ahead a stream read prefetches, shared by the batch-1 tile kernels
// (avx512_common.h's prefetch_page_ahead) and the bandwidth probe that judges them
// (bench/detail/membw.h), so that the roofline is measured with the kernels' own distance.
// The hardware prefetchers of the hosts measured follow a stream within a 4 KiB page but not
// into the next one; one software prefetch per page, two pages ahead, restarts them early
// (docs/benchmarks.md "Engine, session 30").
#pragma once

#include <cstdint>

namespace troupe::compute::detail {

inline constexpr int64_t kPageBytes = 4096;
inline constexpr int64_t kPageAhead = 2 * kPageBytes;

}  // namespace troupe::compute::detail
