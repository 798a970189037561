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
#include "tests/compute/golden_check.h"
#include "tests/test_support.h"

namespace troupe::compute {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

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
void check_case(const GoldenCase& g, std::shared_ptr<const model::Model> model,
                KvType kv = KvType::kF32, double tol = 0) {
  const json j = json::parse(testing::read_text_file(g.dir + "/case.json"));
  GoldenRun r;
  r.label = model->format + " " + g.model_name + "/" + g.case_name;
  if (kv != KvType::kF32) r.label += std::string(", KV ") + std::string(kv_type_name(kv));
  r.prompt = j.at("prompt_tokens").get<std::vector<int32_t>>();
  check_golden_run(model, j, g.dir, tol > 0 ? tol : g.tol, r, kv);
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

// A KV cache of f16 or bf16 values rounds every K and V value once. With f16 every case stays
// within the tolerance issue #2 sets for F16 models (1e-2 of max|ref|; measured at most 1e-3),
// with the same top-1 and greedy rules, against the reference's f32 logits. bf16 keeps 8
// significant bits: the dense models stay within it (at most 8e-3, stories260K), but in an MoE
// model a rounded value can tip a router's near-tie to another expert, which moves the logits by
// far more (0.25 of max|ref| in one qwen3moe case), so the MoE cases are held to f16 only.
TEST(Golden, HalfPrecisionKvCacheStaysWithinTheF16Tolerance) {
  TROUPE_SHARED_OR_SKIP(shared);
  const auto cases = find_cases(shared);
  ASSERT_GE(cases.size(), 21u) << "expected 7 models x 3 cases under golden/";
  for (const GoldenCase& g : cases) {
    auto model = load_model_for_test(g.model_file);
    ASSERT_TRUE(model) << g.model_file;
    const bool dense = model->spec.n_expert == 0;
    for (const KvType kv : {KvType::kF16, KvType::kBF16}) {
      if (kv == KvType::kBF16 && !dense) continue;
      SCOPED_TRACE(g.model_name + "/" + g.case_name + " KV " + std::string(kv_type_name(kv)));
      check_case(g, model, kv, 1e-2);
    }
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
