// Sample control-plane and client messages (actors/detail/control_wire.h) with every field set
// to a non-default value: the round trips of control_wire_test.cc check them field by field, and
// the wire fuzzer (tests/fuzz/wire_fuzz_seeds.cc) starts from their frames. No gtest here.
#pragma once

#include <cstdint>
#include <vector>

#include "actors/detail/control_wire.h"

namespace troupe::actors::detail::samples {

inline constexpr uint64_t kEpoch = 9;
inline constexpr int64_t kVocab = 16;  // logits width of the finished event

inline const ResourcesInfo kResources{
    .cpu_cores = 16, .memory_bytes = 64ull << 30, .free_memory_bytes = 40ull << 30};

inline JoinRequestMsg make_join_request() {
  JoinRequestMsg m;
  m.name = "node-b";
  m.address = "10.0.0.2:7100";
  m.version = "0.1.0+42e1bc1";
  m.pid = 4242;
  m.model_hash = 0x0123456789abcdefull;
  m.resources = kResources;
  for (size_t i = 0; i < 32; ++i) {
    m.nonce[i] = static_cast<uint8_t>(i + 1);
    m.proof[i] = static_cast<uint8_t>(200 - i);
  }
  return m;
}

inline JoinReplyMsg make_join_reply() {
  JoinReplyMsg m;
  m.header.cluster_epoch = kEpoch;
  m.accepted = true;
  m.node_id = 2;
  m.lease_ms = 3000;
  m.heartbeat_ms = 500;
  for (size_t i = 0; i < 32; ++i) m.proof[i] = static_cast<uint8_t>(i * 7);
  m.error = "";
  return m;
}

inline MembershipMsg make_membership() {
  MembershipMsg m;
  m.header.cluster_epoch = kEpoch;
  m.version = 17;
  m.members.push_back({1, "node-a", "10.0.0.1:7100", MemberState::kAlive, 12, kResources});
  m.members.push_back({2, "node-b", "10.0.0.2:7100", MemberState::kSuspect, 2500, {4, 8, 2}});
  m.members.push_back({5, "node-c", "", MemberState::kLeft, 99999, {}});
  return m;
}

inline PlacementMsg make_placement() {
  PlacementMsg m;
  m.header.cluster_epoch = kEpoch;
  m.version = 4;
  m.model_name = "qwen3-moe-tiny";
  m.model_hash = 0xfeedfacecafebeefull;
  m.stages = {
      {0, 1, 0, 4, true, false, 2}, {1, 2, 4, 8, false, false, 0}, {2, 3, 8, 12, false, true, 6}};
  m.shards = {{0, 2, {0, 2, 4}, 1}, {1, 3, {1, 3, 5}, 3}};
  m.kv_pools = {{2, 3, 100, 16}, {0, 1, 120, 16}, {1, 2, 110, 16}};  // any order
  m.encoders = {{0, 1, 4}, {1, 3, 0}};  // image encoders on the head and on node 3
  m.microbatches = 2;
  return m;
}

inline std::vector<StartupPhaseInfo> make_phases() {
  return {{"join", {2, ActorRole::kNodeDaemon, 0}, 0, 15, true},
          {"map weights", {2, ActorRole::kStage, 1}, 15, 800, false}};
}

inline PlacementReportMsg make_placement_report() {
  PlacementReportMsg m;
  m.header.cluster_epoch = kEpoch;
  m.version = 4;
  m.ok = false;
  m.error = "model file missing: /models/x.gguf";
  m.phases = make_phases();
  return m;
}

inline std::vector<LinkCountersInfo> make_links() {
  LinkCountersInfo a;
  a.node = "node-a";
  a.peer = "node-b";
  a.address = "10.0.0.2:7100";
  a.messages_sent = 1;
  a.bytes_sent = 2;
  a.messages_received = 3;
  a.bytes_received = 4;
  a.send_errors = 5;
  a.malformed = 6;
  a.corrupted = 6;
  a.oversized = 8;
  a.pulled = 3;
  a.pulls_to = true;
  LinkCountersInfo b;
  b.node = "node-b";
  b.peer = "";  // a client without a name is still shown by its address
  b.address = "10.0.0.9:51234";
  b.messages_received = 1ull << 40;
  b.bytes_received = 3'000'000'000;
  b.pulls_from = true;
  return {a, b};
}

inline StatusSnapshotMsg make_snapshot() {
  StatusSnapshotMsg m;
  m.header.cluster_epoch = kEpoch;
  m.taken_at_ms = 123456;
  m.has_membership = true;
  m.membership = make_membership();
  m.actors.push_back({{2, ActorRole::kStage, 1},
                      "stage/1@node-b",
                      ActorStateInfo::kRestarting,
                      3,
                      4000,
                      "injected fault"});
  m.actors.push_back(
      {{1, ActorRole::kScheduler, 0}, "scheduler/0@node-a", ActorStateInfo::kRunning, 0, 9, ""});
  m.phases = make_phases();
  m.has_throughput = true;
  m.throughput = {10000, 512.5, 33.25, 8.0, 4, 7};
  m.placement_version = 4;
  m.reporter = "node-a";
  m.serving = true;
  m.condition = "requests held: re-placing actors (placement 2)";
  m.links = make_links();
  m.transport = {{"node-a", 3, 1717, 4242}, {"node-b", 0, 0, 2}};
  m.has_encoder = true;
  m.encoder = {"mmproj-f16.gguf", 12, 15, 4, 11, 1, 5.625, 4, 37748736, 3};
  return m;
}

inline GenerateRequestMsg make_generate_request() {
  GenerateRequestMsg m;
  m.header.cluster_epoch = kEpoch;
  m.tag = 77;
  GenerateRequest& r = m.request;
  r.prompt = "Once upon a time";
  r.prompt_tokens = {1, 5, 15, 0};
  r.add_bos = false;
  r.sampling.temperature = 0.7f;
  r.sampling.top_k = 40;
  r.sampling.top_p = 0.95f;
  r.sampling.min_p = 0.05f;
  r.sampling.repetition_penalty = 1.1f;
  r.sampling.presence_penalty = 0.5f;
  r.sampling.frequency_penalty = -0.25f;
  r.sampling.penalty_last_n = -1;
  r.sampling.seed = 31337;
  r.sampling.stop_token_ids = {2, 7};
  r.sampling.stop_strings = {"\n\n", "END"};
  r.sampling.ignore_eos = true;
  r.max_tokens = 300;
  r.return_logits = true;
  return m;
}

inline GenerateEventMsg make_finished_event(int64_t n_vocab = kVocab) {
  GenerateEventMsg m;
  m.header.cluster_epoch = kEpoch;
  m.tag = 77;
  m.delta = "end";
  m.token = 9;
  m.finished = true;
  GenerateResult& r = m.result;
  r.prompt_tokens = {1, 5, 15};
  r.tokens = {9, 3, 12};
  r.text = "a b c";
  r.finish_reason = "length";
  r.error = "";
  r.logits.resize(static_cast<size_t>(3 * n_vocab));
  for (size_t i = 0; i < r.logits.size(); ++i) r.logits[i] = 0.125f * static_cast<float>(i) - 2;
  return m;
}

}  // namespace troupe::actors::detail::samples
