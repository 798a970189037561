// `troupe node`, `troupe serve` and `troupe status`: a node daemon of a multi-host cluster, the
// head node, and the head's view of the cluster.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <netinet/in.h>
#include <sys/socket.h>

#include "actors/cluster_client.h"
#include "actors/cluster_node.h"
#include "bin/args.h"
#include "bin/cluster_generate.h"
#include "bin/commands.h"
#include "serve/http_gateway.h"

namespace troupe::cli {

namespace {

constexpr const char* kNodeHelp =
    "usage: troupe node --config CLUSTER.toml --name NODE [options]\n"
    "       troupe serve --config CLUSTER.toml [--name HEAD] [--http HOST:PORT] [options]\n"
    "       troupe serve --model PATH [--http HOST:PORT] [options]\n"
    "Runs one node daemon of the cluster CLUSTER.toml describes ([cluster], [[node]], [[stage]],\n"
    "[[expert_shard]]: see conf/cluster-example.toml). `serve` runs the head node (controller,\n"
    "router, scheduler), by default the plan's cluster.head. The daemon joins the head with the\n"
    "cluster token, hosts the actors placed on it, and leaves cleanly on SIGTERM or SIGINT.\n"
    "`serve --model PATH` without --config serves the model from this one process (a one-node\n"
    "cluster on loopback) over HTTP, by default on 127.0.0.1:8000.\n"
    "  --model PATH         the model (with --config: override the plan's model path)\n"
    "  --http HOST:PORT     serve: the OpenAI-compatible HTTP API (/v1/completions,\n"
    "                       /v1/chat/completions, /v1/models), /health, /ready, /metrics\n"
    "  --api-key KEY        serve: /v1/ routes need 'Authorization: Bearer KEY' (default: the\n"
    "                       environment's TROUPE_API_KEY; none: open)\n"
    "  --served-model-name N  serve: the name clients give as \"model\" (default: the model\n"
    "                       file's or directory's name)\n"
    "  --chat-template FILE serve: the Jinja chat template for /v1/chat/completions in place\n"
    "                       of the model's own (default: the model's)\n"
    "  --tool-call-parser F serve: the format tool calls are parsed from replies in: hermes,\n"
    "                       llama3_json, mistral, deepseek_v3, kimi_k2, glm45, qwen3_coder,\n"
    "                       seed_oss, minimax_m2, pythonic (default: the one the chat template\n"
    "                       writes)\n"
    "  --reasoning-parser P serve: deepseek_r1, qwen3 or think: a chat reply's <think>...\n"
    "                       </think> is answered as reasoning_content (default: content)\n"
    "  --max-model-len N    serve --model: prompt + completion tokens per sequence (default 2048)\n"
    "  --max-sequences N    serve --model: sequences decoded at once (default the plan's)\n"
    "  --mmproj PATH        serve --model: a vision encoder (llama.cpp mmproj GGUF) for chats\n"
    "                       with images\n"
    "  --fault RULES        fault-injection rules, ';'-separated (tests), e.g.\n"
    "                       'drop:peer=node-b:p=0.1:seed=7;delay:delay_ms=50:dir=in'\n"
    "  --ready-timeout S    give up when not serving after S seconds (default 600)\n";

constexpr const char* kStatusHelp =
    "usage: troupe status --head HOST:PORT [--token T | --config CLUSTER.toml] [--json]\n"
    "Prints the head's view: whether the cluster serves (and why not), members and their\n"
    "leases, placement versions, actors, start-up phases of every node. --json: the same as\n"
    "one JSON object.\n";

// A free TCP port on loopback, for the one-node cluster of `serve --model`.
int free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = 0;
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  if (fd >= 0) ::close(fd);
  if (port == 0) throw CliError("cannot find a free loopback port for the one-node cluster");
  return port;
}

std::string toml_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// `serve --model PATH`: the plan of a one-node cluster in this process.
Result<actors::Plan> one_node_plan(const ArgParser& ap) {
  std::random_device rd;
  char token[33];
  std::snprintf(token, sizeof token, "%08x%08x%08x%08x", rd(), rd(), rd(), rd());
  const std::string model = std::filesystem::absolute(ap.str("model")).string();
  std::string t = "[model]\npath = " + toml_string(model) + "\n";
  if (ap.has("mmproj"))
    t += "mmproj = " + toml_string(std::filesystem::absolute(ap.str("mmproj")).string()) + "\n";
  t += "[cluster]\ntoken = \"" + std::string(token) + "\"\nhead = \"local\"\n";
  t += "[[node]]\nname = \"local\"\naddress = \"127.0.0.1:" + std::to_string(free_loopback_port()) +
       "\"\n";
  t += "[[stage]]\nnode = \"local\"\n";
  t += "[scheduler]\nmax_model_len = " +
       std::to_string(ap.integer("max-model-len", 2048, 1, int64_t{1} << 24)) + "\n";
  if (ap.has("max-sequences"))
    t += "max_sequences = " + std::to_string(ap.integer("max-sequences", 0, 1, 4096)) + "\n";
  return actors::parse_plan_string(t, "serve --model " + ap.str("model"));
}

void split_host_port(const std::string& s, std::string* host, uint16_t* port) {
  const size_t colon = s.rfind(':');
  char* end = nullptr;
  const long p = colon == std::string::npos ? -1 : std::strtol(s.c_str() + colon + 1, &end, 10);
  if (colon == std::string::npos || colon == 0 || !end || *end != '\0' || p < 0 || p > 65535)
    throw CliError("--http: expected HOST:PORT with a port in 0..65535, got '" + s + "'");
  *host = s.substr(0, colon);
  *port = static_cast<uint16_t>(p);
}

int run_node(const Args& args, bool serve) {
  if (!args.empty() && (args[0] == "--help" || args[0] == "-h")) {
    std::fputs(kNodeHelp, stdout);
    return 0;
  }
  ArgParser ap(args,
               {"config", "name", "model", "fault", "ready-timeout", "http", "api-key",
                "served-model-name", "chat-template", "tool-call-parser", "reasoning-parser",
                "max-model-len", "max-sequences", "mmproj"},
               {});
  const bool quick = serve && !ap.has("config") && ap.has("model");
  if (!serve)
    for (const char* o : {"http", "api-key", "served-model-name", "chat-template",
                          "tool-call-parser", "reasoning-parser", "max-model-len", "max-sequences"})
      if (ap.has(o)) throw CliError(std::string("--") + o + " is an option of `troupe serve`");
  if (!quick)
    for (const char* o : {"max-model-len", "max-sequences", "mmproj"})
      if (ap.has(o))
        throw CliError(
            std::string("--") + o + " is for `serve --model` (with --config, set it in " +
            (o == std::string("mmproj") ? "the plan's [model])" : "the plan's [scheduler])"));
  auto plan = quick ? one_node_plan(ap) : actors::parse_plan_file(ap.required("config"));
  if (!plan) throw CliError(plan.error().message);
  if (ap.has("model") && !quick) plan->model_path = ap.str("model");
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
  serve::GatewayOptions http;
  const bool want_http = serve && (quick || ap.has("http"));
  if (want_http) {
    split_host_port(ap.str("http", "127.0.0.1:8000"), &http.host, &http.port);
    http.api_key =
        ap.str("api-key", std::getenv("TROUPE_API_KEY") ? std::getenv("TROUPE_API_KEY") : "");
    http.model_id = ap.str("served-model-name");
    if (ap.has("chat-template")) {
      std::ifstream in(ap.str("chat-template"), std::ios::binary);
      std::stringstream text;
      text << in.rdbuf();
      if (!in || text.str().empty())
        throw CliError("--chat-template: cannot read '" + ap.str("chat-template") +
                       "' (or it is empty)");
      http.chat_template = text.str();
    }
    http.tool_call_parser = ap.str("tool-call-parser");
    http.reasoning_parser = ap.str("reasoning-parser");
    http.max_model_len = plan->scheduler.max_model_len;
  }
  auto node = actors::ClusterNode::start(std::move(*plan), opts);
  if (!node) throw CliError(node.error().message);
  std::unique_ptr<serve::HttpGateway> gateway;
  if (want_http) {
    auto g = serve::HttpGateway::start(**node, http);
    if (!g) {
      (*node)->leave("failed");
      throw CliError(g.error().message);
    }
    gateway = std::move(*g);
    std::fprintf(stderr, "troupe: HTTP API on http://%s:%u/v1 (model \"%s\")%s\n",
                 http.host.c_str(), gateway->port(), gateway->model_id().c_str(),
                 http.api_key.empty() ? "" : ", API key required");
  }
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
        if (gateway) gateway->stop();
        return 1;
      }
    }
    timespec ts{0, ready ? 500000000 : 1000000};
    const int sig = sigtimedwait(&set, nullptr, &ts);
    if (sig == SIGTERM || sig == SIGINT) {
      std::fprintf(stderr, "troupe: node %s leaving (%s)\n", opts.name.c_str(),
                   sig == SIGTERM ? "SIGTERM" : "SIGINT");
      // The head drains first (requests in flight finish and reach their HTTP clients), then
      // the gateway closes.
      (*node)->leave(sig == SIGTERM ? "SIGTERM" : "SIGINT");
      if (gateway) gateway->stop();
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
