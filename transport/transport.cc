// Transport over UCX UCP (see transport.h). One progress thread owns the worker: it runs queued
// commands (connect, send, close), UCX progress and callbacks, timers (auth deadlines, delayed
// faults, connect timeouts), then delivers received messages to the handler outside the lock,
// and sleeps on the worker's event fd plus an eventfd that other threads signal.
//
// Wire: every UCX active message carries a 40-byte WireHeader (detail/transport_impl.h). AM ids:
// hello (client -> server: name, nonce, proof), hello-ack (server: name, proof of the nonce),
// hello-nack (server: why it refused), data (authenticated peers only), bye (orderly close).
#include <mutex>

#include "transport/detail/transport_impl.h"

namespace troupe::transport {

Status Transport::Impl::init() {
  // A node restarted right after it stopped (systemd's Restart=, a crash) must be able to listen
  // on its port again while the old connections sit in TIME_WAIT: SO_REUSEADDR on the listener.
  // UCX reads this one from the environment only (its connection manager's configuration is not
  // ucp_config_modify's); a value the user set wins. Set once, before any transport exists.
  static std::once_flag reuse_addr;
  std::call_once(reuse_addr, [] { ::setenv("UCX_TCP_CM_REUSEADDR", "y", 0); });
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
  for (unsigned id : {kAmHello, kAmHelloAck, kAmHelloNack, kAmData, kAmBye, kAmByeAck, kAmSum,
                      kAmPullOffer, kAmPullAccept, kAmPull, kAmPullDone}) {
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
      case kAmSum:
        hp.cb = &Impl::am_sum;
        break;
      case kAmBye:
        hp.cb = &Impl::am_bye;
        break;
      case kAmPullOffer:
        hp.cb = &Impl::am_pull_offer;
        break;
      case kAmPullAccept:
        hp.cb = &Impl::am_pull_accept;
        break;
      case kAmPull:
        hp.cb = &Impl::am_pull;
        break;
      case kAmPullDone:
        hp.cb = &Impl::am_pull_done;
        break;
      default:  // kAmByeAck
        hp.cb = &Impl::am_bye_ack;
        break;
    }
    if (ucs_status_t s = ucp_worker_set_am_recv_handler(worker, &hp); s != UCS_OK)
      return Error{1, std::string("UCX: cannot set a message handler: ") + ucs_status_string(s)};
  }
  init_pulls();  // off (or impossible here): every message takes the endpoint
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

Status Transport::Impl::start_listener() {
  sockaddr_storage ss{};
  if (auto r = resolve(opts.listen_host, opts.listen_port, &ss); !r) return r;
  ucp_listener_params_t lp{};
  lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&ss);
  lp.sockaddr.addrlen = ss.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  lp.conn_handler.cb = &Impl::on_conn_request;
  lp.conn_handler.arg = this;
  if (ucs_status_t s = ucp_listener_create(worker, &lp, &listener); s != UCS_OK) {
    // UCX says "Device is busy" when bind() fails (the port is taken by another process, or by
    // connections it does not let us reuse), and other errors when no transport can listen.
    const std::string why = s == UCS_ERR_BUSY
                                ? "the address is in use: another process may listen there"
                                : "the listener needs tcp in UCX_TLS";
    return Error{1, "transport: cannot listen on " + opts.listen_host + ":" +
                        std::to_string(opts.listen_port) + ": " + ucs_status_string(s) + " (" +
                        why + ")"};
  }
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

Status Transport::Impl::resolve(const std::string& host, uint16_t port, sockaddr_storage* out) {
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

ucp_err_handling_mode_t Transport::Impl::err_mode() const {
  // auto and peer: UCX reports a dead peer, and UCX 1.13 then leaves its shared-memory
  // transports out (they cannot report one), so peers on this host talk over TCP. none: shared
  // memory on one host, where a peer that dies while it writes into our receive queue can
  // leave the worker unable to receive from anyone (docs/transport.md, error_mode).
  return opts.error_mode == ErrorMode::kNone ? UCP_ERR_HANDLING_MODE_NONE
                                             : UCP_ERR_HANDLING_MODE_PEER;
}

void Transport::Impl::signal() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(event_fd, &one, sizeof(one));
}

void Transport::Impl::post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lk(cmd_mu);
    commands.push_back(std::move(fn));
  }
  // Pairs with the loop's store to `sleeping` before it looks at `commands` (both seq_cst):
  // either the loop sees this command, or this sees sleeping == true and wakes it.
  if (sleeping.load()) signal();
}

