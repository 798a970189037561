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
#include <map>
#include <random>
#include <string>
#include <utility>
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

// |got - ref| / |ref| over all logits (2-norms); NaN, with a failure, for a size mismatch or a
// non-finite logit.
double relative_error(const std::vector<float>& got, const std::vector<float>& ref,
                      const std::string& what) {
  if (got.size() != ref.size() || ref.empty()) {
    ADD_FAILURE() << what << ": " << got.size() << " logits against " << ref.size();
    return NAN;
  }
  double err2 = 0, ref2 = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) {
      ADD_FAILURE() << what << ": logit " << i << " is " << got[i];
      return NAN;
    }
    err2 += (static_cast<double>(got[i]) - ref[i]) * (static_cast<double>(got[i]) - ref[i]);
    ref2 += static_cast<double>(ref[i]) * ref[i];
  }
  EXPECT_GT(ref2, 0) << what << ": the f32 logits are all zero";
  const double rel = std::sqrt(err2 / ref2);
  std::printf("%-20s |logits - f32| / |f32| = %.4f\n", what.c_str(), rel);
  return rel;
}

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
    std::map<std::string, double> rel;  // by --dtype
    for (const Case& c : cases) {
      const std::string what = arch + " " + c.dtype;
      rel[c.dtype] = relative_error(prompt_logits(make(arch, c.dtype), prompt), ref, what);
      EXPECT_LT(rel[c.dtype], c.max_rel) << what;
    }
    // More bits, closer: q8_0 < q6_K < q5_K < q4_K, each step by more than 1.5 times (about 2).
    // Q5_0 and Q5_1 against Q4_0 and Q4_1 likewise: the fifth bit about halves the error.
    for (const auto& [more, fewer] :
         {std::pair{"q8_0", "q6_k"}, std::pair{"q6_k", "q5_k"}, std::pair{"q5_k", "q4_k"},
          std::pair{"q4_k", "q3_k"}, std::pair{"q3_k", "q2_k"}, std::pair{"q5_0", "q4_0"},
          std::pair{"q5_1", "q4_1"}})
      EXPECT_LT(1.5 * rel[more], rel[fewer]) << arch << ": " << more << " against " << fewer;
  }
  // A width off the super-block (288): a Q4_K_M file of it holds Q5_0 and Q8_0 where rows do
  // not fit Q4_K and Q6_K (synth does what llama.cpp's quantizer does), and still tracks its
  // f32 twin like the 256-wide one.
  for (const std::string arch : {"llama", "mixtral"}) {
    const std::vector<float> ref = prompt_logits(make(arch, "f32", 288), prompt);
    const std::vector<float> got = prompt_logits(make(arch, "q4_k_m", 288), prompt);
    const double rel = relative_error(got, ref, arch + " q4_k_m@288");
    EXPECT_LT(rel, 0.17) << arch;  // measured 8.8 / 11.4 %
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace troupe::compute
