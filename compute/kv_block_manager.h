// KvBlockManager: the allocation brain of one paged KV pool. It hands out block ids, keeps each
// sequence's block table and the blocks' reference counts, caches full blocks by chained hash so
// that a later sequence with the same prefix skips its prefill, and evicts cached blocks in LRU
// order. It owns ids only; the KV memory itself is compute::KvCache. Used by the KV manager actor
// and the scheduler's admission. Not thread-safe: owned by one actor, called from its handlers.
// A broken REQUIRES (a caller bug, never bad input) throws InternalError.
//
// Invariants (checked by check_invariants()):
//  1. Every block is in exactly one state: used (referenced by >= 1 live sequence), cached
//     (unreferenced, registered in the prefix cache, on the LRU list: evictable), or free.
//  2. A used block is never evicted or handed out again until its last reference is dropped.
//  3. Only full blocks whose KV has been committed are registered in the prefix cache, and only
//     such blocks are ever shared between live sequences. A sequence writes KV only at positions
//     >= its computed length, i.e. into its private, not yet full tail blocks.
//  4. A prefix-cache hit is exact: a block matches only when its own tokens are equal and it
//     was computed after exactly the prefix matched so far (compared by content ids, never by
//     hashes alone), so a hash collision can only cost a miss, never serve another prefix's KV.
//  5. At most one unreferenced copy of any block content is kept; redundant copies (two
//     sequences that computed the same prefix at once) go back to the free list on release.
//  6. Deterministic: the same sequence of calls yields the same block ids (no iteration over
//     hash maps decides anything; the free list is a stack that starts with the lowest ids).
//  7. A block holding an unidentified image position (token id -1: its KV depends on the
//     image's rows, not on the id) is never cached, nor is any later block of that sequence.
//     Ids below -1 name an image's content (kv_image_id): blocks holding them are cached and
//     matched like text, so a prompt that repeats an image behind the same prefix reuses its KV.
//     A hit never ends inside a span the caller asks to keep whole (KvWholeSpan).
#pragma once

#include <climits>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "base/result.h"

namespace troupe::compute {

/// Chained hash of one full block: H(hash of the previous block, tokens of this block).
using KvBlockHashFn = uint64_t (*)(uint64_t parent_hash, std::span<const int32_t> tokens);

/// The id that stands for every position of one image in a sequence's cache tokens: -2 - index,
/// where index numbers distinct image contents (the owner keeps a table from a content digest to
/// its index and never reuses one). Positions of the same image content share the id; the parent
/// chain then fixes which of its rows each one holds.
inline constexpr int32_t kv_image_id(int32_t index) { return -2 - index; }

/// The parent hash of a sequence's first block.
inline constexpr uint64_t kKvRootHash = 0x6b765f726f6f7421ULL;  // "kv_root!"

/// The default KvBlockHashFn: a 64-bit mix of the parent hash and the tokens. A pure function of
/// its inputs (the same in every process of one build), so peers may compute it to route by
/// prefix; it is only an index, never trusted without comparing tokens.
uint64_t kv_block_hash(uint64_t parent_hash, std::span<const int32_t> tokens);

struct KvBlockManagerConfig {
  int64_t num_blocks = 0;           // blocks in the pool, in [1, INT32_MAX]
  int64_t block_size = 16;          // tokens per block, >= 1
  bool enable_prefix_cache = true;  // false: freed blocks go straight to the free list
  KvBlockHashFn hash_fn = nullptr;  // nullptr: kv_block_hash. Tests inject colliding ones.
};

/// A snapshot of the pool. num_used + num_cached + num_free == num_blocks.
struct KvStats {
  int64_t num_blocks = 0;
  int64_t num_used = 0;    // referenced by at least one live sequence
  int64_t num_cached = 0;  // unreferenced but holding a reusable prefix (evictable)
  int64_t num_free = 0;    // on the free list
  int64_t num_sequences = 0;
  double usage_perc = 0;  // num_used / num_blocks, in [0, 1] (vLLM's kv_cache_usage_perc)
  // Allocated-but-unfilled token slots of used blocks / slots of used blocks, in [0, 1]: the
  // space lost to partly filled tails and to blocks reserved ahead of their tokens.
  double fragmentation_perc = 0;
  uint64_t prefix_queries = 0;       // add_sequence calls with the prefix cache enabled
  uint64_t prefix_query_tokens = 0;  // tokens those calls looked up
  uint64_t prefix_hit_tokens = 0;    // tokens they found already computed
  uint64_t evictions = 0;            // cached blocks taken back for reuse
  /// prefix_hit_tokens / prefix_query_tokens, 0 before any query.
  double prefix_hit_rate() const {
    return prefix_query_tokens == 0
               ? 0.0
               : static_cast<double>(prefix_hit_tokens) / static_cast<double>(prefix_query_tokens);
  }
};

/// Positions [begin, end) of a sequence that a prefix-cache hit takes whole or not at all (a
/// non-causal image, which must be computed in one step): a hit that would end strictly inside
/// one ends before it instead.
struct KvWholeSpan {
  int64_t begin = 0, end = 0;
};

/// What add_sequence would find for a token sequence, without taking anything (admission).
struct KvPrefixMatch {
  int64_t num_computed_tokens = 0;  // num_blocks * block_size
  int64_t num_blocks = 0;           // leading full blocks found in the cache
  // Of those, how many are unreferenced now: adding the sequence takes them out of
  // num_free_blocks(). A new sequence of length L fits iff
  //   ceil(L / block_size) - num_blocks <= num_free_blocks() - num_unreferenced_blocks.
  int64_t num_unreferenced_blocks = 0;
};

class KvBlockManager {
 public:
  /// Throws InputError on a bad configuration (non-positive sizes, more than INT32_MAX blocks).
  explicit KvBlockManager(const KvBlockManagerConfig& cfg);

