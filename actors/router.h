// Router actor factory (see actors/router.cc). Its interface, RouterActor, and every message it
// takes are in actors/interfaces.h: submit (with or without a resume state), cancel, token events
// from the scheduler, sched (the scheduler was replaced) and crash. The client of a request gets
// (token, tag, StreamPiecePtr) while it streams and (finish, tag, GenerateResultPtr) at the end
// (RouterClientActor).
#pragma once

#include <cstdint>
#include <memory>

#include <caf/fwd.hpp>

#include "actors/interfaces.h"
#include "model/model.h"

namespace troupe::actors {

/// first_seq_id: the router numbers its sequences from here. A replacement router starts above
/// every id its predecessor could have used, since the scheduler may still hold (and is
/// cancelling) the old router's sequences. encoder: lays out the prompts of requests with image
/// files (actors/encoder.h); null refuses them with an error result.
RouterActor spawn_router(caf::actor_system& sys, std::shared_ptr<const model::Model> model,
                         SchedulerActor scheduler, int64_t first_seq_id, EncoderActor encoder = {});

}  // namespace troupe::actors
