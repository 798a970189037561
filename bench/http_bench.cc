// http_bench: what the HTTP gateway costs. A one-node cluster (node daemon, router, scheduler,
// one stage) serves MODEL; the same batch of requests runs, alternately, straight into the head
// (ClusterNode::submit, the gateway's own path into the cluster: its ceiling) and through the
// gateway over loopback HTTP, streamed as server-sent events, one client thread per request.
// Reports generated tokens/s and time to first token of each, medians of the rounds, and their
// ratio measured side by side.
// Usage: http_bench MODEL [--concurrency 1,8,32] [--gen G] [--prompt P] [--rounds R]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <netinet/in.h>
#include <nlohmann/json.hpp>
#include <sys/socket.h>

#include "actors/cluster_node.h"
#include "actors/plan.h"
#include "bench/detail/args.h"
#include "bench/detail/median.h"
#include "bench/detail/ports.h"
#include "serve/http_gateway.h"
#include "tests/serve/http_client.h"

using namespace troupe;
using bench::median;
using Clock = std::chrono::steady_clock;

namespace {

double secs(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

struct Round {
  double wall = 0;         // first request sent to last one finished
  double tokens = 0;       // generated
  double ttft_median = 0;  // per request
};

Round direct(actors::ClusterNode& node, const std::vector<std::vector<int32_t>>& prompts, int gen) {
  std::mutex mu;
  std::condition_variable cv;
  size_t left = prompts.size();
  std::vector<double> ttft(prompts.size(), -1);
  double tokens = 0;
  const auto t0 = Clock::now();
  for (size_t i = 0; i < prompts.size(); ++i) {
    actors::GenerateRequest r;
    r.prompt_tokens = prompts[i];
    r.max_tokens = gen;
    r.sampling.ignore_eos = true;
    actors::RequestCallbacks cb;
    cb.on_piece = [&, i](const std::string&, int32_t, const std::vector<float>&) {
      std::lock_guard<std::mutex> lk(mu);
      if (ttft[i] < 0) ttft[i] = secs(Clock::now() - t0);
    };
    cb.on_finish = [&](const actors::GenerateResult& res) {
      std::lock_guard<std::mutex> lk(mu);
      if (!res.ok()) {
        std::fprintf(stderr, "http_bench: request failed: %s\n", res.error.c_str());
        std::exit(1);
      }
      tokens += static_cast<double>(res.tokens.size());
      if (--left == 0) cv.notify_all();
    };
    if (!node.submit(std::move(r), std::move(cb))) std::exit(1);
  }
  std::unique_lock<std::mutex> lk(mu);
  cv.wait(lk, [&] { return left == 0; });
  return {secs(Clock::now() - t0), tokens, median(ttft)};
}

Round over_http(uint16_t port, const std::string& model_id,
                const std::vector<std::vector<int32_t>>& prompts, int gen) {
  std::vector<double> ttft(prompts.size(), -1), toks(prompts.size(), 0);
  std::vector<std::thread> clients;
  const auto t0 = Clock::now();
  for (size_t i = 0; i < prompts.size(); ++i)
    clients.emplace_back([&, i] {
      const std::string body = nlohmann::json{{"model", model_id},
                                              {"prompt", prompts[i]},
                                              {"max_tokens", gen},
                                              {"temperature", 0},
                                              {"ignore_eos", true},
                                              {"stream", true},
                                              {"stream_options", {{"include_usage", true}}}}
                                   .dump();
      const int fd = serve::testing::send_request(
          port, serve::testing::request_text("POST", "/v1/completions", body));
      std::string raw;
      char buf[65536];
      while (true) {
        const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) break;
        raw.append(buf, static_cast<size_t>(n));
        if (ttft[i] < 0 && raw.find("\"text\"") != std::string::npos)
          ttft[i] = secs(Clock::now() - t0);
      }
      ::close(fd);
      const auto a = serve::testing::parse_answer(raw);
      const auto ev = a.events();
      if (a.status != 200 || ev.size() < 2) {
        std::fprintf(stderr, "http_bench: HTTP %d: %s\n", a.status, a.body.c_str());
        std::exit(1);
      }
      toks[i] = nlohmann::json::parse(ev[ev.size() - 2])["usage"]["completion_tokens"];
    });
  for (auto& t : clients) t.join();
  double tokens = 0;
  for (double t : toks) tokens += t;
  return {secs(Clock::now() - t0), tokens, median(ttft)};
}

}  // namespace

