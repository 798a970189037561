// Loading a model from disk: a GGUF file or a Hugging Face directory becomes a Model (ModelSpec +
// tokenizer + the storage the weight views point into). Immutable after load; share freely.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/result.h"
#include "model/model_spec.h"
#include "model/weight_tiles.h"

namespace troupe::model {

class GgufFile;
class Tokenizer;
struct TensorInfo;

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

/// A GGUF tensor as a weight view: ne[0], ne[1], and ne[2] * ne[3] stacked matrices.
WeightView view_of(const TensorInfo& t);

/// Row r (of a 2-D view in rows) as floats: dequantize_row, and for the scaled types (kF8_E4M3,
/// kI4_PACKED, kFP4_PACKED) each value times its block's scale (one float multiply: the nearest
/// float to the exact product).
void dequantize_view_row(const WeightView& w, int64_t r, float* out);
/// The same with row r's bytes (in rows' order) at `row`: a row taken out of its tile.
void dequantize_view_row(const WeightView& w, int64_t r, const uint8_t* row, float* out);

/// Calls fn on every weight view of the spec (layers, experts, shared experts, embedding, output
/// norm and head), present or not. A tied head is visited as its own view.
void for_each_weight(ModelSpec& spec, const std::function<void(WeightView&)>& fn);
void for_each_weight(const ModelSpec& spec, const std::function<void(const WeightView&)>& fn);
/// The part of for_each_weight that is one layer's, routed experts excepted (its shared expert
/// included).
void for_each_layer_weight(const LayerSpec& layer,
                           const std::function<void(const WeightView&)>& fn);
/// Every view of one FFN (a routed expert's): matrices and biases.
void for_each_ffn_weight(const ExpertFfn& ffn, const std::function<void(const WeightView&)>& fn);

/// Where compute reads the weights from. kMap: the file mapping (page-cache pages of 4 KiB,
/// shared between processes, nothing copied; a node faults in only what it reads). kMemory: a
/// private copy in anonymous memory backed by transparent huge pages, made at start (fewer TLB
/// misses: batch-1 decode 6-70 % faster on the 2-core VM, docs/benchmarks.md "Engine, session
/// 7"). kAuto (the default): kMemory where the copy fits in the memory available with room to
/// spare, else kMap (choose_weight_storage).
enum class WeightStorage : uint8_t { kMap = 0, kMemory = 1, kAuto = 2 };
/// Parses "map", "memory" or "auto"; an error names the value.
Result<WeightStorage> parse_weight_storage(const std::string& s);

/// Bytes this process can still allocate: /proc/meminfo's MemAvailable, bounded by its cgroup
/// (v2) limit less its usage where one is set. 0 when neither can be read.
uint64_t available_memory_bytes();

/// Bytes copy_weights_to_memory(model, ranges, ...) would copy.
uint64_t weight_copy_bytes(const Model& model, const std::vector<std::span<const uint8_t>>& ranges);

/// Resolves `requested` for a copy of `bytes` with `available` bytes of memory (normally
/// available_memory_bytes()): kAuto becomes kMemory when the copy leaves at least 1 GiB and a
/// tenth of `available` free (for KV pools, activations and the rest), else kMap, with the reason
/// in *why; kMemory that does not fit in `available` is an error naming both sizes (rather than
/// the kernel's out-of-memory killer midway through the copy). kMap stays kMap. An unknown
/// `available` (0) lets kMemory through and makes kAuto kMap.
Result<WeightStorage> choose_weight_storage(WeightStorage requested, uint64_t bytes,
                                            uint64_t available, std::string* why);

/// Puts the weight views of `model` inside `ranges` (all present views when empty) where
/// `requested` says, with the memory available now (choose_weight_storage): a copy
/// (copy_weights_to_memory, tiling the types in `tile_types`), or `model` itself when nothing is to
/// be copied (kMap, or kAuto without room: then the reason is in *why). Errors name the model's
/// path.
Result<std::shared_ptr<const Model>> place_weights(
    std::shared_ptr<const Model> model, WeightStorage requested,
    const std::vector<std::span<const uint8_t>>& ranges, int threads, std::string* why,
    TileTypes tile_types = {});

/// Returns a Model equal to `model` except that every weight view lying inside one of `ranges`
/// (all present views when `ranges` is empty) points into one private buffer of anonymous
/// memory with transparent huge pages, filled by `threads` threads. Views outside the ranges
/// keep pointing into the file mapping. The copied matrices of the types in `tile_types` that can
/// be (weight_tiles.h: tileable: int8-kernel types, F16, BF16) are put in 16-row tiles
/// (WeightLayout::kTiles16), the order the CPU's kernels read fastest: only for a model the
/// CPU engine computes with (compute::tiled_weight_types() says which types this CPU's kernels
/// read fast in tiles; the GPU engine's upload reads rows). Errors: the memory cannot be
/// allocated.
Result<std::shared_ptr<const Model>> copy_weights_to_memory(
    std::shared_ptr<const Model> model, const std::vector<std::span<const uint8_t>>& ranges,
    int threads, TileTypes tile_types = {});

/// Implemented by the Hugging Face reader (model/hf_model.cc).
Result<std::shared_ptr<const Model>> load_hf_model(const std::string& dir);

}  // namespace troupe::model
