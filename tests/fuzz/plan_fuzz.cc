// libFuzzer entry for the plan and cluster files (actors/plan_parse.cc, actors/plan.cc): the input
// is TOML text, as an operator might mistype it. A rejected plan is fine (its message must name
// the source); an accepted one is resolved against a fixed MoE model shape and placed on its
// nodes, and whatever comes out must be the concrete, consistent plan resolve_plan promises.
// Built by tests/fuzz/CMakeLists.txt; run by scripts/fuzz-smoke (seeds: conf/*.toml).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "actors/plan.h"
#include "model/model_spec.h"

namespace {

using troupe::actors::Plan;

volatile uint64_t g_sink = 0;

void require(bool ok) {
  if (!ok) std::abort();
}

troupe::model::ModelSpec moe_spec() {
  troupe::model::ModelSpec s;
  s.n_layer = 6;
  s.n_expert = 8;
  s.n_ctx_train = 2048;
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // The cluster token may come from the environment; keep it from deciding what is tested.
  unsetenv("TROUPE_CLUSTER_TOKEN");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto plan = troupe::actors::parse_plan_string(text, "fuzz.toml");
  if (!plan) {
    require(plan.error().message.rfind("fuzz.toml", 0) == 0);
    return 0;
  }
  Plan p = *plan;
  g_sink = g_sink + troupe::actors::describe_plan(p).size();
  const auto spec = moe_spec();
  if (!troupe::actors::resolve_plan(p, spec)) return 0;
  // Resolved: every layer in exactly one stage, in order; every expert in exactly one shard.
  int64_t next = 0;
  for (const auto& st : p.stages) {
    require(st.layer_begin == next && st.layer_end > st.layer_begin);
    next = st.layer_end;
  }
  require(next == spec.n_layer);
  std::vector<int> owners(static_cast<size_t>(spec.n_expert), 0);
  for (const auto& sh : p.expert_shards)
    for (int32_t e : sh.experts) {
      require(e >= 0 && e < spec.n_expert);
      ++owners[static_cast<size_t>(e)];
    }
  if (!p.expert_shards.empty())
    for (int n : owners) require(n == 1);
  g_sink = g_sink + troupe::actors::describe_plan(p).size();
  if (troupe::actors::resolve_placement(p)) g_sink = g_sink + p.cluster.nodes.size();
  return 0;
}
