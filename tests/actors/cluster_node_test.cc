// Node daemons in this process (each with its own transport, UCX worker and actor system) on
// loopback: the cluster forms, places stages and expert shards across the nodes, and serves
// requests whose greedy tokens and logits are bit-identical to the single-process actor system;
// a wrong token is refused; a node that leaves is marked `left`; garbage frames are survived.
// Clusters with image encoders: cluster_images_test.cc.
#include "actors/cluster_node.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <thread>
#include <utility>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <nlohmann/json.hpp>
#include <sys/socket.h>

#include "actors/cluster_client.h"
#include "actors/detail/control_wire.h"
#include "compute/engine.h"
#include "model/model.h"
#include "model/synth.h"
#include "tests/actors/cluster_nodes.h"
#include "tests/cluster_test_util.h"
#include "tests/deepseek_v4_model.h"
#include "tests/hf_twin_model.h"
#include "tests/test_support.h"
#include "transport/transport.h"

namespace troupe::actors {
namespace {

using namespace std::chrono_literals;
using namespace testing_nodes;
using testing::expect_same;
using testing::free_port;
using testing::generate_with_fault;
using testing::local_results;

std::vector<GenerateRequest> requests(int64_t n_vocab, size_t count, int64_t n_gen) {
  return testing::cluster_requests(n_vocab, count, n_gen, 7);
}

// The model at shared/rel, the request mix on it, and the single-process results to compare with
// (empty when the model cannot be loaded).
struct Workload {
  std::string path;
  std::vector<GenerateRequest> reqs;
  std::vector<GenerateResult> want;
};

Workload workload_at(const std::string& path) {
  Workload w;
  w.path = path;
  auto m = model::load_model(w.path);
  EXPECT_TRUE(m) << (m ? "" : m.error().message);
  if (!m) return w;
  w.reqs = requests((*m)->spec.n_vocab, 4, 10);
  w.want = local_results(w.path, w.reqs);
  return w;
}

Workload workload(const std::string& shared, const std::string& rel) {
  return workload_at(shared + "/" + rel);
}

void run_exactness_at(const std::string& model_path, const Layout& layout,
                      const std::function<void(Plan&)>& tweak = {}) {
  const auto [path, reqs, want] = workload_at(model_path);
  ASSERT_FALSE(want.empty());
  std::vector<uint16_t> ports;
  Plan plan = parse(cluster_toml(path, layout, &ports));
  if (tweak) tweak(plan);
  Nodes n;
  n.start(plan, 3);
  auto client = ClusterClient::connect("127.0.0.1", ports[0], "test-token");
  ASSERT_TRUE(client) << client.error().message;
  expect_same((*client)->generate_many(reqs), want);
  // The head's status names every node, every placed actor, and every node's start-up phases.
  auto st = (*client)->status_json();
  ASSERT_TRUE(st) << st.error().message;
  auto j = nlohmann::json::parse(*st);
  EXPECT_TRUE(j["serving"].get<bool>());
  EXPECT_EQ(j["condition"], "") << *st;
  EXPECT_EQ(j["members"].size(), 3u);
  EXPECT_EQ(j["actors"].size(), layout.stage_nodes.size() + layout.shard_nodes.size());
  std::set<std::string> phase_nodes;
  for (const auto& p : j["phases"]) phase_nodes.insert(p["node"].get<std::string>());
  EXPECT_EQ(phase_nodes.size(), 3u) << *st;
  // And every node's live links with their counters (the other nodes' from their heartbeats):
  // traffic both ways between each node and the head "a", nothing dropped, large messages by
  // same-host pull between nodes of this process (one host), and one link per pair of nodes
  // (two workers that send to each other do not both connect).
  std::set<std::string> names;
  for (const auto& m : j["members"]) names.insert(m["name"].get<std::string>());
  // A link's same-host pull is set up by an offer and an accept each way, so a snapshot may
  // catch one way done ("pull in" or "pull out"): wait for both, as for the reports.
  std::set<std::string> reporters;
  bool pulls_settled = false;
  for (int i = 0; i < 100 && (reporters.size() < 3 || !pulls_settled); ++i) {
    if (i > 0) std::this_thread::sleep_for(100ms);
    st = (*client)->status_json();
    ASSERT_TRUE(st) << st.error().message;
    j = nlohmann::json::parse(*st);
    reporters.clear();
    pulls_settled = true;
    for (const auto& l : j["links"]) {
      reporters.insert(l["node"].get<std::string>());
      if (names.count(l["peer"].get<std::string>()) && l["large_messages"] != "pull")
        pulls_settled = false;
    }
  }
  EXPECT_EQ(reporters, names) << *st;
  size_t between_nodes = 0;
  std::map<std::pair<std::string, std::string>, int> per_pair;
  for (const auto& l : j["links"]) {
    if (l["node"] == "a" || l["peer"] == "a") {
      EXPECT_GT(l["messages_received"].get<uint64_t>(), 0u) << l;
      EXPECT_GT(l["messages_sent"].get<uint64_t>(), 0u) << l;
    }
    EXPECT_EQ(l["malformed"].get<uint64_t>(), 0u) << l;
    EXPECT_EQ(l["send_errors"].get<uint64_t>(), 0u) << l;
    if (names.count(l["peer"].get<std::string>())) {
      ++between_nodes;
      EXPECT_EQ(l["large_messages"], "pull") << l;
      const int links =
          ++per_pair[std::pair(l["node"].get<std::string>(), l["peer"].get<std::string>())];
      EXPECT_EQ(links, 1) << "two links between " << l["node"] << " and " << l["peer"] << ": "
                          << *st;
    }
  }
  EXPECT_GE(between_nodes, 4u) << *st;  // at least each worker <-> the head, both ends
}

void run_exactness(const std::string& rel, const Layout& layout,
                   const std::function<void(Plan&)>& tweak = {}) {
  TROUPE_SHARED_OR_SKIP(shared);
  run_exactness_at(shared + "/" + rel, layout, tweak);
}

TEST(ClusterNode, DenseStagesOnThreeNodesAreBitIdentical) {
  run_exactness("models/stories260K/stories260K.gguf", {{"a", "b", "c"}, {}});
}

TEST(ClusterNode, MoeStagesAndExpertShardsAcrossNodesAreBitIdentical) {
  run_exactness("models/synth/mixtral-moe/model.gguf", {{"b", "c"}, {"c", "a", "b"}});
}

// DeepSeek-V4 (Hugging Face form): each position's four hyper-connection streams go between the
// stages' nodes as the hidden state (4 x n_embd wide), expert rows as n_embd.
TEST(ClusterNode, DeepseekV4StreamsCrossNodesBitIdentical) {
  testing::TempDir dir;
  testing::V4Options o;
  o.seed = 31;
  testing::write_deepseek_v4(dir.path(), o);
  run_exactness_at(dir.path(), {{"b", "c"}, {"c", "a"}});
}

// [cluster] payload_checksums = false: the same results without the transport's payload sums.
TEST(ClusterNode, WithoutPayloadChecksumsResultsAreBitIdentical) {
  run_exactness("models/synth/mixtral-moe/model.gguf", {{"b", "c"}, {"c", "a", "b"}},
                [](Plan& p) { p.cluster.payload_checksums = false; });
}

// Hidden states of long prompts (4 KiB per token on a 1024-wide model: a 100-token prefill is
// 400 KiB) go from stage to stage by same-host pull between the nodes of this process, and the
// results stay bit-identical to the single-process system; the receiving node's link says so.
TEST(ClusterNode, LargeHiddenStatesGoBySameHostPullBitIdentical) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("troupe_pull_cluster_" + std::to_string(::getpid()) + ".gguf"))
                               .string();
  model::SynthOptions so;
  so.n_embd = 1024;
  so.n_layer = 2;
  so.n_head = 8;
  so.n_head_kv = 2;
  so.n_ff = 512;
  so.n_ctx = 512;
  ASSERT_TRUE(model::synth_model(so, path));
  auto m = model::load_model(path);
  ASSERT_TRUE(m) << m.error().message;
  std::vector<GenerateRequest> reqs = requests((*m)->spec.n_vocab, 2, 4);
  std::mt19937 rng(5);
  for (auto& r : reqs) {
    r.prompt_tokens.clear();
    for (int k = 0; k < 100; ++k)
      r.prompt_tokens.push_back(
          static_cast<int32_t>(3 + rng() % static_cast<uint32_t>((*m)->spec.n_vocab - 3)));
  }
  const auto want = local_results(path, reqs);
  std::vector<uint16_t> ports;
  Nodes n;
  n.start(parse(cluster_toml(path, {{"b", "c"}, {}}, &ports)), 3);
  auto client = ClusterClient::connect("127.0.0.1", ports[0], "test-token");
  ASSERT_TRUE(client) << client.error().message;
  expect_same((*client)->generate_many(reqs), want);
  uint64_t pulled = 0;
  std::string last;
  for (int i = 0; i < 50 && pulled == 0; ++i) {
    if (i > 0) std::this_thread::sleep_for(100ms);
    auto st = (*client)->status_json();
    ASSERT_TRUE(st) << st.error().message;
    last = *st;
    const auto j = nlohmann::json::parse(*st);
    for (const auto& l : j["links"])
      if (l["node"] == "c" && l["peer"] == "b") pulled += l["pulled"].get<uint64_t>();
  }
  EXPECT_GT(pulled, 0u) << "stage 1 (node c) pulled nothing from stage 0 (node b):\n" << last;
  std::filesystem::remove(path);
}

