// Test helpers for FP8 (E4M3, block-scaled) Hugging Face checkpoints: the test's own FP8
// encoding and decoding (from the format's definition, not troupe's code), and a writer that
// turns a shared Hugging Face model into an FP8 copy plus its exact f32 "twin" (every FP8 weight
// replaced by the nearest floats to fp8 * scale). Header-only; for tests linking troupe_model.
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

#include "model/model.h"
#include "model/safetensors.h"
#include "tests/safetensors_writer.h"
#include "tests/test_support.h"

namespace troupe::testing {

/// E4M3 ("e4m3fn") code b as a double: bias 7, 3 mantissa bits, subnormals at exponent 0,
/// S.1111.111 NaN (no infinities).
inline double e4m3_value(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return std::nan("");
  const double mag =
      e == 0 ? m / 8.0 * std::ldexp(1.0, -6) : (1 + m / 8.0) * std::ldexp(1.0, e - 7);
  return (b & 0x80) ? -mag : mag;
}

/// The E4M3 code nearest to x (ties to the even code), saturating at +-448.
inline uint8_t e4m3_nearest(double x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::min(std::fabs(x), 448.0);
  // Codes 0x00..0x7e are the non-negative values in increasing order.
  int lo = 0, hi = 0x7e;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    (e4m3_value(static_cast<uint8_t>(mid)) <= a ? lo : hi) = mid;
  }
  const double dl = a - e4m3_value(static_cast<uint8_t>(lo));
  const double dh = e4m3_value(static_cast<uint8_t>(hi)) - a;
  const int code = dl < dh ? lo : dh < dl ? hi : (lo % 2 == 0 ? lo : hi);
  return static_cast<uint8_t>(sign | code);
}

/// Every row of x (each matrix of a stack) dequantizes (model::dequantize_view_row) to the same
/// bits as y's: a quantized checkpoint's view against its exact f32 twin's.
inline void expect_same_rows(const model::WeightView& x, const model::WeightView& y) {
  SCOPED_TRACE(x.name);
  ASSERT_EQ(x.cols(), y.cols());
  ASSERT_EQ(x.rows(), y.rows());
  std::vector<float> rx(static_cast<size_t>(x.cols())), ry(rx.size());
  for (int64_t i = 0; i < x.ne[2]; ++i) {
    const model::WeightView xs = x.ne[2] > 1 ? x.slice(i) : x, ys = y.ne[2] > 1 ? y.slice(i) : y;
    for (int64_t r = 0; r < xs.rows(); ++r) {
      model::dequantize_view_row(xs, r, rx.data());
      model::dequantize_view_row(ys, r, ry.data());
      ASSERT_EQ(std::memcmp(rx.data(), ry.data(), rx.size() * 4), 0) << "row " << r;
    }
  }
}

/// Writes a quantized copy of the Hugging Face model in src_dir and its f32 twin: each folder's
/// config.json and model.safetensors, and links to src_dir's tokenizer files in both.
inline void write_copy_and_twin(const TempDir& copy, const TempDir& twin,
                                const std::string& src_dir, const nlohmann::json& copy_cfg,
                                const nlohmann::json& twin_cfg,
                                const std::vector<StTensor>& copy_tensors,
                                const std::vector<StTensor>& twin_tensors) {
  copy.write("config.json", copy_cfg.dump(2));
  twin.write("config.json", twin_cfg.dump(2));
  copy.write("model.safetensors", safetensors_image(copy_tensors));
  twin.write("model.safetensors", safetensors_image(twin_tensors));
  for (const auto& e : std::filesystem::directory_iterator(src_dir)) {
    const std::string f = e.path().filename().string();
    if (f.starts_with("tokenizer") || f == "special_tokens_map.json") {
      copy.link(f, e.path().string());
      twin.link(f, e.path().string());
    }
  }
}

