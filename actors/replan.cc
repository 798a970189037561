// Re-placement after node loss (see detail/replan.h).
#include "actors/detail/replan.h"

#include <limits>
#include <string>

#include "base/check.h"

namespace troupe::actors::detail {

Result<PlacementMsg> replan(const PlacementMsg& old, const std::map<uint32_t, Survivor>& alive,
                            const std::function<uint64_t(ActorRole, uint32_t)>& actor_bytes) {
  if (alive.empty()) return make_error(0, "no node is left to take the pipeline's actors");
  PlacementMsg pl = old;
  pl.version = old.version + 1;
  std::map<uint32_t, uint64_t> load;      // node -> actors hosted
  std::map<uint32_t, uint64_t> moved_in;  // node -> bytes of weights moved onto it
  for (const auto& [id, s] : alive) load[id] = 0;
  for (const auto& s : pl.stages)
    if (load.count(s.node_id)) ++load[s.node_id];
  for (const auto& s : pl.shards)
    if (load.count(s.node_id)) ++load[s.node_id];
  for (const auto& e : pl.encoders)
    if (load.count(e.node_id)) ++load[e.node_id];
  auto move = [&](uint32_t& node_id, ActorRole role, uint32_t index,
                  const std::string& what) -> Status {
    if (alive.count(node_id)) return Ok{};
    const uint64_t need = actor_bytes ? actor_bytes(role, index) : 0;
    uint32_t best = 0;
    uint64_t best_load = std::numeric_limits<uint64_t>::max();
    uint64_t most_free = 0;
    for (const auto& [id, s] : alive) {
      const uint64_t free_left =
          s.free_memory_bytes > moved_in[id] ? s.free_memory_bytes - moved_in[id] : 0;
      most_free = std::max(most_free, free_left);
      const bool fits = need <= free_left;
      if (fits && load[id] < best_load) {
        best = id;
        best_load = load[id];
      }
    }
    if (best_load == std::numeric_limits<uint64_t>::max())
      return make_error(0, strfmt("no surviving node has room for %s of node %u (needs %.1f MB of "
                                  "weights; the most free memory left is %.1f MB)",
                                  what.c_str(), node_id, static_cast<double>(need) / 1e6,
                                  static_cast<double>(most_free) / 1e6));
    node_id = best;
    ++load[best];
    moved_in[best] += need;
    return Ok{};
  };
  for (auto& s : pl.stages)
    if (auto st = move(s.node_id, ActorRole::kStage, s.stage, "stage " + std::to_string(s.stage));
        !st)
      return st.error();
  for (auto& s : pl.shards)
    if (auto st = move(s.node_id, ActorRole::kExpertShard, s.shard,
                       "expert shard " + std::to_string(s.shard));
        !st)
      return st.error();
  for (auto& e : pl.encoders)
    if (auto st = move(e.node_id, ActorRole::kEncoder, e.index,
                       "image encoder " + std::to_string(e.index));
        !st)
      return st.error();
  for (auto& k : pl.kv_pools)
    for (const auto& s : pl.stages)
      if (s.stage == k.stage) k.node_id = s.node_id;
  return pl;
}

}  // namespace troupe::actors::detail
