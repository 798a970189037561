// One generation request through the gateway (detail/gateway_io.h generate): its choices are
// submitted to the head; their callbacks (on actor threads) queue events under a lock and wake
// the request's coroutine through the I/O thread, which streams them as server-sent events or
// gathers them into one answer.
#include <cerrno>
#include <ctime>
#include <deque>
#include <optional>
#include <random>
#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange without it
#include <vector>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <sys/socket.h>

#include "actors/cluster_node.h"
#include "model/tokenizer.h"
#include "serve/detail/gateway_io.h"

namespace troupe::serve::detail {

namespace {

using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

struct Event {
  size_t choice = 0;
  bool finished = false;
  std::string delta;
  int32_t token = -1;
  bool has_logprob = false;  // the request wants logprobs and this piece is a token's
  TokenLogprob logprob;
  actors::GenerateResult result;
};

// One request's choices in flight: filled by callbacks, drained by its coroutine. The callbacks
// may outlive the coroutine (and the gateway): they hold this, never the coroutine's timer, which
// `wake` points to only while the coroutine may wait on it.
struct Exchange {
  std::mutex mu;
  std::deque<Event> events;
  net::steady_timer* wake = nullptr;
};

// The coroutine's side of an Exchange: its timer registered for wake-ups, and, when the coroutine
// ends early (the client left, the time ran out, the gateway stopped and destroyed it), its
// unfinished choices cancelled.
struct InFlight {
  actors::ClusterNode* node;
  std::shared_ptr<Exchange> ex;
  std::vector<uint64_t> ids;
  std::vector<bool> done;
  InFlight(actors::ClusterNode* n, std::shared_ptr<Exchange> e, net::steady_timer* t)
      : node(n), ex(std::move(e)) {
    std::lock_guard<std::mutex> lk(ex->mu);
    ex->wake = t;
  }
  ~InFlight() {
    {
      std::lock_guard<std::mutex> lk(ex->mu);
      ex->wake = nullptr;
    }
    for (size_t i = 0; i < ids.size(); ++i)
      if (!done[i]) node->cancel(ids[i]);
  }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;
};

// Watches an idle connection while a whole (not streamed) answer is computed: a client that
// closes it meanwhile has its request cancelled, as a streamed one is when a write fails. Bytes
// that arrive instead (a pipelined request) end the watch: they are the next read's. (A client
// that half-closes after its request reads as gone.)
struct HangUpWatch {
  bool done = false;  // the answer is being written: stop watching
  bool gone = false;  // the client closed the connection
};

net::awaitable<void> watch_hang_up(std::shared_ptr<beast::tcp_stream> sp,
                                   std::shared_ptr<HangUpWatch> w, std::shared_ptr<Exchange> ex) {
  beast::error_code ec;
  co_await sp->socket().async_wait(tcp::socket::wait_read,
                                   net::redirect_error(net::use_awaitable, ec));
  if (w->done || ec) co_return;
  char c;
  const ssize_t n = ::recv(sp->socket().native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))) co_return;
  w->gone = true;
  std::lock_guard<std::mutex> lk(ex->mu);
  if (ex->wake) ex->wake->cancel();
}

// The error a failed choice answers with: overload and a cluster that does not serve are 503s
// (the client may retry), the rest 500s.
ApiError result_error(const actors::GenerateResult& r, int* retry_after_s) {
  ApiError e;
  e.message = r.error.empty() ? "the request failed" : r.error;
  const bool unavailable = r.finish_reason == "overloaded" ||
                           r.error.rfind("the cluster is not serving", 0) == 0 ||
                           r.error.rfind("the cluster is shutting down", 0) == 0;
  e.status = unavailable ? 503 : 500;
  e.type = unavailable ? "service_unavailable" : "server_error";
  *retry_after_s = unavailable ? 1 : 0;
  return e;
}

ApiError timeout_error(std::chrono::milliseconds limit) {
  ApiError e;
  e.status = 504;
  e.type = "timeout";
  e.message = "the request did not finish within " + std::to_string(limit.count()) + " ms";
  return e;
}

std::string random_id(const char* prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  char b[40];
  std::snprintf(b, sizeof b, "%s%016llx", prefix, static_cast<unsigned long long>(rng()));
  return b;
}

