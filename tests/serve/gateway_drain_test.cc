// The gateway while its head leaves (SIGTERM's path): requests in flight finish and reach their
// HTTP clients within the drain time; those still running when it ends get an error, not
// silence; new ones are refused with 503.
#include <chrono>
#include <future>

#include <nlohmann/json.hpp>

#include "actors/cluster_node.h"
#include "actors/plan.h"
#include "serve/http_gateway.h"
#include "tests/cluster_test_util.h"
#include "tests/serve/http_client.h"
#include "tests/test_support.h"

namespace troupe::serve {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

struct Served {
  std::unique_ptr<actors::ClusterNode> node;
  std::unique_ptr<HttpGateway> gateway;
};

Served serve_stories(const std::string& shared, std::chrono::milliseconds drain) {
  Served s;
  const std::string toml = "[model]\npath = \"" + shared +
                           "/models/stories260K/stories260K.gguf\"\n[cluster]\ntoken = \"t\"\n"
                           "head = \"a\"\nucx_net_devices = \"lo\"\n[[node]]\nname = \"a\"\n"
                           "address = \"127.0.0.1:" +
                           std::to_string(troupe::testing::free_port()) +
                           "\"\n[[stage]]\nnode = \"a\"\n[stages]\nkv_blocks = 256\n"
                           "[scheduler]\nmax_sequences = 4\nmax_model_len = 2048\n";
  auto plan = actors::parse_plan_string(toml, "drain-test.toml");
  EXPECT_TRUE(plan) << plan.error().message;
  if (!plan) return s;
  actors::NodeOptions o;
  o.name = "a";
  o.drain_timeout = drain;
  auto node = actors::ClusterNode::start(*plan, o);
  EXPECT_TRUE(node) << node.error().message;
  if (!node) return s;
  s.node = std::move(*node);
  auto r = s.node->wait_ready(60s);
  EXPECT_TRUE(r) << r.error().message;
  GatewayOptions g;
  g.port = 0;
  g.model_id = "stories";
  g.max_model_len = 2048;
  g.request_timeout = 20s;  // a request nobody ends fails the test, not hangs it
  auto gw = HttpGateway::start(*s.node, g);
  EXPECT_TRUE(gw) << gw.error().message;
  if (gw) s.gateway = std::move(*gw);
  return s;
}

// A long streamed request whose first bytes have arrived: the socket, to read the rest from.
int start_stream(uint16_t port, int max_tokens) {
  const std::string body =
      json{{"model", "stories"}, {"prompt", "Once"},   {"max_tokens", max_tokens},
           {"temperature", 0.8}, {"ignore_eos", true}, {"stream", true}}
          .dump();
  const int fd = testing::connect_loopback(port);
  testing::send_all(fd,
                    "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                    "Content-Type: application/json\r\nContent-Length: " +
                        std::to_string(body.size()) + "\r\n\r\n" + body);
  return fd;
}

std::string read_to_end(int fd) {
  std::string out;
  char buf[65536];
  while (true) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

TEST(GatewayDrain, RequestsInFlightFinishThenNewOnesAre503) {
  TROUPE_SHARED_OR_SKIP(shared);
  Served s = serve_stories(shared, 20s);
  ASSERT_TRUE(s.gateway);
  const uint16_t port = s.gateway->port();
  const int fd = start_stream(port, 900);
  char first[64];
  ASSERT_GT(::recv(fd, first, sizeof first, MSG_PEEK), 0);  // admitted and streaming
  auto leaving = std::async(std::launch::async, [&] { s.node->leave("test"); });
  const auto a = testing::parse_answer(read_to_end(fd));
  leaving.get();
  ASSERT_EQ(a.status, 200);
  const auto events = a.events();
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  const json last = json::parse(events[events.size() - 2]);
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length") << events[events.size() - 2];
  // The head has left: a new request is refused, and says why.
  const auto r = testing::http(port, "POST", "/v1/completions",
                               json{{"model", "stories"}, {"prompt", "Hi"}}.dump());
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_EQ(r.headers.count("retry-after"), 1u);
  EXPECT_NE(r.body.find("shutting down"), std::string::npos) << r.body;
  EXPECT_EQ(testing::http(port, "GET", "/ready").status, 503);
}

TEST(GatewayDrain, RequestsCutByTheEndOfTheDrainGetAnError) {
  TROUPE_SHARED_OR_SKIP(shared);
  Served s = serve_stories(shared, 1ms);
  ASSERT_TRUE(s.gateway);
  const int fd = start_stream(s.gateway->port(), 2000);
  char first[64];
  ASSERT_GT(::recv(fd, first, sizeof first, MSG_PEEK), 0);
  s.node->leave("test");  // drains for 1 ms: the request is still running
  const auto a = testing::parse_answer(read_to_end(fd));
  ASSERT_EQ(a.status, 200);
  const auto events = a.events();
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  const json err = json::parse(events[events.size() - 2]);
  ASSERT_TRUE(err.contains("error")) << events[events.size() - 2];
  EXPECT_NE(err["error"]["message"].get<std::string>().find("shutting down"), std::string::npos);
}

}  // namespace
}  // namespace troupe::serve
