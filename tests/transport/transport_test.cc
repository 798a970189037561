// Transport over real UCX on loopback: two transports in this process (each with its own worker
// and progress thread), the authenticated handshake, message delivery from 0 B to 16 MiB,
// refusal of a wrong token, survival of garbage bytes on the listener's port, oversized
// messages, an orderly close, send order across eager and rendezvous (fragmented) messages,
// idle CPU, and the fault-injection shim. Malformed fragment sequences: fragment_test.cc.
#include "transport/transport.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <future>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "tests/transport/transport_test_util.h"

namespace troupe::transport {
namespace {

using namespace std::chrono_literals;

TEST(Transport, HandshakeNamesBothEnds) {
  Pair p;
  p.start();
  EXPECT_GT(p.b->port(), 0);
  EXPECT_EQ(p.a->peer_name(p.b_from_a), "node-b");
  ASSERT_EQ(p.b_in.events.size(), 1u);
  EXPECT_EQ(std::get<2>(p.b_in.events[0]), "node-a");
}

TEST(Transport, DeliversEverySizeIntactInOrderBothWays) {
  Pair p;
  p.start();
  const std::vector<size_t> sizes = {0, 1, 8, 4096, 65536, 1u << 20, 16u << 20};
  for (size_t i = 0; i < sizes.size(); ++i) {
    auto bytes = pattern(sizes[i], static_cast<uint32_t>(i));
    ASSERT_TRUE(p.a->send(p.b_from_a, copy_message(100 + i, bytes)));
  }
  ASSERT_TRUE(p.b_in.wait_messages(sizes.size()));
  for (size_t i = 0; i < sizes.size(); ++i) {
    const Message& m = p.b_in.msgs[i];
    EXPECT_EQ(m.type, 100 + i);
    ASSERT_EQ(m.size_bytes, sizes[i]);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(m.data().data()) % 8, 0u);
    auto want = pattern(sizes[i], static_cast<uint32_t>(i));
    EXPECT_TRUE(std::equal(want.begin(), want.end(), m.data().begin())) << "size " << sizes[i];
  }
  // The reply path: b answers on the PeerId it got.
  const PeerId a_from_b = p.b_in.msgs[0].peer;
  ASSERT_TRUE(p.b->send(a_from_b, copy_message(7, pattern(300000, 9))));
  ASSERT_TRUE(p.a_in.wait_messages(1));
  EXPECT_EQ(p.a_in.msgs[0].type, 7u);
  EXPECT_EQ(p.a_in.msgs[0].size_bytes, 300000u);
  auto st = p.b->stats();
  ASSERT_EQ(st.links.size(), 1u);
  EXPECT_EQ(st.links[0].messages_received, sizes.size());
  EXPECT_EQ(st.links[0].messages_sent, 1u);
}

TEST(Transport, SmallMessagesDoNotOvertakeLargeOnes) {
  // Large messages go by rendezvous and small ones eagerly; the receiver must still hand them to
  // the handler in the order they were sent (transport.h: "delivery is in order per peer").
  Pair p;
  p.start();
  const std::vector<size_t> sizes = {1u << 20, 16, 300000, 8, 40000, 1u << 20, 1, 0, 2u << 20, 64};
  constexpr int kRounds = 4;
  for (int r = 0; r < kRounds; ++r)
    for (size_t i = 0; i < sizes.size(); ++i) {
      const uint64_t type = static_cast<uint64_t>(r) * sizes.size() + i;
      ASSERT_TRUE(p.a->send(p.b_from_a, copy_message(type, pattern(sizes[i], type))));
    }
  ASSERT_TRUE(p.b_in.wait_messages(kRounds * sizes.size()));
  std::lock_guard<std::mutex> lk(p.b_in.mu);
  for (size_t k = 0; k < p.b_in.msgs.size(); ++k) {
    const Message& m = p.b_in.msgs[k];
    ASSERT_EQ(m.type, k) << "message " << k << " was delivered out of order";
    const auto want = pattern(sizes[k % sizes.size()], static_cast<uint32_t>(k));
    ASSERT_EQ(m.size_bytes, want.size());
    EXPECT_TRUE(std::equal(want.begin(), want.end(), m.data().begin())) << "message " << k;
  }
}

TEST(Transport, GatherSendKeepsPartsInOrder) {
  Pair p;
  p.start();
  auto x = std::make_shared<std::vector<uint8_t>>(pattern(5000, 1));
  auto y = std::make_shared<std::vector<uint8_t>>(pattern(2u << 20, 2));
  OutMessage m;
  m.type = 42;
  m.parts = {{x->data(), x->size()}, {y->data(), y->size()}};
  m.keep_alive = std::make_shared<std::pair<decltype(x), decltype(y)>>(x, y);
  ASSERT_TRUE(p.a->send(p.b_from_a, std::move(m)));
  ASSERT_TRUE(p.b_in.wait_messages(1));
  const auto d = p.b_in.msgs[0].data();
  ASSERT_EQ(d.size(), x->size() + y->size());
  EXPECT_TRUE(std::equal(x->begin(), x->end(), d.begin()));
  EXPECT_TRUE(std::equal(y->begin(), y->end(), d.begin() + static_cast<ptrdiff_t>(x->size())));
}

TEST(Transport, LargeGatheredMessagesCrossFragmentsIntact) {
  // Over 1 MiB a message travels in fragments; parts of a gather list straddle their borders.
  Pair p;
  p.start();
  std::vector<std::shared_ptr<std::vector<uint8_t>>> bufs;
  for (size_t n : {size_t{5000}, size_t{3} << 19, size_t{3}, (size_t{2} << 20) + 7, size_t{0}})
    bufs.push_back(std::make_shared<std::vector<uint8_t>>(pattern(n, static_cast<uint32_t>(n))));
  OutMessage m;
  m.type = 43;
  std::vector<uint8_t> want;
  for (auto& b : bufs) {
    m.parts.push_back({b->data(), b->size()});
    want.insert(want.end(), b->begin(), b->end());
  }
  m.keep_alive = std::make_shared<decltype(bufs)>(bufs);
  ASSERT_TRUE(p.a->send(p.b_from_a, std::move(m)));
  ASSERT_TRUE(p.a->send(p.b_from_a, copy_message(44, pattern(5u << 20, 44))));
  ASSERT_TRUE(p.b_in.wait_messages(2));
  std::lock_guard<std::mutex> lk(p.b_in.mu);
  ASSERT_EQ(p.b_in.msgs[0].size_bytes, want.size());
  EXPECT_TRUE(std::equal(want.begin(), want.end(), p.b_in.msgs[0].data().begin()));
  const auto second = pattern(5u << 20, 44);
  ASSERT_EQ(p.b_in.msgs[1].size_bytes, second.size());
  EXPECT_TRUE(std::equal(second.begin(), second.end(), p.b_in.msgs[1].data().begin()));
  EXPECT_EQ(p.b->stats().links[0].malformed, 0u);
}

TEST(Transport, OrderlyCloseDeliversWhatWasSentBeforeIt) {
  // Large messages still being received when the goodbye arrives are delivered, then kDown.
  Pair p;
  p.start();
  constexpr int kCount = 6;
  for (int i = 0; i < kCount; ++i)
    ASSERT_TRUE(
        p.a->send(p.b_from_a, copy_message(i, pattern(3u << 20, static_cast<uint32_t>(i)))));
  ASSERT_TRUE(p.a->send(p.b_from_a, copy_message(kCount, pattern(10, kCount))));
  p.a->close(p.b_from_a);
  ASSERT_TRUE(p.b_in.wait_event(PeerEvent::kDown));
  std::lock_guard<std::mutex> lk(p.b_in.mu);
  EXPECT_EQ(p.b_in.msgs_at_down, static_cast<size_t>(kCount + 1));
  ASSERT_EQ(p.b_in.msgs.size(), static_cast<size_t>(kCount + 1));
  for (int i = 0; i <= kCount; ++i) EXPECT_EQ(p.b_in.msgs[i].type, static_cast<uint64_t>(i));
}

TEST(Transport, ClosingWhileLargeMessagesWaitReleasesThem) {
  // b closes the link while a's large messages wait for b's receive slots: the waiting ones are
  // handed back to UCX (a's sends complete), nothing is delivered after kDown, and both
  // transports shut down cleanly.
  Pair p;
  auto first = std::make_shared<std::promise<void>>();
  auto arrived = first->get_future();
  std::promise<void> gate;
  p.b_in.first_arrived = first;
  p.b_in.release = gate.get_future().share();
  p.start();
  constexpr int kCount = 24;
  for (int i = 0; i < kCount; ++i)
    ASSERT_TRUE(
        p.a->send(p.b_from_a, copy_message(i, pattern(2u << 20, static_cast<uint32_t>(i)))));
  // b's progress thread is held in the handler at the first message, with the rest announced
  // or on their way; the close is queued behind it.
  ASSERT_EQ(arrived.wait_for(10s), std::future_status::ready);
  const PeerId a_from_b = p.b->stats().links[0].peer;
  p.b->close(a_from_b);
  gate.set_value();
  ASSERT_TRUE(p.b_in.wait_event(PeerEvent::kDown));
  ASSERT_TRUE(p.a_in.wait_event(PeerEvent::kDown));
  size_t at_down = 0;
  {
    std::lock_guard<std::mutex> lk(p.b_in.mu);
    at_down = p.b_in.msgs_at_down;
    EXPECT_LT(at_down, static_cast<size_t>(kCount));
    for (size_t i = 0; i < p.b_in.msgs.size(); ++i) EXPECT_EQ(p.b_in.msgs[i].type, i);
  }
  p.a.reset();
  p.b.reset();
  EXPECT_EQ(p.b_in.count(), at_down);
}

TEST(Transport, IdleTransportsUseNoCpu) {
  // poll_in_flight polls only while a transfer is in flight: once everything completed, both
  // progress threads sleep.
  Pair p;
  p.start();
  ASSERT_TRUE(p.a->send(p.b_from_a, copy_message(1, pattern(4u << 20, 1))));
  ASSERT_TRUE(p.b_in.wait_messages(1));
  std::this_thread::sleep_for(50ms);  // past poll_in_flight after the last completion
  auto cpu_ms = [] {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
  };
  const double before = cpu_ms();
  std::this_thread::sleep_for(300ms);
  EXPECT_LT(cpu_ms() - before, 30.0) << "an idle transport kept a core busy";
}

TEST(Transport, WrongTokenIsRefusedAndLogged) {
  Inbox b_in, a_in;
  auto b = Transport::start(options("node-b", "right"), b_in.handler(), b_in.peer_handler());
  ASSERT_TRUE(b) << b.error().message;
  auto ao = options("intruder", "wrong");
  ao.listen_host = "";
  auto a = Transport::start(ao, a_in.handler(), a_in.peer_handler());
  ASSERT_TRUE(a);
  auto r = (*a)->connect("127.0.0.1", (*b)->port(), 5s);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("bad cluster token"), std::string::npos) << r.error().message;
  EXPECT_EQ((*b)->stats().auth_failures, 1u);
  EXPECT_TRUE(b_in.events.empty());  // never up
}

