// In-process messages of the node daemon (private to actors/): frames from the transport handed
// to actors, the daemon's own timers and notices, and the typed interfaces of its actors (the
// node actor, the head's client gateway, the remote expert-shard proxy). The engine's actors are
// in actors/interfaces.h.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/atom.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "actors/cluster_node.h"
#include "actors/interfaces.h"
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

/// A request from this process (ClusterNode::submit): id for cancel, request, callbacks.
struct LocalRequest {
  uint64_t id = 0;
  GenerateRequestPtr request;
  RequestCallbacks callbacks;
};
using LocalRequestPtr = std::shared_ptr<const LocalRequest>;

/// The stand-in for every expert shard of one other node (detail/remote.h): an ExpertShardActor
/// to the stages, plus what the node actor hands it:
///   (combine, MessagePtr)  an ExpertCombine frame from that node: completes its waiting request
///   (linkdown)             the link to that node went down: fail every pending request
using RemoteShardsActor = ExpertShardActor::extend<caf::reacts_to<combine_atom, MessagePtr>,
                                                   caf::reacts_to<linkdown_atom>>;

/// The stand-in for an image encoder instance on another node (detail/remote.h): an
/// ImageWorkerActor to the head's encoder front, plus what the node actor hands it:
///   (combine, MessagePtr)  an EncodedImage frame from that node: answers its waiting job
///   (linkdown)             the link to that node went down: every waiting job is to be retried
///   (deadline, uint64 job) its own timer: a job its node has said nothing of (no receipt, none
///                          repeated, no answer) for a lease is lost and to be retried
using RemoteImageActor = ImageWorkerActor::extend<caf::reacts_to<combine_atom, MessagePtr>,
                                                  caf::reacts_to<linkdown_atom>,
                                                  caf::reacts_to<deadline_atom, uint64_t>>;

/// The head's client gateway (node_head.cc): client requests that came over the transport, and
/// the router's answers (as RouterClientActor), sent back as GenerateEvent frames.
///   (submit, PeerId, uint64 tag, GenerateRequestPtr)  hand a client's request to the router
///   (cancel, PeerId, uint64 tag)                      stop that client's request
///   (linkdown, PeerId)                                the client is gone: cancel its requests
///   (submit, LocalRequestPtr)                         a request from this process
///   (cancel, uint64 id)                               stop that request
///   (drain) -> int64                                  the number of client requests in flight
/// When it stops, requests from this process still in flight end with an error.
using GatewayActor = RouterClientActor::extend<
    caf::reacts_to<submit_atom, transport::PeerId, uint64_t, GenerateRequestPtr>,
    caf::reacts_to<cancel_atom, transport::PeerId, uint64_t>,
    caf::reacts_to<submit_atom, LocalRequestPtr>, caf::reacts_to<cancel_atom, uint64_t>,
    caf::reacts_to<linkdown_atom, transport::PeerId>, caf::replies_to<drain_atom>::with<int64_t>>;

/// The node actor (cluster_node.cc; detail/node_state.h), which owns a node daemon's state:
///   (wire, MessagePtr)                       a frame from the transport's thread
///   (peer, uint64 id, bool up, string name, string reason)
///                                            a link came up or went down
///   (joined, uint64 head_peer, string error) the joiner thread reached the head (peer 0: failed)
///   (placed, uint64 version, string error, uint64 map_start_ms, uint64 map_ms, uint64 map_bytes)
///                                            the placement thread connected and mapped weights
///   (tick)                                   its own heartbeat (lease check on the head) timer
///   (token, int64, StreamPiecePtr), (finish, int64, GenerateResultPtr)
///                                            the head's warm-up generation (RouterClientActor)
///   (leave, string reason) -> bool           orderly leave: tell the head, stop local actors
///   (status) -> string                       the status snapshot as JSON
///   (crash, string "stage/N" | "expert/N") -> bool
///                                            fault injection on a local actor; false if no such
///   (drain) -> int64                         the head stops admitting; -> requests in flight
///   (submit, LocalRequestPtr)                a request from this process: to the gateway, or
///                                            refused at once when not serving
///   (cancel, uint64 id)                      stop that request
///   (stats) -> string                        the head's scheduler's counters (JSON); "{}"
///                                            elsewhere
using NodeActor = RouterClientActor::extend<
    caf::reacts_to<wire_atom, MessagePtr>,
    caf::reacts_to<peer_atom, uint64_t, bool, std::string, std::string>,
    caf::reacts_to<joined_atom, uint64_t, std::string>,
    caf::reacts_to<placed_atom, uint64_t, std::string, uint64_t, uint64_t, uint64_t>,
    caf::reacts_to<tick_atom>, caf::replies_to<leave_atom, std::string>::with<bool>,
    caf::replies_to<status_atom>::with<std::string>,
    caf::replies_to<crash_atom, std::string>::with<bool>,
    caf::replies_to<drain_atom>::with<int64_t>, caf::reacts_to<submit_atom, LocalRequestPtr>,
    caf::reacts_to<cancel_atom, uint64_t>, caf::replies_to<stats_atom>::with<std::string>>;

}  // namespace troupe::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::MessagePtr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::LocalRequestPtr)
