// Data of the transport: sending (faults, fragments, checksums, active messages) and receiving
// (eager and rendezvous fragments into pooled buffers, a few receives at a time, checksums as
// fragments land, delivery in send order per peer). Runs on the progress thread (see
// detail/transport_impl.h).
#include "transport/detail/transport_impl.h"

namespace troupe::transport {

void Transport::Impl::on_send_done(void* request, ucs_status_t status, void* user) {
  auto* ctx = static_cast<SendCtx*>(user);
  --ctx->im->sends_in_flight;
  if (status != UCS_OK) ctx->im->count_send_error(ctx->peer);
  if (ctx->out) ctx->im->fragment_sent(*ctx->out, ctx->fragment, status == UCS_OK);
  delete ctx;
  ucp_request_free(request);
}

void Transport::Impl::count_send_error(PeerId id) {
  auto it = peers.find(id);
  if (it != peers.end()) ++it->second.stats.send_errors;
}

void Transport::Impl::post_am(Peer& p, unsigned am_id, WireHeader header,
                              const std::vector<std::span<const uint8_t>>& parts,
                              std::shared_ptr<const void> keep_alive, std::shared_ptr<Outgoing> out,
                              size_t fragment) {
  auto* ctx = new SendCtx;
  ctx->im = this;
  ctx->peer = p.id;
  ctx->header = header;
  ctx->keep_alive = std::move(keep_alive);
  ctx->out = std::move(out);
  ctx->fragment = fragment;
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
  if (r == nullptr || UCS_PTR_IS_ERR(r)) {
    const bool ok = r == nullptr;
    if (!ok) ++p.stats.send_errors;
    if (ctx->out) fragment_sent(*ctx->out, ctx->fragment, ok);
    delete ctx;
  } else {
    ++sends_in_flight;
  }
}

void Transport::Impl::send_data(PeerId id, OutMessage m, bool apply_faults) {
  auto it = peers.find(id);
  if (it == peers.end()) return;
  Peer& p = it->second;
  if (!p.up || p.stats.cut) {
    ++p.stats.send_errors;
    return;
  }
  const size_t n = m.size_bytes();
  std::optional<uint64_t> sum;  // known before sending only when a fault corrupts the copy
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
        case FaultAction::kCorrupt: {
          Checksum c;  // of the original: the receiver must notice the corrupted copy
          for (const auto& part : m.parts) c.update(part);
          sum = c.final();
          m = corrupted(m, d->corrupt_at);
          break;
        }
      }
    }
  }
  ++p.stats.messages_sent;
  p.stats.bytes_sent += n;
  if (!send_pull(p, m, sum)) send_fragments(p, m, sum);
}

void Transport::Impl::send_fragments(Peer& p, const OutMessage& m, std::optional<uint64_t> sum) {
  const size_t n = m.size_bytes();
  const bool checksums = opts.checksum_payloads;
  // Equal fragments (8-byte multiples), so that none is small enough to go eagerly.
  const size_t num_fragments = std::max<size_t>(1, (n + kFragmentBytes - 1) / kFragmentBytes);
  const size_t fragment_bytes = ((n + num_fragments - 1) / num_fragments + 7) / 8 * 8;
  WireHeader h;
  h.type = m.type;
  h.total_bytes = n;
  Checksum running;
  // Several fragments, sum unknown: each fragment is summed after UCX is done with its bytes,
  // and the sum follows in a trailer (see kSumFollows).
  std::shared_ptr<Outgoing> out;
  if (checksums && !sum && num_fragments > 1) {
    out = std::make_shared<Outgoing>();
    out->peer = p.id;
    out->type = m.type;
    out->total_bytes = n;
    out->fragments.reserve(num_fragments);
    out->sent.assign(num_fragments, false);
    out->keep_alive = m.keep_alive;
    p.sums_due.push_back(out);
  }
  size_t part_idx = 0, part_off = 0;  // where the next fragment starts in m.parts
  std::vector<std::span<const uint8_t>> parts;
  for (size_t off = 0;; off += fragment_bytes) {  // an empty message is one empty fragment
    const size_t len = std::min(fragment_bytes, n - off);
    parts.clear();
    for (size_t left = len; left > 0;) {
      const auto& part = m.parts[part_idx];
      const size_t take = std::min(left, part.size() - part_off);
      if (take > 0) parts.push_back(part.subspan(part_off, take));
      left -= take;
      part_off += take;
      if (part_off == part.size()) ++part_idx, part_off = 0;
    }
    if (out)
      out->fragments.push_back(parts);
    else if (checksums && !sum)
      for (const auto& s : parts) running.update(s);
    const bool last = off + len >= n;
    h.offset = off;
    // 0 = no checksum; on the last fragment the checksum itself (always odd) or kSumFollows,
    // else 1 = one comes.
    h.sum = !checksums ? 0 : !last ? 1 : out ? kSumFollows : (sum ? *sum : running.final()) | 1;
    post_am(p, kAmData, h, parts, m.keep_alive, out, out ? out->fragments.size() - 1 : 0);
    if (last) break;
    // Let UCX move what it can before the next fragment's checksum: over TCP the sender pushes
    // the bytes itself, and a 64 MiB message summed in one go left the socket idle meanwhile.
    ucp_worker_progress(worker);
    if (!p.ep || p.down) {  // closed from a callback meanwhile: the rest cannot go
      ++p.stats.send_errors;
      if (out) out->failed = true;
      return;
    }
  }
}

