// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, F16, BF16, F8_E4M3, I4_PACKED and FP4_PACKED
// matrices in 16-row tiles (WeightLayout::kTiles16), the in-memory order the CPU kernels read
// fastest. Int8 types: one 64-byte load gives 4 columns of 16 rows, so one dot-product instruction
// serves 16
// output rows at once and a block's scaling is done once for 16 rows
// (compute/matmul_tiles*_avx512.cc; docs/benchmarks.md "Engine, session 12"); with AVX2, one
// 32-byte half gives 4 columns of 8 rows (compute/matmul_tiles*_avx2.cc, "Engine, session 39").
//
// A matrix of R rows (R a multiple of 16) and nb blocks per row becomes R/16 tiles, tile t
// holding rows 16t..16t+15 in the same bytes those rows took. A tile is nb records, one per
// block column b, each 16 * sizeof(block) bytes:
//   - the block's leading f16 fields, each as 16 rows' values (32 bytes): Q4_0, Q5_0 and Q8_0
//     d; Q4_1 and Q5_1 d, then m; Q4_K and Q5_K d, then dmin;
//   - then the rest of the block as 64-byte chunks: chunk c holds, for row i = 0..15 at bytes
//     4i..4i+3, the row's block bytes [4c, 4c+4) after those fields. Q4_0: 4 chunks of qs (low
//     nibbles are values 0-15, high nibbles 16-31). Q8_0: 8 chunks of qs, each byte stored as
//     (uint8_t)(q ^ 0x80), i.e. q + 128, the unsigned operand of an unsigned-by-signed dot
//     product. Q4_1: 4 chunks of qs, as Q4_0. Q5_0 and Q5_1: 1 chunk of qh, then 4 of qs; each
//     row's qh word with its bits reordered (q5_tile_qh) so that byte k holds at bit c the fifth
//     bit of value 4c + k and at bit 4 + c that of value 16 + 4c + k (c, k < 4): one shift puts
//     the bits of a chunk's 4 values at bit 4 of their bytes. Q4_K: 3 chunks of packed scales
//     and mins, then 32 chunks of qs. Q5_K: 3 chunks of scales and mins, 8 of qh, then 32 of qs.
//   Q6_K, whose d ends its block, differs: a record is its 52 chunks alone (ql 32, qh 16,
//   scales 4; 3328 bytes, whole cache lines), and the tile's d values follow its last record,
//   32 bytes per block column in column order.
// F16 and BF16 (the float kernels read 4 rows at a time, compute/detail/matmul_float_avx512.h)
// have no records: a tile is 4 quads of 4 rows, each quad in its 4 rows' bytes, and a quad holds
// its rows 16 columns (32 bytes) at a time: columns 16c..16c+15 of its rows 0-3 are the 128
// bytes at 128c. Batch-1 decode then reads one stream instead of 4 rows in 4 places (60 % of
// the read bandwidth; docs/benchmarks.md "Engine, session 31"). Columns a multiple of 16.
// F8_E4M3 is in quads too, 16 columns (16 bytes per row, one cache line per quad) at a time,
// and only where no value is the NaN code, no scale reaches 256 in magnitude and subnormal codes
// are rare (f8_tiles_suit; a weight copy checks): its tile kernel then widens each byte straight
// to the f32 bits of value * 2^-120 (a shift and a mask, no NaN test) and multiplies by
// 2^120 * scale, the product the rows' kernel forms (docs/benchmarks.md "Engine, session 48").
// I4_PACKED and FP4_PACKED (two 4-bit values per byte, value 2b in byte b's low nibble) are in
// quads as F16 and BF16, 128 columns at a time: a row's 64-byte group g (columns
// 128g..128g+127) at 256g + 64 (i % 4) in its quad, and in each group the nibbles reordered so
// that column 128g + 16s + d (s < 8, d < 16) is nibble s of the group's dword d (bits
// 4s..4s+3). One 64-byte load then gives the 16 values of columns 128g + 16s.. in the low 4 bits
// of its 16 dword lanes after a shift by 4s: one shift and one table lookup per 16 values
// instead of two 512-bit shuffles, a shift and an OR (compute/detail/matmul_float_avx512.h;
// docs/benchmarks.md "Engine, session 47"). Columns a multiple of 128.
// A stack of matrices (ne[2] > 1) is tiled matrix by matrix.
#pragma once

