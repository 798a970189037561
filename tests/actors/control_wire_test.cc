// Tests of actors/detail/control_wire.h: round trips of every control and client message that
// compare every field, message kinds and type ids, one test per kind of malformed input (each
// asserting the error names the problem), and a byte-flip loop over every decoder.
#include "actors/detail/control_wire.h"

#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <gtest/gtest.h>

#include "schemas/client.capnp.h"
#include "schemas/cluster.capnp.h"
#include "schemas/encoder.capnp.h"
#include "schemas/errc.h"
#include "schemas/expert.capnp.h"
#include "schemas/frame.h"
#include "schemas/step.capnp.h"
#include "tests/actors/control_wire_samples.h"
#include "tests/actors/wire_test_util.h"

namespace troupe::actors::detail {
namespace {

using namespace samples;  // kEpoch, kVocab, kResources, make_*
const SendInfo kSend{.sender = {.node = 3, .role = ActorRole::kNodeDaemon, .index = 0}, .seq = 5};

using testing::Bytes;
using testing::expect_error;
using testing::mutate;
using testing::schema;
using testing::wire;

ControlLimits control_limits() { return {.expected_epoch = kEpoch}; }
ClientLimits client_limits() { return {.n_vocab = kVocab, .expected_epoch = kEpoch}; }

template <class Msg>
Msg with_epoch(Msg m, uint64_t epoch = kEpoch) {
  m.header.cluster_epoch = epoch;
  return m;
}

Bytes frame_of(const Result<WireFrame>& f) {
  EXPECT_TRUE(f) << (f ? "" : f.error().message);
  return f ? f->flatten() : Bytes{};
}

void expect_header(const WireHeader& h, uint64_t epoch = kEpoch) {
  EXPECT_EQ(h.cluster_epoch, epoch);
  EXPECT_EQ(h.sender, kSend.sender);
  EXPECT_EQ(h.seq, kSend.seq);
}

void expect_same(const ResourcesInfo& a, const ResourcesInfo& b) {
  EXPECT_EQ(a.cpu_cores, b.cpu_cores);
  EXPECT_EQ(a.memory_bytes, b.memory_bytes);
  EXPECT_EQ(a.free_memory_bytes, b.free_memory_bytes);
}

void expect_same(const std::vector<StartupPhaseInfo>& a, const std::vector<StartupPhaseInfo>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name);
    EXPECT_EQ(a[i].actor, b[i].actor);
    EXPECT_EQ(a[i].start_ms, b[i].start_ms);
    EXPECT_EQ(a[i].duration_ms, b[i].duration_ms);
    EXPECT_EQ(a[i].done, b[i].done);
  }
}

void expect_same_members(const MembershipMsg& a, const MembershipMsg& b) {
  EXPECT_EQ(a.version, b.version);
  ASSERT_EQ(a.members.size(), b.members.size());
  for (size_t i = 0; i < a.members.size(); ++i) {
    EXPECT_EQ(a.members[i].node_id, b.members[i].node_id);
    EXPECT_EQ(a.members[i].name, b.members[i].name);
    EXPECT_EQ(a.members[i].address, b.members[i].address);
    EXPECT_EQ(a.members[i].state, b.members[i].state);
    EXPECT_EQ(a.members[i].last_heartbeat_age_ms, b.members[i].last_heartbeat_age_ms);
    expect_same(a.members[i].resources, b.members[i].resources);
  }
}

// ---- Message kinds ----

TEST(ControlWireKinds, TypeIdsNameTheRootStructs) {
  EXPECT_EQ(type_id(ControlMsg::kJoinRequest), capnp::typeId<schemas::JoinRequest>());
  EXPECT_EQ(type_id(ControlMsg::kPlacementReport), capnp::typeId<schemas::PlacementReport>());
  EXPECT_EQ(type_id(ControlMsg::kStatusSnapshot), capnp::typeId<schemas::StatusSnapshot>());
  EXPECT_EQ(type_id(ControlMsg::kGenerateEvent), capnp::typeId<schemas::GenerateEvent>());
  EXPECT_EQ(type_id(ControlMsg::kBatchDescriptor), capnp::typeId<schemas::BatchDescriptor>());
  EXPECT_EQ(type_id(ControlMsg::kStepResult), capnp::typeId<schemas::StepResult>());
  EXPECT_EQ(type_id(ControlMsg::kExpertDispatch), capnp::typeId<schemas::ExpertDispatch>());
  EXPECT_EQ(type_id(ControlMsg::kExpertCombine), capnp::typeId<schemas::ExpertCombine>());
  EXPECT_EQ(type_id(ControlMsg::kEncodeImage), capnp::typeId<schemas::EncodeImage>());
  EXPECT_EQ(type_id(ControlMsg::kEncodedImage), capnp::typeId<schemas::EncodedImage>());
  EXPECT_STREQ(to_string(ControlMsg::kEncodeImage), "EncodeImage");
  EXPECT_STREQ(to_string(ControlMsg::kEncodedImage), "EncodedImage");
  std::vector<uint64_t> seen;
  for (int i = 0; i <= static_cast<int>(ControlMsg::kEncodedImage); ++i) {
    const auto m = static_cast<ControlMsg>(i);
    SCOPED_TRACE(to_string(m));
    EXPECT_NE(type_id(m), 0u);
    EXPECT_STRNE(to_string(m), "unknown");
    ControlMsg back{};
    ASSERT_TRUE(control_msg_of(type_id(m), &back));
    EXPECT_EQ(back, m);
    for (uint64_t id : seen) EXPECT_NE(id, type_id(m));
    seen.push_back(type_id(m));
  }
  ControlMsg out = ControlMsg::kJoinReply;
  EXPECT_FALSE(control_msg_of(0x1234, &out));
  EXPECT_EQ(out, ControlMsg::kJoinReply);
  EXPECT_STREQ(to_string(ControlMsg::kLeaveNotice), "LeaveNotice");
  EXPECT_STREQ(to_string(MemberState::kSuspect), "suspect");
}

// ---- Round trips ----

TEST(ControlWireRoundTrip, JoinRequestKeepsEveryFieldWithEpochZero) {
  const JoinRequestMsg m = make_join_request();  // epoch 0: first start
  auto d = decode_join_request(frame_of(encode(m, kSend)), control_limits());
  ASSERT_TRUE(d) << d.error().message;
  expect_header(d->header, 0);
  EXPECT_EQ(d->name, m.name);
  EXPECT_EQ(d->address, m.address);
  EXPECT_EQ(d->version, m.version);
  EXPECT_EQ(d->pid, m.pid);
  EXPECT_EQ(d->model_hash, m.model_hash);
  expect_same(d->resources, m.resources);
  EXPECT_EQ(d->nonce, m.nonce);
  EXPECT_EQ(d->proof, m.proof);
  // A stale epoch (a fenced node joining again) is accepted whatever the receiver's epoch.
  d = decode_join_request(frame_of(encode(with_epoch(m, 3), kSend)), control_limits());
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ(d->header.cluster_epoch, 3u);
}

TEST(ControlWireRoundTrip, JoinReplyKeepsEveryField) {
  JoinReplyMsg m = make_join_reply();
  auto d = decode_join_reply(frame_of(encode(m, kSend)), control_limits());
  ASSERT_TRUE(d) << d.error().message;
  expect_header(d->header);
  EXPECT_EQ(d->accepted, m.accepted);
  EXPECT_EQ(d->node_id, m.node_id);
  EXPECT_EQ(d->lease_ms, m.lease_ms);
  EXPECT_EQ(d->heartbeat_ms, m.heartbeat_ms);
  EXPECT_EQ(d->proof, m.proof);
  EXPECT_EQ(d->error, "");
  m.accepted = false;
  m.node_id = 0;
  m.error = "bad proof";
  d = decode_join_reply(frame_of(encode(m, kSend)), control_limits());
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_FALSE(d->accepted);
  EXPECT_EQ(d->error, "bad proof");
}

