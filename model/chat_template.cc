// ChatTemplate (model/chat_template.h): JSON context -> Jinja values, and the calls into the
// interpreter of model/detail/jinja*.cc.
#include "model/chat_template.h"

#include <nlohmann/json.hpp>

#include "model/detail/jinja.h"

namespace troupe::model {
namespace {

detail::Value from_json(const nlohmann::ordered_json& j, int depth) {
  using detail::Value;
  if (depth > 200) return Value(detail::None{});
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value(detail::None{});
    case nlohmann::ordered_json::value_t::boolean:
      return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const auto u = j.get<uint64_t>();
      return u > static_cast<uint64_t>(INT64_MAX) ? Value(static_cast<double>(u))
                                                  : Value(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      detail::List l;
      l.reserve(j.size());
      for (const auto& x : j) l.push_back(from_json(x, depth + 1));
      return Value(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      auto d = std::make_shared<detail::Dict>();
      for (const auto& [k, v] : j.items()) d->set(k, from_json(v, depth + 1));
      return Value(std::move(d));
    }
    default:
      return Value(detail::None{});
  }
}

}  // namespace

Result<ChatTemplate> ChatTemplate::compile(std::string_view source) {
  auto p = detail::parse_jinja(source);
  if (!p) return make_error(0, "chat template " + p.error().message);
  ChatTemplate t;
  t.program_ = std::move(*p);
  return t;
}

Result<std::string> ChatTemplate::render(const nlohmann::ordered_json& context, int64_t now_unix,
                                         const ChatTemplateLimits& limits) const {
  if (!program_) return make_error(0, "the chat template is not compiled");
  if (!context.is_object()) return make_error(0, "a chat template's context must be an object");
  detail::Dict globals;
  for (const auto& [k, v] : context.items()) globals.set(k, from_json(v, 0));
  detail::RenderLimits rl;
  rl.max_output_bytes = limits.max_output_bytes;
  rl.max_steps = limits.max_steps;
  auto r = detail::render_jinja(*program_, globals, now_unix, rl);
  if (!r && r.error().code == 0)
    return make_error(static_cast<int>(TemplateErrc::kError), "chat template " + r.error().message);
  return r;
}

}  // namespace troupe::model