TEST(Transport, ServerThatCannotProveTheTokenIsNotTrusted) {
  // The server holds another token: it refuses the client; the client never sees kUp either.
  Inbox b_in, a_in;
  auto b = Transport::start(options("node-b", "token-1"), b_in.handler());
  ASSERT_TRUE(b);
  auto ao = options("node-a", "token-2");
  ao.listen_host = "";
  auto a = Transport::start(ao, a_in.handler(), a_in.peer_handler());
  ASSERT_TRUE(a);
  EXPECT_FALSE((*a)->connect("127.0.0.1", (*b)->port(), 5s));
  EXPECT_TRUE(a_in.events.empty());
}

TEST(Transport, ConnectToNothingFailsWithinTheTimeout) {
  Inbox a_in;
  auto ao = options("node-a");
  ao.listen_host = "";
  auto a = Transport::start(ao, a_in.handler());
  ASSERT_TRUE(a);
  // A port nobody listens on (bind one, learn it, close it).
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  socklen_t len = sizeof(sa);
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  ::close(fd);
  auto r = (*a)->connect("127.0.0.1", ntohs(sa.sin_port), 2s);
  ASSERT_FALSE(r);
  EXPECT_FALSE(r.error().message.empty());
}

TEST(Transport, GarbageOnTheListenerPortIsSurvived) {
  Pair p;
  p.start();
  for (int round = 0; round < 5; ++round) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(p.b->port());
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
    auto junk = pattern(static_cast<size_t>(1) << (6 + 2 * round), static_cast<uint32_t>(round));
    [[maybe_unused]] ssize_t n = write(fd, junk.data(), junk.size());
    ::close(fd);
  }
  // Still serving: the old link works and a new peer can join.
  ASSERT_TRUE(p.a->send(p.b_from_a, copy_message(1, pattern(10, 1))));
  ASSERT_TRUE(p.b_in.wait_messages(1));
  Inbox c_in;
  auto co = options("node-c");
  co.listen_host = "";
  auto c = Transport::start(co, c_in.handler());
  ASSERT_TRUE(c);
  auto r = (*c)->connect("127.0.0.1", p.b->port(), 10s);
  ASSERT_TRUE(r) << r.error().message;
  ASSERT_TRUE((*c)->send(*r, copy_message(2, pattern(10, 2))));
  ASSERT_TRUE(p.b_in.wait_messages(2));
}

