// The int8 types (Q4_0 ... Q6_K) in 16-row tiles (model/weight_tiles.h, WeightLayout::kTiles16):
// tiling is lossless (every row comes back), every SIMD path gives the scalar tile kernel's bits,
// which agree with the scalar row kernels to rounding; F16, BF16 and the packed 4-bit types'
// tiles give the bits of their rows; every kernel set reads the rows of the types it tiles
// (AVX-512 VNNI, AVX2) with its tiles' arithmetic, so rows give the very bits of tiles; batch
// invariance holds (tokens, threads, shared inputs), embedding rows read through tiles, and a
// weight copy made with tiles gives an engine the mapped model's logits (bit for bit where the
// SIMD level tiles the type) and batch invariance.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "compute/detail/matmul_kernels.h"
#include "compute/engine.h"
#include "compute/matmul.h"
#include "compute/thread_pool.h"
#include "model/model.h"
#include "model/synth.h"
#include "model/weight_tiles.h"
#include "tests/compute/engine_test_util.h"
#include "tests/compute/matmul_test_util.h"

namespace troupe::compute {
namespace {

using model::GgmlType;
using model::WeightLayout;
using model::WeightView;
using namespace matmultest;  // NOLINT(google-build-using-namespace): the test helpers

constexpr GgmlType kInt8Types[] = {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0,
                                   GgmlType::kQ5_1, GgmlType::kQ8_0, GgmlType::kQ4_K,
                                   GgmlType::kQ5_K, GgmlType::kQ6_K};

// F16, BF16 and F8_E4M3 tile too (4-row quads, 16 columns at a time; model/weight_tiles.h).
constexpr GgmlType kFloatTypes[] = {GgmlType::kF16, GgmlType::kBF16, GgmlType::kF8_E4M3};

// And the packed 4-bit types (4-row quads, 128 columns at a time, nibbles reordered in each
// row's 64 bytes).
constexpr GgmlType kNibbleTypes[] = {GgmlType::kI4_PACKED, GgmlType::kFP4_PACKED};

bool nibble_type(GgmlType t) { return t == GgmlType::kI4_PACKED || t == GgmlType::kFP4_PACKED; }

// Columns of n blocks of type t (F16, BF16, F8_E4M3: of n chunks of 16 columns; I4_PACKED,
// FP4_PACKED: of n groups of 128).
int64_t cols_of(GgmlType t, int64_t n) {
  if (t == GgmlType::kF16 || t == GgmlType::kBF16 || t == GgmlType::kF8_E4M3)
    return n * model::kFloatTileCols;
  if (nibble_type(t)) return n * model::kNibbleTileCols;
  return n * model::type_traits(static_cast<uint32_t>(t))->block_elems;
}

// A matrix (or stack) owning its bytes, in rows, and the same bytes tiled; the scaled types'
// scales (both views share them).
struct Pair {
  std::vector<uint8_t> rows_bytes, tile_bytes;
  std::vector<float> scales;
  std::vector<uint8_t> scale_codes;  // NVFP4's E4M3 scales (nvfp4_scales)
  WeightView rows, tiles;
};

// An FP4 pair's scales as NVFP4's: an E4M3 code per 16 columns (every finite code, subnormals
// included) under a global scale that multiplies (ModelOpt) or divides (compressed-tensors).
void nvfp4_scales(Pair& p, bool divide, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t n = p.rows.ne[1] * p.rows.ne[2] * p.rows.cols() / 16;
  p.scale_codes.resize(static_cast<size_t>(n));
  for (auto& c : p.scale_codes) {
    c = static_cast<uint8_t>(rng() % 256);
    if ((c & 0x7f) == 0x7f) c = 0x3f;  // not NaN
  }
  for (WeightView* v : {&p.rows, &p.tiles}) {
    v->scales = p.scale_codes.data();
    v->scale_type = GgmlType::kF8_E4M3;
    v->scale_block[1] = 16;
    v->scale_stride = v->cols() / 16;
    (divide ? v->scale_div : v->scale_mul) = divide ? 2688.f / 3.7f : 3.7f / 2688.f;
  }
}

Pair make_pair(GgmlType t, int64_t rows, int64_t cols, uint32_t seed, int64_t n_mat = 1) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  Pair p;
  const int64_t rb = model::row_bytes(t, cols);
  p.rows_bytes.resize(static_cast<size_t>(rb * rows * n_mat));
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows * n_mat; ++r) {
    uint8_t* dst = p.rows_bytes.data() + r * rb;
    if (t == GgmlType::kQ4_K || t == GgmlType::kQ5_K) {
      // Any bit pattern is a valid block: random bytes, then sane f16 scales (d and dmin lead
      // both blocks).
      for (int64_t i = 0; i < rb; ++i) dst[i] = static_cast<uint8_t>(rng());
      std::uniform_real_distribution<float> sd(2e-3f, 2e-2f);
      const int64_t block = model::row_bytes(t, model::kQK_K);
      for (int64_t b = 0; b < cols / model::kQK_K; ++b) {
        auto* blk = reinterpret_cast<model::BlockQ4_K*>(dst + b * block);
        blk->d = model::fp32_to_fp16(sd(rng));
        blk->dmin = model::fp32_to_fp16(sd(rng));
      }
      continue;
    }
    if (nibble_type(t)) {  // any byte is two valid 4-bit values
      for (int64_t i = 0; i < rb; ++i) dst[i] = static_cast<uint8_t>(rng());
      continue;
    }
    if (t == GgmlType::kF8_E4M3) {  // every code but NaN's (tiles hold none), subnormals too
      for (int64_t i = 0; i < rb; ++i) {
        do {
          dst[i] = static_cast<uint8_t>(rng());
        } while ((dst[i] & 0x7f) == 0x7f);
      }
      continue;
    }
    if (t == GgmlType::kQ6_K) {  // likewise, with int8 group scales of both signs
      for (int64_t i = 0; i < rb; ++i) dst[i] = static_cast<uint8_t>(rng());
      std::uniform_real_distribution<float> sd(1e-4f, 2e-3f);
      for (int64_t b = 0; b < cols / model::kQK_K; ++b)
        reinterpret_cast<model::BlockQ6_K*>(dst)[b].d = model::fp32_to_fp16(sd(rng));
      continue;
    }
    for (auto& v : row) v = uni(rng);
    model::quantize_row(t, row.data(), dst, cols);
  }
  p.tile_bytes = p.rows_bytes;
  model::tile_in_place(t, p.tile_bytes.data(), rows, cols, n_mat);
  p.rows.name = "test." + model::type_name(t);
  p.rows.type = t;
  p.rows.ne[0] = cols;
  p.rows.ne[1] = rows;
  p.rows.ne[2] = n_mat;
  p.rows.data = p.rows_bytes.data();
  if (nibble_type(t)) {
    // F32 scales of both signs over a wide range, one per 32 columns (I4_PACKED) or 64 (FP4).
    const int64_t group = t == GgmlType::kI4_PACKED ? 32 : 64;
    std::uniform_real_distribution<float> e(-12.f, 4.f);
    p.scales.resize(static_cast<size_t>(rows * n_mat * cols / group));
    for (float& v : p.scales) v = std::exp2(e(rng)) * (rng() % 2 ? 1.f : -1.f) * (1.f + uni(rng));
    p.rows.scales = p.scales.data();
    p.rows.scale_type = GgmlType::kF32;
    p.rows.scale_block[0] = 1;
    p.rows.scale_block[1] = group;
    p.rows.scale_stride = cols / group;
  }
  if (t == GgmlType::kF8_E4M3) {
    // F32 scales per 8 rows x 32 columns (the last block of a row 16 columns wide when cols is
    // an odd number of 16s), of both signs from f32 subnormals to just under the tiles' limit.
    const int64_t grid_cols = (cols + 31) / 32;
    std::uniform_real_distribution<float> e(-30.f, 7.f);
    p.scales.resize(static_cast<size_t>(rows / 8 * n_mat * grid_cols));
    for (float& v : p.scales) v = std::exp2(e(rng)) * (rng() % 2 ? 1.f : -1.f) * (1.f + uni(rng));
    p.scales[0] = 255.99f;
    p.scales[1] = -1e-40f;
    p.rows.scales = p.scales.data();
    p.rows.scale_type = GgmlType::kF32;
    p.rows.scale_block[0] = 8;
    p.rows.scale_block[1] = 32;
    p.rows.scale_stride = grid_cols;
  }
  p.tiles = p.rows;
  p.tiles.data = p.tile_bytes.data();
  p.tiles.layout = WeightLayout::kTiles16;
  return p;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(WeightTiles, EveryRowComesBack) {
  std::vector<GgmlType> types(std::begin(kInt8Types), std::end(kInt8Types));
  types.insert(types.end(), std::begin(kFloatTypes), std::end(kFloatTypes));
  types.insert(types.end(), std::begin(kNibbleTypes), std::end(kNibbleTypes));
  for (GgmlType t : types) {
    const Pair p = make_pair(t, 48, cols_of(t, 5), 3, 2);
    EXPECT_NE(p.rows_bytes, p.tile_bytes) << "tiling moved nothing";
    std::vector<uint8_t> row(static_cast<size_t>(p.rows.row_bytes()));
    for (int64_t m = 0; m < 2; ++m)
      for (int64_t r = 0; r < 48; ++r) {
        model::untile_row(p.tiles, m, r, row.data());
        ASSERT_EQ(std::memcmp(row.data(), p.rows.slice(m).row(r), row.size()), 0)
            << model::type_name(t) << " matrix " << m << " row " << r;
      }
  }
}

TEST(WeightTiles, OnlyWholeTilesOfTileTypes) {
  Pair p = make_pair(GgmlType::kQ4_0, 32, 64, 1);
  EXPECT_TRUE(model::tileable(p.rows));
  EXPECT_FALSE(model::tileable(p.tiles)) << "already tiled";
  WeightView v = p.rows;
  v.ne[1] = 40;  // not a multiple of 16
  EXPECT_FALSE(model::tileable(v));
  v = p.rows;
  v.data = nullptr;
  EXPECT_FALSE(model::tileable(v));
  // Float types: F16, BF16 and F8_E4M3 with whole chunks of 16 columns; not F32 or MXFP4.
  for (GgmlType t : kFloatTypes) {
    v = p.rows;
    v.type = t;
    EXPECT_TRUE(model::tileable(v)) << model::type_name(t);
    v.ne[0] = 72;  // not a multiple of 16
    EXPECT_FALSE(model::tileable(v)) << model::type_name(t);
  }
  // The packed 4-bit types with whole groups of 128 columns.
  for (GgmlType t : kNibbleTypes) {
    v = p.rows;
    v.type = t;
    EXPECT_FALSE(model::tileable(v)) << model::type_name(t) << ": 64 columns";
    v.ne[0] = 384;
    EXPECT_TRUE(model::tileable(v)) << model::type_name(t);
  }
  for (GgmlType t : {GgmlType::kF32, GgmlType::kMXFP4}) {
    v = p.rows;
    v.type = t;
    v.ne[0] = 256;
    EXPECT_FALSE(model::tileable(v)) << model::type_name(t);
  }
}

// Tiles of type t (F16, BF16, F8_E4M3, I4_PACKED, FP4_PACKED: the rows' values in another order,
// summed in the same order; F8's each widened another way, to the same float) give their rows'
// bits on every kernel set: a set with tile kernels of its own
// (AVX-512; AVX2 for I4_PACKED) its row kernels' bits for every token count and thread count, so it
// is batch-invariant as they are; the others read tiles through the scalar kernel and give its
// bits. `rows` x `chunks` (cols_of) in a stack of 2, seeded with `seed`.
void expect_tiles_give_the_bits_of_rows(GgmlType t, int64_t rows, int64_t chunks, uint32_t seed,
                                        const std::function<void(Pair&)>& edit = {}) {
  ThreadPool pool2(2), pool3(3);
  ThreadPool* pools[] = {nullptr, &pool2, &pool3};
  const auto sets = kernel_sets();
  const detail::KernelSet& scalar = *sets.back();
  Pair p = make_pair(t, rows, cols_of(t, chunks), seed, 2);
  if (edit) edit(p);
  for (const auto* ks : sets) {
    const bool own = ks->find(t, WeightLayout::kTiles16) != scalar.find(t, WeightLayout::kTiles16);
    for (int64_t m = 0; m < 2; ++m) {
      const WeightView r = p.rows.slice(m), tiles = p.tiles.slice(m);
      for (int64_t n_tok : {1, 2, 5, 6, 7, 16, 49}) {
        const auto x = random_x(n_tok, r.cols(), seed + 2 + static_cast<uint32_t>(n_tok));
        const auto want = run(own ? *ks : scalar, r, x, n_tok, nullptr);
        for (ThreadPool* pool : pools)
          ASSERT_TRUE(same_bits(run(*ks, tiles, x, n_tok, pool), want))
              << ks->name << " " << model::type_name(t) << " matrix " << m << " n_tok=" << n_tok
              << " threads=" << (pool ? pool->size() : 1);
      }
    }
  }
}

// Columns of 37 chunks: rows of 1184 bytes (F8: 592), so that quads cross pages at varying places
// (the batch-1 kernel prefetches per page). F8's scales reach from f32 subnormals to just under
// 256, and its codes include E4M3's subnormals (make_pair).
TEST(TiledMatmul, FloatTilesGiveTheBitsOfRows) {
  for (GgmlType t : kFloatTypes) expect_tiles_give_the_bits_of_rows(t, 64, 37, 31);
}

// The packed 4-bit types: quads 128 columns at a time, the nibbles of each row's 64 bytes
// reordered; scales per 32 or 64 columns (make_pair).
TEST(TiledMatmul, NibbleTilesGiveTheBitsOfRows) {
  for (GgmlType t : kNibbleTypes) expect_tiles_give_the_bits_of_rows(t, 48, 7, 41);
}

// NVFP4 (FP4 with an E4M3 scale per 16 columns and a global scale): the table is rebuilt every
// 16 columns, and the global scale applied, alike in tiles and rows.
TEST(TiledMatmul, Nvfp4TilesGiveTheBitsOfRows) {
  for (const bool divide : {false, true}) {
    SCOPED_TRACE(divide ? "global scale divides" : "global scale multiplies");
    expect_tiles_give_the_bits_of_rows(GgmlType::kFP4_PACKED, 48, 3, 43,
                                       [&](Pair& p) { nvfp4_scales(p, divide, 44); });
  }
}

// Every path (those without SIMD tile kernels read tiles through the scalar ones) gives the
// scalar tile kernel's bits; and those agree with the row kernels to float rounding (the same
// int8 activations and exact integer dots, summed in another order).
TEST(TiledMatmul, EveryPathGivesTheScalarBitsAndRowsToRounding) {
  const auto sets = kernel_sets();
  const detail::KernelSet& scalar = *sets.back();
  for (GgmlType t : kInt8Types) {
    const Pair p = make_pair(t, 48, cols_of(t, 17), 5);
    for (int64_t n_tok : {1, 5, 16, 70}) {
      const auto x = random_x(n_tok, p.rows.cols(), 7);
      const auto want = run(scalar, p.tiles, x, n_tok, nullptr);
      const auto rows = run(scalar, p.rows, x, n_tok, nullptr);
      float amax = 0;
      for (float v : rows) amax = std::max(amax, std::fabs(v));
      for (size_t i = 0; i < rows.size(); ++i)
        ASSERT_NEAR(want[i], rows[i], 2e-6 * amax) << model::type_name(t) << " element " << i;
      for (const auto* ks : sets)
        EXPECT_TRUE(same_bits(run(*ks, p.tiles, x, n_tok, nullptr), want))
            << ks->name << " " << model::type_name(t) << " n_tok=" << n_tok;
    }
  }
}

// Every kernel set reads ggml's rows of each type it tiles (detail::tiled_types: AVX-512 VNNI
// every int8 type, AVX2 the same eight) with the arithmetic of its tiles: a matrix gives the same
// bits mapped from its file (rows) and copied into tiles, also for a row count that is not whole
// tiles (a masked or partial last tile) and any first row, with one thread or two.
TEST(TiledMatmul, RowsGiveTheBitsOfTilesOfEveryTiledType) {
  ThreadPool pool2(2);
  int checked = 0;
  for (const auto* ks : kernel_sets()) {
    const model::TileTypes tiled = detail::tiled_types(*ks);
    for (GgmlType t : kInt8Types) {
      if (!tiled.has(t)) continue;
      ++checked;
      const Pair p = make_pair(t, 64, cols_of(t, 13), 15);
      for (int64_t n_tok : {1, 2, 4, 5, 8, 19}) {
        SCOPED_TRACE(std::string(ks->name) + " " + model::type_name(t) +
                     " n_tok=" + std::to_string(n_tok));
        const auto x = random_x(n_tok, p.rows.cols(), 17);
        const int64_t rows = 64;
        const auto tiles = run(*ks, p.tiles, x, n_tok, nullptr);
        ASSERT_TRUE(same_bits(run(*ks, p.rows, x, n_tok, &pool2), tiles));
        ASSERT_TRUE(same_bits(run(*ks, p.rows, x, n_tok, nullptr), tiles));
        // Rows [3, 40): 37 rows from an odd first row, in rows only.
        WeightView part = p.rows;
        part.data = p.rows.row(3);
        part.ne[1] = 37;
        const auto yp = run(*ks, part, x, n_tok, &pool2);
        for (int64_t tk = 0; tk < n_tok; ++tk)
          ASSERT_EQ(
              std::memcmp(yp.data() + tk * 37, tiles.data() + tk * rows + 3, 37 * sizeof(float)), 0)
              << "token " << tk;
      }
    }
  }
  if (checked == 0) GTEST_SKIP() << "no kernel set of this CPU tiles an int8 type (scalar only)";
}

// y[t][o] depends on neither n_tok, the thread count, the token's neighbours nor the targets
// computed together.
TEST(TiledMatmul, BatchInvariant) {
  ThreadPool pool2(2), pool3(3);
  ThreadPool* pools[] = {nullptr, &pool2, &pool3};
  constexpr int64_t kMaxTok = 70;  // past one token block of the AVX-512 kernel (64)
  for (const auto* ks : kernel_sets()) {
    for (GgmlType t : kInt8Types) {
      SCOPED_TRACE(std::string(ks->name) + " " + model::type_name(t));
      const Pair p = make_pair(t, 96, cols_of(t, 9), 21);
      const int64_t cols = p.rows.cols(), rows = p.rows.rows();
      const auto x = random_x(kMaxTok, cols, 23);
      const auto full = run(*ks, p.tiles, x, kMaxTok, nullptr);
      for (ThreadPool* pool : pools)
        for (int64_t n_tok : {1, 3, 9, 16, 70}) {
          auto y = run(*ks, p.tiles, x, n_tok, pool);
          ASSERT_EQ(std::memcmp(y.data(), full.data(), y.size() * sizeof(float)), 0)
              << "n_tok=" << n_tok << " threads=" << (pool ? pool->size() : 1);
        }
      std::vector<float> other = random_x(9, cols, 99);
      std::copy(x.begin(), x.begin() + cols, other.begin() + 5 * cols);
      const auto y_other = run(*ks, p.tiles, other, 9, &pool2);
      ASSERT_EQ(std::memcmp(y_other.data() + 5 * rows, full.data(), rows * sizeof(float)), 0);
      // q/k/v-like targets on one input: each exactly its own product.
      const Pair b = make_pair(t, 64, cols_of(t, 9), 22), c = make_pair(t, 32, cols_of(t, 9), 24);
      std::vector<float> ya(static_cast<size_t>(16 * rows)), yb(16 * 64), yc(16 * 32);
      const MatmulTarget targets[] = {
          {p.tiles, ya.data(), rows}, {b.tiles, yb.data(), 64}, {c.tiles, yc.data(), 32}};
      detail::matmul_shared_with(*ks, targets, x.data(), cols, 16, &pool2);
      EXPECT_TRUE(same_bits(ya, run(*ks, p.tiles, x, 16, nullptr)));
      EXPECT_TRUE(same_bits(yb, run(*ks, b.tiles, x, 16, nullptr)));
      EXPECT_TRUE(same_bits(yc, run(*ks, c.tiles, x, 16, nullptr)));
    }
  }
}

// Threads own contiguous shares of a product's row tiles and steal the back half of another's
// when done (run_rows in matmul.cc). With more threads than CPUs (so that some are descheduled
// mid-share and others steal) and several targets in one run, every output row is written, once
// computed, with the one-thread bits: rows start as NaN.
TEST(TiledMatmul, RowSharesAndStealingWriteEveryRow) {
  ThreadPool pool4(4), pool7(7);
  for (GgmlType t : {GgmlType::kQ4_0, GgmlType::kQ8_0, GgmlType::kQ4_K}) {
    const int64_t cols = cols_of(t, t == GgmlType::kQ4_K ? 2 : 8);
    const Pair a = make_pair(t, 16 * 97, cols, 41), b = make_pair(t, 16 * 13, cols, 42),
               c = make_pair(t, 16 * 40, cols, 43);
    for (int64_t n_tok : {1, 3}) {
      const auto x = random_x(n_tok, cols, 44);
      auto alone = [&](const WeightView& w) {
        std::vector<float> y(static_cast<size_t>(n_tok * w.rows()));
        matmul(w, x.data(), n_tok, y.data(), nullptr);
        return y;
      };
      const std::vector<float> wa = alone(a.tiles), wb = alone(b.tiles), wc = alone(c.tiles);
      for (ThreadPool* pool : {&pool4, &pool7})
        for (int rep = 0; rep < 20; ++rep) {
          std::vector<float> ya(wa.size(), NAN), yb(wb.size(), NAN), yc(wc.size(), NAN);
          if (rep % 2 == 0) {
            matmul(a.tiles, x.data(), n_tok, ya.data(), pool);
            ASSERT_TRUE(same_bits(ya, wa))
                << model::type_name(t) << " alone, threads " << pool->size() << " n_tok " << n_tok;
            continue;
          }
          const MatmulTarget targets[] = {{a.tiles, ya.data(), a.tiles.rows()},
                                          {b.tiles, yb.data(), b.tiles.rows()},
                                          {c.tiles, yc.data(), c.tiles.rows()}};
          matmul_shared(targets, x.data(), cols, n_tok, pool);
          ASSERT_TRUE(same_bits(ya, wa) && same_bits(yb, wb) && same_bits(yc, wc))
              << model::type_name(t) << " shared, threads " << pool->size() << " n_tok " << n_tok;
        }
    }
  }
}

// A NaN reaches its own token's outputs only, in a pass of 2 tokens and in one of 6 (the
// kernels' per-token accumulators, unrolled since session 28).
TEST(TiledMatmul, NonFiniteInputPropagates) {
  for (const auto* ks : kernel_sets())
    for (GgmlType t : {GgmlType::kQ8_0, GgmlType::kQ4_1})
      for (int64_t n_tok : {2, 6}) {
        const Pair p = make_pair(t, 16, 64, 2);
        auto x = random_x(n_tok, 64, 3);
        x[64 + 40] = NAN;
        const auto y = run(*ks, p.tiles, x, n_tok, nullptr);
        for (int64_t tk = 0; tk < n_tok; ++tk)
          for (int64_t r = 0; r < 16; ++r) {
            const float v = y[static_cast<size_t>(tk * 16 + r)];
            EXPECT_EQ(std::isnan(v), tk == 1)
                << ks->name << " " << model::type_name(t) << " n_tok=" << n_tok << " token " << tk;
            if (tk != 1) {
              EXPECT_TRUE(std::isfinite(v));
            }
          }
      }
}

// A block whose largest value is below 127 / FLT_MAX would scale to infinity: it quantizes to
// zeros on every path (once undefined behaviour in the scalar path), so the products stay
// finite and every path gives the scalar tile kernel's bits.
TEST(TiledMatmul, TinyBlocksQuantizeToZeroOnEveryPath) {
  const auto sets = kernel_sets();
  const Pair p = make_pair(GgmlType::kQ4_0, 16, 96, 4);
  auto x = random_x(2, 96, 5);
  for (int k = 32; k < 64; ++k) x[static_cast<size_t>(k)] = 1e-38f * static_cast<float>(k % 3);
  const auto want = run(*sets.back(), p.tiles, x, 2, nullptr);
  for (float v : want) EXPECT_TRUE(std::isfinite(v));
  for (const auto* ks : sets) {
    EXPECT_TRUE(same_bits(run(*ks, p.tiles, x, 2, nullptr), want)) << ks->name;
    const auto rows = run(*ks, p.rows, x, 2, nullptr);
    for (size_t i = 0; i < rows.size(); ++i) EXPECT_TRUE(std::isfinite(rows[i])) << ks->name;
  }
}

// The SIMD kernels scale a block's integer dot with one FMA on the floats M + dot
// (ActTile32): exact for activation scales over the range a model's activations take, from
// tiny to huge, so every path gives the scalar bits there, and the products agree with the
// row kernels to rounding (a wrong magic constant or scale rounding would not).
TEST(TiledMatmul, ScalesFromTinyToHugeGiveTheScalarBits) {
  const auto sets = kernel_sets();
  for (GgmlType t :
       {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1}) {
    const Pair p = make_pair(t, 32, 256, 6);
    auto x = random_x(3, 256, 8);
    const float mag[8] = {1e-30f, 3e-12f, 1.f, 7e5f, 1e12f, 2e20f, 5e28f, 1e30f};
    for (int tk = 0; tk < 3; ++tk)
      for (int b = 0; b < 8; ++b)
        for (int k = 0; k < 32; ++k)
          x[static_cast<size_t>(tk * 256 + b * 32 + k)] *= mag[(b + tk) % 8];
    const auto want = run(*sets.back(), p.tiles, x, 3, nullptr);
    const auto rows = run(*sets.back(), p.rows, x, 3, nullptr);
    // Q4_1 and Q5_1 sum a scaled dot and an offset term of opposite signs, each rounded on its
    // own: their rounding is relative to the terms, up to ~10x the sum here.
    const bool offsets = t == GgmlType::kQ4_1 || t == GgmlType::kQ5_1;
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_TRUE(std::isfinite(want[i])) << model::type_name(t) << " element " << i;
      ASSERT_NEAR(want[i], rows[i], (offsets ? 1e-4 : 1e-5) * std::fabs(rows[i]) + 1e-30)
          << model::type_name(t) << " element " << i;
    }
    for (const auto* ks : sets)
      EXPECT_TRUE(same_bits(run(*ks, p.tiles, x, 3, nullptr), want))
          << ks->name << " " << model::type_name(t);
  }
}

