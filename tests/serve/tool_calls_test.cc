// Tool-call formats (serve/tool_calls.h): detection from templates, each format's replies split
// into content and calls, replies that only look like calls kept whole, and the streamed prefix
// never passing a call's start.
#include "serve/tool_calls.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace troupe::serve {
namespace {

using nlohmann::json;

// The DeepSeek markers' fullwidth bar and lower block.
const std::string kBar = "\xEF\xBD\x9C", kBlk = "\xE2\x96\x81";
std::string ds(const std::string& words) {  // "tool calls begin" -> <｜tool▁calls▁begin｜>
  std::string s = "<" + kBar;
  for (char c : words) s += c == ' ' ? kBlk : std::string(1, c);
  return s + kBar + ">";
}

void expect_call(const ToolCall& c, const std::string& name, const json& args) {
  EXPECT_EQ(c.name, name);
  EXPECT_EQ(json::parse(c.arguments), args) << c.arguments;
  EXPECT_FALSE(c.id.empty());
}

TEST(ToolCalls, DetectsTheFormatByTheTemplatesMarkers) {
  EXPECT_EQ(detect_tool_format("{{ '<tool_call>\\n' }}{{ tool_call | tojson }}"),
            ToolFormat::kHermes);
  EXPECT_EQ(detect_tool_format("<tool_call>{{ name }}<arg_key>"), ToolFormat::kGlm45);
  EXPECT_EQ(detect_tool_format("{{ '[TOOL_CALLS]' }}"), ToolFormat::kMistral);
  EXPECT_EQ(detect_tool_format("<|tool_calls_section_begin|>"), ToolFormat::kKimiK2);
  EXPECT_EQ(detect_tool_format("{{'" + ds("tool calls begin") + "'}}"), ToolFormat::kDeepseekV3);
  EXPECT_EQ(detect_tool_format("<|start_header_id|>{{ '\"parameters\": ' }}"),
            ToolFormat::kLlama3Json);
  EXPECT_EQ(detect_tool_format("<tool_call>\n<function={{ name }}>\n<parameter={{ k }}>"),
            ToolFormat::kQwen3Coder);
  EXPECT_EQ(detect_tool_format("{{ '<minimax:tool_call>' }}<invoke name="), ToolFormat::kMinimaxM2);
  EXPECT_EQ(detect_tool_format("'<seed:tool_call>'\n<function=x>\n<parameter=y>"),
            ToolFormat::kSeedOss);
  EXPECT_EQ(detect_tool_format("<|start_header_id|>format of [func_name1(params_name1=params_value1"
                               "...)] \"parameters\""),
            ToolFormat::kPythonic);
  EXPECT_EQ(detect_tool_format("<|im_start|>{{ m.content }}"), ToolFormat::kNone);
  ToolFormat f;
  ASSERT_TRUE(tool_format_by_name("deepseek_v3", &f));
  EXPECT_EQ(f, ToolFormat::kDeepseekV3);
  EXPECT_EQ(tool_format_name(ToolFormat::kKimiK2), "kimi_k2");
  EXPECT_FALSE(tool_format_by_name("qwen", &f));
}

TEST(ToolCalls, SplitsEachFormatsReplies) {
  auto r =
      parse_tool_calls(ToolFormat::kHermes,
                       "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                       "{\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"time\", "
                       "\"arguments\": {}}\n</tool_call>");
  EXPECT_EQ(r.content, "Let me look.");
  ASSERT_EQ(r.calls.size(), 2u);
  expect_call(r.calls[0], "get_weather", {{"city", "Paris"}});
  expect_call(r.calls[1], "time", json::object());
  EXPECT_NE(r.calls[0].id, r.calls[1].id);

  r = parse_tool_calls(
      ToolFormat::kLlama3Json,
      "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\", \"days\": 3}}");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 1u);
  expect_call(r.calls[0], "get_weather", {{"city", "Oslo"}, {"days", 3}});
  r = parse_tool_calls(ToolFormat::kLlama3Json,
                       "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", "
                       "\"parameters\": {\"x\": 1}}");
  ASSERT_EQ(r.calls.size(), 2u);
  expect_call(r.calls[1], "b", {{"x", 1}});

  r = parse_tool_calls(ToolFormat::kMistral,
                       "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"q\": \"x\"}}, {\"name\": "
                       "\"g\", \"arguments\": {}}]");
  ASSERT_EQ(r.calls.size(), 2u);
  expect_call(r.calls[0], "f", {{"q", "x"}});
  r = parse_tool_calls(ToolFormat::kMistral,
                       "Sure.[TOOL_CALLS]f[ARGS]{\"q\": \"x\"}[TOOL_CALLS]g[ARGS]{}");
  EXPECT_EQ(r.content, "Sure.");
  ASSERT_EQ(r.calls.size(), 2u);
  expect_call(r.calls[1], "g", json::object());

  // DeepSeek V3 / R1 (a ```json block) and V3.1 (the arguments after the separator).
  r = parse_tool_calls(ToolFormat::kDeepseekV3,
                       "Checking." + ds("tool calls begin") + ds("tool call begin") + "function" +
                           ds("tool sep") + "get_weather\n```json\n{\"city\": \"Rome\"}\n```" +
                           ds("tool call end") + ds("tool calls end"));
  EXPECT_EQ(r.content, "Checking.");
  ASSERT_EQ(r.calls.size(), 1u);
  expect_call(r.calls[0], "get_weather", {{"city", "Rome"}});
  r = parse_tool_calls(ToolFormat::kDeepseekV3,
                       ds("tool calls begin") + ds("tool call begin") + "a" + ds("tool sep") +
                           "{\"k\": [1, 2]}" + ds("tool call end") + ds("tool call begin") + "b" +
                           ds("tool sep") + "{}" + ds("tool call end") + ds("tool calls end"));
  ASSERT_EQ(r.calls.size(), 2u);
  expect_call(r.calls[0], "a", {{"k", {1, 2}}});
  expect_call(r.calls[1], "b", json::object());

  r = parse_tool_calls(ToolFormat::kKimiK2,
                       "<|tool_calls_section_begin|><|tool_call_begin|>functions.search:0"
                       "<|tool_call_argument_begin|>{\"q\": \"troupe\"}<|tool_call_end|>"
                       "<|tool_calls_section_end|>");
  ASSERT_EQ(r.calls.size(), 1u);
  expect_call(r.calls[0], "search", {{"q", "troupe"}});
  EXPECT_EQ(r.calls[0].id, "functions.search:0") << "Kimi's own id";

  r = parse_tool_calls(
      ToolFormat::kGlm45,
      "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n"
      "<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>");
  ASSERT_EQ(r.calls.size(), 1u);
  expect_call(r.calls[0], "get_weather", {{"city", "Beijing"}, {"days", 2}});
}

// Formats whose argument values are bare text: typed by the tools' schemas when the request has
// them, else JSON where the text parses as a non-string value.
TEST(ToolCalls, SplitsTheXmlAndPythonicFormats) {
  const ToolParamTypes types = {{"get_weather", {{"city", "string"}, {"days", "integer"}}},
                                {"flags", {{"on", "boolean"}, {"tags", "array"}}}};
  const std::string qwen =
      "I'll check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\n123 Main\n"
      "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n"
      "<tool_call>\n<function=flags>\n<parameter=on>\nTrue\n</parameter>\n<parameter=tags>\n"
      "[\"a\", \"b\"]\n</parameter>\n</function>\n</tool_call>";
  auto r = parse_tool_calls(ToolFormat::kQwen3Coder, qwen, &types);
  EXPECT_EQ(r.content, "I'll check.");
  ASSERT_EQ(r.calls.size(), 2u);
  expect_call(r.calls[0], "get_weather", {{"city", "123 Main"}, {"days", 3}});
  expect_call(r.calls[1], "flags", {{"on", true}, {"tags", {"a", "b"}}});
  // Without the types: "3" is a number, "123 Main" stays text; a string-typed "42" stays "42".
  r = parse_tool_calls(ToolFormat::kQwen3Coder, qwen);
  expect_call(r.calls[0], "get_weather", {{"city", "123 Main"}, {"days", 3}});
  r = parse_tool_calls(ToolFormat::kQwen3Coder,
                       "<tool_call>\n<function=get_weather>\n<parameter=city>\n42\n</parameter>"
                       "\n</function>\n</tool_call>",
                       &types);
  expect_call(r.calls[0], "get_weather", {{"city", "42"}});

  r = parse_tool_calls(
      ToolFormat::kMinimaxM2,
      "Sure.\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter "
      "name=\"city\">Paris</parameter>\n<parameter name=\"days\">2</parameter>\n"
      "</invoke>\n<invoke name=\"flags\">\n<parameter name=\"on\">false</parameter>"
      "\n</invoke>\n</minimax:tool_call>",
      &types);
  EXPECT_EQ(r.content, "Sure.");
  ASSERT_EQ(r.calls.size(), 2u);
  expect_call(r.calls[0], "get_weather", {{"city", "Paris"}, {"days", 2}});
  expect_call(r.calls[1], "flags", {{"on", false}});

  r = parse_tool_calls(
      ToolFormat::kPythonic,
      "[get_weather(city='San Francisco', days=3), flags(on=True, tags=['a', \"b\"], "
      "opts={'x': None, 'y': -1.5}), noargs()]");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 3u);
  expect_call(r.calls[0], "get_weather", {{"city", "San Francisco"}, {"days", 3}});
  expect_call(r.calls[1], "flags",
              {{"on", true}, {"tags", {"a", "b"}}, {"opts", {{"x", nullptr}, {"y", -1.5}}}});
  expect_call(r.calls[2], "noargs", json::object());
  r = parse_tool_calls(ToolFormat::kPythonic,
                       "<|python_start|>[get_weather(city=\"Oslo\")]<|python_end|>");
  ASSERT_EQ(r.calls.size(), 1u);
  expect_call(r.calls[0], "get_weather", {{"city", "Oslo"}});
}

