// AVX2 kernels for the 32-value block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) in 16-row tiles
// (model/weight_tiles.h), for CPUs without AVX-512. A 64-byte chunk of a record holds 4 bytes of
// each of 16 rows: its two 32-byte halves are rows 0-7 and 8-15, so one 256-bit load gives 4
// columns of 8 output rows, lane i being row i of the half, and one vpmaddubsw multiplies them
// all by the same 4 activation values (broadcast). The row kernels these replaced spent their
// scaling and a horizontal sum on each row: on one core, batch-1 Q4_0 read 13-17 GB/s from DRAM
// and 26-30 GB/s from cache with them, 35-39 and 50-63 with these (docs/benchmarks.md "Engine,
// session 39"). The same kernels read matrices in ggml's rows (kRowsIn: a mapped file), each
// record assembled in the tile's layout first, so that a matrix gives the same bits mapped or
// copied ("Engine, session 40").
//
// Each output is ActTile32's scalar recurrence (matmul_kernels.h), the same bits as the scalar
// and AVX-512 tile kernels. The integer dot of a block is exact:
//   - vpmaddubsw (unsigned weights x signed activations, |x| <= 127) sums pairs into int16
//     without saturating while the sum stays below 2^15, so the int16 sums are widened by
//     vpmaddwd before they could exceed it: 16 products of 4-bit weights (16 x 15 x 127), 8 of
//     5-bit ones (8 x 31 x 127);
//   - Q8_0's tiles store q + 128 (0..255), whose pairs could overflow, so the kernel takes
//     q = u - 128 back and multiplies |q| (at most 128) by the activations given q's sign, each
//     pair sum (at most 2 x 128 x 127) widened at once; its dot then starts from M alone;
//   - with AVX-VNNI (vpdpbusd, the avx2-vnni set) the products go straight into int32 lanes.
// The dot starts from ActTile32::start (the bits of M plus the weights' folded offset), so its
// int32 lanes are the floats M + dot, and (M + dot) - M is float(dot) exactly.
// Compiled with the AVX2 flags of *_avx2.cc.
#include <immintrin.h>

#include <cstdint>

#include "compute/detail/avx2_common.h"
#include "compute/detail/matmul_kernels.h"
#include "compute/detail/matmul_tiles.h"
#include "compute/detail/unroll.h"
#include "model/weight_tiles.h"

namespace troupe::compute::detail {
namespace {

using model::GgmlType;

// kRowsIn: the same kernel reading ggml's rows (a mapped file), each record assembled in the
// tile's layout first (Avx2Rows, detail/avx2_common.h): the same bits as the tiled matrix.
template <GgmlType kType, bool kVnni, bool kRowsIn_>
struct Avx2TileKernel {
  static constexpr bool kRowsIn = kRowsIn_;
  static constexpr bool kQ8 = kType == GgmlType::kQ8_0;
  static constexpr bool kFive = blocks32_five(kType);
  static constexpr bool kMin = blocks32_min(kType);
  static constexpr int kFields = kMin ? 2 : 1;  // leading f16 fields: d (and m)
  // The block as Avx2Rows reads it: fields, then dwords (Q5's qh word, then qs).
  static constexpr int64_t kBlock = sizeof(Block32<kType>);
  static constexpr bool kTrailing = false, kQ5Qh = kFive, kFlip = kQ8;
  static constexpr int64_t kChunks = (kBlock - 2 * kFields) / 4;
  static constexpr int64_t kRec = model::kTileRows * kBlock;
  using Tiled = Avx2TileKernel<kType, kVnni, false>;
  static constexpr int64_t kQh = 2 * model::kTileRows * kFields;  // Q5: the qh chunk
  static constexpr int64_t kQs = kQh + (kFive ? 64 : 0);          // the value chunks
  // Without VNNI, Q5 keeps two int16 sums per token (the others one): fewer tokens per pass so
  // that the sums and accumulators stay in the 16 registers.
  static constexpr bool kTwoSums = !kVnni && kFive;
  static constexpr int kMaxTok = kTwoSums ? 3 : 4;
  // A streaming pass of this many tokens also prefetches into L2 (avx2_pass): Q8_0, the least
  // work per byte, was no faster with 2 (docs/benchmarks.md "Engine, session 45").
  static constexpr int kL2StreamTok = kQ8 ? 3 : 2;
  static constexpr int64_t kTokBlock = 64;  // tokens whose activations stay in L2
  static constexpr int64_t kRecCols = 32;
  // One token alone prefetches a page ahead only: the next record into L1 as well made batch-1
  // Q4_0 slower (52 against 68-72 GB/s with two threads; Q8_0 the same).
  static constexpr bool kNextRecord = false;

