// The ground truth of the actor-system tests: greedy generation on the plain engine, and the
// bit-for-bit comparison of a cluster's result with it. Users: tests/actors/*_test.cc.
#pragma once

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "actors/local_cluster.h"
#include "compute/engine.h"
#include "compute/multimodal_prompt.h"
#include "compute/sampler.h"
#include "compute/vision_encoder.h"
#include "model/image.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "model/vision.h"

namespace troupe::actors {

struct Reference {
  std::vector<int32_t> tokens;
  std::vector<float> logits;  // [tokens, n_vocab]
};

// Greedy generation on the plain engine, the prompt prefilled as the CLI does (a non-causal
// image as a step of its own).
inline Reference solo(std::shared_ptr<const model::Model> m, const compute::MultimodalPrompt& p,
                      int64_t n, compute::KvType kv = compute::KvType::kF32) {
  compute::EngineOptions o;
  o.max_tokens_in_cache = static_cast<int64_t>(p.tokens.size()) + n + 1;
  o.kv_type = kv;
  auto eng = compute::Engine::create(m, o);
  EXPECT_TRUE(eng);
  compute::Sequence seq(**eng);
  EXPECT_TRUE(seq.reserve(static_cast<int64_t>(p.tokens.size()) + n));
  compute::StepResult r;
  const auto E = static_cast<size_t>(m->spec.n_embd);
  for (const compute::PrefillChunk& c : compute::prefill_chunks(p, 1 << 20)) {
    auto st = seq.next({p.tokens.data() + c.begin, static_cast<size_t>(c.end - c.begin)},
                       compute::SeqStep::Logits::kLast);
    const auto k = static_cast<size_t>(
        std::count(st.tokens.begin(), st.tokens.end(), compute::SeqStep::kEmbedded));
    st.embd = {p.embd.data() + static_cast<size_t>(c.row_begin) * E, k * E};
    st.non_causal = c.non_causal;
    const Status ok = (*eng)->step({&st, 1}, &r);
    EXPECT_TRUE(ok.has_value()) << ok.error().message;
    seq.advance(c.end - c.begin);
  }
  Reference ref;
  compute::Sampler greedy(compute::SamplingParams{});
  for (int64_t i = 0; i < n; ++i) {
    std::span<const float> row(r.row(0), static_cast<size_t>(r.n_vocab));
    ref.logits.insert(ref.logits.end(), row.begin(), row.end());
    ref.tokens.push_back(greedy.sample(row, {}));
    if (i + 1 == n) break;
    auto st2 = seq.next({&ref.tokens.back(), 1}, compute::SeqStep::Logits::kLast);
    EXPECT_TRUE((*eng)->step({&st2, 1}, &r).has_value());
    seq.advance(1);
  }
  return ref;
}

// The same for a prompt of token ids, prefilled in one step.
inline Reference solo(std::shared_ptr<const model::Model> m, const std::vector<int32_t>& prompt,
                      int64_t n, compute::KvType kv = compute::KvType::kF32) {
  compute::MultimodalPrompt p;
  p.tokens = prompt;
  return solo(std::move(m), p, n, kv);
}

inline void expect_identical(const GenerateResult& got, const Reference& ref,
                             const std::string& what) {
  ASSERT_TRUE(got.ok()) << what << ": " << got.error;
  EXPECT_EQ(got.tokens, ref.tokens) << what;
  ASSERT_EQ(got.logits.size(), ref.logits.size()) << what;
  EXPECT_EQ(std::memcmp(got.logits.data(), ref.logits.data(), ref.logits.size() * 4), 0)
      << what << ": logits differ";
}

// The bytes of an image file, as a client sends them ("" and a test failure when unreadable).
inline std::string image_file(const std::string& path) {
  auto b = model::read_image_bytes(path);
  EXPECT_TRUE(b) << b.error().message;
  return b ? std::move(*b) : std::string();
}

// The prompt `text` with the image files at `paths` encoded by `enc` and laid out here: what a
// cluster's encoder must reproduce (empty, and a test failure, on an error).
inline compute::MultimodalPrompt reference_prompt(const model::Model& m,
                                                  compute::VisionEncoder& enc,
                                                  const std::string& text,
                                                  const std::vector<std::string>& paths) {
  std::vector<std::vector<float>> rows;
  for (const auto& path : paths) {
    auto image = model::read_image_file(path);
    auto r = image ? enc.encode(*image) : Result<std::vector<float>>(image.error());
    EXPECT_TRUE(r) << path << ": " << r.error().message;
    if (!r) return {};
    rows.push_back(std::move(*r));
  }
  auto p = compute::build_multimodal_prompt(*m.tokenizer, text, rows, enc.spec(), true);
  EXPECT_TRUE(p) << p.error().message;
  return p ? std::move(*p) : compute::MultimodalPrompt{};
}

// A greedy request of n tokens, logits returned, whose image files the cluster's encoder lays out.
inline GenerateRequest file_request(const std::string& text, std::vector<std::string> files,
                                    int64_t n) {
  GenerateRequest r;
  r.prompt = text;
  r.image_files = std::make_shared<const std::vector<std::string>>(std::move(files));
  r.max_tokens = n;
  r.sampling.ignore_eos = true;
  r.return_logits = true;
  return r;
}

// The synthetic LLaVA pair of ../shared, and an encoder for reference rows.
struct Llava {
  Result<std::shared_ptr<const model::Model>> m = Error{1, "not loaded"};
  Result<std::shared_ptr<const model::VisionModel>> vm = Error{1, "not loaded"};
  Result<std::unique_ptr<compute::VisionEncoder>> enc = Error{1, "not loaded"};
};

/// ../shared's synthetic LLaVA pair, or the pair at `model` and `mmproj` (a Hugging Face
/// directory may be both).
inline void load_llava(const std::string& shared, Llava* l, const std::string& model = "",
                       const std::string& mmproj = "") {
  const std::string dir = shared + "/models/synth/llava-tiny/";
  l->m = model::load_model(model.empty() ? dir + "model.gguf" : model);
  ASSERT_TRUE(l->m) << l->m.error().message;
  l->vm = model::load_vision_model(mmproj.empty() ? dir + "mmproj.gguf" : mmproj);
  ASSERT_TRUE(l->vm) << l->vm.error().message;
  l->enc = compute::VisionEncoder::create(*l->vm, 1);
  ASSERT_TRUE(l->enc);
}

}  // namespace troupe::actors
