// The HTTP gateway end to end: a one-node cluster (a real node daemon over UCX on loopback)
// serving stories260K, the gateway on a free port, and requests over real sockets
// (tests/serve/http_client.h). Checks the OpenAI-compatible answers against the reference story,
// the stream against the whole answer, every error path's status and body, cancellation when a
// client leaves, the API key, and the metrics.
#include "serve/http_gateway.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include <nlohmann/json.hpp>

#include "actors/cluster_node.h"
#include "actors/plan.h"
#include "model/tokenizer.h"
#include "tests/cluster_test_util.h"
#include "tests/serve/http_client.h"
#include "tests/serve/served_cluster.h"
#include "tests/test_support.h"

namespace troupe::serve {
namespace {

using nlohmann::json;
using testing::http;
using namespace std::chrono_literals;

constexpr const char* kModelId = "stories";

class Gateway : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string shared = troupe::testing::shared_dir();
    if (shared.empty()) return;
    testing::ServedSpec spec;
    spec.model = shared + "/models/stories260K/stories260K.gguf";
    spec.model_id = kModelId;
    spec.gateway.max_body_bytes = 1 << 16;
    served_ = testing::ServedCluster::start(spec).release();
    if (served_) {
      node_ = served_->node.get();
      gateway_ = served_->gateway.get();
      port_ = gateway_->port();
    }
  }
  static void TearDownTestSuite() {
    delete served_;
    served_ = nullptr;
    gateway_ = nullptr;
    node_ = nullptr;
  }
  void SetUp() override {
    TROUPE_SHARED_OR_SKIP(shared);
    ASSERT_NE(gateway_, nullptr) << "the cluster or its gateway did not start";
  }

  static testing::HttpAnswer post(const std::string& path, const json& body,
                                  const std::vector<std::string>& headers = {}) {
    return http(port_, "POST", path, body.dump(), headers);
  }
  static json body_of(const testing::HttpAnswer& a) {
    auto j = json::parse(a.body, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << "not JSON: " << a.body;
    return j;
  }
  // The status and the error object's param of a refused request.
  static void expect_error(const testing::HttpAnswer& a, int status, const std::string& param,
                           const std::string& words) {
    EXPECT_EQ(a.status, status) << a.body;
    const json j = body_of(a);
    ASSERT_TRUE(j.contains("error")) << a.body;
    EXPECT_EQ(a.headers.at("content-type"), "application/json");
    const json& e = j["error"];
    EXPECT_TRUE(e["message"].is_string());
    EXPECT_NE(e["message"].get<std::string>().find(words), std::string::npos) << a.body;
    EXPECT_TRUE(e["type"].is_string());
    if (param.empty())
      EXPECT_TRUE(e["param"].is_null()) << a.body;
    else
      EXPECT_EQ(e["param"], param) << a.body;
  }
  static json scheduler_metrics() {
    const auto a = http(port_, "GET", "/metrics");
    json out = json::object();
    size_t at = 0;
    while (at < a.body.size()) {
      size_t nl = a.body.find('\n', at);
      if (nl == std::string::npos) nl = a.body.size();
      const std::string line = a.body.substr(at, nl - at);
      at = nl + 1;
      if (line.empty() || line[0] == '#') continue;
      const size_t sp = line.rfind(' ');
      out[line.substr(0, sp)] = std::stod(line.substr(sp + 1));
    }
    return out;
  }

  // The metrics once nothing runs (neither in the scheduler nor the gateway), or after 5 s.
  static json metrics_when_idle() {
    json m;
    for (int i = 0; i < 200; ++i) {
      m = scheduler_metrics();
      if (m.value("troupe:num_requests_running", 1.0) == 0 &&
          m.value("troupe:gateway_requests_in_flight", 1.0) == 0)
        break;
      std::this_thread::sleep_for(25ms);
    }
    return m;
  }

  static inline testing::ServedCluster* served_ = nullptr;
  static inline actors::ClusterNode* node_ = nullptr;
  static inline HttpGateway* gateway_ = nullptr;
  static inline uint16_t port_ = 0;
};

TEST_F(Gateway, GreedyCompletionFromBosIsTheReferenceStory) {
  // llama2.c's run.c output, as tests/compute/story_test.cc checks it on the engine alone; here
  // through HTTP, the router and the scheduler.
  std::string expected = troupe::testing::read_text_file(
      troupe::testing::shared_dir() + "/models/stories260K/expected_greedy_t0_256steps.txt");
  while (!expected.empty() && expected.back() == '\n') expected.pop_back();
  const auto a =
      post("/v1/completions",
           {{"model", kModelId}, {"prompt", {1}}, {"max_tokens", 256}, {"temperature", 0}});
  ASSERT_EQ(a.status, 200) << a.body;
  const json j = body_of(a);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], kModelId);
  EXPECT_EQ(j["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  ASSERT_EQ(j["choices"].size(), 1u);
  std::string text = j["choices"][0]["text"];
  if (!text.empty() && text[0] == ' ') text.erase(0, 1);  // run.c drops the space after BOS
  EXPECT_EQ(text, expected);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 1);
  EXPECT_EQ(j["usage"]["completion_tokens"], 256);
  EXPECT_EQ(j["usage"]["total_tokens"], 257);
}

