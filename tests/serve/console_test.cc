// The console in a real browser: headless Chromium loads /console from a one-node cluster's
// gateway, its script renders /console/state and follows /console/feed (server-sent events) for
// two updates; the page it leaves must show the cluster as the head reports it. Plus the state
// and feed endpoints read directly.
#include <unistd.h>

#include <chrono>
#include <cstdlib>

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
using testing::http;
using namespace std::chrono_literals;

std::string find_chromium() {
  for (const char* p : {"/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"})
    if (::access(p, X_OK) == 0) return p;
  return "";
}

class Console : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string shared = troupe::testing::shared_dir();
    if (shared.empty()) return;
    testing::ServedSpec spec;
    spec.model = shared + "/models/stories260K/stories260K.gguf";
    spec.model_id = "stories";
    spec.max_sequences = 4;
    spec.gateway.console_period = 200ms;
    served_ = testing::ServedCluster::start(spec).release();
    if (served_) gateway_ = served_->gateway.get();
  }
  static void TearDownTestSuite() {
    delete served_;
    served_ = nullptr;
    gateway_ = nullptr;
  }
  void SetUp() override {
    TROUPE_SHARED_OR_SKIP(shared);
    ASSERT_NE(gateway_, nullptr) << "the cluster or its gateway did not start";
  }
  static inline testing::ServedCluster* served_ = nullptr;
  static inline HttpGateway* gateway_ = nullptr;
};

TEST_F(Console, StateAndFeedDescribeTheCluster) {
  const uint16_t port = gateway_->port();
  ASSERT_EQ(http(port, "POST", "/v1/completions",
                 json{{"model", "stories"}, {"prompt", "Once"}, {"max_tokens", 5}}.dump())
                .status,
            200);
  const auto a = http(port, "GET", "/console/state");
  ASSERT_EQ(a.status, 200) << a.body;
  const json st = json::parse(a.body);
  EXPECT_EQ(st["model"]["id"], "stories");
  EXPECT_EQ(st["model"]["arch"], "llama");
  // stories260K has no chat template: the console says why chats are refused.
  EXPECT_NE(st["model"]["chat"]["template"].get<std::string>().find("no chat template"),
            std::string::npos)
      << st["model"].dump();
  EXPECT_EQ(st["model"]["chat"]["tool_calls"], "none");
  EXPECT_EQ(st["cluster"]["serving"], true);
  ASSERT_EQ(st["cluster"]["members"].size(), 1u);
  EXPECT_EQ(st["cluster"]["members"][0]["name"], "a");
  EXPECT_EQ(st["cluster"]["actors"][0]["name"], "stage/0@a");
  EXPECT_GE(st["scheduler"]["tokens_generated"].get<double>(), 5);
  EXPECT_GE(st["gateway"]["http_2xx"].get<double>(), 1);
  for (const char* page : {"/console", "/console/console.js", "/console/console.css"}) {
    const auto p = http(port, "GET", page);
    EXPECT_EQ(p.status, 200) << page;
    EXPECT_GT(p.body.size(), 500u) << page;
  }
  EXPECT_EQ(http(port, "GET", "/console").headers.at("content-type"), "text/html; charset=utf-8");
  EXPECT_EQ(http(port, "POST", "/console/state", "{}").status, 405);

  // The feed: a state per period, until the client goes (read a few, then hang up).
  const int fd = testing::connect_loopback(port);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(testing::send_all(fd, "GET /console/feed HTTP/1.1\r\nHost: x\r\n\r\n"));
  std::string got;
  char buf[65536];
  const auto t0 = std::chrono::steady_clock::now();
  size_t events = 0;
  while (events < 3 && std::chrono::steady_clock::now() - t0 < 20s) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
    events = 0;
    for (size_t at = got.find("data: {"); at != std::string::npos; at = got.find("data: {", at + 1))
      ++events;
  }
  ::close(fd);
  EXPECT_GE(events, 3u) << got.substr(0, 500);
  EXPECT_NE(got.find("text/event-stream"), std::string::npos);
}

TEST_F(Console, AHeadlessBrowserShowsTheCluster) {
  const std::string chromium = find_chromium();
  if (chromium.empty()) {
    if (troupe::testing::shared_required())
      FAIL() << "chromium is not installed: scripts/setup installs it";
    GTEST_SKIP() << "chromium is not installed (scripts/setup installs it): the console's browser "
                    "test did not run";
  }
  const uint16_t port = gateway_->port();
  ASSERT_EQ(http(port, "POST", "/v1/completions",
                 json{{"model", "stories"}, {"prompt", "Once"}, {"max_tokens", 5}}.dump())
                .status,
            200);
  troupe::testing::TempDir dir;
  // --dump-dom prints the page once its script is done and its connections closed: the page
  // follows the feed for two updates (?updates=2), then closes it.
  const auto run = troupe::testing::run_process(
      "/usr/bin/timeout",
      {"90", chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
       "--user-data-dir=" + dir.file("profile"), "--virtual-time-budget=10000", "--dump-dom",
       "http://127.0.0.1:" + std::to_string(port) + "/console?updates=2"},
      dir.path());
  ASSERT_EQ(run.rc, 0) << run.err.substr(0, 2000);
  const std::string& dom = run.out;
  auto has = [&](const std::string& s) {
    EXPECT_NE(dom.find(s), std::string::npos) << "the page lacks: " << s << "\n" << dom;
  };
  has(R"(id="serving" class="badge ok">serving<)");
  has(R"(id="model" class="muted">stories · llama · 5 layers · gguf · chats refused: this model has no chat template)");
  has(R"(id="feed" class="muted">stopped after 2 updates<)");
  has(R"(<td>a</td><td>127.0.0.1:)");                // the node row
  has(R"(<span class="state-alive">alive</span>)");  // its state
  has(R"(<td>stage/0</td><td>a</td><td><span class="state-running">running</span></td>)");
  has(R"(<td>warm-up</td>)");  // a start-up phase
  has(R"(<td>tokens generated</td>)");
}

}  // namespace
}  // namespace troupe::serve
