// OpenAI-compatible request bodies (see openai.h): validation field by field, each error naming
// its field; prompts tokenized, chat messages rendered, images taken from data: URLs. The
// answers' JSON is openai_answers.cc's.
#include "serve/openai.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <limits>

#include <nlohmann/json.hpp>

#include "base/base64.h"
#include "compute/grammar.h"
#include "compute/multimodal_prompt.h"
#include "model/chat_template.h"
#include "model/image.h"
#include "model/tokenizer.h"
#include "serve/json_schema.h"

namespace troupe::serve {

namespace {

// Ordered: objects keep their members' order into the chat template (tojson of a message).
using json = nlohmann::ordered_json;

// Thrown inside parsing only; parse_request turns it into its ApiError.
struct BadField {
  ApiError e;
};

[[noreturn]] void fail(const std::string& param, const std::string& message, int status = 400,
                       const std::string& code = "") {
  ApiError e;
  e.status = status;
  e.message = message;
  e.param = param;
  e.code = code;
  throw BadField{std::move(e)};
}

std::string type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::string:
      return "a string";
    case json::value_t::array:
      return "an array";
    case json::value_t::object:
      return "an object";
    case json::value_t::number_float:
      return "a number";
    default:
      return "an integer";
  }
}

// Optional fields: absent and null mean "not given".
const json* field(const json& body, const char* name) {
  auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

std::string shortest(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", x);
  return b;
}

double number(const json& body, const char* name, double def, double lo, double hi) {
  const json* v = field(body, name);
  if (!v) return def;
  if (!v->is_number())
    fail(name, std::string("'") + name + "' must be a number, got " + type_name(*v));
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi)
    fail(name, std::string("'") + name + "' must be in [" + shortest(lo) + ", " + shortest(hi) +
                   "], got " + v->dump());
  return x;
}

int64_t integer(const json& body, const char* name, int64_t def, int64_t lo, int64_t hi) {
  const json* v = field(body, name);
  if (!v) return def;
  if (!v->is_number_integer() &&
      !(v->is_number_float() && std::trunc(v->get<double>()) == v->get<double>() &&
        std::fabs(v->get<double>()) < 9e15))
    fail(name, std::string("'") + name + "' must be an integer, got " + type_name(*v) +
                   (v->is_number() ? " (" + v->dump() + ")" : ""));
  const int64_t x =
      v->is_number_integer() ? v->get<int64_t>() : static_cast<int64_t>(v->get<double>());
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(hi))
    fail(name, std::string("'") + name + "' must be at most " + std::to_string(hi) + ", got " +
                   v->dump());
  if (x < lo || x > hi)
    fail(name, std::string("'") + name + "' must be in [" + std::to_string(lo) + ", " +
                   std::to_string(hi) + "], got " + v->dump());
  return x;
}

bool boolean(const json& body, const char* name, bool def) {
  const json* v = field(body, name);
  if (!v) return def;
  if (!v->is_boolean())
    fail(name, std::string("'") + name + "' must be a boolean, got " + type_name(*v));
  return v->get<bool>();
}

std::vector<int32_t> token_ids(const json& v, const std::string& param, int32_t n_vocab) {
  std::vector<int32_t> out;
  for (size_t i = 0; i < v.size(); ++i) {
    const json& t = v[i];
    if (!t.is_number_integer())
      fail(param, "'" + param + "[" + std::to_string(i) +
                      "]' must be a token id (an integer), got " + type_name(t));
    const int64_t id = t.get<int64_t>();
    if (id < 0 || id >= n_vocab || (t.is_number_unsigned() && t.get<uint64_t>() >= 1u << 31))
      fail(param, "'" + param + "[" + std::to_string(i) + "]' = " + t.dump() +
                      " is not a token id of this model (0 to " + std::to_string(n_vocab - 1) +
                      ")");
    out.push_back(static_cast<int32_t>(id));
  }
  return out;
}

// Fields of the API troupe does not implement: refused when given a value that asks for them.
void refuse_unsupported(const json& body, Endpoint ep) {
  auto given = [&](const char* name) { return field(body, name) != nullptr; };
  if (given("logit_bias") && !(body["logit_bias"].is_object() && body["logit_bias"].empty()))
    fail("logit_bias", "'logit_bias' is not supported yet");
  if (given("suffix") && body["suffix"] != json(""))
    fail("suffix", "'suffix' is not supported (no fill-in-the-middle)");
  if (given("best_of") && body["best_of"] != json(1) && body["best_of"] != body.value("n", json(1)))
    fail("best_of", "'best_of' other than n is not supported");
  if (ep == Endpoint::kChat) {
  }
}