TEST(ControlWireRoundTrip, HeartbeatAndAckKeepEveryField) {
  HeartbeatMsg hb;
  hb.header.cluster_epoch = kEpoch;
  hb.lease_ms = 3000;
  hb.resources = kResources;
  hb.num_actors = 5;
  hb.uptime_ms = 1ull << 40;
  hb.links = make_links();
  hb.transport = {"", 1, 2, 3};  // a heartbeat may leave the name out: the head knows it
  auto d = decode_heartbeat(frame_of(encode(hb, kSend)), control_limits());
  ASSERT_TRUE(d) << d.error().message;
  expect_header(d->header);
  EXPECT_EQ(d->lease_ms, hb.lease_ms);
  expect_same(d->resources, hb.resources);
  EXPECT_EQ(d->num_actors, hb.num_actors);
  EXPECT_EQ(d->uptime_ms, hb.uptime_ms);
  EXPECT_EQ(d->links, hb.links);
  EXPECT_EQ(d->transport, hb.transport);
  HeartbeatAckMsg ack;
  ack.header.cluster_epoch = kEpoch;
  ack.lease_ms = 2500;
  ack.membership_version = 17;
  ack.fenced = true;
  auto a = decode_heartbeat_ack(frame_of(encode(ack, kSend)), control_limits());
  ASSERT_TRUE(a) << a.error().message;
  expect_header(a->header);
  EXPECT_EQ(a->lease_ms, ack.lease_ms);
  EXPECT_EQ(a->membership_version, ack.membership_version);
  EXPECT_EQ(a->fenced, ack.fenced);
}

TEST(ControlWireRoundTrip, MembershipKeepsEveryField) {
  const MembershipMsg m = make_membership();
  auto d = decode_membership(frame_of(encode(m, kSend)), control_limits());
  ASSERT_TRUE(d) << d.error().message;
  expect_header(d->header);
  expect_same_members(*d, m);
}

TEST(ControlWireRoundTrip, PlacementKeepsEveryField) {
  const PlacementMsg m = make_placement();
  auto d = decode_placement(frame_of(encode(m, kSend)), control_limits());
  ASSERT_TRUE(d) << d.error().message;
  expect_header(d->header);
  EXPECT_EQ(d->version, m.version);
  EXPECT_EQ(d->model_name, m.model_name);
  EXPECT_EQ(d->model_hash, m.model_hash);
  ASSERT_EQ(d->stages.size(), m.stages.size());
  for (size_t i = 0; i < m.stages.size(); ++i) {
    const auto& x = m.stages[i];
    const auto& y = d->stages[i];
    EXPECT_EQ(y.stage, x.stage);
    EXPECT_EQ(y.node_id, x.node_id);
    EXPECT_EQ(y.layer_begin, x.layer_begin);
    EXPECT_EQ(y.layer_end, x.layer_end);
    EXPECT_EQ(y.has_embedding, x.has_embedding);
    EXPECT_EQ(y.has_output_head, x.has_output_head);
    EXPECT_EQ(y.threads, x.threads);
  }
  ASSERT_EQ(d->shards.size(), m.shards.size());
  for (size_t i = 0; i < m.shards.size(); ++i) {
    EXPECT_EQ(d->shards[i].shard, m.shards[i].shard);
    EXPECT_EQ(d->shards[i].node_id, m.shards[i].node_id);
    EXPECT_EQ(d->shards[i].experts, m.shards[i].experts);
    EXPECT_EQ(d->shards[i].threads, m.shards[i].threads);
  }
  ASSERT_EQ(d->kv_pools.size(), m.kv_pools.size());
  for (size_t i = 0; i < m.kv_pools.size(); ++i) {
    EXPECT_EQ(d->kv_pools[i].stage, m.kv_pools[i].stage);
    EXPECT_EQ(d->kv_pools[i].node_id, m.kv_pools[i].node_id);
    EXPECT_EQ(d->kv_pools[i].num_blocks, m.kv_pools[i].num_blocks);
    EXPECT_EQ(d->kv_pools[i].block_size, m.kv_pools[i].block_size);
  }
  ASSERT_EQ(m.encoders.size(), 2u);
  EXPECT_EQ(d->encoders, m.encoders);
  EXPECT_EQ(d->microbatches, m.microbatches);
}

TEST(ControlWireRoundTrip, PlacementKeepsTwoEncodersOrNone) {
  PlacementMsg m = make_placement();
  m.encoders = {{0, 2, 3}, {1, 5, 0}};
  auto d = decode_placement(frame_of(encode(m, kSend)), control_limits());
  ASSERT_TRUE(d) << d.error().message;
  ASSERT_EQ(d->encoders.size(), 2u);
  EXPECT_EQ(d->encoders[0], (EncoderPlacementInfo{0, 2, 3}));
  EXPECT_EQ(d->encoders[1], (EncoderPlacementInfo{1, 5, 0}));  // threads 0 = auto
  // CPU only: every instance goes out with device -1.
  const Bytes bytes = frame_of(encode(m, kSend));
  auto r = schemas::read_frame(bytes, size_t{1} << 20);
  ASSERT_TRUE(r);
  auto encoders = (*r)->getRoot<schemas::Placement>().getEncoders();
  ASSERT_EQ(encoders.size(), 2u);
  EXPECT_EQ(encoders[1].getDevice(), -1);
  EXPECT_EQ(encoders[1].getNodeId(), 5u);
  m.encoders.clear();  // a model without an mmproj
  d = decode_placement(frame_of(encode(m, kSend)), control_limits());
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_TRUE(d->encoders.empty());
}

TEST(ControlWireRoundTrip, PlacementReportLeaveNoticeAndStatusRequestKeepEveryField) {
  const PlacementReportMsg m = make_placement_report();
  auto d = decode_placement_report(frame_of(encode(m, kSend)), control_limits());
  ASSERT_TRUE(d) << d.error().message;
  expect_header(d->header);
  EXPECT_EQ(d->version, m.version);
  EXPECT_EQ(d->ok, m.ok);
  EXPECT_EQ(d->error, m.error);
  expect_same(d->phases, m.phases);
  LeaveNoticeMsg leave;
  leave.header.cluster_epoch = kEpoch;
  leave.reason = std::string("SIGTERM\0after drain", 19);  // embedded NUL survives
  auto l = decode_leave_notice(frame_of(encode(leave, kSend)), control_limits());
  ASSERT_TRUE(l) << l.error().message;
  expect_header(l->header);
  EXPECT_EQ(l->reason, leave.reason);
  StatusRequestMsg req;
  req.header.cluster_epoch = kEpoch;
  req.include_kv = true;
  auto r = decode_status_request(frame_of(encode(req, kSend)), control_limits());
  ASSERT_TRUE(r) << r.error().message;
  expect_header(r->header);
  EXPECT_TRUE(r->include_kv);
}

