// Test-only access to a transport's wire: hand-made data frames sent over an authenticated link,
// and the receiver's fragment bookkeeping, so that tests can check how a receiver treats
// malformed fragment sequences. Users: tests/transport/ only (production code never includes a
// detail/ header of another folder, and nothing in transport/ calls this).
// Thread safety: like Transport's public methods (any thread; the work runs on its progress
// thread, and each call waits for it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "base/result.h"
#include "transport/transport.h"

namespace troupe::transport::detail {

/// Active message ids for RawFrame::am (detail/transport_impl.h, AmId; checked there).
struct RawAm {
  static constexpr unsigned kData = 4, kSum = 7, kPullOffer = 8, kPull = 10, kPullDone = 11;
};

/// One data active message as it goes on the wire. The defaults are a well-formed header for
/// this link; each field may be set to anything, which is the point.
struct RawFrame {
  std::optional<uint32_t> magic;    // default: the real magic
  std::optional<uint32_t> version;  // default: this build's wire version
  uint64_t type = 0;
  uint64_t sum = 0;  // 0: no checksum; 1: one comes later; 2: in a trailer; else the checksum
  unsigned am = RawAm::kData;  // kSum: a checksum trailer; kPull...: same-host pulls
  uint64_t total_bytes = 0;
  uint64_t offset = 0;
  std::optional<uint64_t> key;  // default: the link's key as the receiver gave it
  // Header bytes that go: fewer than the 56 of a header truncate it, more append zeros.
  std::optional<size_t> header_bytes;
  std::vector<uint8_t> payload;
  enum class Protocol : uint8_t { kAuto, kEager, kRendezvous } protocol = Protocol::kAuto;
};

/// What a transport's receive side holds at one moment (read on its progress thread).
struct ReceiveState {
  size_t rndv_waiting = 0;          // rendezvous fragments waiting for a receive slot
  size_t rndv_in_flight = 0;        // receives UCX is running
  size_t rndv_bytes_in_flight = 0;  // their bytes (at most kMaxReceiveBytesInFlight but one)
  size_t inbox_messages = 0;        // messages, over all peers, not yet delivered or dropped
  size_t assembling = 0;            // peers with a message whose next fragment is expected
};

struct TransportTesting {
  /// Posts `frame` to `peer` on the progress thread, in order with earlier send()s, and waits
  /// until UCX has taken it. Errors: unknown peer, link down, UCX refused the send.
  static Status send_raw_frame(Transport& t, PeerId peer, const RawFrame& frame);
  static ReceiveState receive_state(const Transport& t);
  /// Sets slot `slot` of `t`'s pull table (same-host pulls) to `id`: a pull it holds open.
  static void set_pull_slot(Transport& t, size_t slot, uint64_t id);

 private:
  static Status send_on_thread(Transport::Impl& im, PeerId peer, const RawFrame& frame);
};

}  // namespace troupe::transport::detail
