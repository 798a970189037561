// Link: a node daemon's handle on the transport for actors: sends frames to peers named by node
// name, keeps the name -> peer table (from connects and from peers that connected here), and
// numbers messages (Header.seq). Private to actors/.
// Thread safety: every method may be called from any thread (actors, shard threads, the
// transport's own thread for on_peer bookkeeping).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "actors/detail/control_wire.h"
#include "actors/detail/wire.h"
#include "base/result.h"
#include "transport/transport.h"

namespace troupe::actors::detail {

class Link {
 public:
  explicit Link(uint32_t node_id = 0) : node_id_(node_id) {}
  /// The transport to send on; null once the daemon is shutting down (sends then fail).
  void set_transport(std::shared_ptr<transport::Transport> t);
  std::shared_ptr<transport::Transport> transport() const;

  /// This node's id (0 until the controller assigned one) and the cluster epoch.
  void set_node_id(uint32_t id) { node_id_.store(id); }
  uint32_t node_id() const { return node_id_.load(); }
  void set_epoch(uint64_t e) { epoch_.store(e); }
  uint64_t epoch() const { return epoch_.load(); }

  /// The header fields for a message sent by `role/index` of this node.
  SendInfo send_info(ActorRole role, uint32_t index = 0) {
    SendInfo s;
    s.sender = {node_id(), role, index};
    s.seq = seq_.fetch_add(1) + 1;
    return s;
  }

  /// Remembers that `name` is reachable through `peer`. Two nodes that connect to each other at
  /// once end up with two links; the first one known carries every message to that node (so
  /// that they keep their order), the other stands by.
  void add_peer(const std::string& name, transport::PeerId peer);
  /// Forgets a closed link. When it carried a node's messages, a standby link to the same node
  /// takes over (what was in flight on the closed one is lost with it, as without a standby).
  void drop_peer(transport::PeerId peer);
  /// The link that carries messages to node `name`, if any (0: none).
  transport::PeerId peer_of(const std::string& name) const;

  /// Connects to `name` at host:port unless a link exists. Blocks (never call it from the
  /// transport's thread or from CAF's shared workers for long).
  Result<transport::PeerId> ensure(const std::string& name, const std::string& host, uint16_t port,
                                   std::chrono::milliseconds timeout);

  /// The peer's node name ("" when unknown or shutting down).
  std::string peer_name(transport::PeerId peer) const;
  /// Counts a frame from `peer` that failed validation (transport::Transport::report_malformed).
  void report_malformed(transport::PeerId peer) const;

  /// Sends a frame of type `m` to node `name` / to a peer. Errors: no link, or the transport's.
  Status send(const std::string& name, ControlMsg m, const WireFrame& frame);
  Status send(transport::PeerId peer, ControlMsg m, const WireFrame& frame);

 private:
  std::shared_ptr<transport::Transport> tx_;  // guarded by mu_
  std::atomic<uint32_t> node_id_;
  std::atomic<uint64_t> epoch_{0};
  std::atomic<uint64_t> seq_{0};
  mutable std::mutex mu_;
  // Live links per node name, in the order they became known; the first carries the messages.
  std::map<std::string, std::vector<transport::PeerId>> by_name_;
};

}  // namespace troupe::actors::detail
