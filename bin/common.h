// Helpers shared by the subcommands.
#pragma once

#include <memory>
#include <string>

#include "model/model.h"

namespace troupe::cli {

/// load_model(path), or a CliError with the loader's message.
std::shared_ptr<const model::Model> load_model_or_throw(const std::string& path);

/// load_model(path) with its weights where `weights` says: "map" (the file mapping) or "memory"
/// (a private copy in huge-page memory). A CliError names a bad value.
std::shared_ptr<const model::Model> load_model_or_throw(const std::string& path,
                                                        const std::string& weights);

/// A JSON string literal for s (UTF-8 passed through, invalid bytes as U+FFFD).
std::string json_quote(const std::string& s);

}  // namespace troupe::cli
