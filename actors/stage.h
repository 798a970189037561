// Stage actor factory (see actors/stage.cc). Its interface, StageActor, and every message it
// takes are in actors/interfaces.h: step, next (the next stage was replaced), sched (the
// scheduler was replaced), shards (an expert shard was replaced), crash and the stats query. It
// forwards (step, ...) to the next stage; the last stage, and any stage whose step failed, sends
// (done, StepOutcomePtr) to cfg.scheduler.
#pragma once

#include <caf/fwd.hpp>

#include "actors/detail/actor_configs.h"
#include "actors/interfaces.h"

namespace troupe::actors {

/// Spawns a stage on its own thread. `next` is the next stage, null for the last one. Throws
/// (from the actor's init) when its engine cannot be built; the actor then terminates with that
/// error.
StageActor spawn_stage(caf::actor_system& sys, const StageConfig& cfg, StageInputActor next,
                       ExpertPlacement placement);

}  // namespace troupe::actors
