// Expert-shard actor factory (see actors/expert_shard.cc). Its interface, ExpertShardActor, and
// its messages (expert, crash) are in actors/interfaces.h.
#pragma once

#include <caf/fwd.hpp>

#include "actors/detail/actor_configs.h"
#include "actors/interfaces.h"

namespace troupe::actors {

ExpertShardActor spawn_expert_shard(caf::actor_system& sys, const ExpertShardConfig& cfg);

}  // namespace troupe::actors
