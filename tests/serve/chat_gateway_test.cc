// /v1/chat/completions end to end: a random-weight Llama written by synth with Phi-3's real
// vocabulary and chat template (../shared), served by a one-node cluster. The chat's prompt must
// be the template's text tokenized with its control tokens, and its answer the completion of
// exactly those tokens.
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "actors/cluster_node.h"
#include "actors/plan.h"
#include "model/model.h"
#include "model/synth.h"
#include "model/tokenizer.h"
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

class ChatGateway : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string shared = troupe::testing::shared_dir();
    if (shared.empty()) return;
    char tmpl[] = "/tmp/troupe-chat-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    model::SynthOptions so;
    so.arch = "llama";
    so.n_embd = 64;
    so.n_layer = 2;
    so.n_head = 4;
    so.n_head_kv = 2;
    so.n_ff = 128;
    so.seed = 3;
    so.vocab_donor = shared + "/models/llama.cpp-vocab/ggml-vocab-phi-3.gguf";
    const std::string path = dir_ + "/phi3-vocab.gguf";
    auto s = model::synth_model(so, path);
    ASSERT_TRUE(s) << s.error().message;
    testing::ServedSpec spec;
    spec.model = path;
    spec.model_id = "phi";
    spec.max_model_len = 256;
    spec.max_sequences = 4;
    served_ = testing::ServedCluster::start(spec).release();
    if (served_) {
      node_ = served_->node.get();
      gateway_ = served_->gateway.get();
    }
  }
  static void TearDownTestSuite() {
    delete served_;
    served_ = nullptr;
    gateway_ = nullptr;
    node_ = nullptr;
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  void SetUp() override {
    TROUPE_SHARED_OR_SKIP(shared);
    ASSERT_NE(gateway_, nullptr) << "the cluster or its gateway did not start";
  }
  static json post(const std::string& path, const json& body, int want = 200) {
    const auto a = http(gateway_->port(), "POST", path, body.dump());
    EXPECT_EQ(a.status, want) << a.body;
    if (a.headers.count("content-type") && a.headers.at("content-type") == "text/event-stream") {
      json events = json::array();
      for (const auto& e : a.events())
        events.push_back(e == "[DONE]" ? json("[DONE]") : json::parse(e));
      return events;
    }
    return json::parse(a.body, nullptr, false);
  }

  static inline std::string dir_;
  static inline testing::ServedCluster* served_ = nullptr;
  static inline actors::ClusterNode* node_ = nullptr;
  static inline HttpGateway* gateway_ = nullptr;
};

const json kMessages = json::array({{{"role", "user"}, {"content", "Name a colour."}},
                                    {{"role", "assistant"}, {"content", "Blue."}},
                                    {{"role", "user"}, {"content", "Another?"}}});

