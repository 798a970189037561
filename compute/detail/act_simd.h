// Element-wise activations for a SIMD level, over the vector traits of attend_simd.h (V::kLanes,
// V::Reg, load/store and their _n forms, add, sub, mul, div, max, select_nonneg, exp_nonpos).
// Each lane is computed alone, by the same operations on every level, so a result never depends
// on where an element falls in a register, on the row split or on the thread.
#pragma once

#include <cstdint>

namespace troupe::compute::detail {
namespace {  // NOLINT(google-build-namespaces): one copy per SIMD level, as attend_simd.h

// g[i] = silu(g[i]) * u[i], silu(x) = x * sigmoid(x) with sigmoid(x) = 1 / (1 + e) for x >= 0
// and e / (1 + e) below, e = e^-|x| from exp_nonpos: no overflow at either end, and a NaN
// stays NaN.
template <class V>
typename V::Reg silu_times(typename V::Reg x, typename V::Reg y) {
  const typename V::Reg neg_abs = V::sub(V::zero(), V::max(x, V::sub(V::zero(), x)));
  const typename V::Reg e = V::exp_nonpos(neg_abs);
  const typename V::Reg one = V::set1(1.0f);
  const typename V::Reg sig = V::div(V::select_nonneg(x, one, e), V::add(one, e));
  return V::mul(V::mul(x, sig), y);
}

template <class V>
void silu_mul_simd(float* g, const float* u, int64_t n) {
  constexpr int L = V::kLanes;
  int64_t i = 0;
  for (; i + L <= n; i += L) V::store(g + i, silu_times<V>(V::load(g + i), V::load(u + i)));
  if (i < n) {
    const int k = static_cast<int>(n - i);
    V::store_n(g + i, silu_times<V>(V::load_n(g + i, k), V::load_n(u + i, k)), k);
  }
}

}  // namespace
}  // namespace troupe::compute::detail
