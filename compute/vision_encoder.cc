// The ViT forward pass and the LLaVA / Gemma 3 projectors, in f32. The order of operations
// follows llama.cpp's clip graphs (the reference the golden data comes from): LayerNorm with
// double sums, attention as softmax(q k^T * scale) v without a mask, biases added after each
// product. One image at a time; products run on the thread pool.
#include "compute/vision_encoder.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/check.h"
#include "compute/detail/ops.h"
#include "compute/matmul.h"
#include "compute/thread_pool.h"
#include "compute/vec_ops.h"
#include "model/ggml_types.h"

namespace troupe::compute {

using model::Projector;
using model::VisionAct;
using model::VisionLayer;
using model::VisionSpec;
using model::WeightView;

namespace {

const float* f32(const WeightView& w) { return reinterpret_cast<const float*>(w.data); }

void layer_norm_rows(const float* x, const WeightView& w, const WeightView& b, float* y,
                     int64_t rows, int64_t n, float eps) {
  const float* wf = w.present() ? f32(w) : nullptr;
  const float* bf = b.present() ? f32(b) : nullptr;
  for (int64_t r = 0; r < rows; ++r) detail::layer_norm(x + r * n, wf, bf, y + r * n, n, eps);
}

/// y[r * stride + i] += b[i] for n rows (nothing without a bias).
void add_bias(const WeightView& b, float* y, int64_t rows, int64_t stride) {
  if (!b.present()) return;
  const float* bv = f32(b);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < b.cols(); ++i) y[r * stride + i] += bv[i];
}

// llama.cpp's CPU GELU (ggml's GGML_GELU_FP16, on by default) does not evaluate the formula:
// it rounds the input to f16 and reads the f16-rounded GELU of that value from a 64 Ki-entry
// table (inputs <= -10 give 0, >= 10 themselves). The mmproj files and the reference outputs
// come from llama.cpp, so troupe's encoder computes the same: the exact formula differs by up to
// 4e-4 of the output range on the golden images (f16 has 11 significant bits).
struct F16ActTable {
  std::vector<uint16_t> gelu, gelu_quick;
  F16ActTable() : gelu(65536), gelu_quick(65536) {
    for (uint32_t i = 0; i < 65536; ++i) {
      const float x = model::fp16_to_fp32(static_cast<uint16_t>(i));
      constexpr float kSqrt2OverPi = 0.79788456080286535587989211986876f;
      const float g = 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * x * (1.0f + 0.044715f * x * x)));
      gelu[i] = model::fp32_to_fp16(g);
      gelu_quick[i] = model::fp32_to_fp16(x * (1.0f / (1.0f + std::exp(-1.702f * x))));
    }
  }
};

float from_table(const std::vector<uint16_t>& table, float x) {
  return model::fp16_to_fp32(table[model::fp32_to_fp16(x)]);
}

float activate(VisionAct act, float x) {
  static const F16ActTable tables;
  switch (act) {
    case VisionAct::kGelu:
      if (x <= -10.0f) return 0.0f;
      if (x >= 10.0f) return x;
      return from_table(tables.gelu, x);
    case VisionAct::kGeluQuick:
      return from_table(tables.gelu_quick, x);
    case VisionAct::kSilu:
      return detail::silu(x);
  }
  return x;
}

}  // namespace

Result<std::unique_ptr<VisionEncoder>> VisionEncoder::create(
    std::shared_ptr<const model::VisionModel> model, int n_threads) {
  if (!model) return Error{1, "vision encoder: no model"};
  if (n_threads < 1) return Error{1, "vision encoder: n_threads must be at least 1"};
  std::unique_ptr<VisionEncoder> e(new VisionEncoder());
  e->model_ = std::move(model);
  e->pool_ = std::make_unique<ThreadPool>(n_threads);
  return e;
}

VisionEncoder::~VisionEncoder() = default;

