// Controller actor (see actors/controller.cc): builds nothing itself at start; it is handed the
// actors a plan produced, monitors them, and restarts a failed stage, expert shard, scheduler or
// router in place. Messages:
//   (crash, string "stage/N" | "expert/N" | "scheduler" | "router") -> bool
//                                fault injection: forward `crash` to that actor; false if no such
//   (router, actor_addr failed) -> actor
//                                the current router, for a client. A client that saw `failed` (its
//                                router) terminate passes its address: if the controller has not
//                                replaced it yet it does so now. A null address only asks.
//   (actors) -> ActorHandles     the supervised actors as they are now (shutdown, stats)
//   (stats) -> string            restarts per actor, as JSON
#pragma once

#include <memory>
#include <vector>

#include <caf/fwd.hpp>

#include "actors/detail/actor_configs.h"
#include "model/model.h"

namespace troupe::actors {

struct ControllerConfig {
  std::vector<StageConfig> stages;
  std::vector<ExpertShardConfig> shards;
  std::vector<int32_t> expert_owner;  // [n_expert] -> shard index; empty when no shards
  SchedulerActorConfig scheduler_cfg;
  std::shared_ptr<const model::Model> model;  // for a replacement router
  std::vector<caf::actor> stage_actors;
  std::vector<caf::actor> shard_actors;
  caf::actor scheduler;
  caf::actor router;
};

caf::actor spawn_controller(caf::actor_system& sys, ControllerConfig cfg);

}  // namespace troupe::actors
