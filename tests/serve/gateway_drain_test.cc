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
#include "tests/serve/served_cluster.h"
#include "tests/test_support.h"

namespace troupe::serve {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

std::unique_ptr<testing::ServedCluster> serve_stories(const std::string& shared,
                                                      std::chrono::milliseconds drain) {
  testing::ServedSpec spec;
  spec.model = shared + "/models/stories260K/stories260K.gguf";
  spec.model_id = "stories";
  spec.max_model_len = 2048;
  spec.kv_blocks = 256;
  spec.max_sequences = 4;
  spec.drain_timeout = drain;
  spec.gateway.request_timeout = 20s;  // a request nobody ends fails the test, not hangs it
  return testing::ServedCluster::start(spec);
}

// A long streamed request whose first bytes have arrived: the socket, to read the rest from.
int start_stream(uint16_t port, int max_tokens) {
  const std::string body =
      json{{"model", "stories"}, {"prompt", "Once"},   {"max_tokens", max_tokens},
           {"temperature", 0.8}, {"ignore_eos", true}, {"stream", true}}
          .dump();
  return testing::send_request(port, testing::request_text("POST", "/v1/completions", body));
}

TEST(GatewayDrain, RequestsInFlightFinishThenNewOnesAre503) {
  TROUPE_SHARED_OR_SKIP(shared);
  auto s = serve_stories(shared, 20s);
  ASSERT_TRUE(s);
  const uint16_t port = s->port();
  const int fd = start_stream(port, 900);
  char first[64];
  ASSERT_GT(::recv(fd, first, sizeof first, MSG_PEEK), 0);  // admitted and streaming
  auto leaving = std::async(std::launch::async, [&] { s->node->leave("test"); });
  const auto a = testing::parse_answer(testing::read_all(fd));
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
  auto s = serve_stories(shared, 1ms);
  ASSERT_TRUE(s);
  const int fd = start_stream(s->port(), 2000);
  char first[64];
  ASSERT_GT(::recv(fd, first, sizeof first, MSG_PEEK), 0);
  s->node->leave("test");  // drains for 1 ms: the request is still running
  const auto a = testing::parse_answer(testing::read_all(fd));
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