TEST(ClusterNode, WrongTokenIsRefused) {
  TROUPE_SHARED_OR_SKIP(shared);
  const std::string path = shared + "/models/stories260K/stories260K.gguf";
  std::vector<uint16_t> ports;
  const std::string toml = cluster_toml(path, {{"a", "b"}, {}}, &ports, "right", 2);
  Plan good = parse(toml);
  std::string bad_toml = toml;
  bad_toml.replace(bad_toml.find("token = \"right\""), 15, "token = \"wrong\"");
  Plan bad = parse(bad_toml);
  NodeOptions ho;
  ho.name = "a";
  auto head = ClusterNode::start(good, ho);
  ASSERT_TRUE(head) << head.error().message;
  NodeOptions bo;
  bo.name = "b";
  bo.join_timeout = 10s;
  auto b = ClusterNode::start(bad, bo);
  ASSERT_TRUE(b);
  auto s = (*b)->wait_ready(20s);
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("bad cluster token"), std::string::npos) << s.error().message;
  EXPECT_FALSE((*head)->wait_ready(100ms));
  // A client with the wrong token gets no further than the handshake either.
  EXPECT_FALSE(ClusterClient::connect("127.0.0.1", ports[0], "wrong"));
  // The head counts both refusals, and its status says so.
  auto client = ClusterClient::connect("127.0.0.1", ports[0], "right");
  ASSERT_TRUE(client) << client.error().message;
  auto st = (*client)->status_json();
  ASSERT_TRUE(st) << st.error().message;
  const auto j = nlohmann::json::parse(*st);
  ASSERT_FALSE(j["transport"].empty()) << *st;
  EXPECT_EQ(j["transport"][0]["node"], "a") << *st;
  EXPECT_GE(j["transport"][0]["auth_failures"].get<uint64_t>(), 2u) << *st;
}