#include <cstdint>

#include "model/model_spec.h"

namespace troupe::model {

inline constexpr int64_t kTileRows = 16;
inline constexpr int64_t kFloatTileCols = 16;    // F16, BF16, F8: columns per chunk of a quad
inline constexpr int64_t kNibbleTileCols = 128;  // I4_PACKED, FP4_PACKED: columns per group

/// A set of weight types (ggml's, whose numbers are below 64, and troupe's own from 1000 on):
/// the ones a weight copy puts in tiles (copy_weights_to_memory), where the CPU kernels read
/// that type's tiles fast.
class TileTypes {
 public:
  constexpr TileTypes() = default;
  /// Every type that can be tiled: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, F16, BF16,
  /// F8_E4M3, I4_PACKED, FP4_PACKED.
  static TileTypes all();
  void add(GgmlType t) {
    if (const int b = bit(t); b >= 0) bits_[b / 64] |= uint64_t{1} << (b % 64);
  }
  bool has(GgmlType t) const {
    const int b = bit(t);
    return b >= 0 && (bits_[b / 64] >> (b % 64) & 1) != 0;
  }
  bool empty() const { return bits_[0] == 0 && bits_[1] == 0; }

 private:
  // ggml's types at 0..63, troupe's (1000 on) at 64..127; -1 for any other number.
  static int bit(GgmlType t) {
    const auto v = static_cast<uint32_t>(t);
    return v < 64 ? static_cast<int>(v) : v >= 1000 && v < 1064 ? static_cast<int>(v - 936) : -1;
  }
  uint64_t bits_[2] = {0, 0};
};

/// Whether w can be tiled: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K or Q6_K, or F16, BF16 or
/// F8_E4M3 with columns a multiple of kFloatTileCols, or I4_PACKED or FP4_PACKED with columns a
/// multiple of kNibbleTileCols; rows a multiple of kTileRows, present, in rows. (An F8_E4M3 view
/// must also pass f8_tiles_suit, which reads its data.)
bool tileable(const WeightView& w);

/// Scales of an F8_E4M3 matrix in tiles are below this in magnitude (or not finite): 2^120
/// times one stays finite.
inline constexpr float kF8TileScaleLimit = 256.f;
/// At most one value in this many of an F8_E4M3 matrix in tiles is a subnormal code.
inline constexpr uint64_t kF8TileSubnormalShare = 4096;

/// Whether the values and scales of F8_E4M3 view w suit the tile kernels, which read no NaN
/// code and multiply by 2^120 * scale, and widen a subnormal code to an f32 subnormal, which
/// some CPUs multiply slowly (a Zen 4 host: 1.1-1.4x as slow where 6 % of the codes are
/// subnormal): no value is the NaN code (0x7f, 0xff), every scale is below kF8TileScaleLimit in
/// magnitude or not finite, and at most one value in kF8TileSubnormalShare is a subnormal code
/// (a real checkpoint's block scales make them rare). Reads all of w's values.
bool f8_tiles_suit(const WeightView& w);

/// A Q5_0/Q5_1 qh word (bit v: value v's fifth bit) in a tile's bit order (see above), and back.
uint32_t q5_tile_qh(uint32_t h);
uint32_t q5_untile_qh(uint32_t t);

/// Reorders `n_mat` matrices of `rows` x `cols` (a tileable type, rows % 16 == 0) at `data`
/// from rows into tiles, in place.
void tile_in_place(GgmlType type, uint8_t* data, int64_t rows, int64_t cols, int64_t n_mat);

/// Row r of matrix `mat` of a tiled view, as the row bytes it had before tiling (ggml blocks),
/// into out[w.row_bytes()].
void untile_row(const WeightView& w, int64_t mat, int64_t r, uint8_t* out);

/// Row i (0..15) of the tile at `tile` (rows of row_bytes bytes of `type`) into out[row_bytes].
void untile_row(GgmlType type, const uint8_t* tile, int64_t row_bytes, int64_t i, uint8_t* out);

}  // namespace troupe::model
