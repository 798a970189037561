// AVX-512 VNNI kernels for Q4_K and Q5_K matrices in 16-row tiles (model/weight_tiles.h), and the
// same arithmetic reading them in ggml's rows (16 rows per super-block, TileRows), so that a
// matrix gives the same bits mapped or tiled. Lane i is output row i. Per super-block and token:
// 64 vpdpbusd give the 8 sub-blocks' dots, one vpmulld per sub-block scales each by its 6-bit
// scale and one add sums them (exact integers); 4 vpdpwssd of the mins against the sub-blocks'
// activation sums give msum, and a conversion, a multiply and two FMAs finish for 16 rows:
// ActTileK's recurrence (matmul_kernels.h), identical to the scalar tile kernel's. Q5_K is Q4_K
// with a fifth bit per value, which one rotate and one ternary-logic op per dword put on top of
// the nibble. Compiled with the flags of *_avx512.cc; runs only with VNNI.
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "compute/detail/avx512_common.h"
#include "compute/detail/matmul_kernels.h"
#include "compute/detail/matmul_tiles.h"
#include "model/weight_tiles.h"

namespace troupe::compute::detail {
namespace {

using model::BlockQ4_K;
using model::BlockQ5_K;
using model::kQK_K;

void quantize_tilek_act(const float* x, int64_t cols, uint8_t* out) {
  auto* a = reinterpret_cast<ActTileK*>(out);
  for (int64_t s = 0; s < cols / kQK_K; ++s) {
    __m512i q[16];
    a[s].d = quantize_vecs(x + s * kQK_K, 16, q);
    for (int v = 0; v < 16; ++v)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(a[s].q + 16 * v), _mm512_cvtepi32_epi8(q[v]));
    for (int j = 0; j < 8; ++j)
      a[s].xsum[kTileKSumSlot[j]] =
          static_cast<int16_t>(_mm512_reduce_add_epi32(_mm512_add_epi32(q[2 * j], q[2 * j + 1])));
  }
}

// acc += int16 pair products of w with the int16 pair at p broadcast.
inline __m512i dot16_bcast(__m512i acc, __m512i w, const void* p) {
  __asm__("vpdpwssd %2%{1to16%}, %1, %0"
          : "+v"(acc)
          : "v"(w), "m"(*static_cast<const int32_t*>(p)));
  return acc;
}

template <bool kRowsIn_, bool kGfni, bool kQ5>
struct TileKernelK {
  static constexpr bool kRowsIn = kRowsIn_;
  static constexpr int64_t kBlock = kQ5 ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);  // 176 or 144
  static constexpr int64_t kRec = model::kTileRows * kBlock;
  static constexpr int kQh = 4;                     // Q5_K: qh's first dword
  static constexpr int kQs = kQ5 ? 12 : 4;          // qs's first dword
  static constexpr int kPartLines = kRec / 64 / 4;  // a quarter of a record, in cache lines
  // Tokens per pass over a tile. Q4_K: 4. With 8, a pass's 8 sums u and 8 accumulators left too
  // few registers and g++ spilled; 4 ran the engine's Q4_K prefill 19 % and decode@16 9 % faster.
  // Q5_K keeps 8: its fifth-bit unpacking, shared by a pass's tokens, made 4 per pass 16 % slower
  // (docs/benchmarks.md "Engine, session 29").
  static constexpr int kMaxTok = kQ5 ? 8 : 4;
  static constexpr int64_t kTokBlock = 64;
  // Records a pass that streams (TilePass::streams) prefetches ahead into L1 (tile()).
  static constexpr int64_t kAheadStream = 3;
  // ... and with 3 tokens or more, into L2 this many records on (~12 KiB, page_ahead.h): on a
  // Zen 4 host Q4_K and Q5_K products of 3-4 tokens 0.9-1.6x as fast (median 1.16x); with 2 no
  // faster (docs/benchmarks.md "Engine, session 45").
  static constexpr int64_t kAheadStreamL2 = records_for(kStreamAheadL2, kRec);
  static constexpr int kL2StreamTok = 3;

