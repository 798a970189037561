// KvBlockManager (see kv_block_manager.h for the invariants). Block states live in one array with
// intrusive links (LRU list, hash chains), so every allocation, release and lookup is O(1) apart
// from walking a hash chain, which holds more than one block only for twins or collisions.
#include "compute/kv_block_manager.h"

#include <algorithm>
#include <climits>

#include "base/check.h"

namespace troupe::compute {

namespace {

// NOTE: 0 is "unspecified" until compute/ has its Errc (STYLE.md "Errors"), as in sampler.cc.
constexpr int kBadSequence = 0;

constexpr uint64_t kMulA = 0x9e3779b97f4a7c15ULL;
constexpr uint64_t kMulB = 0xd6e8feb86659fd93ULL;

uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t finalize64(uint64_t h) {
  h ^= h >> 31;
  h *= 0x94d049bb133111ebULL;
  h ^= h >> 29;
  h *= 0xbf58476d1ce4e5b9ULL;
  return h ^ (h >> 32);
}

long long ll(int64_t v) { return static_cast<long long>(v); }

}  // namespace

uint64_t kv_block_hash(uint64_t parent_hash, std::span<const int32_t> tokens) {
  // The length is folded in so that blocks of different sizes never share a hash by padding.
  uint64_t h = parent_hash ^ (kMulA * (static_cast<uint64_t>(tokens.size()) + 1));
  size_t i = 0;
  for (; i + 1 < tokens.size(); i += 2) {
    const uint64_t word = static_cast<uint32_t>(tokens[i]) |
                          (static_cast<uint64_t>(static_cast<uint32_t>(tokens[i + 1])) << 32);
    h = rotl64((h ^ word) * kMulA, 31) * kMulB;
  }
  if (i < tokens.size()) h = rotl64((h ^ static_cast<uint32_t>(tokens[i])) * kMulA, 31) * kMulB;
  return finalize64(h);
}

KvBlockManager::KvBlockManager(const KvBlockManagerConfig& cfg) : cfg_(cfg) {
  if (cfg.num_blocks <= 0 || cfg.num_blocks > INT32_MAX || cfg.block_size <= 0)
    TROUPE_INPUT_ERROR(
        "KV block manager: bad configuration (blocks %lld, expected 1..%d; block "
        "size %lld, expected >= 1)",
        ll(cfg.num_blocks), INT32_MAX, ll(cfg.block_size));
  if (cfg_.hash_fn == nullptr) cfg_.hash_fn = &kv_block_hash;
  blocks_.resize(static_cast<size_t>(cfg.num_blocks));
  if (cfg.enable_prefix_cache)
    block_tokens_.resize(static_cast<size_t>(cfg.num_blocks * cfg.block_size));
  // A stack whose top is the lowest id: a fresh pool hands out 0, 1, 2, ...
  free_.reserve(static_cast<size_t>(cfg.num_blocks));
  for (int64_t b = cfg.num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

// ---- Sequence lifecycle ----

Result<int64_t> KvBlockManager::add_sequence(int64_t seq_id, std::span<const int32_t> tokens,
                                             std::span<const KvWholeSpan> whole) {
  if (seqs_.contains(seq_id))
    return make_error(kBadSequence,
                      strfmt("KV add_sequence: sequence %lld is already live", ll(seq_id)));
  if (tokens.empty())
    return make_error(kBadSequence,
                      strfmt("KV add_sequence: sequence %lld has no tokens", ll(seq_id)));
  SeqState s;
  const int64_t num_hit = find_prefix(tokens, whole, &s.blocks);
  for (int32_t b : s.blocks) acquire(b);
  s.computed = num_hit * cfg_.block_size;
  if (cfg_.enable_prefix_cache) {
    ++prefix_queries_;
    prefix_query_tokens_ += tokens.size();
    prefix_hit_tokens_ += static_cast<uint64_t>(s.computed);
  }
  const int64_t computed = s.computed;
  seqs_.emplace(seq_id, std::move(s));
  return computed;
}

KvPrefixMatch KvBlockManager::match_prefix(std::span<const int32_t> tokens,
                                           std::span<const KvWholeSpan> whole) const {
  std::vector<int32_t> hit;
  KvPrefixMatch m;
  m.num_blocks = find_prefix(tokens, whole, &hit);
  m.num_computed_tokens = m.num_blocks * cfg_.block_size;
  for (int32_t b : hit) m.num_unreferenced_blocks += blocks_[b].ref_count == 0 ? 1 : 0;
  return m;
}

bool KvBlockManager::reserve(int64_t seq_id, int64_t new_length) {
  SeqState& s = live(seq_id, "reserve");
  const int64_t needed = num_blocks_needed(seq_id, new_length);
  if (needed == 0) return true;
  if (needed > num_free_blocks()) return false;
  s.blocks.reserve(s.blocks.size() + static_cast<size_t>(needed));  // no throw past this point
  for (int64_t i = 0; i < needed; ++i) {
    const int32_t b = take_block();
    acquire(b);
    s.blocks.push_back(b);
  }
  num_unfilled_slots_ += needed * cfg_.block_size;
  return true;
}

void KvBlockManager::commit(int64_t seq_id, std::span<const int32_t> tokens,
                            int64_t computed_length) {
  SeqState& s = live(seq_id, "commit");
  const int64_t bs = cfg_.block_size;
  const int64_t capacity = static_cast<int64_t>(s.blocks.size()) * bs;
  TROUPE_CHECK(computed_length >= s.computed && computed_length <= capacity &&
                   computed_length <= static_cast<int64_t>(tokens.size()),
               "KV commit of sequence %lld: computed length %lld, expected in [%lld, %lld] "
               "(computed so far, reserved) and <= %zu tokens",
               ll(seq_id), ll(computed_length), ll(s.computed), ll(capacity), tokens.size());
  if (cfg_.enable_prefix_cache) {
    for (int64_t i = s.computed / bs; i < computed_length / bs && i < s.uncached_from; ++i) {
      const auto block_tokens =
          tokens.subspan(static_cast<size_t>(i * bs), static_cast<size_t>(bs));
      if (std::any_of(block_tokens.begin(), block_tokens.end(),
                      [](int32_t t) { return t == -1; })) {
        s.uncached_from = i;  // invariant 7
        break;
      }
      const int32_t b = s.blocks[static_cast<size_t>(i)];
      // Only the private tail is ever written: a shared or cached block here means the table
      // and the computed length disagree, and caching it again would corrupt the index.
      TROUPE_CHECK(blocks_[b].ref_count == 1 && blocks_[b].content_id == kNoContent,
                   "KV commit of sequence %lld: block %d at index %lld is shared or cached",
                   ll(seq_id), b, ll(i));
      const int32_t prev = i == 0 ? kNoBlock : s.blocks[static_cast<size_t>(i - 1)];
      register_full_block(b, prev == kNoBlock ? kKvRootHash : blocks_[prev].hash,
                          prev == kNoBlock ? kRootContent : blocks_[prev].content_id, block_tokens);
    }
  }
  num_unfilled_slots_ -= computed_length - s.computed;
  s.computed = computed_length;
}

bool KvBlockManager::free_sequence(int64_t seq_id) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return false;
  SeqState& s = it->second;
  num_unfilled_slots_ -= static_cast<int64_t>(s.blocks.size()) * cfg_.block_size - s.computed;
  // Tail first: within one sequence the LRU then evicts from the end of the prefix, and a
  // block whose parent is gone can never be matched anyway.
  for (auto b = s.blocks.rbegin(); b != s.blocks.rend(); ++b) release(*b);
  seqs_.erase(it);
  return true;
}

// ---- Queries ----

std::span<const int32_t> KvBlockManager::block_table(int64_t seq_id) const {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return {};
  return it->second.blocks;
}

int64_t KvBlockManager::computed_length(int64_t seq_id) const {
  auto it = seqs_.find(seq_id);
  return it == seqs_.end() ? -1 : it->second.computed;
}

int64_t KvBlockManager::num_free_blocks() const {
  return static_cast<int64_t>(free_.size()) + num_lru_;
}

int64_t KvBlockManager::num_blocks_needed(int64_t seq_id, int64_t new_length) const {
  const SeqState& s = live(seq_id, "num_blocks_needed");
  TROUPE_CHECK(new_length >= 0, "KV reserve of sequence %lld: negative length %lld", ll(seq_id),
               ll(new_length));
  const int64_t want = (new_length + cfg_.block_size - 1) / cfg_.block_size;
  return std::max<int64_t>(0, want - static_cast<int64_t>(s.blocks.size()));
}

bool KvBlockManager::can_fit(int64_t num_tokens) const {
  return num_tokens >= 0 && (num_tokens + cfg_.block_size - 1) / cfg_.block_size <= cfg_.num_blocks;
}

KvStats KvBlockManager::stats() const {
  KvStats st;
  st.num_blocks = cfg_.num_blocks;
  st.num_used = num_used_;
  st.num_cached = num_lru_;
  st.num_free = static_cast<int64_t>(free_.size());
  st.num_sequences = num_sequences();
  st.usage_perc = static_cast<double>(num_used_) / static_cast<double>(cfg_.num_blocks);
  st.fragmentation_perc = num_used_ == 0 ? 0.0
                                         : static_cast<double>(num_unfilled_slots_) /
                                               static_cast<double>(num_used_ * cfg_.block_size);
  st.prefix_queries = prefix_queries_;
  st.prefix_query_tokens = prefix_query_tokens_;
  st.prefix_hit_tokens = prefix_hit_tokens_;
  st.evictions = evictions_;
  return st;
}

int32_t KvBlockManager::ref_count(int32_t block_id) const {
  TROUPE_CHECK(block_id >= 0 && block_id < cfg_.num_blocks, "KV block id %d out of range",
               block_id);
  return blocks_[block_id].ref_count;
}

bool KvBlockManager::is_cached(int32_t block_id) const {
  TROUPE_CHECK(block_id >= 0 && block_id < cfg_.num_blocks, "KV block id %d out of range",
               block_id);
  return blocks_[block_id].content_id != kNoContent;
}

// ---- Invariants ----

void KvBlockManager::check_invariants() const {
  check_block_states();
  check_index();
  check_sequences();
}

// Invariants 1 and 2: reference counts match the tables; used, cached and free partition the pool.
void KvBlockManager::check_block_states() const {
  const int64_t n = cfg_.num_blocks;
  std::vector<int32_t> refs(static_cast<size_t>(n), 0);
  for (const auto& [id, s] : seqs_)
    for (int32_t b : s.blocks) {
      TROUPE_CHECK(b >= 0 && b < n, "sequence %lld: block id %d out of range", ll(id), b);
      ++refs[b];
    }
  enum : char { kUnseen, kUsed, kLru, kFree };
  std::vector<char> state(static_cast<size_t>(n), kUnseen);
  int64_t used = 0;
  for (int32_t b = 0; b < n; ++b) {
    TROUPE_CHECK(refs[b] == blocks_[b].ref_count, "block %d: %d references in tables, count %d", b,
                 refs[b], blocks_[b].ref_count);
    if (refs[b] > 0) state[b] = kUsed, ++used;
  }
  TROUPE_CHECK(used == num_used_, "%lld used blocks, counter says %lld", ll(used), ll(num_used_));
  int64_t on_lru = 0;
  int32_t prev = kNoBlock;
  for (int32_t b = lru_head_; b != kNoBlock; prev = b, b = blocks_[b].lru_next) {
    TROUPE_CHECK(on_lru++ < n, "LRU list has a cycle");
    TROUPE_CHECK(state[b] == kUnseen, "block %d on the LRU list is used or listed twice", b);
    TROUPE_CHECK(blocks_[b].on_lru && blocks_[b].lru_prev == prev, "block %d: bad LRU links", b);
    TROUPE_CHECK(blocks_[b].content_id != kNoContent, "block %d on the LRU list is not cached", b);
    state[b] = kLru;
  }
  TROUPE_CHECK(prev == lru_tail_ && on_lru == num_lru_, "LRU tail %d (expected %d), %lld entries",
               prev, lru_tail_, ll(on_lru));
  for (int32_t b : free_) {
    TROUPE_CHECK(b >= 0 && b < n, "free block id %d out of range", b);
    TROUPE_CHECK(state[b] == kUnseen, "free block %d is used, evictable or listed twice", b);
    TROUPE_CHECK(blocks_[b].content_id == kNoContent, "free block %d is still cached", b);
    state[b] = kFree;
  }
  for (int32_t b = 0; b < n; ++b) {
    TROUPE_CHECK(state[b] != kUnseen, "block %d is neither used, evictable nor free", b);
    TROUPE_CHECK(blocks_[b].on_lru == (state[b] == kLru), "block %d: stale LRU flag", b);
  }
}

// Invariants 4 and 5: the index holds exactly the cached blocks; equal contents share one id.
void KvBlockManager::check_index() const {
  TROUPE_CHECK(cfg_.enable_prefix_cache || index_.empty(), "prefix cache off but index not empty");
  int64_t indexed = 0;
  for (const auto& [hash, head] : index_) {
    int64_t steps = 0;
    for (int32_t b = head; b != kNoBlock; b = blocks_[b].chain_next) {
      TROUPE_CHECK(steps++ < cfg_.num_blocks, "hash chain has a cycle");
      const Block& m = blocks_[b];
      TROUPE_CHECK(m.content_id != kNoContent && m.hash == hash, "block %d: bad index entry", b);
      ++indexed;
      for (int32_t x = m.chain_next; x != kNoBlock; x = blocks_[x].chain_next) {
        const bool same = holds(x, m.parent_content_id, stored_tokens(b));
        TROUPE_CHECK(same == (blocks_[x].content_id == m.content_id),
                     "blocks %d and %d: content ids disagree with contents", b, x);
        TROUPE_CHECK(!same || m.ref_count > 0 || blocks_[x].ref_count > 0,
                     "blocks %d and %d: two unreferenced copies of one prefix", b, x);
      }
    }
  }
  int64_t cached = 0;
  for (const Block& m : blocks_) cached += m.content_id != kNoContent ? 1 : 0;
  TROUPE_CHECK(indexed == cached, "%lld blocks indexed, %lld cached", ll(indexed), ll(cached));
}

// Invariant 3: full committed blocks are cached and chained to their parents; tails are private.
void KvBlockManager::check_sequences() const {
  const int64_t bs = cfg_.block_size;
  int64_t unfilled = 0;
  for (const auto& [id, s] : seqs_) {
    const int64_t capacity = static_cast<int64_t>(s.blocks.size()) * bs;
    TROUPE_CHECK(s.computed >= 0 && s.computed <= capacity, "sequence %lld: computed %lld of %lld",
                 ll(id), ll(s.computed), ll(capacity));
    unfilled += capacity - s.computed;
    for (size_t i = 0; i < s.blocks.size(); ++i) {
      const Block& m = blocks_[s.blocks[i]];
      const auto bi = static_cast<int64_t>(i);
      if (bi >= s.computed / bs || bi >= s.uncached_from) {
        TROUPE_CHECK(m.ref_count == 1 && m.content_id == kNoContent,
                     "sequence %lld: tail or image block %d is shared or cached", ll(id),
                     s.blocks[i]);
      } else if (cfg_.enable_prefix_cache) {
        const Block* parent = i == 0 ? nullptr : &blocks_[s.blocks[i - 1]];
        TROUPE_CHECK(m.content_id != kNoContent, "sequence %lld: full block %d is not cached",
                     ll(id), s.blocks[i]);
        TROUPE_CHECK(m.parent_content_id == (parent ? parent->content_id : kRootContent) &&
                         m.hash == cfg_.hash_fn(parent ? parent->hash : kKvRootHash,
                                                stored_tokens(s.blocks[i])),
                     "sequence %lld: block %d is not chained to its parent", ll(id), s.blocks[i]);
      }
    }
  }
  TROUPE_CHECK(unfilled == num_unfilled_slots_, "%lld unfilled slots, counter says %lld",
               ll(unfilled), ll(num_unfilled_slots_));
}

// ---- Internals ----

KvBlockManager::SeqState& KvBlockManager::live(int64_t seq_id, const char* what) {
  auto it = seqs_.find(seq_id);
  TROUPE_CHECK(it != seqs_.end(), "KV %s: sequence %lld is not live", what, ll(seq_id));
  return it->second;
}

const KvBlockManager::SeqState& KvBlockManager::live(int64_t seq_id, const char* what) const {
  auto it = seqs_.find(seq_id);
  TROUPE_CHECK(it != seqs_.end(), "KV %s: sequence %lld is not live", what, ll(seq_id));
  return it->second;
}

int64_t KvBlockManager::find_prefix(std::span<const int32_t> tokens,
                                    std::span<const KvWholeSpan> whole,
                                    std::vector<int32_t>* out) const {
  if (!cfg_.enable_prefix_cache || tokens.empty()) return 0;
  const int64_t bs = cfg_.block_size;
  // The last token is never served from the cache: its step must run to give logits, so a
  // prompt of exactly k full blocks can hit at most k - 1 of them.
  const int64_t max_blocks = (static_cast<int64_t>(tokens.size()) - 1) / bs;
  uint64_t hash = kKvRootHash;
  uint64_t parent = kRootContent;
  int64_t n = 0;
  for (; n < max_blocks; ++n) {
    const auto block = tokens.subspan(static_cast<size_t>(n * bs), static_cast<size_t>(bs));
    hash = cfg_.hash_fn(hash, block);
    const int32_t b = find_holder(hash, parent, block);
    if (b == kNoBlock) break;
    parent = blocks_[b].content_id;
    if (out != nullptr) out->push_back(b);
  }
  // Back off to a block boundary at or before the start of any span the hit would end inside
  // (earlier spans first: backing off may land inside one of them).
  for (bool moved = true; moved && n > 0;) {
    moved = false;
    for (const KvWholeSpan& w : whole) {
      if (w.begin < n * bs && n * bs < w.end) {
        n = w.begin / bs;
        moved = true;
      }
    }
  }
  if (out != nullptr && static_cast<int64_t>(out->size()) > n) out->resize(static_cast<size_t>(n));
  return n;
}

std::span<const int32_t> KvBlockManager::stored_tokens(int32_t b) const {
  return std::span<const int32_t>(block_tokens_)
      .subspan(static_cast<size_t>(b) * static_cast<size_t>(cfg_.block_size),
               static_cast<size_t>(cfg_.block_size));
}

bool KvBlockManager::holds(int32_t b, uint64_t parent_content_id,
                           std::span<const int32_t> tokens) const {
  const auto stored = stored_tokens(b);
  return blocks_[b].parent_content_id == parent_content_id &&
         std::equal(stored.begin(), stored.end(), tokens.begin(), tokens.end());
}

int32_t KvBlockManager::find_holder(uint64_t hash, uint64_t parent_content_id,
                                    std::span<const int32_t> tokens) const {
  auto it = index_.find(hash);
  if (it == index_.end()) return kNoBlock;
  int32_t unreferenced = kNoBlock;
  for (int32_t b = it->second; b != kNoBlock; b = blocks_[b].chain_next) {
    if (!holds(b, parent_content_id, tokens)) continue;  // a collision or another prefix
    // A referenced copy costs nothing to share; an unreferenced one leaves the evictable pool.
    if (blocks_[b].ref_count > 0) return b;
    if (unreferenced == kNoBlock) unreferenced = b;
  }
  return unreferenced;
}

void KvBlockManager::register_full_block(int32_t b, uint64_t parent_hash,
                                         uint64_t parent_content_id,
                                         std::span<const int32_t> tokens) {
  const uint64_t hash = cfg_.hash_fn(parent_hash, tokens);
  // Two sequences that computed the same prefix at once hold equal copies: both stay indexed
  // (block tables are append-only, so neither can be swapped for the other), under one content
  // id so that children of either copy match after either parent.
  const int32_t twin = find_holder(hash, parent_content_id, tokens);
  Block& m = blocks_[b];
  m.hash = hash;
  m.parent_content_id = parent_content_id;
  m.content_id = twin != kNoBlock ? blocks_[twin].content_id : next_content_id_++;
  std::copy(tokens.begin(), tokens.end(),
            block_tokens_.begin() + static_cast<ptrdiff_t>(b) * cfg_.block_size);
  auto [it, inserted] = index_.try_emplace(hash, b);
  if (!inserted) {
    m.chain_next = it->second;
    it->second = b;
  }
}

void KvBlockManager::index_erase(int32_t b) {
  Block& m = blocks_[b];
  auto it = index_.find(m.hash);
  TROUPE_CHECK(it != index_.end(), "KV block %d: hash not indexed", b);
  if (it->second == b) {
    if (m.chain_next == kNoBlock)
      index_.erase(it);
    else
      it->second = m.chain_next;
  } else {
    int32_t p = it->second;
    while (blocks_[p].chain_next != b) {
      p = blocks_[p].chain_next;
      TROUPE_CHECK(p != kNoBlock, "KV block %d: missing from its hash chain", b);
    }
    blocks_[p].chain_next = m.chain_next;
  }
  m.chain_next = kNoBlock;
  m.content_id = kNoContent;
  m.parent_content_id = kRootContent;
  m.hash = 0;
}

bool KvBlockManager::has_other_holder(int32_t b) const {
  auto it = index_.find(blocks_[b].hash);
  if (it == index_.end()) return false;
  for (int32_t x = it->second; x != kNoBlock; x = blocks_[x].chain_next)
    if (x != b && blocks_[x].content_id == blocks_[b].content_id) return true;
  return false;
}

void KvBlockManager::lru_push_back(int32_t b) {
  Block& m = blocks_[b];
  m.on_lru = true;
  m.lru_prev = lru_tail_;
  m.lru_next = kNoBlock;
  if (lru_tail_ != kNoBlock)
    blocks_[lru_tail_].lru_next = b;
  else
    lru_head_ = b;
  lru_tail_ = b;
  ++num_lru_;
}

void KvBlockManager::lru_erase(int32_t b) {
  Block& m = blocks_[b];
  if (m.lru_prev != kNoBlock)
    blocks_[m.lru_prev].lru_next = m.lru_next;
  else
    lru_head_ = m.lru_next;
  if (m.lru_next != kNoBlock)
    blocks_[m.lru_next].lru_prev = m.lru_prev;
  else
    lru_tail_ = m.lru_prev;
  m.lru_prev = m.lru_next = kNoBlock;
  m.on_lru = false;
  --num_lru_;
}

int32_t KvBlockManager::take_block() {
  if (!free_.empty()) {
    const int32_t b = free_.back();
    free_.pop_back();
    return b;
  }
  const int32_t b = lru_head_;
  TROUPE_CHECK(b != kNoBlock, "KV pool: no free or evictable block");
  lru_erase(b);
  index_erase(b);
  ++evictions_;
  return b;
}

void KvBlockManager::acquire(int32_t b) {
  Block& m = blocks_[b];
  if (m.ref_count == 0) {
    if (m.on_lru) lru_erase(b);
    ++num_used_;
  }
  ++m.ref_count;
}

void KvBlockManager::release(int32_t b) {
  Block& m = blocks_[b];
  TROUPE_CHECK(m.ref_count > 0, "KV block %d released with no reference", b);
  if (--m.ref_count > 0) return;
  --num_used_;
  if (m.content_id == kNoContent) {
    free_.push_back(b);
  } else if (has_other_holder(b)) {
    // Another copy keeps this prefix findable; a second evictable copy would only waste space.
    index_erase(b);
    free_.push_back(b);
  } else {
    lru_push_back(b);
  }
}

}  // namespace troupe::compute
