// In-process messages of the node daemon (private to actors/): frames from the transport handed
// to actors, and the daemon's own timers and notices.
#pragma once

#include <memory>

#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/atom.hpp>

#include "transport/transport.h"

namespace troupe::actors {

using wire_atom = caf::atom_constant<caf::atom("wire")>;          // (wire, MessagePtr)
using peer_atom = caf::atom_constant<caf::atom("peer")>;          // (peer, id, up, name, reason)
using combine_atom = caf::atom_constant<caf::atom("combine")>;    // (combine, MessagePtr)
using linkdown_atom = caf::atom_constant<caf::atom("linkdown")>;  // (linkdown): fail pending
using tick_atom = caf::atom_constant<caf::atom("tick")>;          // heartbeat / lease timer
using joined_atom = caf::atom_constant<caf::atom("joined")>;      // head link connected (or not)
using placed_atom = caf::atom_constant<caf::atom("placed")>;      // placement set-up finished
using leave_atom = caf::atom_constant<caf::atom("leave")>;        // orderly leave
using status_atom = caf::atom_constant<caf::atom("status")>;      // -> JSON

using MessagePtr = std::shared_ptr<const transport::Message>;

}  // namespace troupe::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::MessagePtr)