/// A shared Hugging Face model (F32 weights) as an FP8 checkpoint with blocks of br x bc, and its
/// exact f32 twin. Every 2-D "*.weight" tensor for which `quantize(name)` holds becomes F8_E4M3
/// with a "_scale_inv" grid (scale = block amax / 448, as DeepSeek's quantizer; 1 for an
/// all-zero block); the twin holds float(e4m3_value(code) * scale) in its place. Other tensors
/// are copied. config.json gains quantization_config in the FP8 copy only.
class Fp8Copy {
 public:
  /// `compressed`: "" for DeepSeek's form (quant_method "fp8", "_scale_inv" grids); "ue8m0" for
  /// DeepSeek-V4's (power-of-two scales as F8_E8M0 grids named "X.scale" for "X.weight"); "block",
  /// "channel" or "tensor" for compressed-tensors "float-quantized" (scales "_scale": blocks of
  /// br x bc, one per row, or one per tensor; tensors whose columns per scale are not a multiple
  /// of 16 stay F32, as troupe needs).
  Fp8Copy(const std::string& src_dir, int64_t br, int64_t bc,
          const std::function<bool(const std::string&)>& quantize = nullptr,
          const std::string& compressed = "") {
    auto set = model::SafetensorsSet::open_dir(src_dir);
    EXPECT_TRUE(set.has_value()) << set.error().message;
    if (!set) return;
    std::vector<StTensor> fp8, twin;
    const bool ue8m0 = compressed == "ue8m0";
    for (const auto& [name, t] : (*set)->tensors()) {
      if (t->dtype == "I32" || t->dtype == "I64") {  // integer tables (DeepSeek-V4's) as they are
        const std::string bytes(reinterpret_cast<const char*>(t->data), t->nbytes);
        fp8.push_back({name, t->dtype, t->shape, bytes});
        twin.push_back(fp8.back());
        continue;
      }
      EXPECT_EQ(t->dtype, "F32") << name;
      std::vector<float> v(static_cast<size_t>(t->num_elements()));
      std::memcpy(v.data(), t->data, v.size() * sizeof(float));
      int64_t tbr = br, tbc = bc;  // this tensor's scale block
      if (t->shape.size() == 2 && compressed == "channel") {
        tbr = 1;
        tbc = t->shape[1];
      } else if (t->shape.size() == 2 && compressed == "tensor") {
        tbr = t->shape[0];
        tbc = t->shape[1];
      }
      const bool q = t->shape.size() == 2 && name.ends_with(".weight") && tbc % 16 == 0 &&
                     (quantize == nullptr || quantize(name));
      if (!q) {
        fp8.push_back({name, "F32", t->shape, f32_bytes(v)});
        twin.push_back(fp8.back());
        continue;
      }
      ++quantized_;
      const int64_t rows = t->shape[0], cols = t->shape[1];
      const int64_t br = tbr, bc = tbc;
      const int64_t gr = (rows + br - 1) / br, gc = (cols + bc - 1) / bc;
      std::vector<float> scales(static_cast<size_t>(gr * gc));
      std::string codes(static_cast<size_t>(rows * cols), '\0');
      std::vector<float> exact(v.size());
      for (int64_t bi = 0; bi < gr; ++bi)
        for (int64_t bj = 0; bj < gc; ++bj) {
          double amax = 0;
          for (int64_t r = bi * br; r < std::min(rows, (bi + 1) * br); ++r)
            for (int64_t c = bj * bc; c < std::min(cols, (bj + 1) * bc); ++c)
              amax = std::max(amax,
                              std::fabs(static_cast<double>(v[static_cast<size_t>(r * cols + c)])));
          // ue8m0: the power of two at or above amax / 448 (DeepSeek-V4's).
          const float s =
              amax <= 0 ? 1.f
              : ue8m0   ? std::ldexp(1.0f, static_cast<int>(std::ceil(std::log2(amax / 448.0))))
                        : static_cast<float>(amax / 448.0);
          scales[static_cast<size_t>(bi * gc + bj)] = s;
          for (int64_t r = bi * br; r < std::min(rows, (bi + 1) * br); ++r)
            for (int64_t c = bj * bc; c < std::min(cols, (bj + 1) * bc); ++c) {
              const auto i = static_cast<size_t>(r * cols + c);
              const uint8_t code = e4m3_nearest(v[i] / static_cast<double>(s));
              codes[i] = static_cast<char>(code);
              // The product is exact in double (4 + 24 significant bits): one rounding to float.
              exact[i] = static_cast<float>(e4m3_value(code) * static_cast<double>(s));
            }
        }
      fp8.push_back({name, "F8_E4M3", t->shape, codes});
      if (ue8m0) {
        std::string e(scales.size(), '\0');
        for (size_t i = 0; i < scales.size(); ++i)
          e[i] = static_cast<char>(127 + std::ilogb(scales[i]));
        fp8.push_back({name.substr(0, name.size() - 7) + ".scale", "F8_E8M0", {gr, gc}, e});
      } else if (compressed.empty())
        fp8.push_back({name + "_scale_inv", "F32", {gr, gc}, f32_bytes(scales)});
      else
        fp8.push_back(
            {name + "_scale", "F32",
             compressed == "tensor" ? std::vector<int64_t>{1} : std::vector<int64_t>{gr, gc},
             f32_bytes(scales)});
      twin.push_back({name, "F32", t->shape, f32_bytes(exact)});
    }
    std::ifstream in(src_dir + "/config.json");
    nlohmann::json cfg = nlohmann::json::parse(in);
    const nlohmann::json twin_cfg = cfg;
    if (ue8m0) {
      cfg["quantization_config"] = {{"quant_method", "fp8"},
                                    {"fmt", "e4m3"},
                                    {"scale_fmt", "ue8m0"},
                                    {"activation_scheme", "dynamic"},
                                    {"weight_block_size", {br, bc}}};
    } else if (compressed.empty()) {
      cfg["quantization_config"] = {{"quant_method", "fp8"},
                                    {"fmt", "e4m3"},
                                    {"activation_scheme", "dynamic"},
                                    {"weight_block_size", {br, bc}}};
    } else {
      nlohmann::json w = {{"num_bits", 8},          {"type", "float"},
                          {"symmetric", true},      {"dynamic", false},
                          {"strategy", compressed}, {"group_size", nullptr},
                          {"actorder", nullptr},    {"block_structure", nullptr}};
      if (compressed == "block") w["block_structure"] = {br, bc};
      cfg["quantization_config"] = {
          {"quant_method", "compressed-tensors"},
          {"format", "float-quantized"},
          {"quantization_status", "compressed"},
          {"kv_cache_scheme", nullptr},
          {"config_groups",
           {{"group_0",
             {{"targets", {"Linear"}},
              {"weights", w},
              {"input_activations",
               {{"num_bits", 8}, {"type", "float"}, {"strategy", "token"}, {"dynamic", true}}},
              {"output_activations", nullptr}}}}}};
    }
    write_copy_and_twin(fp8_, twin_, src_dir, cfg, twin_cfg, fp8, twin);
  }
  const std::string& fp8_path() const { return fp8_.path(); }
  const std::string& twin_path() const { return twin_.path(); }
  const TempDir& fp8_dir() const { return fp8_; }
  int quantized() const { return quantized_; }

 private:
  TempDir fp8_, twin_;
  int quantized_ = 0;
};

}  // namespace troupe::testing
