// Tool calls in a model's reply: the format a model writes them in (by its chat template, or
// named by `--tool-call-parser`), the split of a whole reply into content and calls, and for
// streams how much of a reply so far can go out as content (what may begin a call is held
// back). Used by serve/openai*.cc and serve/generation.cc; pure functions.
#pragma once

#include <cstddef>
#include <map>
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
  kKimiK2,      // <|tool_calls_section_begin|><|tool_call_begin|>functions.name:0 ...
  kGlm45,       // <tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>
  kQwen3Coder,  // <tool_call><function=name><parameter=k>v</parameter></function></tool_call>
                // (Qwen3-Coder, Qwen3.5, StepFun)
  kSeedOss,     // the same inside <seed:tool_call>...</seed:tool_call> (Seed-OSS)
  kMinimaxM2,   // <minimax:tool_call><invoke name="n"><parameter name="k">v</parameter></invoke>
  kPythonic,    // [name(k=v, ...), ...] (Llama 4, Llama 3.2 with a pythonic template)
  // Not a model's format: the reply of a request with tool_choice "required", which its grammar
  // makes a JSON array of {"name": .., "parameters": {..}} (serve/openai.cc).
  kForcedCalls,
};

/// "hermes", "llama3_json", "mistral", "deepseek_v3", "kimi_k2", "glm45", "qwen3_coder",
/// "seed_oss", "minimax_m2", "pythonic"; "none";
/// "tool_choice_required" (kForcedCalls, which tool_format_by_name does not give).
std::string_view tool_format_name(ToolFormat f);
/// Every name `--tool-call-parser` takes, comma-separated ("hermes, llama3_json, ...").
std::string tool_format_names();
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

/// The JSON Schema types of the request's tools' parameters: function name -> parameter name ->
/// "string", "integer", "number", "boolean", "object", "array" (absent: not known). Formats that
/// write argument values as bare text (glm45, qwen3_coder, seed_oss, minimax_m2) read them by
/// these.
using ToolParamTypes = std::map<std::string, std::map<std::string, std::string>>;

/// Splits a whole reply. Calls that do not parse (cut by max_tokens, bad JSON) leave the whole
/// reply as content: nothing the model wrote is lost. `types`: see ToolParamTypes; without them
/// a bare value is JSON when it parses as a non-string JSON value, else a string.
ParsedReply parse_tool_calls(ToolFormat f, std::string_view reply,
                             const ToolParamTypes* types = nullptr);

/// How many bytes of `reply_so_far` may be streamed as content now: everything before the first
/// call's start, and before any tail that could still become one. `from`: what an earlier call
/// found streamable (no call starts before it), where the search for one begins, so a stream
/// does not rescan its whole reply at every token.
size_t streamable_prefix(ToolFormat f, std::string_view reply_so_far, size_t from = 0);

}  // namespace troupe::serve
