// Same-host pulls: peers on one host move large messages by cross-memory attach. The sender
// announces where the bytes are (kAmPull) and keeps them until the receiver says it is done
// (kAmPullDone); the receiver reads them with process_vm_readv on its progress thread, a few MiB
// per round, then reads the sender's pull-table slot to make sure the sender still held them.
// Everything but the bytes goes over the UCX endpoint, so failures are reported as for any
// message (docs/transport.md, Same-host pulls). Runs on the progress thread.
#include <cerrno>
#include <fstream>

#include <sys/prctl.h>
#include <sys/uio.h>

#include "transport/detail/transport_impl.h"

namespace troupe::transport {
namespace {

constexpr size_t kBootIdBytes = 36;  // /proc/sys/kernel/random/boot_id: a UUID in text
// Offer: boot id, pid, cookie address, cookie, table address, table slots.
constexpr size_t kOfferBytes = kBootIdBytes + 8 + 8 + kNonceBytes + 8 + 8;

void put_bytes(std::vector<uint8_t>& out, const void* p, size_t n) {
  const size_t at = out.size();
  out.resize(at + n);
  std::memcpy(out.data() + at, p, n);
}

void put_u64(std::vector<uint8_t>& out, uint64_t v) { put_bytes(out, &v, 8); }

uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  std::memcpy(&v, p, 8);
  return v;
}

// Reads `n` bytes at `addr` in process `pid` into `out`: true when all of them came.
bool read_remote(int64_t pid, uint64_t addr, void* out, size_t n) {
  iovec local{out, n};
  iovec remote{reinterpret_cast<void*>(addr), n};
  return process_vm_readv(static_cast<pid_t>(pid), &local, 1, &remote, 1, 0) ==
         static_cast<ssize_t>(n);
}

}  // namespace

bool Transport::Impl::init_pulls() {
  if (!opts.same_host_pull) return false;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (!(f >> id) || id.size() != kBootIdBytes) return false;
  boot_id = id;
  pull_table = std::make_unique<std::atomic<uint64_t>[]>(kPullSlots);
  for (size_t i = 0; i < kPullSlots; ++i) pull_table[i].store(0);
  free_pull_slots.clear();
  for (size_t i = kPullSlots; i > 0; --i) free_pull_slots.push_back(i - 1);
  // Under Yama's ptrace_scope 1 only a process's ancestors may read its memory; peers are not.
  // Without Yama this fails with EINVAL and changes nothing (same-user access is the rule).
  prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  return true;
}

void Transport::Impl::offer_pull(Peer& p) {
  if (!pull_table) return;
  const auto* key = reinterpret_cast<const uint8_t*>(&p.remote_key);
  p.pull_cookie = hmac_sha256(opts.cluster_token, kPullLabel, {{key, sizeof(p.remote_key)}});
  auto buf = std::make_shared<std::vector<uint8_t>>();
  buf->reserve(kOfferBytes);
  put_bytes(*buf, boot_id.data(), kBootIdBytes);
  put_u64(*buf, static_cast<uint64_t>(getpid()));
  put_u64(*buf, reinterpret_cast<uint64_t>(p.pull_cookie.data()));
  put_bytes(*buf, p.pull_cookie.data(), kNonceBytes);
  put_u64(*buf, reinterpret_cast<uint64_t>(pull_table.get()));
  put_u64(*buf, kPullSlots);
  post_am(p, kAmPullOffer, WireHeader{}, {{buf->data(), buf->size()}}, buf);
}

