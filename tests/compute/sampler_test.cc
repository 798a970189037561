// Tests of compute/sampler.h: greedy and seeded sampling, RNG state round trips, top-k/top-p/
// min-p/temperature against reference computations, penalties, validation, and StopMatcher.
#include "compute/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <numeric>
#include <set>

#include <gtest/gtest.h>

namespace troupe::compute {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

SamplingParams with_temperature(float temperature, uint64_t seed = 1) {
  SamplingParams p;
  p.temperature = temperature;
  p.seed = seed;
  return p;
}

// Test data from a fixed generator (not <random>, whose distributions vary by library).
std::vector<float> random_logits(size_t n, uint64_t seed, float scale = 4.0f) {
  std::vector<float> out(n);
  uint64_t x = seed;
  for (float& v : out) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    v = scale * (static_cast<float>(x >> 40) / static_cast<float>(1 << 24) * 2.0f - 1.0f);
  }
  return out;
}

std::vector<double> softmax(const std::vector<float>& logits, double temperature = 1) {
  const float m = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  double z = 0;
  for (size_t i = 0; i < logits.size(); ++i) z += p[i] = std::exp((logits[i] - m) / temperature);
  for (double& v : p) v /= z;
  return p;
}

std::vector<int32_t> ids_of(const std::vector<TokenProb>& d) {
  std::vector<int32_t> ids;
  for (const TokenProb& t : d) ids.push_back(t.token_id);
  return ids;
}

std::vector<int32_t> sorted_ids(std::vector<TokenProb> d) {
  std::vector<int32_t> ids = ids_of(d);
  std::sort(ids.begin(), ids.end());
  return ids;
}

// ---- greedy and special values ----

TEST(Sampler, GreedyPicksArgmax) {
  Sampler s(SamplingParams{});
  EXPECT_EQ(s.sample(std::vector<float>{1, 3, 2, -1}, {}), 1);
  EXPECT_EQ(s.sample(std::vector<float>{-5, -3, -4}, {}), 1);
}

TEST(Sampler, GreedyTiesGoToLowestId) {
  Sampler s(SamplingParams{});
  EXPECT_EQ(s.sample(std::vector<float>{1, 5, 5, 2, 5}, {}), 1);
  EXPECT_EQ(s.sample(std::vector<float>(1000, 0.25f), {}), 0);
}

TEST(Sampler, NaNLogitIsNeverChosen) {
  Sampler greedy(SamplingParams{});
  EXPECT_EQ(greedy.sample(std::vector<float>{kNaN, 1, kNaN}, {}), 1);
  EXPECT_EQ(greedy.sample(std::vector<float>{kNaN, -50}, {}), 1);
  Sampler s(with_temperature(5));
  for (int i = 0; i < 500; ++i) EXPECT_EQ(s.sample(std::vector<float>{kNaN, -3, kNaN}, {}), 1);
}

TEST(Sampler, MinusInfLogitIsNeverDrawn) {
  Sampler s(with_temperature(3));
  std::vector<float> logits = {-kInf, 0, -kInf, 0.5f, -kInf, -1};
  for (int i = 0; i < 2000; ++i) {
    int32_t t = s.sample(logits, {});
    EXPECT_TRUE(t == 1 || t == 3 || t == 5) << t;
  }
}

TEST(Sampler, AllMinusInfOrNaNGivesTokenZero) {
  std::vector<float> logits = {-kInf, kNaN, -kInf};
  Sampler greedy(SamplingParams{});
  EXPECT_EQ(greedy.sample(logits, {}), 0);
  SamplingParams p = with_temperature(1);
  p.top_k = 2;
  p.top_p = 0.5f;
  Sampler s(p);
  EXPECT_EQ(s.sample(logits, {}), 0);
}

TEST(Sampler, PlusInfLogitsShareAllTheMass) {
  Sampler s(with_temperature(1));
  std::vector<float> logits = {0, kInf, 3, kInf};
  std::vector<TokenProb> d = s.distribution(logits, {});
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].token_id, 1);
  EXPECT_EQ(d[1].token_id, 3);
  EXPECT_DOUBLE_EQ(d[0].prob, 0.5);
  std::set<int32_t> seen;
  for (int i = 0; i < 200; ++i) seen.insert(s.sample(logits, {}));
  EXPECT_EQ(seen, (std::set<int32_t>{1, 3}));
  Sampler greedy(SamplingParams{});
  EXPECT_EQ(greedy.sample(logits, {}), 1);
}

