// Replies split into reasoning, content and tool calls (serve/reply_stream.h): the expected
// splits, and the same split however the reply arrives in pieces (a character at a time, in
// chunks of 2, 3 and 7 bytes, whole).
#include "serve/reply_stream.h"

#include <gtest/gtest.h>

namespace troupe::serve {
namespace {

struct Case {
  ReplyFormat format;
  std::string reply;
  std::string reasoning, content;
  std::vector<std::string> calls;  // names
};

const std::string kCall = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>";

std::vector<Case> cases() {
  auto fmt = [](ToolFormat t, bool reasoning, bool starts_in_reasoning) {
    ReplyFormat f;
    f.tools = t;
    f.reasoning = reasoning;
    f.starts_in_reasoning = starts_in_reasoning;
    return f;
  };
  const ReplyFormat think = fmt(ToolFormat::kNone, true, false);
  const ReplyFormat opened = fmt(ToolFormat::kNone, true, true);
  const ReplyFormat tools = fmt(ToolFormat::kHermes, false, false);
  const ReplyFormat both = fmt(ToolFormat::kHermes, true, false);
  ReplyFormat harmony;
  harmony.harmony = true;
  const std::string kCallMsg =
      "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
      "<|message|>{\"city\": \"Paris\"}<|call|>";
  return {
      {think,
       "<think>\nI should check.\n</think>\n\nHello there.",
       "I should check.\n",
       "Hello there.",
       {}},
      {think, "  <think>a</think>b", "a", "b", {}},
      {opened, "plan first</think>answer", "plan first", "answer", {}},
      {think, "<think>cut before the end", "cut before the end", "", {}},
      {opened, "still thinking <", "still thinking <", "", {}},
      {think, "No thinking here.", "", "No thinking here.", {}},
      {think, "<thin", "", "<thin", {}},
      {think, "   ", "", "   ", {}},
      {ReplyFormat{}, "<think>x</think>y", "", "<think>x</think>y", {}},
      {tools, "I will look.\n" + kCall, "", "I will look.", {"f"}},
      {tools, kCall + "\n" + kCall, "", "", {"f", "f"}},
      {tools, "a < b and <tool", "", "a < b and <tool", {}},
      {tools, "text\n\n", "", "text\n\n", {}},
      {tools, "<tool_call>{\"name\": cut", "", "<tool_call>{\"name\": cut", {}},
      {both, "<think>\nneed weather\n</think>\n\n" + kCall, "need weather\n", "", {"f"}},
      {both, "<think>x</think>Sure. " + kCall, "x", "Sure.", {"f"}},
      // gpt-oss's harmony messages.
      {harmony,
       "<|channel|>analysis<|message|>The user says hi.<|end|><|start|>assistant<|channel|>final"
       "<|message|>Hello! a < b <|return|>",
       "The user says hi.",
       "Hello! a < b ",
       {}},
      {harmony,
       "<|channel|>analysis<|message|>Need weather.<|end|>" + kCallMsg,
       "Need weather.",
       "",
       {"get_weather"}},
      {harmony,
       "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{}<|call|>",
       "",
       "",
       {"get_weather"}},
      {harmony, "<|channel|>analysis<|message|>cut short", "cut short", "", {}},
      {harmony, "<|channel|>final<|message|>Done.", "", "Done.", {}},
      {harmony, "Plain text, no channels.", "", "Plain text, no channels.", {}},
      {harmony,
       "<|channel|>commentary to=functions.f<|message|>not json<|call|>",
       "",
       "not json",
       {}},
      {harmony, "<|channel|>commentary<|message|>Checking now.<|end|>", "", "Checking now.", {}},
  };
}

TEST(ReplyStream, SplitsReasoningContentAndCalls) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.reply);
    const auto s = ReplyStream::split(c.format, c.reply);
    EXPECT_EQ(s.reasoning, c.reasoning);
    EXPECT_EQ(s.content, c.content);
    ASSERT_EQ(s.calls.size(), c.calls.size());
    for (size_t k = 0; k < c.calls.size(); ++k) EXPECT_EQ(s.calls[k].name, c.calls[k]);
  }
}

TEST(ReplyStream, PiecesGiveTheWholeSplit) {
  for (const Case& c : cases()) {
    for (size_t chunk : {size_t{1}, size_t{2}, size_t{3}, size_t{7}}) {
      SCOPED_TRACE(c.reply + " in pieces of " + std::to_string(chunk));
      ReplyStream s(c.format);
      std::string reasoning, content;
      for (size_t at = 0; at < c.reply.size(); at += chunk) {
        const auto d = s.push(std::string_view(c.reply).substr(at, chunk));
        reasoning += d.reasoning;
        content += d.content;
        // Nothing sent is ever taken back: what went out is a start of the final split.
        EXPECT_EQ(c.reasoning.rfind(reasoning, 0), 0u);
        EXPECT_EQ(c.content.rfind(content, 0), 0u);
      }
      const auto e = s.finish();
      EXPECT_EQ(reasoning + e.rest.reasoning, c.reasoning);
      EXPECT_EQ(content + e.rest.content, c.content);
      EXPECT_EQ(e.calls.size(), c.calls.size());
    }
  }
}

}  // namespace
}  // namespace troupe::serve