// `troupe status` without --json: the headline says whether the cluster serves and why not;
// each table's columns line up (a column starts at the same offset on every row).
TEST(StatusText, SaysWhyNotServingAndAlignsMembersActorsAndPhases) {
  StatusSnapshotMsg m = make_snapshot();
  m.reporter = "node-a";
  m.serving = false;
  m.condition = "waiting for a node with room for stage 2";
  const std::string t = status_text(m);
  EXPECT_EQ(t.rfind("cluster: not serving (waiting for a node with room for stage 2); reported by "
                    "node-a; epoch " +
                        std::to_string(kEpoch) + ", membership 17, placement 4\n",
                    0),
            0u)
      << t;
  std::vector<std::string> lines;
  for (size_t b = 0, e; b < t.size(); b = e + 1) {
    e = t.find('\n', b);
    lines.push_back(t.substr(b, e - b));
  }
  auto line_with = [&](const std::string& a, const std::string& b) -> std::string {
    for (const auto& l : lines)
      if (l.find(a) != std::string::npos && l.find(b) != std::string::npos) return l;
    ADD_FAILURE() << "no line with " << a << " and " << b << " in\n" << t;
    return "";
  };
  const std::string head = line_with("address", "heartbeat");
  const std::string b = line_with("node-b", "10.0.0.2:7100");
  EXPECT_NE(b.find("suspect"), std::string::npos) << b;
  EXPECT_NE(b.find("2500 ms"), std::string::npos) << b;
  EXPECT_EQ(head.find("address"), b.find("10.0.0.2:7100")) << t;
  EXPECT_EQ(head.find("state"), b.find("suspect")) << t;
  EXPECT_EQ(line_with("node-c", "left").find("left"), head.find("state")) << t;
  const std::string actor = line_with("stage/1@node-b", "restarting");
  EXPECT_EQ(actor.back(), '3') << actor;  // restarts, right-aligned
  EXPECT_EQ(line_with("actor", "state").find("state"),
            line_with("scheduler/0@node-a", "running").find("running"))
      << t;
  EXPECT_NE(line_with("node-b", "join").find("15"), std::string::npos) << t;
  EXPECT_NE(line_with("map weights", "(running)").find("node-b"), std::string::npos) << t;
  // Links: each node's own, with the remote address (a nameless client: peer "-"), how large
  // messages go.
  const std::string lhead = line_with("peer", "large msgs");
  const std::string ab = line_with("node-a", "pull out");
  EXPECT_EQ(lhead.find("large msgs"), ab.find("pull out")) << t;
  EXPECT_EQ(lhead.find("address"), ab.find("10.0.0.2:7100")) << t;  // the remote end
  EXPECT_NE(line_with("10.0.0.9:51234", "pull in").find(" - "), std::string::npos) << t;
  EXPECT_NE(ab.find("1 / 0.0 kB"), std::string::npos) << ab;
  EXPECT_NE(line_with("10.0.0.9:51234", "pull in").find("0 / 0.0 kB"), std::string::npos) << t;
  EXPECT_NE(line_with("10.0.0.9:51234", "pull in").find("1099511627776 / 3.0 GB"),
            std::string::npos)
      << t;
  EXPECT_NE(ab.find("14 (6/8)"), std::string::npos) << ab;  // malformed 6 + oversized 8
  EXPECT_NE(line_with("10.0.0.9:51234", "pull in").find("node-b"), std::string::npos) << t;
  const std::string thead = line_with("peers refused", "connections accepted");
  const std::string ta = line_with("node-a", "4242");
  EXPECT_EQ(thead.find("connections accepted") + std::string("connections accepted").size(),
            ta.find("4242") + 4)
      << t;  // right-aligned under its heading
  EXPECT_NE(t.find("image encoder: mmproj-f16.gguf: 12 requests (1 refused), 15 images: 4 encoded "
                   "in 5.625 s, 11 from the cache, 3 sent again; cache holds 4 images, 37.7 MB\n"),
            std::string::npos)
      << t;
  const std::string j = status_json(m);
  EXPECT_NE(j.find("\"encoder\":{\"mmproj\":\"mmproj-f16.gguf\",\"requests\":12,\"images\":15,"
                   "\"encoded\":4,\"cache_hits\":11,\"failed\":1,\"encode_seconds\":5.625,"
                   "\"cache_entries\":4,\"cache_bytes\":37748736,\"retried\":3}}"),
            std::string::npos)
      << j;
  EXPECT_NE(j.find("\"links\":[{\"node\":\"node-a\",\"peer\":\"node-b\",\"address\":"
                   "\"10.0.0.2:7100\",\"large_messages\":\"pull out\",\"messages_sent\":1,"),
            std::string::npos)
      << j;
  // Nothing placed, no phases yet: said, not an empty table.
  StatusSnapshotMsg empty;
  empty.reporter = "node-a";
  empty.serving = true;
  const std::string e = status_text(empty);
  EXPECT_NE(e.find("cluster: serving; reported by node-a"), std::string::npos) << e;
  EXPECT_NE(e.find("actors:\n  (none placed)\n"), std::string::npos) << e;
  EXPECT_NE(e.find("(ms since each node's start):\n  (none)\n"), std::string::npos) << e;
  EXPECT_NE(e.find("last heartbeat):\n  (none)\n"), std::string::npos) << e;
  EXPECT_EQ(e.find("transports:"), std::string::npos) << e;
  EXPECT_EQ(e.find("image encoder"), std::string::npos) << e;
  EXPECT_EQ(status_json(empty).find("encoder"), std::string::npos);
}

TEST(ControlWireRoundTrip, StatusSnapshotKeepsEveryField) {
  const StatusSnapshotMsg m = make_snapshot();
  auto d = decode_status_snapshot(frame_of(encode(m, kSend)), control_limits());
  ASSERT_TRUE(d) << d.error().message;
  expect_header(d->header);
  EXPECT_EQ(d->taken_at_ms, m.taken_at_ms);
  ASSERT_TRUE(d->has_membership);
  expect_same_members(d->membership, m.membership);
  ASSERT_EQ(d->actors.size(), m.actors.size());
  for (size_t i = 0; i < m.actors.size(); ++i) {
    EXPECT_EQ(d->actors[i].actor, m.actors[i].actor);
    EXPECT_EQ(d->actors[i].name, m.actors[i].name);
    EXPECT_EQ(d->actors[i].state, m.actors[i].state);
    EXPECT_EQ(d->actors[i].restarts, m.actors[i].restarts);
    EXPECT_EQ(d->actors[i].uptime_ms, m.actors[i].uptime_ms);
    EXPECT_EQ(d->actors[i].last_error, m.actors[i].last_error);
  }
  expect_same(d->phases, m.phases);
  ASSERT_TRUE(d->has_throughput);
  EXPECT_EQ(d->throughput.window_ms, m.throughput.window_ms);
  EXPECT_EQ(d->throughput.prompt_tokens_per_s, m.throughput.prompt_tokens_per_s);
  EXPECT_EQ(d->throughput.generation_tokens_per_s, m.throughput.generation_tokens_per_s);
  EXPECT_EQ(d->throughput.steps_per_s, m.throughput.steps_per_s);
  EXPECT_EQ(d->throughput.num_requests_running, m.throughput.num_requests_running);
  EXPECT_EQ(d->throughput.num_requests_waiting, m.throughput.num_requests_waiting);
  EXPECT_EQ(d->placement_version, m.placement_version);
  EXPECT_EQ(d->reporter, m.reporter);
  EXPECT_EQ(d->serving, m.serving);
  EXPECT_EQ(d->condition, m.condition);
  EXPECT_EQ(d->links, m.links);
  EXPECT_EQ(d->transport, m.transport);
  ASSERT_TRUE(d->has_encoder);
  EXPECT_EQ(d->encoder.mmproj, m.encoder.mmproj);
  EXPECT_EQ(d->encoder.requests, m.encoder.requests);
  EXPECT_EQ(d->encoder.images, m.encoder.images);
  EXPECT_EQ(d->encoder.encoded, m.encoder.encoded);
  EXPECT_EQ(d->encoder.cache_hits, m.encoder.cache_hits);
  EXPECT_EQ(d->encoder.failed, m.encoder.failed);
  EXPECT_EQ(d->encoder.encode_seconds, m.encoder.encode_seconds);
  EXPECT_EQ(d->encoder.cache_entries, m.encoder.cache_entries);
  EXPECT_EQ(d->encoder.cache_bytes, m.encoder.cache_bytes);
  EXPECT_EQ(d->encoder.retried, m.encoder.retried);
  // A single node's snapshot: no membership, no throughput, no encoder.
  StatusSnapshotMsg node = m;
  node.has_membership = false;
  node.has_throughput = false;
  node.has_encoder = false;
  d = decode_status_snapshot(frame_of(encode(node, kSend)), control_limits());
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_FALSE(d->has_membership);
  EXPECT_FALSE(d->has_throughput);
  EXPECT_FALSE(d->has_encoder);
  // An encoder time that is not a time.
  node.has_encoder = true;
  node.encoder.encode_seconds = -1;
  expect_error(decode_status_snapshot(frame_of(encode(node, kSend)), control_limits()),
               wire(WireErrc::kInvalid),
               "StatusSnapshot.encoder.encodeSeconds: -1, expected a finite time >= 0");
  EXPECT_TRUE(d->membership.members.empty());
}