TEST(Transport, OversizedMessagesAreCountedAndDropped) {
  auto bo = options("node-b");
  bo.max_message_bytes = 1u << 20;
  Pair p;
  p.start(options("node-a"), bo);
  ASSERT_TRUE(p.a->send(p.b_from_a, copy_message(1, pattern(2u << 20, 1))));
  ASSERT_TRUE(p.a->send(p.b_from_a, copy_message(2, pattern(100, 2))));
  ASSERT_TRUE(p.b_in.wait_messages(1));
  EXPECT_EQ(p.b_in.msgs[0].type, 2u);
  EXPECT_EQ(p.b->stats().links[0].oversized, 1u);
}

TEST(Transport, OrderlyCloseIsSeenByThePeer) {
  Pair p;
  p.start();
  p.a->close(p.b_from_a);
  ASSERT_TRUE(p.b_in.wait_event(PeerEvent::kDown));
  bool found = false;
  for (auto& e : p.b_in.events)
    if (std::get<1>(e) == PeerEvent::kDown) {
      EXPECT_NE(std::get<3>(e).find("closed by the peer"), std::string::npos) << std::get<3>(e);
      found = true;
    }
  EXPECT_TRUE(found);
  // Sending on a closed link is an error that names the link.
  for (int i = 0; i < 100 && p.a->send(p.b_from_a, copy_message(1, {})); ++i)
    std::this_thread::sleep_for(10ms);
  EXPECT_FALSE(p.a->send(p.b_from_a, copy_message(1, {})));
}