TEST(Sampler, VocabOfOne) {
  SamplingParams p = with_temperature(0.8f);
  p.top_k = 5;
  p.top_p = 0.5f;
  p.min_p = 0.5f;
  p.repetition_penalty = 1.3f;
  Sampler s(p);
  EXPECT_EQ(s.sample(std::vector<float>{2.5f}, std::vector<int32_t>{0, 0}), 0);
  Sampler greedy(SamplingParams{});
  EXPECT_EQ(greedy.sample(std::vector<float>{-kInf}, {}), 0);
}

TEST(Sampler, AllEqualLogitsAreUniform) {
  Sampler s(with_temperature(1, 7));
  std::vector<TokenProb> d = s.distribution(std::vector<float>(8, 1.5f), {});
  ASSERT_EQ(d.size(), 8u);
  for (const TokenProb& t : d) EXPECT_DOUBLE_EQ(t.prob, 0.125);
}

// ---- RNG: reproducibility and state ----

// With 65536 equal logits the drawn token is floor(u * 65536): the top 16 bits of the generator
// output. The expected values come from an independent implementation of splitmix64 seeding
// and xoshiro256** (the first seed-0 output, 0x99ec5f36cb75f2b4, is the published one).
TEST(Sampler, DrawsArePinnedXoshiroOutputs) {
  const std::vector<float> flat(65536, 0.0f);
  Sampler s0(with_temperature(1, 0));
  EXPECT_EQ(s0.sample(flat, {}), 0x99ec);
  EXPECT_EQ(s0.sample(flat, {}), 0xbf6e);
  EXPECT_EQ(s0.sample(flat, {}), 0x1a5f);
  Sampler s42(with_temperature(1, 42));
  EXPECT_EQ(s42.sample(flat, {}), 0x1578);
  EXPECT_EQ(s42.sample(flat, {}), 0x6104);
  EXPECT_EQ(s42.sample(flat, {}), 0xae17);
  SamplerState st = Sampler::seeded_state(0);
  EXPECT_EQ(st.s[0], 0xe220a8397b1dcdafULL);
  EXPECT_EQ(st.s[3], 0xf88bb8a8724c81ecULL);
}

std::vector<int32_t> generate(Sampler& s, std::vector<int32_t>& history, int num_tokens,
                              size_t vocab) {
  std::vector<int32_t> out;
  for (int i = 0; i < num_tokens; ++i) {
    std::vector<float> logits = random_logits(vocab, 1000 + history.size(), 2.0f);
    int32_t t = s.sample(logits, history);
    history.push_back(t);
    out.push_back(t);
  }
  return out;
}

TEST(Sampler, SameSeedSameSequenceOtherSeedOtherSequence) {
  SamplingParams p = with_temperature(1.0f, 1234);
  p.top_k = 50;
  p.top_p = 0.95f;
  p.repetition_penalty = 1.1f;
  std::vector<int32_t> h1 = {1, 2, 3}, h2 = h1, h3 = h1;
  Sampler a(p), b(p);
  p.seed = 1235;
  Sampler c(p);
  std::vector<int32_t> ta = generate(a, h1, 100, 1000);
  std::vector<int32_t> tb = generate(b, h2, 100, 1000);
  std::vector<int32_t> tc = generate(c, h3, 100, 1000);
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta, tc);
}

TEST(Sampler, RestoredStateReproducesTheContinuation) {
  SamplingParams p = with_temperature(0.9f, 99);
  p.top_p = 0.9f;
  p.presence_penalty = 0.3f;
  Sampler a(p);
  std::vector<int32_t> history = {5, 6, 7};
  generate(a, history, 37, 3000);
  const SamplerState saved = a.state();
  std::vector<int32_t> history_b = history;
  std::vector<int32_t> cont_a = generate(a, history, 50, 3000);

  SamplingParams q = p;
  q.seed = 0;  // the state, not the seed, decides what comes next
  Sampler b(q);
  ASSERT_TRUE(b.set_state(saved).has_value());
  EXPECT_EQ(b.state(), saved);
  std::vector<int32_t> cont_b = generate(b, history_b, 50, 3000);
  EXPECT_EQ(cont_a, cont_b);
}

