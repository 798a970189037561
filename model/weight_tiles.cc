// 16-row tiles of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, F16, BF16, F8_E4M3, I4_PACKED
// and FP4_PACKED matrices (see weight_tiles.h for the layout).
#include "model/weight_tiles.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/check.h"

namespace troupe::model {
namespace {

// How a block is laid out in a tile: its 16-bit fields (scales), each as 16 rows' values, and
// the rest of the block as dwords, each as a 64-byte chunk of the 16 rows'. All but Q6_K lead with
// their fields, and a record is the fields, then the chunks. Q6_K's one field (d)
// trails its 208 other bytes (52 chunks, a whole number of cache lines): its records are the
// chunks alone, and the tile's d values follow its last record, 32 bytes per block column.
struct BlockShape {
  int64_t bytes;
  int64_t n16;  // 16-bit fields (Q4_0, Q5_0, Q8_0, Q6_K: d; Q4_1, Q5_1: d, m; Q4_K, Q5_K: d, dmin)
  bool trailing;    // the fields end the block (Q6_K) rather than start it
  uint8_t flip;     // XORed into every chunk byte (Q8_0: int8 -> q + 128)
  bool q5 = false;  // chunk 0 is a qh word, stored in q5_tile_qh's bit order (Q5_0, Q5_1)
  int64_t chunks() const { return (bytes - 2 * n16) / 4; }
  // Where a block's fields and chunks sit, in the block and in a tile of nb records.
  int64_t block_field(int64_t f) const { return (trailing ? 4 * chunks() : 0) + 2 * f; }
  int64_t block_chunk(int64_t c) const { return (trailing ? 0 : 2 * n16) + 4 * c; }
  int64_t record_bytes() const { return trailing ? 64 * chunks() : kTileRows * bytes; }
  int64_t tile_field(int64_t nb, int64_t b, int64_t f) const {
    return trailing ? nb * record_bytes() + 2 * kTileRows * (b * n16 + f)
                    : b * record_bytes() + 2 * kTileRows * f;
  }
  int64_t tile_chunk(int64_t b, int64_t c) const {
    return b * record_bytes() + (trailing ? 0 : 2 * kTileRows * n16) + 64 * c;
  }
};

BlockShape shape_of(GgmlType t) {
  switch (t) {
    case GgmlType::kQ4_0:
      return {static_cast<int64_t>(sizeof(BlockQ4_0)), 1, false, 0};
    case GgmlType::kQ4_1:
      return {static_cast<int64_t>(sizeof(BlockQ4_1)), 2, false, 0};
    case GgmlType::kQ5_0:
      return {static_cast<int64_t>(sizeof(BlockQ5_0)), 1, false, 0, true};
    case GgmlType::kQ5_1:
      return {static_cast<int64_t>(sizeof(BlockQ5_1)), 2, false, 0, true};
    case GgmlType::kQ8_0:
      return {static_cast<int64_t>(sizeof(BlockQ8_0)), 1, false, 0x80};
    case GgmlType::kQ4_K:
      return {static_cast<int64_t>(sizeof(BlockQ4_K)), 2, false, 0};
    case GgmlType::kQ5_K:
      return {static_cast<int64_t>(sizeof(BlockQ5_K)), 2, false, 0};
    case GgmlType::kQ6_K:
      return {static_cast<int64_t>(sizeof(BlockQ6_K)), 1, true, 0};
    default:
      TROUPE_CHECK(false, "weight tiles: type %s has no tiled form", type_name(t).c_str());
  }
  return {};
}

// One tile: 16 rows of nb blocks at `rows` (row stride row_bytes) into `out`.
void tile_one(const BlockShape& s, const uint8_t* rows, int64_t row_bytes, int64_t nb,
              uint8_t* out) {
  for (int64_t b = 0; b < nb; ++b) {
    for (int64_t i = 0; i < kTileRows; ++i) {
      const uint8_t* blk = rows + i * row_bytes + b * s.bytes;
      for (int64_t f = 0; f < s.n16; ++f)
        std::memcpy(out + s.tile_field(nb, b, f) + 2 * i, blk + s.block_field(f), 2);
      for (int64_t c = 0; c < s.chunks(); ++c)
        for (int k = 0; k < 4; ++k)
          out[s.tile_chunk(b, c) + 4 * i + k] = blk[s.block_chunk(c) + k] ^ s.flip;
      if (s.q5) {
        uint8_t* qh = out + s.tile_chunk(b, 0) + 4 * i;
        uint32_t h;
        std::memcpy(&h, qh, 4);
        h = q5_tile_qh(h);
        std::memcpy(qh, &h, 4);
      }
    }
  }
}

// Where bit v of a Q5 qh word goes in the tile's order: value v = 16h + 4c + k (h, c, k as in
// weight_tiles.h) to bit 8k + 4h + c; and back.
constexpr int q5_tile_bit(int v) { return 8 * (v % 4) + (v < 16 ? 0 : 4) + v % 16 / 4; }
constexpr int q5_untile_bit(int p) { return 16 * (p % 8 / 4) + 4 * (p % 4) + p / 8; }

// The bit permutation for each byte of a word on its own (it moves bits, so the word's image is
// the OR of its bytes' images): 4 lookups per word instead of 32 bit moves, for every Q5 block
// a weight copy tiles.
struct Q5QhTables {
  uint32_t tile[4][256], untile[4][256];
  constexpr Q5QhTables() : tile(), untile() {
    for (int byte = 0; byte < 4; ++byte) {
      for (int x = 0; x < 256; ++x) {
        for (int i = 0; i < 8; ++i) {
          if ((x >> i & 1) == 0) continue;
          tile[byte][x] |= uint32_t{1} << q5_tile_bit(8 * byte + i);
          untile[byte][x] |= uint32_t{1} << q5_untile_bit(8 * byte + i);
        }
      }
    }
  }
};
constexpr Q5QhTables kQ5Qh;
static_assert([] {
  for (int v = 0; v < 32; ++v)
    if (q5_untile_bit(q5_tile_bit(v)) != v) return false;
  return true;
}());

uint32_t permute_bytes(const uint32_t (&table)[4][256], uint32_t x) {
  return table[0][x & 0xFF] | table[1][x >> 8 & 0xFF] | table[2][x >> 16 & 0xFF] |
         table[3][x >> 24];
}

bool float_tiled(GgmlType t) {
  return t == GgmlType::kF16 || t == GgmlType::kBF16 || t == GgmlType::kF8_E4M3;
}
bool nibble_tiled(GgmlType t) { return t == GgmlType::kI4_PACKED || t == GgmlType::kFP4_PACKED; }

// An 8 x 8 matrix of nibbles, row i in r[i] (element j at bits 4j), transposed in place: the
// 4 x 4 blocks swapped, then the 2 x 2 blocks in each, then the nibbles in each.
void transpose_nibbles8(uint32_t (&r)[8]) {
  const auto swap = [&](int a, int b, int shift, uint32_t mask) {
    const uint32_t t = ((r[a] >> shift) ^ r[b]) & mask;
    r[a] ^= t << shift;
    r[b] ^= t;
  };
  for (int i = 0; i < 4; ++i) swap(i, i + 4, 16, 0x0000FFFFu);
  for (int i : {0, 1, 4, 5}) swap(i, i + 2, 8, 0x00FF00FFu);
  for (int i : {0, 2, 4, 6}) swap(i, i + 1, 4, 0x0F0F0F0Fu);
}

// I4_PACKED and FP4_PACKED: a row's 64-byte group (128 values) from the file's order (value 16s + d
// at nibble d of 8-byte word s) to the tiles' (nibble s of dword d), or back. As nibble matrices,
// the words are 8 rows of 16 and the dwords 16 rows of 8: the two orders are each other's
// transposes, done as two 8 x 8 transposes (d < 8 and d >= 8). A nibble at a time, tiling ran at
// 0.25 GB/s, which a weight copy of a large int4 model would wait for; this way at 2 GB/s.
void nibble_group(const uint8_t* in, uint8_t* out, bool to_tiles) {
  uint32_t a[16], b[16];
  std::memcpy(a, in, sizeof a);
  for (int h = 0; h < 2; ++h) {
    uint32_t r[8];
    // Rows: word s's dword h (to tiles); or dword 8h + d (back).
    for (int i = 0; i < 8; ++i) r[i] = to_tiles ? a[2 * i + h] : a[8 * h + i];
    transpose_nibbles8(r);
    for (int i = 0; i < 8; ++i) (to_tiles ? b[8 * h + i] : b[2 * i + h]) = r[i];
  }
  std::memcpy(out, b, sizeof b);
}

// F16, BF16 and F8_E4M3: row i (0-15) of a tile is row i % 4 of quad i / 4, whose 4 rows take 4 *
// row_bytes bytes from the tile's start plus 4 * row_bytes * (i / 4); in a quad, chunk c
// (columns 16c..16c+15, `chunk` = 16 values' bytes per row: 32, or 16 for F8) of row i % 4 is
// at 4 chunk c + chunk (i % 4).
constexpr int64_t kQuadRows = 4;
int64_t float_chunk_bytes(GgmlType t) { return t == GgmlType::kF8_E4M3 ? 16 : 32; }
int64_t quad_chunk(int64_t row_bytes, int64_t chunk, int64_t i, int64_t c) {
  return i / kQuadRows * kQuadRows * row_bytes + kQuadRows * chunk * c + chunk * (i % kQuadRows);
}

// I4_PACKED and FP4_PACKED: where group g (columns 128g..128g+127) of row i (0-3) of a quad
// sits in the quad.
int64_t nibble_quad_group(int64_t i, int64_t g) { return kQuadRows * 64 * g + 64 * i; }

}  // namespace

uint32_t q5_tile_qh(uint32_t h) { return permute_bytes(kQ5Qh.tile, h); }
uint32_t q5_untile_qh(uint32_t t) { return permute_bytes(kQ5Qh.untile, t); }

TileTypes TileTypes::all() {
  TileTypes s;
  for (GgmlType t :
       {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0,
        GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kF16, GgmlType::kBF16,
        GgmlType::kF8_E4M3, GgmlType::kI4_PACKED, GgmlType::kFP4_PACKED})
    s.add(t);
  return s;
}

bool tileable(const WeightView& w) {
  const bool int8 = w.type == GgmlType::kQ4_0 || w.type == GgmlType::kQ4_1 ||
                    w.type == GgmlType::kQ5_0 || w.type == GgmlType::kQ5_1 ||
                    w.type == GgmlType::kQ8_0 || w.type == GgmlType::kQ4_K ||
                    w.type == GgmlType::kQ5_K || w.type == GgmlType::kQ6_K;
  const bool floats = float_tiled(w.type) && w.cols() % kFloatTileCols == 0;
  const bool nibbles = nibble_tiled(w.type) && w.cols() % kNibbleTileCols == 0;
  return w.present() && w.layout == WeightLayout::kRows && (int8 || floats || nibbles) &&
         w.rows() > 0 && w.rows() % kTileRows == 0 && w.cols() > 0;
}

bool f8_tiles_suit(const WeightView& w) {
  if (w.type != GgmlType::kF8_E4M3 || !w.present() || w.scales == nullptr) return false;
  // 8 codes at a time, each byte's 7 magnitude bits m (no carry crosses a byte below): m + 1
  // reaches bit 7 for the NaN code alone; the exponent bits (m & 0x78) + 0x78 reach it unless
  // they are 0, and the mantissa bits (m & 0x07) + 0x7f unless they are 0: a subnormal code.
  constexpr uint64_t kLow7 = 0x7f7f7f7f7f7f7f7fULL, kOnes = 0x0101010101010101ULL,
                     kHigh = 0x8080808080808080ULL, kExp = 0x7878787878787878ULL,
                     kMan = 0x0707070707070707ULL;
  const uint64_t n = w.nbytes();
  uint64_t i = 0, nan = 0, subnormals = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v;
    std::memcpy(&v, w.data + i, 8);
    const uint64_t m = v & kLow7;
    nan |= (m + kOnes) & kHigh;
    subnormals +=
        static_cast<uint64_t>(std::popcount(~((m & kExp) + kExp) & ((m & kMan) + kLow7) & kHigh));
  }
  for (; i < n; ++i) {
    const unsigned m = w.data[i] & 0x7fu;
    nan |= m == 0x7fu;
    subnormals += m != 0 && m < 8;
  }
  if (nan != 0 || subnormals * kF8TileSubnormalShare > n) return false;
  const int64_t n_scales = w.ne[2] * w.scale_grid_rows() * w.scale_stride;
  std::vector<float> sc(static_cast<size_t>(n_scales));
  scales_to_f32(w.scales, w.scale_type, n_scales, sc.data(), w.scale_mul, w.scale_div);
  for (const float v : sc)
    if (std::isfinite(v) && std::fabs(v) >= kF8TileScaleLimit) return false;
  return true;
}

