// Tests of the schemas/*.capnp messages: every top-level message starts with `header @0`, and
// each one survives to_frame()/read_frame() unchanged (canonical words equal) with its fields
// readable on the other side.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <capnp/message.h>
#include <capnp/schema.h>
#include <capnp/serialize.h>
#include <gtest/gtest.h>

#include "schemas/cluster.capnp.h"
#include "schemas/expert.capnp.h"
#include "schemas/frame.h"
#include "schemas/kv.capnp.h"
#include "schemas/step.capnp.h"
#include "schemas/tensor_codec.h"

namespace troupe::schemas {
namespace {

constexpr uint64_t kEpoch = 12;

// Builds a T (header set, then fill(root)), frames it, reads the frame back, and checks that the
// header reads back and that the received message is word-for-word the one sent. Returns the
// reader (nullptr after a failure). `frame` keeps the bytes the reader points into.
template <class T, class Fill>
std::unique_ptr<capnp::FlatArrayMessageReader> round_trip(kj::Array<capnp::word>& frame,
                                                          Fill fill) {
  capnp::MallocMessageBuilder mb;
  auto root = mb.initRoot<T>();
  set_header(root.initHeader(),
             {.cluster_epoch = kEpoch, .node = 3, .role = Role::CONTROLLER, .index = 0, .seq = 5});
  fill(root);
  frame = to_frame(mb);
  auto b = frame.asBytes();
  auto r = read_frame({b.begin(), b.size()}, 1 << 24);
  if (!r) {
    ADD_FAILURE() << r.error().message;
    return nullptr;
  }
  auto got = (*r)->template getRoot<T>();
  auto h = read_header(got.getHeader(), kEpoch);
  EXPECT_TRUE(h) << (h ? "" : h.error().message);
  if (h) {
    EXPECT_EQ(h->seq, 5u);
    EXPECT_EQ(h->node, 3u);
    EXPECT_EQ(h->role, Role::CONTROLLER);
  }
  auto sent = capnp::canonicalize(root.asReader());
  auto received = capnp::canonicalize(got);
  EXPECT_EQ(sent.size(), received.size());
  EXPECT_TRUE(sent.size() == received.size() &&
              std::memcmp(sent.begin(), received.begin(), sent.size() * sizeof(capnp::word)) == 0)
      << "received message differs from the one sent";
  return std::move(*r);
}

std::vector<float> ramp(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i) - 3.0f;
  return v;
}

std::span<const uint8_t> as_bytes(const std::vector<float>& v) {
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(float)};
}

template <class T>
bool header_is_field_zero() {
  auto fields = capnp::Schema::from<T>().getFields();
  if (fields.size() == 0) return false;
  auto f = fields[0];
  return f.getProto().getName() == "header" && f.getProto().getOrdinal().isExplicit() &&
         f.getProto().getOrdinal().getExplicit() == 0 && f.getType().isStruct() &&
         f.getType().asStruct().getProto().getId() == capnp::typeId<Header>();
}

TEST(Messages, EveryTopLevelMessageHasHeaderAtZero) {
  EXPECT_TRUE(header_is_field_zero<BatchDescriptor>());
  EXPECT_TRUE(header_is_field_zero<StepResult>());
  EXPECT_TRUE(header_is_field_zero<ExpertDispatch>());
  EXPECT_TRUE(header_is_field_zero<ExpertCombine>());
  EXPECT_TRUE(header_is_field_zero<KvAllocateRequest>());
  EXPECT_TRUE(header_is_field_zero<KvAllocateReply>());
  EXPECT_TRUE(header_is_field_zero<KvAppend>());
  EXPECT_TRUE(header_is_field_zero<KvFree>());
  EXPECT_TRUE(header_is_field_zero<KvStats>());
  EXPECT_TRUE(header_is_field_zero<JoinRequest>());
  EXPECT_TRUE(header_is_field_zero<JoinReply>());
  EXPECT_TRUE(header_is_field_zero<Heartbeat>());
  EXPECT_TRUE(header_is_field_zero<HeartbeatAck>());
  EXPECT_TRUE(header_is_field_zero<Membership>());
  EXPECT_TRUE(header_is_field_zero<Placement>());
  EXPECT_TRUE(header_is_field_zero<StatusRequest>());
  EXPECT_TRUE(header_is_field_zero<StatusSnapshot>());
  EXPECT_TRUE(header_is_field_zero<FaultCommand>());
}

