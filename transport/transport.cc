// Transport over UCX UCP (see transport.h). One progress thread owns the worker: it runs queued
// commands (connect, send, close), UCX progress and callbacks, timers (auth deadlines, delayed
// faults, connect timeouts), then delivers received messages to the handler outside the lock,
// and sleeps on the worker's event fd plus an eventfd that other threads signal.
//
// Wire: every UCX active message carries a 16-byte header {magic, version, type}. AM ids:
// hello (client -> server: name, nonce, proof), hello-ack (server: name, proof of the nonce),
// hello-nack (server: why it refused), data (authenticated peers only), bye (orderly close).
#include "transport/transport.h"

#include <netdb.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <queue>
#include <thread>
#include <unordered_map>

#include <arpa/inet.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <ucp/api/ucp.h>

#include "transport/auth.h"
#include "transport/detail/buffer_pool.h"
#include "transport/detail/checksum.h"

namespace troupe::transport {

using detail::BufferPool;
using detail::Checksum;
using detail::checksum;

namespace {

constexpr uint32_t kMagic = 0x50525254;  // "TRRP" little-endian
constexpr uint32_t kWireVersion = 4;  // 2: CRC-32C of the payload; 3: link id and key; 4: 8-lane sum
enum AmId : unsigned {
  kAmHello = 1,
  kAmHelloAck = 2,
  kAmHelloNack = 3,
  kAmData = 4,
  kAmBye = 5,
  kAmByeAck = 6,
};
constexpr size_t kNonceBytes = 32;
constexpr size_t kMaxNameBytes = 256;
constexpr std::string_view kHelloLabel = "troupe-hello";
constexpr std::string_view kHelloReplyLabel = "troupe-hello-reply";
constexpr std::chrono::milliseconds kByeTimeout{1000};  // wait this long for a bye's answer

struct WireHeader {
  uint32_t magic = kMagic;
  uint32_t version = kWireVersion;
  uint64_t type = 0;
  uint64_t sum = 0;  // checksum of the payload: a corrupted message is dropped, never delivered
  // The receiver's own id and key of this link (told in the handshake): how it finds the peer a
  // message comes from without asking UCX for the sending endpoint, which UCX 1.13 resolves
  // fatally when that endpoint is gone (seen at shutdown with several workers in one process).
  uint64_t link = 0;
  uint64_t key = 0;
};
static_assert(sizeof(WireHeader) == 40);

using Clock = std::chrono::steady_clock;

std::span<const uint8_t> as_bytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// Little helpers for the handshake payloads: [u16 name length][name][32 nonce or proof]...
void put_name(std::vector<uint8_t>& out, const std::string& name) {
  const uint16_t n = static_cast<uint16_t>(name.size());
  out.push_back(static_cast<uint8_t>(n & 0xff));
  out.push_back(static_cast<uint8_t>(n >> 8));
  out.insert(out.end(), name.begin(), name.end());
}
// A link's (id, key) as the peer must put them in the headers it sends us.
void append_link(std::vector<uint8_t>& out, uint64_t id, uint64_t key) {
  const auto* a = reinterpret_cast<const uint8_t*>(&id);
  const auto* b = reinterpret_cast<const uint8_t*>(&key);
  out.insert(out.end(), a, a + 8);
  out.insert(out.end(), b, b + 8);
}

bool get_name(std::span<const uint8_t>& in, std::string* name) {
  if (in.size() < 2) return false;
  const size_t n = in[0] | (static_cast<size_t>(in[1]) << 8);
  if (n == 0 || n > kMaxNameBytes || in.size() < 2 + n) return false;
  name->assign(reinterpret_cast<const char*>(in.data() + 2), n);
  in = in.subspan(2 + n);
  return true;
}

std::string sockaddr_string(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = {0};
  uint16_t port = 0;
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    port = ntohs(a->sin6_port);
  }
  return std::string(host) + ":" + std::to_string(port);
}

bool is_loopback(const sockaddr_storage& ss) {
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    return (ntohl(a->sin_addr.s_addr) >> 24) == 127;
  }
  if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    return IN6_IS_ADDR_LOOPBACK(&a->sin6_addr);
  }
  return false;
}

}  // namespace

size_t OutMessage::size_bytes() const {
  size_t n = 0;
  for (const auto& p : parts) n += p.size();
  return n;
}

OutMessage copy_message(uint64_t type, std::span<const uint8_t> bytes) {
  auto buf = std::make_shared<std::vector<uint8_t>>(bytes.begin(), bytes.end());
  OutMessage m;
  m.type = type;
  m.parts.push_back({buf->data(), buf->size()});
  m.keep_alive = std::move(buf);
  return m;
}

struct Transport::Impl {
  struct Peer {
    PeerId id = 0;
    ucp_ep_h ep = nullptr;
    bool client = false;     // we connected to it
    bool up = false;         // authenticated
    bool down = false;       // closed or failed; waiting to be forgotten
    bool bye_sent = false;   // we said goodbye and wait for its answer before closing
    uint64_t key = 0;        // ours: messages to us on this link carry (id, key)
    uint64_t remote_id = 0;  // theirs: what we put in the headers we send
    uint64_t remote_key = 0;
    std::array<uint8_t, kNonceBytes> nonce{};  // client: the nonce of our hello
    Clock::time_point since;
    std::shared_ptr<std::promise<Result<PeerId>>> waiter;  // client: connect() waiting
    LinkStats stats;
  };
  struct SendCtx {
    Impl* im = nullptr;
    PeerId peer = 0;
    WireHeader header;
    std::vector<ucp_dt_iov_t> iov;
    std::shared_ptr<const void> keep_alive;
  };
  struct RecvCtx {
    Impl* im = nullptr;
    Message msg;
    uint64_t sum = 0;  // the sender's checksum of the payload
  };
  struct Timer {
    Clock::time_point at;
    uint64_t order = 0;
    std::function<void()> fn;
    bool operator>(const Timer& o) const { return at != o.at ? at > o.at : order > o.order; }
  };