TEST(ClusterNode, RequestsBeforeTheClusterFormsGetAClearError) {
  TROUPE_SHARED_OR_SKIP(shared);
  const std::string path = shared + "/models/stories260K/stories260K.gguf";
  std::vector<uint16_t> ports;
  Plan plan = parse(cluster_toml(path, {{"a", "b"}, {}}, &ports, "t", 2));
  NodeOptions ho;
  ho.name = "a";
  auto head = ClusterNode::start(plan, ho);
  ASSERT_TRUE(head);
  auto client = ClusterClient::connect("127.0.0.1", ports[0], "t");
  ASSERT_TRUE(client);
  GenerateRequest r;
  r.prompt = "Once upon a time";
  r.max_tokens = 4;
  auto res = (*client)->generate_many({r});
  ASSERT_FALSE(res[0].ok());
  EXPECT_NE(res[0].error.find("not serving"), std::string::npos) << res[0].error;
  EXPECT_NE(res[0].error.find("b"), std::string::npos) << res[0].error;
}

TEST(ClusterNode, NodeThatLeavesIsMarkedLeftAndGarbageIsSurvived) {
  TROUPE_SHARED_OR_SKIP(shared);
  const std::string path = shared + "/models/stories260K/stories260K.gguf";
  std::vector<uint16_t> ports;
  // Node c hosts nothing: its leaving does not stop the service.
  Plan plan = parse(cluster_toml(path, {{"a", "b"}, {}}, &ports, "t", 3));
  Nodes n;
  n.start(plan, 3);
  // Garbage: frames of unknown and of known types with random bytes, from an authenticated peer.
  {
    transport::TransportOptions o;
    o.node_name = "prober";
    o.cluster_token = "t";
    o.listen_host = "";
    auto tx = transport::Transport::start(o, [](transport::Message&&) {});
    ASSERT_TRUE(tx);
    auto p = (*tx)->connect("127.0.0.1", ports[0]);
    ASSERT_TRUE(p);
    std::mt19937 rng(3);
    std::vector<uint8_t> junk(4096);
    for (auto& b : junk) b = static_cast<uint8_t>(rng());
    for (uint64_t type : {uint64_t{1}, uint64_t{0xdeadbeef}})
      ASSERT_TRUE((*tx)->send(*p, transport::copy_message(type, junk)));
    // Every message type the head knows, with junk inside.
    for (int k = 0; k <= static_cast<int>(detail::ControlMsg::kExpertCombine); ++k)
      ASSERT_TRUE((*tx)->send(
          *p, transport::copy_message(detail::type_id(static_cast<detail::ControlMsg>(k)), junk)));
    // The prober's transport closes here (after flushing): the head has them all by then.
  }
  n.nodes[2]->leave("test");
  auto client = ClusterClient::connect("127.0.0.1", ports[0], "t");
  ASSERT_TRUE(client);
  bool left = false;
  std::string last;
  for (int i = 0; i < 50 && !left; ++i) {
    auto st = (*client)->status_json();
    ASSERT_TRUE(st) << st.error().message;
    last = *st;
    const auto j = nlohmann::json::parse(*st);
    for (const auto& m : j["members"])
      if (m["name"] == "c" && m["state"] == "left") left = true;
    if (!left) std::this_thread::sleep_for(20ms);
  }
  EXPECT_TRUE(left) << "node c not marked left within 1 s (its lease): " << last;
  GenerateRequest r;
  r.prompt = "Once upon a time";
  r.max_tokens = 8;
  auto res = (*client)->generate_many({r});
  EXPECT_TRUE(res[0].ok()) << res[0].error;
  EXPECT_EQ(res[0].tokens.size(), 8u);
}

