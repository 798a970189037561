// The attention kernel (compute/vec_ops.h) against a double-precision reference, on K/V rows
// laid out in blocks as the paged cache holds them; and the SwiGLU activation (silu_mul).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "compute/kv_cache.h"
#include "compute/vec_ops.h"
#include "model/ggml_types.h"

namespace troupe::compute {
namespace {

// n positions in blocks of bs rows, each row [K (dk) | V (dv) | 3 floats of padding], with the
// blocks scattered over the pool in reverse order.
struct Paged {
  std::vector<float> pool;
  std::vector<const void*> blocks;
  KvView view;
};

Paged make_paged(int64_t n, int64_t bs, int64_t dk, int64_t dv, std::mt19937& rng, float spread) {
  Paged p;
  std::normal_distribution<float> nd(0.f, spread);
  const int64_t stride = dk + dv + 3, nb = (n + bs - 1) / bs;
  p.pool.resize(static_cast<size_t>(nb * bs * stride));
  for (auto& v : p.pool) v = nd(rng);
  for (int64_t b = 0; b < nb; ++b)
    p.blocks.push_back(&p.pool[static_cast<size_t>((nb - 1 - b) * bs * stride)]);
  p.view.blocks = p.blocks.data();
  p.view.block_size = bs;
  p.view.k_offset = 0;
  p.view.k_stride = stride;
  p.view.v_offset = dk;
  p.view.v_stride = stride;
  return p;
}

// Position j's key and value in an f32 view.
const float* key(const KvView& kv, int64_t j) {
  return static_cast<const float*>(kv.blocks[j / kv.block_size]) + kv.k_offset +
         (j % kv.block_size) * kv.k_stride;
}
const float* value(const KvView& kv, int64_t j) {
  return static_cast<const float*>(kv.blocks[j / kv.block_size]) + kv.v_offset +
         (j % kv.block_size) * kv.v_stride;
}

std::vector<double> reference(const float* q, int64_t dk, const KvView& kv, int64_t n, float scale,
                              int64_t dv) {
  std::vector<double> s(static_cast<size_t>(n)), out(static_cast<size_t>(dv), 0.0);
  double mx = -INFINITY, sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    double d = 0;
    for (int64_t i = 0; i < dk; ++i) d += double{q[i]} * key(kv, j)[i];
    s[static_cast<size_t>(j)] = d * scale;
    mx = std::max(mx, d * scale);
  }
  for (auto& v : s) sum += (v = std::exp(v - mx));
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < dv; ++i)
      out[static_cast<size_t>(i)] += s[static_cast<size_t>(j)] / sum * value(kv, j)[i];
  return out;
}

struct Shape {
  int64_t g, dk, dv, n, bs;
};

