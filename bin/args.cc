#include "bin/args.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace troupe::cli {

ArgParser::ArgParser(const std::vector<std::string>& args, const std::set<std::string>& with_value,
                     const std::set<std::string>& flags, size_t max_positional,
                     const std::set<std::string>& repeatable) {
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i];
    if (a.rfind("--", 0) != 0 || a.size() == 2) {
      if (positional_.size() >= max_positional) throw CliError("unexpected argument '" + a + "'");
      positional_.push_back(a);
      continue;
    }
    std::string name = a.substr(2), value;
    bool inline_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      inline_value = true;
    }
    if (with_value.count(name)) {
      if (!inline_value) {
        if (i + 1 >= args.size()) throw CliError("option --" + name + " needs a value");
        value = args[++i];
      }
      if (values_.count(name) && !repeatable.count(name))
        throw CliError("option --" + name + " given twice");
      values_[name] = value;
      repeated_[name].push_back(value);
    } else if (flags.count(name)) {
      if (inline_value) throw CliError("option --" + name + " takes no value");
      flags_.insert(name);
    } else {
      throw CliError("unknown option --" + name);
    }
  }
}

std::vector<std::string> ArgParser::all(const std::string& name) const {
  auto it = repeated_.find(name);
  return it == repeated_.end() ? std::vector<std::string>{} : it->second;
}

std::string ArgParser::str(const std::string& name, const std::string& def) const {
  auto it = values_.find(name);
  return it == values_.end() ? def : it->second;
}

std::string ArgParser::required(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) throw CliError("missing required option --" + name);
  return it->second;
}

int64_t ArgParser::integer(const std::string& name, int64_t def, int64_t lo, int64_t hi) const {
  auto it = values_.find(name);
  if (it == values_.end()) return def;
  const std::string& s = it->second;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno == ERANGE || v < lo || v > hi)
    throw CliError("--" + name + " must be an integer in " + std::to_string(lo) + ".." +
                   std::to_string(hi) + ", got '" + s + "'");
  return v;
}

double ArgParser::number(const std::string& name, double def, double lo, double hi) const {
  auto it = values_.find(name);
  if (it == values_.end()) return def;
  const std::string& s = it->second;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || !std::isfinite(v) || v < lo || v > hi) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "--%s must be a number in [%g, %g], got '%s'", name.c_str(), lo,
                  hi, s.c_str());
    throw CliError(buf);
  }
  return v;
}

std::vector<int32_t> parse_id_list(const std::string& s, const std::string& what) {
  std::vector<int32_t> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
    size_t j = i;
    while (j < s.size() && s[j] != ',') ++j;
    std::string item = s.substr(i, j - i);
    while (!item.empty() && (item.back() == ' ' || item.back() == '\t')) item.pop_back();
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || errno == ERANGE || v < 0 || v > 0x7fffffff)
      throw CliError(what + ": '" + item + "' is not a token id (a non-negative integer)");
    out.push_back(static_cast<int32_t>(v));
    i = j + 1;
    if (j == s.size()) break;
  }
  if (out.empty()) throw CliError(what + " is empty");
  return out;
}

}  // namespace troupe::cli
