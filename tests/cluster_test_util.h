// Helpers shared by the cluster tests (tests/actors/cluster_node_test.cc: daemons in one
// process; tests/bin/cluster_process_test.cc: daemons as processes): loopback ports, a request
// mix, the single-process reference, the bit-exact comparison, and a fault injected mid-stream.
#pragma once

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "actors/cluster_client.h"
#include "actors/local_cluster.h"
#include "actors/plan.h"
#include "model/model.h"

namespace troupe::testing {

// A port below the kernel's ephemeral range (32768+ by default), so that the outgoing sockets of
// other tests running at the same time cannot take it between this check and the daemon's bind.
inline uint16_t free_port() {
  static std::mt19937 rng(static_cast<uint32_t>(::getpid()) * 2654435761u);
  // Never the same port twice in one process: a cluster's nodes take theirs before any binds
  // (16 random draws from 12000 collide about once in a hundred runs).
  static std::set<uint16_t> given;
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const uint16_t port = static_cast<uint16_t>(20000 + rng() % 12000);
    if (!given.insert(port).second) continue;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0;
    ::close(fd);
    if (ok) return port;
  }
  return 0;
}

// `count` requests of growing random prompts (seeded), greedy and ignoring EOS, logits returned;
// every second one samples with a seeded temperature instead (its RNG travels with the steps).
inline std::vector<actors::GenerateRequest> cluster_requests(int64_t n_vocab, size_t count,
                                                             int64_t n_gen, uint32_t seed) {
  std::vector<actors::GenerateRequest> reqs;
  std::mt19937 rng(seed);
  for (size_t i = 0; i < count; ++i) {
    actors::GenerateRequest r;
    for (size_t k = 0; k < 5 + 9 * i; ++k)
      r.prompt_tokens.push_back(
          static_cast<int32_t>(3 + rng() % static_cast<uint32_t>(n_vocab - 3)));
    r.max_tokens = n_gen;
    r.sampling.ignore_eos = true;
    r.return_logits = true;
    if (i % 2 == 1) {
      r.sampling.temperature = 0.8f;
      r.sampling.seed = seed + i;
    }
    reqs.push_back(std::move(r));
  }
  return reqs;
}

// The same requests through the single-process actor system (itself bit-identical to the engine).
inline std::vector<actors::GenerateResult> local_results(
    const std::string& model_path, const std::vector<actors::GenerateRequest>& reqs) {
  auto m = model::load_model(model_path);
  EXPECT_TRUE(m);
  if (!m) return {};
  actors::Plan plan = actors::even_plan(model_path, 1, 0);
  plan.scheduler.max_sequences = 8;
  plan.scheduler.max_model_len = 256;
  EXPECT_TRUE(actors::resolve_plan(plan, (*m)->spec));
  auto lc = actors::LocalCluster::start(plan, *m);
  EXPECT_TRUE(lc);
  if (!lc) return {};
  return (*lc)->generate_many(reqs);
}

inline void expect_same(const std::vector<actors::GenerateResult>& got,
                        const std::vector<actors::GenerateResult>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i].ok()) << "request " << i << ": " << got[i].error;
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
    ASSERT_EQ(got[i].logits.size(), want[i].logits.size()) << "request " << i;
    EXPECT_EQ(std::memcmp(got[i].logits.data(), want[i].logits.data(), want[i].logits.size() * 4),
              0)
        << "request " << i << ": logits differ";
  }
}

// Streams `reqs` through `client` and runs `fault` once, at the first piece any request streams
// (so requests are in flight when it strikes); `*fired` says whether it ran.
inline std::vector<actors::GenerateResult> generate_with_fault(
    actors::ClusterClient& client, const std::vector<actors::GenerateRequest>& reqs,
    const std::function<void()>& fault, std::chrono::milliseconds timeout, bool* fired) {
  std::atomic<bool> hit{false};
  auto got = client.generate_many(
      reqs, 0,
      [&](size_t, const std::string&, int32_t) {
        if (!hit.exchange(true)) fault();
      },
      timeout);
  *fired = hit.load();
  return got;
}

}  // namespace troupe::testing
