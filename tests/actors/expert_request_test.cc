// Expert requests are answered exactly once, and one that its receiver drops unanswered (a shard
// that stopped with it in its mailbox, or was already gone) fails at once: the stage waiting on it
// must not wait out its expert timeout, and a node must not be kept from exiting by that wait.
#include <chrono>
#include <memory>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <caf/typed_event_based_actor.hpp>
#include <gtest/gtest.h>

#include "actors/detail/messages.h"
#include "actors/interfaces.h"

namespace troupe::actors {
namespace {

using namespace std::chrono_literals;

// A shard that answers its first request (y = 2x) and then stops, leaving the rest unanswered.
ExpertShardActor::behavior_type answer_once_then_stop(ExpertShardActor::pointer self) {
  return {
      [=](expert_atom, const ExpertRequestPtr& r) {
        for (size_t i = 0; i < r->x.size(); ++i) r->y[i] = 2 * r->x[i];
        answer_request(*r);
        self->quit();
      },
      [](crash_atom) {},
  };
}

ExpertRequestPtr make_request(std::shared_ptr<Latch> latch, float value) {
  auto r = std::make_shared<ExpertRequest>();
  r->experts = {0};
  r->rows = {1};
  r->x.assign(4, value);
  r->y.assign(4, 0.0f);
  r->done = std::move(latch);
  return r;
}

TEST(ExpertRequest, ADroppedRequestFailsAtOnceAndAnAnsweredOneKeepsItsAnswer) {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  auto shard = sys.spawn(answer_once_then_stop);
  auto latch = std::make_shared<Latch>(3);
  auto first = make_request(latch, 1.5f);
  auto second = make_request(latch, 2.5f);  // dropped in the stopped shard's mailbox
  auto third = make_request(latch, 3.5f);   // sent after it stopped
  caf::anon_send(shard, expert_atom::value, guard_request(first, "first was dropped"));
  caf::anon_send(shard, expert_atom::value, guard_request(second, "second was dropped"));
  {
    caf::scoped_actor self{sys};
    self->wait_for(shard);
  }
  caf::anon_send(shard, expert_atom::value, guard_request(third, "third was dropped"));
  // Generous bound only so that a broken guard fails the test instead of hanging it.
  ASSERT_TRUE(latch->wait_for(60s)) << "a dropped request was never answered";
  EXPECT_EQ(first->error, "");
  EXPECT_EQ(first->y[3], 3.0f);
  EXPECT_EQ(second->error, "second was dropped");
  EXPECT_EQ(third->error, "third was dropped");
}

TEST(ExpertRequest, OnlyTheFirstAnswerCounts) {
  auto latch = std::make_shared<Latch>(2);
  auto r = make_request(latch, 1.0f);
  answer_request(*r);
  fail_request(*r, "late failure");  // e.g. a proxy's link went down after the answer
  answer_request(*r);
  EXPECT_EQ(r->error, "");
  EXPECT_FALSE(latch->wait_for(0ms)) << "one request counted the latch down more than once";
  auto other = make_request(latch, 1.0f);
  fail_request(*other, "link down");
  fail_request(*other, "second reason");
  EXPECT_EQ(other->error, "link down");
  EXPECT_TRUE(latch->wait_for(0ms));
}

}  // namespace
}  // namespace troupe::actors
