// Private to transport/: the wire constants and header, the handshake payload helpers, and
// Transport::Impl, the state of one transport and the methods its progress thread runs.
// transport.cc: set-up, the progress loop, shutdown and the public API; transport_link.cc:
// peers, the authenticated handshake and orderly close; transport_data.cc: sending and
// receiving data (checksums, faults, rendezvous receives, delivery).
#pragma once

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
#include "transport/transport.h"

namespace troupe::transport {
namespace detail {

constexpr uint32_t kMagic = 0x50525254;  // "TRRP" little-endian
constexpr uint32_t kWireVersion =
    4;  // 2: CRC-32C of the payload; 3: link id and key; 4: 8-lane sum
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

inline std::span<const uint8_t> as_bytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// Little helpers for the handshake payloads: [u16 name length][name][32 nonce or proof]...
inline void put_name(std::vector<uint8_t>& out, const std::string& name) {
  const uint16_t n = static_cast<uint16_t>(name.size());
  out.push_back(static_cast<uint8_t>(n & 0xff));
  out.push_back(static_cast<uint8_t>(n >> 8));
  out.insert(out.end(), name.begin(), name.end());
}
// A link's (id, key) as the peer must put them in the headers it sends us.
inline void append_link(std::vector<uint8_t>& out, uint64_t id, uint64_t key) {
  const auto* a = reinterpret_cast<const uint8_t*>(&id);
  const auto* b = reinterpret_cast<const uint8_t*>(&key);
  out.insert(out.end(), a, a + 8);
  out.insert(out.end(), b, b + 8);
}

inline bool get_name(std::span<const uint8_t>& in, std::string* name) {
  if (in.size() < 2) return false;
  const size_t n = in[0] | (static_cast<size_t>(in[1]) << 8);
  if (n == 0 || n > kMaxNameBytes || in.size() < 2 + n) return false;
  name->assign(reinterpret_cast<const char*>(in.data() + 2), n);
  in = in.subspan(2 + n);
  return true;
}

inline std::string sockaddr_string(const sockaddr_storage& ss) {
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

inline bool is_loopback(const sockaddr_storage& ss) {
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

}  // namespace detail

// Every file of the transport uses these unqualified (this header is private to transport/).
using namespace detail;

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

  Status init();

  Status start_listener();

  static Status resolve(const std::string& host, uint16_t port, sockaddr_storage* out);

  ucp_err_handling_mode_t err_mode_for(const sockaddr_storage& ss) const;

  // --- the progress thread ----------------------------------------------------------------

  void signal();

  void post(std::function<void()> fn);

  // Announces that the loop will wait; false (and not sleeping) when a command came in.
  bool prepare_to_sleep();

  void add_timer(std::chrono::milliseconds after, std::function<void()> fn);

  void loop();

  // Calls the handlers with what the last round received, outside the lock.
  bool deliver();

  void shutdown();

  // --- peers ------------------------------------------------------------------------------

  Peer* peer_of(ucp_ep_h ep);

  Peer& add_peer(ucp_ep_h ep, bool client, const std::string& address);

  // Marks a peer down, tells the handler (if it was up) and closes its endpoint: flushing what
  // was sent (an answer to a goodbye), or at once (a failed or refused peer).
  void close_peer(Peer& p, const std::string& reason, bool flush);

  // An orderly close: the peer is down for us at once (no more sends), the goodbye goes after
  // every message sent before it, and the endpoint closes when the peer answers it — so the
  // peer has taken in everything we sent — or after kByeTimeout.
  void say_goodbye(Peer& p, const std::string& reason);

  void reap_closing();

  void check_auth_deadlines(Clock::time_point now);

  ucp_ep_h create_ep(ucp_ep_params_t& ep, const sockaddr_storage& ss);

  static void on_conn_request(ucp_conn_request_h req, void* arg);

  static void on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status);

  // --- sending ----------------------------------------------------------------------------

  static void on_send_done(void* request, ucs_status_t status, void* user);

  void count_send_error(PeerId id);

  void post_am(Peer& p, unsigned am_id, WireHeader header,
               const std::vector<std::span<const uint8_t>>& parts,
               std::shared_ptr<const void> keep_alive);

  void send_data(PeerId id, OutMessage m, bool apply_faults);

  static OutMessage corrupted(const OutMessage& m, size_t at);

  // --- receiving --------------------------------------------------------------------------

  std::shared_ptr<uint64_t[]> alloc_words(size_t bytes) { return pool->get(bytes); }

  // The sender's endpoint, or nullptr when it did not say (we always send with REPLY).
  static ucp_ep_h sender(const ucp_am_recv_param_t* param);

  // The peer a message names in its header (link id and key), or null: unknown, stale or forged.
  Peer* peer_of_header(const void* header, size_t header_length, WireHeader* out);

  static bool is_rndv(const ucp_am_recv_param_t* param);

  static ucs_status_t am_data(void* arg, const void* header, size_t header_length, void* data,
                              size_t length, const ucp_am_recv_param_t* param);

  static void on_recv_done(void* request, ucs_status_t status, size_t, void* user);

  // A whole message arrived from an authenticated peer: incoming faults, counters, delivery.
  void received(Peer& p, Message&& m, uint64_t sum);

  // Delivers a message whose payload matches the sender's checksum; counts and drops the rest.
  void deliver_checked(Peer& p, Message&& m, uint64_t sum);

  static void count_received(Peer& p, const Message& m);

  // The handshake succeeded (either side): the peer may send and be sent to.
  void mark_up(Peer& p, const std::string& name);

  // Handshake payloads are small: take them eagerly, refuse rendezvous ones.
  static bool small_payload(const ucp_am_recv_param_t* param, size_t length);

  static ucs_status_t am_hello(void* arg, const void*, size_t, void* data, size_t length,
                               const ucp_am_recv_param_t* param);

  static ucs_status_t am_hello_ack(void* arg, const void* header, size_t header_length, void* data,
                                   size_t length, const ucp_am_recv_param_t* param);

  static ucs_status_t am_hello_nack(void* arg, const void* header, size_t header_length, void* data,
                                    size_t length, const ucp_am_recv_param_t* param);

  static ucs_status_t am_bye(void* arg, const void* header, size_t header_length, void*, size_t,
                             const ucp_am_recv_param_t*);

  static ucs_status_t am_bye_ack(void* arg, const void* header, size_t header_length, void*, size_t,
                                 const ucp_am_recv_param_t*);

  // --- commands (run on the progress thread) ------------------------------------------------

  void do_connect(const std::string& host, uint16_t port, std::chrono::milliseconds timeout,
                  std::shared_ptr<std::promise<Result<PeerId>>> waiter);
};

}  // namespace troupe::transport
