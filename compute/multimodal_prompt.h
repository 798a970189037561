// A prompt with images, as the engine takes it: token ids with SeqStep::kEmbedded at each image
// position and the images' embedding rows in order. Built the way llama.cpp's libmtmd lays a
// prompt out, so that outputs can be compared with it. Users: bin/ (troupe generate --image).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "base/result.h"
#include "model/vision.h"

namespace troupe::model {
class Tokenizer;
}

namespace troupe::compute {

/// Where an image goes in a prompt's text (llama.cpp's default media marker).
inline constexpr std::string_view kMediaMarker = "<__media__>";

/// How many image markers `text` holds.
inline size_t count_media_markers(std::string_view text) {
  size_t n = 0;
  for (size_t at = 0; (at = text.find(kMediaMarker, at)) != std::string_view::npos;
       at += kMediaMarker.size())
    ++n;
  return n;
}

struct MultimodalPrompt {
  struct Span {
    int64_t begin = 0, count = 0;  // token positions
  };
  std::vector<int32_t> tokens;     // ids, and SeqStep::kEmbedded at image positions
  std::vector<float> embd;         // f32 [number of kEmbedded tokens, n_embd]
  std::vector<Span> images;        // where each image's rows are, in order
  bool non_causal_images = false;  // each image must be one step with SeqStep::non_causal
  /// Per image (in order), a digest of its content (the encoder's cache key: a SHA-256 of the
  /// file); empty when unknown. With it the prefix cache may keep and reuse the KV of image
  /// positions (compute/kv_block_manager.h invariant 7; a non-causal image only whole).
  std::vector<std::array<uint8_t, 32>> image_keys;
};

/// One prefill step of a multimodal prompt: tokens [begin, end), rows [row_begin, ...).
struct PrefillChunk {
  int64_t begin = 0, end = 0, row_begin = 0;
  bool non_causal = false;
};

/// Prefill steps of at most max_tokens each (an image that must be non-causal is one step of its
/// own, however long); causal prompts split anywhere, which never changes a result.
std::vector<PrefillChunk> prefill_chunks(const MultimodalPrompt& p, int64_t max_tokens);

/// Whether an encoder fits a language model: rows as wide as its embeddings (n_embd), a
/// vocabulary (`tok` non-null), and for a Gemma 3 encoder the <start_of_image>/<end_of_image>
/// tokens. The error names the mismatch.
Status check_vision_pair(const model::Tokenizer* tok, int64_t n_embd,
                         const model::VisionSpec& vision);

/// Splits `text` at each kMediaMarker (one per image, in order; with no marker at all the images
/// come first, each followed by nothing) and tokenizes each text part on its own without
/// BOS/EOS but recognising special-token texts, BOS first when add_bos (llama.cpp's
/// mtmd_tokenize). Each image is its rows of `images` (f32 [tokens_per_image, n_embd]), wrapped
/// in the projector's begin/end-of-image tokens where it has them (Gemma 3's <start_of_image>
/// and <end_of_image>). Errors: marker count not equal to the image count, an image of the wrong
/// size, begin/end tokens missing from the vocabulary.
Result<MultimodalPrompt> build_multimodal_prompt(const model::Tokenizer& tok, std::string_view text,
                                                 std::span<const std::vector<float>> images,
                                                 const model::VisionSpec& vision, bool add_bos);

}  // namespace troupe::compute
