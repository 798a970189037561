// Chat prompt families (see chat_format.h). Each renderer follows its family's reference
// template: the texts around every turn, which roles it takes and in which order, and whether
// contents are stripped of surrounding whitespace.
#include "serve/chat_format.h"

namespace troupe::serve {

namespace {

std::string strip(std::string_view s) {
  const char* ws = " \t\r\n";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return "";
  const size_t e = s.find_last_not_of(ws);
  return std::string(s.substr(b, e - b + 1));
}

Error bad(size_t i, const std::string& why) {
  return Error{1, "messages[" + std::to_string(i) + "]: " + why};
}

// Llama 2, Mistral and Gemma: an optional leading system message, then user and assistant turns
// alternating from the user's, the last one the user's.
Status check_alternation(const std::vector<ChatMessage>& m, bool system_allowed,
                         std::string_view family) {
  size_t first = 0;
  if (!m.empty() && m[0].role == "system") {
    if (!system_allowed)
      return bad(0, "this model's chat template (" + std::string(family) +
                        ") has no place for a system message");
    first = 1;
  }
  if (first == m.size()) return bad(first, "a user message must follow the system message");
  for (size_t i = first; i < m.size(); ++i) {
    const char* want = (i - first) % 2 == 0 ? "user" : "assistant";
    if (m[i].role != want)
      return bad(i, "role '" + m[i].role + "' where '" + want + "' is due: this model's chat " +
                        "template (" + std::string(family) +
                        ") takes user and assistant turns in alternation, a system message " +
                        "only first");
  }
  if (m.back().role != "user")
    return bad(m.size() - 1, "the last message must be the user's (the assistant answers it)");
  return Ok{};
}

std::string render_chatml(const std::vector<ChatMessage>& m) {
  std::string out;
  for (const auto& x : m) out += "<|im_start|>" + x.role + "\n" + x.content + "<|im_end|>\n";
  return out + "<|im_start|>assistant\n";
}

std::string render_llama3(const std::vector<ChatMessage>& m) {
  std::string out = "<|begin_of_text|>";
  for (const auto& x : m)
    out +=
        "<|start_header_id|>" + x.role + "<|end_header_id|>\n\n" + strip(x.content) + "<|eot_id|>";
  return out + "<|start_header_id|>assistant<|end_header_id|>\n\n";
}

std::string render_llama2(const std::vector<ChatMessage>& m) {
  size_t first = 0;
  std::string system;
  if (m[0].role == "system") {
    system = m[0].content;
    first = 1;
  }
  std::string out;
  for (size_t i = first; i < m.size(); ++i) {
    std::string content = m[i].content;
    if (i == first && first == 1) content = "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + content;
    if (m[i].role == "user")
      out += "<s>[INST] " + strip(content) + " [/INST]";
    else
      out += " " + strip(content) + " </s>";
  }
  return out;
}

std::string render_mistral(const std::vector<ChatMessage>& m) {
  std::string out = "<s>";
  for (const auto& x : m)
    out += x.role == "user" ? "[INST] " + x.content + " [/INST]" : x.content + "</s>";
  return out;
}

std::string render_gemma(const std::vector<ChatMessage>& m) {
  size_t first = 0;
  std::string prefix;
  if (m[0].role == "system") {
    prefix = m[0].content + "\n\n";
    first = 1;
  }
  std::string out = "<bos>";
  for (size_t i = first; i < m.size(); ++i) {
    const std::string role = m[i].role == "assistant" ? "model" : m[i].role;
    out += "<start_of_turn>" + role + "\n" + (i == first ? prefix : std::string()) +
           strip(m[i].content) + "<end_of_turn>\n";
  }
  return out + "<start_of_turn>model\n";
}

std::string render_deepseek(const std::vector<ChatMessage>& m) {
  // Every system message, joined, comes first; then the turns.
  std::string system;
  bool first_system = true;
  for (const auto& x : m)
    if (x.role == "system") {
      system += (first_system ? "" : "\n\n") + x.content;
      first_system = false;
    }
  std::string out = "<｜begin▁of▁sentence｜>" + system;
  for (const auto& x : m) {
    if (x.role == "user")
      out += "<｜User｜>" + x.content;
    else if (x.role == "assistant")
      out += "<｜Assistant｜>" + x.content + "<｜end▁of▁sentence｜>";
  }
  return out + "<｜Assistant｜>";
}

std::string render_phi3(const std::vector<ChatMessage>& m) {
  std::string out = "<s>";
  for (const auto& x : m)
    out += x.role == "user" ? "<|user|>\n" + x.content + "<|end|>\n<|assistant|>\n"
                            : x.content + "<|end|>\n";
  return out;
}

}  // namespace

ChatFormat detect_chat_format(std::string_view t) {
  auto has = [&](std::string_view s) { return t.find(s) != std::string_view::npos; };
  if (t.empty()) return ChatFormat::kNone;
  if (has("<|im_start|>")) return ChatFormat::kChatMl;
  if (has("<|start_header_id|>")) return ChatFormat::kLlama3;
  if (has("<start_of_turn>")) return ChatFormat::kGemma;
  if (has("<｜User｜>") || has("<｜Assistant｜>")) return ChatFormat::kDeepseek;
  if (has("<|assistant|>") && has("<|end|>")) return ChatFormat::kPhi3;
  if (has("[INST]")) return has("<<SYS>>") ? ChatFormat::kLlama2 : ChatFormat::kMistral;
  return ChatFormat::kNone;
}

std::string_view chat_format_name(ChatFormat f) {
  switch (f) {
    case ChatFormat::kChatMl:
      return "chatml";
    case ChatFormat::kLlama3:
      return "llama3";
    case ChatFormat::kLlama2:
      return "llama2";
    case ChatFormat::kMistral:
      return "mistral";
    case ChatFormat::kGemma:
      return "gemma";
    case ChatFormat::kDeepseek:
      return "deepseek";
    case ChatFormat::kPhi3:
      return "phi3";
    case ChatFormat::kNone:
      break;
  }
  return "none";
}

std::vector<std::string_view> chat_format_tokens(ChatFormat f) {
  switch (f) {
    case ChatFormat::kChatMl:
      return {"<|im_start|>", "<|im_end|>"};
    case ChatFormat::kLlama3:
      return {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"};
    case ChatFormat::kLlama2:
    case ChatFormat::kMistral:
      return {"<s>", "</s>"};
    case ChatFormat::kGemma:
      return {"<bos>", "<start_of_turn>", "<end_of_turn>"};
    case ChatFormat::kDeepseek:
      return {"<｜begin▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>"};
    case ChatFormat::kPhi3:
      return {"<s>", "<|user|>", "<|assistant|>", "<|end|>"};
    case ChatFormat::kNone:
      break;
  }
  return {};
}

Result<std::string> render_chat(ChatFormat f, const std::vector<ChatMessage>& messages) {
  if (messages.empty()) return Error{1, "messages is empty: give at least one message"};
  std::vector<ChatMessage> m = messages;
  for (size_t i = 0; i < m.size(); ++i) {
    if (m[i].role == "developer") m[i].role = "system";
    if (m[i].role != "system" && m[i].role != "user" && m[i].role != "assistant")
      return bad(i, "role '" + messages[i].role +
                        "' is not one troupe's chat prompts take (system, developer, user, "
                        "assistant)");
  }
  const std::string family(chat_format_name(f));
  switch (f) {
    case ChatFormat::kChatMl:
      return render_chatml(m);
    case ChatFormat::kLlama3:
      return render_llama3(m);
    case ChatFormat::kDeepseek:
      return render_deepseek(m);
    case ChatFormat::kLlama2:
      if (auto s = check_alternation(m, true, family); !s) return s.error();
      return render_llama2(m);
    case ChatFormat::kMistral:
      if (auto s = check_alternation(m, false, family); !s) return s.error();
      return render_mistral(m);
    case ChatFormat::kGemma:
      if (auto s = check_alternation(m, true, family); !s) return s.error();
      return render_gemma(m);
    case ChatFormat::kPhi3:
      for (size_t i = 0; i < m.size(); ++i)
        if (m[i].role == "system")
          return bad(i, "this model's chat template (phi3) has no place for a system message");
      if (m.back().role != "user")
        return bad(m.size() - 1, "the last message must be the user's (the assistant answers it)");
      return render_phi3(m);
    case ChatFormat::kNone:
      break;
  }
  return Error{1, "the model has no chat template of a family troupe knows"};
}

}  // namespace troupe::serve