TEST(Attention, MatchesReferenceAndEachHeadIsIndependentOfItsGroup) {
  std::mt19937 rng(5);
  // Widths that are and are not multiples of 8 and 16; one position; several blocks; long.
  const Shape shapes[] = {{8, 64, 64, 1, 16},    {8, 64, 64, 37, 16},   {4, 128, 128, 300, 16},
                          {2, 40, 24, 17, 4},    {1, 7, 5, 3, 2},       {3, 72, 64, 1000, 32},
                          {8, 576, 512, 20, 16}, {33, 576, 512, 40, 16}};  // MLA-wide
  for (const Shape& sh : shapes) {
    for (const float spread : {0.3f, 3.0f}) {  // flat and peaked softmax
      SCOPED_TRACE(::testing::Message() << "g=" << sh.g << " dk=" << sh.dk << " dv=" << sh.dv
                                        << " n=" << sh.n << " spread=" << spread);
      Paged p = make_paged(sh.n, sh.bs, sh.dk, sh.dv, rng, spread);
      std::normal_distribution<float> nd(0.f, spread);
      const int64_t q_stride = sh.dk + 1, out_stride = sh.dv + 2;
      std::vector<float> q(static_cast<size_t>(sh.g * q_stride));
      for (auto& v : q) v = nd(rng);
      const float scale = 1.0f / std::sqrt(static_cast<float>(sh.dk));
      std::vector<float> out(static_cast<size_t>(sh.g * out_stride), -99.f);
      attend_heads(q.data(), q_stride, sh.g, sh.dk, p.view, sh.n, scale, sh.dv, out.data(),
                   out_stride);
      for (int64_t h = 0; h < sh.g; ++h) {
        const auto want =
            reference(&q[static_cast<size_t>(h * q_stride)], sh.dk, p.view, sh.n, scale, sh.dv);
        double vmax = 0;
        for (double v : want) vmax = std::max(vmax, std::fabs(v));
        for (int64_t i = 0; i < sh.dv; ++i) {
          const float got = out[static_cast<size_t>(h * out_stride + i)];
          ASSERT_TRUE(std::isfinite(got));
          ASSERT_NEAR(got, want[static_cast<size_t>(i)], 2e-5 * (vmax + spread))
              << "head " << h << " value " << i;
        }
        for (int64_t i = sh.dv; i < out_stride; ++i)
          ASSERT_EQ(out[static_cast<size_t>(h * out_stride + i)], -99.f) << "wrote past dv";
        // The same head alone: bit-identical (a head never depends on its neighbours).
        std::vector<float> solo(static_cast<size_t>(sh.dv));
        attend_heads(&q[static_cast<size_t>(h * q_stride)], q_stride, 1, sh.dk, p.view, sh.n, scale,
                     sh.dv, solo.data(), sh.dv);
        ASSERT_EQ(std::memcmp(solo.data(), &out[static_cast<size_t>(h * out_stride)],
                              static_cast<size_t>(sh.dv) * sizeof(float)),
                  0)
            << "head " << h;
      }
    }
  }
}

// A cache of f16 or bf16 values (KvType): the kernel reads them as the floats they are, so its
// output has the same bits as on an f32 pool holding the rounded values, for every shape and
// head grouping; and that pool's values are what KvCache::store rounds to.
TEST(Attention, HalfPrecisionRowsGiveTheBitsOfTheirValuesInF32) {
  std::mt19937 rng(9);
  const Shape shapes[] = {{8, 64, 64, 37, 16},
                          {2, 40, 24, 17, 4},
                          {1, 7, 5, 3, 2},
                          {3, 72, 64, 300, 32},
                          {8, 576, 512, 20, 16}};
  for (const KvType type : {KvType::kF16, KvType::kBF16}) {
    for (const Shape& sh : shapes) {
      SCOPED_TRACE(::testing::Message() << kv_type_name(type) << " g=" << sh.g << " dk=" << sh.dk
                                        << " dv=" << sh.dv << " n=" << sh.n);
      Paged p = make_paged(sh.n, sh.bs, sh.dk, sh.dv, rng, 2.0f);
      // The same pool stored as halves (via the cache, which rounds), and read back as floats.
      const int64_t stride = p.view.k_stride, rows = static_cast<int64_t>(p.pool.size()) / stride;
      KvCacheConfig c;
      c.n_layer = 1;
      c.k_width = stride;
      c.block_size = rows;
      c.num_blocks = 1;
      c.type = type;
      KvCache cache(c);
      for (int64_t r = 0; r < rows; ++r)
        cache.store(0, 0, r, 0, &p.pool[static_cast<size_t>(r * stride)], stride);
      for (int64_t r = 0; r < rows; ++r)
        cache.load(0, 0, r, 0, stride, &p.pool[static_cast<size_t>(r * stride)]);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < stride; ++i) {
          // One head and no V: slot r's row is r * stride values into the block.
          const auto* h = reinterpret_cast<const uint16_t*>(cache.block(0, 0)) + r * stride + i;
          const float v = p.pool[static_cast<size_t>(r * stride + i)];
          ASSERT_EQ(*h, type == KvType::kF16 ? model::fp32_to_fp16(v) : model::fp32_to_bf16(v));
        }
      Paged half = p;
      half.view.type = type;
      for (size_t b = 0; b < p.blocks.size(); ++b) {
        const auto off = static_cast<const float*>(p.blocks[b]) - p.pool.data();
        half.blocks[b] = reinterpret_cast<const uint16_t*>(cache.block(0, 0)) + off;
      }
      half.view.blocks = half.blocks.data();
      std::normal_distribution<float> nd(0.f, 2.0f);
      std::vector<float> q(static_cast<size_t>(sh.g * sh.dk));
      for (auto& v : q) v = nd(rng);
      const float scale = 1.0f / std::sqrt(static_cast<float>(sh.dk));
      std::vector<float> want(static_cast<size_t>(sh.g * sh.dv)), got(want.size());
      attend_heads(q.data(), sh.dk, sh.g, sh.dk, p.view, sh.n, scale, sh.dv, want.data(), sh.dv);
      attend_heads(q.data(), sh.dk, sh.g, sh.dk, half.view, sh.n, scale, sh.dv, got.data(), sh.dv);
      ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)));
      // And close to the double-precision reference on the rounded values.
      const auto ref = reference(q.data(), sh.dk, p.view, sh.n, scale, sh.dv);
      for (int64_t i = 0; i < sh.dv; ++i)
        ASSERT_NEAR(got[static_cast<size_t>(i)], ref[static_cast<size_t>(i)], 1e-4);
    }
  }
}