TEST(Sampler, SetStateRejectsAllZeros) {
  Sampler s(with_temperature(1));
  const SamplerState before = s.state();
  Status st = s.set_state(SamplerState{});
  ASSERT_FALSE(st.has_value());
  EXPECT_NE(st.error().message.find("all zeros"), std::string::npos);
  EXPECT_EQ(s.state(), before);
}

TEST(Sampler, OneRngStepPerSampledTokenNoneWhenGreedy) {
  Sampler greedy(SamplingParams{});
  const SamplerState g0 = greedy.state();
  greedy.sample(random_logits(100, 1), {});
  EXPECT_EQ(greedy.state(), g0);

  // Whatever the logits (one token, all -inf, many tokens), a draw is one step.
  SamplingParams p = with_temperature(1, 5);
  Sampler a(p), b(p), c(p);
  a.sample(std::vector<float>{1.0f}, {});
  b.sample(std::vector<float>{-kInf, -kInf}, {});
  c.sample(random_logits(5000, 2), {});
  EXPECT_EQ(a.state(), b.state());
  EXPECT_EQ(a.state(), c.state());
  EXPECT_NE(a.state(), Sampler::seeded_state(5));
  // distribution() leaves it alone.
  c.distribution(random_logits(5000, 3), {});
  EXPECT_EQ(a.state(), c.state());
}

// ---- truncation ----

TEST(Sampler, TopK1IsGreedy) {
  SamplingParams p = with_temperature(1.5f, 3);
  p.top_k = 1;
  Sampler s(p), greedy(SamplingParams{});
  for (uint64_t row = 0; row < 50; ++row) {
    std::vector<float> logits = random_logits(5000, row);
    if (row % 5 == 0) logits[4000] = logits[100] = 10;  // a tie at the top
    EXPECT_EQ(s.sample(logits, {}), greedy.sample(logits, {})) << "row " << row;
  }
}

TEST(Sampler, TinyTopPIsGreedy) {
  SamplingParams p = with_temperature(1.5f, 3);
  p.top_p = 1e-6f;
  Sampler s(p), greedy(SamplingParams{});
  for (uint64_t row = 0; row < 50; ++row) {
    std::vector<float> logits = random_logits(5000, row);
    if (row % 5 == 0) logits[4000] = logits[100] = 10;
    EXPECT_EQ(s.sample(logits, {}), greedy.sample(logits, {})) << "row " << row;
  }
}

// Reference: every token sorted by (logit desc, id asc).
std::vector<int32_t> reference_order(const std::vector<float>& logits) {
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  return ids;
}

TEST(Sampler, TopKKeepsTheKBestInDrawOrder) {
  for (int32_t k : {3, 40, 4096, 4097, 9000}) {  // both the heap and the nth_element path
    std::vector<float> logits = random_logits(20000, 11);
    for (int i = 0; i < 50; ++i) logits[100 + 37 * i] = 3.5f;  // ties inside and at the cut
    SamplingParams p = with_temperature(1);
    p.top_k = k;
    Sampler s(p);
    std::vector<TokenProb> d = s.distribution(logits, {});
    std::vector<int32_t> expected = reference_order(logits);
    expected.resize(k);
    EXPECT_EQ(ids_of(d), expected) << "k=" << k;
    std::vector<float> kept;
    for (int32_t id : expected) kept.push_back(logits[id]);
    std::vector<double> ref = softmax(kept);
    for (int i = 0; i < k; i += 97) EXPECT_NEAR(d[i].prob, ref[i], 1e-9 + 1e-6 * ref[i]);
  }
}

