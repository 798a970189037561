// AVX-512 VNNI kernels for the 32-value block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) in 16-row
// tiles (model/weight_tiles.h). Vector lane i is output row i of the tile: one vpdpbusd multiplies
// 4 columns of 16 rows by the same 4 activation values (broadcast), so a 32-value block is 8
// vpdpbusd into one int32 accumulator per row (two chains, joined by one add), and its scaling is
// a subtraction, a multiply and an FMA for 16 rows (the dot starts from the bits of a float,
// ActTile32, so no convert); Q4_1 and Q5_1 add one FMA for their offsets. The row-layout
// kernels spend 3 instructions of scaling per 8 values of one row: with tiles, 8 of every 10
// multiply-pipe instructions of a token are dot products (Q8_0; the 4- and 5-bit types add their
// unpacking, shared by up to 8 tokens). What limits a pass here is the two multiply pipes, not
// the dot products' count (docs/benchmarks.md "Engine, session 27"); loads stopped binding once
// the accumulators stayed in registers: a layout with a third of the loads (4 rows x 4 tokens
// per vector) was no faster ("Engine, session 28").
// Each output is ActTile32's scalar recurrence (matmul_kernels.h), identical to the scalar
// kernel's, whatever the tile's token count (batch invariance). With VNNI the same kernels
// serve these types in ggml's rows too (kRowsIn, reading 16 rows), so a matrix gives the
// same bits mapped from its file or tiled in memory. Compiled with the AVX-512 flags of
// *_avx512.cc; runs only where VNNI was detected.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "compute/detail/avx512_common.h"
#include "compute/detail/matmul_kernels.h"
#include "compute/detail/matmul_tiles.h"
#include "model/weight_tiles.h"

namespace troupe::compute::detail {
namespace {

using model::GgmlType;

template <GgmlType kType>
void quantize_tile_act(const float* x, int64_t cols, uint8_t* out) {
  auto* a = reinterpret_cast<ActTile32*>(out);
  for (int64_t b = 0; b < cols / 32; ++b) {
    __m512i q[2];
    const float d = quantize_vecs(x + 32 * b, 2, q);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(a[b].q), _mm512_cvtepi32_epi8(q[0]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(a[b].q + 16), _mm512_cvtepi32_epi8(q[1]));
    finish_act_tile32(a[b], tile_init(kType), _mm512_reduce_add_epi32(_mm512_add_epi32(q[0], q[1])),
                      d);
  }
}

// kRowsIn: the same kernel reading a matrix in ggml's rows (a mapped file): each block of 16
// rows is read into a record's registers (TileRows: loads and a transpose for the values, a
// gather for the scales), and a last tile of fewer rows masks its lanes. Same arithmetic, so the
// same bits as the tiled matrix: where the weights live never changes a result.
template <GgmlType kType, bool kRowsIn_, bool kGfni>
struct TileKernel {
  static constexpr bool kRowsIn = kRowsIn_;
  static constexpr bool kNibbles = kType != GgmlType::kQ8_0;  // 4 or 5 bits
  static constexpr bool kFive = blocks32_five(kType);
  static constexpr bool kMin = blocks32_min(kType);
  static constexpr int64_t kFields = kMin ? 2 : 1;  // leading f16 fields: d (and m)
  static constexpr int64_t kBlock = sizeof(Block32<kType>);
  static constexpr int64_t kRec = model::kTileRows * kBlock;
  // Accumulators per pass over a tile. 16 spilled registers (16 activation pointers as well as
  // 16 accumulators): 10-15 % slower at 16 and 512 tokens (docs, "Engine, session 13").
  static constexpr int kMaxTok = 8;
  // Records prefetched ahead (prefetches past the tensor's end are harmless). A tile's only
  // pass of up to 6 tokens (TilePass::alone, TilePass::streams) reads its weights from DRAM with
  // one prefetch per page, two pages ahead (prefetch_page_ahead), and with 2 tokens or more with
  // every line kAheadStream records (~4.5 KiB) ahead into L1 as well. One token alone does
  // without the second: per record, batch-1 decode ran 10-25 % slower than with none
  // (docs/benchmarks.md "Engine, session 29"), and with none ~30 % slower than once per page
  // ("Engine, session 30"). 2 to 6 tokens took 1.1-1.5x as long with the form they had until
  // session 43, the lines 16 records ahead into L2 and no page prefetch ("Engine, session 43"),
  // which a pass of 7 or 8 tokens keeps: with the new form Q8_0 8-token decode ran ~10 % slower
  // (its weights and 8 tokens' activations crowd L1). A tile's later passes read it from L2 and
  // fetch shares of the next tile into L2 (TilePass::l2_target), and with up to kL1Tok tokens
  // the records kAheadL1 ahead into L1.
  static constexpr int64_t kAheadL1 = 4, kAheadL2 = 16,
                           kAheadStream = records_for(kStreamAhead, kRec),
                           kAheadStreamL2 = records_for(kStreamAheadL2, kRec);
  // Streaming passes of this many tokens or more also fetch each line kAheadStreamL2 records
  // (~12 KiB) on into L2 (page_ahead.h): on a Zen 4 host Q4_0 and Q8_0 products of 4-6 tokens
  // 1.0-1.6x faster (median 1.16x), Q4_0's of 3 tokens 1.05-1.5x; Q8_0 with 2 or 3 tokens (the
  // least work per byte) ran slower, the others with 2 no faster (docs/benchmarks.md "Engine,
  // session 45").
  static constexpr int kL2StreamTok = kNibbles ? 3 : 4;
  static constexpr int64_t kTokBlock = 64;  // tokens whose activations stay in L2
  // Later passes of up to this many tokens prefetch records into L1; longer ones leave it to the
  // hardware (their 5 prefetches per record took load slots from the broadcasts: 16-token
  // products ~4 % faster without, docs/benchmarks.md "Engine, session 27").
  static constexpr int kL1Tok = 2;

