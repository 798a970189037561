// Data of the transport: sending (faults, checksums, active messages) and receiving (eager and
// rendezvous receives into pooled buffers, checksum checks, delivery). Runs on the progress
// thread (see detail/transport_impl.h).
#include "transport/detail/transport_impl.h"

namespace troupe::transport {

void Transport::Impl::on_send_done(void* request, ucs_status_t status, void* user) {
  auto* ctx = static_cast<SendCtx*>(user);
  if (status != UCS_OK) ctx->im->count_send_error(ctx->peer);
  delete ctx;
  ucp_request_free(request);
}

void Transport::Impl::count_send_error(PeerId id) {
  auto it = peers.find(id);
  if (it != peers.end()) ++it->second.stats.send_errors;
}

void Transport::Impl::post_am(Peer& p, unsigned am_id, WireHeader header,
                              const std::vector<std::span<const uint8_t>>& parts,
                              std::shared_ptr<const void> keep_alive) {
  auto* ctx = new SendCtx;
  ctx->im = this;
  ctx->peer = p.id;
  ctx->header = header;
  ctx->keep_alive = std::move(keep_alive);
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
  if (r == nullptr) {
    delete ctx;
  } else if (UCS_PTR_IS_ERR(r)) {
    ++p.stats.send_errors;
    delete ctx;
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
  Checksum sum;
  if (opts.checksum_payloads)
    for (const auto& part : m.parts) sum.update(part);
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
        case FaultAction::kCorrupt:
          m = corrupted(m, d->corrupt_at);  // after the checksum: the receiver must notice
          break;
      }
    }
  }
  ++p.stats.messages_sent;
  p.stats.bytes_sent += n;
  WireHeader h;
  h.type = m.type;
  h.sum = opts.checksum_payloads ? sum.final() | 1 : 0;  // 0 = no checksum; a real one is odd
  post_am(p, kAmData, h, m.parts, std::move(m.keep_alive));
}

OutMessage Transport::Impl::corrupted(const OutMessage& m, size_t at) {
  std::vector<uint8_t> flat;
  flat.reserve(m.size_bytes());
  for (const auto& s : m.parts) flat.insert(flat.end(), s.begin(), s.end());
  if (!flat.empty()) flat[at % flat.size()] ^= 0x5a;
  return copy_message(m.type, flat);
}

Transport::Impl::Peer* Transport::Impl::peer_of_header(const void* header, size_t header_length,
                                                       WireHeader* out) {
  if (header_length != sizeof(WireHeader)) return nullptr;
  std::memcpy(out, header, sizeof(WireHeader));
  if (out->magic != kMagic || out->version != kWireVersion) return nullptr;
  auto it = peers.find(out->link);
  if (it == peers.end() || it->second.key != out->key || !it->second.ep) return nullptr;
  return &it->second;
}

bool Transport::Impl::is_rndv(const ucp_am_recv_param_t* param) {
  return (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
}

ucs_status_t Transport::Impl::am_data(void* arg, const void* header, size_t header_length,
                                      void* data, size_t length, const ucp_am_recv_param_t* param) {
  auto* im = static_cast<Impl*>(arg);
  WireHeader h;
  Peer* p = im->peer_of_header(header, header_length, &h);
  if (!p || !p->up) {
    ++im->unauth_dropped;  // no such link, a forged key, or a peer not (or no longer) up
    return UCS_OK;         // an unread rendezvous is dropped by UCX
  }
  if (length > im->opts.max_message_bytes) {
    ++p->stats.oversized;
    return UCS_OK;
  }
  if (p->stats.cut) return UCS_OK;
  Message m;
  m.peer = p->id;
  m.type = h.type;
  m.size_bytes = length;
  m.storage = im->alloc_words(length);
  if (!is_rndv(param)) {
    if (length) std::memcpy(m.storage.get(), data, length);
    im->received(*p, std::move(m), h.sum);
    return UCS_OK;
  }
  auto* ctx = new RecvCtx{im, std::move(m), h.sum};
  ucp_request_param_t prm{};
  prm.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE;
  prm.cb.recv_am = &Impl::on_recv_done;
  prm.user_data = ctx;
  prm.datatype = ucp_dt_make_contig(1);
  ucs_status_ptr_t r = ucp_am_recv_data_nbx(im->worker, data, ctx->msg.storage.get(), length, &prm);
  if (r == nullptr) {
    im->received(*p, std::move(ctx->msg), ctx->sum);
    delete ctx;
  } else if (UCS_PTR_IS_ERR(r)) {
    ++p->stats.malformed;
    delete ctx;
  }
  return UCS_OK;
}

void Transport::Impl::on_recv_done(void* request, ucs_status_t status, size_t, void* user) {
  auto* ctx = static_cast<RecvCtx*>(user);
  Impl* im = ctx->im;
  auto it = im->peers.find(ctx->msg.peer);
  if (it != im->peers.end() && !it->second.down) {
    if (status == UCS_OK)
      im->received(it->second, std::move(ctx->msg), ctx->sum);
    else
      ++it->second.stats.malformed;
  }
  delete ctx;
  ucp_request_free(request);
}

void Transport::Impl::received(Peer& p, Message&& m, uint64_t sum) {
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
          add_timer(std::chrono::milliseconds(d->delay_ms), [this, id, held, sum] {
            auto it = peers.find(id);
            if (it == peers.end() || it->second.down) return;
            deliver_checked(it->second, std::move(*held), sum);
          });
          return;
        }
        case FaultAction::kDuplicate: {
          Message dup = m;
          dup.storage = alloc_words(m.size_bytes);
          std::memcpy(dup.storage.get(), m.storage.get(), m.size_bytes);
          deliver_checked(p, std::move(dup), sum);
          break;
        }
        case FaultAction::kCorrupt:
          if (m.size_bytes)
            reinterpret_cast<uint8_t*>(m.storage.get())[d->corrupt_at % m.size_bytes] ^= 0x5a;
          break;
      }
    }
  }
  deliver_checked(p, std::move(m), sum);
}

void Transport::Impl::deliver_checked(Peer& p, Message&& m, uint64_t sum) {
  if (sum != 0 && (checksum(m.data()) | 1) != sum) {
    ++p.stats.malformed;
    ++p.stats.corrupted;
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
