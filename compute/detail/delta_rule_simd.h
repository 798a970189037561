// One token of the gated delta rule (Gated DeltaNet's recurrence) for one value head, over the
// vector traits of attend_simd.h (V::kLanes, V::Reg, load/store and their _n forms, set1, zero,
// sub, mul, fmadd). The state's columns are independent: each is updated by the same operations
// in the same order on every level, whatever register it falls in.
#pragma once

#include <algorithm>
#include <cstdint>

namespace troupe::compute::detail {
namespace {  // NOLINT(google-build-namespaces): one copy per SIMD level, as attend_simd.h

// S [dk rows, dv columns] in place, for columns in passes of up to 4 registers (a pass's rows
// stay in L1 between its two sweeps):
//   S = decay S, kv = S^T k;  delta = beta (v - kv);  S += k delta^T, o = S^T q.
template <class V>
void delta_rule_simd(float* S, int64_t dk, int64_t dv, const float* k, const float* q,
                     const float* v, float decay, float beta, float* o) {
  constexpr int L = V::kLanes;
  constexpr int kRegs = 4;
  using Reg = typename V::Reg;
  const Reg dec = V::set1(decay), bet = V::set1(beta);
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
    Reg acc[kRegs];
    for (int r = 0; r < regs; ++r) acc[r] = V::zero();
    for (int64_t a = 0; a < dk; ++a) {
      float* row = S + a * dv + d0;
      const Reg ka = V::set1(k[a]);
      for (int r = 0; r < regs; ++r) {
        const Reg s = V::mul(load(row, r), dec);
        store(row, r, s);
        acc[r] = V::fmadd(s, ka, acc[r]);
      }
    }
    Reg delta[kRegs], out[kRegs];
    for (int r = 0; r < regs; ++r) {
      delta[r] = V::mul(V::sub(load(v + d0, r), acc[r]), bet);
      out[r] = V::zero();
    }
    for (int64_t a = 0; a < dk; ++a) {
      float* row = S + a * dv + d0;
      const Reg ka = V::set1(k[a]), qa = V::set1(q[a]);
      for (int r = 0; r < regs; ++r) {
        const Reg s = V::fmadd(ka, delta[r], load(row, r));
        store(row, r, s);
        out[r] = V::fmadd(s, qa, out[r]);
      }
    }
    for (int r = 0; r < regs; ++r) store(o + d0, r, out[r]);
  }
}

}  // namespace
}  // namespace troupe::compute::detail
