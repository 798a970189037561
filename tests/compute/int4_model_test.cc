// compressed-tensors int4 Hugging Face checkpoints through the engine: a shared model written as
// packed int4 by the test (tests/int4_model.h) gives, bit for bit, the logits of its f32 twin
// holding q * scale -- Kimi-K2-Thinking's layout (routed experts int4, the rest as stored) and
// every linear layer packed, for DeepSeek-V3 style MLA + MoE, Mixtral and the dense Llama -- and
// logits close to the unquantized model's where its weights are trained.
#include "tests/int4_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "compute/engine.h"
#include "compute/matmul.h"
#include "model/model.h"
#include "model/weight_tiles.h"
#include "tests/compute/engine_test_util.h"
#include "tests/test_support.h"

namespace troupe::compute {
namespace {

using model::GgmlType;
using testing::Int4Copy;
using testing::Int4Options;

std::vector<int32_t> prompt(int32_t vocab) { return stride_prompt(vocab); }

bool routed_expert(const std::string& name) { return name.find(".experts.") != std::string::npos; }

void check_model(const std::string& shared, const std::string& name, const Int4Options& o,
                 bool trained = false) {
  SCOPED_TRACE(name + " group " + std::to_string(o.group) + (o.quantize ? " experts" : " all"));
  const std::string src = shared + "/models/hf/" + name;
  const Int4Copy copy(src, o);
  ASSERT_GT(copy.quantized(), 0);
  auto i4 = model::load_model(copy.int4_path());
  ASSERT_TRUE(i4.has_value()) << i4.error().message;
  const model::LayerSpec& last = (*i4)->spec.layers.back();
  if (last.is_moe) {
    EXPECT_EQ(last.experts[0].gate.type, GgmlType::kI4_PACKED);
  }
  if (!o.quantize) {
    EXPECT_EQ(last.wo.type, GgmlType::kI4_PACKED);
  }

  // Against the unquantized model: not equal (int4 was really applied), and for the trained
  // model close.
  const auto p = prompt(static_cast<int32_t>((*i4)->spec.n_vocab));
  expect_quantized_logits(prompt_logits(*i4, p), prompt_logits(copy.twin_path(), p),
                          prompt_logits(src, p), trained ? 0.25 : 0.0);
}

TEST(Int4Model, KimiLayoutEqualsItsExactTwin) {
  TROUPE_SHARED_OR_SKIP(shared);
  Int4Options o;
  o.quantize = routed_expert;  // as Kimi-K2-Thinking: routed experts int4, BF16 scales
  check_model(shared, "deepseek2", o);
  check_model(shared, "qwen3moe", o);
}

TEST(Int4Model, EveryLinearLayerPackedEqualsItsExactTwin) {
  TROUPE_SHARED_OR_SKIP(shared);
  Int4Options o;
  check_model(shared, "deepseek2", o);
  o.group = 128;
  o.scale_dtype = "F16";
  check_model(shared, "mixtral-moe", o);
  o.group = 0;
  o.scale_dtype = "F32";
  check_model(shared, "qwen2moe", o);
}

TEST(Int4Model, DenseLlamaEqualsItsExactTwin) {
  TROUPE_SHARED_OR_SKIP(shared);
  Int4Options o;
  o.group = 32;
  check_model(shared, "stories260K", o, /*trained=*/true);
}

// A "mixed-precision" compressed-tensors checkpoint: routed experts int4, every other linear
// layer FP8 with a scale per row (Kimi-K2-Thinking's experts with an FP8 rest, as the mixed
// releases of MiniMax and GLM are laid out).
TEST(Int4Model, MixedPrecisionInt4AndFp8EqualsItsExactTwin) {
  TROUPE_SHARED_OR_SKIP(shared);
  const testing::Fp8Copy fp8(
      shared + "/models/hf/deepseek2", 0, 0, [](const std::string& n) { return !routed_expert(n); },
      "channel");
  std::ifstream in(fp8.fp8_path() + "/config.json");
  nlohmann::json fp8_group =
      nlohmann::json::parse(in)["quantization_config"]["config_groups"]["group_0"];
  fp8_group["format"] = "float-quantized";
  Int4Options o;
  o.quantize = routed_expert;
  o.passthrough_dir = fp8.fp8_path();
  o.extra_groups = {{"group_1", fp8_group}};
  const Int4Copy mixed(fp8.twin_path(), o);
  ASSERT_GT(mixed.quantized(), 0);
  auto m = model::load_model(mixed.int4_path());
  ASSERT_TRUE(m.has_value()) << m.error().message;
  const model::LayerSpec& last = (*m)->spec.layers.back();
  EXPECT_EQ(last.experts[0].down.type, GgmlType::kI4_PACKED);
  EXPECT_EQ(last.wo.type, GgmlType::kF8_E4M3);
  EXPECT_EQ(last.wo.scale_block[0], 1);
  EXPECT_EQ(last.shared.gate.type, GgmlType::kF8_E4M3);
  const auto p = prompt(static_cast<int32_t>((*m)->spec.n_vocab));
  const auto got = prompt_logits(*m, p);
  const auto twin = prompt_logits(mixed.twin_path(), p);
  ASSERT_FALSE(got.empty());
  ASSERT_EQ(got.size(), twin.size());
  EXPECT_EQ(std::memcmp(got.data(), twin.data(), got.size() * sizeof(float)), 0);
}

// A node's weights in memory (the default where they fit): packed views copied (the scales stay
// where they were), same logits.
TEST(Int4Model, WeightsCopiedToMemoryGiveTheSameLogits) {
  TROUPE_SHARED_OR_SKIP(shared);
  const Int4Copy copy(shared + "/models/hf/deepseek2");
  auto mapped = model::load_model(copy.int4_path());
  ASSERT_TRUE(mapped.has_value()) << mapped.error().message;
  // Tiled as a node tiles them: with AVX-512 or AVX2, the packed matrices of whole 128-column
  // groups (the experts' gate and up, 32 x 128) in the layout its kernels read fastest.
  const model::TileTypes tiles = tiled_weight_types();
  auto in_memory = model::copy_weights_to_memory(*mapped, {}, 2, tiles);
  ASSERT_TRUE(in_memory.has_value()) << in_memory.error().message;
  const model::WeightView &a = (*mapped)->spec.layers[2].experts[5].up,
                          &b = (*in_memory)->spec.layers[2].experts[5].up;
  EXPECT_NE(a.data, b.data);  // copied
  EXPECT_EQ(a.scales, b.scales);
  EXPECT_EQ(b.layout, tiles.has(GgmlType::kI4_PACKED) ? model::WeightLayout::kTiles16
                                                      : model::WeightLayout::kRows)
      << simd_level();
  if (tiles.has(GgmlType::kI4_PACKED)) {
    const model::WeightView& down = (*in_memory)->spec.layers[2].experts[5].down;
    EXPECT_EQ(down.cols() % model::kNibbleTileCols == 0 ? model::WeightLayout::kTiles16
                                                        : model::WeightLayout::kRows,
              down.layout);
  }
  const auto p = prompt(static_cast<int32_t>((*mapped)->spec.n_vocab));
  EXPECT_EQ(prompt_logits(*in_memory, p), prompt_logits(*mapped, p));
}

}  // namespace
}  // namespace troupe::compute
