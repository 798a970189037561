// The transport's payload checksum and receive-buffer pool, alone: a checksum over parts of any
// size equals the contiguous one; every single flipped byte and every swap of two different
// bytes changes it; pooled buffers come back for the next message of their size class, and a
// new size class makes room by evicting old ones.
#include "transport/detail/checksum.h"

#include <random>

#include <gtest/gtest.h>

#include "transport/detail/buffer_pool.h"

namespace troupe::transport::detail {
namespace {

std::vector<uint8_t> random_bytes_of(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

TEST(Checksum, PartsOfAnySizeGiveTheContiguousSum) {
  const auto data = random_bytes_of(1000, 1);
  const uint64_t whole = checksum(data);
  std::mt19937 rng(2);
  for (int trial = 0; trial < 200; ++trial) {
    Checksum c;
    size_t at = 0;
    while (at < data.size()) {
      const size_t n = std::min<size_t>(data.size() - at, rng() % 70);
      c.update({data.data() + at, n});
      at += n;
    }
    EXPECT_EQ(c.final(), whole) << "trial " << trial;
  }
}

TEST(Checksum, EveryFlipAndSwapChangesIt) {
  auto data = random_bytes_of(257, 3);
  const uint64_t sum = checksum(data);
  for (size_t i = 0; i < data.size(); ++i)
    for (uint8_t bit = 1; bit != 0; bit = static_cast<uint8_t>(bit << 1)) {
      data[i] ^= bit;
      EXPECT_NE(checksum(data), sum) << "byte " << i << " bit " << int(bit);
      data[i] ^= bit;
    }
  for (size_t i = 0; i + 8 < data.size(); i += 7) {
    if (data[i] == data[i + 8]) continue;
    std::swap(data[i], data[i + 8]);  // same lane offset, different word: order matters
    EXPECT_NE(checksum(data), sum) << "swap " << i;
    std::swap(data[i], data[i + 8]);
  }
  // Length matters: trailing zero bytes are not invisible.
  auto longer = data;
  longer.push_back(0);
  EXPECT_NE(checksum(longer), sum);
  EXPECT_NE(checksum({}), checksum(std::vector<uint8_t>(1, 0)));
}

TEST(BufferPool, ReusesBuffersOfASizeClass) {
  auto pool = std::make_shared<BufferPool>();
  const uint64_t* first = nullptr;
  {
    auto a = pool->get(100000);  // 128 KiB class
    first = a.get();
    reinterpret_cast<uint8_t*>(a.get())[99999] = 7;
  }
  auto b = pool->get(120000);  // same class: the same memory comes back
  EXPECT_EQ(b.get(), first);
  auto c = pool->get(120000);  // the class is empty now: fresh memory
  EXPECT_NE(c.get(), first);
  auto small = pool->get(100);  // below the pooled sizes: plain allocation
  EXPECT_NE(small.get(), nullptr);
  b.reset();
  pool.reset();  // buffers outliving the pool are freed, not returned
  c.reset();
}

TEST(BufferPool, ANewSizeClassEvictsOldOnesWhenFull) {
  auto pool = std::make_shared<BufferPool>();
  constexpr size_t kSmall = size_t{1} << 20, kLarge = size_t{64} << 20;
  {
    std::vector<std::shared_ptr<uint64_t[]>> held;
    for (size_t i = 0; i < BufferPool::kMaxHeld / kSmall; ++i) held.push_back(pool->get(kSmall));
  }
  EXPECT_EQ(pool->held_bytes(), BufferPool::kMaxHeld);  // full of 1 MiB buffers
  const uint64_t* large = nullptr;
  {
    auto a = pool->get(kLarge);
    large = a.get();
  }
  // The 64 MiB buffer stayed (64 of the 1 MiB ones went) and comes back for the next message.
  EXPECT_EQ(pool->held_bytes(), BufferPool::kMaxHeld);
  auto b = pool->get(kLarge);
  EXPECT_EQ(b.get(), large);
  EXPECT_EQ(pool->held_bytes(), BufferPool::kMaxHeld - kLarge);
}

}  // namespace
}  // namespace troupe::transport::detail
