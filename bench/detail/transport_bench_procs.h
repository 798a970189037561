// transport_bench's helpers: child processes with a piped stdout (spawn, read_until, finish)
// and ucx_perftest runs (Perftest, parse_perftest). Users: bench/transport_bench.cc only.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <sys/wait.h>

namespace troupe::bench {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// --- child processes ------------------------------------------------------------------------

struct Child {
  pid_t pid = -1;
  int out_fd = -1;  // its stdout
  int in_fd = -1;   // its stdin (ours to close), or -1
};

// Starts argv[0] (searched in PATH) with `env` added; stdout is piped to us.
inline std::optional<Child> spawn(const std::vector<std::string>& argv,
                                  const std::vector<std::pair<std::string, std::string>>& env,
                                  bool pipe_stdin) {
  int out[2], in[2] = {-1, -1};
  if (pipe2(out, O_CLOEXEC) != 0) return std::nullopt;
  if (pipe_stdin && pipe2(in, O_CLOEXEC) != 0) return std::nullopt;
  const pid_t pid = fork();
  if (pid < 0) return std::nullopt;
  if (pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    if (pipe_stdin) dup2(in[0], STDIN_FILENO);
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  close(out[1]);
  if (pipe_stdin) close(in[0]);
  return Child{pid, out[0], pipe_stdin ? in[1] : -1};
}

// Appends the child's output to `acc` until `done(acc)`, EOF or the deadline; true if done.
template <class Done>
bool read_until(Child& c, std::string* acc, Done done, Clock::time_point deadline) {
  char buf[4096];
  while (!done(*acc)) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd p{c.out_fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    const ssize_t n = read(c.out_fd, buf, sizeof(buf));
    if (n <= 0) return done(*acc);
    acc->append(buf, static_cast<size_t>(n));
  }
  return true;
}

// Waits for the child to exit (killing it at the deadline); its exit status, or -1.
inline int finish(Child& c, Clock::time_point deadline) {
  if (c.in_fd >= 0) close(c.in_fd);
  c.in_fd = -1;
  int status = 0;
  while (waitpid(c.pid, &status, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      kill(c.pid, SIGKILL);
      waitpid(c.pid, &status, 0);
      status = -1;
      break;
    }
    std::this_thread::sleep_for(5ms);
  }
  if (c.out_fd >= 0) close(c.out_fd);
  c.out_fd = -1;
  return status >= 0 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

inline std::string run_capture(const char* cmd) {
  std::string out;
  if (FILE* f = popen(cmd, "r")) {
    char buf[256];
    while (fgets(buf, sizeof(buf), f)) out += buf;
    pclose(f);
  }
  return out;
}

// --- ucx_perftest -----------------------------------------------------------------------------

// perftest's numbers: the last line of its -f output that ends in 8 numbers
// (iterations, latency p50/avg/overall us, bandwidth avg/overall MB/s, msg rate avg/overall).
struct PerftestResult {
  double lat_p50_us = 0, lat_avg_us = 0, bw_bytes_s = 0;
};

inline std::optional<PerftestResult> parse_perftest(const std::string& out) {
  std::optional<PerftestResult> best;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream ws(line);
    std::vector<double> nums;
    for (std::string w; ws >> w;) {
      char* end = nullptr;
      const double v = std::strtod(w.c_str(), &end);
      if (end != w.c_str() && *end == '\0') nums.push_back(v);
    }
    if (nums.size() < 8) continue;
    const double* n = nums.data() + nums.size() - 8;
    // ucx_perftest's MB is 2^20 bytes; its latency is already one-way (round trip / 2).
    best = PerftestResult{n[1], n[3], n[5] * 1048576.0};
  }
  return best;
}

// True when something listens on TCP `port` (any address), from /proc/net/tcp{,6}.
inline bool port_listening(unsigned port) {
  for (const char* file : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    FILE* f = std::fopen(file, "r");
    if (!f) continue;
    char line[512];
    bool found = false;
    while (!found && std::fgets(line, sizeof(line), f)) {
      char local[128], remote[128];
      unsigned st = 0;
      if (std::sscanf(line, "%*s %127s %127s %x", local, remote, &st) != 3) continue;
      const char* colon = std::strrchr(local, ':');
      found = colon && st == 0x0A && std::strtoul(colon + 1, nullptr, 16) == port;
    }
    std::fclose(f);
    if (found) return true;
  }
  return false;
}

// Waits until the child listens on `port`; false if it exited or the deadline passed.
inline bool wait_listening(const Child& c, unsigned port, Clock::time_point deadline) {
  while (Clock::now() < deadline) {
    if (port_listening(port)) return true;
    int status = 0;
    if (waitpid(c.pid, &status, WNOHANG) == c.pid) return false;
    std::this_thread::sleep_for(2ms);
  }
  return false;
}

class Perftest {
 public:
  explicit Perftest(std::string path) : path_(std::move(path)) {}
  // One run of `ucx_perftest -t test -s size -n iters` over UCX_TLS=tls (with -e when `peer`).
  std::optional<PerftestResult> run(const std::string& tls, bool peer, const char* test,
                                    size_t size, uint64_t iters);

 private:
  std::string path_;
  std::mt19937 rng_{static_cast<uint32_t>(getpid())};
};

inline std::optional<PerftestResult> Perftest::run(const std::string& tls, bool peer,
                                                   const char* test, size_t size, uint64_t iters) {
  const std::vector<std::pair<std::string, std::string>> env = {{"UCX_TLS", tls},
                                                                {"UCX_NET_DEVICES", "lo"}};
  for (int attempt = 0; attempt < 3; ++attempt) {
    const unsigned port_num = 20000 + rng_() % 20000;
    const std::string port = std::to_string(port_num);
    auto server = spawn({path_, "-p", port}, env, false);
    if (!server) return std::nullopt;
    // Its "Waiting for connection" sits in a stdio buffer (stdout is a pipe), and a test
    // connection would be taken for the client: wait for the listening socket instead.
    if (!wait_listening(*server, port_num, Clock::now() + 15s)) {
      finish(*server, Clock::now() + 1s);  // the port was taken, or perftest is broken
      continue;
    }
    const uint64_t warmup = std::clamp<uint64_t>(iters / 10, 2, 1000);
    std::vector<std::string> argv = {path_, "127.0.0.1",
                                     "-p",  port,
                                     "-t",  test,
                                     "-s",  std::to_string(size),
                                     "-n",  std::to_string(iters),
                                     "-w",  std::to_string(warmup),
                                     "-f"};
    if (peer) argv.push_back("-e");
    auto client = spawn(argv, env, false);
    std::string cout_;
    if (client)
      read_until(
          *client, &cout_, [](const std::string&) { return false; }, Clock::now() + 60s);
    const int rc = client ? finish(*client, Clock::now() + 5s) : -1;
    finish(*server, Clock::now() + 5s);
    if (rc != 0) {
      std::fprintf(stderr, "transport_bench: ucx_perftest %s -s %zu failed (exit %d)\n", test, size,
                   rc);
      return std::nullopt;
    }
    return parse_perftest(cout_);
  }
  return std::nullopt;
}

inline bool in_path(const std::string& name) {
  if (name.find('/') != std::string::npos) return access(name.c_str(), X_OK) == 0;
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "");
  for (std::string d; std::getline(dirs, d, ':');)
    if (!d.empty() && access((d + "/" + name).c_str(), X_OK) == 0) return true;
  return false;
}

}  // namespace troupe::bench
