// KvPools (compute/kv_pools.h).
#include "compute/kv_pools.h"

#include <cstdint>

#include "base/check.h"

namespace troupe::compute {

KvPools::KvPools(const KvBlockManagerConfig& cfg, int64_t n_pools) {
  if (n_pools < 1 || cfg.num_blocks < n_pools || cfg.num_blocks % n_pools != 0 ||
      cfg.num_blocks > INT32_MAX)
    TROUPE_INPUT_ERROR("KV pools: %lld blocks do not split into %lld equal pools",
                       static_cast<long long>(cfg.num_blocks), static_cast<long long>(n_pools));
  per_pool_ = cfg.num_blocks / n_pools;
  KvBlockManagerConfig c = cfg;
  c.num_blocks = per_pool_;
  pools_.reserve(static_cast<size_t>(n_pools));
  for (int64_t p = 0; p < n_pools; ++p) pools_.emplace_back(c);
}

Result<int64_t> KvPools::add_sequence(int64_t seq_id, std::span<const int32_t> tokens,
                                      std::span<const KvWholeSpan> whole) {
  if (seq_pool_.contains(seq_id))
    return Error{0, "KV pools: sequence " + std::to_string(seq_id) + " is already live"};
  // Pools with room for the whole known sequence first, then the longest cached prefix, the
  // fewest live sequences, the most room, the lowest index.
  const auto bs = pools_[0].block_size();
  const auto want = (static_cast<int64_t>(tokens.size()) + bs - 1) / bs;
  size_t best = 0;
  bool best_fits = false;
  int64_t best_hit = -1, best_seqs = 0, best_left = -1;
  for (size_t p = 0; p < pools_.size(); ++p) {
    const KvPrefixMatch m = pools_[p].match_prefix(tokens, whole);
    const int64_t left = pools_[p].num_free_blocks() - m.num_unreferenced_blocks;
    const bool fits = want - m.num_blocks <= left;
    const int64_t seqs = pools_[p].num_sequences();
    const bool better = best_hit < 0 || (fits != best_fits          ? fits
                                         : m.num_blocks != best_hit ? m.num_blocks > best_hit
                                         : seqs != best_seqs        ? seqs < best_seqs
                                                                    : left > best_left);
    if (better) {
      best = p;
      best_fits = fits;
      best_hit = m.num_blocks;
      best_seqs = seqs;
      best_left = left;
    }
  }
  auto r = pools_[best].add_sequence(seq_id, tokens, whole);
  if (r) seq_pool_.emplace(seq_id, static_cast<int64_t>(best));
  return r;
}

KvBlockManager& KvPools::pool_for(int64_t seq_id, const char* what) {
  const auto it = seq_pool_.find(seq_id);
  TROUPE_CHECK(it != seq_pool_.end(), "KV pools: %s of sequence %lld, which is not live", what,
               static_cast<long long>(seq_id));
  return pools_[static_cast<size_t>(it->second)];
}

bool KvPools::reserve(int64_t seq_id, int64_t new_length) {
  return pool_for(seq_id, "reserve").reserve(seq_id, new_length);
}

void KvPools::commit(int64_t seq_id, std::span<const int32_t> tokens, int64_t computed_length) {
  pool_for(seq_id, "commit").commit(seq_id, tokens, computed_length);
}

bool KvPools::free_sequence(int64_t seq_id) {
  const auto it = seq_pool_.find(seq_id);
  if (it == seq_pool_.end()) return false;
  const bool freed = pools_[static_cast<size_t>(it->second)].free_sequence(seq_id);
  seq_pool_.erase(it);
  return freed;
}

std::span<const int32_t> KvPools::block_table(int64_t seq_id) {
  const auto it = seq_pool_.find(seq_id);
  if (it == seq_pool_.end()) return {};
  const std::span<const int32_t> t = pools_[static_cast<size_t>(it->second)].block_table(seq_id);
  if (pools_.size() == 1) return t;
  const auto base = static_cast<int32_t>(it->second * per_pool_);
  table_.assign(t.begin(), t.end());
  for (int32_t& b : table_) b += base;
  return table_;
}

int64_t KvPools::pool_of(int64_t seq_id) const {
  const auto it = seq_pool_.find(seq_id);
  return it == seq_pool_.end() ? -1 : it->second;
}

int64_t KvPools::computed_length(int64_t seq_id) const {
  const int64_t p = pool_of(seq_id);
  return p < 0 ? -1 : pools_[static_cast<size_t>(p)].computed_length(seq_id);
}

bool KvPools::can_fit(int64_t num_tokens) const { return pools_[0].can_fit(num_tokens); }

KvStats KvPools::stats() const {
  KvStats s;
  double unfilled_weighted = 0;
  for (const KvBlockManager& p : pools_) {
    const KvStats q = p.stats();
    s.num_blocks += q.num_blocks;
    s.num_used += q.num_used;
    s.num_cached += q.num_cached;
    s.num_free += q.num_free;
    s.num_sequences += q.num_sequences;
    s.prefix_queries += q.prefix_queries;
    s.prefix_query_tokens += q.prefix_query_tokens;
    s.prefix_hit_tokens += q.prefix_hit_tokens;
    s.evictions += q.evictions;
    unfilled_weighted += q.fragmentation_perc * static_cast<double>(q.num_used);
  }
  s.usage_perc =
      s.num_blocks ? static_cast<double>(s.num_used) / static_cast<double>(s.num_blocks) : 0.0;
  s.fragmentation_perc = s.num_used ? unfilled_weighted / static_cast<double>(s.num_used) : 0.0;
  return s;
}

void KvPools::check_invariants() const {
  for (const KvBlockManager& p : pools_) p.check_invariants();
  for (const auto& [seq, pool] : seq_pool_)
    TROUPE_CHECK(pools_[static_cast<size_t>(pool)].has_sequence(seq),
                 "KV pools: sequence %lld is mapped to pool %lld, which does not hold it",
                 static_cast<long long>(seq), static_cast<long long>(pool));
}

}  // namespace troupe::compute