compute::SamplingParams sampling_of(const json& body, int32_t n_vocab) {
  compute::SamplingParams sp;
  sp.temperature = static_cast<float>(number(body, "temperature", 1.0, 0.0, 2.0));
  sp.top_p = static_cast<float>(number(body, "top_p", 1.0, 0.0, 1.0));
  if (sp.top_p <= 0) fail("top_p", "'top_p' must be greater than 0, got " + body["top_p"].dump());
  const int64_t top_k = integer(body, "top_k", 0, -1, n_vocab);
  sp.top_k = static_cast<int32_t>(top_k < 0 ? 0 : top_k);  // -1: off (vLLM)
  sp.min_p = static_cast<float>(number(body, "min_p", 0.0, 0.0, 1.0));
  sp.presence_penalty = static_cast<float>(number(body, "presence_penalty", 0.0, -2.0, 2.0));
  sp.frequency_penalty = static_cast<float>(number(body, "frequency_penalty", 0.0, -2.0, 2.0));
  sp.repetition_penalty = static_cast<float>(number(body, "repetition_penalty", 1.0, 0.0, 1e9));
  if (sp.repetition_penalty <= 0)
    fail("repetition_penalty", "'repetition_penalty' must be greater than 0");
  sp.ignore_eos = boolean(body, "ignore_eos", false);
  if (const json* s = field(body, "stop")) {
    if (s->is_string()) {
      sp.stop_strings.push_back(s->get<std::string>());
    } else if (s->is_array()) {
      for (size_t i = 0; i < s->size(); ++i) {
        if (!(*s)[i].is_string())
          fail("stop",
               "'stop[" + std::to_string(i) + "]' must be a string, got " + type_name((*s)[i]));
        sp.stop_strings.push_back((*s)[i].get<std::string>());
      }
      if (s->size() > 16) fail("stop", "'stop' holds at most 16 strings");
    } else {
      fail("stop", "'stop' must be a string or an array of strings, got " + type_name(*s));
    }
    for (const auto& x : sp.stop_strings)
      if (x.empty()) fail("stop", "'stop' strings must not be empty");
  }
  if (const json* s = field(body, "stop_token_ids")) {
    if (!s->is_array())
      fail("stop_token_ids",
           "'stop_token_ids' must be an array of token ids, got " + type_name(*s));
    sp.stop_token_ids = token_ids(*s, "stop_token_ids", n_vocab);
  }
  return sp;
}

// The prompts of /v1/completions: a string, an array of token ids, or an array of either.
// `texts` (echo only; else null): each prompt's text.
std::vector<actors::GenerateRequest> completion_prompts(const json& body,
                                                        const model::Tokenizer* tok,
                                                        int32_t n_vocab,
                                                        std::vector<std::string>* texts) {
  const json* p = field(body, "prompt");
  if (!p) fail("prompt", "'prompt' is required");
  std::vector<json> items;
  if (p->is_string() || (p->is_array() && !p->empty() && (*p)[0].is_number()))
    items.push_back(*p);
  else if (p->is_array())
    items.assign(p->begin(), p->end());
  else
    fail("prompt", "'prompt' must be a string, an array of token ids, or an array of those; got " +
                       type_name(*p));
  if (items.empty()) fail("prompt", "'prompt' is empty");
  std::vector<actors::GenerateRequest> out;
  for (size_t i = 0; i < items.size(); ++i) {
    const json& it = items[i];
    const std::string param = items.size() == 1 ? "prompt" : "prompt[" + std::to_string(i) + "]";
    actors::GenerateRequest r;
    if (it.is_string()) {
      if (!tok) fail(param, "this model has no vocabulary: send the prompt as token ids");
      const std::string text = it.get<std::string>();
      r.prompt_tokens = tok->encode(text, /*add_special=*/true, /*parse_special=*/true);
      if (texts) texts->push_back(text);
    } else if (it.is_array()) {
      r.prompt_tokens = token_ids(it, param, n_vocab);
      if (texts) texts->push_back(tok ? tok->decode(r.prompt_tokens) : std::string());
    } else {
      fail(param,
           "'" + param + "' must be a string or an array of token ids, got " + type_name(it));
    }
    if (r.prompt_tokens.empty()) fail(param, "'" + param + "' has no tokens");
    out.push_back(std::move(r));
  }
  return out;
}

using compute::kMediaMarker;  // where an image goes in a prompt's text

