// A chat reply split as it arrives: the model's reasoning (between <think> and </think>, with
// `--reasoning-parser`), its content, and its tool calls (serve/tool_calls.h). Pushed piece by
// piece for streams, or whole at once: both give the same split. Used by serve/generation.cc and
// serve/openai_answers.cc; one per choice, one thread.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "serve/tool_calls.h"

namespace troupe::serve {

/// How a reply is split; the default splits nothing (all content).
struct ReplyFormat {
  ToolFormat tools = ToolFormat::kNone;  // parse tool calls from the content
  bool reasoning = false;                // <think>...</think> is reasoning_content
  bool starts_in_reasoning = false;      // the prompt opened <think>: the reply begins inside it
  /// tool_choice named this function: the whole reply is its arguments (a JSON object, as the
  /// request's grammar writes it), answered as one call.
  std::string forced_function;
  /// The request's tools' parameter types, for formats that write values as bare text.
  std::shared_ptr<const ToolParamTypes> param_types;
  /// gpt-oss's harmony messages: `<|channel|>analysis<|message|>...` is reasoning, the `final`
  /// channel content, `commentary to=functions.NAME ...<|message|>{..}<|call|>` a tool call.
  bool harmony = false;
  bool active() const {
    return tools != ToolFormat::kNone || reasoning || !forced_function.empty() || harmony;
  }
};

class ReplyStream {
 public:
  explicit ReplyStream(ReplyFormat f);

  struct Delta {
    std::string reasoning;  // reasoning_content to send now
    std::string content;    // content to send now
  };
  /// Appends the next piece of the reply (text with its markers); returns what may go out now.
  /// Held back: a tail that may be the start of </think> or of a tool call.
  Delta push(std::string_view piece);

  struct End {
    Delta rest;                   // what was held back and is now content or reasoning
    std::vector<ToolCall> calls;  // the content's tool calls (then rest.content is only the text
                                  // before them)
  };
  /// The reply is whole.
  End finish();

  /// The whole split of a reply at once (what push then finish give, gathered).
  struct Split {
    std::string reasoning, content;
    std::vector<ToolCall> calls;
  };
  static Split split(ReplyFormat f, std::string_view reply);

 private:
  ReplyFormat f_;
  bool in_reasoning_;
  std::string pending_;             // reasoning text not yet sent (a possible start of </think>)
  std::string content_;             // the content so far, with its markers
  size_t sent_ = 0;                 // bytes of content_ sent
  bool seen_start_ = false;         // past a leading <think> (or none can come)
  bool reasoning_started_ = false;  // the reasoning's leading whitespace is behind
  bool after_reasoning_ = false;    // </think> seen: the content's leading whitespace goes
  // harmony: the text not yet split, whether it is a message's body (else a header), the
  // message's channel and recipient, a call's arguments so far, and the calls.
  Delta harmony_push(std::string_view piece, bool at_end);
  void harmony_emit(std::string_view text, Delta& d);
  void harmony_end_message();
  std::string h_buf_;
  bool h_body_ = false;
  std::string h_channel_, h_to_, h_args_;
  std::vector<ToolCall> h_calls_;
  std::string h_dropped_;  // calls whose arguments are no JSON object: content, at the end
};

}  // namespace troupe::serve