  // One record of a tile, ready: v[c] pairs with activation bytes 4c..4c+3 of the block
  // (4- and 5-bit types: chunks 0-3 low nibbles = values 4c.., high nibbles = values 16 + 4c..).
  struct Rec {
    __m512i v[8];
    __m512 dw;
    __m512 dm;  // Q4_1, Q5_1: the offsets m
  };

  // kHigh16 (Q4_0, Q4_1, one token): the high nibbles stay in place (16 q), one AND instead of
  // a shift and an AND; their chain is divided by 16 once per block instead (dots_high16).
  template <int NT>
  static constexpr bool kHigh16 = kNibbles && !kFive && NT == 1;

  // The fifth bits onto the nibbles, from the 16 rows' qh words in the tile's bit order
  // (model::q5_tile_qh: byte k holds at bit c value 4c + k's, at bit 4 + c value 16 + 4c + k's):
  // one shift and one ternary OR-of-AND per chunk.
  static void add_fifth_bits(__m512i h, Rec& r) {
    const __m512i bit = _mm512_set1_epi8(0x10);
    for (int c = 0; c < 4; ++c) {  // 0xF8: a | (b & c)
      r.v[c] = _mm512_ternarylogic_epi32(r.v[c], _mm512_sll_epi32(h, _mm_cvtsi32_si128(4 - c)), bit,
                                         0xF8);
      r.v[4 + c] = _mm512_ternarylogic_epi32(r.v[4 + c], _mm512_srl_epi32(h, _mm_cvtsi32_si128(c)),
                                             bit, 0xF8);
    }
  }

