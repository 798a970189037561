// Test pictures for the image benchmarks (image_chat_bench, encoder_bench): 336x336 PNG files
// (LLaVA 1.5's input size) whose pattern depends on a seed, so every seed is another image with
// another digest. Needs tests/image_writers.h's libpng (the bench links PNG::PNG).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tests/image_writers.h"

namespace troupe::bench {

inline std::string picture(int seed) {
  const int S = 336;
  std::vector<uint8_t> rgb(static_cast<size_t>(S * S * 3));
  for (int y = 0; y < S; ++y)
    for (int x = 0; x < S; ++x)
      for (int c = 0; c < 3; ++c)
        rgb[static_cast<size_t>((y * S + x) * 3 + c)] =
            static_cast<uint8_t>((x * (c + 1) + y * (seed + 2) + 40 * seed) & 255);
  return testing::encode_rgb_png(S, S, rgb);
}

}  // namespace troupe::bench
