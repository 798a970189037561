// KvPools: one pool behaves as a KvBlockManager (same ids); several keep every sequence's blocks
// inside one pool's global id range, spread new sequences over the pools, follow a cached prefix
// to its pool, refuse a split that does not divide, and sum their stats.
#include "compute/kv_pools.h"

#include <numeric>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "base/check.h"
#include "compute/kv_block_manager.h"

namespace troupe::compute {
namespace {

KvBlockManagerConfig config(int64_t blocks) {
  KvBlockManagerConfig c;
  c.num_blocks = blocks;
  c.block_size = 4;
  return c;
}

std::vector<int32_t> tokens(int n, int32_t first) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

TEST(KvPools, OnePoolIsTheBlockManager) {
  KvPools pools(config(16), 1);
  KvBlockManager plain(config(16));
  for (int64_t s = 0; s < 3; ++s) {
    const auto t = tokens(9, static_cast<int32_t>(100 * s));
    ASSERT_TRUE(pools.add_sequence(s, t).has_value());
    ASSERT_TRUE(plain.add_sequence(s, t).has_value());
    ASSERT_TRUE(pools.reserve(s, 9));
    ASSERT_TRUE(plain.reserve(s, 9));
    const auto a = pools.block_table(s);
    const auto b = plain.block_table(s);
    EXPECT_EQ(std::vector<int32_t>(a.begin(), a.end()), std::vector<int32_t>(b.begin(), b.end()));
  }
  EXPECT_EQ(pools.stats().num_used, plain.stats().num_used);
}

TEST(KvPools, EverySequenceStaysInsideOnePoolsRange) {
  KvPools pools(config(24), 3);  // 8 blocks per pool: ids [0, 8), [8, 16), [16, 24)
  EXPECT_EQ(pools.blocks_per_pool(), 8);
  std::set<int64_t> used_pools;
  for (int64_t s = 0; s < 6; ++s) {
    const auto t = tokens(5, static_cast<int32_t>(1000 * s));
    ASSERT_TRUE(pools.add_sequence(s, t).has_value());
    ASSERT_TRUE(pools.reserve(s, 9));  // 3 blocks
    const int64_t p = pools.pool_of(s);
    used_pools.insert(p);
    for (int32_t b : pools.block_table(s)) {
      EXPECT_GE(b, p * 8) << "sequence " << s;
      EXPECT_LT(b, (p + 1) * 8) << "sequence " << s;
    }
  }
  EXPECT_EQ(used_pools.size(), 3u) << "new sequences are spread over the pools";
  // Pool of sequence 0 is full after two sequences of 3 blocks and one more block: growing
  // a sequence there past its pool fails even though other pools have room.
  const int64_t p0 = pools.pool_of(0);
  int64_t other = -1;
  for (int64_t s = 1; s < 6; ++s)
    if (pools.pool_of(s) == p0) other = s;
  ASSERT_GE(other, 0);
  EXPECT_TRUE(pools.reserve(0, 13));      // 4th block: 7 of 8 used in that pool
  EXPECT_TRUE(pools.reserve(0, 16));      // still the 4th
  EXPECT_TRUE(pools.reserve(other, 13));  // 8 of 8
  EXPECT_FALSE(pools.reserve(0, 17)) << "a pool's sequence cannot borrow another pool's blocks";
  pools.check_invariants();
  const KvStats st = pools.stats();
  EXPECT_EQ(st.num_blocks, 24);
  EXPECT_EQ(st.num_used + st.num_cached + st.num_free, 24);
  EXPECT_EQ(st.num_sequences, 6);
  EXPECT_TRUE(pools.free_sequence(0));
  EXPECT_FALSE(pools.free_sequence(0));
  EXPECT_EQ(pools.pool_of(0), -1);
  EXPECT_TRUE(pools.block_table(0).empty());
}

TEST(KvPools, ACachedPrefixBringsTheSequenceToItsPool) {
  KvPools pools(config(16), 2);
  const auto prompt = tokens(9, 7);
  ASSERT_TRUE(pools.add_sequence(1, prompt).has_value());
  ASSERT_TRUE(pools.reserve(1, 9));
  pools.commit(1, prompt, 9);
  const int64_t home = pools.pool_of(1);
  // Fill the other pool less than this one would be: the prefix still decides.
  auto again = pools.add_sequence(2, prompt);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(*again, 8) << "two full blocks found in the cache";
  EXPECT_EQ(pools.pool_of(2), home);
  pools.check_invariants();
}

TEST(KvPools, AFullPoolDoesNotPullASequenceByItsPrefix) {
  KvPools pools(config(8), 2);  // 4 blocks per pool
  const auto prompt = tokens(9, 7);
  ASSERT_TRUE(pools.add_sequence(1, prompt).has_value());
  ASSERT_TRUE(pools.reserve(1, 16));  // all 4 blocks of its pool
  pools.commit(1, prompt, 9);
  auto r = pools.add_sequence(2, prompt);
  ASSERT_TRUE(r.has_value());
  EXPECT_NE(pools.pool_of(2), pools.pool_of(1)) << "its prefix's pool has no room for it";
  EXPECT_TRUE(pools.reserve(2, 9));
  pools.check_invariants();
}

TEST(KvPools, RefusesASplitThatDoesNotDivide) {
  try {
    KvPools pools(config(10), 3);
    ADD_FAILURE() << "10 blocks split into 3 pools";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("10 blocks do not split into 3 equal pools"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(KvPools(config(10), 0), InputError);
}

TEST(KvPools, ALiveSequenceCannotBeAddedTwice) {
  KvPools pools(config(8), 2);
  ASSERT_TRUE(pools.add_sequence(5, tokens(3, 0)).has_value());
  const auto r = pools.add_sequence(5, tokens(3, 0));
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message.find("already live"), std::string::npos) << r.error().message;
}

}  // namespace
}  // namespace troupe::compute