void Transport::Impl::fragment_sent(Outgoing& out, size_t fragment, bool ok) {
  if (!ok) {
    out.failed = true;
  } else if (fragment < out.sent.size()) {
    out.sent[fragment] = true;
    // In order (the sum is position-dependent); completions come in order in practice.
    while (out.summed < out.fragments.size() && out.sent[out.summed]) {
      for (const auto& s : out.fragments[out.summed]) out.running.update(s);
      ++out.summed;
    }
  }
  auto it = peers.find(out.peer);
  if (it != peers.end()) post_trailers(it->second, false);
}

void Transport::Impl::post_trailers(Peer& p, bool now) {
  while (!p.sums_due.empty()) {
    Outgoing& out = *p.sums_due.front();
    if (out.failed || !p.ep || p.stats.cut) {
      // The link is failing (or cut): the receiver drops these messages with it. Later trailers
      // would complete the wrong messages there, so none goes.
      p.sums_due.clear();
      return;
    }
    if (out.summed < out.sent.size()) {
      if (!now || out.fragments.size() < out.sent.size()) return;  // not all posted yet
      for (; out.summed < out.fragments.size(); ++out.summed)
        for (const auto& s : out.fragments[out.summed]) out.running.update(s);
    }
    WireHeader h;
    h.type = out.type;
    h.total_bytes = out.total_bytes;
    h.offset = out.total_bytes;
    h.sum = out.running.final() | 1;
    p.sums_due.pop_front();
    post_am(p, kAmSum, h, {}, nullptr);
  }
}

OutMessage Transport::Impl::corrupted(const OutMessage& m, size_t at) {
  std::vector<uint8_t> flat;
  flat.reserve(m.size_bytes());
  for (const auto& s : m.parts) flat.insert(flat.end(), s.begin(), s.end());
  if (!flat.empty()) flat[at % flat.size()] ^= 0x5a;
  return copy_message(m.type, flat);
}

Transport::Impl::Peer* Transport::Impl::link_of(const void* header, size_t header_length) {
  if (header_length < offsetof(WireHeader, key) + sizeof(uint64_t)) return nullptr;
  uint64_t link = 0, key = 0;
  std::memcpy(&link, static_cast<const uint8_t*>(header) + offsetof(WireHeader, link), 8);
  std::memcpy(&key, static_cast<const uint8_t*>(header) + offsetof(WireHeader, key), 8);
  auto it = peers.find(link);
  if (it == peers.end() || it->second.key != key || !it->second.ep) return nullptr;
  return &it->second;
}

Transport::Impl::Peer* Transport::Impl::sender_up(const void* header, size_t header_length,
                                                  WireHeader* out, const char* bad_header) {
  Peer* p = peer_of_header(header, header_length, out);
  if (!p) {
    // A header that names a live link with its key comes from that peer, whatever else is
    // wrong with it: count it there (a bad header is the peer's bug, not an intruder).
    if (Peer* q = link_of(header, header_length); q && q->up)
      count_malformed(*q,
                      std::string(bad_header) + " (" + std::to_string(header_length) + " bytes)");
    else
      ++unauth_dropped;  // no such link, a forged key, or too short to name one
    return nullptr;
  }
  if (!p->up) {
    ++unauth_dropped;  // a peer not (or no longer) up
    return nullptr;
  }
  return p;
}