TEST(Messages, SamplingDefaultsMatchTheSampler) {
  // An unset SamplingParams must mean what compute::SamplingParams{} means: sampling "off".
  capnp::MallocMessageBuilder mb;
  auto p = mb.initRoot<SamplingParams>().asReader();
  EXPECT_EQ(p.getTemperature(), 0.0f);
  EXPECT_EQ(p.getTopK(), 0);
  EXPECT_EQ(p.getTopP(), 1.0f);
  EXPECT_EQ(p.getMinP(), 0.0f);
  EXPECT_EQ(p.getRepetitionPenalty(), 1.0f);
  EXPECT_EQ(p.getPresencePenalty(), 0.0f);
  EXPECT_EQ(p.getFrequencyPenalty(), 0.0f);
  EXPECT_EQ(p.getPenaltyLastN(), 64);
  EXPECT_EQ(p.getSeed(), 0u);
  EXPECT_FALSE(p.getIgnoreEos());
}

// ---- step.capnp -------------------------------------------------------------------------------

TEST(Messages, BatchDescriptorRoundTrips) {
  std::vector<float> hidden = ramp(3 * 8);  // [numTokens = 3, nEmbd = 8]
  kj::Array<capnp::word> frame;
  auto r = round_trip<BatchDescriptor>(frame, [&](BatchDescriptor::Builder m) {
    m.setStepId(1001);
    m.setMicrobatch(1);
    m.setAttempt(2);
    m.setStage(1);
    m.setDeadlineMs(500);
    const uint64_t shape[] = {3, 8};
    ASSERT_TRUE(set_tensor_external(m.initHidden(), TensorDtype::kF32, shape, as_bytes(hidden)));
    auto seqs = m.initSequences(2);
    // A prefill chunk of 2 tokens, then a decode token that samples.
    seqs[0].setRequestId(7);
    seqs[0].setSeqId(0);
    seqs[0].setPos0(16);
    seqs[0].setCount(2);
    seqs[0].setLogits(LogitsMode::NONE);
    auto t0 = seqs[0].initTokenIds(2);
    t0.set(0, 100);
    t0.set(1, 101);
    auto bt = seqs[0].initBlockTables(2);
    bt[0].setStage(0);
    auto ids0 = bt[0].initBlockIds(2);
    ids0.set(0, 4);
    ids0.set(1, 9);
    bt[1].setStage(1);
    bt[1].initBlockIds(2).set(1, 3);
    auto sp = seqs[0].initSplices(1)[0];
    sp.setOffset(1);
    sp.setContentHash(0xabcdef);
    seqs[1].setRequestId(8);
    seqs[1].setSeqId(5);
    seqs[1].setPos0(40);
    seqs[1].setCount(1);
    seqs[1].setLogits(LogitsMode::LAST);
    seqs[1].setSample(true);
    seqs[1].initTokenIds(1).set(0, 55);
    auto p = seqs[1].initSampling();
    p.setTemperature(0.7f);
    p.setTopK(40);
    p.setTopP(0.9f);
    p.setSeed(1234);
    p.initStopTokenIds(1).set(0, 2);
    p.setNumLogprobs(3);
    auto st = seqs[1].initSamplerState();
    st.setS0(1);
    st.setS1(2);
    st.setS2(3);
    st.setS3(0xffffffffffffffffull);
    auto hist = seqs[1].initPenaltyHistory(2);
    hist.set(0, 54);
    hist.set(1, 55);
  });
  ASSERT_TRUE(r);
  auto m = r->getRoot<BatchDescriptor>();
  EXPECT_EQ(m.getStepId(), 1001u);
  EXPECT_EQ(m.getAttempt(), 2u);
  ASSERT_EQ(m.getSequences().size(), 2u);
  auto s0 = m.getSequences()[0];
  EXPECT_EQ(s0.getPos0(), 16u);
  EXPECT_EQ(s0.getTokenIds()[1], 101);
  EXPECT_EQ(s0.getBlockTables()[0].getBlockIds()[1], 9);
  EXPECT_EQ(s0.getLogits(), LogitsMode::NONE);
  EXPECT_EQ(s0.getSplices()[0].getContentHash(), 0xabcdefu);
  auto s1 = m.getSequences()[1];
  EXPECT_TRUE(s1.getSample());
  EXPECT_EQ(s1.getSampling().getTopK(), 40);
  EXPECT_FLOAT_EQ(s1.getSampling().getTopP(), 0.9f);
  EXPECT_EQ(s1.getSampling().getPenaltyLastN(), 64);  // default survives
  EXPECT_EQ(s1.getSamplerState().getS3(), 0xffffffffffffffffull);
  EXPECT_EQ(s1.getPenaltyHistory()[0], 54);
  auto v = read_tensor(m.getHidden());
  ASSERT_TRUE(v) << v.error().message;
  EXPECT_TRUE(expect_tensor(*v, {TensorDtype::kF32}, {3, 8}, "hidden"));
  EXPECT_EQ(v->as<float>()[23], 20.0f);
}