// n positions of 2 KV heads in a KvCache (one layer, blocks of bs in reverse order), as the
// engine fills it: keys[j] and values[j] are head `head`'s, the other head's random as well.
struct CachedKv {
  std::unique_ptr<KvCache> cache;
  std::vector<const void*> blocks;
  KvView view;
};

CachedKv cache_kv(const std::vector<std::vector<float>>& keys,
                  const std::vector<std::vector<float>>& values, int64_t head, int64_t bs,
                  KvType type, bool by_dim) {
  const auto n = static_cast<int64_t>(keys.size());
  const auto dk = static_cast<int64_t>(keys[0].size()), dv = static_cast<int64_t>(values[0].size());
  CachedKv c;
  KvCacheConfig cfg;
  cfg.n_layer = 1;
  cfg.k_width = 2 * dk;
  cfg.v_width = 2 * dv;
  cfg.heads = 2;
  cfg.block_size = bs;
  cfg.num_blocks = (n + bs - 1) / bs;
  cfg.type = type;
  cfg.k_by_dim = by_dim;
  c.cache = std::make_unique<KvCache>(cfg);
  for (int64_t j = 0; j < n; ++j) {
    const auto b = static_cast<int32_t>(cfg.num_blocks - 1 - j / bs);
    std::vector<float> other(static_cast<size_t>(dk + dv), 7.5f + static_cast<float>(j));
    const auto& k = keys[static_cast<size_t>(j)];
    const auto& v = values[static_cast<size_t>(j)];
    c.cache->store(0, b, j % bs, head * dk, k.data(), dk);
    c.cache->store(0, b, j % bs, (1 - head) * dk, other.data(), dk);
    c.cache->store(0, b, j % bs, 2 * dk + head * dv, v.data(), dv);
    c.cache->store(0, b, j % bs, 2 * dk + (1 - head) * dv, other.data(), dv);
  }
  // The last block's slots past n hold NaN: attention must never let them in.
  const std::vector<float> nan(static_cast<size_t>(2 * (dk + dv)), std::nanf(""));
  for (int64_t j = n; j < cfg.num_blocks * bs; ++j)
    c.cache->store(0, 0, j % bs, 0, nan.data(), 2 * (dk + dv));
  for (int64_t b = 0; b < cfg.num_blocks; ++b)
    c.blocks.push_back(c.cache->block(0, static_cast<int32_t>(cfg.num_blocks - 1 - b)));
  c.view.blocks = c.blocks.data();
  c.view.type = type;
  c.view.block_size = bs;
  c.view.k_offset = c.cache->k_offset(head);
  c.view.k_stride = c.cache->k_stride();
  c.view.v_offset = c.cache->v_offset(head);
  c.view.v_stride = c.cache->v_stride();
  c.view.k_by_dim = by_dim;
  return c;
}

