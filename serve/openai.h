// The OpenAI-compatible API's request bodies and answers, without any HTTP: a JSON body of
// /v1/completions or /v1/chat/completions becomes the cluster's GenerateRequests (one per choice),
// or an ApiError naming the field; results and streamed pieces become the API's JSON. Used by
// serve/http_gateway.cc; pure functions, callable from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "actors/local_cluster.h"
#include "base/result.h"
#include "model/chat_template.h"
#include "model/model.h"
#include "serve/reply_stream.h"
#include "serve/tool_calls.h"

namespace troupe::serve {

/// An error as the OpenAI API reports it: the HTTP status and the body's error object.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";  // or "not_found_error", "server_error", ...
  std::string param;                           // the offending field; "" gives null
  std::string code;                            // "" gives null
};
/// {"error": {"message", "type", "param", "code"}}
std::string error_body(const ApiError& e);

enum class Endpoint { kCompletions, kChat };

/// What the parser needs to know of the model it serves.
struct ServedModel {
  std::string id;  // the name clients give as "model"
  std::shared_ptr<const model::Model> model;
  int64_t max_model_len = 0;  // prompt + completion tokens a sequence may hold
  int64_t max_choices = 16;   // prompts x n in one request
  /// The prompt positions one image takes (the head's vision encoder's rows); 0: the head has
  /// no vision encoder and chats may not hold images.
  int64_t image_tokens = 0;
  /// The template chats are rendered with (set_chat_template); null: chats are refused with
  /// chat_template_error.
  std::shared_ptr<const model::ChatTemplate> chat_template;
  std::string chat_template_error = "this model has no chat template: use /v1/completions";
  /// How the model writes tool calls: from its template (set_chat_template), or named by
  /// `--tool-call-parser`; kNone refuses requests with tools.
  ToolFormat tool_format = ToolFormat::kNone;
  bool template_takes_tools = false;  // the template reads `tools`
  /// `--reasoning-parser`: a chat reply's <think>...</think> is its reasoning_content.
  bool reasoning = false;
  /// The template writes gpt-oss's harmony messages (<|channel|>...<|message|>): replies are
  /// split by channel (ReplyFormat::harmony), tool calls included.
  bool harmony = false;
};

/// Compiles `source` (the model's chat template, or one given in its place) for `served`. An
/// empty source, or one that does not compile (the error is returned, naming its line), leaves
/// chats refused with a message that says why; completions are served either way.
Status set_chat_template(ServedModel* served, std::string_view source);

/// A parsed request: one GenerateRequest per choice (prompts x n, choice i = prompt i / n).
struct ApiRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::vector<actors::GenerateRequest> choices;
  std::vector<std::string> echo_text;  // completions with echo: each choice's prompt text
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  /// Log-probabilities of the generated tokens with this many alternatives each (completions:
  /// "logprobs": N; chats: "logprobs": true with "top_logprobs": N); -1: none.
  int logprobs = -1;
  /// Chats: how each reply is split into reasoning, content and tool calls (tools when the
  /// request has them with tool_choice auto; reasoning with --reasoning-parser); inactive: the
  /// reply is all content.
  ReplyFormat reply;
};

/// One generated token's log-probability and the most likely tokens at its step: the log-softmax
/// of the model's raw logits (before penalties and temperature), as the API reports them.
struct TokenLogprob {
  int32_t token = 0;
  double logprob = 0;
  std::vector<std::pair<int32_t, double>> top;  // most likely first; ties to the lower id
};
/// From the logits row that `token` was drawn from: its logprob and the `top_n` most likely.
TokenLogprob token_logprob(std::span<const float> logits, int32_t token, int top_n);

/// The "logprobs" object of a choice or chunk for `lps`. Completions: tokens, token_logprobs,
/// top_logprobs, text_offset (from `text_offset`, the characters of the choice's text before
/// these tokens); chats: content (token, logprob, bytes, top_logprobs).
std::string logprobs_json(Endpoint endpoint, const model::Tokenizer* tok,
                          const std::vector<TokenLogprob>& lps, size_t text_offset);

/// Parses and validates a body. Prompts are tokenized here (special-token texts recognized, as
/// Hugging Face tokenizers do); a chat's messages go through the model's chat template
/// (model/chat_template.h), with the request's chat_template_kwargs and add_generation_prompt. A
/// chat's images (image_url parts with data: URLs of PNG or JPEG files) stay in its text as image
/// markers and go with it as files: the cluster's encoder lays the prompt out. Returns false with
/// *err set (status 400, or 404 for an unknown model).
bool parse_request(Endpoint endpoint, std::string_view body, const ServedModel& served,
                   ApiRequest* out, ApiError* err);

/// The "finish_reason" the API reports for a result's ("eos" and "stop" are "stop").
std::string api_finish_reason(const actors::GenerateResult& r);

/// The whole answer (stream false): an object "text_completion" or "chat.completion".
/// `logprobs`: per choice, when the request asked for them (else empty).
std::string response_body(const ApiRequest& req, const std::string& id, int64_t created,
                          const std::string& model_id,
                          const std::vector<actors::GenerateResult>& results,
                          const std::vector<std::vector<TokenLogprob>>& logprobs = {},
                          const model::Tokenizer* tok = nullptr);

/// One server-sent event's JSON (stream true): a "text_completion" or "chat.completion.chunk"
/// holding `delta` for choice `index` (with the role on a chat's first chunk), or its end
/// (finish_reason set, delta empty).
/// `logprobs_object`: the chunk's "logprobs" (logprobs_json), "" for null. `reasoning`: a chat
/// chunk's reasoning_content.
std::string chunk_body(Endpoint endpoint, const std::string& id, int64_t created,
                       const std::string& model_id, size_t index, const std::string& delta,
                       bool first, const std::string& finish_reason,
                       const std::string& logprobs_object = "", const std::string& reasoning = "");
/// The chunk of a stream that carries a choice's tool calls (whole, each with its arguments).
/// `first`: no chunk of the choice went out yet (this one then carries the role).
std::string tool_calls_chunk_body(const std::string& id, int64_t created,
                                  const std::string& model_id, size_t index,
                                  const std::vector<ToolCall>& calls, bool first = false);

/// A reply's text with control tokens written out (the markers some formats' tool calls are
/// made of, such as Mistral's [TOOL_CALLS]), decoded as the stream decodes it.
std::string reply_with_markers(const model::Tokenizer& tok, const std::vector<int32_t>& tokens);

/// The usage chunk that ends a stream with stream_options.include_usage (choices empty).
std::string usage_chunk_body(Endpoint endpoint, const std::string& id, int64_t created,
                             const std::string& model_id,
                             const std::vector<actors::GenerateResult>& results);

/// GET /v1/models: the one model served.
std::string models_body(const std::string& model_id, int64_t created);

}  // namespace troupe::serve
