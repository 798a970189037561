// AVX2 kernels for Q4_K, Q5_K and Q6_K matrices in 16-row tiles (model/weight_tiles.h), for CPUs
// without AVX-512, as matmul_tiles_avx2.cc does for the 32-value block types: a 64-byte chunk's
// two 32-byte halves are rows 0-7 and 8-15, lane i of a 256-bit register is row i of the half,
// and one vpmaddubsw (or, with AVX-VNNI, vpdpbusd) multiplies 4 columns of 8 rows by 4 broadcast
// activation values. The row kernels these replaced unpacked each row's scales and summed each
// row's lanes; on one core their batch-1 Q4_K read ~18 GB/s from cache (docs/benchmarks.md
// "Engine, session 34"). The same kernels read ggml's rows (kRowsIn), as matmul_tiles_avx2.cc's.
//
// Each output is the scalar recurrence of ActTileK (Q4_K, Q5_K) or ActTileQ6K (Q6_K)
// (matmul_kernels.h): the same bits as the scalar and AVX-512 tile kernels. The integer dots are
// exact: vpmaddubsw's int16 pair sums are widened by vpmaddwd before a sum could reach 2^15 (16
// products of 4-bit weights, 8 of 5-bit ones, 4 of 6-bit ones, each product at most 127 times
// the weight). Compiled with the AVX2 flags of *_avx2.cc.
#include <immintrin.h>

#include <cstdint>
#include <utility>

#include "compute/detail/avx2_common.h"
#include "compute/detail/matmul_kernels.h"
#include "compute/detail/matmul_tiles.h"
#include "compute/detail/unroll.h"
#include "model/weight_tiles.h"