  // The fifth bits onto the nibbles from qh words in ggml's order (bit v: value v's), as
  // read from rows: byte k of chunk c takes bit 4c + k (low) or 16 + 4c + k (high), found by
  // copying the word's byte (4c + k) / 8 across its dword and testing one bit per byte.
  static void add_fifth_bits_ggml(__m512i h, Rec& r) {
    const __m512i bit = _mm512_set1_epi8(0x10);
    __m512i spread[4];  // byte j of h in every byte of its dword
    for (int j = 0; j < 4; ++j)
      spread[j] = _mm512_shuffle_epi8(
          h, _mm512_add_epi8(_mm512_set4_epi32(0x0C0C0C0C, 0x08080808, 0x04040404, 0),
                             _mm512_set1_epi8(static_cast<char>(j))));
    const __m512i sel[2] = {_mm512_set1_epi32(0x08040201), _mm512_set1_epi32(0x80402010)};
    for (int c = 0; c < 4; ++c) {
      const __mmask64 lo = _mm512_test_epi8_mask(spread[c / 2], sel[c % 2]);
      const __mmask64 hi = _mm512_test_epi8_mask(spread[2 + c / 2], sel[c % 2]);
      r.v[c] = _mm512_mask_add_epi8(r.v[c], lo, r.v[c], bit);
      r.v[4 + c] = _mm512_mask_add_epi8(r.v[4 + c], hi, r.v[4 + c], bit);
    }
  }

