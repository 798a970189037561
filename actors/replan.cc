// Re-placement after node loss (see detail/replan.h).
#include "actors/detail/replan.h"

#include <filesystem>
#include <limits>
#include <string>

#include "base/check.h"
#include "compute/engine.h"

namespace troupe::actors::detail {
namespace {

std::string mb(uint64_t bytes) { return strfmt("%.1f MB", static_cast<double>(bytes) / 1e6); }

// "600.0 MB of weights", or with a stage's other parts "680.0 MB: 500.0 MB of weights, 160.0 MB
// of KV pool, 20.0 MB of recurrent states".
std::string describe(const ActorMemory& m) {
  if (m.kv == 0 && m.states == 0) return mb(m.weights) + " of weights";
  std::string s = mb(m.total()) + ": " + mb(m.weights) + " of weights";
  if (m.kv > 0) s += ", " + mb(m.kv) + " of KV pool";
  if (m.states > 0) s += ", " + mb(m.states) + " of recurrent states";
  return s;
}

// "stage 2", "expert shard 0", "image encoder 1".
std::string what_actor(ActorRole role, uint32_t index) {
  const char* kind = role == ActorRole::kStage         ? "stage"
                     : role == ActorRole::kExpertShard ? "expert shard"
                                                       : "image encoder";
  return kind + (" " + std::to_string(index));
}

}  // namespace

ActorMemory stage_pools_memory(const model::ModelSpec& spec, const Plan& plan,
                               const PlacementMsg& pl, uint32_t index, int64_t state_slots) {
  ActorMemory m;
  if (index < plan.stages.size() && !plan.stages[index].on_cpu()) return m;
  for (const auto& s : pl.stages) {
    if (s.stage != index) continue;
    const compute::LayerRange range{s.layer_begin, s.layer_end};
    for (const auto& k : pl.kv_pools)
      if (k.stage == index && k.num_blocks > 0)
        m.kv += compute::kv_pool_bytes(
            compute::kv_cache_config(spec, range, k.block_size, k.num_blocks, plan.kv_type));
    m.states = static_cast<uint64_t>(std::max<int64_t>(0, state_slots)) *
               compute::recurrent_state_bytes(spec, range);
  }
  return m;
}

void for_each_placed_actor(const PlacementMsg& pl,
                           const std::function<void(ActorRole, uint32_t, uint32_t)>& f) {
  for (const auto& s : pl.stages) f(ActorRole::kStage, s.stage, s.node_id);
  for (const auto& s : pl.shards) f(ActorRole::kExpertShard, s.shard, s.node_id);
  for (const auto& e : pl.encoders) f(ActorRole::kEncoder, e.index, e.node_id);
}

PlacementMsg initial_placement(const Plan& p,
                               const std::function<uint32_t(const std::string&)>& node_id) {
  PlacementMsg pl;
  pl.version = 1;
  pl.model_name = std::filesystem::path(p.model_path).filename().string();
  pl.microbatches = static_cast<uint32_t>(p.scheduler.microbatches);
  // Every stage gets a pool of the smallest stage's size: the scheduler admits by one count.
  int64_t kv_blocks = p.stages.empty() ? 0 : p.stages[0].kv_blocks;
  for (const auto& s : p.stages) kv_blocks = std::min(kv_blocks, s.kv_blocks);
  const size_t n = p.stages.size();
  for (size_t i = 0; i < n; ++i) {
    const StagePlan& s = p.stages[i];
    StagePlacementInfo sp;
    sp.stage = static_cast<uint32_t>(i);
    sp.node_id = node_id(s.node);
    sp.layer_begin = static_cast<uint32_t>(s.layer_begin);
    sp.layer_end = static_cast<uint32_t>(s.layer_end);
    sp.has_embedding = i == 0;
    sp.has_output_head = i + 1 == n;
    sp.threads = static_cast<uint32_t>(s.threads);
    pl.stages.push_back(sp);
    pl.kv_pools.push_back({sp.stage, sp.node_id, static_cast<uint32_t>(kv_blocks),
                           static_cast<uint32_t>(p.kv_block_size)});
  }
  for (size_t j = 0; j < p.expert_shards.size(); ++j) {
    const ExpertShardPlan& s = p.expert_shards[j];
    ShardPlacementInfo sp;
    sp.shard = static_cast<uint32_t>(j);
    sp.node_id = node_id(s.node);
    sp.experts = s.experts;
    sp.threads = static_cast<uint32_t>(s.threads);
    pl.shards.push_back(std::move(sp));
  }
  for (size_t k = 0; k < p.encoders.size(); ++k)
    pl.encoders.push_back({static_cast<uint32_t>(k), node_id(p.encoders[k].node),
                           static_cast<uint32_t>(p.encoders[k].threads)});
  return pl;
}

Status check_memory_limits(const Plan& plan, const PlacementMsg& pl,
                           const std::function<uint32_t(const std::string&)>& node_id,
                           const std::function<ActorMemory(ActorRole, uint32_t)>& actor_memory) {
  for (const auto& n : plan.cluster.nodes) {
    if (n.memory_limit_mb <= 0) continue;
    const uint32_t id = node_id(n.name);
    uint64_t total = 0;
    std::string parts;
    for_each_placed_actor(pl, [&](ActorRole role, uint32_t index, uint32_t node) {
      if (node != id) return;
      const ActorMemory m = actor_memory(role, index);
      total += m.total();
      parts += (parts.empty() ? "" : ", ") + what_actor(role, index) + " (" + describe(m) + ")";
    });
    const uint64_t limit = static_cast<uint64_t>(n.memory_limit_mb) << 20;
    if (total > limit)
      return make_error(
          static_cast<int>(PlanErrc::kInvalid),
          strfmt("%s: node '%s': the plan places %s on it, over its memory_limit_mb "
                 "= %lld (%s): %s",
                 plan.source.c_str(), n.name.c_str(), mb(total).c_str(),
                 static_cast<long long>(n.memory_limit_mb), mb(limit).c_str(), parts.c_str()));
  }
  return Ok{};
}

Result<PlacementMsg> replan(const PlacementMsg& old, const std::map<uint32_t, Survivor>& alive,
                            const std::function<ActorMemory(ActorRole, uint32_t)>& actor_memory) {
  if (alive.empty()) return make_error(0, "no node is left to take the pipeline's actors");
  PlacementMsg pl = old;
  pl.version = old.version + 1;
  std::map<uint32_t, uint64_t> load;      // node -> actors hosted
  std::map<uint32_t, uint64_t> moved_in;  // node -> bytes moved onto it
  for (const auto& [id, s] : alive) load[id] = 0;
  for (const auto& s : pl.stages)
    if (load.count(s.node_id)) ++load[s.node_id];
  for (const auto& s : pl.shards)
    if (load.count(s.node_id)) ++load[s.node_id];
  for (const auto& e : pl.encoders)
    if (load.count(e.node_id)) ++load[e.node_id];
  auto move = [&](uint32_t& node_id, ActorRole role, uint32_t index) -> Status {
    if (alive.count(node_id)) return Ok{};
    const ActorMemory mem = actor_memory ? actor_memory(role, index) : ActorMemory{};
    const uint64_t need = mem.total();
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
      return make_error(0, strfmt("no surviving node has room for %s of node %u (needs %s; the "
                                  "most free memory left is %.1f MB)",
                                  what_actor(role, index).c_str(), node_id, describe(mem).c_str(),
                                  static_cast<double>(most_free) / 1e6));
    node_id = best;
    ++load[best];
    moved_in[best] += need;
    return Ok{};
  };
  for (auto& s : pl.stages)
    if (auto st = move(s.node_id, ActorRole::kStage, s.stage); !st) return st.error();
  for (auto& s : pl.shards)
    if (auto st = move(s.node_id, ActorRole::kExpertShard, s.shard); !st) return st.error();
  for (auto& e : pl.encoders)
    if (auto st = move(e.node_id, ActorRole::kEncoder, e.index); !st) return st.error();
  for (auto& k : pl.kv_pools)
    for (const auto& s : pl.stages)
      if (s.stage == k.stage) k.node_id = s.node_id;
  return pl;
}

}  // namespace troupe::actors::detail
