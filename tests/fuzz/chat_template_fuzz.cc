// libFuzzer target: chat templates (model/chat_template.h). The input is a template's source; it
// is compiled and, when it compiles, rendered with a fixed conversation under small limits. Any
// crash, hang, sanitizer report or unbounded output is a finding; errors are fine.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include <nlohmann/json.hpp>

#include "model/chat_template.h"

namespace {

const nlohmann::ordered_json& context() {
  static const nlohmann::ordered_json c = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Hi \u00e9 \"there\"\n"},
      {"role": "assistant", "content": "<think>x</think>Hello", "reasoning_content": "r"},
      {"role": "user", "content": "Numbers: 1, 2.5"}
    ],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
               "properties": {"a": {"type": "integer"}}}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>", "n": 3
  })");
  return c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  auto t = troupe::model::ChatTemplate::compile(source);
  if (!t) {
    if (t.error().message.empty()) std::abort();
    return 0;
  }
  troupe::model::ChatTemplateLimits limits;
  limits.max_steps = 200'000;
  limits.max_output_bytes = 1 << 20;
  auto r = t->render(context(), 1785067200, limits);
  if (r && r->size() > limits.max_output_bytes) {
    std::fprintf(stderr, "chat_template_fuzz: output past the limit\n");
    std::abort();
  }
  if (!r && r.error().code == 0 && r.error().message.empty()) std::abort();
  return 0;
}
