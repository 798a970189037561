// The engine with scaled rotary frequencies: each way a model file states its scaling (Hugging
// Face rope_scaling, GGUF rope.scaling.* keys and rope_freqs.weight) must give the same logits
// as the other form of the same model, and visibly different logits from the unscaled model.
#include <algorithm>
#include <cmath>
#include <functional>
#include <numbers>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "compute/engine.h"
#include "model/gguf_writer.h"
#include "model/model.h"
#include "tests/compute/engine_test_util.h"
#include "tests/edited_model.h"
#include "tests/test_support.h"

namespace troupe::compute {
namespace {

using model::GgufWriter;
using nlohmann::json;
using testing::EditedHfModel;
using testing::ExtraTensor;
using testing::TempDir;

// Positions up to 47: far enough that the slow pairs' angles change visibly when divided.
std::vector<int32_t> prompt(int32_t vocab) {
  std::vector<int32_t> p{1};
  for (int32_t i = 0; i < 47; ++i) p.push_back(2 + (i * 37) % (vocab - 2));
  return p;
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, std::fabs(static_cast<double>(x)));
  return m;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}

/// Expects `got` within 1e-4 * max|want| of `want` (the golden tests' F32 bound) and both at
/// least 1e-2 * max|want| away from `unscaled`.
void expect_same_scaled(const std::vector<float>& want, const std::vector<float>& got,
                        const std::vector<float>& unscaled) {
  ASSERT_FALSE(want.empty());
  const double ref = max_abs(want);
  EXPECT_LE(max_diff(want, got), 1e-4 * ref);
  EXPECT_GT(max_diff(want, unscaled), 1e-2 * ref) << "the scaling changed nothing";
}

std::string stories_gguf(const std::string& shared) {
  return shared + "/models/stories260K/stories260K.gguf";
}

// Llama 3's rule written out here on its own (wavelength bands of the original context), to
// give the GGUF copy its rope_freqs.weight as a converter would.
std::vector<float> llama3_divisors(int n_rot, double theta, double factor, double low, double high,
                                   double orig) {
  std::vector<float> d;
  for (int i = 0; i < n_rot / 2; ++i) {
    const double wavelength = 2 * std::numbers::pi * std::pow(theta, 2.0 * i / n_rot);
    if (wavelength < orig / high) {
      d.push_back(1.0f);
    } else if (wavelength > orig / low) {
      d.push_back(static_cast<float>(factor));
    } else {
      const double smooth = (orig / wavelength - low) / (high - low);
      d.push_back(static_cast<float>(1 / ((1 - smooth) / factor + smooth)));
    }
  }
  return d;
}

TEST(RopeScalingEngine, HfLlama3MatchesGgufRopeFreqs) {
  TROUPE_SHARED_OR_SKIP(shared);
  // stories260K has 4 rotary pairs of wavelengths 6.3, 63, 628 and 6283: with an original
  // context of 256 and high/low factors 8/1 they fall in every band.
  EditedHfModel hf(shared, "stories260K", [](json& c) {
    c["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", 8.0},
                         {"low_freq_factor", 1.0},
                         {"high_freq_factor", 8.0},
                         {"original_max_position_embeddings", 256}};
  });
  TempDir dir;
  const std::string gguf = testing::edited_gguf(
      dir, "llama3.gguf", stories_gguf(shared), [](GgufWriter&) {},
      {ExtraTensor{"rope_freqs.weight", llama3_divisors(8, 10000, 8, 1, 8, 256)}});
  const std::vector<int32_t> p = prompt(512);
  const auto want = prompt_logits(gguf, p);
  expect_same_scaled(want, prompt_logits(hf.path(), p), prompt_logits(stories_gguf(shared), p));
}