int main(int argc, char** argv) {
  const char* tool = "http_bench";
  const char* usage =
      "usage: http_bench MODEL [--concurrency 1,8,32] [--gen G] [--prompt P] [--rounds R]";
  bench::model_arg_or_usage(argc, argv, usage);
  const std::string model = argv[1];
  int gen = 64, plen = 32, rounds = 5;
  std::vector<int> conc = {1, 8, 32};
  for (int i = 2; i < argc; ++i) {
    const std::string k = argv[i];
    bench::known_option(tool, k, {"--gen", "--prompt", "--rounds", "--concurrency"}, usage);
    const std::string v = bench::value_arg(tool, argc, argv, i);
    if (k == "--gen") {
      gen = static_cast<int>(bench::int_arg(tool, k, v, 1, 1 << 20));
    } else if (k == "--prompt") {
      plen = static_cast<int>(bench::int_arg(tool, k, v, 1, 1 << 20));
    } else if (k == "--rounds") {
      rounds = static_cast<int>(bench::int_arg(tool, k, v, 1, 1000));
    } else {  // --concurrency
      conc.clear();
      for (const int64_t c : bench::int_list_arg(tool, k, v, 1, 1024))
        conc.push_back(static_cast<int>(c));
    }
  }
  int max_c = 1;
  for (int c : conc) max_c = std::max(max_c, c);

  const std::string toml =
      "[model]\npath = \"" + model +
      "\"\n[cluster]\ntoken = \"bench\"\nhead = \"a\"\nucx_net_devices = \"lo\"\n"
      "[[node]]\nname = \"a\"\naddress = \"127.0.0.1:" +
      std::to_string(bench::free_loopback_port()) +
      "\"\n[[stage]]\nnode = \"a\"\n[scheduler]\nmax_sequences = " + std::to_string(max_c) +
      "\nmax_model_len = " + std::to_string(plen + gen + 16) + "\n";
  auto plan = actors::parse_plan_string(toml, "http_bench");
  if (!plan) {
    std::fprintf(stderr, "http_bench: %s\n", plan.error().message.c_str());
    return 1;
  }
  actors::NodeOptions o;
  o.name = "a";
  auto node = actors::ClusterNode::start(*plan, o);
  if (!node || !(*node)->wait_ready(std::chrono::seconds(600))) {
    std::fprintf(stderr, "http_bench: the cluster did not start%s%s\n", node ? "" : ": ",
                 node ? "" : node.error().message.c_str());
    return 1;
  }
  serve::GatewayOptions g;
  g.port = 0;
  g.model_id = "bench";
  g.max_model_len = plen + gen + 16;
  g.max_choices = 1;
  auto gw = serve::HttpGateway::start(**node, g);
  if (!gw) {
    std::fprintf(stderr, "http_bench: %s\n", gw.error().message.c_str());
    return 1;
  }
  const int64_t n_vocab = (*node)->model()->spec.n_vocab;
  std::printf("http_bench: %s, prompt %d tokens, %d generated per request, %d rounds, %u cores\n",
              model.c_str(), plen, gen, rounds, std::thread::hardware_concurrency());
  std::printf("%-12s %-8s %14s %14s %12s %12s %10s\n", "concurrency", "", "tok/s direct",
              "tok/s http", "ttft direct", "ttft http", "http/direct");
  std::mt19937 rng(7);
  for (int c : conc) {
    std::vector<double> dt, ht, df, hf, ratio;
    for (int r = 0; r < rounds + 1; ++r) {
      std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(c));
      for (auto& p : prompts)
        for (int k = 0; k < plen; ++k)
          p.push_back(static_cast<int32_t>(3 + rng() % static_cast<uint32_t>(n_vocab - 3)));
      const Round d = direct(**node, prompts, gen);
      const Round h = over_http((*gw)->port(), "bench", prompts, gen);
      if (r == 0) continue;  // warm-up
      dt.push_back(d.tokens / d.wall);
      ht.push_back(h.tokens / h.wall);
      df.push_back(d.ttft_median * 1e3);
      hf.push_back(h.ttft_median * 1e3);
      ratio.push_back((h.tokens / h.wall) / (d.tokens / d.wall));
    }
    std::printf("%-12d %-8s %14.0f %14.0f %10.2f ms %10.2f ms %10.2f\n", c, "", median(dt),
                median(ht), median(df), median(hf), median(ratio));
  }
  (*gw)->stop();
  (*node)->leave("done");
  return 0;
}