  TransportOptions opts;
  std::shared_ptr<BufferPool> pool = std::make_shared<BufferPool>();
  MessageHandler on_message;
  PeerHandler on_peer;
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  ucp_listener_h listener = nullptr;
  uint16_t port = 0;
  int event_fd = -1, epoll_fd = -1, worker_fd = -1;
  std::thread thread;
  std::atomic<bool> stop{false};
  // True while the progress thread is about to wait (or waits) on epoll: only then does post()
  // write the eventfd. A write per message costs a syscall and, on shared cores, a wake-up.
  std::atomic<bool> sleeping{false};

  // Guarded by mu: peers, stats, the shim. The progress thread holds it while it works.
  mutable std::mutex mu;
  std::map<PeerId, Peer> peers;
  std::unordered_map<ucp_ep_h, PeerId> by_ep;
  PeerId next_peer = 1;
  uint64_t auth_failures = 0, unauth_dropped = 0, accepted = 0;
  FaultShim shim;
  bool faults_on = false;

  // Progress-thread only.
  std::priority_queue<Timer, std::vector<Timer>, std::greater<>> timers;
  uint64_t timer_order = 0;
  std::vector<Message> deliveries;  // received, waiting for the handler (outside the lock)
  struct Event {
    PeerId peer;
    PeerEvent ev;
    std::string name, reason;
  };
  std::vector<Event> events;
  std::vector<void*> closing;  // ucp_ep_close_nbx requests still in flight

  std::mutex cmd_mu;
  std::deque<std::function<void()>> commands;

  // --- setup ------------------------------------------------------------------------------

  Status init() {
    ucp_config_t* config = nullptr;
    if (ucs_status_t s = ucp_config_read(nullptr, nullptr, &config); s != UCS_OK)
      return Error{1, std::string("UCX: cannot read its configuration: ") + ucs_status_string(s)};
    Status st = Ok{};
    if (!opts.tls.empty() && ucp_config_modify(config, "TLS", opts.tls.c_str()) != UCS_OK)
      st = Error{1, "UCX: bad transport list (UCX_TLS) '" + opts.tls + "'"};
    if (st && !opts.net_devices.empty() &&
        ucp_config_modify(config, "NET_DEVICES", opts.net_devices.c_str()) != UCS_OK)
      st = Error{1, "UCX: bad device list (UCX_NET_DEVICES) '" + opts.net_devices + "'"};
    if (st) {
      ucp_params_t params{};
      params.field_mask = UCP_PARAM_FIELD_FEATURES;
      params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
      if (ucs_status_t s = ucp_init(&params, config, &context); s != UCS_OK)
        st = Error{1, std::string("UCX: ucp_init failed: ") + ucs_status_string(s)};
    }
    ucp_config_release(config);
    if (!st) return st;
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;  // only the progress thread touches it
    if (ucs_status_t s = ucp_worker_create(context, &wp, &worker); s != UCS_OK)
      return Error{1, std::string("UCX: cannot create a worker: ") + ucs_status_string(s)};
    for (unsigned id : {kAmHello, kAmHelloAck, kAmHelloNack, kAmData, kAmBye, kAmByeAck}) {
      ucp_am_handler_param_t hp{};
      hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                      UCP_AM_HANDLER_PARAM_FIELD_ARG;
      hp.id = id;
      hp.arg = this;
      switch (id) {
        case kAmHello:
          hp.cb = &Impl::am_hello;
          break;
        case kAmHelloAck:
          hp.cb = &Impl::am_hello_ack;
          break;
        case kAmHelloNack:
          hp.cb = &Impl::am_hello_nack;
          break;
        case kAmData:
          hp.cb = &Impl::am_data;
          break;
        default:
          hp.cb = &Impl::am_bye;
          break;
      }
      if (ucs_status_t s = ucp_worker_set_am_recv_handler(worker, &hp); s != UCS_OK)
        return Error{1, std::string("UCX: cannot set a message handler: ") + ucs_status_string(s)};
    }
    if (ucs_status_t s = ucp_worker_get_efd(worker, &worker_fd); s != UCS_OK)
      return Error{1, std::string("UCX: no worker event fd: ") + ucs_status_string(s)};
    event_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    if (event_fd < 0 || epoll_fd < 0) return Error{1, "transport: cannot create eventfd/epoll"};
    for (int fd : {worker_fd, event_fd}) {
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.fd = fd;
      if (epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0)
        return Error{1, "transport: epoll_ctl failed"};
    }
    if (!opts.listen_host.empty()) return start_listener();
    return Ok{};
  }