TEST(Sampler, TopPKeepsTheSmallestNucleus) {
  // Probabilities 0.5, 0.25, 0.125, 0.0625, 0.0625, with ids shuffled.
  std::vector<float> logits = {std::log(0.125f), std::log(0.5f), std::log(0.0625f), std::log(0.25f),
                               std::log(0.0625f)};
  SamplingParams p = with_temperature(1);
  p.top_p = 0.7f;  // without top-k the survivors come in id order
  EXPECT_EQ(ids_of(Sampler(p).distribution(logits, {})), (std::vector<int32_t>{1, 3}));
  p.top_p = 0.8f;
  EXPECT_EQ(ids_of(Sampler(p).distribution(logits, {})), (std::vector<int32_t>{0, 1, 3}));
  p.top_p = 0.4f;
  EXPECT_EQ(ids_of(Sampler(p).distribution(logits, {})), (std::vector<int32_t>{1}));
  p.top_k = 2;  // top-k first, then top-p on the renormalized pair (2/3, 1/3)
  p.top_p = 0.7f;
  EXPECT_EQ(ids_of(Sampler(p).distribution(logits, {})), (std::vector<int32_t>{1, 3}));
  p.top_p = 0.6f;
  EXPECT_EQ(ids_of(Sampler(p).distribution(logits, {})), (std::vector<int32_t>{1}));
}

// Without top-k the nucleus is found through a weight histogram and a weighted quickselect; it
// must be a prefix of the full sort whose mass just reaches top_p (up to exp rounding).
TEST(Sampler, TopPOnLargeVocabIsAPrefixOfTheFullSort) {
  // Nuclei of ~90k, thousands and tens of tokens; all-equal logits (one histogram bucket).
  std::vector<std::vector<float>> rows = {
      random_logits(100000, 21, 0.5f), random_logits(100000, 22, 3.0f),
      random_logits(100000, 23, 12.0f), std::vector<float>(100000, 1.0f)};
  rows.push_back(random_logits(100000, 24, 2.0f));  // every third token masked
  for (size_t i = 0; i < rows.back().size(); i += 3) rows.back()[i] = -kInf;
  for (const std::vector<float>& logits : rows) {
    SamplingParams p = with_temperature(1);
    p.top_p = 0.9f;
    Sampler s(p);
    std::vector<int32_t> got = sorted_ids(s.distribution(logits, {}));

    const std::vector<int32_t> order = reference_order(logits);
    std::vector<int32_t> prefix(order.begin(), order.begin() + got.size());
    std::sort(prefix.begin(), prefix.end());
    ASSERT_EQ(got, prefix) << "not a prefix of the sorted order; size " << got.size();
    const float m = logits[order[0]];
    double z = 0;
    for (float v : logits) z += std::exp(static_cast<double>(v - m));
    double without_last = 0;
    for (size_t i = 0; i + 1 < got.size(); ++i)
      without_last += std::exp(double(logits[order[i]] - m));
    const double with_last = without_last + std::exp(double(logits[order[got.size() - 1]] - m));
    EXPECT_LT(without_last, 0.9 * z * (1 + 1e-5)) << got.size();
    EXPECT_GE(with_last, 0.9 * z * (1 - 1e-5)) << got.size();
  }
}

TEST(Sampler, MinPDropsTokensBelowAFractionOfTheBest) {
  // Probabilities 0.5, 0.3, 0.15, 0.04, 0.01 with ids shuffled.
  std::vector<float> logits = {std::log(0.04f), std::log(0.3f), std::log(0.01f), std::log(0.5f),
                               std::log(0.15f)};
  SamplingParams p = with_temperature(1);
  p.min_p = 0.2f;  // keeps p >= 0.1
  EXPECT_EQ(sorted_ids(Sampler(p).distribution(logits, {})), (std::vector<int32_t>{1, 3, 4}));
  p.min_p = 0.5f;  // keeps p >= 0.25
  EXPECT_EQ(sorted_ids(Sampler(p).distribution(logits, {})), (std::vector<int32_t>{1, 3}));
  p.min_p = 1.0f;
  EXPECT_EQ(sorted_ids(Sampler(p).distribution(logits, {})), (std::vector<int32_t>{3}));
  p.min_p = 0.2f;
  p.top_k = 4;  // sorted path
  EXPECT_EQ(ids_of(Sampler(p).distribution(logits, {})), (std::vector<int32_t>{3, 1, 4}));
  p.top_k = 0;
  p.top_p = 0.99f;
  EXPECT_EQ(ids_of(Sampler(p).distribution(logits, {})), (std::vector<int32_t>{1, 3, 4}));
  // Survivors are renormalized: 0.5, 0.3, 0.15 -> /0.95.
  std::vector<TokenProb> d = Sampler(p).distribution(logits, {});
  EXPECT_NEAR(d[1].prob, 0.5 / 0.95, 1e-6);
}

