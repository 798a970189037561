// FP8 (E4M3, block-scaled) Hugging Face checkpoints through the engine: a shared model written as
// FP8 by the test (tests/fp8_model.h) gives, bit for bit, the logits of its f32 twin holding the
// exact products fp8 * scale -- for DeepSeek-V3 style MLA + MoE (kv_b_proj and the router
// converted to f32, the rest FP8 views), Mixtral and the dense Llama -- and logits close to the
// unquantized model's (FP8 rounds each weight to 4 significant bits).
#include "tests/fp8_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "compute/engine.h"
#include "compute/matmul.h"
#include "model/model.h"
#include "tests/compute/engine_test_util.h"
#include "tests/test_support.h"

namespace troupe::compute {
namespace {

using model::GgmlType;
using testing::Fp8Copy;

std::vector<int32_t> prompt(int32_t vocab) { return stride_prompt(vocab); }

void check_model(const std::string& shared, const std::string& name, int64_t br, int64_t bc,
                 bool trained = false, const std::string& compressed = "") {
  SCOPED_TRACE(name + " blocks " + std::to_string(br) + "x" + std::to_string(bc) + " " +
               compressed);
  const std::string src = shared + "/models/hf/" + name;
  const Fp8Copy copy(src, br, bc, nullptr, compressed);
  ASSERT_GT(copy.quantized(), 0);
  auto fp8 = model::load_model(copy.fp8_path());
  ASSERT_TRUE(fp8.has_value()) << fp8.error().message;
  const model::ModelSpec& s = (*fp8)->spec;
  EXPECT_EQ(s.token_embd.type, GgmlType::kF8_E4M3);
  EXPECT_EQ(s.output.type, GgmlType::kF8_E4M3);
  const model::LayerSpec& last = s.layers.back();
  if (last.is_moe) {
    EXPECT_EQ(last.experts[0].gate.type, GgmlType::kF8_E4M3);
    EXPECT_EQ(last.router.type, GgmlType::kF32);  // the engine reads routers as floats
  }
  if (last.wk_b.present()) {
    EXPECT_EQ(last.wkv_a.type, GgmlType::kF8_E4M3);
    EXPECT_EQ(last.wk_b.type, GgmlType::kF32);  // per-head transposes: exact f32
  } else {
    EXPECT_EQ(last.wq.type, GgmlType::kF8_E4M3);
  }

  const auto p = prompt(static_cast<int32_t>(s.n_vocab));
  // Against the unquantized model: not equal (FP8 was really applied), and for the trained
  // model close. (The synthetic MoE models' random routers pick other experts once their
  // weights are rounded to 4 significant bits, which moves their logits far.)
  expect_quantized_logits(prompt_logits(*fp8, p), prompt_logits(copy.twin_path(), p),
                          prompt_logits(src, p), trained ? 0.1 : 0.0);
}

// A node's weights in memory (the default where they fit): FP8 views copied (the scale grids
// stay where they were) and tiled where the kernels read F8 tiles, same logits bit for bit.
TEST(Fp8Model, WeightsCopiedToMemoryGiveTheSameLogits) {
  TROUPE_SHARED_OR_SKIP(shared);
  const Fp8Copy copy(shared + "/models/hf/deepseek2", 128, 128);
  auto mapped = model::load_model(copy.fp8_path());
  ASSERT_TRUE(mapped.has_value()) << mapped.error().message;
  // As a node copies them: the types this CPU's kernels read fast in tiles.
  auto in_memory = model::copy_weights_to_memory(*mapped, {}, 2, compute::tiled_weight_types());
  ASSERT_TRUE(in_memory.has_value()) << in_memory.error().message;
  const model::WeightView &a = (*mapped)->spec.layers[2].experts[5].up,
                          &b = (*in_memory)->spec.layers[2].experts[5].up;
  EXPECT_NE(a.data, b.data);  // copied
  EXPECT_EQ(a.scales, b.scales);
  // In tiles where this CPU's kernels read F8 tiles (AVX-512), else in rows.
  EXPECT_EQ(b.layout == model::WeightLayout::kTiles16,
            compute::tiled_weight_types().has(GgmlType::kF8_E4M3));
  const auto p = prompt(static_cast<int32_t>((*mapped)->spec.n_vocab));
  EXPECT_EQ(prompt_logits(*in_memory, p), prompt_logits(*mapped, p));
}

TEST(Fp8Model, DeepseekV3EqualsItsExactTwin) {
  TROUPE_SHARED_OR_SKIP(shared);
  check_model(shared, "deepseek2", 128, 128);
  check_model(shared, "deepseek2", 16, 32);
}

TEST(Fp8Model, MixtralEqualsItsExactTwin) {
  TROUPE_SHARED_OR_SKIP(shared);
  check_model(shared, "mixtral-moe", 32, 64);
}

// compressed-tensors "float-quantized" FP8 (the llm-compressor releases): scales per channel,
// per tensor or per block, dynamic activations computed in f32.
TEST(Fp8Model, CompressedTensorsFp8EqualsItsExactTwin) {
  TROUPE_SHARED_OR_SKIP(shared);
  check_model(shared, "deepseek2", 0, 0, false, "channel");
  check_model(shared, "mixtral-moe", 0, 0, false, "tensor");
  check_model(shared, "qwen3moe", 32, 64, false, "block");
  check_model(shared, "stories260K", 0, 0, /*trained=*/true, "channel");
}

TEST(Fp8Model, DenseLlamaEqualsItsExactTwin) {
  TROUPE_SHARED_OR_SKIP(shared);
  check_model(shared, "stories260K", 128, 128, /*trained=*/true);
}

}  // namespace
}  // namespace troupe::compute
