// Test helpers for NVFP4 Hugging Face checkpoints: the test's own NVFP4 quantizer (from the
// format's definition: E2M1 values two to a byte, the low nibble first; an E4M3 scale per 16
// columns; a global f32 scale per tensor), and a writer that turns a shared Hugging Face model
// into an NVFP4 copy in ModelOpt's or compressed-tensors' form plus its exact f32 "twin" (every
// NVFP4 weight replaced by the floats E2M1(q) * float(its group's scale)). Header-only; for tests
// linking troupe_model.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/safetensors.h"
#include "tests/fp8_model.h"
#include "tests/test_support.h"

namespace troupe::testing {

/// The E2M1 magnitudes of codes 0-7 (code + 8: the negatives).
inline constexpr double kE2M1[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};

/// The E2M1 code nearest to x (on a tie the smaller magnitude), saturating at +-6.
inline int e2m1_nearest(double x) {
  const double a = std::fabs(x);
  int best = 0;
  for (int c = 1; c < 8; ++c)
    if (std::fabs(kE2M1[c] - a) < std::fabs(kE2M1[best] - a)) best = c;
  return best == 0 ? 0 : (x < 0 ? best + 8 : best);
}
/// E2M1 code c as a double; -0 (code 8) as +0.
inline double e2m1_value(int c) { return c >= 8 ? -kE2M1[c - 8] : kE2M1[c]; }

struct Nvfp4Options {
  bool modelopt = true;  // ModelOpt's tensors and config, else compressed-tensors'
  /// ModelOpt: declare the format in hf_quant_config.json (as older exports do) instead of
  /// config.json's quantization_config.
  bool side_file = false;
  /// Which 2-D "*.weight" tensors to quantize (null: every one whose columns allow it, except
  /// the embedding).
  std::function<bool(const std::string&)> quantize;
};

/// A shared Hugging Face model (F32 weights) as an NVFP4 checkpoint and its exact f32 twin. A
/// tensor's global scale is amax / (6 * 448) (ModelOpt: weight_scale_2, which multiplies) or its
/// inverse (compressed-tensors: weight_global_scale, which divides); a group's scale is the E4M3
/// code nearest amax_group / 6 in those units, q the E2M1 code nearest x / its scale.
class Nvfp4Copy {
 public:
  explicit Nvfp4Copy(const std::string& src_dir, const Nvfp4Options& o = {}) {
    auto set = model::SafetensorsSet::open_dir(src_dir);
    EXPECT_TRUE(set.has_value()) << set.error().message;
    if (!set) return;
    std::vector<StTensor> packed, twin;
    for (const auto& [name, t] : (*set)->tensors()) {
      EXPECT_EQ(t->dtype, "F32") << name;
      std::vector<float> v(static_cast<size_t>(t->num_elements()));
      std::memcpy(v.data(), t->data, v.size() * sizeof(float));
      const int64_t cols = t->shape.size() == 2 ? t->shape[1] : 0;
      const bool q =
          t->shape.size() == 2 && name.ends_with(".weight") && cols % 16 == 0 &&
          (o.quantize ? o.quantize(name) : name.find("embed_tokens") == std::string::npos);
      if (!q) {
        twin.push_back({name, "F32", t->shape, f32_bytes(v)});
        packed.push_back(twin.back());
        continue;
      }
      ++quantized_;
      const int64_t rows = t->shape[0], ng = cols / 16;
      double amax = 0;
      for (const float x : v) amax = std::max(amax, std::fabs(static_cast<double>(x)));
      const float s2 = amax > 0 ? static_cast<float>(amax / (6.0 * 448.0)) : 1.f;  // multiplies
      const float gs = amax > 0 ? static_cast<float>(6.0 * 448.0 / amax) : 1.f;    // divides
      std::string codes(static_cast<size_t>(rows * cols / 2), '\0'), scales;
      std::vector<float> exact(v.size());
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t g = 0; g < ng; ++g) {
          double ga = 0;
          for (int64_t c = 16 * g; c < 16 * g + 16; ++c)
            ga = std::max(ga, std::fabs(static_cast<double>(v[static_cast<size_t>(r * cols + c)])));
          const uint8_t sc = e4m3_nearest(o.modelopt ? ga / 6.0 / s2 : ga / 6.0 * gs);
          scales.push_back(static_cast<char>(sc));
          // The group's scale as the format defines it: the float nearest e4m3 * s2 or e4m3 / gs.
          const auto eff =
              static_cast<float>(o.modelopt ? e4m3_value(sc) * s2 : e4m3_value(sc) / gs);
          for (int64_t c = 16 * g; c < 16 * g + 16; ++c) {
            const auto i = static_cast<size_t>(r * cols + c);
            const int code = eff > 0 ? e2m1_nearest(v[i] / static_cast<double>(eff)) : 0;
            codes[i / 2] = static_cast<char>(codes[i / 2] | code << (4 * (i % 2)));
            exact[i] = static_cast<float>(e2m1_value(code) * static_cast<double>(eff));
          }
        }
      const std::string base = name.substr(0, name.size() - 7);  // without ".weight"
      const auto one = [](float x) { return std::string(reinterpret_cast<const char*>(&x), 4); };
      if (o.modelopt) {
        packed.push_back({name, "U8", {rows, cols / 2}, codes});
        packed.push_back({base + ".weight_scale", "F8_E4M3", {rows, ng}, scales});
        packed.push_back({base + ".weight_scale_2", "F32", {}, one(s2)});
        packed.push_back({base + ".input_scale", "F32", {}, one(0.01f)});  // not applied
      } else {
        packed.push_back({base + ".weight_packed", "U8", {rows, cols / 2}, codes});
        packed.push_back({base + ".weight_scale", "F8_E4M3", {rows, ng}, scales});
        packed.push_back({base + ".weight_global_scale", "F32", {1}, one(gs)});
        packed.push_back({base + ".input_global_scale", "F32", {1}, one(100.f)});  // not applied
      }
      twin.push_back({name, "F32", t->shape, f32_bytes(exact)});
    }
    std::ifstream in(src_dir + "/config.json");
    nlohmann::json cfg = nlohmann::json::parse(in);
    const nlohmann::json twin_cfg = cfg;
    if (o.modelopt) {
      const nlohmann::json q = {{"quant_algo", "NVFP4"},
                                {"kv_cache_quant_algo", nullptr},
                                {"group_size", 16},
                                {"exclude_modules", {"lm_head"}}};
      if (o.side_file) {
        packed_.write("hf_quant_config.json",
                      nlohmann::json{{"producer", {{"name", "modelopt"}, {"version", "0.35.0"}}},
                                     {"quantization", q}}
                          .dump(2));
      } else {
        cfg["quantization_config"] = q;
        cfg["quantization_config"]["quant_method"] = "modelopt";
      }
    } else {
      const nlohmann::json w = {
          {"num_bits", 4},       {"type", "float"},     {"strategy", "tensor_group"},
          {"group_size", 16},    {"symmetric", true},   {"dynamic", false},
          {"actorder", nullptr}, {"observer", "minmax"}};
      nlohmann::json a = w;
      a["dynamic"] = "local";
      cfg["quantization_config"] = {{"quant_method", "compressed-tensors"},
                                    {"format", "nvfp4-pack-quantized"},
                                    {"quantization_status", "compressed"},
                                    {"kv_cache_scheme", nullptr},
                                    {"sparsity_config", nlohmann::json::object()},
                                    {"ignore", {"lm_head"}},
                                    {"config_groups",
                                     {{"group_0",
                                       {{"targets", {"Linear"}},
                                        {"weights", w},
                                        {"input_activations", a},
                                        {"output_activations", nullptr}}}}}};
    }
    write_copy_and_twin(packed_, twin_, src_dir, cfg, twin_cfg, packed, twin);
  }
  const std::string& nvfp4_path() const { return packed_.path(); }
  const std::string& twin_path() const { return twin_.path(); }
  const TempDir& nvfp4_dir() const { return packed_; }
  int quantized() const { return quantized_; }

 private:
  TempDir packed_, twin_;
  int quantized_ = 0;
};

}  // namespace troupe::testing
