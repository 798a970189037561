#include "bin/common.h"

#include <nlohmann/json.hpp>

#include "bin/args.h"

namespace troupe::cli {

std::shared_ptr<const model::Model> load_model_or_throw(const std::string& path) {
  auto m = model::load_model(path);
  if (!m) throw CliError(m.error().message);
  return *m;
}

std::string json_quote(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace troupe::cli
