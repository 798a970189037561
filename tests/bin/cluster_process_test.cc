// Multi-process clusters: `troupe serve` and `troupe node` daemons as real processes — on
// loopback, and in network namespaces joined by veth pairs and a bridge with UCX over TCP only —
// serve requests whose greedy tokens and logits are bit-identical to the single-process actor
// system; 16 daemons form a cluster; a daemon that gets SIGTERM leaves; a wrong token is refused.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <nlohmann/json.hpp>
#include <sys/socket.h>
#include <sys/wait.h>

#include "actors/cluster_client.h"
#include "actors/local_cluster.h"
#include "actors/plan.h"
#include "model/model.h"
#include "tests/cluster_test_util.h"
#include "tests/hf_twin_model.h"
#include "tests/serve/http_client.h"
#include "tests/test_support.h"

namespace troupe {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::expect_same;
using testing::free_port;
using testing::generate_with_fault;
using testing::local_results;

std::vector<actors::GenerateRequest> requests(int64_t n_vocab) {
  return testing::cluster_requests(n_vocab, 3, 8, 11);
}

// A fresh folder per test process, removed at exit: a folder named after the process id alone
// could be a finished process's (ids come round), whose daemon logs a test would then read.
fs::path temp_dir() {
  static const testing::TempDir d;
  return d.path();
}

// A daemon process; killed (SIGKILL) if still running when the test ends.
struct Daemon {
  pid_t pid = -1;
  std::string log;
  ~Daemon() { kill_now(); }
  void kill_now() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
      pid = -1;
    }
  }
  // SIGTERM and wait (up to 10 s); the exit status, or -1.
  int terminate() {
    if (pid <= 0) return -1;
    ::kill(pid, SIGTERM);
    return wait_exit(10s);
  }
  // Waits for the process to exit by itself; its status, or -1 after `timeout`.
  int wait_exit(std::chrono::milliseconds timeout) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
      int st = 0;
      if (::waitpid(pid, &st, WNOHANG) == pid) {
        pid = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
      std::this_thread::sleep_for(10ms);
    }
    return -1;
  }
  // The log so far ("" until the child has created it).
  std::string output() const {
    return testing::file_exists(log) ? testing::read_text_file(log) : std::string();
  }
};

// Starts `prefix... troupe args...` with stdout+stderr to a log file.
std::unique_ptr<Daemon> spawn(const std::vector<std::string>& prefix,
                              const std::vector<std::string>& args, const std::string& name) {
  auto d = std::make_unique<Daemon>();
  // A log of its own: an earlier test's daemon of the same name left its log in this process's
  // folder, which wait_log could read before the new child truncates it.
  static int spawned = 0;
  d->log = (temp_dir() / (name + "." + std::to_string(++spawned) + ".log")).string();
  std::vector<std::string> argv = prefix;
  argv.push_back(testing::binary_dir() + "/bin/troupe");
  argv.insert(argv.end(), args.begin(), args.end());
  const pid_t pid = fork();
  if (pid == 0) {
    FILE* f = std::fopen(d->log.c_str(), "w");
    if (f) {
      dup2(fileno(f), 1);
      dup2(fileno(f), 2);
    }
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    execvp(cargv[0], cargv.data());
    _exit(127);
  }
  d->pid = pid;
  return d;
}