// An image_url part's file: a data: URL of a PNG or JPEG (the gateway fetches nothing).
std::string image_bytes(const json& part, const std::string& pp) {
  const json* iu = part.contains("image_url") ? &part["image_url"] : nullptr;
  const json* url = iu && iu->is_object() && iu->contains("url") ? &(*iu)["url"]
                    : iu && iu->is_string()                      ? iu
                                                                 : nullptr;
  if (!url || !url->is_string())
    fail(pp, "'" + pp + "' of type 'image_url' must have 'image_url': {'url': ...}");
  const std::string u = url->get<std::string>();
  const size_t comma = u.find(',');
  if (u.rfind("data:", 0) != 0 || comma == std::string::npos)
    fail(pp, "'" + pp +
                 "': only data: URLs are taken (data:image/png;base64,...); the server "
                 "fetches no URLs");
  const std::string meta = u.substr(5, comma - 5);
  if (meta.size() < 7 || meta.compare(meta.size() - 7, 7, ";base64") != 0)
    fail(pp, "'" + pp + "': the data: URL must be base64 (data:image/png;base64,...)");
  std::string bytes;
  if (!base64_decode(std::string_view(u).substr(comma + 1), &bytes) || bytes.empty())
    fail(pp, "'" + pp + "': the data: URL's base64 is malformed");
  // Decoded here once to tell the client what is wrong with a bad file (a 400 naming the part);
  // the encoder decodes it again for its pixels.
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  if (auto img = model::decode_image({data, bytes.size()}, pp); !img) fail(pp, img.error().message);
  return bytes;
}

std::string content_text(const json& c, const std::string& param,
                         std::vector<std::string>* images) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array())
    fail(param,
         "'" + param + "' must be a string or an array of content parts, got " + type_name(c));
  std::string text;
  for (size_t i = 0; i < c.size(); ++i) {
    const json& part = c[i];
    const std::string pp = param + "[" + std::to_string(i) + "]";
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      fail(pp, "'" + pp + "' must be an object with a 'type'");
    const std::string type = part["type"].get<std::string>();
    if (type == "image_url") {
      if (!images) fail(pp, "'" + pp + "': images are taken in user messages only");
      images->push_back(image_bytes(part, pp));
      text += kMediaMarker;
      continue;
    }
    if (type != "text")
      fail(pp, "'" + pp + "': content parts of type '" + type +
                   "' are not supported (only 'text' and 'image_url')");
    if (!part.contains("text") || !part["text"].is_string())
      fail(pp, "'" + pp + "' of type 'text' must have a string 'text'");
    text += part["text"].get<std::string>();
  }
  return text;
}

// An assistant message's tool_calls as templates take them: each function's arguments as an
// object (the API sends a JSON string; Hugging Face templates read the object, as vLLM passes it).
json message_tool_calls(const json& calls, const std::string& param) {
  if (!calls.is_array()) fail(param, "'" + param + "' must be an array, got " + type_name(calls));
  json out = json::array();
  for (size_t k = 0; k < calls.size(); ++k) {
    const std::string pk = param + "[" + std::to_string(k) + "]";
    const json& c = calls[k];
    if (!c.is_object() || !c.contains("function") || !c["function"].is_object() ||
        !c["function"].contains("name") || !c["function"]["name"].is_string())
      fail(pk, "'" + pk + "' must be an object with a 'function' holding a string 'name'");
    json call = c;
    const json& f = c["function"];
    if (f.contains("arguments") && f["arguments"].is_string()) {
      const std::string& a = f["arguments"].get_ref<const std::string&>();
      json parsed = json::parse(a, nullptr, false);
      if (parsed.is_discarded() || !parsed.is_object())
        fail(pk + ".function.arguments",
             "'" + pk + ".function.arguments' must be a JSON object's text");
      call["function"]["arguments"] = std::move(parsed);
    }
    out.push_back(std::move(call));
  }
  return out;
}

// The request's tools when the template is to see them (tool_choice not "none"), checked;
// null when there are none.
const json* tools_of(const json& body) {
  const json* t = field(body, "tools");
  if (!t) return nullptr;
  if (!t->is_array()) fail("tools", "'tools' must be an array, got " + type_name(*t));
  for (size_t k = 0; k < t->size(); ++k) {
    const std::string pk = "tools[" + std::to_string(k) + "]";
    const json& x = (*t)[k];
    if (!x.is_object() || x.value("type", json("")) != json("function") ||
        !x.contains("function") || !x["function"].is_object() || !x["function"].contains("name") ||
        !x["function"]["name"].is_string())
      fail(pk, "'" + pk +
                   "' must be {\"type\": \"function\", \"function\": {\"name\": ..., "
                   "\"parameters\": {...}}}");
    if (x["function"].contains("parameters") && !x["function"]["parameters"].is_object())
      fail(pk + ".function.parameters", "'" + pk + ".function.parameters' must be an object");
  }
  if (t->empty()) return nullptr;
  if (const json* c = field(body, "tool_choice"); c && *c == json("none")) return nullptr;
  return t;
}

