// The HTTP gateway (see http_gateway.h): Boost.Beast over Asio with C++20 coroutines, one I/O
// thread: the listener, connections, routing, probes, metrics and the console. Generation
// requests are generation.cc's.
#include "serve/http_gateway.h"

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <set>
#include <thread>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <nlohmann/json.hpp>

#include "actors/cluster_node.h"
#include "serve/detail/gateway_io.h"
#include "web/assets.h"

namespace troupe::serve {

using namespace detail;  // NOLINT: the Asio and Beast aliases of gateway_io.h
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace detail {

net::awaitable<bool> send(beast::tcp_stream& s, const Request& req, http::status st,
                          std::string body, std::string_view type, int retry_after_s,
                          GatewayMetrics& metrics) {
  http::response<http::string_body> res{st, req.version()};
  res.set(http::field::server, "troupe");
  res.set(http::field::content_type, beast::string_view(type.data(), type.size()));
  if (retry_after_s > 0) res.set(http::field::retry_after, std::to_string(retry_after_s));
  res.keep_alive(req.keep_alive());
  res.body() = std::move(body);
  res.prepare_payload();
  metrics.count_status(static_cast<int>(st));
  beast::error_code ec;
  co_await http::async_write(s, res, net::redirect_error(net::use_awaitable, ec));
  co_return !ec && req.keep_alive();
}

net::awaitable<bool> send_error(beast::tcp_stream& s, const Request& req, const ApiError& e,
                                GatewayMetrics& metrics, int retry_after_s) {
  co_return co_await send(s, req, static_cast<http::status>(e.status), error_body(e),
                          "application/json", retry_after_s, metrics);
}

}  // namespace detail

struct HttpGateway::Impl {
  actors::ClusterNode* node = nullptr;
  GatewayOptions opts;
  ServedModel served;
  int64_t created = 0;
  std::unique_ptr<net::io_context> ioc_owner = std::make_unique<net::io_context>(1);
  net::io_context& ioc = *ioc_owner;
  std::unique_ptr<tcp::acceptor> acceptor;
  std::thread io;
  std::shared_ptr<Alive> alive = std::make_shared<Alive>();
  std::set<std::shared_ptr<beast::tcp_stream>> conns;  // I/O thread only
  GatewayMetrics metrics;
  uint16_t port = 0;
  bool stopped = false;

  net::awaitable<void> accept_loop();
  net::awaitable<void> serve_connection(std::shared_ptr<beast::tcp_stream> s);
  // Answers one request; false: close the connection after it.
  net::awaitable<bool> handle(const std::shared_ptr<beast::tcp_stream>& sp, Request& req);
  net::awaitable<bool> send(beast::tcp_stream& s, const Request& req, http::status st,
                            std::string body, std::string_view type = "application/json",
                            int retry_after_s = 0) {
    return detail::send(s, req, st, std::move(body), type, retry_after_s, metrics);
  }
  net::awaitable<bool> send_error(beast::tcp_stream& s, const Request& req, const ApiError& e,
                                  int retry_after_s = 0) {
    return detail::send_error(s, req, e, metrics, retry_after_s);
  }
  GenerationContext generation;  // set at start
  bool serving_now(std::string* why);
  // The console's state (JSON), refreshed at most every 250 ms: the status and scheduler queries
  // block the I/O thread for their round trip to the node's actors.
  const std::string& console_state();
  net::awaitable<bool> console_feed(beast::tcp_stream& s, const Request& req);
  std::string state_cache;
  Clock::time_point state_at;
};

const std::string& HttpGateway::Impl::console_state() {
  const auto now = Clock::now();
  if (!state_cache.empty() && now - state_at < std::chrono::milliseconds(250)) return state_cache;
  const model::Model& m = *served.model;
  nlohmann::json model = {{"id", served.id},           {"path", m.path},
                          {"format", m.format},        {"arch", model::arch_name(m.spec.arch)},
                          {"n_layer", m.spec.n_layer}, {"n_embd", m.spec.n_embd},
                          {"n_vocab", m.spec.n_vocab}, {"max_model_len", served.max_model_len}};
  // Chats: whether they are served, and how replies are split.
  model["chat"] = {
      {"template", served.chat_template ? "ok" : served.chat_template_error},
      {"tool_calls",
       served.harmony ? std::string("harmony") : std::string(tool_format_name(served.tool_format))},
      {"reasoning", served.reasoning || served.harmony}};
  const auto wall = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::system_clock::now().time_since_epoch());
  state_cache = "{\"time_ms\":" + std::to_string(wall.count()) + ",\"model\":" + model.dump() +
                ",\"cluster\":" + node->status_json() +
                ",\"scheduler\":" + node->scheduler_stats_json() +
                ",\"gateway\":" + metrics.json() + "}";
  state_at = now;
  return state_cache;
}