// ---- temperature and the draw ----

double chi_square(const std::vector<int>& counts, const std::vector<double>& probs, int n) {
  double chi2 = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    const double e = n * probs[i];
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  return chi2;
}

TEST(Sampler, DrawFrequenciesMatchSoftmaxOverTemperature) {
  const std::vector<float> logits = {1.0f, 0.5f, 0.0f, -0.5f, -1.0f, 2.0f};
  for (float temperature : {0.7f, 1.0f, 2.5f}) {
    Sampler s(with_temperature(temperature, 2024));
    const std::vector<double> expected = softmax(logits, temperature);
    std::vector<TokenProb> d = s.distribution(logits, {});
    ASSERT_EQ(d.size(), logits.size());
    for (const TokenProb& t : d) EXPECT_NEAR(t.prob, expected[t.token_id], 1e-6);

    constexpr int kDraws = 20000;
    std::vector<int> counts(logits.size(), 0);
    for (int i = 0; i < kDraws; ++i) ++counts[s.sample(logits, {})];
    // 5 degrees of freedom: P(chi2 > 30) ~ 1.5e-5. The seed is fixed, so this cannot flake;
    // the bound only has to hold for a correct sampler with any seed.
    EXPECT_LT(chi_square(counts, expected, kDraws), 30.0) << "temperature=" << temperature;
  }
}

TEST(Sampler, TemperatureComesAfterTruncation) {
  // softmax: 0.6, 0.3, 0.1. top_p = 0.55 keeps only token 0 however hot the temperature.
  std::vector<float> logits = {std::log(0.6f), std::log(0.3f), std::log(0.1f)};
  SamplingParams p = with_temperature(10);
  p.top_p = 0.55f;
  EXPECT_EQ(ids_of(Sampler(p).distribution(logits, {})), (std::vector<int32_t>{0}));
  // top_k = 2 then temperature 2 over the pair.
  p.top_p = 1;
  p.top_k = 2;
  p.temperature = 2;
  std::vector<TokenProb> d = Sampler(p).distribution(logits, {});
  ASSERT_EQ(d.size(), 2u);
  const double r = std::sqrt(0.3 / 0.6);
  EXPECT_NEAR(d[0].prob, 1 / (1 + r), 1e-6);
}

// ---- penalties ----

std::vector<float> penalized(const SamplingParams& p, std::vector<float> logits,
                             std::vector<int32_t> history) {
  Sampler s(p);
  s.penalize(logits, history);
  return logits;
}

TEST(Sampler, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  SamplingParams p;
  p.repetition_penalty = 2;
  // Token 0 appears twice but is penalized once; token 4 is not in the history.
  EXPECT_EQ(penalized(p, {2, -2, 1, 0, 3}, {0, 1, 3, 0}), (std::vector<float>{1, -4, 1, 0, 3}));
  p.repetition_penalty = 0.5f;  // < 1 rewards repeats
  EXPECT_EQ(penalized(p, {2, -2, 1}, {0, 1}), (std::vector<float>{4, -1, 1}));
}

TEST(Sampler, PresencePenaltySubtractsOncePerSeenToken) {
  SamplingParams p;
  p.presence_penalty = 0.5f;
  EXPECT_EQ(penalized(p, {1, 1, 1}, {0, 0, 2}), (std::vector<float>{0.5f, 1, 0.5f}));
}

TEST(Sampler, FrequencyPenaltySubtractsPerOccurrence) {
  SamplingParams p;
  p.frequency_penalty = 0.25f;
  EXPECT_EQ(penalized(p, {1, 1, 1}, {0, 0, 0, 2}), (std::vector<float>{0.25f, 1, 0.75f}));
  p.frequency_penalty = -0.5f;
  EXPECT_EQ(penalized(p, {1, 1}, {1, 1}), (std::vector<float>{1, 2}));
}

