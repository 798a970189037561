// multihost_bench: `troupe serve` + `troupe node` daemons as separate processes on loopback (one
// pipeline stage per daemon) against the in-process actor system (LocalCluster, the same plan
// without the cluster): start-up time by phase, and generated tokens/s at 1 and 16 concurrent
// requests, side by side in each of several rounds; prints medians and ratios.
// Usage: multihost_bench MODEL [--runs 3] [--daemons 2,3] [--concurrency 1,16] [--prompt 64]
//                        [--gen 64] [--troupe PATH] [--tls TLS] [--timeout-s 300] [--no-reference]
//                        [--weights auto|memory|map]   (the daemons' [model] weights; the
//                        in-process runs read their weights the same way)
// Daemons are killed on every exit path (SIGKILL when the bench dies, via PR_SET_PDEATHSIG).
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <nlohmann/json.hpp>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "actors/cluster_client.h"
#include "actors/local_cluster.h"
#include "actors/plan.h"
#include "bench/detail/args.h"
#include "bench/detail/ports.h"
#include "compute/matmul.h"
#include "model/model.h"

using namespace troupe;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

constexpr const char* kToken = "multihost-bench-token";
constexpr int kMaxChildren = 16;

// Pids of live daemons, for the signal handler (async-signal-safe: plain stores and loads).
volatile pid_t g_children[kMaxChildren] = {};

void kill_all_children() {
  for (auto& p : g_children)
    if (p > 0) {
      ::kill(p, SIGKILL);
      ::waitpid(p, nullptr, 0);
      p = 0;
    }
}

void on_signal(int sig) {
  for (auto& p : g_children)
    if (p > 0) ::kill(p, SIGKILL);
  _exit(128 + sig);
}