Result<std::vector<float>> VisionEncoder::encode(const model::Image& image) {
  if (image.width <= 0 || image.height <= 0 ||
      image.rgb.size() != static_cast<size_t>(image.width) * static_cast<size_t>(image.height) * 3)
    return Error{1, "vision encoder: the image is empty or its pixel buffer has the wrong size"};
  const std::vector<float> pixels = model::preprocess_image(image, spec().preprocess());
  return encode(pixels);
}

Result<std::vector<float>> VisionEncoder::encode(std::span<const float> pixels) {
  const int64_t S = spec().image_size;
  if (static_cast<int64_t>(pixels.size()) != 3 * S * S)
    return Error{1, strfmt("vision encoder: %zu input values, expected 3 x %lld x %lld",
                           pixels.size(), static_cast<long long>(S), static_cast<long long>(S))};
  std::vector<float> out;
  try {
    forward(pixels.data(), &out);
  } catch (const std::exception& ex) {
    return Error{2, strfmt("vision encoder (%s): %s", model_->path.c_str(), ex.what())};
  }
  return out;
}

void VisionEncoder::forward(const float* pixels, std::vector<float>* out) {
  const VisionSpec& s = spec();
  const int64_t E = s.n_embd, N = s.n_pos();
  patch_embed(pixels);
  if (s.pre_ln_w.present()) {
    h_.resize(static_cast<size_t>(N * E));
    layer_norm_rows(x_.data(), s.pre_ln_w, s.pre_ln_b, h_.data(), N, E, s.eps);
    x_.swap(h_);
  }
  // The states the projector reads (LLaVA feature layers): inner ones before post_ln.
  const std::vector<int64_t>& feats = s.feature_layers;
  std::vector<std::vector<float>> saved;
  for (int64_t il = 0; il < s.n_layer_run; ++il) {
    if (std::find(feats.begin(), feats.end(), il) != feats.end()) saved.push_back(x_);
    block(s.layers[static_cast<size_t>(il)]);
  }
  if (s.post_ln_w.present()) {
    h_.resize(static_cast<size_t>(N * E));
    layer_norm_rows(x_.data(), s.post_ln_w, s.post_ln_b, h_.data(), N, E, s.eps);
    x_.swap(h_);
  }
  if (!saved.empty()) {
    if (feats.back() == s.n_layer_run) saved.push_back(x_);
    // Concatenated along the width, in layer order.
    const int64_t W = E * static_cast<int64_t>(saved.size());
    features_.resize(static_cast<size_t>(N * W));
    for (int64_t r = 0; r < N; ++r)
      for (size_t f = 0; f < saved.size(); ++f)
        std::memcpy(&features_[static_cast<size_t>(r * W) + f * static_cast<size_t>(E)],
                    &saved[f][static_cast<size_t>(r * E)], static_cast<size_t>(E) * sizeof(float));
  } else {
    features_ = x_;
  }
  project(out);
}

// Each patch's 3 x p x p pixels (channel, row, column) times the patch matrix, then the class
// token after the patches (llama.cpp's order), then the learned positions.
void VisionEncoder::patch_embed(const float* pixels) {
  const VisionSpec& s = spec();
  const int64_t E = s.n_embd, P = s.patch_size, S = s.image_size, side = s.patches_per_side();
  const int64_t np = s.n_patches(), N = s.n_pos(), K = 3 * P * P;
  tmp_.resize(static_cast<size_t>(np * K));
  for (int64_t py = 0; py < side; ++py)
    for (int64_t px = 0; px < side; ++px) {
      float* row = &tmp_[static_cast<size_t>((py * side + px) * K)];
      for (int64_t c = 0; c < 3; ++c)
        for (int64_t y = 0; y < P; ++y)
          std::memcpy(row + (c * P + y) * P, pixels + (c * S + py * P + y) * S + px * P,
                      static_cast<size_t>(P) * sizeof(float));
    }
  x_.assign(static_cast<size_t>(N * E), 0.0f);
  matmul(s.patch_w, tmp_.data(), np, x_.data(), pool_.get());
  add_bias(s.patch_b, x_.data(), np, E);
  if (s.class_embd.present())
    std::memcpy(&x_[static_cast<size_t>(np * E)], f32(s.class_embd),
                static_cast<size_t>(E) * sizeof(float));
  std::vector<float> pos(static_cast<size_t>(E));
  for (int64_t r = 0; r < N; ++r) {
    get_row(s.pos_embd, r, pos.data());
    for (int64_t i = 0; i < E; ++i)
      x_[static_cast<size_t>(r * E + i)] += pos[static_cast<size_t>(i)];
  }
}