// ---- constrained replies ----

// A schema given as an object, or as a JSON object's text (vLLM's guided_json takes both).
json schema_of(const json& v, const std::string& param) {
  if (v.is_object()) return v;
  if (v.is_string()) {
    const std::string& t = v.get_ref<const std::string&>();
    json parsed = json::parse(t.begin(), t.end(), nullptr, false);
    if (!parsed.is_discarded() && parsed.is_object()) return parsed;
  }
  fail(param, "'" + param + "' must be a JSON schema (an object, or its JSON text)");
}

std::string schema_grammar(const json& schema, const std::string& param) {
  auto g = json_schema_grammar(schema);
  if (!g) fail(param, "'" + param + "': " + g.error().message);
  return std::move(*g);
}

// A GBNF literal of text.
std::string gbnf_literal(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      out += strfmt("\\x%02X", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string choice_grammar(const json& v, const std::string& param) {
  if (!v.is_array() || v.empty())
    fail(param, "'" + param + "' must be a non-empty array of strings");
  std::string g = "root ::= ";
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string() || v[i].get_ref<const std::string&>().empty())
      fail(param, "'" + param + "[" + std::to_string(i) + "]' must be a non-empty string");
    g += (i ? " | " : "") + gbnf_literal(v[i].get<std::string>());
  }
  return g + "\n";
}

std::string gbnf_of(const json& v, const std::string& param) {
  if (!v.is_string()) fail(param, "'" + param + "' must be a string of GBNF rules");
  return v.get<std::string>();
}

// tool_choice "required": a JSON array of one or more {"name", "parameters"} objects (one with
// parallel_tool_calls false), each a tool of the request's with arguments its schema accepts.
std::string required_calls_grammar(const json& tools, bool parallel) {
  json any = json::array();
  for (const json& t : tools) {
    const json& f = t["function"];
    json params = f.contains("parameters") ? f["parameters"] : json::object();
    json call = {{"type", "object"},
                 {"properties", {{"name", {{"const", f["name"]}}}, {"parameters", params}}},
                 {"required", {"name", "parameters"}}};
    any.push_back(std::move(call));
  }
  json schema = {{"type", "array"}, {"minItems", 1}, {"items", {{"anyOf", any}}}};
  if (!parallel) schema["maxItems"] = 1;
  return schema_grammar(schema, "tools");
}

