// The attention kernel of vec_ops.h for a SIMD level, over a vector-traits type V that the
// level's file defines (vec_ops_avx2.cc, vec_ops_avx512.cc; see AttendTraits there):
//   V::kLanes; V::Reg; zero(), set1(f), load(p), load_n(p, k) (first k lanes, rest 0),
//   load_f16(h), load_bf16(h) (kLanes f16 or bf16 values, exactly as floats),
//   store(p, r), store_n(p, r, k), add, sub, mul, max, fmadd(a, b, c) = a * b + c,
//   lane_sums(Reg (&)[kLanes]) (lane i = the sum of every lane of input i), hsum(r),
//   hmax(r), exp_nonpos(r) (e^x for x <= 0; below -87 it is 0).
// Everything is in an unnamed namespace: each including file keeps its own copy built for its
// instruction set.
//
// K/V rows of f16 or bf16 (KvView::type) are read as the floats they hold, so the arithmetic is
// the same as on an f32 cache holding those values.
// Fixed arithmetic order, so a head's result depends only on its query row, the K/V rows and
// n (never on its neighbours in the group, the positions' alignment or the thread):
//  - score(j) = lane_sums over [q[c] * k_j[c] accumulated over the dk chunks c in order] * scale
//    for keys in rows; for keys by dimension (KvView::k_by_dim), (q[0] k_j[0] + q[1] k_j[1] + ...
//    by FMA, in the order of the dimensions) * scale, each position in its own lane;
//  - the softmax sum runs in lanes over position chunks in order, then hsum;
//  - out[d] = (sum over j in order of e_j * v_j[d], by FMA) * (1 / sum).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "compute/detail/unroll.h"
#include "compute/vec_ops.h"