TEST(Messages, StepResultRoundTrips) {
  std::vector<float> logits = ramp(2 * 16);
  kj::Array<capnp::word> frame;
  auto r = round_trip<StepResult>(frame, [&](StepResult::Builder m) {
    m.setStepId(1001);
    m.setMicrobatch(1);
    m.setComputeNs(123456);
    const uint64_t shape[] = {2, 16};
    ASSERT_TRUE(set_tensor_copy(m.initLogits(), TensorDtype::kF32, shape, as_bytes(logits)));
    auto seqs = m.initSequences(2);
    seqs[0].setRequestId(7);  // prefill chunk: no token drawn, default -1 kept
    seqs[1].setRequestId(8);
    seqs[1].setSeqId(5);
    seqs[1].setSampledToken(321);
    seqs[1].setStopToken(true);
    seqs[1].setLogitsRowBegin(1);
    seqs[1].setLogitsRowCount(1);
    seqs[1].setSampledLogprob(-0.25f);
    seqs[1].initSamplerState().setS2(99);
    auto top = seqs[1].initTopLogprobs(2);
    top[0].setTokenId(321);
    top[0].setLogprob(-0.25f);
    top[1].setTokenId(4);
    top[1].setLogprob(-2.0f);
  });
  ASSERT_TRUE(r);
  auto m = r->getRoot<StepResult>();
  EXPECT_EQ(m.getComputeNs(), 123456u);
  EXPECT_FALSE(m.hasError());
  EXPECT_EQ(m.getSequences()[0].getSampledToken(), -1);
  auto s1 = m.getSequences()[1];
  EXPECT_EQ(s1.getSampledToken(), 321);
  EXPECT_TRUE(s1.getStopToken());
  EXPECT_EQ(s1.getSamplerState().getS2(), 99u);
  EXPECT_EQ(s1.getTopLogprobs()[1].getTokenId(), 4);
  auto v = read_tensor(m.getLogits());
  ASSERT_TRUE(v) << v.error().message;
  EXPECT_EQ(v->as<float>()[s1.getLogitsRowBegin() * 16 + 3], 16.0f);
}

TEST(Messages, StepResultCarriesAnError) {
  kj::Array<capnp::word> frame;
  auto r = round_trip<StepResult>(frame, [&](StepResult::Builder m) {
    m.setStepId(3);
    auto e = m.initError();
    e.setDomain("compute");
    e.setCode(4);
    e.setMessage("block table of seq 2 too short: need 3 blocks, got 2");
  });
  ASSERT_TRUE(r);
  auto e = r->getRoot<StepResult>().getError();
  EXPECT_EQ(std::string(e.getDomain().cStr()), "compute");
  EXPECT_EQ(e.getCode(), 4u);
  EXPECT_EQ(std::string(e.getMessage().cStr()),
            "block table of seq 2 too short: need 3 blocks, got 2");
}

