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
bool parse_hermes(std::string_view r, size_t at, const ToolParamTypes* /*types*/,
                  std::vector<ToolCall>* calls) {
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
bool parse_llama3(std::string_view r, size_t at, const ToolParamTypes* /*types*/,
                  std::vector<ToolCall>* calls) {
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
bool parse_mistral(std::string_view r, size_t at, const ToolParamTypes* /*types*/,
                   std::vector<ToolCall>* calls) {
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
bool parse_deepseek(std::string_view r, size_t at, const ToolParamTypes* /*types*/,
                    std::vector<ToolCall>* calls) {
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
bool parse_kimi(std::string_view r, size_t at, const ToolParamTypes* /*types*/,
                std::vector<ToolCall>* calls) {
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
// A bare argument value as JSON: by its parameter's schema type when the request gives it, else
// JSON when it parses as a non-string value, else the text as a string. A value that is not of
// its type stays the text it was written as.
json typed_value(std::string_view v, const ToolParamTypes* types, const std::string& fn,
                 const std::string& key) {
  std::string type;
  if (types) {
    if (auto f = types->find(fn); f != types->end())
      if (auto k = f->second.find(key); k != f->second.end()) type = k->second;
  }
  if (type == "string") return json(std::string(v));
  json parsed;
  const bool ok = parse_json(trim(v), &parsed);
  if (type.empty()) return ok && !parsed.is_string() ? parsed : json(std::string(v));
  if (ok &&
      ((type == "integer" && parsed.is_number_integer()) ||
       (type == "number" && parsed.is_number()) || (type == "boolean" && parsed.is_boolean()) ||
       (type == "object" && parsed.is_object()) || (type == "array" && parsed.is_array()) ||
       (type == "null" && parsed.is_null())))
    return parsed;
  if (type == "boolean" && (trim(v) == "True" || trim(v) == "False")) return trim(v) == "True";
  return json(std::string(v));
}

// One newline each side goes: templates write such values on lines of their own.
std::string_view strip_newlines(std::string_view v) {
  if (!v.empty() && v.front() == '\n') v.remove_prefix(1);
  if (!v.empty() && v.back() == '\n') v.remove_suffix(1);
  return v;
}

std::string_view unquote(std::string_view v) {
  v = trim(v);
  if (v.size() >= 2 && v.front() == '"' && v.back() == '"') return v.substr(1, v.size() - 2);
  return v;
}

// The `OPEN key>value</parameter>` pairs of a call's body as its arguments (keys quoted or not),
// each value read by its type; sets c->arguments and c->id. False when one is cut short.
bool read_parameters(std::string_view body, std::string_view open, const ToolParamTypes* types,
                     ToolCall* c) {
  json args = json::object();
  for (size_t p = body.find(open); p != body.npos; p = body.find(open, p + 1)) {
    const size_t pe = body.find('>', p);
    const size_t ve = pe == body.npos ? pe : body.find("</parameter>", pe);
    if (ve == body.npos) return false;
    const std::string key(unquote(body.substr(p + open.size(), pe - p - open.size())));
    args[key] = typed_value(strip_newlines(body.substr(pe + 1, ve - pe - 1)), types, c->name, key);
    p = ve;
  }
  c->arguments = args.dump(-1, ' ', false, json::error_handler_t::replace);
  c->id = new_call_id();
  return true;
}

// OPEN\n<function=name>\n<parameter=k>\nv\n</parameter>\n</function>\nCLOSE: Qwen3-Coder's
// <tool_call>...</tool_call>, Seed-OSS's <seed:tool_call>...</seed:tool_call>.
bool parse_functions(std::string_view r, size_t at, const ToolParamTypes* types,
                     std::vector<ToolCall>* calls, std::string_view open, std::string_view close) {
  while (at != r.npos) {
    const size_t end = r.find(close, at);
    if (end == r.npos) return false;  // cut short
    const std::string_view call = r.substr(at + open.size(), end - at - open.size());
    const size_t f = call.find("<function=");
    const size_t fe = f == call.npos ? f : call.find('>', f);
    if (fe == call.npos) return false;
    ToolCall c;
    c.name = std::string(trim(call.substr(f + 10, fe - f - 10)));
    if (c.name.empty()) return false;
    if (!read_parameters(call.substr(fe + 1), "<parameter=", types, &c)) return false;
    calls->push_back(std::move(c));
    at = r.find(open, end);
  }
  return !calls->empty();
}

bool parse_qwen3_coder(std::string_view r, size_t at, const ToolParamTypes* types,
                       std::vector<ToolCall>* calls) {
  return parse_functions(r, at, types, calls, "<tool_call>", "</tool_call>");
}

bool parse_seed_oss(std::string_view r, size_t at, const ToolParamTypes* types,
                    std::vector<ToolCall>* calls) {
  return parse_functions(r, at, types, calls, "<seed:tool_call>", "</seed:tool_call>");
}

// <minimax:tool_call>\n<invoke name="n">\n<parameter name="k">v</parameter>\n</invoke>\n...
// </minimax:tool_call>
bool parse_minimax(std::string_view r, size_t at, const ToolParamTypes* types,
                   std::vector<ToolCall>* calls) {
  constexpr std::string_view kOpen = "<minimax:tool_call>", kClose = "</minimax:tool_call>";
  while (at != r.npos) {
    const size_t end = r.find(kClose, at);
    if (end == r.npos) return false;  // cut short
    const std::string_view block = r.substr(at + kOpen.size(), end - at - kOpen.size());
    for (size_t i = block.find("<invoke name="); i != block.npos;
         i = block.find("<invoke name=", i + 1)) {
      const size_t ie = block.find('>', i);
      const size_t close = ie == block.npos ? ie : block.find("</invoke>", ie);
      if (close == block.npos) return false;
      ToolCall c;
      c.name = std::string(unquote(block.substr(i + 13, ie - i - 13)));
      if (c.name.empty()) return false;
      if (!read_parameters(block.substr(ie + 1, close - ie - 1), "<parameter name=", types, &c))
        return false;
      calls->push_back(std::move(c));
      i = close;
    }
    at = r.find(kOpen, end);
  }
  return !calls->empty();
}

// ---- pythonic: [name(k=v, ...), ...] ----

bool is_ident_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.';
}

void skip_ws(std::string_view s, size_t* i) {
  while (*i < s.size() && (s[*i] == ' ' || s[*i] == '\t' || s[*i] == '\n' || s[*i] == '\r')) ++*i;
}

// A Python literal at s[*i] (str, int, float, True/False/None, list, tuple, dict with string
// keys) as JSON; false when there is none.
bool py_value(std::string_view s, size_t* i, json* out, int depth) {
  if (depth > 32) return false;
  skip_ws(s, i);
  if (*i >= s.size()) return false;
  const char c = s[*i];
  if (c == '\'' || c == '"') {
    std::string v;
    for (++*i; *i < s.size() && s[*i] != c; ++*i) {
      char ch = s[*i];
      if (ch == '\\' && *i + 1 < s.size()) {
        const char e = s[++*i];
        ch = e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e;
      }
      v += ch;
    }
    if (*i >= s.size()) return false;
    ++*i;
    *out = v;
    return true;
  }
  if (c == '[' || c == '(') {
    const char close = c == '[' ? ']' : ')';
    *out = json::array();
    ++*i;
    for (;;) {
      skip_ws(s, i);
      if (*i < s.size() && s[*i] == close) break;
      json item;
      if (!py_value(s, i, &item, depth + 1)) return false;
      out->push_back(std::move(item));
      skip_ws(s, i);
      if (*i < s.size() && s[*i] == ',')
        ++*i;
      else if (*i >= s.size() || s[*i] != close)
        return false;
    }
    ++*i;
    return true;
  }
  if (c == '{') {
    *out = json::object();
    ++*i;
    for (;;) {
      skip_ws(s, i);
      if (*i < s.size() && s[*i] == '}') break;
      json key, val;
      if (!py_value(s, i, &key, depth + 1) || !key.is_string()) return false;
      skip_ws(s, i);
      if (*i >= s.size() || s[*i] != ':') return false;
      ++*i;
      if (!py_value(s, i, &val, depth + 1)) return false;
      (*out)[key.get<std::string>()] = std::move(val);
      skip_ws(s, i);
      if (*i < s.size() && s[*i] == ',')
        ++*i;
      else if (*i >= s.size() || s[*i] != '}')
        return false;
    }
    ++*i;
    return true;
  }
  size_t e = *i;
  while (e < s.size() && (is_ident_char(s[e]) || s[e] == '-' || s[e] == '+')) ++e;
  const std::string_view word = s.substr(*i, e - *i);
  if (word.empty()) return false;
  *i = e;
  if (word == "True") return *out = true, true;
  if (word == "False") return *out = false, true;
  if (word == "None") return *out = nullptr, true;
  return parse_json(word, out) && out->is_number();
}

bool parse_pythonic(std::string_view r, size_t at, const ToolParamTypes* /*types*/,
                    std::vector<ToolCall>* calls) {
  std::string_view s = trim(r.substr(at));
  if (s.substr(0, 16) == "<|python_start|>") s = trim(s.substr(16));
  if (s.size() >= 14 && s.substr(s.size() - 14) == "<|python_end|>")
    s = trim(s.substr(0, s.size() - 14));
  if (s.empty() || s.front() != '[' || s.back() != ']') return false;
  size_t i = 1;
  for (;;) {
    skip_ws(s, &i);
    size_t e = i;
    while (e < s.size() && is_ident_char(s[e])) ++e;
    ToolCall c;
    c.name = std::string(s.substr(i, e - i));
    if (c.name.empty() || e >= s.size() || s[e] != '(') return false;
    i = e + 1;
    json args = json::object();
    for (;;) {
      skip_ws(s, &i);
      if (i < s.size() && s[i] == ')') break;
      size_t k = i;
      while (k < s.size() && is_ident_char(s[k])) ++k;
      const std::string key(s.substr(i, k - i));
      i = k;
      skip_ws(s, &i);
      if (key.empty() || i >= s.size() || s[i] != '=') return false;
      ++i;
      json v;
      if (!py_value(s, &i, &v, 0)) return false;
      args[key] = std::move(v);
      skip_ws(s, &i);
      if (i < s.size() && s[i] == ',')
        ++i;
      else if (i >= s.size() || s[i] != ')')
        return false;
    }
    ++i;  // )
    c.arguments = args.dump(-1, ' ', false, json::error_handler_t::replace);
    c.id = new_call_id();
    calls->push_back(std::move(c));
    skip_ws(s, &i);
    if (i < s.size() && s[i] == ',') {
      ++i;
      continue;
    }
    return i + 1 == s.size() && s[i] == ']';
  }
}

// Where a pythonic call list begins: the reply (after whitespace) opens with `[name(` or
// <|python_start|>; npos otherwise.
size_t pythonic_start(std::string_view r) {
  const size_t b = r.find_first_not_of(" \t\r\n");
  if (b == r.npos) return r.npos;
  const std::string_view t = r.substr(b);
  if (t.substr(0, 16) == "<|python_start|>") return b;
  if (t.empty() || t[0] != '[') return r.npos;
  size_t i = 1;
  skip_ws(t, &i);
  const size_t name = i;
  while (i < t.size() && is_ident_char(t[i])) ++i;
  return i > name && i < t.size() && t[i] == '(' ? b : r.npos;
}

bool parse_glm(std::string_view r, size_t at, const ToolParamTypes* types,
               std::vector<ToolCall>* calls) {
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
      args[key] = typed_value(v, types, c.name, key);
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
bool parse_forced(std::string_view r, size_t at, const ToolParamTypes* /*types*/,
                  std::vector<ToolCall>* calls) {
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
  bool (*parse)(std::string_view reply, size_t at, const ToolParamTypes* types,
                std::vector<ToolCall>* calls);
};

constexpr Markers kFormats[] = {
    {ToolFormat::kHermes, "hermes", "<tool_call>", parse_hermes},
    {ToolFormat::kLlama3Json, "llama3_json", "<|python_tag|>", parse_llama3},
    {ToolFormat::kMistral, "mistral", "[TOOL_CALLS]", parse_mistral},
    {ToolFormat::kDeepseekV3, "deepseek_v3", kDsCallsBegin, parse_deepseek},
    {ToolFormat::kKimiK2, "kimi_k2", "<|tool_calls_section_begin|>", parse_kimi},
    {ToolFormat::kGlm45, "glm45", "<tool_call>", parse_glm},
    {ToolFormat::kQwen3Coder, "qwen3_coder", "<tool_call>", parse_qwen3_coder},
    {ToolFormat::kSeedOss, "seed_oss", "<seed:tool_call>", parse_seed_oss},
    {ToolFormat::kMinimaxM2, "minimax_m2", "<minimax:tool_call>", parse_minimax},
    {ToolFormat::kPythonic, "pythonic", "[", parse_pythonic},
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
  if (f == ToolFormat::kPythonic) return pythonic_start(r);
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

std::string tool_format_names() {
  std::string out;
  for (const Markers& m : kFormats) {
    if (m.format == ToolFormat::kForcedCalls) continue;
    if (!out.empty()) out += ", ";
    out += m.name;
  }
  return out;
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
  if (has("<minimax:tool_call>")) return ToolFormat::kMinimaxM2;
  if (has("<seed:tool_call>")) return ToolFormat::kSeedOss;
  if (has("<function=") && has("<parameter=")) return ToolFormat::kQwen3Coder;
  if (has("func_name1(")) return ToolFormat::kPythonic;
  if (has("<|tool_calls_section_begin|>")) return ToolFormat::kKimiK2;
  if (has(kDsCallsBegin)) return ToolFormat::kDeepseekV3;
  if (has("[TOOL_CALLS]")) return ToolFormat::kMistral;
  if (has("<tool_call>")) return ToolFormat::kHermes;
  if (has("<|python_tag|>") || (has("<|start_header_id|>") && has("\"parameters\"")))
    return ToolFormat::kLlama3Json;
  return ToolFormat::kNone;
}

ParsedReply parse_tool_calls(ToolFormat f, std::string_view reply, const ToolParamTypes* types) {
  ParsedReply out;
  const size_t at = calls_start(f, reply);
  if (at == std::string_view::npos) {
    out.content = std::string(reply);
    return out;
  }
  const bool ok = markers(f)->parse(reply, at, types, &out.calls);
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
  if (f == ToolFormat::kPythonic) {
    // Calls open the reply: hold back while it may still become `[name(` or <|python_start|>.
    const std::string_view t = trim(r);
    if (t.empty() || std::string_view("<|python_start|>").substr(0, t.size()) == t) return 0;
    if (t[0] == '[') {
      size_t i = 1;
      skip_ws(t, &i);
      while (i < t.size() && is_ident_char(t[i])) ++i;
      if (i == t.size()) return 0;
    }
    return r.size();
  }
  // Hold back a tail that is the start of the marker.
  const std::string_view m = markers(f)->start;
  for (size_t n = std::min(m.size() - 1, r.size()); n > 0; --n)
    if (r.substr(r.size() - n) == m.substr(0, n)) return r.size() - n;
  return r.size();
}

}  // namespace troupe::serve