void VisionEncoder::block(const VisionLayer& L) {
  const VisionSpec& s = spec();
  const int64_t E = s.n_embd, N = s.n_pos(), F = s.n_ff;
  h_.resize(static_cast<size_t>(N * E));
  qkv_.resize(static_cast<size_t>(N * 3 * E));
  attn_.resize(static_cast<size_t>(N * E));
  tmp_.resize(static_cast<size_t>(N * E));
  ff_.resize(static_cast<size_t>(N * F));
  layer_norm_rows(x_.data(), L.ln1_w, L.ln1_b, h_.data(), N, E, s.eps);
  const MatmulTarget t[3] = {{L.q_w, qkv_.data(), 3 * E},
                             {L.k_w, qkv_.data() + E, 3 * E},
                             {L.v_w, qkv_.data() + 2 * E, 3 * E}};
  matmul_shared(t, h_.data(), E, N, pool_.get());
  add_bias(L.q_b, qkv_.data(), N, 3 * E);
  add_bias(L.k_b, qkv_.data() + E, N, 3 * E);
  add_bias(L.v_b, qkv_.data() + 2 * E, N, 3 * E);
  attention(qkv_.data(), attn_.data());
  matmul(L.o_w, attn_.data(), N, tmp_.data(), pool_.get());
  add_bias(L.o_b, tmp_.data(), N, E);
  for (size_t i = 0; i < x_.size(); ++i) x_[i] += tmp_[i];

  layer_norm_rows(x_.data(), L.ln2_w, L.ln2_b, h_.data(), N, E, s.eps);
  matmul(L.up_w, h_.data(), N, ff_.data(), pool_.get());
  add_bias(L.up_b, ff_.data(), N, F);
  for (float& v : ff_) v = activate(s.act, v);
  matmul(L.down_w, ff_.data(), N, tmp_.data(), pool_.get());
  add_bias(L.down_b, tmp_.data(), N, E);
  for (size_t i = 0; i < x_.size(); ++i) x_[i] += tmp_[i];
}