TEST(Sampler, RepetitionComesBeforePresenceAndFrequency) {
  SamplingParams p;
  p.repetition_penalty = 2;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  // 4 / 2 - (2 * 0.25 + 0.5) = 1;  -4 * 2 - (1 * 0.25 + 0.5) = -8.75
  EXPECT_EQ(penalized(p, {4, -4, 7}, {0, 1, 0}), (std::vector<float>{1, -8.75f, 7}));
}

TEST(Sampler, PenaltiesSeeOnlyTheLastNTokens) {
  SamplingParams p;
  p.presence_penalty = 1;
  p.penalty_last_n = 2;
  EXPECT_EQ(penalized(p, {0, 0, 0, 0}, {0, 1, 2}), (std::vector<float>{0, -1, -1, 0}));
  p.penalty_last_n = -1;
  EXPECT_EQ(penalized(p, {0, 0, 0, 0}, {0, 1, 2}), (std::vector<float>{-1, -1, -1, 0}));
  p.penalty_last_n = 0;
  EXPECT_EQ(penalized(p, {0, 0, 0, 0}, {0, 1, 2}), (std::vector<float>{0, 0, 0, 0}));
  p.penalty_last_n = 10;  // longer than the history
  EXPECT_EQ(penalized(p, {0, 0, 0, 0}, {3}), (std::vector<float>{0, 0, 0, -1}));
}

TEST(Sampler, PenaltiesIgnoreOutOfRangeIdsAndKeepMinusInf) {
  SamplingParams p;
  p.repetition_penalty = 1.5f;
  p.frequency_penalty = 1;
  EXPECT_EQ(penalized(p, {1, -kInf}, {-1, 7, 2, 1}), (std::vector<float>{1, -kInf}));
}

TEST(Sampler, PenaltyCountsDoNotLeakBetweenCalls) {
  SamplingParams p;
  p.frequency_penalty = 1;
  Sampler s(p);
  std::vector<float> a = {0, 0, 0};
  s.penalize(a, std::vector<int32_t>{0, 0, 1});
  EXPECT_EQ(a, (std::vector<float>{-2, -1, 0}));
  std::vector<float> b = {0, 0, 0};
  s.penalize(b, std::vector<int32_t>{2});
  EXPECT_EQ(b, (std::vector<float>{0, 0, -1}));
}

TEST(Sampler, GreedyIsArgmaxOfPenalizedLogits) {
  SamplingParams p;
  p.repetition_penalty = 2;
  Sampler s(p);
  EXPECT_EQ(s.sample(std::vector<float>{1.0f, 0.9f}, std::vector<int32_t>{0}), 1);
  EXPECT_EQ(s.sample(std::vector<float>{1.0f, 0.9f}, std::vector<int32_t>{}), 0);
}

// ---- validation ----

void expect_invalid(const SamplingParams& p, const std::string& needle) {
  Status st = p.validate();
  ASSERT_FALSE(st.has_value()) << "expected an error containing: " << needle;
  EXPECT_NE(st.error().message.find(needle), std::string::npos) << st.error().message;
  Result<Sampler> s = Sampler::create(p);
  ASSERT_FALSE(s.has_value());
  EXPECT_EQ(s.error().message, st.error().message);
}

TEST(SamplingParams, DefaultsAreValid) {
  EXPECT_TRUE(SamplingParams{}.validate().has_value());
  SamplingParams p;
  p.top_p = 1;
  p.min_p = 1;
  p.presence_penalty = -2;
  p.penalty_last_n = -1;
  p.stop_strings = {"\n\n"};
  EXPECT_TRUE(p.validate().has_value());
}

