// Constrained replies end to end: stories260K (a model that knows nothing of JSON) served on a
// one-node cluster must answer response_format json_schema / json_object, guided_choice, a GBNF
// grammar and forced tool calls with replies that parse and satisfy what was asked, checked here
// by nlohmann's parser and by hand (not by the grammar engine that made them); bad constraints
// get 400s that name the field.
#include <regex>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "actors/cluster_node.h"
#include "serve/http_gateway.h"
#include "serve/openai.h"
#include "tests/serve/http_client.h"
#include "tests/serve/served_cluster.h"
#include "tests/test_support.h"

namespace troupe::serve {
namespace {

using json = nlohmann::ordered_json;
using testing::http;

const json kPerson = json::parse(R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "pet": {"enum": ["cat", "dog", null]},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 3}
  },
  "required": ["name", "age", "tags"]
})");

// The reply satisfies kPerson (checked without the grammar engine).
void expect_person(const std::string& text) {
  const json v = json::parse(text, nullptr, false);
  ASSERT_FALSE(v.is_discarded()) << "not JSON: " << text;
  ASSERT_TRUE(v.is_object()) << text;
  std::set<std::string> keys;
  for (const auto& [k, _] : v.items()) keys.insert(k);
  for (const char* k : {"name", "age", "tags"}) EXPECT_TRUE(keys.count(k)) << k << " in " << text;
  for (const auto& k : keys) EXPECT_TRUE(kPerson["properties"].contains(k)) << k << " in " << text;
  ASSERT_TRUE(v["name"].is_string()) << text;
  const auto name = v["name"].get<std::string>();
  // Characters, not bytes: count the UTF-8 lead bytes.
  size_t chars = 0;
  for (unsigned char c : name) chars += (c & 0xC0) != 0x80;
  EXPECT_GE(chars, 1u) << text;
  EXPECT_LE(chars, 12u) << text;
  ASSERT_TRUE(v["age"].is_number_integer()) << text;
  EXPECT_GE(v["age"].get<int64_t>(), 0) << text;
  EXPECT_LE(v["age"].get<int64_t>(), 120) << text;
  if (v.contains("pet")) {
    EXPECT_TRUE(v["pet"] == "cat" || v["pet"] == "dog" || v["pet"].is_null()) << text;
  }
  ASSERT_TRUE(v["tags"].is_array()) << text;
  EXPECT_LE(v["tags"].size(), 3u) << text;
  for (const auto& t : v["tags"]) EXPECT_TRUE(t.is_string() && t.get<std::string>().size() <= 5);
  // Property order is the schema's.
  std::vector<std::string> order;
  for (const auto& [k, _] : v.items()) order.push_back(k);
  std::vector<std::string> schema_order;
  for (const auto& [k, _] : kPerson["properties"].items())
    if (keys.count(k)) schema_order.push_back(k);
  EXPECT_EQ(order, schema_order) << text;
}

class StructuredOutput : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string shared = troupe::testing::shared_dir();
    if (shared.empty()) return;
    testing::ServedSpec spec;
    spec.model = shared + "/models/stories260K/stories260K.gguf";
    spec.model_id = "tiny";
    spec.max_model_len = 2048;
    spec.kv_blocks = 512;
    spec.gateway.chat_template = troupe::testing::read_text_file(
        troupe::testing::source_dir() + "/tests/model/chat_templates/chatml_tools.jinja");
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
  static json post(const std::string& path, const json& body, int want = 200) {
    const auto a = http(served_->port(), "POST", path, body.dump());
    EXPECT_EQ(a.status, want) << a.body;
    return json::parse(a.body, nullptr, false);
  }
  static json complete(json body, int want = 200) {
    body["model"] = "tiny";
    if (!body.contains("prompt")) body["prompt"] = "Once upon a time";
    return post("/v1/completions", body, want);
  }
  static json chat(json body, int want = 200) {
    body["model"] = "tiny";
    return post("/v1/chat/completions", body, want);
  }
  static inline testing::ServedCluster* served_ = nullptr;
};

TEST_F(StructuredOutput, JsonSchemaRepliesSatisfyTheSchema) {
  const json fmt = {{"type", "json_schema"},
                    {"json_schema", {{"name", "person"}, {"schema", kPerson}}}};
  // Sampled (several seeds, two choices each) and greedy; the grammar ends the reply with EOS.
  for (int seed = 1; seed <= 3; ++seed) {
    const json a = complete({{"response_format", fmt},
                             {"max_tokens", 400},
                             {"temperature", 1.0},
                             {"seed", seed},
                             {"n", 2}});
    ASSERT_EQ(a["choices"].size(), 2u) << a.dump();
    for (const auto& c : a["choices"]) {
      SCOPED_TRACE(c.dump());
      EXPECT_EQ(c["finish_reason"], "stop");
      expect_person(c["text"].get<std::string>());
    }
  }
  const json g1 = complete({{"response_format", fmt}, {"max_tokens", 400}, {"temperature", 0}});
  const json g2 = complete({{"response_format", fmt}, {"max_tokens", 400}, {"temperature", 0}});
  expect_person(g1["choices"][0]["text"].get<std::string>());
  EXPECT_EQ(g1["choices"][0]["text"], g2["choices"][0]["text"]);
  EXPECT_EQ(g1["choices"][0]["finish_reason"], "stop");
  // Without the constraint the model writes a story, not JSON.
  const json free = complete({{"max_tokens", 40}, {"temperature", 0}});
  EXPECT_TRUE(
      json::parse(free["choices"][0]["text"].get<std::string>(), nullptr, false).is_discarded());
}