// The K-quant tile kernels scale a (sub-)block's dot with one FMA on the floats M + dot, by
// d * sc and -M * d * sc, both exact for every f16 d (ActTileK, ActTileQ6K): so weight scales
// from the smallest f16 subnormal to the largest f16 give the scalar bits on every path, and
// the row kernels' products to rounding.
TEST(TiledMatmul, KQuantScalesOverTheWholeF16RangeGiveTheScalarBits) {
  const auto sets = kernel_sets();
  const float ds[] = {0x1p-24f, 3e-6f, 1e-3f, 0.5f, 7.f, 900.f, 3e4f, 65504.f};
  for (GgmlType t : {GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K}) {
    Pair p = make_pair(t, 32, cols_of(t, 8), 12);
    for (int64_t r = 0; r < 32; ++r)
      for (int64_t b = 0; b < 8; ++b) {
        const uint16_t d = model::fp32_to_fp16(ds[(r + b) % 8]);
        uint8_t* blk =
            p.rows_bytes.data() + r * p.rows.row_bytes() + b * model::row_bytes(t, model::kQK_K);
        if (t != GgmlType::kQ6_K) {  // Q4_K and Q5_K lead with d and dmin
          reinterpret_cast<model::BlockQ4_K*>(blk)->d = d;
          reinterpret_cast<model::BlockQ4_K*>(blk)->dmin = d;
        } else {
          reinterpret_cast<model::BlockQ6_K*>(blk)->d = d;
        }
      }
    p.tile_bytes = p.rows_bytes;
    model::tile_in_place(t, p.tile_bytes.data(), 32, p.rows.cols(), 1);
    p.rows.data = p.rows_bytes.data();
    p.tiles.data = p.tile_bytes.data();
    const auto x = random_x(3, p.rows.cols(), 13);
    const auto want = run(*sets.back(), p.tiles, x, 3, nullptr);
    const auto rows = run(*sets.back(), p.rows, x, 3, nullptr);
    // Per output, the error bound of the rounding the two orders differ by: a few ulps of the
    // largest term, which is a 65504-scaled block's.
    float amax = 0;
    for (float v : rows) amax = std::max(amax, std::fabs(v));
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_TRUE(std::isfinite(want[i])) << model::type_name(t) << " element " << i;
      ASSERT_NEAR(want[i], rows[i], 1e-5 * amax) << model::type_name(t) << " element " << i;
    }
    for (const auto* ks : sets) {
      EXPECT_TRUE(same_bits(run(*ks, p.tiles, x, 3, nullptr), want))
          << ks->name << " " << model::type_name(t);
      if (weight_tiles_supported() && std::string_view(ks->name).starts_with("avx512-vnni")) {
        EXPECT_TRUE(same_bits(run(*ks, p.rows, x, 3, nullptr), want))
            << ks->name << " " << model::type_name(t) << " from rows";
      }
    }
  }
}