// Faults on the links: lost, duplicated, corrupted and delayed steps, lost expert rows. The
// scheduler's step deadline and the stage's expert deadline run the work again; outputs stay
// bit-identical to the fault-free run.
void run_lossy(const std::string& model_path) {
  const auto [path, reqs, want] = workload_at(model_path);
  ASSERT_FALSE(want.empty());
  std::vector<uint16_t> ports;
  Plan plan = parse(cluster_toml(path, {{"b", "c"}, {"c", "a"}}, &ports));
  using detail::ControlMsg;
  using detail::type_id;
  Nodes n;
  n.tweak = [](NodeOptions& o) {
    o.cluster.step_timeout_ms = 400;
    o.cluster.expert_timeout_ms = 300;
    auto rule = [](transport::FaultAction a, ControlMsg msg, double p, uint64_t seed, uint32_t max,
                   bool out = true) {
      transport::FaultRule r;
      r.action = a;
      r.type = type_id(msg);
      r.probability = p;
      r.seed = seed;
      r.max_count = max;
      r.outgoing = out;
      r.delay_ms = 50;
      return r;
    };
    using transport::FaultAction;
    if (o.name == "a")  // the head: steps out, results in
      o.faults = {rule(FaultAction::kDrop, ControlMsg::kBatchDescriptor, 0.15, 1, 4),
                  rule(FaultAction::kDuplicate, ControlMsg::kStepResult, 0.2, 2, 4, false),
                  // Seed 43 corrupts the 4th and 7th step results the rule sees (those not
                  // duplicated); seed 3 picked the 24th, near the ~24-29 of a run, so under
                  // load a run could see none and fail (transport::FaultShim's draws).
                  rule(FaultAction::kCorrupt, ControlMsg::kStepResult, 0.1, 43, 2, false)};
    if (o.name == "b")  // stage 0: hidden states to stage 1, rows to the shards
      o.faults = {rule(FaultAction::kDelay, ControlMsg::kBatchDescriptor, 0.2, 4, 4),
                  rule(FaultAction::kDrop, ControlMsg::kExpertDispatch, 0.05, 5, 3)};
    if (o.name == "c")  // stage 1 and shard 0: answers back
      o.faults = {rule(FaultAction::kDrop, ControlMsg::kExpertCombine, 0.05, 6, 3)};
  };
  n.start(plan, 3);
  auto client = ClusterClient::connect("127.0.0.1", ports[0], "test-token");
  ASSERT_TRUE(client) << client.error().message;
  expect_same((*client)->generate_many(reqs), want);
  // The corrupted step results were caught, and an operator sees them in the head's status: its
  // links' corrupted counters (each one also counted as dropped).
  auto st = (*client)->status_json();
  ASSERT_TRUE(st) << st.error().message;
  uint64_t corrupted = 0, malformed = 0;
  const auto j = nlohmann::json::parse(*st);
  for (const auto& l : j["links"])
    if (l["node"] == "a") {
      corrupted += l["corrupted"].get<uint64_t>();
      malformed += l["malformed"].get<uint64_t>();
    }
  EXPECT_GE(corrupted, 1u) << *st;
  EXPECT_GE(malformed, corrupted) << *st;
}

TEST(ClusterNode, LostDuplicatedAndCorruptedMessagesChangeNoResult) {
  TROUPE_SHARED_OR_SKIP(shared);
  run_lossy(shared + "/models/synth/mixtral-moe/model.gguf");
}

