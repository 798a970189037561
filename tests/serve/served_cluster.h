// A one-node cluster (a real node daemon over UCX on loopback: router, scheduler, one stage)
// with an HTTP gateway on a free port, for tests/serve/. Header-only.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "actors/cluster_node.h"
#include "actors/plan.h"
#include "serve/http_gateway.h"
#include "tests/cluster_test_util.h"

namespace troupe::serve::testing {

struct ServedSpec {
  std::string model;               // a GGUF file
  std::string model_extra;         // more [model] lines ("mmproj = ...\n")
  std::string model_id = "model";  // the name clients give
  int64_t max_model_len = 512;
  int64_t kv_blocks = 64;
  int64_t max_sequences = 8;
  std::chrono::milliseconds drain_timeout{30000};
  GatewayOptions gateway;  // port, model_id and max_model_len are set from the above
};

struct ServedCluster {
  std::unique_ptr<actors::ClusterNode> node;
  std::unique_ptr<HttpGateway> gateway;
  uint16_t port() const { return gateway->port(); }

  /// Starts it and waits until the cluster serves; null (with a test failure) when it cannot.
  static std::unique_ptr<ServedCluster> start(const ServedSpec& spec) {
    const std::string toml =
        "[model]\npath = \"" + spec.model + "\"\n" + spec.model_extra +
        "[cluster]\ntoken = \"t\"\nhead = \"a\"\nucx_net_devices = \"lo\"\n"
        "[[node]]\nname = \"a\"\naddress = \"127.0.0.1:" +
        std::to_string(troupe::testing::free_port()) + "\"\n[[stage]]\nnode = \"a\"\n" +
        "[stages]\nkv_blocks = " + std::to_string(spec.kv_blocks) +
        "\n[scheduler]\nmax_sequences = " + std::to_string(spec.max_sequences) +
        "\nmax_model_len = " + std::to_string(spec.max_model_len) + "\n";
    auto plan = actors::parse_plan_string(toml, "served-cluster.toml");
    EXPECT_TRUE(plan) << plan.error().message;
    if (!plan) return nullptr;
    actors::NodeOptions o;
    o.name = "a";
    o.drain_timeout = spec.drain_timeout;
    auto node = actors::ClusterNode::start(*plan, o);
    EXPECT_TRUE(node) << node.error().message;
    if (!node) return nullptr;
    auto sc = std::make_unique<ServedCluster>();
    sc->node = std::move(*node);
    auto ready = sc->node->wait_ready(std::chrono::seconds(60));
    EXPECT_TRUE(ready) << ready.error().message;
    if (!ready) return nullptr;
    GatewayOptions g = spec.gateway;
    g.port = 0;
    g.model_id = spec.model_id;
    g.max_model_len = spec.max_model_len;
    auto gw = HttpGateway::start(*sc->node, g);
    EXPECT_TRUE(gw) << gw.error().message;
    if (!gw) return nullptr;
    sc->gateway = std::move(*gw);
    return sc;
  }
};

}  // namespace troupe::serve::testing
