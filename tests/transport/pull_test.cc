// Same-host pulls (transport_pull.cc): large messages between transports of one host are read
// from the sender's memory; everything else goes over the endpoint. Two transports of this
// process are peers on one host here; processes that die mid-pull are in peer_death_test.cc.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <future>
#include <memory>
#include <string>
#include <thread>

#include "tests/transport/transport_test_util.h"
#include "transport/detail/testing.h"

namespace troupe::transport {
namespace {

using namespace std::chrono_literals;
using detail::RawAm;
using detail::RawFrame;
using detail::TransportTesting;

TransportOptions pulling(const std::string& name) {
  TransportOptions o = options(name);
  o.same_host_pull = true;
  return o;
}

// Waits until `t`'s first link says `field` (the offer and its acceptance are asynchronous).
bool wait_link(Transport& t, bool LinkStats::*field) {
  for (int i = 0; i < 1000; ++i) {
    const auto st = t.stats();
    if (!st.links.empty() && st.links[0].*field) return true;
    std::this_thread::sleep_for(5ms);
  }
  return false;
}

// A kAmPull payload: slot, number of ranges, then (address, length) per range.
std::vector<uint8_t> ranges(uint64_t slot, const std::vector<std::pair<uint64_t, uint64_t>>& r) {
  std::vector<uint8_t> out(16 + 16 * r.size());
  const uint64_t n = r.size();
  std::memcpy(out.data(), &slot, 8);
  std::memcpy(out.data() + 8, &n, 8);
  for (size_t i = 0; i < r.size(); ++i) {
    std::memcpy(out.data() + 16 + 16 * i, &r[i].first, 8);
    std::memcpy(out.data() + 24 + 16 * i, &r[i].second, 8);
  }
  return out;
}

struct PullPair : Pair {
  void start_pulling(TransportOptions ao = pulling("node-a"),
                     TransportOptions bo = pulling("node-b")) {
    ASSERT_NO_FATAL_FAILURE(start(ao, bo));
    ASSERT_TRUE(wait_link(*a, &LinkStats::pulls_to)) << "b never accepted a's offer";
    ASSERT_TRUE(wait_link(*b, &LinkStats::pulls_from));
  }
  uint64_t pulled() const { return b->stats().links[0].pulled; }
  uint64_t malformed() const { return b->stats().links[0].malformed; }
};

// Large and small messages, one of three parts, in one order: all arrive intact and in that
// order, the ones of at least pull_min_bytes by pull.
TEST(Pulls, LargeMessagesArePulledIntactAndInOrder) {
  PullPair p;
  ASSERT_NO_FATAL_FAILURE(p.start_pulling());
  const size_t min = pulling("x").pull_min_bytes;
  const std::vector<std::vector<uint8_t>> bodies = {pattern(10, 1),       pattern(5 << 20, 2),
                                                    pattern(min - 1, 3),  pattern(min, 4),
                                                    pattern(64 << 20, 5), pattern(100, 6)};
  for (size_t i = 0; i < bodies.size(); ++i)
    ASSERT_TRUE(p.a->send(p.b_from_a, copy_message(i, bodies[i])));
  // Three parts gathered from separate buffers, as a Cap'n Proto message's segments go.
  auto parts = std::make_shared<std::vector<std::vector<uint8_t>>>(
      std::vector<std::vector<uint8_t>>{pattern(300 << 10, 7), pattern(8, 8), pattern(1 << 20, 9)});
  OutMessage m;
  m.type = 99;
  for (const auto& part : *parts) m.parts.emplace_back(part.data(), part.size());
  m.keep_alive = parts;
  ASSERT_TRUE(p.a->send(p.b_from_a, std::move(m)));
  ASSERT_TRUE(p.b_in.wait_messages(bodies.size() + 1, 30s));
  for (size_t i = 0; i < bodies.size(); ++i) {
    ASSERT_EQ(p.b_in.msgs[i].type, i);
    EXPECT_TRUE(std::ranges::equal(p.b_in.msgs[i].data(), bodies[i])) << "message " << i;
  }
  std::vector<uint8_t> joined;
  for (const auto& part : *parts) joined.insert(joined.end(), part.begin(), part.end());
  EXPECT_EQ(p.b_in.msgs.back().type, 99u);
  EXPECT_TRUE(std::ranges::equal(p.b_in.msgs.back().data(), joined));
  EXPECT_EQ(p.pulled(), 4u);  // 5 MiB, min, 64 MiB and the three parts
  EXPECT_EQ(p.malformed(), 0u);
}

// More messages than the sender's pull table has slots, while the receiver is stuck in its
// handler: the first 1024 wait as pulls, the rest go over the endpoint, and all arrive in order.
TEST(Pulls, AFullPullTableFallsBackToTheEndpointInOrder) {
  PullPair p;
  ASSERT_NO_FATAL_FAILURE(p.start_pulling());
  const size_t n = 1100, min = pulling("x").pull_min_bytes;
  auto body = std::make_shared<const std::vector<uint8_t>>(pattern(min, 11));
  auto arrived = std::make_shared<std::promise<void>>();
  auto first = arrived->get_future();
  std::promise<void> release;
  p.b_in.release = release.get_future().share();
  p.b_in.first_arrived = arrived;
  for (size_t i = 0; i < n; ++i) {
    OutMessage m;
    m.type = i;
    m.parts = {{body->data(), body->size()}};
    m.keep_alive = body;  // one buffer for all: 1100 x 256 KiB would be 280 MB
    ASSERT_TRUE(p.a->send(p.b_from_a, std::move(m)));
  }
  ASSERT_EQ(first.wait_for(10s), std::future_status::ready);
  for (int i = 0; i < 400 && p.a->stats().links[0].messages_sent < n; ++i)
    std::this_thread::sleep_for(5ms);
  release.set_value();
  ASSERT_TRUE(p.b_in.wait_messages(n, 60s));
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(p.b_in.msgs[i].type, i);
    ASSERT_TRUE(std::ranges::equal(p.b_in.msgs[i].data(), *body)) << "message " << i;
  }
  EXPECT_GE(p.pulled(), 1024u);
  EXPECT_LT(p.pulled(), n) << "no message took the endpoint with the table full";
}

// The sender lets go of a pulled message's bytes once the receiver has read them.
TEST(Pulls, TheSenderKeepsTheBytesUntilTheyAreRead) {
  PullPair p;
  ASSERT_NO_FATAL_FAILURE(p.start_pulling());
  auto body = std::make_shared<std::vector<uint8_t>>(pattern(2 << 20, 3));
  std::weak_ptr<std::vector<uint8_t>> watch = body;
  OutMessage m;
  m.type = 1;
  m.parts = {{body->data(), body->size()}};
  m.keep_alive = std::move(body);
  ASSERT_TRUE(p.a->send(p.b_from_a, std::move(m)));
  ASSERT_TRUE(p.b_in.wait_messages(1));
  for (int i = 0; i < 400 && !watch.expired(); ++i) std::this_thread::sleep_for(5ms);
  EXPECT_TRUE(watch.expired()) << "the sender still holds a message the receiver has read";
  EXPECT_EQ(p.pulled(), 1u);
}

// A pull announced while the fault shim has cut the link is dropped (as everything is), and its
// sender keeps the bytes only until the cut is lifted: then the held "done" lets go of them.
TEST(Pulls, ACutLinkThatHealsLetsTheSenderGoOfDroppedPulls) {
  PullPair p;
  ASSERT_NO_FATAL_FAILURE(p.start_pulling());
  // The first message b receives cuts the link (and is lost with it).
  p.b->set_faults({FaultRule{FaultAction::kCut, "node-a", 0, 1.0, 1, 0, 1, false}});
  ASSERT_TRUE(p.a->send(p.b_from_a, copy_message(1, pattern(10, 1))));
  for (int i = 0; i < 400 && !p.b->stats().links[0].cut; ++i) std::this_thread::sleep_for(5ms);
  ASSERT_TRUE(p.b->stats().links[0].cut);

  auto body = std::make_shared<std::vector<uint8_t>>(pattern(2 << 20, 5));
  std::weak_ptr<std::vector<uint8_t>> watch = body;
  OutMessage m;
  m.type = 2;
  m.parts = {{body->data(), body->size()}};
  m.keep_alive = std::move(body);
  ASSERT_TRUE(p.a->send(p.b_from_a, std::move(m)));
  // It goes as a pull (a's side) and b drops its announcement: a must keep the bytes meanwhile.
  for (int i = 0; i < 400 && p.a->stats().links[0].messages_sent < 2; ++i)
    std::this_thread::sleep_for(5ms);
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(watch.expired()) << "a let go of a pull b never read";

  p.b->set_faults({});
  for (int i = 0; i < 400 && !watch.expired(); ++i) std::this_thread::sleep_for(5ms);
  EXPECT_TRUE(watch.expired()) << "the cut healed, but a still holds the pull b dropped";
  // The link works again, pulls included, and nothing dropped during the cut turns up.
  const auto big = pattern(3 << 20, 6);
  ASSERT_TRUE(p.a->send(p.b_from_a, copy_message(3, big)));
  ASSERT_TRUE(p.b_in.wait_messages(1));
  EXPECT_EQ(p.b_in.msgs[0].type, 3u);
  EXPECT_TRUE(std::equal(big.begin(), big.end(), p.b_in.msgs[0].data().begin()));
  EXPECT_EQ(p.pulled(), 1u);
}

// Either side can turn pulls off; then everything takes the endpoint.
TEST(Pulls, OffWhenEitherSideSaysSo) {
  for (const bool receiver_off : {true, false}) {
    SCOPED_TRACE(receiver_off ? "receiver off" : "sender off");
    PullPair p;
    auto ao = pulling("node-a"), bo = pulling("node-b");
    (receiver_off ? bo : ao).same_host_pull = false;
    ASSERT_NO_FATAL_FAILURE(p.start(ao, bo));
    std::this_thread::sleep_for(100ms);  // time for an offer to be (wrongly) taken
    const auto big = pattern(3 << 20, 4);
    ASSERT_TRUE(p.a->send(p.b_from_a, copy_message(4, big)));
    ASSERT_TRUE(p.b_in.wait_messages(1));
    EXPECT_TRUE(std::ranges::equal(p.b_in.msgs[0].data(), big));
    EXPECT_FALSE(p.a->stats().links[0].pulls_to);
    EXPECT_EQ(p.pulled(), 0u);
  }
}

// A corrupted copy (the sender's fault shim) carries the original's sum and is dropped.
TEST(Pulls, CorruptedCopyIsCaught) {
  PullPair p;
  ASSERT_NO_FATAL_FAILURE(p.start_pulling());
  p.a->set_faults({FaultRule{FaultAction::kCorrupt, "", 3, 1.0, 1, 0, 1, true}});
  ASSERT_TRUE(p.a->send(p.b_from_a, copy_message(3, pattern(3u << 20, 3))));
  const auto big = pattern(3u << 20, 4);
  ASSERT_TRUE(p.a->send(p.b_from_a, copy_message(4, big)));
  ASSERT_TRUE(p.b_in.wait_messages(1));
  EXPECT_EQ(p.b_in.msgs[0].type, 4u);
  EXPECT_TRUE(std::ranges::equal(p.b_in.msgs[0].data(), big));
  EXPECT_EQ(p.b->stats().links[0].corrupted, 1u);
}

// Hand-made announcements (this process's memory is the "sender's"): each bad one is counted
// and dropped, the link goes on, and a real pull after it arrives.
TEST(Pulls, BadAnnouncementsAreCountedAndDropped) {
  PullPair p;
  ASSERT_NO_FATAL_FAILURE(p.start_pulling());
  const auto bytes = pattern(4096, 5);
  const auto at = reinterpret_cast<uint64_t>(bytes.data());
  struct Case {
    const char* what;
    uint64_t total;
    std::vector<uint8_t> payload;
  };
  const std::vector<Case> cases = {
      {"ranges short of the size", 4096, ranges(5, {{at, 100}})},
      {"ranges past the size", 100, ranges(5, {{at, 4096}})},
      {"a zero-length range", 4096, ranges(5, {{at, 0}, {at, 4096}})},
      {"a slot past the table", 4096, ranges(1u << 20, {{at, 4096}})},
      {"no ranges", 0, ranges(5, {})},
      {"65 ranges", 65 * 8, ranges(5, std::vector<std::pair<uint64_t, uint64_t>>(65, {at, 8}))},
      {"a truncated range list", 4096, {1, 0, 0, 0, 0, 0, 0, 0, 1}},
      {"unreadable memory", 4096, ranges(5, {{16, 4096}})},
      {"a slot the sender does not hold", 4096, ranges(5, {{at, 4096}})},
  };
  uint64_t want_malformed = 0;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    RawFrame f;
    f.am = RawAm::kPull;
    f.type = 7;
    f.total_bytes = c.total;
    f.offset = 12345;  // the pull id
    f.payload = c.payload;
    f.protocol = RawFrame::Protocol::kEager;
    ASSERT_TRUE(TransportTesting::send_raw_frame(*p.a, p.b_from_a, f));
    ++want_malformed;
    for (int i = 0; i < 400 && p.malformed() < want_malformed; ++i)
      std::this_thread::sleep_for(5ms);
    EXPECT_EQ(p.malformed(), want_malformed);
  }
  // The same announcement with the slot held (a's table is this process's): read and delivered.
  TransportTesting::set_pull_slot(*p.a, 5, 12345);
  RawFrame good;
  good.am = RawAm::kPull;
  good.type = 8;
  good.total_bytes = 4096;
  good.offset = 12345;
  good.payload = ranges(5, {{at, 2048}, {at + 2048, 2048}});
  ASSERT_TRUE(TransportTesting::send_raw_frame(*p.a, p.b_from_a, good));
  ASSERT_TRUE(p.b_in.wait_messages(1));
  EXPECT_EQ(p.b_in.msgs[0].type, 8u);
  EXPECT_TRUE(std::ranges::equal(p.b_in.msgs[0].data(), bytes));
  TransportTesting::set_pull_slot(*p.a, 5, 0);
  // b said it was done with 12345 each time; a holds no such pull: counted there.
  for (int i = 0; i < 400 && p.a->stats().links[0].malformed < cases.size() + 1; ++i)
    std::this_thread::sleep_for(5ms);
  EXPECT_EQ(p.a->stats().links[0].malformed, cases.size() + 1);
  // And real traffic still flows both ways.
  const auto big = pattern(1 << 20, 6);
  ASSERT_TRUE(p.a->send(p.b_from_a, copy_message(9, big)));
  ASSERT_TRUE(p.b_in.wait_messages(2));
  EXPECT_TRUE(std::ranges::equal(p.b_in.msgs[1].data(), big));
  EXPECT_EQ(p.pulled(), 2u);
  EXPECT_EQ(p.malformed(), want_malformed);
}