// Every weight at its largest magnitude and every activation at +-127, so that each block's
// integer dot reaches the bound the SIMD kernels' int16 sums are sized for (16 x 15 x 127 for
// 4-bit weights, 2 x 128 x 127 for Q8_0's pairs, ...): a sum widened too late saturates, and
// its output differs from the scalar kernel's exact one. Random weights never get near it.
TEST(TiledMatmul, ExtremeValuesGiveTheScalarBits) {
  const auto sets = kernel_sets();
  const detail::KernelSet& scalar = *sets.back();
  for (GgmlType t : kInt8Types) {
    Pair p = make_pair(t, 32, cols_of(t, 3), 9);
    const bool kquant = t == GgmlType::kQ4_K || t == GgmlType::kQ5_K || t == GgmlType::kQ6_K;
    const int64_t block = model::row_bytes(t, kquant ? model::kQK_K : 32);
    const uint16_t scale = model::fp32_to_fp16(1.f / 1024);
    // Q8_0's largest products are -128 x -127; the others' weights are largest with all bits
    // set (Q6_K's group scales then read -1: 0x7F makes them 127).
    std::memset(p.rows_bytes.data(), t == GgmlType::kQ8_0 ? 0x80 : 0xFF, p.rows_bytes.size());
    for (size_t b = 0; b < p.rows_bytes.size(); b += static_cast<size_t>(block)) {
      uint8_t* blk = p.rows_bytes.data() + b;
      if (t == GgmlType::kQ6_K) {
        auto* q6 = reinterpret_cast<model::BlockQ6_K*>(blk);
        std::memset(q6->scales, 0x7F, sizeof q6->scales);
        q6->d = scale;
        continue;
      }
      std::memcpy(blk, &scale, 2);  // d (all but Q6_K lead with it)
      if (detail::blocks32_min(t) || t == GgmlType::kQ4_K || t == GgmlType::kQ5_K)
        std::memcpy(blk + 2, &scale, 2);  // m, dmin
    }
    p.tile_bytes = p.rows_bytes;
    model::tile_in_place(t, p.tile_bytes.data(), 32, p.rows.cols(), 1);
    p.rows.data = p.rows_bytes.data();
    p.tiles.data = p.tile_bytes.data();
    for (const float sign : {1.f, -1.f}) {
      for (int64_t n_tok : {1, 2, 5}) {
        const std::vector<float> x(static_cast<size_t>(n_tok * p.rows.cols()), sign);
        const auto want = run(scalar, p.tiles, x, n_tok, nullptr);
        for (float v : want) ASSERT_TRUE(std::isfinite(v)) << model::type_name(t);
        for (const auto* ks : sets)
          EXPECT_TRUE(same_bits(run(*ks, p.tiles, x, n_tok, nullptr), want))
              << ks->name << " " << model::type_name(t) << " n_tok=" << n_tok << " sign " << sign;
      }
    }
  }
}

