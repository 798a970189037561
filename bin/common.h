// Helpers shared by the subcommands.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "compute/kv_type.h"
#include "compute/multimodal_prompt.h"
#include "model/model.h"

namespace troupe::cli {

/// load_model(path), or a CliError with the loader's message.
std::shared_ptr<const model::Model> load_model_or_throw(const std::string& path);

/// load_model(path) with its weights where `weights` says: "map" (the file mapping), "memory"
/// (a private copy in huge-page memory) or "auto" (the copy where it fits with room to spare,
/// model::choose_weight_storage; else the mapping, with a note on stderr). A CliError names a
/// bad value, or a "memory" copy that does not fit. A copy for engines that all run on the CPU
/// (`cpu_only`) puts the matrices its kernels read fastest in tiles in those tiles
/// (compute::tiled_weight_types).
std::shared_ptr<const model::Model> load_model_or_throw(const std::string& path,
                                                        const std::string& weights,
                                                        bool cpu_only = true);

class ArgParser;

/// The value of --threads: an integer in [1, 1024], or 0 for "auto" (also when the option is
/// absent). CliError names a bad value. compute::resolve_threads turns 0 into a count.
int threads_option(const ArgParser& ap);

/// The value of --kv-type: f32 (also when the option is absent), f16 or bf16
/// (compute/kv_type.h). CliError names a bad value.
compute::KvType kv_type_option(const ArgParser& ap);

/// The --prompt text with each --image file (decoded, then encoded by the --mmproj encoder)
/// in place of its <__media__> marker, BOS first unless --no-bos. CliError names a bad image, a
/// mismatched encoder or a marker count that does not match the images.
compute::MultimodalPrompt prompt_with_images(const ArgParser& ap, const model::Model& model,
                                             int threads);

/// The bytes of each --image file, in order, for a cluster's encoder to decode; each is decoded
/// here first so that a bad file is a CliError naming it before anything is sent.
std::shared_ptr<const std::vector<std::string>> image_file_bytes(const ArgParser& ap);

/// A JSON string literal for s (UTF-8 passed through, invalid bytes as U+FFFD).
std::string json_quote(const std::string& s);

}  // namespace troupe::cli