TEST(ControlWireRoundTrip, GenerateRequestKeepsEveryFieldAndStopStrings) {
  const GenerateRequestMsg m = make_generate_request();
  auto d = decode_generate_request(frame_of(encode(m, kSend)), client_limits());
  ASSERT_TRUE(d) << d.error().message;
  expect_header(d->header);
  EXPECT_EQ(d->tag, m.tag);
  const GenerateRequest& x = m.request;
  const GenerateRequest& y = d->request;
  EXPECT_EQ(y.prompt, x.prompt);
  EXPECT_EQ(y.prompt_tokens, x.prompt_tokens);
  EXPECT_EQ(y.add_bos, x.add_bos);
  EXPECT_EQ(y.sampling.temperature, x.sampling.temperature);
  EXPECT_EQ(y.sampling.top_k, x.sampling.top_k);
  EXPECT_EQ(y.sampling.top_p, x.sampling.top_p);
  EXPECT_EQ(y.sampling.min_p, x.sampling.min_p);
  EXPECT_EQ(y.sampling.repetition_penalty, x.sampling.repetition_penalty);
  EXPECT_EQ(y.sampling.presence_penalty, x.sampling.presence_penalty);
  EXPECT_EQ(y.sampling.frequency_penalty, x.sampling.frequency_penalty);
  EXPECT_EQ(y.sampling.penalty_last_n, x.sampling.penalty_last_n);
  EXPECT_EQ(y.sampling.seed, x.sampling.seed);
  EXPECT_EQ(y.sampling.stop_token_ids, x.sampling.stop_token_ids);
  EXPECT_EQ(y.sampling.stop_strings, x.sampling.stop_strings);
  EXPECT_EQ(y.sampling.ignore_eos, x.sampling.ignore_eos);
  EXPECT_EQ(y.max_tokens, x.max_tokens);
  EXPECT_EQ(y.return_logits, x.return_logits);
  // Defaults survive too (the schema's defaults equal the C++ ones).
  GenerateRequestMsg plain;
  plain.header.cluster_epoch = kEpoch;
  plain.request.prompt = "hi";
  d = decode_generate_request(frame_of(encode(plain, kSend)), client_limits());
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_TRUE(d->request.add_bos);
  EXPECT_EQ(d->request.max_tokens, 128);
  EXPECT_EQ(d->request.sampling.top_p, 1.0f);
  EXPECT_EQ(d->request.sampling.penalty_last_n, 64);
}

TEST(ControlWireRoundTrip, CancelAndGenerateEventsKeepEveryField) {
  CancelRequestMsg cancel;
  cancel.header.cluster_epoch = kEpoch;
  cancel.tag = 77;
  auto c = decode_cancel_request(frame_of(encode(cancel, kSend)), client_limits());
  ASSERT_TRUE(c) << c.error().message;
  expect_header(c->header);
  EXPECT_EQ(c->tag, 77u);

  GenerateEventMsg piece;
  piece.header.cluster_epoch = kEpoch;
  piece.tag = 77;
  piece.delta = " wor";
  piece.token = 11;
  auto p = decode_generate_event(frame_of(encode(piece, kVocab, kSend)), client_limits());
  ASSERT_TRUE(p) << p.error().message;
  expect_header(p->header);
  EXPECT_EQ(p->tag, piece.tag);
  EXPECT_EQ(p->delta, piece.delta);
  EXPECT_EQ(p->token, piece.token);
  EXPECT_FALSE(p->finished);

  const GenerateEventMsg m = make_finished_event();
  auto d = decode_generate_event(frame_of(encode(m, kVocab, kSend)), client_limits());
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ(d->tag, m.tag);
  EXPECT_EQ(d->delta, m.delta);
  EXPECT_EQ(d->token, m.token);
  EXPECT_TRUE(d->finished);
  EXPECT_EQ(d->result.prompt_tokens, m.result.prompt_tokens);
  EXPECT_EQ(d->result.tokens, m.result.tokens);
  EXPECT_EQ(d->result.text, m.result.text);
  EXPECT_EQ(d->result.finish_reason, m.result.finish_reason);
  EXPECT_EQ(d->result.error, m.result.error);
  EXPECT_EQ(d->result.logits, m.result.logits);
  // The client does not know n_vocab: the width comes from the tensor.
  ClientLimits any_width = client_limits();
  any_width.n_vocab = 0;
  d = decode_generate_event(frame_of(encode(m, kVocab, kSend)), any_width);
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ(d->result.logits, m.result.logits);
}

TEST(ControlWireRoundTrip, GenerateEventOfAnErrorAndOfAStopToken) {
  GenerateEventMsg m = make_finished_event();
  m.result.finish_reason = "error";
  m.result.error = "prompt too long";
  m.result.logits.clear();
  m.token = -1;
  auto d = decode_generate_event(frame_of(encode(m, kVocab, kSend)), client_limits());
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ(d->result.error, "prompt too long");
  EXPECT_EQ(d->token, -1);
  EXPECT_TRUE(d->result.logits.empty());
  // EOS ended it: the router keeps the EOS row but not the token, so rows = tokens + 1.
  m = make_finished_event();
  m.result.finish_reason = "stop";
  m.result.tokens.pop_back();
  d = decode_generate_event(frame_of(encode(m, kVocab, kSend)), client_limits());
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ(d->result.logits.size(), 3u * kVocab);
  EXPECT_EQ(d->result.tokens.size(), 2u);
}

// A client fails the request a malformed event belongs to, when its tag reads, rather than wait.
TEST(ControlWireMalformed, GenerateEventTagReadsWhereTheRestIsMalformed) {
  GenerateEventMsg m = make_finished_event();
  m.tag = 5;
  m.result.prompt_tokens = {1, -7};
  const auto frame = frame_of(encode(m, kVocab, kSend));
  EXPECT_FALSE(decode_generate_event(frame, client_limits()));
  EXPECT_EQ(generate_event_tag(frame, client_limits()), 5u);
  const std::vector<uint8_t> garbage(64, 0xab);
  EXPECT_EQ(generate_event_tag(garbage, client_limits()), 0u);
  ClientLimits stale = client_limits();
  stale.expected_epoch = kEpoch + 5;  // a header that does not read: nothing trusted
  EXPECT_EQ(generate_event_tag(frame, stale), 0u);
}