// Keys by dimension (KvView::k_by_dim, the engine's layout for all but MLA): each head close to
// the double-precision reference; a head's bits the same alone as in its group (of up to 16, in
// passes of 8, 4, 2 and 1), whatever the block size (chunks of the full SIMD width, narrower
// ones at the end of a block, blocks of one position) and where a sliding window starts in a
// block; and an f16 or bf16 cache gives the bits of an f32 one holding its rounded values.
// Positions before the window and the last block's unwritten slots hold NaN, which must not
// reach the result (in either layout).
TEST(Attention, KeysByDimensionMatchTheReferenceInAnyBlockShape) {
  struct Case {
    int64_t g, dk, dv, n, first;
  };
  const Case cases[] = {{8, 64, 64, 1, 0},   {8, 64, 64, 37, 0},    {4, 128, 128, 300, 0},
                        {2, 40, 24, 17, 3},  {1, 7, 5, 3, 0},       {3, 72, 64, 200, 50},
                        {12, 64, 64, 70, 0}, {16, 32, 32, 100, 17}, {5, 16, 16, 33, 21}};
  std::mt19937 rng(11);
  for (const Case& cs : cases) {
    for (const float spread : {0.3f, 3.0f}) {
      SCOPED_TRACE(::testing::Message()
                   << "g=" << cs.g << " dk=" << cs.dk << " dv=" << cs.dv << " n=" << cs.n
                   << " first=" << cs.first << " spread=" << spread);
      std::normal_distribution<float> nd(0.f, spread);
      std::vector<std::vector<float>> keys(static_cast<size_t>(cs.n)), values(keys.size());
      for (auto& k : keys) {
        k.resize(static_cast<size_t>(cs.dk));
        for (auto& x : k) x = nd(rng);
      }
      for (auto& v : values) {
        v.resize(static_cast<size_t>(cs.dv));
        for (auto& x : v) x = nd(rng);
      }
      for (int64_t j = 0; j < cs.first; ++j) {  // outside the window
        std::fill(keys[static_cast<size_t>(j)].begin(), keys[static_cast<size_t>(j)].end(),
                  std::nanf(""));
        std::fill(values[static_cast<size_t>(j)].begin(), values[static_cast<size_t>(j)].end(),
                  std::nanf(""));
      }
      const int64_t q_stride = cs.dk + 1;
      std::vector<float> q(static_cast<size_t>(cs.g * q_stride));
      for (auto& x : q) x = nd(rng);
      const float scale = 1.0f / std::sqrt(static_cast<float>(cs.dk));
      std::vector<float> first_out;
      for (const int64_t bs : {16, 4, 20, 1, 48}) {
        SCOPED_TRACE(::testing::Message() << "block size " << bs);
        CachedKv c = cache_kv(keys, values, 1, bs, KvType::kF32, true);
        c.view.first = cs.first;
        std::vector<float> out(static_cast<size_t>(cs.g * cs.dv), -99.f);
        attend_heads(q.data(), q_stride, cs.g, cs.dk, c.view, cs.n, scale, cs.dv, out.data(),
                     cs.dv);
        if (first_out.empty()) {
          first_out = out;
          for (int64_t h = 0; h < cs.g; ++h) {
            std::vector<double> s, want(static_cast<size_t>(cs.dv), 0.0);
            double mx = -INFINITY, sum = 0;
            for (int64_t j = cs.first; j < cs.n; ++j) {
              double d = 0;
              for (int64_t i = 0; i < cs.dk; ++i)
                d += double{q[static_cast<size_t>(h * q_stride + i)]} *
                     keys[static_cast<size_t>(j)][static_cast<size_t>(i)];
              s.push_back(d * scale);
              mx = std::max(mx, d * scale);
            }
            for (auto& v : s) sum += (v = std::exp(v - mx));
            for (int64_t j = cs.first; j < cs.n; ++j)
              for (int64_t i = 0; i < cs.dv; ++i)
                want[static_cast<size_t>(i)] +=
                    s[static_cast<size_t>(j - cs.first)] / sum *
                    values[static_cast<size_t>(j)][static_cast<size_t>(i)];
            double vmax = 0;
            for (double v : want) vmax = std::max(vmax, std::fabs(v));
            for (int64_t i = 0; i < cs.dv; ++i) {
              const float got = out[static_cast<size_t>(h * cs.dv + i)];
              ASSERT_TRUE(std::isfinite(got));
              ASSERT_NEAR(got, want[static_cast<size_t>(i)], 2e-5 * (vmax + spread))
                  << "head " << h << " value " << i;
            }
          }
          // Keys in rows (MLA's layout) over the same positions: as close, other bits.
          CachedKv rows = cache_kv(keys, values, 1, bs, KvType::kF32, false);
          rows.view.first = cs.first;
          std::vector<float> by_row(out.size());
          attend_heads(q.data(), q_stride, cs.g, cs.dk, rows.view, cs.n, scale, cs.dv,
                       by_row.data(), cs.dv);
          for (size_t i = 0; i < out.size(); ++i)
            ASSERT_NEAR(by_row[i], out[i], 4e-5 * (1 + std::fabs(out[i]))) << "value " << i;
        } else {
          ASSERT_EQ(0, std::memcmp(out.data(), first_out.data(), out.size() * sizeof(float)));
        }
        for (int64_t h = 0; h < cs.g; ++h) {  // each head alone
          std::vector<float> solo(static_cast<size_t>(cs.dv));
          attend_heads(&q[static_cast<size_t>(h * q_stride)], q_stride, 1, cs.dk, c.view, cs.n,
                       scale, cs.dv, solo.data(), cs.dv);
          ASSERT_EQ(0, std::memcmp(solo.data(), &out[static_cast<size_t>(h * cs.dv)],
                                   solo.size() * sizeof(float)))
              << "head " << h;
        }
      }
      for (const auto& [type, bs] :
           {std::pair{KvType::kF16, int64_t{16}}, std::pair{KvType::kBF16, int64_t{16}},
            std::pair{KvType::kF16, int64_t{20}}, std::pair{KvType::kBF16, int64_t{1}}}) {
        SCOPED_TRACE(::testing::Message() << kv_type_name(type) << " block size " << bs);
        CachedKv half = cache_kv(keys, values, 0, bs, type, true);
        auto rk = keys, rv = values;  // the rounded values, read back
        for (int64_t j = 0; j < cs.n; ++j) {
          const auto b = static_cast<int32_t>(half.blocks.size() - 1 - static_cast<size_t>(j / bs));
          half.cache->load(0, b, j % bs, 0, cs.dk, rk[static_cast<size_t>(j)].data());
          half.cache->load(0, b, j % bs, 2 * cs.dk, cs.dv, rv[static_cast<size_t>(j)].data());
        }
        CachedKv f32 = cache_kv(rk, rv, 0, bs, KvType::kF32, true);
        half.view.first = f32.view.first = cs.first;
        std::vector<float> want(static_cast<size_t>(cs.g * cs.dv)), got(want.size());
        attend_heads(q.data(), q_stride, cs.g, cs.dk, f32.view, cs.n, scale, cs.dv, want.data(),
                     cs.dv);
        attend_heads(q.data(), q_stride, cs.g, cs.dk, half.view, cs.n, scale, cs.dv, got.data(),
                     cs.dv);
        ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)));
      }
    }
  }
}

