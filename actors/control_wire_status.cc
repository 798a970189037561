// Wire codec of the status messages (actors/detail/control_wire.h): StatusRequest and the
// StatusSnapshot that answers it (membership view, actor states, start-up phases, throughput).
// The decoder checks every enum, text and rate before it returns the snapshot.
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "actors/detail/control_wire.h"
#include "actors/detail/control_wire_internal.h"
#include "actors/detail/wire_internal.h"
#include "schemas/cluster.capnp.h"

namespace troupe::actors::detail {

using control_wire_internal::encode_msg;
using control_wire_internal::read_actor;
using control_wire_internal::read_enum;
using control_wire_internal::read_links;
using control_wire_internal::read_membership;
using control_wire_internal::read_phases;
using control_wire_internal::read_text;
using control_wire_internal::read_transport;
using control_wire_internal::text;
using control_wire_internal::write_actor;
using control_wire_internal::write_links;
using control_wire_internal::write_membership;
using control_wire_internal::write_phases;
using control_wire_internal::write_transport;
using wire_internal::check_len;
using wire_internal::decode_frame;
using wire_internal::fail;
using wire_internal::read_wire_header;

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

Result<EncoderInfo> read_encoder(schemas::EncoderCounters::Reader src, const ControlLimits& l) {
  EncoderInfo e;
  auto name = read_text(src.getMmproj(), l.max_text, "StatusSnapshot.encoder.mmproj");
  if (!name) return name.error();
  e.mmproj = std::move(*name);
  e.requests = src.getRequests();
  e.images = src.getImages();
  e.encoded = src.getEncoded();
  e.cache_hits = src.getCacheHits();
  e.failed = src.getFailed();
  e.encode_seconds = src.getEncodeSeconds();
  e.cache_entries = src.getCacheEntries();
  e.cache_bytes = src.getCacheBytes();
  e.retried = src.getRetried();
  if (!std::isfinite(e.encode_seconds) || e.encode_seconds < 0)
    return fail(WireErrc::kInvalid,
                strfmt("StatusSnapshot.encoder.encodeSeconds: %g, expected a finite time >= 0",
                       e.encode_seconds));
  return e;
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
        root.setCondition(text(m.condition));
        write_links(root.initLinks(static_cast<unsigned>(m.links.size())), m.links);
        auto tc = root.initTransport(static_cast<unsigned>(m.transport.size()));
        for (size_t i = 0; i < m.transport.size(); ++i)
          write_transport(tc[unsigned(i)], m.transport[i]);
        if (m.has_encoder) {
          auto e = root.initEncoder();
          e.setMmproj(text(m.encoder.mmproj));
          e.setRequests(m.encoder.requests);
          e.setImages(m.encoder.images);
          e.setEncoded(m.encoder.encoded);
          e.setCacheHits(m.encoder.cache_hits);
          e.setFailed(m.encoder.failed);
          e.setEncodeSeconds(m.encoder.encode_seconds);
          e.setCacheEntries(m.encoder.cache_entries);
          e.setCacheBytes(m.encoder.cache_bytes);
          e.setRetried(m.encoder.retried);
        }
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
        auto condition = read_text(root.getCondition(), l.max_text, "StatusSnapshot.condition");
        if (!condition) return condition.error();
        m.condition = std::move(*condition);
        auto links = read_links(root.getLinks(), l, "StatusSnapshot.links");
        if (!links) return links.error();
        m.links = std::move(*links);
        const auto tc = root.getTransport();
        if (auto st = check_len("StatusSnapshot.transport", tc.size(), l.max_list); !st)
          return st.error();
        for (unsigned i = 0; i < tc.size(); ++i) {
          auto x = read_transport(tc[i], l, strfmt("StatusSnapshot.transport[%u]", i), false);
          if (!x) return x.error();
          m.transport.push_back(std::move(*x));
        }
        m.has_encoder = root.hasEncoder();
        if (m.has_encoder) {
          auto e = read_encoder(root.getEncoder(), l);
          if (!e) return e.error();
          m.encoder = std::move(*e);
        }
        return m;
      });
}

}  // namespace troupe::actors::detail