TEST_F(Gateway, LogprobsAreTheReferenceLogitsLogSoftmax) {
  // llama.cpp's logits of each greedy step (../shared/golden), log-softmaxed here in double: the
  // logprob of each generated token and the five most likely tokens must be theirs.
  const std::string dir = troupe::testing::shared_dir() + "/golden/stories260K/once_upon_a_time";
  const json c = json::parse(troupe::testing::read_text_file(dir + "/case.json"));
  const std::vector<float> rows = troupe::testing::read_f32_file(dir + "/step_logits.f32");
  const size_t vocab = c["vocab"], steps = c["n_gen"];
  ASSERT_EQ(rows.size(), vocab * steps);
  const auto a = post("/v1/completions", {{"model", kModelId},
                                          {"prompt", c["prompt_tokens"]},
                                          {"max_tokens", steps},
                                          {"temperature", 0},
                                          {"ignore_eos", true},
                                          {"logprobs", 5}});
  ASSERT_EQ(a.status, 200) << a.body;
  const json lp = body_of(a)["choices"][0]["logprobs"];
  ASSERT_EQ(lp["token_logprobs"].size(), steps);
  const auto& tok = *node_->model()->tokenizer;
  for (size_t s = 0; s < steps; ++s) {
    const float* row = rows.data() + s * vocab;
    double mx = row[0], big = 0;
    for (size_t v = 0; v < vocab; ++v) {
      mx = std::max<double>(mx, row[v]);
      big = std::max<double>(big, std::fabs(row[v]));
    }
    double sum = 0;
    for (size_t v = 0; v < vocab; ++v) sum += std::exp(row[v] - mx);
    const double log_z = mx + std::log(sum);
    const double tol = 2e-4 * big;  // the golden tolerance on logits, twice: log_z moves too
    const int32_t want = c["greedy_tokens"][s];
    EXPECT_EQ(lp["tokens"][s], tok.token_to_piece(want, true)) << "step " << s;
    EXPECT_NEAR(lp["token_logprobs"][s].get<double>(), row[want] - log_z, tol) << "step " << s;
    // The five most likely, each with its logprob.
    std::vector<int32_t> ids(vocab);
    for (size_t v = 0; v < vocab; ++v) ids[v] = static_cast<int32_t>(v);
    std::partial_sort(ids.begin(), ids.begin() + 6, ids.end(),
                      [&](int32_t x, int32_t y) { return row[x] > row[y]; });
    const json& top = lp["top_logprobs"][s];
    EXPECT_EQ(top.size(), 5u);
    for (size_t k = 0; k < 5; ++k) {
      if (row[ids[k]] - row[ids[k + 1]] < 2 * tol) break;  // a near-tie may go either way
      const std::string piece = tok.token_to_piece(ids[k], true);
      ASSERT_TRUE(top.contains(piece)) << "step " << s << ": " << piece << " missing from " << top;
      EXPECT_NEAR(top[piece].get<double>(), row[ids[k]] - log_z, tol) << "step " << s;
    }
  }
  // The stream carries the same numbers, one token a chunk.
  const auto st = post("/v1/completions", {{"model", kModelId},
                                           {"prompt", c["prompt_tokens"]},
                                           {"max_tokens", 4},
                                           {"temperature", 0},
                                           {"logprobs", 0},
                                           {"stream", true}});
  ASSERT_EQ(st.status, 200);
  const auto events = st.events();
  for (size_t s = 0; s < 4; ++s) {
    const json e = json::parse(events.at(s));
    EXPECT_EQ(e["choices"][0]["logprobs"]["token_logprobs"][0], lp["token_logprobs"][s]);
    EXPECT_TRUE(e["choices"][0]["logprobs"]["top_logprobs"][0].empty());  // logprobs 0
  }
}

