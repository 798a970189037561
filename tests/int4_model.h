// Test helpers for compressed-tensors int4 ("pack-quantized") Hugging Face checkpoints: the
// test's own symmetric int4 quantizer and packing (from the format's definition, not troupe's
// code), and a writer that turns a shared Hugging Face model into an int4 copy plus its exact f32
// "twin" (every packed weight replaced by the floats q * scale). Header-only; for tests linking
// troupe_model.
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

#include "model/ggml_types.h"
#include "model/safetensors.h"
#include "tests/fp8_model.h"
#include "tests/test_support.h"

namespace troupe::testing {

/// x rounded to bfloat16 (nearest, ties to even) and its 16 bits; x finite.
inline uint16_t bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// Packs signed 4-bit values (each in [-8, 7]) eight to a little-endian 32-bit word, value i of
/// a word in bits 4i..4i+3 stored as q + 8 (compressed-tensors' pack-quantized layout).
inline std::string pack_int4(const std::vector<int>& q) {
  std::string out(q.size() / 2, '\0');
  for (size_t w = 0; w < q.size() / 8; ++w) {
    uint32_t word = 0;
    for (int i = 0; i < 8; ++i) word |= static_cast<uint32_t>(q[8 * w + i] + 8) << (4 * i);
    std::memcpy(out.data() + 4 * w, &word, 4);
  }
  return out;
}

struct Int4Options {
  int64_t group = 32;                // columns per scale; 0: one per row ("channel")
  std::string scale_dtype = "BF16";  // BF16, F16 or F32
  bool write_shape = true;           // X.weight_shape beside each packed weight
  std::string shape_dtype = "I32";   // I32 or I64
  /// Which 2-D "*.weight" tensors to pack (null: every one whose columns allow it, except the
  /// embedding, which is no linear layer).
  std::function<bool(const std::string&)> quantize;
  /// When set, the int4 copy takes every tensor it does not pack from this directory instead,
  /// as stored (e.g. an FP8 copy whose f32 twin is src_dir), and config_groups gains
  /// `extra_groups` with format "mixed-precision".
  std::string passthrough_dir;
  nlohmann::json extra_groups = nlohmann::json::object();
};

/// A shared Hugging Face model (F32 weights) as a compressed-tensors int4 checkpoint and its exact
/// f32 twin. A packed weight's group scale is amax / 7.5 rounded to the scale dtype (as
/// compressed-tensors' symmetric observer: the range [-8, 7] is 15 steps), q = round(x / scale)
/// clamped to [-8, 7]; the twin holds float(q * scale), exact for a BF16 or F16 scale. Tensors
/// whose columns are not a multiple of 16 and of the group stay F32 in both.
class Int4Copy {
 public:
  Int4Copy(const std::string& src_dir, const Int4Options& o = {}) {
    auto set = model::SafetensorsSet::open_dir(src_dir);
    EXPECT_TRUE(set.has_value()) << set.error().message;
    if (!set) return;
    std::vector<StTensor> packed, twin;
    std::vector<std::string> packed_names;
    for (const auto& [name, t] : (*set)->tensors()) {
      EXPECT_EQ(t->dtype, "F32") << name;
      std::vector<float> v(static_cast<size_t>(t->num_elements()));
      std::memcpy(v.data(), t->data, v.size() * sizeof(float));
      const int64_t cols = t->shape.size() == 2 ? t->shape[1] : 0;
      const int64_t group = o.group > 0 ? o.group : cols;
      const bool q =
          t->shape.size() == 2 && name.ends_with(".weight") && cols % 16 == 0 &&
          cols % group == 0 &&
          (o.quantize ? o.quantize(name) : name.find("embed_tokens") == std::string::npos);
      if (!q) {
        twin.push_back({name, "F32", t->shape, f32_bytes(v)});
        if (o.passthrough_dir.empty()) packed.push_back(twin.back());
        continue;
      }
      ++quantized_;
      packed_names.push_back(name);
      const int64_t rows = t->shape[0];
      const int64_t ng = cols / group;
      std::vector<int> codes(v.size());
      std::vector<float> exact(v.size());
      std::string scale_bytes;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t g = 0; g < ng; ++g) {
          double amax = 0;
          for (int64_t c = g * group; c < (g + 1) * group; ++c)
            amax = std::max(amax,
                            std::fabs(static_cast<double>(v[static_cast<size_t>(r * cols + c)])));
          float s = amax > 0 ? static_cast<float>(amax / 7.5) : 1.f;
          if (o.scale_dtype == "BF16") {
            const uint16_t b = bf16_bits(s);
            s = bf16_float(b);
            scale_bytes.append(reinterpret_cast<const char*>(&b), 2);
          } else if (o.scale_dtype == "F16") {
            const uint16_t h = model::fp32_to_fp16(s);
            s = model::fp16_to_fp32(h);
            scale_bytes.append(reinterpret_cast<const char*>(&h), 2);
          } else {
            scale_bytes.append(reinterpret_cast<const char*>(&s), 4);
          }
          for (int64_t c = g * group; c < (g + 1) * group; ++c) {
            const auto i = static_cast<size_t>(r * cols + c);
            const double qd = std::nearbyint(static_cast<double>(v[i]) / s);
            codes[i] = static_cast<int>(std::clamp(qd, -8.0, 7.0));
            exact[i] = static_cast<float>(codes[i] * static_cast<double>(s));
          }
        }
      const std::string base = name.substr(0, name.size() - 7);  // without ".weight"
      packed.push_back({base + ".weight_packed", "I32", {rows, cols / 8}, pack_int4(codes)});
      packed.push_back({base + ".weight_scale", o.scale_dtype, {rows, ng}, scale_bytes});
      if (o.write_shape) {
        std::string shape_bytes;
        for (const int64_t d : {rows, cols}) {
          if (o.shape_dtype == "I64") {
            shape_bytes.append(reinterpret_cast<const char*>(&d), 8);
          } else {
            const auto d32 = static_cast<int32_t>(d);
            shape_bytes.append(reinterpret_cast<const char*>(&d32), 4);
          }
        }
        packed.push_back({base + ".weight_shape", o.shape_dtype, {2}, shape_bytes});
      }
      twin.push_back({name, "F32", t->shape, f32_bytes(exact)});
    }
    if (!o.passthrough_dir.empty()) {
      auto other = model::SafetensorsSet::open_dir(o.passthrough_dir);
      EXPECT_TRUE(other.has_value()) << other.error().message;
      if (!other) return;
      for (const auto& [name, t] : (*other)->tensors())
        if (std::find(packed_names.begin(), packed_names.end(), name) == packed_names.end())
          packed.push_back({name, t->dtype, t->shape,
                            std::string(reinterpret_cast<const char*>(t->data), t->nbytes)});
    }
    std::ifstream in(src_dir + "/config.json");
    nlohmann::json cfg = nlohmann::json::parse(in);
    const nlohmann::json twin_cfg = cfg;
    nlohmann::json weights = {{"num_bits", 4},       {"type", "int"},
                              {"symmetric", true},   {"dynamic", false},
                              {"actorder", nullptr}, {"block_structure", nullptr},
                              {"observer", "minmax"}};
    if (o.group > 0) {
      weights["strategy"] = "group";
      weights["group_size"] = o.group;
    } else {
      weights["strategy"] = "channel";
      weights["group_size"] = nullptr;
    }
    cfg["quantization_config"] = {{"quant_method", "compressed-tensors"},
                                  {"format", "pack-quantized"},
                                  {"quantization_status", "compressed"},
                                  {"kv_cache_scheme", nullptr},
                                  {"sparsity_config", nlohmann::json::object()},
                                  {"ignore", nlohmann::json::array()},
                                  {"config_groups",
                                   {{"group_0",
                                     {{"targets", {"Linear"}},
                                      {"weights", weights},
                                      {"input_activations", nullptr},
                                      {"output_activations", nullptr}}}}}};
    if (!o.extra_groups.empty()) {
      auto& q = cfg["quantization_config"];
      q["format"] = "mixed-precision";
      q["config_groups"]["group_0"]["format"] = "pack-quantized";
      for (const auto& [k, g] : o.extra_groups.items()) q["config_groups"][k] = g;
    }
    write_copy_and_twin(packed_, twin_, src_dir, cfg, twin_cfg, packed, twin);
  }
  const std::string& int4_path() const { return packed_.path(); }
  const std::string& twin_path() const { return twin_.path(); }
  const TempDir& int4_dir() const { return packed_; }
  int quantized() const { return quantized_; }

 private:
  TempDir packed_, twin_;
  int quantized_ = 0;
};

}  // namespace troupe::testing
