// A small command-line parser for troupe's subcommands: `--name value` and `--flag`, with
// typed getters that turn bad values into one-line CliError messages.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace troupe::cli {

/// A user error: main prints "troupe <command>: <what>" and exits with status 2.
class CliError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class ArgParser {
 public:
  /// `with_value`: options that take a value; `flags`: options that do not; `repeatable`:
  /// options of with_value that may be given several times (all() returns every value).
  /// Throws CliError on an unknown option, a missing value or a repeated option.
  ArgParser(const std::vector<std::string>& args, const std::set<std::string>& with_value,
            const std::set<std::string>& flags, size_t max_positional = 0,
            const std::set<std::string>& repeatable = {});

  bool has(const std::string& name) const { return values_.count(name) || flags_.count(name); }
  bool flag(const std::string& name) const { return flags_.count(name) > 0; }
  std::string str(const std::string& name, const std::string& def = "") const;
  std::string required(const std::string& name) const;
  int64_t integer(const std::string& name, int64_t def, int64_t lo, int64_t hi) const;
  double number(const std::string& name, double def, double lo, double hi) const;
  const std::vector<std::string>& positional() const { return positional_; }
  /// Every value of a repeatable option, in command-line order.
  std::vector<std::string> all(const std::string& name) const;

 private:
  std::map<std::string, std::string> values_;
  std::map<std::string, std::vector<std::string>> repeated_;
  std::set<std::string> flags_;
  std::vector<std::string> positional_;
};

/// Parses "1,2,3" (spaces allowed) into token ids; throws CliError naming `what`.
std::vector<int32_t> parse_id_list(const std::string& s, const std::string& what);

}  // namespace troupe::cli
