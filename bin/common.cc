#include "bin/common.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bin/args.h"
#include "compute/matmul.h"
#include "compute/thread_pool.h"
#include "compute/vision_encoder.h"
#include "model/image.h"
#include "model/vision.h"

namespace troupe::cli {

std::shared_ptr<const model::Model> load_model_or_throw(const std::string& path) {
  auto m = model::load_model(path);
  if (!m) throw CliError(m.error().message);
  return *m;
}

std::shared_ptr<const model::Model> load_model_or_throw(const std::string& path,
                                                        const std::string& weights, bool cpu_only) {
  auto storage = model::parse_weight_storage(weights);
  if (!storage) throw CliError("--" + storage.error().message);
  auto m = load_model_or_throw(path);
  std::string why;
  auto placed = model::place_weights(m, *storage, {}, compute::available_cpus(), &why,
                                     cpu_only ? compute::tiled_weight_types() : model::TileTypes{});
  if (!placed) throw CliError(placed.error().message);
  if (!why.empty())
    std::fprintf(stderr, "troupe: %s: reading the weights through the file mapping: %s\n",
                 path.c_str(), why.c_str());
  return *placed;
}

int threads_option(const ArgParser& ap) {
  if (!ap.has("threads") || ap.str("threads") == "auto") return 0;
  const std::string v = ap.str("threads");
  const bool digits = !v.empty() && v.size() <= 4 &&
                      std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; });
  const int n = digits ? std::stoi(v) : 0;
  if (n < 1 || n > 1024)
    throw CliError("--threads must be an integer from 1 to 1024 or \"auto\", got '" + v + "'");
  return n;
}

compute::KvType kv_type_option(const ArgParser& ap) {
  if (!ap.has("kv-type")) return compute::KvType::kF32;
  const std::string v = ap.str("kv-type");
  if (auto t = compute::parse_kv_type(v)) return *t;
  throw CliError("--kv-type must be f32, f16 or bf16, got '" + v + "'");
}

std::string json_quote(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::shared_ptr<const std::vector<std::string>> image_file_bytes(const ArgParser& ap) {
  auto files = std::make_shared<std::vector<std::string>>();
  for (const std::string& path : ap.all("image")) {
    auto bytes = model::read_image_bytes(path);
    if (!bytes) throw CliError(bytes.error().message);
    const auto* data = reinterpret_cast<const uint8_t*>(bytes->data());
    if (auto image = model::decode_image({data, bytes->size()}, path); !image)
      throw CliError(image.error().message);
    files->push_back(std::move(*bytes));
  }
  return files;
}

// The prompt text with the --image files encoded by the --mmproj encoder in their places.
compute::MultimodalPrompt prompt_with_images(const ArgParser& ap, const model::Model& model,
                                             int threads) {
  const std::vector<std::string> files = ap.all("image");
  if (files.empty()) throw CliError("--mmproj needs at least one --image");
  // A Hugging Face LLaVA directory holds its vision tower beside the language model.
  std::string mmproj = ap.str("mmproj");
  if (mmproj.empty() && std::filesystem::is_directory(ap.str("model"))) mmproj = ap.str("model");
  if (mmproj.empty())
    throw CliError(
        "--image needs a vision encoder: --mmproj FILE (or a Hugging Face LLaVA "
        "directory as --model)");
  auto vision = model::load_vision_model(mmproj);
  if (!vision) throw CliError(vision.error().message);
  const model::VisionSpec& vs = (*vision)->spec;
  if (auto st = compute::check_vision_pair(model.tokenizer.get(), model.spec.n_embd, vs); !st)
    throw CliError(st.error().message);
  auto enc = compute::VisionEncoder::create(*vision, threads);
  if (!enc) throw CliError(enc.error().message);
  std::vector<std::vector<float>> rows;
  for (const std::string& f : files) {
    auto image = model::read_image_file(f);
    if (!image) throw CliError(image.error().message);
    auto e = (*enc)->encode(*image);
    if (!e) throw CliError(f + ": " + e.error().message);
    rows.push_back(std::move(*e));
  }
  auto p = compute::build_multimodal_prompt(*model.tokenizer, ap.str("prompt"), rows, vs,
                                            !ap.flag("no-bos"));
  if (!p) throw CliError(p.error().message);
  return std::move(*p);
}

}  // namespace troupe::cli
