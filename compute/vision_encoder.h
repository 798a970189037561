// VisionEncoder: a vision-language model's image encoder (model/vision.h) on the CPU: one
// preprocessed image in, the rows that replace its placeholder positions in the text model out.
// Users: bin/ (troupe generate --image), tests. Thread safety: one encode() at a time per
// encoder (it owns its thread pool and scratch); the VisionModel is shared read-only.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "base/result.h"
#include "model/image.h"
#include "model/vision.h"

namespace troupe::compute {

class ThreadPool;

class VisionEncoder {
 public:
  static Result<std::unique_ptr<VisionEncoder>> create(
      std::shared_ptr<const model::VisionModel> model, int n_threads);
  ~VisionEncoder();

  /// pixels: f32 planar [3][S][S], S = spec().image_size (model::preprocess_image with
  /// spec().preprocess()). Returns f32 [spec().n_image_tokens(), spec().n_embd_out].
  Result<std::vector<float>> encode(std::span<const float> pixels);
  /// Preprocesses a decoded image as the model asks, then encodes it.
  Result<std::vector<float>> encode(const model::Image& image);

  const model::VisionSpec& spec() const { return model_->spec; }

 private:
  VisionEncoder() = default;
  void forward(const float* pixels, std::vector<float>* out);
  void patch_embed(const float* pixels);
  void block(const model::VisionLayer& L);
  void attention(const float* qkv, float* out);
  void project(std::vector<float>* out);

  std::shared_ptr<const model::VisionModel> model_;
  std::unique_ptr<ThreadPool> pool_;
  // Scratch, f32 row-major: the sequence [n_pos, n_embd] and per-block temporaries.
  std::vector<float> x_, h_, qkv_, attn_, tmp_, ff_, features_;
  // One head's attention: q and k [n_pos, d], v transposed [d, n_pos], scores [n_pos, n_pos].
  std::vector<float> head_q_, head_k_, head_vt_, scores_, head_out_;
};

}  // namespace troupe::compute
