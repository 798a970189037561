// Peer processes that die (SIGKILL) or stall (SIGSTOP) while messages flow must not stop the
// transport from sending and receiving on its other links, and their deaths are reported as
// links going down. With shared memory between processes (error mode "none") a peer killed
// while it sends can leave the receiver unable to receive from anyone, for good
// (docs/transport.md, error_mode): PeerKilledWhileSendingToUs… caught that in 2 of 8 runs over
// shared memory and in none of 14 over TCP, the default. The peers are this test binary run
// again as helpers: disabled tests that only run when told where to connect.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <sys/prctl.h>
#include <sys/wait.h>

#include "tests/transport/transport_test_util.h"

namespace troupe::transport {
namespace {

using namespace std::chrono_literals;

constexpr const char* kHubPortEnv = "TROUPE_TEST_HUB_PORT";

// The helper: connects to the hub named by the environment and takes whatever comes until it is
// killed (at most 60 s). Skipped when run without the environment (it is disabled anyway).
TEST(TransportPeerHelper, DISABLED_ReceiveUntilKilled) {
  const char* port = std::getenv(kHubPortEnv);
  if (!port) GTEST_SKIP() << kHubPortEnv << " is not set: this runs only as a helper process";
  // Answers every message with 16 KiB (a rendezvous the hub receives from this process).
  const auto answer = pattern(16 << 10, 3);
  std::atomic<Transport*> self{nullptr};
  std::atomic<PeerId> hub{0};
  auto t = Transport::start(
      options("victim", "secret-token"),
      [&](Message&& m) {
        Transport* me = self.load();
        if (me && hub) (void)me->send(hub, copy_message(m.type, answer));
      },
      nullptr);
  ASSERT_TRUE(t) << t.error().message;
  self = t->get();
  auto p = (*t)->connect("127.0.0.1", static_cast<uint16_t>(std::atoi(port)), 10s);
  ASSERT_TRUE(p) << p.error().message;
  hub = *p;
  std::this_thread::sleep_for(60s);
}

// The other helper: streams small (eager) messages to the hub until killed.
TEST(TransportPeerHelper, DISABLED_StreamUntilKilled) {
  const char* port = std::getenv(kHubPortEnv);
  if (!port) GTEST_SKIP() << kHubPortEnv << " is not set: this runs only as a helper process";
  auto t = Transport::start(
      options("streamer", "secret-token"), [](Message&&) {}, nullptr);
  ASSERT_TRUE(t) << t.error().message;
  auto p = (*t)->connect("127.0.0.1", static_cast<uint16_t>(std::atoi(port)), 10s);
  ASSERT_TRUE(p) << p.error().message;
  const auto bytes = pattern(4 << 10, 4);
  // Faster than UCX takes them, so that its thread writes all the time, but never more than
  // 16384 messages (64 MiB) ahead, nor for more than 10 s.
  const auto end = std::chrono::steady_clock::now() + 10s;
  uint64_t posted = 0;
  auto ahead = [&]() -> uint64_t {  // posted, not yet handed to UCX
    const auto st = (*t)->stats();
    return st.links.empty() ? 0 : posted - std::min(posted, st.links[0].messages_sent);
  };
  for (int round = 0; std::chrono::steady_clock::now() < end; ++round) {
    for (int i = 0; i < 32; ++i)
      posted += static_cast<bool>((*t)->send(*p, copy_message(11, bytes)));
    std::this_thread::sleep_for(20us);
    while (round % 32 == 0 && ahead() > 16384 && std::chrono::steady_clock::now() < end)
      std::this_thread::sleep_for(1ms);
  }
}

// The third helper: streams 1 MiB messages, all the same bytes, to the hub by same-host pull
// (the hub reads them from this process's memory) until killed.
TEST(TransportPeerHelper, DISABLED_PullUntilKilled) {
  const char* port = std::getenv(kHubPortEnv);
  if (!port) GTEST_SKIP() << kHubPortEnv << " is not set: this runs only as a helper process";
  auto o = options("puller", "secret-token");
  o.same_host_pull = true;
  auto t = Transport::start(
      o, [](Message&&) {}, nullptr);
  ASSERT_TRUE(t) << t.error().message;
  auto p = (*t)->connect("127.0.0.1", static_cast<uint16_t>(std::atoi(port)), 10s);
  ASSERT_TRUE(p) << p.error().message;
  // At most 16 messages held (sent, not yet read by the hub), for at most 20 s.
  const auto bytes = std::make_shared<const std::vector<uint8_t>>(pattern(1 << 20, 12));
  auto held = std::make_shared<std::atomic<int>>(0);
  const auto end = std::chrono::steady_clock::now() + 20s;
  while (std::chrono::steady_clock::now() < end) {
    if (held->load() >= 16) {
      std::this_thread::sleep_for(100us);
      continue;
    }
    held->fetch_add(1);
    // The bytes are the same for every message; each message's keep-alive counts itself out.
    std::shared_ptr<const void> token(new int(0), [held, bytes](const int* p) {
      held->fetch_sub(1);
      delete p;
    });
    OutMessage m;
    m.type = 12;
    m.parts = {{bytes->data(), bytes->size()}};
    m.keep_alive = std::move(token);
    if (!(*t)->send(*p, std::move(m))) break;
  }
}

pid_t spawn_helper(uint16_t hub_port, const char* which = "ReceiveUntilKilled") {
  std::string env = std::string(kHubPortEnv) + "=" + std::to_string(hub_port);
  std::string exe = "/proc/self/exe",
              filter = std::string("--gtest_filter=TransportPeerHelper.DISABLED_") + which,
              disabled = "--gtest_also_run_disabled_tests";
  std::vector<char*> argv = {exe.data(), filter.data(), disabled.data(), nullptr};
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);                // never outlive the test
    const int null = ::open("/dev/null", O_WRONLY);  // its gtest report is of no interest
    if (null >= 0) {
      dup2(null, 1);
      dup2(null, 2);
    }
    putenv(env.data());
    execv("/proc/self/exe", argv.data());
    _exit(127);
  }
  return pid;
}