TEST(SamplingParams, ValidateNamesTheBadFieldAndValue) {
  SamplingParams p;
  p.temperature = -0.5f;
  expect_invalid(p, "temperature must be >= 0 (0 = greedy), got -0.5");
  p = {};
  p.temperature = kNaN;
  expect_invalid(p, "temperature must be a finite number, got nan");
  p = {};
  p.top_k = -1;
  expect_invalid(p, "top_k must be >= 0 (0 = off), got -1");
  p = {};
  p.top_p = 0;
  expect_invalid(p, "top_p must be in (0, 1] (1 = off), got 0");
  p.top_p = 1.5f;
  expect_invalid(p, "top_p must be in (0, 1] (1 = off), got 1.5");
  p.top_p = kNaN;
  expect_invalid(p, "top_p must be a finite number, got nan");
  p = {};
  p.min_p = -0.1f;
  expect_invalid(p, "min_p must be in [0, 1] (0 = off), got -0.1");
  p.min_p = 2;
  expect_invalid(p, "min_p must be in [0, 1] (0 = off), got 2");
  p = {};
  p.repetition_penalty = 0;
  expect_invalid(p, "repetition_penalty must be > 0 (1 = off), got 0");
  p.repetition_penalty = kNaN;
  expect_invalid(p, "repetition_penalty must be a finite number, got nan");
  p = {};
  p.presence_penalty = kNaN;
  expect_invalid(p, "presence_penalty must be a finite number, got nan");
  p = {};
  p.frequency_penalty = kInf;
  expect_invalid(p, "frequency_penalty must be a finite number, got inf");
  p = {};
  p.min_p = -kInf;
  expect_invalid(p, "min_p must be a finite number, got -inf");
  p = {};
  p.penalty_last_n = -2;
  expect_invalid(p, "penalty_last_n must be >= -1 (-1 = all), got -2");
  p = {};
  p.stop_token_ids = {2, -7};
  expect_invalid(p, "stop_token_ids[1] must be >= 0, got -7");
  p = {};
  p.stop_strings = {"a", ""};
  expect_invalid(p, "stop_strings[1] is empty");
}

TEST(SamplingParams, SamplerConstructorRejectsInvalidParams) {
  SamplingParams p;
  p.top_p = 0;
  EXPECT_THROW(Sampler{p}, InternalError);
}

TEST(SamplingParams, StopTokensAndEos) {
  SamplingParams p;
  p.stop_token_ids = {7};
  const std::vector<int32_t> eos = {2, 3};
  EXPECT_TRUE(p.is_stop_token(7, eos));
  EXPECT_TRUE(p.is_stop_token(3, eos));
  EXPECT_FALSE(p.is_stop_token(4, eos));
  p.ignore_eos = true;
  EXPECT_FALSE(p.is_stop_token(3, eos));
  EXPECT_TRUE(p.is_stop_token(7, eos));
}

// ---- StopMatcher ----

std::string feed_all(StopMatcher& m, const std::vector<std::string>& pieces, bool* stopped) {
  std::string out;
  *stopped = false;
  for (const std::string& piece : pieces) {
    StopMatcher::Output o = m.feed(piece);
    out += o.text;
    if (o.stopped) *stopped = true;
  }
  if (!*stopped) out += m.flush();
  return out;
}

TEST(StopMatcher, PassesTextThroughWithoutStops) {
  StopMatcher m({});
  EXPECT_EQ(m.feed("hello ").text, "hello ");
  EXPECT_EQ(m.feed("world").text, "world");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, CatchesAStopSplitAcrossTokens) {
  StopMatcher m({"</end>"});
  StopMatcher::Output o = m.feed("Hello </");
  EXPECT_EQ(o.text, "Hello ");
  EXPECT_FALSE(o.stopped);
  o = m.feed("en");
  EXPECT_EQ(o.text, "");
  EXPECT_FALSE(o.stopped);
  o = m.feed("d> trailing");
  EXPECT_EQ(o.text, "");
  EXPECT_TRUE(o.stopped);
  EXPECT_EQ(o.stop_idx, 0);
  EXPECT_TRUE(m.stopped());
  // Later input is ignored; nothing is left to flush.
  o = m.feed("more");
  EXPECT_EQ(o.text, "");
  EXPECT_TRUE(o.stopped);
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, ReleasesAPartialMatchThatDoesNotComplete) {
  StopMatcher m({"STOP"});
  EXPECT_EQ(m.feed("ST").text, "");
  EXPECT_EQ(m.feed("AR").text, "STAR");
  EXPECT_EQ(m.feed("xS").text, "x");
  EXPECT_EQ(m.flush(), "S");
  EXPECT_FALSE(m.stopped());
}