TEST(Transport, PeerDestroyedIsSeenAsDown) {
  Pair p;
  p.start();
  p.a.reset();  // says bye on the way out
  EXPECT_TRUE(p.b_in.wait_event(PeerEvent::kDown));
}

// --- fault shim ---------------------------------------------------------------------------

TEST(FaultRules, ParseAndReject) {
  auto r = parse_fault_rule(
      "delay:peer=node-b:type=7:p=0.5:seed=9:delay_ms=20:max=3:dir=in:min_bytes=4096");
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->action, FaultAction::kDelay);
  EXPECT_EQ(r->peer, "node-b");
  EXPECT_EQ(r->type, 7u);
  EXPECT_DOUBLE_EQ(r->probability, 0.5);
  EXPECT_EQ(r->seed, 9u);
  EXPECT_EQ(r->delay_ms, 20u);
  EXPECT_EQ(r->max_count, 3u);
  EXPECT_FALSE(r->outgoing);
  EXPECT_EQ(r->min_bytes, 4096u);
  EXPECT_NE(parse_fault_rule("drop:min_bytes=-1").error().message.find("min_bytes"),
            std::string::npos);
  EXPECT_NE(parse_fault_rule("explode").error().message.find("unknown action"), std::string::npos);
  EXPECT_NE(parse_fault_rule("drop:p=2").error().message.find("p must be in [0, 1]"),
            std::string::npos);
  EXPECT_NE(parse_fault_rule("drop:color=red").error().message.find("unknown key"),
            std::string::npos);
  EXPECT_NE(parse_fault_rule("drop:seed").error().message.find("key=value"), std::string::npos);
}

