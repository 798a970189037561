// The golden comparison of ../shared/golden cases (text and vision-language): every position's
// logits in one batch, then the greedy path token by token, against the reference's logits.f32
// and step_logits.f32, with the tolerance and near-tie rules of issue #2 (case.json's fields).
// Users: tests/compute/golden_test.cc, vision_test.cc.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "compute/engine.h"
#include "model/model.h"
#include "tests/test_support.h"

namespace troupe::compute {

struct RowCheck {
  double max_rel = 0;       // max |Δ| / max|ref| over rows
  int argmax_mismatch = 0;  // rows where top-1 differs although the reference margin was clear
};

inline int argmax(const float* v, int64_t n) {
  return static_cast<int>(std::max_element(v, v + n) - v);
}

// Compares one row; returns max|Δ|/max|ref| and flags a top-1 mismatch beyond a clear margin.
inline void check_row(const float* got, const float* ref, int64_t n, double tol, RowCheck* rc) {
  double mx = 0, d = 0;
  for (int64_t i = 0; i < n; ++i) {
    mx = std::max(mx, std::fabs(static_cast<double>(ref[i])));
    d = std::max(d, std::fabs(static_cast<double>(got[i]) - ref[i]));
  }
  rc->max_rel = std::max(rc->max_rel, d / mx);
  std::vector<float> sorted(ref, ref + n);
  std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
  const double margin = static_cast<double>(sorted[0]) - sorted[1];
  if (margin > 2 * tol * mx && argmax(got, n) != argmax(ref, n)) rc->argmax_mismatch++;
}

/// One case's prompt as the engine takes it: token ids, SeqStep::kEmbedded at image positions,
/// whose rows are in `embd` (f32 [number of them, n_embd]).
struct GoldenRun {
  std::string label;
  std::vector<int32_t> prompt;
  std::vector<float> embd;
};

/// Checks a case (`j` its case.json, `dir` its folder) on `model`: batch logits of every
/// position (prompt then greedy tokens), then the greedy path after a one-chunk prefill; with
/// the KV cache storing `kv` values.
inline void check_golden_run(std::shared_ptr<const model::Model> model, const nlohmann::json& j,
                             const std::string& dir, double tol, const GoldenRun& r,
                             KvType kv = KvType::kF32) {
  const int64_t V = model->spec.n_vocab;
  ASSERT_EQ(V, j.at("vocab").get<int64_t>());
  const auto greedy = j.at("greedy_tokens").get<std::vector<int32_t>>();
  const auto margins = j.at("diagnostics").at("greedy_margins").get<std::vector<double>>();
  const auto ref_all = testing::read_f32_file(dir + "/logits.f32");
  const auto ref_step = testing::read_f32_file(dir + "/step_logits.f32");
  std::vector<int32_t> all = r.prompt;
  all.insert(all.end(), greedy.begin(), greedy.end());
  const int64_t n_pos = j.at("n_positions").get<int64_t>();
  ASSERT_EQ(static_cast<int64_t>(all.size()), n_pos);
  ASSERT_EQ(static_cast<int64_t>(ref_all.size()), n_pos * V);

  EngineOptions opts;
  opts.max_tokens_in_cache = 256;
  opts.kv_type = kv;
  auto eng = Engine::create(model, opts);
  ASSERT_TRUE(eng) << eng.error().message;

  // 1. Every position in one batch.
  {
    Sequence seq(**eng);
    ASSERT_TRUE(seq.reserve(n_pos));
    SeqStep st = seq.next(all, SeqStep::Logits::kAll);
    st.embd = r.embd;
    StepResult res;
    const Status ok = (*eng)->step({&st, 1}, &res);
    ASSERT_TRUE(ok.has_value()) << ok.error().message;
    RowCheck rc;
    for (int64_t p = 0; p < n_pos; ++p) check_row(res.row(0, p), &ref_all[p * V], V, tol, &rc);
    std::printf("[golden] %s batch: max|d|/max|ref| = %.3g (tol %.0e)\n", r.label.c_str(),
                rc.max_rel, tol);
    EXPECT_LE(rc.max_rel, tol) << "batch logits";
    EXPECT_EQ(rc.argmax_mismatch, 0) << "batch top-1";
  }
  // 2. The greedy path: prompt in one chunk, then one token at a time.
  Sequence seq(**eng);
  ASSERT_TRUE(seq.reserve(n_pos));
  SeqStep st = seq.next(r.prompt, SeqStep::Logits::kLast);
  st.embd = r.embd;
  StepResult res;
  ASSERT_TRUE((*eng)->step({&st, 1}, &res).has_value());
  seq.advance(static_cast<int64_t>(r.prompt.size()));
  RowCheck rc;
  bool diverged = false;
  for (size_t s = 0; s < greedy.size(); ++s) {
    const float* row = res.row(0);
    const float* ref = &ref_step[s * V];
    double mx = 0;
    for (int64_t i = 0; i < V; ++i) mx = std::max(mx, std::fabs(static_cast<double>(ref[i])));
    const bool near_tie = margins[s] < 2 * tol * mx;
    check_row(row, ref, V, tol, &rc);
    if (!near_tie) {
      EXPECT_EQ(argmax(row, V), greedy[s]) << "greedy step " << s;
    }
    if (argmax(row, V) != greedy[s]) {  // a near tie went the other way: stop comparing
      diverged = true;
      break;
    }
    const int32_t next = greedy[s];
    SeqStep st2 = seq.next({&next, 1}, SeqStep::Logits::kLast);
    ASSERT_TRUE((*eng)->step({&st2, 1}, &res).has_value());
    seq.advance(1);
  }
  std::printf("[golden] %s steps: max|d|/max|ref| = %.3g, diverged at near-tie: %s\n",
              r.label.c_str(), rc.max_rel, diverged ? "yes" : "no");
  EXPECT_LE(rc.max_rel, tol) << "step logits";
  EXPECT_EQ(rc.argmax_mismatch, 0) << "step top-1";
}

}  // namespace troupe::compute