TEST_F(Gateway, StreamCarriesTheSameTextAsTheWholeAnswer) {
  const json req = {{"model", kModelId},
                    {"prompt", "Once upon a time"},
                    {"max_tokens", 40},
                    {"temperature", 0.9},
                    {"seed", 11}};
  const auto whole = post("/v1/completions", req);
  ASSERT_EQ(whole.status, 200) << whole.body;
  json sreq = req;
  sreq["stream"] = true;
  sreq["stream_options"] = {{"include_usage", true}};
  const auto s = post("/v1/completions", sreq);
  ASSERT_EQ(s.status, 200) << s.body;
  EXPECT_EQ(s.headers.at("content-type"), "text/event-stream");
  const auto events = s.events();
  ASSERT_GE(events.size(), 3u) << s.body;
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text, finish;
  json usage;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json e = json::parse(events[i]);
    EXPECT_EQ(e["object"], "text_completion");
    if (e["choices"].empty()) {
      usage = e["usage"];
      continue;
    }
    text += e["choices"][0]["text"].get<std::string>();
    if (!e["choices"][0]["finish_reason"].is_null()) finish = e["choices"][0]["finish_reason"];
  }
  const json w = body_of(whole);
  EXPECT_EQ(text, w["choices"][0]["text"].get<std::string>());  // the seed makes both the same
  EXPECT_EQ(finish, w["choices"][0]["finish_reason"].get<std::string>());
  EXPECT_EQ(usage, w["usage"]);
}

TEST_F(Gateway, SeedsStopStringsAndChoices) {
  json req = {{"model", kModelId},
              {"prompt", {"Once upon a time", "The dog"}},
              {"n", 2},
              {"max_tokens", 12},
              {"temperature", 1.0},
              {"seed", 5}};
  const auto a = post("/v1/completions", req);
  const auto b = post("/v1/completions", req);
  ASSERT_EQ(a.status, 200) << a.body;
  const json ja = body_of(a), jb = body_of(b);
  ASSERT_EQ(ja["choices"].size(), 4u);  // prompts x n, prompt-major
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(ja["choices"][i]["index"], i);
    EXPECT_EQ(ja["choices"][i]["text"], jb["choices"][i]["text"]) << "seeded choice " << i;
  }
  EXPECT_NE(ja["choices"][0]["text"], ja["choices"][1]["text"]) << "n choices draw differently";

  // A stop string ends the text before it.
  const auto g = post("/v1/completions", {{"model", kModelId},
                                          {"prompt", "Once upon a time"},
                                          {"max_tokens", 30},
                                          {"temperature", 0}});
  const std::string greedy = body_of(g)["choices"][0]["text"];
  const size_t cut = greedy.find(" girl");
  ASSERT_NE(cut, std::string::npos) << greedy;
  const auto st = post("/v1/completions", {{"model", kModelId},
                                           {"prompt", "Once upon a time"},
                                           {"max_tokens", 30},
                                           {"temperature", 0},
                                           {"stop", {" girl"}}});
  ASSERT_EQ(st.status, 200) << st.body;
  EXPECT_EQ(body_of(st)["choices"][0]["text"], greedy.substr(0, cut));
  EXPECT_EQ(body_of(st)["choices"][0]["finish_reason"], "stop");

  // echo puts the prompt's text before the completion.
  const auto e = post("/v1/completions", {{"model", kModelId},
                                          {"prompt", "Once upon a time"},
                                          {"max_tokens", 30},
                                          {"temperature", 0},
                                          {"echo", true}});
  EXPECT_EQ(body_of(e)["choices"][0]["text"], "Once upon a time" + greedy);
}

