// Tests of compute/kv_block_manager.h: prefix reuse (full blocks only, >= 1 token left to compute,
// exact under forced hash collisions), sharing between live sequences, LRU eviction that never
// touches referenced blocks, failed reservations that change nothing, statistics, the cache
// switched off, determinism, and a randomized run against a reference model of KV contents.
#include "compute/kv_block_manager.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

namespace troupe::compute {
namespace {

using Tokens = std::vector<int32_t>;

KvBlockManagerConfig config(int64_t num_blocks, int64_t block_size = 4, bool cache = true,
                            KvBlockHashFn hash_fn = nullptr) {
  KvBlockManagerConfig c;
  c.num_blocks = num_blocks;
  c.block_size = block_size;
  c.enable_prefix_cache = cache;
  c.hash_fn = hash_fn;
  return c;
}

// n distinct tokens first, first + 1, ...
Tokens iota_tokens(int32_t first, int n) {
  Tokens t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

Tokens concat(Tokens a, const Tokens& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

Tokens table(const KvBlockManager& m, int64_t seq_id) {
  const auto t = m.block_table(seq_id);
  return Tokens(t.begin(), t.end());
}

// Adds seq_id, reserves and commits all of tokens; returns the prefix hit.
int64_t run(KvBlockManager& m, int64_t seq_id, const Tokens& tokens) {
  auto hit = m.add_sequence(seq_id, tokens);
  EXPECT_TRUE(hit.has_value());
  EXPECT_TRUE(m.reserve(seq_id, static_cast<int64_t>(tokens.size())));
  m.commit(seq_id, tokens, static_cast<int64_t>(tokens.size()));
  m.check_invariants();
  return hit.has_value() ? *hit : -1;
}

// Image positions (negative ids) are never cached, nor anything after them: two prompts with
// different images behind the same placeholder must not share KV. The blocks before the first
// image block still are.
TEST(KvBlockManager, BlocksFromTheFirstImagePositionOnAreNeverCached) {
  KvBlockManager m(config(32));
  const Tokens text = iota_tokens(100, 8);  // two full blocks
  const Tokens prompt =
      concat(concat(text, Tokens{5, -1, -1, -1, -1, -1, 6, 7}), iota_tokens(200, 8));
  EXPECT_EQ(run(m, 1, prompt), 0);
  ASSERT_TRUE(m.free_sequence(1));
  // Same text, then the same placeholders (a different image, maybe): only the text is reused.
  EXPECT_EQ(run(m, 2, prompt), 8);
  ASSERT_TRUE(m.free_sequence(2));
  // Committed in several pieces, the blocks after the image stay uncached too.
  auto hit = m.add_sequence(3, prompt);
  ASSERT_TRUE(hit.has_value());
  ASSERT_TRUE(m.reserve(3, static_cast<int64_t>(prompt.size())));
  for (int64_t n : {12, 16, 20, 24}) m.commit(3, prompt, n);
  m.check_invariants();
  ASSERT_TRUE(m.free_sequence(3));
  EXPECT_EQ(m.match_prefix(prompt).num_computed_tokens, 8);
}

// Identified images (content ids below -1, kv_image_id) are cached like text: the same image
// behind the same prefix is reused through and past it; another image (another id) only up to
// where it starts.
TEST(KvBlockManager, BlocksOfIdentifiedImagesAreCachedByContent) {
  KvBlockManager m(config(32));
  const Tokens text = iota_tokens(100, 8);
  const int32_t a = kv_image_id(0), b = kv_image_id(1);
  EXPECT_EQ(a, -2);
  EXPECT_EQ(b, -3);
  const Tokens with_a =
      concat(concat(text, Tokens{5, a, a, a, a, a, a, a, a, a, 6, 7}), iota_tokens(200, 4));
  Tokens with_b = with_a;
  std::replace(with_b.begin(), with_b.end(), a, b);
  EXPECT_EQ(run(m, 1, with_a), 0);
  ASSERT_TRUE(m.free_sequence(1));
  // Every block but the last (one token is always computed): text, image, text after it.
  EXPECT_EQ(run(m, 2, with_a), 20);
  ASSERT_TRUE(m.free_sequence(2));
  EXPECT_EQ(run(m, 3, with_b), 8);  // the text only: the next block holds the other image
  ASSERT_TRUE(m.free_sequence(3));
  EXPECT_EQ(m.match_prefix(with_b).num_computed_tokens, 20);  // now cached too
  EXPECT_EQ(m.match_prefix(with_a).num_computed_tokens, 20);
}

// A hit never ends strictly inside a span kept whole (a non-causal image): it backs off to the
// block boundary at or before the span's start, and only then; the blocks it drops stay cached.
TEST(KvBlockManager, HitsTakeWholeSpansWholeOrNotAtAll) {
  KvBlockManager m(config(32));
  const int32_t a = kv_image_id(0);
  // Text 0..9, image 10..21, text 22..27.
  const Tokens prompt = concat(concat(iota_tokens(100, 10), Tokens(12, a)), iota_tokens(300, 6));
  const KvWholeSpan image[] = {{10, 22}};
  // Only positions 0..15 are computed and cached: four blocks, the last ending inside the image.
  ASSERT_TRUE(m.add_sequence(1, prompt).has_value());
  ASSERT_TRUE(m.reserve(1, 16));
  m.commit(1, prompt, 16);
  ASSERT_TRUE(m.free_sequence(1));
  EXPECT_EQ(m.match_prefix(prompt).num_computed_tokens, 16);
  EXPECT_EQ(m.match_prefix(prompt, image).num_computed_tokens, 8);  // block 2 holds position 10
  auto hit = m.add_sequence(2, prompt, image);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(*hit, 8);
  EXPECT_EQ(m.block_table(2).size(), 2u);
  m.check_invariants();
  // With the whole image computed, the hit goes through it.
  ASSERT_TRUE(m.reserve(2, 28));
  m.commit(2, prompt, 28);
  ASSERT_TRUE(m.free_sequence(2));
  EXPECT_EQ(m.match_prefix(prompt, image).num_computed_tokens, 24);
  // Spans that touch the hit's end but do not contain it change nothing; nested back-offs do.
  const KvWholeSpan ends_there[] = {{10, 24}};
  EXPECT_EQ(m.match_prefix(prompt, ends_there).num_computed_tokens, 24);
  const KvWholeSpan chain[] = {{22, 26}, {5, 23}};
  EXPECT_EQ(m.match_prefix(prompt, chain).num_computed_tokens, 4);
  m.check_invariants();
}

// Test hash functions that force collisions.
uint64_t constant_hash(uint64_t, std::span<const int32_t>) { return 42; }
uint64_t parent_blind_hash(uint64_t, std::span<const int32_t> t) { return kv_block_hash(0, t); }
uint64_t coarse_hash(uint64_t parent, std::span<const int32_t> t) {
  return (parent + static_cast<uint64_t>(t[0])) & 3;
}

// ---- Prefix cache ----

TEST(KvBlockManager, ReusesCachedPrefixBlock) {
  KvBlockManager m(config(16));
  const Tokens prompt = iota_tokens(100, 10);  // 2 full blocks + 2 tokens
  EXPECT_EQ(run(m, 1, prompt), 0);
  EXPECT_EQ(table(m, 1), (Tokens{0, 1, 2}));
  ASSERT_TRUE(m.free_sequence(1));
  EXPECT_EQ(m.stats().num_cached, 2);  // the partial tail went back to the free list

  const Tokens longer = concat(prompt, iota_tokens(500, 7));
  auto hit = m.add_sequence(2, longer);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(*hit, 8);
  EXPECT_EQ(m.computed_length(2), 8);
  EXPECT_EQ(table(m, 2), (Tokens{0, 1}));
  ASSERT_TRUE(m.reserve(2, static_cast<int64_t>(longer.size())));
  EXPECT_EQ(table(m, 2).size(), 5u);
  m.commit(2, longer, static_cast<int64_t>(longer.size()));
  m.check_invariants();
}

TEST(KvBlockManager, NeverReturnsPartialBlockAsHit) {
  KvBlockManager m(config(16));
  const Tokens prompt = iota_tokens(0, 7);  // 1 full block + 3 tokens
  run(m, 1, prompt);
  EXPECT_TRUE(m.is_cached(table(m, 1)[0]));
  EXPECT_FALSE(m.is_cached(table(m, 1)[1]));
  // While the owner is live and after it is gone, only the full block is found.
  const Tokens again = concat(prompt, {9, 9, 9});
  EXPECT_EQ(m.match_prefix(again).num_computed_tokens, 4);
  m.free_sequence(1);
  EXPECT_EQ(run(m, 2, again), 4);
}

TEST(KvBlockManager, AlwaysLeavesOneTokenToCompute) {
  KvBlockManager m(config(16));
  const Tokens prompt = iota_tokens(0, 8);  // exactly 2 full blocks
  run(m, 1, prompt);
  m.free_sequence(1);
  // The same 8 tokens: the second block is dropped so that token 7 is computed for logits.
  EXPECT_EQ(m.match_prefix(prompt).num_computed_tokens, 4);
  EXPECT_EQ(run(m, 2, prompt), 4);
  // Sequence 2 recomputed the second block into block 2, a live twin of the cached block 1. A
  // lookup prefers the live copy: sharing it takes nothing out of the evictable pool.
  EXPECT_EQ(table(m, 2), (Tokens{0, 2}));
  const KvPrefixMatch pm = m.match_prefix(concat(prompt, {1}));
  EXPECT_EQ(pm.num_blocks, 2);
  EXPECT_EQ(pm.num_unreferenced_blocks, 0);
  m.free_sequence(2);  // block 2 is a redundant copy now: freed, block 1 stays cached
  EXPECT_EQ(m.stats().num_cached, 2);
  EXPECT_FALSE(m.is_cached(2));
  EXPECT_EQ(m.match_prefix(concat(prompt, {1})).num_computed_tokens, 8);
  EXPECT_EQ(m.match_prefix(Tokens{0}).num_computed_tokens, 0);
  EXPECT_EQ(m.match_prefix(iota_tokens(0, 4)).num_computed_tokens, 0);
  EXPECT_EQ(m.match_prefix(iota_tokens(0, 5)).num_computed_tokens, 4);
}

TEST(KvBlockManager, HashCollisionIsAMiss) {
  KvBlockManager m(config(16, 4, true, &constant_hash));  // every block collides
  const Tokens a = iota_tokens(0, 9);
  run(m, 1, a);
  m.free_sequence(1);
  EXPECT_EQ(m.match_prefix(iota_tokens(50, 9)).num_blocks, 0);
  Tokens b = a;
  b[5] = 99;  // second block differs
  EXPECT_EQ(m.match_prefix(b).num_blocks, 1);
  EXPECT_EQ(run(m, 2, b), 4);
  m.free_sequence(2);
  // Both versions of the second block now share one hash; each still matches only itself.
  EXPECT_EQ(m.match_prefix(a).num_blocks, 2);
  EXPECT_EQ(m.match_prefix(b).num_blocks, 2);
  EXPECT_EQ(m.stats().num_cached, 3);
  m.check_invariants();
}

TEST(KvBlockManager, SameTokensUnderADifferentPrefixIsAMiss) {
  // A hash that ignores the parent: block Z after [P, Q] and block Z after [P] collide.
  KvBlockManager m(config(16, 4, true, &parent_blind_hash));
  const Tokens p = iota_tokens(0, 4), q = iota_tokens(10, 4), z = iota_tokens(20, 4);
  run(m, 1, concat(concat(concat(p, q), z), {7}));
  m.free_sequence(1);
  const Tokens pz = concat(concat(p, z), {7});
  EXPECT_EQ(m.match_prefix(pz).num_blocks, 1);  // P only: Z's stored parent is Q
  EXPECT_EQ(run(m, 2, pz), 4);
  m.free_sequence(2);
  EXPECT_EQ(m.match_prefix(pz).num_blocks, 2);
  EXPECT_EQ(m.match_prefix(concat(concat(concat(p, q), z), {7})).num_blocks, 3);
}

TEST(KvBlockManager, DefaultHashIsChainedAndDeterministic) {
  const Tokens a = iota_tokens(0, 4);
  EXPECT_EQ(kv_block_hash(kKvRootHash, a), kv_block_hash(kKvRootHash, a));
  EXPECT_NE(kv_block_hash(kKvRootHash, a), kv_block_hash(kKvRootHash + 1, a));
  EXPECT_NE(kv_block_hash(kKvRootHash, a), kv_block_hash(kKvRootHash, iota_tokens(1, 4)));
  EXPECT_NE(kv_block_hash(kKvRootHash, Tokens{1, 2, 3}),
            kv_block_hash(kKvRootHash, Tokens{1, 2, 3, 0}));
}

// ---- Sharing, duplicates ----

TEST(KvBlockManager, SharesPrefixBetweenLiveSequences) {
  KvBlockManager m(config(16));
  const Tokens prompt = iota_tokens(0, 9);
  run(m, 1, prompt);  // [0, 1, 2], blocks 0 and 1 full
  const Tokens other = concat(iota_tokens(0, 8), iota_tokens(300, 5));
  EXPECT_EQ(run(m, 2, other), 8);
  const Tokens t2 = table(m, 2);
  ASSERT_EQ(t2.size(), 4u);
  EXPECT_EQ(t2[0], 0);
  EXPECT_EQ(t2[1], 1);
  EXPECT_EQ(t2[2], 3);  // the tails are private
  EXPECT_EQ(m.ref_count(0), 2);
  EXPECT_EQ(m.ref_count(1), 2);
  EXPECT_EQ(m.ref_count(2), 1);
  EXPECT_EQ(m.stats().num_used, 5);
  m.free_sequence(1);
  EXPECT_EQ(m.ref_count(0), 1);
  EXPECT_EQ(m.ref_count(2), 0);
  EXPECT_EQ(m.stats().num_used, 4);
  EXPECT_EQ(m.stats().num_cached, 0);  // shared blocks are still used, the tail went free
  m.free_sequence(2);
  EXPECT_EQ(m.stats().num_used, 0);
  EXPECT_EQ(m.stats().num_cached, 3);  // 0, 1 and sequence 2's full third block
  m.check_invariants();
}

TEST(KvBlockManager, DuplicateComputationKeepsOneEvictableCopy) {
  KvBlockManager m(config(16));
  const Tokens prompt = iota_tokens(0, 10);
  // Both start before either has committed: both compute the prompt.
  ASSERT_EQ(*m.add_sequence(1, prompt), 0);
  ASSERT_EQ(*m.add_sequence(2, prompt), 0);
  ASSERT_TRUE(m.reserve(1, 10));
  ASSERT_TRUE(m.reserve(2, 10));
  m.commit(1, prompt, 10);
  m.commit(2, prompt, 10);
  m.check_invariants();
  EXPECT_EQ(table(m, 1), (Tokens{0, 1, 2}));
  EXPECT_EQ(table(m, 2), (Tokens{3, 4, 5}));
  m.free_sequence(1);  // its full blocks have live twins: freed, not cached
  EXPECT_EQ(m.stats().num_cached, 0);
  EXPECT_EQ(m.stats().num_free, 13);
  m.free_sequence(2);
  EXPECT_EQ(m.stats().num_cached, 2);
  EXPECT_EQ(run(m, 3, prompt), 8);
  EXPECT_EQ(table(m, 3)[0], 3);
  m.check_invariants();
}

TEST(KvBlockManager, ChildOfOneCopyMatchesAfterTheOther) {
  KvBlockManager m(config(16));
  const Tokens p = iota_tokens(0, 8);
  const Tokens px = concat(p, iota_tokens(100, 4));
  ASSERT_EQ(*m.add_sequence(1, px), 0);
  ASSERT_EQ(*m.add_sequence(2, concat(p, {5})), 0);
  ASSERT_TRUE(m.reserve(1, 12));
  ASSERT_TRUE(m.reserve(2, 9));
  m.commit(1, px, 12);             // [0, 1, 2]
  m.commit(2, concat(p, {5}), 9);  // [3, 4, 5]
  m.free_sequence(1);  // 2 is cached (no twin); 0 and 1 are freed (twins 3 and 4 are live)
  m.free_sequence(2);
  m.check_invariants();
  // Block 2's parent is the content of block 1, which block 4 still holds.
  auto hit = m.add_sequence(3, concat(px, {1}));
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(*hit, 12);
  EXPECT_EQ(table(m, 3), (Tokens{3, 4, 2}));
}

// ---- Eviction ----

TEST(KvBlockManager, EvictsLeastRecentlyReleasedFirstAndTailsBeforeHeads) {
  KvBlockManager m(config(6));
  const Tokens a = iota_tokens(0, 8), b = iota_tokens(100, 8);
  run(m, 1, a);  // [0, 1]
  m.free_sequence(1);
  run(m, 2, b);  // [2, 3]
  m.free_sequence(2);
  EXPECT_EQ(m.num_free_blocks(), 6);
  // 3 blocks: the 2 free ones, then A's tail (the oldest release).
  ASSERT_EQ(*m.add_sequence(3, iota_tokens(200, 12)), 0);
  ASSERT_TRUE(m.reserve(3, 12));
  EXPECT_EQ(table(m, 3), (Tokens{4, 5, 1}));
  EXPECT_EQ(m.stats().evictions, 1u);
  EXPECT_EQ(m.match_prefix(concat(a, {0})).num_blocks, 1);  // A's head survived its tail
  EXPECT_EQ(m.match_prefix(concat(b, {0})).num_blocks, 2);
  ASSERT_TRUE(m.reserve(3, 16));
  EXPECT_EQ(table(m, 3)[3], 0);
  EXPECT_EQ(m.match_prefix(concat(a, {0})).num_blocks, 0);
  EXPECT_EQ(m.match_prefix(concat(b, {0})).num_blocks, 2);
  m.check_invariants();
}

TEST(KvBlockManager, ReuseRefreshesRecency) {
  KvBlockManager m(config(5));
  const Tokens a = iota_tokens(0, 8), b = iota_tokens(100, 8);
  run(m, 1, a);  // [0, 1]
  m.free_sequence(1);
  run(m, 2, b);  // [2, 3]
  m.free_sequence(2);
  EXPECT_EQ(run(m, 3, concat(a, {1})), 8);  // takes A's blocks off the LRU list...
  m.free_sequence(3);                       // ...and releases them after B's
  ASSERT_EQ(*m.add_sequence(4, iota_tokens(200, 12)), 0);
  ASSERT_TRUE(m.reserve(4, 12));
  EXPECT_EQ(table(m, 4), (Tokens{4, 3, 2}));  // the free block, then B's tail and head
  EXPECT_EQ(m.match_prefix(concat(b, {0})).num_blocks, 0);
  EXPECT_EQ(m.match_prefix(concat(a, {0})).num_blocks, 2);
  EXPECT_EQ(m.stats().evictions, 2u);
}

TEST(KvBlockManager, NeverEvictsReferencedBlocks) {
  KvBlockManager m(config(4));
  const Tokens a = iota_tokens(0, 8);
  run(m, 1, a);  // live: [0, 1]
  run(m, 2, iota_tokens(100, 8));
  m.free_sequence(2);  // cached: 3, 2
  ASSERT_EQ(*m.add_sequence(3, iota_tokens(300, 1)), 0);
  EXPECT_FALSE(m.reserve(3, 12));  // 3 blocks, only 2 evictable
  ASSERT_TRUE(m.reserve(3, 8));
  EXPECT_EQ(table(m, 3), (Tokens{3, 2}));
  EXPECT_EQ(table(m, 1), (Tokens{0, 1}));
  EXPECT_EQ(m.num_free_blocks(), 0);
  EXPECT_FALSE(m.reserve(3, 9));
  // A prefix held by a live sequence is still shared when nothing is free.
  auto hit = m.add_sequence(4, concat(a, {7}));
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(*hit, 8);
  EXPECT_EQ(m.ref_count(0), 2);
  EXPECT_FALSE(m.reserve(4, 9));
  m.check_invariants();
}

// ---- Failures ----

struct Snapshot {
  KvStats stats;
  std::map<int64_t, Tokens> tables;
  std::vector<int32_t> refs;
  std::vector<bool> cached;
  bool operator==(const Snapshot& o) const {
    const auto key = [](const KvStats& s) {
      return std::make_tuple(s.num_used, s.num_cached, s.num_free, s.num_sequences, s.usage_perc,
                             s.fragmentation_perc, s.prefix_queries, s.prefix_query_tokens,
                             s.prefix_hit_tokens, s.evictions);
    };
    return key(stats) == key(o.stats) && tables == o.tables && refs == o.refs && cached == o.cached;
  }
};

Snapshot snapshot(const KvBlockManager& m, std::initializer_list<int64_t> ids) {
  Snapshot s;
  s.stats = m.stats();
  for (int64_t id : ids) s.tables[id] = table(m, id);
  for (int32_t b = 0; b < m.num_blocks(); ++b) {
    s.refs.push_back(m.ref_count(b));
    s.cached.push_back(m.is_cached(b));
  }
  return s;
}

// A pool with used, cached and free blocks.
void mixed_state(KvBlockManager& m) {
  run(m, 1, iota_tokens(0, 9));
  run(m, 2, iota_tokens(100, 8));
  m.free_sequence(2);
  ASSERT_EQ(*m.add_sequence(3, iota_tokens(0, 6)), 4);
}

TEST(KvBlockManager, ReserveFailureLeavesStateUnchanged) {
  KvBlockManager m(config(8)), twin(config(8));
  mixed_state(m);
  mixed_state(twin);
  const Snapshot before = snapshot(m, {1, 3});
  EXPECT_EQ(m.num_blocks_needed(3, 4 + 4 * 7), 7);
  EXPECT_GT(m.num_blocks_needed(3, 4 + 4 * 7), m.num_free_blocks());
  EXPECT_FALSE(m.reserve(3, 4 + 4 * 7));
  EXPECT_TRUE(before == snapshot(m, {1, 3}));
  m.check_invariants();
  // Nothing hidden changed either (free-list and LRU order): the next allocations agree with a
  // twin that never saw the failure.
  ASSERT_TRUE(m.reserve(3, 20));
  ASSERT_TRUE(twin.reserve(3, 20));
  EXPECT_EQ(table(m, 3), table(twin, 3));
}

TEST(KvBlockManager, FreeListExhaustionReturnsFalse) {
  KvBlockManager m(config(4));
  EXPECT_TRUE(m.can_fit(16));
  EXPECT_FALSE(m.can_fit(17));
  ASSERT_EQ(*m.add_sequence(1, Tokens{1}), 0);
  ASSERT_TRUE(m.reserve(1, 16));
  EXPECT_TRUE(m.reserve(1, 16));  // already covered
  EXPECT_TRUE(m.reserve(1, 3));   // never shrinks
  EXPECT_EQ(table(m, 1).size(), 4u);
  ASSERT_EQ(*m.add_sequence(2, Tokens{1}), 0);
  EXPECT_FALSE(m.reserve(2, 1));
  EXPECT_EQ(m.num_free_blocks(), 0);
  m.free_sequence(1);  // nothing committed: all four go back to the free list
  EXPECT_EQ(m.stats().num_free, 4);
  EXPECT_TRUE(m.reserve(2, 1));
  m.check_invariants();
}

TEST(KvBlockManager, RejectsDuplicateAndEmptySequences) {
  KvBlockManager m(config(8));
  run(m, 1, iota_tokens(0, 9));
  const Snapshot before = snapshot(m, {1});
  auto dup = m.add_sequence(1, iota_tokens(0, 9));
  ASSERT_FALSE(dup.has_value());
  EXPECT_NE(dup.error().message.find("sequence 1 is already live"), std::string::npos);
  auto empty = m.add_sequence(2, Tokens{});
  ASSERT_FALSE(empty.has_value());
  EXPECT_NE(empty.error().message.find("no tokens"), std::string::npos);
  EXPECT_TRUE(before == snapshot(m, {1}));
  EXPECT_FALSE(m.has_sequence(2));
  EXPECT_FALSE(m.free_sequence(2));
  EXPECT_TRUE(m.block_table(2).empty());
  EXPECT_EQ(m.computed_length(2), -1);
}

TEST(KvBlockManager, BadConfigurationAndContractViolationsThrow) {
  EXPECT_THROW({ KvBlockManager bad(config(0)); }, InputError);
  EXPECT_THROW({ KvBlockManager bad(config(8, 0)); }, InputError);
  KvBlockManager m(config(8));
  EXPECT_THROW(m.reserve(5, 4), InternalError);  // not live
  ASSERT_EQ(*m.add_sequence(1, iota_tokens(0, 6)), 0);
  ASSERT_TRUE(m.reserve(1, 6));
  const Tokens t = iota_tokens(0, 6);
  EXPECT_THROW(m.commit(1, t, 9), InternalError);  // past the reservation
  m.commit(1, t, 5);
  EXPECT_THROW(m.commit(1, t, 4), InternalError);  // going back
  m.check_invariants();
}

// ---- Statistics, configuration ----

TEST(KvBlockManager, ReportsUsageFragmentationAndHitRate) {
  KvBlockManager m(config(10));
  const Tokens prompt = iota_tokens(0, 10);
  ASSERT_EQ(*m.add_sequence(1, prompt), 0);
  ASSERT_TRUE(m.reserve(1, 10));
  KvStats s = m.stats();
  EXPECT_EQ(s.num_used, 3);
  EXPECT_EQ(s.num_free, 7);
  EXPECT_DOUBLE_EQ(s.usage_perc, 0.3);
  EXPECT_DOUBLE_EQ(s.fragmentation_perc, 1.0);  // reserved, nothing computed yet
  m.commit(1, prompt, 10);
  s = m.stats();
  EXPECT_DOUBLE_EQ(s.fragmentation_perc, 2.0 / 12.0);
  EXPECT_EQ(s.num_sequences, 1);
  m.free_sequence(1);
  s = m.stats();
  EXPECT_EQ(s.num_used, 0);
  EXPECT_EQ(s.num_cached, 2);
  EXPECT_EQ(s.num_free, 8);
  EXPECT_DOUBLE_EQ(s.usage_perc, 0.0);
  EXPECT_DOUBLE_EQ(s.fragmentation_perc, 0.0);
  EXPECT_EQ(run(m, 2, prompt), 8);
  s = m.stats();
  EXPECT_EQ(s.prefix_queries, 2u);
  EXPECT_EQ(s.prefix_query_tokens, 20u);
  EXPECT_EQ(s.prefix_hit_tokens, 8u);
  EXPECT_DOUBLE_EQ(s.prefix_hit_rate(), 0.4);
  EXPECT_EQ(s.num_used + s.num_cached + s.num_free, s.num_blocks);
}

TEST(KvBlockManager, MatchPrefixPredictsAdmission) {
  KvBlockManager m(config(4));
  const Tokens a = iota_tokens(0, 8);
  run(m, 1, a);
  m.free_sequence(1);
  const Tokens want = concat(a, iota_tokens(50, 8));  // 4 blocks, 2 of them cached
  const KvPrefixMatch pm = m.match_prefix(want);
  EXPECT_EQ(pm.num_blocks, 2);
  EXPECT_EQ(pm.num_unreferenced_blocks, 2);
  EXPECT_EQ(m.num_free_blocks(), 4);  // unchanged by the query
  EXPECT_EQ(m.stats().prefix_queries, 1u);
  ASSERT_EQ(*m.add_sequence(2, want), 8);
  EXPECT_EQ(m.num_free_blocks(), 4 - pm.num_unreferenced_blocks);
  EXPECT_TRUE(m.reserve(2, 16));
}

TEST(KvBlockManager, PrefixCacheDisabled) {
  KvBlockManager m(config(8, 4, false));
  const Tokens prompt = iota_tokens(0, 9);
  EXPECT_EQ(run(m, 1, prompt), 0);
  EXPECT_FALSE(m.is_cached(0));
  m.free_sequence(1);
  EXPECT_EQ(m.stats().num_cached, 0);
  EXPECT_EQ(m.stats().num_free, 8);
  EXPECT_EQ(m.match_prefix(prompt).num_blocks, 0);
  EXPECT_EQ(run(m, 2, prompt), 0);
  EXPECT_EQ(m.stats().prefix_queries, 0u);
  EXPECT_EQ(m.stats().evictions, 0u);
}

TEST(KvBlockManager, SameOperationsGiveSameBlockIds) {
  const auto script = [](KvBlockManager& m) {
    std::vector<Tokens> out;
    run(m, 7, iota_tokens(0, 13));
    run(m, 8, iota_tokens(0, 9));
    m.free_sequence(7);
    run(m, 9, iota_tokens(40, 21));
    run(m, 10, concat(iota_tokens(0, 12), {3, 3}));
    for (int64_t id : {8, 9, 10}) out.push_back(table(m, id));
    return out;
  };
  KvBlockManager a(config(12)), b(config(12));
  const auto ta = script(a);
  EXPECT_EQ(ta, script(b));
  EXPECT_EQ(ta[0], (Tokens{0, 1, 4}));
}

// ---- Randomized run against a reference model ----

uint64_t splitmix(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Drives a manager with random operations and checks it against a model of what KV every block
// holds: content_[b] is the token prefix whose KV block b's written slots encode. Any hit must
// hand out blocks whose content is exactly the new sequence's prefix.
class Stress {
 public:
  explicit Stress(const KvBlockManagerConfig& cfg, uint64_t seed)
      : m_(cfg), bs_(cfg.block_size), content_(static_cast<size_t>(cfg.num_blocks)), rng_(seed) {
    for (int f = 0; f < 4; ++f) families_.push_back(random_tokens(2 + uniform(5 * bs_)));
  }

  // Runs n random operations; returns a digest of every block id handed out.
  uint64_t run(int n) {
    for (int i = 0; i < n; ++i) {
      const int64_t op = uniform(100);
      if (op < 22 || seqs_.empty())
        add();
      else if (op < 50)
        reserve();
      else if (op < 75)
        commit();
      else if (op < 85)
        generate();
      else
        free();
      if (::testing::Test::HasFatalFailure()) return digest_;
      m_.check_invariants();
      check_tables();
      if (::testing::Test::HasFatalFailure()) return digest_;
    }
    return digest_;
  }
  const KvBlockManager& manager() const { return m_; }

 private:
  struct Seq {
    Tokens tokens;
    Tokens table;
    int64_t computed = 0;
  };

  int64_t uniform(int64_t n) {
    return static_cast<int64_t>(splitmix(rng_) % static_cast<uint64_t>(n));
  }
  Tokens random_tokens(int64_t n) {
    Tokens t;
    for (int64_t i = 0; i < n; ++i) t.push_back(static_cast<int32_t>(uniform(3)));  // tiny vocab
    return t;
  }
  Seq* pick() {
    auto it = seqs_.begin();
    std::advance(it, uniform(static_cast<int64_t>(seqs_.size())));
    return &it->second;
  }
  int64_t pick_id() {
    auto it = seqs_.begin();
    std::advance(it, uniform(static_cast<int64_t>(seqs_.size())));
    return it->first;
  }
  void mix(int64_t v) { digest_ = (digest_ ^ static_cast<uint64_t>(v)) * 0x100000001b3ULL; }
  int64_t blocks_in_live_tables() const {
    std::set<int32_t> s;
    for (const auto& [id, q] : seqs_) s.insert(q.table.begin(), q.table.end());
    return static_cast<int64_t>(s.size());
  }

  void add() {
    if (seqs_.size() >= 10) return free();
    const Tokens& f = families_[static_cast<size_t>(uniform(4))];
    Tokens t(f.begin(), f.begin() + uniform(static_cast<int64_t>(f.size()) + 1));
    const Tokens tail = random_tokens(1 + uniform(2 * bs_));
    t.insert(t.end(), tail.begin(), tail.end());
    const KvPrefixMatch pm = m_.match_prefix(t);
    const int64_t free_before = m_.num_free_blocks();
    // Every full block a live sequence has committed is findable (live blocks are never evicted).
    int64_t lower = 0;
    for (const auto& [id, q] : seqs_) {
      int64_t k = 0;
      while ((k + 1) * bs_ <= q.computed && (k + 1) * bs_ <= static_cast<int64_t>(t.size()) - 1 &&
             std::equal(t.begin(), t.begin() + (k + 1) * bs_, q.tokens.begin()))
        ++k;
      lower = std::max(lower, k);
    }
    const int64_t id = next_id_++;
    auto hit = m_.add_sequence(id, t);
    ASSERT_TRUE(hit.has_value());
    mix(*hit);
    ASSERT_EQ(*hit, pm.num_computed_tokens);
    ASSERT_EQ(*hit % bs_, 0);
    ASSERT_LE(*hit, static_cast<int64_t>(t.size()) - 1);
    if (m_.config().enable_prefix_cache) {
      ASSERT_GE(*hit / bs_, lower);
    } else {
      ASSERT_EQ(*hit, 0);
    }
    ASSERT_EQ(m_.num_free_blocks(), free_before - pm.num_unreferenced_blocks);
    Seq q{t, table(m_, id), *hit};
    ASSERT_EQ(static_cast<int64_t>(q.table.size()) * bs_, *hit);
    for (size_t i = 0; i < q.table.size(); ++i) {
      const Tokens want(t.begin(), t.begin() + static_cast<int64_t>(i + 1) * bs_);
      ASSERT_EQ(content_[q.table[i]], want) << "block " << q.table[i] << " holds another prefix";
    }
    seqs_.emplace(id, std::move(q));
    if (uniform(10) == 0) {
      ASSERT_FALSE(m_.add_sequence(id, t).has_value());
    }
  }

  void reserve() {
    const int64_t id = pick_id();
    Seq& q = seqs_[id];
    const int64_t target = std::min<int64_t>(q.computed + 1 + uniform(3 * bs_),
                                             static_cast<int64_t>(q.tokens.size()) + bs_);
    const int64_t needed = m_.num_blocks_needed(id, target);
    const int64_t unreferenced = m_.num_blocks() - blocks_in_live_tables();
    const KvStats before = m_.stats();
    const bool ok = m_.reserve(id, target);
    mix(ok);
    ASSERT_EQ(ok, needed <= unreferenced);
    const Tokens now = table(m_, id);
    if (!ok) {
      ASSERT_EQ(now, q.table);
      ASSERT_EQ(m_.stats().num_free, before.num_free);
      ASSERT_EQ(m_.stats().num_cached, before.num_cached);
      return;
    }
    ASSERT_EQ(static_cast<int64_t>(now.size()), static_cast<int64_t>(q.table.size()) + needed);
    ASSERT_TRUE(std::equal(q.table.begin(), q.table.end(), now.begin()));
    for (size_t i = q.table.size(); i < now.size(); ++i) {
      ASSERT_EQ(m_.ref_count(now[i]), 1) << "handed out a referenced block";
      content_[now[i]].clear();  // evicted or free: its old KV is gone
      mix(now[i]);
    }
    q.table = now;
  }

  void commit() {
    const int64_t id = pick_id();
    Seq& q = seqs_[id];
    const int64_t limit = std::min<int64_t>(static_cast<int64_t>(q.table.size()) * bs_,
                                            static_cast<int64_t>(q.tokens.size()));
    if (limit <= q.computed) return;
    const int64_t to = q.computed + 1 + uniform(limit - q.computed);
    for (int64_t i = q.computed / bs_; i * bs_ < to; ++i) {
      const int32_t b = q.table[static_cast<size_t>(i)];
      ASSERT_EQ(m_.ref_count(b), 1) << "would write into shared block " << b;
      content_[b].assign(q.tokens.begin(), q.tokens.begin() + std::min((i + 1) * bs_, to));
    }
    m_.commit(id, q.tokens, to);
    q.computed = to;
  }

  void generate() {  // a decode step sampled one more token
    Seq* q = pick();
    q->tokens.push_back(static_cast<int32_t>(uniform(3)));
  }

  void free() {
    if (uniform(20) == 0) {
      ASSERT_FALSE(m_.free_sequence(1'000'000));
    }
    const int64_t id = pick_id();
    ASSERT_TRUE(m_.free_sequence(id));
    seqs_.erase(id);
  }

  void check_tables() {
    const KvStats s = m_.stats();
    ASSERT_EQ(s.num_used, blocks_in_live_tables());
    ASSERT_EQ(s.num_used + s.num_cached + s.num_free, s.num_blocks);
    ASSERT_EQ(s.num_sequences, static_cast<int64_t>(seqs_.size()));
    for (const auto& [id, q] : seqs_) {
      ASSERT_EQ(table(m_, id), q.table);
      ASSERT_EQ(m_.computed_length(id), q.computed);
    }
  }

  KvBlockManager m_;
  int64_t bs_;
  std::vector<Tokens> content_;
  std::vector<Tokens> families_;
  std::map<int64_t, Seq> seqs_;
  uint64_t rng_;
  int64_t next_id_ = 0;
  uint64_t digest_ = 0xcbf29ce484222325ULL;
};

TEST(KvBlockManager, RandomOperationsMatchReferenceModel) {
  struct Case {
    const char* name;
    KvBlockManagerConfig cfg;
  };
  const Case cases[] = {
      {"default", config(40, 4)},
      {"tiny pool", config(10, 4)},
      {"block size 1", config(32, 1)},
      {"block size 3, constant hash", config(24, 3, true, &constant_hash)},
      {"parent-blind hash", config(32, 2, true, &parent_blind_hash)},
      {"coarse hash", config(24, 4, true, &coarse_hash)},
      {"cache off", config(24, 4, false)},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    for (uint64_t seed : {1, 2, 3}) {
      Stress s(c.cfg, seed);
      const uint64_t digest = s.run(4000);
      if (::testing::Test::HasFatalFailure()) return;
      const KvStats st = s.manager().stats();
      if (c.cfg.enable_prefix_cache && c.cfg.num_blocks >= 24) {
        EXPECT_GT(st.prefix_hit_tokens, 0u);
      }
      // Determinism: a second run from the same seed hands out the same blocks.
      EXPECT_EQ(Stress(c.cfg, seed).run(4000), digest);
    }
  }
}

}  // namespace
}  // namespace troupe::compute