// A parsed request from submission to its answer; lives in generate()'s coroutine frame.
class Generation {
 public:
  Generation(const GenerationContext& ctx, std::shared_ptr<beast::tcp_stream> sp,
             const Request& req, ApiRequest ar)
      : ctx_(ctx),
        sp_(std::move(sp)),
        req_(req),
        ar_(std::move(ar)),
        ep_(ar_.endpoint),
        n_(ar_.choices.size()),
        timer_(*ctx.ioc),
        fl_(ctx.node, ex_, &timer_),
        results_(n_),
        first_(n_, true),
        got_token_(n_, false),
        logprobs_(ar_.logprobs >= 0 ? n_ : 0),
        text_len_(n_, 0),
        last_token_(n_, t0_) {
    if (ar_.stream && ar_.reply.active())
      for (size_t i = 0; i < n_; ++i)
        replies_.emplace_back(*ctx_.served->model->tokenizer, ar_.reply);
  }

  // Hands every choice to the head; an error (the node cannot take requests) answers at once.
  std::optional<ApiError> submit();
  // Streams or gathers the answer; false: close the connection after it.
  net::awaitable<bool> run();

 private:
  actors::RequestCallbacks callbacks(size_t i);
  net::awaitable<bool> write_event(const std::string& data);
  net::awaitable<void> begin_stream();
  net::awaitable<void> take(Event& e);
  net::awaitable<bool> end_stream();
  net::awaitable<bool> answer_whole();
  const std::string& model_id() const { return ctx_.served->id; }

  const GenerationContext& ctx_;
  std::shared_ptr<beast::tcp_stream> sp_;
  const Request& req_;
  ApiRequest ar_;
  Endpoint ep_;
  size_t n_;
  Clock::time_point t0_ = Clock::now();
  std::shared_ptr<Exchange> ex_ = std::make_shared<Exchange>();
  net::steady_timer timer_;  // before fl_: fl_ unregisters it before it goes
  InFlight fl_;
  std::string id_ = random_id(ep_ == Endpoint::kChat ? "chatcmpl-" : "cmpl-");
  int64_t created_ = static_cast<int64_t>(std::time(nullptr));
  std::vector<actors::GenerateResult> results_;
  std::vector<bool> first_;                          // no chunk of the choice streamed yet
  std::vector<bool> got_token_;                      // no token of the choice seen yet
  std::vector<std::vector<TokenLogprob>> logprobs_;  // whole answers: per choice
  std::vector<size_t> text_len_;                     // bytes of each choice's text so far
  std::vector<Clock::time_point> last_token_;
  // Streamed chats whose replies are split (tools, reasoning): each choice's reply decoded with
  // its markers, split as it arrives (what may begin </think> or a call is held back).
  struct SplitStream {
    SplitStream(const model::Tokenizer& tok, ReplyFormat f)
        : decoder(tok, /*render_special=*/true), split(f) {}
    model::StreamDecoder decoder;
    ReplyStream split;
  };
  std::vector<SplitStream> replies_;
  size_t remaining_ = n_;
  bool ok_ = true;  // the connection still works
  bool timed_out_ = false;
  std::shared_ptr<HangUpWatch> hang_up_ = std::make_shared<HangUpWatch>();
  http::response<http::empty_body> head_{http::status::ok, req_.version()};
  http::response_serializer<http::empty_body> sr_{head_};
};

actors::RequestCallbacks Generation::callbacks(size_t i) {
  auto wake = [ex = ex_, a = ctx_.alive](Event e) {
    {
      std::lock_guard<std::mutex> lk(ex->mu);
      ex->events.push_back(std::move(e));
    }
    std::lock_guard<std::mutex> lk(a->mu);
    if (a->ioc)
      net::post(*a->ioc, [ex] {
        std::lock_guard<std::mutex> lk2(ex->mu);
        if (ex->wake) ex->wake->cancel();
      });
  };
  actors::RequestCallbacks cb;
  cb.on_piece = [wake, i, top_n = ar_.logprobs](const std::string& delta, int32_t token,
                                                const std::vector<float>& logits) {
    Event e;
    e.choice = i;
    e.delta = delta;
    e.token = token;
    if (top_n >= 0 && token >= 0 && !logits.empty()) {
      // Here, on the actor's thread: the row is not copied, only its summary kept.
      e.has_logprob = true;
      e.logprob = token_logprob(logits, token, top_n);
    }
    wake(std::move(e));
  };
  cb.on_finish = [wake, i](const actors::GenerateResult& r) {
    Event e;
    e.choice = i;
    e.finished = true;
    e.result = r;
    wake(std::move(e));
  };
  return cb;
}

