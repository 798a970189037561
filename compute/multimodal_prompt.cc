// build_multimodal_prompt: text parts and image rows in prompt order (see the header).
#include "compute/multimodal_prompt.h"

#include <algorithm>
#include <string>

#include "base/check.h"
#include "compute/engine.h"
#include "model/tokenizer.h"

namespace troupe::compute {

namespace {

// The text around each image: Gemma 3 brackets its images with two special tokens, which
// llama.cpp writes around the marker before tokenizing (so they join the neighbouring text).
std::string bracket_markers(std::string_view text, const model::VisionSpec& v) {
  if (v.projector != model::Projector::kGemma3) return std::string(text);
  std::string out;
  size_t at = 0;
  for (size_t m; (m = text.find(kMediaMarker, at)) != std::string_view::npos;) {
    out.append(text.substr(at, m - at));
    out.append("<start_of_image>").append(kMediaMarker).append("<end_of_image>");
    at = m + kMediaMarker.size();
  }
  out.append(text.substr(at));
  return out;
}

Status check_image_tokens(const model::Tokenizer& tok, const model::VisionSpec& v) {
  if (v.projector != model::Projector::kGemma3 ||
      (tok.find_token("<start_of_image>") >= 0 && tok.find_token("<end_of_image>") >= 0))
    return Ok{};
  return Error{1,
               "the language model's vocabulary has no <start_of_image> / <end_of_image> "
               "tokens, which a Gemma 3 vision encoder needs"};
}

}  // namespace

Status check_vision_pair(const model::Tokenizer* tok, int64_t n_embd,
                         const model::VisionSpec& vision) {
  if (vision.n_embd_out != n_embd)
    return Error{1,
                 strfmt("the vision encoder gives rows of %lld values but the language model's "
                        "width is %lld: they do not belong together",
                        static_cast<long long>(vision.n_embd_out), static_cast<long long>(n_embd))};
  if (!tok) return Error{1, "the language model has no vocabulary to lay out a prompt with images"};
  return check_image_tokens(*tok, vision);
}

Result<MultimodalPrompt> build_multimodal_prompt(const model::Tokenizer& tok, std::string_view text,
                                                 std::span<const std::vector<float>> images,
                                                 const model::VisionSpec& vision, bool add_bos) {
  const size_t n_markers = count_media_markers(text);
  std::string with_markers;
  if (n_markers == 0) {
    for (size_t i = 0; i < images.size(); ++i) with_markers.append(kMediaMarker);
    with_markers.append(text);
  } else if (n_markers != images.size()) {
    return Error{
        1, strfmt("the prompt has %zu image markers (%.*s) but %zu images were given", n_markers,
                  static_cast<int>(kMediaMarker.size()), kMediaMarker.data(), images.size())};
  } else {
    with_markers = text;
  }
  if (auto st = check_image_tokens(tok, vision); !st) return st.error();
  const std::string full = bracket_markers(with_markers, vision);
  const int64_t rows = vision.n_image_tokens(), width = vision.n_embd_out;

  MultimodalPrompt p;
  p.non_causal_images = vision.projector == model::Projector::kGemma3;
  if (add_bos && tok.bos_id() >= 0) p.tokens.push_back(tok.bos_id());
  size_t at = 0, image = 0;
  while (true) {
    const size_t m = full.find(kMediaMarker, at);
    const std::string_view part =
        std::string_view(full).substr(at, m == std::string::npos ? std::string::npos : m - at);
    if (!part.empty()) {
      const std::vector<int32_t> ids = tok.encode(part, /*add_special=*/false,
                                                  /*parse_special=*/true);
      p.tokens.insert(p.tokens.end(), ids.begin(), ids.end());
    }
    if (m == std::string::npos) break;
    const std::vector<float>& e = images[image];
    if (static_cast<int64_t>(e.size()) != rows * width)
      return Error{
          1, strfmt("image %zu has %zu embedding values, expected %lld x %lld", image + 1, e.size(),
                    static_cast<long long>(rows), static_cast<long long>(width))};
    p.images.push_back({static_cast<int64_t>(p.tokens.size()), rows});
    p.tokens.insert(p.tokens.end(), static_cast<size_t>(rows), SeqStep::kEmbedded);
    p.embd.insert(p.embd.end(), e.begin(), e.end());
    ++image;
    at = m + kMediaMarker.size();
  }
  return p;
}

std::vector<PrefillChunk> prefill_chunks(const MultimodalPrompt& p, int64_t max_tokens) {
  TROUPE_CHECK(max_tokens > 0, "prefill_chunks: max_tokens %lld",
               static_cast<long long>(max_tokens));
  std::vector<PrefillChunk> out;
  const int64_t n = static_cast<int64_t>(p.tokens.size());
  int64_t at = 0, row = 0;
  size_t image = 0;
  auto add = [&](int64_t end, bool non_causal) {
    out.push_back({at, end, row, non_causal});
    for (int64_t i = at; i < end; ++i)
      row += p.tokens[static_cast<size_t>(i)] == SeqStep::kEmbedded;
    at = end;
  };
  while (at < n) {
    if (p.non_causal_images && image < p.images.size() && p.images[image].begin == at) {
      add(at + p.images[image++].count, true);
      continue;
    }
    int64_t end = std::min(n, at + max_tokens);
    if (p.non_causal_images && image < p.images.size()) end = std::min(end, p.images[image].begin);
    add(end, false);
  }
  return out;
}

}  // namespace troupe::compute