TEST_F(Gateway, BadRequestsGetOpenAiErrors) {
  const json ok = {{"model", kModelId}, {"prompt", "Hi"}, {"max_tokens", 2}};
  auto with = [&](const char* k, json v) {
    json b = ok;
    b[k] = std::move(v);
    return post("/v1/completions", b);
  };
  expect_error(http(port_, "POST", "/v1/completions", "{not json"), 400, "", "not valid JSON");
  expect_error(http(port_, "POST", "/v1/completions", "[1,2]"), 400, "", "JSON object");
  expect_error(post("/v1/completions", {{"prompt", "Hi"}}), 400, "model", "required");
  expect_error(with("model", "gpt-4"), 404, "model", "does not exist");
  expect_error(with("temperature", "hot"), 400, "temperature", "must be a number");
  expect_error(with("temperature", 3), 400, "temperature", "[0, 2]");
  expect_error(with("top_p", 0), 400, "top_p", "greater than 0");
  expect_error(with("max_tokens", -1), 400, "max_tokens", "[0, 512]");
  expect_error(with("max_tokens", 1.5), 400, "max_tokens", "integer");
  expect_error(with("max_tokens", 600), 400, "max_tokens", "512");
  expect_error(with("max_tokens", 511), 400, "max_tokens", "maximum context length");
  expect_error(with("prompt", json::array()), 400, "prompt", "empty");
  expect_error(with("prompt", {1, 99999}), 400, "prompt", "not a token id");
  expect_error(with("prompt", 7), 400, "prompt", "must be a string");
  expect_error(with("stop", {1}), 400, "stop", "must be a string");
  expect_error(with("stop", ""), 400, "stop", "must not be empty");
  expect_error(with("n", 0), 400, "n", "[1, 16]");
  expect_error(with("logprobs", 21), 400, "logprobs", "at most 20");
  expect_error(with("logprobs", true), 400, "logprobs", "integer");
  {
    json b = ok;
    b["echo"] = true;
    b["logprobs"] = 1;
    expect_error(post("/v1/completions", b), 400, "echo", "prompt's logprobs");
  }
  expect_error(with("stream", "yes"), 400, "stream", "boolean");
  expect_error(with("stream_options", {{"include_usage", true}}), 400, "stream_options",
               "only allowed with stream");
  expect_error(post("/v1/chat/completions",
                    {{"model", kModelId}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}}),
               400, "messages", "no chat template");
  expect_error(post("/v1/chat/completions", {{"model", kModelId}, {"messages", "Hi"}}), 400,
               "messages", "must be an array");
  expect_error(http(port_, "GET", "/v1/completions"), 405, "", "use POST");
  expect_error(http(port_, "POST", "/v1/models", "{}"), 405, "", "use GET");
  expect_error(http(port_, "GET", "/v2/anything"), 404, "", "no route");
  expect_error(http(port_, "POST", "/v1/completions", std::string(70000, ' ')), 413, "",
               "larger than");
  // Not HTTP at all: a 400 and the connection closed, never a hang.
  const auto raw = testing::parse_answer(testing::raw_exchange(port_, "HELLO\r\n\r\n"));
  expect_error(raw, 400, "", "malformed HTTP request");
  // The server still serves after all of that.
  EXPECT_EQ(post("/v1/completions", ok).status, 200);
}

