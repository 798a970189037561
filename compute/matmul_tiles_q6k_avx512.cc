// AVX-512 VNNI kernels for Q6_K matrices in 16-row tiles (model/weight_tiles.h), and the same
// arithmetic reading Q6_K in ggml's rows (16 rows per super-block, TileRows), so that a matrix
// gives the same bits mapped or tiled. Lane i is output row i. Per super-block, group (16
// values) and token: 4 vpdpbusd from the activation record's start give M + t_g in the int32
// lanes, one FMA scales them by the group's d * sc and one add sums the groups: ActTileQ6K's
// recurrence (matmul_kernels.h), identical to the scalar tile kernel's. The 6-bit weights are
// unpacked once per group and pass, mostly off the port the dot products use (vpshufb looks
// the high bits up; shifts only where no lookup reaches). Compiled with the flags of
// *_avx512.cc; runs only with VNNI.
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "compute/detail/avx512_common.h"
#include "compute/detail/matmul_kernels.h"
#include "compute/detail/matmul_tiles.h"
#include "model/weight_tiles.h"

namespace troupe::compute::detail {
namespace {

using model::BlockQ6_K;
using model::kQK_K;

void quantize_tileq6k_act(const float* x, int64_t cols, uint8_t* out) {
  auto* a = reinterpret_cast<ActTileQ6K*>(out);
  for (int64_t s = 0; s < cols / kQK_K; ++s) {
    __m512i q[16];
    a[s].d = quantize_vecs(x + s * kQK_K, 16, q);
    for (int g = 0; g < 16; ++g) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(a[s].q + 16 * g), _mm512_cvtepi32_epi8(q[g]));
      a[s].start[g] = tile_start(-32 * _mm512_reduce_add_epi32(q[g]));
    }
  }
}

// Ternary-logic immediates (A = 0xF0, B = 0xCC, C = 0xAA): A | (B & C) and (A & C) | B.
constexpr int kAOrBAndC = 0xF8;
constexpr int kAAndCOrB = 0xEC;

template <bool kRowsIn_, bool kGfni>
struct TileKernelQ6K {
  static constexpr bool kRowsIn = kRowsIn_;
  static constexpr int64_t kBlock = sizeof(BlockQ6_K);  // 210
  static constexpr int kChunks = 52;                    // ql 0-31, qh 32-47, scales 48-51
  static constexpr int64_t kRec = 64 * kChunks;         // a tile's record: 3328 bytes
  // One token alone fetches the lines this many records (~24 KiB) on into L2 (tile()).
  static constexpr int64_t kAloneAheadL2 = records_for(2 * kStreamAheadL2, kRec);
  static constexpr int kMaxTok = 8;
  static constexpr int64_t kTokBlock = 64;

  // Where a tile's super-blocks come from: records (tiles, the d values after the last one) or
  // 16 rows (TileRows: read into a record on the stack, lanes in its order, rows >= n read as
  // row 0 and never stored).
  struct Source {
    const uint8_t* base;
    int64_t row_bytes, nsb;
    [[maybe_unused]] std::conditional_t<kRowsIn, TileRows, NoRows> rows;
    uint8_t* buf;             // kRec bytes, 64-aligned (rows only)
    bool next_to_l2 = false;  // the record one ahead into L2 instead of L1 (one token alone)

