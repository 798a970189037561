// HttpGateway: the cluster's HTTP front on the head node (`troupe serve --http`): the
// OpenAI-compatible API (/v1/completions, /v1/chat/completions, /v1/models; streamed as
// server-sent events), /health, /ready, /metrics (Prometheus text), and the console: /console
// (web/console.*), /console/state (the cluster's state as JSON) and /console/feed (that state
// as server-sent events). Requests go to the
// cluster through ClusterNode::submit; a client that goes away mid-stream has its requests
// cancelled. Light header: Boost.Beast stays in http_gateway.cc.
// Thread safety: one I/O thread of its own serves every connection; start/stop from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "base/result.h"

namespace troupe::actors {
class ClusterNode;
}

namespace troupe::serve {

struct GatewayOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;       // 0: any free port (port() tells which)
  std::string model_id;       // the name clients give as "model"; "" = the model file's name
  std::string chat_template;  // a Jinja chat template's source in place of the model's ("": its)
  /// The tool-call format replies are parsed in ("hermes", "llama3_json", "mistral",
  /// "deepseek_v3", "kimi_k2", "glm45"); "": the one the chat template shows.
  std::string tool_call_parser;
  /// "deepseek_r1", "qwen3" or "think": a chat reply's <think>...</think> is its
  /// reasoning_content (streamed as delta.reasoning_content); "": all of it is content.
  std::string reasoning_parser;
  int64_t max_model_len = 0;  // the plan's scheduler.max_model_len (prompt + completion)
  int64_t max_choices = 16;   // prompts x n in one request
  /// When set, /v1/ routes need "Authorization: Bearer <api_key>" (401 otherwise).
  std::string api_key;
  int64_t max_body_bytes = int64_t{8} << 20;          // larger bodies: 413
  std::chrono::milliseconds request_timeout{600000};  // a request not done by then: 504
  std::chrono::milliseconds idle_timeout{60000};      // a keep-alive connection's silence
  std::chrono::milliseconds console_period{1000};     // between /console/feed's updates
};

class HttpGateway {
 public:
  /// Listens on host:port and serves `node` (the head; it must outlive the gateway). Errors: the
  /// node is not the head, the address cannot be bound.
  static Result<std::unique_ptr<HttpGateway>> start(actors::ClusterNode& node, GatewayOptions opts);
  /// stop().
  ~HttpGateway();
  uint16_t port() const;
  const std::string& model_id() const;
  /// Closes the listener and every connection (requests in flight are cancelled) and joins the
  /// I/O thread. Idempotent.
  void stop();

 private:
  HttpGateway();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe::serve
