// Receive buffers of the transport (private to transport/). Users: transport.cc, tests.
// Thread safety: get() and the buffers' release may happen on any thread (a mutex guards the
// free lists).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <vector>

#include <sys/mman.h>

namespace troupe::transport::detail {

// Receive buffers. Large messages landing in fresh memory pay a page fault per 4 KiB, which caps
// receiving at ~0.35 GB/s on the 2-core VM where shared memory moves ~10 GB/s. Buffers of
// >= 64 KiB therefore come in power-of-two size classes and return to a free list when the last
// reference to the message drops (decoders copy out what they keep), up to kMaxHeld bytes; the
// largest are 2 MiB aligned with transparent huge pages asked for. When a returning buffer does
// not fit under kMaxHeld, buffers of other size classes make room: a stream whose message size
// changed (the bench goes 1, 4, 16, 64 MiB) would otherwise find the pool full of sizes nobody
// asks for, and fault in (and zero) fresh memory for every message.
class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  static constexpr size_t kMaxHeld = size_t{256} << 20;

  ~BufferPool() {
    for (auto& [cls, list] : free_)
      for (uint64_t* p : list) std::free(p);
  }

  /// Bytes of free buffers the pool holds (for tests).
  size_t held_bytes() {
    std::lock_guard<std::mutex> lk(mu_);
    return held_;
  }

  std::shared_ptr<uint64_t[]> get(size_t bytes) {
    if (bytes < kMinPooled) return std::shared_ptr<uint64_t[]>(new uint64_t[(bytes + 7) / 8 + 1]);
    const size_t cls = std::bit_ceil(bytes);
    uint64_t* p = nullptr;
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto& list = free_[cls];
      if (!list.empty()) {
        p = list.back();
        list.pop_back();
        held_ -= cls;
      }
    }
    if (!p) p = allocate(cls);
    if (!p) throw std::bad_alloc();
    std::weak_ptr<BufferPool> weak = weak_from_this();
    return std::shared_ptr<uint64_t[]>(p, [weak, cls](uint64_t* q) {
      if (auto pool = weak.lock())
        pool->put(q, cls);
      else
        std::free(q);
    });
  }

 private:
  static constexpr size_t kMinPooled = size_t{64} << 10;
  static constexpr size_t kHugePage = size_t{2} << 20;

  static uint64_t* allocate(size_t cls) {
    const size_t align = cls >= kHugePage ? kHugePage : 64;
    void* p = std::aligned_alloc(align, cls);
    if (p && align == kHugePage) madvise(p, cls, MADV_HUGEPAGE);
    return static_cast<uint64_t*>(p);
  }

  void put(uint64_t* p, size_t cls) {
    std::vector<uint64_t*> evicted;
    {
      std::lock_guard<std::mutex> lk(mu_);
      // Largest other classes first: the fewest buffers to free.
      for (auto it = free_.rbegin(); held_ + cls > kMaxHeld && it != free_.rend(); ++it) {
        if (it->first == cls) continue;
        while (!it->second.empty() && held_ + cls > kMaxHeld) {
          evicted.push_back(it->second.back());
          it->second.pop_back();
          held_ -= it->first;
        }
      }
      if (held_ + cls <= kMaxHeld) {
        free_[cls].push_back(p);
        held_ += cls;
        p = nullptr;
      }
    }
    for (uint64_t* q : evicted) std::free(q);
    std::free(p);
  }

  std::mutex mu_;
  std::map<size_t, std::vector<uint64_t*>> free_;  // by size class
  size_t held_ = 0;
};

}  // namespace troupe::transport::detail
