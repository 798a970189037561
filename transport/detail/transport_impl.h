// Private to transport/: the wire constants and header, the handshake payload helpers, and
// Transport::Impl, the state of one transport and the methods its progress thread runs.
// transport.cc: set-up, the progress loop, shutdown and the public API; transport_link.cc:
// peers, the authenticated handshake and orderly close; transport_data.cc: sending and
// receiving data (checksums, faults, rendezvous receives, delivery).
#pragma once

#include <netdb.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <optional>
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
// 2: CRC-32C of the payload; 3: link id and key; 4: 8-lane sum; 5: fragments (total, offset);
// 6: the checksum of a fragmented message in a trailer (kAmSum) after its fragments;
// 7: same-host pulls (kAmPullOffer .. kAmPullDone).
constexpr uint32_t kWireVersion = 7;
enum AmId : unsigned {
  kAmHello = 1,
  kAmHelloAck = 2,
  kAmHelloNack = 3,
  kAmData = 4,
  kAmBye = 5,
  kAmByeAck = 6,
  kAmSum = 7,  // the checksum of the fragmented data message before it (header only)
  // Same-host pulls (transport_pull.cc): "you may read my memory, check with this cookie";
  // "I checked it" (header only); a data message to read (header: type, sum, total_bytes,
  // offset = pull id; payload: slot and byte ranges); "done reading pull id" (header only).
  kAmPullOffer = 8,
  kAmPullAccept = 9,
  kAmPull = 10,
  kAmPullDone = 11,
};
// A pull's byte ranges: at most this many; the receiver reads at most kPullStepBytes per round
// of the progress loop, so that other peers' messages do not wait behind a large one.
constexpr size_t kMaxPullRanges = 64;
constexpr size_t kPullStepBytes = size_t{4} << 20;
// The sender's table of pulls it holds open (slot -> pull id, 0 = free): the receiver reads the
// slot after the bytes, so a pull the sender gave up (its link failed) is never delivered.
constexpr size_t kPullSlots = 1024;
constexpr size_t kNonceBytes = 32;
constexpr size_t kMaxNameBytes = 256;
constexpr std::string_view kHelloLabel = "troupe-hello";
constexpr std::string_view kHelloReplyLabel = "troupe-hello-reply";
constexpr std::string_view kPullLabel = "troupe-pull";
constexpr std::chrono::milliseconds kByeTimeout{1000};  // wait this long for a bye's answer
// Bytes of rendezvous receives (fragments) running at once per transport, at most (one always
// may). Over shared memory the receiver copies them one after the other anyway, and more only
// adds buffers that fall out of the cache; over TCP each receive costs the sender a round trip
// before its data flows, so small ones need many in flight (64 KiB messages: 32 here; with two
// at a time they streamed at a third of the rate).
constexpr size_t kMaxReceiveBytesInFlight = size_t{2} << 20;
// Data messages larger than this go in fragments of at most this size. The receiver checksums
// each fragment as soon as it lands, while the bytes are still in cache (a whole 64 MiB message
// checked after its copy is read back from DRAM), and the sender checksums the next fragment
// while the receiver copies the previous one instead of before sending anything.
constexpr size_t kFragmentBytes = size_t{1} << 20;
// `sum` of a fragmented message's last fragment when its checksum follows in a kAmSum trailer.
// The sender sums each fragment once UCX is done with its bytes, just after the kernel's copy
// (TCP) or the peer's read (shared memory) brought them into the cache; summed before posting,
// the fragments of a 64 MiB message were read from DRAM twice.
constexpr uint64_t kSumFollows = 2;

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
  // A data message over kFragmentBytes travels as several active messages ("fragments"), sent
  // back to back in order, each `offset` bytes into the message of `total_bytes`. Only the last
  // carries the checksum (odd), or kSumFollows: a kAmSum with the same type and total_bytes
  // brings it later (trailers come in the order of their messages); the others say in `sum`
  // whether one comes (1) or not (0).
  uint64_t total_bytes = 0;
  uint64_t offset = 0;
};
static_assert(sizeof(WireHeader) == 56);

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

}  // namespace detail

// Every file of the transport uses these unqualified (this header is private to transport/).
using namespace detail;

