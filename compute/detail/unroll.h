// detail::unroll<N>(f): a loop over a small array of registers written out in the source, for
// the SIMD kernels (compute/detail/matmul_tiles.h, attend_simd.h).
#pragma once

#include <type_traits>
#include <utility>

namespace troupe::compute::detail {

/// f(0), f(1), ..., f(N - 1), unrolled in the source (each index a std::integral_constant, so
/// it can be an intrinsic's immediate at -O0 too). A kernel's arrays of registers (one
/// accumulator per token) are then indexed by constants only, which g++ 12 needs to keep them in
/// registers: after a loop over them, even one it unrolled later, it stored every accumulator
/// to the stack once per record (docs/benchmarks.md "Engine, session 28"). Give the lambda
/// __attribute__((always_inline)) too: g++ outlined a long one, passing the arrays' address.
template <class F, int... I>
[[gnu::always_inline]] inline void unroll_each(F& f, std::integer_sequence<int, I...>) {
  (f(std::integral_constant<int, I>{}), ...);
}
template <int N, class F>
[[gnu::always_inline]] inline void unroll(F&& f) {
  unroll_each(f, std::make_integer_sequence<int, N>{});
}

}  // namespace troupe::compute::detail
