// sampler_bench: time to sample one token from a 128k vocabulary with the usual filter chains
// (median of 21 runs). Usage: sampler_bench
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "compute/sampler.h"

using troupe::compute::Sampler;
using troupe::compute::SamplingParams;

namespace {
double median_ms(Sampler& s, const std::vector<float>& logits, const std::vector<int32_t>& hist) {
  std::vector<double> t;
  for (int i = 0; i < 21; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    s.sample(logits, hist);
    t.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}
}  // namespace

int main() {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> logits(128 * 1024);
  for (float& v : logits) {
    v = nd(rng);
    v *= v * 12.0f;  // many near-top tokens: an ~18k-token nucleus at top-p 0.95
  }
  std::vector<int32_t> history;
  for (int32_t i = 0; i < 512; ++i) history.push_back(i * 2003 % 131072);
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_k = 40;
  p.top_p = 0.95f;
  p.repetition_penalty = 1.1f;
  Sampler topk(p);
  p.top_k = 0;
  Sampler topp(p);
  p.top_p = 1;
  p.min_p = 0.05f;
  Sampler minp(p);
  p.min_p = 0;
  Sampler temp(p);
  std::printf("sampler_bench: 128k vocabulary, 512-token penalty history, median of 21\n");
  std::printf("  top-k 40 + top-p 0.95: %.3f ms\n", median_ms(topk, logits, history));
  std::printf("  top-p 0.95:            %.3f ms\n", median_ms(topp, logits, history));
  std::printf("  min-p 0.05:            %.3f ms\n", median_ms(minp, logits, history));
  std::printf("  temperature only:      %.3f ms\n", median_ms(temp, logits, history));
  return 0;
}