std::optional<ApiError> Generation::submit() {
  for (size_t i = 0; i < n_; ++i) {
    auto id = ctx_.node->submit(ar_.choices[i], callbacks(i));
    if (!id) {
      ApiError e;
      e.status = 503;
      e.type = "service_unavailable";
      e.message = id.error().message;
      return e;  // those submitted are cancelled by fl_
    }
    fl_.ids.push_back(*id);
    fl_.done.push_back(false);
  }
  return std::nullopt;
}

net::awaitable<bool> Generation::write_event(const std::string& data) {
  beast::error_code ec;
  const std::string frame = "data: " + data + "\n\n";
  co_await net::async_write(*sp_, http::make_chunk(net::buffer(frame)),
                            net::redirect_error(net::use_awaitable, ec));
  co_return !ec;
}

net::awaitable<void> Generation::begin_stream() {
  head_.set(http::field::server, "troupe");
  head_.set(http::field::content_type, "text/event-stream");
  head_.set(http::field::cache_control, "no-cache");
  head_.keep_alive(req_.keep_alive());
  head_.chunked(true);
  beast::error_code ec;
  co_await http::async_write_header(*sp_, sr_, net::redirect_error(net::use_awaitable, ec));
  ok_ = !ec;
  ctx_.metrics->count_status(200);
  for (size_t i = 0; ok_ && i < ar_.echo_text.size(); ++i)
    ok_ = co_await write_event(
        chunk_body(ep_, id_, created_, model_id(), i, ar_.echo_text[i], false, ""));
}

net::awaitable<void> Generation::take(Event& e) {
  const size_t i = e.choice;
  GatewayMetrics& m = *ctx_.metrics;
  if (fl_.done[i]) co_return;
  if (!e.finished) {
    const auto now = Clock::now();
    if (!got_token_[i])
      m.ttft.observe(std::chrono::duration<double>(now - t0_).count());
    else
      m.per_token.observe(std::chrono::duration<double>(now - last_token_[i]).count());
    got_token_[i] = true;
    last_token_[i] = now;
    std::string reasoning;
    if (!replies_.empty() && e.token >= 0) {  // split: reasoning, and content that is not a call
      SplitStream& t = replies_[i];
      ReplyStream::Delta d = t.split.push(t.decoder.push(e.token));
      e.delta = std::move(d.content);
      reasoning = std::move(d.reasoning);
    }
    if (ar_.stream && ok_ && (!e.delta.empty() || !reasoning.empty() || e.has_logprob)) {
      const size_t offset = text_len_[i] + (i < ar_.echo_text.size() ? ar_.echo_text[i].size() : 0);
      // Built before the co_await: g++ 12 miscompiles an initializer list inside one.
      std::string lp_json;
      if (e.has_logprob) {
        std::vector<TokenLogprob> one(1, e.logprob);
        lp_json = logprobs_json(ep_, ctx_.served->model->tokenizer.get(), one, offset);
      }
      std::string chunk =
          chunk_body(ep_, id_, created_, model_id(), i, e.delta, first_[i], "", lp_json, reasoning);
      ok_ = co_await write_event(chunk);
      first_[i] = false;
    } else if (e.has_logprob) {
      logprobs_[i].push_back(std::move(e.logprob));
    }
    text_len_[i] += e.delta.size();
    co_return;
  }
  fl_.done[i] = true;
  --remaining_;
  results_[i] = std::move(e.result);
  const std::string reason = api_finish_reason(results_[i]);
  m.count_finish(reason);
  m.prompt_tokens += results_[i].prompt_tokens.size();
  if (!ar_.stream || !ok_) co_return;
  int retry = 0;
  std::string finish = reason;
  if (!replies_.empty() && results_[i].ok()) {
    // The reply is whole: what was held back goes out as content or reasoning, and the calls.
    SplitStream& t = replies_[i];
    const ReplyStream::Delta last = t.split.push(t.decoder.flush());
    const ReplyStream::End end = t.split.finish();
    const std::string rest = last.content + end.rest.content;
    const std::string rest_reasoning = last.reasoning + end.rest.reasoning;
    if (!rest.empty() || !rest_reasoning.empty()) {
      std::string chunk =
          chunk_body(ep_, id_, created_, model_id(), i, rest, first_[i], "", "", rest_reasoning);
      ok_ = co_await write_event(chunk);
      first_[i] = false;
    }
    if (ok_ && !end.calls.empty()) {
      std::string chunk = tool_calls_chunk_body(id_, created_, model_id(), i, end.calls, first_[i]);
      ok_ = co_await write_event(chunk);
      first_[i] = false;
      finish = "tool_calls";
    }
    if (!ok_) co_return;
  }
  std::string data = results_[i].ok()
                         ? chunk_body(ep_, id_, created_, model_id(), i, "", first_[i], finish)
                         : error_body(result_error(results_[i], &retry));
  ok_ = co_await write_event(data);
}

