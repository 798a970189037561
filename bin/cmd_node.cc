// `troupe node`, `troupe serve` and `troupe status`: a node daemon of a multi-host cluster, the
// head node, and the head's view of the cluster.
#include <signal.h>

#include <cstdio>
#include <cstdlib>

#include "actors/cluster_client.h"
#include "actors/cluster_node.h"
#include "bin/args.h"
#include "bin/cluster_generate.h"
#include "bin/commands.h"

namespace troupe::cli {

namespace {

constexpr const char* kNodeHelp =
    "usage: troupe node --config CLUSTER.toml --name NODE [options]\n"
    "       troupe serve --config CLUSTER.toml [--name HEAD]\n"
    "Runs one node daemon of the cluster CLUSTER.toml describes ([cluster], [[node]], [[stage]],\n"
    "[[expert_shard]]: see conf/cluster-example.toml). `serve` runs the head node (controller,\n"
    "router, scheduler), by default the plan's cluster.head. The daemon joins the head with the\n"
    "cluster token, hosts the actors placed on it, and leaves cleanly on SIGTERM or SIGINT.\n"
    "  --model PATH         override the plan's model path\n"
    "  --fault RULES        fault-injection rules, ';'-separated (tests), e.g.\n"
    "                       'drop:peer=node-b:p=0.1:seed=7;delay:delay_ms=50:dir=in'\n"
    "  --ready-timeout S    give up when not serving after S seconds (default 600)\n";

constexpr const char* kStatusHelp =
    "usage: troupe status --head HOST:PORT [--token T | --config CLUSTER.toml] [--json]\n"
    "Prints the head's view: whether the cluster serves (and why not), members and their\n"
    "leases, placement versions, actors, start-up phases of every node. --json: the same as\n"
    "one JSON object.\n";

int run_node(const Args& args, bool serve) {
  if (!args.empty() && (args[0] == "--help" || args[0] == "-h")) {
    std::fputs(kNodeHelp, stdout);
    return 0;
  }
  ArgParser ap(args, {"config", "name", "model", "fault", "ready-timeout"}, {});
  auto plan = actors::parse_plan_file(ap.required("config"));
  if (!plan) throw CliError(plan.error().message);
  if (ap.has("model")) plan->model_path = ap.str("model");
  if (auto s = actors::resolve_placement(*plan); !s) throw CliError(s.error().message);
  actors::NodeOptions opts;
  opts.name = ap.has("name") ? ap.str("name") : (serve ? plan->cluster.head : ap.required("name"));
  if (serve && opts.name != plan->cluster.head)
    throw CliError("'" + opts.name + "' is not the head of this cluster (cluster.head = '" +
                   plan->cluster.head + "'): use `troupe node` for it");
  if (ap.has("fault")) {
    std::string rules = ap.str("fault");
    size_t at = 0;
    while (at <= rules.size()) {
      const size_t semi = rules.find(';', at);
      const std::string one =
          rules.substr(at, semi == std::string::npos ? std::string::npos : semi - at);
      if (!one.empty()) {
        auto r = transport::parse_fault_rule(one);
        if (!r) throw CliError(r.error().message);
        opts.faults.push_back(*r);
      }
      if (semi == std::string::npos) break;
      at = semi + 1;
    }
  }
  const int64_t ready_s = ap.integer("ready-timeout", 600, 1, 86400);
  // Signals are taken by sigwait below: block them before any thread starts.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  auto node = actors::ClusterNode::start(std::move(*plan), opts);
  if (!node) throw CliError(node.error().message);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(ready_s);
  bool ready = false;
  while (true) {
    if (!ready) {
      auto s = (*node)->wait_ready(std::chrono::milliseconds(200));
      if (s) {
        ready = true;
        std::fprintf(stderr, "troupe: node %s ready%s\n", opts.name.c_str(),
                     (*node)->is_head() ? ": the cluster is serving" : "");
      } else if (s.error().message.rfind("not ready within", 0) != 0 ||
                 std::chrono::steady_clock::now() > deadline) {
        std::fprintf(stderr, "troupe %s: %s\n", serve ? "serve" : "node",
                     s.error().message.c_str());
        (*node)->leave("failed");
        return 1;
      }
    }
    timespec ts{0, ready ? 500000000 : 1000000};
    const int sig = sigtimedwait(&set, nullptr, &ts);
    if (sig == SIGTERM || sig == SIGINT) {
      std::fprintf(stderr, "troupe: node %s leaving (%s)\n", opts.name.c_str(),
                   sig == SIGTERM ? "SIGTERM" : "SIGINT");
      (*node)->leave(sig == SIGTERM ? "SIGTERM" : "SIGINT");
      return 0;
    }
  }
}

}  // namespace

int cmd_node(const Args& args) { return run_node(args, false); }
int cmd_serve(const Args& args) { return run_node(args, true); }

int cmd_status(const Args& args) {
  if (!args.empty() && (args[0] == "--help" || args[0] == "-h")) {
    std::fputs(kStatusHelp, stdout);
    return 0;
  }
  ArgParser ap(args, {"head", "token", "config"}, {"json"});
  auto client = connect_head(ap);
  const bool json = ap.flag("json");
  auto s = json ? client->status_json() : client->status_text();
  if (!s) throw CliError(s.error().message);
  std::printf("%s%s", s->c_str(), json ? "\n" : "");
  return 0;
}

}  // namespace troupe::cli