[[noreturn]] void fail(const std::string& msg) {
  std::fflush(stdout);
  std::fprintf(stderr, "multihost_bench: %s\n", msg.c_str());
  kill_all_children();
  std::exit(1);
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string tail(const std::string& s, size_t n) {
  return s.size() > n ? s.substr(s.size() - n) : s;
}

// A port that was free a moment ago (the daemons bind it; a race is reported as a start failure).
uint16_t free_port() {
  const uint16_t p = bench::free_loopback_port();
  if (p == 0) fail("cannot find a free loopback port");
  return p;
}

struct Options {
  std::string model, troupe, tls, dir;
  std::string weights = "auto";
  int runs = 3;
  std::vector<int> daemons = {2, 3}, concurrency = {1, 16};
  int64_t prompt = 64, gen = 64;
  int timeout_s = 300;
  bool reference = true;
  bool pull = true;  // [cluster] same_host_pull (the daemons share this host)
};

// The plan text: one stage per node, `threads` compute threads each. With `cluster` false the
// same plan without [cluster], [[node]] and the stages' node keys (the single-process system).
std::string plan_text(const Options& o, int n, int threads, bool cluster,
                      const std::vector<uint16_t>& ports) {
  std::ostringstream t;
  t << "[model]\npath = \"" << o.model << "\"\nweights = \"" << o.weights << "\"\n";
  if (cluster) {
    t << "[cluster]\nname = \"bench\"\ntoken = \"" << kToken << "\"\nhead = \"n0\"\n"
      << "ucx_net_devices = \"lo\"\nucx_tls = \"" << o.tls << "\"\n"
      << "same_host_pull = " << (o.pull ? "true" : "false") << "\n";
    for (int i = 0; i < n; ++i)
      t << "[[node]]\nname = \"n" << i << "\"\naddress = \"127.0.0.1:" << ports[size_t(i)]
        << "\"\n";
  }
  for (int i = 0; i < n; ++i) {
    t << "[[stage]]\nthreads = " << threads << "\n";
    if (cluster) t << "node = \"n" << i << "\"\n";
  }
  // A micro-batch per stage keeps every stage busy at 16 requests; no prefix cache (the prompts
  // share nothing); the KV pool is the auto size for max_sequences full-length sequences.
  t << "[scheduler]\nmax_sequences = 16\nmax_tokens_per_step = 512\nmax_model_len = "
    << (o.prompt + o.gen + 64) << "\nmicrobatches = " << n << "\nprefix_cache = false\n";
  return t.str();
}

// --- daemons ------------------------------------------------------------------------------

struct Daemon {
  pid_t pid = -1;
  int slot = -1;
  std::string name, log;
};

// Forks and execs `argv` with stdout+stderr to `log`; the child dies with the bench.
Daemon spawn(const std::vector<std::string>& argv, const std::string& name,
             const std::string& log) {
  Daemon d;
  d.name = name;
  d.log = log;
  for (int i = 0; i < kMaxChildren && d.slot < 0; ++i)
    if (g_children[i] == 0) d.slot = i;
  if (d.slot < 0) fail("too many daemons");
  std::vector<char*> cargv;
  std::vector<std::string> copy = argv;
  for (auto& a : copy) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) fail("fork failed");
  if (pid == 0) {  // only async-signal-safe calls until exec
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  d.pid = pid;
  g_children[d.slot] = pid;
  return d;
}

// Exit status of `d` if it has exited (reaped), else -1.
int poll_exit(Daemon& d) {
  int st = 0;
  if (d.pid <= 0 || ::waitpid(d.pid, &st, WNOHANG) != d.pid) return -1;
  g_children[d.slot] = 0;
  d.pid = -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

// SIGTERM (the daemon leaves the cluster cleanly), then SIGKILL after `grace`.
void stop(Daemon& d, std::chrono::milliseconds grace) {
  if (d.pid <= 0) return;
  ::kill(d.pid, SIGTERM);
  const auto end = Clock::now() + grace;
  while (Clock::now() < end)
    if (poll_exit(d) >= 0)
      return;
    else
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ::kill(d.pid, SIGKILL);
  ::waitpid(d.pid, nullptr, 0);
  g_children[d.slot] = 0;
  d.pid = -1;
}

struct Phase {
  std::string node, name;
  double start_ms = 0, duration_ms = 0;
};

// One cluster of n daemons: started, measured, stopped (also by the destructor).
class DaemonCluster {
 public:
  DaemonCluster(const Options& o, int n, int round) : o_(o), n_(n), round_(round) {}
  ~DaemonCluster() { stop_all(); }

  /// Spawns the head and n-1 nodes; returns the seconds from the first fork to "serving".
  double start() {
    std::vector<uint16_t> ports;
    for (int i = 0; i < n_; ++i) ports.push_back(free_port());
    port_ = ports[0];
    const std::string tag = o_.dir + "/c" + std::to_string(n_) + "-r" + std::to_string(round_);
    conf_ = tag + ".toml";
    std::ofstream(conf_) << plan_text(o_, n_, 1, true, ports);
    const auto t0 = Clock::now();
    for (int i = 0; i < n_; ++i) {
      const std::string name = "n" + std::to_string(i);
      std::vector<std::string> argv = {o_.troupe, i == 0 ? "serve" : "node", "--config", conf_};
      if (i > 0) argv.insert(argv.end(), {"--name", name});
      daemons_.push_back(spawn(argv, name, tag + "-" + name + ".log"));
    }
    const auto deadline = t0 + std::chrono::seconds(o_.timeout_s);
    while (read_text(daemons_[0].log).find("the cluster is serving") == std::string::npos) {
      for (auto& d : daemons_)
        if (const int rc = poll_exit(d); rc >= 0)
          fail("daemon " + d.name + " exited (status " + std::to_string(rc) +
               ") before the cluster served; its log " + d.log + " ends:\n" +
               tail(read_text(d.log), 2000));
      if (Clock::now() > deadline)
        fail(std::to_string(n_) + "-daemon cluster not serving after " +
             std::to_string(o_.timeout_s) + " s; head log " + daemons_[0].log + " ends:\n" +
             tail(read_text(daemons_[0].log), 2000));
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    const double serving_s = seconds_since(t0);
    auto c = actors::ClusterClient::connect("127.0.0.1", port_, kToken);
    if (!c) fail("cannot connect to the head: " + c.error().message);
    client_ = std::move(*c);
    return serving_s;
  }

  /// Every node's start-up phases from the head's status snapshot.
  std::vector<Phase> phases() {
    auto s = client_->status_json();
    if (!s) fail("status from the head: " + s.error().message);
    const auto j = nlohmann::json::parse(*s);
    if (!j.value("serving", false)) fail("the head reports not serving: " + *s);
    std::vector<Phase> out;
    for (const auto& p : j.at("phases"))
      out.push_back({p.at("node").get<std::string>(), p.at("name").get<std::string>(),
                     p.at("start_ms").get<double>(), p.at("duration_ms").get<double>()});
    return out;
  }

  std::vector<actors::GenerateResult> generate(const std::vector<actors::GenerateRequest>& reqs,
                                               size_t concurrency) {
    return client_->generate_many(reqs, concurrency, nullptr,
                                  std::chrono::milliseconds(o_.timeout_s * 1000));
  }

  void stop_all() {
    client_.reset();
    for (size_t i = daemons_.size(); i-- > 0;) stop(daemons_[i], std::chrono::seconds(10));
    daemons_.clear();
  }

 private:
  const Options& o_;
  int n_, round_;
  uint16_t port_ = 0;
  std::string conf_;
  std::vector<Daemon> daemons_;
  std::unique_ptr<actors::ClusterClient> client_;
};

// --- requests and measurements ------------------------------------------------------------

std::vector<actors::GenerateRequest> make_requests(int k, int64_t prompt, int64_t gen,
                                                   int64_t vocab) {
  std::vector<actors::GenerateRequest> reqs;
  for (int i = 0; i < k; ++i) {
    std::mt19937 rng(static_cast<uint32_t>(1000 + i));
    actors::GenerateRequest r;
    for (int64_t t = 0; t < prompt; ++t)
      r.prompt_tokens.push_back(static_cast<int32_t>(3 + rng() % static_cast<uint32_t>(vocab - 3)));
    r.max_tokens = gen;
    r.sampling.ignore_eos = true;  // greedy (temperature 0) is the default
    reqs.push_back(std::move(r));
  }
  return reqs;
}

// Generated tokens/s of one generate_many call through `run`; fails on any request error.
template <typename Run>
double tokens_per_s(Run&& run, const std::vector<actors::GenerateRequest>& reqs, int k,
                    const std::string& what) {
  const auto t0 = Clock::now();
  const auto res = run(reqs, static_cast<size_t>(k));
  const double wall = seconds_since(t0);
  double tokens = 0;
  for (const auto& r : res) {
    if (!r.ok()) fail(what + ": request failed: " + r.error);
    tokens += static_cast<double>(r.tokens.size());
  }
  if (tokens != static_cast<double>(reqs.size() * size_t(reqs[0].max_tokens)))
    fail(what + ": fewer tokens than asked (ignore_eos not honoured?)");
  return tokens / wall;
}

// Key: configuration name ("3 daemons", "3 stages in-process", ...) and concurrency.
using Samples = std::map<std::pair<std::string, int>, std::vector<double>>;

struct Bench {
  Options o;
  std::shared_ptr<const model::Model> model;
  std::map<int, std::vector<actors::GenerateRequest>> reqs;  // by concurrency
  std::vector<actors::GenerateRequest> warmup;
  Samples tps;
  std::map<int, std::vector<double>> serving_s;  // by daemons
  std::map<int, std::map<std::pair<std::string, std::string>, std::vector<Phase>>> phases;
  std::map<int, std::vector<std::pair<std::string, std::string>>> phase_order;  // as reported

  void run_cluster(int n, int round) {
    const std::string cfg = std::to_string(n) + " daemons";
    DaemonCluster c(o, n, round);
    serving_s[n].push_back(c.start());
    for (const auto& p : c.phases()) {
      auto& v = phases[n][{p.node, p.name}];
      if (v.empty()) phase_order[n].push_back({p.node, p.name});
      v.push_back(p);
    }
    auto gen = [&](const auto& r, size_t k) { return c.generate(r, k); };
    tokens_per_s(gen, warmup, 1, cfg + " warm-up");
    for (int k : o.concurrency) {
      tps[{cfg, k}].push_back(tokens_per_s(gen, reqs[k], k, cfg));
      std::printf("  round %d  %-26s concurrency %-3d %7.2f tokens/s\n", round + 1, cfg.c_str(), k,
                  tps[{cfg, k}].back());
      std::fflush(stdout);
    }
  }

  void run_local(int stages, int threads, int round, const std::string& cfg) {
    auto plan = actors::parse_plan_string(plan_text(o, stages, threads, false, {}), "bench plan");
    if (!plan) fail(plan.error().message);
    if (auto s = actors::resolve_plan(*plan, model->spec); !s) fail(s.error().message);
    auto lc = actors::LocalCluster::start(*plan, model);
    if (!lc) fail(cfg + ": " + lc.error().message);
    auto gen = [&](const auto& r, size_t k) { return (*lc)->generate_many(r, k); };
    tokens_per_s(gen, warmup, 1, cfg + " warm-up");
    for (int k : o.concurrency) {
      tps[{cfg, k}].push_back(tokens_per_s(gen, reqs[k], k, cfg));
      std::printf("  round %d  %-26s concurrency %-3d %7.2f tokens/s\n", round + 1, cfg.c_str(), k,
                  tps[{cfg, k}].back());
      std::fflush(stdout);
    }
  }
};

// --- report -------------------------------------------------------------------------------

void print_startup(const Bench& b, int n) {
  std::printf(
      "\nstart-up, %d daemons (median of %d starts; start = ms since that process's "
      "ClusterNode::start):\n",
      n, b.o.runs);
  std::printf("| node | phase | start ms | duration ms |\n|---|---|---|---|\n");
  // Phases in the order the head reports them (per node, in start order).
  const auto& order = b.phase_order.at(n);
  std::map<std::pair<std::string, std::string>, double> first_start;
  for (const auto& key : order) {
    std::vector<double> s;
    for (const auto& p : b.phases.at(n).at(key)) s.push_back(p.start_ms);
    first_start[key] = median(s);
  }
  double head_serving_ms = 0;
  for (const auto& key : order) {
    std::vector<double> d;
    for (const auto& p : b.phases.at(n).at(key)) d.push_back(p.duration_ms);
    std::printf("| %s | %s | %.0f | %.0f |\n", key.first.c_str(), key.second.c_str(),
                first_start[key], median(d));
    if (key.first == "n0" && key.second == "placement")
      head_serving_ms = first_start[key] + median(d);
  }
  std::printf(
      "head: serving %.0f ms after its ClusterNode::start; bench: %.0f ms from the first "
      "fork to the head's \"serving\" line (median; each: ",
      head_serving_ms, 1000 * median(b.serving_s.at(n)));
  for (double s : b.serving_s.at(n)) std::printf("%.0f ", 1000 * s);
  std::printf("ms)\n");
}

void print_throughput(const Bench& b,
                      const std::vector<std::pair<std::string, std::string>>& pairs) {
  std::printf(
      "\ngenerated tokens/s, median of %d rounds (each round runs every configuration "
      "back to back; ratio = median of the per-round ratios):\n",
      b.o.runs);
  std::printf(
      "| configuration | concurrency | tokens/s | runs | vs in-process | extra ms per step "
      "|\n|---|---|---|---|---|---|\n");
  auto line = [&](const std::string& cfg, int k, const std::string& base) {
    const auto& v = b.tps.at({cfg, k});
    std::string runs;
    for (double x : v) {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%s%.1f", runs.empty() ? "" : " ", x);
      runs += buf;
    }
    std::string ratio = "", extra = "";
    if (!base.empty()) {
      const auto& w = b.tps.at({base, k});
      std::vector<double> r, e;
      for (size_t i = 0; i < v.size() && i < w.size(); ++i) {
        r.push_back(v[i] / w[i]);
        // Steps per request: one per generated token (the first comes from the prefill step);
        // requests run together, so the run has about `gen` steps of which each got slower by:
        e.push_back(1000.0 * (k / v[i] - k / w[i]));
      }
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%.3fx", median(r));
      ratio = buf;
      std::snprintf(buf, sizeof(buf), "%+.2f", median(e));
      extra = buf;
    }
    std::printf("| %s | %d | %.2f | %s | %s | %s |\n", cfg.c_str(), k, median(v), runs.c_str(),
                ratio.c_str(), extra.c_str());
  };
  for (int k : b.o.concurrency) {
    for (const auto& [cfg, base] : pairs) {
      if (!base.empty()) line(base, k, "");
      line(cfg, k, base);
    }
    if (b.o.reference) line("1 stage x 2 threads in-process", k, "");
  }
}

Options parse_args(int argc, char** argv) {
  bench::model_arg_or_usage(
      argc, argv,
      "usage: multihost_bench MODEL [--runs 3] [--daemons 2,3] [--concurrency 1,16] [--prompt 64] "
      "[--gen 64] [--troupe PATH] [--tls TLS] [--timeout-s 300] [--no-reference] "
      "[--weights auto|memory|map] [--pull on|off]");
  Options o;
  o.model = fs::absolute(argv[1]).string();
  o.troupe = (fs::canonical("/proc/self/exe").parent_path().parent_path() / "bin/troupe").string();
  const char* tool = "multihost_bench";
  auto list = [&](const std::string& k, const std::string& v, int64_t hi) {
    std::vector<int> out;
    for (const int64_t n : bench::int_list_arg(tool, k, v, 1, hi))
      out.push_back(static_cast<int>(n));
    return out;
  };
  for (int i = 2; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--no-reference") {
      o.reference = false;
      continue;
    }
    const std::string v = bench::value_arg(tool, argc, argv, i);
    if (k == "--runs")
      o.runs = static_cast<int>(bench::int_arg(tool, k, v, 1, 1000));
    else if (k == "--daemons")
      o.daemons = list(k, v, kMaxChildren);
    else if (k == "--concurrency")
      o.concurrency = list(k, v, 4096);
    else if (k == "--prompt")
      o.prompt = bench::int_arg(tool, k, v, 1, 1 << 20);
    else if (k == "--gen")
      o.gen = bench::int_arg(tool, k, v, 1, 1 << 20);
    else if (k == "--troupe")
      o.troupe = v;
    else if (k == "--tls")
      o.tls = v;
    else if (k == "--weights")
      o.weights = v;
    else if (k == "--timeout-s")
      o.timeout_s = static_cast<int>(bench::int_arg(tool, k, v, 1, 86400));
    else if (k == "--pull" && (v == "on" || v == "off"))
      o.pull = v == "on";
    else
      bench::usage_error(tool, "unknown option '" + k + "' or value '" + v + "'");
  }
  for (int n : o.daemons)
    if (n < 1 || n > kMaxChildren) fail("--daemons: each count must be in [1, 16]");
  if (!model::parse_weight_storage(o.weights)) fail("--weights: expected auto, memory or map");
  if (access(o.troupe.c_str(), X_OK) != 0)
    fail("no troupe binary at " + o.troupe + " (build the `troupe` target or pass --troupe)");
  return o;
}

// The machine's read bandwidth, by the sibling membw_bench when it is built (a few seconds).
void print_membw() {
  const fs::path mb = fs::canonical("/proc/self/exe").parent_path() / "membw_bench";
  if (access(mb.c_str(), X_OK) != 0) {
    std::printf(
        "memory bandwidth: membw_bench not built (docs/benchmarks.md: 24.5 GB/s with 1 "
        "thread, 48.7 with 2)\n");
    return;
  }
  FILE* p = popen((mb.string() + " 512 5").c_str(), "r");
  char line[256];
  while (p && fgets(line, sizeof(line), p))
    if (std::string(line).rfind("read bandwidth", 0) == 0) std::printf("memory %s", line);
  if (p) pclose(p);
}

void print_header(const Options& o, const model::Model& m) {
#ifdef NDEBUG
  const char* build = "release";
#else
  const char* build = "DEBUG (numbers are not meaningful)";
#endif
  std::printf("multihost_bench: %u hardware threads, %ld MiB memory, simd %s, build %s\n",
              std::thread::hardware_concurrency(),
              sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGE_SIZE) / (1 << 20), compute::simd_level(),
              build);
  print_membw();
  const double mb = static_cast<double>(fs::file_size(o.model)) / 1e6;
  std::printf("model %s: %.0f MB, %lld layers (~%.0f MB of weights read per decode step)\n",
              o.model.c_str(), mb, (long long)m.spec.n_layer, mb);
  std::printf("requests: %lld prompt tokens, %lld generated, greedy, ignore_eos; concurrency:",
              (long long)o.prompt, (long long)o.gen);
  for (int k : o.concurrency) std::printf(" %d", k);
  std::printf("; %d rounds\n", o.runs);
  std::printf(
      "daemons: one pipeline stage each, 1 compute thread per stage (%u hardware threads: "
      "3 stages oversubscribe them), UCX %s on loopback, same-host pulls %s; troupe %s\n",
      std::thread::hardware_concurrency(), o.tls.empty() ? "default transports" : o.tls.c_str(),
      o.pull ? "on" : "off", o.troupe.c_str());
  std::printf("in-process: LocalCluster with the same plan minus [cluster]/[[node]]\n\n");
}

}  // namespace

