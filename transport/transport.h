// Transport: one UCX UCP worker per process (per node daemon), a listener, and one endpoint per
// peer. Peers prove the cluster token at connect (mutual HMAC-SHA256); messages are typed byte
// frames (usually Cap'n Proto, typed by the root struct's id) sent as UCX active messages: eager
// for small ones, rendezvous for large ones (in fragments of at most 1 MiB), gathered from the
// caller's buffers without a copy, and delivered in send order per peer. Between processes of
// one host, messages of 256 KiB and more are read out of the sender's memory instead (same-host
// pulls, transport_pull.cc).
// Users: actors/ (node daemon, remote proxies), bench/, tests.
// Thread safety: every public method may be called from any thread. All UCX calls run on the
// transport's own progress thread, which also runs the handlers: they must return quickly
// (hand the message to an actor or a queue) and must not call connect() (it would wait on the
// thread that is running the handler).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/result.h"
#include "transport/fault.h"

namespace troupe::transport {

namespace detail {
struct TransportTesting;  // test-only access to the wire (detail/testing.h)
}  // namespace detail

/// A connected, authenticated peer of this transport; 0 is never a valid id.
using PeerId = uint64_t;

/// How an endpoint learns that its peer failed, and with it whether peers on one host may use
/// shared memory (docs/transport.md, error_mode).
enum class ErrorMode : uint8_t {
  /// The default: the same as kPeer.
  kAuto = 0,
  /// UCP_ERR_HANDLING_MODE_PEER everywhere: a failed peer is reported, and same-host traffic
  /// goes over TCP through the loopback device (UCX 1.13 leaves shared memory out).
  kPeer = 1,
  /// UCP_ERR_HANDLING_MODE_NONE everywhere: shared memory between processes of one host
  /// (about 3x TCP's bandwidth here), but a dead peer is noticed only by heartbeats above, and
  /// one killed while it writes into this process's receive queue (a shared ring) leaves this
  /// transport unable to receive from anyone. For benchmarks, not for clusters that must
  /// survive a process dying.
  kNone = 2,
};

struct TransportOptions {
  std::string node_name;      // this node's name, told to peers in the handshake
  std::string cluster_token;  // shared secret; both ends must hold the same one (non-empty)
  std::string listen_host = "0.0.0.0";  // address the listener binds; "" = no listener
  uint16_t listen_port = 0;             // 0 = an ephemeral port (see Transport::port())
  /// UCX transports and devices (UCX_TLS, UCX_NET_DEVICES); empty = UCX's environment/defaults.
  /// The listener needs `tcp` in tls (DEPENDENCIES.md §4, trap 7).
  std::string tls;
  std::string net_devices;
  ErrorMode error_mode = ErrorMode::kAuto;
  size_t max_message_bytes = 256u << 20;         // bytes; larger incoming messages are dropped
  std::chrono::milliseconds auth_timeout{5000};  // an accepted peer must authenticate within it
  /// Busy-poll for this long after the last activity before sleeping on the worker's event fd:
  /// lower latency for more CPU. 0 = sleep at once (the default: these hosts are 2-core).
  std::chrono::microseconds spin{0};
  /// While this transport's own transfers are in flight (a rendezvous receive, or a send UCX has
  /// not completed), poll for up to this long after the last activity instead of sleeping,
  /// yielding the core between polls. Sleeping costs a wake-up per completion (and over shared
  /// memory a signal from the peer per message): streaming 1 MiB messages it halved the rate
  /// over shared memory and cost a quarter over TCP (docs/transport.md). An idle transport still
  /// sleeps at once. 0 = always sleep at once.
  std::chrono::microseconds poll_in_flight{100};
  FaultRules faults;  // fault-injection shim: off when empty
  /// Checksum every payload (64-bit, position-dependent; a mismatch is counted and the message
  /// dropped). Costs a pass over the bytes on each side: measured in docs/benchmarks.md. A
  /// message that carries no checksum (its sender turned this off) is not checked.
  bool checksum_payloads = true;
  /// Peers on this host (same boot, and each able to read the other's memory: checked at
  /// connect) move messages of at least pull_min_bytes by cross-memory attach: the sender
  /// announces where the bytes are, the receiver reads them with one process_vm_readv copy
  /// and says when it is done. The announcement and everything else still go over the UCX
  /// endpoint (with its failure reports), so a peer that dies mid-transfer costs that
  /// message only (docs/transport.md, Same-host pulls). Needs ptrace access between the
  /// processes (same user; Yama's ptrace_scope at most 1, which this opens to any process of
  /// the same user with PR_SET_PTRACER_ANY). Pulled bytes are not checksummed (no wire).
  bool same_host_pull = true;
  size_t pull_min_bytes = 256u << 10;
};

/// One received message. `data` is 8-byte aligned (Cap'n Proto reads it in place) and owned by
/// the message: the handler may move it away and keep it.
struct Message {
  PeerId peer = 0;
  uint64_t type = 0;  // the sender's type id (Cap'n Proto: capnp::typeId<Root>())
  std::shared_ptr<uint64_t[]> storage;
  size_t size_bytes = 0;
  std::span<const uint8_t> data() const {
    return {reinterpret_cast<const uint8_t*>(storage.get()), size_bytes};
  }
};

/// What happened to a peer.
enum class PeerEvent : uint8_t {
  kUp = 0,    // authenticated (either side of the connection)
  kDown = 1,  // closed by either end, failed, or cut; its PeerId is never reused
};

using MessageHandler = std::function<void(Message&&)>;
using PeerHandler =
    std::function<void(PeerId, PeerEvent, const std::string& peer_name, const std::string& reason)>;

/// A message to send: byte ranges gathered in order, kept valid by `keep_alive` until UCX is
/// done with them (the transport holds it until the send completes).
struct OutMessage {
  uint64_t type = 0;
  std::vector<std::span<const uint8_t>> parts;
  std::shared_ptr<const void> keep_alive;
  size_t size_bytes() const;
};
/// An OutMessage that owns a copy of `bytes`.
OutMessage copy_message(uint64_t type, std::span<const uint8_t> bytes);

/// Counters of one link (monotonic since the peer connected).
struct LinkStats {
  PeerId peer = 0;
  std::string name;     // the peer's node name
  std::string address;  // "ip:port" of the remote end
  bool up = false;
  bool cut = false;  // cut by the fault shim
  uint64_t messages_sent = 0, bytes_sent = 0, messages_received = 0, bytes_received = 0;
  uint64_t send_errors = 0;  // sends UCX failed (peer gone, link cut)
  // Dropped from an authenticated link: a bad header (size, magic, version), a fragment out of
  // sequence or past its total, a message it interrupted, a checksum mismatch, or reported by
  // report_malformed() (docs/transport.md, Counters).
  uint64_t malformed = 0;
  uint64_t corrupted = 0;     // dropped (and counted in malformed): payload checksum mismatch
  uint64_t oversized = 0;     // dropped: larger than max_message_bytes
  uint64_t faults_fired = 0;  // fault-shim actions applied on this link
  bool pulls_to = false;      // messages to it may go by same-host pull (it can read ours)
  bool pulls_from = false;    // we can read its memory (same host): it may send us pulls
  uint64_t pulled = 0;        // messages received from it by pull (also in messages_received)
};

struct TransportStats {
  std::vector<LinkStats> links;          // live and closed links, in connect order
  uint64_t auth_failures = 0;            // peers refused: bad proof, bad hello, or no hello in time
  uint64_t unauthenticated_dropped = 0;  // messages from peers that had not authenticated
  uint64_t connections_accepted = 0;     // by the listener
};

class Transport {
 public:
  /// Creates the UCX context and worker, starts the listener and the progress thread.
  /// Errors: no token, UCX initialization, a listener that cannot bind.
  static Result<std::unique_ptr<Transport>> start(const TransportOptions& opts,
                                                  MessageHandler on_message,
                                                  PeerHandler on_peer = nullptr);
  /// Says goodbye to every peer, closes the endpoints and stops the thread.
  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  /// The listener's port (the ephemeral one when listen_port was 0); 0 without a listener.
  uint16_t port() const;
  const std::string& node_name() const;

  /// Connects to a listener and authenticates both ways. Blocks until the peer's reply proves the
  /// token, or fails: refused (the message says why), unreachable, or no answer within `timeout`.
  Result<PeerId> connect(const std::string& host, uint16_t port,
                         std::chrono::milliseconds timeout = std::chrono::milliseconds(10000));

  /// Queues a message to a peer and returns; delivery is in order per peer. Errors: unknown or
  /// closed peer, a message over max_message_bytes. A send that fails later (peer died) is
  /// counted in LinkStats::send_errors and reported as PeerEvent::kDown when UCX says so.
  Status send(PeerId peer, OutMessage msg);

  /// Closes the link to a peer (it sees kDown). Idempotent.
  void close(PeerId peer);

  /// Counts a message that passed the transport but failed validation above it (e.g. a Cap'n
  /// Proto frame that read_frame() rejected) in that link's `malformed` counter.
  void report_malformed(PeerId peer);

  /// Replaces the fault-injection rules (empty = off). Clearing the rules heals cut links.
  void set_faults(FaultRules rules);

  TransportStats stats() const;
  /// The peer's node name ("" when unknown).
  std::string peer_name(PeerId peer) const;

 private:
  friend struct detail::TransportTesting;
  Transport();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe::transport
