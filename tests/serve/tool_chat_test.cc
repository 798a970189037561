// Chats with tools end to end: stories260K served with a ChatML template that takes tools
// (tests/model/chat_templates/chatml_tools.jinja, given as --chat-template would give it). The
// tools must reach the template (the prompt is the template's rendering with them), tool_choice
// "none" must keep them out, bad tools and tool calls get 400s naming the field, and a reply
// holding a Hermes tool call becomes the API's tool_calls.
#include <nlohmann/json.hpp>

#include "actors/cluster_node.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"
#include "serve/http_gateway.h"
#include "serve/openai.h"
#include "tests/serve/http_client.h"
#include "tests/serve/served_cluster.h"
#include "tests/test_support.h"

namespace troupe::serve {
namespace {

using json = nlohmann::ordered_json;
using testing::http;

const json kTools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
  "description": "The weather in a city.", "parameters": {"type": "object",
  "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])");

class ToolChat : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string shared = troupe::testing::shared_dir();
    if (shared.empty()) return;
    testing::ServedSpec spec;
    spec.model = shared + "/models/stories260K/stories260K.gguf";
    spec.model_id = "tiny";
    spec.max_model_len = 2048;  // a 512-token vocabulary spells the tools' JSON out
    spec.kv_blocks = 256;
    spec.gateway.chat_template = template_source();
    served_ = testing::ServedCluster::start(spec).release();
  }
  static void TearDownTestSuite() {
    delete served_;
    served_ = nullptr;
  }
  void SetUp() override {
    TROUPE_SHARED_OR_SKIP(shared);
    ASSERT_NE(served_, nullptr) << "the cluster or its gateway did not start";
  }
  static json post(const json& body, int want = 200) {
    const auto a = http(served_->port(), "POST", "/v1/chat/completions", body.dump());
    EXPECT_EQ(a.status, want) << a.body;
    return json::parse(a.body, nullptr, false);
  }
  static std::string template_source() {
    return troupe::testing::read_text_file(troupe::testing::source_dir() +
                                           "/tests/model/chat_templates/chatml_tools.jinja");
  }
  static const model::Tokenizer& tok() { return *served_->node->model()->tokenizer; }
  // The served template's text for `messages` (with `tools` when not null).
  static std::string rendered(const json& messages, const json& tools,
                              bool add_generation_prompt = true) {
    json ctx = {{"messages", messages},
                {"add_generation_prompt", add_generation_prompt},
                {"bos_token", std::string(tok().token_text(tok().bos_id()))},
                {"eos_token", std::string(tok().token_text(tok().eos_id()))}};
    if (!tools.is_null()) ctx["tools"] = tools;
    auto t = model::ChatTemplate::compile(template_source());
    EXPECT_TRUE(t);
    if (!t) return "";
    auto text = t->render(ctx, 0);
    EXPECT_TRUE(text) << text.error().message;
    return text ? *text : "";
  }
  // The prompt's length the template gives `messages`.
  static int64_t prompt_len(const json& messages, const json& tools) {
    return static_cast<int64_t>(tok().encode(rendered(messages, tools), false, true).size());
  }

  static inline testing::ServedCluster* served_ = nullptr;
};

std::string trimmed(const json& s) {
  const std::string t = s.get<std::string>();
  const size_t b = t.find_first_not_of(' ');
  return b == std::string::npos ? "" : t.substr(b);
}

const json kAsk = json::array({{{"role", "user"}, {"content", "Weather in Paris?"}}});

TEST_F(ToolChat, TheToolsReachTheTemplateUnlessToolChoiceIsNone) {
  const json with =
      post({{"model", "tiny"}, {"messages", kAsk}, {"tools", kTools}, {"max_tokens", 2}});
  EXPECT_EQ(with["usage"]["prompt_tokens"], prompt_len(kAsk, kTools)) << with.dump();
  const json none = post({{"model", "tiny"},
                          {"messages", kAsk},
                          {"tools", kTools},
                          {"tool_choice", "none"},
                          {"max_tokens", 2}});
  EXPECT_EQ(none["usage"]["prompt_tokens"], prompt_len(kAsk, nullptr)) << none.dump();
  EXPECT_GT(with["usage"]["prompt_tokens"].get<int64_t>(),
            none["usage"]["prompt_tokens"].get<int64_t>() + 20);

  // A conversation that went through a call: the assistant's call (arguments as the API's JSON
  // text) and the tool's answer, as the template writes them.
  json history = kAsk;
  history.push_back(
      {{"role", "assistant"},
       {"content", nullptr},
       {"tool_calls",
        {{{"id", "call_1"},
          {"type", "function"},
          {"function", {{"name", "get_weather"}, {"arguments", "{\"city\": \"Paris\"}"}}}}}}});
  history.push_back({{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "Sunny, 21 C"}});
  const json after =
      post({{"model", "tiny"}, {"messages", history}, {"tools", kTools}, {"max_tokens", 2}});
  json expected = history;  // the template sees the arguments as an object
  expected[1]["tool_calls"][0]["function"]["arguments"] = {{"city", "Paris"}};
  EXPECT_EQ(after["usage"]["prompt_tokens"], prompt_len(expected, kTools)) << after.dump();
}

