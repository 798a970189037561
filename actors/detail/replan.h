// Re-placement after node loss (private to actors/; users: node_head.cc, tests): which surviving
// node takes each stage and expert shard of the nodes that are gone. A pure function of the old
// placement and the survivors, so the head can compute it at once and tests can pin it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "actors/detail/control_wire.h"
#include "actors/plan.h"
#include "base/result.h"
#include "model/model_spec.h"

namespace troupe::actors::detail {

struct Survivor {
  uint64_t free_memory_bytes = 0;  // as the node last reported it (join, heartbeats)
};

/// The memory an actor takes on the node that hosts it.
struct ActorMemory {
  uint64_t weights = 0;
  uint64_t kv = 0;      // a CPU stage's KV pool, reserved whole when the stage starts
  uint64_t states = 0;  // a CPU stage's recurrent state slots (linear-attention layers)
  uint64_t total() const { return weights + kv + states; }
};

/// What stage `index` of placement pl keeps on its node beside its weights (weights 0 here): on
/// a CPU stage, its KV pool (pl's pool of the stage, in plan.kv_type, reserved whole when the
/// stage starts) and `state_slots` recurrent states of its linear-attention layers. A GPU stage
/// keeps both on its device: nothing.
ActorMemory stage_pools_memory(const model::ModelSpec& spec, const Plan& plan,
                               const PlacementMsg& pl, uint32_t index, int64_t state_slots);

/// Calls f(role, index, node id) for every stage, expert shard and image encoder of pl, in that
/// order.
void for_each_placed_actor(const PlacementMsg& pl,
                           const std::function<void(ActorRole, uint32_t, uint32_t)>& f);

/// The first placement of a resolved multi-host plan (resolve_plan, resolve_placement): every
/// stage (with its KV pool), expert shard and image encoder on the node the plan names, whose id
/// `node_id(name)` gives. Version 1; the header's epoch and the model hash are the caller's.
PlacementMsg initial_placement(const Plan& p,
                               const std::function<uint32_t(const std::string&)>& node_id);

/// Checks that what pl places on each node with a memory_limit_mb fits under it (the sum of
/// `actor_memory` over its actors). The error (PlanErrc::kInvalid) names the plan, the node, the
/// sum and the limit, and each actor with its parts.
Status check_memory_limits(const Plan& plan, const PlacementMsg& pl,
                           const std::function<uint32_t(const std::string&)>& node_id,
                           const std::function<ActorMemory(ActorRole, uint32_t)>& actor_memory);

/// The placement that follows `old` once only the nodes of `alive` remain (node id -> what it
/// reported). Actors on alive nodes stay where they are (their weights are resident); each actor
/// of a gone node moves to the alive node that hosts the fewest actors so far (ties: the lower
/// node id), provided the node reported enough free memory for everything moved onto it
/// (`actor_memory(role, index)`: weights, and a stage's KV pool and recurrent states; actors
/// checked in stage, shard, then image encoder order). KV pools follow their stages. The
/// version is old.version + 1. Errors: no node is alive, or no alive node has room for an actor
/// (the message names it, what it needs, part by part, and the most free memory).
Result<PlacementMsg> replan(const PlacementMsg& old, const std::map<uint32_t, Survivor>& alive,
                            const std::function<ActorMemory(ActorRole, uint32_t)>& actor_memory);

}  // namespace troupe::actors::detail