  // The value bytes of half h (rows 8h..8h+7) of chunk c.
  static __m256i chunk(const uint8_t* rec, int64_t c, int h) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + kQs + 64 * c + 32 * h));
  }

  // The int32 lanes M + offset + dot of the half's 8 rows with token n's block, for every n.
  template <int NT>
  static void dots(const uint8_t* rec, int h, const ActTile32* const* ab, __m256i (&out)[NT]) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i ones = _mm256_set1_epi16(1);
    if constexpr (kQ8) {
      if constexpr (kVnni) {
        __m256i s0[NT], s1[NT];
        unroll<NT>([&](int n) __attribute__((always_inline)) {
          s0[n] = _mm256_set1_epi32(ab[n]->start);
          s1[n] = _mm256_setzero_si256();
        });
        unroll<4>([&](int c) __attribute__((always_inline)) {
          const __m256i u0 = chunk(rec, 2 * c, h), u1 = chunk(rec, 2 * c + 1, h);
          unroll<NT>([&](int n) __attribute__((always_inline)) {
            s0[n] = dpbusd(s0[n], u0, bcast4(ab[n]->q + 8 * c));
            s1[n] = dpbusd(s1[n], u1, bcast4(ab[n]->q + 8 * c + 4));
          });
        });
        unroll<NT>([&](int n)
                       __attribute__((always_inline)) { out[n] = _mm256_add_epi32(s0[n], s1[n]); });
      } else {
        // q = u - 128 as int8: |q| (at most 128) by the activations given q's sign, whose pair
        // sums stay below 2^15 (2 x 128 x 127), widened at once.
        const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
        __m256i s[NT];
        // The dot of q itself starts from M: ActTile32::start also folds in the stored
        // offset's -128 sum(x), which this dot does not need.
        unroll<NT>([&](int n) __attribute__((always_inline)) {
          s[n] = _mm256_set1_epi32(kTileMagicBits);
        });
        unroll<8>([&](int c) __attribute__((always_inline)) {
          const __m256i q = _mm256_xor_si256(chunk(rec, c, h), flip);
          const __m256i mag = _mm256_abs_epi8(q);
          unroll<NT>([&](int n) __attribute__((always_inline)) {
            const __m256i x = _mm256_sign_epi8(bcast4(ab[n]->q + 4 * c), q);
            s[n] = _mm256_add_epi32(s[n], _mm256_madd_epi16(_mm256_maddubs_epi16(mag, x), ones));
          });
        });
        unroll<NT>([&](int n) __attribute__((always_inline)) { out[n] = s[n]; });
      }
    } else {
      // Chunk c: low nibbles are values 4c.., high nibbles 16 + 4c.. (plus Q5's fifth bits:
      // byte k of the tile's qh word holds at bit c value 4c + k's, at bit 4 + c value
      // 16 + 4c + k's, model::q5_tile_qh).
      __m256i qh = _mm256_setzero_si256();
      if constexpr (kFive)
        qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + kQh + 32 * h));
      __m256i s0[NT], s1[NT];
      unroll<NT>([&](int n) __attribute__((always_inline)) {
        s0[n] = kVnni ? _mm256_set1_epi32(ab[n]->start) : _mm256_setzero_si256();
        s1[n] = _mm256_setzero_si256();
      });
      unroll<4>([&](int c) __attribute__((always_inline)) {
        const __m256i z = chunk(rec, c, h);
        __m256i lo = _mm256_and_si256(z, m4);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(z, 4), m4);
        if constexpr (kFive) {
          const __m256i bit = _mm256_set1_epi8(0x10);
          lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi32(qh, 4 - c), bit));
          hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_srli_epi32(qh, c), bit));
        }
        unroll<NT>([&](int n) __attribute__((always_inline)) {
          const __m256i xl = bcast4(ab[n]->q + 4 * c), xh = bcast4(ab[n]->q + 16 + 4 * c);
          if constexpr (kVnni) {
            s0[n] = dpbusd(s0[n], lo, xl);
            s1[n] = dpbusd(s1[n], hi, xh);
          } else if constexpr (kFive) {
            s0[n] = _mm256_add_epi16(s0[n], _mm256_maddubs_epi16(lo, xl));
            s1[n] = _mm256_add_epi16(s1[n], _mm256_maddubs_epi16(hi, xh));
          } else {
            s0[n] = _mm256_add_epi16(s0[n], _mm256_add_epi16(_mm256_maddubs_epi16(lo, xl),
                                                             _mm256_maddubs_epi16(hi, xh)));
          }
        });
      });
      unroll<NT>([&](int n) __attribute__((always_inline)) {
        if constexpr (kVnni) {
          out[n] = _mm256_add_epi32(s0[n], s1[n]);
        } else {
          __m256i d = _mm256_madd_epi16(s0[n], ones);
          if constexpr (kFive) d = _mm256_add_epi32(d, _mm256_madd_epi16(s1[n], ones));
          out[n] = _mm256_add_epi32(_mm256_set1_epi32(ab[n]->start), d);
        }
      });
    }
  }

  // Record b (block column b) for halves [h0, h0 + NH): each output's recurrence
  // acc = fma(float(dot) * d_x, d_w, acc) (+ fma(dsum, m_w, acc)).
  template <int NT, int NH>
  [[gnu::always_inline]] static void record(const MatmulJob&, const uint8_t*, const uint8_t* rec,
                                            int64_t, const ActTile32* const* ab, int h0,
                                            __m256 (&acc)[NH][NT]) {
    const __m256 magic = _mm256_set1_ps(kTileMagic);
    unroll<NH>([&](int hh) __attribute__((always_inline)) {
      const int h = h0 + hh;
      __m256i x[NT];
      dots<NT>(rec, h, ab, x);
      const __m256 dw = f16x8(rec + 16 * h);
      const __m256 dm = kMin ? f16x8(rec + 32 + 16 * h) : _mm256_setzero_ps();
      unroll<NT>([&](int n) __attribute__((always_inline)) {
        const __m256 t = _mm256_mul_ps(_mm256_sub_ps(_mm256_castsi256_ps(x[n]), magic),
                                       _mm256_set1_ps(ab[n]->d));
        acc[hh][n] = _mm256_fmadd_ps(t, dw, acc[hh][n]);
        if constexpr (kMin)
          acc[hh][n] = _mm256_fmadd_ps(_mm256_set1_ps(ab[n]->dsum), dm, acc[hh][n]);
      });
    });
  }

  template <int NT>
  static void tile(const MatmulJob& j, int64_t row, int64_t tok, int64_t n_rows, TilePass pass) {
    avx2_tile<Avx2TileKernel, ActTile32, NT>(j, row, tok, n_rows, pass);
  }
};

