// The console's pages (web/console.*), embedded into the binary at build time (web/embed.cmake):
// served by serve/http_gateway.cc under /console. Dependency-free.
#pragma once

#include <string_view>

namespace troupe::web {

struct Asset {
  std::string_view path;          // "/console", "/console/console.js", ...
  std::string_view content_type;  // "text/html; charset=utf-8", ...
  std::string_view body;
};

/// The asset served at `path`, or null.
const Asset* find_asset(std::string_view path);

}  // namespace troupe::web
