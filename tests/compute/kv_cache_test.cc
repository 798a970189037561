// Tests of compute/kv_cache.h: the pool reads as zeros before anything is written, rows of
// different layers, blocks and slots do not overlap, and a pool larger than the memory
// available is refused at start with a message that names the sizes and the settings to lower.
#include "compute/kv_cache.h"

#include <string>

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
TEST(KvCache, HalfPrecisionPoolsHoldRoundedValuesInHalfTheBytes) {
  for (const KvType type : {KvType::kF16, KvType::kBF16}) {
    SCOPED_TRACE(std::string(kv_type_name(type)));
    KvCacheConfig c = config(2, 6, 3, 4, 3);
    c.type = type;
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

TEST(KvCache, FreshPoolReadsZeroAndRowsDoNotOverlap) {
  KvCache kv(config(3, 8, 4, 4, 5));
  EXPECT_EQ(kv.bytes(), uint64_t{3 * 5 * 4 * 12 * sizeof(float)});
  EXPECT_EQ(kv.row_stride(), 12);
  // Every float reads 0 before any write (attention may read a block's unwritten slots as
  // padding; the old pool was zero-filled and the mapped one must read the same).
  for (int64_t l = 0; l < 3; ++l)
    for (int32_t b = 0; b < 5; ++b)
      for (int64_t s = 0; s < 4; ++s)
        for (int64_t i = 0; i < 12; ++i) ASSERT_EQ(kv.k(l, b, s)[i], 0.f);
  // Write a distinct value everywhere through k() and v(), then read every one back.
  auto value = [](int64_t l, int64_t b, int64_t s, int64_t i) {
    return static_cast<float>(((l * 5 + b) * 4 + s) * 12 + i + 1);
  };
  for (int64_t l = 0; l < 3; ++l)
    for (int32_t b = 0; b < 5; ++b)
      for (int64_t s = 0; s < 4; ++s) {
        for (int64_t i = 0; i < 8; ++i) kv.k(l, b, s)[i] = value(l, b, s, i);
        for (int64_t i = 0; i < 4; ++i) kv.v(l, b, s)[i] = value(l, b, s, 8 + i);
      }
  for (int64_t l = 0; l < 3; ++l)
    for (int32_t b = 0; b < 5; ++b)
      for (int64_t s = 0; s < 4; ++s)
        for (int64_t i = 0; i < 12; ++i) ASSERT_EQ(kv.k(l, b, s)[i], value(l, b, s, i));
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
  kv.k(21, 8191, 15)[511] = 1.f;  // the last float is there
  EXPECT_LT(resident() - before, uint64_t{64} << 20);
}

}  // namespace
}  // namespace troupe::compute