    // The 52 chunks of super-block s.
    const uint8_t* record(int64_t s) const {
      if constexpr (kRowsIn) {
        for (int c = 0; c < kChunks; c += 4) {
          __m512i v[4];
          rows.load16(s * kBlock + 4 * c, v);
          for (int i = 0; i < 4; ++i) _mm512_store_si512(buf + 64 * (c + i), v[i]);
        }
        return buf;
      } else {
        return base + s * kRec;
      }
    }
    // The 16 rows' d of super-block s.
    __m512 d(int64_t s) const {
      if constexpr (kRowsIn) {
        // The dword ending the block (scales 14-15, then d): never past the row.
        const __m512i g = rows.gather(base, s * kBlock + kBlock - 4);
        return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(g, 16)));
      } else {
        return _mm512_cvtph_ps(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + nsb * kRec + 32 * s)));
      }
    }
    // Part `part` (0-15) of the next super-block's prefetch; l2: the record TilePass::l2_target
    // chose for this super-block, or null (tiles only).
    void prefetch(int64_t s, int part, const uint8_t* l2) const {
      if constexpr (kRowsIn) {
        // This tile's rows at the next super-block into L1, and the next tile's rows at this
        // one into L2 (210 bytes: 4 lines, one per part and row).
        if (part < 4) {
          for (int i = 0; i < 16; ++i)
            prefetch_l1(base + i * row_bytes + (s + 1) * kBlock + 64 * part);
        } else if (part < 8) {
          for (int i = 0; i < 16; ++i)
            prefetch_l2(base + (16 + i) * row_bytes + s * kBlock + 64 * (part - 4));
        }
      } else if (part < 13) {
        // 4 of the 52 lines of the record one ahead into L1 (or L2), and of l2's record into L2.
        const int64_t off = 4 * 64 * part;
        for (int o = 0; o < 4; ++o) {
          const uint8_t* line = base + (s + 1) * kRec + off + 64 * o;
          if (next_to_l2)
            prefetch_l2(line);
          else
            prefetch_l1(line);
        }
        if (l2 != nullptr)
          for (int o = 0; o < 4; ++o) prefetch_l2(l2 + off + 64 * o);
      }
    }
  };

  // The 4 weight dwords (16 values per lane, as unsigned bytes 0-63) of group G.
  template <int G>
  static void unpack(const uint8_t* rec, __m512i* w) {
    constexpr int h = G / 8, J = G / 2 % 4, half = G % 2;
    const __m512i m0f = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    for (int k = 0; k < 4; ++k) {
      const int l4 = 4 * half + k;
      const __m512i ql = _mm512_loadu_si512(rec + 64 * (16 * h + 8 * (J & 1) + l4));
      const __m512i qh = _mm512_loadu_si512(rec + 64 * (32 + 8 * h + l4));
      if constexpr (J < 2) {
        // The high bits of values J: qh bits 2J..2J+1 to bits 4-5, by a lookup on its low
        // nibble; the low nibble of ql below them.
        const __m512i table = J == 0 ? _mm512_set1_epi32(0x30201000)
                                     : _mm512_set4_epi32(0x30303030, 0x20202020, 0x10101010, 0);
        const __m512i hb = _mm512_shuffle_epi8(table, _mm512_and_si512(qh, m0f));
        w[k] = _mm512_ternarylogic_epi32(ql, hb, m0f, kAAndCOrB);
      } else {
        const __m512i hi = J == 2 ? qh : _mm512_srli_epi32(qh, 2);
        w[k] = _mm512_ternarylogic_epi32(high_nibbles<kGfni>(ql), hi, m30, kAOrBAndC);
      }
    }
  }

  // Group G's scale for the 16 rows: ds = d * sc_G (exact) and -M * ds (exact).
  template <int G>
  static void group_scale(const uint8_t* rec, __m512 d24, __m512* ds, __m512* nmds) {
    const __m512i sc4 = _mm512_loadu_si512(rec + 64 * (48 + G / 4));
    // Byte G % 4 of each dword to its top, the rest zero: sc_G * 2^24, exact as a float.
    constexpr unsigned b = G % 4;
    const __m512i top = _mm512_set4_epi32(static_cast<int>(0x00808080u | (12u + b) << 24),
                                          static_cast<int>(0x00808080u | (8u + b) << 24),
                                          static_cast<int>(0x00808080u | (4u + b) << 24),
                                          static_cast<int>(0x00808080u | (0u + b) << 24));
    *ds = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_shuffle_epi8(sc4, top)), d24);
    *nmds = _mm512_mul_ps(*ds, _mm512_set1_ps(-kTileMagic));
  }

  // Group G of super-block s for NT tokens (x[n]: token n's record of s) into u.
  template <int G, int NT>
  static void group(const uint8_t* rec, int64_t s, __m512 d24, const ActTileQ6K* const* x,
                    __m512* u, const Source& src, const uint8_t* l2) {
    src.prefetch(s, G, l2);
    __m512i w[4];
    unpack<G>(rec, w);
    __m512 ds, nmds;
    group_scale<G>(rec, d24, &ds, &nmds);
    for (int n = 0; n < NT; ++n) {
      const int8_t* q = x[n]->q + 16 * G;
      __m512i t = _mm512_set1_epi32(x[n]->start[G]);
      for (int k = 0; k < 4; ++k) t = dot_u8s8_bcast(t, w[k], q + 4 * k);
      u[n] = _mm512_add_ps(u[n], _mm512_fmadd_ps(_mm512_castsi512_ps(t), ds, nmds));
    }
  }

  // All 16 groups, in order.
  template <int NT, int... G>
  static void groups(std::integer_sequence<int, G...>, const uint8_t* rec, int64_t s, __m512 d24,
                     const ActTileQ6K* const* x, __m512* u, const Source& src, const uint8_t* l2) {
    (group<G, NT>(rec, s, d24, x, u, src, l2), ...);
  }

  template <int NT>
  static void tile(const MatmulJob& j, int64_t row, int64_t tok, int64_t n_rows, TilePass pass) {
    alignas(64) uint8_t buf[kRowsIn ? kRec : 64];
    const int64_t nsb = j.cols / kQK_K;
    const uint8_t* w = j.w + row * j.w_row_bytes;
    // One token alone: one prefetch per page two pages ahead, as the 32-value kernels
    // (prefetch_page_ahead), the next record into L2 and the lines kAloneAheadL2 records on into
    // L2. Until session 46 it had the prefetches of more tokens (the next record into L1, the one
    // after into L2) with the page prefetch: Q6_K batch-1 products 6-8 % faster than without the
    // page prefetch on a Zen 5; without the L2 prefetches, as Q4_K then, 2-15 % slower
    // (docs/benchmarks.md "Engine, session 33"). On a Zen 4 host the new form ran them 1.11-1.21x
    // as fast ("Engine, session 46").
    const bool alone = !kRowsIn && pass.alone(NT);
    const Source src{w, j.w_row_bytes, nsb, {w, j.w_row_bytes, n_rows}, buf, alone};
    const ActTileQ6K* a[NT];
    for (int n = 0; n < NT; ++n)
      a[n] = reinterpret_cast<const ActTileQ6K*>(j.act + (tok + n) * j.act_stride);
    __m512 acc[NT];
    for (int n = 0; n < NT; ++n) acc[n] = _mm512_setzero_ps();
    const uint8_t* next_tile = src.base + model::kTileRows * j.w_row_bytes;
    if (!kRowsIn && ((pass.count > 1 && pass.index == 0) || alone))  // the next tile's d values
      for (int64_t o = 0; o < 32 * nsb; o += 64) prefetch_l2(next_tile + nsb * kRec + o);
    [[maybe_unused]] int64_t l2_due = pass.index;  // TilePass::l2_target
    for (int64_t s = 0; s < nsb; ++s) {
      if (alone) prefetch_page_ahead(src.base + s * kRec, kRec);
      const uint8_t* l2 =
          kRowsIn ? nullptr
                  : pass.l2_target(s, &l2_due, src.base + (s + (alone ? kAloneAheadL2 : 2)) * kRec,
                                   next_tile + s * kRec);
      const uint8_t* rec = src.record(s);
      const __m512 d24 = _mm512_mul_ps(src.d(s), _mm512_set1_ps(0x1p-24f));
      const ActTileQ6K* x[NT];
      for (int n = 0; n < NT; ++n) x[n] = a[n] + s;
      __m512 u[NT];  // from -0: u = v_0 + ... exactly as ActTileQ6K's sum
      for (int n = 0; n < NT; ++n) u[n] = _mm512_set1_ps(-0.f);
      groups<NT>(std::make_integer_sequence<int, 16>(), rec, s, d24, x, u, src, l2);
      for (int n = 0; n < NT; ++n)
        acc[n] = _mm512_fmadd_ps(u[n], _mm512_set1_ps(a[n][s].d), acc[n]);
    }
    if constexpr (kRowsIn)
      for (int n = 0; n < NT; ++n) acc[n] = TileRows::to_row_order(acc[n]);
    const auto keep = static_cast<__mmask16>((1u << n_rows) - 1);
    for (int n = 0; n < NT; ++n)
      _mm512_mask_storeu_ps(j.y + (tok + n) * j.y_stride + row, keep, acc[n]);
  }
};

}  // namespace

void avx512_tile_kernels_q6k(bool gfni, TypeKernels* q6_k_tiles, TypeKernels* q6_k_rows) {
  tile16_kernel_pair<TileKernelQ6K>(gfni, act_records256_bytes<ActTileQ6K>, quantize_tileq6k_act,
                                    q6_k_tiles, q6_k_rows);
}

}  // namespace troupe::compute::detail