// A prompt laid out around an image reports -1 at the image's positions; nothing below -1 passes.
TEST(ControlWireRoundTrip, GenerateEventKeepsImagePositionsOfItsPrompt) {
  GenerateEventMsg m = make_finished_event();
  m.result.prompt_tokens = {1, -1, -1, 5};
  auto d = decode_generate_event(frame_of(encode(m, kVocab, kSend)), client_limits());
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_EQ(d->result.prompt_tokens, m.result.prompt_tokens);
  m.result.prompt_tokens[2] = -2;
  expect_error(decode_generate_event(frame_of(encode(m, kVocab, kSend)), client_limits()),
               wire(WireErrc::kInvalid),
               "GenerateEvent.promptTokens[2]: token id -2 is outside [0, 16) and not -1");
}

// ---- Encoders refuse what has no wire form ----

TEST(ControlWireEncode, RejectsEpochZeroExceptInJoinRequest) {
  HeartbeatMsg hb;  // epoch 0
  expect_error(encode(hb, kSend), wire(WireErrc::kUnencodable), "encode Heartbeat: epoch 0");
  PlacementMsg p = make_placement();
  p.header.cluster_epoch = 0;
  expect_error(encode(p, kSend), wire(WireErrc::kUnencodable), "encode Placement: epoch 0");
  EXPECT_TRUE(encode(make_join_request(), kSend));
  SendInfo no_seq = kSend;
  no_seq.seq = 0;
  expect_error(encode(make_join_request(), no_seq), wire(WireErrc::kUnencodable), "seq 0");
}

TEST(ControlWireEncode, RejectsNegativeExpertAndBadLogits) {
  PlacementMsg p = make_placement();
  p.shards[1].experts[0] = -3;
  expect_error(encode(p, kSend), wire(WireErrc::kUnencodable), "shards[1] has expert -3");
  GenerateEventMsg e = make_finished_event();
  e.result.logits.pop_back();
  expect_error(encode(e, kVocab, kSend), wire(WireErrc::kUnencodable),
               "47 logits for 3 tokens at n_vocab 16");
  e = make_finished_event();
  expect_error(encode(e, 0, kSend), wire(WireErrc::kUnencodable), "at n_vocab 0");
}

// ---- Malformed input: one test per way a frame can be bad ----

// One valid frame of each control and client message, with its decoder.
struct Case {
  const char* name;
  Bytes frame;
  std::function<bool(const Bytes&, std::string*)> decode;  // ok? and the error text
};

template <class Decode, class Limits>
std::function<bool(const Bytes&, std::string*)> wrap(Decode decode, Limits lim) {
  return [decode, lim](const Bytes& b, std::string* error) {
    auto r = decode(b, lim);
    if (!r && error) *error = r.error().message;
    return r.has_value();
  };
}

std::vector<Case> all_cases() {
  const ControlLimits c = control_limits();
  const ClientLimits k = client_limits();
  HeartbeatMsg hb;
  hb.header.cluster_epoch = kEpoch;
  hb.resources = kResources;
  HeartbeatAckMsg ack;
  ack.header.cluster_epoch = kEpoch;
  LeaveNoticeMsg leave;
  leave.header.cluster_epoch = kEpoch;
  leave.reason = "SIGTERM";
  StatusRequestMsg sreq;
  sreq.header.cluster_epoch = kEpoch;
  CancelRequestMsg cancel;
  cancel.header.cluster_epoch = kEpoch;
  return {
      {"JoinRequest", frame_of(encode(make_join_request(), kSend)), wrap(decode_join_request, c)},
      {"JoinReply", frame_of(encode(make_join_reply(), kSend)), wrap(decode_join_reply, c)},
      {"Heartbeat", frame_of(encode(hb, kSend)), wrap(decode_heartbeat, c)},
      {"HeartbeatAck", frame_of(encode(ack, kSend)), wrap(decode_heartbeat_ack, c)},
      {"Membership", frame_of(encode(make_membership(), kSend)), wrap(decode_membership, c)},
      {"Placement", frame_of(encode(make_placement(), kSend)), wrap(decode_placement, c)},
      {"PlacementReport", frame_of(encode(make_placement_report(), kSend)),
       wrap(decode_placement_report, c)},
      {"LeaveNotice", frame_of(encode(leave, kSend)), wrap(decode_leave_notice, c)},
      {"StatusRequest", frame_of(encode(sreq, kSend)), wrap(decode_status_request, c)},
      {"StatusSnapshot", frame_of(encode(make_snapshot(), kSend)), wrap(decode_status_snapshot, c)},
      {"GenerateRequest", frame_of(encode(make_generate_request(), kSend)),
       wrap(decode_generate_request, k)},
      {"CancelRequest", frame_of(encode(cancel, kSend)), wrap(decode_cancel_request, k)},
      {"GenerateEvent", frame_of(encode(make_finished_event(), kVocab, kSend)),
       wrap(decode_generate_event, k)},
  };
}

TEST(ControlWireMalformed, RejectsTruncatedFrames) {
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(c.name);
    std::string error;
    ASSERT_TRUE(c.decode(c.frame, &error)) << error;
    Bytes cut = c.frame;
    cut.resize(cut.size() - 8);
    EXPECT_FALSE(c.decode(cut, &error));
    EXPECT_CONTAINS(error, "need");
    EXPECT_FALSE(c.decode(Bytes{}, &error));
  }
}

TEST(ControlWireMalformed, RejectsGarbage) {
  std::mt19937 gen(23);
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(c.name);
    for (size_t size : {7, 8, 64, 1000}) {
      Bytes junk(size);
      for (uint8_t& x : junk) x = static_cast<uint8_t>(gen());
      std::string error;
      EXPECT_FALSE(c.decode(junk, &error));
      EXPECT_FALSE(error.empty());
    }
    // A segment table that fits, then garbage words: Cap'n Proto rejects the root pointer.
    Bytes junk(64);
    for (uint8_t& x : junk) x = static_cast<uint8_t>(gen());
    const uint32_t table[2] = {0, 7};
    std::memcpy(junk.data(), table, sizeof(table));
    std::string error;
    EXPECT_FALSE(c.decode(junk, &error));
    EXPECT_FALSE(error.empty());
  }
}

TEST(ControlWireMalformed, RejectsWrongEpoch) {
  const Bytes frame = frame_of(encode(make_placement(), kSend));
  ControlLimits lim = control_limits();
  lim.expected_epoch = kEpoch + 1;
  expect_error(decode_placement(frame, lim), schema(schemas::Errc::kStaleEpoch),
               "Placement.header: message from epoch 9, receiver is in epoch 10: stale");
  lim.expected_epoch = kEpoch - 1;
  expect_error(decode_placement(frame, lim), schema(schemas::Errc::kFutureEpoch),
               "receiver is behind");
  ClientLimits k = client_limits();
  k.expected_epoch = kEpoch + 1;
  expect_error(decode_generate_request(frame_of(encode(make_generate_request(), kSend)), k),
               schema(schemas::Errc::kStaleEpoch), "GenerateRequest.header: message from epoch 9");
  // Epoch 0 is unset everywhere but in a JoinRequest, even when no epoch is expected.
  Bytes zero = mutate<schemas::Heartbeat>(frame_of(encode(with_epoch(HeartbeatMsg{}), kSend)),
                                          [](auto root) { root.getHeader().setClusterEpoch(0); });
  expect_error(decode_heartbeat(zero, ControlLimits{}), schema(schemas::Errc::kBadHeader),
               "Heartbeat.header: cluster epoch is unset (0)");
  Bytes no_seq = mutate<schemas::Placement>(frame, [](auto root) { root.getHeader().setSeq(0); });
  expect_error(decode_placement(no_seq, control_limits()), schema(schemas::Errc::kBadHeader),
               "header seq is unset");
}

