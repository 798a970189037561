// Test helpers that write edited copies of the shared models into temporary folders: a Hugging
// Face directory with config.json changed (weights linked, not copied) and a GGUF file with its
// metadata and tensors changed. Header-only; for test binaries that link troupe_model.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/gguf.h"
#include "model/gguf_writer.h"
#include "tests/test_support.h"

namespace troupe::testing {

/// A copy of shared/models/hf/<name> with config.json edited; weights linked, not copied.
class EditedHfModel {
 public:
  EditedHfModel(const std::string& shared, const std::string& name,
                const std::function<void(nlohmann::json&)>& edit, bool with_tokenizer = false) {
    const std::string src = shared + "/models/hf/" + name;
    std::ifstream in(src + "/config.json");
    nlohmann::json cfg = nlohmann::json::parse(in);
    edit(cfg);
    dir_.write("config.json", cfg.dump(2));
    for (const auto& e : std::filesystem::directory_iterator(src)) {
      const std::string f = e.path().filename().string();
      if (f.ends_with(".safetensors") || f.ends_with(".index.json") ||
          (with_tokenizer && f.starts_with("tokenizer")))
        dir_.link(f, e.path().string());
    }
  }
  const std::string& path() const { return dir_.path(); }
  const TempDir& dir() const { return dir_; }

 private:
  TempDir dir_;
};

/// A tensor to add to an edited GGUF copy (f32, one dimension).
struct ExtraTensor {
  std::string name;
  std::vector<float> values;
  model::GgmlType type = model::GgmlType::kF32;  // stored as (converted by the writer)
};

/// A copy of the GGUF file `src` in `dir` named `name`: every key and tensor but those named in
/// `drop`, then `edit` run on the writer (to set or remove keys), then `extra` tensors appended.
/// Returns the path ("" with a test failure when the copy could not be written).
inline std::string edited_gguf(const TempDir& dir, const std::string& name, const std::string& src,
                               const std::function<void(model::GgufWriter&)>& edit,
                               const std::vector<ExtraTensor>& extra = {},
                               const std::vector<std::string>& drop = {}) {
  auto f = model::GgufFile::open(src);
  EXPECT_TRUE(f.has_value()) << src << ": " << f.error().message;
  if (!f) return {};
  model::GgufWriter w;
  for (const auto& [key, value] : (*f)->metadata()) w.copy_value(key, value);
  edit(w);
  for (const model::TensorInfo& t : (*f)->tensors()) {
    if (std::find(drop.begin(), drop.end(), t.name) != drop.end()) continue;
    const std::vector<int64_t> shape(t.ne, t.ne + t.n_dims);
    const std::span<const uint8_t> bytes(t.data, static_cast<size_t>(t.nbytes));
    EXPECT_TRUE(w.add_tensor(t.name, t.type, shape, bytes).has_value()) << t.name;
  }
  for (const ExtraTensor& x : extra) {
    const int64_t shape[1] = {static_cast<int64_t>(x.values.size())};
    EXPECT_TRUE(w.add_tensor_f32(x.name, x.type, shape, x.values).has_value()) << x.name;
  }
  const std::string path = dir.path() + "/" + name;
  auto st = w.write(path);
  EXPECT_TRUE(st.has_value()) << path << ": " << st.error().message;
  return st ? path : std::string();
}

}  // namespace troupe::testing