// Waits for the next peer to come up at `in` after `ups_before` of them; its id, or 0.
PeerId wait_new_peer(Inbox& in, size_t ups_before) {
  PeerId id = 0;
  std::unique_lock<std::mutex> lk(in.mu);
  in.cv.wait_for(lk, 30s, [&] {
    size_t n = 0;
    for (auto& ev : in.events)
      if (std::get<1>(ev) == PeerEvent::kUp && ++n > ups_before) id = std::get<0>(ev);
    return id != 0;
  });
  return id;
}

size_t ups(Inbox& in) {
  std::lock_guard<std::mutex> lk(in.mu);
  size_t n = 0;
  for (auto& ev : in.events) n += std::get<1>(ev) == PeerEvent::kUp;
  return n;
}

// A hub (listening) and a watcher connected to it, both in this process; the helper processes
// connect to the hub.
struct HubAndWatcher {
  Inbox hub_in, watcher_in;
  std::unique_ptr<Transport> hub, watcher;
  PeerId hub_id = 0, watcher_id = 0;  // each as the other sees it
  size_t pings = 0;

  void start(bool hub_pulls = false) {
    auto ho = options("hub");
    ho.same_host_pull = hub_pulls;
    auto h = Transport::start(ho, hub_in.handler(), hub_in.peer_handler());
    ASSERT_TRUE(h) << h.error().message;
    hub = std::move(*h);
    auto wo = options("watcher");
    wo.listen_host = "";
    auto w = Transport::start(wo, watcher_in.handler(), watcher_in.peer_handler());
    ASSERT_TRUE(w) << w.error().message;
    watcher = std::move(*w);
    auto id = watcher->connect("127.0.0.1", hub->port(), 10s);
    ASSERT_TRUE(id) << id.error().message;
    hub_id = *id;
    watcher_id = wait_new_peer(hub_in, 0);
    ASSERT_NE(watcher_id, 0u);
  }
  // Messages the hub received from `peer` (hub_in.mu held).
  size_t from(PeerId peer) const {
    size_t n = 0;
    for (const auto& m : hub_in.msgs) n += m.peer == peer;
    return n;
  }
  // Starts helper `which` (a streamer) and waits until the hub has `n` messages from it.
  void start_streamer(const char* which, size_t n, pid_t* child, PeerId* victim) {
    const size_t before = ups(hub_in);
    *child = spawn_helper(hub->port(), which);
    ASSERT_GT(*child, 0);
    *victim = wait_new_peer(hub_in, before);
    ASSERT_NE(*victim, 0u) << "the helper process did not connect";
    std::unique_lock<std::mutex> lk(hub_in.mu);
    ASSERT_TRUE(hub_in.cv.wait_for(lk, 10s, [&] { return from(*victim) >= n; }))
        << "the helper sent nothing";
  }
  // The streamers' messages add up: the next round starts from empty inboxes.
  void clear_inboxes() {
    std::scoped_lock lk(hub_in.mu, watcher_in.mu);
    hub_in.msgs.clear();
    watcher_in.msgs.clear();
    pings = 0;
  }
  // One message watcher -> hub and one back, each within 10 s.
  void ping(const std::string& after) {
    ASSERT_TRUE(watcher->send(hub_id, copy_message(9, pattern(64, 1))));
    ++pings;
    {
      std::unique_lock<std::mutex> lk(hub_in.mu);
      ASSERT_TRUE(hub_in.cv.wait_for(lk, 10s, [&] { return from(watcher_id) >= pings; }))
          << "the hub stopped receiving after " << after;
    }
    ASSERT_TRUE(hub->send(watcher_id, copy_message(10, pattern(64, 2))));
    ASSERT_TRUE(watcher_in.wait_messages(pings, 10s)) << "the hub stopped sending after " << after;
  }
};

