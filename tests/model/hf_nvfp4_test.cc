// The Hugging Face reader's NVFP4 checkpoints (ModelOpt's and compressed-tensors' forms): an
// NVFP4 copy of a shared model loads as FP4_PACKED views straight into the file, with E4M3 scales
// per 16 columns and the tensor's global scale, whose rows are its exact twin's; every malformed
// declaration or tensor gets a message naming the file and the problem.
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/model.h"
#include "model/safetensors.h"
#include "tests/nvfp4_model.h"
#include "tests/test_support.h"

namespace troupe::model {
namespace {

using nlohmann::json;
using testing::expect_same_rows;
using testing::Nvfp4Copy;
using testing::Nvfp4Options;
using testing::StTensor;

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE((haystack).find(needle), std::string::npos) << "message: " << (haystack)

std::string load_error(const std::string& dir) {
  auto m = load_hf_model(dir);
  return m ? std::string() : m.error().message;
}

float scalar(const SafetensorsTensor* t) {
  float f;
  std::memcpy(&f, t->data, 4);
  return f;
}

TEST(HfNvfp4, LoadsViewsIntoTheFileWhoseRowsAreTheTwins) {
  TROUPE_SHARED_OR_SKIP(shared);
  for (const bool modelopt : {true, false}) {
    SCOPED_TRACE(modelopt ? "modelopt" : "compressed-tensors");
    Nvfp4Options o;
    o.modelopt = modelopt;
    const Nvfp4Copy copy(shared + "/models/hf/deepseek2", o);
    auto q = load_hf_model(copy.nvfp4_path());
    ASSERT_TRUE(q.has_value()) << q.error().message;
    auto twin = load_hf_model(copy.twin_path());
    ASSERT_TRUE(twin.has_value()) << twin.error().message;
    const ModelSpec &a = (*q)->spec, &b = (*twin)->spec;
    const LayerSpec &la = a.layers[1], &lb = b.layers[1];
    const WeightView& g = la.experts[3].gate;
    EXPECT_EQ(g.type, GgmlType::kFP4_PACKED);
    EXPECT_EQ(g.scale_type, GgmlType::kF8_E4M3);
    EXPECT_EQ(g.scale_block[0], 1);
    EXPECT_EQ(g.scale_block[1], 16);
    EXPECT_EQ(g.scale_stride, a.n_embd / 16);
    EXPECT_EQ(g.nbytes(), static_cast<uint64_t>(g.rows() * g.cols() / 2));
    const auto files = std::static_pointer_cast<const SafetensorsSet>((*q)->storage.front());
    const std::string x = "model.layers.1.mlp.experts.3.gate_proj.weight";
    const std::string base = "model.layers.1.mlp.experts.3.gate_proj";
    EXPECT_EQ(g.data, files->find(modelopt ? x : x + "_packed")->data);
    EXPECT_EQ(g.scales, files->find(base + ".weight_scale")->data);
    if (modelopt) {
      EXPECT_EQ(g.scale_mul, scalar(files->find(base + ".weight_scale_2")));
      EXPECT_EQ(g.scale_div, 1.0f);
    } else {
      EXPECT_EQ(g.scale_div, scalar(files->find(base + ".weight_global_scale")));
      EXPECT_EQ(g.scale_mul, 1.0f);
    }
    for (const auto& [v, w] : std::vector<std::pair<const WeightView*, const WeightView*>>{
             {&g, &lb.experts[3].gate},
             {&la.experts[0].down, &lb.experts[0].down},
             {&la.wkv_a, &lb.wkv_a},
             {&la.wo, &lb.wo},
             {&a.output, &b.output},
             {&la.wk_b, &lb.wk_b},
             {&la.router, &lb.router},
             {&la.shared.up, &lb.shared.up}})
      expect_same_rows(*v, *w);
    EXPECT_EQ(la.wo.type, GgmlType::kFP4_PACKED);
    EXPECT_EQ(la.wk_b.type, GgmlType::kF32);    // per-head transposes: exact f32
    EXPECT_EQ(la.router.type, GgmlType::kF32);  // the router was quantized too: converted
    EXPECT_EQ(a.token_embd.type, GgmlType::kF32);
  }
}

// A small NVFP4 copy of stories260K whose config and tensors a test then edits.
class BadNvfp4 : public ::testing::TestWithParam<bool> {  // param: ModelOpt's form
 protected:
  void SetUp() override {
    const std::string shared = testing::shared_dir();
    if (shared.empty()) {
      if (testing::shared_required()) FAIL() << "../shared is required here";
      GTEST_SKIP() << "../shared not found (set TROUPE_SHARED_DIR); skipping";
    }
    Nvfp4Options o;
    o.modelopt = GetParam();
    copy_ = std::make_unique<Nvfp4Copy>(shared + "/models/hf/stories260K", o);
    ASSERT_TRUE(load_error(path()).empty()) << load_error(path());
    std::ifstream in(path() + "/config.json");
    cfg_ = json::parse(in);
    auto st = SafetensorsFile::open(path() + "/model.safetensors");
    ASSERT_TRUE(st.has_value());
    for (const SafetensorsTensor& t : (*st)->tensors())
      tensors_.push_back(
          {t.name, t.dtype, t.shape, std::string(reinterpret_cast<const char*>(t.data), t.nbytes)});
  }
  const std::string& path() const { return copy_->nvfp4_path(); }
  /// The load error after `edit` changed config.json's quantization_config (null: removed).
  std::string with_quant(const std::function<void(json&)>& edit) {
    json c = cfg_;
    edit(c["quantization_config"]);
    if (c["quantization_config"].is_null()) c.erase("quantization_config");
    copy_->nvfp4_dir().write("config.json", c.dump());
    return load_error(path());
  }
  /// The load error after `edit` changed the tensor list.
  std::string with_tensors(const std::function<void(std::vector<StTensor>&)>& edit) {
    std::vector<StTensor> t = tensors_;
    edit(t);
    copy_->nvfp4_dir().write("model.safetensors", testing::safetensors_image(t));
    return load_error(path());
  }
  static StTensor& find(std::vector<StTensor>& t, const std::string& name) {
    for (StTensor& x : t)
      if (x.name == name) return x;
    ADD_FAILURE() << "no " << name;
    return t.front();
  }
  static void erase(std::vector<StTensor>& t, const std::string& name) {
    std::erase_if(t, [&](const StTensor& x) { return x.name == name; });
  }
  std::string global_name() const {
    return kBase + (GetParam() ? ".weight_scale_2" : ".weight_global_scale");
  }
  std::string data_name() const { return kBase + (GetParam() ? ".weight" : ".weight_packed"); }
  static inline const std::string kBase = "model.layers.2.self_attn.q_proj";
  std::unique_ptr<Nvfp4Copy> copy_;
  json cfg_;
  std::vector<StTensor> tensors_;
};

TEST_P(BadNvfp4, TensorsWithoutTheDeclaration) {
  const std::string e = with_quant([](json& q) { q = nullptr; });
  if (GetParam()) {  // a U8 weight: the reader names what it reads
    EXPECT_HAS(e, "model.safetensors");
    EXPECT_HAS(e, "'model.layers.0.self_attn.q_proj.weight' has dtype U8");
    EXPECT_HAS(e, "U8 NVFP4");
  } else {  // packed without compressed-tensors' config
    EXPECT_HAS(e, "is packed but");
    EXPECT_HAS(e, "quantization_config");
  }
}

TEST_P(BadNvfp4, Declarations) {
  if (GetParam()) {
    EXPECT_HAS(with_quant([](json& q) { q["quant_algo"] = "FP8"; }),
               "quantization_config.quant_algo is \"FP8\"; troupe reads ModelOpt's \"NVFP4\"");
    EXPECT_HAS(with_quant([](json& q) { q.erase("quant_algo"); }), "quant_algo is (absent)");
    EXPECT_HAS(with_quant([](json& q) { q["group_size"] = 32; }),
               "quantization_config.group_size is 32; NVFP4 scales groups of 16 columns");
    EXPECT_HAS(with_quant([](json& q) {
                 q["config_groups"] = {{"group_0", {{"weights", {{"group_size", 128}}}}}};
               }),
               "quantization_config.config_groups.group_0.weights.group_size is 128");
    // ModelOpt's side file, with config.json declaring nothing.
    json c = cfg_;
    c.erase("quantization_config");
    copy_->nvfp4_dir().write("config.json", c.dump());
    copy_->nvfp4_dir().write("hf_quant_config.json", R"({"producer": {"name": "modelopt"}})");
    std::string e = load_error(path());
    EXPECT_HAS(e, "hf_quant_config.json: no \"quantization\" object");
    copy_->nvfp4_dir().write("hf_quant_config.json",
                             R"({"quantization": {"quant_algo": "W4A8_AWQ"}})");
    e = load_error(path());
    EXPECT_HAS(e, "hf_quant_config.json: quantization.quant_algo is \"W4A8_AWQ\"");
    copy_->nvfp4_dir().write("hf_quant_config.json",
                             R"({"quantization": {"quant_algo": "NVFP4", "group_size": 16}})");
    EXPECT_EQ(load_error(path()), "");
  } else {
    auto weights = [](json& q) -> json& { return q["config_groups"]["group_0"]["weights"]; };
    EXPECT_HAS(with_quant([&](json& q) { weights(q)["strategy"] = "group"; }),
               "config_groups.group_0.weights.strategy is \"group\"; NVFP4 weights are "
               "\"tensor_group\"");
    EXPECT_HAS(with_quant([&](json& q) { weights(q)["group_size"] = 32; }),
               "config_groups.group_0.weights.group_size is 32; NVFP4 scales groups of 16");
    EXPECT_HAS(with_quant([&](json& q) { weights(q)["symmetric"] = false; }), "asymmetric nvfp4");
    EXPECT_HAS(with_quant([](json& q) { q["format"] = "float-quantized"; }),
               "config_groups.group_0.format \"float-quantized\" is not supported for 4-bit "
               "float weights");
    EXPECT_HAS(with_quant([](json& q) {
                 q["config_groups"]["group_0"]["output_activations"] = {{"num_bits", 4}};
               }),
               "quantizes output activations");
  }
}

TEST_P(BadNvfp4, Tensors) {
  const std::string scale = kBase + ".weight_scale";
  EXPECT_HAS(with_tensors([&](auto& t) { erase(t, global_name()); }),
             "NVFP4 weight '" + data_name() + "' has no '" + global_name() + "'");
  EXPECT_HAS(with_tensors([&](auto& t) { erase(t, scale); }), "has no '" + scale + "'");
  EXPECT_HAS(with_tensors([&](auto& t) {
               StTensor& s = find(t, scale);
               s.dtype = "U8";
             }),
             "scales '" + scale + "' are U8 [64, 4]; NVFP4's 64 x 64 weights need F8_E4M3 [64, 4]");
  EXPECT_HAS(with_tensors([&](auto& t) {
               StTensor& d = find(t, data_name());
               d.shape = {32, 64};
             }),
             "'" + data_name() +
                 "' is U8 [32, 64]; 64 x 64 FP4 values two to a byte need U8 "
                 "[64, 32]");
  EXPECT_HAS(with_tensors([&](auto& t) {
               StTensor& g = find(t, global_name());
               g.shape = {2};
               g.bytes += g.bytes;
             }),
             "global scale '" + global_name() + "' is F32 [2]; NVFP4 needs one F32 value");
  for (const float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), 0.0f}) {
    const std::string e =
        with_tensors([&](auto& t) { std::memcpy(find(t, global_name()).bytes.data(), &bad, 4); });
    if (bad == 0.0f && GetParam()) {  // a zero multiplier is a valid (all-zero) matrix
      EXPECT_EQ(e, "");
    } else {
      EXPECT_HAS(e, "global scale '" + global_name() + "' is ");
      EXPECT_HAS(e, GetParam() ? "must be finite" : "must be finite and nonzero");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Forms, BadNvfp4, ::testing::Values(true, false), [](const auto& info) {
  return std::string(info.param ? "ModelOpt" : "CompressedTensors");
});

}  // namespace
}  // namespace troupe::model
