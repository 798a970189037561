// Router actor factory (see actors/router.cc). Messages:
//   (submit, GenerateRequestPtr, int64 tag)  from a client: tokenize, open the token log, queue
//                                            with the scheduler; the client then receives
//                                            (token, int64 tag, StreamPiecePtr) while it streams
//                                            and (finish, int64 tag, GenerateResultPtr)
//   (submit, GenerateRequestPtr, int64 tag, ResumeStatePtr)
//                                            as above, for a request whose router failed: the
//                                            pieces the client saw are not streamed again
//   (cancel, int64 tag)                      from the same client: stop that request
//   (token, TokenEventPtr)                   from the scheduler (events of any other sender are
//                                            dropped: they come from a replaced scheduler)
//   (sched, actor)                           the scheduler was replaced: resubmit every request in
//                                            flight from its token log and sampler state
//   (crash)                                  fault injection: throw while handling the next
//                                            submit, cancel or token
#pragma once

#include <cstdint>
#include <memory>

#include <caf/fwd.hpp>

#include "model/model.h"

namespace troupe::actors {

/// first_seq_id: the router numbers its sequences from here. A replacement router starts above
/// every id its predecessor could have used, since the scheduler may still hold (and is
/// cancelling) the old router's sequences.
caf::actor spawn_router(caf::actor_system& sys, std::shared_ptr<const model::Model> model,
                        caf::actor scheduler, int64_t first_seq_id);

}  // namespace troupe::actors