// round_to_f16 (the SIMD conversion behind an f16 cache) gives model::fp32_to_fp16's bits for
// every kind of value, at every offset and tail: ties to even, overflow to infinity, the
// subnormals, zeros of both signs, and NaN (0x7e00 with its sign) in a chunk of ordinary values.
TEST(Attention, RoundToF16IsTheScalarConversion) {
  std::vector<float> x = {0.f,       -0.f,          1.f,          -1.f,           65504.f,
                          65519.f,   65520.f,       -70000.f,     1e30f,          INFINITY,
                          -INFINITY, 6.0e-8f,       -6.0e-8f,     2.98e-8f,       2.9802322e-8f,
                          1e-10f,    6.1035156e-5f, 6.097555e-5f, 1.00048828125f, 1.00146484375f,
                          3.14159f,  -2.71828f,     1e-5f,        std::nanf(""),  -std::nanf("")};
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 100.f);
  for (int i = 0; i < 300; ++i)
    x.push_back(nd(rng) * std::ldexp(1.f, static_cast<int>(i % 40) - 30));
  for (size_t off = 0; off < 17; ++off) {
    const auto n = static_cast<int64_t>(x.size() - off);
    std::vector<uint16_t> got(static_cast<size_t>(n));
    round_to_f16(x.data() + off, got.data(), n);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(got[static_cast<size_t>(i)], model::fp32_to_fp16(x[off + static_cast<size_t>(i)]))
          << "value " << x[off + static_cast<size_t>(i)] << " offset " << off;
  }
}

