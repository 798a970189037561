// Quantized models against their f32 twin: troupe synth draws a matrix's values from its name
// and the seed alone, so the same options in f32 and in a quantized type give the same model up
// to its quantization. Each quantized model's teacher-forced logits must track the f32 model's
// (whose path runs no quantized code: float weights, float kernels), within a bound set by its
// bits, and more bits must track closer. A decoder that read a type's layout wrong would give
// logits unrelated to the f32 model's; one that lost a bit would fall out of the order.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "compute/engine.h"
#include "model/model.h"
#include "model/synth.h"
#include "tests/compute/engine_test_util.h"

namespace troupe::compute {
namespace {

namespace fs = std::filesystem;

struct Case {
  const char* dtype;  // --dtype
  double max_rel;     // bound on |logits - f32 logits| / |f32 logits| (2-norm over all)
};

TEST(QuantizedModel, LogitsTrackTheF32TwinCloserWithMoreBits) {
  const fs::path dir = fs::temp_directory_path() / ("troupe_qmodel_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto make = [&](const std::string& arch, const std::string& dtype, int64_t n_embd = 256) {
    model::SynthOptions so;
    so.arch = arch;
    so.n_embd = n_embd;  // 256: rows of whole K-quant super-blocks
    so.n_layer = 2;
    so.n_head = 4;
    so.n_head_kv = 2;
    so.n_ff = 512;
    if (arch == "mixtral") {
      so.n_expert = 4;
      so.n_expert_used = 2;
    }
    so.n_vocab = 512;
    so.seed = 7;
    so.num_threads = 2;
    EXPECT_TRUE(model::parse_synth_dtype(dtype, &so)) << dtype;
    const std::string path =
        (dir / (arch + "-" + dtype + "-" + std::to_string(n_embd) + ".gguf")).string();
    auto made = model::synth_model_summary(so, path);
    EXPECT_TRUE(made.has_value()) << made.error().message;
    return path;
  };
  std::mt19937 rng(3);
  std::vector<int32_t> prompt(24);
  for (auto& t : prompt) t = static_cast<int32_t>(rng() % 512);

  // Bounds about 1.5 times the errors measured (llama / mixtral, the same on AVX-512 VNNI and
  // AVX2): q8_0 1.6 / 1.5 %, q6_K 4.6 / 4.5 %, q5_K 8.7 / 8.1 %, q5_K_M 7.8 / 9.5 %, q4_K
  // 17.6 / 18.3 %, q4_K_M 15.2 / 15.9 %, q4_0 18.6 / 20.5 %, q3_K 34 / 36 %, q2_K 71 / 70 %,
  // q4_1 17.6 / 21.6 %, q5_0 9.8 / 9.2 %, q5_1 8.4 / 9.2 % (an unrelated model would be ~140 %):
  // the weights' own rounding, grown through two layers and the head, each bit about halving it.
  const Case cases[] = {{"q8_0", 0.025}, {"q6_k", 0.07},   {"q5_k", 0.13},  {"q5_k_m", 0.14},
                        {"q4_k", 0.27},  {"q4_k_m", 0.25}, {"q4_0", 0.3},   {"q3_k", 0.5},
                        {"q2_k", 1.0},   {"iq4_nl", 0.3},  {"iq4_xs", 0.3}, {"q4_1", 0.32},
                        {"q5_0", 0.15},  {"q5_1", 0.14}};
  for (const std::string arch : {"llama", "mixtral"}) {
    const std::vector<float> ref = prompt_logits(make(arch, "f32"), prompt);
    ASSERT_FALSE(ref.empty());
    double ref2 = 0;
    for (float v : ref) ref2 += static_cast<double>(v) * v;
    ASSERT_GT(ref2, 0);
    double rel_of[std::size(cases)] = {};
    for (size_t c = 0; c < std::size(cases); ++c) {
      const std::vector<float> got = prompt_logits(make(arch, cases[c].dtype), prompt);
      ASSERT_EQ(got.size(), ref.size()) << arch << " " << cases[c].dtype;
      double err2 = 0;
      for (size_t i = 0; i < ref.size(); ++i) {
        ASSERT_TRUE(std::isfinite(got[i])) << arch << " " << cases[c].dtype << " logit " << i;
        err2 += (static_cast<double>(got[i]) - ref[i]) * (static_cast<double>(got[i]) - ref[i]);
      }
      rel_of[c] = std::sqrt(err2 / ref2);
      std::printf("%s %-7s |logits - f32| / |f32| = %.4f\n", arch.c_str(), cases[c].dtype,
                  rel_of[c]);
      EXPECT_LT(rel_of[c], cases[c].max_rel) << arch << " " << cases[c].dtype;
    }
    // More bits, closer: q8_0 < q6_K < q5_K < q4_K, each step by more than 1.5 times (about 2).
    EXPECT_LT(1.5 * rel_of[0], rel_of[1]) << arch << ": q8_0 against q6_K";
    EXPECT_LT(1.5 * rel_of[1], rel_of[2]) << arch << ": q6_K against q5_K";
    EXPECT_LT(1.5 * rel_of[2], rel_of[4]) << arch << ": q5_K against q4_K";
    EXPECT_LT(1.5 * rel_of[4], rel_of[7]) << arch << ": q4_K against q3_K";
    EXPECT_LT(1.5 * rel_of[7], rel_of[8]) << arch << ": q3_K against q2_K";
    // Q5_0 and Q5_1 against Q4_0 and Q4_1: the fifth bit about halves the error.
    EXPECT_LT(1.5 * rel_of[12], rel_of[6]) << arch << ": q5_0 against q4_0";
    EXPECT_LT(1.5 * rel_of[13], rel_of[11]) << arch << ": q5_1 against q4_1";
  }
  // A width off the super-block (288): a Q4_K_M file of it holds Q5_0 and Q8_0 where rows do
  // not fit Q4_K and Q6_K (synth does what llama.cpp's quantizer does), and still tracks its
  // f32 twin like the 256-wide one.
  for (const std::string arch : {"llama", "mixtral"}) {
    const std::vector<float> ref = prompt_logits(make(arch, "f32", 288), prompt);
    const std::vector<float> got = prompt_logits(make(arch, "q4_k_m", 288), prompt);
    ASSERT_FALSE(ref.empty());
    ASSERT_EQ(got.size(), ref.size()) << arch;
    double err2 = 0, ref2 = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_TRUE(std::isfinite(got[i])) << arch << " logit " << i;
      err2 += (static_cast<double>(got[i]) - ref[i]) * (static_cast<double>(got[i]) - ref[i]);
      ref2 += static_cast<double>(ref[i]) * ref[i];
    }
    const double rel = std::sqrt(err2 / ref2);
    std::printf("%s q4_k_m at width 288 |logits - f32| / |f32| = %.4f\n", arch.c_str(), rel);
    EXPECT_LT(rel, 0.17) << arch;  // measured 8.8 / 11.4 %
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace troupe::compute
