// Stage actor factory (see actors/stage.cc). Messages it handles:
//   (step, StepBatchPtr, HiddenPtr)  run the step; forward (step, batch, hidden) to `next`, or on
//                                    the last stage send (done, StepOutcomePtr) to `next`
//   (next, actor)                    rewire after a neighbour restarted
//   (shards, vector<actor>)          new expert-shard addresses after a shard restarted
//   (sched, actor)                   the scheduler was replaced: failed steps go to the new one
//                                    (the last stage's `next` is rewired with (next, actor))
//   (crash)                          fault injection: throw on the next step
#pragma once

#include <caf/fwd.hpp>

#include "actors/detail/actor_configs.h"

namespace troupe::actors {

/// Spawns a stage on its own thread. Throws (from the actor's init) when its engine cannot be
/// built; the actor then terminates with that error.
caf::actor spawn_stage(caf::actor_system& sys, const StageConfig& cfg, caf::actor next,
                       ExpertPlacement placement);

}  // namespace troupe::actors