net::awaitable<bool> Generation::end_stream() {
  if (!ok_) co_return false;
  if (timed_out_) ok_ = co_await write_event(error_body(timeout_error(ctx_.request_timeout)));
  if (ok_ && ar_.include_usage)
    ok_ = co_await write_event(usage_chunk_body(ep_, id_, created_, model_id(), results_));
  if (ok_) ok_ = co_await write_event("[DONE]");
  beast::error_code ec;
  if (ok_)
    co_await net::async_write(*sp_, http::make_chunk_last(),
                              net::redirect_error(net::use_awaitable, ec));
  co_return ok_ && !ec && req_.keep_alive();
}

net::awaitable<bool> Generation::answer_whole() {
  GatewayMetrics& m = *ctx_.metrics;
  if (hang_up_->gone) co_return false;
  if (timed_out_) co_return co_await send_error(*sp_, req_, timeout_error(ctx_.request_timeout), m);
  for (const auto& r : results_)
    if (!r.ok()) {
      int retry = 0;
      const ApiError e = result_error(r, &retry);
      co_return co_await send_error(*sp_, req_, e, m, retry);
    }
  std::string body = response_body(ar_, id_, created_, model_id(), results_, logprobs_,
                                   ctx_.served->model->tokenizer.get());
  co_return co_await send(*sp_, req_, http::status::ok, std::move(body), "application/json", 0, m);
}

net::awaitable<bool> Generation::run() {
  GatewayMetrics& m = *ctx_.metrics;
  ++m.in_flight;
  if (ar_.stream)
    co_await begin_stream();
  else
    net::co_spawn(*ctx_.ioc, watch_hang_up(sp_, hang_up_, ex_), net::detached);
  const auto deadline = t0_ + ctx_.request_timeout;
  while (remaining_ > 0 && ok_ && !hang_up_->gone) {
    std::deque<Event> batch;
    {
      std::lock_guard<std::mutex> lk(ex_->mu);
      batch.swap(ex_->events);
    }
    if (batch.empty()) {
      if (Clock::now() >= deadline) {
        timed_out_ = true;
        break;
      }
      beast::error_code ec;
      timer_.expires_at(deadline);
      co_await timer_.async_wait(net::redirect_error(net::use_awaitable, ec));
      continue;
    }
    for (Event& e : batch) co_await take(e);
  }
  if (!ar_.stream && !hang_up_->gone) {
    hang_up_->done = true;
    beast::error_code ec;
    sp_->socket().cancel(ec);  // ends the watch's wait
  }
  --m.in_flight;
  // Choices not done (the client left, the time ran out) are cancelled by fl_ as it ends.
  for (size_t i = 0; i < n_; ++i)
    if (!fl_.done[i]) m.count_finish("cancelled");
  m.e2e.observe(std::chrono::duration<double>(Clock::now() - t0_).count());
  // Not one co_await of a conditional expression: g++ 12 miscompiles that.
  if (ar_.stream) co_return co_await end_stream();
  co_return co_await answer_whole();
}

}  // namespace

net::awaitable<bool> generate(const GenerationContext& ctx, std::shared_ptr<beast::tcp_stream> sp,
                              const Request& req, Endpoint ep) {
  ApiRequest ar;
  ApiError err;
  if (!parse_request(ep, req.body(), *ctx.served, &ar, &err))
    co_return co_await send_error(*sp, req, err, *ctx.metrics);
  Generation g(ctx, sp, req, std::move(ar));
  if (auto e = g.submit()) co_return co_await send_error(*sp, req, *e, *ctx.metrics, 1);
  co_return co_await g.run();
}

}  // namespace troupe::serve::detail
