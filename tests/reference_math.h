// The plain float64 arithmetic the test references share (tests/hf_moe_reference.h,
// tests/gpt_oss_reference.h): vectors of doubles, dot products, RMSNorm, activations, softmax and
// NeoX and interleaved rotary. Written for clarity, not speed; independent of troupe's engine.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace troupe::testing::refmath {

using Vec = std::vector<double>;

inline double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

/// a += s * b.
inline void add_scaled(Vec& a, double s, const Vec& b) {
  for (size_t i = 0; i < a.size(); ++i) a[i] += s * b[i];
}

inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
inline double silu(double x) { return x / (1.0 + std::exp(-x)); }

/// v / sqrt(mean(v^2) + eps) * w.
inline Vec rms_norm(const Vec& v, const Vec& w, double eps) {
  const double inv = 1.0 / std::sqrt(dot(v, v) / static_cast<double>(v.size()) + eps);
  Vec out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = v[i] * inv * w[i];
  return out;
}

/// Numerically stable softmax of z in place.
inline void softmax(Vec& z) {
  const double mx = *std::ranges::max_element(z);
  double sum = 0;
  for (double& x : z) sum += (x = std::exp(x - mx));
  for (double& x : z) x /= sum;
}

/// Rotates the first r elements of the head at [off, off + head) of v for position pos, NeoX
/// (rotate_half) style: pairs (i, i + r/2), angle = pos * theta^(-2i/r); the rest unchanged.
inline void rope_neox(Vec& v, int64_t off, int64_t pos, int64_t r, double theta) {
  for (int64_t i = 0; i < r / 2; ++i) {
    const double inv_freq = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(r));
    const double angle = static_cast<double>(pos) * inv_freq;
    const double cs = std::cos(angle), sn = std::sin(angle);
    const double a = v[off + i], b = v[off + i + r / 2];
    v[off + i] = a * cs - b * sn;
    v[off + i + r / 2] = b * cs + a * sn;
  }
}

/// The same rotation GPT-J (interleaved) style, as transformers' ERNIE 4.5 and Llama 4 rotate:
/// pairs (2i, 2i + 1), angle = pos * theta^(-2i/r).
inline void rope_interleaved(Vec& v, int64_t off, int64_t pos, int64_t r, double theta) {
  for (int64_t i = 0; i < r / 2; ++i) {
    const double inv_freq = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(r));
    const double angle = static_cast<double>(pos) * inv_freq;
    const double cs = std::cos(angle), sn = std::sin(angle);
    const double a = v[off + 2 * i], b = v[off + 2 * i + 1];
    v[off + 2 * i] = a * cs - b * sn;
    v[off + 2 * i + 1] = b * cs + a * sn;
  }
}

}  // namespace troupe::testing::refmath
