// Tokens of the gated delta rule (Gated DeltaNet's recurrence) for one value head, over the
// vector traits of attend_simd.h (V::kLanes, V::Reg, load/store and their _n forms, set1, zero,
// sub, mul, fmadd). The state's columns are independent: each is updated by the same operations
// in the same order on every level, whatever register it falls in.
#pragma once

#include <algorithm>
#include <cstdint>

namespace troupe::compute::detail {
namespace {  // NOLINT(google-build-namespaces): one copy per SIMD level, as attend_simd.h

// n tokens of one value head in order, S [dk rows, dv columns] in place: for token t,
//   S = decay_t S, kv = S^T k_t;  delta = beta_t (v_t - kv);  S += k_t delta^T, o_t = S^T q_t.
// Columns go in passes of up to 4 registers. Each pass sweeps its rows n + 1 times: token t's
// second sweep (the correction and o_t) and token t + 1's first (the decay and kv) are one, which
// leaves every value's operations and their order as they are token by token (the same bits,
// however a sequence's tokens are split into steps) and halves what is read and written.
// k, q: [n, dk]; v: n rows v_stride apart; o: n rows o_stride apart.
template <class V>
void delta_rule_simd(float* S, int64_t dk, int64_t dv, int64_t n, const float* k, const float* q,
                     const float* v, int64_t v_stride, const float* decay, const float* beta,
                     float* o, int64_t o_stride) {
  constexpr int L = V::kLanes;
  constexpr int kRegs = 4;
  using Reg = typename V::Reg;
  if (n <= 0) return;
  for (int64_t d0 = 0; d0 < dv; d0 += kRegs * L) {
    const int64_t width = std::min<int64_t>(kRegs * L, dv - d0);
    const int regs = static_cast<int>((width + L - 1) / L);
    int lanes[kRegs];
    for (int r = 0; r < regs; ++r) lanes[r] = static_cast<int>(std::min<int64_t>(L, width - r * L));
    auto load = [&](const float* p, int r) {
      return lanes[r] == L ? V::load(p + r * L) : V::load_n(p + r * L, lanes[r]);
    };
    auto store = [&](float* p, int r, Reg x) {
      if (lanes[r] == L) {
        V::store(p + r * L, x);
      } else {
        V::store_n(p + r * L, x, lanes[r]);
      }
    };
    // Token 0's first sweep.
    Reg acc[kRegs];
    for (int r = 0; r < regs; ++r) acc[r] = V::zero();
    {
      const Reg dec = V::set1(decay[0]);
      for (int64_t a = 0; a < dk; ++a) {
        float* row = S + a * dv + d0;
        const Reg ka = V::set1(k[a]);
        for (int r = 0; r < regs; ++r) {
          const Reg s = V::mul(load(row, r), dec);
          store(row, r, s);
          acc[r] = V::fmadd(s, ka, acc[r]);
        }
      }
    }
    for (int64_t t = 0; t < n; ++t) {
      const float* kt = k + t * dk;
      const float* qt = q + t * dk;
      Reg delta[kRegs], out[kRegs];
      const Reg bet = V::set1(beta[t]);
      for (int r = 0; r < regs; ++r) {
        delta[r] = V::mul(V::sub(load(v + t * v_stride + d0, r), acc[r]), bet);
        out[r] = V::zero();
        acc[r] = V::zero();
      }
      const bool next = t + 1 < n;
      const float* kn = next ? k + (t + 1) * dk : kt;
      const Reg dec = V::set1(next ? decay[t + 1] : 1.0f);
      for (int64_t a = 0; a < dk; ++a) {
        float* row = S + a * dv + d0;
        const Reg ka = V::set1(kt[a]), qa = V::set1(qt[a]), kb = V::set1(kn[a]);
        for (int r = 0; r < regs; ++r) {
          Reg s = V::fmadd(ka, delta[r], load(row, r));
          out[r] = V::fmadd(s, qa, out[r]);
          if (next) {
            s = V::mul(s, dec);
            acc[r] = V::fmadd(s, kb, acc[r]);
          }
          store(row, r, s);
        }
      }
      for (int r = 0; r < regs; ++r) store(o + t * o_stride + d0, r, out[r]);
    }
  }
}

}  // namespace
}  // namespace troupe::compute::detail