// The hub streams messages (16 KiB and 1 MiB: rendezvous, several in flight) to two helper
// processes; one is frozen (SIGSTOP, as a stalled host), the other killed mid-transfer, then the
// frozen one killed too. After each, a third transport in this process must still reach the hub
// both ways. Repeated, since a death has to land while sends are in flight.
TEST(TransportProcesses, PeersKilledMidTransferLeaveOtherLinksWorking) {
  HubAndWatcher t;
  ASSERT_NO_FATAL_FAILURE(t.start());
  auto& hub_in = t.hub_in;
  const auto big = pattern(1 << 20, 7), mid = pattern(16 << 10, 8);
  for (int round = 0; round < 4; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    pid_t child[2];
    PeerId id[2];
    for (int k = 0; k < 2; ++k) {
      const size_t before = ups(hub_in);
      child[k] = spawn_helper(t.hub->port());
      ASSERT_GT(child[k], 0);
      id[k] = wait_new_peer(hub_in, before);
      ASSERT_NE(id[k], 0u) << "helper process " << k << " did not connect";
    }
    // The hub's handler holds the first answer while more answers (rendezvous) queue up, so
    // that the hub starts receiving some of them only after their sender is dead.
    auto arrived = std::make_shared<std::promise<void>>();
    auto first = arrived->get_future();
    std::promise<void> release;
    hub_in.release = release.get_future().share();
    hub_in.first_arrived = arrived;
    for (int i = 0; i < 64; ++i)
      for (int k = 0; k < 2; ++k) {
        (void)t.hub->send(id[k], copy_message(5, mid));
        if (i % 8 == 0) (void)t.hub->send(id[k], copy_message(6, big));
      }
    ASSERT_EQ(first.wait_for(10s), std::future_status::ready) << "no answer from the helpers";
    std::this_thread::sleep_for(std::chrono::milliseconds(20 + 10 * (round % 3)));
    ::kill(child[0], SIGSTOP);
    ::kill(child[1], SIGKILL);
    ::waitpid(child[1], nullptr, 0);
    release.set_value();
    ASSERT_NO_FATAL_FAILURE(t.ping("a peer died with sends in flight"));
    ::kill(child[0], SIGKILL);
    ::waitpid(child[0], nullptr, 0);
    ASSERT_NO_FATAL_FAILURE(t.ping("a frozen peer was killed"));
    // Both deaths are reported as the links going down (UCX error handling, error mode auto).
    std::unique_lock<std::mutex> lk(hub_in.mu);
    EXPECT_TRUE(hub_in.cv.wait_for(lk, 30s, [&] {
      int down = 0;
      for (auto& ev : hub_in.events)
        down += std::get<1>(ev) == PeerEvent::kDown &&
                (std::get<0>(ev) == id[0] || std::get<0>(ev) == id[1]);
      return down == 2;
    })) << "a killed peer was not reported down";
  }
}

// A peer killed while it streams small messages to the hub (so it may die in the middle of
// writing one into the hub's receive queue): the hub must still receive from its other links.
TEST(TransportProcesses, PeerKilledWhileSendingToUsLeavesOtherLinksWorking) {
  HubAndWatcher t;
  ASSERT_NO_FATAL_FAILURE(t.start());
  for (int round = 0; round < 60; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    pid_t child = 0;
    PeerId victim = 0;  // (unused here: the hub only has to survive it)
    ASSERT_NO_FATAL_FAILURE(t.start_streamer("StreamUntilKilled", 100, &child, &victim));
    std::this_thread::sleep_for(std::chrono::milliseconds(1 + round % 7));
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
    ASSERT_NO_FATAL_FAILURE(t.ping("a peer died while sending to it"));
    t.clear_inboxes();
  }
}

// A peer killed while the hub reads messages out of its memory (same-host pulls): every
// message the hub delivers from it is whole and right (a pull the sender gave up, or whose
// memory went with it, is dropped, never delivered half-read), and the hub's other links work.
TEST(TransportProcesses, PeerKilledWhileWeReadItsMemoryLeavesOtherLinksWorking) {
  HubAndWatcher t;
  ASSERT_NO_FATAL_FAILURE(t.start(/*hub_pulls=*/true));
  auto& hub_in = t.hub_in;
  const auto want = pattern(1 << 20, 12);
  uint64_t pulled = 0;
  for (int round = 0; round < 12; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    pid_t child = 0;
    PeerId victim = 0;
    ASSERT_NO_FATAL_FAILURE(t.start_streamer("PullUntilKilled", 4, &child, &victim));
    std::this_thread::sleep_for(std::chrono::microseconds(300 * (round % 5)));
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
    ASSERT_NO_FATAL_FAILURE(t.ping("a peer died while we read its memory"));
    for (const auto& l : t.hub->stats().links)
      if (l.peer == victim) pulled += l.pulled;
    {
      std::lock_guard<std::mutex> lk(hub_in.mu);
      for (const auto& m : hub_in.msgs)
        if (m.peer == victim) {
          ASSERT_EQ(m.type, 12u);
          ASSERT_TRUE(std::ranges::equal(m.data(), want)) << "a message arrived damaged";
        }
    }
    t.clear_inboxes();
  }
  EXPECT_GT(pulled, 0u) << "the messages did not go by pull";
}

}  // namespace
}  // namespace troupe::transport
