// Node daemon: its status snapshot (`troupe status`): membership and start-up phases (the
// head's with every node's), links and transports, placed actors, the head's image encoder.
#include <algorithm>
#include <map>
#include <string>

#include "actors/detail/node_state.h"
#include "actors/encoder.h"

namespace troupe::actors::detail {

namespace {

// Node id -> name: the head's member table, or the membership it sent.
std::map<uint32_t, std::string> node_names(NodeSelf* self) {
  auto& st = self->state;
  std::map<uint32_t, std::string> out;
  if (st.head) {
    for (const auto& [name, m] : st.members) out[m.node_id] = name;
  } else {
    for (const auto& m : st.membership.members) out[m.node_id] = m.name;
  }
  return out;
}

// Every placed stage, expert shard and image encoder, named kind/index@node, running once its node
// reported.
void add_actors(NodeSelf* self, StatusSnapshotMsg& s) {
  auto& st = self->state;
  const auto names = node_names(self);
  auto add = [&](ActorRole role, uint32_t index, uint32_t node, const char* kind) {
    ActorStatusInfo a;
    a.actor = {node, role, index};
    const auto it = names.find(node);
    a.name = std::string(kind) + "/" + std::to_string(index) + "@" +
             (it != names.end() ? it->second : "?");
    bool up = false;
    if (st.head) {
      for (const auto& [n, m] : st.members)
        if (m.node_id == node) up = m.reported && m.state == MemberState::kAlive;
    } else {
      up = node == st.link->node_id() && st.placed;
    }
    a.state = up ? ActorStateInfo::kRunning : ActorStateInfo::kStarting;
    s.actors.push_back(std::move(a));
  };
  for (const auto& sp : st.placement->stages) add(ActorRole::kStage, sp.stage, sp.node_id, "stage");
  for (const auto& sp : st.placement->shards)
    add(ActorRole::kExpertShard, sp.shard, sp.node_id, "expert");
  for (const auto& e : st.placement->encoders)
    add(ActorRole::kEncoder, e.index, e.node_id, "encoder");
}

}  // namespace

StatusSnapshotMsg snapshot(NodeSelf* self) {
  auto& st = self->state;
  StatusSnapshotMsg s;
  s.header.cluster_epoch = std::max<uint64_t>(1, st.link->epoch());
  s.taken_at_ms = ms_since(st.started);
  s.placement_version = st.placement ? st.placement->version : 0;
  s.reporter = st.me.name;
  s.serving = st.head ? st.serving : st.placed;
  if (st.head) {
    s.condition = head_condition(self);
    s.has_membership = true;
    s.membership = membership_of(self);
    for (const auto& [name, m] : st.members) {
      auto ph = phase_infos(name == st.me.name ? st.phases : m.phases, m.node_id);
      s.phases.insert(s.phases.end(), ph.begin(), ph.end());
    }
  } else {
    s.phases = phase_infos(st.phases, st.link->node_id());
  }
  s.transport.resize(1);
  transport_counters(self, &s.links, &s.transport[0]);
  if (st.head)
    for (const auto& [name, m] : st.members)
      if (name != st.me.name && m.state == MemberState::kAlive) {
        s.links.insert(s.links.end(), m.links.begin(), m.links.end());
        if (m.transport) {
          s.transport.push_back(*m.transport);
          s.transport.back().node = name;  // as the head knows it
        }
      }
  if (st.placement) add_actors(self, s);
  if (st.encoder_counters) {
    s.has_encoder = true;
    s.encoder = encoder_info(st.plan.mmproj, *st.encoder_counters);
  }
  return s;
}

std::string status_json(NodeSelf* self) { return detail::status_json(snapshot(self)); }

void answer_status(NodeSelf* self, const MessagePtr& m) {
  auto r = decode_status_request(m->data(), {});
  if (!r) return drop_malformed(self, m, "status request", r.error().message);
  send_to(self, m->peer, snapshot(self), ActorRole::kNodeDaemon);
}

}  // namespace troupe::actors::detail