namespace troupe::compute::detail {
namespace {  // NOLINT(google-build-namespaces): one copy per SIMD level, see above

// A K/V value as the cache stores it.
template <KvType kT>
using KvElem = std::conditional_t<kT == KvType::kF32, float, uint16_t>;

// kLanes stored values (the first k of them, the rest 0) as floats.
template <class V, KvType kT>
typename V::Reg load_kv(const KvElem<kT>* p) {
  if constexpr (kT == KvType::kF32) {
    return V::load(p);
  } else if constexpr (kT == KvType::kF16) {
    return V::load_f16(p);
  } else {
    return V::load_bf16(p);
  }
}
template <class V, KvType kT>
typename V::Reg load_kv_n(const KvElem<kT>* p, int k) {
  if constexpr (kT == KvType::kF32) {
    return V::load_n(p, k);
  } else {
    uint16_t t[V::kLanes] = {};  // +0 in either format
    std::memcpy(t, p, static_cast<size_t>(k) * sizeof(uint16_t));
    return load_kv<V, kT>(t);
  }
}

// How far ahead of the rows it reads attention prefetches them: the V row kValueAhead positions
// on (keys by dimension: kChunksAhead below). A decode step reads every layer's K and V from
// memory once, and the hardware prefetchers follow a KV head's rows only as far as a block's
// run of them goes (docs/benchmarks.md "Engine, session 35"). Keys in rows (MLA's: 2.3 KB
// each, a block's rows contiguous) are not prefetched: their scores ran no faster with the next
// rows prefetched into L1 or L2 ("Engine, session 37").
constexpr int64_t kValueAhead = 64;

// The weighted values of HB heads over R registers of value columns from column `col` (the last
// register holding `last` lanes, all of them when kFull): out_h = (sum over j in order of
// e_h[j] * v_j, by FMA) * inv_h. Each V row is read once for all HB heads (a head's sum is the
// same whatever heads share its pass); the HB * R accumulators stay in registers (indexed
// through unroll: with loops g++ 12 stored them all to the stack at every position).
template <class V, KvType kT, int HB, int R, bool kFull>
void weighted_values(const KvElem<kT>* const* rows, int64_t n, int64_t col, const float* e,
                     int64_t e_stride, const float* inv, int last, float* out, int64_t out_stride) {
  using Reg = typename V::Reg;
  constexpr int L = V::kLanes;
  Reg acc[HB][R];
  unroll<HB>([&](auto h) __attribute__((always_inline)) {
    unroll<R>([&](auto r) __attribute__((always_inline)) { acc[h][r] = V::zero(); });
  });
  for (int64_t j = 0; j < n; ++j) {
    const KvElem<kT>* v = rows[j] + col;
    // This pass's part of a V row kValueAhead positions on (rows past n are row 0's).
    const auto* ahead = reinterpret_cast<const char*>(rows[j + kValueAhead] + col);
    for (int64_t o = 0; o < R * L * static_cast<int64_t>(sizeof(KvElem<kT>)); o += 64)
      __builtin_prefetch(ahead + o);
    Reg vr[R];
    unroll<R>([&](auto r) __attribute__((always_inline)) {
      if (kFull || r + 1 < R) {
        vr[r] = load_kv<V, kT>(v + r * L);
      } else {
        vr[r] = load_kv_n<V, kT>(v + r * L, last);
      }
    });
    unroll<HB>([&](auto h) __attribute__((always_inline)) {
      const Reg w = V::set1(e[h * e_stride + j]);
      unroll<R>([&](auto r)
                    __attribute__((always_inline)) { acc[h][r] = V::fmadd(w, vr[r], acc[h][r]); });
    });
  }
  unroll<HB>([&](auto h) __attribute__((always_inline)) {
    const Reg s = V::set1(inv[h]);
    float* o = out + h * out_stride;
    unroll<R>([&](auto r) __attribute__((always_inline)) {
      if (kFull || r + 1 < R) {
        V::store(o + r * L, V::mul(acc[h][r], s));
      } else {
        V::store_n(o + r * L, V::mul(acc[h][r], s), last);
      }
    });
  });
}

// Heads per values pass (1, 2, 4 or 8) and the registers of columns each pass may hold for
// them: 16 accumulators (8 heads x 2 registers ... 1 head x 8), so that the V rows are read
// once for as many heads as the registers allow.
constexpr int kValueAccs = 16;
constexpr int value_regs(int hb) { return std::min(8, kValueAccs / hb); }

// weighted_values<V, kT, HB, r, full> for r = 1 .. value_regs(HB).
template <class V, KvType kT, int HB, bool kFull>
auto value_pass(int64_t regs) {
  using Fn = void (*)(const KvElem<kT>* const*, int64_t, int64_t, const float*, int64_t,
                      const float*, int, float*, int64_t);
  static constexpr auto kPasses = []<int... R>(std::integer_sequence<int, R...>) {
    return std::array<Fn, sizeof...(R)>{&weighted_values<V, kT, HB, R + 1, kFull>...};
  }
  (std::make_integer_sequence<int, value_regs(HB)>{});
  return kPasses[static_cast<size_t>(regs - 1)];
}

// The weighted values of heads [h0, h0 + HB) over every column, in passes of value_regs(HB)
// registers.
template <class V, KvType kT, int HB>
void values_of_heads(const KvElem<kT>* const* rows, int64_t n, const float* e, int64_t e_stride,
                     const float* inv, int64_t dv, float* out, int64_t out_stride) {
  constexpr int L = V::kLanes;
  constexpr int64_t kCols = value_regs(HB) * L;
  for (int64_t c0 = 0; c0 < dv; c0 += kCols) {
    const int64_t cols = std::min(kCols, dv - c0);
    const int64_t regs = (cols + L - 1) / L;
    const int last = static_cast<int>(cols - (regs - 1) * L);
    (last == L ? value_pass<V, kT, HB, true>(regs) : value_pass<V, kT, HB, false>(regs))(
        rows, n, c0, e, e_stride, inv, last, out + c0, out_stride);
  }
}

// Query registers held per head in a pass of the row score loop, for HP heads per pass (each
// at L / HP positions): with the L accumulators, 24 of AVX-512's 32 registers, 12 of AVX2's 16.
template <class V, int HP>
constexpr int kScoreRegs = (V::kLanes >= 16 ? 8 : 4) / HP;

// HP heads' scores at P = L / HP positions (keys in rows): acc[h P + i] += q_h[c, c + QR L) .
// k_i[...] for the positions i, chunk by chunk in order (each sum in the order of the plain loop
// over chunks); each K load feeds every head of the pass.
template <class V, KvType kT, int HP, int QR>
[[gnu::always_inline]] inline void score_chunks(const float* const* qh, const KvElem<kT>* const* kr,
                                                int64_t c, typename V::Reg (&acc)[V::kLanes]) {
  constexpr int L = V::kLanes, P = L / HP;
  typename V::Reg a[HP][QR];
  unroll<HP>([&](auto h) __attribute__((always_inline)) {
    unroll<QR>([&](auto r)
                   __attribute__((always_inline)) { a[h][r] = V::load(qh[h] + c + r * L); });
  });
  unroll<P>([&](auto i) __attribute__((always_inline)) {
    const KvElem<kT>* k = kr[i] + c;
    unroll<QR>([&](auto r) __attribute__((always_inline)) {
      const typename V::Reg kv = load_kv<V, kT>(k + r * L);
      unroll<HP>([&](auto h) __attribute__((always_inline)) {
        acc[h * P + i] = V::fmadd(a[h][r], kv, acc[h * P + i]);
      });
    });
  });
}

// score_chunks for 1 .. kScoreRegs registers.
template <class V, KvType kT, int HP, int QR = kScoreRegs<V, HP>>
[[gnu::always_inline]] inline void score_regs(int regs, const float* const* qh,
                                              const KvElem<kT>* const* kr, int64_t c,
                                              typename V::Reg (&acc)[V::kLanes]) {
  if constexpr (QR > 1) {
    if (regs < QR) return score_regs<V, kT, HP, QR - 1>(regs, qh, kr, c, acc);
  }
  score_chunks<V, kT, HP, QR>(qh, kr, c, acc);
}

// Keys by dimension (KvView::k_by_dim): a chunk of up to kLanes positions of one block, its
// key values for dimension d at k + d * block_size, its scores at index `at` of a score row.
struct KeyChunk {
  const void* k;
  int64_t at;
  int lanes;
};

// How many chunks ahead the by-dimension scores prefetch their keys (a chunk of 16 positions of
// 64 f32 dimensions is 4 KiB). Every line of a chunk is prefetched: fetching every 4th or 16th
// line, or 8 or 16 chunks ahead, was no faster (docs/benchmarks.md "Engine, session 36").
constexpr int64_t kChunksAhead = 4;

// Scores of HB heads (rows of q, q_stride apart) at PC chunks (all kLanes wide when kFull, else
// the one chunk of `lanes`): acc[h][c] = sum over d in order of q_h[d] * k_c[d] by FMA, one
// position per lane; then stored times scale at s + h * s_stride + at_c. The HB * PC sums are
// independent chains, so that the FMAs' latency is hidden. With `ahead`, the keys of the chunks
// kChunksAhead on are prefetched, one line per dimension.
template <class V, KvType kT, int HB, int PC, bool kFull>
void key_scores(const float* q, int64_t q_stride, int64_t dk, int64_t bs, const KeyChunk* ch,
                bool ahead, float scale, float* s, int64_t s_stride) {
  using Reg = typename V::Reg;
  using Elem = KvElem<kT>;
  const Reg vscale = V::set1(scale);
  Reg acc[HB][PC];
  const Elem* k[PC];
  const char* pf[PC];
  unroll<PC>([&](auto c) __attribute__((always_inline)) {
    k[c] = static_cast<const Elem*>(ch[c].k);
    pf[c] = static_cast<const char*>(ch[c + kChunksAhead].k);
    unroll<HB>([&](auto h) __attribute__((always_inline)) { acc[h][c] = V::zero(); });
  });
  const int lanes = ch[0].lanes;
  for (int64_t d = 0; d < dk; ++d) {
    Reg kv[PC];
    unroll<PC>([&](auto c) __attribute__((always_inline)) {
      if (ahead) __builtin_prefetch(pf[c] + d * bs * static_cast<int64_t>(sizeof(Elem)));
      kv[c] = kFull ? load_kv<V, kT>(k[c] + d * bs) : load_kv_n<V, kT>(k[c] + d * bs, lanes);
    });
    unroll<HB>([&](auto h) __attribute__((always_inline)) {
      const Reg qd = V::set1(q[h * q_stride + d]);
      unroll<PC>([&](auto c) __attribute__((always_inline)) {
        acc[h][c] = V::fmadd(qd, kv[c], acc[h][c]);
      });
    });
  }
  unroll<HB>([&](auto h) __attribute__((always_inline)) {
    unroll<PC>([&](auto c) __attribute__((always_inline)) {
      V::store(s + h * s_stride + ch[c].at, V::mul(acc[h][c], vscale));
    });
  });
}

// Accumulators the by-dimension scores keep: 16 of AVX-512's 32 registers, 8 of AVX2's 16.
template <class V>
constexpr int kKeyAccs = V::kLanes >= 16 ? 16 : 8;

// key_scores for HB = 1 << hb and PC = 1 << pc (full chunks), where HB * PC <= kKeyAccs.
template <class V, KvType kT>
using KeyScoresFn = void (*)(const float*, int64_t, int64_t, int64_t, const KeyChunk*, bool, float,
                             float*, int64_t);
template <class V, KvType kT, int H, int C>
constexpr KeyScoresFn<V, kT> key_entry() {
  if constexpr ((1 << H) * (1 << C) <= kKeyAccs<V>) {
    return &key_scores<V, kT, 1 << H, 1 << C, true>;
  } else {
    return nullptr;
  }
}
template <class V, KvType kT, int H>
constexpr std::array<KeyScoresFn<V, kT>, 4> key_row() {
  return {key_entry<V, kT, H, 0>(), key_entry<V, kT, H, 1>(), key_entry<V, kT, H, 2>(),
          key_entry<V, kT, H, 3>()};
}
template <class V, KvType kT>
KeyScoresFn<V, kT> key_pass(int hb, int pc) {
  static constexpr std::array<std::array<KeyScoresFn<V, kT>, 4>, 4> kPasses = {
      key_row<V, kT, 0>(), key_row<V, kT, 1>(), key_row<V, kT, 2>(), key_row<V, kT, 3>()};
  return kPasses[static_cast<size_t>(hb)][static_cast<size_t>(pc)];
}

// The scores of g heads at the chunks ch[0, n_chunks) (the list followed by kChunksAhead more
// for the prefetches), in groups of up to PC full chunks, each group's keys read once for all
// heads (in passes of 8, 4, 2 and 1 heads); a chunk narrower than kLanes on its own.
template <class V, KvType kT>
void scores_by_dim(const float* q, int64_t q_stride, int64_t g, int64_t dk, int64_t bs,
                   const KeyChunk* ch, int64_t n_chunks, float scale, float* s, int64_t s_stride) {
  constexpr int L = V::kLanes;
  int hb0 = 0;  // log2 of the widest head pass
  while (hb0 < 3 && (int64_t{2} << hb0) <= g) ++hb0;
  int pc0 = 0;  // log2 of the most chunks per group
  while (pc0 < 3 && (2 << pc0) << hb0 <= kKeyAccs<V>) ++pc0;
  for (int64_t i = 0; i < n_chunks;) {
    int pc = 0;
    if (ch[i].lanes == L) {
      int64_t m = 1;  // full chunks from i, up to the group's size
      while (m < (int64_t{1} << pc0) && i + m < n_chunks && ch[i + m].lanes == L) ++m;
      while ((int64_t{2} << pc) <= m) ++pc;
    }
    for (int64_t h = 0, hb = hb0; h < g; h += int64_t{1} << hb) {
      while ((int64_t{1} << hb) > g - h) --hb;
      const float* qh = q + h * q_stride;
      float* sh = s + h * s_stride;
      if (ch[i].lanes < L) {
        constexpr auto kMasked =
            std::array{&key_scores<V, kT, 1, 1, false>, &key_scores<V, kT, 2, 1, false>,
                       &key_scores<V, kT, 4, 1, false>, &key_scores<V, kT, 8, 1, false>};
        kMasked[static_cast<size_t>(hb)](qh, q_stride, dk, bs, ch + i, h == 0, scale, sh, s_stride);
      } else {
        key_pass<V, kT>(static_cast<int>(hb), pc)(qh, q_stride, dk, bs, ch + i, h == 0, scale, sh,
                                                  s_stride);
      }
    }
    i += int64_t{1} << pc;
  }
}

// The scores of HP heads (q rows qh) at positions [j0, j0 + L / HP) from keys in rows: one
// register per head and position, summed across lanes at the end by lane_sums, whose tree is
// the same for every register (so a score's bits do not depend on the heads and positions it
// was computed with), times scale, stored at s + h * s_stride + j0.
template <class V, KvType kT, int HP>
[[gnu::always_inline]] inline void score_pass(const float* const* qh, int64_t dk,
                                              const KvElem<kT>* const* kr, typename V::Reg vscale,
                                              float* s, int64_t s_stride, int64_t j0) {
  using Reg = typename V::Reg;
  constexpr int L = V::kLanes, P = L / HP;
  const int64_t k_full = dk / L * L;
  const int k_tail = static_cast<int>(dk - k_full);
  Reg acc[L];
  unroll<L>([&](auto i) __attribute__((always_inline)) { acc[i] = V::zero(); });
  for (int64_t c = 0; c < k_full;) {
    const int64_t regs = std::min<int64_t>(kScoreRegs<V, HP>, (k_full - c) / L);
    score_regs<V, kT, HP>(static_cast<int>(regs), qh, kr, c, acc);
    c += regs * L;
  }
  if (k_tail > 0) {
    Reg a[HP];
    for (int h = 0; h < HP; ++h) a[h] = V::load_n(qh[h] + k_full, k_tail);
    unroll<P>([&](auto i) __attribute__((always_inline)) {
      const Reg kv = load_kv_n<V, kT>(kr[i] + k_full, k_tail);
      unroll<HP>([&](auto h) __attribute__((always_inline)) {
        acc[h * P + i] = V::fmadd(a[h], kv, acc[h * P + i]);
      });
    });
  }
  alignas(64) float sums[L];
  V::store(sums, V::mul(V::lane_sums(acc), vscale));
  for (int h = 0; h < HP; ++h) std::memcpy(s + h * s_stride + j0, sums + h * P, P * sizeof(float));
}

// Scores from keys in rows (MLA's, up to 576 values wide): two heads at L / 2 positions per pass,
// so that the pass's K rows stay in L1 across the heads (16 rows of 576 f32, 2.3 KB each, did
// not) and each K load feeds two FMAs; an odd last head alone at L positions per pass. Four
// heads at 4 positions (AVX-512) ran no faster than two at 8 (docs/benchmarks.md "Engine,
// session 37"). krows[j] is position j's key for j in [0, n), and a readable row past it up to
// a multiple of L.
template <class V, KvType kT>
void scores_by_row(const float* q, int64_t q_stride, int64_t g, int64_t dk,
                   const KvElem<kT>* const* krows, int64_t n, float scale, float* s,
                   int64_t s_stride) {
  constexpr int L = V::kLanes;
  const typename V::Reg vscale = V::set1(scale);
  const int64_t pairs = g / 2 * 2;
  if (pairs > 0) {
    for (int64_t j0 = 0; j0 < n; j0 += L / 2) {
      for (int64_t h = 0; h < pairs; h += 2) {
        const float* qh[2] = {q + h * q_stride, q + (h + 1) * q_stride};
        score_pass<V, kT, 2>(qh, dk, krows + j0, vscale, s + h * s_stride, s_stride, j0);
      }
    }
  }
  if (g > pairs) {
    const float* qh[1] = {q + pairs * q_stride};
    for (int64_t j0 = 0; j0 < n; j0 += L)
      score_pass<V, kT, 1>(qh, dk, krows + j0, vscale, s + pairs * s_stride, s_stride, j0);
  }
}

template <class V, KvType kT>
void attend_rows(const float* q, int64_t q_stride, int64_t g, int64_t dk, const KvView& kv,
                 int64_t n_end, float scale, int64_t dv, float* out, int64_t out_stride) {
  using Reg = typename V::Reg;
  using Elem = KvElem<kT>;
  constexpr int L = V::kLanes;
  // Positions [first, n_end): vrows[j] (and krows[j], keys in rows) is position first + j's
  // value (key).
  const int64_t first = kv.first, n = n_end - first, bs = kv.block_size;
  if (n <= 0) {  // no positions: nothing to weigh (the engine never asks)
    for (int64_t h = 0; h < g; ++h) std::fill_n(out + h * out_stride, dv, 0.0f);
    return;
  }
  // Score rows [g][row]: head h's score of position first + j at h * row + off + j (keys by
  // dimension: off = first % bs, scores computed from the start of first's block, and a chunk
  // stored whole past n), then exp(score - max); then [g]: 1 / their sums.
  const int64_t off = kv.k_by_dim ? first % bs : 0;
  const int64_t row = (off + n + L - 1) / L * L + (kv.k_by_dim ? L : 0);
  thread_local std::vector<float> scores;
  thread_local std::vector<const Elem*> krows, vrows;
  thread_local std::vector<KeyChunk> chunks;
  if (static_cast<int64_t>(scores.size()) < g * (row + 1))
    scores.resize(static_cast<size_t>(g * (row + 1)));
  float* inv = &scores[static_cast<size_t>(g * row)];
  // Row pointers for [0, n) and the prefetches' look-ahead past it.
  const int64_t n_rows = (n + L - 1) / L * L + kValueAhead;
  if (static_cast<int64_t>(vrows.size()) < n_rows) {
    krows.resize(static_cast<size_t>(n_rows));
    vrows.resize(static_cast<size_t>(n_rows));
  }
  // Row pointers once, block by block (no division per position); K rows only for keys in rows.
  for (int64_t b = first / bs, j = 0, i0 = first % bs; j < n; ++b, i0 = 0) {
    const auto* base = static_cast<const Elem*>(kv.blocks[b]);
    const int64_t m = std::min(bs - i0, n - j);  // positions of this block
    for (int64_t i = 0; i < m; ++i)
      vrows[static_cast<size_t>(j + i)] = base + kv.v_offset + (i0 + i) * kv.v_stride;
    if (!kv.k_by_dim)
      for (int64_t i = 0; i < m; ++i)
        krows[static_cast<size_t>(j + i)] = base + kv.k_offset + (i0 + i) * kv.k_stride;
    j += m;
  }
  for (int64_t j = n; j < n_rows; ++j) {  // read, unused
    if (!kv.k_by_dim) krows[static_cast<size_t>(j)] = krows[0];
    vrows[static_cast<size_t>(j)] = vrows[0];
  }

  if (kv.k_by_dim) {
    // The chunks of up to L positions of each block from first's to n_end's, then kChunksAhead
    // copies of the first (prefetched, unused).
    chunks.clear();
    const int64_t b0 = first / bs;
    for (int64_t b = b0; b * bs < n_end; ++b) {
      const auto* base = static_cast<const Elem*>(kv.blocks[b]) + kv.k_offset;
      for (int64_t c0 = 0; c0 < bs && b * bs + c0 < n_end; c0 += L)
        chunks.push_back(
            {base + c0, (b - b0) * bs + c0, static_cast<int>(std::min<int64_t>(L, bs - c0))});
    }
    const auto n_chunks = static_cast<int64_t>(chunks.size());
    for (int64_t i = 0; i < kChunksAhead; ++i) chunks.push_back(chunks[0]);
    scores_by_dim<V, kT>(q, q_stride, g, dk, bs, chunks.data(), n_chunks, scale, scores.data(),
                         row);
  } else {
    scores_by_row<V, kT>(q, q_stride, g, dk, krows.data(), n, scale, scores.data(), row);
  }

  // Softmax numerators; positions past n become 0.
  const int64_t n_full = n / L * L;
  const int n_tail = static_cast<int>(n - n_full);
  for (int64_t h = 0; h < g; ++h) {
    float* sh = &scores[static_cast<size_t>(h * row + off)];
    Reg mx = V::set1(-std::numeric_limits<float>::infinity());
    for (int64_t j = 0; j < n_full; j += L) mx = V::max(mx, V::load(sh + j));
    if (n_tail > 0) {
      float tmp[L];
      for (int i = 0; i < L; ++i) tmp[i] = i < n_tail ? sh[n_full + i] : sh[0];
      mx = V::max(mx, V::load(tmp));
    }
    // A sink is one more softmax term (its value vector 0): in the max and in the sum.
    const float sink = kv.sinks != nullptr ? kv.sinks[h] : -std::numeric_limits<float>::infinity();
    const float mh = std::max(V::hmax(mx), sink);
    const Reg m = V::set1(mh);
    Reg sum = V::zero();
    for (int64_t j = 0; j < n_full; j += L) {
      const Reg ev = V::exp_nonpos(V::sub(V::load(sh + j), m));
      V::store(sh + j, ev);
      sum = V::add(sum, ev);
    }
    if (n_tail > 0) {
      const Reg ev = V::exp_nonpos(V::sub(V::load(sh + n_full), m));
      V::store_n(sh + n_full, ev, n_tail);
      for (int i = n_tail; i < L; ++i) sh[n_full + i] = 0.0f;
      sum = V::add(sum, V::load(sh + n_full));
    }
    inv[h] = 1.0f / (V::hsum(sum) + (kv.sinks != nullptr ? std::exp(sink - mh) : 0.0f));
  }

  // Weighted values, up to 8 heads per pass over the V rows.
  for (int64_t h = 0; h < g;) {
    const int64_t left = g - h;
    const float* e = &scores[static_cast<size_t>(h * row + off)];
    float* oh = out + h * out_stride;
    const Elem* const* r = vrows.data();
    if (left >= 8) {
      values_of_heads<V, kT, 8>(r, n, e, row, inv + h, dv, oh, out_stride);
      h += 8;
    } else if (left >= 4) {
      values_of_heads<V, kT, 4>(r, n, e, row, inv + h, dv, oh, out_stride);
      h += 4;
    } else if (left >= 2) {
      values_of_heads<V, kT, 2>(r, n, e, row, inv + h, dv, oh, out_stride);
      h += 2;
    } else {
      values_of_heads<V, kT, 1>(r, n, e, row, inv + h, dv, oh, out_stride);
      h += 1;
    }
  }
}

// The attention kernel of vec_ops.h (attend_heads) for the cache's value type.
template <class V>
void attend_simd(const float* q, int64_t q_stride, int64_t g, int64_t dk, const KvView& kv,
                 int64_t n_end, float scale, int64_t dv, float* out, int64_t out_stride) {
  switch (kv.type) {
    case KvType::kF16:
      return attend_rows<V, KvType::kF16>(q, q_stride, g, dk, kv, n_end, scale, dv, out,
                                          out_stride);
    case KvType::kBF16:
      return attend_rows<V, KvType::kBF16>(q, q_stride, g, dk, kv, n_end, scale, dv, out,
                                           out_stride);
    case KvType::kF32:
      break;
  }
  attend_rows<V, KvType::kF32>(q, q_stride, g, dk, kv, n_end, scale, dv, out, out_stride);
}

// softmax_rows of vec_ops.h: per row, the scaled maximum, e^(x * scale - max) summed in lanes
// over chunks in order, then each value times 1 / the sum. The tail chunk is read with load_n,
// whose zero lanes are masked out of the maximum and the sum.
template <class V>
void softmax_rows_simd(float* p, int64_t rows, int64_t n, float scale) {
  using Reg = typename V::Reg;
  constexpr int L = V::kLanes;
  const int64_t n_full = n / L * L;
  const int tail = static_cast<int>(n - n_full);
  const Reg sc = V::set1(scale);
  for (int64_t r = 0; r < rows; ++r) {
    float* x = p + r * n;
    Reg mx = V::set1(-std::numeric_limits<float>::infinity());
    for (int64_t j = 0; j < n_full; j += L) {
      const Reg v = V::mul(V::load(x + j), sc);
      V::store(x + j, v);
      mx = V::max(mx, v);
    }
    float m = V::hmax(mx);
    for (int64_t j = n_full; j < n; ++j) m = std::max(m, x[j] *= scale);
    const Reg mv = V::set1(m);
    Reg sum = V::zero();
    for (int64_t j = 0; j < n_full; j += L) {
      const Reg e = V::exp_nonpos(V::sub(V::load(x + j), mv));
      V::store(x + j, e);
      sum = V::add(sum, e);
    }
    if (tail > 0) {
      const Reg e = V::exp_nonpos(V::sub(V::load_n(x + n_full, tail), mv));
      V::store_n(x + n_full, e, tail);
      float t[V::kLanes] = {};
      V::store_n(t, e, tail);
      sum = V::add(sum, V::load(t));
    }
    const Reg inv = V::set1(1.0f / V::hsum(sum));
    for (int64_t j = 0; j < n_full; j += L) V::store(x + j, V::mul(V::load(x + j), inv));
    if (tail > 0) V::store_n(x + n_full, V::mul(V::load_n(x + n_full, tail), inv), tail);
  }
}

}  // namespace
}  // namespace troupe::compute::detail