// Which types a weight copy tiles, per SIMD level (tests/CMakeLists.txt runs this under each):
// the types whose tiles that level's kernels read fast, and only those, so that no copy falls
// to the scalar tile kernel.
TEST(TiledMatmul, WeightCopiesTileWhatTheKernelsReadFast) {
  const model::TileTypes types = tiled_weight_types();
  const std::string_view level = simd_level();
  std::vector<GgmlType> want;
  if (level == "avx512") {
    want.assign(std::begin(kFloatTypes), std::end(kFloatTypes));  // no VNNI needed
    want.insert(want.end(), std::begin(kNibbleTypes), std::end(kNibbleTypes));
    if (weight_tiles_supported())
      want.insert(want.end(), std::begin(kInt8Types), std::end(kInt8Types));
  } else if (level == "avx2") {
    want.assign(std::begin(kInt8Types), std::end(kInt8Types));
    want.push_back(GgmlType::kI4_PACKED);  // the AVX-512 layout, read in halves
    want.push_back(GgmlType::kF8_E4M3);    // and in 8-column halves of its quads' chunks
  }
  std::vector<GgmlType> all(std::begin(kInt8Types), std::end(kInt8Types));
  all.insert(all.end(), std::begin(kFloatTypes), std::end(kFloatTypes));
  all.insert(all.end(), std::begin(kNibbleTypes), std::end(kNibbleTypes));
  for (GgmlType t : all) {
    const bool wanted = std::find(want.begin(), want.end(), t) != want.end();
    EXPECT_EQ(types.has(t), wanted) << level << " " << model::type_name(t);
    EXPECT_TRUE(model::TileTypes::all().has(t)) << model::type_name(t);
  }
  EXPECT_FALSE(types.has(GgmlType::kF32));
  EXPECT_FALSE(types.has(GgmlType::kIQ4_NL));
}

