// FP8 E4M3 decoding and the Hugging Face reader's block-scaled FP8 checkpoints: every code
// against the format's definition; an FP8 copy of a shared model loads as FP8 views whose rows
// are the exact products fp8 * scale; every malformed quantization_config or scale grid gets a
// message naming the file and the problem; the GGUF reader and writer refuse troupe's in-memory
// type.
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/gguf_writer.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "tests/fp8_model.h"
#include "tests/test_support.h"

namespace troupe::model {
namespace {

using nlohmann::json;
using testing::Fp8Copy;
using testing::StTensor;
using testing::TempDir;

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE((haystack).find(needle), std::string::npos) << "message: " << (haystack)

TEST(Fp8, EveryCodeDecodesAsTheFormatDefines) {
  for (int b = 0; b < 256; ++b) {
    const float got = fp8_e4m3_to_fp32(static_cast<uint8_t>(b));
    const double want = testing::e4m3_value(static_cast<uint8_t>(b));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << b;
    } else {
      EXPECT_EQ(static_cast<double>(got), want) << b;
      EXPECT_EQ(std::signbit(got), (b & 0x80) != 0) << b;
    }
  }
  // Anchors from the OCP FP8 specification.
  EXPECT_EQ(fp8_e4m3_to_fp32(0x7e), 448.f);                // largest
  EXPECT_EQ(fp8_e4m3_to_fp32(0x38), 1.f);                  // exponent 7 = bias
  EXPECT_EQ(fp8_e4m3_to_fp32(0x08), std::ldexp(1.f, -6));  // smallest normal
  EXPECT_EQ(fp8_e4m3_to_fp32(0x01), std::ldexp(1.f, -9));  // smallest subnormal
  EXPECT_EQ(fp8_e4m3_to_fp32(0xc0), -2.f);
}

// model::fp32_to_fp8_e4m3 (the benches' requantization) against the tests' own encoder.
TEST(Fp8, EncoderAgreesWithTheTestEncoder) {
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7f) != 0x7f) {
      EXPECT_EQ(fp32_to_fp8_e4m3(fp8_e4m3_to_fp32(static_cast<uint8_t>(b))), b) << b;
    }
  }
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> e(-14.f, 10.f);
  for (int i = 0; i < 200000; ++i) {
    const float v = std::exp2(e(rng)) * (rng() % 2 ? 1.f : -1.f);
    ASSERT_EQ(fp32_to_fp8_e4m3(v), testing::e4m3_nearest(v)) << v;
  }
  // Every midpoint of two neighbouring codes goes to the even one.
  for (int b = 0; b < 0x7e; ++b) {
    const float mid = (fp8_e4m3_to_fp32(static_cast<uint8_t>(b)) +
                       fp8_e4m3_to_fp32(static_cast<uint8_t>(b + 1))) /
                      2;
    EXPECT_EQ(fp32_to_fp8_e4m3(mid), b % 2 == 0 ? b : b + 1) << b;
  }
  EXPECT_EQ(fp32_to_fp8_e4m3(1e9f), 0x7e);  // saturates
  EXPECT_EQ(fp32_to_fp8_e4m3(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(fp32_to_fp8_e4m3(std::nanf("")) & 0x7f, 0x7f);
}

TEST(Fp8, TestEncoderRoundsToNearestEven) {
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7f) != 0x7f) {
      EXPECT_EQ(testing::e4m3_nearest(testing::e4m3_value(static_cast<uint8_t>(b))), b);
    }
  }
  EXPECT_EQ(testing::e4m3_nearest(1000.0), 0x7e);  // saturates
  EXPECT_EQ(testing::e4m3_nearest(1.0625), 0x38);  // halfway 1 and 1.125: even code
  EXPECT_EQ(testing::e4m3_nearest(1.1875), 0x3a);  // halfway 1.125 and 1.25: even code
}

// ---- loading ----

std::string load_error(const std::string& dir) {
  auto m = load_hf_model(dir);
  return m ? std::string() : m.error().message;
}

