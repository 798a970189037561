// Tests of rotary scaling (model/rope.h): the frequencies of each kind against anchors worked
// out by hand from the published definitions, and how GGUF keys (rope.scaling.*, rope_freqs)
// and Hugging Face configs (rope_scaling: linear, llama3, yarn) become a ModelSpec, including
// each kind of bad value.
#include <cmath>
#include <numbers>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/check.h"
#include "model/gguf.h"
#include "model/gguf_writer.h"
#include "model/model.h"
#include "model/rope.h"
#include "tests/edited_model.h"
#include "tests/test_support.h"

namespace troupe::model {
namespace {

using nlohmann::json;
using testing::EditedHfModel;
using testing::ExtraTensor;
using testing::TempDir;

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE((haystack).find(needle), std::string::npos) << "message: " << (haystack)

ModelSpec rope_spec(double theta, int64_t n_rot) {
  ModelSpec s;
  s.rope_theta = static_cast<float>(theta);
  s.n_rot = n_rot;
  return s;
}

double base_freq(const ModelSpec& s, int64_t i) {
  return std::pow(static_cast<double>(s.rope_theta),
                  -2.0 * static_cast<double>(i) / static_cast<double>(s.n_rot));
}

TEST(RopeFrequencies, UnscaledIsThePowerRuleExactly) {
  const ModelSpec s = rope_spec(10000, 64);
  const RopeFrequencies f = rope_frequencies(s);
  ASSERT_EQ(f.inv_freq.size(), 32u);
  for (int64_t i = 0; i < 32; ++i) EXPECT_EQ(f.inv_freq[i], base_freq(s, i)) << i;
  EXPECT_EQ(f.inv_freq[0], 1.0);
  EXPECT_EQ(f.mscale, 1.0);
}

TEST(RopeFrequencies, LinearDividesEveryPair) {
  ModelSpec s = rope_spec(10000, 16);
  s.rope_scaling.type = RopeScalingType::kLinear;
  s.rope_scaling.factor = 4;
  const RopeFrequencies f = rope_frequencies(s);
  for (int64_t i = 0; i < 8; ++i) EXPECT_DOUBLE_EQ(f.inv_freq[i], base_freq(s, i) / 4) << i;
}

TEST(RopeFrequencies, PerPairDivisorsApply) {
  ModelSpec s = rope_spec(10000, 8);
  s.rope_freq_factors = {1, 2, 4, 8};
  const RopeFrequencies f = rope_frequencies(s);
  for (int64_t i = 0; i < 4; ++i)
    EXPECT_DOUBLE_EQ(f.inv_freq[i], base_freq(s, i) / s.rope_freq_factors[i]) << i;
}

// DeepSeek-V3's YaRN: base 10000, 64 rotary dims, factor 40 over an original 4096 positions.
// A pair turns 4096 * inv_freq / (2 pi) times over the original context; the ramp's ends are
// where that count is beta_fast = 32 and beta_slow = 1: pair index 64 ln(4096 / (2 pi n)) /
// (2 ln 10000) = 10.47 and 22.51, rounded outwards to 10 and 23.
TEST(RopeFrequencies, YarnKeepsFastPairsAndInterpolatesSlowOnes) {
  ModelSpec s = rope_spec(10000, 64);
  RopeScaling& sc = s.rope_scaling;
  sc.type = RopeScalingType::kYarn;
  sc.factor = 40;
  sc.orig_ctx = 4096;
  const RopeFrequencies f = rope_frequencies(s);
  ASSERT_EQ(f.inv_freq.size(), 32u);
  for (int64_t i = 0; i <= 10; ++i) EXPECT_DOUBLE_EQ(f.inv_freq[i], base_freq(s, i)) << i;
  for (int64_t i = 23; i < 32; ++i) EXPECT_DOUBLE_EQ(f.inv_freq[i], base_freq(s, i) / 40) << i;
  for (int64_t i = 11; i < 23; ++i) {
    const double ramp = (static_cast<double>(i) - 10) / 13;  // 0 at pair 10, 1 at pair 23
    const double want = base_freq(s, i) * ((1 - ramp) + ramp / 40);
    EXPECT_NEAR(f.inv_freq[i], want, 1e-12 * base_freq(s, i)) << i;
  }
  EXPECT_EQ(f.mscale, 1.0);  // attn_factor is applied by whoever reads the file
}

TEST(RopeFrequencies, YarnWithoutTruncationUsesTheExactEnds) {
  ModelSpec s = rope_spec(10000, 64);
  RopeScaling& sc = s.rope_scaling;
  sc.type = RopeScalingType::kYarn;
  sc.factor = 40;
  sc.orig_ctx = 4096;
  sc.truncate = false;
  const double lo = 64 * std::log(4096 / (2 * std::numbers::pi * 32)) / (2 * std::log(10000.0));
  const double hi = 64 * std::log(4096 / (2 * std::numbers::pi * 1)) / (2 * std::log(10000.0));
  const RopeFrequencies f = rope_frequencies(s);
  const double ramp = (11 - lo) / (hi - lo);
  EXPECT_NEAR(f.inv_freq[11], base_freq(s, 11) * ((1 - ramp) + ramp / 40), 1e-12);
  EXPECT_DOUBLE_EQ(f.inv_freq[10], base_freq(s, 10));  // 10 < lo = 10.47
}

TEST(RopeFrequencies, YarnMagnitude) {
  EXPECT_DOUBLE_EQ(yarn_mscale(40), 1 + 0.1 * std::log(40.0));
  EXPECT_DOUBLE_EQ(yarn_mscale(40, 0.707), 1 + 0.0707 * std::log(40.0));
  EXPECT_EQ(yarn_mscale(1), 1.0);
  EXPECT_EQ(yarn_mscale(0.5), 1.0);
}

// Llama 3.1's configuration: base 500000, 128 rotary dims, factor 8, low/high frequency factors
// 1 and 4, original context 8192. Wavelength 2 pi 500000^(i/64) is below 8192 / 4 = 2048 up to
// pair 28 (1956) and above 8192 from pair 35 (8219); pairs 29..34 lie in the smooth band.
TEST(RopeFrequencies, Llama3Bands) {
  const std::vector<float> d = llama3_freq_factors(128, 500000, 8, 1, 4, 8192);
  ASSERT_EQ(d.size(), 64u);
  for (int i = 0; i <= 28; ++i) EXPECT_EQ(d[i], 1.0f) << i;
  for (int i = 35; i < 64; ++i) EXPECT_EQ(d[i], 8.0f) << i;
  for (int i = 29; i <= 34; ++i) {
    EXPECT_GT(d[i], d[i - 1]) << i;
    EXPECT_LT(d[i], 8.0f) << i;
    // In the band the new frequency is a blend of the original and the original / 8, weighted
    // by how many times the pair turns over the original context (8192 / wavelength) - 1, / 3.
    const double wavelength = 2 * std::numbers::pi * std::pow(500000.0, i / 64.0);
    const double smooth = (8192 / wavelength - 1) / 3;
    EXPECT_NEAR(1.0 / d[i], (1 - smooth) / 8 + smooth, 1e-6) << i;
  }
}

TEST(RopeScaling, ValidationNamesTheBadValue) {
  const auto error = [](const ModelSpec& s) {
    try {
      validate_rope_scaling(s, "m.gguf");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  ModelSpec s = rope_spec(10000, 8);
  EXPECT_EQ(error(s), "");
  s.rope_freq_factors = {1, 2, 3};
  EXPECT_HAS(error(s), "m.gguf: 3 rope frequency factors, expected one per rotary pair (4)");
  s.rope_freq_factors = {1, 2, 0, 4};
  EXPECT_HAS(error(s), "rope frequency factor 2 is 0; it must be finite and > 0");
  s.rope_freq_factors.clear();
  s.rope_scaling.type = RopeScalingType::kYarn;
  s.rope_scaling.factor = 4;
  EXPECT_HAS(error(s), "YaRN rope scaling needs the original context length (got 0)");
  s.rope_scaling.orig_ctx = 128;
  s.rope_scaling.beta_slow = -1;
  EXPECT_HAS(error(s), "YaRN beta_fast 32 and beta_slow -1 must be finite and > 0");
  s.rope_scaling.beta_slow = 1;
  s.rope_scaling.factor = NAN;
  EXPECT_HAS(error(s), "rope scaling factor nan must be finite and > 0");
  s.rope_scaling.factor = 4;
  s.kq_scale_mult = 0;
  EXPECT_HAS(error(s), "attention scale multiplier 0 must be finite and > 0");
}

// ---- GGUF ----

std::string stories_gguf(const std::string& shared) {
  return shared + "/models/stories260K/stories260K.gguf";
}

/// The spec of a GGUF file, or the loader's error message.
struct Loaded {
  std::shared_ptr<const Model> model;
  std::string error;
};
Loaded load(const std::string& path) {
  auto m = load_model(path);
  if (!m) return {nullptr, m.error().message};
  return {*m, ""};
}

TEST(RopeScalingGguf, YarnKeys) {
  TROUPE_SHARED_OR_SKIP(shared);
  TempDir dir;
  const std::string path =
      testing::edited_gguf(dir, "yarn.gguf", stories_gguf(shared), [](GgufWriter& w) {
        w.set_string("llama.rope.scaling.type", "yarn");
        w.set_f32("llama.rope.scaling.factor", 4);
        w.set_u32("llama.rope.scaling.original_context_length", 128);
        w.set_f32("llama.rope.scaling.yarn_beta_fast", 16);
        w.set_f32("llama.rope.scaling.yarn_beta_slow", 2);
        w.set_f32("llama.rope.scaling.attn_factor", 0.5);
      });
  const Loaded l = load(path);
  ASSERT_NE(l.model, nullptr) << l.error;
  const ModelSpec& s = l.model->spec;
  EXPECT_EQ(s.rope_scaling.type, RopeScalingType::kYarn);
  EXPECT_EQ(s.rope_scaling.factor, 4.0);
  EXPECT_EQ(s.rope_scaling.orig_ctx, 128);
  EXPECT_EQ(s.rope_scaling.beta_fast, 16.0);
  EXPECT_EQ(s.rope_scaling.beta_slow, 2.0);
  // llama.cpp multiplies cos and sin by attn_factor times YaRN's magnitude term.
  EXPECT_NEAR(s.rope_scaling.attn_factor, 0.5 * (1 + 0.1 * std::log(4.0)), 1e-7);
  EXPECT_EQ(s.kq_scale_mult, 1.0);
  EXPECT_TRUE(s.rope_freq_factors.empty());
}

TEST(RopeScalingGguf, YarnOriginalContextDefaultsToTheTrainingContext) {
  TROUPE_SHARED_OR_SKIP(shared);
  TempDir dir;
  const std::string path =
      testing::edited_gguf(dir, "yarn.gguf", stories_gguf(shared), [](GgufWriter& w) {
        w.set_string("llama.rope.scaling.type", "yarn");
        w.set_f32("llama.rope.scaling.factor", 2);
      });
  const Loaded l = load(path);
  ASSERT_NE(l.model, nullptr) << l.error;
  EXPECT_GT(l.model->spec.n_ctx_train, 0);
  EXPECT_EQ(l.model->spec.rope_scaling.orig_ctx, l.model->spec.n_ctx_train);
}

// DeepSeek's GGUF: yarn_log_multiplier 0.1 (its mscale_all_dim 1); cos and sin stay unscaled
// and the attention logits take (1 + 0.1 ln factor)^2.
TEST(RopeScalingGguf, DeepseekYarnScalesTheAttentionLogits) {
  TROUPE_SHARED_OR_SKIP(shared);
  TempDir dir;
  const std::string path = testing::edited_gguf(
      dir, "ds.gguf", shared + "/models/synth/deepseek2/model.gguf", [](GgufWriter& w) {
        w.set_string("deepseek2.rope.scaling.type", "yarn");
        w.set_f32("deepseek2.rope.scaling.factor", 40);
        w.set_u32("deepseek2.rope.scaling.original_context_length", 4096);
        w.set_f32("deepseek2.rope.scaling.yarn_log_multiplier", 0.1f);
      });
  const Loaded l = load(path);
  ASSERT_NE(l.model, nullptr) << l.error;
  const ModelSpec& s = l.model->spec;
  EXPECT_EQ(s.rope_scaling.type, RopeScalingType::kYarn);
  EXPECT_EQ(s.rope_scaling.attn_factor, 1.0);
  const double m = 1 + 0.1 * std::log(40.0);
  EXPECT_NEAR(s.kq_scale_mult, m * m, 1e-6);
}

// As llama.cpp reads them: the factor divides the frequencies under "linear" or no type at all,
// never under "none" (llama.cpp's context forces the scale to 1 then), the old rope.scale_linear
// key stands in for a missing factor, and a factor of 0 means unset.
TEST(RopeScalingGguf, LinearFactorUnderEveryNonYarnType) {
  TROUPE_SHARED_OR_SKIP(shared);
  TempDir dir;
  struct Case {
    const char* type;        // nullptr: no rope.scaling.type key
    const char* factor_key;  // under "llama."
    float factor;
    RopeScalingType want;
    double want_factor;
  };
  const Case cases[] = {
      {"linear", "rope.scaling.factor", 2, RopeScalingType::kLinear, 2},
      {"none", "rope.scaling.factor", 2, RopeScalingType::kNone, 1},
      {nullptr, "rope.scaling.factor", 3, RopeScalingType::kLinear, 3},
      {nullptr, "rope.scale_linear", 2, RopeScalingType::kLinear, 2},
      {"linear", "rope.scaling.factor", 0, RopeScalingType::kNone, 1},
      {"none", "rope.scaling.factor", 1, RopeScalingType::kNone, 1},
  };
  int n = 0;
  for (const Case& c : cases) {
    const std::string what = std::string(c.type ? c.type : "(no type)") + " " + c.factor_key + " " +
                             std::to_string(c.factor);
    const std::string path = testing::edited_gguf(
        dir, "linear" + std::to_string(n++) + ".gguf", stories_gguf(shared), [&](GgufWriter& w) {
          if (c.type) w.set_string("llama.rope.scaling.type", c.type);
          w.set_f32(std::string("llama.") + c.factor_key, c.factor);
        });
    const Loaded l = load(path);
    ASSERT_NE(l.model, nullptr) << what << ": " << l.error;
    EXPECT_EQ(l.model->spec.rope_scaling.type, c.want) << what;
    EXPECT_EQ(l.model->spec.rope_scaling.factor, c.want_factor) << what;
  }
}

// Without YaRN, llama.cpp multiplies cos and sin by attn_factor alone; DeepSeek's graph does not
// (it would need its own rule), so troupe refuses that combination there.
TEST(RopeScalingGguf, AttnFactorWithoutYarn) {
  TROUPE_SHARED_OR_SKIP(shared);
  TempDir dir;
  const auto edit = [](const std::string& arch) {
    return [arch](GgufWriter& w) {
      w.set_string(arch + ".rope.scaling.type", "linear");
      w.set_f32(arch + ".rope.scaling.factor", 2);
      w.set_f32(arch + ".rope.scaling.attn_factor", 0.5f);
    };
  };
  const Loaded l = load(testing::edited_gguf(dir, "l.gguf", stories_gguf(shared), edit("llama")));
  ASSERT_NE(l.model, nullptr) << l.error;
  EXPECT_EQ(l.model->spec.rope_scaling.type, RopeScalingType::kLinear);
  EXPECT_EQ(l.model->spec.rope_scaling.attn_factor, 0.5);
  const std::string ds = testing::edited_gguf(
      dir, "ds.gguf", shared + "/models/synth/deepseek2/model.gguf", edit("deepseek2"));
  const Loaded d = load(ds);
  EXPECT_EQ(d.model, nullptr);
  EXPECT_HAS(d.error, "rope.scaling.attn_factor 0.5 without YaRN is not supported for deepseek2");
}

TEST(RopeScalingGguf, RopeFreqsTensorBecomesPerPairDivisors) {
  TROUPE_SHARED_OR_SKIP(shared);
  TempDir dir;
  // stories260K: head_dim 8, so 4 rotary pairs.
  const std::string path =
      testing::edited_gguf(dir, "freqs.gguf", stories_gguf(shared), [](GgufWriter&) {},
                           {ExtraTensor{"rope_freqs.weight", {1, 1.5f, 8, 8}}});
  const Loaded l = load(path);
  ASSERT_NE(l.model, nullptr) << l.error;
  EXPECT_EQ(l.model->spec.rope_freq_factors, (std::vector<float>{1, 1.5f, 8, 8}));
  EXPECT_EQ(l.model->spec.rope_scaling.type, RopeScalingType::kNone);
}

TEST(RopeScalingGguf, BadInputs) {
  TROUPE_SHARED_OR_SKIP(shared);
  TempDir dir;
  const std::string src = stories_gguf(shared);
  struct Case {
    const char* what;
    std::function<void(GgufWriter&)> edit;
    std::vector<ExtraTensor> extra;
    const char* message;
  };
  const Case cases[] = {
      {"unknown type",
       [](GgufWriter& w) { w.set_string("llama.rope.scaling.type", "longrope"); },
       {},
       "rope scaling 'longrope' is not supported (none, linear, yarn)"},
      {"negative factor",
       [](GgufWriter& w) {
         w.set_string("llama.rope.scaling.type", "yarn");
         w.set_f32("llama.rope.scaling.factor", -2);
       },
       {},
       "rope scaling factor -2 must be finite and > 0"},
      {"log multiplier outside deepseek2",
       [](GgufWriter& w) {
         w.set_string("llama.rope.scaling.type", "yarn");
         w.set_f32("llama.rope.scaling.factor", 4);
         w.set_f32("llama.rope.scaling.yarn_log_multiplier", 0.1f);
       },
       {},
       "rope.scaling.yarn_log_multiplier 0.1 is supported only for deepseek2"},
      {"factor of the wrong type",
       [](GgufWriter& w) {
         w.set_string("llama.rope.scaling.type", "linear");
         w.set_string("llama.rope.scaling.factor", "two");
       },
       {},
       "llama.rope.scaling.factor"},
      {"rope_freqs too short",
       [](GgufWriter&) {},
       {ExtraTensor{"rope_freqs.weight", {1, 2, 4}}},
       "tensor 'rope_freqs.weight' must be f32 [4] (one divisor per rotary pair), got f32 [3, 1]"},
      {"rope_freqs f16",
       [](GgufWriter&) {},
       {ExtraTensor{"rope_freqs.weight", {1, 2, 4, 8}, GgmlType::kF16}},
       "tensor 'rope_freqs.weight' must be f32 [4] (one divisor per rotary pair), got f16 [4, 1]"},
      {"rope_freqs zero",
       [](GgufWriter&) {},
       {ExtraTensor{"rope_freqs.weight", {1, 0, 4, 8}}},
       "rope frequency factor 1 is 0; it must be finite and > 0"},
  };
  int n = 0;
  for (const Case& c : cases) {
    const std::string path =
        testing::edited_gguf(dir, "bad" + std::to_string(n++) + ".gguf", src, c.edit, c.extra);
    const Loaded l = load(path);
    EXPECT_EQ(l.model, nullptr) << c.what;
    EXPECT_HAS(l.error, c.message) << c.what;
    EXPECT_HAS(l.error, path) << c.what;
  }
}

// ---- Hugging Face ----

std::string hf_error(const std::string& dir) {
  auto m = load_hf_model(dir);
  return m ? std::string() : m.error().message;
}

TEST(RopeScalingHf, Llama3BecomesPerPairDivisors) {
  TROUPE_SHARED_OR_SKIP(shared);
  EditedHfModel m(shared, "stories260K", [](json& c) {
    c["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", 8.0},
                         {"low_freq_factor", 1.0},
                         {"high_freq_factor", 8.0},
                         {"original_max_position_embeddings", 256}};
  });
  auto r = load_hf_model(m.path());
  ASSERT_TRUE(r.has_value()) << r.error().message;
  const ModelSpec& s = (*r)->spec;
  EXPECT_EQ(s.rope_scaling.type, RopeScalingType::kNone);
  // Wavelengths 2 pi 10000^(i/4): 6.3 (kept: < 256 / 8), 62.8 (smooth band), 628 and 6283
  // (> 256: divided by 8).
  ASSERT_EQ(s.rope_freq_factors.size(), 4u);
  EXPECT_EQ(s.rope_freq_factors[0], 1.0f);
  const double smooth = (256 / (2 * std::numbers::pi * 10)) - 1;
  EXPECT_NEAR(s.rope_freq_factors[1], 1 / ((1 - smooth / 7) / 8 + smooth / 7), 1e-5);
  EXPECT_EQ(s.rope_freq_factors[2], 8.0f);
  EXPECT_EQ(s.rope_freq_factors[3], 8.0f);
}

TEST(RopeScalingHf, LinearAndDefault) {
  TROUPE_SHARED_OR_SKIP(shared);
  EditedHfModel lin(shared, "stories260K", [](json& c) {
    c["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  });
  auto r = load_hf_model(lin.path());
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ((*r)->spec.rope_scaling.type, RopeScalingType::kLinear);
  EXPECT_EQ((*r)->spec.rope_scaling.factor, 2.0);
  // transformers' newer rope_parameters, with the theta inside.
  EditedHfModel def(shared, "stories260K", [](json& c) {
    c.erase("rope_theta");
    c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5000.0}};
  });
  r = load_hf_model(def.path());
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ((*r)->spec.rope_scaling.type, RopeScalingType::kNone);
  EXPECT_EQ((*r)->spec.rope_theta, 5000.0f);
}

TEST(RopeScalingHf, YarnDefaultsAndAttentionFactor) {
  TROUPE_SHARED_OR_SKIP(shared);
  EditedHfModel m(shared, "stories260K", [](json& c) {
    c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  });
  auto r = load_hf_model(m.path());
  ASSERT_TRUE(r.has_value()) << r.error().message;
  const RopeScaling& sc = (*r)->spec.rope_scaling;
  EXPECT_EQ(sc.type, RopeScalingType::kYarn);
  EXPECT_EQ(sc.orig_ctx, 512);  // max_position_embeddings
  EXPECT_EQ(sc.beta_fast, 32.0);
  EXPECT_EQ(sc.beta_slow, 1.0);
  EXPECT_TRUE(sc.truncate);
  EXPECT_DOUBLE_EQ(sc.attn_factor, 1 + 0.1 * std::log(4.0));
  EXPECT_EQ((*r)->spec.kq_scale_mult, 1.0);

  EditedHfModel given(shared, "stories260K", [](json& c) {
    c["rope_scaling"] = {
        {"rope_type", "yarn"},      {"factor", 4.0},  {"original_max_position_embeddings", 128},
        {"attention_factor", 0.75}, {"beta_fast", 8}, {"truncate", false}};
  });
  r = load_hf_model(given.path());
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ((*r)->spec.rope_scaling.orig_ctx, 128);
  EXPECT_EQ((*r)->spec.rope_scaling.attn_factor, 0.75);
  EXPECT_EQ((*r)->spec.rope_scaling.beta_fast, 8.0);
  EXPECT_FALSE((*r)->spec.rope_scaling.truncate);
}

// Without a factor, YaRN's is the ratio of max_position_embeddings (512) to the original
// context; an explicit factor wins over that ratio.
TEST(RopeScalingHf, YarnFactorFromTheTwoContexts) {
  TROUPE_SHARED_OR_SKIP(shared);
  EditedHfModel implicit(shared, "stories260K", [](json& c) {
    c["rope_scaling"] = {{"rope_type", "yarn"}, {"original_max_position_embeddings", 128}};
  });
  auto r = load_hf_model(implicit.path());
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ((*r)->spec.rope_scaling.factor, 4.0);
  EXPECT_DOUBLE_EQ((*r)->spec.rope_scaling.attn_factor, 1 + 0.1 * std::log(4.0));
  EditedHfModel explicit_factor(shared, "stories260K", [](json& c) {
    c["rope_scaling"] = {
        {"rope_type", "yarn"}, {"factor", 2.0}, {"original_max_position_embeddings", 128}};
  });
  r = load_hf_model(explicit_factor.path());
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ((*r)->spec.rope_scaling.factor, 2.0);
}

// DeepSeek-V3's config: mscale = mscale_all_dim = 1, so cos/sin keep their size (the ratio of
// the two magnitude terms) and the softmax scale takes the all-dims term squared.
TEST(RopeScalingHf, DeepseekYarnScalesTheAttentionLogits) {
  TROUPE_SHARED_OR_SKIP(shared);
  EditedHfModel m(shared, "deepseek2", [](json& c) {
    c["rope_scaling"] = {
        {"type", "yarn"},       {"factor", 40.0}, {"original_max_position_embeddings", 4096},
        {"beta_fast", 32},      {"beta_slow", 1}, {"mscale", 1.0},
        {"mscale_all_dim", 1.0}};
  });
  auto r = load_hf_model(m.path());
  ASSERT_TRUE(r.has_value()) << r.error().message;
  const ModelSpec& s = (*r)->spec;
  EXPECT_EQ(s.rope_scaling.type, RopeScalingType::kYarn);
  EXPECT_EQ(s.rope_scaling.orig_ctx, 4096);
  EXPECT_DOUBLE_EQ(s.rope_scaling.attn_factor, 1.0);
  const double mm = 1 + 0.1 * std::log(40.0);
  EXPECT_DOUBLE_EQ(s.kq_scale_mult, mm * mm);
}

TEST(RopeScalingHf, BadInputs) {
  TROUPE_SHARED_OR_SKIP(shared);
  const std::pair<json, const char*> cases[] = {
      {{{"rope_type", "dynamic"}, {"factor", 2.0}},
       "rope scaling 'dynamic' is not supported (default, linear, llama3, yarn, longrope)"},
      {{{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 5.0}},
       "llama3 rope scaling needs factor > 0, 0 < low_freq_factor <= high_freq_factor"},
      {{{"rope_type", "yarn"}, {"factor", "forty"}},
       "rope scaling 'factor' must be a number, got \"forty\""},
      {{{"rope_type", "yarn"}, {"factor", -2.0}}, "rope scaling factor -2 must be finite and > 0"},
      {{{"rope_type", "yarn"}, {"factor", 2.0}, {"original_max_position_embeddings", 1e30}},
       "YaRN original_max_position_embeddings 1e+30 must be in [1, 16777216]"},
      {{{"rope_type", "yarn"}, {"factor", 2.0}, {"beta_slow", 0}},
       "YaRN beta_fast 32 and beta_slow 0 must be finite and > 0"},
  };
  for (const auto& one : cases) {
    const json& scaling = one.first;
    EditedHfModel m(shared, "stories260K", [&](json& c) { c["rope_scaling"] = scaling; });
    EXPECT_HAS(hf_error(m.path()), one.second) << scaling.dump();
  }
  EditedHfModel not_object(shared, "stories260K", [](json& c) { c["rope_scaling"] = 4; });
  EXPECT_HAS(hf_error(not_object.path()), "rope_scaling/rope_parameters must be an object");
}

}  // namespace
}  // namespace troupe::model
