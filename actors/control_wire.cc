// Wire codec of the control plane and of clients (see actors/detail/control_wire.h): the message
// kinds, and the membership and liveness messages (join, heartbeat, membership, leave, actor
// restart). Placement, status and the client protocol are in control_wire_placement.cc,
// control_wire_status.cc and control_wire_client.cc; the helpers they share in
// detail/control_wire_internal.h. Shares the frame, header and sampling helpers of actors/wire.cc
// through actors/detail/wire_internal.h. Decoders treat every frame as hostile: reads run inside
// schemas::guard() (decode_frame()), each list and text is sized before it is copied, and every
// value is checked before it is returned.
#include "actors/detail/control_wire.h"

#include <array>
#include <cstring>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "actors/detail/control_wire_internal.h"
#include "actors/detail/wire_internal.h"
#include "schemas/client.capnp.h"
#include "schemas/cluster.capnp.h"
#include "schemas/encoder.capnp.h"
#include "schemas/expert.capnp.h"
#include "schemas/step.capnp.h"

namespace troupe::actors::detail {

using control_wire_internal::check_node_id;
using control_wire_internal::encode_msg;
using control_wire_internal::read_actor;
using control_wire_internal::read_links;
using control_wire_internal::read_membership;
using control_wire_internal::read_resources;
using control_wire_internal::read_text;
using control_wire_internal::read_transport;
using control_wire_internal::text;
using control_wire_internal::write_actor;
using control_wire_internal::write_links;
using control_wire_internal::write_membership;
using control_wire_internal::write_resources;
using control_wire_internal::write_transport;
using wire_internal::build_frame;
using wire_internal::check_send;
using wire_internal::decode_frame;
using wire_internal::fail;
using wire_internal::read_error;
using wire_internal::read_wire_header;
using wire_internal::write_error;

static_assert(uint16_t(MemberState::kLeft) == uint16_t(schemas::MemberState::LEFT));
static_assert(uint16_t(MemberState::kDead) == uint16_t(schemas::MemberState::DEAD));
static_assert(uint16_t(ActorStateInfo::kFailed) == uint16_t(schemas::ActorState::FAILED));
static_assert(uint16_t(ActorStateInfo::kStopped) == uint16_t(schemas::ActorState::STOPPED));

// ---- Message kinds -----------------------------------------------------------------------------

namespace {

struct KindInfo {
  ControlMsg msg;
  uint64_t type_id;
  const char* name;
};

// Indexed by ControlMsg value.
constexpr KindInfo kKinds[] = {
    {ControlMsg::kJoinRequest, capnp::typeId<schemas::JoinRequest>(), "JoinRequest"},
    {ControlMsg::kJoinReply, capnp::typeId<schemas::JoinReply>(), "JoinReply"},
    {ControlMsg::kHeartbeat, capnp::typeId<schemas::Heartbeat>(), "Heartbeat"},
    {ControlMsg::kHeartbeatAck, capnp::typeId<schemas::HeartbeatAck>(), "HeartbeatAck"},
    {ControlMsg::kMembership, capnp::typeId<schemas::Membership>(), "Membership"},
    {ControlMsg::kPlacement, capnp::typeId<schemas::Placement>(), "Placement"},
    {ControlMsg::kPlacementReport, capnp::typeId<schemas::PlacementReport>(), "PlacementReport"},
    {ControlMsg::kLeaveNotice, capnp::typeId<schemas::LeaveNotice>(), "LeaveNotice"},
    {ControlMsg::kStatusRequest, capnp::typeId<schemas::StatusRequest>(), "StatusRequest"},
    {ControlMsg::kStatusSnapshot, capnp::typeId<schemas::StatusSnapshot>(), "StatusSnapshot"},
    {ControlMsg::kGenerateRequest, capnp::typeId<schemas::GenerateRequest>(), "GenerateRequest"},
    {ControlMsg::kCancelRequest, capnp::typeId<schemas::CancelRequest>(), "CancelRequest"},
    {ControlMsg::kGenerateEvent, capnp::typeId<schemas::GenerateEvent>(), "GenerateEvent"},
    {ControlMsg::kBatchDescriptor, capnp::typeId<schemas::BatchDescriptor>(), "BatchDescriptor"},
    {ControlMsg::kStepResult, capnp::typeId<schemas::StepResult>(), "StepResult"},
    {ControlMsg::kExpertDispatch, capnp::typeId<schemas::ExpertDispatch>(), "ExpertDispatch"},
    {ControlMsg::kExpertCombine, capnp::typeId<schemas::ExpertCombine>(), "ExpertCombine"},
    {ControlMsg::kActorRestart, capnp::typeId<schemas::ActorRestart>(), "ActorRestart"},
    {ControlMsg::kEncodeImage, capnp::typeId<schemas::EncodeImage>(), "EncodeImage"},
    {ControlMsg::kEncodedImage, capnp::typeId<schemas::EncodedImage>(), "EncodedImage"},
};

constexpr bool kinds_in_order() {
  for (size_t i = 0; i < std::size(kKinds); ++i)
    if (static_cast<size_t>(kKinds[i].msg) != i) return false;
  return true;
}
static_assert(kinds_in_order(), "kKinds must list ControlMsg values in order");
static_assert(std::size(kKinds) == size_t(ControlMsg::kEncodedImage) + 1,
              "a ControlMsg is missing");

const KindInfo* kind_info(ControlMsg m) {
  const auto i = static_cast<size_t>(m);
  return i < std::size(kKinds) ? &kKinds[i] : nullptr;
}

}  // namespace

uint64_t type_id(ControlMsg m) {
  const KindInfo* k = kind_info(m);
  return k ? k->type_id : 0;
}

bool control_msg_of(uint64_t type_id, ControlMsg* out) {
  for (const KindInfo& k : kKinds) {
    if (k.type_id != type_id) continue;
    if (out) *out = k.msg;
    return true;
  }
  return false;
}

const char* to_string(ControlMsg m) {
  const KindInfo* k = kind_info(m);
  return k ? k->name : "unknown";
}

const char* to_string(MemberState s) {
  switch (s) {
    case MemberState::kJoining:
      return "joining";
    case MemberState::kAlive:
      return "alive";
    case MemberState::kSuspect:
      return "suspect";
    case MemberState::kDead:
      return "dead";
    case MemberState::kLeft:
      return "left";
  }
  return "unknown";
}
// ---- Membership and liveness -------------------------------------------------------------------

namespace {

constexpr size_t kProofBytes = 32;

// Exactly kProofBytes bytes (a nonce or an HMAC).
Status read_proof(capnp::Data::Reader d, const std::string& where,
                  std::array<uint8_t, kProofBytes>& out) {
  if (d.size() != kProofBytes) {
    return fail(WireErrc::kInvalid,
                strfmt("%s: %zu bytes, expected %zu", where.c_str(), d.size(), kProofBytes));
  }
  std::memcpy(out.data(), d.begin(), kProofBytes);
  return Ok{};
}

}  // namespace

Result<WireFrame> encode(const JoinRequestMsg& m, const SendInfo& send) {
  return encode_msg<schemas::JoinRequest>(
      "encode JoinRequest", m.header.cluster_epoch, send,
      [&](schemas::JoinRequest::Builder root) -> Status {
        auto node = root.initNode();
        node.setName(text(m.name));
        node.setAddress(text(m.address));
        node.setVersion(text(m.version));
        node.setPid(m.pid);
        node.setModelFileHash(m.model_hash);
        write_resources(node.initResources(), m.resources);
        root.setNonce(capnp::Data::Reader(m.nonce.data(), m.nonce.size()));
        root.setProof(capnp::Data::Reader(m.proof.data(), m.proof.size()));
        return Ok{};
      },
      /*allow_zero_epoch=*/true);
}

Result<JoinRequestMsg> decode_join_request(std::span<const uint8_t> f, const ControlLimits& l) {
  return decode_frame<schemas::JoinRequest, JoinRequestMsg>(
      f, l.max_frame_bytes, "JoinRequest",
      [&](schemas::JoinRequest::Reader root) -> Result<JoinRequestMsg> {
        JoinRequestMsg m;
        // The joiner sends the last epoch it knew (0 on first start, stale after a fence): no
        // epoch check here, whatever l.expected_epoch says.
        auto h = read_wire_header(root.getHeader(), 0, "JoinRequest", /*allow_zero_epoch=*/true);
        if (!h) return h.error();
        m.header = *h;
        auto node = root.getNode();
        auto name = read_text(node.getName(), l.max_text, "JoinRequest.node.name", true);
        if (!name) return name.error();
        auto address = read_text(node.getAddress(), l.max_text, "JoinRequest.node.address");
        if (!address) return address.error();
        auto version = read_text(node.getVersion(), l.max_text, "JoinRequest.node.version");
        if (!version) return version.error();
        m.name = std::move(*name);
        m.address = std::move(*address);
        m.version = std::move(*version);
        m.pid = node.getPid();
        m.model_hash = node.getModelFileHash();
        m.resources = read_resources(node.getResources());
        if (auto st = read_proof(root.getNonce(), "JoinRequest.nonce", m.nonce); !st)
          return st.error();
        if (auto st = read_proof(root.getProof(), "JoinRequest.proof", m.proof); !st)
          return st.error();
        return m;
      });
}

Result<WireFrame> encode(const JoinReplyMsg& m, const SendInfo& send) {
  return encode_msg<schemas::JoinReply>(
      "encode JoinReply", m.header.cluster_epoch, send,
      [&](schemas::JoinReply::Builder root) -> Status {
        root.setAccepted(m.accepted);
        root.setNodeId(m.node_id);
        root.setLeaseMs(m.lease_ms);
        root.setHeartbeatIntervalMs(m.heartbeat_ms);
        root.setProof(capnp::Data::Reader(m.proof.data(), m.proof.size()));
        if (!m.error.empty()) write_error(root.initError(), m.error);
        return Ok{};
      });
}

Result<JoinReplyMsg> decode_join_reply(std::span<const uint8_t> f, const ControlLimits& l) {
  return decode_frame<schemas::JoinReply, JoinReplyMsg>(
      f, l.max_frame_bytes, "JoinReply",
      [&](schemas::JoinReply::Reader root) -> Result<JoinReplyMsg> {
        JoinReplyMsg m;
        auto h = read_wire_header(root.getHeader(), l.expected_epoch, "JoinReply");
        if (!h) return h.error();
        m.header = *h;
        m.accepted = root.getAccepted();
        m.node_id = root.getNodeId();
        if (m.accepted) {
          if (auto st = check_node_id(m.node_id, "JoinReply.nodeId"); !st) return st.error();
        }
        m.lease_ms = root.getLeaseMs();
        m.heartbeat_ms = root.getHeartbeatIntervalMs();
        if (auto st = read_proof(root.getProof(), "JoinReply.proof", m.proof); !st)
          return st.error();
        if (root.hasError()) m.error = read_error(root.getError());
        return m;
      });
}

Result<WireFrame> encode(const HeartbeatMsg& m, const SendInfo& send) {
  return encode_msg<schemas::Heartbeat>(
      "encode Heartbeat", m.header.cluster_epoch, send,
      [&](schemas::Heartbeat::Builder root) -> Status {
        root.setLeaseMs(m.lease_ms);
        write_resources(root.initResources(), m.resources);
        root.setNumActors(m.num_actors);
        root.setUptimeMs(m.uptime_ms);
        write_links(root.initLinks(static_cast<unsigned>(m.links.size())), m.links);
        write_transport(root.initTransport(), m.transport);
        return Ok{};
      });
}

Result<HeartbeatMsg> decode_heartbeat(std::span<const uint8_t> f, const ControlLimits& l) {
  return decode_frame<schemas::Heartbeat, HeartbeatMsg>(
      f, l.max_frame_bytes, "Heartbeat",
      [&](schemas::Heartbeat::Reader root) -> Result<HeartbeatMsg> {
        HeartbeatMsg m;
        auto h = read_wire_header(root.getHeader(), l.expected_epoch, "Heartbeat");
        if (!h) return h.error();
        m.header = *h;
        m.lease_ms = root.getLeaseMs();
        m.resources = read_resources(root.getResources());
        m.num_actors = root.getNumActors();
        m.uptime_ms = root.getUptimeMs();
        auto links = read_links(root.getLinks(), l, "Heartbeat.links");
        if (!links) return links.error();
        m.links = std::move(*links);
        auto tc = read_transport(root.getTransport(), l, "Heartbeat.transport", true);
        if (!tc) return tc.error();
        m.transport = std::move(*tc);
        return m;
      });
}

Result<WireFrame> encode(const HeartbeatAckMsg& m, const SendInfo& send) {
  return encode_msg<schemas::HeartbeatAck>("encode HeartbeatAck", m.header.cluster_epoch, send,
                                           [&](schemas::HeartbeatAck::Builder root) -> Status {
                                             root.setLeaseMs(m.lease_ms);
                                             root.setMembershipVersion(m.membership_version);
                                             root.setFenced(m.fenced);
                                             return Ok{};
                                           });
}

Result<HeartbeatAckMsg> decode_heartbeat_ack(std::span<const uint8_t> f, const ControlLimits& l) {
  return decode_frame<schemas::HeartbeatAck, HeartbeatAckMsg>(
      f, l.max_frame_bytes, "HeartbeatAck",
      [&](schemas::HeartbeatAck::Reader root) -> Result<HeartbeatAckMsg> {
        HeartbeatAckMsg m;
        auto h = read_wire_header(root.getHeader(), l.expected_epoch, "HeartbeatAck");
        if (!h) return h.error();
        m.header = *h;
        m.lease_ms = root.getLeaseMs();
        m.membership_version = root.getMembershipVersion();
        m.fenced = root.getFenced();
        return m;
      });
}

Result<WireFrame> encode(const MembershipMsg& m, const SendInfo& send) {
  const uint64_t epoch = m.header.cluster_epoch;
  if (auto st = check_send(epoch, send, "encode Membership"); !st) return st.error();
  return build_frame<schemas::Membership>(
      "encode Membership", [&](schemas::Membership::Builder root, WireFrame::Impl&) -> Status {
        write_membership(root, m, epoch, send);
        return Ok{};
      });
}

Result<MembershipMsg> decode_membership(std::span<const uint8_t> f, const ControlLimits& l) {
  return decode_frame<schemas::Membership, MembershipMsg>(
      f, l.max_frame_bytes, "Membership",
      [&](schemas::Membership::Reader root) -> Result<MembershipMsg> {
        auto h = read_wire_header(root.getHeader(), l.expected_epoch, "Membership");
        if (!h) return h.error();
        auto m = read_membership(root, l, "Membership");
        if (!m) return m.error();
        m->header = *h;
        return m;
      });
}

Result<WireFrame> encode(const LeaveNoticeMsg& m, const SendInfo& send) {
  return encode_msg<schemas::LeaveNotice>("encode LeaveNotice", m.header.cluster_epoch, send,
                                          [&](schemas::LeaveNotice::Builder root) -> Status {
                                            root.setReason(text(m.reason));
                                            return Ok{};
                                          });
}

Result<LeaveNoticeMsg> decode_leave_notice(std::span<const uint8_t> f, const ControlLimits& l) {
  return decode_frame<schemas::LeaveNotice, LeaveNoticeMsg>(
      f, l.max_frame_bytes, "LeaveNotice",
      [&](schemas::LeaveNotice::Reader root) -> Result<LeaveNoticeMsg> {
        LeaveNoticeMsg m;
        auto h = read_wire_header(root.getHeader(), l.expected_epoch, "LeaveNotice");
        if (!h) return h.error();
        m.header = *h;
        auto reason = read_text(root.getReason(), l.max_text, "LeaveNotice.reason");
        if (!reason) return reason.error();
        m.reason = std::move(*reason);
        return m;
      });
}

Result<WireFrame> encode(const ActorRestartMsg& m, const SendInfo& send) {
  return encode_msg<schemas::ActorRestart>("encode ActorRestart", m.header.cluster_epoch, send,
                                           [&](schemas::ActorRestart::Builder root) -> Status {
                                             write_actor(root.initActor(), m.actor);
                                             root.setReason(text(m.reason));
                                             root.setKvLost(m.kv_lost);
                                             root.setRestarts(m.restarts);
                                             return Ok{};
                                           });
}

Result<ActorRestartMsg> decode_actor_restart(std::span<const uint8_t> f, const ControlLimits& l) {
  return decode_frame<schemas::ActorRestart, ActorRestartMsg>(
      f, l.max_frame_bytes, "ActorRestart",
      [&](schemas::ActorRestart::Reader root) -> Result<ActorRestartMsg> {
        ActorRestartMsg m;
        auto h = read_wire_header(root.getHeader(), l.expected_epoch, "ActorRestart");
        if (!h) return h.error();
        m.header = *h;
        auto a = read_actor(root.getActor(), "ActorRestart.actor");
        if (!a) return a.error();
        m.actor = *a;
        auto reason = read_text(root.getReason(), l.max_text, "ActorRestart.reason");
        if (!reason) return reason.error();
        m.reason = std::move(*reason);
        m.kv_lost = root.getKvLost();
        m.restarts = root.getRestarts();
        return m;
      });
}

}  // namespace troupe::actors::detail