struct Transport::Impl {
  // A data message from its first fragment's arrival to its delivery.
  struct Incoming {
    enum class State : uint8_t {
      kAssembling,  // fragments announced or being received
      kDone,        // every byte arrived (and was checksummed, when the sender sent a sum)
      kFailed,      // a fragment failed, broke the sequence, or was abandoned: dropped
    };
    State state = State::kAssembling;
    Message msg;                 // storage: allocated with the first fragment's receive
    uint64_t sum = 0;            // the sender's checksum (from the last fragment or the trailer)
    bool verify = false;         // the sender sent a checksum
    bool sum_pending = false;    // it comes in a trailer (kAmSum) that has not arrived yet
    bool all_announced = false;  // the last fragment arrived (its data may still be coming)
    size_t announced_bytes = 0;  // fragments that arrived so far cover [0, announced_bytes)
    size_t parts_pending = 0;    // rendezvous fragments not yet received
    // The checksum of [0, checked_bytes), run as fragments land, and fragments that landed past
    // a gap (out of order): offset -> length.
    Checksum running;
    size_t checked_bytes = 0;
    std::map<size_t, size_t> landed;
    const char* why = "";  // kFailed: why (for the log)
    // A same-host pull: the sender's byte ranges, its slot and id, and how far reading got.
    std::vector<std::pair<uint64_t, uint64_t>> pull_ranges;  // (address, length)
    uint64_t pull_id = 0, pull_slot = 0;
    size_t pulled_bytes = 0;
  };
  // A rendezvous fragment waiting for a receive slot: UCX's descriptor and where it goes.
  struct Receive {
    std::shared_ptr<Incoming> in;
    void* desc = nullptr;
    size_t offset = 0, length = 0;
  };
  // A fragmented message whose checksum goes in a trailer: summed fragment by fragment, in
  // order, as UCX completes their sends.
  struct Outgoing {
    PeerId peer = 0;
    uint64_t type = 0, total_bytes = 0;
    std::vector<std::vector<std::span<const uint8_t>>> fragments;  // each fragment's byte ranges
    std::vector<bool> sent;  // UCX completed the fragment's send
    size_t summed = 0;       // fragments [0, summed) are in `running`
    Checksum running;
    bool failed = false;  // a fragment did not go: no trailer (the link is failing)
    std::shared_ptr<const void> keep_alive;
  };
  struct Peer {
    PeerId id = 0;
    ucp_ep_h ep = nullptr;
    bool client = false;       // we connected to it
    bool up = false;           // authenticated
    bool down = false;         // closed or failed; waiting to be forgotten
    bool bye_sent = false;     // we said goodbye and wait for its answer before closing
    bool bye_pending = false;  // it said goodbye; we answer once its inbox is delivered
    uint64_t key = 0;          // ours: messages to us on this link carry (id, key)
    uint64_t remote_id = 0;    // theirs: what we put in the headers we send
    uint64_t remote_key = 0;
    std::array<uint8_t, kNonceBytes> nonce{};  // client: the nonce of our hello
    Clock::time_point since;
    std::shared_ptr<std::promise<Result<PeerId>>> waiter;  // client: connect() waiting
    LinkStats stats;
    // Data messages from this peer that arrived but wait for an earlier rendezvous one: the
    // handler gets them in the order they were sent, though small ones come in at once.
    std::deque<std::shared_ptr<Incoming>> inbox;
    std::shared_ptr<Incoming> assembling;  // the message whose next fragment is expected
    // Messages whose checksum trailer has not arrived, in the order the trailers will come.
    std::deque<std::shared_ptr<Incoming>> awaiting_sum;
    // Our fragmented messages to it whose trailer has not gone yet, in send order.
    std::deque<std::shared_ptr<Outgoing>> sums_due;
    // Same-host pulls: its process and pull table (from its offer, checked).
    int64_t pull_pid = 0;
    uint64_t pull_table = 0;
    // Our offer's cookie for it, which it reads back out of our memory: HMAC(token,
    // "troupe-pull" | its link key), so only this process, on this link, can have shown it.
    std::array<uint8_t, kNonceBytes> pull_cookie{};
    // Our messages it has not finished reading: pull id -> (slot, what keeps the bytes alive).
    std::map<uint64_t, std::pair<size_t, std::shared_ptr<const void>>> pulls_out;
    // Its pulls we are done with (read, refused or dropped) while the fault shim cut the link:
    // the "done" goes when the cut is lifted, so that it lets go of their bytes then.
    std::vector<uint64_t> pulls_done_held;
  };
  struct SendCtx {
    Impl* im = nullptr;
    PeerId peer = 0;
    WireHeader header;
    std::vector<ucp_dt_iov_t> iov;
    std::shared_ptr<const void> keep_alive;
    std::shared_ptr<Outgoing> out;  // set for a fragment whose message's sum goes in a trailer
    size_t fragment = 0;
  };
  struct RecvCtx {
    Impl* im = nullptr;
    std::shared_ptr<Incoming> in;
    size_t offset = 0, length = 0;
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
  // Rendezvous fragments whose receive has not started, across peers in arrival order, and how
  // many receives UCX is running. Few run at once so that each lands in a buffer the handler
  // just gave back, still in cache: with a receive started for every announced message (64 at
  // 1 MiB in the bench), copy and checksum each ran at DRAM speed, 3-4x slower.
  std::deque<Receive> rndv_waiting;
  size_t rndv_in_flight = 0, rndv_bytes_in_flight = 0;
  size_t sends_in_flight = 0;  // sends UCX has not completed yet
  // Same-host pulls: ours to read, in arrival order; this host's boot id (told in offers) and
  // the table of our pulls in flight (kPullSlots).
  std::deque<std::shared_ptr<Incoming>> pulls_waiting;
  std::string boot_id;
  std::unique_ptr<std::atomic<uint64_t>[]> pull_table;
  std::vector<size_t> free_pull_slots;
  uint64_t next_pull_id = 1;
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

