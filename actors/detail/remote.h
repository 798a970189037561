// Remote proxies: local stand-ins for actors on other nodes. A stage, the scheduler or an expert
// shard placed elsewhere is represented here by an actor that takes the same in-process messages
// (messages.h) and sends their wire form (wire.h) over the Link. Private to actors/.
//   remote stage      (step, StepBatchPtr, HiddenPtr, double)  -> BatchDescriptor
//   remote scheduler  (done, StepOutcomePtr)                    -> StepResult
//   remote shards     (expert, ExpertRequestPtr)                -> ExpertDispatch; the node daemon
//                     hands it each ExpertCombine of its node as (combine, MessagePtr) and the
//                     proxy completes the waiting request (or fails every pending one on (down)).
// The proxies run on CAF's shared workers; encoding references the tensors in place.
#pragma once

#include <memory>
#include <string>

#include <caf/fwd.hpp>

#include "actors/detail/link.h"

namespace troupe::actors::detail {

caf::actor spawn_remote_stage(caf::actor_system& sys, std::shared_ptr<Link> link, std::string node,
                              uint32_t stage, int64_t n_embd, caf::actor scheduler);
caf::actor spawn_remote_scheduler(caf::actor_system& sys, std::shared_ptr<Link> link,
                                  std::string head, int64_t n_vocab);
/// One proxy for every expert shard hosted on `node`.
caf::actor spawn_remote_shards(caf::actor_system& sys, std::shared_ptr<Link> link, std::string node,
                               int64_t n_embd);

}  // namespace troupe::actors::detail
