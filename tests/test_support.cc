#include "tests/test_support.h"

#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <sys/stat.h>
#include <sys/wait.h>

namespace troupe::testing {

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

std::string shared_dir() {
  if (const char* e = std::getenv("TROUPE_SHARED_DIR"); e && *e) {
    return file_exists(std::string(e) + "/README.md") ? std::string(e) : std::string();
  }
  std::string d = TROUPE_SHARED_DIR_DEFAULT;
  return file_exists(d + "/README.md") ? d : std::string();
}

std::string binary_dir() { return TROUPE_BINARY_DIR; }
std::string source_dir() { return TROUPE_SOURCE_DIR; }

int count_lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

namespace {

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

}  // namespace

ProcessRun run_process(const std::string& program, const std::vector<std::string>& args,
                       const std::string& scratch_dir) {
  std::string cmd = shell_quote(program);
  for (const auto& a : args) cmd += " " + shell_quote(a);
  const std::string o = scratch_dir + "/out.txt", e = scratch_dir + "/err.txt";
  cmd += " >" + shell_quote(o) + " 2>" + shell_quote(e) + " </dev/null";
  ProcessRun r;
  const int st = std::system(cmd.c_str());
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
  r.out = read_text_file(o);
  r.err = read_text_file(e);
  return r;
}

bool shared_required() {
  const char* e = std::getenv("TROUPE_REQUIRE_SHARED");
  return e && std::string(e) == "1";
}

std::vector<float> read_f32_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  f.seekg(0, std::ios::end);
  const auto n = static_cast<size_t>(f.tellg());
  f.seekg(0);
  std::vector<float> v(n / 4);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
  return v;
}

std::string read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string model_param_name(const std::string& path) {
  std::string s = path.substr(0, path.rfind('/'));
  s = s.substr(s.rfind('/') + 1);
  for (char& ch : s) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return s;
}

TempDir::TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "troupe-test-XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed for " + tmpl);
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string TempDir::write(const std::string& name, const std::string& bytes) const {
  const std::string p = file(name);
  std::ofstream(p, std::ios::binary) << bytes;
  return p;
}

void TempDir::link(const std::string& name, const std::string& target) const {
  std::filesystem::create_symlink(target, file(name));
}

}  // namespace troupe::testing
