// Controller actor (see actors/controller.cc): builds nothing itself at start; it is handed the
// actors a plan produced, monitors them, and restarts a failed stage, expert shard, scheduler or
// router in place. Its interface, ControllerActor, and every message it takes are in
// actors/interfaces.h: crash (fault injection by name), router (the current router, replacing a
// failed one), actors (the supervised handles) and stats (restarts per actor).
#pragma once

#include <memory>
#include <vector>

#include <caf/fwd.hpp>

#include "actors/detail/actor_configs.h"
#include "actors/interfaces.h"
#include "model/model.h"

namespace troupe::actors {

struct ControllerConfig {
  std::vector<StageConfig> stages;
  std::vector<ExpertShardConfig> shards;
  std::vector<int32_t> expert_owner;  // [n_expert] -> shard index; empty when no shards
  SchedulerActorConfig scheduler_cfg;
  std::shared_ptr<const model::Model> model;  // for a replacement router
  std::vector<StageActor> stage_actors;
  std::vector<ExpertShardActor> shard_actors;
  SchedulerActor scheduler;
  RouterActor router;
  EncoderActor encoder;  // for a replacement router; may be null
};

ControllerActor spawn_controller(caf::actor_system& sys, ControllerConfig cfg);

}  // namespace troupe::actors
