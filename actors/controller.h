// Controller actor (see actors/controller.cc): builds nothing itself; it is handed the actors a
// plan produced, monitors them, and restarts a failed stage or expert shard in place. Messages:
//   (crash, string "stage/N" | "expert/N")  fault injection: forward `crash` to that actor
//   (stats) -> string                        restarts per actor, as JSON
#pragma once

#include <vector>

#include <caf/fwd.hpp>

#include "actors/detail/actor_configs.h"

namespace troupe::actors {

struct ControllerConfig {
  std::vector<StageConfig> stages;
  std::vector<ExpertShardConfig> shards;
  std::vector<int32_t> expert_owner;  // [n_expert] -> shard index; empty when no shards
  std::vector<caf::actor> stage_actors;
  std::vector<caf::actor> shard_actors;
  caf::actor scheduler;
  caf::actor router;
};

caf::actor spawn_controller(caf::actor_system& sys, ControllerConfig cfg);

}  // namespace troupe::actors
