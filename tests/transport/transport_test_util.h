// Test helpers of the transport tests: an Inbox that collects what a transport receives, and a
// Pair of transports in this process (each with its own worker and progress thread) connected
// over loopback. Users: tests/transport/*_test.cc.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "transport/transport.h"

namespace troupe::transport {

// Collects what a transport receives; waits with a deadline (no sleeps as assertions).
struct Inbox {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Message> msgs;
  std::vector<std::tuple<PeerId, PeerEvent, std::string, std::string>> events;
  size_t msgs_at_down = SIZE_MAX;  // messages delivered when the first kDown came
  // When set, the handler (the transport's progress thread) stops at the first message: it
  // fulfils `first_arrived` and waits for `release` before taking the message.
  std::shared_ptr<std::promise<void>> first_arrived;
  std::shared_future<void> release;

  MessageHandler handler() {
    return [this](Message&& m) {
      if (first_arrived) {
        first_arrived->set_value();
        first_arrived.reset();
        release.wait();
      }
      std::lock_guard<std::mutex> lk(mu);
      msgs.push_back(std::move(m));
      cv.notify_all();
    };
  }
  PeerHandler peer_handler() {
    return [this](PeerId p, PeerEvent e, const std::string& name, const std::string& why) {
      std::lock_guard<std::mutex> lk(mu);
      events.emplace_back(p, e, name, why);
      if (e == PeerEvent::kDown && msgs_at_down == SIZE_MAX) msgs_at_down = msgs.size();
      cv.notify_all();
    };
  }
  bool wait_messages(size_t n, std::chrono::milliseconds t = std::chrono::seconds(10)) {
    std::unique_lock<std::mutex> lk(mu);
    return cv.wait_for(lk, t, [&] { return msgs.size() >= n; });
  }
  bool wait_event(PeerEvent e, std::chrono::milliseconds t = std::chrono::seconds(10)) {
    std::unique_lock<std::mutex> lk(mu);
    return cv.wait_for(lk, t, [&] {
      for (auto& ev : events)
        if (std::get<1>(ev) == e) return true;
      return false;
    });
  }
  size_t count() {
    std::lock_guard<std::mutex> lk(mu);
    return msgs.size();
  }
};

inline TransportOptions options(const std::string& name,
                                const std::string& token = "secret-token") {
  TransportOptions o;
  o.node_name = name;
  o.cluster_token = token;
  o.listen_host = "127.0.0.1";
  o.net_devices = "lo";  // keep UCX off the other interfaces (DEPENDENCIES.md §4)
  // These tests are about the endpoint's own paths (eager, rendezvous fragments, trailers),
  // which two transports of one process would otherwise skip for large messages: same-host
  // pulls are tested with it on (pull_test.cc).
  o.same_host_pull = false;
  return o;
}

inline std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

struct Pair {
  Inbox a_in, b_in;
  std::unique_ptr<Transport> a, b;
  PeerId b_from_a = 0;  // b as seen by a

  void start(TransportOptions ao = options("node-a"), TransportOptions bo = options("node-b")) {
    auto rb = Transport::start(bo, b_in.handler(), b_in.peer_handler());
    ASSERT_TRUE(rb) << rb.error().message;
    b = std::move(*rb);
    ao.listen_host = "";  // a only connects
    auto ra = Transport::start(ao, a_in.handler(), a_in.peer_handler());
    ASSERT_TRUE(ra) << ra.error().message;
    a = std::move(*ra);
    auto p = a->connect("127.0.0.1", b->port(), std::chrono::seconds(10));
    ASSERT_TRUE(p) << p.error().message;
    b_from_a = *p;
    ASSERT_TRUE(b_in.wait_event(PeerEvent::kUp));
  }
};

}  // namespace troupe::transport