TEST_F(Gateway, ChoicesAreLimitedAsPromptsTimesN) {
  // max_choices is 16: one prompt x 9 passes, three prompts x 6 do not.
  const auto a =
      post("/v1/completions", {{"model", kModelId}, {"prompt", "Hi"}, {"max_tokens", 1}, {"n", 9}});
  EXPECT_EQ(a.status, 200) << a.body;
  EXPECT_EQ(body_of(a)["choices"].size(), 9u);
  expect_error(
      post("/v1/completions",
           {{"model", kModelId}, {"prompt", {"a", "b", "c"}}, {"max_tokens", 1}, {"n", 6}}),
      400, "n", "at most 16");
}

TEST_F(Gateway, AClientThatLeavesHasItsRequestCancelled) {
  const json before = scheduler_metrics();
  const double generated0 = before.value("troupe:generation_tokens_total", -1.0);
  ASSERT_GE(generated0, 0);
  // Ask for 500 tokens, read the first bytes of the stream, hang up.
  const std::string body = json{{"model", kModelId},  {"prompt", "Once"},   {"max_tokens", 500},
                                {"temperature", 0.8}, {"ignore_eos", true}, {"stream", true}}
                               .dump();
  const int fd =
      testing::send_request(port_, testing::request_text("POST", "/v1/completions", body));
  ASSERT_GE(fd, 0);
  char buf[256];
  ASSERT_GT(::recv(fd, buf, sizeof buf, 0), 0);
  ::close(fd);
  // The scheduler drops the sequence: nothing runs any more, and far fewer than 500 tokens came.
  const json m = metrics_when_idle();
  EXPECT_EQ(m.value("troupe:num_requests_running", -1.0), 0);
  EXPECT_EQ(m.value("troupe:gateway_requests_in_flight", -1.0), 0);
  EXPECT_LT(m.value("troupe:generation_tokens_total", 1e9) - generated0, 250);
  EXPECT_GE(m.value("troupe:request_success_total{finished_reason=\"cancelled\"}", 0.0), 1);
}

TEST_F(Gateway, AClientThatLeavesBeforeAWholeAnswerHasItsRequestCancelled) {
  const double generated0 = scheduler_metrics().value("troupe:generation_tokens_total", -1.0);
  ASSERT_GE(generated0, 0);
  const std::string body = json{
      {"model", kModelId},
      {"prompt", "Once"},
      {"max_tokens", 500},
      {"temperature", 0.8},
      {"ignore_eos", true}}.dump();
  const int fd =
      testing::send_request(port_, testing::request_text("POST", "/v1/completions", body));
  ASSERT_GE(fd, 0);
  ::close(fd);  // gone before any answer
  const json m = metrics_when_idle();
  EXPECT_EQ(m.value("troupe:num_requests_running", -1.0), 0);
  EXPECT_EQ(m.value("troupe:gateway_requests_in_flight", -1.0), 0);
  EXPECT_LT(m.value("troupe:generation_tokens_total", 1e9) - generated0, 250);
}