// The grammar the reply must follow (GBNF; "" for none): from response_format (json_object,
// json_schema), a forced tool call (tool_choice "required" or a named function: the reply is
// then the calls' JSON, split into tool_calls by *reply), troupe's `grammar` (GBNF, llama.cpp's
// name), or vLLM's guided_json / guided_choice / structured_outputs. At most one of them.
std::string reply_grammar(const json& body, Endpoint ep, ReplyFormat* reply) {
  std::vector<std::pair<std::string, std::string>> found;  // (param, grammar)
  if (const json* f = field(body, "response_format")) {
    const json type = f->is_object() ? f->value("type", json()) : json();
    if (type == json("json_object")) {
      found.push_back({"response_format", json_object_grammar()});
    } else if (type == json("json_schema")) {
      const json* js = f->contains("json_schema") ? &(*f)["json_schema"] : nullptr;
      if (!js || !js->is_object() || !js->contains("schema"))
        fail("response_format",
             "'response_format' of type json_schema needs {\"json_schema\": {\"name\": ..., "
             "\"schema\": {...}}}");
      found.push_back(
          {"response_format",
           schema_grammar(schema_of((*js)["schema"], "response_format.json_schema.schema"),
                          "response_format.json_schema.schema")});
    } else if (type != json("text")) {
      fail("response_format",
           "'response_format' must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
           "{\"type\": \"json_schema\", \"json_schema\": {...}}");
    }
  }
  if (const json* g = field(body, "grammar")) found.push_back({"grammar", gbnf_of(*g, "grammar")});
  if (const json* g = field(body, "guided_json"))
    found.push_back({"guided_json", schema_grammar(schema_of(*g, "guided_json"), "guided_json")});
  if (const json* g = field(body, "guided_choice"))
    found.push_back({"guided_choice", choice_grammar(*g, "guided_choice")});
  if (const json* g = field(body, "guided_grammar"))
    found.push_back({"guided_grammar", gbnf_of(*g, "guided_grammar")});
  if (field(body, "guided_regex"))
    fail("guided_regex", "'guided_regex' is not supported (json, choice and grammar are)");
  if (const json* so = field(body, "structured_outputs")) {
    if (!so->is_object()) fail("structured_outputs", "'structured_outputs' must be an object");
    for (const auto& [k, v] : so->items()) {
      const std::string param = "structured_outputs." + k;
      if (v.is_null()) continue;
      if (k == "json")
        found.push_back({param, schema_grammar(schema_of(v, param), param)});
      else if (k == "choice")
        found.push_back({param, choice_grammar(v, param)});
      else if (k == "grammar")
        found.push_back({param, gbnf_of(v, param)});
      else
        fail(param, "'" + param + "' is not supported (json, choice and grammar are)");
    }
  }
  const json* choice = ep == Endpoint::kChat ? field(body, "tool_choice") : nullptr;
  if (choice && *choice != json("none") && *choice != json("auto")) {
    const json* tools = field(body, "tools");
    if (!tools || !tools->is_array() || tools->empty())
      fail("tool_choice", "'tool_choice' forces a call, but the request has no 'tools'");
    if (*choice == json("required")) {
      found.push_back({"tool_choice",
                       required_calls_grammar(*tools, boolean(body, "parallel_tool_calls", true))});
      reply->tools = ToolFormat::kForcedCalls;
    } else {
      const json* name = choice->is_object() && choice->contains("function") &&
                                 (*choice)["function"].is_object() &&
                                 (*choice)["function"].contains("name")
                             ? &(*choice)["function"]["name"]
                             : nullptr;
      if (!name || !name->is_string())
        fail("tool_choice",
             "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": "
             "\"function\", \"function\": {\"name\": ...}}");
      const json* tool = nullptr;
      for (const json& t : *tools)
        if (t["function"]["name"] == *name) tool = &t;
      if (!tool)
        fail("tool_choice",
             "'tool_choice' names the function " + name->dump() + ", which is not among 'tools'");
      const json& f = (*tool)["function"];
      found.push_back({"tool_choice",
                       schema_grammar(f.contains("parameters") ? f["parameters"] : json::object(),
                                      "tool_choice")});
      reply->tools = ToolFormat::kNone;
      reply->forced_function = name->get<std::string>();
    }
  }
  if (found.empty()) return {};
  if (found.size() > 1)
    fail(found[1].first, "'" + found[0].first + "' and '" + found[1].first +
                             "' both constrain the reply: give one");
  const auto& [param, grammar] = found[0];
  if (auto g = compute::Grammar::compile(grammar); !g)
    fail(param, "'" + param + "': " + g.error().message);
  if (boolean(body, "ignore_eos", false))
    fail("ignore_eos", "'ignore_eos' cannot be used with '" + param +
                           "': a constrained reply ends once its grammar is complete");
  // The reply is the grammar's sentence: no reasoning or harmony channels before it.
  reply->reasoning = false;
  reply->starts_in_reasoning = false;
  reply->harmony = false;
  return grammar;
}

// The JSON Schema types of the tools' parameters (the first non-null one of a type list).
std::shared_ptr<const ToolParamTypes> param_types_of(const json& tools) {
  auto types = std::make_shared<ToolParamTypes>();
  for (const json& t : tools) {
    const json& f = t["function"];
    if (!f.contains("parameters") || !f["parameters"].contains("properties") ||
        !f["parameters"]["properties"].is_object())
      continue;
    auto& params = (*types)[f["name"].get<std::string>()];
    for (const auto& [k, v] : f["parameters"]["properties"].items()) {
      if (!v.is_object() || !v.contains("type")) continue;
      const json& ty = v["type"];
      if (ty.is_string()) {
        params[k] = ty.get<std::string>();
      } else if (ty.is_array()) {
        for (const json& x : ty)
          if (x.is_string() && x != "null") {
            params[k] = x.get<std::string>();
            break;
          }
      }
    }
  }
  return types;
}

