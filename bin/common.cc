#include "bin/common.h"

#include <sched.h>

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

std::shared_ptr<const model::Model> load_model_or_throw(const std::string& path,
                                                        const std::string& weights) {
  auto storage = model::parse_weight_storage(weights);
  if (!storage) throw CliError("--" + storage.error().message);
  auto m = load_model_or_throw(path);
  const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::string why;
  auto placed = model::place_weights(m, *storage, {}, threads, &why);
  if (!placed) throw CliError(placed.error().message);
  if (!why.empty())
    std::fprintf(stderr, "troupe: %s: reading the weights through the file mapping: %s\n",
                 path.c_str(), why.c_str());
  return *placed;
}

int available_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

int threads_option(const ArgParser& ap, bool auto_by_default, int sharers, int fallback) {
  const bool is_auto = ap.has("threads") ? ap.str("threads") == "auto" : auto_by_default;
  if (is_auto) return std::max(1, available_cpus() / std::max(1, sharers));
  if (!ap.has("threads")) return fallback;
  const std::string v = ap.str("threads");
  const bool digits = !v.empty() && v.size() <= 4 &&
                      std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; });
  const int n = digits ? std::stoi(v) : 0;
  if (n < 1 || n > 1024)
    throw CliError("--threads must be an integer from 1 to 1024 or \"auto\", got '" + v + "'");
  return n;
}

std::string json_quote(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace troupe::cli
