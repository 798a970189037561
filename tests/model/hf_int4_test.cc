// The Hugging Face reader's compressed-tensors int4 ("pack-quantized") checkpoints: an int4 copy
// of a shared model loads as I4_PACKED views straight into the file whose rows are the exact
// products q * scale; every malformed quantization_config or packed tensor gets a message naming
// the file and the problem; the GGUF writer refuses troupe's in-memory type.
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/gguf_writer.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "tests/int4_model.h"
#include "tests/test_support.h"

namespace troupe::model {
namespace {

using nlohmann::json;
using testing::expect_same_rows;
using testing::Int4Copy;
using testing::Int4Options;
using testing::StTensor;

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE((haystack).find(needle), std::string::npos) << "message: " << (haystack)

std::string load_error(const std::string& dir) {
  auto m = load_hf_model(dir);
  return m ? std::string() : m.error().message;
}

TEST(HfInt4, LoadsPackedViewsWhoseRowsAreTheExactProducts) {
  TROUPE_SHARED_OR_SKIP(shared);
  for (const std::string scale : {"BF16", "F16", "F32"}) {
    SCOPED_TRACE(scale);
    Int4Options o;
    o.scale_dtype = scale;
    o.shape_dtype = scale == "F32" ? "I64" : "I32";
    const Int4Copy copy(shared + "/models/hf/deepseek2", o);
    auto i4 = load_hf_model(copy.int4_path());
    ASSERT_TRUE(i4.has_value()) << i4.error().message;
    auto twin = load_hf_model(copy.twin_path());
    ASSERT_TRUE(twin.has_value()) << twin.error().message;
    const ModelSpec &a = (*i4)->spec, &b = (*twin)->spec;
    const LayerSpec &la = a.layers[1], &lb = b.layers[1];
    // Zero-copy views into the file, a scale per 32 columns in the stored type.
    const WeightView& g = la.experts[3].gate;
    EXPECT_EQ(g.type, GgmlType::kI4_PACKED);
    EXPECT_EQ(type_name(g.scale_type), scale == "BF16" ? "bf16" : scale == "F16" ? "f16" : "f32");
    EXPECT_EQ(g.scale_block[0], 1);
    EXPECT_EQ(g.scale_block[1], 32);
    EXPECT_EQ(g.scale_stride, a.n_embd / 32);
    EXPECT_EQ(g.nbytes(), static_cast<uint64_t>(g.rows() * g.cols() / 2));
    // (load_hf_model keeps the mapped files first in the model's storage.)
    const auto files = std::static_pointer_cast<const SafetensorsSet>((*i4)->storage.front());
    const std::string x = "model.layers.1.mlp.experts.3.gate_proj.weight";
    EXPECT_EQ(g.data, files->find(x + "_packed")->data);
    EXPECT_EQ(g.scales, files->find(x + "_scale")->data);
    for (const auto& [x, y] : std::vector<std::pair<const WeightView*, const WeightView*>>{
             {&g, &lb.experts[3].gate},
             {&la.experts[0].down, &lb.experts[0].down},
             {&la.wkv_a, &lb.wkv_a},
             {&la.wo, &lb.wo},
             {&a.output, &b.output},
             {&la.wk_b, &lb.wk_b},
             {&la.wv_b, &lb.wv_b},
             {&la.shared.up, &lb.shared.up}})
      expect_same_rows(*x, *y);
    EXPECT_EQ(la.wo.type, GgmlType::kI4_PACKED);
    EXPECT_EQ(la.wk_b.type, GgmlType::kF32);  // per-head transposes: exact f32
    EXPECT_EQ(a.token_embd.type, GgmlType::kF32);
    EXPECT_EQ(la.router.type, GgmlType::kF32);
  }
}

TEST(HfInt4, PackedRouterAndChannelScalesBecomeWhatTheEngineReads) {
  TROUPE_SHARED_OR_SKIP(shared);
  Int4Options o;
  o.group = 0;  // one scale per row
  o.write_shape = false;
  const Int4Copy copy(shared + "/models/hf/mixtral-moe", o);
  auto i4 = load_hf_model(copy.int4_path());
  ASSERT_TRUE(i4.has_value()) << i4.error().message;
  auto twin = load_hf_model(copy.twin_path());
  ASSERT_TRUE(twin.has_value()) << twin.error().message;
  const LayerSpec &la = (*i4)->spec.layers[0], &lb = (*twin)->spec.layers[0];
  EXPECT_EQ(la.experts[1].up.type, GgmlType::kI4_PACKED);
  EXPECT_EQ(la.experts[1].up.scale_block[1], la.experts[1].up.cols());
  EXPECT_EQ(la.router.type, GgmlType::kF32);  // the router was packed too: converted
  expect_same_rows(la.router, lb.router);
  expect_same_rows(la.experts[1].up, lb.experts[1].up);
  expect_same_rows(la.wq, lb.wq);
}

// A small int4 copy of stories260K whose config.json and tensors a test then edits.
class BadInt4 : public ::testing::Test {
 protected:
  void SetUp() override {
    shared_ = testing::shared_dir();
    if (shared_.empty()) {
      if (testing::shared_required()) FAIL() << "../shared is required here";
      GTEST_SKIP() << "../shared not found (set TROUPE_SHARED_DIR); skipping";
    }
    copy_ = std::make_unique<Int4Copy>(shared_ + "/models/hf/stories260K");
    ASSERT_TRUE(load_error(copy_->int4_path()).empty()) << load_error(copy_->int4_path());
    std::ifstream in(copy_->int4_path() + "/config.json");
    cfg_ = json::parse(in);
    auto st = SafetensorsFile::open(copy_->int4_path() + "/model.safetensors");
    ASSERT_TRUE(st.has_value());
    for (const SafetensorsTensor& t : (*st)->tensors())
      tensors_.push_back(
          {t.name, t.dtype, t.shape, std::string(reinterpret_cast<const char*>(t.data), t.nbytes)});
  }
  /// The load error after `edit` changed config.json's quantization_config (erased: removed).
  std::string with_quant(const std::function<void(json&)>& edit) {
    json c = cfg_;
    edit(c["quantization_config"]);
    if (c["quantization_config"].is_null()) c.erase("quantization_config");
    copy_->int4_dir().write("config.json", c.dump());
    return load_error(copy_->int4_path());
  }
  json& weights(json& q) { return q["config_groups"]["group_0"]["weights"]; }
  /// The load error after `edit` changed the tensor list.
  std::string with_tensors(const std::function<void(std::vector<StTensor>&)>& edit) {
    std::vector<StTensor> t = tensors_;
    edit(t);
    copy_->int4_dir().write("model.safetensors", testing::safetensors_image(t));
    return load_error(copy_->int4_path());
  }
  StTensor& find(std::vector<StTensor>& t, const std::string& name) {
    for (StTensor& x : t)
      if (x.name == name) return x;
    ADD_FAILURE() << "no " << name;
    return t.front();
  }
  std::string shared_;
  std::unique_ptr<Int4Copy> copy_;
  json cfg_;
  std::vector<StTensor> tensors_;
};

const std::string kWq = "model.layers.2.self_attn.q_proj.weight";

TEST_F(BadInt4, PackedTensorsWithoutQuantizationConfig) {
  const std::string e = with_quant([](json& q) { q = nullptr; });
  EXPECT_HAS(e, "_packed' is packed but ");
  EXPECT_HAS(e, "config.json has no compressed-tensors \"pack-quantized\" quantization_config");
}

TEST_F(BadInt4, QuantizationConfigFields) {
  EXPECT_HAS(with_quant([](json& q) { q["format"] = "naive-quantized"; }),
             "config.json: compressed-tensors format \"naive-quantized\" is not supported");
  EXPECT_HAS(with_quant([](json& q) { q["format"] = 3; }),
             "config.json: quantization_config.format must be a string, got 3");
  EXPECT_HAS(with_quant([&](json& q) { weights(q)["strategy"] = json::array(); }),
             "config_groups.group_0.weights.strategy must be a string, got []");
  EXPECT_HAS(with_quant([](json& q) { q["quantization_status"] = "frozen"; }),
             "quantization_status \"frozen\": the weights are not stored compressed");
  EXPECT_HAS(with_quant([](json& q) {
               q["sparsity_config"] = {{"format", "sparse-bitmask"}};
             }),
             "compressed-tensors sparsity_config is not supported");
  EXPECT_HAS(with_quant([](json& q) {
               q["kv_cache_scheme"] = {{"num_bits", 8}};
             }),
             "compressed-tensors kv_cache_scheme is not supported");
  EXPECT_HAS(with_quant([](json& q) { q.erase("config_groups"); }),
             "compressed-tensors quantization_config needs config_groups");
  EXPECT_HAS(with_quant([&](json& q) { weights(q)["num_bits"] = 8; }),
             "config_groups.group_0.weights.num_bits is 8; troupe reads 4-bit");
  EXPECT_HAS(with_quant([&](json& q) { weights(q)["type"] = "float"; }),
             "group_0.format \"pack-quantized\" is not supported for 4-bit float weights");
  EXPECT_HAS(with_quant([&](json& q) {
               weights(q)["type"] = "float";
               weights(q)["num_bits"] = 8;
             }),
             "group_0.format \"pack-quantized\" is not supported for float weights");
  EXPECT_HAS(with_quant([&](json& q) { weights(q)["type"] = "uint"; }),
             "weights.type is \"uint\"; troupe reads \"int\" (4-bit) and \"float\" (8-bit)");
  EXPECT_HAS(with_quant([&](json& q) { weights(q)["symmetric"] = false; }),
             "asymmetric int4 (with zero points) is not supported");
  EXPECT_HAS(with_quant([&](json& q) { weights(q)["strategy"] = "tensor"; }),
             "weights.strategy is \"tensor\"; troupe reads \"group\" and \"channel\"");
  EXPECT_HAS(with_quant([&](json& q) { weights(q)["group_size"] = 8; }),
             "weights.group_size is 8; troupe needs a positive multiple of 16");
  EXPECT_HAS(with_quant([&](json& q) { weights(q)["actorder"] = "group"; }),
             "weights.actorder \"group\" is not supported");
  EXPECT_HAS(with_quant([&](json& q) { weights(q)["dynamic"] = true; }),
             "weights.dynamic is true; weights must be quantized ahead of time");
  EXPECT_HAS(with_quant([](json& q) {
               q["config_groups"]["group_0"]["input_activations"] = {{"num_bits", 8}};
             }),
             "group_0 quantizes activations; troupe reads weight-only (W4A16) int4 schemes");
  EXPECT_HAS(with_quant([&](json& q) {
               json g = q["config_groups"]["group_0"];
               g["weights"]["group_size"] = 64;
               q["config_groups"]["group_1"] = g;
             }),
             "config groups quantize with different group sizes (32 and 64 columns)");
  EXPECT_HAS(with_quant([](json& q) { q["config_groups"]["group_0"]["format"] = "int-quantized"; }),
             "group_0.format \"int-quantized\" is not supported");
  // What real checkpoints also write: accepted.
  EXPECT_EQ(with_quant([&](json& q) {
              q["format"] = "mixed-precision";
              q["config_groups"]["group_0"]["format"] = "pack-quantized";
              q["transform_config"] = json::object();
              weights(q)["actorder"] = "static";
            }),
            "");
}

TEST_F(BadInt4, PackedTensors) {
  const std::string base = kWq.substr(0, kWq.size() - 7);
  const std::string p = base + ".weight_packed", s = base + ".weight_scale",
                    sh = base + ".weight_shape";
  EXPECT_HAS(with_tensors([&](auto& t) { find(t, p).dtype = "F32"; }),
             "'" + p +
                 "' is F32 [64, 8]; 64 x 64 int4 values packed eight to a word need I32 "
                 "[64, 8]");
  EXPECT_HAS(with_tensors([&](auto& t) { std::erase_if(t, [&](auto& x) { return x.name == s; }); }),
             "packed weight '" + p + "' has no scales ('" + s + "' is missing)");
  EXPECT_HAS(with_tensors([&](auto& t) {
               StTensor& x = find(t, s);
               x.shape = {128};
             }),
             "scales '" + s +
                 "' have shape [128]; 64 x 64 weights with a scale per 32 columns "
                 "need [64, 2]");
  EXPECT_HAS(with_tensors([&](auto& t) { find(t, s).dtype = "I16"; }),
             "scales '" + s + "' have dtype I16; troupe reads F32, BF16 or F16 scales");
  EXPECT_HAS(with_tensors([&](auto& t) {
               t.push_back({base + ".weight_zero_point", "I32", {64, 1}, std::string(256, '\0')});
             }),
             "'" + base + ".weight_zero_point' exists: asymmetric int4 weights are not supported");
  EXPECT_HAS(with_tensors([&](auto& t) {
               t.push_back({base + ".weight_g_idx", "I32", {64}, std::string(256, '\0')});
             }),
             "'" + base + ".weight_g_idx' exists: reordered int4 weights are not supported");
  EXPECT_HAS(with_tensors([&](auto& t) {
               const int32_t dims[2] = {64, 32};
               find(t, sh).bytes.assign(reinterpret_cast<const char*>(dims), 8);
             }),
             "'" + base + ".weight_shape' is I32 [2] holding [64, 32]; the model needs [64, 64]");
  // Neither the weight nor its packed form: the usual message.
  EXPECT_HAS(with_tensors([&](auto& t) { std::erase_if(t, [&](auto& x) { return x.name == p; }); }),
             "missing tensor '" + kWq + "'");
}

TEST_F(BadInt4, ColumnsTheGroupDoesNotDivide) {
  // stories260K's q_proj has 64 columns; groups of 48 do not divide them.
  EXPECT_HAS(with_quant([&](json& q) { weights(q)["group_size"] = 48; }),
             "has 64 columns; packed int4 needs a multiple of 16 and of the group size 48");
}

TEST(Int4Gguf, InMemoryTypeIsNotAGgufType) {
  GgufWriter w;
  const int64_t shape[1] = {16};
  const std::vector<uint8_t> bytes(8);
  auto r = w.add_tensor("w", GgmlType::kI4_PACKED, shape, bytes);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().message, "tensor 'w': type i4_packed has no GGUF id");
}

}  // namespace
}  // namespace troupe::model