  // Where a tile's super-blocks come from: records (tiles) or 16 rows (TileRows: lanes in its
  // order, rows >= n read as row 0 and never stored).
  struct Source {
    const uint8_t* base;
    int64_t row_bytes;
    [[maybe_unused]] std::conditional_t<kRowsIn, TileRows, NoRows> rows;

    // Dwords k..k+3 (0 = d and dmin, 1-3 = packed scales, then Q5_K's 8 of qh, then 32 of qs;
    // k a multiple of 4) of super-block s, 16 rows.
    void dwords4(int64_t s, int k, __m512i* v) const {
      if constexpr (kRowsIn) {
        rows.load16(s * kBlock + 4 * k, v);
      } else {
        // Records: d x16, dmin x16, then the chunks (dword k >= 1 is chunk k - 1).
        for (int i = 0; i < 4; ++i) v[i] = _mm512_loadu_si512(base + s * kRec + 64 * (k + i));
      }
    }
    // d and dmin of super-block s as floats; dword0: its dword 0 (rows only).
    void scales(int64_t s, __m512i dword0, __m512* d, __m512* dmin) const {
      if constexpr (kRowsIn) {
        *d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dword0));
        *dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dword0, 16)));
      } else {
        const uint8_t* rec = base + s * kRec;
        *d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec)));
        *dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + 32)));
      }
    }
    // Part `part` (0-3) of the prefetch of the super-block `ahead` on into L1 (none where ahead
    // is 0); l2: the record to fetch into L2 (tile()), or null. Tiles only.
    void prefetch(int64_t s, int part, const uint8_t* l2, int64_t ahead) const {
      if constexpr (kRowsIn) {
        // The next tile's rows at this super-block, 3 lines each, one per part (a block that
        // straddles a fourth line has it fetched as the next block's first: prefetching it here
        // too cost batch-1 decode 10-15 %).
        if (64 * part < kBlock)
          for (int i = 0; i < 16; ++i)
            prefetch_l1(base + (16 + i) * row_bytes + s * kBlock + 64 * part);
      } else {
        // A quarter of the record `ahead` on into L1, and of l2's record into L2.
        const int64_t off = kPartLines * 64 * part;
        if (ahead > 0)
          for (int o = 0; o < kPartLines; ++o)
            prefetch_l1(base + (s + ahead) * kRec + off + 64 * o);
        if (l2 != nullptr)
          for (int o = 0; o < kPartLines; ++o) prefetch_l2(l2 + off + 64 * o);
      }
    }
  };

  template <int NT>
  static void tile(const MatmulJob& j, int64_t row, int64_t tok, int64_t n_rows, TilePass pass) {
    const uint8_t* w = j.w + row * j.w_row_bytes;
    const Source src{w, j.w_row_bytes, {w, j.w_row_bytes, n_rows}};
    const ActTileK* a[NT];
    unroll<NT>([&](int n) __attribute__((always_inline)) {
      a[n] = reinterpret_cast<const ActTileK*>(j.act + (tok + n) * j.act_stride);
    });
    __m512 acc[NT];
    unroll<NT>([&](int n) __attribute__((always_inline)) { acc[n] = _mm512_setzero_ps(); });
    const __m512i m3f = _mm512_set1_epi8(0x3F), m0f = _mm512_set1_epi8(0x0F),
                  m10 = _mm512_set1_epi8(0x10), m30 = _mm512_set1_epi8(0x30),
                  mlo = _mm512_set1_epi32(0xFF), pair = _mm512_set1_epi32(0x00FF00FF);
    [[maybe_unused]] int64_t l2_due = pass.index;  // TilePass::l2_target
    // A tile's only pass streams its weights from DRAM. One token alone: instead of the record
    // two ahead into L2, one prefetch per page two pages ahead (prefetch_page_ahead), as the
    // 32-value kernels: Q4_K batch-1 products 9-16 % faster streaming and 22-40 % hot
    // (docs/benchmarks.md "Engine, session 33"); and the next record into L2. Until session 46
    // the next record went into L1 (with no prefetch of it at all, a third slower on a Zen 5);
    // on a Zen 4 host, into L2 ran Q4_K batch-1 products 1.27-1.31x and Q5_K 1.06-1.38x as fast
    // ("Engine, session 46"). 2 to 6 tokens (TilePass::streams): the page prefetch too, and the
    // record kAheadStream on into L1 instead of the next; with the next into L1 and the one after
    // into L2 (their form until session 43), Q4_K_M and Q5_K_M decode of 4 sequences ran 6-19 %
    // slower ("Engine, session 43").
    const bool alone = !kRowsIn && pass.alone(NT);
    const bool stream = !kRowsIn && pass.streams(NT);
    const int64_t l1_ahead = alone ? 0 : stream ? kAheadStream : 1;
    for (int64_t s = 0; s < j.cols / kQK_K; ++s) {
      if (alone || stream) prefetch_page_ahead(src.base + s * kRec, kRec);
      // The 6-bit scales and mins of the 16 rows (q4k_scales_mins, lane-wise): bytes j of
      // sc_lo/sc_hi are sc[j]/sc[4 + j], of mn_lo/mn_hi mn[j]/mn[4 + j].
      __m512i head[4];  // d and dmin, then the packed scales
      src.dwords4(s, 0, head);
      const __m512i s0 = head[1], s1 = head[2], s2 = head[3];
      const __m512i sc_lo = _mm512_and_si512(s0, m3f), mn_lo = _mm512_and_si512(s1, m3f);
      const __m512i sc_hi = _mm512_or_si512(_mm512_and_si512(s2, m0f),
                                            _mm512_and_si512(_mm512_srli_epi32(s0, 2), m30));
      const __m512i mn_hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(s2, 4), m0f),
                                            _mm512_and_si512(_mm512_srli_epi32(s1, 2), m30));
      const uint8_t* l2 =
          kRowsIn  ? nullptr
          : alone  ? src.base + (s + 1) * kRec
          : stream ? (NT >= kL2StreamTok ? src.base + (s + kAheadStreamL2) * kRec : nullptr)
                   : pass.l2_target(s, &l2_due, src.base + (s + 2) * kRec,
                                    src.base + model::kTileRows * j.w_row_bytes + s * kRec);
      __m512 d, dmin;
      src.scales(s, head[0], &d, &dmin);
      // tot = sum_j sc_j * dot_j, exact (|tot| < 2^26).
      __m512i tot[NT];
      unroll<NT>([&](int n) __attribute__((always_inline)) { tot[n] = _mm512_setzero_si512(); });
      __m512i qh[8];  // Q5_K: bit sb of each byte is the top bit of a value of sub-block sb
      if constexpr (kQ5) {
        src.dwords4(s, kQh, qh);
        src.dwords4(s, kQh + 4, qh + 4);
      }
      for (int p = 0; p < 4; ++p) {  // sub-blocks 2p (low nibbles) and 2p + 1 (high)
        src.prefetch(s, p, l2, l1_ahead);
        __m512i z[8];  // the values of both halves
        src.dwords4(s, kQs + 8 * p, z);
        src.dwords4(s, kQs + 8 * p + 4, z + 4);
        for (int h = 0; h < 2; ++h) {
          if constexpr (!kRowsIn)
            if (h == 1) {  // read again (L1) rather than kept: 8 registers g++ spilled
              src.dwords4(s, kQs + 8 * p, z);
              src.dwords4(s, kQs + 8 * p + 4, z + 4);
            }
          const int sb = 2 * p + h;
          const __m512i scv =
              _mm512_and_si512(_mm512_srli_epi32(sb < 4 ? sc_lo : sc_hi, 8 * (sb % 4)), mlo);
          __m512i w[8];
          for (int k = 0; k < 8; ++k) {
            w[k] = h == 0 ? _mm512_and_si512(z[k], m0f) : high_nibbles<kGfni>(z[k]);
            if constexpr (kQ5) {  // bit sb of each qh byte to bit 4, then w | (that & 0x10)
              const __m512i hb = _mm512_rolv_epi32(qh[k], _mm512_set1_epi32((4 - sb) & 31));
              w[k] = _mm512_ternarylogic_epi32(w[k], hb, m10, 0xF8);
            }
          }
          unroll<NT>([&](int n) __attribute__((always_inline)) {
            const int8_t* x = a[n][s].q + 32 * sb;
            __m512i d0 = _mm512_setzero_si512(), d1 = _mm512_setzero_si512();
            for (int k = 0; k < 8; k += 2) {
              d0 = dot_u8s8_bcast(d0, w[k], x + 4 * k);
              d1 = dot_u8s8_bcast(d1, w[k + 1], x + 4 * k + 4);
            }
            tot[n] = _mm512_add_epi32(tot[n], _mm512_mullo_epi32(_mm512_add_epi32(d0, d1), scv));
          });
        }
      }
      // The mins as int16 pairs (mn0, mn2), (mn1, mn3), (mn4, mn6), (mn5, mn7): xsum's order.
      const __m512i m02 = _mm512_and_si512(mn_lo, pair),
                    m13 = _mm512_and_si512(_mm512_srli_epi32(mn_lo, 8), pair),
                    m46 = _mm512_and_si512(mn_hi, pair),
                    m57 = _mm512_and_si512(_mm512_srli_epi32(mn_hi, 8), pair);
      unroll<NT>([&](int n) __attribute__((always_inline)) {
        const int16_t* xs = a[n][s].xsum;
        __m512i ms = dot16_bcast(_mm512_setzero_si512(), m02, xs);
        ms = dot16_bcast(ms, m13, xs + 2);
        ms = dot16_bcast(ms, m46, xs + 4);
        ms = dot16_bcast(ms, m57, xs + 6);
        // Rounded here, by an explicit rounding mode, so that no compiler fuses it with the
        // FMA below (a rounding fewer than the scalar recurrence's).
        const __m512 u = _mm512_mul_round_ps(_mm512_cvtepi32_ps(tot[n]), d,
                                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m512 w = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(ms), dmin, u);
        acc[n] = _mm512_fmadd_ps(w, _mm512_set1_ps(a[n][s].d), acc[n]);
      });
    }
    if constexpr (kRowsIn)
      unroll<NT>([&](int n)
                     __attribute__((always_inline)) { acc[n] = TileRows::to_row_order(acc[n]); });
    const auto keep = static_cast<__mmask16>((1u << n_rows) - 1);
    unroll<NT>([&](int n) __attribute__((always_inline)) {
      _mm512_mask_storeu_ps(j.y + (tok + n) * j.y_stride + row, keep, acc[n]);
    });
  }
};

template <bool kRowsIn, bool kGfni>
using TileKernelQ4K = TileKernelK<kRowsIn, kGfni, false>;
template <bool kRowsIn, bool kGfni>
using TileKernelQ5K = TileKernelK<kRowsIn, kGfni, true>;

}  // namespace

void avx512_tile_kernels_k(bool gfni, TypeKernels* q4_k_tiles, TypeKernels* q4_k_rows,
                           TypeKernels* q5_k_tiles, TypeKernels* q5_k_rows) {
  tile16_kernel_pair<TileKernelQ4K>(gfni, act_records256_bytes<ActTileK>, quantize_tilek_act,
                                    q4_k_tiles, q4_k_rows);
  tile16_kernel_pair<TileKernelQ5K>(gfni, act_records256_bytes<ActTileK>, quantize_tilek_act,
                                    q5_k_tiles, q5_k_rows);
}

}  // namespace troupe::compute::detail
