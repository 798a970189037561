// Paged KV cache: one pool per engine, allocated once at start, split into fixed-size blocks.
// A sequence owns a block table (block ids in position order); attention reads through it.
// The pool is anonymous memory with transparent huge pages asked for: its size is checked at
// start against the memory available, and the kernel commits (and zeroes) its pages as blocks
// are first written. Zero-filling the default pool of a 1.1B model (131072 tokens, 5.9 GB) took
// ~25 s of start-up on the 2-core VM (4 KiB page faults); reserving it takes none.
// Not thread-safe: owned and mutated by one engine (or KV manager actor) at a time; the compute
// threads of a step only read and write the rows the step assigns to them.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "base/result.h"
#include "compute/kv_type.h"

namespace troupe::compute {

struct KvCacheConfig {
  int64_t n_layer = 0;
  int64_t k_width = 0;      // values per token per layer for K (MLA: latent + rope key)
  int64_t v_width = 0;      // values per token per layer for V (0 for MLA)
  int64_t block_size = 16;  // tokens per block
  int64_t num_blocks = 0;
  KvType type = KvType::kF32;  // what the values are stored as (kv_type.h)
};

class KvCache {
 public:
  /// Reserves the whole pool up front (zeroed, committed as used). Throws InputError when it is
  /// larger than the memory available or cannot be mapped.
  explicit KvCache(const KvCacheConfig& cfg);
  KvCache(const KvCache&) = delete;  // one pool per owner (a copy would share it)
  KvCache& operator=(const KvCache&) = delete;

  const KvCacheConfig& config() const { return cfg_; }
  int64_t block_size() const { return cfg_.block_size; }
  int64_t num_blocks() const { return cfg_.num_blocks; }
  uint64_t bytes() const { return bytes_; }

  /// The row of (layer, block, slot): k_width K values, then v_width V values, of
  /// config().type.
  uint8_t* row(int64_t layer, int32_t block, int64_t slot) {
    return pool_.get() +
           ((layer * cfg_.num_blocks + block) * cfg_.block_size + slot) * stride_ * elem_bytes_;
  }
  /// Writes x[0, n) into that row from value `at` on, rounded to the pool's type.
  void store(int64_t layer, int32_t block, int64_t slot, int64_t at, const float* x, int64_t n);
  /// Reads values [at, at + n) of that row back as floats (the rounded values, exactly).
  void load(int64_t layer, int32_t block, int64_t slot, int64_t at, int64_t n, float* out);
  /// An f32 pool's K row of (layer, block, slot) [k_width], and its V row [v_width].
  float* k(int64_t layer, int32_t block, int64_t slot) {
    return reinterpret_cast<float*>(row(layer, block, slot));
  }
  float* v(int64_t layer, int32_t block, int64_t slot) {
    return k(layer, block, slot) + cfg_.k_width;
  }
  /// Values from one slot's row to the next slot's (K and V of a slot are one row).
  int64_t row_stride() const { return stride_; }

 private:
  KvCacheConfig cfg_;
  int64_t stride_ = 0;             // k_width + v_width
  int64_t elem_bytes_ = 4;         // kv_type_bytes(cfg_.type)
  std::shared_ptr<uint8_t> pool_;  // base/huge_pages.h: zero, committed as blocks are written
  uint64_t bytes_ = 0;             // of the pool
};

/// Free-list allocator of block ids. Not thread-safe.
class BlockAllocator {
 public:
  explicit BlockAllocator(int64_t num_blocks);
  int64_t num_free() const { return static_cast<int64_t>(free_.size()); }
  int64_t num_total() const { return total_; }
  /// Appends n block ids to out; false (and nothing taken) when fewer than n are free.
  bool allocate(int64_t n, std::vector<int32_t>* out);
  void release(std::span<const int32_t> blocks);

 private:
  int64_t total_;
  std::vector<int32_t> free_;
};

}  // namespace troupe::compute
