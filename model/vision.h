// Vision encoders of vision-language models: the image half of a llama.cpp "mmproj" GGUF
// (general.architecture "clip"), a ViT and the projector that maps its output into the text
// model's embedding space, described independently of the file. Users: compute/vision_encoder.h,
// bin/ (troupe generate --mmproj). Immutable after load; share freely.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/result.h"
#include "model/image.h"
#include "model/model_spec.h"

namespace troupe::model {

/// How the encoder's output becomes text-model embeddings (the file's clip.projector_type).
enum class Projector : uint8_t {
  kMlp = 0,     // "mlp": LLaVA 1.5 -- linear, GELU, linear over the patch rows
  kGemma3 = 1,  // "gemma3": k x k average pooling, RMS norm, one linear map
};
const char* projector_name(Projector p);

/// The activation of the ViT's feed-forward blocks (clip.use_gelu / clip.use_silu).
enum class VisionAct : uint8_t {
  kGelu = 0,       // GELU's tanh form, as llama.cpp computes it (see compute/vision_encoder.h)
  kGeluQuick = 1,  // x * sigmoid(1.702 x): CLIP's own "quick_gelu"
  kSilu = 2,
};

struct VisionLayer {
  WeightView ln1_w, ln1_b;  // LayerNorm before attention
  WeightView q_w, q_b, k_w, k_b, v_w, v_b, o_w, o_b;
  WeightView ln2_w, ln2_b;  // LayerNorm before the FFN
  WeightView up_w, up_b, down_w, down_b;
};

struct VisionSpec {
  Projector projector = Projector::kMlp;
  VisionAct act = VisionAct::kGelu;
  int64_t image_size = 0;  // the encoder's input is image_size x image_size pixels
  int64_t patch_size = 0;
  int64_t n_embd = 0;  // ViT width
  int64_t n_ff = 0;
  int64_t n_head = 0;
  float eps = 1e-6f;  // LayerNorm epsilon (also the Gemma 3 projector's RMS norm)
  std::array<float, 3> mean{}, std{};
  /// The ViT blocks that run (a LLaVA projector reads an inner layer's output, so later blocks
  /// are skipped), and which hidden states feed the projector: 0 is the input of block 0, i the
  /// output of block i - 1; several are concatenated along the width (Granite Vision).
  int64_t n_layer_run = 0;
  std::vector<int64_t> feature_layers;
  int64_t merge = 1;       // Gemma 3: the pooling kernel (clip.vision.projector.scale_factor)
  int64_t n_embd_out = 0;  // the text model's width: the projector's output rows

  /// Patch embedding as a matrix: [n_embd rows, 3 * patch^2 columns], column c * p^2 + y * p + x.
  WeightView patch_w, patch_b;
  WeightView class_embd;          // LLaVA: appended after the patch rows (llama.cpp's order)
  WeightView pos_embd;            // [n_pos rows, n_embd]
  WeightView pre_ln_w, pre_ln_b;  // may be absent
  WeightView post_ln_w, post_ln_b;
  std::vector<VisionLayer> layers;        // all blocks in the file
  WeightView mm0_w, mm0_b, mm2_w, mm2_b;  // kMlp (mm2 optional)
  WeightView soft_emb_norm_w;             // kGemma3
  WeightView input_proj;                  // kGemma3: [n_embd_out rows, n_embd] (transposed copy)

  int64_t patches_per_side() const { return image_size / patch_size; }
  int64_t n_patches() const { return patches_per_side() * patches_per_side(); }
  /// Rows of the ViT's sequence: the patches, plus the class token where there is one.
  int64_t n_pos() const { return n_patches() + (class_embd.present() ? 1 : 0); }
  /// Embeddings one image becomes (every image is resized to image_size x image_size).
  int64_t n_image_tokens() const;
  /// Resize, pad and normalization that turn a decoded image into the encoder's input.
  ImagePreprocess preprocess() const;
};

struct VisionModel {
  std::string path;
  VisionSpec spec;
  std::vector<std::shared_ptr<const void>> storage;  // the mapping and converted copies
};

/// Loads an mmproj GGUF, or the vision tower of a Hugging Face model directory (see
/// load_hf_vision_model). Errors name the file and the key or tensor (an unknown projector type,
/// a missing or misshapen tensor, an image size that is not a multiple of the patch size, ...).
Result<std::shared_ptr<const VisionModel>> load_vision_model(const std::string& path);

/// The vision tower and projector of a Hugging Face LlavaForConditionalGeneration or
/// Gemma3ForConditionalGeneration directory (model/hf_vision.cc: config.json,
/// preprocessor_config.json, safetensors), as the VisionSpec llama.cpp's converter would give it.
Result<std::shared_ptr<const VisionModel>> load_hf_vision_model(const std::string& dir);

/// Whether the Hugging Face directory's config.json names a multimodal class (architectures[0]
/// ending in "ForConditionalGeneration"): one whose vision tower load_vision_model may read, or
/// refuses saying why. False for any other directory, or one that cannot be read.
bool hf_names_multimodal_model(const std::string& dir);

/// The bytes of weights load_vision_model(path) maps: an mmproj file's size, or in a Hugging Face
/// directory those of its vision tower and projector tensors (not the language model's); 0 when
/// the path cannot be read.
uint64_t vision_weight_bytes(const std::string& path);

}  // namespace troupe::model
