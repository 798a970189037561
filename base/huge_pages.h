// Anonymous memory with transparent huge pages asked for, for the large buffers that compute
// streams through: the weights copy (model/weights_memory.cc), the KV pool (compute/kv_cache.cc)
// and the benchmarks' bandwidth probe (bench/detail/membw.h). The kernel hands out zeroed pages
// and commits each on first touch.
#pragma once

#include <cstdint>
#include <memory>

#include <sys/mman.h>

namespace troupe {

inline constexpr uint64_t kHugePageBytes = uint64_t{2} << 20;

/// `bytes` rounded up to whole huge pages: what map_huge_pages maps.
inline uint64_t huge_page_round(uint64_t bytes) {
  return (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
}

/// huge_page_round(bytes) of private anonymous memory, read-write and zero, unmapped when the
/// last owner drops it; nullptr (errno set by mmap) when it cannot be mapped. The huge-page
/// advice is only advice: 4 KiB pages work too.
inline std::shared_ptr<uint8_t> map_huge_pages(uint64_t bytes) {
  const uint64_t mapped = huge_page_round(bytes);
  void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  ::madvise(p, mapped, MADV_HUGEPAGE);
  return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(p),
                                  [mapped](uint8_t* q) { ::munmap(q, mapped); });
}

}  // namespace troupe
