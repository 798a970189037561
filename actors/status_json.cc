// JSON rendering of a status snapshot (see detail/control_wire.h status_json).
#include <cstdio>
#include <map>

#include "actors/detail/control_wire.h"

namespace troupe::actors::detail {

namespace {

std::string json_str(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
      o += buf;
    } else {
      o += c;
    }
  }
  return o + "\"";
}

const char* state_name(ActorStateInfo s) {
  switch (s) {
    case ActorStateInfo::kStarting:
      return "starting";
    case ActorStateInfo::kRunning:
      return "running";
    case ActorStateInfo::kRestarting:
      return "restarting";
    case ActorStateInfo::kStopped:
      return "stopped";
    case ActorStateInfo::kFailed:
      return "failed";
  }
  return "unknown";
}

}  // namespace

std::string status_json(const StatusSnapshotMsg& s) {
  std::map<uint32_t, std::string> names;
  for (const auto& m : s.membership.members) names[m.node_id] = m.name;
  std::string o =
      "{\"node\":" + json_str(s.reporter) + ",\"serving\":" + (s.serving ? "true" : "false") +
      ",\"condition\":" + json_str(s.condition) +
      ",\"epoch\":" + std::to_string(s.header.cluster_epoch) +
      ",\"placement_version\":" + std::to_string(s.placement_version) +
      ",\"membership_version\":" + std::to_string(s.membership.version) + ",\"members\":[";
  for (size_t i = 0; i < s.membership.members.size(); ++i) {
    const auto& m = s.membership.members[i];
    o += (i ? "," : "") + std::string("{\"id\":") + std::to_string(m.node_id) +
         ",\"name\":" + json_str(m.name) + ",\"address\":" + json_str(m.address) +
         ",\"state\":" + json_str(to_string(m.state)) +
         ",\"heartbeat_age_ms\":" + std::to_string(m.last_heartbeat_age_ms) +
         ",\"cpu_cores\":" + std::to_string(m.resources.cpu_cores) +
         ",\"memory_bytes\":" + std::to_string(m.resources.memory_bytes) +
         ",\"free_memory_bytes\":" + std::to_string(m.resources.free_memory_bytes) + "}";
  }
  o += "],\"actors\":[";
  for (size_t i = 0; i < s.actors.size(); ++i)
    o += (i ? "," : "") + std::string("{\"name\":") + json_str(s.actors[i].name) +
         ",\"state\":" + json_str(state_name(s.actors[i].state)) +
         ",\"restarts\":" + std::to_string(s.actors[i].restarts) + "}";
  o += "],\"phases\":[";
  for (size_t i = 0; i < s.phases.size(); ++i) {
    const auto& p = s.phases[i];
    const auto it = names.find(p.actor.node);
    o += (i ? "," : "") + std::string("{\"node\":") +
         json_str(it != names.end() ? it->second : s.reporter) + ",\"name\":" + json_str(p.name) +
         ",\"start_ms\":" + std::to_string(p.start_ms) +
         ",\"duration_ms\":" + std::to_string(p.duration_ms) +
         ",\"done\":" + (p.done ? "true" : "false") + "}";
  }
  return o + "]}";
}

}  // namespace troupe::actors::detail