// An offer whose cookie is not the one bound to the link (here: 32 random bytes that are where
// the offer says, as any process of this user could show) is not accepted.
TEST(Pulls, AnOfferWithoutTheLinksCookieIsNotAccepted) {
  PullPair p;
  auto ao = pulling("node-a");
  ao.same_host_pull = false;  // a offers nothing itself; the forged offer is the only one
  ASSERT_NO_FATAL_FAILURE(p.start(ao, pulling("node-b")));
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string boot;
  ASSERT_TRUE(f >> boot);
  ASSERT_EQ(boot.size(), 36u);
  const auto cookie = pattern(32, 7);
  std::vector<uint8_t> offer(boot.begin(), boot.end());
  auto put = [&](uint64_t v) {
    offer.resize(offer.size() + 8);
    std::memcpy(offer.data() + offer.size() - 8, &v, 8);
  };
  put(static_cast<uint64_t>(getpid()));
  put(reinterpret_cast<uint64_t>(cookie.data()));
  offer.insert(offer.end(), cookie.begin(), cookie.end());
  const std::vector<uint64_t> table(1024, 0);
  put(reinterpret_cast<uint64_t>(table.data()));
  put(table.size());
  RawFrame fr;
  fr.am = RawAm::kPullOffer;
  fr.payload = offer;
  fr.protocol = RawFrame::Protocol::kEager;
  ASSERT_TRUE(TransportTesting::send_raw_frame(*p.a, p.b_from_a, fr));
  // Something sent after the offer has arrived: the offer was handled by then.
  ASSERT_TRUE(p.a->send(p.b_from_a, copy_message(1, pattern(10, 1))));
  ASSERT_TRUE(p.b_in.wait_messages(1));
  EXPECT_FALSE(p.b->stats().links[0].pulls_from);
}

// A pull from a peer whose memory we never checked (we turned pulls off) is refused.
TEST(Pulls, AnnouncementFromAPeerWeCannotReadIsRefused) {
  PullPair p;
  auto bo = pulling("node-b");
  bo.same_host_pull = false;
  ASSERT_NO_FATAL_FAILURE(p.start(pulling("node-a"), bo));
  const auto bytes = pattern(4096, 5);
  RawFrame f;
  f.am = RawAm::kPull;
  f.total_bytes = 4096;
  f.payload = ranges(0, {{reinterpret_cast<uint64_t>(bytes.data()), 4096}});
  ASSERT_TRUE(TransportTesting::send_raw_frame(*p.a, p.b_from_a, f));
  for (int i = 0; i < 400 && p.malformed() == 0; ++i) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(p.malformed(), 1u);
  EXPECT_EQ(p.pulled(), 0u);
}

}  // namespace
}  // namespace troupe::transport
