// JSON and text renderings of a status snapshot (see detail/control_wire.h status_json).
#include <algorithm>
#include <cstdio>
#include <map>
#include <utility>
#include <vector>

#include "actors/detail/control_wire.h"
#include "base/check.h"

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

// How a link's large messages travel: by same-host pull (each way or both) or the UCX link.
const char* large_path(const LinkCountersInfo& l) {
  if (l.pulls_to && l.pulls_from) return "pull";
  if (l.pulls_to) return "pull out";
  if (l.pulls_from) return "pull in";
  return "ucx";
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
  auto n = [](uint64_t v) { return std::to_string(v); };
  o += "],\"links\":[";
  for (size_t i = 0; i < s.links.size(); ++i) {
    const auto& l = s.links[i];
    o += (i ? "," : "") + std::string("{\"node\":") + json_str(l.node) +
         ",\"peer\":" + json_str(l.peer) + ",\"address\":" + json_str(l.address) +
         ",\"large_messages\":" + json_str(large_path(l)) +
         ",\"messages_sent\":" + n(l.messages_sent) + ",\"bytes_sent\":" + n(l.bytes_sent) +
         ",\"messages_received\":" + n(l.messages_received) +
         ",\"bytes_received\":" + n(l.bytes_received) + ",\"pulled\":" + n(l.pulled) +
         ",\"malformed\":" + n(l.malformed) + ",\"corrupted\":" + n(l.corrupted) +
         ",\"oversized\":" + n(l.oversized) + ",\"send_errors\":" + n(l.send_errors) + "}";
  }
  o += "],\"transport\":[";
  for (size_t i = 0; i < s.transport.size(); ++i) {
    const auto& t = s.transport[i];
    o += (i ? "," : "") + std::string("{\"node\":") + json_str(t.node) +
         ",\"auth_failures\":" + n(t.auth_failures) +
         ",\"unauthenticated_dropped\":" + n(t.unauthenticated_dropped) +
         ",\"connections_accepted\":" + n(t.connections_accepted) + "}";
  }
  o += "]";
  if (s.has_encoder) o += ",\"encoder\":" + encoder_json(s.encoder);
  return o + "}";
}

std::string encoder_json(const EncoderInfo& e) {
  const auto n = [](uint64_t v) { return std::to_string(v); };
  return "{\"mmproj\":" + json_str(e.mmproj) + ",\"requests\":" + n(e.requests) +
         ",\"images\":" + n(e.images) + ",\"encoded\":" + n(e.encoded) +
         ",\"cache_hits\":" + n(e.cache_hits) + ",\"failed\":" + n(e.failed) +
         ",\"encode_seconds\":" + strfmt("%.3f", e.encode_seconds) +
         ",\"cache_entries\":" + n(e.cache_entries) + ",\"cache_bytes\":" + n(e.cache_bytes) +
         ",\"retried\":" + n(e.retried) + "}";
}

namespace {

// Rows of cells printed as left-aligned columns (right-aligned where `right` says), two spaces
// apart, each line indented by two.
std::string table(const std::vector<std::vector<std::string>>& rows,
                  const std::vector<bool>& right) {
  std::vector<size_t> w;
  for (const auto& r : rows)
    for (size_t c = 0; c < r.size(); ++c) {
      if (w.size() <= c) w.push_back(0);
      w[c] = std::max(w[c], r[c].size());
    }
  std::string o;
  for (const auto& r : rows) {
    std::string line;
    for (size_t c = 0; c < r.size(); ++c) {
      const std::string pad(w[c] - r[c].size(), ' ');
      const bool ra = c < right.size() && right[c];
      line += "  " + (ra ? pad + r[c] : r[c] + (c + 1 < r.size() ? pad : ""));
    }
    o += line + "\n";
  }
  return o;
}

std::string gb(uint64_t bytes) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.1f", static_cast<double>(bytes) / 1e9);
  return b;
}

// "N / X kB", "N / X MB" or "N / X GB": messages and bytes, in the unit that shows the bytes.
std::string traffic(uint64_t messages, uint64_t bytes) {
  const double v = static_cast<double>(bytes);
  const auto [div, unit] = v >= 1e9   ? std::pair{1e9, "GB"}
                           : v >= 1e6 ? std::pair{1e6, "MB"}
                                      : std::pair{1e3, "kB"};
  char b[64];
  std::snprintf(b, sizeof(b), "%llu / %.1f %s", static_cast<unsigned long long>(messages), v / div,
                unit);
  return b;
}

}  // namespace

