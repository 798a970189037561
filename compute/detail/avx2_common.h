// Shared by the AVX2 kernel files (matmul_avx2.cc, matmul_tiles_avx2.cc, matmul_tiles_k_avx2.cc):
// small loads and AVX-VNNI's dot product, and the record loop and entry of the tile kernels. In an
// unnamed namespace, as simd_hsum.h: each including file keeps its own copy built with its AVX2
// flags.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <type_traits>
#include <vector>

#include "compute/detail/matmul_kernels.h"
#include "compute/detail/matmul_tiles.h"
#include "compute/detail/page_ahead.h"
#include "compute/detail/unroll.h"

namespace troupe::compute::detail {
namespace {  // NOLINT(google-build-namespaces): one copy per including file, see above

#if defined(__AVX2__)
/// acc + the exact 4-byte dot products of unsigned a and signed b in each int32 lane, by
/// AVX-VNNI's VEX-encoded vpdpbusd; asm, so that the including file keeps its AVX2 flags.
inline __m256i dpbusd(__m256i acc, __m256i a, __m256i b) {
  __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(a), "x"(b));
  return acc;
}

/// The 4 bytes at p in every dword.
inline __m256i bcast4(const void* p) {
  int32_t v;
  __builtin_memcpy(&v, p, sizeof v);
  return _mm256_set1_epi32(v);
}

inline __m256i load32(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

/// 8 f16 at p as floats.
inline __m256 f16x8(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

/// A tile's rows read from ggml's row layout (a mapped file) by a kernel's kRowsIn instantiation:
/// each record is assembled half by half (rows 8h..8h+7) in the tile's layout
/// (model/weight_tiles.h) in a buffer on the stack, and the kernel reads it there as it reads a
/// tiled record: the same arithmetic, so the same bits, wherever the weights live. K describes
/// its block as model/weight_tiles.cc's layouts do: kBlock (bytes), kFields (f16 fields: d, and
/// m or dmin), kTrailing (the fields end the block; a tile keeps them after its last record, the
/// buffer at kRec), kChunks (the block's other bytes as dwords), kQ5Qh (chunk 0 is a Q5_0/Q5_1
/// qh word, whose bits a tile reorders as model::q5_tile_qh), kFlip (Q8_0: a tile stores q + 128).
/// Rows at and past n (a last tile of fewer rows) are read as row 0; their outputs are not
/// stored.
template <class K>
class Avx2Rows {
 public:
  Avx2Rows(const uint8_t* base, int64_t row_bytes, int64_t n) : bytes_(row_bytes) {
    for (int i = 0; i < 16; ++i) row_[i] = base + (i < n ? i : 0) * row_bytes;
  }

  /// Record s's halves [h0, h0 + nh) into rec (K::kRec bytes, 32-byte aligned) and, where the
  /// fields trail (K::kTrailing), their 32 bytes into fields.
  [[gnu::always_inline]] void record(int64_t s, int h0, int nh, uint8_t* rec,
                                     uint8_t* fields) const {
    constexpr int64_t kFieldsAt = K::kTrailing ? 4 * K::kChunks : 0;  // in a block
    constexpr int64_t kChunksAt = K::kTrailing ? 0 : 2 * K::kFields;
    constexpr int64_t kRecChunks = K::kTrailing ? 0 : 32 * K::kFields;  // in a record
    static_assert(K::kChunks >= 4 && kChunksAt + 4 * K::kChunks <= K::kBlock);
    if constexpr (!K::kTrailing) fields = rec;
    const int64_t at = s * K::kBlock;
    for (int h = h0; h < h0 + nh; ++h) {
      const uint8_t* const* r = row_ + 8 * h;
      unroll<K::kFields>([&](int f) __attribute__((always_inline)) {
        const int64_t o = at + kFieldsAt + 2 * f;
        _mm_storeu_si128(
            reinterpret_cast<__m128i*>(fields + 32 * f + 16 * h),
            _mm_setr_epi16(f16(r[0] + o), f16(r[1] + o), f16(r[2] + o), f16(r[3] + o),
                           f16(r[4] + o), f16(r[5] + o), f16(r[6] + o), f16(r[7] + o)));
      });
      // Chunks 4g..4g+3 from one 16-byte read of each row; a last partial group reads the last
      // 4 chunks (rewriting some with the same bytes), never past the block.
      for (int64_t c = 0; c < K::kChunks; c += 4) {
        const int64_t c0 = c + 4 <= K::kChunks ? c : K::kChunks - 4;
        __m256i v[4];
        load16(r, at + kChunksAt + 4 * c0, v);
        if constexpr (K::kQ5Qh)
          if (c0 == 0) v[0] = q5_tile_order(v[0]);
        unroll<4>([&](int i) __attribute__((always_inline)) {
          if constexpr (K::kFlip) v[i] = _mm256_xor_si256(v[i], _mm256_set1_epi8(-128));
          _mm256_store_si256(reinterpret_cast<__m256i*>(rec + kRecChunks + 64 * (c0 + i) + 32 * h),
                             v[i]);
        });
      }
    }
  }

  /// The whole tile of nb records, as model/weight_tiles.h lays it out, into t (32-byte
  /// aligned; trailing fields after the last record).
  void tile(int64_t nb, uint8_t* t) const {
    for (int64_t s = 0; s < nb; ++s) record(s, 0, 2, t + s * K::kRec, t + nb * K::kRec + 32 * s);
  }

  /// Prefetches into L1 record s of the 8 nh rows that follow halves [h0, h0 + nh), which the
  /// next pass reads (the next half or the next tile), once per cache line of a row.
  [[gnu::always_inline]] void prefetch_next(int64_t s, int h0, int nh) const {
    const int64_t at = s * K::kBlock;
    if (K::kBlock < 64 && at % 64 >= K::kBlock)
      return;  // this line was fetched with a block before
    const uint8_t* next = row_[0] + 8 * (h0 + nh) * bytes_ + at;  // row_[0]: the tile's first
    for (int i = 0; i < 8 * nh; ++i)
      for (int64_t o = 0; o < K::kBlock; o += 64) prefetch_l1(next + i * bytes_ + o);
  }

 private:
  static int16_t f16(const uint8_t* p) {
    int16_t v;
    __builtin_memcpy(&v, p, sizeof v);
    return v;
  }

  // The 16 bytes at `at` of each of the 8 rows r[0..8) as 4 vectors: v[c] lane i is dword c of
  // row i (a 4 x 4 dword transpose in each 128-bit lane, rows 0-3 low and 4-7 high).
  static void load16(const uint8_t* const* r, int64_t at, __m256i* v) {
    __m256i z[4];  // z[g]: row g (low lane), row 4 + g (high lane)
    for (int g = 0; g < 4; ++g)
      z[g] = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(r[4 + g] + at),
                                 reinterpret_cast<const __m128i*>(r[g] + at));
    const __m256i t0 = _mm256_unpacklo_epi32(z[0], z[1]), t1 = _mm256_unpackhi_epi32(z[0], z[1]);
    const __m256i t2 = _mm256_unpacklo_epi32(z[2], z[3]), t3 = _mm256_unpackhi_epi32(z[2], z[3]);
    v[0] = _mm256_unpacklo_epi64(t0, t2);
    v[1] = _mm256_unpackhi_epi64(t0, t2);
    v[2] = _mm256_unpacklo_epi64(t1, t3);
    v[3] = _mm256_unpackhi_epi64(t1, t3);
  }

  // x with its bits exchanged where m is set and d places up.
  static __m256i delta_swap(__m256i x, int d, uint32_t m) {
    const __m256i t = _mm256_and_si256(_mm256_xor_si256(_mm256_srli_epi32(x, d), x),
                                       _mm256_set1_epi32(static_cast<int32_t>(m)));
    return _mm256_xor_si256(x, _mm256_xor_si256(t, _mm256_slli_epi32(t, d)));
  }
  // model::q5_tile_qh in every dword: bit v = 16a + 4c + k goes to bit 8k + 4a + c, a rotation
  // of the bit index's five bits, made of four exchanges of two of them.
  static __m256i q5_tile_order(__m256i x) {
    x = delta_swap(x, 14, 0x0000CCCCu);    // index bits 1 and 4
    x = delta_swap(x, 7, 0x00AA00AAu);     // 0 and 3
    x = delta_swap(x, 2, 0x0C0C0C0Cu);     // 1 and 2
    return delta_swap(x, 1, 0x22222222u);  // 0 and 1
  }

  int64_t bytes_;
  const uint8_t* row_[16];  // rows at and past n: row 0
};

/// What a kernel reading tiles has in Avx2Rows' place.
struct Avx2NoRows {
  Avx2NoRows(const uint8_t*, int64_t, int64_t) {}
};

/// The record loop of the AVX2 tile kernels: halves [h0, h0 + NH) (rows 8 h..) of the tile at w
/// (or, kRowsIn, of the rows src reads) for the tokens' activation records a[0..NT), every
/// record in order, into out. K provides kRowsIn, kRec (bytes of a record), kRecCols (columns it
/// holds), kNextRecord (one token alone prefetches the record after next and every line ~12 KiB
/// on into L2, as well as a page ahead; the K-quants. Until session 45 the record after next went
/// into L1 and nothing further; session 45 added the lines 12 KiB on for Q5_K and Q6_K (on a Zen 4
/// host their batch-1 products 1.3-1.6x and 1.8-2.8x faster; Q4_K's up to 1.3x slower with the
/// L1 prefetch kept), session 46 moved the record after next into L2 and gave Q4_K both (Q4_K
/// 1.26x, Q5_K 1.16x, Q6_K 1.21x with one thread, docs/benchmarks.md "Engine, session 46")) and
///   template <int NT, int NH> static void record(const MatmulJob&, const uint8_t* tile,
///       const uint8_t* rec, int64_t s, const Act* const* x, int h0, __m256 (&acc)[NH][NT]);
/// (x[n]: token n's activation record for record s). kStream: the first half of a tile's only
/// pass of 2 or more tokens, which reads the weights from DRAM: one prefetch per page, as one
/// token alone, and every line of the record 6.75 KiB on into L1 (with no software prefetch, the
/// form until session 43, 2-token products took 1.3-1.8x as long on an AMD EPYC, docs/benchmarks.md
/// "Engine, session 43"); with K::kL2StreamTok tokens or more, every line ~12 KiB on into L2
/// first (page_ahead.h; on a Zen 4 host Q4_0 and Q4_K products of 2-3 tokens 1.0-1.8x faster,
/// "Engine, session 45"). A template parameter, and the pass found from j.n_tok rather than
/// TilePass, so that the 1-token code g++ makes stays as it was: a first form that read TilePass
/// halved batch-1 Q4_0's streaming speed through a rescheduled 1-token loop.
template <class K, class Act, int NT, int NH, bool kStream = false, class Src>
[[gnu::always_inline]] inline void avx2_pass(const MatmulJob& j, const uint8_t* w, const Src& src,
                                             const Act* const* a, int h0, bool alone,
                                             float (&out)[NT][16]) {
  __m256 acc[NH][NT];
  unroll<NH>([&](int hh) __attribute__((always_inline)) {
    unroll<NT>([&](int n) __attribute__((always_inline)) { acc[hh][n] = _mm256_setzero_ps(); });
  });
  [[maybe_unused]] alignas(32) uint8_t buf[K::kRowsIn ? K::kRec + 32 : 32];
  // ~12 KiB on, in whole records (page_ahead.h).
  constexpr int64_t kAheadL2 = records_for(kStreamAheadL2, K::kRec) * K::kRec;
  for (int64_t s = 0; s < j.cols / K::kRecCols; ++s) {
    const uint8_t* rec = w + s * K::kRec;
    if constexpr (K::kRowsIn) {
      src.prefetch_next(s, h0, NH);
      src.record(s, h0, NH, buf, buf + K::kRec);
      rec = buf;
    } else if constexpr (kStream) {
      prefetch_page_ahead(rec, K::kRec);
      if constexpr (NT >= K::kL2StreamTok)
        for (int64_t o = 0; o < K::kRec; o += 64) prefetch_l2(rec + kAheadL2 + o);
      constexpr int64_t kAhead = records_for(kStreamAheadFar, K::kRec) * K::kRec;
      for (int64_t o = 0; o < K::kRec; o += 64) prefetch_l1(rec + kAhead + o);
    } else if (alone) {
      prefetch_page_ahead(rec, K::kRec);
      if constexpr (K::kNextRecord) {
        for (int64_t o = 0; o < K::kRec; o += 64) prefetch_l2(rec + kAheadL2 + o);
        for (int64_t o = 0; o < K::kRec; o += 64) prefetch_l2(rec + 2 * K::kRec + o);
      }
    }
    const Act* x[NT];
    unroll<NT>([&](int n) __attribute__((always_inline)) { x[n] = a[n] + s; });
    K::template record<NT, NH>(j, w, rec, s, x, h0, acc);
  }
  unroll<NH>([&](int hh) __attribute__((always_inline)) {
    unroll<NT>([&](int n) __attribute__((always_inline)) {
      _mm256_storeu_ps(out[n] + 8 * (h0 + hh), acc[hh][n]);
    });
  });
}

/// A kernel K's tile() on the tile at w (or, kRowsIn, the 16 rows from w): one token alone reads
/// each record once for both halves, so the weights stream without a pause; more tokens take a
/// half at a time (the tile, 18-50 KB, is still in L1 or L2 for the second), so that their sums
/// fit the 16 registers.
template <class K, class Act, int NT>
[[gnu::always_inline]] inline void avx2_tile_at(const MatmulJob& j, const uint8_t* w, int64_t row,
                                                int64_t tok, int64_t n_rows, TilePass pass) {
  const Act* a[NT];
  unroll<NT>([&](int n) __attribute__((always_inline)) {
    a[n] = reinterpret_cast<const Act*>(j.act + (tok + n) * j.act_stride);
  });
  const std::conditional_t<K::kRowsIn, Avx2Rows<K>, Avx2NoRows> src(w, j.w_row_bytes, n_rows);
  alignas(32) float out[NT][16];
  if constexpr (NT == 1) {
    avx2_pass<K, Act, NT, 2>(j, w, src, a, 0, pass.alone(NT), out);
  } else {
    if (j.n_tok <= K::kMaxTok)  // the tile's only pass (kStream above)
      avx2_pass<K, Act, NT, 1, true>(j, w, src, a, 0, false, out);
    else
      avx2_pass<K, Act, NT, 1>(j, w, src, a, 0, false, out);
    avx2_pass<K, Act, NT, 1>(j, w, src, a, 1, false, out);
  }
  for (int n = 0; n < NT; ++n)
    for (int64_t i = 0; i < n_rows; ++i) j.y[(tok + n) * j.y_stride + row + i] = out[n][i];
}

/// This thread's buffer of at least `bytes` for a tile assembled from rows (avx2_tile), 32-byte
/// aligned: one for every kernel and pass (an NT-token pass and the tail pass after it share it).
inline uint8_t* tile_buffer(int64_t bytes) {
  struct alignas(32) Bytes32 {
    uint8_t b[32];
  };
  thread_local std::vector<Bytes32> buf;
  return reinterpret_cast<uint8_t*>(scratch(buf, (bytes + 31) / 32));
}

/// A kernel K's tile(). Reading rows (kRowsIn) for more tokens than one pass takes, the first
/// pass assembles the whole tile in this thread's buffer and every pass reads it there through
/// the kernel that reads tiles, K::Tiled (tile16_rows runs a tile's passes one after another on
/// one thread): assembling each record again in every pass made 16-token products 15-25 %
/// slower than the row kernels they replaced (docs/benchmarks.md "Engine, session 40").
template <class K, class Act, int NT>
[[gnu::always_inline]] inline void avx2_tile(const MatmulJob& j, int64_t row, int64_t tok,
                                             int64_t n_rows, TilePass pass) {
  const uint8_t* w = j.w + row * j.w_row_bytes;
  if constexpr (K::kRowsIn) {
    if (pass.count > 1) {
      const int64_t nb = j.cols / K::kRecCols;
      uint8_t* t = tile_buffer(nb * (K::kRec + 32));
      if (pass.index == 0) Avx2Rows<K>(w, j.w_row_bytes, n_rows).tile(nb, t);
      avx2_tile_at<typename K::Tiled, Act, NT>(j, t, row, tok, n_rows, pass);
      return;
    }
  }
  avx2_tile_at<K, Act, NT>(j, w, row, tok, n_rows, pass);
}
#endif

}  // namespace
}  // namespace troupe::compute::detail
