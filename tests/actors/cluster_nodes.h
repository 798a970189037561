// Node daemons in one test process (tests/actors/cluster_*_test.cc): a cluster TOML for nodes
// a, b, c on loopback ports, parsing it, and starting the daemons.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "actors/cluster_node.h"
#include "actors/plan.h"
#include "model/model.h"
#include "tests/cluster_test_util.h"

namespace troupe::actors::testing_nodes {

using namespace std::chrono_literals;
using troupe::testing::free_port;

struct Layout {
  std::vector<std::string> stage_nodes;  // per stage
  std::vector<std::string> shard_nodes;  // per expert shard
};

// A cluster TOML for nodes a, b, c on free loopback ports.
inline std::string cluster_toml(const std::string& model, const Layout& l,
                                std::vector<uint16_t>* ports,
                                const std::string& token = "test-token", size_t num_nodes = 3) {
  std::string t = "[model]\npath = \"" + model + "\"\n";
  t += "[cluster]\ntoken = \"" + token + "\"\nhead = \"a\"\nheartbeat_ms = 100\nlease_ms = 1000\n";
  t += "ucx_net_devices = \"lo\"\n";
  ports->clear();
  for (size_t i = 0; i < num_nodes; ++i) {
    ports->push_back(free_port());
    t += "[[node]]\nname = \"" + std::string(1, static_cast<char>('a' + i)) +
         "\"\naddress = \"127.0.0.1:" + std::to_string(ports->back()) + "\"\n";
  }
  for (const auto& n : l.stage_nodes) t += "[[stage]]\nnode = \"" + n + "\"\n";
  for (const auto& n : l.shard_nodes) t += "[[expert_shard]]\nnode = \"" + n + "\"\n";
  t += "[stages]\nkv_blocks = 64\n[scheduler]\nmax_sequences = 8\nmax_model_len = 256\n";
  return t;
}

inline Plan parse(const std::string& toml) {
  auto p = parse_plan_string(toml, "cluster-test.toml");
  EXPECT_TRUE(p) << (p ? "" : p.error().message);
  return p ? *p : Plan{};
}

// What the plan of `toml` places on node `name` (placed_memory_bytes: its actors' weights, KV
// pools and recurrent states).
inline uint64_t placed_bytes(const std::string& toml, const std::string& name) {
  Plan plan = parse(toml);
  auto m = model::load_model(plan.model_path);
  EXPECT_TRUE(m) << (m ? "" : m.error().message);
  if (!m) return 0;
  EXPECT_TRUE(resolve_plan(plan, (*m)->spec).has_value());
  EXPECT_TRUE(resolve_placement(plan).has_value());
  return placed_memory_bytes(plan, (*m)->spec).at(name);
}

// The smallest memory_limit_mb that holds what the plan of `toml` places on node `name`: room
// for nothing more than the rest of its last MiB.
inline int64_t fitting_limit_mb(const std::string& toml, const std::string& name) {
  return static_cast<int64_t>((placed_bytes(toml, name) + (1u << 20) - 1) >> 20);
}

struct Nodes {
  std::vector<std::unique_ptr<ClusterNode>> nodes;
  std::function<void(NodeOptions&)> tweak;  // per-node options (faults, timeouts)
  void start(const Plan& plan, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      NodeOptions o;
      o.name = std::string(1, static_cast<char>('a' + i));
      o.join_timeout = 30s;
      if (tweak) tweak(o);
      auto node = ClusterNode::start(plan, o);
      ASSERT_TRUE(node) << node.error().message;
      nodes.push_back(std::move(*node));
    }
    auto s = nodes[0]->wait_ready(120s);
    ASSERT_TRUE(s) << s.error().message;
  }
};

}  // namespace troupe::actors::testing_nodes