std::string status_text(const StatusSnapshotMsg& s) {
  std::map<uint32_t, std::string> names;
  for (const auto& m : s.membership.members) names[m.node_id] = m.name;
  std::string o = "cluster: " + std::string(s.serving ? "serving" : "not serving") +
                  (s.condition.empty() ? "" : " (" + s.condition + ")") + "; reported by " +
                  s.reporter + "; epoch " + std::to_string(s.header.cluster_epoch) +
                  ", membership " + std::to_string(s.membership.version) + ", placement " +
                  std::to_string(s.placement_version) + "\n";
  std::vector<std::vector<std::string>> rows = {
      {"id", "name", "address", "state", "heartbeat", "cores", "free/total GB"}};
  for (const auto& m : s.membership.members)
    rows.push_back({std::to_string(m.node_id), m.name, m.address, to_string(m.state),
                    std::to_string(m.last_heartbeat_age_ms) + " ms",
                    std::to_string(m.resources.cpu_cores),
                    gb(m.resources.free_memory_bytes) + "/" + gb(m.resources.memory_bytes)});
  o += "members:\n" + table(rows, {true, false, false, false, true, true, true});
  rows = {{"actor", "state", "restarts"}};
  for (const auto& a : s.actors)
    rows.push_back({a.name, state_name(a.state), std::to_string(a.restarts)});
  o += "actors:\n" +
       (s.actors.empty() ? std::string("  (none placed)\n") : table(rows, {false, false, true}));
  rows = {{"node", "phase", "start ms", "duration ms"}};
  for (const auto& p : s.phases) {
    const auto it = names.find(p.actor.node);
    rows.push_back({it != names.end() ? it->second : s.reporter, p.name, std::to_string(p.start_ms),
                    p.done ? std::to_string(p.duration_ms) : "(running)"});
  }
  o += "start-up phases (ms since each node's start):\n" +
       (s.phases.empty() ? std::string("  (none)\n") : table(rows, {false, false, true, true}));
  // The address tells apart two links of one pair (both ends connected at once) and says which
  // end of the link it is: the peer's listening port, or the port it connected from.
  rows = {{"node", "peer", "address", "large msgs", "sent msgs / bytes", "received msgs / bytes",
           "pulled", "dropped (corrupt/oversized)", "send errors"}};
  for (const auto& l : s.links)
    rows.push_back({l.node, l.peer.empty() ? "-" : l.peer, l.address, large_path(l),
                    traffic(l.messages_sent, l.bytes_sent),
                    traffic(l.messages_received, l.bytes_received), std::to_string(l.pulled),
                    std::to_string(l.malformed + l.oversized) + " (" + std::to_string(l.corrupted) +
                        "/" + std::to_string(l.oversized) + ")",
                    std::to_string(l.send_errors)});
  o += "links (live; each node's own counts, other nodes' as of their last heartbeat):\n" +
       (s.links.empty() ? std::string("  (none)\n")
                        : table(rows, {false, false, false, false, true, true, true, true, true}));
  rows = {{"node", "peers refused", "from unauthenticated peers", "connections accepted"}};
  for (const auto& t : s.transport)
    rows.push_back({t.node, std::to_string(t.auth_failures),
                    std::to_string(t.unauthenticated_dropped),
                    std::to_string(t.connections_accepted)});
  if (!s.transport.empty()) o += "transports:\n" + table(rows, {false, true, true, true});
  if (s.has_encoder) {
    const EncoderInfo& e = s.encoder;
    o += strfmt(
        "image encoder: %s: %llu requests (%llu refused), %llu images: %llu encoded in %.3f s, "
        "%llu from the cache, %llu sent again; cache holds %llu images, %s MB\n",
        e.mmproj.c_str(), (unsigned long long)e.requests, (unsigned long long)e.failed,
        (unsigned long long)e.images, (unsigned long long)e.encoded, e.encode_seconds,
        (unsigned long long)e.cache_hits, (unsigned long long)e.retried,
        (unsigned long long)e.cache_entries, strfmt("%.1f", e.cache_bytes / 1e6).c_str());
  }
  return o;
}

}  // namespace troupe::actors::detail