TEST(TiledMatmul, GetRowReadsTiles) {
  std::vector<GgmlType> types(std::begin(kInt8Types), std::end(kInt8Types));
  types.insert(types.end(), std::begin(kFloatTypes), std::end(kFloatTypes));
  types.insert(types.end(), std::begin(kNibbleTypes), std::end(kNibbleTypes));
  for (GgmlType t : types) {
    const Pair p = make_pair(t, 32, cols_of(t, 3), 9);
    std::vector<float> a(static_cast<size_t>(p.rows.cols())), b(a.size());
    for (int64_t r = 0; r < 32; ++r) {
      get_row(p.rows, r, a.data());
      get_row(p.tiles, r, b.data());
      ASSERT_EQ(a, b) << model::type_name(t) << " row " << r;
    }
  }
}

// --- a model copied with tiles ---

// A view inside a larger view (here a Q8_0 matrix inside an f32 tensor, with another small view
// between them in address order) is never tiled: that would scramble the larger view's bytes.
// The copy leaves its source intact (anonymous memory, as a converting loader makes).
TEST(WeightTiles, ACopyTilesNoViewInsideAnother) {
  auto m = std::make_shared<model::Model>();
  m->path = "test";
  const int64_t q8_row = model::row_bytes(GgmlType::kQ8_0, 32);  // 34
  auto buf = std::make_shared<std::vector<uint8_t>>(65536);
  std::mt19937 rng(3);
  for (auto& b : *buf) b = static_cast<uint8_t>(rng());
  for (int64_t r = 0; r < 16; ++r) {  // sane f16 scales for both Q8_0 views
    const uint16_t d = model::fp32_to_fp16(0.01f);
    std::memcpy(buf->data() + r * q8_row, &d, 2);
    std::memcpy(buf->data() + 4096 + r * q8_row, &d, 2);
  }
  const std::vector<uint8_t> before = *buf;
  m->storage.push_back(buf);
  model::ModelSpec& spec = m->spec;
  spec.token_embd.name = "big";
  spec.token_embd.type = GgmlType::kF32;
  spec.token_embd.ne[0] = 64;
  spec.token_embd.ne[1] = 256;  // 64 KiB: holds both matrices below
  spec.token_embd.data = buf->data();
  model::LayerSpec L;
  L.wq.name = "first";
  L.wq.type = GgmlType::kQ8_0;
  L.wq.ne[0] = 32;
  L.wq.ne[1] = 16;
  L.wq.data = buf->data();
  L.wk = L.wq;
  L.wk.name = "inside";
  L.wk.data = buf->data() + 4096;
  L.wv.name = "between";  // the group just before "inside", ending well before it
  L.wv.type = GgmlType::kF32;
  L.wv.ne[0] = 64;
  L.wv.data = buf->data() + 2048;
  spec.layers.push_back(L);
  auto copy = model::copy_weights_to_memory(m, {}, 2, model::TileTypes::all());
  ASSERT_TRUE(copy.has_value()) << copy.error().message;
  model::for_each_weight((*copy)->spec, [&](const WeightView& w) {
    EXPECT_EQ(w.layout, WeightLayout::kRows) << w.name << " lies inside another view";
  });
  const auto& big = (*copy)->spec.token_embd;
  EXPECT_EQ(std::memcmp(big.data, before.data(), before.size()), 0) << "the copy changed";
  EXPECT_EQ(*buf, before) << "the source changed";
}

