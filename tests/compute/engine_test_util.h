// Test helpers for engine tests: load a GGUF model without its tokenizer.
#pragma once

#include <memory>
#include <string>

#include "model/gguf.h"
#include "model/model.h"

namespace troupe::compute {

inline std::shared_ptr<const model::Model> load_model_for_test(const std::string& path) {
  auto g = model::GgufFile::open(path);
  if (!g) return nullptr;
  auto m = std::make_shared<model::Model>();
  m->path = path;
  m->format = "gguf";
  m->spec = model::spec_from_gguf(**g);
  m->storage.push_back(std::shared_ptr<const model::GgufFile>(std::move(*g)));
  return m;
}

}  // namespace troupe::compute