TEST(FaultRules, SeededDecisionsReplay) {
  FaultRule r;
  r.action = FaultAction::kDrop;
  r.probability = 0.3;
  r.seed = 1234;
  auto run = [&] {
    FaultShim s({r});
    std::string fired;
    for (int i = 0; i < 200; ++i) fired += s.decide("x", 1, true, 10) ? '1' : '0';
    return fired;
  };
  const std::string a = run(), b = run();
  EXPECT_EQ(a, b);
  const auto ones = std::count(a.begin(), a.end(), '1');
  EXPECT_GT(ones, 30);  // ~60 expected; a broken RNG gives 0 or 200
  EXPECT_LT(ones, 100);
  FaultShim other_peer({FaultRule{FaultAction::kDrop, "node-b", 0, 1.0, 1, 0, 2, true}});
  EXPECT_FALSE(other_peer.decide("node-c", 1, true, 1));
  EXPECT_FALSE(other_peer.decide("node-b", 1, false, 1));  // incoming: not this rule
  EXPECT_TRUE(other_peer.decide("node-b", 1, true, 1));
  EXPECT_TRUE(other_peer.decide("node-b", 1, true, 1));
  EXPECT_FALSE(other_peer.decide("node-b", 1, true, 1));  // max 2
  FaultRule big;
  big.min_bytes = 100;
  FaultShim only_big({big});
  EXPECT_FALSE(only_big.decide("x", 1, true, 99));  // a receipt-sized message passes
  EXPECT_TRUE(only_big.decide("x", 1, true, 100));
}

TEST(TransportFaults, DropDuplicateCorruptDelay) {
  Pair p;
  p.start();
  const auto payload = pattern(1000, 5);
  // drop the first message of type 1, duplicate the first of type 2, corrupt the first of 3
  // (the receiver's checksum catches it: dropped, never delivered), delay the first of type 4
  // by 200 ms (type 5 sent after it overtakes it).
  p.a->set_faults({FaultRule{FaultAction::kDrop, "node-b", 1, 1.0, 1, 0, 1, true},
                   FaultRule{FaultAction::kDuplicate, "", 2, 1.0, 1, 0, 1, true},
                   FaultRule{FaultAction::kCorrupt, "", 3, 1.0, 1, 0, 1, true},
                   FaultRule{FaultAction::kDelay, "", 4, 1.0, 1, 200, 1, true}});
  for (uint64_t t : {1, 2, 3, 4, 5}) ASSERT_TRUE(p.a->send(p.b_from_a, copy_message(t, payload)));
  ASSERT_TRUE(p.b_in.wait_messages(4));
  std::vector<uint64_t> types;
  for (auto& m : p.b_in.msgs) {
    types.push_back(m.type);
    EXPECT_TRUE(std::equal(payload.begin(), payload.end(), m.data().begin()));
  }
  EXPECT_EQ(types, (std::vector<uint64_t>{2, 2, 5, 4}));
  EXPECT_EQ(p.a->stats().links[0].faults_fired, 4u);
  EXPECT_EQ(p.b->stats().links[0].corrupted, 1u);
  EXPECT_EQ(p.b->stats().links[0].malformed, 1u);
}