  const KvBlockManagerConfig& config() const { return cfg_; }
  int64_t block_size() const { return cfg_.block_size; }
  int64_t num_blocks() const { return cfg_.num_blocks; }

  // ---- Sequence lifecycle ----

  /// Starts sequence seq_id whose known tokens are `tokens` (the prompt, or prompt + generated
  /// tokens on a replay). Takes a reference on the longest cached run of full leading blocks
  /// whose contents equal the tokens, and returns how many leading tokens are thereby already
  /// computed: a multiple of block_size, at most tokens.size() - 1 (the last token is always
  /// computed again, since a step needs it to produce logits). Those blocks form the block table;
  /// call reserve() for the rest. Errors (nothing changed): seq_id already live, empty tokens.
  /// `whole`: spans a hit must not end inside (KvWholeSpan).
  Result<int64_t> add_sequence(int64_t seq_id, std::span<const int32_t> tokens,
                               std::span<const KvWholeSpan> whole = {});

  /// What add_sequence(tokens, whole) would find now. Changes nothing, counts nothing.
  KvPrefixMatch match_prefix(std::span<const int32_t> tokens,
                             std::span<const KvWholeSpan> whole = {}) const;

  /// Grows the block table of seq_id to cover positions [0, new_length), taking blocks from the
  /// free list first, then evicting the least recently released cached block. Returns true if it
  /// already did. Returns false and changes nothing when too few blocks are free or evictable
  /// (the scheduler then preempts). Never shrinks. REQUIRES: seq_id is live.
  bool reserve(int64_t seq_id, int64_t new_length);

  /// Records that positions [0, computed_length) of seq_id now hold the KV of
  /// tokens[0, computed_length); every block this fills is registered in the prefix cache (when
  /// enabled) under its chained hash. tokens may be longer than computed_length.
  /// REQUIRES: seq_id is live; computed_length(seq_id) <= computed_length <= its reserved
  /// capacity and <= tokens.size(); tokens agree with those the sequence was added with.
  void commit(int64_t seq_id, std::span<const int32_t> tokens, int64_t computed_length);

  /// Ends seq_id and drops its references. Blocks in the prefix cache that become unreferenced
  /// turn evictable, tail blocks first (so a prefix's head outlives its tail); the others return
  /// to the free list. Returns false (and does nothing) if seq_id is not live, so an abort that
  /// races a finish is harmless.
  bool free_sequence(int64_t seq_id);

  // ---- Queries ----

  /// The block ids of seq_id in position order: block i holds positions [i*bs, (i+1)*bs).
  /// Valid until the next reserve/free_sequence of that sequence. Empty if seq_id is not live.
  std::span<const int32_t> block_table(int64_t seq_id) const;
  /// Positions of seq_id whose KV is computed; -1 if seq_id is not live.
  int64_t computed_length(int64_t seq_id) const;
  bool has_sequence(int64_t seq_id) const { return seqs_.contains(seq_id); }
  int64_t num_sequences() const { return static_cast<int64_t>(seqs_.size()); }