  ucp_err_handling_mode_t err_mode() const;

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

  ucp_ep_h create_ep(ucp_ep_params_t& ep);

  static void on_conn_request(ucp_conn_request_h req, void* arg);

  static void on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status);

  // --- sending ----------------------------------------------------------------------------

  static void on_send_done(void* request, ucs_status_t status, void* user);

  void count_send_error(PeerId id);

  // `out`, `fragment`: a fragment whose checksum goes in a trailer (fragment_sent follows).
  void post_am(Peer& p, unsigned am_id, WireHeader header,
               const std::vector<std::span<const uint8_t>>& parts,
               std::shared_ptr<const void> keep_alive, std::shared_ptr<Outgoing> out = nullptr,
               size_t fragment = 0);

  // UCX is done with a fragment of `out` (ok) or failed it: sums the fragments now complete in
  // order, then posts the trailers that are due.
  void fragment_sent(Outgoing& out, size_t fragment, bool ok);

  // Posts the peer's trailers whose messages are summed, in send order; with `now`, first sums
  // what is left of every message (a goodbye must follow all of them).
  void post_trailers(Peer& p, bool now);

  void send_data(PeerId id, OutMessage m, bool apply_faults);

  // Posts a message as fragments of at most kFragmentBytes, checksumming each before it goes
  // (unless `sum` is already known: a corrupted copy carries the original's).
  void send_fragments(Peer& p, const OutMessage& m, std::optional<uint64_t> sum);

  static OutMessage corrupted(const OutMessage& m, size_t at);

  // --- receiving --------------------------------------------------------------------------

  std::shared_ptr<uint64_t[]> alloc_words(size_t bytes) { return pool->get(bytes); }

  // The sender's endpoint, or nullptr when it did not say (we always send with REPLY).
  static ucp_ep_h sender(const ucp_am_recv_param_t* param);

  // The peer a message names in its header (link id and key), or null: unknown, stale or forged.
  Peer* peer_of_header(const void* header, size_t header_length, WireHeader* out);

  // The live link a header names with its right key, even when the rest of the header is bad
  // (wrong size, magic or version); null when it names none (unknown, forged, or too short).
  Peer* link_of(const void* header, size_t header_length);

  // The authenticated, up peer a data or trailer header comes from, or null, counted: in the
  // link's `malformed` (as `bad_header`) when the header names a live link with its key but is
  // otherwise bad, else in unauthenticated_dropped.
  Peer* sender_up(const void* header, size_t header_length, WireHeader* out,
                  const char* bad_header);

  static bool is_rndv(const ucp_am_recv_param_t* param);

  static ucs_status_t am_data(void* arg, const void* header, size_t header_length, void* data,
                              size_t length, const ucp_am_recv_param_t* param);

  static void on_recv_done(void* request, ucs_status_t status, size_t, void* user);

