// ClusterClient: requests to a head over the transport (see cluster_client.h).
#include "actors/cluster_client.h"

#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <mutex>

#include "actors/detail/control_wire.h"
#include "transport/transport.h"

namespace troupe::actors {

using namespace detail;

namespace {
// Clients do not take part in membership, so they do not know the cluster epoch; the head does
// not check it on client messages (their tags and its own request state say what is current).
constexpr uint64_t kClientEpoch = 1;
}  // namespace

struct ClusterClient::Impl {
  std::unique_ptr<transport::Transport> tx;
  transport::PeerId head = 0;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<transport::Message> inbox;
  bool head_down = false;
  std::string down_reason;
  uint64_t seq = 0;

  SendInfo send_info() {
    SendInfo s;
    s.sender = {0, ActorRole::kGateway, 0};
    s.seq = ++seq;
    return s;
  }

  Status send(ControlMsg kind, const Result<WireFrame>& f) {
    if (!f) return f.error();
    transport::OutMessage out;
    out.type = type_id(kind);
    out.parts = f->iov();
    out.keep_alive = f->keep_alive();
    return tx->send(head, std::move(out));
  }

  // The next message from the head, or false on timeout / a dead link.
  bool next(transport::Message* out, std::chrono::steady_clock::time_point deadline) {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait_until(lk, deadline, [&] { return !inbox.empty() || head_down; });
    if (inbox.empty()) return false;
    *out = std::move(inbox.front());
    inbox.pop_front();
    return true;
  }
};

ClusterClient::ClusterClient() : impl_(std::make_unique<Impl>()) {}
ClusterClient::~ClusterClient() = default;

Result<std::unique_ptr<ClusterClient>> ClusterClient::connect(const std::string& host,
                                                              uint16_t port,
                                                              const std::string& token,
                                                              std::chrono::milliseconds timeout) {
  std::unique_ptr<ClusterClient> c(new ClusterClient());
  Impl* im = c->impl_.get();
  transport::TransportOptions o;
  o.node_name = "client-" + std::to_string(getpid());
  o.cluster_token = token;
  o.listen_host = "";  // clients do not accept connections
  auto tx = transport::Transport::start(
      o,
      [im](transport::Message&& m) {
        std::lock_guard<std::mutex> lk(im->mu);
        im->inbox.push_back(std::move(m));
        im->cv.notify_all();
      },
      [im](transport::PeerId p, transport::PeerEvent e, const std::string&,
           const std::string& why) {
        if (e != transport::PeerEvent::kDown) return;
        std::lock_guard<std::mutex> lk(im->mu);
        if (p == im->head) {
          im->head_down = true;
          im->down_reason = why;
          im->cv.notify_all();
        }
      });
  if (!tx) return tx.error();
  im->tx = std::move(*tx);
  auto p = im->tx->connect(host, port, timeout);
  if (!p)
    return Error{1, "cannot reach the head at " + host + ":" + std::to_string(port) + ": " +
                        p.error().message};
  im->head = *p;
  return c;
}

std::vector<GenerateResult> ClusterClient::generate_many(const std::vector<GenerateRequest>& reqs,
                                                         size_t concurrency,
                                                         const StreamCallback& on_delta,
                                                         std::chrono::milliseconds timeout) {
  Impl& im = *impl_;
  std::vector<GenerateResult> results(reqs.size());
  std::vector<bool> finished(reqs.size(), false);
  if (concurrency == 0) concurrency = reqs.size();
  size_t next = 0, done = 0;
  auto fail = [&](size_t i, const std::string& why) {
    if (finished[i]) return;
    results[i].finish_reason = "error";
    results[i].error = why;
    finished[i] = true;
    ++done;
  };
  auto submit = [&](size_t i) {
    GenerateRequestMsg m;
    m.header.cluster_epoch = kClientEpoch;
    m.tag = i + 1;  // tag 0 is not used
    m.request = reqs[i];
    if (auto s = im.send(ControlMsg::kGenerateRequest, encode(m, im.send_info())); !s)
      fail(i, "cannot send the request to the head: " + s.error().message);
  };
  for (; next < reqs.size() && next < concurrency; ++next) submit(next);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (done < reqs.size()) {
    transport::Message m;
    if (!im.next(&m, deadline)) {
      const std::string why = im.head_down ? "lost the link to the head: " + im.down_reason
                                           : "no answer from the head within " +
                                                 std::to_string(timeout.count()) + " ms";
      for (size_t i = 0; i < reqs.size(); ++i) fail(i, why);
      break;
    }
    ControlMsg kind;
    if (!control_msg_of(m.type, &kind) || kind != ControlMsg::kGenerateEvent) continue;
    auto e = decode_generate_event(m.data(), {});
    if (!e) {
      // Not waited for in vain: the request it belongs to (when that much reads) fails with the
      // reason; its other events are ignored.
      const uint64_t tag = generate_event_tag(m.data(), {});
      if (tag == 0 || tag > reqs.size() || finished[tag - 1]) continue;
      fail(tag - 1, "the head sent a malformed event for this request: " + e.error().message);
      if (next < reqs.size()) submit(next++);
      continue;
    }
    if (e->tag == 0 || e->tag > reqs.size()) continue;
    const size_t i = e->tag - 1;
    if (finished[i]) continue;
    if (!e->finished) {
      if (on_delta) on_delta(i, e->delta, e->token);
      continue;
    }
    results[i] = std::move(e->result);
    finished[i] = true;
    ++done;
    if (next < reqs.size()) submit(next++);
  }
  return results;
}

Result<std::string> ClusterClient::status_json(std::chrono::milliseconds timeout) {
  return status(timeout, false);
}

Result<std::string> ClusterClient::status_text(std::chrono::milliseconds timeout) {
  return status(timeout, true);
}

Result<std::string> ClusterClient::status(std::chrono::milliseconds timeout, bool text) {
  Impl& im = *impl_;
  StatusRequestMsg r;
  r.header.cluster_epoch = kClientEpoch;
  if (auto s = im.send(ControlMsg::kStatusRequest, encode(r, im.send_info())); !s) return s.error();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  transport::Message m;
  while (im.next(&m, deadline)) {
    ControlMsg kind;
    if (!control_msg_of(m.type, &kind) || kind != ControlMsg::kStatusSnapshot) continue;
    auto s = decode_status_snapshot(m.data(), {});
    if (!s) return Error{1, "the head's status is malformed: " + s.error().message};
    return text ? detail::status_text(*s) : detail::status_json(*s);
  }
  return Error{1, im.head_down ? "lost the link to the head: " + im.down_reason
                               : "no status from the head within " +
                                     std::to_string(timeout.count()) + " ms"};
}

}  // namespace troupe::actors