// ---- expert.capnp -----------------------------------------------------------------------------

TEST(Messages, ExpertDispatchRoundTrips) {
  std::vector<float> rows = ramp(3 * 4);  // [numRows = 3, nEmbd = 4]
  kj::Array<capnp::word> frame;
  auto r = round_trip<ExpertDispatch>(frame, [&](ExpertDispatch::Builder m) {
    m.setStepId(77);
    m.setLayer(5);
    const uint64_t shape[] = {3, 4};
    ASSERT_TRUE(set_tensor_external(m.initRows(), TensorDtype::kF32, shape, as_bytes(rows)));
    auto tok = m.initTokenIdx(3);
    auto exp = m.initExpertIds(3);
    auto slot = m.initSlots(3);
    auto w = m.initWeights(3);
    const uint32_t t[] = {0, 0, 2}, e[] = {12, 13, 12};
    const uint8_t s[] = {0, 1, 0};
    const float ws[] = {0.6f, 0.4f, 1.0f};
    for (unsigned i = 0; i < 3; ++i) {
      tok.set(i, t[i]);
      exp.set(i, e[i]);
      slot.set(i, s[i]);
      w.set(i, ws[i]);
    }
  });
  ASSERT_TRUE(r);
  auto m = r->getRoot<ExpertDispatch>();
  EXPECT_EQ(m.getLayer(), 5u);
  EXPECT_EQ(m.getExpertIds()[1], 13u);
  EXPECT_EQ(m.getSlots()[1], 1u);
  EXPECT_FLOAT_EQ(m.getWeights()[0], 0.6f);
  auto v = read_tensor(m.getRows());
  ASSERT_TRUE(v) << v.error().message;
  EXPECT_EQ(v->dim(0), m.getTokenIdx().size());
}

TEST(Messages, ExpertCombineRoundTrips) {
  std::vector<float> out = ramp(3 * 4);
  kj::Array<capnp::word> frame;
  auto r = round_trip<ExpertCombine>(frame, [&](ExpertCombine::Builder m) {
    m.setStepId(77);
    m.setLayer(5);
    m.setComputeNs(999);
    const uint64_t shape[] = {3, 4};
    ASSERT_TRUE(set_tensor_copy(m.initOutputs(), TensorDtype::kF32, shape, as_bytes(out)));
  });
  ASSERT_TRUE(r);
  auto m = r->getRoot<ExpertCombine>();
  auto v = read_tensor(m.getOutputs());
  ASSERT_TRUE(v) << v.error().message;
  EXPECT_EQ(v->as<float>()[11], 8.0f);
  EXPECT_EQ(m.getComputeNs(), 999u);
}

// ---- kv.capnp ---------------------------------------------------------------------------------

TEST(Messages, KvAllocateRequestAndReplyRoundTrip) {
  kj::Array<capnp::word> f1, f2;
  auto req = round_trip<KvAllocateRequest>(f1, [](KvAllocateRequest::Builder m) {
    m.setRequestId(7);
    m.setSeqId(2);
    m.setNumTokens(48);
    auto h = m.initPrefixBlockHashes(2);
    h.set(0, 0x1111);
    h.set(1, 0x2222);
  });
  ASSERT_TRUE(req);
  EXPECT_EQ(req->getRoot<KvAllocateRequest>().getNumTokens(), 48u);
  EXPECT_EQ(req->getRoot<KvAllocateRequest>().getPrefixBlockHashes()[1], 0x2222u);
  auto rep = round_trip<KvAllocateReply>(f2, [](KvAllocateReply::Builder m) {
    m.setRequestId(7);
    m.setSeqId(2);
    m.setOk(true);
    auto ids = m.initBlockIds(3);
    ids.set(0, 10);
    ids.set(1, 11);
    ids.set(2, 30);
    m.setNumCachedTokens(32);
    m.setNumFreeBlocks(500);
  });
  ASSERT_TRUE(rep);
  auto m = rep->getRoot<KvAllocateReply>();
  EXPECT_TRUE(m.getOk());
  EXPECT_EQ(m.getBlockIds()[2], 30);
  EXPECT_EQ(m.getNumCachedTokens(), 32u);
}