bool wait_log(const Daemon& d, const std::string& text, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (d.output().find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

struct Node {
  std::string name, host;
  uint16_t port = 0;
};

std::string cluster_file(const std::string& model, const std::vector<Node>& nodes,
                         const std::vector<std::string>& stage_nodes,
                         const std::vector<std::string>& shard_nodes, const std::string& extra,
                         const std::string& name) {
  std::string t = "[model]\npath = \"" + model + "\"\n[cluster]\ntoken = \"proc-token\"\n";
  t += "head = \"" + nodes[0].name + "\"\nheartbeat_ms = 200\nlease_ms = 2000\n" + extra;
  for (const auto& n : nodes)
    t += "[[node]]\nname = \"" + n.name + "\"\naddress = \"" + n.host + ":" +
         std::to_string(n.port) + "\"\n";
  for (const auto& s : stage_nodes) t += "[[stage]]\nnode = \"" + s + "\"\n";
  for (const auto& s : shard_nodes) t += "[[expert_shard]]\nnode = \"" + s + "\"\n";
  // threads "auto": each daemon divides its CPUs among the actors placed on it (node_place.cc);
  // the outputs must not depend on it.
  t += "[stages]\nkv_blocks = 64\nthreads = \"auto\"\n";
  if (!shard_nodes.empty()) t += "[expert_shards]\nthreads = \"auto\"\n";
  t += "[scheduler]\nmax_sequences = 8\nmax_model_len = 256\n";
  const std::string path = (temp_dir() / (name + ".toml")).string();
  std::ofstream(path) << t;
  return path;
}

// Starts the head (serve) and the other nodes; waits until the head serves.
std::vector<std::unique_ptr<Daemon>> start_cluster(
    const std::string& conf, const std::vector<Node>& nodes,
    const std::vector<std::vector<std::string>>& prefix) {
  std::vector<std::unique_ptr<Daemon>> ds;
  for (size_t i = 0; i < nodes.size(); ++i) {
    std::vector<std::string> args = {i == 0 ? "serve" : "node", "--config", conf};
    if (i > 0) {
      args.push_back("--name");
      args.push_back(nodes[i].name);
    }
    ds.push_back(
        spawn(prefix.empty() ? std::vector<std::string>{} : prefix[i], args, nodes[i].name));
  }
  EXPECT_TRUE(wait_log(*ds[0], "the cluster is serving", 120s)) << ds[0]->output();
  return ds;
}

std::vector<Node> loopback_nodes(size_t n) {
  std::vector<Node> nodes;
  for (size_t i = 0; i < n; ++i)
    nodes.push_back({"n" + std::to_string(i), "127.0.0.1", free_port()});
  return nodes;
}

void run_loopback(const std::string& rel, const std::vector<std::string>& stages,
                  const std::vector<std::string>& shards) {
  TROUPE_SHARED_OR_SKIP(shared);
  const std::string path = shared + "/" + rel;
  auto m = model::load_model(path);
  ASSERT_TRUE(m);
  const auto reqs = requests((*m)->spec.n_vocab);
  const auto want = local_results(path, reqs);
  const auto nodes = loopback_nodes(3);
  const std::string conf =
      cluster_file(path, nodes, stages, shards, "ucx_net_devices = \"lo\"\n", "loopback");
  auto ds = start_cluster(conf, nodes, {});
  auto client = actors::ClusterClient::connect("127.0.0.1", nodes[0].port, "proc-token");
  ASSERT_TRUE(client) << client.error().message;
  expect_same((*client)->generate_many(reqs), want);
  // SIGTERM: every daemon leaves cleanly (exit 0), and the head names each one that left.
  for (size_t i = ds.size(); i-- > 0;) {
    EXPECT_EQ(ds[i]->terminate(), 0) << ds[i]->output();
    if (i > 0) {
      EXPECT_TRUE(wait_log(*ds[0], "node " + nodes[i].name + " is left", 5s)) << ds[0]->output();
    }
  }
}

// `troupe serve --model`: a one-node cluster in one process, answering over HTTP, leaving cleanly
// on SIGTERM; its options refused where they do not belong.
TEST(ServeProcess, ServeModelAnswersOverHttpAndLeavesOnSigterm) {
  TROUPE_SHARED_OR_SKIP(shared);
  const std::string model = shared + "/models/stories260K/stories260K.gguf";
  const uint16_t port = free_port();
  auto d = spawn({},
                 {"serve", "--model", model, "--http", "127.0.0.1:" + std::to_string(port),
                  "--served-model-name", "tiny", "--chat-template",
                  testing::source_dir() + "/tests/model/chat_templates/llama2_sys.jinja",
                  "--reasoning-parser", "deepseek_r1"},
                 "serve-model");
  ASSERT_TRUE(wait_log(*d, "the cluster is serving", 60s)) << d->output();
  EXPECT_NE(d->output().find("HTTP API on http://127.0.0.1:" + std::to_string(port)),
            std::string::npos)
      << d->output();
  EXPECT_EQ(serve::testing::http(port, "GET", "/ready").status, 200);
  const auto a = serve::testing::http(
      port, "POST", "/v1/completions",
      R"({"model": "tiny", "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0})");
  ASSERT_EQ(a.status, 200) << a.body;
  const auto j = nlohmann::json::parse(a.body);
  EXPECT_EQ(j["usage"]["completion_tokens"], 8);
  // stories260K has no chat template: --chat-template gives it one.
  const auto chat = serve::testing::http(
      port, "POST", "/v1/chat/completions",
      R"({"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})");
  ASSERT_EQ(chat.status, 200) << chat.body;
  EXPECT_EQ(nlohmann::json::parse(chat.body)["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(d->terminate(), 0) << d->output();
  EXPECT_NE(d->output().find("leaving (SIGTERM)"), std::string::npos) << d->output();

  const std::string dir = temp_dir().string();
  const std::string troupe = testing::binary_dir() + "/bin/troupe";
  auto bad = testing::run_process(troupe, {"serve", "--model", model, "--http", "nowhere"}, dir);
  EXPECT_EQ(bad.rc, 2);
  EXPECT_NE(bad.err.find("--http: expected HOST:PORT"), std::string::npos) << bad.err;
  bad = testing::run_process(
      troupe, {"serve", "--model", model, "--chat-template", "/nonexistent.jinja"}, dir);
  EXPECT_EQ(bad.rc, 2);
  EXPECT_NE(bad.err.find("--chat-template: cannot read '/nonexistent.jinja'"), std::string::npos)
      << bad.err;
  bad = testing::run_process(
      troupe, {"node", "--config", "x.toml", "--name", "a", "--http", "127.0.0.1:1"}, dir);
  EXPECT_EQ(bad.rc, 2);
  EXPECT_NE(bad.err.find("--http is an option of `troupe serve`"), std::string::npos) << bad.err;
}

TEST(ClusterProcesses, DenseOnThreeLoopbackDaemonsIsBitIdentical) {
  run_loopback("models/stories260K/stories260K.gguf", {"n0", "n1", "n2"}, {});
}

TEST(ClusterProcesses, MoeOnThreeLoopbackDaemonsIsBitIdentical) {
  run_loopback("models/synth/mixtral-moe/model.gguf", {"n1", "n2"}, {"n2", "n0", "n1"});
}

// A MoE model (the synthetic Mixtral unless given) on three loopback daemons: stages on n0 and
// n2, expert shards on n1 and n2 (so losing n2 loses a stage and a shard), with the requests and
// their single-process results.
struct MoeOnThree {
  std::string path;
  std::vector<actors::GenerateRequest> reqs;
  std::vector<actors::GenerateResult> want;  // empty if the model cannot be loaded
  std::vector<Node> nodes;
  std::string conf;
  std::vector<std::unique_ptr<Daemon>> ds;
  MoeOnThree(const std::string& shared, const std::string& name,
             const std::string& model_path = {}) {
    path = model_path.empty() ? shared + "/models/synth/mixtral-moe/model.gguf" : model_path;
    auto m = model::load_model(path);
    if (!m) return;
    reqs = requests((*m)->spec.n_vocab);
    want = local_results(path, reqs);
    nodes = loopback_nodes(3);
    conf =
        cluster_file(path, nodes, {"n0", "n2"}, {"n1", "n2"}, "ucx_net_devices = \"lo\"\n", name);
    ds = start_cluster(conf, nodes, {});
  }
};

// A daemon hosting a stage and an expert shard is killed (SIGKILL: no goodbye) while requests
// stream: the head declares it dead when its lease (2 s) runs out, re-places its actors on the two
// survivors, recomputes the requests, and every token and logit equals the single-process run.
void kill_mid_stream(MoeOnThree& c) {
  ASSERT_FALSE(c.want.empty());
  auto& [path, reqs, want, nodes, conf, ds] = c;
  auto client = actors::ClusterClient::connect("127.0.0.1", nodes[0].port, "proc-token");
  ASSERT_TRUE(client) << client.error().message << "\n" << ds[0]->output();
  bool killed = false;
  auto got = generate_with_fault(
      **client, reqs, [&] { c.ds[2]->kill_now(); }, 120s, &killed);  // (clang 14: no bindings)
  ASSERT_TRUE(killed);
  expect_same(got, want);
  // The requests can finish before the head logs the end of the re-placement (it logs once every
  // node confirmed): under load that took over the 1 s this waited before (session 53 saw it once).
  EXPECT_TRUE(wait_log(*ds[0], "re-placement 2 done", 20s)) << ds[0]->output();
  // Both survivors leave cleanly (exit 0). Before expert requests were guarded (guard_request),
  // the head took 10-20 s here: a stage of the old placement waited out its expert timeout for a
  // request dropped in a stopped shard's mailbox. Now well under a second; the time is printed.
  for (size_t i = 2; i-- > 0;) {
    const auto t0 = std::chrono::steady_clock::now();
    ::kill(ds[i]->pid, SIGTERM);
    EXPECT_EQ(ds[i]->wait_exit(10s), 0) << ds[i]->output();
    std::printf("daemon %zu exited %.2f s after SIGTERM\n", i,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
}

TEST(ClusterProcesses, KilledDaemonsActorsAreReplacedWithIdenticalOutput) {
  TROUPE_SHARED_OR_SKIP(shared);
  MoeOnThree c(shared, "killed");
  kill_mid_stream(c);
}

// The same with Qwen3-Next: the killed daemon's stage held its linear layers' recurrent states.
// The survivor that takes the stage starts with none; every sequence is recomputed from its token
// log (position 0 starts each state afresh), and the output stays bit-identical.
TEST(ClusterProcesses, KilledDaemonsQwen3NextStatesAreRecomputedWithIdenticalOutput) {
  testing::TempDir dir;
  MoeOnThree c("", "killed-qwen3next", testing::synth_arch(dir, "qwen3next", 35));
  kill_mid_stream(c);
}

// One daemon killed and, in the same lease, another frozen (SIGSTOP: a stalled host, a long
// pause) and then thawed: the head declares both dead, re-places everything on the head's
// node, and the thawed daemon, which missed all of it, must not disturb the new placement.
// Every request still finishes bit-identically. In about 1 run in 100 this used to hang: with
// shared memory and no UCX error handling (error mode "none", then auto's choice on loopback)
// the killed daemon left the head's UCX worker unable to receive anything (docs/transport.md).
TEST(ClusterProcesses, KilledAndFrozenDaemonsInOneLeaseLeaveIdenticalOutput) {
  TROUPE_SHARED_OR_SKIP(shared);
  MoeOnThree c(shared, "frozen");
  ASSERT_FALSE(c.want.empty());
  auto& [path, reqs, want, nodes, conf, ds] = c;
  auto client = actors::ClusterClient::connect("127.0.0.1", nodes[0].port, "proc-token");
  ASSERT_TRUE(client) << client.error().message;
  bool hit = false;
  std::thread thaw;
  auto got = generate_with_fault(
      **client, reqs,
      [&] {
        ::kill(c.ds[1]->pid, SIGSTOP);  // c.ds: clang 14 captures no structured bindings
        c.ds[2]->kill_now();
        thaw = std::thread([&] {
          std::this_thread::sleep_for(3500ms);  // past the 2 s lease
          ::kill(c.ds[1]->pid, SIGCONT);
        });
      },
      60s, &hit);
  if (thaw.joinable()) thaw.join();
  ASSERT_TRUE(hit);
  for (const auto& r : got)
    if (!r.ok()) {
      auto st = (*client)->status_json();
      ADD_FAILURE() << "status: " << (st ? *st : st.error().message) << "\n" << ds[0]->output();
      break;
    }
  expect_same(got, want);
  expect_same((*client)->generate_many(reqs, 0, {}, 120s), want);
  for (size_t i = 2; i-- > 0;) {
    ::kill(ds[i]->pid, SIGTERM);
    EXPECT_EQ(ds[i]->wait_exit(10s), 0) << ds[i]->output();
  }
  std::printf("%s\n", ds[0]->output().c_str());
}

// A killed daemon restarted under its old name rejoins as spare capacity (a new node id, no
// actors), and when another daemon dies the next re-placement moves that one's actors onto it:
// the cluster heals back to its size, and the output is still bit-identical.
TEST(ClusterProcesses, RestartedDaemonRejoinsAndHostsTheNextReplacement) {
  TROUPE_SHARED_OR_SKIP(shared);
  MoeOnThree c(shared, "rejoin");
  ASSERT_FALSE(c.want.empty());
  auto& [path, reqs, want, nodes, conf, ds] = c;
  ds[2]->kill_now();
  ASSERT_TRUE(wait_log(*ds[0], "re-placement 2 done", 60s)) << ds[0]->output();
  ds[2] = spawn({}, {"node", "--config", conf, "--name", "n2"}, "n2-again");
  ASSERT_TRUE(wait_log(*ds[0], "node n2 rejoined (spare capacity) as node 4", 60s))
      << ds[0]->output() << ds[2]->output();
  ds[1]->kill_now();
  ASSERT_TRUE(wait_log(*ds[0], "re-placement 3 done", 60s)) << ds[0]->output();
  // n1's stage and shard went to n2, the survivor with nothing on it.
  EXPECT_NE(ds[2]->output().find("node n2: re-placement 3"), std::string::npos) << ds[2]->output();
  auto client = actors::ClusterClient::connect("127.0.0.1", nodes[0].port, "proc-token");
  ASSERT_TRUE(client) << client.error().message;
  expect_same((*client)->generate_many(reqs), want);
  for (size_t i : {2, 0}) EXPECT_EQ(ds[i]->terminate(), 0) << ds[i]->output();
}

// Three namespaces on a bridge: real TCP between "hosts" (UCX would otherwise use shared memory
// between processes of one machine, DEPENDENCIES.md §4).
struct Netns {
  std::string tag = "tr" + std::to_string(::getpid() % 100000);
  std::vector<std::string> names;
  bool ok = false;
  std::string why;
  static int sh(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()); }
  explicit Netns(size_t n) {
    if (geteuid() != 0) {
      why = "not root";
      return;
    }
    if (sh("ip link add " + tag + "br type bridge") != 0) {
      why = "cannot create a bridge (ip link add ... type bridge)";
      return;
    }
    sh("ip addr add 10.78.0.254/24 dev " + tag + "br");
    sh("ip link set " + tag + "br up");
    for (size_t i = 0; i < n; ++i) {
      const std::string ns = tag + "n" + std::to_string(i), a = tag + "a" + std::to_string(i),
                        b = tag + "b" + std::to_string(i);
      if (sh("ip netns add " + ns) != 0) {
        why = "cannot create a network namespace (ip netns add)";
        return;
      }
      names.push_back(ns);
      if (sh("ip link add " + a + " type veth peer name " + b) != 0 ||
          sh("ip link set " + b + " netns " + ns) != 0 ||
          sh("ip link set " + a + " master " + tag + "br") != 0 ||
          sh("ip link set " + a + " up") != 0 ||
          sh("ip netns exec " + ns + " ip addr add 10.78.0." + std::to_string(i + 1) + "/24 dev " +
             b) != 0 ||
          sh("ip netns exec " + ns + " ip link set " + b + " up") != 0 ||
          sh("ip netns exec " + ns + " ip link set lo up") != 0) {
        why = "cannot wire namespace " + ns + " with a veth pair";
        return;
      }
    }
    ok = true;
  }
  ~Netns() {
    for (const auto& ns : names) sh("ip netns del " + ns);
    sh("ip link del " + tag + "br");
    for (size_t i = 0; i < 16; ++i) sh("ip link del " + tag + "a" + std::to_string(i));
  }
};

TEST(ClusterProcesses, MoeAcrossThreeNetworkNamespacesOverTcpIsBitIdentical) {
  TROUPE_SHARED_OR_SKIP(shared);
  Netns net(3);
  if (!net.ok) GTEST_SKIP() << "network namespaces unavailable here: " << net.why;
  const std::string path = shared + "/models/synth/mixtral-moe/model.gguf";
  auto m = model::load_model(path);
  ASSERT_TRUE(m);
  const auto reqs = requests((*m)->spec.n_vocab);
  const auto want = local_results(path, reqs);
  std::vector<Node> nodes;
  for (size_t i = 0; i < 3; ++i)
    nodes.push_back({"h" + std::to_string(i), "10.78.0." + std::to_string(i + 1), 7500});
  // The namespaces stand for separate hosts: TCP over the veth links, no same-host pulls.
  const std::string conf = cluster_file(path, nodes, {"h1", "h2"}, {"h2", "h0", "h1"},
                                        "ucx_tls = \"tcp\"\nsame_host_pull = false\n", "netns");
  std::vector<std::vector<std::string>> prefix;
  for (const auto& ns : net.names) prefix.push_back({"ip", "netns", "exec", ns});
  auto ds = start_cluster(conf, nodes, prefix);
  // The test process is in the root namespace: it reaches the head through the bridge.
  auto client = actors::ClusterClient::connect("10.78.0.1", 7500, "proc-token");
  ASSERT_TRUE(client) << client.error().message;
  expect_same((*client)->generate_many(reqs), want);
  for (size_t i = ds.size(); i-- > 0;) EXPECT_EQ(ds[i]->terminate(), 0) << ds[i]->output();
}

TEST(ClusterProcesses, SixteenDaemonsFormAClusterAndServe) {
  TROUPE_SHARED_OR_SKIP(shared);
  const std::string path = shared + "/models/stories260K/stories260K.gguf";
  const auto nodes = loopback_nodes(16);
  // stories260K has 5 layers: stages on 5 daemons, the other 11 are members without actors.
  const std::string conf = cluster_file(path, nodes, {"n3", "n6", "n9", "n12", "n15"}, {},
                                        "ucx_net_devices = \"lo\"\n", "sixteen");
  auto ds = start_cluster(conf, nodes, {});
  auto client = actors::ClusterClient::connect("127.0.0.1", nodes[0].port, "proc-token");
  ASSERT_TRUE(client) << client.error().message;
  auto st = (*client)->status_json();
  ASSERT_TRUE(st) << st.error().message;
  auto j = nlohmann::json::parse(*st);
  EXPECT_EQ(j["members"].size(), 16u);
  for (const auto& mem : j["members"]) EXPECT_EQ(mem["state"], "alive") << mem.dump();
  actors::GenerateRequest r;
  r.prompt = "Once upon a time";
  r.max_tokens = 12;
  r.sampling.ignore_eos = true;
  auto res = (*client)->generate_many({r, r, r});
  for (const auto& x : res) {
    ASSERT_TRUE(x.ok()) << x.error;
    EXPECT_EQ(x.tokens, res[0].tokens);
    EXPECT_EQ(x.tokens.size(), 12u);
  }
  // SIGTERM to a daemon without actors: the head marks it `left` at once (well within its lease).
  ASSERT_EQ(ds[5]->terminate(), 0) << ds[5]->output();
  bool left = false;
  for (int i = 0; i < 100 && !left; ++i) {
    auto s = (*client)->status_json();
    ASSERT_TRUE(s);
    const auto now = nlohmann::json::parse(*s);
    for (const auto& mem : now["members"])
      if (mem["name"] == "n5" && mem["state"] == "left") left = true;
    if (!left) std::this_thread::sleep_for(20ms);
  }
  EXPECT_TRUE(left);
  // Killed without a goodbye: the lease (2 s) expires and the node is declared dead.
  ds[7]->kill_now();
  bool dead = false;
  for (int i = 0; i < 300 && !dead; ++i) {
    auto s = (*client)->status_json();
    ASSERT_TRUE(s);
    const auto now = nlohmann::json::parse(*s);
    for (const auto& mem : now["members"])
      if (mem["name"] == "n7" && mem["state"] == "dead") dead = true;
    if (!dead) std::this_thread::sleep_for(20ms);
  }
  EXPECT_TRUE(dead) << "n7 not declared dead within 6 s (lease 2 s)";
  auto again = (*client)->generate_many({r});
  ASSERT_TRUE(again[0].ok()) << again[0].error;
  EXPECT_EQ(again[0].tokens, res[0].tokens);
}

TEST(ClusterProcesses, WrongTokenDaemonExitsWithAClearError) {
  TROUPE_SHARED_OR_SKIP(shared);
  const std::string path = shared + "/models/stories260K/stories260K.gguf";
  const auto nodes = loopback_nodes(2);
  const std::string conf = cluster_file(path, nodes, {"n0", "n1"}, {}, "", "good");
  std::string bad_text = testing::read_text_file(conf);
  bad_text.replace(bad_text.find("proc-token"), 10, "not-it-xyz");
  const std::string bad = (temp_dir() / "bad.toml").string();
  std::ofstream(bad) << bad_text;
  auto head = spawn({}, {"serve", "--config", conf}, "good-head");
  auto intruder = spawn({}, {"node", "--config", bad, "--name", "n1"}, "intruder");
  EXPECT_EQ(intruder->wait_exit(30s), 1) << intruder->output();
  EXPECT_NE(intruder->output().find("bad cluster token"), std::string::npos) << intruder->output();
  EXPECT_TRUE(wait_log(*head, "refused peer", 5s)) << head->output();
}

}  // namespace
}  // namespace troupe