namespace troupe::compute::detail {
namespace {

using model::kQK_K;

// The int32 lanes start + sum over k of the 4-byte dots of unsigned w[k] (at most `kMax`) and
// signed x[k] (broadcast from x + 4k), exactly: int16 pair sums widened every kSpan products.
// Without VNNI, `widen` (int16 pairs, |.| small enough for the product: by default 1) multiplies
// each int16 sum as vpmaddwd widens it: Q4_K and Q5_K pass their sub-block's scale.
template <int kN, int kMax, bool kVnni>
inline __m256i dot_chunks(__m256i start, const __m256i* w, const int8_t* x,
                          __m256i widen = _mm256_set1_epi16(1)) {
  if constexpr (kVnni) {
    __m256i s0 = start, s1 = _mm256_setzero_si256();
    unroll<kN / 2>([&](int k) __attribute__((always_inline)) {
      s0 = dpbusd(s0, w[2 * k], bcast4(x + 8 * k));
      s1 = dpbusd(s1, w[2 * k + 1], bcast4(x + 8 * k + 4));
    });
    return _mm256_add_epi32(s0, s1);
  } else {
    // Products per lane that an int16 sum holds: 2 per vpmaddubsw.
    constexpr int kPer = 32767 / (kMax * 127) / 2 * 2;
    static_assert(kPer >= 2);
    constexpr int kSpan = kPer / 2 < kN ? kPer / 2 : kN;  // vpmaddubsw results per int16 sum
    __m256i acc = start;
    unroll<kN / kSpan>([&](int g) __attribute__((always_inline)) {
      __m256i s = _mm256_maddubs_epi16(w[kSpan * g], bcast4(x + 4 * kSpan * g));
      unroll<kSpan - 1>([&](int k) __attribute__((always_inline)) {
        s = _mm256_add_epi16(
            s, _mm256_maddubs_epi16(w[kSpan * g + k + 1], bcast4(x + 4 * (kSpan * g + k + 1))));
      });
      acc = _mm256_add_epi32(acc, _mm256_madd_epi16(s, widen));
    });
    return acc;
  }
}

// Makes the compiler finish v here: a group's sums are added into v where the source adds them,
// and nothing of a later group's is loaded before. g++ 12 otherwise made every integer sum of a
// Q6_K record first and added them all at the end: 16-32 sums and the broadcasts spilled to the
// stack (340 stack loads and stores in the one-token kernel's 1530 instructions; with this, 17
// in 1510, all at its entry and exit). Emits no instruction. Tried on Q4_K and Q5_K's sub-blocks
// too: mixed (one token 10-20 % faster without VNNI, 8-16 % slower with it; 16 tokens ~10 % slower
// without VNNI), so not used there.
[[gnu::always_inline]] inline void settle(__m256& v) { __asm__ volatile("" : "+x"(v)::"memory"); }

// --- Q4_K and Q5_K ---------------------------------------------------------------------------
// A record: d x16 and dmin x16 (64 bytes), 3 chunks of packed scales and mins, Q5_K's 8 chunks of
// qh, 32 chunks of qs.
// kRowsIn (both kernels): reading ggml's rows, each record assembled in the tile's layout first
// (Avx2Rows, detail/avx2_common.h): the same bits as the tiled matrix.
template <bool kQ5, bool kVnni, bool kRowsIn_>
struct Avx2TileKernelK {
  static constexpr bool kRowsIn = kRowsIn_;
  // The block as Avx2Rows reads it: d and dmin, then dwords (scales, Q5_K's qh, qs).
  static constexpr int64_t kBlock = kQ5 ? sizeof(model::BlockQ5_K) : sizeof(model::BlockQ4_K);
  static constexpr int kFields = 2;
  static constexpr bool kTrailing = false, kQ5Qh = false, kFlip = false;
  static constexpr int64_t kChunks = (kBlock - 4) / 4;
  static constexpr int64_t kRec = model::kTileRows * kBlock;
  using Tiled = Avx2TileKernelK<kQ5, kVnni, false>;
  static constexpr int64_t kScales = 64, kQh = 256, kQs = kQ5 ? 256 + 8 * 64 : 256;
  static constexpr int kMaxQ = kQ5 ? 31 : 15;  // the largest weight value
  static constexpr int kMaxTok = 3;            // sums, accumulators and operands in 16 registers
  static constexpr int kL2StreamTok = 2;       // avx2_pass: streaming passes prefetch into L2
  static constexpr int64_t kTokBlock = 64;
  static constexpr int64_t kRecCols = kQK_K;
  // One token alone prefetches the record after next (into L2 since session 46) and the lines
  // ~12 KiB on (avx2_pass): with none, batch-1 Q4_K read 13 GB/s with one thread where the kernel
  // read 23-30 GB/s from cache; with the next record into L1, 22-25 (docs/benchmarks.md "Engine,
  // session 39"); with the one after it, 25-34, and Q4_K_M decode ran 3-20 % faster ("Engine,
  // session 40"); on a Zen 4 host, the form of session 46 1.26x faster than that ("session 46").
  static constexpr bool kNextRecord = true;

  // Sub-block sb's weights in qs chunk 8 (sb / 2) + k of half rh (rows 8 rh..): the low (even
  // sb) or high nibbles, and Q5_K's fifth bits (bit sb of each qh byte, moved to bit 4).
  // kHigh16 (Q4_K, odd sb): the high nibbles left in place, 16 q.
  template <int sb, bool kHigh16 = false>
  [[gnu::always_inline]] static __m256i weights(const uint8_t* rec, int k, int rh) {
    const __m256i m0f = _mm256_set1_epi8(0x0F);
    const __m256i z = load32(rec + kQs + 64 * (8 * (sb / 2) + k) + 32 * rh);
    if constexpr (kHigh16) {
      static_assert(!kQ5 && sb % 2 == 1);
      return _mm256_andnot_si256(m0f, z);
    }
    __m256i w =
        sb % 2 == 0 ? _mm256_and_si256(z, m0f) : _mm256_and_si256(_mm256_srli_epi16(z, 4), m0f);
    if constexpr (kQ5) {
      const __m256i qh = load32(rec + kQh + 64 * k + 32 * rh);
      __m256i hb;
      if constexpr (sb <= 4) {
        hb = _mm256_slli_epi32(qh, 4 - sb);
      } else {
        hb = _mm256_srli_epi32(qh, sb - 4);
      }
      w = _mm256_or_si256(w, _mm256_and_si256(hb, _mm256_set1_epi8(0x10)));
    }
    return w;
  }