// A streamed constrained chat: the deltas put together are the schema's JSON.
TEST_F(StructuredOutput, StreamedRepliesAreTheSchemasJson) {
  const auto a = http(
      served_->port(), "POST", "/v1/chat/completions",
      json{{"model", "tiny"},
           {"messages", {{{"role", "user"}, {"content", "Who are you?"}}}},
           {"response_format",
            {{"type", "json_schema"}, {"json_schema", {{"name", "person"}, {"schema", kPerson}}}}},
           {"max_tokens", 400},
           {"temperature", 0.7},
           {"seed", 5},
           {"stream", true}}
          .dump());
  ASSERT_EQ(a.status, 200) << a.body;
  std::string text, finish;
  std::istringstream in(a.body);
  int pieces = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("data: {", 0) != 0) continue;
    const json ev = json::parse(line.substr(6));
    const json& ch = ev["choices"][0];
    if (ch["delta"].contains("content") && ch["delta"]["content"].is_string()) {
      text += ch["delta"]["content"].get<std::string>();
      ++pieces;
    }
    if (ch["finish_reason"].is_string()) finish = ch["finish_reason"];
  }
  EXPECT_GT(pieces, 5);  // streamed, not held back
  expect_person(text);
  EXPECT_EQ(finish, "stop") << text;
}

// json_object: any object. A story model fills strings until max_tokens, so the reply is checked
// as what it is: a whole object, or (cut short) text that only lacks its end.
TEST_F(StructuredOutput, JsonObjectRepliesAreObjectsOrTheirBeginnings) {
  for (int seed = 1; seed <= 4; ++seed) {
    const json a = complete({{"response_format", {{"type", "json_object"}}},
                             {"max_tokens", 60},
                             {"temperature", 1.0},
                             {"seed", seed}});
    const std::string text = a["choices"][0]["text"].get<std::string>();
    ASSERT_FALSE(text.empty());
    EXPECT_EQ(text[0], '{') << text;
    if (a["choices"][0]["finish_reason"] == "stop") {
      EXPECT_TRUE(json::parse(text, nullptr, false).is_object()) << text;
      continue;
    }
    try {
      const json whole = json::parse(text);
      ADD_FAILURE() << "a reply cut short parsed whole: " << whole.dump();
    } catch (const json::parse_error& e) {
      // The only fault is the missing end: the parser fails past the last byte.
      EXPECT_GE(e.byte, text.size()) << e.what() << "\n" << text;
    }
  }
}

TEST_F(StructuredOutput, ChoicesAndGrammars) {
  const std::set<std::string> options = {"yes", "no", "maybe so"};
  for (int seed = 1; seed <= 4; ++seed) {
    const json a = complete({{"guided_choice", {"yes", "no", "maybe so"}},
                             {"temperature", 1.0},
                             {"seed", seed},
                             {"max_tokens", 20}});
    EXPECT_TRUE(options.count(a["choices"][0]["text"].get<std::string>())) << a.dump();
  }
  const json s = complete({{"structured_outputs", {{"choice", {"left", "right"}}}},
                           {"max_tokens", 20},
                           {"temperature", 0}});
  EXPECT_TRUE(s["choices"][0]["text"] == "left" || s["choices"][0]["text"] == "right") << s.dump();
  // A GBNF grammar: a code like "AB-123" then a word from a class.
  const std::regex re("[A-Z]{2}-[0-9]{3} (red|green|blue)");
  for (int seed = 1; seed <= 3; ++seed) {
    const json g = complete({{"grammar",
                              "root ::= [A-Z]{2} \"-\" digit{3} \" \" color\n"
                              "digit ::= [0-9]\ncolor ::= \"red\" | \"green\" | \"blue\"\n"},
                             {"temperature", 1.0},
                             {"seed", seed},
                             {"max_tokens", 30}});
    const std::string t = g["choices"][0]["text"].get<std::string>();
    EXPECT_TRUE(std::regex_match(t, re)) << t;
    EXPECT_EQ(g["choices"][0]["finish_reason"], "stop");
  }
  // A reply cut by max_tokens is what was written so far, finish_reason "length".
  const json cut = complete({{"guided_choice", {"a long answer to cut short"}}, {"max_tokens", 3}});
  EXPECT_EQ(cut["choices"][0]["finish_reason"], "length") << cut.dump();
  EXPECT_EQ(std::string("a long answer to cut short")
                .rfind(cut["choices"][0]["text"].get<std::string>(), 0),
            0u)
      << cut.dump();
}

