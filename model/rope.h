// Rotary position frequencies of a ModelSpec with its scaling applied (linear, YaRN, per-pair
// divisors such as Llama 3's): the one definition the CPU engine and the GPU backend build their
// cos/sin tables from, and the Hugging Face "llama3" rule that produces such divisors.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/model_spec.h"

namespace troupe::model {

struct RopeFrequencies {
  std::vector<double> inv_freq;  ///< [n_rot / 2]: radians per position of each rotary pair
  double mscale = 1.0;           ///< multiplies every pair's cos and sin
};

/// Pair i turns by pos * inv_freq[i]. Unscaled: theta^(-2i / n_rot), computed in double exactly
/// as the engine always has (so unscaled models keep their bits). `max_positions`: the longest
/// sequence the caller runs (0: not said); above s.rope_long_after, LongRoPE's long factors
/// divide the frequencies instead of the short ones.
RopeFrequencies rope_frequencies(const ModelSpec& s, int64_t max_positions = 0);
/// The frequencies of layers with local_rope: base s.rope_theta_local, no scaling, no factors.
RopeFrequencies rope_frequencies_local(const ModelSpec& s);

/// cos and sin of every pair's angle at each position, times f.mscale: row t of `cos` and `sin`
/// ([positions.size(), inv_freq.size()], row-major) is position positions[t]. The one place
/// these values are computed; the CPU engine and the GPU's tables both call it.
void rope_cos_sin(const RopeFrequencies& f, std::span<const int64_t> positions, float* cos,
                  float* sin);

/// YaRN's magnitude term: 1 + 0.1 * m * ln(factor), or 1 when factor <= 1.
double yarn_mscale(double factor, double m = 1.0);

/// Hugging Face's "llama3" rope scaling as per-pair divisors of the base frequencies:
/// wavelengths shorter than orig_ctx / high_freq_factor keep theirs (1), longer than
/// orig_ctx / low_freq_factor are divided by `factor`, and the band between is interpolated (none
/// when the two factors are equal, as Llama 4's).
std::vector<float> llama3_freq_factors(int64_t n_rot, double theta, double factor,
                                       double low_freq_factor, double high_freq_factor,
                                       double orig_ctx);

/// Checks the scaling fields of a spec; throws InputError naming `source` and the field.
void validate_rope_scaling(const ModelSpec& s, const std::string& source);

/// "none", "linear" or "yarn", for messages and `troupe inspect`.
const char* rope_scaling_name(RopeScalingType t);

}  // namespace troupe::model
