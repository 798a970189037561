// Option values of the bench tools. A value an option does not take ends the tool with one line on
// stderr ("engine_bench: --prefill takes an integer in 1..1048576, got 'abc'") and exit code 2, the
// same as a bad command line of `troupe`: a typo must not turn into a silent 0 (std::atoll) and a
// benchmark of something else.
#pragma once

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

namespace troupe::bench {

/// Prints "TOOL: MESSAGE" on stderr and exits with code 2.
[[noreturn]] inline void usage_error(const char* tool, const std::string& message) {
  std::fprintf(stderr, "%s: %s\n", tool, message.c_str());
  std::exit(2);
}

/// The comma-separated items of an option's value ("1,2" -> {"1", "2"}; "" -> {""}).
inline std::vector<std::string> split_commas(const std::string& list) {
  std::vector<std::string> items;
  for (size_t pos = 0; pos <= list.size();) {
    const size_t end = std::min(list.find(',', pos), list.size());
    items.push_back(list.substr(pos, end - pos));
    pos = end + 1;
  }
  return items;
}

/// `text` as a whole decimal integer in [lo, hi], or nothing.
inline std::optional<int64_t> parse_int(const std::string& text, int64_t lo, int64_t hi) {
  int64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [p, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || p != end || v < lo || v > hi) return std::nullopt;
  return v;
}

/// `text` as a whole decimal integer in [lo, hi], or a usage_error naming `option`.
inline int64_t int_arg(const char* tool, const std::string& option, const std::string& text,
                       int64_t lo, int64_t hi) {
  const std::optional<int64_t> v = parse_int(text, lo, hi);
  if (!v)
    usage_error(tool, option + " takes an integer in " + std::to_string(lo) + ".." +
                          std::to_string(hi) + ", got '" + text + "'");
  return *v;
}

/// A comma-separated list of int_arg values ("1,2"), at least one.
inline std::vector<int64_t> int_list_arg(const char* tool, const std::string& option,
                                         const std::string& text, int64_t lo, int64_t hi) {
  std::vector<int64_t> values;
  for (const std::string& item : split_commas(text)) {
    const std::optional<int64_t> v = parse_int(item, lo, hi);
    if (!v)
      usage_error(tool, option + " takes integers in " + std::to_string(lo) + ".." +
                            std::to_string(hi) + " separated by commas, got '" + text + "'");
    values.push_back(*v);
  }
  return values;
}

/// `text` as a whole decimal number in [lo, hi] ("0.25", "1e-3"), or a usage_error naming `option`.
inline double double_arg(const char* tool, const std::string& option, const std::string& text,
                         double lo, double hi) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !(v >= lo && v <= hi)) {
    char range[64];
    std::snprintf(range, sizeof range, "%g..%g", lo, hi);
    usage_error(tool, option + " takes a number in " + range + ", got '" + text + "'");
  }
  return v;
}

/// A usage_error unless `option` is one of `known` ("unknown option '--x'; USAGE").
inline void known_option(const char* tool, const std::string& option,
                         std::initializer_list<const char*> known, const char* usage) {
  for (const char* k : known)
    if (option == k) return;
  usage_error(tool, "unknown option '" + option + "'; " + usage);
}

/// For a tool whose first argument is a model file: returns where there is one; else (no argument,
/// or an option first) prints `usage` and exits, on stdout with code 0 for --help or -h, else on
/// stderr with code 2.
inline void model_arg_or_usage(int argc, char** argv, const char* usage) {
  if (argc >= 2 && argv[1][0] != '-') return;
  const bool help =
      argc >= 2 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0);
  std::fprintf(help ? stdout : stderr, "%s\n", usage);
  std::exit(help ? 0 : 2);
}

/// The value after option argv[i] (advancing i to it), or a usage_error when there is none.
inline std::string value_arg(const char* tool, int argc, char** argv, int& i) {
  if (i + 1 >= argc) usage_error(tool, std::string(argv[i]) + " needs a value");
  return argv[++i];
}

}  // namespace troupe::bench