// F8_E4M3 tiles are read without a NaN test, with 2^120 * scale, and their subnormal codes as f32
// subnormals (matmul_float_avx512.h): a copy tiles an F8 matrix only where no code is NaN's, no
// scale reaches 256 and at most one code in 4096 is subnormal (model::f8_tiles_suit), and every
// matrix reads back the same values either way.
TEST(WeightTiles, F8CopiesTileOnlyMatricesTheTileKernelsSuit) {
  auto m = std::make_shared<model::Model>();
  m->path = "test";
  constexpr int64_t kRows = 16, kCols = 256, kN = kRows * kCols;  // 4096 values each
  constexpr int kViews = 5;
  auto codes = std::make_shared<std::vector<uint8_t>>(kViews * kN);
  auto scales = std::make_shared<std::vector<float>>(2 * kViews);  // 1 x 2 blocks per matrix
  // Codes as a checkpoint's: values up to the block's largest, rounded (no subnormal code: the
  // smallest normal is 2^-6 of 448, and none of these values is that small but 0).
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> uni(-448.f, 448.f);
  for (auto& b : *codes) {
    float v = uni(rng);
    if (std::fabs(v) < 1.f) v = 0;
    b = model::fp32_to_fp8_e4m3(v);
  }
  for (size_t i = 0; i < scales->size(); ++i) (*scales)[i] = 0.01f * static_cast<float>(i + 1);
  uint8_t* at[kViews];
  for (int i = 0; i < kViews; ++i) at[i] = codes->data() + i * kN;
  at[0][100] = 0x05;              // one subnormal code in 4096: allowed
  at[1][5 * kCols + 17] = 0xff;   // a NaN code in row 5
  (*scales)[2 * 2 + 1] = -256.f;  // too large a scale
  (*scales)[3 * 2 + 0] = std::numeric_limits<float>::infinity();  // not finite, allowed
  at[4][7] = 0x81;  // two subnormal codes in 4096: too many
  at[4][4000] = 0x07;
  m->storage.push_back(codes);
  m->storage.push_back(scales);
  model::LayerSpec L;
  WeightView* views[kViews] = {&L.wq, &L.wk, &L.wv, &L.wo, &L.ffn_gate};
  const char* names[kViews] = {"clean", "nan code", "scale 256", "infinite scale", "subnormals"};
  for (int i = 0; i < kViews; ++i) {
    WeightView& v = *views[i];
    v.name = names[i];
    v.type = GgmlType::kF8_E4M3;
    v.ne[0] = kCols;
    v.ne[1] = kRows;
    v.data = at[i];
    v.scales = scales->data() + 2 * i;
    v.scale_block[0] = kRows;
    v.scale_block[1] = 128;
    v.scale_stride = 2;
  }
  const bool want_tiles[kViews] = {true, false, false, true, false};
  for (int i = 0; i < kViews; ++i)
    EXPECT_EQ(model::f8_tiles_suit(*views[i]), want_tiles[i]) << names[i];
  (*scales)[2 * 2 + 1] = -255.99f;
  EXPECT_TRUE(model::f8_tiles_suit(L.wv)) << "a scale just under 256";
  (*scales)[2 * 2 + 1] = -256.f;
  at[4][4000] = 0x08;  // the smallest normal
  EXPECT_TRUE(model::f8_tiles_suit(L.ffn_gate)) << "one subnormal code";
  at[4][4000] = 0x07;
  // A view whose bytes are not whole 8-byte words (read 8 at a time, then one at a time).
  std::vector<uint8_t> odd(12, 0x40);
  const float odd_scale = 1.f;
  WeightView v12 = L.wq;
  v12.ne[0] = 12;
  v12.ne[1] = 1;
  v12.data = odd.data();
  v12.scales = &odd_scale;
  EXPECT_TRUE(model::f8_tiles_suit(v12));
  odd[10] = 0x7f;
  EXPECT_FALSE(model::f8_tiles_suit(v12)) << "a NaN code in the last word's tail";
  odd[10] = 0x40;
  odd[11] = 0x83;
  EXPECT_FALSE(model::f8_tiles_suit(v12)) << "a subnormal code in the last word's tail";
  m->spec.layers.push_back(L);
  auto copy = model::copy_weights_to_memory(m, {}, 2, model::TileTypes::all());
  ASSERT_TRUE(copy.has_value()) << copy.error().message;
  const model::LayerSpec& C = (*copy)->spec.layers[0];
  const WeightView* copied[kViews] = {&C.wq, &C.wk, &C.wv, &C.wo, &C.ffn_gate};
  std::vector<float> a(kCols), b(kCols);
  for (int i = 0; i < kViews; ++i) {
    EXPECT_NE(copied[i]->data, views[i]->data) << names[i] << ": copied";
    EXPECT_EQ(copied[i]->layout == WeightLayout::kTiles16, want_tiles[i]) << names[i];
    for (int64_t r = 0; r < kRows; ++r) {
      get_row(*views[i], r, a.data());
      get_row(*copied[i], r, b.data());
      ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
          << names[i] << " row " << r;
    }
  }
}

