// KvPools: the scheduler's KV block ids as one or more equal pools, a sequence living in exactly
// one. A data-parallel GPU stage (gpu/dp_engine.h) keeps each rank's KV cache on its own GPU:
// block ids [p * per_pool, (p + 1) * per_pool) are rank p's, and all of a sequence's blocks must
// be on one rank. With one pool this is exactly a KvBlockManager. Each pool is a KvBlockManager
// (prefix caching within a pool); ids are translated to the global range on the way out.
// Not thread-safe: owned by the scheduler actor.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "base/result.h"
#include "compute/kv_block_manager.h"

namespace troupe::compute {

class KvPools {
 public:
  /// cfg.num_blocks in all, split into n_pools equal pools. Throws InputError when n_pools < 1 or
  /// does not divide cfg.num_blocks, and as KvBlockManager for a bad cfg.
  KvPools(const KvBlockManagerConfig& cfg, int64_t n_pools);

  int64_t num_pools() const { return static_cast<int64_t>(pools_.size()); }
  int64_t blocks_per_pool() const { return per_pool_; }
  int64_t num_blocks() const { return per_pool_ * num_pools(); }

  /// KvBlockManager::add_sequence in the pool chosen by, in turn: room for all of `tokens`, the
  /// longest cached prefix of them, the fewest live sequences, the most blocks left, the lowest
  /// index: deterministic, spreading new sequences over the pools and following a cached prefix
  /// only where it fits.
  Result<int64_t> add_sequence(int64_t seq_id, std::span<const int32_t> tokens,
                               std::span<const KvWholeSpan> whole = {});
  /// As KvBlockManager, in the sequence's pool. REQUIRES (reserve, commit): seq_id is live.
  bool reserve(int64_t seq_id, int64_t new_length);
  void commit(int64_t seq_id, std::span<const int32_t> tokens, int64_t computed_length);
  bool free_sequence(int64_t seq_id);
  /// Global block ids (the pool's ids + pool * blocks_per_pool). Valid until the next
  /// block_table, reserve or free_sequence call on this object.
  std::span<const int32_t> block_table(int64_t seq_id);
  /// The pool seq_id lives in, or -1.
  int64_t pool_of(int64_t seq_id) const;
  /// KvBlockManager::computed_length in seq_id's pool; -1 if seq_id is not live.
  int64_t computed_length(int64_t seq_id) const;
  /// Whether a sequence of num_tokens positions could ever fit in one (otherwise empty) pool.
  bool can_fit(int64_t num_tokens) const;
  /// The pools' stats summed (usage and fragmentation over all of them).
  KvStats stats() const;
  const KvBlockManager& pool(int64_t p) const { return pools_.at(static_cast<size_t>(p)); }
  void check_invariants() const;

 private:
  KvBlockManager& pool_for(int64_t seq_id, const char* what);

  int64_t per_pool_ = 0;
  std::vector<KvBlockManager> pools_;
  std::unordered_map<int64_t, int64_t> seq_pool_;
  std::vector<int32_t> table_;  // block_table's translated ids
};

}  // namespace troupe::compute