  // Sub-block sb's 6-bit scale for half rh's 8 rows (int32 lanes), unpacked from the 3 packed
  // chunks as q4k_scales_mins does, lane-wise.
  template <int sb>
  [[gnu::always_inline]] static __m256i sub_scale(const uint8_t* rec, int rh) {
    const __m256i s0 = load32(rec + kScales + 32 * rh);
    const __m256i sc =
        sb < 4
            ? _mm256_and_si256(s0, _mm256_set1_epi8(0x3F))
            : _mm256_or_si256(
                  _mm256_and_si256(load32(rec + kScales + 128 + 32 * rh), _mm256_set1_epi8(0x0F)),
                  _mm256_and_si256(_mm256_srli_epi32(s0, 2), _mm256_set1_epi8(0x30)));
    return _mm256_and_si256(_mm256_srli_epi32(sc, 8 * (sb % 4)), _mm256_set1_epi32(0xFF));
  }

  // The multiplier of a sub-block's dots: its scale in both int16 halves of a lane (vpmaddwd's
  // pair; sc < 64, so each widened sum stays exact) without VNNI, as an int32 (vpmulld) with it.
  [[gnu::always_inline]] static __m256i multiplier(__m256i sc) {
    if constexpr (kVnni) return sc;
    return _mm256_or_si256(sc, _mm256_slli_epi32(sc, 16));
  }

  // Half rh's mins as int16 pairs (mn0, mn2), (mn1, mn3), (mn4, mn6), (mn5, mn7): xsum's order.
  struct Mins {
    __m256i m02, m13, m46, m57;
  };
  [[gnu::always_inline]] static Mins mins(const uint8_t* rec, int rh) {
    const __m256i m0f = _mm256_set1_epi8(0x0F), pair = _mm256_set1_epi32(0x00FF00FF);
    const __m256i s1 = load32(rec + kScales + 64 + 32 * rh),
                  s2 = load32(rec + kScales + 128 + 32 * rh);
    const __m256i lo = _mm256_and_si256(s1, _mm256_set1_epi8(0x3F));
    const __m256i hi =
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(s2, 4), m0f),
                        _mm256_and_si256(_mm256_srli_epi32(s1, 2), _mm256_set1_epi8(0x30)));
    return {_mm256_and_si256(lo, pair), _mm256_and_si256(_mm256_srli_epi32(lo, 8), pair),
            _mm256_and_si256(hi, pair), _mm256_and_si256(_mm256_srli_epi32(hi, 8), pair)};
  }