bool Transport::Impl::prepare_to_sleep() {
  sleeping.store(true);
  std::lock_guard<std::mutex> ck(cmd_mu);
  if (commands.empty()) return true;
  sleeping.store(false, std::memory_order_relaxed);
  return false;
}

void Transport::Impl::add_timer(std::chrono::milliseconds after, std::function<void()> fn) {
  timers.push({Clock::now() + after, timer_order++, std::move(fn)});
}

void Transport::Impl::loop() {
  auto last_activity = Clock::now();
  auto next_auth_check = Clock::now();
  // A UCX worker that keeps saying "busy" (ucp_worker_arm) while its progress finds nothing has
  // stopped receiving (err_mode: error mode none); say so once rather than hang silently.
  Clock::time_point stalled_since{};
  bool stall_reported = false;
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
      // After the last round's deliveries, so that a receive can reuse the buffer (still in
      // cache) that the handler just gave back.
      busy |= start_receives();
      busy |= run_pulls();
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
      // Hand over what arrived before progressing further: the handler frees the buffers the
      // next receives reuse, and messages do not wait behind a whole burst.
      while (deliveries.empty() && events.empty() && ucp_worker_progress(worker) != 0) busy = true;
      // Fragments announced in the last progress call (which may count as no event, over TCP)
      // must not wait for a wake-up. With deliveries pending, the next round starts them after
      // the handler has given its buffers back.
      if (deliveries.empty()) busy |= start_receives();
      reap_closing();
    }
    busy |= deliver();
    const auto now = Clock::now();
    if (busy) {
      last_activity = now;
      stalled_since = Clock::time_point{};
      continue;
    }
    if (opts.spin.count() > 0 && now - last_activity < opts.spin) continue;
    if (sends_in_flight + rndv_in_flight > 0 && now - last_activity < opts.poll_in_flight) {
      // A completion is on its way. Sleeping would cost a wake-up here and, over shared memory,
      // a signal from the peer for every message; yield instead, so that other threads (the
      // peer's, on a small host) still get the core.
      sched_yield();
      continue;
    }
    if (!prepare_to_sleep()) continue;
    {
      std::lock_guard<std::mutex> lk(mu);
      if (ucp_worker_arm(worker) == UCS_ERR_BUSY) {
        sleeping.store(false, std::memory_order_relaxed);
        if (stalled_since == Clock::time_point{}) stalled_since = now;
        if (!stall_reported && now - stalled_since > std::chrono::seconds(5)) {
          stall_reported = true;
          std::fprintf(stderr,
                       "troupe: transport: the UCX worker has reported pending events for 5 s "
                       "but its progress finds none; messages may not be received "
                       "(docs/transport.md, error_mode)\n");
        }
        continue;
      }
    }
    stalled_since = Clock::time_point{};
    int timeout_ms = 100;
    {
      std::lock_guard<std::mutex> lk(mu);
      if (!timers.empty()) {
        const auto d = std::chrono::duration_cast<std::chrono::milliseconds>(timers.top().at - now);
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

bool Transport::Impl::deliver() {
  std::vector<Message> msgs;
  std::vector<Event> evs;
  {
    std::lock_guard<std::mutex> lk(mu);
    msgs.swap(deliveries);
    evs.swap(events);
  }
  // A peer's kUp before its messages, its kDown after them (both may land in one round).
  auto tell = [&](PeerEvent which) {
    for (auto& e : evs)
      if (e.ev == which && on_peer) on_peer(e.peer, e.ev, e.name, e.reason);
  };
  tell(PeerEvent::kUp);
  for (auto& m : msgs) {
    try {
      on_message(std::move(m));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "troupe: transport: message handler threw: %s\n", e.what());
    }
  }
  tell(PeerEvent::kDown);
  return !msgs.empty() || !evs.empty();
}

void Transport::Impl::shutdown() {
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
  rndv_waiting.clear();  // each was released when its peer closed
  if (listener) ucp_listener_destroy(listener);
  listener = nullptr;
}

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
  if (impl_->faults_on) return;
  for (auto& [id, p] : impl_->peers) {
    if (!p.stats.cut) continue;
    p.stats.cut = false;
    impl_->post([im = impl_.get(), id = id] { im->send_held_pull_dones(id); });
  }
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