void tile_in_place(GgmlType type, uint8_t* data, int64_t rows, int64_t cols, int64_t n_mat) {
  if (nibble_tiled(type)) {
    TROUPE_CHECK(rows % kTileRows == 0 && cols % kNibbleTileCols == 0, "weight tiles: %lld x %lld",
                 static_cast<long long>(rows), static_cast<long long>(cols));
    const int64_t row_bytes = cols / 2, groups = cols / kNibbleTileCols;
    std::vector<uint8_t> copy(static_cast<size_t>(kQuadRows * row_bytes));
    for (int64_t q = 0; q < n_mat * rows / kQuadRows; ++q) {
      uint8_t* quad = data + q * kQuadRows * row_bytes;
      std::memcpy(copy.data(), quad, copy.size());
      for (int64_t i = 0; i < kQuadRows; ++i)
        for (int64_t g = 0; g < groups; ++g)
          nibble_group(copy.data() + i * row_bytes + 64 * g, quad + nibble_quad_group(i, g), true);
    }
    return;
  }
  if (float_tiled(type)) {
    TROUPE_CHECK(rows % kTileRows == 0 && cols % kFloatTileCols == 0, "weight tiles: %lld x %lld",
                 static_cast<long long>(rows), static_cast<long long>(cols));
    const int64_t chunk = float_chunk_bytes(type), row_bytes = cols / kFloatTileCols * chunk,
                  tile_bytes = kTileRows * row_bytes;
    std::vector<uint8_t> copy(static_cast<size_t>(tile_bytes));
    for (int64_t t = 0; t < n_mat * rows / kTileRows; ++t) {
      uint8_t* tile = data + t * tile_bytes;
      std::memcpy(copy.data(), tile, copy.size());
      for (int64_t i = 0; i < kTileRows; ++i)
        for (int64_t c = 0; c < cols / kFloatTileCols; ++c)
          std::memcpy(tile + quad_chunk(row_bytes, chunk, i, c),
                      copy.data() + i * row_bytes + c * chunk, static_cast<size_t>(chunk));
    }
    return;
  }
  const BlockShape s = shape_of(type);
  const int64_t elems = type_traits(static_cast<uint32_t>(type))->block_elems;
  TROUPE_CHECK(rows % kTileRows == 0 && cols % elems == 0, "weight tiles: %lld x %lld",
               static_cast<long long>(rows), static_cast<long long>(cols));
  const int64_t row_bytes = cols / elems * s.bytes, tile_bytes = kTileRows * row_bytes;
  std::vector<uint8_t> copy(static_cast<size_t>(tile_bytes));
  for (int64_t t = 0; t < n_mat * rows / kTileRows; ++t) {
    uint8_t* tile = data + t * tile_bytes;
    std::memcpy(copy.data(), tile, copy.size());
    tile_one(s, copy.data(), row_bytes, cols / elems, tile);
  }
}