TEST(Messages, KvAppendRoundTrips) {
  kj::Array<capnp::word> frame;
  auto r = round_trip<KvAppend>(frame, [](KvAppend::Builder m) {
    m.setRequestId(7);
    m.setNumTokens(64);
    m.setFirstFullBlockIdx(3);
    m.initFullBlockHashes(1).set(0, 0x3333);
  });
  ASSERT_TRUE(r);
  EXPECT_EQ(r->getRoot<KvAppend>().getFirstFullBlockIdx(), 3u);
  EXPECT_EQ(r->getRoot<KvAppend>().getFullBlockHashes()[0], 0x3333u);
}

TEST(Messages, KvFreeRoundTrips) {
  kj::Array<capnp::word> frame;
  auto r = round_trip<KvFree>(frame, [](KvFree::Builder m) {
    m.setRequestId(7);
    m.setSeqId(2);
    m.setKeepCached(true);
    m.setReason(KvFreeReason::PREEMPTED);
  });
  ASSERT_TRUE(r);
  EXPECT_TRUE(r->getRoot<KvFree>().getKeepCached());
  EXPECT_EQ(r->getRoot<KvFree>().getReason(), KvFreeReason::PREEMPTED);
}

void fill_kv_stats(KvStats::Builder m) {
  m.setStage(1);
  m.setBlockSizeTokens(16);
  m.setBlockSizeBytes(1 << 20);
  m.setNumBlocks(1000);
  m.setBlocksUsed(600);
  m.setBlocksCached(100);
  m.setBlocksFree(300);
  m.setUsagePerc(0.6f);
  m.setFragmentationPerc(0.05f);
  m.setPrefixQueriesTotal(5000);
  m.setPrefixHitsTotal(1200);
  m.setEvictionsTotal(7);
  m.setNumSequences(40);
}

TEST(Messages, KvStatsRoundTrips) {
  kj::Array<capnp::word> frame;
  auto r = round_trip<KvStats>(frame, [](KvStats::Builder m) { fill_kv_stats(m); });
  ASSERT_TRUE(r);
  auto m = r->getRoot<KvStats>();
  EXPECT_EQ(m.getBlocksUsed() + m.getBlocksCached() + m.getBlocksFree(), m.getNumBlocks());
  EXPECT_FLOAT_EQ(m.getFragmentationPerc(), 0.05f);
  EXPECT_EQ(m.getPrefixHitsTotal(), 1200u);
}

// ---- cluster.capnp ----------------------------------------------------------------------------

void fill_resources(NodeResources::Builder r) {
  r.setCpuCores(16);
  r.setMemoryBytes(128ull << 30);
  r.setFreeMemoryBytes(100ull << 30);
  auto d = r.initDevices(1)[0];
  d.setKind(DeviceKind::CUDA);
  d.setIndex(0);
  d.setName("NVIDIA H200");
  d.setMemoryBytes(141ull << 30);
  d.setFreeMemoryBytes(139ull << 30);
  d.setComputeCapability(90);
}

