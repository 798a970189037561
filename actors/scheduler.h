// Scheduler actor factory (see actors/scheduler.cc). Messages:
//   (submit, SeqRequestPtr, actor reply_to)  queue a request; token events go to reply_to as
//                                            (token, TokenEventPtr)
//   (cancel, int64 seq_id)                   stop a request; its KV blocks are freed
//   (done, StepOutcomePtr)                   a step came back from the last stage
//   (stage, actor first_stage)               the first stage was replaced
//   (reset)                                  a stage lost its KV: recompute every running sequence
//   (stats) -> std::string                   a one-line summary (JSON)
#pragma once

#include <caf/fwd.hpp>

#include "actors/plan.h"

namespace troupe::actors {

caf::actor spawn_scheduler(caf::actor_system& sys, const SchedulerConfig& cfg, int64_t kv_blocks,
                           int64_t kv_block_size, int64_t n_vocab);

}  // namespace troupe::actors