// Full (non-causal) attention of every position to every position, head by head, as two
// products on the f32 matmul kernels: scores = Q K^T (K's rows as the "weights"), scaled by
// 1/sqrt(d), softmax with the maximum subtracted (vec_ops.h softmax_rows), then P V (V transposed
// as the weights). The kernels' per-output dot products make every row independent of the
// others, like the rest of the encoder.
void VisionEncoder::attention(const float* qkv, float* out) {
  const VisionSpec& s = spec();
  const int64_t E = s.n_embd, N = s.n_pos(), H = s.n_head, d = E / H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  head_q_.resize(static_cast<size_t>(N * d));
  head_k_.resize(static_cast<size_t>(N * d));
  head_vt_.resize(static_cast<size_t>(d * N));
  // Queries go kQueryBlock at a time, so that their scores (kQueryBlock x N) stay in cache
  // between the two products; each row is computed alone either way (the same bits).
  constexpr int64_t kQueryBlock = 128;
  scores_.resize(static_cast<size_t>(std::min(N, kQueryBlock) * N));
  head_out_.resize(static_cast<size_t>(N * d));
  model::WeightView kw, vw;
  kw.name = "attention keys";
  kw.ne[0] = d;
  kw.ne[1] = N;
  kw.data = reinterpret_cast<const uint8_t*>(head_k_.data());
  vw.name = "attention values";
  vw.ne[0] = N;
  vw.ne[1] = d;
  vw.data = reinterpret_cast<const uint8_t*>(head_vt_.data());
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t j = 0; j < N; ++j) {
      const float* row = qkv + j * 3 * E + h * d;
      std::memcpy(&head_q_[static_cast<size_t>(j * d)], row, static_cast<size_t>(d) * 4);
      std::memcpy(&head_k_[static_cast<size_t>(j * d)], row + E, static_cast<size_t>(d) * 4);
      for (int64_t c = 0; c < d; ++c) head_vt_[static_cast<size_t>(c * N + j)] = row[2 * E + c];
    }
    for (int64_t q0 = 0; q0 < N; q0 += kQueryBlock) {
      const int64_t nq = std::min(kQueryBlock, N - q0);
      matmul(kw, &head_q_[static_cast<size_t>(q0 * d)], nq, scores_.data(), pool_.get());
      pool_->parallel_for(nq, 8, [&](int64_t i0, int64_t i1) {
        softmax_rows(&scores_[static_cast<size_t>(i0 * N)], i1 - i0, N, scale);
      });
      matmul(vw, scores_.data(), nq, &head_out_[static_cast<size_t>(q0 * d)], pool_.get());
    }
    for (int64_t i = 0; i < N; ++i)
      std::memcpy(out + i * E + h * d, &head_out_[static_cast<size_t>(i * d)],
                  static_cast<size_t>(d) * 4);
  }
}

void VisionEncoder::project(std::vector<float>* out) {
  const VisionSpec& s = spec();
  const int64_t E = s.n_embd, n_out = s.n_image_tokens(), D = s.n_embd_out;
  out->assign(static_cast<size_t>(n_out * D), 0.0f);
  if (s.projector == Projector::kMlp) {
    // llama.cpp keeps sequence rows 1 .. n_patches: patches 1 .. n-1, then the class token.
    const int64_t W = static_cast<int64_t>(features_.size()) / s.n_pos();
    const float* rows = features_.data() + W;
    const bool two = s.mm2_w.present();
    const int64_t Hd = s.mm0_w.rows();
    ff_.resize(static_cast<size_t>(n_out * Hd));
    float* first = two ? ff_.data() : out->data();
    matmul(s.mm0_w, rows, n_out, first, pool_.get());
    add_bias(s.mm0_b, first, n_out, Hd);
    if (!two) return;
    for (float& v : ff_) v = activate(VisionAct::kGelu, v);
    matmul(s.mm2_w, ff_.data(), n_out, out->data(), pool_.get());
    add_bias(s.mm2_b, out->data(), n_out, D);
    return;
  }
  // Gemma 3: k x k average pooling over the patch grid (sum in window order, then / k^2),
  // RMS norm times soft_emb_norm, then the projection.
  const int64_t k = s.merge, side = s.patches_per_side(), os = side / k;
  h_.assign(static_cast<size_t>(n_out * E), 0.0f);
  for (int64_t oy = 0; oy < os; ++oy)
    for (int64_t ox = 0; ox < os; ++ox)
      for (int64_t c = 0; c < E; ++c) {
        float acc = 0;
        for (int64_t ky = 0; ky < k; ++ky)
          for (int64_t kx = 0; kx < k; ++kx)
            acc += features_[static_cast<size_t>(((oy * k + ky) * side + ox * k + kx) * E + c)];
        h_[static_cast<size_t>((oy * os + ox) * E + c)] = acc / static_cast<float>(k * k);
      }
  tmp_.resize(static_cast<size_t>(n_out * E));
  for (int64_t r = 0; r < n_out; ++r)
    detail::rms_norm(&h_[static_cast<size_t>(r * E)], f32(s.soft_emb_norm_w),
                     &tmp_[static_cast<size_t>(r * E)], E, s.eps);
  matmul(s.input_proj, tmp_.data(), n_out, out->data(), pool_.get());
}

}  // namespace troupe::compute