// A link that loses every step the head sends, its nodes alive (heartbeats pass): every step
// fails by its deadline and no retry can succeed. Each request ends with an error once its steps
// have failed for the scheduler's window, naming the last failure, instead of being retried
// forever. When the link heals, the cluster serves the same requests bit-identically.
TEST(ClusterNode, StepsThatAlwaysFailEndTheirRequestsAfterTheWindow) {
  TROUPE_SHARED_OR_SKIP(shared);
  const auto [path, reqs, want] = workload(shared, "models/synth/mixtral-moe/model.gguf");
  ASSERT_FALSE(want.empty());
  std::vector<uint16_t> ports;
  Plan plan = parse(cluster_toml(path, {{"b", "c"}, {"c", "a"}}, &ports));
  Nodes n;
  n.tweak = [](NodeOptions& o) {
    o.cluster.step_timeout_ms = 200;
    o.cluster.step_failure_window_ms = 2000;
  };
  n.start(plan, 3);
  auto client = ClusterClient::connect("127.0.0.1", ports[0], "test-token");
  ASSERT_TRUE(client) << client.error().message;
  transport::FaultRule lose;  // every step the head sends to the first stage
  lose.action = transport::FaultAction::kDrop;
  lose.type = detail::type_id(detail::ControlMsg::kBatchDescriptor);
  n.nodes[0]->set_faults({lose});
  const auto t0 = std::chrono::steady_clock::now();
  const auto got = (*client)->generate_many(reqs);
  const auto took = std::chrono::steady_clock::now() - t0;
  ASSERT_EQ(got.size(), reqs.size());
  for (const auto& g : got) {
    EXPECT_EQ(g.finish_reason, "error");
    EXPECT_TRUE(g.tokens.empty());
    const std::string tail = " times in a row over 2 s; the last: the step timed out after 200 ms";
    const auto at = g.error.find(tail);
    ASSERT_NE(at, std::string::npos) << g.error;
    const auto from = g.error.rfind("its steps failed ", at);
    ASSERT_NE(from, std::string::npos) << g.error;
    EXPECT_GE(std::stoi(g.error.substr(from + 17, at - from - 17)), 8) << g.error;
  }
  EXPECT_GE(took, 2s);  // the window, not the count, ended them (8 deadlines take 1.6 s)
  n.nodes[0]->set_faults({});
  expect_same((*client)->generate_many(reqs), want);
}

// A node's memory_limit_mb bounds what its actors take, so the free memory it reports is the
// limit less its actors' weights, KV pools and recurrent states (the room re-placement sees).
// Two clusters that differ only in their KV pools (64 and 192 blocks a stage) see node b, which
// hosts stage 0, report free memory that differs by exactly stage 0's 128 more blocks; each is
// the limit less what placed_memory_bytes (the start-up check's count) gives for b.
TEST(ClusterNode, AMemoryLimitCountsTheKvPoolOfEachStage) {
  TROUPE_SHARED_OR_SKIP(shared);
  const std::string path = shared + "/models/synth/mixtral-moe/model.gguf";
  auto m = model::load_model(path);
  ASSERT_TRUE(m.has_value()) << m.error().message;
  constexpr uint64_t kLimit = uint64_t{2048} << 20;
  Plan resolved;
  auto reported_by_b = [&](int64_t blocks) -> uint64_t {
    std::vector<uint16_t> ports;
    Plan plan = parse(cluster_toml(path, {{"b", "c"}, {"c", "a"}}, &ports));
    plan.cluster.nodes[1].memory_limit_mb = 2048;
    for (auto& s : plan.stages) s.kv_blocks = blocks;
    resolved = plan;
    EXPECT_TRUE(resolve_plan(resolved, (*m)->spec).has_value());
    Nodes n;
    n.start(plan, 3);
    auto client = ClusterClient::connect("127.0.0.1", ports[0], "test-token");
    EXPECT_TRUE(client) << client.error().message;
    if (!client) return 0;
    // Before its placement b reports its whole limit; a heartbeat after it, the limit less its
    // actors' memory.
    uint64_t free = kLimit;
    for (int i = 0; i < 100 && free >= kLimit; ++i) {
      if (i > 0) std::this_thread::sleep_for(50ms);
      auto st = (*client)->status_json();
      if (!st) continue;
      const auto j = nlohmann::json::parse(*st);
      for (const auto& mem : j["members"])
        if (mem["name"] == "b") free = mem["free_memory_bytes"].get<uint64_t>();
    }
    EXPECT_LT(free, kLimit) << "node b never reported its placed actors";
    // What the start-up check counts for b (placed_memory_bytes) is what b's actors take.
    Plan placed = resolved;
    EXPECT_TRUE(resolve_placement(placed).has_value());
    EXPECT_EQ(free, kLimit - placed_memory_bytes(placed, (*m)->spec).at("b"));
    return free;
  };
  const uint64_t small = reported_by_b(64);
  const uint64_t large = reported_by_b(192);
  const StagePlan& s0 = resolved.stages[0];
  const uint64_t block = compute::kv_pool_bytes(compute::kv_cache_config(
      (*m)->spec, {s0.layer_begin, s0.layer_end}, resolved.kv_block_size, 1, resolved.kv_type));
  EXPECT_GT(block, 0u);
  EXPECT_EQ(small - large, 128 * block) << "free " << small << " with 64 blocks, " << large
                                        << " with 192; a block of stage 0 takes " << block;
}