  template <bool kHi16 = false>
  static Rec load(const uint8_t* rec) {
    Rec r;
    r.dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec)));
    r.dm = kMin ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + 32)))
                : _mm512_setzero_ps();
    const uint8_t* q = rec + 2 * model::kTileRows * kFields;
    if constexpr (kNibbles) {
      const uint8_t* qs = q + (kFive ? 64 : 0);
      const __m512i m4 = _mm512_set1_epi8(0x0F);
      for (int c = 0; c < 4; ++c) {
        const __m512i z = _mm512_loadu_si512(qs + 64 * c);
        r.v[c] = _mm512_and_si512(z, m4);
        r.v[4 + c] = kHi16 ? _mm512_andnot_si512(m4, z) : high_nibbles<kGfni>(z);
      }
      if constexpr (kFive) add_fifth_bits(_mm512_loadu_si512(q), r);
    } else {
      for (int c = 0; c < 8; ++c) r.v[c] = _mm512_loadu_si512(q + 64 * c);
    }
    return r;
  }

  // A token block's start and d in every lane pair, by one 8-byte broadcast: loads are what a
  // pass runs short of first (two per cycle, and every vpdpbusd takes one for its broadcast),
  // while the shuffles that split it run on pipes the dot products leave idle.
  static __m512i start_d(const ActTile32& a) {
    static_assert(offsetof(ActTile32, d) == offsetof(ActTile32, start) + 4);
    int64_t sd = 0;
    std::memcpy(&sd, &a.start, sizeof sd);
    return _mm512_set1_epi64(sd);
  }
  static __m512i start_of(__m512i sd) { return _mm512_shuffle_epi32(sd, _MM_PERM_AAAA); }
  static __m512 d_of(__m512i sd) {
    return _mm512_castsi512_ps(_mm512_shuffle_epi32(sd, _MM_PERM_BBBB));
  }

  // The exact dots of the 16 rows with one token's block, in two chains of 4 vpdpbusd: one
  // chain of 8 left the tile's 8 tokens waiting on its latency (16-token products 20-30 %
  // slower, docs/benchmarks.md "Engine, session 12"); one chain per token with the tile's
  // tokens interleaved was no faster at 16 to 512 tokens and slower for Q8_0 at 2 to 8
  // ("Engine, session 13"). Integer sums: the order is free.
  static __m512i dots(const Rec& r, const ActTile32& a, __m512i sd) {
    __m512i s0 = start_of(sd), s1 = _mm512_setzero_si512();
    for (int c = 0; c < 8; c += 2) {
      s0 = dot_u8s8_bcast(s0, r.v[c], a.q + 4 * c);
      s1 = dot_u8s8_bcast(s1, r.v[c + 1], a.q + 4 * c + 4);
    }
    return _mm512_add_epi32(s0, s1);
  }

  // acc + (the block's dots x d_x) x d_w, ActTile32's recurrence: x's int32 lanes are the
  // floats M + dot (the dot started from M's bits), so x - M is the dot exactly and one
  // multiply is float(dot) x d_x rounded once, as the scalar recurrence's. The subtraction
  // runs beside the dot products; an FMA with -M d_x (the earlier form) cost a load more.
  // Q4_1 and Q5_1 then add the offsets' term, acc + d_x sum(x) x m_w.
  static __m512 scale(__m512i x, const ActTile32& a, __m512i sd, const Rec& r, __m512 acc) {
    const __m512 t =
        _mm512_mul_ps(_mm512_sub_ps(_mm512_castsi512_ps(x), _mm512_set1_ps(kTileMagic)), d_of(sd));
    acc = _mm512_fmadd_ps(t, r.dw, acc);
    if constexpr (kMin) acc = _mm512_fmadd_ps(_mm512_set1_ps(a.dsum), r.dm, acc);
    return acc;
  }

  // Block b of the 16 rows as a record (load()'s registers), lanes in TileRows' order.
  template <bool kHi16 = false>
  static Rec gather(const TileRows& src, const uint8_t* base, int64_t b) {
    auto dwords = [&](int64_t off) { return src.gather(base, b * kBlock + off); };
    Rec r;
    // The dword at the block's start: its f16 scale (low half; masked lanes 0) and, for Q4_1
    // and Q5_1, its offset (high half).
    const __m512i d = dwords(0);
    r.dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(d));
    r.dm = kMin ? _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(d, 16)))
                : _mm512_setzero_ps();
    if constexpr (kNibbles) {
      const int64_t qs = 2 * kFields + (kFive ? 4 : 0);
      const __m512i m4 = _mm512_set1_epi8(0x0F);
      __m512i z[4];
      src.load16(b * kBlock + qs, z);
      for (int c = 0; c < 4; ++c) {
        r.v[c] = _mm512_and_si512(z[c], m4);
        r.v[4 + c] = kHi16 ? _mm512_andnot_si512(m4, z[c]) : high_nibbles<kGfni>(z[c]);
      }
      if constexpr (kFive) add_fifth_bits_ggml(dwords(2 * kFields), r);
    } else {
      const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));  // int8 -> q + 128
      src.load16(b * kBlock + 2, r.v);
      src.load16(b * kBlock + 18, r.v + 4);
      for (int c = 0; c < 8; ++c) r.v[c] = _mm512_xor_si512(r.v[c], flip);
    }
    return r;
  }

  // dots() for a Rec loaded with kHigh16: the high chain sums 16 q x, a multiple of 16 below
  // 2^31 (4 x 4 x 240 x 128 per lane), so the shift is exact and the dots are dots()'s.
  static __m512i dots_high16(const Rec& r, const ActTile32& a, __m512i sd) {
    __m512i s0 = start_of(sd), s1 = _mm512_setzero_si512();
    for (int c = 0; c < 4; ++c) {
      s0 = dot_u8s8_bcast(s0, r.v[c], a.q + 4 * c);
      s1 = dot_u8s8_bcast(s1, r.v[4 + c], a.q + 16 + 4 * c);
    }
    return _mm512_add_epi32(s0, _mm512_srai_epi32(s1, 4));
  }

  // Rows [row, row + n_rows) (n_rows < 16 only for kRowsIn's last tile) x tokens
  // [tok, tok + NT).
  template <int NT>
  static void tile(const MatmulJob& j, int64_t row, int64_t tok, int64_t n_rows, TilePass pass) {
    const uint8_t* w = j.w + row * j.w_row_bytes;
    const ActTile32* a[NT];
    unroll<NT>([&](int n) __attribute__((always_inline)) {
      a[n] = reinterpret_cast<const ActTile32*>(j.act + (tok + n) * j.act_stride);
    });
    __m512 acc[NT];
    unroll<NT>([&](int n) __attribute__((always_inline)) { acc[n] = _mm512_setzero_ps(); });
    const int64_t nb = j.cols / 32;
    [[maybe_unused]] const std::conditional_t<kRowsIn, TileRows, NoRows> src(w, j.w_row_bytes,
                                                                             n_rows);
    constexpr bool kHi16 = kHigh16<NT>;
    [[maybe_unused]] int64_t l2_due = pass.index;
    const bool stream = pass.alone(NT) || pass.streams(NT);
    for (int64_t b = 0; b < nb; ++b) {
      Rec r;
      if constexpr (kRowsIn) {
        // The next tile's rows at this block (the rows after this tile's, in the file).
        if ((b * kBlock) % 64 < kBlock)
          for (int i = 0; i < 16; ++i) prefetch_l1(w + (16 + i) * j.w_row_bytes + b * kBlock);
        r = gather<kHi16>(src, w, b);
      } else {
        const uint8_t* rec = w + b * kRec;
        if (stream) {
          prefetch_page_ahead(rec, kRec);
          if constexpr (NT >= kL2StreamTok)
            for (int64_t o = 0; o < kRec; o += 64) prefetch_l2(rec + kAheadStreamL2 * kRec + o);
          if constexpr (NT > 1)
            for (int64_t o = 0; o < kRec; o += 64) prefetch_l1(rec + kAheadStream * kRec + o);
        } else {
          if (NT <= kL1Tok)
            for (int64_t o = 0; o < kRec; o += 64) prefetch_l1(rec + kAheadL1 * kRec + o);
          if (const uint8_t* l2 = pass.l2_target(b, &l2_due, rec + kAheadL2 * kRec,
                                                 rec + model::kTileRows * j.w_row_bytes))
            for (int64_t o = 0; o < kRec; o += 64) prefetch_l2(l2 + o);
        }
        r = load<kHi16>(rec);
      }
      unroll<NT>([&](int n) __attribute__((always_inline)) {
        const ActTile32& ab = a[n][b];
        const __m512i sd = start_d(ab);
        acc[n] = scale(kHi16 ? dots_high16(r, ab, sd) : dots(r, ab, sd), ab, sd, r, acc[n]);
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

template <GgmlType kType, bool kRowsIn, bool kGfni>
TypeKernels tile_kernels() {
  TypeKernels k;
  k.act_row_bytes = act_tile32_bytes;
  k.quantize = quantize_tile_act<kType>;
  k.rows = tile16_rows<TileKernel<kType, kRowsIn, kGfni>>;
  k.row_tile = static_cast<int>(model::kTileRows);
  return k;
}

}  // namespace

namespace {
// A type's tile kernels and the ones reading rows; gfni: unpack nibbles with GFNI (the same bits).
template <GgmlType kType>
void tile_kernel_pair(bool gfni, TypeKernels* tiles, TypeKernels* rows) {
  *tiles = gfni ? tile_kernels<kType, false, true>() : tile_kernels<kType, false, false>();
  *rows = gfni ? tile_kernels<kType, true, true>() : tile_kernels<kType, true, false>();
}
}  // namespace

void avx512_tile_kernels(bool gfni, TypeKernels* q8_0, TypeKernels* q4_0, TypeKernels* q8_0_rows,
                         TypeKernels* q4_0_rows) {
  // Q8_0 has no 4-bit values: one instantiation serves both.
  tile_kernel_pair<GgmlType::kQ8_0>(false, q8_0, q8_0_rows);
  tile_kernel_pair<GgmlType::kQ4_0>(gfni, q4_0, q4_0_rows);
}

void avx512_tile_kernels_q451(bool gfni, KernelSet* s) {
  tile_kernel_pair<GgmlType::kQ4_1>(gfni, &s->q4_1_t16, &s->q4_1);
  tile_kernel_pair<GgmlType::kQ5_0>(gfni, &s->q5_0_t16, &s->q5_0);
  tile_kernel_pair<GgmlType::kQ5_1>(gfni, &s->q5_1_t16, &s->q5_1);
}

}  // namespace troupe::compute::detail