TEST(TransportFaults, CorruptionOnReceiptIsCaughtToo) {
  Pair p;
  p.start();
  // Incoming rule at b: every message of type 7 gets a byte flipped after it arrived (the
  // fragmented ones too, whose checksum was taken as their fragments landed).
  p.b->set_faults({FaultRule{FaultAction::kCorrupt, "", 7, 1.0, 9, 0, 0, false}});
  for (int i = 0; i < 5; ++i)
    ASSERT_TRUE(p.a->send(p.b_from_a, copy_message(7, pattern(70000, 1))));
  ASSERT_TRUE(p.a->send(p.b_from_a, copy_message(7, pattern(3u << 20, 1))));
  ASSERT_TRUE(p.a->send(p.b_from_a, copy_message(8, pattern(10, 2))));
  ASSERT_TRUE(p.b_in.wait_messages(1));
  EXPECT_EQ(p.b_in.msgs[0].type, 8u);
  EXPECT_EQ(p.b->stats().links[0].corrupted, 6u);
}

TEST(TransportFaults, CorruptedFragmentedMessageIsDropped) {
  Pair p;
  p.start();
  p.a->set_faults({FaultRule{FaultAction::kCorrupt, "", 3, 1.0, 1, 0, 1, true}});
  ASSERT_TRUE(p.a->send(p.b_from_a, copy_message(3, pattern(3u << 20, 3))));
  ASSERT_TRUE(p.a->send(p.b_from_a, copy_message(4, pattern(3u << 20, 4))));
  ASSERT_TRUE(p.b_in.wait_messages(1));
  EXPECT_EQ(p.b_in.msgs[0].type, 4u);
  EXPECT_EQ(p.b->stats().links[0].corrupted, 1u);
}

TEST(TransportFaults, SenderWithoutChecksumsIsNotChecked) {
  Pair p;
  auto ao = options("node-a");
  ao.checksum_payloads = false;  // send() takes no sum; the headers say none comes
  p.start(ao);
  p.a->set_faults({FaultRule{FaultAction::kCorrupt, "", 3, 1.0, 1, 0, 1, true}});
  const auto big = pattern(3u << 20, 4);
  ASSERT_TRUE(p.a->send(p.b_from_a, copy_message(3, pattern(3u << 20, 3))));
  ASSERT_TRUE(p.a->send(p.b_from_a, copy_message(4, big)));
  ASSERT_TRUE(p.b_in.wait_messages(2));
  EXPECT_EQ(p.b_in.msgs[0].type, 3u);  // corrupted, but nothing to check it against
  EXPECT_TRUE(std::equal(big.begin(), big.end(), p.b_in.msgs[1].data().begin()));
  EXPECT_EQ(p.b->stats().links[0].corrupted, 0u);
}

TEST(TransportFaults, CutLinkDropsBothWaysUntilCleared) {
  Pair p;
  p.start();
  p.b->set_faults({FaultRule{FaultAction::kCut, "node-a", 0, 1.0, 1, 0, 0, false}});
  ASSERT_TRUE(p.a->send(p.b_from_a, copy_message(1, pattern(10, 1))));
  // The first message cuts the link (and is lost); prove it by a marker sent after clearing,
  // which must be the first message delivered.
  for (int i = 0; i < 400 && !p.b->stats().links[0].cut; ++i) std::this_thread::sleep_for(5ms);
  ASSERT_TRUE(p.b->stats().links[0].cut);
  // While cut, b's own sends fail (counted, not delivered).
  const PeerId a_from_b = p.b->stats().links[0].peer;
  ASSERT_TRUE(p.b->send(a_from_b, copy_message(9, pattern(10, 9))));
  for (int i = 0; i < 400 && p.b->stats().links[0].send_errors == 0; ++i)
    std::this_thread::sleep_for(5ms);
  EXPECT_EQ(p.b->stats().links[0].send_errors, 1u);
  p.b->set_faults({});
  EXPECT_FALSE(p.b->stats().links[0].cut);
  ASSERT_TRUE(p.a->send(p.b_from_a, copy_message(3, pattern(10, 3))));
  ASSERT_TRUE(p.b_in.wait_messages(1));
  EXPECT_EQ(p.b_in.msgs[0].type, 3u);
}

