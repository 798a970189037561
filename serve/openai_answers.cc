// OpenAI-compatible answers (see openai.h): errors, whole answers, stream chunks, usage and
// log-probabilities as the API's JSON.
#include <algorithm>
#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

#include "model/tokenizer.h"
#include "serve/openai.h"

namespace troupe::serve {

namespace {

using nlohmann::json;

json usage_of(const std::vector<actors::GenerateResult>& results) {
  // Prompts shared by n choices count once, as the API does.
  int64_t prompt = 0, completion = 0;
  const std::vector<int32_t>* last = nullptr;
  for (const auto& r : results) {
    if (!last || *last != r.prompt_tokens) prompt += static_cast<int64_t>(r.prompt_tokens.size());
    last = &r.prompt_tokens;
    completion += static_cast<int64_t>(r.tokens.size());
  }
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion}};
}

}  // namespace

std::string error_body(const ApiError& e) {
  json err = {{"message", e.message},
              {"type", e.type},
              {"param", e.param.empty() ? json(nullptr) : json(e.param)},
              {"code", e.code.empty() ? json(nullptr) : json(e.code)}};
  return json{{"error", err}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

TokenLogprob token_logprob(std::span<const float> logits, int32_t token, int top_n) {
  TokenLogprob out;
  out.token = token;
  if (logits.empty()) return out;
  float mx = -std::numeric_limits<float>::infinity();
  for (float x : logits)
    if (x > mx) mx = x;
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - mx);
  const double log_z = static_cast<double>(mx) + std::log(sum);
  auto lp = [&](int32_t id) {
    return static_cast<double>(logits[static_cast<size_t>(id)]) - log_z;
  };
  if (token >= 0 && static_cast<size_t>(token) < logits.size()) out.logprob = lp(token);
  // The k best by one pass, kept sorted (k <= 20; most logits fail against the k-th at once):
  // no vocabulary-sized buffer per token. Ties go to the lower id (the earlier one stays first).
  const size_t k = std::min(static_cast<size_t>(std::max(top_n, 0)), logits.size());
  std::vector<int32_t> ids;
  ids.reserve(k + 1);
  for (size_t v = 0; v < logits.size() && k > 0; ++v) {
    const float x = logits[v];
    if (ids.size() == k && !(x > logits[static_cast<size_t>(ids.back())])) continue;
    auto at = std::upper_bound(ids.begin(), ids.end(), x, [&](float val, int32_t id) {
      return val > logits[static_cast<size_t>(id)];
    });
    ids.insert(at, static_cast<int32_t>(v));
    if (ids.size() > k) ids.pop_back();
  }
  for (int32_t id : ids) out.top.emplace_back(id, lp(id));
  return out;
}

namespace {

std::string piece_of(const model::Tokenizer* tok, int32_t id) {
  return tok ? tok->token_to_piece(id, /*render_special=*/true) : std::to_string(id);
}

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

json logprobs_value(Endpoint endpoint, const model::Tokenizer* tok,
                    const std::vector<TokenLogprob>& lps, size_t text_offset) {
  if (endpoint == Endpoint::kChat) {
    json content = json::array();
    for (const auto& t : lps) {
      const std::string piece = piece_of(tok, t.token);
      json top = json::array();
      for (const auto& [id, lp] : t.top) {
        const std::string p = piece_of(tok, id);
        top.push_back({{"token", p}, {"logprob", lp}, {"bytes", bytes_of(p)}});
      }
      content.push_back({{"token", piece},
                         {"logprob", t.logprob},
                         {"bytes", bytes_of(piece)},
                         {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  json tokens = json::array(), token_lps = json::array(), tops = json::array(),
       offsets = json::array();
  size_t at = text_offset;
  for (const auto& t : lps) {
    const std::string piece = piece_of(tok, t.token);
    tokens.push_back(piece);
    token_lps.push_back(t.logprob);
    json top = json::object();
    for (const auto& [id, lp] : t.top) top[piece_of(tok, id)] = lp;
    tops.push_back(top);
    offsets.push_back(at);
    at += piece.size();
  }
  return {{"tokens", tokens},
          {"token_logprobs", token_lps},
          {"top_logprobs", tops},
          {"text_offset", offsets}};
}

}  // namespace

std::string logprobs_json(Endpoint endpoint, const model::Tokenizer* tok,
                          const std::vector<TokenLogprob>& lps, size_t text_offset) {
  return logprobs_value(endpoint, tok, lps, text_offset)
      .dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string api_finish_reason(const actors::GenerateResult& r) {
  if (r.finish_reason == "eos" || r.finish_reason == "stop") return "stop";
  return r.finish_reason;
}

std::string response_body(const ApiRequest& req, const std::string& id, int64_t created,
                          const std::string& model_id,
                          const std::vector<actors::GenerateResult>& results,
                          const std::vector<std::vector<TokenLogprob>>& logprobs,
                          const model::Tokenizer* tok) {
  const bool chat = req.endpoint == Endpoint::kChat;
  json choices = json::array();
  for (size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    json c = {{"index", i}, {"finish_reason", api_finish_reason(r)}};
    const std::string echo = !chat && i < req.echo_text.size() ? req.echo_text[i] : "";
    if (chat && req.reply.active() && tok) {
      const auto split = ReplyStream::split(req.reply, reply_with_markers(*tok, r.tokens));
      json m = {{"role", "assistant"},
                {"content", split.content.empty() && !split.calls.empty() ? json(nullptr)
                                                                          : json(split.content)}};
      if (req.reply.reasoning || req.reply.harmony)
        m["reasoning_content"] = split.reasoning.empty() ? json(nullptr) : json(split.reasoning);
      if (!split.calls.empty()) {
        json calls = json::array();
        for (const ToolCall& t : split.calls)
          calls.push_back({{"id", t.id},
                           {"type", "function"},
                           {"function", {{"name", t.name}, {"arguments", t.arguments}}}});
        m["tool_calls"] = std::move(calls);
        c["finish_reason"] = "tool_calls";
      }
      c["message"] = std::move(m);
    } else if (chat) {
      c["message"] = {{"role", "assistant"}, {"content", r.text}};
    } else
      c["text"] = echo + r.text;
    c["logprobs"] = i < logprobs.size()
                        ? logprobs_value(req.endpoint, tok, logprobs[i], echo.size())
                        : json(nullptr);
    choices.push_back(std::move(c));
  }
  json out = {{"id", id},
              {"object", chat ? "chat.completion" : "text_completion"},
              {"created", created},
              {"model", model_id},
              {"choices", std::move(choices)},
              {"usage", usage_of(results)}};
  return out.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string chunk_body(Endpoint endpoint, const std::string& id, int64_t created,
                       const std::string& model_id, size_t index, const std::string& delta,
                       bool first, const std::string& finish_reason,
                       const std::string& logprobs_object, const std::string& reasoning) {
  const bool chat = endpoint == Endpoint::kChat;
  json c = {{"index", index},
            {"finish_reason", finish_reason.empty() ? json(nullptr) : json(finish_reason)}};
  if (chat) {
    json d = json::object();
    if (first) d["role"] = "assistant";
    if (!reasoning.empty()) d["reasoning_content"] = reasoning;
    if (!delta.empty() || (first && finish_reason.empty() && reasoning.empty()))
      d["content"] = delta;
    c["delta"] = std::move(d);
  } else {
    c["text"] = delta;
  }
  c["logprobs"] = logprobs_object.empty() ? json(nullptr) : json::parse(logprobs_object);
  json out = {{"id", id},
              {"object", chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created},
              {"model", model_id},
              {"choices", json::array({std::move(c)})}};
  return out.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string tool_calls_chunk_body(const std::string& id, int64_t created,
                                  const std::string& model_id, size_t index,
                                  const std::vector<ToolCall>& calls, bool first) {
  json list = json::array();
  for (size_t k = 0; k < calls.size(); ++k)
    list.push_back({{"index", k},
                    {"id", calls[k].id},
                    {"type", "function"},
                    {"function", {{"name", calls[k].name}, {"arguments", calls[k].arguments}}}});
  json delta = json::object();
  if (first) delta["role"] = "assistant";
  delta["tool_calls"] = std::move(list);
  json c = {{"index", index},
            {"finish_reason", nullptr},
            {"delta", std::move(delta)},
            {"logprobs", nullptr}};
  json out = {{"id", id},
              {"object", "chat.completion.chunk"},
              {"created", created},
              {"model", model_id},
              {"choices", json::array({std::move(c)})}};
  return out.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string reply_with_markers(const model::Tokenizer& tok, const std::vector<int32_t>& tokens) {
  model::StreamDecoder d(tok, /*render_special=*/true);
  std::string out;
  for (int32_t t : tokens) out += d.push(t);
  return out + d.flush();
}

std::string usage_chunk_body(Endpoint endpoint, const std::string& id, int64_t created,
                             const std::string& model_id,
                             const std::vector<actors::GenerateResult>& results) {
  json out = {{"id", id},
              {"object", endpoint == Endpoint::kChat ? "chat.completion.chunk" : "text_completion"},
              {"created", created},
              {"model", model_id},
              {"choices", json::array()},
              {"usage", usage_of(results)}};
  return out.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string models_body(const std::string& model_id, int64_t created) {
  json m = {{"id", model_id}, {"object", "model"}, {"created", created}, {"owned_by", "troupe"}};
  return json{{"object", "list"}, {"data", json::array({m})}}.dump();
}

}  // namespace troupe::serve