int main(int argc, char** argv) {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGHUP, &sa, nullptr);
  Bench b;
  b.o = parse_args(argc, argv);
  auto m = model::load_model(b.o.model);
  if (!m) fail(m.error().message);
  b.model = *m;
  print_header(b.o, *b.model);
  // The in-process runs read their weights as the daemons do (each daemon copies its own
  // stage's tensors under "auto" or "memory"; here one copy of all of them).
  {
    std::string why;
    auto placed = model::place_weights(b.model, *model::parse_weight_storage(b.o.weights), {}, 2,
                                       &why, compute::tiled_weight_types());
    if (!placed) fail(placed.error().message);
    const bool copied = *placed != b.model;
    b.model = *placed;
    std::printf("weights (--weights %s): in-process runs read them from %s%s%s\n",
                b.o.weights.c_str(), copied ? "huge-page memory" : "the file mapping",
                why.empty() ? "" : ": ", why.c_str());
  }
  b.o.dir = (fs::temp_directory_path() / ("troupe_multihost_" + std::to_string(getpid()))).string();
  fs::create_directories(b.o.dir);
  for (int k : b.o.concurrency)
    b.reqs[k] = make_requests(k, b.o.prompt, b.o.gen, b.model->spec.n_vocab);
  b.warmup = make_requests(1, 8, 4, b.model->spec.n_vocab);
  std::vector<std::pair<std::string, std::string>> pairs;
  for (int n : b.o.daemons)
    pairs.push_back({std::to_string(n) + " daemons", std::to_string(n) + " stages in-process"});
  const auto t0 = Clock::now();
  for (int r = 0; r < b.o.runs; ++r) {
    for (int n : b.o.daemons) {
      b.run_cluster(n, r);
      b.run_local(n, 1, r, std::to_string(n) + " stages in-process");
    }
    if (b.o.reference) b.run_local(1, 2, r, "1 stage x 2 threads in-process");
    std::printf("  round %d done after %.0f s\n", r + 1, seconds_since(t0));
  }
  for (int n : b.o.daemons) print_startup(b, n);
  print_throughput(b, pairs);
  std::printf(
      "\n\"extra ms per step\" = (concurrency / tokens/s) difference: the added wall time "
      "per generation step when every request takes one token per step.\n");
  fs::remove_all(b.o.dir);
  return 0;
}
