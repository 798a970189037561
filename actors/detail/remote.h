// Remote proxies: local stand-ins for actors on other nodes. A stage, the scheduler or an expert
// shard placed elsewhere is represented here by an actor of the same interface (interfaces.h),
// so the rest of the node holds one handle type; it sends the messages' wire form (wire.h) over
// the Link. Private to actors/.
//   remote stage      StageActor:     (step, StepBatchPtr, HiddenPtr, double) -> BatchDescriptor;
//                                     a step that cannot be sent fails at `scheduler`
//   remote scheduler  SchedulerActor: (done, StepOutcomePtr) -> StepResult
//   remote shards     RemoteShardsActor (an ExpertShardActor): (expert, ExpertRequestPtr) ->
//                     ExpertDispatch; the node daemon hands it each ExpertCombine of its node as
//                     (combine, MessagePtr) and the proxy completes the waiting request (or fails
//                     every pending one on (linkdown)).
//   remote image      RemoteImageActor (an ImageWorkerActor): (image, ImageJobPtr) ->
//                     EncodeImage; the node daemon hands it each EncodedImage of its node as
//                     (combine, MessagePtr) and the proxy answers the waiting job (or every
//                     pending one, retryable, on (linkdown)).
// The interfaces' other messages never reach a proxy (the node wires, supervises and queries
// only its local actors; the actor a proxy stands for is looked after on its own node): a proxy
// logs and drops them, and answers a request with sec::unexpected_message, as CAF's default
// handler did for the untyped proxies.
// The proxies run on CAF's shared workers; encoding references the tensors in place.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <caf/fwd.hpp>

#include "actors/detail/link.h"
#include "actors/detail/node_messages.h"
#include "actors/interfaces.h"

namespace troupe::actors::detail {

StageActor spawn_remote_stage(caf::actor_system& sys, std::shared_ptr<Link> link, std::string node,
                              uint32_t stage, int64_t n_embd, SchedulerActor scheduler);
SchedulerActor spawn_remote_scheduler(caf::actor_system& sys, std::shared_ptr<Link> link,
                                      std::string head, int64_t n_vocab);
/// One proxy for every expert shard hosted on `node`.
RemoteShardsActor spawn_remote_shards(caf::actor_system& sys, std::shared_ptr<Link> link,
                                      std::string node, int64_t n_embd);

/// The proxy of encoder instance `index` on `node`; answers carry rows f32 [n_rows, n_embd]. A
/// job its node says nothing of for `silence` (no receipt, none repeated, no answer) is lost and
/// answered "retry".
RemoteImageActor spawn_remote_image(caf::actor_system& sys, std::shared_ptr<Link> link,
                                    std::string node, uint32_t index, int64_t n_rows,
                                    int64_t n_embd, std::chrono::milliseconds silence);

}  // namespace troupe::actors::detail
