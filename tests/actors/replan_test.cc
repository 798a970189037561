// Re-placement after node loss: actors of gone nodes (stages, expert shards, image encoders) move
// to the least-loaded survivor with room, the others stay, KV pools follow their stages, and a
// lack of room is a clear error.
#include "actors/detail/replan.h"

#include <cstdint>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

namespace troupe::actors::detail {
namespace {

PlacementMsg three_nodes() {
  PlacementMsg pl;
  pl.version = 1;
  for (uint32_t i = 0; i < 3; ++i) {
    StagePlacementInfo s;
    s.stage = i;
    s.node_id = i + 1;  // stage 0 on node 1 (the head), 1 on node 2, 2 on node 3
    pl.stages.push_back(s);
    pl.kv_pools.push_back({i, i + 1, 64, 16});
  }
  for (uint32_t j = 0; j < 2; ++j) {
    ShardPlacementInfo sh;
    sh.shard = j;
    sh.node_id = j == 0 ? 2 : 3;
    sh.experts = {static_cast<int32_t>(2 * j), static_cast<int32_t>(2 * j + 1)};
    pl.shards.push_back(sh);
  }
  return pl;
}

TEST(Replan, ActorsOfAGoneNodeMoveToTheLeastLoadedSurvivor) {
  const PlacementMsg old = three_nodes();
  auto r = replan(old, {{1, {}}, {2, {}}}, nullptr);
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ(r->version, 2u);
  // Node 1 hosts 1 actor, node 2 hosts 2: stage 2 goes to node 1, then shard 1 (loads now 2/2)
  // to the lower id, node 1.
  EXPECT_EQ(r->stages[0].node_id, 1u);
  EXPECT_EQ(r->stages[1].node_id, 2u);
  EXPECT_EQ(r->stages[2].node_id, 1u);
  EXPECT_EQ(r->shards[0].node_id, 2u);
  EXPECT_EQ(r->shards[1].node_id, 1u);
  EXPECT_EQ(r->shards[1].experts, old.shards[1].experts);
  for (const auto& k : r->kv_pools) EXPECT_EQ(k.node_id, r->stages[k.stage].node_id);
}

TEST(Replan, NothingMovesWhenTheGoneNodeHostedNothing) {
  PlacementMsg old = three_nodes();
  auto r = replan(old, {{1, {}}, {2, {}}, {3, {}}, {4, {}}}, nullptr);
  ASSERT_TRUE(r.has_value());
  for (size_t i = 0; i < old.stages.size(); ++i)
    EXPECT_EQ(r->stages[i].node_id, old.stages[i].node_id);
}

TEST(Replan, RoomIsCheckedAgainstReportedFreeMemory) {
  const PlacementMsg old = three_nodes();
  auto bytes = [](ActorRole role, uint32_t) -> ActorMemory {
    return {role == ActorRole::kStage ? 600'000'000u : 100'000'000u};
  };
  // Node 1 (least loaded) has no room for a 600 MB stage; node 2 has.
  auto r = replan(old, {{1, {500'000'000}}, {2, {2'000'000'000}}}, bytes);
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ(r->stages[2].node_id, 2u);
  EXPECT_EQ(r->shards[1].node_id, 1u);  // 100 MB fits on node 1
  // Nobody has room: a clear error naming the actor and the sizes.
  auto bad = replan(old, {{1, {500'000'000}}, {2, {400'000'000}}}, bytes);
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message.find("stage 2 of node 3"), std::string::npos)
      << bad.error().message;
  EXPECT_NE(bad.error().message.find("600.0 MB"), std::string::npos) << bad.error().message;
}

TEST(Replan, AStagesKvPoolAndRecurrentStatesNeedRoomToo) {
  const PlacementMsg old = three_nodes();
  // A stage's 300 MB of weights fit on node 1 (the least loaded, 500 MB free); with its 150 MB
  // KV pool and 100 MB of recurrent states it does not, and goes to node 2.
  auto memory = [](ActorRole role, uint32_t) -> ActorMemory {
    if (role == ActorRole::kStage) return {300'000'000u, 150'000'000u, 100'000'000u};
    return {100'000'000u};
  };
  auto r = replan(old, {{1, {500'000'000}}, {2, {2'000'000'000}}}, memory);
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ(r->stages[2].node_id, 2u);
  EXPECT_EQ(r->kv_pools[2].node_id, 2u);
  EXPECT_EQ(r->shards[1].node_id, 1u);
  // No survivor has the stage's 550 MB: the error names each part.
  auto bad = replan(old, {{1, {500'000'000}}, {2, {540'000'000}}}, memory);
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message.find("no surviving node has room for stage 2 of node 3 (needs "
                                     "550.0 MB: 300.0 MB of weights, 150.0 MB of KV pool, 100.0 "
                                     "MB of recurrent states; the most free memory left is 540.0 "
                                     "MB)"),
            std::string::npos)
      << bad.error().message;
}

// three_nodes() with image encoders on node 3 (gone below), node 2 and node 3.
PlacementMsg with_encoders() {
  PlacementMsg pl = three_nodes();
  pl.encoders = {{0, 3, 2}, {1, 2, 0}, {2, 3, 4}};
  return pl;
}

TEST(Replan, EncodersOfAGoneNodeMoveToTheLeastLoadedSurvivor) {
  const PlacementMsg old = with_encoders();
  auto r = replan(old, {{1, {}}, {2, {}}}, nullptr);
  ASSERT_TRUE(r.has_value()) << r.error().message;
  // Loads before: node 1 has 1 actor (stage 0), node 2 has 3 (stage 1, shard 0, encoder 1).
  // Stage 2 and shard 1 go to node 1 (2, then 3 actors); encoder 0 ties 3/3 and takes the lower
  // id, node 1 (4); encoder 2 then goes to node 2 (4).
  EXPECT_EQ(r->stages[2].node_id, 1u);
  EXPECT_EQ(r->shards[1].node_id, 1u);
  ASSERT_EQ(r->encoders.size(), 3u);
  EXPECT_EQ(r->encoders[0], (EncoderPlacementInfo{0, 1, 2}));
  EXPECT_EQ(r->encoders[1], (EncoderPlacementInfo{1, 2, 0}));  // on a survivor: stays
  EXPECT_EQ(r->encoders[2], (EncoderPlacementInfo{2, 2, 4}));  // index and threads kept
}

TEST(Replan, EncodersOnSurvivorsStayAndCountAsLoad) {
  PlacementMsg old = three_nodes();
  // Three encoders on node 1 make it the busiest survivor (4 actors to node 2's 2): stage 2
  // and shard 1 go to node 2.
  old.encoders = {{0, 1, 0}, {1, 1, 0}, {2, 1, 0}};
  auto r = replan(old, {{1, {}}, {2, {}}}, nullptr);
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ(r->encoders, old.encoders);
  EXPECT_EQ(r->stages[2].node_id, 2u);
  EXPECT_EQ(r->shards[1].node_id, 2u);
  // Nothing gone: nothing moves.
  const PlacementMsg all = with_encoders();
  auto same = replan(all, {{1, {}}, {2, {}}, {3, {}}}, nullptr);
  ASSERT_TRUE(same.has_value()) << same.error().message;
  EXPECT_EQ(same->encoders, all.encoders);
}

TEST(Replan, EncoderRoomIsAskedForWithItsRoleAndIndex) {
  const PlacementMsg old = with_encoders();
  std::vector<std::pair<ActorRole, uint32_t>> asked;
  auto bytes = [&](ActorRole role, uint32_t index) -> ActorMemory {
    asked.push_back({role, index});
    return {role == ActorRole::kEncoder ? 300'000'000u : 100'000'000u};
  };
  // Node 1 (the least loaded) can take stage 2 and shard 1 (200 MB) but no 300 MB encoder.
  auto r = replan(old, {{1, {450'000'000}}, {2, {2'000'000'000}}}, bytes);
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ(r->stages[2].node_id, 1u);
  EXPECT_EQ(r->shards[1].node_id, 1u);
  EXPECT_EQ(r->encoders[0].node_id, 2u);
  EXPECT_EQ(r->encoders[2].node_id, 2u);
  const std::vector<std::pair<ActorRole, uint32_t>> expected = {{ActorRole::kStage, 2},
                                                                {ActorRole::kExpertShard, 1},
                                                                {ActorRole::kEncoder, 0},
                                                                {ActorRole::kEncoder, 2}};
  EXPECT_EQ(asked, expected);  // only the actors that move
}

TEST(Replan, NoRoomForAnEncoderIsAnErrorNamingIt) {
  const PlacementMsg old = with_encoders();
  auto bytes = [](ActorRole role, uint32_t) -> ActorMemory {
    return {role == ActorRole::kEncoder ? 700'000'000u : 100'000'000u};
  };
  auto bad = replan(old, {{1, {500'000'000}}, {2, {600'000'000}}}, bytes);
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message.find("image encoder 0 of node 3"), std::string::npos)
      << bad.error().message;
  EXPECT_NE(bad.error().message.find("700.0 MB"), std::string::npos) << bad.error().message;
}

TEST(Replan, NoSurvivorIsAnError) {
  auto r = replan(three_nodes(), {}, nullptr);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message.find("no node is left"), std::string::npos);
}

}  // namespace
}  // namespace troupe::actors::detail
