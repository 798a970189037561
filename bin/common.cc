#include "bin/common.h"

#include <algorithm>
#include <cstdio>
#include <thread>

#include <nlohmann/json.hpp>

#include "bin/args.h"

namespace troupe::cli {

std::shared_ptr<const model::Model> load_model_or_throw(const std::string& path) {
  auto m = model::load_model(path);
  if (!m) throw CliError(m.error().message);
  return *m;
}

namespace {

// MemAvailable from /proc/meminfo in bytes (0 when unknown).
uint64_t mem_available() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  unsigned long long kb = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
  std::fclose(f);
  return static_cast<uint64_t>(kb) * 1024;
}

}  // namespace

std::shared_ptr<const model::Model> load_model_or_throw(const std::string& path,
                                                        const std::string& weights) {
  model::WeightStorage storage = model::WeightStorage::kMap;
  auto m = load_model_or_throw(path);
  if (weights == "auto") {
    uint64_t bytes = 0;
    model::for_each_weight(m->spec, [&](const model::WeightView& w) { bytes += w.nbytes(); });
    if (bytes <= mem_available() / 2) storage = model::WeightStorage::kMemory;
  } else {
    auto s = model::parse_weight_storage(weights);
    if (!s) throw CliError("--" + s.error().message);
    storage = *s;
  }
  if (storage == model::WeightStorage::kMap) return m;
  const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  auto copy = model::copy_weights_to_memory(m, {}, threads);
  if (!copy) throw CliError(copy.error().message);
  return *copy;
}

std::string json_quote(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace troupe::cli