TEST(ToolCalls, WhatOnlyLooksLikeACallStaysContent) {
  for (const auto& [f, reply] : std::vector<std::pair<ToolFormat, std::string>>{
           {ToolFormat::kHermes, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": "},  // cut
           {ToolFormat::kHermes, "<tool_call>{\"arguments\": {}}</tool_call>"},  // no name
           {ToolFormat::kHermes, "<tool_call>{\"name\": \"f\"}</tool_call> and more text"},
           {ToolFormat::kLlama3Json, "{\"answer\": 42}"},
           {ToolFormat::kLlama3Json, "Plain text."},
           {ToolFormat::kMistral, "[TOOL_CALLS]not json"},
           {ToolFormat::kKimiK2, "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0"},
           {ToolFormat::kGlm45, "<tool_call>f<arg_key>a</arg_key>"},
           {ToolFormat::kQwen3Coder, "<tool_call>\n<function=f>\n<parameter=a>\n1"},  // cut
           {ToolFormat::kQwen3Coder, "<tool_call>\n{\"name\": \"f\"}\n</tool_call>"},
           {ToolFormat::kMinimaxM2, "<minimax:tool_call>\n<invoke name=\"f\">\n"},
           {ToolFormat::kPythonic, "[1, 2, 3]"},
           {ToolFormat::kPythonic, "[f(a=1), g(b=)]"},
           {ToolFormat::kPythonic, "[f(a='open)]"},
           {ToolFormat::kPythonic, "Call f(a=1) later."},
           {ToolFormat::kNone, "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>"}}) {
    const ParsedReply r = parse_tool_calls(f, reply);
    EXPECT_TRUE(r.calls.empty()) << reply;
    EXPECT_EQ(r.content, reply) << "nothing the model wrote is lost";
  }
}