TEST(RopeScalingEngine, HfYarnMatchesGgufYarn) {
  TROUPE_SHARED_OR_SKIP(shared);
  EditedHfModel hf(shared, "stories260K", [](json& c) {
    c["rope_scaling"] = {
        {"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 128}};
  });
  TempDir dir;
  const std::string gguf =
      testing::edited_gguf(dir, "yarn.gguf", stories_gguf(shared), [](GgufWriter& w) {
        w.set_string("llama.rope.scaling.type", "yarn");
        w.set_f32("llama.rope.scaling.factor", 4);
        w.set_u32("llama.rope.scaling.original_context_length", 128);
      });
  const std::vector<int32_t> p = prompt(512);
  const auto want = prompt_logits(gguf, p);
  expect_same_scaled(want, prompt_logits(hf.path(), p), prompt_logits(stories_gguf(shared), p));
}

// MLA with DeepSeek's YaRN: the HF config's mscale_all_dim and the GGUF's yarn_log_multiplier
// both put (1 + 0.1 ln 4)^2 on the attention logits.
TEST(RopeScalingEngine, DeepseekHfYarnMatchesGgufYarn) {
  TROUPE_SHARED_OR_SKIP(shared);
  EditedHfModel hf(shared, "deepseek2", [](json& c) {
    c["rope_scaling"] = {
        {"type", "yarn"},       {"factor", 4.0},  {"original_max_position_embeddings", 64},
        {"beta_fast", 32},      {"beta_slow", 1}, {"mscale", 1.0},
        {"mscale_all_dim", 1.0}};
  });
  const std::string src = shared + "/models/synth/deepseek2/model.gguf";
  TempDir dir;
  const std::string gguf = testing::edited_gguf(dir, "ds.gguf", src, [](GgufWriter& w) {
    w.set_string("deepseek2.rope.scaling.type", "yarn");
    w.set_f32("deepseek2.rope.scaling.factor", 4);
    w.set_u32("deepseek2.rope.scaling.original_context_length", 64);
    w.set_f32("deepseek2.rope.scaling.yarn_log_multiplier", 0.1f);
  });
  auto m = model::load_model(src);
  ASSERT_TRUE(m.has_value()) << m.error().message;
  const std::vector<int32_t> p = prompt(static_cast<int32_t>((*m)->spec.n_vocab));
  const auto want = prompt_logits(gguf, p);
  expect_same_scaled(want, prompt_logits(hf.path(), p), prompt_logits(*m, p));
}

/// stories260K's GGUF with its spec edited before the engine sees it.
std::vector<float> edited_spec_logits(const std::string& shared,
                                      const std::function<void(model::ModelSpec&)>& edit,
                                      const std::vector<int32_t>& p) {
  const auto base = load_model_for_test(stories_gguf(shared));
  EXPECT_TRUE(base);
  if (!base) return {};
  auto m = std::make_shared<model::Model>(*base);
  edit(m->spec);
  return prompt_logits(std::shared_ptr<const model::Model>(std::move(m)), p);
}

// stories260K rotates whole heads (n_rot = head_dim), so multiplying cos and sin by a scales
// every q.k by a^2: the same as multiplying the attention scale by a^2.
TEST(RopeScalingEngine, CosSinMagnitudeActsAsAttentionScale) {
  TROUPE_SHARED_OR_SKIP(shared);
  const std::vector<int32_t> p = prompt(512);
  const auto yarn = [](model::ModelSpec& s) {
    s.rope_scaling.type = model::RopeScalingType::kYarn;
    s.rope_scaling.factor = 4;
    s.rope_scaling.orig_ctx = 128;
  };
  const auto want = edited_spec_logits(
      shared,
      [&](model::ModelSpec& s) {
        yarn(s);
        s.rope_scaling.attn_factor = 1.5;
      },
      p);
  const auto got = edited_spec_logits(
      shared,
      [&](model::ModelSpec& s) {
        yarn(s);
        s.kq_scale_mult = 2.25;
      },
      p);
  const auto plain = edited_spec_logits(shared, yarn, p);
  expect_same_scaled(want, got, plain);
}

// Two routes to dividing every frequency by 2: linear scaling and per-pair divisors.
TEST(RopeScalingEngine, LinearEqualsUniformDivisors) {
  TROUPE_SHARED_OR_SKIP(shared);
  const std::vector<int32_t> p = prompt(512);
  const auto want = edited_spec_logits(
      shared,
      [](model::ModelSpec& s) {
        s.rope_scaling.type = model::RopeScalingType::kLinear;
        s.rope_scaling.factor = 2;
      },
      p);
  const auto got = edited_spec_logits(
      shared, [](model::ModelSpec& s) { s.rope_freq_factors.assign(4, 2.0f); }, p);
  EXPECT_EQ(want, got);  // the same doubles reach the same cos/sin
  EXPECT_GT(max_diff(want, edited_spec_logits(
                               shared, [](model::ModelSpec&) {}, p)),
            1e-2 * max_abs(want));
}

}  // namespace
}  // namespace troupe::compute