TEST(HfFp8, LoadsFp8ViewsWhoseRowsAreTheExactProducts) {
  TROUPE_SHARED_OR_SKIP(shared);
  const Fp8Copy copy(shared + "/models/hf/deepseek2", 16, 32);
  auto fp8 = load_hf_model(copy.fp8_path());
  ASSERT_TRUE(fp8.has_value()) << fp8.error().message;
  auto twin = load_hf_model(copy.twin_path());
  ASSERT_TRUE(twin.has_value()) << twin.error().message;
  const ModelSpec &a = (*fp8)->spec, &b = (*twin)->spec;
  const LayerSpec &la = a.layers[1], &lb = b.layers[1];
  // Views straight into the file (zero-copy), with the block shape and one scale row per block.
  const WeightView& g = la.experts[3].gate;
  EXPECT_EQ(g.type, GgmlType::kF8_E4M3);
  EXPECT_EQ(g.scale_block[0], 16);
  EXPECT_EQ(g.scale_block[1], 32);
  EXPECT_EQ(g.scale_stride, (a.n_embd + 31) / 32);
  EXPECT_EQ(g.nbytes(), static_cast<uint64_t>(g.rows() * g.cols()));
  for (const auto& [x, y] : std::vector<std::pair<const WeightView*, const WeightView*>>{
           {&g, &lb.experts[3].gate},
           {&la.experts[0].down, &lb.experts[0].down},
           {&la.wkv_a, &lb.wkv_a},
           {&la.wo, &lb.wo},
           {&a.token_embd, &b.token_embd},
           {&la.wk_b, &lb.wk_b},
           {&la.router, &lb.router}})
    testing::expect_same_rows(*x, *y);
  EXPECT_EQ(la.wk_b.type, GgmlType::kF32);
  EXPECT_EQ(la.router.type, GgmlType::kF32);
  EXPECT_EQ(la.attn_norm.type, GgmlType::kF32);
}

// A small FP8 copy of stories260K whose config.json and tensors a test then edits.
class BadFp8 : public ::testing::Test {
 protected:
  void SetUp() override {
    shared_ = testing::shared_dir();
    if (shared_.empty()) {
      if (testing::shared_required()) FAIL() << "../shared is required here";
      GTEST_SKIP() << "../shared not found (set TROUPE_SHARED_DIR); skipping";
    }
    copy_ = std::make_unique<Fp8Copy>(shared_ + "/models/hf/stories260K", 128, 128);
    ASSERT_TRUE(load_error(copy_->fp8_path()).empty()) << load_error(copy_->fp8_path());
    std::ifstream in(copy_->fp8_path() + "/config.json");
    cfg_ = json::parse(in);
    auto st = SafetensorsFile::open(copy_->fp8_path() + "/model.safetensors");
    ASSERT_TRUE(st.has_value());
    for (const SafetensorsTensor& t : (*st)->tensors())
      tensors_.push_back(
          {t.name, t.dtype, t.shape, std::string(reinterpret_cast<const char*>(t.data), t.nbytes)});
  }
  /// The load error after config.json's quantization_config is replaced (null: removed).
  std::string with_quant(const json& q) {
    json c = cfg_;
    if (q.is_null())
      c.erase("quantization_config");
    else
      c["quantization_config"] = q;
    copy_->fp8_dir().write("config.json", c.dump());
    return load_error(copy_->fp8_path());
  }
  /// The load error after `edit` changed the tensor list.
  std::string with_tensors(const std::function<void(std::vector<StTensor>&)>& edit) {
    std::vector<StTensor> t = tensors_;
    edit(t);
    copy_->fp8_dir().write("model.safetensors", testing::safetensors_image(t));
    return load_error(copy_->fp8_path());
  }
  StTensor& find(std::vector<StTensor>& t, const std::string& name) {
    for (StTensor& x : t)
      if (x.name == name) return x;
    ADD_FAILURE() << "no " << name;
    return t.front();
  }
  std::string shared_;
  std::unique_ptr<Fp8Copy> copy_;
  json cfg_;
  std::vector<StTensor> tensors_;
};

const char* kWq = "model.layers.2.self_attn.q_proj.weight";

TEST_F(BadFp8, Fp8TensorsWithoutQuantizationConfig) {
  EXPECT_HAS(with_quant(nullptr), "' is F8_E4M3 but ");
  EXPECT_HAS(with_quant(nullptr), "config.json has no quantization_config \"fp8\"");
}