// With tools a stream holds back what may begin a call and sends the rest at the end: the
// content it sends is the whole answer's.
TEST_F(ToolChat, AStreamWithToolsSendsTheWholeAnswersContent) {
  const json body = {{"model", "tiny"},  {"messages", kAsk}, {"tools", kTools},
                     {"max_tokens", 40}, {"temperature", 0}, {"ignore_eos", true}};
  const json whole = post(body);
  json sbody = body;
  sbody["stream"] = true;
  const auto a = http(served_->port(), "POST", "/v1/chat/completions", sbody.dump());
  ASSERT_EQ(a.status, 200) << a.body;
  std::string content, finish;
  for (const auto& e : a.events()) {
    if (e == "[DONE]") continue;
    const json c = json::parse(e);
    const json& d = c["choices"][0]["delta"];
    if (d.contains("content")) content += d["content"].get<std::string>();
    EXPECT_FALSE(d.contains("tool_calls")) << e;
    if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(content, whole["choices"][0]["message"]["content"]);
  EXPECT_EQ(finish, whole["choices"][0]["finish_reason"]);
  EXPECT_EQ(finish, "length");
}

// continue_final_message: the prompt is the conversation's rendering up to the end of the final
// assistant message's text, and the reply goes on from there.
TEST_F(ToolChat, AFinalAssistantMessageIsContinued) {
  json msgs = kAsk;
  msgs.push_back({{"role", "assistant"}, {"content", "Once upon a"}});
  const json a = post({{"model", "tiny"},
                       {"messages", msgs},
                       {"continue_final_message", true},
                       {"add_generation_prompt", false},
                       {"max_tokens", 3}});
  std::string text = rendered(msgs, nullptr, /*add_generation_prompt=*/false);
  const size_t end = text.rfind("Once upon a") + std::string("Once upon a").size();
  ASSERT_LT(end, text.size()) << "the template closes the turn after the text";
  text.resize(end);
  EXPECT_EQ(a["usage"]["prompt_tokens"], tok().encode(text, false, true).size()) << a.dump();

  const json both = post({{"model", "tiny"},
                          {"messages", msgs},
                          {"continue_final_message", true},
                          {"add_generation_prompt", true}},
                         400);
  EXPECT_EQ(both["error"]["param"], "continue_final_message");
  const json user_last =
      post({{"model", "tiny"}, {"messages", kAsk}, {"continue_final_message", true}}, 400);
  EXPECT_EQ(user_last["error"]["param"], "continue_final_message");
}

TEST_F(ToolChat, BadToolsAndToolCallsAreNamed) {
  // A forced call (tests/serve/structured_output_test.cc) must name one of the tools.
  const json forced = post({{"model", "tiny"},
                            {"messages", kAsk},
                            {"tools", kTools},
                            {"tool_choice", {{"type", "function"}, {"function", {{"name", "x"}}}}}},
                           400);
  EXPECT_EQ(forced["error"]["param"], "tool_choice");
  const json odd =
      post({{"model", "tiny"}, {"messages", kAsk}, {"tools", kTools}, {"tool_choice", 5}}, 400);
  EXPECT_EQ(odd["error"]["param"], "tool_choice");
  const json bad_tool = post({{"model", "tiny"},
                              {"messages", kAsk},
                              {"tools", {{{"type", "function"}, {"function", {{"x", 1}}}}}}},
                             400);
  EXPECT_EQ(bad_tool["error"]["param"], "tools[0]");
  const json not_list =
      post({{"model", "tiny"}, {"messages", kAsk}, {"tools", "get_weather"}}, 400);
  EXPECT_EQ(not_list["error"]["param"], "tools");
  json history = kAsk;
  history.push_back({{"role", "assistant"},
                     {"tool_calls",
                      {{{"id", "c"},
                        {"type", "function"},
                        {"function", {{"name", "f"}, {"arguments", "{not json"}}}}}}});
  const json bad_args = post({{"model", "tiny"}, {"messages", history}}, 400);
  EXPECT_EQ(bad_args["error"]["param"], "messages[1].tool_calls[0].function.arguments");
}

TEST_F(ToolChat, AReplyHoldingACallBecomesToolCalls) {
  const model::Tokenizer& tok = *served_->node->model()->tokenizer;
  ApiRequest req;
  req.endpoint = Endpoint::kChat;
  req.reply.tools = ToolFormat::kHermes;
  actors::GenerateResult r;
  r.finish_reason = "stop";
  r.text =
      "I will look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\"}}\n</tool_call>";
  r.tokens = tok.encode(r.text, false, false);
  json body = json::parse(response_body(req, "chatcmpl-1", 0, "tiny", {r}, {}, &tok));
  const json& choice = body["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  // (stories260K's SentencePiece tokens give the text a leading space)
  EXPECT_EQ(trimmed(choice["message"]["content"]), "I will look.");
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u) << body.dump();
  const json& call = choice["message"]["tool_calls"][0];
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(call["function"]["arguments"].get<std::string>()),
            json({{"city", "Paris"}}));
  EXPECT_EQ(call["id"].get<std::string>().rfind("call_", 0), 0u);

  // Without a call the reply is content, with the finish reason the cluster gave.
  r.text = "Just text <tool";
  r.tokens = tok.encode(r.text, false, false);
  body = json::parse(response_body(req, "chatcmpl-2", 0, "tiny", {r}, {}, &tok));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(trimmed(body["choices"][0]["message"]["content"]), "Just text <tool");
  EXPECT_FALSE(body["choices"][0]["message"].contains("tool_calls"));

  // With --reasoning-parser: the thinking is reasoning_content, the call after it a call.
  req.reply.reasoning = true;
  r.text =
      "<think>\nThe user wants weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", "
      "\"arguments\": {\"city\": \"Rome\"}}\n</tool_call>";
  r.tokens = tok.encode(r.text, false, false);
  body = json::parse(response_body(req, "chatcmpl-4", 0, "tiny", {r}, {}, &tok));
  EXPECT_EQ(body["choices"][0]["message"]["reasoning_content"], "The user wants weather.\n");
  EXPECT_TRUE(body["choices"][0]["message"]["content"].is_null()) << body.dump();
  EXPECT_EQ(body["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(json::parse(chunk_body(Endpoint::kChat, "c", 0, "tiny", 0, "", false, "", "",
                                   "Hmm"))["choices"][0]["delta"]["reasoning_content"],
            "Hmm");

  // A format that writes values as bare text reads them by the tools' parameter types.
  req.reply.reasoning = false;
  req.reply.tools = ToolFormat::kQwen3Coder;
  req.reply.param_types = std::make_shared<const ToolParamTypes>(
      ToolParamTypes{{"get_weather", {{"city", "string"}, {"days", "integer"}}}});
  r.text =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\n1984\n</parameter>\n"
      "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>";
  r.tokens = tok.encode(r.text, false, false);
  body = json::parse(response_body(req, "chatcmpl-5", 0, "tiny", {r}, {}, &tok));
  EXPECT_EQ(json::parse(body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
                            .get<std::string>()),
            json({{"city", "1984"}, {"days", 2}}))
      << body.dump();

  // The stream's chunk for the calls.
  const json chunk = json::parse(tool_calls_chunk_body(
      "chatcmpl-3", 0, "tiny", 0, {{"call_x", "get_weather", "{\"city\": \"Oslo\"}"}}));
  EXPECT_EQ(chunk["choices"][0]["delta"]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(chunk["choices"][0]["delta"]["tool_calls"][0]["index"], 0);
  EXPECT_FALSE(chunk["choices"][0]["delta"].contains("role"));
  const json opening = json::parse(
      tool_calls_chunk_body("chatcmpl-3", 0, "tiny", 0, {{"call_x", "f", "{}"}}, /*first=*/true));
  EXPECT_EQ(opening["choices"][0]["delta"]["role"], "assistant") << "a reply that is only a call";
}