TEST(Messages, JoinRequestAndReplyRoundTrip) {
  kj::Array<capnp::word> f1, f2;
  auto req = round_trip<JoinRequest>(f1, [](JoinRequest::Builder m) {
    auto n = m.initNode();
    n.setName("node-b");
    n.setAddress("10.0.0.2:13337");
    n.setVersion("0.1.0");
    n.setPid(4242);
    n.setModelFileHash(0x5555);
    fill_resources(n.initResources());
    std::memset(m.initNonce(32).begin(), 0xa5, 32);
    std::memset(m.initProof(32).begin(), 0x5a, 32);
  });
  ASSERT_TRUE(req);
  auto j = req->getRoot<JoinRequest>();
  EXPECT_EQ(std::string(j.getNode().getName().cStr()), "node-b");
  EXPECT_EQ(j.getNode().getResources().getDevices()[0].getComputeCapability(), 90u);
  EXPECT_EQ(j.getProof().size(), 32u);
  EXPECT_EQ(j.getNonce()[31], 0xa5);
  auto rep = round_trip<JoinReply>(f2, [](JoinReply::Builder m) {
    m.setAccepted(true);
    m.setNodeId(2);
    m.setLeaseMs(3000);
    m.setHeartbeatIntervalMs(500);
    m.initProof(32);
  });
  ASSERT_TRUE(rep);
  EXPECT_EQ(rep->getRoot<JoinReply>().getNodeId(), 2u);
  EXPECT_EQ(rep->getRoot<JoinReply>().getLeaseMs(), 3000u);
}

TEST(Messages, HeartbeatAndAckRoundTrip) {
  kj::Array<capnp::word> f1, f2;
  auto hb = round_trip<Heartbeat>(f1, [](Heartbeat::Builder m) {
    m.setLeaseMs(3000);
    m.setNumActors(4);
    m.setUptimeMs(60000);
    fill_resources(m.initResources());
  });
  ASSERT_TRUE(hb);
  EXPECT_EQ(hb->getRoot<Heartbeat>().getLeaseMs(), 3000u);
  auto ack = round_trip<HeartbeatAck>(f2, [](HeartbeatAck::Builder m) {
    m.setLeaseMs(3000);
    m.setMembershipVersion(9);
    m.setFenced(true);
  });
  ASSERT_TRUE(ack);
  EXPECT_TRUE(ack->getRoot<HeartbeatAck>().getFenced());
  EXPECT_EQ(ack->getRoot<HeartbeatAck>().getMembershipVersion(), 9u);
}

void fill_membership(Membership::Builder m) {
  m.setVersion(9);
  auto ms = m.initMembers(2);
  ms[0].setNodeId(1);
  ms[0].setName("node-a");
  ms[0].setState(MemberState::ALIVE);
  ms[1].setNodeId(2);
  ms[1].setName("node-b");
  ms[1].setState(MemberState::SUSPECT);
  ms[1].setLastHeartbeatAgeMs(2500);
}

TEST(Messages, MembershipRoundTrips) {
  kj::Array<capnp::word> frame;
  auto r = round_trip<Membership>(frame, [](Membership::Builder m) { fill_membership(m); });
  ASSERT_TRUE(r);
  auto m = r->getRoot<Membership>();
  EXPECT_EQ(m.getMembers()[1].getState(), MemberState::SUSPECT);
  EXPECT_EQ(m.getMembers()[1].getLastHeartbeatAgeMs(), 2500u);
}

TEST(Messages, PlacementRoundTrips) {
  kj::Array<capnp::word> frame;
  auto r = round_trip<Placement>(frame, [](Placement::Builder m) {
    m.setVersion(4);
    m.setModelName("synth-moe");
    m.setNumMicrobatches(2);
    auto st = m.initStages(2);
    st[0].setStage(0);
    st[0].setNodeId(1);
    st[0].initDevices(1).set(0, -1);
    st[0].setLayerEnd(6);
    st[0].setHasEmbedding(true);
    st[1].setStage(1);
    st[1].setNodeId(2);
    st[1].initDevices(2).set(1, 1);
    st[1].setLayerBegin(6);
    st[1].setLayerEnd(12);
    st[1].setHasOutputHead(true);
    auto es = m.initExpertShards(1)[0];
    es.setShard(0);
    es.setNodeId(2);
    es.setDevice(1);
    auto ex = es.initExperts(2);
    ex.set(0, 4);
    ex.set(1, 5);
    auto kv = m.initKvPools(1)[0];
    kv.setStage(1);
    kv.setNumBlocks(2048);
    kv.setBlockSizeTokens(16);
    m.initEncoders(1)[0].setDevice(-1);
  });
  ASSERT_TRUE(r);
  auto m = r->getRoot<Placement>();
  EXPECT_EQ(m.getStages()[0].getDevices()[0], -1);
  EXPECT_TRUE(m.getStages()[1].getHasOutputHead());
  EXPECT_EQ(m.getExpertShards()[0].getExperts()[1], 5u);
  EXPECT_EQ(m.getKvPools()[0].getNumBlocks(), 2048u);
  EXPECT_EQ(std::string(m.getModelName().cStr()), "synth-moe");
}