TEST(ToolCalls, TheStreamedPrefixStopsWhereACallMayBegin) {
  const std::string reply =
      "Let me look.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
  const size_t start = reply.find("<tool_call>");
  size_t last = 0;
  for (size_t n = 0; n <= reply.size(); ++n) {
    const size_t p = streamable_prefix(ToolFormat::kHermes, std::string_view(reply).substr(0, n));
    EXPECT_LE(p, std::min(n, start)) << n;
    EXPECT_GE(p, last) << "the streamed prefix never shrinks";
    EXPECT_EQ(streamable_prefix(ToolFormat::kHermes, std::string_view(reply).substr(0, n), last), p)
        << "searching from the last prefix finds what a whole search finds";
    last = p;
    // Only a tail that could still grow into the marker is held back.
    if (n <= start && p < n) {
      EXPECT_EQ(std::string("<tool_call>").rfind(reply.substr(p, n - p), 0), 0u) << n;
    }
  }
  EXPECT_EQ(streamable_prefix(ToolFormat::kHermes, "a < b"), 5u) << "'<' then a space is not a tag";
  EXPECT_EQ(streamable_prefix(ToolFormat::kLlama3Json, "  {\"name\""), 2u);
  EXPECT_EQ(streamable_prefix(ToolFormat::kLlama3Json, "<|pyth"), 0u);
  EXPECT_EQ(streamable_prefix(ToolFormat::kLlama3Json, "Hello"), 5u);
  EXPECT_EQ(streamable_prefix(ToolFormat::kNone, "<tool_call>"), 11u);
  EXPECT_EQ(streamable_prefix(ToolFormat::kPythonic, " [get_wea"), 0u);
  EXPECT_EQ(streamable_prefix(ToolFormat::kPythonic, "[get_weather(ci"), 0u);
  EXPECT_EQ(streamable_prefix(ToolFormat::kPythonic, "[1, 2]"), 6u);
  EXPECT_EQ(streamable_prefix(ToolFormat::kPythonic, "Sunny"), 5u);
  EXPECT_EQ(streamable_prefix(ToolFormat::kMinimaxM2, "ok <minimax:to"), 3u);
}

}  // namespace
}  // namespace troupe::serve
