// Paged KV cache: one pool per engine, allocated once at start, split into fixed-size blocks.
// A sequence owns a block table (block ids in position order); attention reads through it.
// The pool is anonymous memory with transparent huge pages asked for: its size is checked at
// start against the memory available, and the kernel commits (and zeroes) its pages as blocks
// are first written. Zero-filling the default pool of a 1.1B model (131072 tokens, 5.9 GB) took
// ~25 s of start-up on the 2-core VM (4 KiB page faults); reserving it takes none.
// Not thread-safe: owned and mutated by one engine (or KV manager actor) at a time; the compute
// threads of a step only read and write the rows the step assigns to them.
#pragma once

#include <algorithm>
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
  int64_t heads = 1;        // K and V each in this many equal parts (the KV heads; MLA: 1)
  int64_t block_size = 16;  // tokens per block
  int64_t num_blocks = 0;
  KvType type = KvType::kF32;  // what the values are stored as (kv_type.h)
  bool k_by_dim = false;       // each head's K in a block dimension by dimension (see KvCache)
};

/// Bytes of the pool a KvCache of cfg reserves.
uint64_t kv_pool_bytes(const KvCacheConfig& cfg);

/// A block of a layer holds its block_size slots' K and V head by head: for each KV head h its
/// K rows (k_width / heads values per slot, slot after slot), then for each head its V rows.
/// So attention, which reads one KV head's rows position after position, reads each block's
/// part as one contiguous run that the hardware prefetchers follow (with K and V of all heads
/// in one row per slot, a head's 256 bytes lay 2 KiB apart; attention_bench at 4096 positions
/// ran ~15 % slower that way, docs/benchmarks.md "Engine, session 35").
/// With k_by_dim, a head's K part of a block holds its values dimension by dimension (K value d
/// of slot s at k_offset(h) + d * block_size + s), so that attention's scores take block_size
/// positions per vector load (KvView::k_by_dim); the V rows stay slot after slot. MLA does not
/// use it: its values are read from its keys' rows.
class KvCache {
 public:
  /// Reserves the whole pool up front (zeroed, committed as used). Throws InputError when it is
  /// larger than the memory available or cannot be mapped, or when the widths do not split
  /// into `heads` parts.
  explicit KvCache(const KvCacheConfig& cfg);
  KvCache(const KvCache&) = delete;  // one pool per owner (a copy would share it)
  KvCache& operator=(const KvCache&) = delete;

  const KvCacheConfig& config() const { return cfg_; }
  int64_t block_size() const { return cfg_.block_size; }
  int64_t num_blocks() const { return cfg_.num_blocks; }
  uint64_t bytes() const { return bytes_; }

  /// The start of (layer, block): block_size * (k_width + v_width) values of config().type.
  uint8_t* block(int64_t layer, int32_t block) {
    return pool_.get() + (layer * cfg_.num_blocks + block) * cfg_.block_size * row_ * elem_bytes_;
  }
  /// Where KV head h's K rows start in a block, in values; a slot's row is k_stride() on from
  /// the one before (without k_by_dim). The same for V.
  int64_t k_offset(int64_t head) const { return head * cfg_.block_size * kd_; }
  int64_t v_offset(int64_t head) const {
    return cfg_.block_size * cfg_.k_width + head * cfg_.block_size * vd_;
  }
  int64_t k_stride() const { return kd_; }
  int64_t v_stride() const { return vd_; }

  /// Writes x[0, n) as values [at, at + n) of the slot's K|V row (k_width K values, then v_width
  /// V values, heads in order), each rounded to the pool's type.
  void store(int64_t layer, int32_t block, int64_t slot, int64_t at, const float* x, int64_t n);
  /// Reads values [at, at + n) of that row back as floats (the rounded values, exactly).
  void load(int64_t layer, int32_t block, int64_t slot, int64_t at, int64_t n, float* out);

 private:
  // Values [at, at + n) of a slot's row as the runs the block holds them in, one per head's
  // part: calls run(place in the block, index into [0, n), length, step) for each, in order,
  // value i of the run at place + i * step (step 1, or block_size for K by dimension).
  template <class F>
  void for_each_run(int64_t slot, int64_t at, int64_t n, F&& run) const {
    for (int64_t done = 0; done < n;) {
      const int64_t x = at + done;
      const bool k = x < cfg_.k_width;
      const int64_t w = k ? kd_ : vd_, in_row = k ? x : x - cfg_.k_width;
      const int64_t head = in_row / w, d = in_row % w;
      const int64_t len = std::min(n - done, w - d);
      if (k && cfg_.k_by_dim)
        run(k_offset(head) + d * cfg_.block_size + slot, done, len, cfg_.block_size);
      else
        run((k ? k_offset(head) : v_offset(head)) + slot * w + d, done, len, int64_t{1});
      done += len;
    }
  }

  KvCacheConfig cfg_;
  int64_t row_ = 0;                // k_width + v_width
  int64_t kd_ = 0, vd_ = 0;        // one head's K and V values per slot
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