// Server-sent events: the console's state every feed_period until the client goes.
net::awaitable<bool> HttpGateway::Impl::console_feed(beast::tcp_stream& s, const Request& req) {
  http::response<http::empty_body> head{http::status::ok, req.version()};
  head.set(http::field::server, "troupe");
  head.set(http::field::content_type, "text/event-stream");
  head.set(http::field::cache_control, "no-cache");
  head.chunked(true);
  http::response_serializer<http::empty_body> sr{head};
  beast::error_code ec;
  co_await http::async_write_header(s, sr, net::redirect_error(net::use_awaitable, ec));
  metrics.count_status(200);
  net::steady_timer timer(ioc);
  while (!ec) {
    const std::string frame = "data: " + console_state() + "\n\n";
    co_await net::async_write(s, http::make_chunk(net::buffer(frame)),
                              net::redirect_error(net::use_awaitable, ec));
    if (ec) break;
    timer.expires_after(opts.console_period);
    beast::error_code tec;
    co_await timer.async_wait(net::redirect_error(net::use_awaitable, tec));
  }
  co_return false;
}

bool HttpGateway::Impl::serving_now(std::string* why) {
  const auto j = nlohmann::json::parse(node->status_json(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    *why = "the head did not answer its status";
    return false;
  }
  const bool serving = j.value("serving", false);
  *why = j.value("condition", std::string());
  if (!serving && why->empty()) *why = "the cluster is not serving yet";
  return serving && why->empty();
}

// --- routing ---------------------------------------------------------------------------------

net::awaitable<bool> HttpGateway::Impl::handle(const std::shared_ptr<beast::tcp_stream>& sp,
                                               Request& req) {
  beast::tcp_stream& s = *sp;
  std::string target(req.target());
  if (const size_t q = target.find('?'); q != std::string::npos) target.resize(q);
  while (target.size() > 1 && target.back() == '/') target.pop_back();
  const bool get = req.method() == http::verb::get;
  const bool post = req.method() == http::verb::post;
  auto wrong_method = [&](const char* allowed) {
    ApiError e;
    e.status = 405;
    e.message = "method " + std::string(req.method_string()) + " is not allowed on " + target +
                " (use " + allowed + ")";
    return e;
  };
  if (target.rfind("/v1/", 0) == 0 && !opts.api_key.empty()) {
    const auto auth = req[http::field::authorization];
    if (auth != "Bearer " + opts.api_key) {
      ApiError e;
      e.status = 401;
      e.code = "invalid_api_key";
      e.message = auth.empty() ? "no API key given: send 'Authorization: Bearer <key>'"
                               : "the API key is not valid";
      co_return co_await send_error(s, req, e);
    }
  }
  if (target == "/health") {
    if (!get) co_return co_await send_error(s, req, wrong_method("GET"));
    co_return co_await send(s, req, http::status::ok, "{\"status\":\"ok\"}");
  }
  if (target == "/ready") {
    if (!get) co_return co_await send_error(s, req, wrong_method("GET"));
    std::string why;
    if (serving_now(&why))
      co_return co_await send(s, req, http::status::ok, "{\"status\":\"ready\"}");
    ApiError e;
    e.status = 503;
    e.type = "service_unavailable";
    e.message = why;
    co_return co_await send_error(s, req, e, 1);
  }
  if (target == "/metrics") {
    if (!get) co_return co_await send_error(s, req, wrong_method("GET"));
    std::string why;
    const bool serving = serving_now(&why);
    co_return co_await send(s, req, http::status::ok,
                            metrics.text(serving, node->scheduler_stats_json()),
                            "text/plain; version=0.0.4");
  }
  if (target == "/console/state") {
    if (!get) co_return co_await send_error(s, req, wrong_method("GET"));
    co_return co_await send(s, req, http::status::ok, console_state());
  }
  if (target == "/console/feed") {
    if (!get) co_return co_await send_error(s, req, wrong_method("GET"));
    co_return co_await console_feed(s, req);
  }
  if (const web::Asset* a = web::find_asset(target)) {
    if (!get) co_return co_await send_error(s, req, wrong_method("GET"));
    co_return co_await send(s, req, http::status::ok, std::string(a->body), a->content_type);
  }
  if (target == "/v1/models") {
    if (!get) co_return co_await send_error(s, req, wrong_method("GET"));
    co_return co_await send(s, req, http::status::ok, models_body(served.id, created));
  }
  if (target == "/v1/completions" || target == "/v1/chat/completions") {
    if (!post) co_return co_await send_error(s, req, wrong_method("POST"));
    co_return co_await detail::generate(
        generation, sp, req,
        target == "/v1/completions" ? Endpoint::kCompletions : Endpoint::kChat);
  }
  ApiError e;
  e.status = 404;
  e.type = "not_found_error";
  e.message = "no route " + target +
              " (this server has /v1/completions, /v1/chat/completions, /v1/models, /health, "
              "/ready, /metrics and /console)";
  co_return co_await send_error(s, req, e);
}

net::awaitable<void> HttpGateway::Impl::serve_connection(std::shared_ptr<beast::tcp_stream> s) {
  beast::flat_buffer buf;
  while (true) {
    http::request_parser<http::string_body> parser;
    parser.body_limit(static_cast<uint64_t>(opts.max_body_bytes));
    s->expires_after(opts.idle_timeout);
    beast::error_code ec;
    co_await http::async_read_header(*s, buf, parser, net::redirect_error(net::use_awaitable, ec));
    if (!ec && beast::iequals(parser.get()[http::field::expect], "100-continue")) {
      // The client waits for leave to send its body (curl does so past 1 KiB, for a second).
      static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      co_await net::async_write(*s, net::buffer(kContinue),
                                net::redirect_error(net::use_awaitable, ec));
    }
    if (!ec && !parser.is_done())
      co_await http::async_read(*s, buf, parser, net::redirect_error(net::use_awaitable, ec));
    if (ec == http::error::end_of_stream || ec == net::error::operation_aborted ||
        ec == beast::error::timeout || ec == net::error::eof || ec == net::error::connection_reset)
      break;
    s->expires_never();
    if (ec) {
      // A malformed or oversized request: say so, then close (the stream cannot be resynced).
      Request dummy;
      dummy.version(11);
      dummy.keep_alive(false);
      ApiError e;
      e.status = ec == http::error::body_limit ? 413 : 400;
      e.message = ec == http::error::body_limit
                      ? "the body is larger than " + std::to_string(opts.max_body_bytes) + " bytes"
                      : "malformed HTTP request: " + ec.message();
      co_await send_error(*s, dummy, e);
      break;
    }
    Request req = parser.release();
    if (!co_await handle(s, req)) break;
  }
  beast::error_code ec;
  s->socket().shutdown(tcp::socket::shutdown_both, ec);
  s->close();
  conns.erase(s);
}

net::awaitable<void> HttpGateway::Impl::accept_loop() {
  while (true) {
    beast::error_code ec;
    tcp::socket sock = co_await acceptor->async_accept(net::redirect_error(net::use_awaitable, ec));
    if (ec == net::error::operation_aborted || !acceptor->is_open()) co_return;
    if (ec) continue;
    auto s = std::make_shared<beast::tcp_stream>(std::move(sock));
    conns.insert(s);
    net::co_spawn(ioc, serve_connection(s), net::detached);
  }
}

// --- HttpGateway -----------------------------------------------------------------------------

HttpGateway::HttpGateway() : impl_(std::make_unique<Impl>()) {}

HttpGateway::~HttpGateway() { stop(); }

Result<std::unique_ptr<HttpGateway>> HttpGateway::start(actors::ClusterNode& node,
                                                        GatewayOptions opts) {
  if (!node.is_head()) return Error{1, "the HTTP gateway runs on the cluster's head node only"};
  std::unique_ptr<HttpGateway> g(new HttpGateway());
  Impl& im = *g->impl_;
  im.node = &node;
  im.served.model = node.model();
  if (const auto v = node.vision()) im.served.image_tokens = v->spec.n_image_tokens();
  im.served.id = opts.model_id;
  if (im.served.id.empty()) {
    std::filesystem::path p(im.served.model->path);
    while (p.has_parent_path() && p.filename().empty()) p = p.parent_path();
    im.served.id = p.filename().string();
  }
  if (!opts.chat_template.empty()) {
    if (auto st = set_chat_template(&im.served, opts.chat_template); !st)
      return Error{1, "--chat-template: " + st.error().message};
  } else if (auto st = set_chat_template(&im.served, im.served.model->chat_template); !st) {
    // Completions are still served; chats say why they are not.
    std::fprintf(stderr, "troupe serve: chat completions are refused: the model's %s\n",
                 st.error().message.c_str());
  }
  if (!opts.tool_call_parser.empty() &&
      !tool_format_by_name(opts.tool_call_parser, &im.served.tool_format))
    return Error{
        1, "--tool-call-parser: '" + opts.tool_call_parser + "' is none of " + tool_format_names()};
  if (!opts.reasoning_parser.empty()) {
    if (opts.reasoning_parser != "deepseek_r1" && opts.reasoning_parser != "qwen3" &&
        opts.reasoning_parser != "think")
      return Error{1, "--reasoning-parser: '" + opts.reasoning_parser +
                          "' is none of deepseek_r1, qwen3, think (all read <think>...</think>)"};
    im.served.reasoning = true;
  }
  im.served.max_model_len = opts.max_model_len;
  im.served.max_choices = opts.max_choices;
  im.opts = std::move(opts);
  im.opts.model_id = im.served.id;
  im.created = static_cast<int64_t>(std::time(nullptr));
  beast::error_code ec;
  const auto addr = net::ip::make_address(im.opts.host, ec);
  if (ec) return Error{1, "--http: '" + im.opts.host + "' is not an IP address"};
  im.acceptor = std::make_unique<tcp::acceptor>(im.ioc);
  const tcp::endpoint ep{addr, im.opts.port};
  im.acceptor->open(ep.protocol(), ec);
  if (!ec) im.acceptor->set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) im.acceptor->bind(ep, ec);
  if (!ec) im.acceptor->listen(net::socket_base::max_listen_connections, ec);
  if (ec)
    return Error{1, "cannot listen for HTTP on " + im.opts.host + ":" +
                        std::to_string(im.opts.port) + ": " + ec.message()};
  im.port = im.acceptor->local_endpoint().port();
  im.generation.node = im.node;
  im.generation.served = &im.served;
  im.generation.metrics = &im.metrics;
  im.generation.alive = im.alive;
  im.generation.ioc = &im.ioc;
  im.generation.request_timeout = im.opts.request_timeout;
  {
    std::lock_guard<std::mutex> lk(im.alive->mu);
    im.alive->ioc = &im.ioc;
  }
  net::co_spawn(im.ioc, im.accept_loop(), net::detached);
  im.io = std::thread([&im] {
    auto guard = net::make_work_guard(im.ioc);
    im.ioc.run();
  });
  return g;
}

uint16_t HttpGateway::port() const { return impl_->port; }
const std::string& HttpGateway::model_id() const { return impl_->served.id; }

void HttpGateway::stop() {
  Impl& im = *impl_;
  if (im.stopped) return;
  im.stopped = true;
  // Close the listener and the connections on the I/O thread: their coroutines end (cancelling
  // what they had in flight), then the context stops.
  // Callbacks of requests in flight post no more; the I/O thread stops; then the connections,
  // the listener and the context go, the context last: it destroys the coroutines still
  // suspended, whose InFlight guards cancel their requests.
  {
    std::lock_guard<std::mutex> lk(im.alive->mu);
    im.alive->ioc = nullptr;
  }
  im.ioc.stop();
  if (im.io.joinable()) im.io.join();
  beast::error_code ec;
  if (im.acceptor) im.acceptor->close(ec);
  for (const auto& s : im.conns) s->socket().close(ec);
  im.conns.clear();
  im.acceptor.reset();
  im.ioc_owner.reset();
}

}  // namespace troupe::serve