  Status start_listener() {
    sockaddr_storage ss{};
    if (auto r = resolve(opts.listen_host, opts.listen_port, &ss); !r) return r;
    ucp_listener_params_t lp{};
    lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&ss);
    lp.sockaddr.addrlen = ss.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
    lp.conn_handler.cb = &Impl::on_conn_request;
    lp.conn_handler.arg = this;
    if (ucs_status_t s = ucp_listener_create(worker, &lp, &listener); s != UCS_OK)
      return Error{1, "transport: cannot listen on " + opts.listen_host + ":" +
                          std::to_string(opts.listen_port) + ": " + ucs_status_string(s) +
                          " (the listener needs tcp in UCX_TLS)"};
    ucp_listener_attr_t la{};
    la.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    if (ucp_listener_query(listener, &la) == UCS_OK) {
      if (la.sockaddr.ss_family == AF_INET)
        port = ntohs(reinterpret_cast<const sockaddr_in*>(&la.sockaddr)->sin_port);
      else if (la.sockaddr.ss_family == AF_INET6)
        port = ntohs(reinterpret_cast<const sockaddr_in6*>(&la.sockaddr)->sin6_port);
    }
    return Ok{};
  }

  static Status resolve(const std::string& host, uint16_t port, sockaddr_storage* out) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    addrinfo* res = nullptr;
    const std::string service = std::to_string(port);
    if (int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &res); rc != 0 || !res)
      return Error{1, "cannot resolve host '" + host + "': " + gai_strerror(rc)};
    std::memcpy(out, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    return Ok{};
  }

  ucp_err_handling_mode_t err_mode_for(const sockaddr_storage& ss) const {
    switch (opts.error_mode) {
      case ErrorMode::kPeer:
        return UCP_ERR_HANDLING_MODE_PEER;
      case ErrorMode::kNone:
        return UCP_ERR_HANDLING_MODE_NONE;
      case ErrorMode::kAuto:
        break;
    }
    return is_loopback(ss) ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER;
  }

  // --- the progress thread ----------------------------------------------------------------

  void signal() {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(event_fd, &one, sizeof(one));
  }

  void post(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lk(cmd_mu);
      commands.push_back(std::move(fn));
    }
    // Pairs with the loop's store to `sleeping` before it looks at `commands` (both seq_cst):
    // either the loop sees this command, or this sees sleeping == true and wakes it.
    if (sleeping.load()) signal();
  }

  // Announces that the loop will wait; false (and not sleeping) when a command came in.
  bool prepare_to_sleep() {
    sleeping.store(true);
    std::lock_guard<std::mutex> ck(cmd_mu);
    if (commands.empty()) return true;
    sleeping.store(false, std::memory_order_relaxed);
    return false;
  }

  void add_timer(std::chrono::milliseconds after, std::function<void()> fn) {
    timers.push({Clock::now() + after, timer_order++, std::move(fn)});
  }

  void loop() {
    auto last_activity = Clock::now();
    auto next_auth_check = Clock::now();
    while (!stop.load(std::memory_order_acquire)) {
      bool busy = false;
      {
        std::unique_lock<std::mutex> lk(mu);
        std::deque<std::function<void()>> cmds;
        {
          std::lock_guard<std::mutex> ck(cmd_mu);
          cmds.swap(commands);
        }
        busy = !cmds.empty();
        for (auto& c : cmds) c();
        const auto now = Clock::now();
        while (!timers.empty() && timers.top().at <= now) {
          auto fn = timers.top().fn;
          timers.pop();
          fn();
          busy = true;
        }
        if (now >= next_auth_check) {
          check_auth_deadlines(now);
          next_auth_check = now + std::chrono::milliseconds(50);
        }
        while (ucp_worker_progress(worker) != 0) busy = true;
        reap_closing();
      }
      busy |= deliver();
      const auto now = Clock::now();
      if (busy) {
        last_activity = now;
        continue;
      }
      if (opts.spin.count() > 0 && now - last_activity < opts.spin) continue;
      if (!prepare_to_sleep()) continue;
      {
        std::lock_guard<std::mutex> lk(mu);
        if (ucp_worker_arm(worker) == UCS_ERR_BUSY) {
          sleeping.store(false, std::memory_order_relaxed);
          continue;
        }
      }
      int timeout_ms = 100;
      {
        std::lock_guard<std::mutex> lk(mu);
        if (!timers.empty()) {
          const auto d =
              std::chrono::duration_cast<std::chrono::milliseconds>(timers.top().at - now);
          timeout_ms = static_cast<int>(std::clamp<int64_t>(d.count() + 1, 0, 100));
        }
      }
      epoll_event evs[2];
      const int n = epoll_wait(epoll_fd, evs, 2, timeout_ms);
      sleeping.store(false, std::memory_order_relaxed);
      for (int i = 0; i < n; ++i)
        if (evs[i].data.fd == event_fd) {
          uint64_t v = 0;
          [[maybe_unused]] ssize_t r = read(event_fd, &v, sizeof(v));
        }
    }
    shutdown();
  }

  // Calls the handlers with what the last round received, outside the lock.
  bool deliver() {
    std::vector<Message> msgs;
    std::vector<Event> evs;
    {
      std::lock_guard<std::mutex> lk(mu);
      msgs.swap(deliveries);
      evs.swap(events);
    }
    for (auto& e : evs)
      if (on_peer) on_peer(e.peer, e.ev, e.name, e.reason);
    for (auto& m : msgs) {
      try {
        on_message(std::move(m));
      } catch (const std::exception& e) {
        std::fprintf(stderr, "troupe: transport: message handler threw: %s\n", e.what());
      }
    }
    return !msgs.empty() || !evs.empty();
  }

  void shutdown() {
    std::unique_lock<std::mutex> lk(mu);
    // Sends queued before the destructor still go out, ahead of the goodbyes.
    std::deque<std::function<void()>> cmds;
    {
      std::lock_guard<std::mutex> ck(cmd_mu);
      cmds.swap(commands);
    }
    for (auto& c : cmds) c();
    for (auto& [id, p] : peers)
      if (!p.down && !p.bye_sent) say_goodbye(p, "transport shutting down");
    // Wait for the goodbyes' answers (every message sent before them was received), then for
    // the endpoints to close.
    const auto deadline = Clock::now() + kByeTimeout + std::chrono::seconds(1);
    auto pending = [&] {
      if (!closing.empty()) return true;
      for (auto& [id, p] : peers)
        if (p.bye_sent && p.ep) return true;
      return false;
    };
    while (pending() && Clock::now() < deadline) {
      ucp_worker_progress(worker);
      reap_closing();
    }
    for (auto& [id, p] : peers)
      if (p.ep) close_peer(p, "transport shutting down", /*flush=*/false);
    for (void* r : closing) ucp_request_free(r);
    closing.clear();
    if (listener) ucp_listener_destroy(listener);
    listener = nullptr;
  }

  // --- peers ------------------------------------------------------------------------------

  Peer* peer_of(ucp_ep_h ep) {
    auto it = by_ep.find(ep);
    if (it == by_ep.end()) return nullptr;
    auto pit = peers.find(it->second);
    return pit == peers.end() ? nullptr : &pit->second;
  }

  Peer& add_peer(ucp_ep_h ep, bool client, const std::string& address) {
    const PeerId id = next_peer++;
    Peer& p = peers[id];
    p.id = id;
    p.ep = ep;
    p.client = client;
    p.since = Clock::now();
    p.stats.peer = id;
    p.stats.address = address;
    random_bytes({reinterpret_cast<uint8_t*>(&p.key), sizeof(p.key)});
    by_ep[ep] = id;
    return p;
  }

  // Marks a peer down, tells the handler (if it was up) and closes its endpoint: flushing what
  // was sent (an answer to a goodbye), or at once (a failed or refused peer).
  void close_peer(Peer& p, const std::string& reason, bool flush) {
    if (!p.down) {
      p.down = true;
      const bool was_up = p.up;
      p.up = false;
      p.stats.up = false;
      if (p.waiter) {
        p.waiter->set_value(Error{1, reason});
        p.waiter.reset();
      }
      if (was_up) events.push_back({p.id, PeerEvent::kDown, p.stats.name, reason});
    }
    if (!p.ep) return;
    ucp_request_param_t prm{};
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags = flush ? 0 : UCP_EP_CLOSE_FLAG_FORCE;
    by_ep.erase(p.ep);
    void* req = ucp_ep_close_nbx(p.ep, &prm);
    if (req && !UCS_PTR_IS_ERR(req)) closing.push_back(req);
    p.ep = nullptr;
  }

  // An orderly close: the peer is down for us at once (no more sends), the goodbye goes after
  // every message sent before it, and the endpoint closes when the peer answers it — so the
  // peer has taken in everything we sent — or after kByeTimeout.
  void say_goodbye(Peer& p, const std::string& reason) {
    if (p.down) return;
    if (!p.up) return close_peer(p, reason, false);
    p.bye_sent = true;
    post_am(p, kAmBye, WireHeader{}, {}, nullptr);
    const PeerId id = p.id;
    const std::string why = reason;
    // Down for the handler now; the endpoint stays until the answer.
    p.up = false;
    p.stats.up = false;
    p.down = true;
    events.push_back({p.id, PeerEvent::kDown, p.stats.name, reason});
    add_timer(kByeTimeout, [this, id] {
      auto it = peers.find(id);
      if (it != peers.end() && it->second.ep) close_peer(it->second, "no answer to goodbye", false);
    });
  }

  void reap_closing() {
    for (size_t i = 0; i < closing.size();) {
      if (ucp_request_check_status(closing[i]) != UCS_INPROGRESS) {
        ucp_request_free(closing[i]);
        closing[i] = closing.back();
        closing.pop_back();
      } else {
        ++i;
      }
    }
  }

  void check_auth_deadlines(Clock::time_point now) {
    for (auto& [id, p] : peers) {
      if (p.down || p.up || now - p.since < opts.auth_timeout) continue;
      if (p.client) {
        // connect() has its own timeout; this only catches a waiter that outlived it.
        continue;
      }
      ++auth_failures;
      std::fprintf(stderr, "troupe: transport: refused peer at %s: no hello within %lld ms\n",
                   p.stats.address.c_str(), static_cast<long long>(opts.auth_timeout.count()));
      close_peer(p, "no hello", false);
    }
  }

  ucp_ep_h create_ep(ucp_ep_params_t& ep, const sockaddr_storage& ss) {
    ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.err_mode = err_mode_for(ss);
    ep.err_handler.cb = &Impl::on_ep_error;
    ep.err_handler.arg = this;
    ucp_ep_h h = nullptr;
    if (ucp_ep_create(worker, &ep, &h) != UCS_OK) return nullptr;
    return h;
  }

  static void on_conn_request(ucp_conn_request_h req, void* arg) {
    auto* im = static_cast<Impl*>(arg);
    ucp_conn_request_attr_t attr{};
    attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
    std::string addr = "?";
    if (ucp_conn_request_query(req, &attr) == UCS_OK) addr = sockaddr_string(attr.client_address);
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST;
    ep.conn_request = req;
    ucp_ep_h h = im->create_ep(ep, attr.client_address);
    if (!h) {
      std::fprintf(stderr, "troupe: transport: cannot accept a connection from %s\n", addr.c_str());
      return;
    }
    ++im->accepted;
    im->add_peer(h, false, addr);
  }

  static void on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status) {
    auto* im = static_cast<Impl*>(arg);
    if (Peer* p = im->peer_of(ep))
      im->close_peer(*p, std::string("link failed: ") + ucs_status_string(status), false);
  }

  // --- sending ----------------------------------------------------------------------------

  static void on_send_done(void* request, ucs_status_t status, void* user) {
    auto* ctx = static_cast<SendCtx*>(user);
    if (status != UCS_OK) ctx->im->count_send_error(ctx->peer);
    delete ctx;
    ucp_request_free(request);
  }

  void count_send_error(PeerId id) {
    auto it = peers.find(id);
    if (it != peers.end()) ++it->second.stats.send_errors;
  }

  void post_am(Peer& p, unsigned am_id, WireHeader header,
               const std::vector<std::span<const uint8_t>>& parts,
               std::shared_ptr<const void> keep_alive) {
    auto* ctx = new SendCtx;
    ctx->im = this;
    ctx->peer = p.id;
    ctx->header = header;
    ctx->keep_alive = std::move(keep_alive);
    for (const auto& s : parts)
      if (!s.empty()) ctx->iov.push_back({const_cast<uint8_t*>(s.data()), s.size()});
    ucp_request_param_t prm{};
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                       UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_FLAGS;
    prm.cb.send = &Impl::on_send_done;
    prm.user_data = ctx;
    // Only the hello asks UCX to name the sending endpoint (the server does not know the link
    // yet); every later message names its link in the header.
    header.link = p.remote_id;
    header.key = p.remote_key;
    ctx->header = header;
    prm.flags = am_id == kAmHello ? UCP_AM_SEND_FLAG_REPLY : 0;
    const void* buf = nullptr;
    size_t count = 0;
    if (ctx->iov.size() <= 1) {
      prm.datatype = ucp_dt_make_contig(1);
      if (!ctx->iov.empty()) {
        buf = ctx->iov[0].buffer;
        count = ctx->iov[0].length;
      }
    } else {
      prm.datatype = ucp_dt_make_iov();
      buf = ctx->iov.data();
      count = ctx->iov.size();
    }
    ucs_status_ptr_t r =
        ucp_am_send_nbx(p.ep, am_id, &ctx->header, sizeof(WireHeader), buf, count, &prm);
    if (r == nullptr) {
      delete ctx;
    } else if (UCS_PTR_IS_ERR(r)) {
      ++p.stats.send_errors;
      delete ctx;
    }
  }

  void send_data(PeerId id, OutMessage m, bool apply_faults) {
    auto it = peers.find(id);
    if (it == peers.end()) return;
    Peer& p = it->second;
    if (!p.up || p.stats.cut) {
      ++p.stats.send_errors;
      return;
    }
    const size_t n = m.size_bytes();
    Checksum sum;
    if (opts.checksum_payloads)
      for (const auto& part : m.parts) sum.update(part);
    if (apply_faults && faults_on) {
      if (auto d = shim.decide(p.stats.name, m.type, true, n)) {
        ++p.stats.faults_fired;
        switch (d->action) {
          case FaultAction::kDrop:
            return;
          case FaultAction::kCut:
            p.stats.cut = true;
            return;
          case FaultAction::kDelay:
            add_timer(std::chrono::milliseconds(d->delay_ms),
                      [this, id, m]() mutable { send_data(id, std::move(m), false); });
            return;
          case FaultAction::kDuplicate:
            send_data(id, m, false);
            break;
          case FaultAction::kCorrupt:
            m = corrupted(m, d->corrupt_at);  // after the checksum: the receiver must notice
            break;
        }
      }
    }
    ++p.stats.messages_sent;
    p.stats.bytes_sent += n;
    WireHeader h;
    h.type = m.type;
    h.sum = opts.checksum_payloads ? sum.final() | 1 : 0;  // 0 = no checksum; a real one is odd
    post_am(p, kAmData, h, m.parts, std::move(m.keep_alive));
  }

  static OutMessage corrupted(const OutMessage& m, size_t at) {
    std::vector<uint8_t> flat;
    flat.reserve(m.size_bytes());
    for (const auto& s : m.parts) flat.insert(flat.end(), s.begin(), s.end());
    if (!flat.empty()) flat[at % flat.size()] ^= 0x5a;
    return copy_message(m.type, flat);
  }

  // --- receiving --------------------------------------------------------------------------

  std::shared_ptr<uint64_t[]> alloc_words(size_t bytes) { return pool->get(bytes); }

  // The sender's endpoint, or nullptr when it did not say (we always send with REPLY).
  static ucp_ep_h sender(const ucp_am_recv_param_t* param) {
    return (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? param->reply_ep : nullptr;
  }

  // The peer a message names in its header (link id and key), or null: unknown, stale or forged.
  Peer* peer_of_header(const void* header, size_t header_length, WireHeader* out) {
    if (header_length != sizeof(WireHeader)) return nullptr;
    std::memcpy(out, header, sizeof(WireHeader));
    if (out->magic != kMagic || out->version != kWireVersion) return nullptr;
    auto it = peers.find(out->link);
    if (it == peers.end() || it->second.key != out->key || !it->second.ep) return nullptr;
    return &it->second;
  }

  static bool is_rndv(const ucp_am_recv_param_t* param) {
    return (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  }

  static ucs_status_t am_data(void* arg, const void* header, size_t header_length, void* data,
                              size_t length, const ucp_am_recv_param_t* param) {
    auto* im = static_cast<Impl*>(arg);
    WireHeader h;
    Peer* p = im->peer_of_header(header, header_length, &h);
    if (!p || !p->up) {
      ++im->unauth_dropped;  // no such link, a forged key, or a peer not (or no longer) up
      return UCS_OK;         // an unread rendezvous is dropped by UCX
    }
    if (length > im->opts.max_message_bytes) {
      ++p->stats.oversized;
      return UCS_OK;
    }
    if (p->stats.cut) return UCS_OK;
    Message m;
    m.peer = p->id;
    m.type = h.type;
    m.size_bytes = length;
    m.storage = im->alloc_words(length);
    if (!is_rndv(param)) {
      if (length) std::memcpy(m.storage.get(), data, length);
      im->received(*p, std::move(m), h.sum);
      return UCS_OK;
    }
    auto* ctx = new RecvCtx{im, std::move(m), h.sum};
    ucp_request_param_t prm{};
    prm.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE;
    prm.cb.recv_am = &Impl::on_recv_done;
    prm.user_data = ctx;
    prm.datatype = ucp_dt_make_contig(1);
    ucs_status_ptr_t r =
        ucp_am_recv_data_nbx(im->worker, data, ctx->msg.storage.get(), length, &prm);
    if (r == nullptr) {
      im->received(*p, std::move(ctx->msg), ctx->sum);
      delete ctx;
    } else if (UCS_PTR_IS_ERR(r)) {
      ++p->stats.malformed;
      delete ctx;
    }
    return UCS_OK;
  }

  static void on_recv_done(void* request, ucs_status_t status, size_t, void* user) {
    auto* ctx = static_cast<RecvCtx*>(user);
    Impl* im = ctx->im;
    auto it = im->peers.find(ctx->msg.peer);
    if (it != im->peers.end() && !it->second.down) {
      if (status == UCS_OK)
        im->received(it->second, std::move(ctx->msg), ctx->sum);
      else
        ++it->second.stats.malformed;
    }
    delete ctx;
    ucp_request_free(request);
  }

  // A whole message arrived from an authenticated peer: incoming faults, counters, delivery.
  void received(Peer& p, Message&& m, uint64_t sum) {
    if (faults_on) {
      if (auto d = shim.decide(p.stats.name, m.type, false, m.size_bytes)) {
        ++p.stats.faults_fired;
        switch (d->action) {
          case FaultAction::kDrop:
            return;
          case FaultAction::kCut:
            p.stats.cut = true;
            return;
          case FaultAction::kDelay: {
            auto held = std::make_shared<Message>(std::move(m));
            const PeerId id = p.id;
            add_timer(std::chrono::milliseconds(d->delay_ms), [this, id, held, sum] {
              auto it = peers.find(id);
              if (it == peers.end() || it->second.down) return;
              deliver_checked(it->second, std::move(*held), sum);
            });
            return;
          }
          case FaultAction::kDuplicate: {
            Message dup = m;
            dup.storage = alloc_words(m.size_bytes);
            std::memcpy(dup.storage.get(), m.storage.get(), m.size_bytes);
            deliver_checked(p, std::move(dup), sum);
            break;
          }
          case FaultAction::kCorrupt:
            if (m.size_bytes)
              reinterpret_cast<uint8_t*>(m.storage.get())[d->corrupt_at % m.size_bytes] ^= 0x5a;
            break;
        }
      }
    }
    deliver_checked(p, std::move(m), sum);
  }

  // Delivers a message whose payload matches the sender's checksum; counts and drops the rest.
  void deliver_checked(Peer& p, Message&& m, uint64_t sum) {
    if (sum != 0 && (checksum(m.data()) | 1) != sum) {
      ++p.stats.malformed;
      ++p.stats.corrupted;
      return;
    }
    count_received(p, m);
    deliveries.push_back(std::move(m));
  }

  static void count_received(Peer& p, const Message& m) {
    ++p.stats.messages_received;
    p.stats.bytes_received += m.size_bytes;
  }

  // The handshake succeeded (either side): the peer may send and be sent to.
  void mark_up(Peer& p, const std::string& name) {
    p.up = true;
    p.stats.up = true;
    p.stats.name = name;
    events.push_back({p.id, PeerEvent::kUp, name, ""});
  }

  // Handshake payloads are small: take them eagerly, refuse rendezvous ones.
  static bool small_payload(const ucp_am_recv_param_t* param, size_t length) {
    return !is_rndv(param) && length <= 4096;
  }

  static ucs_status_t am_hello(void* arg, const void*, size_t, void* data, size_t length,
                               const ucp_am_recv_param_t* param) {
    auto* im = static_cast<Impl*>(arg);
    Peer* p = im->peer_of(sender(param));
    if (!p || p->client || p->up || p->down) return UCS_OK;
    std::string name;
    std::span<const uint8_t> in;
    if (small_payload(param, length)) in = {static_cast<const uint8_t*>(data), length};
    std::string why;
    if (!get_name(in, &name) || in.size() != 2 * kNonceBytes + 16) {
      why = "malformed hello";
    } else {
      const auto nonce = in.first(kNonceBytes), proof = in.subspan(kNonceBytes, kNonceBytes);
      std::memcpy(&p->remote_id, in.data() + 2 * kNonceBytes, 8);
      std::memcpy(&p->remote_key, in.data() + 2 * kNonceBytes + 8, 8);
      const Digest want = hmac_sha256(im->opts.cluster_token, kHelloLabel, {nonce, as_bytes(name)});
      if (!digest_equal(want, proof)) {
        why = "bad cluster token";
      } else {
        std::vector<uint8_t> out;
        put_name(out, im->opts.node_name);
        const Digest reply = hmac_sha256(im->opts.cluster_token, kHelloReplyLabel,
                                         {nonce, as_bytes(im->opts.node_name)});
        out.insert(out.end(), reply.begin(), reply.end());
        append_link(out, p->id, p->key);
        auto buf = std::make_shared<std::vector<uint8_t>>(std::move(out));
        im->post_am(*p, kAmHelloAck, WireHeader{}, {{buf->data(), buf->size()}}, buf);
        im->mark_up(*p, name);
        return UCS_OK;
      }
    }
    ++im->auth_failures;
    std::fprintf(stderr, "troupe: transport: refused peer at %s (calls itself '%s'): %s\n",
                 p->stats.address.c_str(), name.c_str(), why.c_str());
    auto buf = std::make_shared<std::string>(why);
    im->post_am(*p, kAmHelloNack, WireHeader{}, {as_bytes(*buf)}, buf);
    // Let the refusal reach the peer before the endpoint goes.
    const PeerId id = p->id;
    p->down = true;  // no data from it in the meantime
    im->add_timer(std::chrono::milliseconds(200), [im, id] {
      auto it = im->peers.find(id);
      if (it != im->peers.end()) im->close_peer(it->second, "refused", false);
    });
    return UCS_OK;
  }

  static ucs_status_t am_hello_ack(void* arg, const void* header, size_t header_length, void* data,
                                   size_t length, const ucp_am_recv_param_t* param) {
    auto* im = static_cast<Impl*>(arg);
    WireHeader h;
    Peer* p = im->peer_of_header(header, header_length, &h);
    if (!p || !p->client || p->up || p->down) return UCS_OK;
    std::string name;
    std::span<const uint8_t> in;
    if (small_payload(param, length)) in = {static_cast<const uint8_t*>(data), length};
    const bool ok = get_name(in, &name) && in.size() == kNonceBytes + 16 &&
                    digest_equal(hmac_sha256(im->opts.cluster_token, kHelloReplyLabel,
                                             {p->nonce, as_bytes(name)}),
                                 in.first(kNonceBytes));
    if (ok) {
      std::memcpy(&p->remote_id, in.data() + kNonceBytes, 8);
      std::memcpy(&p->remote_key, in.data() + kNonceBytes + 8, 8);
    }
    if (!ok) {
      ++im->auth_failures;
      std::fprintf(stderr, "troupe: transport: peer at %s did not prove the cluster token\n",
                   p->stats.address.c_str());
      im->close_peer(*p, "the peer at " + p->stats.address + " did not prove the cluster token",
                     false);
      return UCS_OK;
    }
    im->mark_up(*p, name);
    if (p->waiter) {
      p->waiter->set_value(p->id);
      p->waiter.reset();
    }
    return UCS_OK;
  }

  static ucs_status_t am_hello_nack(void* arg, const void* header, size_t header_length, void* data,
                                    size_t length, const ucp_am_recv_param_t* param) {
    auto* im = static_cast<Impl*>(arg);
    WireHeader h;
    Peer* p = im->peer_of_header(header, header_length, &h);
    if (!p || !p->client || p->up || p->down) return UCS_OK;
    std::string why = "no reason given";
    if (small_payload(param, length) && length > 0 && length <= 256)
      why.assign(static_cast<const char*>(data), length);
    im->close_peer(*p, "refused by " + p->stats.address + ": " + why, false);
    return UCS_OK;
  }

  static ucs_status_t am_bye(void* arg, const void* header, size_t header_length, void*, size_t,
                             const ucp_am_recv_param_t*) {
    auto* im = static_cast<Impl*>(arg);
    WireHeader h;
    Peer* p = im->peer_of_header(header, header_length, &h);
    if (!p) return UCS_OK;
    // Every message the peer sent before its goodbye has arrived: answer, then close (flushing
    // the answer out).
    if (!p->ep) return UCS_OK;
    im->post_am(*p, kAmByeAck, WireHeader{}, {}, nullptr);
    im->close_peer(*p, "closed by the peer", /*flush=*/true);
    return UCS_OK;
  }

  static ucs_status_t am_bye_ack(void* arg, const void* header, size_t header_length, void*, size_t,
                                 const ucp_am_recv_param_t*) {
    auto* im = static_cast<Impl*>(arg);
    WireHeader h;
    if (Peer* p = im->peer_of_header(header, header_length, &h); p && p->bye_sent)
      im->close_peer(*p, "closed here", /*flush=*/false);
    return UCS_OK;
  }

  // --- commands (run on the progress thread) ------------------------------------------------

  void do_connect(const std::string& host, uint16_t port, std::chrono::milliseconds timeout,
                  std::shared_ptr<std::promise<Result<PeerId>>> waiter) {
    sockaddr_storage ss{};
    if (auto r = resolve(host, port, &ss); !r) return waiter->set_value(r.error());
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
    ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    ep.sockaddr.addr = reinterpret_cast<const sockaddr*>(&ss);
    ep.sockaddr.addrlen = ss.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
    const std::string where = host + ":" + std::to_string(port);
    ucp_ep_h h = create_ep(ep, ss);
    if (!h) return waiter->set_value(Error{1, "cannot connect to " + where});
    Peer& p = add_peer(h, true, where);
    p.waiter = waiter;
    random_bytes(p.nonce);
    std::vector<uint8_t> out;
    put_name(out, opts.node_name);
    out.insert(out.end(), p.nonce.begin(), p.nonce.end());
    const Digest proof =
        hmac_sha256(opts.cluster_token, kHelloLabel, {p.nonce, as_bytes(opts.node_name)});
    out.insert(out.end(), proof.begin(), proof.end());
    append_link(out, p.id, p.key);
    auto buf = std::make_shared<std::vector<uint8_t>>(std::move(out));
    post_am(p, kAmHello, WireHeader{}, {{buf->data(), buf->size()}}, buf);
    const PeerId id = p.id;
    add_timer(timeout, [this, id, where, timeout] {
      auto it = peers.find(id);
      if (it == peers.end() || it->second.up || it->second.down) return;
      close_peer(it->second,
                 "no answer from " + where + " within " + std::to_string(timeout.count()) +
                     " ms (is a troupe node listening there?)",
                 false);
    });
  }
};

Transport::Transport() : impl_(std::make_unique<Impl>()) {}

Result<std::unique_ptr<Transport>> Transport::start(const TransportOptions& opts,
                                                    MessageHandler on_message,
                                                    PeerHandler on_peer) {
  if (opts.cluster_token.empty()) return Error{1, "transport: the cluster token is empty"};
  if (opts.node_name.empty() || opts.node_name.size() > kMaxNameBytes)
    return Error{
        1, "transport: the node name must have 1.." + std::to_string(kMaxNameBytes) + " bytes"};
  if (!on_message) return Error{1, "transport: no message handler"};
  std::unique_ptr<Transport> t(new Transport());
  Impl& im = *t->impl_;
  im.opts = opts;
  im.on_message = std::move(on_message);
  im.on_peer = std::move(on_peer);
  im.shim = FaultShim(opts.faults);
  im.faults_on = im.shim.active();
  if (auto s = im.init(); !s) return s.error();
  im.thread = std::thread([&im] { im.loop(); });
  return t;
}

Transport::~Transport() {
  Impl& im = *impl_;
  if (im.thread.joinable()) {
    im.stop.store(true, std::memory_order_release);
    im.signal();
    im.thread.join();
  }
  if (im.worker) ucp_worker_destroy(im.worker);
  if (im.context) ucp_cleanup(im.context);
  if (im.epoll_fd >= 0) ::close(im.epoll_fd);
  if (im.event_fd >= 0) ::close(im.event_fd);
}

uint16_t Transport::port() const { return impl_->port; }
const std::string& Transport::node_name() const { return impl_->opts.node_name; }

Result<PeerId> Transport::connect(const std::string& host, uint16_t port,
                                  std::chrono::milliseconds timeout) {
  auto waiter = std::make_shared<std::promise<Result<PeerId>>>();
  auto fut = waiter->get_future();
  impl_->post(
      [this, host, port, timeout, waiter] { impl_->do_connect(host, port, timeout, waiter); });
  if (fut.wait_for(timeout + std::chrono::seconds(5)) != std::future_status::ready)
    return Error{1, "transport: connect to " + host + ":" + std::to_string(port) + " hung"};
  return fut.get();
}

Status Transport::send(PeerId peer, OutMessage msg) {
  Impl& im = *impl_;
  const size_t n = msg.size_bytes();
  {
    std::lock_guard<std::mutex> lk(im.mu);
    auto it = im.peers.find(peer);
    if (it == im.peers.end()) return Error{1, "transport: no peer " + std::to_string(peer)};
    if (!it->second.up)
      return Error{1, "transport: the link to '" + it->second.stats.name + "' (" +
                          it->second.stats.address + ") is down"};
  }
  if (n > im.opts.max_message_bytes)
    return Error{1, "transport: message of " + std::to_string(n) + " bytes is over the limit of " +
                        std::to_string(im.opts.max_message_bytes)};
  im.post([&im, peer, m = std::move(msg)]() mutable { im.send_data(peer, std::move(m), true); });
  return Ok{};
}

void Transport::close(PeerId peer) {
  impl_->post([this, peer] {
    auto it = impl_->peers.find(peer);
    if (it != impl_->peers.end()) impl_->say_goodbye(it->second, "closed here");
  });
}

void Transport::report_malformed(PeerId peer) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  auto it = impl_->peers.find(peer);
  if (it != impl_->peers.end()) ++it->second.stats.malformed;
}

void Transport::set_faults(FaultRules rules) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->shim = FaultShim(std::move(rules));
  impl_->faults_on = impl_->shim.active();
  if (!impl_->faults_on)
    for (auto& [id, p] : impl_->peers) p.stats.cut = false;
}

TransportStats Transport::stats() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  TransportStats s;
  for (const auto& [id, p] : impl_->peers) s.links.push_back(p.stats);
  s.auth_failures = impl_->auth_failures;
  s.unauthenticated_dropped = impl_->unauth_dropped;
  s.connections_accepted = impl_->accepted;
  return s;
}

std::string Transport::peer_name(PeerId peer) const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  auto it = impl_->peers.find(peer);
  return it == impl_->peers.end() ? std::string() : it->second.stats.name;
}

}  // namespace troupe::transport
