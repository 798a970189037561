// Scheduler actor factory (see actors/scheduler.cc). Its interface, SchedulerActor, and every
// message it takes are in actors/interfaces.h: submit, cancel, done (a step's outcome), stage (the
// first stage), reset, deadline, fail, crash, and the stats and kv queries. Token events go to
// each request's submitter as (token, TokenEventPtr) (SchedulerClientActor).
#pragma once

#include <caf/fwd.hpp>

#include "actors/detail/actor_configs.h"
#include "actors/interfaces.h"

namespace troupe::actors {

/// first_stage may be null and sent later as (stage, StageInputActor); no step is sent before it
/// is known.
SchedulerActor spawn_scheduler(caf::actor_system& sys, const SchedulerActorConfig& cfg,
                               StageInputActor first_stage);

}  // namespace troupe::actors