TEST_F(Gateway, ExpectContinueAndKeepAlive) {
  // A client that asks before sending its body (curl past 1 KiB) is told to go on at once.
  const std::string body =
      json{{"model", kModelId}, {"prompt", "Once"}, {"max_tokens", 3}, {"temperature", 0}}.dump();
  const int fd = testing::connect_loopback(port_);
  ASSERT_GE(fd, 0);
  const timeval wait{10, 0};  // a server that never says "continue" fails the test in 10 s
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
  ASSERT_TRUE(testing::send_all(fd,
                                "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                                "Content-Type: application/json\r\nExpect: 100-continue\r\n"
                                "Content-Length: " +
                                    std::to_string(body.size()) + "\r\n\r\n"));
  char buf[4096];
  const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
  ASSERT_GT(n, 0);
  EXPECT_EQ(std::string(buf, static_cast<size_t>(n)), "HTTP/1.1 100 Continue\r\n\r\n");
  // The body, then a second request on the same connection (keep-alive), then close.
  ASSERT_TRUE(testing::send_all(fd, body));
  ASSERT_TRUE(
      testing::send_all(fd, "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
  std::string rest;
  while (true) {
    const ssize_t k = ::recv(fd, buf, sizeof buf, 0);
    if (k <= 0) break;
    rest.append(buf, static_cast<size_t>(k));
  }
  ::close(fd);
  const size_t second = rest.find("HTTP/1.1", 1);
  ASSERT_NE(second, std::string::npos) << rest;
  const auto a = testing::parse_answer(rest.substr(0, second));
  const auto b = testing::parse_answer(rest.substr(second));
  EXPECT_EQ(a.status, 200);
  EXPECT_EQ(body_of(a)["usage"]["completion_tokens"], 3);
  EXPECT_EQ(b.status, 200);
  EXPECT_EQ(body_of(b)["data"][0]["id"], kModelId);
}

TEST_F(Gateway, HealthReadyModelsAndMetrics) {
  const auto h = http(port_, "GET", "/health");
  EXPECT_EQ(h.status, 200);
  const auto r = http(port_, "GET", "/ready");
  EXPECT_EQ(r.status, 200) << r.body;
  const auto m = http(port_, "GET", "/v1/models");
  ASSERT_EQ(m.status, 200);
  const json jm = body_of(m);
  EXPECT_EQ(jm["object"], "list");
  ASSERT_EQ(jm["data"].size(), 1u);
  EXPECT_EQ(jm["data"][0]["id"], kModelId);
  ASSERT_EQ(
      post("/v1/completions", {{"model", kModelId}, {"prompt", "Hi"}, {"max_tokens", 3}}).status,
      200);
  const auto t = http(port_, "GET", "/metrics");
  ASSERT_EQ(t.status, 200);
  EXPECT_EQ(t.headers.at("content-type").rfind("text/plain", 0), 0u);
  const json x = scheduler_metrics();
  EXPECT_EQ(x.value("troupe:cluster_serving", -1.0), 1);
  EXPECT_GE(x.value("troupe:prompt_tokens_total", 0.0), 2);
  EXPECT_GE(x.value("troupe:time_to_first_token_seconds_count", 0.0), 1);
  EXPECT_GE(x.value("troupe:e2e_request_latency_seconds_count", 0.0), 1);
  EXPECT_GE(x.value("troupe:scheduler_steps_total", 0.0), 1);
  EXPECT_TRUE(x.contains("troupe:kv_cache_usage_perc"));
  EXPECT_GE(x.value("troupe:http_requests_total{code=\"2xx\"}", 0.0), 4);
}

// A gateway with an API key, on the same cluster.
TEST_F(Gateway, ApiKeyGuardsTheV1Routes) {
  GatewayOptions g;
  g.port = 0;
  g.model_id = kModelId;
  g.max_model_len = 512;
  g.api_key = "sesame";
  auto gw = HttpGateway::start(*node_, g);
  ASSERT_TRUE(gw) << gw.error().message;
  const uint16_t port = (*gw)->port();
  const json req = {{"model", kModelId}, {"prompt", "Hi"}, {"max_tokens", 2}};
  const auto none = http(port, "POST", "/v1/completions", req.dump());
  EXPECT_EQ(none.status, 401) << none.body;
  EXPECT_NE(none.body.find("no API key"), std::string::npos);
  const auto wrong =
      http(port, "POST", "/v1/completions", req.dump(), {"Authorization: Bearer nope"});
  EXPECT_EQ(wrong.status, 401);
  EXPECT_NE(wrong.body.find("invalid_api_key"), std::string::npos);
  EXPECT_EQ(
      http(port, "POST", "/v1/completions", req.dump(), {"Authorization: Bearer sesame"}).status,
      200);
  EXPECT_EQ(http(port, "GET", "/health").status, 200);  // probes need no key
  (*gw)->stop();
  EXPECT_EQ(http(port, "GET", "/health").status, 0) << "stopped: nothing listens";
}

}  // namespace
}  // namespace troupe::serve