Transport::Impl::Peer* Transport::Impl::peer_of_header(const void* header, size_t header_length,
                                                       WireHeader* out) {
  if (header_length != sizeof(WireHeader)) return nullptr;
  std::memcpy(out, header, sizeof(WireHeader));
  if (out->magic != kMagic || out->version != kWireVersion) return nullptr;
  return link_of(header, header_length);
}

bool Transport::Impl::is_rndv(const ucp_am_recv_param_t* param) {
  return (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
}

ucs_status_t Transport::Impl::am_data(void* arg, const void* header, size_t header_length,
                                      void* data, size_t length, const ucp_am_recv_param_t* param) {
  auto* im = static_cast<Impl*>(arg);
  WireHeader h;
  Peer* p = im->sender_up(header, header_length, &h, "bad frame header");
  if (!p) return UCS_OK;  // counted; an unread rendezvous is dropped by UCX
  if (h.total_bytes > im->opts.max_message_bytes) {
    if (h.offset == 0) ++p->stats.oversized;  // once per message
    return UCS_OK;
  }
  if (p->stats.cut) return UCS_OK;
  // The common case first: a whole message that came eagerly, with nothing before it waiting.
  if (!is_rndv(param) && h.offset == 0 && length == h.total_bytes && h.sum != kSumFollows &&
      p->inbox.empty() && !p->assembling) {
    Message m;
    m.peer = p->id;
    m.type = h.type;
    m.size_bytes = length;
    m.storage = im->alloc_words(length);
    if (length) std::memcpy(m.storage.get(), data, length);
    im->received(*p, std::move(m), h.sum, std::nullopt);
    return UCS_OK;
  }
  std::shared_ptr<Incoming> in = im->message_of(*p, h, length);
  if (!in) {                 // malformed: counted; an unread rendezvous is dropped by UCX
    im->drain_inbox(p->id);  // the message it failed may be at the head: count it now
    return UCS_OK;
  }
  if (!is_rndv(param)) {
    if (!in->msg.storage) in->msg.storage = im->alloc_words(in->msg.size_bytes);
    if (length)
      std::memcpy(reinterpret_cast<uint8_t*>(in->msg.storage.get()) + h.offset, data, length);
    im->fragment_landed(*in, h.offset, length);
    im->drain_inbox(p->id);
    return UCS_OK;
  }
  if (in->state != Incoming::State::kAssembling) return UCS_OK;  // UCX drops the rendezvous
  // Rendezvous: keep UCX's descriptor (UCS_INPROGRESS) until the progress loop has a receive
  // slot for it (start_receives). Never started here: releasing a descriptor from inside its
  // own callback is not something UCX allows.
  ++in->parts_pending;
  im->rndv_waiting.push_back({in, data, h.offset, length});
  return UCS_INPROGRESS;
}

std::shared_ptr<Transport::Impl::Incoming> Transport::Impl::message_of(Peer& p, const WireHeader& h,
                                                                       size_t length) {
  std::shared_ptr<Incoming> in;
  if (h.offset == 0) {
    if (p.assembling) fail(*p.assembling, "it stopped short: the next message began");
    in = std::make_shared<Incoming>();
    in->msg.peer = p.id;
    in->msg.type = h.type;
    in->msg.size_bytes = h.total_bytes;
    in->verify = h.sum != 0;
    p.inbox.push_back(in);
  } else if (p.assembling && p.assembling->announced_bytes == h.offset &&
             p.assembling->msg.size_bytes == h.total_bytes && p.assembling->msg.type == h.type) {
    in = p.assembling;
  }
  if (!in) {
    // The sequence is broken: the message in progress cannot complete either (without this it
    // stayed at the head of the inbox and held every later message of the peer).
    if (p.assembling) fail(*p.assembling, "a fragment out of sequence interrupted it");
    p.assembling.reset();
    count_malformed(p, "fragment out of sequence (type " + std::to_string(h.type) + ", offset " +
                           std::to_string(h.offset) + " of " + std::to_string(h.total_bytes) +
                           " bytes)");
    return nullptr;
  }
  p.assembling.reset();
  if (h.offset > h.total_bytes || length > h.total_bytes - h.offset) {
    fail(*in, "a fragment past its end");
    return nullptr;
  }
  in->announced_bytes += length;
  if (in->announced_bytes == h.total_bytes) {
    in->all_announced = true;
    in->sum = h.sum;
    if (h.sum == kSumFollows) {
      in->sum_pending = true;
      p.awaiting_sum.push_back(in);
    }
  } else {
    p.assembling = in;
  }
  return in;
}

bool Transport::Impl::start_receives() {
  bool started = false;
  while (!rndv_waiting.empty() &&
         (rndv_in_flight == 0 ||
          rndv_bytes_in_flight + rndv_waiting.front().length <= kMaxReceiveBytesInFlight)) {
    Receive r = std::move(rndv_waiting.front());
    rndv_waiting.pop_front();
    start_receive(std::move(r));
    started = true;
  }
  return started;
}

void Transport::Impl::start_receive(Receive r) {
  Incoming& in = *r.in;
  const PeerId id = in.msg.peer;
  if (in.state == Incoming::State::kAssembling && !in.msg.storage) {
    try {
      in.msg.storage = alloc_words(in.msg.size_bytes);
    } catch (const std::bad_alloc&) {
      fail(in, "no memory for it");
    }
  }
  if (in.state != Incoming::State::kAssembling) {
    ucp_am_data_release(worker, r.desc);  // tells the sender; the message is lost anyway
    --in.parts_pending;
    drain_inbox(id);
    return;
  }
  auto* ctx = new RecvCtx{this, r.in, r.offset, r.length};
  ucp_request_param_t prm{};
  prm.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE;
  prm.cb.recv_am = &Impl::on_recv_done;
  prm.user_data = ctx;
  prm.datatype = ucp_dt_make_contig(1);
  uint8_t* dst = reinterpret_cast<uint8_t*>(in.msg.storage.get()) + r.offset;
  ucs_status_ptr_t st = ucp_am_recv_data_nbx(worker, r.desc, dst, r.length, &prm);
  if (st != nullptr && !UCS_PTR_IS_ERR(st)) {
    ++rndv_in_flight;
    rndv_bytes_in_flight += r.length;
    return;
  }
  delete ctx;
  --in.parts_pending;
  if (st == nullptr)
    fragment_landed(in, r.offset, r.length);
  else
    fail(in, "its receive failed");
  drain_inbox(id);
}

void Transport::Impl::on_recv_done(void* request, ucs_status_t status, size_t, void* user) {
  auto* ctx = static_cast<RecvCtx*>(user);
  Impl* im = ctx->im;
  Incoming& in = *ctx->in;
  --im->rndv_in_flight;
  im->rndv_bytes_in_flight -= ctx->length;
  --in.parts_pending;
  if (status == UCS_OK)
    im->fragment_landed(in, ctx->offset, ctx->length);
  else
    fail(in, "its receive failed");
  im->drain_inbox(in.msg.peer);
  delete ctx;
  ucp_request_free(request);
}

void Transport::Impl::fragment_landed(Incoming& in, size_t offset, size_t length) {
  if (in.state != Incoming::State::kAssembling) return;
  if (in.verify) {
    const auto* base = reinterpret_cast<const uint8_t*>(in.msg.storage.get());
    in.landed[offset] = length;
    for (auto it = in.landed.begin(); it != in.landed.end() && it->first == in.checked_bytes;
         it = in.landed.erase(it)) {
      in.running.update({base + it->first, it->second});
      in.checked_bytes += it->second;
    }
  }
  complete_if_whole(in);
}

void Transport::Impl::complete_if_whole(Incoming& in) {
  if (in.state == Incoming::State::kAssembling && in.all_announced && in.parts_pending == 0 &&
      !in.sum_pending)
    in.state = Incoming::State::kDone;
}

ucs_status_t Transport::Impl::am_sum(void* arg, const void* header, size_t header_length, void*,
                                     size_t length, const ucp_am_recv_param_t*) {
  auto* im = static_cast<Impl*>(arg);
  WireHeader h;
  Peer* p = im->sender_up(header, header_length, &h, "bad checksum trailer header");
  if (!p || p->stats.cut) return UCS_OK;
  const std::string what = "checksum trailer (type " + std::to_string(h.type) + ", " +
                           std::to_string(h.total_bytes) + " bytes)";
  if (p->awaiting_sum.empty()) {
    im->count_malformed(*p, what + " for no message waiting for one");
    return UCS_OK;
  }
  std::shared_ptr<Incoming> in = std::move(p->awaiting_sum.front());
  p->awaiting_sum.pop_front();
  in->sum_pending = false;
  if (length != 0 || h.type != in->msg.type || h.total_bytes != in->msg.size_bytes ||
      h.offset != h.total_bytes || (h.sum & 1) == 0) {
    fail(*in, "its checksum trailer did not match it");
  } else {
    in->sum = h.sum;
    im->complete_if_whole(*in);
  }
  im->drain_inbox(p->id);
  return UCS_OK;
}

void Transport::Impl::fail(Incoming& in, const char* why) {
  if (in.state != Incoming::State::kFailed) in.why = why;
  in.state = Incoming::State::kFailed;
  in.landed.clear();
}

void Transport::Impl::count_malformed(Peer& p, const std::string& why) {
  const uint64_t n = ++p.stats.malformed;
  // The first few, then every 1000th: a broken or hostile peer must not flood the log; the
  // counter always counts.
  if (n <= 8 || n % 1000 == 0)
    std::fprintf(stderr, "troupe: transport: dropped from '%s' (%s): %s; malformed=%llu\n",
                 p.stats.name.c_str(), p.stats.address.c_str(), why.c_str(),
                 static_cast<unsigned long long>(n));
}

void Transport::Impl::drain_inbox(PeerId id) {
  auto it = peers.find(id);
  if (it == peers.end() || it->second.down) return;  // its inbox was dropped with it
  Peer& p = it->second;
  while (!p.inbox.empty()) {
    Incoming& in = *p.inbox.front();
    if (in.state == Incoming::State::kDone) {
      std::optional<uint64_t> computed;
      if (in.verify && in.checked_bytes == in.msg.size_bytes) computed = in.running.final();
      if (!in.msg.storage) in.msg.storage = alloc_words(0);  // an empty message
      received(p, std::move(in.msg), in.sum, computed);
    } else if (in.state == Incoming::State::kFailed) {
      count_malformed(p, "message (type " + std::to_string(in.msg.type) + ", " +
                             std::to_string(in.msg.size_bytes) + " bytes): " + in.why);
    } else {
      break;
    }
    p.inbox.pop_front();
  }
  if (p.inbox.empty() && p.bye_pending && !p.down) answer_bye(p);
}

void Transport::Impl::drop_inbox(Peer& p) {
  // Release this peer's fragments still waiting for a receive slot (UCX needs the endpoint).
  for (auto it = rndv_waiting.begin(); it != rndv_waiting.end();) {
    if (it->in->msg.peer == p.id) {
      ucp_am_data_release(worker, it->desc);
      it = rndv_waiting.erase(it);
    } else {
      ++it;
    }
  }
  // Receives in flight keep their message (the RecvCtx owns it) until UCX is done with them.
  for (auto& in : p.inbox) fail(*in, "the link closed");
  p.inbox.clear();
  p.assembling.reset();
  p.awaiting_sum.clear();
}

void Transport::Impl::received(Peer& p, Message&& m, uint64_t sum,
                               std::optional<uint64_t> computed) {
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
          add_timer(std::chrono::milliseconds(d->delay_ms), [this, id, held, sum, computed] {
            auto it = peers.find(id);
            if (it == peers.end() || it->second.down) return;
            deliver_checked(it->second, std::move(*held), sum, computed);
          });
          return;
        }
        case FaultAction::kDuplicate: {
          Message dup = m;
          dup.storage = alloc_words(m.size_bytes);
          std::memcpy(dup.storage.get(), m.storage.get(), m.size_bytes);
          deliver_checked(p, std::move(dup), sum, computed);
          break;
        }
        case FaultAction::kCorrupt:
          if (m.size_bytes)
            reinterpret_cast<uint8_t*>(m.storage.get())[d->corrupt_at % m.size_bytes] ^= 0x5a;
          computed.reset();  // the bytes changed after they were checksummed: check them again
          break;
      }
    }
  }
  deliver_checked(p, std::move(m), sum, computed);
}

void Transport::Impl::deliver_checked(Peer& p, Message&& m, uint64_t sum,
                                      std::optional<uint64_t> computed) {
  if (sum != 0 && ((computed ? *computed : checksum(m.data())) | 1) != sum) {
    ++p.stats.corrupted;
    count_malformed(p, "message (type " + std::to_string(m.type) + ", " +
                           std::to_string(m.size_bytes) + " bytes): payload checksum mismatch");
    return;
  }
  count_received(p, m);
  deliveries.push_back(std::move(m));
}

void Transport::Impl::count_received(Peer& p, const Message& m) {
  ++p.stats.messages_received;
  p.stats.bytes_received += m.size_bytes;
}

bool Transport::Impl::small_payload(const ucp_am_recv_param_t* param, size_t length) {
  return !is_rndv(param) && length <= 4096;
}

}  // namespace troupe::transport
