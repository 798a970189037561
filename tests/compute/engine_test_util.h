// Test helpers for engine tests: load a GGUF model without its tokenizer; teacher-forced logits.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "compute/engine.h"
#include "model/gguf.h"
#include "model/model.h"

namespace troupe::compute {

inline std::shared_ptr<const model::Model> load_model_for_test(const std::string& path) {
  auto g = model::GgufFile::open(path);
  if (!g) return nullptr;
  auto m = std::make_shared<model::Model>();
  m->path = path;
  m->format = "gguf";
  m->spec = model::spec_from_gguf(**g);
  m->storage.push_back(std::shared_ptr<const model::GgufFile>(std::move(*g)));
  return m;
}

/// The teacher-forced logits [tokens x vocab] of prompts[which] when all `prompts` run as one
/// batched step of a fresh 2-thread engine on m; empty, with a test failure, on an error.
inline std::vector<float> batch_logits(std::shared_ptr<const model::Model> m,
                                       const std::vector<std::vector<int32_t>>& prompts,
                                       size_t which) {
  EngineOptions o;
  o.max_tokens_in_cache = 512;
  o.n_threads = 2;
  auto eng = Engine::create(std::move(m), o);
  EXPECT_TRUE(eng.has_value()) << eng.error().message;
  if (!eng) return {};
  std::vector<std::unique_ptr<Sequence>> seqs;
  std::vector<SeqStep> steps;
  for (const auto& p : prompts) {
    seqs.push_back(std::make_unique<Sequence>(**eng));
    EXPECT_TRUE(seqs.back()->reserve(static_cast<int64_t>(p.size())));
    steps.push_back(seqs.back()->next(p, SeqStep::Logits::kAll));
  }
  StepResult r;
  EXPECT_TRUE((*eng)->step(steps, &r).has_value());
  const float* first = r.row(which);
  return {first, first + r.row_count[which] * r.n_vocab};
}

/// The same for one prompt alone.
inline std::vector<float> prompt_logits(std::shared_ptr<const model::Model> m,
                                        const std::vector<int32_t>& prompt) {
  return batch_logits(std::move(m), {prompt}, 0);
}

/// The same for the model file (or Hugging Face directory) at path, mapped.
inline std::vector<float> prompt_logits(const std::string& path,
                                        const std::vector<int32_t>& prompt) {
  auto m = model::load_model(path);
  EXPECT_TRUE(m.has_value()) << path << ": " << m.error().message;
  if (!m) return {};
  return prompt_logits(*m, prompt);
}

}  // namespace troupe::compute
