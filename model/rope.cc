// Rotary frequencies with scaling (model/rope.h). Formulas follow the published definitions:
// YaRN (Peng et al. 2023, "YaRN: Efficient Context Window Extension of Large Language Models")
// with the correction range and ramp as Hugging Face and llama.cpp compute them, and Llama 3.1's
// frequency bands as its model card's configuration describes them.
#include "model/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "base/check.h"

namespace troupe::model {

double yarn_mscale(double factor, double m) {
  return factor <= 1.0 ? 1.0 : 0.1 * m * std::log(factor) + 1.0;
}

const char* rope_scaling_name(RopeScalingType t) {
  switch (t) {
    case RopeScalingType::kNone:
      return "none";
    case RopeScalingType::kLinear:
      return "linear";
    case RopeScalingType::kYarn:
      return "yarn";
  }
  return "?";
}

RopeFrequencies rope_frequencies(const ModelSpec& s, int64_t max_positions) {
  const bool long_rope = !s.rope_freq_factors_long.empty() && max_positions > s.rope_long_after;
  const std::vector<float>& factors = long_rope ? s.rope_freq_factors_long : s.rope_freq_factors;
  const int64_t half = s.n_rot / 2;
  const RopeScaling& sc = s.rope_scaling;
  const double theta = static_cast<double>(s.rope_theta);
  const double n_rot = static_cast<double>(s.n_rot);
  RopeFrequencies r;
  r.inv_freq.resize(static_cast<size_t>(half));
  // YaRN's ramp: pairs that turn more than beta_fast times over the original context keep their
  // frequency, pairs that turn fewer than beta_slow times are interpolated (divided by the
  // factor), and the pairs between blend linearly. Pair index d turns n times over the context
  // L when d = n_rot * ln(L / (2 pi n)) / (2 ln theta).
  double lo = 0, hi = 0;
  if (sc.type == RopeScalingType::kYarn) {
    const auto pair_of = [&](double turns) {
      return n_rot * std::log(static_cast<double>(sc.orig_ctx) / (turns * 2 * std::numbers::pi)) /
             (2 * std::log(theta));
    };
    lo = pair_of(sc.beta_fast);
    hi = pair_of(sc.beta_slow);
    if (sc.truncate) {
      lo = std::floor(lo);
      hi = std::ceil(hi);
    }
    lo = std::max(lo, 0.0);
    hi = std::min(hi, n_rot - 1);
  }
  for (int64_t i = 0; i < half; ++i) {
    double f = std::pow(theta, -2.0 * static_cast<double>(i) / n_rot);
    if (!factors.empty()) f /= static_cast<double>(factors[static_cast<size_t>(i)]);
    switch (sc.type) {
      case RopeScalingType::kNone:
        break;
      case RopeScalingType::kLinear:
        f /= sc.factor;
        break;
      case RopeScalingType::kYarn: {
        const double ramp =
            std::clamp((static_cast<double>(i) - lo) / std::max(hi - lo, 0.001), 0.0, 1.0);
        const double keep = 1.0 - ramp;  // 1: the original frequency, 0: interpolated
        f = (f / sc.factor) * (1.0 - keep) + f * keep;
        break;
      }
    }
    r.inv_freq[static_cast<size_t>(i)] = f;
  }
  r.mscale = sc.attn_factor;
  return r;
}

RopeFrequencies rope_frequencies_local(const ModelSpec& s) {
  const int64_t half = s.n_rot / 2;
  RopeFrequencies r;
  r.inv_freq.resize(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    r.inv_freq[static_cast<size_t>(i)] =
        std::pow(static_cast<double>(s.rope_theta_local),
                 -2.0 * static_cast<double>(i) / static_cast<double>(s.n_rot));
  return r;
}

void rope_cos_sin(const RopeFrequencies& f, std::span<const int64_t> positions, float* cos,
                  float* sin) {
  const size_t half = f.inv_freq.size();
  for (size_t t = 0; t < positions.size(); ++t) {
    const double pos = static_cast<double>(positions[t]);
    for (size_t i = 0; i < half; ++i) {
      const double a = pos * f.inv_freq[i];
      cos[t * half + i] = static_cast<float>(f.mscale * std::cos(a));
      sin[t * half + i] = static_cast<float>(f.mscale * std::sin(a));
    }
  }
}

std::vector<float> llama3_freq_factors(int64_t n_rot, double theta, double factor,
                                       double low_freq_factor, double high_freq_factor,
                                       double orig_ctx) {
  const int64_t half = n_rot / 2;
  std::vector<float> out(static_cast<size_t>(half));
  const double long_wavelen = orig_ctx / low_freq_factor;    // longer: divided by factor
  const double short_wavelen = orig_ctx / high_freq_factor;  // shorter: kept
  for (int64_t i = 0; i < half; ++i) {
    const double inv = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(n_rot));
    const double wavelen = 2 * std::numbers::pi / inv;
    double div = 1.0;
    if (wavelen > long_wavelen) {
      div = factor;
    } else if (wavelen >= short_wavelen && high_freq_factor > low_freq_factor) {
      const double smooth =
          (orig_ctx / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
      div = 1.0 / ((1.0 - smooth) / factor + smooth);
    }
    out[static_cast<size_t>(i)] = static_cast<float>(div);
  }
  return out;
}

void validate_rope_scaling(const ModelSpec& s, const std::string& src) {
  const RopeScaling& sc = s.rope_scaling;
  const auto positive = [](double v) { return std::isfinite(v) && v > 0; };
  for (const std::vector<float>* factors : {&s.rope_freq_factors, &s.rope_freq_factors_long}) {
    if (factors->empty()) continue;
    if (static_cast<int64_t>(factors->size()) != s.n_rot / 2)
      TROUPE_INPUT_ERROR("%s: %zu rope frequency factors, expected one per rotary pair (%lld)",
                         src.c_str(), factors->size(), static_cast<long long>(s.n_rot / 2));
    for (size_t i = 0; i < factors->size(); ++i)
      if (!positive((*factors)[i]))
        TROUPE_INPUT_ERROR("%s: rope frequency factor %zu is %g; it must be finite and > 0",
                           src.c_str(), i, static_cast<double>((*factors)[i]));
  }
  if (sc.type != RopeScalingType::kNone && !positive(sc.factor))
    TROUPE_INPUT_ERROR("%s: rope scaling factor %g must be finite and > 0", src.c_str(), sc.factor);
  if (sc.type == RopeScalingType::kYarn) {
    if (sc.orig_ctx <= 0)
      TROUPE_INPUT_ERROR("%s: YaRN rope scaling needs the original context length (got %lld)",
                         src.c_str(), static_cast<long long>(sc.orig_ctx));
    if (!positive(sc.beta_fast) || !positive(sc.beta_slow))
      TROUPE_INPUT_ERROR("%s: YaRN beta_fast %g and beta_slow %g must be finite and > 0",
                         src.c_str(), sc.beta_fast, sc.beta_slow);
  }
  if (!positive(sc.attn_factor))
    TROUPE_INPUT_ERROR("%s: rope attention factor %g must be finite and > 0", src.c_str(),
                       sc.attn_factor);
  if (!positive(s.kq_scale_mult))
    TROUPE_INPUT_ERROR("%s: attention scale multiplier %g must be finite and > 0", src.c_str(),
                       s.kq_scale_mult);
}

}  // namespace troupe::model