struct ModelCase {
  const char* arch;
  GgmlType dtype;
};

class TiledModel : public ::testing::TestWithParam<ModelCase> {};

TEST_P(TiledModel, SameLogitsAsMappedAndBatchInvariant) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("troupe_tiles_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const GgmlType dtype = GetParam().dtype;
  const bool k_quant =
      dtype == GgmlType::kQ4_K || dtype == GgmlType::kQ5_K || dtype == GgmlType::kQ6_K;
  const std::string path =
      (dir / (std::string(GetParam().arch) + "-" + model::type_name(dtype) + ".gguf")).string();
  model::SynthOptions so;
  so.arch = GetParam().arch;
  so.n_embd = k_quant ? 256 : 128;  // rows of whole K-quant super-blocks
  so.n_layer = 2;
  so.n_head = 4;
  so.n_head_kv = 2;
  so.n_ff = 2 * *so.n_embd;
  if (so.arch == "mixtral") {
    so.n_expert = 4;
    so.n_expert_used = 2;
  }
  so.n_vocab = 300;  // an output head of 300 rows: not whole tiles, stays in rows
  so.dtype = dtype;
  so.num_threads = 2;
  auto made = model::synth_model_summary(so, path);
  ASSERT_TRUE(made.has_value()) << made.error().message;
  auto loaded = model::load_model(path);
  ASSERT_TRUE(loaded.has_value()) << loaded.error().message;
  auto mapped = *loaded;
  auto tiled = model::copy_weights_to_memory(mapped, {}, 2, model::TileTypes::all());
  ASSERT_TRUE(tiled.has_value()) << tiled.error().message;
  int n_tiled = 0, n_rows_int8 = 0;
  model::for_each_weight((*tiled)->spec, [&](const WeightView& w) {
    if (!w.present()) return;
    if (w.layout == WeightLayout::kTiles16) {
      ++n_tiled;
      EXPECT_EQ(w.rows() % 16, 0) << w.name;
    } else if (w.type == dtype) {
      ++n_rows_int8;
      EXPECT_NE(w.rows() % 16, 0) << w.name << " could have been tiled";
    }
  });
  EXPECT_GT(n_tiled, 0);
  EXPECT_GT(n_rows_int8, 0) << "the 300-row head (and the embedding it shares) stays in rows";
  // Without tiles asked, nothing is tiled.
  auto plain = model::copy_weights_to_memory(mapped, {}, 2, model::TileTypes{});
  ASSERT_TRUE(plain.has_value());
  model::for_each_weight((*plain)->spec, [&](const WeightView& w) {
    EXPECT_EQ(w.layout, WeightLayout::kRows) << w.name;
  });

  std::mt19937 rng(5);
  std::vector<std::vector<int32_t>> prompts(3);
  for (size_t i = 0; i < prompts.size(); ++i) {
    prompts[i].resize(7 + 5 * i);
    for (auto& t : prompts[i]) t = static_cast<int32_t>(rng() % 300);
  }
  const auto want = batch_logits(mapped, {prompts[1]}, 0);
  const auto alone = batch_logits(*tiled, {prompts[1]}, 0);
  const auto batched = batch_logits(*tiled, prompts, 1);
  ASSERT_FALSE(want.empty());
  ASSERT_EQ(alone.size(), want.size());
  // Every tiled matrix gives its mapped twin's products to float rounding.
  std::vector<const WeightView*> before, after;
  model::for_each_weight(mapped->spec, [&](const WeightView& w) { before.push_back(&w); });
  model::for_each_weight((*tiled)->spec, [&](const WeightView& w) { after.push_back(&w); });
  ASSERT_EQ(before.size(), after.size());
  ThreadPool pool(2);
  for (size_t i = 0; i < before.size(); ++i) {
    if (after[i]->layout != WeightLayout::kTiles16) continue;
    for (int64_t m = 0; m < after[i]->ne[2]; ++m) {
      const WeightView a = before[i]->slice(m), b = after[i]->slice(m);
      const auto x = random_x(12, a.cols(), 1);
      std::vector<float> ya(static_cast<size_t>(12 * a.rows())), yb(ya.size());
      matmul(a, x.data(), 12, ya.data(), &pool);
      matmul(b, x.data(), 12, yb.data(), &pool);
      float amax = 0;
      for (float v : ya) amax = std::max(amax, std::fabs(v));
      for (size_t k = 0; k < ya.size(); ++k) ASSERT_NEAR(ya[k], yb[k], 1e-6f * amax) << a.name;
    }
  }
  // Where this SIMD level's weight copies tile the type (tiled_weight_types: AVX-512 VNNI every
  // type, AVX2 the int8 ones, AVX-512 without VNNI F16 and BF16), its row kernels share their
  // tiles' arithmetic: the same logits, bit for bit. Elsewhere (only this test makes tiles there)
  // the last-bit differences can move a hidden value across an int8 activation step, which moves
  // the next products by ~1/127 of their scale (the llama case, rows on AVX-512 VNNI before
  // session 12: mean 1.2e-3, max 9e-3 of the largest logit): so the whole model agrees to int8
  // steps.
  double amax = 0, err = 0, sum = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    amax = std::max(amax, static_cast<double>(std::fabs(want[i])));
    err = std::max(err, static_cast<double>(std::fabs(alone[i] - want[i])));
    sum += std::fabs(alone[i] - want[i]);
  }
  if (tiled_weight_types().has(dtype)) {
    EXPECT_TRUE(same_bits(alone, want))
        << simd_level() << ": tiled against mapped logits: max diff " << err;
  } else {
    EXPECT_LE(err, 3e-2 * amax) << "tiled against mapped logits";
    EXPECT_LE(sum / static_cast<double>(want.size()), 4e-3 * amax) << "tiled against mapped logits";
  }
  EXPECT_TRUE(same_bits(alone, batched)) << "a sequence's logits alone and in a batch";
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Archs, TiledModel,
    ::testing::Values(ModelCase{"llama", GgmlType::kQ4_0}, ModelCase{"mixtral", GgmlType::kQ4_0},
                      ModelCase{"llama", GgmlType::kQ4_1}, ModelCase{"llama", GgmlType::kQ5_0},
                      ModelCase{"mixtral", GgmlType::kQ5_1}, ModelCase{"llama", GgmlType::kQ4_K},
                      ModelCase{"llama", GgmlType::kQ5_K}, ModelCase{"mixtral", GgmlType::kQ5_K},
                      ModelCase{"llama", GgmlType::kQ6_K}, ModelCase{"mixtral", GgmlType::kQ6_K},
                      ModelCase{"llama", GgmlType::kF16}, ModelCase{"mixtral", GgmlType::kBF16}),
    [](const ::testing::TestParamInfo<ModelCase>& p) {
      return std::string(p.param.arch) + "_" + model::type_name(p.param.dtype);
    });

}  // namespace
}  // namespace troupe::compute
