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
#include "model/model.h"

namespace troupe::actors {

struct Reference {
  std::vector<int32_t> tokens;
  std::vector<float> logits;  // [tokens, n_vocab]
};

// Greedy generation on the plain engine, the prompt prefilled as the CLI does (a non-causal
// image as a step of its own).
inline Reference solo(std::shared_ptr<const model::Model> m, const compute::MultimodalPrompt& p,
                      int64_t n) {
  compute::EngineOptions o;
  o.max_tokens_in_cache = static_cast<int64_t>(p.tokens.size()) + n + 1;
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
                      int64_t n) {
  compute::MultimodalPrompt p;
  p.tokens = prompt;
  return solo(std::move(m), p, n);
}

inline void expect_identical(const GenerateResult& got, const Reference& ref,
                             const std::string& what) {
  ASSERT_TRUE(got.ok()) << what << ": " << got.error;
  EXPECT_EQ(got.tokens, ref.tokens) << what;
  ASSERT_EQ(got.logits.size(), ref.logits.size()) << what;
  EXPECT_EQ(std::memcmp(got.logits.data(), ref.logits.data(), ref.logits.size() * 4), 0)
      << what << ": logits differ";
}

}  // namespace troupe::actors