ucs_status_t Transport::Impl::am_pull_offer(void* arg, const void* header, size_t header_length,
                                            void* data, size_t length,
                                            const ucp_am_recv_param_t* param) {
  auto* im = static_cast<Impl*>(arg);
  WireHeader h;
  Peer* p = im->sender_up(header, header_length, &h, "bad pull offer header");
  if (!p || !im->pull_table || p->stats.pulls_from) return UCS_OK;
  if (!small_payload(param, length) || length != kOfferBytes) {
    count_malformed(*p, "pull offer of " + std::to_string(length) + " bytes");
    return UCS_OK;
  }
  const auto* in = static_cast<const uint8_t*>(data);
  // Another host (or a peer in a process we may not read) is no error: it just takes TCP.
  if (std::memcmp(in, im->boot_id.data(), kBootIdBytes) != 0) return UCS_OK;
  in += kBootIdBytes;
  const auto pid = static_cast<int64_t>(get_u64(in));
  const uint64_t cookie_at = get_u64(in + 8);
  const uint8_t* cookie = in + 16;
  const uint64_t table = get_u64(in + 16 + kNonceBytes);
  const uint64_t slots = get_u64(in + 24 + kNonceBytes);
  // The cookie is bound to this link (our key for it) and must be in the offering process's
  // memory where it says: another process of this user cannot have shown it.
  const auto* key = reinterpret_cast<const uint8_t*>(&p->key);
  const Digest want = hmac_sha256(im->opts.cluster_token, kPullLabel, {{key, sizeof(p->key)}});
  std::array<uint8_t, kNonceBytes> seen{};
  if (pid <= 0 || slots != kPullSlots || !digest_equal(want, {cookie, kNonceBytes}) ||
      !read_remote(pid, cookie_at, seen.data(), seen.size()) || !digest_equal(want, seen))
    return UCS_OK;
  p->pull_pid = pid;
  p->pull_table = table;
  p->stats.pulls_from = true;
  im->post_am(*p, kAmPullAccept, WireHeader{}, {}, nullptr);
  return UCS_OK;
}

ucs_status_t Transport::Impl::am_pull_accept(void* arg, const void* header, size_t header_length,
                                             void*, size_t, const ucp_am_recv_param_t*) {
  auto* im = static_cast<Impl*>(arg);
  WireHeader h;
  Peer* p = im->sender_up(header, header_length, &h, "bad pull accept header");
  if (p && im->pull_table) p->stats.pulls_to = true;
  return UCS_OK;
}

bool Transport::Impl::send_pull(Peer& p, const OutMessage& m, std::optional<uint64_t> sum) {
  const size_t n = m.size_bytes();
  // The bytes must outlive the send by an unknown time: only messages that say what keeps
  // them alive go this way.
  if (!p.stats.pulls_to || n < opts.pull_min_bytes || n == 0 || !m.keep_alive ||
      free_pull_slots.empty() || m.parts.size() > kMaxPullRanges)
    return false;
  const size_t slot = free_pull_slots.back();
  free_pull_slots.pop_back();
  const uint64_t id = next_pull_id++;
  pull_table[slot].store(id, std::memory_order_release);
  p.pulls_out[id] = {slot, m.keep_alive};
  auto buf = std::make_shared<std::vector<uint8_t>>();
  put_u64(*buf, slot);
  put_u64(*buf, 0);  // the number of ranges, set below
  uint64_t ranges = 0;
  for (const auto& part : m.parts) {
    if (part.empty()) continue;
    put_u64(*buf, reinterpret_cast<uint64_t>(part.data()));
    put_u64(*buf, part.size());
    ++ranges;
  }
  std::memcpy(buf->data() + 8, &ranges, 8);
  WireHeader h;
  h.type = m.type;
  // Only a corrupted copy (fault shim) carries a sum, when checksums are on.
  h.sum = opts.checksum_payloads && sum ? (*sum | 1) : 0;
  h.total_bytes = n;
  h.offset = id;
  post_am(p, kAmPull, h, {{buf->data(), buf->size()}}, buf);
  return true;
}