  // acc + (d tot - msum dmin) d_x for one token of half rh.
  [[gnu::always_inline]] static __m256 finish(const uint8_t* rec, int rh, const Mins& m,
                                              const ActTileK* x, __m256i tot, __m256 acc) {
    const __m256 u = _mm256_mul_ps(_mm256_cvtepi32_ps(tot), f16x8(rec + 16 * rh));
    const int16_t* xs = x->xsum;
    __m256i ms = _mm256_madd_epi16(m.m02, bcast4(xs));
    ms = _mm256_add_epi32(ms, _mm256_madd_epi16(m.m13, bcast4(xs + 2)));
    ms = _mm256_add_epi32(ms, _mm256_madd_epi16(m.m46, bcast4(xs + 4)));
    ms = _mm256_add_epi32(ms, _mm256_madd_epi16(m.m57, bcast4(xs + 6)));
    const __m256 v = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(ms), f16x8(rec + 32 + 16 * rh), u);
    return _mm256_fmadd_ps(v, _mm256_set1_ps(x->d), acc);
  }

  // sc * dot(w, x) over a sub-block's 8 chunks, exact: without VNNI the int16 sums widened by
  // vpmaddwd by the scale (dot_chunks), with VNNI vpdpbusd's int32 dot times the scale.
  [[gnu::always_inline]] static __m256i scaled_dot(const __m256i* w, const int8_t* x, __m256i mul) {
    const __m256i zero = _mm256_setzero_si256();
    if constexpr (kVnni) return _mm256_mullo_epi32(dot_chunks<8, kMaxQ, true>(zero, w, x), mul);
    return dot_chunks<8, kMaxQ, false>(zero, w, x, mul);
  }

  // Super-block s's half rh for tokens x[0..NT): each sub-block's 8 chunks unpacked once for
  // all tokens.
  template <int NT>
  [[gnu::always_inline]] static void super_block(const uint8_t* rec, int rh,
                                                 const ActTileK* const* x, __m256* acc) {
    __m256i tot[NT];
    unroll<NT>([&](int n) __attribute__((always_inline)) { tot[n] = _mm256_setzero_si256(); });
    unroll<8>([&](auto sb_) __attribute__((always_inline)) {
      constexpr int sb = decltype(sb_)::value;
      const __m256i mul = multiplier(sub_scale<sb>(rec, rh));
      __m256i w[8];
      unroll<8>([&](int k) __attribute__((always_inline)) { w[k] = weights<sb>(rec, k, rh); });
      unroll<NT>([&](int n) __attribute__((always_inline)) {
        tot[n] = _mm256_add_epi32(tot[n], scaled_dot(w, x[n]->q + 32 * sb, mul));
      });
    });
    const Mins m = mins(rec, rh);
    unroll<NT>([&](int n) __attribute__((always_inline)) {
      acc[n] = finish(rec, rh, m, x[n], tot[n], acc[n]);
    });
  }

  // super_block for one token and both halves at once: each chunk's halves are unpacked and
  // multiplied by one broadcast, so that the sums, operands and accumulators stay in registers.
  [[gnu::always_inline]] static void super_block_one(const uint8_t* rec, const ActTileK* x,
                                                     __m256 (&acc)[2]) {
    // Q4_K with VNNI, odd sub-blocks: the high nibbles left in place (16 q, one AND instead of a
    // shift and an AND); their scaled dots, all multiples of 16, summed apart (tot16, below
    // 2^31) and divided by 16 once per super-block (exact).
    constexpr bool kHigh = kVnni && !kQ5;
    __m256i tot[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    __m256i tot16[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    unroll<8>([&](auto sb_) __attribute__((always_inline)) {
      constexpr int sb = decltype(sb_)::value;
      constexpr bool kHigh16 = kHigh && sb % 2 == 1;
      __m256i t[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
      __m256i s16[2][2] = {};  // without VNNI: int16 sums of 8 chunks (Q5_K: 4)
      unroll<8>([&](int k) __attribute__((always_inline)) {
        const __m256i x4 = bcast4(x->q + 32 * sb + 4 * k);
        unroll<2>([&](int rh) __attribute__((always_inline)) {
          const __m256i w = weights<sb, kHigh16>(rec, k, rh);
          if constexpr (kVnni) {
            t[rh] = dpbusd(t[rh], w, x4);
          } else {
            s16[rh][kQ5 ? k / 4 : 0] =
                _mm256_add_epi16(s16[rh][kQ5 ? k / 4 : 0], _mm256_maddubs_epi16(w, x4));
          }
        });
      });
      unroll<2>([&](int rh) __attribute__((always_inline)) {
        const __m256i mul = multiplier(sub_scale<sb>(rec, rh));
        if constexpr (kHigh16) {
          tot16[rh] = _mm256_add_epi32(tot16[rh], _mm256_mullo_epi32(t[rh], mul));
        } else if constexpr (kVnni) {
          tot[rh] = _mm256_add_epi32(tot[rh], _mm256_mullo_epi32(t[rh], mul));
        } else {
          tot[rh] = _mm256_add_epi32(tot[rh], _mm256_madd_epi16(s16[rh][0], mul));
          if constexpr (kQ5)
            tot[rh] = _mm256_add_epi32(tot[rh], _mm256_madd_epi16(s16[rh][1], mul));
        }
      });
    });
    unroll<2>([&](int rh) __attribute__((always_inline)) {
      if constexpr (kHigh) tot[rh] = _mm256_add_epi32(tot[rh], _mm256_srai_epi32(tot16[rh], 4));
      acc[rh] = finish(rec, rh, mins(rec, rh), x, tot[rh], acc[rh]);
    });
  }

  // Super-block s for halves [h0, h0 + NH).
  template <int NT, int NH>
  [[gnu::always_inline]] static void record(const MatmulJob&, const uint8_t*, const uint8_t* rec,
                                            int64_t, const ActTileK* const* x, int h0,
                                            __m256 (&acc)[NH][NT]) {
    if constexpr (NT == 1 && NH == 2) {
      __m256 both[2] = {acc[0][0], acc[1][0]};
      super_block_one(rec, x[0], both);
      acc[0][0] = both[0];
      acc[1][0] = both[1];
    } else {
      unroll<NH>([&](int hh)
                     __attribute__((always_inline)) { super_block<NT>(rec, h0 + hh, x, acc[hh]); });
    }
  }

  template <int NT>
  static void tile(const MatmulJob& j, int64_t row, int64_t tok, int64_t n_rows, TilePass pass) {
    avx2_tile<Avx2TileKernelK, ActTileK, NT>(j, row, tok, n_rows, pass);
  }
};

// --- Q6_K ------------------------------------------------------------------------------------
// A record is 52 chunks (ql 0-31, qh 32-47, scales 48-51); the tile's d values follow its last
// record, 32 bytes per super-block.
template <bool kVnni, bool kRowsIn_>
struct Avx2TileKernelQ6K {
  static constexpr bool kRowsIn = kRowsIn_;
  // The block as Avx2Rows reads it: 52 dwords (ql, qh, scales), then d.
  static constexpr int64_t kBlock = sizeof(model::BlockQ6_K);
  static constexpr int kFields = 1;
  static constexpr bool kTrailing = true, kQ5Qh = false, kFlip = false;
  static constexpr int64_t kChunks = 52;
  static constexpr int64_t kRec = 64 * kChunks;
  using Tiled = Avx2TileKernelQ6K<kVnni, false>;
  static constexpr int kMaxTok = 4;
  static constexpr int kL2StreamTok = 2;  // as Q4_K's
  static constexpr int64_t kTokBlock = 64;
  static constexpr int64_t kRecCols = kQK_K;
  static constexpr bool kNextRecord = true;  // as Q4_K's

  // Dword k of group G's weights (values 4k..4k+3 of the group per lane, unsigned 0-63), half
  // rh: ql's nibble, and qh's bits 2J..2J+1 moved to bits 4-5 by a shift. (A lookup on qh's low
  // nibble instead, for J < 2, needs two tables in registers; with them the one-token kernel
  // spilled.)
  template <int G>
  [[gnu::always_inline]] static __m256i weight(const uint8_t* rec, int k, int rh) {
    constexpr int h = G / 8, J = G / 2 % 4, half = G % 2;
    const __m256i m0f = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    const int l4 = 4 * half + k;
    const __m256i ql = load32(rec + 64 * (16 * h + 8 * (J & 1) + l4) + 32 * rh);
    const __m256i qh = load32(rec + 64 * (32 + 8 * h + l4) + 32 * rh);
    const __m256i lo =
        J < 2 ? _mm256_and_si256(ql, m0f) : _mm256_and_si256(_mm256_srli_epi16(ql, 4), m0f);
    __m256i hb;
    if constexpr (J == 0) {
      hb = _mm256_slli_epi16(qh, 4);
    } else if constexpr (J == 1) {
      hb = _mm256_slli_epi16(qh, 2);
    } else if constexpr (J == 2) {
      hb = qh;
    } else {
      hb = _mm256_srli_epi16(qh, 2);
    }
    return _mm256_or_si256(lo, _mm256_and_si256(hb, m30));
  }

  // Group G's scale for the half's 8 rows, d * sc_G (exact): the signed byte G % 4 of each row's
  // scale dword taken by two shifts (no table in a register), times the half's d.
  template <int G>
  [[gnu::always_inline]] static __m256 group_scale(const uint8_t* rec, int rh, __m256 d) {
    const __m256i sc4 = load32(rec + 64 * (48 + G / 4) + 32 * rh);
    const __m256i sc =
        _mm256_srai_epi32(G % 4 == 3 ? sc4 : _mm256_slli_epi32(sc4, 24 - 8 * (G % 4)), 24);
    return _mm256_mul_ps(_mm256_cvtepi32_ps(sc), d);
  }

  template <int NT, int... G>
  [[gnu::always_inline]] static void groups(std::integer_sequence<int, G...>, const uint8_t* rec,
                                            int rh, __m256 d, const ActTileQ6K* const* x,
                                            __m256* u) {
    auto group = [&](auto g) __attribute__((always_inline)) {
      constexpr int kG = decltype(g)::value;
      __m256i w[4];
      unroll<4>([&](int k) __attribute__((always_inline)) { w[k] = weight<kG>(rec, k, rh); });
      const __m256 ds = group_scale<kG>(rec, rh, d);
      const __m256 nmds = _mm256_mul_ps(ds, _mm256_set1_ps(-kTileMagic));  // exact
      unroll<NT>([&](int n) __attribute__((always_inline)) {
        const __m256i t =
            dot_chunks<4, 63, kVnni>(_mm256_set1_epi32(x[n]->start[kG]), w, x[n]->q + 16 * kG);
        u[n] = _mm256_add_ps(u[n], _mm256_fmadd_ps(_mm256_castsi256_ps(t), ds, nmds));
        settle(u[n]);
      });
    };
    (group(std::integral_constant<int, G>{}), ...);
  }

  // One token, both halves of a record: the sums of groups<1>, each group's activation dwords
  // broadcast once for the two halves, and written so that the loop keeps few constants in
  // registers (m0f, m30, M and, without VNNI, ones): the qh bits moved by shifts instead of a
  // lookup, each group's scale by two shifts (group_scale), and t * ds as (t - M) * ds (t - M
  // exact, one rounding: the bits of fma(M + t, ds, -M * ds)), each group settled (settle)
  // before the next.
  [[gnu::always_inline]] static void record_one(const uint8_t* rec, const uint8_t* d,
                                                const ActTileQ6K* x, __m256 (&acc)[2]) {
    const __m256 magic = _mm256_set1_ps(kTileMagic);
    __m256 u[2] = {_mm256_set1_ps(-0.f), _mm256_set1_ps(-0.f)};
    unroll<16>([&](auto g_) __attribute__((always_inline)) {
      constexpr int G = decltype(g_)::value;
      const int8_t* xq = x->q + 16 * G;
      __m256i t[2];
      t[0] = t[1] = _mm256_set1_epi32(x->start[G]);
      if constexpr (kVnni) {
        unroll<4>([&](int k) __attribute__((always_inline)) {
          const __m256i x4 = bcast4(xq + 4 * k);
          t[0] = dpbusd(t[0], weight<G>(rec, k, 0), x4);
          t[1] = dpbusd(t[1], weight<G>(rec, k, 1), x4);
        });
      } else {
        const __m256i ones = _mm256_set1_epi16(1);
        unroll<2>([&](int p) __attribute__((always_inline)) {
          const __m256i xa = bcast4(xq + 8 * p), xb = bcast4(xq + 8 * p + 4);
          unroll<2>([&](int rh) __attribute__((always_inline)) {
            const __m256i s =
                _mm256_add_epi16(_mm256_maddubs_epi16(weight<G>(rec, 2 * p, rh), xa),
                                 _mm256_maddubs_epi16(weight<G>(rec, 2 * p + 1, rh), xb));
            t[rh] = _mm256_add_epi32(t[rh], _mm256_madd_epi16(s, ones));
          });
        });
      }
      unroll<2>([&](int rh) __attribute__((always_inline)) {
        const __m256 ds = group_scale<G>(rec, rh, f16x8(d + 16 * rh));
        u[rh] = _mm256_add_ps(u[rh],
                              _mm256_mul_ps(_mm256_sub_ps(_mm256_castsi256_ps(t[rh]), magic), ds));
      });
      settle(u[0]);
      settle(u[1]);
    });
    unroll<2>([&](int rh) __attribute__((always_inline)) {
      acc[rh] = _mm256_fmadd_ps(u[rh], _mm256_set1_ps(x->d), acc[rh]);
    });
  }

  // Super-block s for halves [h0, h0 + NH); its d values follow the tile's last record (an
  // assembled record's, the record: Avx2Rows).
  template <int NT, int NH>
  [[gnu::always_inline]] static void record(const MatmulJob& j, const uint8_t* tile,
                                            const uint8_t* rec, int64_t s,
                                            const ActTileQ6K* const* x, int h0,
                                            __m256 (&acc)[NH][NT]) {
    const uint8_t* d = kRowsIn ? rec + kRec : tile + j.cols / kQK_K * kRec + 32 * s;
    if constexpr (NT == 1 && NH == 2) {
      __m256 both[2] = {acc[0][0], acc[1][0]};
      record_one(rec, d, x[0], both);
      acc[0][0] = both[0];
      acc[1][0] = both[1];
      return;
    }
    unroll<NH>([&](int hh) __attribute__((always_inline)) {
      const int rh = h0 + hh;
      const __m256 dh = f16x8(d + 16 * rh);
      __m256 u[NT];  // from -0: u = v_0 + ... exactly as ActTileQ6K's sum
      unroll<NT>([&](int n) __attribute__((always_inline)) { u[n] = _mm256_set1_ps(-0.f); });
      groups<NT>(std::make_integer_sequence<int, 16>(), rec, rh, dh, x, u);
      unroll<NT>([&](int n) __attribute__((always_inline)) {
        acc[hh][n] = _mm256_fmadd_ps(u[n], _mm256_set1_ps(x[n]->d), acc[hh][n]);
      });
    });
  }

  template <int NT>
  static void tile(const MatmulJob& j, int64_t row, int64_t tok, int64_t n_rows, TilePass pass) {
    avx2_tile<Avx2TileKernelQ6K, ActTileQ6K, NT>(j, row, tok, n_rows, pass);
  }
};

// A kernel reading rows (K) and its twin reading tiles (K::Tiled).
template <class K>
void set_pair(TypeKernels* tiles, TypeKernels* rows) {
  tiles->rows = tile16_rows<typename K::Tiled>;
  rows->rows = tile16_rows<K>;
  for (TypeKernels* k : {tiles, rows}) k->row_tile = static_cast<int>(model::kTileRows);
}

template <bool kVnni>
void set_all(KernelSet* s) {
  set_pair<Avx2TileKernelK<false, kVnni, true>>(&s->q4_k_t16, &s->q4_k);
  set_pair<Avx2TileKernelK<true, kVnni, true>>(&s->q5_k_t16, &s->q5_k);
  set_pair<Avx2TileKernelQ6K<kVnni, true>>(&s->q6_k_t16, &s->q6_k);
}

}  // namespace

void avx2_tile_rows_k(bool vnni, KernelSet* s) {
  if (vnni) {
    set_all<true>(s);
  } else {
    set_all<false>(s);
  }
}

}  // namespace troupe::compute::detail