TEST_F(BadFp8, QuantizationConfigFields) {
  EXPECT_HAS(with_quant(json::array()), "config.json: quantization_config must be an object");
  EXPECT_HAS(with_quant({{"fmt", "e4m3"}}),
             "quantization_config.quant_method is missing or not a string");
  EXPECT_HAS(with_quant({{"quant_method", "gptq"}, {"bits", 4}}),
             "quantization_config.quant_method 'gptq' is not supported");
  EXPECT_HAS(
      with_quant({{"quant_method", "fp8"}, {"fmt", "e5m2"}, {"weight_block_size", {128, 128}}}),
      "quantization_config.fmt \"e5m2\" is not supported (only \"e4m3\", also written "
      "\"float8_e4m3fn\")");
  // PyTorch's name for the same format, as MiniMax-M2's config writes it, with the keys
  // DeepSeek's and MiniMax's configs carry beside it.
  EXPECT_EQ(with_quant({{"quant_method", "fp8"},
                        {"fmt", "float8_e4m3fn"},
                        {"activation_scheme", "dynamic"},
                        {"modules_to_not_convert", {"gate", "e_score_correction_bias", "lm_head"}},
                        {"weight_block_size", {128, 128}}}),
            "");
  EXPECT_HAS(with_quant({{"quant_method", "fp8"}}),
             "\"fp8\" without weight_block_size (one scale per tensor) is not supported");
  EXPECT_HAS(with_quant({{"quant_method", "fp8"}, {"weight_block_size", {128}}}),
             "weight_block_size must be two integers, got [128]");
  EXPECT_HAS(with_quant({{"quant_method", "fp8"}, {"weight_block_size", {"a", 128}}}),
             "weight_block_size must be two integers");
  EXPECT_HAS(with_quant({{"quant_method", "fp8"}, {"weight_block_size", {128, 100}}}),
             "weight_block_size [128, 100] is not supported (rows >= 1, columns a positive "
             "multiple of 16)");
  EXPECT_HAS(with_quant({{"quant_method", "fp8"}, {"weight_block_size", {0, 128}}}),
             "weight_block_size [0, 128] is not supported");
}

TEST_F(BadFp8, ScaleGrids) {
  const std::string s = std::string(kWq) + "_scale_inv";
  EXPECT_HAS(with_tensors([&](auto& t) { std::erase_if(t, [&](auto& x) { return x.name == s; }); }),
             std::string("F8_E4M3 tensor '") + kWq + "' has no scales ('" + s + "' is missing)");
  EXPECT_HAS(
      with_tensors([&](auto& t) {
        StTensor& x = find(t, s);
        x.shape = {1, 2};
        x.bytes += x.bytes;
      }),
      "scales '" + s + "' have shape [1, 2]; [64, 64] with blocks of 128 x 128 needs [1, 1]");
  EXPECT_HAS(with_tensors([&](auto& t) { find(t, s).dtype = "I32"; }),
             "scales '" + s + "' have dtype I32; troupe reads F32, BF16, F16 or F8_E8M0 scales");
  for (float bad : {NAN, INFINITY, 1e30f}) {
    EXPECT_HAS(with_tensors([&](auto& t) { find(t, s).bytes = testing::f32_bytes({bad}); }),
               "scales '" + s + "': scale 0 is ");
  }
  // BF16 scales are read too (converted), and give the same model.
  EXPECT_EQ(with_tensors([&](auto& t) {
              StTensor& x = find(t, s);
              float f;
              std::memcpy(&f, x.bytes.data(), 4);
              const uint16_t h = fp32_to_bf16(f);
              x.dtype = "BF16";
              x.bytes.assign(reinterpret_cast<const char*>(&h), 2);
            }),
            "");
  // F8 for a 3-D tensor cannot carry block scales.
  EXPECT_HAS(with_tensors([&](auto& t) {
               StTensor& x = find(t, kWq);
               x.shape = {64, 8, 8};
             }),
             "has shape [64, 8, 8]");
}