// gpt-oss's harmony messages (a template of our own in its style): the template is recognized,
// tools need no parser, reasoning_effort reaches the template, and a reply's channels become
// reasoning_content, content and tool_calls.
TEST_F(ToolChat, HarmonyRepliesAreSplitByChannel) {
  ServedModel sm;
  sm.id = "tiny";
  sm.model = served_->node->model();
  sm.max_model_len = 2048;
  ASSERT_TRUE(set_chat_template(
      &sm, troupe::testing::read_text_file(troupe::testing::source_dir() +
                                           "/tests/model/chat_templates/harmony_tools.jinja")));
  EXPECT_TRUE(sm.harmony);
  ApiRequest req;
  ApiError err;
  const json body = {{"model", "tiny"},
                     {"messages", kAsk},
                     {"tools", kTools},
                     {"reasoning_effort", "high"},
                     {"max_tokens", 8}};
  ASSERT_TRUE(parse_request(Endpoint::kChat, body.dump(), sm, &req, &err)) << err.message;
  EXPECT_TRUE(req.reply.harmony);
  EXPECT_EQ(req.reply.tools, ToolFormat::kNone);  // the channels say what is a call
  const std::string prompt = tok().decode(req.choices[0].prompt_tokens);
  EXPECT_NE(prompt.find("Reasoning: high"), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("## get_weather"), std::string::npos) << prompt;
  json bad = body;
  bad["reasoning_effort"] = "max";
  EXPECT_FALSE(parse_request(Endpoint::kChat, bad.dump(), sm, &req, &err));
  EXPECT_EQ(err.param, "reasoning_effort");

  ASSERT_TRUE(parse_request(Endpoint::kChat, body.dump(), sm, &req, &err)) << err.message;
  actors::GenerateResult r;
  r.finish_reason = "stop";
  r.text =
      "<|channel|>analysis<|message|>Weather needed.<|end|><|start|>assistant<|channel|>"
      "commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}"
      "<|call|>";
  r.tokens = tok().encode(r.text, false, false);
  json out = json::parse(response_body(req, "chatcmpl-h", 0, "tiny", {r}, {}, &tok()));
  const json& m = out["choices"][0]["message"];
  EXPECT_EQ(m["reasoning_content"], "Weather needed.") << out.dump();
  EXPECT_TRUE(m["content"].is_null()) << out.dump();
  ASSERT_EQ(m["tool_calls"].size(), 1u) << out.dump();
  EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(m["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            json({{"city", "Paris"}}));
  EXPECT_EQ(out["choices"][0]["finish_reason"], "tool_calls");
  r.text =
      "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final"
      "<|message|>Sunny.<|return|>";
  r.tokens = tok().encode(r.text, false, false);
  out = json::parse(response_body(req, "chatcmpl-h2", 0, "tiny", {r}, {}, &tok()));
  EXPECT_EQ(out["choices"][0]["message"]["reasoning_content"], "Easy.");
  EXPECT_EQ(trimmed(out["choices"][0]["message"]["content"]), "Sunny.");
  EXPECT_EQ(out["choices"][0]["finish_reason"], "stop");
}

TEST_F(ToolChat, AnUnknownParserOrATemplateWithoutToolsIsRefused) {
  GatewayOptions g;
  g.port = 0;
  g.tool_call_parser = "qwen";
  auto bad = HttpGateway::start(*served_->node, g);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("--tool-call-parser: 'qwen' is none of"), std::string::npos)
      << bad.error().message;
  GatewayOptions think;
  think.port = 0;
  think.reasoning_parser = "o1";
  auto bad_think = HttpGateway::start(*served_->node, think);
  ASSERT_FALSE(bad_think);
  EXPECT_NE(bad_think.error().message.find("--reasoning-parser: 'o1' is none of"),
            std::string::npos);
  // The same model with a template that never reads `tools`: a chat with tools is refused.
  GatewayOptions plain;
  plain.port = 0;
  plain.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}";
  auto gw = HttpGateway::start(*served_->node, plain);
  ASSERT_TRUE(gw) << gw.error().message;
  const auto a =
      http((*gw)->port(), "POST", "/v1/chat/completions",
           json({{"model", (*gw)->model_id()}, {"messages", kAsk}, {"tools", kTools}}).dump());
  EXPECT_EQ(a.status, 400) << a.body;
  EXPECT_NE(a.body.find("does not take tools"), std::string::npos) << a.body;
}

}  // namespace
}  // namespace troupe::serve