TEST(ControlWireMalformed, RejectsOverLongLists) {
  ControlLimits lim = control_limits();
  lim.max_list = 2;
  expect_error(decode_membership(frame_of(encode(make_membership(), kSend)), lim),
               wire(WireErrc::kTooLong), "Membership.members: 3 entries exceed the limit of 2");
  expect_error(decode_placement(frame_of(encode(make_placement(), kSend)), lim),
               wire(WireErrc::kTooLong), "Placement.stages: 3 entries exceed the limit of 2");
  lim.max_list = 1;
  expect_error(decode_placement_report(frame_of(encode(make_placement_report(), kSend)), lim),
               wire(WireErrc::kTooLong), "PlacementReport.startupPhases: 2 entries exceed");
  expect_error(decode_status_snapshot(frame_of(encode(make_snapshot(), kSend)), lim),
               wire(WireErrc::kTooLong), "StatusSnapshot.membership.members: 3 entries exceed");
  HeartbeatMsg hb;
  hb.header.cluster_epoch = kEpoch;
  hb.links = make_links();
  expect_error(decode_heartbeat(frame_of(encode(hb, kSend)), lim), wire(WireErrc::kTooLong),
               "Heartbeat.links: 2 entries exceed the limit of 1");
  ClientLimits k = client_limits();
  k.max_prompt_tokens = 3;
  expect_error(decode_generate_request(frame_of(encode(make_generate_request(), kSend)), k),
               wire(WireErrc::kTooLong), "GenerateRequest.promptTokens: 4 entries exceed");
  k = client_limits();
  k.max_stop_strings = 1;
  expect_error(decode_generate_request(frame_of(encode(make_generate_request(), kSend)), k),
               wire(WireErrc::kTooLong), "GenerateRequest.stopStrings: 2 entries exceed");
  k = client_limits();
  k.max_tokens = 2;
  expect_error(decode_generate_event(frame_of(encode(make_finished_event(), kVocab, kSend)), k),
               wire(WireErrc::kTooLong), "GenerateEvent.tokens: 3 entries exceed the limit of 2");
}

// Link counters that cannot be (more corrupted than dropped, more pulled than received) and a
// link without a reporting node are refused, naming the entry.
TEST(ControlWireMalformed, RejectsImpossibleLinkCounters) {
  HeartbeatMsg hb;
  hb.header.cluster_epoch = kEpoch;
  hb.links = make_links();
  hb.links[1].corrupted = 1;  // malformed is 0
  expect_error(decode_heartbeat(frame_of(encode(hb, kSend)), control_limits()),
               wire(WireErrc::kInvalid), "Heartbeat.links[1]: counters that cannot be");
  hb.links = make_links();
  hb.links[0].pulled = 4;  // received 3
  expect_error(decode_heartbeat(frame_of(encode(hb, kSend)), control_limits()),
               wire(WireErrc::kInvalid), "Heartbeat.links[0]: counters that cannot be");
  StatusSnapshotMsg s = make_snapshot();
  s.links[1].node = "";
  expect_error(decode_status_snapshot(frame_of(encode(s, kSend)), control_limits()),
               wire(WireErrc::kInvalid), "StatusSnapshot.links[1].node");
  s = make_snapshot();
  s.transport[1].node = "";
  expect_error(decode_status_snapshot(frame_of(encode(s, kSend)), control_limits()),
               wire(WireErrc::kInvalid), "StatusSnapshot.transport[1].node");
}

TEST(ControlWireMalformed, RejectsOverLongText) {
  ControlLimits lim = control_limits();
  lim.max_text = 8;
  expect_error(decode_join_request(frame_of(encode(make_join_request(), kSend)), lim),
               wire(WireErrc::kTooLong),
               "JoinRequest.node.address: 13 bytes exceed the limit of 8");
  expect_error(decode_status_snapshot(frame_of(encode(make_snapshot(), kSend)), lim),
               wire(WireErrc::kTooLong), "StatusSnapshot.membership.members[0].address: 13 bytes");
  ClientLimits k = client_limits();
  k.max_text = 10;
  expect_error(decode_generate_request(frame_of(encode(make_generate_request(), kSend)), k),
               wire(WireErrc::kTooLong), "GenerateRequest.prompt: 16 bytes exceed the limit of 10");
}

TEST(ControlWireMalformed, RejectsEmptyNames) {
  JoinRequestMsg join = make_join_request();
  join.name.clear();
  expect_error(decode_join_request(frame_of(encode(join, kSend)), control_limits()),
               wire(WireErrc::kInvalid), "JoinRequest.node.name: empty, expected a name");
  MembershipMsg m = make_membership();
  m.members[1].name.clear();
  expect_error(decode_membership(frame_of(encode(m, kSend)), control_limits()),
               wire(WireErrc::kInvalid), "Membership.members[1].name: empty");
}

TEST(ControlWireMalformed, RejectsBadEnumsAndRoles) {
  Bytes state = mutate<schemas::Membership>(
      frame_of(encode(make_membership(), kSend)),
      [](auto root) { root.getMembers()[2].setState(static_cast<schemas::MemberState>(9)); });
  expect_error(decode_membership(state, control_limits()), wire(WireErrc::kInvalid),
               "Membership.members[2].state: unknown value 9, expected 0..4");
  Bytes actor = mutate<schemas::StatusSnapshot>(
      frame_of(encode(make_snapshot(), kSend)),
      [](auto root) { root.getActors()[1].setState(static_cast<schemas::ActorState>(5)); });
  expect_error(decode_status_snapshot(actor, control_limits()), wire(WireErrc::kInvalid),
               "StatusSnapshot.actors[1].state: unknown value 5, expected 0..4");
  Bytes role = mutate<schemas::PlacementReport>(
      frame_of(encode(make_placement_report(), kSend)), [](auto root) {
        root.getStartupPhases()[0].getActor().setRole(static_cast<schemas::Role>(42));
      });
  expect_error(decode_placement_report(role, control_limits()), wire(WireErrc::kInvalid),
               "PlacementReport.startupPhases[0].actor.role: 42 is not a known role");
  Bytes sender = mutate<schemas::Membership>(
      frame_of(encode(make_membership(), kSend)),
      [](auto root) { root.getHeader().getSender().setRole(schemas::Role::UNKNOWN); });
  expect_error(decode_membership(sender, control_limits()), schema(schemas::Errc::kBadHeader),
               "header sender role 0 is invalid");
}

TEST(ControlWireMalformed, RejectsBadNonceAndProofLength) {
  const Bytes join = frame_of(encode(make_join_request(), kSend));
  Bytes nonce = mutate<schemas::JoinRequest>(join, [](auto root) { root.initNonce(31); });
  expect_error(decode_join_request(nonce, control_limits()), wire(WireErrc::kInvalid),
               "JoinRequest.nonce: 31 bytes, expected 32");
  Bytes proof = mutate<schemas::JoinRequest>(join, [](auto root) { root.disownProof(); });
  expect_error(decode_join_request(proof, control_limits()), wire(WireErrc::kInvalid),
               "JoinRequest.proof: 0 bytes, expected 32");
  Bytes reply = mutate<schemas::JoinReply>(frame_of(encode(make_join_reply(), kSend)),
                                           [](auto root) { root.initProof(33); });
  expect_error(decode_join_reply(reply, control_limits()), wire(WireErrc::kInvalid),
               "JoinReply.proof: 33 bytes, expected 32");
}