ucs_status_t Transport::Impl::am_pull(void* arg, const void* header, size_t header_length,
                                      void* data, size_t length, const ucp_am_recv_param_t* param) {
  auto* im = static_cast<Impl*>(arg);
  WireHeader h;
  Peer* p = im->sender_up(header, header_length, &h, "bad pull header");
  if (!p) return UCS_OK;
  if (p->stats.cut) {  // dropped, as the cut drops everything; its sender may let go once it heals
    im->pull_done(p->id, h.offset);
    return UCS_OK;
  }
  const std::string what =
      "pull (type " + std::to_string(h.type) + ", " + std::to_string(h.total_bytes) + " bytes)";
  std::string bad;
  const auto* in = static_cast<const uint8_t*>(data);
  uint64_t slot = 0, ranges = 0, total = 0;
  std::vector<std::pair<uint64_t, uint64_t>> parts;
  if (!p->stats.pulls_from) {
    bad = "from a peer whose memory we cannot read";
  } else if (!small_payload(param, length) || length < 16) {
    bad = "with " + std::to_string(length) + " bytes of ranges";
  } else {
    slot = get_u64(in);
    ranges = get_u64(in + 8);
    if (slot >= kPullSlots || ranges == 0 || ranges > kMaxPullRanges || length != 16 + 16 * ranges)
      bad = "with slot " + std::to_string(slot) + " and " + std::to_string(ranges) + " ranges in " +
            std::to_string(length) + " bytes";
    for (uint64_t i = 0; bad.empty() && i < ranges; ++i) {
      const uint64_t at = get_u64(in + 16 + 16 * i), len = get_u64(in + 24 + 16 * i);
      if (len == 0 || len > h.total_bytes - total) bad = "whose ranges do not add up to its size";
      total += len;
      parts.emplace_back(at, len);
    }
    if (bad.empty() && total != h.total_bytes) bad = "whose ranges do not add up to its size";
  }
  if (!bad.empty()) {
    count_malformed(*p, what + " " + bad);
    im->pull_done(p->id, h.offset);  // the sender may let go of it
    return UCS_OK;
  }
  if (h.total_bytes > im->opts.max_message_bytes) {
    ++p->stats.oversized;
    im->pull_done(p->id, h.offset);
    return UCS_OK;
  }
  if (p->assembling) fail(*p->assembling, "it stopped short: the next message began");
  p->assembling.reset();
  auto msg = std::make_shared<Incoming>();
  msg->msg.peer = p->id;
  msg->msg.type = h.type;
  msg->msg.size_bytes = h.total_bytes;
  msg->verify = h.sum != 0;
  msg->sum = h.sum;
  msg->all_announced = true;
  msg->announced_bytes = h.total_bytes;
  msg->parts_pending = 1;  // until it is read and its slot checked
  msg->pull_ranges = std::move(parts);
  msg->pull_id = h.offset;
  msg->pull_slot = slot;
  p->inbox.push_back(msg);
  im->pulls_waiting.push_back(std::move(msg));
  return UCS_OK;
}

size_t Transport::Impl::read_pull(Incoming& in, Peer& p, size_t budget) {
  // The next piece: [pulled_bytes, pulled_bytes + want) of the message, from its ranges.
  const size_t total = in.msg.size_bytes, from = in.pulled_bytes;
  const size_t want = std::min(budget, total - from);
  std::vector<iovec> remote;
  size_t pos = 0;
  for (const auto& [at, len] : in.pull_ranges) {
    const size_t lo = std::max(pos, from), hi = std::min(pos + len, from + want);
    if (lo < hi) remote.push_back({reinterpret_cast<void*>(at + (lo - pos)), hi - lo});
    pos += len;
  }
  iovec local{reinterpret_cast<uint8_t*>(in.msg.storage.get()) + from, want};
  const ssize_t got =
      process_vm_readv(static_cast<pid_t>(p.pull_pid), &local, 1, remote.data(), remote.size(), 0);
  if (got != static_cast<ssize_t>(want)) {
    fail(in, got < 0 && errno == ESRCH ? "its sender is gone"
                                       : "the sender's memory could not be read");
    return 0;
  }
  in.pulled_bytes += want;
  if (in.pulled_bytes == total) {
    // Read after the bytes: a slot that still holds the id proves they were the sender's when
    // we read them (it frees a slot before the bytes).
    uint64_t held = 0;
    if (!read_remote(p.pull_pid, p.pull_table + 8 * in.pull_slot, &held, 8) || held != in.pull_id) {
      fail(in, "its sender withdrew it before it was read");
      return want;
    }
    --in.parts_pending;
    ++p.stats.pulled;
  }
  fragment_landed(in, from, want);  // sums it if the sender sent a sum; completes it
  return want;
}