// Whether a TCP connection on local port `port` is in TIME_WAIT (/proc/net/tcp, state 06).
bool time_wait_on(uint16_t port) {
  std::ifstream in("/proc/net/tcp");
  std::string line;
  char want[8];
  std::snprintf(want, sizeof(want), ":%04X", port);
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string slot, local, remote, state;
    if (f >> slot >> local >> remote >> state && local.ends_with(want) && state == "06")
      return true;
  }
  return false;
}

// A node restarted at once (systemd's Restart=, a crash) listens on its port again although
// its old connections still sit in TIME_WAIT there (the listener sets SO_REUSEADDR).
TEST(Transport, ListensAgainOnItsPortRightAfterClosing) {
  // Which end closes first (and so holds the TIME_WAIT) is a race between b's goodbye and a's
  // answer: try pairs until b's side holds one (each try does so with a good chance).
  uint16_t port = 0;
  std::unique_ptr<Pair> pair;
  for (int attempt = 0; attempt < 20 && port == 0; ++attempt) {
    pair = std::make_unique<Pair>();
    Pair& p = *pair;
    ASSERT_NO_FATAL_FAILURE(p.start());
    ASSERT_TRUE(p.a->send(p.b_from_a, copy_message(1, pattern(64, 1))));
    ASSERT_TRUE(p.b_in.wait_messages(1));
    const uint16_t b_port = p.b->port();
    p.b.reset();
    for (int i = 0; i < 50 && !time_wait_on(b_port); ++i) std::this_thread::sleep_for(10ms);
    if (time_wait_on(b_port)) port = b_port;
  }
  ASSERT_NE(port, 0) << "b's side never held a TIME_WAIT connection in 20 tries";
  TransportOptions again = options("node-b");
  again.listen_port = port;
  Inbox in;
  auto b2 = Transport::start(again, in.handler(), in.peer_handler());
  ASSERT_TRUE(b2) << b2.error().message;
  EXPECT_EQ((*b2)->port(), port);
  auto peer = pair->a->connect("127.0.0.1", port, std::chrono::seconds(10));
  ASSERT_TRUE(peer) << peer.error().message;
  ASSERT_TRUE(pair->a->send(*peer, copy_message(2, pattern(64, 2))));
  ASSERT_TRUE(in.wait_messages(1));
}

// A port another transport listens on is refused with a message that says so.
TEST(Transport, APortInUseIsAClearError) {
  Inbox in1, in2;
  auto first = Transport::start(options("node-a"), in1.handler(), in1.peer_handler());
  ASSERT_TRUE(first) << first.error().message;
  TransportOptions same = options("node-b");
  same.listen_port = (*first)->port();
  auto second = Transport::start(same, in2.handler(), in2.peer_handler());
  ASSERT_FALSE(second);
  EXPECT_NE(second.error().message.find("in use"), std::string::npos) << second.error().message;
  EXPECT_NE(second.error().message.find(std::to_string(same.listen_port)), std::string::npos)
      << second.error().message;
}

TEST(Transport, RejectsBadOptions) {
  Inbox in;
  auto o = options("n");
  o.cluster_token = "";
  EXPECT_NE(Transport::start(o, in.handler()).error().message.find("token is empty"),
            std::string::npos);
  o = options("");
  EXPECT_NE(Transport::start(o, in.handler()).error().message.find("node name"), std::string::npos);
  o = options("n");
  o.listen_host = "256.1.1.1";
  EXPECT_FALSE(Transport::start(o, in.handler()));
}

}  // namespace
}  // namespace troupe::transport