// compressed-tensors "float-quantized" FP8: views with a scale per row, per tensor or per block
// ("_scale" tensors), and every malformed group or scale tensor refused by name.
TEST(HfFp8, CompressedTensorsScalesPerRowTensorAndBlock) {
  TROUPE_SHARED_OR_SKIP(shared);
  const struct {
    const char* strategy;
    int64_t br, bc, want_br, want_bc;
  } cases[] = {{"channel", 0, 0, 1, 128}, {"tensor", 0, 0, 32, 128}, {"block", 16, 32, 16, 32}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.strategy);
    const Fp8Copy copy(shared + "/models/hf/deepseek2", c.br, c.bc, nullptr, c.strategy);
    auto fp8 = load_hf_model(copy.fp8_path());
    ASSERT_TRUE(fp8.has_value()) << fp8.error().message;
    auto twin = load_hf_model(copy.twin_path());
    ASSERT_TRUE(twin.has_value()) << twin.error().message;
    const WeightView &g = (*fp8)->spec.layers[1].experts[3].gate,
                     &tg = (*twin)->spec.layers[1].experts[3].gate;
    EXPECT_EQ(g.type, GgmlType::kF8_E4M3);
    EXPECT_EQ(g.scale_block[0], c.want_br);
    EXPECT_EQ(g.scale_block[1], c.want_bc);
    testing::expect_same_rows(g, tg);
  }
}

TEST(HfFp8, CompressedTensorsFp8Refusals) {
  TROUPE_SHARED_OR_SKIP(shared);
  const Fp8Copy copy(shared + "/models/hf/stories260K", 0, 0, nullptr, "channel");
  ASSERT_EQ(load_error(copy.fp8_path()), "");
  std::ifstream in(copy.fp8_path() + "/config.json");
  const json cfg = json::parse(in);
  auto with = [&](const std::function<void(json & group)>& edit) {
    json c = cfg;
    edit(c["quantization_config"]["config_groups"]["group_0"]);
    copy.fp8_dir().write("config.json", c.dump());
    return load_error(copy.fp8_path());
  };
  EXPECT_HAS(with([](json& g) { g["input_activations"]["dynamic"] = false; }),
             "group_0.input_activations has static scales");
  EXPECT_HAS(with([](json& g) {
               g["output_activations"] = {{"num_bits", 8}};
             }),
             "group_0 quantizes output activations");
  EXPECT_HAS(with([](json& g) { g["weights"]["strategy"] = "group"; }),
             "weights.strategy is \"group\"; troupe reads \"channel\", \"tensor\" and "
             "\"block\" fp8 weights");
  EXPECT_HAS(with([](json& g) {
               g["weights"]["strategy"] = "block";
               g["weights"]["block_structure"] = {128, 100};
             }),
             "weights.block_structure is [128,100]; troupe needs [rows, columns]");
  EXPECT_HAS(with([](json& g) { g["weights"]["num_bits"] = 6; }),
             "weights.num_bits is 6; troupe reads 8-bit (E4M3) float-quantized weights");
  // 4-bit float weights are NVFP4's, which has its own format name.
  EXPECT_HAS(with([](json& g) { g["weights"]["num_bits"] = 4; }),
             "group_0.format \"float-quantized\" is not supported for 4-bit float weights (only "
             "\"nvfp4-pack-quantized\")");
  EXPECT_HAS(with([](json& g) { g["weights"]["symmetric"] = false; }),
             "asymmetric fp8 (with zero points) is not supported");
  EXPECT_HAS(with([](json& g) { g["format"] = "naive-quantized"; }),
             "group_0.format \"naive-quantized\" is not supported for float weights");
  // The scales' shape must be the strategy's: per tensor declared, per row stored.
  EXPECT_HAS(with([](json& g) { g["weights"]["strategy"] = "tensor"; }),
             "scales 'model.embed_tokens.weight_scale' have shape [512, 1]; [512, 64] with "
             "blocks of 512 x 64 needs [1, 1]");
  // Two FP8 groups must agree.
  json c = cfg;
  auto& groups = c["quantization_config"]["config_groups"];
  groups["group_1"] = groups["group_0"];
  groups["group_1"]["weights"]["strategy"] = "tensor";
  copy.fp8_dir().write("config.json", c.dump());
  EXPECT_HAS(load_error(copy.fp8_path()),
             "config groups quantize fp8 weights with different scale layouts");
}

TEST(Fp8Gguf, InMemoryTypeIsNotAGgufType) {
  GgufWriter w;
  const int64_t shape[1] = {16};
  const std::vector<uint8_t> bytes(16);
  auto r = w.add_tensor("w", GgmlType::kF8_E4M3, shape, bytes);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().message, "tensor 'w': type f8_e4m3 has no GGUF id");
}

}  // namespace
}  // namespace troupe::model