  /// Blocks reserve() can still hand out: free plus evictable.
  int64_t num_free_blocks() const;
  /// Blocks that growing seq_id to new_length would take (0 if already covered).
  /// REQUIRES: seq_id is live.
  int64_t num_blocks_needed(int64_t seq_id, int64_t new_length) const;
  /// Whether a sequence of num_tokens positions could ever fit, in an otherwise empty pool.
  bool can_fit(int64_t num_tokens) const;
  KvStats stats() const;

  /// Live references on block_id (tests and debugging).
  int32_t ref_count(int32_t block_id) const;
  /// Whether block_id holds a registered prefix (used or evictable).
  bool is_cached(int32_t block_id) const;

  /// Recomputes every invariant above from scratch; throws InternalError naming the first broken
  /// one. O(num_blocks + table sizes + pairs within a hash chain): for tests and debugging, not
  /// for every step.
  void check_invariants() const;

 private:
  static constexpr int32_t kNoBlock = -1;
  static constexpr uint64_t kNoContent = 0;    // content_id of a block not in the prefix cache
  static constexpr uint64_t kRootContent = 0;  // parent_content_id of a sequence's first block

  struct Block {
    int32_t ref_count = 0;
    int32_t lru_prev = kNoBlock;  // LRU neighbours, while cached and unreferenced
    int32_t lru_next = kNoBlock;
    int32_t chain_next = kNoBlock;  // next cached block with the same hash
    bool on_lru = false;
    uint64_t hash = 0;  // chained hash, while cached
    // Identity of the exact prefix this block's KV encodes: equal ids <=> equal prefixes.
    // Assigned when a full block is registered and never reused, so a stale parent id can
    // only fail to match.
    uint64_t content_id = kNoContent;
    uint64_t parent_content_id = kRootContent;
  };

  struct SeqState {
    std::vector<int32_t> blocks;
    int64_t computed = 0;
    // The first block holding an image position (invariant 7): from it on, full blocks stay
    // private like the tail.
    int64_t uncached_from = INT64_MAX;
  };

  SeqState& live(int64_t seq_id, const char* what);
  const SeqState& live(int64_t seq_id, const char* what) const;
  // Walks the cache along tokens; appends matched block ids to *out (may be null).
  int64_t find_prefix(std::span<const int32_t> tokens, std::span<const KvWholeSpan> whole,
                      std::vector<int32_t>* out) const;
  std::span<const int32_t> stored_tokens(int32_t b) const;
  bool holds(int32_t b, uint64_t parent_content_id, std::span<const int32_t> tokens) const;
  // A cached block with this content, preferring one already referenced; kNoBlock if none.
  int32_t find_holder(uint64_t hash, uint64_t parent_content_id,
                      std::span<const int32_t> tokens) const;
  void register_full_block(int32_t b, uint64_t parent_hash, uint64_t parent_content_id,
                           std::span<const int32_t> tokens);
  void index_erase(int32_t b);
  bool has_other_holder(int32_t b) const;
  void lru_push_back(int32_t b);
  void lru_erase(int32_t b);
  int32_t take_block();
  void acquire(int32_t b);
  void release(int32_t b);
  void check_block_states() const;
  void check_index() const;
  void check_sequences() const;

  KvBlockManagerConfig cfg_;
  std::vector<Block> blocks_;
  std::vector<int32_t> block_tokens_;  // [num_blocks, block_size], valid while a block is cached
  std::vector<int32_t> free_;          // stack: back() is handed out next
  int32_t lru_head_ = kNoBlock;        // least recently released cached block: evicted first
  int32_t lru_tail_ = kNoBlock;
  int64_t num_lru_ = 0;
  int64_t num_used_ = 0;
  int64_t num_unfilled_slots_ = 0;  // sum over live sequences of reserved - computed
  uint64_t next_content_id_ = 1;
  std::unordered_map<uint64_t, int32_t> index_;  // hash -> first cached block of its chain
  std::unordered_map<int64_t, SeqState> seqs_;
  uint64_t prefix_queries_ = 0;
  uint64_t prefix_query_tokens_ = 0;
  uint64_t prefix_hit_tokens_ = 0;
  uint64_t evictions_ = 0;
};

}  // namespace troupe::compute
