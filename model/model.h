// Loading a model from disk: a GGUF file or a Hugging Face directory becomes a Model (ModelSpec +
// tokenizer + the storage the weight views point into). Immutable after load; share freely.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/result.h"
#include "model/model_spec.h"

namespace troupe::model {

class GgufFile;
class Tokenizer;

struct Model {
  std::string path;
  std::string format;  // "gguf" or "hf"
  ModelSpec spec;
  std::shared_ptr<const Tokenizer> tokenizer;        // null when the file has no vocabulary
  std::string chat_template;                         // may be empty
  std::vector<std::shared_ptr<const void>> storage;  // keeps mappings and buffers alive
};

/// Loads `path`: a .gguf file or a directory holding config.json. Errors name the file and
/// the problem. The tokenizer is loaded too (an error when the vocabulary is malformed).
Result<std::shared_ptr<const Model>> load_model(const std::string& path);

/// Builds a ModelSpec from an open GGUF file (weight views point into its mapping).
/// Throws InputError naming the file and the key or tensor.
ModelSpec spec_from_gguf(const GgufFile& gguf);

/// Implemented by the Hugging Face reader (model/hf_model.cc).
Result<std::shared_ptr<const Model>> load_hf_model(const std::string& dir);

}  // namespace troupe::model
