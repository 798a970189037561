// The checksum's block loop, compiled three times (AVX-512, AVX2, x86-64) and chosen by the
// loader from the CPU (GCC/Clang function multi-versioning); every version gives the same sums.
#include "transport/detail/checksum.h"

#include <cstring>

namespace troupe::transport::detail {

#if defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
#define TROUPE_CHECKSUM_CLONES [[gnu::target_clones("avx512f", "avx2", "default")]]
#else
#define TROUPE_CHECKSUM_CLONES
#endif

TROUPE_CHECKSUM_CLONES
void checksum_blocks(uint64_t* a_out, uint64_t* b_out, const uint8_t* p, size_t n_blocks) {
  uint64_t a[kChecksumLanes], b[kChecksumLanes];
  std::memcpy(a, a_out, sizeof a);
  std::memcpy(b, b_out, sizeof b);
  for (size_t i = 0; i < n_blocks; ++i, p += kChecksumBlock) {
    uint64_t w[kChecksumLanes];
    std::memcpy(w, p, sizeof w);
    for (int l = 0; l < kChecksumLanes; ++l) {
      a[l] += w[l];
      b[l] += a[l];
    }
  }
  std::memcpy(a_out, a, sizeof a);
  std::memcpy(b_out, b, sizeof b);
}

}  // namespace troupe::transport::detail