// Qwen3-Next across nodes: each sequence's recurrent state slot travels in the steps
// (SequenceStep.stateSlot), its states live in the stages of nodes b and c. Lost and delayed
// steps and lost expert rows fail steps after a stage advanced a state; those sequences are
// recomputed from position 0, and every token and logit stays the single-process run's.
TEST(ClusterNode, Qwen3NextStatesAcrossNodesSurviveLostMessages) {
  testing::TempDir dir;
  const std::string path = testing::synth_arch(dir, "qwen3next", 34);
  run_exactness_at(path, {{"b", "c"}, {"c", "a"}});
  run_lossy(path);
}

// A node hosting part of the pipeline goes while requests are in flight: the head re-places its
// actors on the survivors, the scheduler recomputes the requests from their token logs, and every
// token and logit equals the fault-free single-process run. `lose` makes node c go; `heal`, if
// given, brings it back (it then rejoins as spare capacity).
// Cuts every link of node c both ways: it looks dead (no heartbeats) until set_faults({}).
void cut_all_links(ClusterNode& c) {
  auto rule = transport::parse_fault_rule("cut");
  ASSERT_TRUE(rule.has_value());
  auto in = *rule;
  in.outgoing = false;
  c.set_faults({*rule, in});
}

void expect_replaced(const std::string& rel, const Layout& layout,
                     const std::function<void(ClusterNode&)>& lose, const std::string& state,
                     const std::function<void(ClusterNode&)>& heal = {}) {
  TROUPE_SHARED_OR_SKIP(shared);
  const auto [path, reqs, want] = workload(shared, rel);
  ASSERT_FALSE(want.empty());
  std::vector<uint16_t> ports;
  Plan plan = parse(cluster_toml(path, layout, &ports));
  Nodes n;
  n.start(plan, 3);
  auto client = ClusterClient::connect("127.0.0.1", ports[0], "test-token");
  ASSERT_TRUE(client) << client.error().message;
  bool gone = false;
  auto got = generate_with_fault(
      **client, reqs, [&] { lose(*n.nodes[2]); }, 60s, &gone);
  ASSERT_TRUE(gone);
  expect_same(got, want);
  // Node c is out of the membership and hosts nothing; the cluster serves on.
  auto st = (*client)->status_json();
  ASSERT_TRUE(st) << st.error().message;
  auto j = nlohmann::json::parse(*st);
  EXPECT_TRUE(j["serving"].get<bool>()) << *st;
  for (const auto& m : j["members"]) {
    if (m["name"] == "c") {
      EXPECT_EQ(m["state"], state) << *st;
    }
  }
  for (const auto& a : j["actors"])
    EXPECT_EQ(a["name"].get<std::string>().find("@c"), std::string::npos) << *st;
  expect_same((*client)->generate_many(reqs), want);
  if (heal) {
    // The links heal: node c, which the head declared dead, asks to join again and is taken
    // back as spare capacity (alive, a new node id, no actors).
    const int64_t old_id = [&] {
      for (const auto& m : j["members"])
        if (m["name"] == "c") return m["id"].get<int64_t>();
      return int64_t{-1};
    }();
    heal(*n.nodes[2]);
    bool back = false;
    std::string last;
    for (int i = 0; i < 300 && !back; ++i) {  // up to 30 s: a hang guard, not a timing check
      std::this_thread::sleep_for(100ms);
      auto s2 = (*client)->status_json();
      if (!s2) continue;
      last = *s2;
      const auto j2 = nlohmann::json::parse(*s2);
      for (const auto& m : j2["members"])
        back |= m["name"] == "c" && m["state"] == "alive" && m["id"] != old_id;
    }
    EXPECT_TRUE(back) << "node c did not rejoin: " << last;
    expect_same((*client)->generate_many(reqs), want);
  }
  // Node c first (it may be retrying to reach the head it lost), then the others.
  for (size_t i = n.nodes.size(); i-- > 0;) n.nodes[i].reset();
}

TEST(ClusterNode, StageNodeThatLeavesMidRequestIsReplacedWithIdenticalOutput) {
  expect_replaced(
      "models/stories260K/stories260K.gguf", {{"a", "b", "c"}, {}},
      [](ClusterNode& c) { c.leave("test"); }, "left");
}

TEST(ClusterNode, StageAndShardNodeThatDiesIsReplacedWithIdenticalOutput) {
  // Node c hosts stage 1 and an expert shard; every link of it is cut (it looks dead: no
  // heartbeats), so the head declares it dead when its lease (1 s) runs out.
  expect_replaced("models/synth/mixtral-moe/model.gguf", {{"a", "c"}, {"b", "c"}}, cut_all_links,
                  "dead", [](ClusterNode& c) { c.set_faults({}); });
}