  // A checksum trailer (kAmSum): completes the oldest message of the peer waiting for one.
  static ucs_status_t am_sum(void* arg, const void* header, size_t header_length, void*,
                             size_t length, const ucp_am_recv_param_t* param);

  // The message a fragment belongs to (a new one for offset 0), or null: the fragment does not
  // continue the peer's message in progress (counted as malformed, with that message).
  std::shared_ptr<Incoming> message_of(Peer& p, const WireHeader& h, size_t length);

  // Starts waiting rendezvous receives within kMaxReceiveBytesInFlight (from the
  // progress loop, never from a UCX callback); true if it started or released any.
  bool start_receives();

  void start_receive(Receive r);

  // A fragment's bytes are in the message's buffer: checksum what is contiguous, and complete
  // the message when it was the last.
  void fragment_landed(Incoming& in, size_t offset, size_t length);

  // Marks a message still assembling done once every fragment has landed and its checksum (if
  // one follows in a trailer) has arrived.
  static void complete_if_whole(Incoming& in);

  static void fail(Incoming& in, const char* why);

  // Counts a dropped fragment or message in the link's `malformed` and logs it (rate-limited).
  static void count_malformed(Peer& p, const std::string& why);

  // Hands on the messages at the head of a peer's inbox that are complete.
  void drain_inbox(PeerId id);

  // Abandons what a peer's inbox holds (the peer is going): rendezvous fragments not started are
  // released to UCX, which tells their sender; receives in flight are dropped when they finish.
  void drop_inbox(Peer& p);

  // A whole message arrived from an authenticated peer: incoming faults, counters, delivery.
  // `computed`: the checksum of its bytes when already known (taken as they landed).
  void received(Peer& p, Message&& m, uint64_t sum, std::optional<uint64_t> computed);

  // Delivers a message whose payload matches the sender's checksum; counts and drops the rest.
  void deliver_checked(Peer& p, Message&& m, uint64_t sum, std::optional<uint64_t> computed);

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

  // Acknowledges a peer's goodbye (everything it sent before is delivered) and closes the link.
  void answer_bye(Peer& p);

  static ucs_status_t am_bye_ack(void* arg, const void* header, size_t header_length, void*, size_t,
                                 const ucp_am_recv_param_t*);

  // --- same-host pulls (transport_pull.cc) -----------------------------------------------

  // At start: this host's boot id and the pull table; false when pulls cannot work here.
  bool init_pulls();

  // A peer came up: offer it to read our memory (when pulls are on and could work).
  void offer_pull(Peer& p);

  // Sends a message as a pull when the peer takes them and it is large enough; false: not sent.
  bool send_pull(Peer& p, const OutMessage& m, std::optional<uint64_t> sum);

  // Reads the oldest waiting pulls (at most kPullStepBytes); true if it did any work.
  bool run_pulls();

  // Reads the next at most `budget` bytes of pull `in` from `p`'s memory (and, after the last,
  // checks the sender's slot); fails `in` when it cannot. The bytes read.
  size_t read_pull(Incoming& in, Peer& p, size_t budget);

  // Frees one of our pull-table slots (before the bytes it held are released).
  void release_pull_slot(size_t slot);

  // Tells the sender we are done with a pull (read, failed or dropped).
  void pull_done(PeerId id, uint64_t pull_id);

  // Gives up our pulls to a peer that is going: frees their slots first, then their bytes.
  void revoke_pulls(Peer& p);
  // The fault shim's cut of the link is over: the "done"s held back during it go.
  void send_held_pull_dones(PeerId id);

  static ucs_status_t am_pull_offer(void* arg, const void* header, size_t header_length, void* data,
                                    size_t length, const ucp_am_recv_param_t* param);
  static ucs_status_t am_pull_accept(void* arg, const void* header, size_t header_length, void*,
                                     size_t, const ucp_am_recv_param_t*);
  static ucs_status_t am_pull(void* arg, const void* header, size_t header_length, void* data,
                              size_t length, const ucp_am_recv_param_t* param);
  static ucs_status_t am_pull_done(void* arg, const void* header, size_t header_length, void*,
                                   size_t, const ucp_am_recv_param_t*);

  // --- commands (run on the progress thread) ------------------------------------------------

  void do_connect(const std::string& host, uint16_t port, std::chrono::milliseconds timeout,
                  std::shared_ptr<std::promise<Result<PeerId>>> waiter);
};

}  // namespace troupe::transport