TEST(ControlWireMalformed, RejectsMembersWithoutOrWithDuplicateIds) {
  MembershipMsg m = make_membership();
  m.members[2].node_id = 1;
  expect_error(decode_membership(frame_of(encode(m, kSend)), control_limits()),
               wire(WireErrc::kInvalid), "Membership.members: node id 1 appears twice");
  m.members[2].node_id = 0;
  expect_error(decode_membership(frame_of(encode(m, kSend)), control_limits()),
               wire(WireErrc::kInvalid), "Membership.members[2].nodeId: node id 0");
  JoinReplyMsg r = make_join_reply();
  r.node_id = 0;
  expect_error(decode_join_reply(frame_of(encode(r, kSend)), control_limits()),
               wire(WireErrc::kInvalid), "JoinReply.nodeId: node id 0");
}

Result<PlacementMsg> decode_edited_placement(const std::function<void(PlacementMsg&)>& edit) {
  PlacementMsg p = make_placement();
  edit(p);
  return decode_placement(frame_of(encode(p, kSend)), control_limits());
}

TEST(ControlWireMalformed, RejectsOverlappingLayerRanges) {
  expect_error(decode_edited_placement([](PlacementMsg& p) { p.stages[1].layer_begin = 3; }),
               wire(WireErrc::kInvalid),
               "Placement.stages[1].layerBegin: 3, expected 4: the layer ranges overlap");
}

TEST(ControlWireMalformed, RejectsLayerGapsAndEmptyRanges) {
  expect_error(decode_edited_placement([](PlacementMsg& p) { p.stages[2].layer_begin = 9; }),
               wire(WireErrc::kInvalid),
               "Placement.stages[2].layerBegin: 9, expected 8: the layer ranges leave a gap");
  expect_error(decode_edited_placement([](PlacementMsg& p) { p.stages[0].layer_begin = 1; }),
               wire(WireErrc::kInvalid), "Placement.stages[0].layerBegin: 1, expected 0");
  expect_error(decode_edited_placement([](PlacementMsg& p) { p.stages[1].layer_end = 4; }),
               wire(WireErrc::kInvalid), "Placement.stages[1]: layers [4, 4) are empty");
}

TEST(ControlWireMalformed, RejectsUnorderedStagesAndShards) {
  expect_error(
      decode_edited_placement([](PlacementMsg& p) { std::swap(p.stages[0], p.stages[1]); }),
      wire(WireErrc::kInvalid), "Placement.stages[0].stage: 1, expected 0 (stages in index order)");
  expect_error(decode_edited_placement([](PlacementMsg& p) { p.shards[1].shard = 0; }),
               wire(WireErrc::kInvalid),
               "Placement.expertShards[1].shard: 0, expected 1 (shards in index order)");
  expect_error(decode_edited_placement([](PlacementMsg& p) { p.stages[1].has_embedding = true; }),
               wire(WireErrc::kInvalid),
               "Placement.stages[1]: hasEmbedding 1, hasOutputHead 0: expected the embedding on "
               "the first stage only");
  expect_error(
      decode_edited_placement([](PlacementMsg& p) { p.stages[2].has_output_head = false; }),
      wire(WireErrc::kInvalid), "Placement.stages[2]: hasEmbedding 0, hasOutputHead 0");
  expect_error(decode_edited_placement([](PlacementMsg& p) { p.stages.clear(); }),
               wire(WireErrc::kInvalid), "Placement.stages: empty, expected >= 1");
}

TEST(ControlWireMalformed, RejectsExpertInTwoShards) {
  expect_error(decode_edited_placement([](PlacementMsg& p) {
                 p.shards[1].experts = {2, 3, 5};
               }),
               wire(WireErrc::kInvalid),
               "Placement.expertShards: expert 2 is in shards 0 and 1, expected one owner");
}

TEST(ControlWireMalformed, RejectsUnsortedOrNegativeExperts) {
  expect_error(decode_edited_placement([](PlacementMsg& p) {
                 p.shards[0].experts = {0, 4, 2};
               }),
               wire(WireErrc::kInvalid),
               "Placement.expertShards[0].experts[2]: 2 after 4, expected strictly ascending");
  Bytes neg = mutate<schemas::Placement>(frame_of(encode(make_placement(), kSend)), [](auto root) {
    root.getExpertShards()[1].getExperts().set(0, 0x80000000u);
  });
  expect_error(decode_placement(neg, control_limits()), wire(WireErrc::kInvalid),
               "Placement.expertShards[1].experts[0]: 2147483648 is outside [0, 2^31)");
}

TEST(ControlWireMalformed, RejectsKvPoolsNotOnePerStage) {
  expect_error(decode_edited_placement([](PlacementMsg& p) { p.kv_pools.pop_back(); }),
               wire(WireErrc::kInvalid), "Placement.kvPools: 2 pools for 3 stages");
  expect_error(decode_edited_placement([](PlacementMsg& p) { p.kv_pools[2].stage = 2; }),
               wire(WireErrc::kInvalid),
               "Placement.kvPools[2].stage: 2 is a second pool of its stage");
  expect_error(decode_edited_placement([](PlacementMsg& p) { p.kv_pools[0].block_size = 0; }),
               wire(WireErrc::kInvalid), "Placement.kvPools[0]: 100 blocks of 0 tokens");
  expect_error(decode_edited_placement([](PlacementMsg& p) { p.microbatches = 0; }),
               wire(WireErrc::kInvalid), "Placement.numMicrobatches: 0, expected >= 1");
}

TEST(ControlWireMalformed, RejectsEncodersOutOfIndexOrder) {
  expect_error(
      decode_edited_placement([](PlacementMsg& p) { std::swap(p.encoders[0], p.encoders[1]); }),
      wire(WireErrc::kInvalid), "Placement.encoders[0].index: 1, expected 0 (in index order)");
  expect_error(decode_edited_placement([](PlacementMsg& p) { p.encoders[1].index = 0; }),
               wire(WireErrc::kInvalid),
               "Placement.encoders[1].index: 0, expected 1 (in index order)");
  expect_error(decode_edited_placement([](PlacementMsg& p) {
                 p.encoders.pop_back();
                 p.encoders[0].index = 1;
               }),
               wire(WireErrc::kInvalid),
               "Placement.encoders[0].index: 1, expected 0 (in index order)");
}

TEST(ControlWireMalformed, RejectsEncoderOnNodeIdZero) {
  expect_error(decode_edited_placement([](PlacementMsg& p) { p.encoders[1].node_id = 0; }),
               wire(WireErrc::kInvalid),
               "Placement.encoders[1].nodeId: node id 0, expected an assigned id >= 1");
}

TEST(ControlWireMalformed, RejectsOverLongEncoderList) {
  PlacementMsg p = make_placement();
  for (uint32_t i = 2; i < 4; ++i) p.encoders.push_back({i, 2, 0});
  ControlLimits lim = control_limits();
  lim.max_list = 3;  // room for the 3 stages and KV pools, not the 4 encoders
  expect_error(decode_placement(frame_of(encode(p, kSend)), lim), wire(WireErrc::kTooLong),
               "Placement.encoders: 4 entries exceed the limit of 3");
}

Result<GenerateRequestMsg> decode_edited_request(
    const std::function<void(GenerateRequestMsg&)>& edit, ClientLimits lim = client_limits()) {
  GenerateRequestMsg m = make_generate_request();
  edit(m);
  return decode_generate_request(frame_of(encode(m, kSend)), lim);
}

TEST(ControlWireMalformed, RejectsGenerateRequestWithZeroMaxTokens) {
  expect_error(decode_edited_request([](GenerateRequestMsg& m) { m.request.max_tokens = 0; }),
               wire(WireErrc::kInvalid), "GenerateRequest.maxTokens: 0, expected 1 .. 1048576");
  ClientLimits lim = client_limits();
  lim.max_tokens = 100;
  expect_error(decode_edited_request([](GenerateRequestMsg&) {}, lim), wire(WireErrc::kInvalid),
               "GenerateRequest.maxTokens: 300, expected 1 .. 100");
}

