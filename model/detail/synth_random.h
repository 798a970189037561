// The pseudo-random numbers of synthetic weights (model/synth.cc, synth_mmproj.cc): a seed per
// tensor from its name, one splitmix64 stream per row, so any thread count gives the same bytes.
#pragma once

#include <cstdint>
#include <string>

namespace troupe::model::detail {

inline uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

inline uint64_t hash_name(const std::string& s) {  // FNV-1a
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

// Approximately standard normal: the sum of four 16-bit uniforms (Irwin-Hall), rescaled.
inline float normalish(uint64_t r) {
  const int64_t s =
      static_cast<int64_t>((r & 0xffff) + ((r >> 16) & 0xffff) + ((r >> 32) & 0xffff) + (r >> 48));
  constexpr float kMean = 4 * 32767.5f;
  constexpr float kInvStd = 1.f / 37837.23f;  // sqrt(4 * (65536^2 - 1) / 12)
  return (static_cast<float>(s) - kMean) * kInvStd;
}

}  // namespace troupe::model::detail
