// Tool-call formats (serve/tool_calls.h): detection by a chat template's markers, and parsers
// for each format's replies.
#include "serve/tool_calls.h"

#include <algorithm>
#include <cstring>
#include <random>

#include <nlohmann/json.hpp>

namespace troupe::serve {
namespace {

using json = nlohmann::ordered_json;

// The DeepSeek markers hold U+FF5C (fullwidth bar) and U+2581 (lower one-eighth block).
constexpr const char* kDsCallsBegin =
    "<\xEF\xBD\x9Ctool\xE2\x96\x81"
    "calls\xE2\x96\x81"
    "begin\xEF\xBD\x9C>";
constexpr const char* kDsCallBegin =
    "<\xEF\xBD\x9Ctool\xE2\x96\x81"
    "call\xE2\x96\x81"
    "begin\xEF\xBD\x9C>";
constexpr const char* kDsCallEnd =
    "<\xEF\xBD\x9Ctool\xE2\x96\x81"
    "call\xE2\x96\x81"
    "end\xEF\xBD\x9C>";
constexpr const char* kDsSep = "<\xEF\xBD\x9Ctool\xE2\x96\x81sep\xEF\xBD\x9C>";

std::string new_call_id() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char kChars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kChars[rng() % (sizeof kChars - 1)];
  return id;
}

std::string_view trim(std::string_view s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

// {"name": .., <args_key>: {..} or "..."} -> a call; false when it is not one.
bool call_from_object(const json& o, ToolCall* out) {
  if (!o.is_object() || !o.contains("name") || !o["name"].is_string()) return false;
  const json* args = nullptr;
  for (const char* k : {"arguments", "parameters"})
    if (o.contains(k)) {
      args = &o[k];
      break;
    }
  out->name = o["name"].get<std::string>();
  if (!args || args->is_null()) {
    out->arguments = "{}";
  } else if (args->is_string()) {
    out->arguments = args->get<std::string>();
  } else {
    out->arguments = args->dump();
  }
  out->id = new_call_id();
  return true;
}

bool parse_json(std::string_view text, json* out) {
  *out = json::parse(text.begin(), text.end(), nullptr, false);
  return !out->is_discarded();
}

// <tool_call>{json}</tool_call> ... (the last closing tag may be missing at the reply's end).
bool parse_hermes(std::string_view r, size_t at, std::vector<ToolCall>* calls) {
  while (at != std::string_view::npos) {
    const size_t body = at + std::strlen("<tool_call>");
    size_t end = r.find("</tool_call>", body);
    const std::string_view inner =
        r.substr(body, end == std::string_view::npos ? r.npos : end - body);
    json o;
    ToolCall c;
    if (!parse_json(trim(inner), &o) || !call_from_object(o, &c)) return false;
    calls->push_back(std::move(c));
    if (end == std::string_view::npos) break;
    const size_t next = r.find("<tool_call>", end);
    if (next == std::string_view::npos && !trim(r.substr(end + 12)).empty()) return false;
    at = next;
  }
  return true;
}

// {..} or [{..}, ..] or {..}; {..} (after an optional <|python_tag|>).
bool parse_llama3(std::string_view r, size_t at, std::vector<ToolCall>* calls) {
  std::string_view s = trim(r.substr(at));
  if (s.substr(0, 14) == "<|python_tag|>") s = trim(s.substr(14));
  json o;
  if (parse_json(s, &o)) {
    const json list = o.is_array() ? o : json::array({o});
    for (const json& x : list) {
      ToolCall c;
      if (!call_from_object(x, &c)) return false;
      calls->push_back(std::move(c));
    }
    return !calls->empty();
  }
  size_t pos = 0;
  while (pos < s.size()) {
    size_t semi = s.find("; ", pos);
    const std::string_view part = trim(s.substr(pos, semi == s.npos ? s.npos : semi - pos));
    ToolCall c;
    if (!parse_json(part, &o) || !call_from_object(o, &c)) return false;
    calls->push_back(std::move(c));
    if (semi == s.npos) break;
    pos = semi + 2;
  }
  return !calls->empty();
}

// [TOOL_CALLS][{..}] or [TOOL_CALLS]name[ARGS]{..}[TOOL_CALLS]name2[ARGS]{..}
bool parse_mistral(std::string_view r, size_t at, std::vector<ToolCall>* calls) {
  std::string_view rest = r.substr(at + 12);
  json o;
  if (parse_json(trim(rest), &o)) {
    const json list = o.is_array() ? o : json::array({o});
    for (const json& x : list) {
      ToolCall c;
      if (!call_from_object(x, &c)) return false;
      calls->push_back(std::move(c));
    }
    return !calls->empty();
  }
  while (!rest.empty()) {
    const size_t args = rest.find("[ARGS]");
    if (args == rest.npos) return false;
    const size_t next = rest.find("[TOOL_CALLS]", args);
    const std::string_view a =
        trim(rest.substr(args + 6, next == rest.npos ? rest.npos : next - args - 6));
    if (!parse_json(a, &o) || !o.is_object()) return false;
    ToolCall c;
    c.name = std::string(trim(rest.substr(0, args)));
    if (c.name.empty()) return false;
    c.arguments = o.dump(-1, ' ', false, json::error_handler_t::replace);
    c.id = new_call_id();
    calls->push_back(std::move(c));
    if (next == rest.npos) break;
    rest = rest.substr(next + 12);
  }
  return !calls->empty();
}

// <｜tool▁call▁begin｜>function<｜tool▁sep｜>name\n```json\n{..}\n```<｜tool▁call▁end｜> (V3, R1)
// or <｜tool▁call▁begin｜>name<｜tool▁sep｜>{..}<｜tool▁call▁end｜> (V3.1, V3.2).
bool parse_deepseek(std::string_view r, size_t at, std::vector<ToolCall>* calls) {
  for (size_t b = r.find(kDsCallBegin, at); b != r.npos; b = r.find(kDsCallBegin, b + 1)) {
    const size_t body = b + std::strlen(kDsCallBegin);
    const size_t end = r.find(kDsCallEnd, body);
    const std::string_view call = r.substr(body, end == r.npos ? r.npos : end - body);
    const size_t sep = call.find(kDsSep);
    if (sep == call.npos) return false;
    std::string_view head = trim(call.substr(0, sep)),
                     tail = call.substr(sep + std::strlen(kDsSep));
    ToolCall c;
    if (head == "function") {  // name, then the arguments in a ```json block
      const size_t nl = tail.find('\n');
      if (nl == tail.npos) return false;
      c.name = std::string(trim(tail.substr(0, nl)));
      tail = trim(tail.substr(nl + 1));
      if (tail.substr(0, 7) == "```json") tail = tail.substr(7);
      const size_t fence = tail.rfind("```");
      if (fence != tail.npos) tail = tail.substr(0, fence);
    } else {
      c.name = std::string(head);
    }
    json o;
    if (c.name.empty() || !parse_json(trim(tail), &o) || !o.is_object()) return false;
    c.arguments = o.dump(-1, ' ', false, json::error_handler_t::replace);
    c.id = new_call_id();
    calls->push_back(std::move(c));
    if (end == r.npos) break;
  }
  return !calls->empty();
}

// <|tool_call_begin|>functions.name:0<|tool_call_argument_begin|>{..}<|tool_call_end|>
bool parse_kimi(std::string_view r, size_t at, std::vector<ToolCall>* calls) {
  static constexpr std::string_view kBegin = "<|tool_call_begin|>";
  static constexpr std::string_view kArgs = "<|tool_call_argument_begin|>";
  static constexpr std::string_view kEnd = "<|tool_call_end|>";
  for (size_t b = r.find(kBegin, at); b != r.npos; b = r.find(kBegin, b + 1)) {
    const size_t body = b + kBegin.size();
    const size_t args = r.find(kArgs, body);
    if (args == r.npos) return false;
    const size_t end = r.find(kEnd, args);
    ToolCall c;
    c.id = std::string(trim(r.substr(body, args - body)));  // functions.name:index
    const size_t dot = c.id.find('.'), colon = c.id.rfind(':');
    c.name = c.id.substr(
        dot == std::string::npos ? 0 : dot + 1,
        colon == std::string::npos || colon < dot ? std::string::npos : colon - (dot + 1));
    json o;
    const size_t a = args + kArgs.size();
    if (c.name.empty() || !parse_json(trim(r.substr(a, end == r.npos ? r.npos : end - a)), &o) ||
        !o.is_object())
      return false;
    c.arguments = o.dump(-1, ' ', false, json::error_handler_t::replace);
    calls->push_back(std::move(c));
    if (end == r.npos) break;
  }
  return !calls->empty();
}

// <tool_call>name\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>...</tool_call>; a value that
// is JSON (a number, an object, ...) is taken as such, any other as a string.
bool parse_glm(std::string_view r, size_t at, std::vector<ToolCall>* calls) {
  while (at != r.npos) {
    const size_t body = at + 11;
    const size_t end = r.find("</tool_call>", body);
    const std::string_view call = r.substr(body, end == r.npos ? r.npos : end - body);
    const size_t first_key = call.find("<arg_key>");
    ToolCall c;
    c.name = std::string(trim(call.substr(0, first_key)));
    if (c.name.empty()) return false;
    json args = json::object();
    for (size_t k = first_key; k != call.npos; k = call.find("<arg_key>", k + 1)) {
      const size_t ke = call.find("</arg_key>", k);
      const size_t vb = call.find("<arg_value>", ke);
      const size_t ve = call.find("</arg_value>", vb);
      if (ke == call.npos || vb == call.npos || ve == call.npos) return false;
      const std::string key(trim(call.substr(k + 9, ke - k - 9)));
      const std::string_view v = call.substr(vb + 11, ve - vb - 11);
      json parsed;
      args[key] = parse_json(v, &parsed) && !parsed.is_string() ? parsed : json(std::string(v));
    }
    c.arguments = args.dump(-1, ' ', false, json::error_handler_t::replace);
    c.id = new_call_id();
    calls->push_back(std::move(c));
    if (end == r.npos) break;
    at = r.find("<tool_call>", end);
  }
  return !calls->empty();
}

// [{"name": .., "parameters": {..}}, ..]: the whole reply (tool_choice "required").
bool parse_forced(std::string_view r, size_t at, std::vector<ToolCall>* calls) {
  json o;
  if (!parse_json(trim(r.substr(at)), &o) || !o.is_array()) return false;
  for (const json& x : o) {
    ToolCall c;
    if (!call_from_object(x, &c)) return false;
    calls->push_back(std::move(c));
  }
  return !calls->empty();
}

// Each format: its name, the text its calls begin with, and its parser (the reply, where the
// calls begin, the calls found; false when they do not parse).
struct Markers {
  ToolFormat format;
  const char* name;
  const char* start;
  bool (*parse)(std::string_view reply, size_t at, std::vector<ToolCall>* calls);
};

constexpr Markers kFormats[] = {
    {ToolFormat::kHermes, "hermes", "<tool_call>", parse_hermes},
    {ToolFormat::kLlama3Json, "llama3_json", "<|python_tag|>", parse_llama3},
    {ToolFormat::kMistral, "mistral", "[TOOL_CALLS]", parse_mistral},
    {ToolFormat::kDeepseekV3, "deepseek_v3", kDsCallsBegin, parse_deepseek},
    {ToolFormat::kKimiK2, "kimi_k2", "<|tool_calls_section_begin|>", parse_kimi},
    {ToolFormat::kGlm45, "glm45", "<tool_call>", parse_glm},
    {ToolFormat::kForcedCalls, "tool_choice_required", "[", parse_forced},
};

const Markers* markers(ToolFormat f) {
  for (const Markers& m : kFormats)
    if (m.format == f) return &m;
  return nullptr;
}

// Where the calls start in a reply (npos: none); none starts before `from`.
size_t calls_start(ToolFormat f, std::string_view r, size_t from = 0) {
  if (f == ToolFormat::kForcedCalls) return r.empty() ? std::string_view::npos : 0;
  if (f == ToolFormat::kLlama3Json) {
    const std::string_view t = trim(r);
    if (t.empty() || (t[0] != '{' && t[0] != '[' && t.substr(0, 14) != "<|python_tag|>"))
      return std::string_view::npos;
    return r.find_first_not_of(" \t\r\n");
  }
  const Markers* m = markers(f);
  return m ? r.find(m->start, std::min(from, r.size())) : std::string_view::npos;
}

}  // namespace

std::string new_tool_call_id() { return new_call_id(); }

std::string_view tool_format_name(ToolFormat f) {
  const Markers* m = markers(f);
  return m ? m->name : "none";
}

bool tool_format_by_name(std::string_view name, ToolFormat* out) {
  for (const Markers& m : kFormats)
    if (name == m.name && m.format != ToolFormat::kForcedCalls) {
      *out = m.format;
      return true;
    }
  if (name == "none") {
    *out = ToolFormat::kNone;
    return true;
  }
  return false;
}

ToolFormat detect_tool_format(std::string_view t) {
  auto has = [&](std::string_view s) { return t.find(s) != std::string_view::npos; };
  if (has("<arg_key>")) return ToolFormat::kGlm45;
  if (has("<|tool_calls_section_begin|>")) return ToolFormat::kKimiK2;
  if (has(kDsCallsBegin)) return ToolFormat::kDeepseekV3;
  if (has("[TOOL_CALLS]")) return ToolFormat::kMistral;
  if (has("<tool_call>")) return ToolFormat::kHermes;
  if (has("<|python_tag|>") || (has("<|start_header_id|>") && has("\"parameters\"")))
    return ToolFormat::kLlama3Json;
  return ToolFormat::kNone;
}

ParsedReply parse_tool_calls(ToolFormat f, std::string_view reply) {
  ParsedReply out;
  const size_t at = calls_start(f, reply);
  if (at == std::string_view::npos) {
    out.content = std::string(reply);
    return out;
  }
  const bool ok = markers(f)->parse(reply, at, &out.calls);
  if (!ok) {
    out.calls.clear();
    out.content = std::string(reply);
    return out;
  }
  out.content = std::string(trim(reply.substr(0, at)));
  return out;
}

size_t streamable_prefix(ToolFormat f, std::string_view r, size_t from) {
  if (f == ToolFormat::kNone) return r.size();
  if (f == ToolFormat::kForcedCalls) return 0;  // the whole reply is the calls
  const size_t at = calls_start(f, r, from);
  if (at != std::string_view::npos) return at;
  if (f == ToolFormat::kLlama3Json) {
    // The reply is a call when it starts with '{' or '[' or <|python_tag|>: hold back while it
    // is only whitespace or a start of the tag.
    const std::string_view t = trim(r);
    if (t.empty() || std::string_view("<|python_tag|>").substr(0, t.size()) == t) return 0;
    return r.size();
  }
  // Hold back a tail that is the start of the marker.
  const std::string_view m = markers(f)->start;
  for (size_t n = std::min(m.size() - 1, r.size()); n > 0; --n)
    if (r.substr(r.size() - n) == m.substr(0, n)) return r.size() - n;
  return r.size();
}

}  // namespace troupe::serve