// Scores far apart: the smallest weights underflow to 0 without NaN, the largest dominates.
TEST(Attention, ExtremeScoresStayFinite) {
  const int64_t dk = 16, dv = 16, n = 5;
  std::vector<float> rows(static_cast<size_t>(n * (dk + dv)), 0.f);
  std::vector<const void*> blocks = {rows.data()};
  KvView kv;
  kv.blocks = blocks.data();
  kv.block_size = n;
  kv.k_stride = dk + dv;
  kv.v_stride = dk + dv;
  kv.v_offset = dk;
  std::vector<float> q(dk, 0.f);
  q[0] = 1.f;
  const float keys[n] = {-1e4f, 0.f, 50.f, 1e4f, -3e38f};
  for (int64_t j = 0; j < n; ++j) {
    rows[static_cast<size_t>(j * (dk + dv))] = keys[j];
    rows[static_cast<size_t>(j * (dk + dv) + dk)] = static_cast<float>(j + 1);  // v[0] = j + 1
  }
  std::vector<float> out(dv);
  attend_heads(q.data(), dk, 1, dk, kv, n, 1.0f, dv, out.data(), dv);
  EXPECT_FLOAT_EQ(out[0], 4.f);  // all weight on position 3
  for (float v : out) EXPECT_TRUE(std::isfinite(v));
}

// A window that leaves no positions (first == n) gives zeros, as a sink's zero value vector
// would, in either key layout; nothing past dv is written.
TEST(Attention, NoPositionsGiveZeros) {
  std::vector<std::vector<float>> keys(20, std::vector<float>(8, 1.f)), values(20, keys[0]);
  for (const bool by_dim : {false, true}) {
    CachedKv c = cache_kv(keys, values, 0, 16, KvType::kF32, by_dim);
    c.view.first = 18;
    std::vector<float> q(3 * 8, 0.5f), out(3 * 9, -99.f);
    attend_heads(q.data(), 8, 3, 8, c.view, 18, 1.0f, 8, out.data(), 9);
    for (int64_t h = 0; h < 3; ++h) {
      for (int64_t i = 0; i < 8; ++i) ASSERT_EQ(out[static_cast<size_t>(h * 9 + i)], 0.f);
      ASSERT_EQ(out[static_cast<size_t>(h * 9 + 8)], -99.f);
    }
  }
}