// A request with images: a text prompt and the image files' bytes (a PNG's first bytes, a JPEG's,
// a zero byte inside), unchanged.
GenerateRequestMsg image_request(std::vector<std::string> files) {
  GenerateRequestMsg m = make_generate_request();
  m.request.prompt_tokens.clear();
  m.request.image_files = std::make_shared<const std::vector<std::string>>(std::move(files));
  return m;
}

TEST(ControlWireRoundTrip, GenerateRequestKeepsItsImageFilesByteForByte) {
  const std::string png("\x89PNG\r\n\x1a\n\0\0\0\rIHDR", 16), jpeg("\xff\xd8\xff\xe0", 4);
  auto d =
      decode_generate_request(frame_of(encode(image_request({png, jpeg}), kSend)), client_limits());
  ASSERT_TRUE(d) << d.error().message;
  ASSERT_TRUE(d->request.image_files);
  EXPECT_EQ(*d->request.image_files, (std::vector<std::string>{png, jpeg}));
  EXPECT_EQ(d->request.prompt, "Once upon a time");
  // Without images there is no list at all.
  d = decode_generate_request(frame_of(encode(make_generate_request(), kSend)), client_limits());
  ASSERT_TRUE(d) << d.error().message;
  EXPECT_FALSE(d->request.image_files);
}

TEST(ControlWireMalformed, RejectsBadImageLists) {
  ClientLimits lim = client_limits();
  lim.max_images = 2;
  lim.max_image_bytes = 8;
  const auto decode = [&](const GenerateRequestMsg& m) {
    return decode_generate_request(frame_of(encode(m, kSend)), lim);
  };
  EXPECT_TRUE(decode(image_request({"12345678", "a"})));
  expect_error(decode(image_request({"a", "b", "c"})), wire(WireErrc::kTooLong),
               "GenerateRequest.images: 3 entries exceed");
  expect_error(decode(image_request({"a", "123456789"})), wire(WireErrc::kTooLong),
               "GenerateRequest.images[1]: 9 bytes exceed the limit of 8");
  expect_error(decode(image_request({""})), wire(WireErrc::kInvalid),
               "GenerateRequest.images[0]: empty, expected image bytes");
  GenerateRequestMsg tokens = image_request({"a"});
  tokens.request.prompt_tokens = {1, 2};
  expect_error(decode(tokens), wire(WireErrc::kInvalid),
               "GenerateRequest.images: a request with images needs a text prompt");
}

TEST(ControlWireMalformed, RejectsGenerateRequestWithTokenOutOfRange) {
  expect_error(
      decode_edited_request([](GenerateRequestMsg& m) { m.request.prompt_tokens[1] = kVocab; }),
      wire(WireErrc::kInvalid), "GenerateRequest.promptTokens[1]: token id 16 is outside [0, 16)");
  ClientLimits any = client_limits();
  any.n_vocab = 0;  // unknown vocabulary: only negative ids are out of range
  EXPECT_TRUE(decode_edited_request(
      [](GenerateRequestMsg& m) { m.request.prompt_tokens[1] = 1000000; }, any));
  expect_error(
      decode_edited_request([](GenerateRequestMsg& m) { m.request.prompt_tokens[3] = -1; }, any),
      wire(WireErrc::kInvalid), "GenerateRequest.promptTokens[3]: token id -1 is outside");
}

TEST(ControlWireMalformed, RejectsGenerateRequestWithEmptyStopString) {
  expect_error(
      decode_edited_request([](GenerateRequestMsg& m) { m.request.sampling.stop_strings[1] = ""; }),
      wire(WireErrc::kInvalid), "GenerateRequest.stopStrings[1]: empty");
}

TEST(ControlWireMalformed, RejectsGenerateRequestWithInvalidSampling) {
  expect_error(decode_edited_request([](GenerateRequestMsg& m) { m.request.sampling.top_p = 0; }),
               wire(WireErrc::kInvalid), "GenerateRequest.sampling: top_p must be in (0, 1]");
  expect_error(
      decode_edited_request([](GenerateRequestMsg& m) { m.request.sampling.temperature = -1; }),
      wire(WireErrc::kInvalid), "GenerateRequest.sampling: temperature");
  Bytes logprobs =
      mutate<schemas::GenerateRequest>(frame_of(encode(make_generate_request(), kSend)),
                                       [](auto root) { root.getSampling().setNumLogprobs(3); });
  expect_error(decode_generate_request(logprobs, client_limits()), wire(WireErrc::kUnsupported),
               "GenerateRequest.sampling.numLogprobs: expected 0");
}

TEST(ControlWireMalformed, RejectsLogitsShapeMismatch) {
  const Bytes valid = frame_of(encode(make_finished_event(), kVocab, kSend));
  // One token fewer than logits rows, finish reason "length": no room for a stop-token row.
  Bytes rows =
      mutate<schemas::GenerateEvent>(valid, [](auto root) { root.initTokens(2).set(0, 1); });
  expect_error(decode_generate_event(rows, client_limits()), wire(WireErrc::kInvalid),
               "GenerateEvent.logits: f32 [3, 16], expected [2 tokens");
  Bytes wide = mutate<schemas::GenerateEvent>(valid, [](auto root) {
    auto shape = root.getLogits().getShape();
    shape.set(0, 2);
    shape.set(1, 24);  // 48 floats as [2, 24]: a valid tensor of the wrong width
  });
  expect_error(decode_generate_event(wide, client_limits()), schema(schemas::Errc::kShapeMismatch),
               "GenerateEvent.logits: expected f32 [*, 16], got f32 [2, 24]");
  Bytes dtype = mutate<schemas::GenerateEvent>(
      valid, [](auto root) { root.getLogits().setDtype(schemas::DType::I32); });
  expect_error(decode_generate_event(dtype, client_limits()), schema(schemas::Errc::kShapeMismatch),
               "got i32 [3, 16]");
  Bytes reason =
      mutate<schemas::GenerateEvent>(valid, [](auto root) { root.setFinishReason("exploded"); });
  expect_error(decode_generate_event(reason, client_limits()), wire(WireErrc::kInvalid),
               "GenerateEvent.finishReason: 'exploded', expected length, eos, stop");
  Bytes token = mutate<schemas::GenerateEvent>(valid, [](auto root) { root.setToken(kVocab); });
  expect_error(decode_generate_event(token, client_limits()), wire(WireErrc::kInvalid),
               "GenerateEvent.token: 16, expected -1 or a token id in [0, 16)");
}

// ---- Byte flips: decoding must never crash (run under ASan) ----

TEST(ControlWireFuzz, FlippedBytesNeverCrashTheDecoders) {
  uint32_t seed = 1;
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(c.name);
    std::mt19937 gen(seed++);
    int accepted = 0;
    constexpr int kIterations = 2000;
    for (int it = 0; it < kIterations; ++it) {
      Bytes frame = c.frame;
      const int flips = 1 + static_cast<int>(gen() % 4);
      for (int k = 0; k < flips; ++k)
        frame[gen() % frame.size()] ^= static_cast<uint8_t>(1 + gen() % 255);
      std::string error;
      if (c.decode(frame, &error)) {
        ++accepted;  // a flip inside a payload or an unchecked field is still a valid message
      } else {
        EXPECT_FALSE(error.empty());
        EXPECT_EQ(error.find('\n'), std::string::npos) << error;
      }
    }
    EXPECT_LT(accepted, kIterations);
  }
}

}  // namespace
}  // namespace troupe::actors::detail
