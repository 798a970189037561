// Test-only wire access (detail/testing.h): raw data frames and the receive side's bookkeeping.
// Runs its work on the progress thread (see detail/transport_impl.h).
#include "transport/detail/testing.h"
#include "transport/detail/transport_impl.h"

namespace troupe::transport::detail {

static_assert(RawAm::kData == kAmData && RawAm::kSum == kAmSum &&
              RawAm::kPullOffer == kAmPullOffer && RawAm::kPull == kAmPull &&
              RawAm::kPullDone == kAmPullDone);

Status TransportTesting::send_raw_frame(Transport& t, PeerId peer, const RawFrame& frame) {
  Transport::Impl& im = *t.impl_;
  std::promise<Status> done;
  auto result = done.get_future();
  im.post([&] { done.set_value(send_on_thread(im, peer, frame)); });
  return result.get();
}

Status TransportTesting::send_on_thread(Transport::Impl& im, PeerId peer, const RawFrame& frame) {
  auto it = im.peers.find(peer);
  if (it == im.peers.end() || !it->second.up || !it->second.ep)
    return Error{1, "raw frame: no live link " + std::to_string(peer)};
  Transport::Impl::Peer& p = it->second;
  WireHeader h;
  h.magic = frame.magic.value_or(kMagic);
  h.version = frame.version.value_or(kWireVersion);
  h.type = frame.type;
  h.sum = frame.sum;
  h.link = p.remote_id;
  h.key = frame.key.value_or(p.remote_key);
  h.total_bytes = frame.total_bytes;
  h.offset = frame.offset;
  auto header = std::make_shared<std::vector<uint8_t>>(frame.header_bytes.value_or(sizeof(h)));
  if (!header->empty()) std::memcpy(header->data(), &h, std::min(header->size(), sizeof(h)));
  auto payload = std::make_shared<std::vector<uint8_t>>(frame.payload);
  ucp_request_param_t prm{};
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_FLAGS;
  prm.datatype = ucp_dt_make_contig(1);
  prm.flags = frame.protocol == RawFrame::Protocol::kEager        ? UCP_AM_SEND_FLAG_EAGER
              : frame.protocol == RawFrame::Protocol::kRendezvous ? UCP_AM_SEND_FLAG_RNDV
                                                                  : 0;
  ucs_status_ptr_t r = ucp_am_send_nbx(p.ep, frame.am, header->data(), header->size(),
                                       payload->data(), payload->size(), &prm);
  if (UCS_PTR_IS_ERR(r))
    return Error{1,
                 std::string("raw frame: UCX refused it: ") + ucs_status_string(UCS_PTR_STATUS(r))};
  // The buffers must outlive the send: progress here until it completes (the peer's receive
  // side runs on its own thread, so this cannot wait on itself).
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (r != nullptr && ucp_request_check_status(r) == UCS_INPROGRESS) {
    if (Clock::now() > deadline) {
      // UCX still owns the buffers: leave them to it (test-only; the test fails anyway).
      new std::shared_ptr<std::vector<uint8_t>>[2] { header, payload };
      return Error{1, "raw frame: the send did not complete within 10 s"};
    }
    ucp_worker_progress(im.worker);
  }
  if (r != nullptr) {
    const ucs_status_t s = ucp_request_check_status(r);
    ucp_request_free(r);
    if (s != UCS_OK) return Error{1, std::string("raw frame: ") + ucs_status_string(s)};
  }
  return Ok{};
}

void TransportTesting::set_pull_slot(Transport& t, size_t slot, uint64_t id) {
  Transport::Impl& im = *t.impl_;
  std::promise<void> done;
  auto result = done.get_future();
  im.post([&] {
    if (im.pull_table && slot < kPullSlots) im.pull_table[slot].store(id);
    done.set_value();
  });
  result.get();
}

ReceiveState TransportTesting::receive_state(const Transport& t) {
  Transport::Impl& im = *t.impl_;
  std::promise<ReceiveState> done;
  auto result = done.get_future();
  im.post([&] {
    ReceiveState s;
    s.rndv_waiting = im.rndv_waiting.size();
    s.rndv_in_flight = im.rndv_in_flight;
    s.rndv_bytes_in_flight = im.rndv_bytes_in_flight;
    for (const auto& [id, p] : im.peers) {
      s.inbox_messages += p.inbox.size();
      s.assembling += p.assembling != nullptr;
    }
    done.set_value(s);
  });
  return result.get();
}

}  // namespace troupe::transport::detail
