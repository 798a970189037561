#include "compute/kv_cache.h"

#include "base/check.h"

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
  try {
    pool_.assign(n, 0.f);
  } catch (const std::bad_alloc&) {
    TROUPE_INPUT_ERROR("KV cache: cannot allocate %.1f MiB",
                       static_cast<double>(n) * 4 / 1048576.0);
  }
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
