// A model's chat template: the Jinja program (from GGUF's tokenizer.chat_template or Hugging
// Face's tokenizer_config.json / chat_template.jinja) that turns a conversation into the prompt's
// text. Rendered as transformers renders it (python jinja2 with trim_blocks, lstrip_blocks, loop
// controls, an immutable sandbox, raise_exception, strftime_now and its tojson), so any model's
// template works on the day it is released. Used by serve/ (chat completions) and bin/. A
// compiled ChatTemplate is immutable: render it from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "base/result.h"

namespace troupe::model {

namespace detail {
struct Program;
}

/// Error codes of ChatTemplate::render.
enum class TemplateErrc {
  kError = 0,   // the template failed (a type error, an unknown filter, a limit): names the line
  kRaised = 1,  // the template called raise_exception: the message is the template's own
};

struct ChatTemplateLimits {
  size_t max_output_bytes = size_t{64} << 20;
  int64_t max_steps = 50'000'000;  // statements and expressions evaluated in one rendering
};

class ChatTemplate {
 public:
  /// Compiles a template's source; the error names the line and what is wrong there.
  static Result<ChatTemplate> compile(std::string_view source);

  /// Renders with `context`, a JSON object whose members become the template's variables:
  /// messages, add_generation_prompt, bos_token, eos_token, tools, ... (as transformers'
  /// apply_chat_template passes them). `now_unix`: the time strftime_now formats (UTC).
  /// Errors: TemplateErrc codes.
  Result<std::string> render(const nlohmann::ordered_json& context, int64_t now_unix,
                             const ChatTemplateLimits& limits = {}) const;

 private:
  std::shared_ptr<const detail::Program> program_;
};

}  // namespace troupe::model
