// Tool calls in a model's reply: the format a model writes them in (by its chat template, or
// named by `--tool-call-parser`), the split of a whole reply into content and calls, and for
// streams how much of a reply so far can go out as content (what may begin a call is held
// back). Used by serve/openai*.cc and serve/generation.cc; pure functions.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::serve {

enum class ToolFormat {
  kNone,
  kHermes,      // <tool_call>{"name": .., "arguments": {..}}</tool_call> (Qwen 2.5/3, Hermes)
  kLlama3Json,  // the reply is {"name": .., "parameters": {..}} (Llama 3.1-3.3), or after
                // <|python_tag|>
  kMistral,     // [TOOL_CALLS][{"name": .., "arguments": {..}}] or [TOOL_CALLS]name[ARGS]{..}
  kDeepseekV3,  // <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>name ```json
                // ..```
  kKimiK2,  // <|tool_calls_section_begin|><|tool_call_begin|>functions.name:0 ...
  kGlm45,   // <tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>
  // Not a model's format: the reply of a request with tool_choice "required", which its grammar
  // makes a JSON array of {"name": .., "parameters": {..}} (serve/openai.cc).
  kForcedCalls,
};

/// "hermes", "llama3_json", "mistral", "deepseek_v3", "kimi_k2", "glm45"; "none";
/// "tool_choice_required" (kForcedCalls, which tool_format_by_name does not give).
std::string_view tool_format_name(ToolFormat f);
/// The format of a name tool_format_name gives; false for an unknown name.
bool tool_format_by_name(std::string_view name, ToolFormat* out);
/// The format the chat template writes tool calls in (by the markers it holds); kNone when it
/// shows none it knows.
ToolFormat detect_tool_format(std::string_view chat_template);

struct ToolCall {
  std::string id;  // the model's own (Kimi K2) or made here: "call_" + 24 characters
  std::string name;
  std::string arguments;  // a JSON object's text, as the API gives it
};

/// A new call id: "call_" + 24 letters and digits.
std::string new_tool_call_id();

struct ParsedReply {
  std::string content;  // the text outside the calls
  std::vector<ToolCall> calls;
};

/// Splits a whole reply. Calls that do not parse (cut by max_tokens, bad JSON) leave the whole
/// reply as content: nothing the model wrote is lost.
ParsedReply parse_tool_calls(ToolFormat f, std::string_view reply);

/// How many bytes of `reply_so_far` may be streamed as content now: everything before the first
/// call's start, and before any tail that could still become one. `from`: what an earlier call
/// found streamable (no call starts before it), where the search for one begins, so a stream
/// does not rescan its whole reply at every token.
size_t streamable_prefix(ToolFormat f, std::string_view reply_so_far, size_t from = 0);

}  // namespace troupe::serve