// Two nodes lost at once: b (an expert shard) and c (stage 1 and a shard) look dead in the same
// lease, so the head re-places c's actors onto a and b (placement 2), then finds b dead too while
// that placement starts and re-places everything onto a (placement 3). The requests in flight
// must survive both re-placements and finish bit-identically on a alone.
TEST(ClusterNode, TwoNodesLostInOneLeaseAreReplacedWithIdenticalOutput) {
  TROUPE_SHARED_OR_SKIP(shared);
  const auto [path, reqs, want] = workload(shared, "models/synth/mixtral-moe/model.gguf");
  ASSERT_FALSE(want.empty());
  std::vector<uint16_t> ports;
  Nodes n;
  n.start(parse(cluster_toml(path, {{"a", "c"}, {"b", "c"}}, &ports)), 3);
  auto client = ClusterClient::connect("127.0.0.1", ports[0], "test-token");
  ASSERT_TRUE(client) << client.error().message;
  bool gone = false;
  auto got = generate_with_fault(
      **client, reqs,
      [&] {
        cut_all_links(*n.nodes[2]);
        cut_all_links(*n.nodes[1]);
      },
      60s, &gone);
  ASSERT_TRUE(gone);
  expect_same(got, want);
  auto st = (*client)->status_json();
  ASSERT_TRUE(st) << st.error().message;
  const auto j = nlohmann::json::parse(*st);
  EXPECT_TRUE(j["serving"].get<bool>()) << *st;
  for (const auto& a : j["actors"])
    EXPECT_NE(a["name"].get<std::string>().find("@a"), std::string::npos) << *st;
  expect_same((*client)->generate_many(reqs), want);
  for (size_t i = n.nodes.size(); i-- > 0;) n.nodes[i].reset();
}

// Node c hosts stage 1 and an expert shard; a and b may hold only what they host already, so
// when c's links are cut and its lease runs out no survivor has room for its actors. The head holds
// the requests for up to replace_wait_ms (ARCHITECTURE.md §7, "queued until it returns").
struct NoRoom {
  Workload w;
  std::vector<uint16_t> ports;
  Nodes n;
  std::unique_ptr<ClusterClient> client;

  void start(const std::string& shared, int64_t replace_wait_ms) {
    w = workload(shared, "models/synth/mixtral-moe/model.gguf");
    ASSERT_FALSE(w.want.empty());
    std::string t = cluster_toml(w.path, {{"a", "c"}, {"b", "c"}}, &ports);
    auto put_after = [&](const std::string& at, const std::string& what) {
      const size_t i = t.find(at);
      ASSERT_NE(i, std::string::npos) << at;
      t.insert(i + at.size(), what);
    };
    put_after("lease_ms = 1000\n", "replace_wait_ms = " + std::to_string(replace_wait_ms) + "\n");
    // a and b can hold what the plan puts on them (rounded up to a MiB), not c's stage and shard:
    // a stage's KV pool of 256 blocks alone takes over a MiB.
    const std::string pool = "kv_blocks = 64\n";
    ASSERT_NE(t.find(pool), std::string::npos);
    t.replace(t.find(pool), pool.size(), "kv_blocks = 256\n");
    const int64_t limit_a = fitting_limit_mb(t, "a"), limit_b = fitting_limit_mb(t, "b");
    put_after("name = \"a\"\n", "memory_limit_mb = " + std::to_string(limit_a) + "\n");
    put_after("name = \"b\"\n", "memory_limit_mb = " + std::to_string(limit_b) + "\n");
    ASSERT_NO_FATAL_FAILURE(n.start(parse(t), 3));
    auto c = ClusterClient::connect("127.0.0.1", ports[0], "test-token");
    ASSERT_TRUE(c) << c.error().message;
    client = std::move(*c);
  }

  void cut_c() { cut_all_links(*n.nodes[2]); }

  // Node c's state in the head's status, seen through a connection of its own; `condition`
  // gets the head's condition of the same snapshot.
  std::string c_state(std::string* condition = nullptr) {
    auto other = ClusterClient::connect("127.0.0.1", ports[0], "test-token");
    if (!other) return "";
    auto st = (*other)->status_json();
    if (!st) return "";
    const auto j = nlohmann::json::parse(*st);
    if (condition) *condition = j["condition"].get<std::string>();
    for (const auto& m : j["members"])
      if (m["name"] == "c") return m["state"].get<std::string>();
    return "";
  }
};

