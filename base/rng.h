// The random generators troupe uses where results must replay exactly: splitmix64 (seeding) and
// xoshiro256** 1.0 (Blackman and Vigna). Users: compute/sampler (the request RNG whose state
// travels with every step), transport/fault (seeded fault decisions). Pure functions.
#pragma once

#include <cstdint>

namespace troupe {

inline uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

/// Advances `x` and returns the next splitmix64 output (used to expand a seed into a state).
inline uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// One xoshiro256** step on state s[0..3] (not all zero).
inline uint64_t xoshiro256ss_next(uint64_t (&s)[4]) {
  const uint64_t result = rotl64(s[1] * 5, 7) * 9;
  const uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl64(s[3], 45);
  return result;
}

}  // namespace troupe
