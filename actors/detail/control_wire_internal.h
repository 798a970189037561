// Helpers shared by the control-plane codec's files (actors/control_wire.cc, membership and
// liveness; control_wire_placement.cc; control_wire_status.cc; control_wire_client.cc): encoding a
// control message with its header, and writing and reading the structs several messages embed
// (actor ids, resources, start-up phases, a membership view) with every value checked. Includes
// Cap'n Proto headers: only those .cc files may include it. Free functions, no shared state.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "actors/detail/control_wire.h"
#include "actors/detail/wire_internal.h"
#include "schemas/cluster.capnp.h"

namespace troupe::actors::detail::control_wire_internal {

using wire_internal::build_frame;
using wire_internal::check_len;
using wire_internal::check_send;
using wire_internal::fail;
using wire_internal::write_header;

// Text as Cap'n Proto sees it: with its size, so embedded NULs survive the trip.
inline capnp::Text::Reader text(const std::string& s) {
  return capnp::Text::Reader(s.data(), s.size());
}

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

inline void write_actor(schemas::ActorId::Builder dst, const ActorRef& a) {
  dst.setNode(a.node);
  dst.setRole(static_cast<schemas::Role>(a.role));
  dst.setIndex(a.index);
}

inline void write_resources(schemas::NodeResources::Builder dst, const ResourcesInfo& r) {
  dst.setCpuCores(r.cpu_cores);
  dst.setMemoryBytes(r.memory_bytes);
  dst.setFreeMemoryBytes(r.free_memory_bytes);
}

inline void write_phases(capnp::List<schemas::StartupPhase>::Builder dst,
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

inline void write_membership(schemas::Membership::Builder dst, const MembershipMsg& m,
                             uint64_t epoch, const SendInfo& send) {
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
inline Result<std::string> read_text(capnp::Text::Reader t, size_t max, const std::string& where,
                                     bool required = false) {
  if (t.size() > max) {
    return fail(WireErrc::kTooLong,
                strfmt("%s: %zu bytes exceed the limit of %zu", where.c_str(), t.size(), max));
  }
  if (required && t.size() == 0)
    return fail(WireErrc::kInvalid, where + ": empty, expected a name");
  return std::string(t.begin(), t.size());
}

// An enumerant this build knows: raw value <= max.
template <class E>
Result<uint16_t> read_enum(E value, uint16_t max, const std::string& where) {
  const auto raw = static_cast<uint16_t>(value);
  if (raw <= max) return raw;
  return fail(WireErrc::kInvalid,
              strfmt("%s: unknown value %u, expected 0..%u", where.c_str(), raw, unsigned{max}));
}

inline Result<ActorRef> read_actor(schemas::ActorId::Reader src, const std::string& where) {
  const auto role = static_cast<uint16_t>(src.getRole());
  if (role == 0 || role > uint16_t(ActorRole::kGateway)) {
    return fail(WireErrc::kInvalid, strfmt("%s.role: %u is not a known role, expected 1..%u",
                                           where.c_str(), role, unsigned(ActorRole::kGateway)));
  }
  return ActorRef{src.getNode(), static_cast<ActorRole>(role), src.getIndex()};
}

inline ResourcesInfo read_resources(schemas::NodeResources::Reader src) {
  // devices: no in-process home yet; not walked.
  return {src.getCpuCores(), src.getMemoryBytes(), src.getFreeMemoryBytes()};
}

// Node ids are assigned at join and are >= 1.
inline Status check_node_id(uint32_t id, const std::string& where) {
  if (id != 0) return Ok{};
  return fail(WireErrc::kInvalid, where + ": node id 0, expected an assigned id >= 1");
}

inline Result<std::vector<StartupPhaseInfo>> read_phases(
    capnp::List<schemas::StartupPhase>::Reader src, const ControlLimits& l,
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

inline void write_links(capnp::List<schemas::LinkCounters>::Builder dst,
                        const std::vector<LinkCountersInfo>& links) {
  for (size_t i = 0; i < links.size(); ++i) {
    const LinkCountersInfo& x = links[i];
    auto y = dst[unsigned(i)];
    y.setNode(text(x.node));
    y.setPeer(text(x.peer));
    y.setAddress(text(x.address));
    y.setMessagesSent(x.messages_sent);
    y.setBytesSent(x.bytes_sent);
    y.setMessagesReceived(x.messages_received);
    y.setBytesReceived(x.bytes_received);
    y.setSendErrors(x.send_errors);
    y.setMalformed(x.malformed);
    y.setCorrupted(x.corrupted);
    y.setOversized(x.oversized);
    y.setPulled(x.pulled);
    y.setPullsTo(x.pulls_to);
    y.setPullsFrom(x.pulls_from);
  }
}

inline Result<std::vector<LinkCountersInfo>> read_links(
    capnp::List<schemas::LinkCounters>::Reader src, const ControlLimits& l,
    const std::string& where) {
  if (auto st = check_len(where, src.size(), l.max_list); !st) return st.error();
  std::vector<LinkCountersInfo> out(src.size());
  for (unsigned i = 0; i < src.size(); ++i) {
    const std::string at = strfmt("%s[%u]", where.c_str(), i);
    auto x = src[i];
    LinkCountersInfo& y = out[i];
    auto node = read_text(x.getNode(), l.max_text, at + ".node", true);
    if (!node) return node.error();
    auto peer = read_text(x.getPeer(), l.max_text, at + ".peer");
    if (!peer) return peer.error();
    auto address = read_text(x.getAddress(), l.max_text, at + ".address");
    if (!address) return address.error();
    y.node = std::move(*node);
    y.peer = std::move(*peer);
    y.address = std::move(*address);
    y.messages_sent = x.getMessagesSent();
    y.bytes_sent = x.getBytesSent();
    y.messages_received = x.getMessagesReceived();
    y.bytes_received = x.getBytesReceived();
    y.send_errors = x.getSendErrors();
    y.malformed = x.getMalformed();
    y.corrupted = x.getCorrupted();
    y.oversized = x.getOversized();
    y.pulled = x.getPulled();
    y.pulls_to = x.getPullsTo();
    y.pulls_from = x.getPullsFrom();
    if (y.corrupted > y.malformed || y.pulled > y.messages_received)
      return fail(WireErrc::kInvalid,
                  at + ": counters that cannot be (corrupted > malformed or pulled > received)");
  }
  return out;
}

inline void write_transport(schemas::TransportCounters::Builder dst,
                            const TransportCountersInfo& x) {
  dst.setNode(text(x.node));
  dst.setAuthFailures(x.auth_failures);
  dst.setUnauthenticatedDropped(x.unauthenticated_dropped);
  dst.setConnectionsAccepted(x.connections_accepted);
}

// `node` may be empty only where `allow_empty` (a heartbeat: the head knows who sent it).
inline Result<TransportCountersInfo> read_transport(schemas::TransportCounters::Reader src,
                                                    const ControlLimits& l,
                                                    const std::string& where, bool allow_empty) {
  auto node = read_text(src.getNode(), l.max_text, where + ".node", !allow_empty);
  if (!node) return node.error();
  return TransportCountersInfo{std::move(*node), src.getAuthFailures(),
                               src.getUnauthenticatedDropped(), src.getConnectionsAccepted()};
}

// Membership without its header (StatusSnapshot embeds one whose header is unused).
inline Result<MembershipMsg> read_membership(schemas::Membership::Reader src,
                                             const ControlLimits& l, const std::string& where) {
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

}  // namespace troupe::actors::detail::control_wire_internal