TEST_F(ChatGateway, ThePromptIsTheTemplatesTokensAndTheAnswerTheirCompletion) {
  const json chat = post("/v1/chat/completions", {{"model", "phi"},
                                                  {"messages", kMessages},
                                                  {"max_tokens", 12},
                                                  {"temperature", 0},
                                                  {"ignore_eos", true}});
  ASSERT_TRUE(chat.is_object());
  EXPECT_EQ(chat["object"], "chat.completion");
  EXPECT_EQ(chat["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  ASSERT_EQ(chat["choices"].size(), 1u);
  EXPECT_EQ(chat["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(chat["choices"][0]["finish_reason"], "length");

  // The prompt the gateway built: the template's text with control tokens as single tokens.
  const auto& tok = *node_->model()->tokenizer;
  // The text is what python jinja2 renders from Phi-3's template for these messages
  // (tests/model/chat_template_test.cc checks our renderer against jinja2 on that template).
  const std::string text =
      "<s><|user|>\nName a colour.<|end|>\n<|assistant|>\nBlue.<|end|>\n<|user|>\nAnother?"
      "<|end|>\n<|assistant|>\n";
  const std::vector<int32_t> ids = tok.encode(text, false, true);
  ASSERT_EQ(ids[0], tok.bos_id());
  EXPECT_EQ(std::count(ids.begin(), ids.end(), tok.bos_id()), 1) << "one BOS, the template's";
  EXPECT_EQ(chat["usage"]["prompt_tokens"], ids.size());
  EXPECT_EQ(chat["usage"]["completion_tokens"], 12);

  // The same tokens as a completion's prompt give the same answer.
  const json comp = post("/v1/completions", {{"model", "phi"},
                                             {"prompt", ids},
                                             {"max_tokens", 12},
                                             {"temperature", 0},
                                             {"ignore_eos", true}});
  EXPECT_EQ(chat["choices"][0]["message"]["content"], comp["choices"][0]["text"]);

  // Chat logprobs: OpenAI's chat shape, the numbers of the completion of the same tokens.
  const json lc = post("/v1/chat/completions", {{"model", "phi"},
                                                {"messages", kMessages},
                                                {"max_tokens", 6},
                                                {"temperature", 0},
                                                {"ignore_eos", true},
                                                {"logprobs", true},
                                                {"top_logprobs", 2}});
  const json lk = post("/v1/completions", {{"model", "phi"},
                                           {"prompt", ids},
                                           {"max_tokens", 6},
                                           {"temperature", 0},
                                           {"ignore_eos", true},
                                           {"logprobs", 2}});
  const json& lp_content = lc["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(lp_content.size(), 6u) << lc.dump();
  for (size_t s = 0; s < 6; ++s) {
    EXPECT_EQ(lp_content[s]["token"], lk["choices"][0]["logprobs"]["tokens"][s]);
    EXPECT_EQ(lp_content[s]["logprob"], lk["choices"][0]["logprobs"]["token_logprobs"][s]);
    EXPECT_EQ(lp_content[s]["top_logprobs"].size(), 2u);
    std::string bytes;
    for (const auto& b : lp_content[s]["bytes"]) bytes += static_cast<char>(b.get<int>());
    EXPECT_EQ(bytes, lp_content[s]["token"].get<std::string>());
  }
  const json bad = post("/v1/chat/completions",
                        {{"model", "phi"}, {"messages", kMessages}, {"top_logprobs", 2}}, 400);
  EXPECT_EQ(bad["error"]["param"], "top_logprobs");

  // Streamed: the role first, then the same content, then [DONE].
  const json events = post("/v1/chat/completions", {{"model", "phi"},
                                                    {"messages", kMessages},
                                                    {"max_tokens", 12},
                                                    {"temperature", 0},
                                                    {"ignore_eos", true},
                                                    {"stream", true}});
  ASSERT_TRUE(events.is_array());
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  EXPECT_EQ(events[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(events[0]["choices"][0]["delta"]["role"], "assistant");
  std::string content;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json& d = events[i]["choices"][0]["delta"];
    if (d.contains("content")) content += d["content"].get<std::string>();
    if (i > 0) {
      EXPECT_FALSE(d.contains("role")) << "the role comes once";
    }
  }
  EXPECT_EQ(content, chat["choices"][0]["message"]["content"]);
  EXPECT_EQ(events[events.size() - 2]["choices"][0]["finish_reason"], "length");
}

TEST_F(ChatGateway, RefusesWhatTheTemplateCannotHold) {
  const json sys =
      post("/v1/chat/completions",
           {{"model", "phi"},
            {"messages",
             {{{"role", "system"}, {"content", "S"}}, {{"role", "user"}, {"content", "U"}}}}},
           400);
  EXPECT_EQ(sys["error"]["param"], "messages[0]");
  EXPECT_NE(sys["error"]["message"].get<std::string>().find(
                "the model's chat template leaves out messages[0] (a system message)"),
            std::string::npos)
      << sys.dump();
  const json kw =
      post("/v1/chat/completions",
           {{"model", "phi"}, {"messages", kMessages}, {"chat_template_kwargs", 3}}, 400);
  EXPECT_EQ(kw["error"]["param"], "chat_template_kwargs");
  const json none =
      post("/v1/chat/completions", {{"model", "phi"}, {"messages", json::array()}}, 400);
  EXPECT_EQ(none["error"]["message"], "'messages' is empty");
  const json gen =
      post("/v1/chat/completions",
           {{"model", "phi"}, {"messages", kMessages}, {"add_generation_prompt", 1}}, 400);
  EXPECT_EQ(gen["error"]["param"], "add_generation_prompt");
  const json img =
      post("/v1/chat/completions",
           {{"model", "phi"},
            {"messages",
             {{{"role", "user"},
               {"content", {{{"type", "image_url"}, {"image_url", {{"url", "data:x"}}}}}}}}}},
           400);
  EXPECT_EQ(img["error"]["param"], "messages[0].content[0]");  // not a data: URL of an image
  // A real PNG, but this server has no vision encoder.
  const std::string png = troupe::testing::read_text_file(troupe::testing::shared_dir() +
                                                          "/golden/vlm/images/checker_50x40.png");
  std::string b64;
  {
    static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    uint32_t acc = 0;
    int bits = 0;
    for (unsigned char c : png) {
      acc = (acc << 8) | c;
      bits += 8;
      while (bits >= 6) {
        bits -= 6;
        b64 += k[(acc >> bits) & 63];
      }
    }
    if (bits > 0) b64 += k[(acc << (6 - bits)) & 63];
    while (b64.size() % 4 != 0) b64 += '=';
  }
  json msg = {{"role", "user"}};
  msg["content"] = json::array(
      {{{"type", "image_url"}, {"image_url", {{"url", "data:image/png;base64," + b64}}}}});
  json body = {{"model", "phi"}};
  body["messages"] = json::array({msg});
  const json novision = post("/v1/chat/completions", body, 400);
  EXPECT_NE(novision["error"]["message"].get<std::string>().find("no vision encoder"),
            std::string::npos)
      << novision.dump();
  // Phi-3's template never reads `tools`: a chat with tools would lose them.
  const json tool = {{"type", "function"}, {"function", {{"name", "f"}}}};
  const json tools = post("/v1/chat/completions",
                          {{"model", "phi"}, {"messages", kMessages}, {"tools", {tool}}}, 400);
  EXPECT_EQ(tools["error"]["param"], "tools");
  EXPECT_NE(tools["error"]["message"].get<std::string>().find("does not take tools"),
            std::string::npos);
  // With tool_choice "none" the tools are not the template's business.
  post("/v1/chat/completions", {{"model", "phi"},
                                {"messages", kMessages},
                                {"tools", {tool}},
                                {"tool_choice", "none"},
                                {"max_tokens", 1}});
  // max_tokens absent: a chat may use the rest of the context.
  const json rest = post("/v1/chat/completions", {{"model", "phi"},
                                                  {"messages", kMessages},
                                                  {"temperature", 0},
                                                  {"stop_token_ids", {0, 1, 2}}});
  EXPECT_TRUE(rest.contains("choices")) << rest.dump();
}

}  // namespace
}  // namespace troupe::serve