// A type's kernel reading rows and its twin reading tiles (the same arithmetic), without or with
// VNNI.
template <GgmlType kType>
void set_pair(bool vnni, TypeKernels* tiles, TypeKernels* rows) {
  using Plain = Avx2TileKernel<kType, false, true>;
  using Vnni = Avx2TileKernel<kType, true, true>;
  tiles->rows = vnni ? tile16_rows<typename Vnni::Tiled> : tile16_rows<typename Plain::Tiled>;
  rows->rows = vnni ? tile16_rows<Vnni> : tile16_rows<Plain>;
  for (TypeKernels* k : {tiles, rows}) k->row_tile = static_cast<int>(model::kTileRows);
}

}  // namespace

void avx2_tile_rows(bool vnni, KernelSet* s) {
  set_pair<GgmlType::kQ8_0>(vnni, &s->q8_0_t16, &s->q8_0);
  set_pair<GgmlType::kQ4_0>(vnni, &s->q4_0_t16, &s->q4_0);
  set_pair<GgmlType::kQ4_1>(vnni, &s->q4_1_t16, &s->q4_1);
  set_pair<GgmlType::kQ5_0>(vnni, &s->q5_0_t16, &s->q5_0);
  set_pair<GgmlType::kQ5_1>(vnni, &s->q5_1_t16, &s->q5_1);
}

}  // namespace troupe::compute::detail
