// Wire codec of the control plane and of clients (see actors/detail/control_wire.h). Shares the
// frame, header and sampling helpers of actors/wire.cc through actors/detail/wire_internal.h.
// Decoders treat every frame as hostile: reads run inside schemas::guard() (decode_frame()), each
// list and text is sized before it is copied, and every value is checked before it is returned.
#include "actors/detail/control_wire.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "actors/detail/wire_internal.h"
#include "schemas/client.capnp.h"
#include "schemas/cluster.capnp.h"
#include "schemas/expert.capnp.h"
#include "schemas/step.capnp.h"

namespace troupe::actors::detail {

using schemas::TensorDtype;
using wire_internal::build_frame;
using wire_internal::check_len;
using wire_internal::check_send;
using wire_internal::decode_frame;
using wire_internal::fail;
using wire_internal::in_field;
using wire_internal::read_error;
using wire_internal::read_sampling;
using wire_internal::read_wire_header;
using wire_internal::write_error;
using wire_internal::write_header;
using wire_internal::write_sampling;

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
};

constexpr bool kinds_in_order() {
  for (size_t i = 0; i < std::size(kKinds); ++i)
    if (static_cast<size_t>(kKinds[i].msg) != i) return false;
  return true;
}
static_assert(kinds_in_order(), "kKinds must list ControlMsg values in order");
static_assert(std::size(kKinds) == size_t(ControlMsg::kActorRestart) + 1,
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

// ---- Shared helpers ----------------------------------------------------------------------------

namespace {

constexpr size_t kProofBytes = 32;
// The finish reasons GenerateEvent.finishReason may carry (schemas/client.capnp).
constexpr const char* kFinishReasons[] = {"length",    "eos",   "stop",
                                          "cancelled", "error", "overloaded"};

// Text as Cap'n Proto sees it: with its size, so embedded NULs survive the trip.
capnp::Text::Reader text(const std::string& s) { return capnp::Text::Reader(s.data(), s.size()); }

// Writes the fields every control message shares and then fill(root) -> Status.
template <class Root, class Fill>
Result<WireFrame> encode_msg(const char* what, uint64_t epoch, const SendInfo& send, Fill&& fill,
                             bool allow_zero_epoch = false) {
  if (auto st = check_send(epoch, send, what, allow_zero_epoch); !st) return st.error();
  return build_frame<Root>(what, [&](typename Root::Builder root, WireFrame::Impl&) -> Status {
    write_header(root.initHeader(), epoch, send);
    return fill(root);
  });
}

void write_actor(schemas::ActorId::Builder dst, const ActorRef& a) {
  dst.setNode(a.node);
  dst.setRole(static_cast<schemas::Role>(a.role));
  dst.setIndex(a.index);
}

void write_resources(schemas::NodeResources::Builder dst, const ResourcesInfo& r) {
  dst.setCpuCores(r.cpu_cores);
  dst.setMemoryBytes(r.memory_bytes);
  dst.setFreeMemoryBytes(r.free_memory_bytes);
}

void write_phases(capnp::List<schemas::StartupPhase>::Builder dst,
                  const std::vector<StartupPhaseInfo>& phases) {
  for (size_t i = 0; i < phases.size(); ++i) {
    auto p = dst[unsigned(i)];
    p.setName(text(phases[i].name));
    write_actor(p.initActor(), phases[i].actor);
    p.setStartMs(phases[i].start_ms);
    p.setDurationMs(phases[i].duration_ms);
    p.setDone(phases[i].done);
  }
}

void write_membership(schemas::Membership::Builder dst, const MembershipMsg& m, uint64_t epoch,
                      const SendInfo& send) {
  write_header(dst.initHeader(), epoch, send);
  dst.setVersion(m.version);
  auto members = dst.initMembers(static_cast<unsigned>(m.members.size()));
  for (size_t i = 0; i < m.members.size(); ++i) {
    const MemberInfo& x = m.members[i];
    auto y = members[unsigned(i)];
    y.setNodeId(x.node_id);
    y.setName(text(x.name));
    y.setAddress(text(x.address));
    y.setState(static_cast<schemas::MemberState>(x.state));
    y.setLastHeartbeatAgeMs(x.last_heartbeat_age_ms);
    write_resources(y.initResources(), x.resources);
  }
}

template <class List, class Vec>
void write_ints(List dst, const Vec& src) {
  for (size_t i = 0; i < src.size(); ++i) dst.set(unsigned(i), src[i]);
}

// A text field of at most `max` bytes; `required`: it must not be empty.
Result<std::string> read_text(capnp::Text::Reader t, size_t max, const std::string& where,
                              bool required = false) {
  if (t.size() > max) {
    return fail(WireErrc::kTooLong,
                strfmt("%s: %zu bytes exceed the limit of %zu", where.c_str(), t.size(), max));
  }
  if (required && t.size() == 0)
    return fail(WireErrc::kInvalid, where + ": empty, expected a name");
  return std::string(t.begin(), t.size());
}

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

// An enumerant this build knows: raw value <= max.
template <class E>
Result<uint16_t> read_enum(E value, uint16_t max, const std::string& where) {
  const auto raw = static_cast<uint16_t>(value);
  if (raw <= max) return raw;
  return fail(WireErrc::kInvalid,
              strfmt("%s: unknown value %u, expected 0..%u", where.c_str(), raw, unsigned{max}));
}

Result<ActorRef> read_actor(schemas::ActorId::Reader src, const std::string& where) {
  const auto role = static_cast<uint16_t>(src.getRole());
  if (role == 0 || role > uint16_t(ActorRole::kGateway)) {
    return fail(WireErrc::kInvalid, strfmt("%s.role: %u is not a known role, expected 1..%u",
                                           where.c_str(), role, unsigned(ActorRole::kGateway)));
  }
  return ActorRef{src.getNode(), static_cast<ActorRole>(role), src.getIndex()};
}

ResourcesInfo read_resources(schemas::NodeResources::Reader src) {
  // devices: no in-process home yet; not walked.
  return {src.getCpuCores(), src.getMemoryBytes(), src.getFreeMemoryBytes()};
}

// Node ids are assigned at join and are >= 1.
Status check_node_id(uint32_t id, const std::string& where) {
  if (id != 0) return Ok{};
  return fail(WireErrc::kInvalid, where + ": node id 0, expected an assigned id >= 1");
}

Result<std::vector<StartupPhaseInfo>> read_phases(capnp::List<schemas::StartupPhase>::Reader src,
                                                  const ControlLimits& l,
                                                  const std::string& where) {
  if (auto st = check_len(where, src.size(), l.max_list); !st) return st.error();
  std::vector<StartupPhaseInfo> out(src.size());
  for (unsigned i = 0; i < src.size(); ++i) {
    const std::string at = strfmt("%s[%u]", where.c_str(), i);
    auto name = read_text(src[i].getName(), l.max_text, at + ".name", true);
    if (!name) return name.error();
    auto actor = read_actor(src[i].getActor(), at + ".actor");
    if (!actor) return actor.error();
    out[i] = {std::move(*name), *actor, src[i].getStartMs(), src[i].getDurationMs(),
              src[i].getDone()};
  }
  return out;
}

// Membership without its header (StatusSnapshot embeds one whose header is unused).
Result<MembershipMsg> read_membership(schemas::Membership::Reader src, const ControlLimits& l,
                                      const std::string& where) {
  MembershipMsg m;
  m.version = src.getVersion();
  auto members = src.getMembers();
  if (auto st = check_len(where + ".members", members.size(), l.max_list); !st) return st.error();
  m.members.resize(members.size());
  std::vector<uint32_t> ids;
  for (unsigned i = 0; i < members.size(); ++i) {
    const std::string at = strfmt("%s.members[%u]", where.c_str(), i);
    auto x = members[i];
    MemberInfo& y = m.members[i];
    y.node_id = x.getNodeId();
    if (auto st = check_node_id(y.node_id, at + ".nodeId"); !st) return st.error();
    auto name = read_text(x.getName(), l.max_text, at + ".name", true);
    if (!name) return name.error();
    auto address = read_text(x.getAddress(), l.max_text, at + ".address");
    if (!address) return address.error();
    auto state = read_enum(x.getState(), uint16_t(MemberState::kLeft), at + ".state");
    if (!state) return state.error();
    y.name = std::move(*name);
    y.address = std::move(*address);
    y.state = static_cast<MemberState>(*state);
    y.last_heartbeat_age_ms = x.getLastHeartbeatAgeMs();
    y.resources = read_resources(x.getResources());
    ids.push_back(y.node_id);
  }
  std::sort(ids.begin(), ids.end());
  if (auto dup = std::adjacent_find(ids.begin(), ids.end()); dup != ids.end()) {
    return fail(
        WireErrc::kInvalid,
        strfmt("%s.members: node id %u appears twice, expected unique ids", where.c_str(), *dup));
  }
  return m;
}

}  // namespace

// ---- Membership and liveness -------------------------------------------------------------------

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
  return encode_msg<schemas::Heartbeat>("encode Heartbeat", m.header.cluster_epoch, send,
                                        [&](schemas::Heartbeat::Builder root) -> Status {
                                          root.setLeaseMs(m.lease_ms);
                                          write_resources(root.initResources(), m.resources);
                                          root.setNumActors(m.num_actors);
                                          root.setUptimeMs(m.uptime_ms);
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

// ---- Placement ---------------------------------------------------------------------------------

namespace {

// Stages in index order 0..n-1, layer ranges non-empty and contiguous from layer 0, exactly the
// first with the embedding and exactly the last with the output head.
Result<std::vector<StagePlacementInfo>> read_stages(
    capnp::List<schemas::StagePlacement>::Reader src, const ControlLimits& l) {
  if (auto st = check_len("Placement.stages", src.size(), l.max_list); !st) return st.error();
  if (src.size() == 0) return fail(WireErrc::kInvalid, "Placement.stages: empty, expected >= 1");
  std::vector<StagePlacementInfo> out(src.size());
  const unsigned last = src.size() - 1;
  for (unsigned i = 0; i < src.size(); ++i) {
    const std::string at = strfmt("Placement.stages[%u]", i);
    auto x = src[i];
    StagePlacementInfo& y = out[i];
    y = {x.getStage(),        x.getNodeId(),        x.getLayerBegin(), x.getLayerEnd(),
         x.getHasEmbedding(), x.getHasOutputHead(), x.getThreads()};
    if (y.stage != i) {
      return fail(WireErrc::kInvalid, strfmt("%s.stage: %u, expected %u (stages in index order)",
                                             at.c_str(), y.stage, i));
    }
    if (auto st = check_node_id(y.node_id, at + ".nodeId"); !st) return st.error();
    if (y.layer_begin >= y.layer_end) {
      return fail(WireErrc::kInvalid, strfmt("%s: layers [%u, %u) are empty, expected begin < end",
                                             at.c_str(), y.layer_begin, y.layer_end));
    }
    const uint32_t want = i == 0 ? 0 : out[i - 1].layer_end;
    if (y.layer_begin != want) {
      return fail(
          WireErrc::kInvalid,
          strfmt("%s.layerBegin: %u, expected %u: the layer ranges %s", at.c_str(), y.layer_begin,
                 want, y.layer_begin < want ? "overlap" : "leave a gap (or do not start at 0)"));
    }
    if (y.has_embedding != (i == 0) || y.has_output_head != (i == last)) {
      return fail(WireErrc::kInvalid,
                  strfmt("%s: hasEmbedding %d, hasOutputHead %d: expected the embedding on the "
                         "first stage only and the output head on the last (of %u) only",
                         at.c_str(), int(y.has_embedding), int(y.has_output_head), last + 1));
    }
  }
  return out;
}

// Shards in index order 0..n-1, each with ascending non-negative experts; no expert in two.
Result<std::vector<ShardPlacementInfo>> read_shards(
    capnp::List<schemas::ExpertShardPlacement>::Reader src, const ControlLimits& l) {
  if (auto st = check_len("Placement.expertShards", src.size(), l.max_list); !st) return st.error();
  std::vector<ShardPlacementInfo> out(src.size());
  std::vector<std::pair<uint32_t, uint32_t>> owner;  // (expert, shard)
  for (unsigned i = 0; i < src.size(); ++i) {
    const std::string at = strfmt("Placement.expertShards[%u]", i);
    auto x = src[i];
    ShardPlacementInfo& y = out[i];
    y.shard = x.getShard();
    y.node_id = x.getNodeId();
    y.threads = x.getThreads();
    if (y.shard != i) {
      return fail(WireErrc::kInvalid, strfmt("%s.shard: %u, expected %u (shards in index order)",
                                             at.c_str(), y.shard, i));
    }
    if (auto st = check_node_id(y.node_id, at + ".nodeId"); !st) return st.error();
    auto experts = x.getExperts();
    if (auto st = check_len(at + ".experts", experts.size(), l.max_list); !st) return st.error();
    for (unsigned e = 0; e < experts.size(); ++e) {
      const uint32_t id = experts[e];
      if (id > uint32_t(std::numeric_limits<int32_t>::max())) {
        return fail(WireErrc::kInvalid,
                    strfmt("%s.experts[%u]: %u is outside [0, 2^31)", at.c_str(), e, id));
      }
      if (e > 0 && id <= experts[e - 1]) {
        return fail(WireErrc::kInvalid,
                    strfmt("%s.experts[%u]: %u after %u, expected strictly ascending ids",
                           at.c_str(), e, id, experts[e - 1]));
      }
      y.experts.push_back(static_cast<int32_t>(id));
      owner.emplace_back(id, i);
    }
  }
  std::sort(owner.begin(), owner.end());
  for (size_t k = 1; k < owner.size(); ++k) {
    if (owner[k].first != owner[k - 1].first) continue;
    return fail(WireErrc::kInvalid,
                strfmt("Placement.expertShards: expert %u is in shards %u and %u, expected one "
                       "owner per expert",
                       owner[k].first, owner[k - 1].second, owner[k].second));
  }
  return out;
}

// One pool per stage (any order), each with blocks.
Result<std::vector<KvPoolInfo>> read_kv_pools(capnp::List<schemas::KvPoolPlacement>::Reader src,
                                              size_t num_stages) {
  if (src.size() != num_stages) {
    return fail(WireErrc::kInvalid,
                strfmt("Placement.kvPools: %u pools for %zu stages, expected one per stage",
                       src.size(), num_stages));
  }
  std::vector<KvPoolInfo> out(src.size());
  std::vector<bool> seen(num_stages, false);
  for (unsigned i = 0; i < src.size(); ++i) {
    const std::string at = strfmt("Placement.kvPools[%u]", i);
    auto x = src[i];
    out[i] = {x.getStage(), x.getNodeId(), x.getNumBlocks(), x.getBlockSizeTokens()};
    const KvPoolInfo& y = out[i];
    if (y.stage >= num_stages || seen[y.stage]) {
      return fail(WireErrc::kInvalid,
                  strfmt("%s.stage: %u is %s, expected one pool per stage 0..%zu", at.c_str(),
                         y.stage, y.stage >= num_stages ? "no stage" : "a second pool of its stage",
                         num_stages - 1));
    }
    seen[y.stage] = true;
    if (auto st = check_node_id(y.node_id, at + ".nodeId"); !st) return st.error();
    if (y.num_blocks == 0 || y.block_size == 0) {
      return fail(WireErrc::kInvalid, strfmt("%s: %u blocks of %u tokens, expected both >= 1",
                                             at.c_str(), y.num_blocks, y.block_size));
    }
  }
  return out;
}

}  // namespace

Result<WireFrame> encode(const PlacementMsg& m, const SendInfo& send) {
  for (size_t s = 0; s < m.shards.size(); ++s) {
    for (int32_t e : m.shards[s].experts) {
      if (e < 0) {
        return fail(WireErrc::kUnencodable,
                    strfmt("encode Placement: shards[%zu] has expert %d, expected ids >= 0", s, e));
      }
    }
  }
  return encode_msg<schemas::Placement>(
      "encode Placement", m.header.cluster_epoch, send,
      [&](schemas::Placement::Builder root) -> Status {
        root.setVersion(m.version);
        root.setModelName(text(m.model_name));
        root.setModelFileHash(m.model_hash);
        auto stages = root.initStages(static_cast<unsigned>(m.stages.size()));
        for (size_t i = 0; i < m.stages.size(); ++i) {
          const StagePlacementInfo& x = m.stages[i];
          auto y = stages[unsigned(i)];
          y.setStage(x.stage);
          y.setNodeId(x.node_id);
          y.initDevices(1).set(0, -1);  // CPU: the only device this build places on
          y.setLayerBegin(x.layer_begin);
          y.setLayerEnd(x.layer_end);
          y.setHasEmbedding(x.has_embedding);
          y.setHasOutputHead(x.has_output_head);
          y.setThreads(x.threads);
        }
        auto shards = root.initExpertShards(static_cast<unsigned>(m.shards.size()));
        for (size_t i = 0; i < m.shards.size(); ++i) {
          const ShardPlacementInfo& x = m.shards[i];
          auto y = shards[unsigned(i)];
          y.setShard(x.shard);
          y.setNodeId(x.node_id);
          y.setDevice(-1);
          write_ints(y.initExperts(static_cast<unsigned>(x.experts.size())), x.experts);
          y.setThreads(x.threads);
        }
        auto pools = root.initKvPools(static_cast<unsigned>(m.kv_pools.size()));
        for (size_t i = 0; i < m.kv_pools.size(); ++i) {
          const KvPoolInfo& x = m.kv_pools[i];
          auto y = pools[unsigned(i)];
          y.setStage(x.stage);
          y.setNodeId(x.node_id);
          y.setDevice(-1);
          y.setNumBlocks(x.num_blocks);
          y.setBlockSizeTokens(x.block_size);
        }
        root.setNumMicrobatches(m.microbatches);
        return Ok{};
      });
}

Result<PlacementMsg> decode_placement(std::span<const uint8_t> f, const ControlLimits& l) {
  return decode_frame<schemas::Placement, PlacementMsg>(
      f, l.max_frame_bytes, "Placement",
      [&](schemas::Placement::Reader root) -> Result<PlacementMsg> {
        PlacementMsg m;
        auto h = read_wire_header(root.getHeader(), l.expected_epoch, "Placement");
        if (!h) return h.error();
        m.header = *h;
        m.version = root.getVersion();
        auto name = read_text(root.getModelName(), l.max_text, "Placement.modelName");
        if (!name) return name.error();
        m.model_name = std::move(*name);
        m.model_hash = root.getModelFileHash();
        auto stages = read_stages(root.getStages(), l);
        if (!stages) return stages.error();
        m.stages = std::move(*stages);
        auto shards = read_shards(root.getExpertShards(), l);
        if (!shards) return shards.error();
        m.shards = std::move(*shards);
        auto pools = read_kv_pools(root.getKvPools(), m.stages.size());
        if (!pools) return pools.error();
        m.kv_pools = std::move(*pools);
        if (root.getEncoders().size() != 0) {
          return fail(WireErrc::kUnsupported,
                      strfmt("Placement.encoders: %u encoders, this build has no encoder path",
                             root.getEncoders().size()));
        }
        m.microbatches = root.getNumMicrobatches();
        if (m.microbatches == 0)
          return fail(WireErrc::kInvalid, "Placement.numMicrobatches: 0, expected >= 1");
        return m;
      });
}

Result<WireFrame> encode(const PlacementReportMsg& m, const SendInfo& send) {
  return encode_msg<schemas::PlacementReport>(
      "encode PlacementReport", m.header.cluster_epoch, send,
      [&](schemas::PlacementReport::Builder root) -> Status {
        root.setVersion(m.version);
        root.setOk(m.ok);
        if (!m.error.empty()) write_error(root.initError(), m.error);
        write_phases(root.initStartupPhases(static_cast<unsigned>(m.phases.size())), m.phases);
        return Ok{};
      });
}

Result<PlacementReportMsg> decode_placement_report(std::span<const uint8_t> f,
                                                   const ControlLimits& l) {
  return decode_frame<schemas::PlacementReport, PlacementReportMsg>(
      f, l.max_frame_bytes, "PlacementReport",
      [&](schemas::PlacementReport::Reader root) -> Result<PlacementReportMsg> {
        PlacementReportMsg m;
        auto h = read_wire_header(root.getHeader(), l.expected_epoch, "PlacementReport");
        if (!h) return h.error();
        m.header = *h;
        m.version = root.getVersion();
        m.ok = root.getOk();
        if (root.hasError()) m.error = read_error(root.getError());
        auto phases = read_phases(root.getStartupPhases(), l, "PlacementReport.startupPhases");
        if (!phases) return phases.error();
        m.phases = std::move(*phases);
        return m;
      });
}

// ---- Status ------------------------------------------------------------------------------------

Result<WireFrame> encode(const StatusRequestMsg& m, const SendInfo& send) {
  return encode_msg<schemas::StatusRequest>("encode StatusRequest", m.header.cluster_epoch, send,
                                            [&](schemas::StatusRequest::Builder root) -> Status {
                                              root.setIncludeKv(m.include_kv);
                                              return Ok{};
                                            });
}

Result<StatusRequestMsg> decode_status_request(std::span<const uint8_t> f, const ControlLimits& l) {
  return decode_frame<schemas::StatusRequest, StatusRequestMsg>(
      f, l.max_frame_bytes, "StatusRequest",
      [&](schemas::StatusRequest::Reader root) -> Result<StatusRequestMsg> {
        StatusRequestMsg m;
        auto h = read_wire_header(root.getHeader(), l.expected_epoch, "StatusRequest");
        if (!h) return h.error();
        m.header = *h;
        m.include_kv = root.getIncludeKv();
        return m;
      });
}

namespace {

void write_actors(capnp::List<schemas::ActorStatus>::Builder dst,
                  const std::vector<ActorStatusInfo>& actors) {
  for (size_t i = 0; i < actors.size(); ++i) {
    const ActorStatusInfo& x = actors[i];
    auto y = dst[unsigned(i)];
    write_actor(y.initActor(), x.actor);
    y.setName(text(x.name));
    y.setState(static_cast<schemas::ActorState>(x.state));
    y.setRestarts(x.restarts);
    y.setUptimeMs(x.uptime_ms);
    y.setLastError(text(x.last_error));
  }
}

void write_throughput(schemas::Throughput::Builder dst, const ThroughputInfo& t) {
  dst.setWindowMs(t.window_ms);
  dst.setPromptTokensPerS(t.prompt_tokens_per_s);
  dst.setGenerationTokensPerS(t.generation_tokens_per_s);
  dst.setStepsPerS(t.steps_per_s);
  dst.setNumRequestsRunning(t.num_requests_running);
  dst.setNumRequestsWaiting(t.num_requests_waiting);
}

Result<std::vector<ActorStatusInfo>> read_actors(capnp::List<schemas::ActorStatus>::Reader src,
                                                 const ControlLimits& l) {
  if (auto st = check_len("StatusSnapshot.actors", src.size(), l.max_list); !st) return st.error();
  std::vector<ActorStatusInfo> out(src.size());
  for (unsigned i = 0; i < src.size(); ++i) {
    const std::string at = strfmt("StatusSnapshot.actors[%u]", i);
    auto x = src[i];
    ActorStatusInfo& y = out[i];
    auto actor = read_actor(x.getActor(), at + ".actor");
    if (!actor) return actor.error();
    auto name = read_text(x.getName(), l.max_text, at + ".name", true);
    if (!name) return name.error();
    auto state = read_enum(x.getState(), uint16_t(ActorStateInfo::kFailed), at + ".state");
    if (!state) return state.error();
    auto last_error = read_text(x.getLastError(), l.max_text, at + ".lastError");
    if (!last_error) return last_error.error();
    y = {*actor,          std::move(*name), static_cast<ActorStateInfo>(*state),
         x.getRestarts(), x.getUptimeMs(),  std::move(*last_error)};
  }
  return out;
}

// Rates are finite and >= 0.
Result<ThroughputInfo> read_throughput(schemas::Throughput::Reader src) {
  ThroughputInfo t{src.getWindowMs(),  src.getPromptTokensPerS(),   src.getGenerationTokensPerS(),
                   src.getStepsPerS(), src.getNumRequestsRunning(), src.getNumRequestsWaiting()};
  const std::pair<const char*, double> rates[] = {
      {"promptTokensPerS", t.prompt_tokens_per_s},
      {"generationTokensPerS", t.generation_tokens_per_s},
      {"stepsPerS", t.steps_per_s}};
  for (const auto& [name, v] : rates) {
    if (!std::isfinite(v) || v < 0) {
      return fail(WireErrc::kInvalid,
                  strfmt("StatusSnapshot.throughput.%s: %g, expected a finite rate >= 0", name, v));
    }
  }
  return t;
}

}  // namespace

Result<WireFrame> encode(const StatusSnapshotMsg& m, const SendInfo& send) {
  const uint64_t epoch = m.header.cluster_epoch;
  return encode_msg<schemas::StatusSnapshot>(
      "encode StatusSnapshot", epoch, send, [&](schemas::StatusSnapshot::Builder root) -> Status {
        root.setTakenAtMs(m.taken_at_ms);
        // The embedded view gets the snapshot's own header so that it is a valid Membership.
        if (m.has_membership) write_membership(root.initMembership(), m.membership, epoch, send);
        write_actors(root.initActors(static_cast<unsigned>(m.actors.size())), m.actors);
        write_phases(root.initStartupPhases(static_cast<unsigned>(m.phases.size())), m.phases);
        if (m.has_throughput) write_throughput(root.initThroughput(), m.throughput);
        root.setPlacementVersion(m.placement_version);
        root.setReporter(text(m.reporter));
        root.setServing(m.serving);
        return Ok{};
      });
}

Result<StatusSnapshotMsg> decode_status_snapshot(std::span<const uint8_t> f,
                                                 const ControlLimits& l) {
  return decode_frame<schemas::StatusSnapshot, StatusSnapshotMsg>(
      f, l.max_frame_bytes, "StatusSnapshot",
      [&](schemas::StatusSnapshot::Reader root) -> Result<StatusSnapshotMsg> {
        StatusSnapshotMsg m;
        auto h = read_wire_header(root.getHeader(), l.expected_epoch, "StatusSnapshot");
        if (!h) return h.error();
        m.header = *h;
        m.taken_at_ms = root.getTakenAtMs();
        m.has_membership = root.hasMembership();
        if (m.has_membership) {
          auto members = read_membership(root.getMembership(), l, "StatusSnapshot.membership");
          if (!members) return members.error();
          m.membership = std::move(*members);
        }
        auto actors = read_actors(root.getActors(), l);
        if (!actors) return actors.error();
        m.actors = std::move(*actors);
        auto phases = read_phases(root.getStartupPhases(), l, "StatusSnapshot.startupPhases");
        if (!phases) return phases.error();
        m.phases = std::move(*phases);
        // kvPools: no in-process home yet; not walked.
        m.has_throughput = root.hasThroughput();
        if (m.has_throughput) {
          auto t = read_throughput(root.getThroughput());
          if (!t) return t.error();
          m.throughput = *t;
        }
        m.placement_version = root.getPlacementVersion();
        auto reporter = read_text(root.getReporter(), l.max_text, "StatusSnapshot.reporter");
        if (!reporter) return reporter.error();
        m.reporter = std::move(*reporter);
        m.serving = root.getServing();
        return m;
      });
}

// ---- Client protocol ---------------------------------------------------------------------------

namespace {

// Token ids in [0, n_vocab), or in [0, 2^31) when n_vocab is 0 (not known to this side).
template <class List>
Status check_tokens(const List& ids, int64_t n_vocab, const std::string& where) {
  const int64_t bound = n_vocab > 0 ? n_vocab : int64_t{std::numeric_limits<int32_t>::max()} + 1;
  return wire_internal::check_ids(ids, bound, where, "token id");
}

// Rows of a finished event's logits: one per generated token, plus one when a stop token (EOS
// or a stop id) ended the request: the router keeps that token's row but not the token.
bool logits_rows_ok(uint64_t rows, size_t tokens, const std::string& finish_reason) {
  return rows == tokens || (rows == tokens + 1 && finish_reason == "stop");
}

Result<GenerateRequest> read_request(schemas::GenerateRequest::Reader root, const ClientLimits& l) {
  GenerateRequest r;
  auto prompt = read_text(root.getPrompt(), l.max_text, "GenerateRequest.prompt");
  if (!prompt) return prompt.error();
  r.prompt = std::move(*prompt);
  auto tokens = root.getPromptTokens();
  if (auto st = check_len("GenerateRequest.promptTokens", tokens.size(), l.max_prompt_tokens); !st)
    return st.error();
  if (auto st = check_tokens(tokens, l.n_vocab, "GenerateRequest.promptTokens"); !st)
    return st.error();
  r.prompt_tokens = wire_internal::to_vector(tokens);
  r.add_bos = root.getAddBos();
  auto sampling = read_sampling(root.getSampling(), "GenerateRequest.sampling", l.max_stop_tokens);
  if (!sampling) return sampling.error();
  r.sampling = std::move(*sampling);
  auto stops = root.getStopStrings();
  if (auto st = check_len("GenerateRequest.stopStrings", stops.size(), l.max_stop_strings); !st)
    return st.error();
  for (unsigned i = 0; i < stops.size(); ++i) {
    const std::string at = strfmt("GenerateRequest.stopStrings[%u]", i);
    auto s = read_text(stops[i], l.max_text, at);
    if (!s) return s.error();
    if (s->empty()) return fail(WireErrc::kInvalid, at + ": empty, expected a non-empty string");
    r.sampling.stop_strings.push_back(std::move(*s));
  }
  if (auto st = r.sampling.validate(); !st)
    return fail(WireErrc::kInvalid, "GenerateRequest.sampling: " + st.error().message);
  r.max_tokens = root.getMaxTokens();
  if (r.max_tokens < 1 || r.max_tokens > l.max_tokens) {
    return fail(WireErrc::kInvalid,
                strfmt("GenerateRequest.maxTokens: %lld, expected 1 .. %lld",
                       static_cast<long long>(r.max_tokens), static_cast<long long>(l.max_tokens)));
  }
  r.return_logits = root.getReturnLogits();
  return r;
}

// The finished part of an event: prompt and generated tokens, text, reason, error, logits.
Status read_result(schemas::GenerateEvent::Reader root, const ClientLimits& l, GenerateResult& r) {
  auto prompt = root.getPromptTokens();
  if (auto st = check_len("GenerateEvent.promptTokens", prompt.size(), l.max_prompt_tokens); !st)
    return st;
  if (auto st = check_tokens(prompt, l.n_vocab, "GenerateEvent.promptTokens"); !st) return st;
  r.prompt_tokens = wire_internal::to_vector(prompt);
  auto tokens = root.getTokens();
  if (auto st = check_len("GenerateEvent.tokens", tokens.size(),
                          size_t(std::max<int64_t>(l.max_tokens, 0)));
      !st)
    return st;
  if (auto st = check_tokens(tokens, l.n_vocab, "GenerateEvent.tokens"); !st) return st;
  r.tokens = wire_internal::to_vector(tokens);
  auto text = read_text(root.getText(), l.max_text, "GenerateEvent.text");
  if (!text) return text.error();
  r.text = std::move(*text);
  auto reason = read_text(root.getFinishReason(), l.max_text, "GenerateEvent.finishReason");
  if (!reason) return reason.error();
  if (std::find_if(std::begin(kFinishReasons), std::end(kFinishReasons),
                   [&](const char* k) { return *reason == k; }) == std::end(kFinishReasons)) {
    return fail(WireErrc::kInvalid,
                strfmt("GenerateEvent.finishReason: '%.64s', expected length, eos, stop, "
                       "cancelled, error or overloaded",
                       reason->c_str()));
  }
  r.finish_reason = std::move(*reason);
  if (root.hasError()) r.error = read_error(root.getError());
  if (!root.hasLogits()) return Ok{};
  auto v = schemas::read_tensor(root.getLogits());
  if (!v) return in_field("GenerateEvent.logits", v.error());
  const int64_t width = l.n_vocab > 0 ? l.n_vocab : -1;
  if (auto st =
          schemas::expect_tensor(*v, {TensorDtype::kF32}, {-1, width}, "GenerateEvent.logits");
      !st)
    return st;
  if (!logits_rows_ok(v->dim(0), r.tokens.size(), r.finish_reason) || v->dim(1) == 0) {
    return fail(WireErrc::kInvalid,
                strfmt("GenerateEvent.logits: f32 [%llu, %llu], expected [%zu tokens (+1 when a "
                       "stop token ended it), n_vocab >= 1] for finish reason '%s'",
                       static_cast<unsigned long long>(v->dim(0)),
                       static_cast<unsigned long long>(v->dim(1)), r.tokens.size(),
                       r.finish_reason.c_str()));
  }
  auto logits = v->as<float>();
  r.logits.assign(logits.begin(), logits.end());
  return Ok{};
}

}  // namespace

Result<WireFrame> encode(const GenerateRequestMsg& m, const SendInfo& send) {
  const GenerateRequest& r = m.request;
  return encode_msg<schemas::GenerateRequest>(
      "encode GenerateRequest", m.header.cluster_epoch, send,
      [&](schemas::GenerateRequest::Builder root) -> Status {
        root.setTag(m.tag);
        root.setPrompt(text(r.prompt));
        write_ints(root.initPromptTokens(static_cast<unsigned>(r.prompt_tokens.size())),
                   r.prompt_tokens);
        root.setAddBos(r.add_bos);
        write_sampling(root.initSampling(), r.sampling);
        const auto& stops = r.sampling.stop_strings;
        auto list = root.initStopStrings(static_cast<unsigned>(stops.size()));
        for (size_t i = 0; i < stops.size(); ++i) list.set(unsigned(i), text(stops[i]));
        root.setMaxTokens(r.max_tokens);
        root.setReturnLogits(r.return_logits);
        return Ok{};
      });
}

Result<GenerateRequestMsg> decode_generate_request(std::span<const uint8_t> f,
                                                   const ClientLimits& l) {
  return decode_frame<schemas::GenerateRequest, GenerateRequestMsg>(
      f, l.max_frame_bytes, "GenerateRequest",
      [&](schemas::GenerateRequest::Reader root) -> Result<GenerateRequestMsg> {
        GenerateRequestMsg m;
        auto h = read_wire_header(root.getHeader(), l.expected_epoch, "GenerateRequest");
        if (!h) return h.error();
        m.header = *h;
        m.tag = root.getTag();
        auto r = read_request(root, l);
        if (!r) return r.error();
        m.request = std::move(*r);
        return m;
      });
}

Result<WireFrame> encode(const CancelRequestMsg& m, const SendInfo& send) {
  return encode_msg<schemas::CancelRequest>("encode CancelRequest", m.header.cluster_epoch, send,
                                            [&](schemas::CancelRequest::Builder root) -> Status {
                                              root.setTag(m.tag);
                                              return Ok{};
                                            });
}

Result<CancelRequestMsg> decode_cancel_request(std::span<const uint8_t> f, const ClientLimits& l) {
  return decode_frame<schemas::CancelRequest, CancelRequestMsg>(
      f, l.max_frame_bytes, "CancelRequest",
      [&](schemas::CancelRequest::Reader root) -> Result<CancelRequestMsg> {
        CancelRequestMsg m;
        auto h = read_wire_header(root.getHeader(), l.expected_epoch, "CancelRequest");
        if (!h) return h.error();
        m.header = *h;
        m.tag = root.getTag();
        return m;
      });
}

Result<WireFrame> encode(const GenerateEventMsg& m, int64_t n_vocab, const SendInfo& send) {
  const GenerateResult& r = m.result;
  const char* what = "encode GenerateEvent";
  if (m.finished && !r.logits.empty()) {
    const uint64_t rows = n_vocab >= 1 ? r.logits.size() / uint64_t(n_vocab) : 0;
    if (n_vocab < 1 || r.logits.size() % uint64_t(n_vocab) != 0 ||
        !logits_rows_ok(rows, r.tokens.size(), r.finish_reason)) {
      return fail(WireErrc::kUnencodable,
                  strfmt("%s: %zu logits for %zu tokens at n_vocab %lld, expected tokens (+1 "
                         "when a stop token ended it) x n_vocab >= 1",
                         what, r.logits.size(), r.tokens.size(), static_cast<long long>(n_vocab)));
    }
  }
  return encode_msg<schemas::GenerateEvent>(
      what, m.header.cluster_epoch, send, [&](schemas::GenerateEvent::Builder root) -> Status {
        root.setTag(m.tag);
        root.setDelta(text(m.delta));
        root.setToken(m.token);
        root.setFinished(m.finished);
        if (!m.finished) return Ok{};
        write_ints(root.initPromptTokens(static_cast<unsigned>(r.prompt_tokens.size())),
                   r.prompt_tokens);
        write_ints(root.initTokens(static_cast<unsigned>(r.tokens.size())), r.tokens);
        root.setText(text(r.text));
        root.setFinishReason(text(r.finish_reason));
        if (!r.error.empty()) write_error(root.initError(), r.error);
        if (r.logits.empty()) return Ok{};
        const uint64_t shape[] = {r.logits.size() / uint64_t(n_vocab), uint64_t(n_vocab)};
        std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(r.logits.data()),
                                       r.logits.size() * sizeof(float));
        if (auto st = schemas::set_tensor_copy(root.initLogits(), TensorDtype::kF32, shape, bytes);
            !st)
          return in_field("encode GenerateEvent: logits", st.error());
        return Ok{};
      });
}

Result<GenerateEventMsg> decode_generate_event(std::span<const uint8_t> f, const ClientLimits& l) {
  return decode_frame<schemas::GenerateEvent, GenerateEventMsg>(
      f, l.max_frame_bytes, "GenerateEvent",
      [&](schemas::GenerateEvent::Reader root) -> Result<GenerateEventMsg> {
        GenerateEventMsg m;
        auto h = read_wire_header(root.getHeader(), l.expected_epoch, "GenerateEvent");
        if (!h) return h.error();
        m.header = *h;
        m.tag = root.getTag();
        auto delta = read_text(root.getDelta(), l.max_text, "GenerateEvent.delta");
        if (!delta) return delta.error();
        m.delta = std::move(*delta);
        m.token = root.getToken();
        if (m.token < -1 || (l.n_vocab > 0 && m.token >= l.n_vocab)) {
          return fail(WireErrc::kInvalid,
                      strfmt("GenerateEvent.token: %d, expected -1 or a token id in [0, %lld)",
                             m.token, static_cast<long long>(l.n_vocab)));
        }
        m.finished = root.getFinished();
        // The result fields mean something only in the finished event; elsewhere not read.
        if (m.finished) {
          if (auto st = read_result(root, l, m.result); !st) return st.error();
        }
        return m;
      });
}

}  // namespace troupe::actors::detail
