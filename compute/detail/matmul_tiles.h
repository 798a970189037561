// The loop nest shared by the SIMD kernel files: walks rows [r0, r1) x all tokens in
// micro-tiles of K::kRows rows x K::kToks tokens (smaller tiles at the edges), token blocks
// outermost so that a block of prepared activations stays in L2 while the weights stream.
// Tile shape never changes a result (matmul_kernels.h, rule 1); it only sets data reuse.
#pragma once

#include <xmmintrin.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include <utility>

#include "base/check.h"
#include "compute/detail/matmul_kernels.h"
#include "compute/detail/unroll.h"
#include "model/weight_tiles.h"

namespace troupe::compute::detail {

/// Software prefetch of `bytes` at p + ahead. Decode streams each tile's rows once, in pieces
/// too short for the hardware prefetchers to ramp up, so kernels fetch the next tile's rows
/// (ahead = one or two tiles of rows) while they work on this one.
inline void prefetch(const void* p, int64_t ahead, int64_t bytes) {
  const char* c = static_cast<const char*>(p) + ahead;
  for (int64_t o = 0; o < bytes + 63; o += 64) _mm_prefetch(c + o, _MM_HINT_T0);
}

/// K provides kRows, kToks, kTokBlock and
///   template <int R, int NT> static void tile(const MatmulJob&, int64_t row, int64_t tok);
/// computing rows [row, row+R) for tokens [tok, tok+NT).
template <class K, int R, int NT>
inline void tile_tail(const MatmulJob& j, int64_t r, int64_t t, int64_t n) {
  if constexpr (NT >= 1) {
    if (n == NT) {
      K::template tile<R, NT>(j, r, t);
    } else {
      tile_tail<K, R, NT - 1>(j, r, t, n);
    }
  }
}

template <class K, int R>
inline void token_tiles(const MatmulJob& j, int64_t r, int64_t t0, int64_t t1) {
  int64_t t = t0;
  for (; t + K::kToks <= t1; t += K::kToks) K::template tile<R, K::kToks>(j, r, t);
  if (t < t1) tile_tail<K, R, K::kToks - 1>(j, r, t, t1 - t);
}

template <class K>
void tiled_rows(const MatmulJob& j, int64_t r0, int64_t r1) {
  for (int64_t t0 = 0; t0 < j.n_tok; t0 += K::kTokBlock) {
    const int64_t t1 = std::min(j.n_tok, t0 + K::kTokBlock);
    int64_t r = r0;
    for (; r + K::kRows <= r1; r += K::kRows) token_tiles<K, K::kRows>(j, r, t0, t1);
    for (; r < r1; ++r) token_tiles<K, 1>(j, r, t0, t1);
  }
}

/// Which of a token block's passes over one 16-row tile a kernel call is: a kernel spreads the
/// next tile's fetch over all of them (one pass alone would need the bandwidth of all).
struct TilePass {
  int index, count;

  /// Whether an nt-token pass is one token alone over the tile: the batch-1 decode case, where
  /// the kernels prefetch once per page, two pages ahead (prefetch_page_ahead).
  bool alone(int nt) const { return nt == 1 && count == 1; }

  /// Whether an nt-token pass is the tile's only pass with 2 to kStreamTok tokens: it reads the
  /// weights from DRAM with too little work per byte to hide the wait, and the kernels prefetch
  /// as for a stream (once per page, as alone, and every line some KiB ahead into L1). A tile's
  /// only pass of 7 or 8 tokens keeps the lines further on in the tile into L2 (l2_target), which
  /// ran Q8_0's 8-token products faster (docs/benchmarks.md "Engine, session 43").
  static constexpr int kStreamTok = 6;
  bool streams(int nt) const { return nt > 1 && nt <= kStreamTok && count == 1; }

  /// Where a kernel at record b of a tile prefetches into L2: `ahead` (further on in this tile)
  /// when this is the tile's only pass; otherwise `next` (record b of the next tile) on this
  /// pass's share of the records (every count-th, from index), so that DRAM streams through all
  /// passes, not just the first (the tile itself stays in L2 between them); else nowhere. The
  /// kernel visits b = 0, 1, 2, ... in order, with `due` starting at index: the next record of
  /// this pass's share (a counter, not a division per record).
  const uint8_t* l2_target(int64_t b, int64_t* due, const uint8_t* ahead,
                           const uint8_t* next) const {
    if (count == 1) return ahead;
    if (b != *due) return nullptr;
    *due += count;
    return next;
  }
};

/// The loop nest of the 16-row tile kernels (matmul_tiles*_avx512.cc). K provides kRowsIn,
/// kMaxTok, kTokBlock and
///   template <int NT> static void tile(const MatmulJob&, int64_t row, int64_t tok, int64_t
///   n_rows, TilePass);
/// computing rows [row, row + n_rows) (n_rows < 16 only for a last tile read from rows) for
/// tokens [tok, tok + NT). Token blocks outermost, as tiled_rows.
template <class K, int NT>
inline void tile16_tail(const MatmulJob& j, int64_t r, int64_t t, int64_t n, int64_t n_rows,
                        TilePass pass) {
  if constexpr (NT >= 1) {
    if (n == NT) {
      K::template tile<NT>(j, r, t, n_rows, pass);
    } else {
      tile16_tail<K, NT - 1>(j, r, t, n, n_rows, pass);
    }
  }
}

template <class K>
void tile16_rows(const MatmulJob& j, int64_t r0, int64_t r1) {
  // A row-reading kernel's gather offsets (15 rows) are int32: rows of up to ~140 M bytes.
  TROUPE_CHECK(!K::kRowsIn || j.w_row_bytes < (int64_t{1} << 31) / 16,
               "matmul: rows of %lld bytes are too long for the row-reading tile kernel",
               static_cast<long long>(j.w_row_bytes));
  for (int64_t t0 = 0; t0 < j.n_tok; t0 += K::kTokBlock) {
    const int64_t t1 = std::min(j.n_tok, t0 + K::kTokBlock);
    for (int64_t r = r0; r < r1; r += 16) {
      const int64_t n_rows = std::min<int64_t>(16, r1 - r);
      TilePass pass{0, static_cast<int>((t1 - t0 + K::kMaxTok - 1) / K::kMaxTok)};
      int64_t t = t0;
      for (; t + K::kMaxTok <= t1; t += K::kMaxTok, ++pass.index)
        K::template tile<K::kMaxTok>(j, r, t, n_rows, pass);
      if (t < t1) tile16_tail<K, K::kMaxTok - 1>(j, r, t, t1 - t, n_rows, pass);
    }
  }
}

/// The kernels of a 16-row tile kernel template K<kRowsIn, kGfni> (matmul_tiles*_avx512.cc):
/// `tiles` reads tiles, `rows` reads 16 rows with the same arithmetic; gfni picks the
/// instantiation that unpacks nibbles with GFNI (the same bits).
template <template <bool, bool> class K>
void tile16_kernel_pair(bool gfni, int64_t (*act_bytes)(int64_t),
                        void (*quantize)(const float*, int64_t, uint8_t*), TypeKernels* tiles,
                        TypeKernels* rows) {
  for (TypeKernels* k : {tiles, rows}) {
    k->act_row_bytes = act_bytes;
    k->quantize = quantize;
    k->row_tile = static_cast<int>(model::kTileRows);
  }
  tiles->rows = gfni ? tile16_rows<K<false, true>> : tile16_rows<K<false, false>>;
  rows->rows = gfni ? tile16_rows<K<true, true>> : tile16_rows<K<true, false>>;
}

}  // namespace troupe::compute::detail