TEST(StopMatcher, HoldsOnlyWhatCanStillMatch) {
  StopMatcher m({"aab"});
  EXPECT_EQ(m.feed("aa").text, "");
  EXPECT_EQ(m.feed("a").text, "a");  // "aaa": only the last "aa" can start "aab"
  StopMatcher::Output o = m.feed("b!");
  EXPECT_TRUE(o.stopped);
  EXPECT_EQ(o.text, "");
}

TEST(StopMatcher, StopAtTheVeryStart) {
  StopMatcher m({"STOP"});
  StopMatcher::Output o = m.feed("STOP and more");
  EXPECT_TRUE(o.stopped);
  EXPECT_EQ(o.text, "");
  StopMatcher m2({"STOP"});
  EXPECT_EQ(m2.feed("S").text, "");
  EXPECT_EQ(m2.feed("TO").text, "");
  o = m2.feed("P");
  EXPECT_TRUE(o.stopped);
  EXPECT_EQ(o.text, "");
}

TEST(StopMatcher, SeveralStopsEarliestWins) {
  StopMatcher m({"world", "lo"});
  StopMatcher::Output o = m.feed("hello world");
  EXPECT_TRUE(o.stopped);
  EXPECT_EQ(o.text, "hel");
  EXPECT_EQ(o.stop_idx, 1);

  StopMatcher tie({"abc", "ab"});
  o = tie.feed("xabc");
  EXPECT_EQ(o.text, "x");
  EXPECT_EQ(o.stop_idx, 0);

  // A short stop completes while a longer one is still a prefix: stop now.
  StopMatcher nested({"abcd", "c"});
  EXPECT_EQ(nested.feed("ab").text, "");
  o = nested.feed("c");
  EXPECT_TRUE(o.stopped);
  EXPECT_EQ(o.text, "ab");
  EXPECT_EQ(o.stop_idx, 1);

  // Held text is the longest suffix any stop could start with.
  StopMatcher two({"xyz", "yzw"});
  EXPECT_EQ(two.feed("ay").text, "a");
  EXPECT_EQ(two.feed("z").text, "");
  o = two.feed("w");
  EXPECT_TRUE(o.stopped);
  EXPECT_EQ(o.text, "");
  EXPECT_EQ(o.stop_idx, 1);
}

bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t len = c < 0x80         ? 1
                       : (c >> 5) == 6  ? 2
                       : (c >> 4) == 14 ? 3
                       : (c >> 3) == 30 ? 4
                                        : 0;
    if (len == 0 || i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k)
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 2) return false;
    i += len;
  }
  return true;
}

TEST(StopMatcher, MultiByteUtf8) {
  // "。" is 3 bytes; a tokenizer may still hand it over in one piece after other characters.
  StopMatcher m({"。", "終わり"});
  std::vector<std::string> pieces = {"你好", "世界。", "再见"};
  bool stopped = false;
  EXPECT_EQ(feed_all(m, pieces, &stopped), "你好世界");
  EXPECT_TRUE(stopped);

  // A multi-character stop split across pieces, with a false start before it.
  StopMatcher m2({"終わり"});
  std::vector<StopMatcher::Output> outs;
  for (std::string piece : {"これは終", "で", "す。終わ", "り！"}) outs.push_back(m2.feed(piece));
  std::string text;
  for (const auto& o : outs) {
    EXPECT_TRUE(valid_utf8(o.text)) << o.text;
    text += o.text;
  }
  EXPECT_EQ(outs[0].text, "これは");
  EXPECT_EQ(outs[1].text, "終で");
  EXPECT_TRUE(outs[3].stopped);
  EXPECT_EQ(text, "これは終です。");

  // Held-back text that turns out not to be a stop is released whole.
  StopMatcher m3({"é!"});
  StopMatcher::Output o = m3.feed("café");
  EXPECT_EQ(o.text, "caf");
  o = m3.feed(" ok");
  EXPECT_EQ(o.text, "é ok");
  EXPECT_TRUE(valid_utf8(o.text));
}

TEST(StopMatcher, EmptyStopStringsAreIgnored) {
  StopMatcher m({"", "END"});
  StopMatcher::Output o = m.feed("abc END");
  EXPECT_TRUE(o.stopped);
  EXPECT_EQ(o.text, "abc ");
  EXPECT_EQ(o.stop_idx, 1);
}

}  // namespace
}  // namespace troupe::compute
