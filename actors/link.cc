// Link: node-name addressing over the transport (see detail/link.h).
#include "actors/detail/link.h"

#include <algorithm>

namespace troupe::actors::detail {

void Link::set_transport(std::shared_ptr<transport::Transport> t) {
  std::lock_guard<std::mutex> lk(mu_);
  tx_ = std::move(t);
}

std::shared_ptr<transport::Transport> Link::transport() const {
  std::lock_guard<std::mutex> lk(mu_);
  return tx_;
}

void Link::add_peer(const std::string& name, transport::PeerId peer) {
  std::lock_guard<std::mutex> lk(mu_);
  auto& links = by_name_[name];
  if (std::find(links.begin(), links.end(), peer) == links.end()) links.push_back(peer);
}

void Link::drop_peer(transport::PeerId peer) {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto it = by_name_.begin(); it != by_name_.end();) {
    std::erase(it->second, peer);
    if (it->second.empty())
      it = by_name_.erase(it);
    else
      ++it;
  }
}

transport::PeerId Link::peer_of(const std::string& name) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = by_name_.find(name);
  return it == by_name_.end() ? 0 : it->second.front();
}

Result<transport::PeerId> Link::ensure(const std::string& name, const std::string& host,
                                       uint16_t port, std::chrono::milliseconds timeout) {
  if (transport::PeerId p = peer_of(name)) return p;
  auto tx = transport();
  if (!tx) return Error{1, "the node is shutting down"};
  auto r = tx->connect(host, port, timeout);
  if (!r) return r.error();
  const std::string got = tx->peer_name(*r);
  if (got != name) {
    tx->close(*r);
    return Error{1, "the node at " + host + ":" + std::to_string(port) + " calls itself '" + got +
                        "', expected '" + name + "'"};
  }
  add_peer(name, *r);
  return peer_of(name);
}

std::string Link::peer_name(transport::PeerId peer) const {
  auto tx = transport();
  return tx ? tx->peer_name(peer) : std::string();
}

void Link::report_malformed(transport::PeerId peer) const {
  if (auto tx = transport()) tx->report_malformed(peer);
}

Status Link::send(const std::string& name, ControlMsg m, const WireFrame& frame) {
  const transport::PeerId p = peer_of(name);
  if (p == 0) return Error{1, "no link to node '" + name + "'"};
  return send(p, m, frame);
}

Status Link::send(transport::PeerId peer, ControlMsg m, const WireFrame& frame) {
  transport::OutMessage out;
  out.type = type_id(m);
  out.parts = frame.iov();
  out.keep_alive = frame.keep_alive();
  auto tx = transport();
  if (!tx) return Error{1, "the node is shutting down"};
  return tx->send(peer, std::move(out));
}

}  // namespace troupe::actors::detail
