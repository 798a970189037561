// Tests of compute/kv_cache.h: the pool reads as zeros before anything is written, rows of
// different layers, blocks and slots do not overlap, and a pool larger than the memory
// available is refused at start with a message that names the sizes and the settings to lower.
#include "compute/kv_cache.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/check.h"
#include "model/ggml_types.h"
#include "model/model.h"

namespace troupe::compute {
namespace {

KvCacheConfig config(int64_t n_layer, int64_t k_width, int64_t v_width, int64_t block_size,
                     int64_t num_blocks) {
  KvCacheConfig c;
  c.n_layer = n_layer;
  c.k_width = k_width;
  c.v_width = v_width;
  c.block_size = block_size;
  c.num_blocks = num_blocks;
  return c;
}

// f16 and bf16 pools: half the bytes of f32's; store() rounds each value (to nearest even) into
// its own row and place only, and load() reads back exactly the rounded values.
// Keys in rows or by dimension alike.
TEST(KvCache, HalfPrecisionPoolsHoldRoundedValuesInHalfTheBytes) {
  for (const auto& [type, by_dim] :
       {std::pair{KvType::kF16, false}, std::pair{KvType::kBF16, false},
        std::pair{KvType::kF16, true}, std::pair{KvType::kBF16, true}}) {
    SCOPED_TRACE(std::string(kv_type_name(type)) + (by_dim ? " by dimension" : " in rows"));
    KvCacheConfig c = config(2, 6, 3, 4, 3);
    c.type = type;
    c.k_by_dim = by_dim;
    KvCache kv(c);
    EXPECT_EQ(kv.bytes(), uint64_t{2 * 3 * 4 * 9 * 2});
    auto value = [](int64_t l, int64_t b, int64_t s, int64_t i) {
      return 1.0f + 0.001f * static_cast<float>(((l * 3 + b) * 4 + s) * 9 + i) + 1e-7f;
    };
    for (int64_t l = 0; l < 2; ++l)
      for (int32_t b = 0; b < 3; ++b)
        for (int64_t s = 0; s < 4; ++s) {
          float row[9];
          for (int64_t i = 0; i < 9; ++i) row[i] = value(l, b, s, i);
          kv.store(l, b, s, 0, row, 6);      // K
          kv.store(l, b, s, 6, row + 6, 3);  // V
        }
    for (int64_t l = 0; l < 2; ++l)
      for (int32_t b = 0; b < 3; ++b)
        for (int64_t s = 0; s < 4; ++s) {
          float got[9];
          kv.load(l, b, s, 0, 9, got);
          for (int64_t i = 0; i < 9; ++i) {
            const float v = value(l, b, s, i);
            const float want = type == KvType::kF16 ? model::fp16_to_fp32(model::fp32_to_fp16(v))
                                                    : model::bf16_to_fp32(model::fp32_to_bf16(v));
            ASSERT_EQ(got[i], want) << l << " " << b << " " << s << " " << i;
            ASSERT_NE(got[i], v);  // these values need rounding in either format
          }
        }
  }
  EXPECT_EQ(parse_kv_type("f16"), KvType::kF16);
  EXPECT_EQ(parse_kv_type("bf16"), KvType::kBF16);
  EXPECT_EQ(parse_kv_type("f32"), KvType::kF32);
  EXPECT_FALSE(parse_kv_type("fp16").has_value());
  EXPECT_FALSE(parse_kv_type("").has_value());
}

// With keys in rows, and by dimension (KvCacheConfig::k_by_dim: a head's K value d of slot s at
// k_offset(h) + d * block_size + s; the V rows as with keys in rows).
TEST(KvCache, FreshPoolReadsZeroAndRowsDoNotOverlap) {
  for (const bool by_dim : {false, true}) {
    SCOPED_TRACE(by_dim ? "keys by dimension" : "keys in rows");
    KvCacheConfig c = config(3, 8, 4, 5, 5);  // blocks of 5 slots: not the K head width (4)
    c.heads = 2;                              // K: 2 x 4 values per slot, V: 2 x 2
    c.k_by_dim = by_dim;
    KvCache kv(c);
    EXPECT_EQ(kv.bytes(), uint64_t{3 * 5 * 5 * 12 * sizeof(float)});
    // Every value reads 0 before any write (attention may read a block's unwritten slots as
    // padding; the old pool was zero-filled and the mapped one must read the same).
    std::vector<float> got(12);
    for (int64_t l = 0; l < 3; ++l)
      for (int32_t b = 0; b < 5; ++b)
        for (int64_t s = 0; s < 5; ++s) {
          kv.load(l, b, s, 0, 12, got.data());
          for (float v : got) ASSERT_EQ(v, 0.f);
        }
    // Write a distinct value everywhere, K and V of a slot in one store or in pieces that cross
    // the heads, then read every one back, through load() and where the layout puts it.
    auto value = [](int64_t l, int64_t b, int64_t s, int64_t i) {
      return static_cast<float>(((l * 5 + b) * 5 + s) * 12 + i + 1);
    };
    for (int64_t l = 0; l < 3; ++l)
      for (int32_t b = 0; b < 5; ++b)
        for (int64_t s = 0; s < 5; ++s) {
          float row[12];
          for (int64_t i = 0; i < 12; ++i) row[i] = value(l, b, s, i);
          if (s % 2 == 0) {
            kv.store(l, b, s, 0, row, 12);
          } else {
            kv.store(l, b, s, 0, row, 3);
            kv.store(l, b, s, 3, row + 3, 6);  // K head 0's last value, head 1, V head 0's first
            kv.store(l, b, s, 9, row + 9, 3);
          }
        }
    for (int64_t l = 0; l < 3; ++l)
      for (int32_t b = 0; b < 5; ++b) {
        const auto* blk = reinterpret_cast<const float*>(kv.block(l, b));
        for (int64_t s = 0; s < 5; ++s) {
          kv.load(l, b, s, 0, 12, got.data());
          for (int64_t i = 0; i < 12; ++i) ASSERT_EQ(got[i], value(l, b, s, i));
          for (int64_t h = 0; h < 2; ++h) {
            for (int64_t d = 0; d < 4; ++d)  // K of head h: its 4 slots' rows in a run
              ASSERT_EQ(blk[kv.k_offset(h) + (by_dim ? d * 5 + s : s * kv.k_stride() + d)],
                        value(l, b, s, 4 * h + d));
            for (int64_t d = 0; d < 2; ++d)
              ASSERT_EQ(blk[kv.v_offset(h) + s * kv.v_stride() + d], value(l, b, s, 8 + 2 * h + d));
          }
        }
      }
    EXPECT_EQ(kv.k_offset(1), 5 * 4);
    EXPECT_EQ(kv.v_offset(0), 5 * 8);
    EXPECT_EQ(kv.v_offset(1), 5 * 8 + 5 * 2);
  }
  // Widths that do not split into the heads are refused.
  KvCacheConfig bad = config(1, 6, 4, 4, 1);
  bad.heads = 4;
  EXPECT_THROW(KvCache{bad}, InputError);
}

TEST(KvCache, PoolLargerThanTheMemoryAvailableIsRefusedAtStart) {
  const uint64_t available = model::available_memory_bytes();
  if (available == 0) GTEST_SKIP() << "this machine does not say how much memory is available";
  // Blocks of 64 layers x 16 tokens x 8 KiB = 8 MiB each: twice the memory available.
  const KvCacheConfig c =
      config(64, 1024, 1024, 16, static_cast<int64_t>(2 * available / (uint64_t{8} << 20)) + 1);
  try {
    KvCache kv(c);
    FAIL() << "a pool of " << c.num_blocks << " blocks was accepted";
  } catch (const InputError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("KV cache: a pool of " + std::to_string(c.num_blocks) +
                     " blocks of 16 tokens over 64 layers needs"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("GiB of memory available"), std::string::npos) << m;
    EXPECT_NE(m.find("lower kv_blocks"), std::string::npos) << m;
  }
}

TEST(KvCache, PoolOfTheDefaultPlanStartsWithoutTouchingItsMemory) {
  // The default plan's pool for a 1.1B model (131072 tokens x 22 layers x 512 floats, 5.9 GB)
  // where the machine has room for it: reserving must not commit it. Resident memory of the
  // process grows by far less than the pool.
  const uint64_t bytes = uint64_t{131072} * 22 * 512 * sizeof(float);
  if (model::available_memory_bytes() < bytes + (uint64_t{1} << 30))
    GTEST_SKIP() << "less than 7 GB of memory available";
  auto resident = [] {
    long pages = 0, rss = 0;
    if (std::FILE* f = std::fopen("/proc/self/statm", "r")) {
      if (std::fscanf(f, "%ld %ld", &pages, &rss) != 2) rss = 0;
      std::fclose(f);
    }
    return static_cast<uint64_t>(rss) * 4096;
  };
  const uint64_t before = resident();
  KvCache kv(config(22, 256, 256, 16, 8192));
  EXPECT_EQ(kv.bytes(), bytes);
  const float one = 1.f;
  kv.store(21, 8191, 15, 511, &one, 1);  // the last float is there
  float back = 0;
  kv.load(21, 8191, 15, 511, 1, &back);
  EXPECT_EQ(back, 1.f);
  EXPECT_LT(resident() - before, uint64_t{64} << 20);
}

}  // namespace
}  // namespace troupe::compute
