// Chat prompts: which known family a model's Jinja chat template belongs to (by the control texts
// it writes), and the prompt text that family gives a list of messages, ending with the
// assistant's turn opened. troupe does not run Jinja: a template of no known family is refused
// by name. Used by serve/openai.cc; pure functions.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"

namespace troupe::serve {

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant" ("developer" is taken as "system")
  std::string content;
};

enum class ChatFormat {
  kNone,      // no template, or one of no known family
  kChatMl,    // <|im_start|>role\n...<|im_end|>\n (Qwen, Yi, many fine-tunes)
  kLlama3,    // <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>
  kLlama2,    // <s>[INST] <<SYS>>\n...\n<</SYS>>\n\n... [/INST] ... </s>
  kMistral,   // <s>[INST] ... [/INST]...</s> (no <<SYS>> block)
  kGemma,     // <start_of_turn>user\n...<end_of_turn>\n, the assistant as "model"
  kDeepseek,  // <｜User｜>...<｜Assistant｜>...<｜end▁of▁sentence｜> (V2.5, V3, R1, V4)
  kPhi3,      // <|user|>\n...<|end|>\n<|assistant|>\n
};

/// The family `jinja` writes, from the control texts it contains; kNone for "" or an unknown one.
ChatFormat detect_chat_format(std::string_view jinja);
/// "chatml", "llama3", ...; "none".
std::string_view chat_format_name(ChatFormat f);

/// The control texts the family's prompts hold, each of which must be one token of the model's
/// vocabulary (a template of the family on a vocabulary without them was misdetected).
std::vector<std::string_view> chat_format_tokens(ChatFormat f);

/// The prompt text for `messages`, ending with the assistant's turn opened (its control texts are
/// meant to be tokenized as special tokens). Errors name the message: an unknown role, a role the
/// family has no place for (Phi-3's template drops system messages; troupe refuses them rather
/// than lose them), turns out of the order the family requires, no messages.
Result<std::string> render_chat(ChatFormat f, const std::vector<ChatMessage>& messages);

}  // namespace troupe::serve
