// Router actor factory (see actors/router.cc). Messages:
//   (submit, GenerateRequestPtr, int64 tag)  from a client: tokenize, open the token log, queue
//                                            with the scheduler; the client then receives
//                                            (token, int64 tag, string delta, int32 token) while it
//                                            streams and (finish, int64 tag, GenerateResultPtr)
//   (cancel, int64 tag)                      from the same client: stop that request
//   (token, TokenEventPtr)                   from the scheduler
#pragma once

#include <memory>

#include <caf/fwd.hpp>

#include "model/model.h"

namespace troupe::actors {

caf::actor spawn_router(caf::actor_system& sys, std::shared_ptr<const model::Model> model,
                        caf::actor scheduler);

}  // namespace troupe::actors
