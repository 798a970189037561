// Small element-wise and per-row operations of the forward pass (private to compute/).
// Each output depends only on its own input row, in a fixed order: batch-invariant by design.
#pragma once

#include <cmath>
#include <cstdint>

namespace troupe::compute::detail {

/// sum a[i] * b[i] in Acc in a fixed order: 8 interleaved partial sums, then a fixed pairwise
/// combine (no chain of n dependent adds).
template <class Acc>
inline Acc dot_in(const float* a, const float* b, int64_t n) {
  Acc acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += static_cast<Acc>(a[i + k]) * b[i + k];
  for (int k = 0; i < n; ++i, ++k) acc[k] += static_cast<Acc>(a[i]) * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/// out = x / sqrt(mean(x^2) + eps) * w, the sum of squares in double like the reference's (each
/// square exact). Its order (dot_in's, since session 29: one chain of adds left 16-sequence
/// decode 1-2 % slower, docs/benchmarks.md) moves the double sum by ~1e-16 relative, which
/// float(sum / n) keeps unless it falls that close to a rounding boundary (as with the GPU's tree
/// of partial sums, gpu/ops.cu).
inline void rms_norm(const float* x, const float* w, float* out, int64_t n, float eps) {
  const double sum = dot_in<double>(x, x, n);
  const float scale = 1.0f / std::sqrt(static_cast<float>(sum / static_cast<double>(n)) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = (x[i] * scale) * w[i];
}

/// rms_norm without weights (Llama 4's q/k norms).
inline void rms_norm_plain(const float* x, float* out, int64_t n, float eps) {
  const double sum = dot_in<double>(x, x, n);
  const float scale = 1.0f / std::sqrt(static_cast<float>(sum / static_cast<double>(n)) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale;
}

/// LayerNorm: y = (x - mean) / sqrt(var + eps) * w + b over n values (sums in double, as ggml's
/// norm); w and b may be null; y may be x. The vision encoders' and DeepSeek-V3.2's indexer keys'.
inline void layer_norm(const float* x, const float* w, const float* b, float* y, int64_t n,
                       float eps) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += x[i];
  const float mean = static_cast<float>(sum / static_cast<double>(n));
  double sum2 = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i] - mean;
    y[i] = v;
    sum2 += static_cast<double>(v) * v;
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(sum2 / static_cast<double>(n)) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] *= scale;
  if (w != nullptr)
    for (int64_t i = 0; i < n; ++i) y[i] *= w[i];
  if (b != nullptr)
    for (int64_t i = 0; i < n; ++i) y[i] += b[i];
}

/// Fixed-order f32 dot product (dot_in's order).
inline float dot(const float* a, const float* b, int64_t n) { return dot_in<float>(a, b, n); }

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }
inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
/// GELU's tanh form: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
inline float gelu_tanh(float x) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
}

/// Rotary embedding of one head in place with precomputed cos/sin of each pair's angle
/// (f32 [n_rot / 2] each). Same pairing as rope() below.
inline void rope_cs(float* x, int64_t n_rot, const float* cs, const float* sn, bool neox) {
  const int64_t half = n_rot / 2;
  for (int64_t i = 0; i < half; ++i) {
    const int64_t a = neox ? i : 2 * i;
    const int64_t b = neox ? i + half : 2 * i + 1;
    const float x0 = x[a], x1 = x[b];
    x[a] = x0 * cs[i] - x1 * sn[i];
    x[b] = x0 * sn[i] + x1 * cs[i];
  }
}

/// Rotary embedding of one head in place. normal: pairs (2i, 2i+1); neox: pairs (i, i+n_rot/2).
/// Dimensions at and beyond n_rot are left as they are.
inline void rope(float* x, int64_t n_rot, int64_t pos, float theta_base, bool neox) {
  const int64_t half = n_rot / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double freq = std::pow(static_cast<double>(theta_base),
                                 -2.0 * static_cast<double>(i) / static_cast<double>(n_rot));
    const double angle = static_cast<double>(pos) * freq;
    const float c = static_cast<float>(std::cos(angle));
    const float s = static_cast<float>(std::sin(angle));
    const int64_t a = neox ? i : 2 * i;
    const int64_t b = neox ? i + half : 2 * i + 1;
    const float x0 = x[a], x1 = x[b];
    x[a] = x0 * c - x1 * s;
    x[b] = x0 * s + x1 * c;
  }
}

}  // namespace troupe::compute::detail
