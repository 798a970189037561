// NVFP4 Hugging Face checkpoints through the engine: a shared model written as NVFP4 by the test
// (tests/nvfp4_model.h), in ModelOpt's form (declared in config.json or in hf_quant_config.json)
// and in compressed-tensors' ("nvfp4-pack-quantized"), gives bit for bit the logits of its f32
// twin holding E2M1(q) * scale -- for DeepSeek-V3 style MLA + MoE, Mixtral, Qwen3-MoE and the
// dense Llama -- logits close to the unquantized model's where its weights are trained, and the
// same logits from weights copied into memory and tiled as a node copies them.
#include "tests/nvfp4_model.h"

#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "compute/engine.h"
#include "compute/matmul.h"
#include "model/model.h"
#include "model/weight_tiles.h"
#include "tests/compute/engine_test_util.h"
#include "tests/test_support.h"

namespace troupe::compute {
namespace {

using model::GgmlType;
using testing::Nvfp4Copy;
using testing::Nvfp4Options;

bool routed_expert(const std::string& name) { return name.find(".experts.") != std::string::npos; }

void check_model(const std::string& shared, const std::string& name, const Nvfp4Options& o,
                 bool trained = false) {
  SCOPED_TRACE(name + (o.modelopt ? " modelopt" : " compressed-tensors") +
               (o.side_file ? " (hf_quant_config.json)" : "") + (o.quantize ? " experts" : " all"));
  const std::string src = shared + "/models/hf/" + name;
  const Nvfp4Copy copy(src, o);
  ASSERT_GT(copy.quantized(), 0);
  auto m = model::load_model(copy.nvfp4_path());
  ASSERT_TRUE(m.has_value()) << m.error().message;
  const model::LayerSpec& last = (*m)->spec.layers.back();
  const model::WeightView& w = last.is_moe ? last.experts[0].gate : last.ffn_gate;
  EXPECT_EQ(w.type, GgmlType::kFP4_PACKED);
  EXPECT_EQ(w.scale_type, GgmlType::kF8_E4M3);
  EXPECT_EQ(w.scale_block[1], 16);
  EXPECT_NE(o.modelopt ? w.scale_mul : w.scale_div, 1.0f);
  if (!o.quantize) {
    EXPECT_EQ(last.wo.type, GgmlType::kFP4_PACKED);
  }
  const auto p = stride_prompt(static_cast<int32_t>((*m)->spec.n_vocab));
  expect_quantized_logits(prompt_logits(*m, p), prompt_logits(copy.twin_path(), p),
                          prompt_logits(src, p), trained ? 0.3 : 0.0);
}

TEST(Nvfp4Model, ModelOptEqualsItsExactTwin) {
  TROUPE_SHARED_OR_SKIP(shared);
  Nvfp4Options o;
  check_model(shared, "deepseek2", o);  // every linear layer, MLA's kv_b_proj and routers too
  o.side_file = true;
  o.quantize = routed_expert;
  check_model(shared, "mixtral-moe", o);
}

TEST(Nvfp4Model, CompressedTensorsEqualsItsExactTwin) {
  TROUPE_SHARED_OR_SKIP(shared);
  Nvfp4Options o;
  o.modelopt = false;
  check_model(shared, "qwen3moe", o);
  o.quantize = routed_expert;
  check_model(shared, "deepseek2", o);
}

TEST(Nvfp4Model, DenseLlamaEqualsItsExactTwin) {
  TROUPE_SHARED_OR_SKIP(shared);
  Nvfp4Options o;
  check_model(shared, "stories260K", o, /*trained=*/true);
  o.modelopt = false;
  check_model(shared, "stories260K", o, /*trained=*/true);
}

// A node's weights in memory: the FP4 views copied, those of whole 128-column groups tiled where
// the kernels read tiles (the scales stay where they were), same logits.
TEST(Nvfp4Model, WeightsCopiedToMemoryGiveTheSameLogits) {
  TROUPE_SHARED_OR_SKIP(shared);
  for (const bool modelopt : {true, false}) {
    SCOPED_TRACE(modelopt ? "modelopt" : "compressed-tensors");
    Nvfp4Options o;
    o.modelopt = modelopt;
    const Nvfp4Copy copy(shared + "/models/hf/deepseek2", o);
    auto mapped = model::load_model(copy.nvfp4_path());
    ASSERT_TRUE(mapped.has_value()) << mapped.error().message;
    const model::TileTypes tiles = tiled_weight_types();
    auto in_memory = model::copy_weights_to_memory(*mapped, {}, 2, tiles);
    ASSERT_TRUE(in_memory.has_value()) << in_memory.error().message;
    const model::WeightView& g = (*in_memory)->spec.layers.back().experts[0].gate;
    EXPECT_EQ(g.type, GgmlType::kFP4_PACKED);
    EXPECT_NE(g.data, (*mapped)->spec.layers.back().experts[0].gate.data);  // copied
    EXPECT_EQ(g.layout, tiles.has(GgmlType::kFP4_PACKED) ? model::WeightLayout::kTiles16
                                                         : model::WeightLayout::kRows)
        << simd_level();
    EXPECT_EQ(g.scale_mul, (*mapped)->spec.layers.back().experts[0].gate.scale_mul);
    EXPECT_EQ(g.scale_div, (*mapped)->spec.layers.back().experts[0].gate.scale_div);
    const auto p = stride_prompt(static_cast<int32_t>((*mapped)->spec.n_vocab));
    const auto a = prompt_logits(*mapped, p), b = prompt_logits(*in_memory, p);
    ASSERT_FALSE(a.empty());
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  }
}

}  // namespace
}  // namespace troupe::compute
