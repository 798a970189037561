// Expert-shard actor factory (see actors/expert_shard.cc). Messages:
//   (expert, ExpertRequestPtr)  compute the request's rows for experts this shard owns, fill y,
//                               count down the request's latch (also when it fails)
//   (crash)                     fault injection: throw while computing the next request
#pragma once

#include <caf/fwd.hpp>

#include "actors/detail/actor_configs.h"

namespace troupe::actors {

caf::actor spawn_expert_shard(caf::actor_system& sys, const ExpertShardConfig& cfg);

}  // namespace troupe::actors
