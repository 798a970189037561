// stories260K's greedy story from BOS must equal llama2.c's reference output (run.c, 256 steps:
// BOS plus 255 fed tokens, 256 sampled).
#include <algorithm>

#include "compute/engine.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "tests/test_support.h"

namespace troupe::compute {
namespace {

TEST(Story, GreedyStoryFromBosMatchesLlama2c) {
  TROUPE_SHARED_OR_SKIP(shared);
  auto m = model::load_model(shared + "/models/stories260K/stories260K.gguf");
  ASSERT_TRUE(m) << m.error().message;
  ASSERT_TRUE((*m)->tokenizer);
  std::string expected =
      testing::read_text_file(shared + "/models/stories260K/expected_greedy_t0_256steps.txt");
  while (!expected.empty() && expected.back() == '\n') expected.pop_back();

  EngineOptions o;
  o.max_tokens_in_cache = 257;
  auto eng = Engine::create(*m, o);
  ASSERT_TRUE(eng);
  Sequence seq(**eng);
  ASSERT_TRUE(seq.reserve(257));
  std::vector<int32_t> toks = {(*m)->tokenizer->bos_id()};
  StepResult r;
  for (int step = 0; step < 256; ++step) {
    SeqStep st = seq.next({&toks.back(), 1}, SeqStep::Logits::kLast);
    ASSERT_TRUE((*eng)->step({&st, 1}, &r).has_value());
    seq.advance(1);
    const float* row = r.row(0);
    const int32_t next = static_cast<int32_t>(std::max_element(row, row + r.n_vocab) - row);
    if (next == (*m)->tokenizer->bos_id()) break;  // llama2.c's run.c stops on BOS
    toks.push_back(next);
  }
  // run.c drops the leading space of the piece that follows BOS; llama.cpp's detokenizer keeps it.
  std::string text = (*m)->tokenizer->decode(toks);
  if (!text.empty() && text[0] == ' ') text.erase(0, 1);
  EXPECT_EQ(toks.size(), 257u);
  EXPECT_EQ(text, expected);
}

}  // namespace
}  // namespace troupe::compute
