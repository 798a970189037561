// Scheduler actor factory (see actors/scheduler.cc). Messages:
//   (submit, SeqRequestPtr, actor reply_to)  queue a request; token events go to reply_to as
//                                            (token, TokenEventPtr). The scheduler monitors
//                                            reply_to: when it terminates, its requests are
//                                            cancelled and their KV blocks freed
//   (cancel, int64 seq_id)                   stop a request; its KV blocks are freed
//   (done, StepOutcomePtr)                   a step came back from the last stage
//   (stage, actor first_stage)               the first stage was replaced
//   (reset)                                  a stage lost its KV: recompute every running sequence
//   (crash)                                  fault injection: throw while handling the next
//                                            submit, cancel, done, stage or reset
//   (stats) -> std::string                   a one-line summary (JSON)
//   (kv) -> compute::KvStats                 the logical KV pool (every stage's pool mirrors it)
#pragma once

#include <caf/fwd.hpp>

#include "actors/detail/actor_configs.h"

namespace troupe::actors {

/// first_stage may be null and sent later as (stage, actor); no step is sent before it is known.
caf::actor spawn_scheduler(caf::actor_system& sys, const SchedulerActorConfig& cfg,
                           caf::actor first_stage);

}  // namespace troupe::actors