TEST(Messages, StatusRequestAndSnapshotRoundTrip) {
  kj::Array<capnp::word> f1, f2;
  auto req = round_trip<StatusRequest>(f1, [](StatusRequest::Builder m) { m.setIncludeKv(true); });
  ASSERT_TRUE(req);
  EXPECT_TRUE(req->getRoot<StatusRequest>().getIncludeKv());
  auto snap = round_trip<StatusSnapshot>(f2, [](StatusSnapshot::Builder m) {
    m.setTakenAtMs(123);
    m.setPlacementVersion(4);
    fill_membership(m.initMembership());
    auto a = m.initActors(1)[0];
    auto id = a.initActor();
    id.setNode(2);
    id.setRole(Role::STAGE);
    id.setIndex(1);
    a.setName("stage/1@node-b");
    a.setState(ActorState::RESTARTING);
    a.setRestarts(2);
    a.setLastError("compute: NaN in layer 3");
    auto ph = m.initStartupPhases(1)[0];
    ph.setName("map weights");
    ph.setDurationMs(850);
    ph.setDone(true);
    fill_kv_stats(m.initKvPools(1)[0]);
    auto tp = m.initThroughput();
    tp.setWindowMs(10000);
    tp.setGenerationTokensPerS(512.5);
    tp.setNumRequestsRunning(8);
  });
  ASSERT_TRUE(snap);
  auto m = snap->getRoot<StatusSnapshot>();
  EXPECT_EQ(m.getActors()[0].getState(), ActorState::RESTARTING);
  EXPECT_EQ(m.getActors()[0].getRestarts(), 2u);
  EXPECT_EQ(m.getActors()[0].getActor().getRole(), Role::STAGE);
  EXPECT_EQ(m.getStartupPhases()[0].getDurationMs(), 850u);
  EXPECT_EQ(m.getKvPools()[0].getNumBlocks(), 1000u);
  EXPECT_DOUBLE_EQ(m.getThroughput().getGenerationTokensPerS(), 512.5);
  EXPECT_EQ(m.getMembership().getMembers().size(), 2u);
}

TEST(Messages, FaultCommandRoundTrips) {
  kj::Array<capnp::word> frame;
  auto r = round_trip<FaultCommand>(frame, [](FaultCommand::Builder m) {
    auto rules = m.initRules(2);
    rules[0].setAction(FaultAction::DROP);
    rules[0].setPeerNode(2);
    rules[0].setMessageTypeId(capnp::typeId<BatchDescriptor>());
    rules[0].setProbability(0.1f);
    rules[0].setSeed(42);
    rules[1].setAction(FaultAction::DELAY);
    rules[1].setDelayMs(200);
    rules[1].setMaxCount(3);
  });
  ASSERT_TRUE(r);
  auto rules = r->getRoot<FaultCommand>().getRules();
  EXPECT_EQ(rules[0].getAction(), FaultAction::DROP);
  EXPECT_EQ(rules[0].getMessageTypeId(), capnp::typeId<BatchDescriptor>());
  EXPECT_FLOAT_EQ(rules[0].getProbability(), 0.1f);
  EXPECT_TRUE(rules[0].getOutgoing());  // default true
  EXPECT_EQ(rules[1].getDelayMs(), 200u);
  EXPECT_EQ(rules[1].getMaxCount(), 3u);
}

}  // namespace
}  // namespace troupe::schemas
