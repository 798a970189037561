// Re-placement after node loss (private to actors/; users: node_head.cc, tests): which surviving
// node takes each stage and expert shard of the nodes that are gone. A pure function of the old
// placement and the survivors, so the head can compute it at once and tests can pin it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>

#include "actors/detail/control_wire.h"
#include "base/result.h"

namespace troupe::actors::detail {

struct Survivor {
  uint64_t free_memory_bytes = 0;  // as the node last reported it (join, heartbeats)
};

/// The placement that follows `old` once only the nodes of `alive` remain (node id -> what it
/// reported). Actors on alive nodes stay where they are (their weights are resident); each actor
/// of a gone node moves to the alive node that hosts the fewest actors so far (ties: the lower
/// node id), provided the node reported enough free memory for the weights of everything moved
/// onto it (`actor_bytes(role, index)`; actors checked in stage, shard, then image encoder
/// order). KV pools
/// follow their stages. The version is old.version + 1. Errors: no node is alive, or no alive
/// node has room for an actor (the message names it, what it needs and the most free memory).
Result<PlacementMsg> replan(const PlacementMsg& old, const std::map<uint32_t, Survivor>& alive,
                            const std::function<uint64_t(ActorRole, uint32_t)>& actor_bytes);

}  // namespace troupe::actors::detail
