// Node daemon: the helpers the node actor's files share (see detail/node_state.h): dropping a
// malformed message, failing, readiness, start-up phases, the host's resources, the model file's
// hash, send errors.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <sys/sysinfo.h>

#include "actors/detail/node_state.h"

namespace troupe::actors::detail {

// --- helpers ----------------------------------------------------------------------------------

void drop_malformed(NodeSelf* self, const MessagePtr& m, const std::string& what,
                    const std::string& why) {
  auto& st = self->state;
  st.link->report_malformed(m->peer);
  std::fprintf(stderr, "troupe: node %s: dropped a %s from '%s': %s\n", st.me.name.c_str(),
               what.c_str(), st.link->peer_name(m->peer).c_str(), why.c_str());
}

void fail(NodeSelf* self, const std::string& why) {
  auto& st = self->state;
  std::fprintf(stderr, "troupe: node %s: %s\n", st.me.name.c_str(), why.c_str());
  std::lock_guard<std::mutex> lk(st.shared->mu);
  if (st.shared->failed.empty()) st.shared->failed = why;
  st.shared->cv.notify_all();
}

void set_ready(NodeSelf* self) {
  auto& sh = *self->state.shared;
  std::lock_guard<std::mutex> lk(sh.mu);
  sh.ready = true;
  sh.waiting_for.clear();
  sh.cv.notify_all();
}

void set_waiting(NodeSelf* self, const std::string& what) {
  auto& sh = *self->state.shared;
  std::lock_guard<std::mutex> lk(sh.mu);
  sh.waiting_for = what;
}

void begin_phase(NodeSelf* self, const std::string& name) {
  auto& st = self->state;
  st.phases.push_back({name, ms_since(st.started), 0, false});
}

void end_phase(NodeSelf* self, const std::string& name) {
  auto& st = self->state;
  for (auto& p : st.phases)
    if (p.name == name && !p.done) {
      p.duration_ms = ms_since(st.started) - p.start_ms;
      p.done = true;
      std::fprintf(stderr, "troupe: node %s: start-up phase '%s' took %llu ms\n",
                   st.me.name.c_str(), name.c_str(),
                   static_cast<unsigned long long>(p.duration_ms));
    }
}

ResourcesInfo local_resources() {
  ResourcesInfo r;
  r.cpu_cores = static_cast<uint32_t>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  struct sysinfo si {};
  if (sysinfo(&si) == 0) {
    r.memory_bytes = static_cast<uint64_t>(si.totalram) * si.mem_unit;
    r.free_memory_bytes = static_cast<uint64_t>(si.freeram + si.bufferram) * si.mem_unit;
  }
  // The kernel's estimate of what can be allocated without swapping (free memory plus the page
  // cache it can drop): a host that has read a model file has most of its memory in page cache.
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  while (meminfo >> key >> kib) {
    if (key == "MemAvailable:") {
      r.free_memory_bytes = kib * 1024;
      break;
    }
    meminfo.ignore(64, '\n');
  }
  return r;
}

uint64_t model_file_hash(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path f = fs::is_directory(path, ec) ? fs::path(path) / "config.json" : fs::path(path);
  std::ifstream in(f, std::ios::binary);
  if (!in) return 0;
  std::vector<char> buf(1 << 20);
  in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
  const size_t n = static_cast<size_t>(in.gcount());
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over the bytes, then the size
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<uint8_t>(buf[i])) * 0x100000001b3ull;
  const uint64_t size = fs::file_size(f, ec);
  for (int i = 0; i < 8; ++i) h = (h ^ ((size >> (8 * i)) & 0xff)) * 0x100000001b3ull;
  return h ? h : 1;
}

void report_send_error(NodeSelf* self, ControlMsg kind, const std::string& why) {
  std::fprintf(stderr, "troupe: node %s: cannot send a %s: %s\n", self->state.me.name.c_str(),
               to_string(kind), why.c_str());
}

ControlMsg control_kind(const JoinRequestMsg&) { return ControlMsg::kJoinRequest; }
ControlMsg control_kind(const JoinReplyMsg&) { return ControlMsg::kJoinReply; }
ControlMsg control_kind(const HeartbeatMsg&) { return ControlMsg::kHeartbeat; }
ControlMsg control_kind(const HeartbeatAckMsg&) { return ControlMsg::kHeartbeatAck; }
ControlMsg control_kind(const MembershipMsg&) { return ControlMsg::kMembership; }
ControlMsg control_kind(const PlacementMsg&) { return ControlMsg::kPlacement; }
ControlMsg control_kind(const PlacementReportMsg&) { return ControlMsg::kPlacementReport; }
ControlMsg control_kind(const LeaveNoticeMsg&) { return ControlMsg::kLeaveNotice; }
ControlMsg control_kind(const StatusSnapshotMsg&) { return ControlMsg::kStatusSnapshot; }
ControlMsg control_kind(const ActorRestartMsg&) { return ControlMsg::kActorRestart; }

std::vector<StartupPhaseInfo> phase_infos(const std::vector<Phase>& phases, uint32_t node_id) {
  std::vector<StartupPhaseInfo> out;
  for (const auto& p : phases) {
    StartupPhaseInfo i;
    i.name = p.name;
    i.actor = {node_id, ActorRole::kNodeDaemon, 0};
    i.start_ms = p.start_ms;
    i.duration_ms = p.duration_ms;
    i.done = p.done;
    out.push_back(std::move(i));
  }
  return out;
}

// --- placement ------------------------------------------------------------------------------

}  // namespace troupe::actors::detail