bool Transport::Impl::run_pulls() {
  bool did = false;
  size_t budget = kPullStepBytes;
  while (!pulls_waiting.empty() && budget > 0) {
    did = true;
    std::shared_ptr<Incoming> in = pulls_waiting.front();
    auto it = peers.find(in->msg.peer);
    Peer* p = it == peers.end() || !it->second.ep ? nullptr : &it->second;
    if (in->state == Incoming::State::kAssembling && !p) fail(*in, "the link closed");
    if (in->state == Incoming::State::kAssembling && !in->msg.storage) {
      try {
        in->msg.storage = alloc_words(in->msg.size_bytes);
      } catch (const std::bad_alloc&) {
        fail(*in, "no memory for it");
      }
    }
    if (in->state == Incoming::State::kAssembling) budget -= read_pull(*in, *p, budget);
    if (in->state == Incoming::State::kAssembling) continue;  // more to read, budget allowing
    pulls_waiting.pop_front();
    if (p) {
      pull_done(p->id, in->pull_id);
      drain_inbox(p->id);
    }
  }
  return did;
}

void Transport::Impl::pull_done(PeerId id, uint64_t pull_id) {
  auto it = peers.find(id);
  if (it == peers.end() || !it->second.ep) return;
  if (it->second.stats.cut) {
    it->second.pulls_done_held.push_back(pull_id);
    return;
  }
  WireHeader h;
  h.offset = pull_id;
  post_am(it->second, kAmPullDone, h, {}, nullptr);
}

ucs_status_t Transport::Impl::am_pull_done(void* arg, const void* header, size_t header_length,
                                           void*, size_t, const ucp_am_recv_param_t*) {
  auto* im = static_cast<Impl*>(arg);
  WireHeader h;
  // Not only from an up peer: one we said goodbye to still reads what we sent before.
  Peer* p = im->peer_of_header(header, header_length, &h);
  if (!p) {
    ++im->unauth_dropped;
    return UCS_OK;
  }
  auto out = p->pulls_out.find(h.offset);
  if (out == p->pulls_out.end()) {
    count_malformed(*p, "pull done for no pull of ours (" + std::to_string(h.offset) + ")");
    return UCS_OK;
  }
  im->release_pull_slot(out->second.first);
  p->pulls_out.erase(out);  // lets go of the bytes
  return UCS_OK;
}

void Transport::Impl::revoke_pulls(Peer& p) {
  // Slots first, then the bytes: a receiver still reading finds the slot empty afterwards.
  for (const auto& [id, held] : p.pulls_out) release_pull_slot(held.first);
  p.pulls_out.clear();
}

void Transport::Impl::send_held_pull_dones(PeerId id) {
  auto it = peers.find(id);
  if (it == peers.end()) return;
  std::vector<uint64_t> held;
  held.swap(it->second.pulls_done_held);
  for (uint64_t pull_id : held) pull_done(id, pull_id);  // held again if cut again meanwhile
}

void Transport::Impl::release_pull_slot(size_t slot) {
  pull_table[slot].store(0, std::memory_order_seq_cst);  // before the bytes go (the callers)
  free_pull_slots.push_back(slot);
}

}  // namespace troupe::transport