TEST(ClusterNode, RequestsWaitForRoomAndFinishIdenticallyWhenTheLostNodeRejoins) {
  TROUPE_SHARED_OR_SKIP(shared);
  NoRoom r;
  r.start(shared, 60000);
  bool cut = false;
  std::thread healer;
  std::string held_condition;  // the head's condition once c was dead
  auto got = generate_with_fault(
      *r.client, r.w.reqs,
      [&] {
        r.cut_c();
        // Once the head has declared c dead (and found no room for its actors), heal c's links:
        // it asks to join again, and the held requests resume on its actors.
        healer = std::thread([&] {
          for (int i = 0; i < 300 && r.c_state(&held_condition) != "dead"; ++i)
            std::this_thread::sleep_for(100ms);
          r.n.nodes[2]->set_faults({});
        });
      },
      120s, &cut);
  if (healer.joinable()) healer.join();
  ASSERT_TRUE(cut);
  expect_same(got, r.w.want);
  // While c was dead the status said why requests were held.
  EXPECT_NE(held_condition.find("requests held: node c, which hosts part of the pipeline, is dead"),
            std::string::npos)
      << held_condition;
  EXPECT_NE(held_condition.find("ms more for a node with room to join"), std::string::npos)
      << held_condition;
  auto st = r.client->status_json();
  ASSERT_TRUE(st) << st.error().message;
  const auto j = nlohmann::json::parse(*st);
  EXPECT_TRUE(j["serving"].get<bool>()) << *st;
  int on_c = 0;
  for (const auto& a : j["actors"])
    on_c += a["name"].get<std::string>().find("@c") != std::string::npos;
  EXPECT_EQ(on_c, 2) << "c's stage and shard should be back on c: " << *st;
  expect_same(r.client->generate_many(r.w.reqs), r.w.want);
  for (size_t i = r.n.nodes.size(); i-- > 0;) r.n.nodes[i].reset();
}

TEST(ClusterNode, RequestsWaitingForRoomFailWithAClearErrorAfterTheWait) {
  TROUPE_SHARED_OR_SKIP(shared);
  NoRoom r;
  r.start(shared, 1500);
  bool cut = false;
  auto got = generate_with_fault(
      *r.client, r.w.reqs, [&] { r.cut_c(); }, 120s, &cut);
  ASSERT_TRUE(cut);
  ASSERT_EQ(got.size(), r.w.reqs.size());
  for (const auto& g : got) {
    EXPECT_EQ(g.finish_reason, "error");
    EXPECT_NE(g.error.find("node c, which hosts part of the pipeline, is dead"), std::string::npos)
        << g.error;
    EXPECT_NE(g.error.find("no surviving node has room"), std::string::npos) << g.error;
    EXPECT_NE(g.error.find("no node with room joined within 1500 ms"), std::string::npos)
        << g.error;
  }
  for (size_t i = r.n.nodes.size(); i-- > 0;) r.n.nodes[i].reset();
}

// The head drains when it leaves: requests in flight finish; new ones are refused.
TEST(ClusterNode, HeadDrainsBeforeLeaving) {
  TROUPE_SHARED_OR_SKIP(shared);
  const std::string path = shared + "/models/stories260K/stories260K.gguf";
  std::vector<uint16_t> ports;
  Plan plan = parse(cluster_toml(path, {{"a", "b"}, {}}, &ports, "t", 2));
  Nodes n;
  n.start(plan, 2);
  auto client = ClusterClient::connect("127.0.0.1", ports[0], "t");
  ASSERT_TRUE(client);
  GenerateRequest r;
  r.prompt = "Once upon a time";
  r.max_tokens = 200;
  r.sampling.ignore_eos = true;
  std::thread leaver([&] {
    std::this_thread::sleep_for(100ms);
    n.nodes[0]->leave("test");
  });
  auto res = (*client)->generate_many({r}, 0, nullptr, 60s);
  leaver.join();
  ASSERT_TRUE(res[0].ok()) << res[0].error;
  EXPECT_EQ(res[0].tokens.size(), 200u);
}

// A stage and an expert shard on worker nodes throw mid-generation: each node restarts its
// actor in place, the head's scheduler recomputes from the token logs, and every token and
// logit equals the fault-free run.
TEST(ClusterNode, CrashedActorsAreRestartedOnTheirNodeWithIdenticalOutput) {
  TROUPE_SHARED_OR_SKIP(shared);
  const auto [path, reqs, want] = workload(shared, "models/synth/mixtral-moe/model.gguf");
  ASSERT_FALSE(want.empty());
  std::vector<uint16_t> ports;
  Plan plan = parse(cluster_toml(path, {{"b", "c"}, {"c", "a"}}, &ports));
  Nodes n;
  n.start(plan, 3);
  auto client = ClusterClient::connect("127.0.0.1", ports[0], "test-token");
  ASSERT_TRUE(client);
  EXPECT_FALSE(n.nodes[1]->inject_fault("stage/1"));  // placed on c, not b
  int pieces = 0;
  auto got = (*client)->generate_many(reqs, 0, [&](size_t, const std::string&, int32_t) {
    if (++pieces == 3) {
      EXPECT_TRUE(n.nodes[1]->inject_fault("stage/0"));
      EXPECT_TRUE(n.nodes[2]->inject_fault("expert/0"));
    }
  });
  expect_same(got, want);
}

}  // namespace
}  // namespace troupe::actors