// softmax_rows against a double-precision softmax, for lengths around the SIMD widths (tails of
// every size), with scales and magnitudes that make the maximum matter; rows do not mix.
TEST(SoftmaxRows, MatchesDoublePrecisionAndKeepsRowsApart) {
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.f, 4.f);
  for (int64_t n : {1, 7, 8, 9, 15, 16, 17, 31, 33, 100, 577}) {
    const int64_t rows = 3;
    std::vector<float> x(static_cast<size_t>(rows * n));
    for (float& v : x) v = d(rng);
    std::vector<float> got = x;
    softmax_rows(got.data(), rows, n, 0.37f);
    for (int64_t r = 0; r < rows; ++r) {
      double mx = -INFINITY, sum = 0;
      for (int64_t j = 0; j < n; ++j) mx = std::max(mx, 0.37 * x[static_cast<size_t>(r * n + j)]);
      for (int64_t j = 0; j < n; ++j)
        sum += std::exp(0.37 * x[static_cast<size_t>(r * n + j)] - mx);
      double total = 0;
      for (int64_t j = 0; j < n; ++j) {
        const double want = std::exp(0.37 * x[static_cast<size_t>(r * n + j)] - mx) / sum;
        const float g = got[static_cast<size_t>(r * n + j)];
        EXPECT_NEAR(g, want, 2e-6 + 2e-6 * want) << "n " << n << " row " << r << " j " << j;
        total += g;
      }
      EXPECT_NEAR(total, 1.0, 1e-5) << "n " << n;
    }
    // A row alone gives the same bits as within the block.
    std::vector<float> one(x.begin() + n, x.begin() + 2 * n);
    softmax_rows(one.data(), 1, n, 0.37f);
    EXPECT_EQ(0, std::memcmp(one.data(), got.data() + n, static_cast<size_t>(n) * 4)) << n;
  }
}

// silu_mul against double precision, from tiny to huge arguments of both signs (where e^-x
// overflows a float), at every tail length; an element's bits never depend on its position in
// the span (the FFN splits it across threads anywhere); NaN stays NaN.
TEST(SiluMul, MatchesDoublePrecisionAtEveryMagnitudeAndPosition) {
  std::vector<float> x = {0.f, -0.f, 1e-30f, -1e-30f, 1e-3f, -1e-3f, 0.5f, -0.5f, 1.f, -1.f};
  for (float m = 1.5f; m < 200.f; m *= 1.7f) {
    x.push_back(m);
    x.push_back(-m);
  }
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 3.f);
  for (int i = 0; i < 500; ++i) x.push_back(nd(rng));
  std::vector<float> u(x.size());
  for (float& v : u) v = nd(rng);
  std::vector<float> got = x;
  silu_mul(got.data(), u.data(), static_cast<int64_t>(got.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    const double xd = x[i], want = xd / (1.0 + std::exp(-xd)) * u[i];
    EXPECT_NEAR(got[i], want, 4e-7 * std::fabs(want) + 1e-37) << "x " << x[i] << " u " << u[i];
  }
  for (int64_t off = 0; off < 17; ++off)  // every start and tail within a register
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{16}, int64_t{33}}) {
      std::vector<float> part(x.begin() + off, x.begin() + off + n);
      silu_mul(part.data(), u.data() + off, n);
      EXPECT_EQ(0, std::memcmp(part.data(), got.data() + off, static_cast<size_t>(n) * 4))
          << "offset " << off << " n " << n;
    }
  float nan = std::nanf(""), one = 1.f;
  silu_mul(&nan, &one, 1);
  EXPECT_TRUE(std::isnan(nan));
}

}  // namespace
}  // namespace troupe::compute