void untile_row(GgmlType type, const uint8_t* tile, int64_t row_bytes, int64_t i, uint8_t* out) {
  if (nibble_tiled(type)) {
    const uint8_t* quad = tile + i / kQuadRows * kQuadRows * row_bytes;
    for (int64_t g = 0; g < row_bytes / 64; ++g)
      nibble_group(quad + nibble_quad_group(i % kQuadRows, g), out + 64 * g, false);
    return;
  }
  if (float_tiled(type)) {
    const int64_t chunk = float_chunk_bytes(type);
    for (int64_t c = 0; c < row_bytes / chunk; ++c)
      std::memcpy(out + c * chunk, tile + quad_chunk(row_bytes, chunk, i, c),
                  static_cast<size_t>(chunk));
    return;
  }
  const BlockShape s = shape_of(type);
  const int64_t nb = row_bytes / s.bytes;
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* blk = out + b * s.bytes;
    for (int64_t f = 0; f < s.n16; ++f)
      std::memcpy(blk + s.block_field(f), tile + s.tile_field(nb, b, f) + 2 * i, 2);
    for (int64_t c = 0; c < s.chunks(); ++c)
      for (int k = 0; k < 4; ++k)
        blk[s.block_chunk(c) + k] = tile[s.tile_chunk(b, c) + 4 * i + k] ^ s.flip;
    if (s.q5) {
      uint8_t* qh = blk + s.block_chunk(0);
      uint32_t h;
      std::memcpy(&h, qh, 4);
      h = q5_untile_qh(h);
      std::memcpy(qh, &h, 4);
    }
  }
}

void untile_row(const WeightView& w, int64_t mat, int64_t r, uint8_t* out) {
  TROUPE_CHECK(
      w.layout == WeightLayout::kTiles16 && r >= 0 && r < w.rows() && mat >= 0 && mat < w.ne[2],
      "weight tiles: row %lld of matrix %lld of %s", static_cast<long long>(r),
      static_cast<long long>(mat), w.name.c_str());
  const int64_t row_bytes = w.row_bytes();
  untile_row(w.type, w.data + mat * w.rows() * row_bytes + r / kTileRows * kTileRows * row_bytes,
             row_bytes, r % kTileRows, out);
}

}  // namespace troupe::model