// The chat template's variables for a chat request: the messages (content as text, images as
// markers in it), add_generation_prompt, the vocabulary's special-token texts and the request's
// chat_template_kwargs, as transformers' apply_chat_template passes them. `cont`: the request's
// continue_final_message.
json chat_context(const json& body, const ServedModel& served, bool cont,
                  std::vector<std::string>* images) {
  const json* msgs = field(body, "messages");
  if (!msgs) fail("messages", "'messages' is required");
  if (!msgs->is_array()) fail("messages", "'messages' must be an array, got " + type_name(*msgs));
  if (msgs->empty()) fail("messages", "'messages' is empty");
  json context = json::object();
  // OpenAI's reasoning_effort reaches the template as a variable (gpt-oss's reads it);
  // chat_template_kwargs may still set it.
  if (const json* e = field(body, "reasoning_effort")) {
    if (!e->is_string() || (*e != "low" && *e != "medium" && *e != "high"))
      fail("reasoning_effort", "'reasoning_effort' must be \"low\", \"medium\" or \"high\"");
    context["reasoning_effort"] = *e;
  }
  if (const json* kw = field(body, "chat_template_kwargs")) {
    if (!kw->is_object())
      fail("chat_template_kwargs",
           "'chat_template_kwargs' must be an object, got " + type_name(*kw));
    for (const auto& [k, v] : kw->items()) context[k] = v;
  }
  json list = json::array();
  for (size_t i = 0; i < msgs->size(); ++i) {
    const json& x = (*msgs)[i];
    const std::string pm = "messages[" + std::to_string(i) + "]";
    if (!x.is_object()) fail(pm, "'" + pm + "' must be an object, got " + type_name(x));
    if (!x.contains("role") || !x["role"].is_string())
      fail(pm + ".role", "'" + pm + ".role' must be a string");
    std::string role = x["role"].get<std::string>();
    if (role == "developer") role = "system";  // OpenAI's newer name; templates know "system"
    json m = json::object();
    m["role"] = role;
    const size_t images_before = images->size();
    if (x.contains("content") && !x["content"].is_null()) {
      const std::string text =
          content_text(x["content"], pm + ".content", role == "user" ? images : nullptr);
      // Each image marker in the text must be one of the message's image parts.
      if (compute::count_media_markers(text) != images->size() - images_before)
        fail(pm + ".content", "'" + pm + ".content' holds " + std::string(kMediaMarker) +
                                  ", the image marker: give images as image_url parts");
      m["content"] = text;
    } else if (role != "assistant") {
      fail(pm + ".content", "'" + pm + ".content' is required");
    } else {
      m["content"] = nullptr;
    }
    for (const char* extra : {"name", "tool_call_id", "reasoning_content"})
      if (x.contains(extra) && x[extra].is_string()) m[extra] = x[extra];
    if (x.contains("tool_calls") && !x["tool_calls"].is_null())
      m["tool_calls"] = message_tool_calls(x["tool_calls"], pm + ".tool_calls");
    list.push_back(std::move(m));
  }
  context["messages"] = std::move(list);
  if (const json* t = tools_of(body)) context["tools"] = *t;
  // continue_final_message (vLLM's): the reply goes on from the last (assistant) message, so the
  // template opens no new turn.
  if (cont) {
    if (field(body, "add_generation_prompt") && boolean(body, "add_generation_prompt", true))
      fail("continue_final_message",
           "'continue_final_message' and 'add_generation_prompt' cannot both be true");
    const json& last = context["messages"].back();
    if (last["role"] != "assistant" || !last["content"].is_string() ||
        last["content"].get_ref<const std::string&>().empty())
      fail("continue_final_message",
           "'continue_final_message' needs the last message to be the assistant's, with text");
  }
  context["add_generation_prompt"] = !cont && boolean(body, "add_generation_prompt", true);
  const model::Tokenizer& tok = *served.model->tokenizer;
  auto special = [&](const char* name, int32_t id) {
    if (id >= 0) context[name] = std::string(tok.token_text(id));
  };
  special("bos_token", tok.bos_id());
  special("eos_token", tok.eos_id());
  return context;
}

