// Private to serve/: what the gateway's connection code (http_gateway.cc) and its generation
// code (generation.cc) share: the Asio and Beast types, answers, and a generation's context.
// Heavy (Beast): include it only from those two files.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange without it

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "serve/metrics.h"
#include "serve/openai.h"

namespace troupe::actors {
class ClusterNode;
}

namespace troupe::serve::detail {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using Request = http::request<http::string_body>;

/// Whether the I/O context may still be posted to: the callbacks of requests in flight (on actor
/// threads, possibly after the gateway stopped) check it under its lock.
struct Alive {
  std::mutex mu;
  net::io_context* ioc = nullptr;
};

/// Writes a whole answer and counts its status; false: close the connection after it.
net::awaitable<bool> send(beast::tcp_stream& s, const Request& req, http::status st,
                          std::string body, std::string_view type, int retry_after_s,
                          GatewayMetrics& metrics);
/// An ApiError as its status and OpenAI-style body (with Retry-After when retry_after_s > 0).
net::awaitable<bool> send_error(beast::tcp_stream& s, const Request& req, const ApiError& e,
                                GatewayMetrics& metrics, int retry_after_s = 0);

/// What a generation needs of its gateway (all of which outlives it).
struct GenerationContext {
  actors::ClusterNode* node = nullptr;
  const ServedModel* served = nullptr;
  GatewayMetrics* metrics = nullptr;
  std::shared_ptr<Alive> alive;
  net::io_context* ioc = nullptr;
  std::chrono::milliseconds request_timeout{600000};
};

/// Answers one /v1/completions or /v1/chat/completions request (I/O thread); false: close the
/// connection after it.
net::awaitable<bool> generate(const GenerationContext& ctx, std::shared_ptr<beast::tcp_stream> sp,
                              const Request& req, Endpoint ep);

}  // namespace troupe::serve::detail
