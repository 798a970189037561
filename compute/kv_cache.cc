#include "compute/kv_cache.h"

#include <cerrno>
#include <cstring>

#include "base/check.h"
#include "base/huge_pages.h"
#include "model/model.h"

namespace troupe::compute {

KvCache::KvCache(const KvCacheConfig& cfg) : cfg_(cfg), stride_(cfg.k_width + cfg.v_width) {
  if (cfg.n_layer <= 0 || stride_ <= 0 || cfg.block_size <= 0 || cfg.num_blocks <= 0)
    TROUPE_INPUT_ERROR(
        "KV cache: bad configuration (layers %lld, width %lld, block %lld, "
        "blocks %lld)",
        static_cast<long long>(cfg.n_layer), static_cast<long long>(stride_),
        static_cast<long long>(cfg.block_size), static_cast<long long>(cfg.num_blocks));
  const uint64_t n = static_cast<uint64_t>(cfg.n_layer) * static_cast<uint64_t>(cfg.num_blocks) *
                     static_cast<uint64_t>(cfg.block_size) * static_cast<uint64_t>(stride_);
  bytes_ = n * sizeof(float);
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  const uint64_t available = model::available_memory_bytes();  // 0: unknown
  if (available > 0 && bytes_ > available)
    TROUPE_INPUT_ERROR(
        "KV cache: a pool of %lld blocks of %lld tokens over %lld layers needs %.2f GiB, more "
        "than the %.2f GiB of memory available (lower kv_blocks, or scheduler.max_sequences or "
        "max_model_len, which size an \"auto\" pool)",
        static_cast<long long>(cfg.num_blocks), static_cast<long long>(cfg.block_size),
        static_cast<long long>(cfg.n_layer), static_cast<double>(bytes_) / kGiB,
        static_cast<double>(available) / kGiB);
  std::shared_ptr<uint8_t> mem = map_huge_pages(bytes_);
  if (!mem)
    TROUPE_INPUT_ERROR("KV cache: cannot map %.2f GiB: %s", static_cast<double>(bytes_) / kGiB,
                       std::strerror(errno));
  pool_ = std::shared_ptr<float>(mem, reinterpret_cast<float*>(mem.get()));
}

BlockAllocator::BlockAllocator(int64_t num_blocks) : total_(num_blocks) {
  free_.reserve(static_cast<size_t>(num_blocks));
  // Hand out low ids first: pop from the back.
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

bool BlockAllocator::allocate(int64_t n, std::vector<int32_t>* out) {
  if (n > num_free()) return false;
  for (int64_t i = 0; i < n; ++i) {
    out->push_back(free_.back());
    free_.pop_back();
  }
  return true;
}

void BlockAllocator::release(std::span<const int32_t> blocks) {
  for (int32_t b : blocks) {
    TROUPE_CHECK(b >= 0 && b < total_, "block id %d out of range", b);
    free_.push_back(b);
  }
}

}  // namespace troupe::compute