// A chat's request, its prompt's length in tokens (with images: their rows counted) and how its
// reply is to be split (tools when the template gets them, reasoning as the server parses it).
actors::GenerateRequest chat_prompt(const json& body, const ServedModel& served,
                                    int64_t* prompt_len, ReplyFormat* reply) {
  const model::Model& m = *served.model;
  if (!m.tokenizer) fail("messages", "this model has no vocabulary: use /v1/completions");
  std::vector<std::string> images;
  const bool cont = boolean(body, "continue_final_message", false);
  const json context = chat_context(body, served, cont, &images);
  if (!served.chat_template) fail("messages", served.chat_template_error);
  if (context.contains("tools")) {
    if (!served.template_takes_tools)
      fail("tools", "this model's chat template does not take tools");
    if (served.tool_format == ToolFormat::kNone && !served.harmony)
      fail("tools",
           "this model's chat template writes tool calls in no format troupe knows: give one "
           "with `troupe serve --tool-call-parser` (" +
               tool_format_names() + ")");
  }
  auto text = served.chat_template->render(context, static_cast<int64_t>(std::time(nullptr)));
  if (!text) {
    if (text.error().code == static_cast<int>(model::TemplateErrc::kRaised))
      fail("messages", "the model's chat template refused the messages: " + text.error().message);
    fail("messages", "the model's " + text.error().message);
  }
  // Nothing is lost silently: a template that leaves a system message out (Phi-3's does) is
  // refused rather than followed.
  const json& list = context["messages"];
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i]["role"] != "system" || !list[i]["content"].is_string()) continue;
    std::string c = list[i]["content"].get<std::string>();
    const size_t b = c.find_first_not_of(" \t\r\n");
    if (b == std::string::npos) continue;
    c = c.substr(b, c.find_last_not_of(" \t\r\n") - b + 1);
    if (text->find(c) == std::string::npos)
      fail("messages[" + std::to_string(i) + "]",
           "the model's chat template leaves out messages[" + std::to_string(i) +
               "] (a system message): put its text in the first user message");
  }
  if (cont) {
    // The prompt ends where the final message's text ends (its turn's closing tokens cut).
    const std::string& final_text = list.back()["content"].get_ref<const std::string&>();
    const size_t at = text->rfind(final_text);
    if (at == std::string::npos)
      fail("continue_final_message",
           "the model's chat template does not write the final message's text as given, so it "
           "cannot be continued");
    text->resize(at + final_text.size());
  }
  // A prompt ending in <think> (DeepSeek-R1's, Qwen3's with thinking) has the reply begin
  // inside the reasoning.
  const size_t last = text->find_last_not_of(" \t\r\n");
  reply->tools =
      context.contains("tools") && !served.harmony ? served.tool_format : ToolFormat::kNone;
  reply->harmony = served.harmony;
  if (context.contains("tools")) reply->param_types = param_types_of(context["tools"]);
  reply->reasoning = served.reasoning;
  reply->starts_in_reasoning = served.reasoning && last != std::string::npos && last + 1 >= 7 &&
                               text->compare(last + 1 - 7, 7, "<think>") == 0;
  actors::GenerateRequest r;
  // The template writes the prompt's special tokens (BOS included) itself, as Hugging Face
  // tokenizes a rendered chat: no BOS added, control-token texts recognized.
  if (images.empty()) {
    r.prompt_tokens = m.tokenizer->encode(*text, /*add_special=*/false, /*parse_special=*/true);
    *prompt_len = static_cast<int64_t>(r.prompt_tokens.size());
    return r;
  }
  if (served.image_tokens <= 0)
    fail("messages",
         "this server has no vision encoder for images ([model] mmproj, or `troupe "
         "serve --mmproj`)");
  r.prompt = *text;
  r.add_bos = false;  // the template writes it
  r.image_files = std::make_shared<const std::vector<std::string>>(std::move(images));
  // The text's tokens (each marker counted as its few characters' tokens) and each image's rows
  // with the two tokens that may bracket them: a bound, for the length check.
  *prompt_len = static_cast<int64_t>(m.tokenizer->encode(*text, false, true).size()) +
                static_cast<int64_t>(r.image_files->size()) * (served.image_tokens + 2);
  return r;
}

