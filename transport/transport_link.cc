// Peers of the transport: connecting, the authenticated handshake (hello / hello-ack /
// hello-nack), goodbye, and closing. Runs on the progress thread (see detail/transport_impl.h).
#include "transport/detail/transport_impl.h"

namespace troupe::transport {

// The sender's endpoint, or nullptr when it did not say (hellos are sent with REPLY).
ucp_ep_h Transport::Impl::sender(const ucp_am_recv_param_t* param) {
  return (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? param->reply_ep : nullptr;
}

Transport::Impl::Peer* Transport::Impl::peer_of(ucp_ep_h ep) {
  auto it = by_ep.find(ep);
  if (it == by_ep.end()) return nullptr;
  auto pit = peers.find(it->second);
  return pit == peers.end() ? nullptr : &pit->second;
}

Transport::Impl::Peer& Transport::Impl::add_peer(ucp_ep_h ep, bool client,
                                                 const std::string& address) {
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

void Transport::Impl::close_peer(Peer& p, const std::string& reason, bool flush) {
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
  revoke_pulls(p);
  drop_inbox(p);  // releases rendezvous descriptors, which needs the endpoint
  ucp_request_param_t prm{};
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  prm.flags = flush ? 0 : UCP_EP_CLOSE_FLAG_FORCE;
  by_ep.erase(p.ep);
  void* req = ucp_ep_close_nbx(p.ep, &prm);
  if (req && !UCS_PTR_IS_ERR(req)) closing.push_back(req);
  p.ep = nullptr;
}

void Transport::Impl::say_goodbye(Peer& p, const std::string& reason) {
  if (p.down) return;
  if (!p.up) return close_peer(p, reason, false);
  p.bye_sent = true;
  post_trailers(p, /*now=*/true);  // the goodbye follows every message sent before it
  post_am(p, kAmBye, WireHeader{}, {}, nullptr);
  drop_inbox(p);  // nothing more is delivered from it
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

void Transport::Impl::reap_closing() {
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

void Transport::Impl::check_auth_deadlines(Clock::time_point now) {
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

ucp_ep_h Transport::Impl::create_ep(ucp_ep_params_t& ep) {
  ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.err_mode = err_mode();
  ep.err_handler.cb = &Impl::on_ep_error;
  ep.err_handler.arg = this;
  ucp_ep_h h = nullptr;
  if (ucp_ep_create(worker, &ep, &h) != UCS_OK) return nullptr;
  return h;
}

void Transport::Impl::on_conn_request(ucp_conn_request_h req, void* arg) {
  auto* im = static_cast<Impl*>(arg);
  ucp_conn_request_attr_t attr{};
  attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
  std::string addr = "?";
  if (ucp_conn_request_query(req, &attr) == UCS_OK) addr = sockaddr_string(attr.client_address);
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST;
  ep.conn_request = req;
  ucp_ep_h h = im->create_ep(ep);
  if (!h) {
    std::fprintf(stderr, "troupe: transport: cannot accept a connection from %s\n", addr.c_str());
    return;
  }
  ++im->accepted;
  im->add_peer(h, false, addr);
}

void Transport::Impl::on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* im = static_cast<Impl*>(arg);
  if (Peer* p = im->peer_of(ep))
    im->close_peer(*p, std::string("link failed: ") + ucs_status_string(status), false);
}

void Transport::Impl::mark_up(Peer& p, const std::string& name) {
  p.up = true;
  p.stats.up = true;
  p.stats.name = name;
  events.push_back({p.id, PeerEvent::kUp, name, ""});
  offer_pull(p);
}

ucs_status_t Transport::Impl::am_hello(void* arg, const void*, size_t, void* data, size_t length,
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

ucs_status_t Transport::Impl::am_hello_ack(void* arg, const void* header, size_t header_length,
                                           void* data, size_t length,
                                           const ucp_am_recv_param_t* param) {
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

ucs_status_t Transport::Impl::am_hello_nack(void* arg, const void* header, size_t header_length,
                                            void* data, size_t length,
                                            const ucp_am_recv_param_t* param) {
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

ucs_status_t Transport::Impl::am_bye(void* arg, const void* header, size_t header_length, void*,
                                     size_t, const ucp_am_recv_param_t*) {
  auto* im = static_cast<Impl*>(arg);
  WireHeader h;
  Peer* p = im->peer_of_header(header, header_length, &h);
  if (!p || !p->ep) return UCS_OK;
  // Every message the peer sent before its goodbye has been announced; some may still be on
  // their way (rendezvous). Answer once they are delivered (drain_inbox), so that the peer's
  // close waits for them.
  if (!p->inbox.empty()) {
    p->bye_pending = true;
    return UCS_OK;
  }
  im->answer_bye(*p);
  return UCS_OK;
}

void Transport::Impl::answer_bye(Peer& p) {
  p.bye_pending = false;
  post_am(p, kAmByeAck, WireHeader{}, {}, nullptr);
  close_peer(p, "closed by the peer", /*flush=*/true);  // flushes the answer out
}

ucs_status_t Transport::Impl::am_bye_ack(void* arg, const void* header, size_t header_length, void*,
                                         size_t, const ucp_am_recv_param_t*) {
  auto* im = static_cast<Impl*>(arg);
  WireHeader h;
  if (Peer* p = im->peer_of_header(header, header_length, &h); p && p->bye_sent)
    im->close_peer(*p, "closed here", /*flush=*/false);
  return UCS_OK;
}

void Transport::Impl::do_connect(const std::string& host, uint16_t port,
                                 std::chrono::milliseconds timeout,
                                 std::shared_ptr<std::promise<Result<PeerId>>> waiter) {
  sockaddr_storage ss{};
  if (auto r = resolve(host, port, &ss); !r) return waiter->set_value(r.error());
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
  ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  ep.sockaddr.addr = reinterpret_cast<const sockaddr*>(&ss);
  ep.sockaddr.addrlen = ss.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  const std::string where = host + ":" + std::to_string(port);
  ucp_ep_h h = create_ep(ep);
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

}  // namespace troupe::transport
