// Helpers shared by all test binaries: locating ../shared, reading binary/JSON files.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace troupe::testing {

/// The shared data folder, or "" when absent. Order: $TROUPE_SHARED_DIR, then the checkout's
/// sibling ../shared.
std::string shared_dir();
/// The build directory (for finding the troupe binary).
std::string binary_dir();
/// The checkout (for test data kept beside the tests).
std::string source_dir();
/// True when $TROUPE_REQUIRE_SHARED=1 (CI sets it): a missing ../shared is then a failure.
bool shared_required();

std::vector<float> read_f32_file(const std::string& path);
std::string read_text_file(const std::string& path);
bool file_exists(const std::string& path);

/// A gtest parameter name for a model path: its folder name with non-alphanumerics as '_'
/// ("models/synth/mixtral-moe/model.gguf" -> "mixtral_moe").
std::string model_param_name(const std::string& path);

/// The number of newline characters in `s` (the lines of a process's output).
int count_lines(const std::string& s);

/// What a finished process left: its exit code (128 where it did not exit), stdout and stderr.
struct ProcessRun {
  int rc = -1;
  std::string out, err;
};

/// Runs `program` with `args` (each passed as it is, no shell parsing) and stdin from /dev/null,
/// and waits for it; its stdout and stderr go through files in `scratch_dir`.
ProcessRun run_process(const std::string& program, const std::vector<std::string>& args,
                       const std::string& scratch_dir);

/// A fresh folder under the system temp directory, removed with everything in it.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  /// The path of `name` inside the folder.
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  /// Writes `bytes` to `name` inside the folder; returns its path.
  std::string write(const std::string& name, const std::string& bytes) const;
  /// Makes `name` inside the folder a symbolic link to `target`.
  void link(const std::string& name, const std::string& target) const;

 private:
  std::string path_;
};

}  // namespace troupe::testing

/// Skips the test (or fails it, in CI) when ../shared is not there; sets `dir` to its path.
#define TROUPE_SHARED_OR_SKIP(dir)                                                    \
  std::string dir = ::troupe::testing::shared_dir();                                  \
  if (dir.empty()) {                                                                  \
    if (::troupe::testing::shared_required()) FAIL() << "../shared is required here"; \
    GTEST_SKIP() << "../shared not found (set TROUPE_SHARED_DIR); skipping";          \
  }
