// Random K-quant rows for kernel tests: any bit pattern is a valid block, so random bytes with
// sane f16 super-block scales exercise every value, scale and min a file can hold.
#pragma once

#include <cstdint>
#include <random>

#include "model/ggml_types.h"

namespace troupe::testing {

/// Fills one row of `cols` values (a multiple of 256) of K-quant type t at dst with random
/// bytes, then sets each super-block's d (and dmin) to f16 values in about [2e-4, 2e-3] times a
/// per-type factor that gives every type outputs of similar size.
inline void random_kquant_row(model::GgmlType t, uint8_t* dst, int64_t cols, std::mt19937& rng) {
  using model::GgmlType;
  const int64_t rb = model::row_bytes(t, cols);
  for (int64_t i = 0; i < rb; ++i) dst[i] = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> sd(2e-4f, 2e-3f);
  auto f16 = [&](float scale) { return model::fp32_to_fp16(sd(rng) * scale); };
  for (int64_t b = 0; b < cols / model::kQK_K; ++b) {
    switch (t) {
      case GgmlType::kQ2_K: {
        auto* blk = reinterpret_cast<model::BlockQ2_K*>(dst) + b;
        blk->d = f16(100);
        blk->dmin = f16(100);
        break;
      }
      case GgmlType::kQ3_K:
        reinterpret_cast<model::BlockQ3_K*>(dst)[b].d = f16(10);
        break;
      case GgmlType::kQ4_K: {
        auto* blk = reinterpret_cast<model::BlockQ4_K*>(dst) + b;
        blk->d = f16(10);
        blk->dmin = f16(10);
        break;
      }
      case GgmlType::kQ5_K: {
        auto* blk = reinterpret_cast<model::BlockQ5_K*>(dst) + b;
        blk->d = f16(5);
        blk->dmin = f16(10);
        break;
      }
      case GgmlType::kIQ4_XS:
        reinterpret_cast<model::BlockIQ4_XS*>(dst)[b].d = f16(1);
        break;
      default:  // Q6_K
        reinterpret_cast<model::BlockQ6_K*>(dst)[b].d = f16(1);
        break;
    }
  }
}

}  // namespace troupe::testing