const json kTools = json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string", "maxLength": 10}}, "required": ["city"]}}},
  {"type": "function", "function": {"name": "add", "parameters": {"type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}
])");
const json kAsk = json::array({{{"role", "user"}, {"content", "Weather in Paris?"}}});

TEST_F(StructuredOutput, ForcedToolCalls) {
  for (int seed = 1; seed <= 3; ++seed) {
    // One call (the story model, free to add calls, would add them until max_tokens).
    const json a = chat({{"messages", kAsk},
                         {"tools", kTools},
                         {"tool_choice", "required"},
                         {"parallel_tool_calls", false},
                         {"max_tokens", 300},
                         {"temperature", 1.0},
                         {"seed", seed}});
    const json& msg = a["choices"][0]["message"];
    ASSERT_TRUE(msg.contains("tool_calls")) << a.dump();
    EXPECT_EQ(a["choices"][0]["finish_reason"], "tool_calls");
    ASSERT_EQ(msg["tool_calls"].size(), 1u);
    for (const auto& call : msg["tool_calls"]) {
      const std::string name = call["function"]["name"];
      const json args = json::parse(call["function"]["arguments"].get<std::string>());
      if (name == "get_weather") {
        EXPECT_TRUE(args.size() == 1 && args["city"].is_string()) << args.dump();
      } else {
        EXPECT_EQ(name, "add");
        EXPECT_TRUE(args.size() == 2 && args["a"].is_number_integer() &&
                    args["b"].is_number_integer())
            << args.dump();
      }
    }
  }
  const json named = chat({{"messages", kAsk},
                           {"tools", kTools},
                           {"tool_choice", {{"type", "function"}, {"function", {{"name", "add"}}}}},
                           {"max_tokens", 200},
                           {"temperature", 0.8},
                           {"seed", 9}});
  const json& msg = named["choices"][0]["message"];
  ASSERT_EQ(msg["tool_calls"].size(), 1u) << named.dump();
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "add");
  EXPECT_TRUE(msg["tool_calls"][0]["id"].get<std::string>().rfind("call_", 0) == 0);
  const json args = json::parse(msg["tool_calls"][0]["function"]["arguments"].get<std::string>());
  EXPECT_TRUE(args["a"].is_number_integer() && args["b"].is_number_integer()) << args.dump();
  EXPECT_TRUE(msg["content"].is_null()) << named.dump();
  // With parallel calls allowed, the reply cut short is the calls' JSON so far, as content.
  const json many = chat({{"messages", kAsk},
                          {"tools", kTools},
                          {"tool_choice", "required"},
                          {"max_tokens", 40},
                          {"temperature", 1.0},
                          {"seed", 2}});
  const json& c = many["choices"][0];
  if (c["finish_reason"] == "length") {
    EXPECT_EQ(c["message"]["content"].get<std::string>().rfind("[", 0), 0u) << many.dump();
    EXPECT_FALSE(c["message"].contains("tool_calls"));
  } else {
    EXPECT_EQ(c["finish_reason"], "tool_calls") << many.dump();
  }
}

TEST_F(StructuredOutput, BadConstraintsAreRefusedByName) {
  auto refused = [](const json& answer, const std::string& param, const std::string& part) {
    EXPECT_EQ(answer["error"]["param"], param) << answer.dump();
    EXPECT_NE(answer["error"]["message"].get<std::string>().find(part), std::string::npos)
        << answer.dump();
  };
  refused(complete({{"response_format",
                     {{"type", "json_schema"},
                      {"json_schema",
                       {{"name", "x"}, {"schema", {{"type", "string"}, {"pattern", "^a+$"}}}}}}}},
                   400),
          "response_format.json_schema.schema", "pattern");
  refused(complete({{"response_format", {{"type", "xml"}}}}, 400), "response_format",
          "json_schema");
  refused(complete({{"grammar", "root ::= \"a\" | b"}}, 400), "grammar", "rule 'b'");
  refused(complete({{"grammar", "root ::= \"a\""}, {"guided_choice", {"x"}}}, 400), "guided_choice",
          "both constrain");
  refused(complete({{"guided_choice", json::array()}}, 400), "guided_choice", "non-empty");
  refused(complete({{"guided_json", "{not json"}}, 400), "guided_json", "JSON schema");
  refused(complete({{"grammar", "root ::= \"a\""}, {"ignore_eos", true}}, 400), "ignore_eos",
          "grammar");
  refused(chat({{"messages", kAsk}, {"tool_choice", "required"}}, 400), "tool_choice",
          "no 'tools'");
  refused(chat({{"messages", kAsk},
                {"tools", kTools},
                {"tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}}},
               400),
          "tool_choice", "\"nope\"");
  refused(complete({{"structured_outputs", {{"regex", "a+"}}}}, 400), "structured_outputs.regex",
          "not supported");
  refused(complete({{"guided_regex", "a+"}}, 400), "guided_regex", "not supported");
  refused(complete({{"guided_grammar", "root ::= x"}}, 400), "guided_grammar", "rule 'x'");
}

}  // namespace
}  // namespace troupe::serve