void parse_body(Endpoint ep, std::string_view text, const ServedModel& served, ApiRequest* out) {
  json body = json::parse(text.begin(), text.end(), nullptr, false);
  if (body.is_discarded()) fail("", "the body is not valid JSON");
  if (!body.is_object()) fail("", "the body must be a JSON object, got " + type_name(body));
  const json* model = field(body, "model");
  if (!model) fail("model", "'model' is required (this server serves '" + served.id + "')");
  if (!model->is_string()) fail("model", "'model' must be a string, got " + type_name(*model));
  if (model->get<std::string>() != served.id)
    fail("model",
         "The model '" + model->get<std::string>() + "' does not exist (this server serves '" +
             served.id + "')",
         404, "model_not_found");
  refuse_unsupported(body, ep);
  const model::Model& m = *served.model;
  const int32_t n_vocab = static_cast<int32_t>(m.spec.n_vocab);
  out->endpoint = ep;
  out->stream = boolean(body, "stream", false);
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object())
      fail("stream_options", "'stream_options' must be an object, got " + type_name(*so));
    if (!out->stream) fail("stream_options", "'stream_options' is only allowed with stream");
    out->include_usage = boolean(*so, "include_usage", false);
  }
  const int64_t n = integer(body, "n", 1, 1, served.max_choices);
  if (ep == Endpoint::kCompletions) {
    out->logprobs = static_cast<int>(integer(body, "logprobs", -1, 0, 20));
  } else {
    const bool want = boolean(body, "logprobs", false);
    const int64_t top = integer(body, "top_logprobs", 0, 0, 20);
    if (field(body, "top_logprobs") && !want)
      fail("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    out->logprobs = want ? static_cast<int>(top) : -1;
  }
  compute::SamplingParams sp = sampling_of(body, n_vocab);
  const json* seed = field(body, "seed");
  const int64_t seed_value = seed ? integer(body, "seed", 0, std::numeric_limits<int64_t>::min(),
                                            std::numeric_limits<int64_t>::max())
                                  : 0;
  std::vector<actors::GenerateRequest> prompts;
  std::vector<int64_t> lens;
  std::vector<std::string> texts;
  const bool echo = ep == Endpoint::kCompletions && boolean(body, "echo", false);
  if (echo && out->logprobs >= 0)
    fail("echo", "'echo' with 'logprobs' (the prompt's logprobs) is not supported yet");
  if (ep == Endpoint::kCompletions) {
    prompts = completion_prompts(body, m.tokenizer.get(), n_vocab, echo ? &texts : nullptr);
    for (const auto& p : prompts) lens.push_back(static_cast<int64_t>(p.prompt_tokens.size()));
  } else {
    int64_t len = 0;
    prompts.push_back(chat_prompt(body, served, &len, &out->reply));
    lens.push_back(len);
  }
  sp.grammar = reply_grammar(body, ep, &out->reply);
  if (!sp.grammar.empty() && !m.tokenizer)
    fail("grammar", "this model has no vocabulary: a reply cannot be constrained");
  if (static_cast<int64_t>(prompts.size()) * n > served.max_choices)
    fail("n", "prompts x n = " + std::to_string(prompts.size() * n) + " choices; at most " +
                  std::to_string(served.max_choices) + " in one request");
  // max_tokens: completions default to 16 (the API's), chats to the rest of the context.
  const char* max_name = ep == Endpoint::kChat && field(body, "max_completion_tokens")
                             ? "max_completion_tokens"
                             : "max_tokens";
  const json* max_given = field(body, max_name);
  const int64_t limit = served.max_model_len > 0 ? served.max_model_len : int64_t{1} << 30;
  const int64_t max_tokens = integer(body, max_name, 16, 0, limit);
  for (size_t i = 0; i < prompts.size(); ++i) {
    actors::GenerateRequest& r = prompts[i];
    const int64_t plen = lens[i];
    if (plen >= limit)
      fail(ep == Endpoint::kChat ? "messages" : "prompt",
           "This model's maximum context length is " + std::to_string(limit) +
               " tokens. However, your prompt has " + std::to_string(plen) + " tokens",
           400, "context_length_exceeded");
    int64_t mt = max_tokens;
    if (!max_given && ep == Endpoint::kChat) mt = limit - plen;
    if (plen + mt > limit)
      fail(max_name,
           "This model's maximum context length is " + std::to_string(limit) +
               " tokens. However, you requested " + std::to_string(plen + mt) + " tokens (" +
               std::to_string(plen) + " in the prompt, " + std::to_string(mt) +
               " in the completion). Please reduce the prompt or '" + max_name + "'",
           400, "context_length_exceeded");
    r.max_tokens = mt;
    r.sampling = sp;
    r.return_logits = out->logprobs >= 0;
    r.add_bos = false;  // tokenized here
    for (int64_t k = 0; k < n; ++k) {
      actors::GenerateRequest c = r;
      // A given seed makes every choice reproducible; choice k draws from seed + k so that the
      // n choices differ. Without one the router picks a seed per choice.
      if (seed) c.sampling.seed = static_cast<uint64_t>(seed_value) + static_cast<uint64_t>(k);
      out->choices.push_back(std::move(c));
      if (echo) out->echo_text.push_back(texts[i]);
    }
  }
}

}  // namespace

Status set_chat_template(ServedModel* served, std::string_view source) {
  served->chat_template.reset();
  if (source.empty()) {
    served->chat_template_error =
        "this model has no chat template: use /v1/completions, or give one (--chat-template)";
    return Ok{};
  }
  auto t = model::ChatTemplate::compile(source);
  if (!t) {
    served->chat_template_error = "the model's " + t.error().message;
    return t.error();
  }
  served->chat_template = std::make_shared<const model::ChatTemplate>(std::move(*t));
  served->chat_template_error.clear();
  served->tool_format = detect_tool_format(source);
  served->harmony = source.find("<|channel|>") != std::string_view::npos &&
                    source.find("<|message|>") != std::string_view::npos;
  served->template_takes_tools = source.find("tools") != std::string_view::npos;
  return Ok{};
}

bool parse_request(Endpoint endpoint, std::string_view body, const ServedModel& served,
                   ApiRequest* out, ApiError* err) {
  *out = ApiRequest{};
  try {
    parse_body(endpoint, body, served, out);
    return true;
  } catch (BadField& b) {
    *err = std::move(b.e);
  } catch (const json::exception& e) {
    err->status = 400;
    err->message = std::string("malformed request: ") + e.what();
  }
  return false;
}

}  // namespace troupe::serve
