// Golden tests: logits and greedy tokens of every model in ../shared/golden against the
// reference implementation's recorded outputs (see each case.json).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>

#include <nlohmann/json.hpp>

#include "compute/engine.h"
#include "model/gguf.h"
#include "model/model.h"
#include "tests/compute/engine_test_util.h"
#include "tests/test_support.h"

namespace troupe::compute {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct RowCheck {
  double max_rel = 0;       // max |Δ| / max|ref| over rows
  int argmax_mismatch = 0;  // rows where top-1 differs although the reference margin was clear
};

int argmax(const float* v, int64_t n) { return static_cast<int>(std::max_element(v, v + n) - v); }

// Compares one row; returns max|Δ|/max|ref| and flags a top-1 mismatch beyond a clear margin.
void check_row(const float* got, const float* ref, int64_t n, double tol, RowCheck* rc) {
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

struct GoldenCase {
  std::string model_name, case_name, dir;
  std::string model_file;
  double tol;
};

std::vector<GoldenCase> find_cases(const std::string& shared) {
  std::vector<GoldenCase> out;
  for (const char* m : {"stories260K", "llama-dense", "llama-dense-f16", "mixtral-moe", "qwen2moe",
                        "qwen3moe", "deepseek2"}) {
    const fs::path md = fs::path(shared) / "golden" / m;
    if (!fs::exists(md)) continue;
    for (const auto& c : fs::directory_iterator(md)) {
      if (!fs::exists(c.path() / "case.json")) continue;
      json j = json::parse(testing::read_text_file((c.path() / "case.json").string()));
      GoldenCase g;
      g.model_name = m;
      g.case_name = c.path().filename().string();
      g.dir = c.path().string();
      std::string mf = j.at("model_file").get<std::string>();
      if (mf.rfind("shared/", 0) == 0) mf = mf.substr(7);
      g.model_file = shared + "/" + mf;
      g.tol = std::string(m).find("f16") != std::string::npos ? 1e-2 : 1e-4;
      out.push_back(g);
    }
  }
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) {
    return a.model_name + a.case_name < b.model_name + b.case_name;
  });
  return out;
}

// Checks one golden case against `model` (loaded from the GGUF file or its Hugging Face twin).
void check_case(const GoldenCase& g, std::shared_ptr<const model::Model> model) {
  json j = json::parse(testing::read_text_file(g.dir + "/case.json"));
  const int64_t V = model->spec.n_vocab;
  ASSERT_EQ(V, j.at("vocab").get<int64_t>());
  std::vector<int32_t> prompt = j.at("prompt_tokens").get<std::vector<int32_t>>();
  std::vector<int32_t> greedy = j.at("greedy_tokens").get<std::vector<int32_t>>();
  std::vector<double> margins = j.at("diagnostics").at("greedy_margins").get<std::vector<double>>();
  const auto ref_all = testing::read_f32_file(g.dir + "/logits.f32");
  const auto ref_step = testing::read_f32_file(g.dir + "/step_logits.f32");
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), greedy.begin(), greedy.end());
  const int64_t n_pos = j.at("n_positions").get<int64_t>();
  ASSERT_EQ(static_cast<int64_t>(all.size()), n_pos);
  ASSERT_EQ(static_cast<int64_t>(ref_all.size()), n_pos * V);

  EngineOptions opts;
  opts.max_tokens_in_cache = 256;
  auto eng = Engine::create(model, opts);
  ASSERT_TRUE(eng) << eng.error().message;

  // 1. Every position in one batch.
  {
    Sequence seq(**eng);
    ASSERT_TRUE(seq.reserve(n_pos));
    SeqStep st = seq.next(all, SeqStep::Logits::kAll);
    StepResult res;
    ASSERT_TRUE((*eng)->step({&st, 1}, &res).has_value());
    RowCheck rc;
    for (int64_t p = 0; p < n_pos; ++p) check_row(res.row(0, p), &ref_all[p * V], V, g.tol, &rc);
    std::printf("[golden] %s %s/%s batch: max|d|/max|ref| = %.3g (tol %.0e)\n",
                model->format.c_str(), g.model_name.c_str(), g.case_name.c_str(), rc.max_rel,
                g.tol);
    EXPECT_LE(rc.max_rel, g.tol) << "batch logits";
    EXPECT_EQ(rc.argmax_mismatch, 0) << "batch top-1";
  }
  // 2. The greedy path: prompt in one chunk, then one token at a time.
  {
    Sequence seq(**eng);
    ASSERT_TRUE(seq.reserve(n_pos));
    SeqStep st = seq.next(prompt, SeqStep::Logits::kLast);
    StepResult res;
    ASSERT_TRUE((*eng)->step({&st, 1}, &res).has_value());
    seq.advance(static_cast<int64_t>(prompt.size()));
    RowCheck rc;
    bool diverged = false;
    for (size_t s = 0; s < greedy.size(); ++s) {
      const float* row = res.row(0);
      const float* ref = &ref_step[s * V];
      double mx = 0;
      for (int64_t i = 0; i < V; ++i) mx = std::max(mx, std::fabs(static_cast<double>(ref[i])));
      const bool near_tie = margins[s] < 2 * g.tol * mx;
      if (!diverged) {
        check_row(row, ref, V, g.tol, &rc);
        if (!near_tie) {
          EXPECT_EQ(argmax(row, V), greedy[s]) << "greedy step " << s;
        }
        if (argmax(row, V) != greedy[s]) diverged = true;  // a near tie went the other way
      }
      if (diverged) break;
      const int32_t next = greedy[s];
      SeqStep st2 = seq.next({&next, 1}, SeqStep::Logits::kLast);
      ASSERT_TRUE((*eng)->step({&st2, 1}, &res).has_value());
      seq.advance(1);
    }
    std::printf("[golden] %s %s/%s steps: max|d|/max|ref| = %.3g, diverged at near-tie: %s\n",
                model->format.c_str(), g.model_name.c_str(), g.case_name.c_str(), rc.max_rel,
                diverged ? "yes" : "no");
    EXPECT_LE(rc.max_rel, g.tol) << "step logits";
    EXPECT_EQ(rc.argmax_mismatch, 0) << "step top-1";
  }
}

TEST(Golden, AllCasesMatchReference) {
  TROUPE_SHARED_OR_SKIP(shared);
  const auto cases = find_cases(shared);
  ASSERT_GE(cases.size(), 21u) << "expected 7 models x 3 cases under golden/";
  for (const GoldenCase& g : cases) {
    SCOPED_TRACE(g.model_name + "/" + g.case_name);
    auto model = load_model_for_test(g.model_file);
    ASSERT_TRUE(model) << g.model_file;
    check_case(g, model);
  }
}

// The Hugging Face twins of the GGUF models must give the same golden logits.
TEST(Golden, HuggingFaceTwinsMatchReference) {
  TROUPE_SHARED_OR_SKIP(shared);
  const auto cases = find_cases(shared);
  int checked = 0;
  for (const char* m : {"stories260K", "mixtral-moe", "qwen2moe", "qwen3moe", "deepseek2"}) {
    auto loaded = model::load_model(shared + "/models/hf/" + m);
    ASSERT_TRUE(loaded) << loaded.error().message;
    EXPECT_EQ((*loaded)->format, "hf");
    for (const GoldenCase& g : cases) {
      if (g.model_name != m) continue;
      SCOPED_TRACE(std::string("hf/") + m + "/" + g.case_name);
      check_case(g, *loaded);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 15);
}

}  // namespace
}  // namespace troupe::compute
