// ExpertShard actor: owns a subset of the routed experts of every MoE layer and computes the rows
// stages send it, on its own thread (spawned detached) with its own compute pool.
#include "actors/expert_shard.h"

#include <algorithm>
#include <stdexcept>

#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "actors/detail/messages.h"
#include "base/check.h"
#include "compute/thread_pool.h"

namespace troupe::actors {

namespace {

struct ExpertShardState {
  ExpertShardConfig cfg;
  std::vector<bool> owned;  // [n_expert]
  std::unique_ptr<compute::ThreadPool> pool;
  std::unique_ptr<compute::ExpertCompute> compute;
  bool crash_next = false;
  static inline const char* name = "expert_shard";
};

using Self = ExpertShardActor::stateful_base<ExpertShardState>;

void serve(Self* self, const ExpertRequestPtr& r) {
  auto& st = self->state;
  const int64_t E = st.cfg.model->spec.n_embd;
  // Validate before computing: a malformed request is answered with an error, never a crash.
  int64_t total = 0;
  for (size_t i = 0; i < r->experts.size(); ++i) {
    const int32_t e = r->experts[i];
    if (e < 0 || static_cast<size_t>(e) >= st.owned.size() || !st.owned[static_cast<size_t>(e)]) {
      r->error =
          "expert " + std::to_string(e) + " is not owned by shard " + std::to_string(st.cfg.index);
      return;
    }
    total += r->rows[i];
  }
  if (r->rows.size() != r->experts.size() || total * E != static_cast<int64_t>(r->x.size()) ||
      r->y.size() != r->x.size()) {
    r->error = "malformed expert request (row counts do not match the data)";
    return;
  }
  std::vector<compute::ExpertTask> tasks;
  int64_t at = 0;
  for (size_t i = 0; i < r->experts.size(); ++i) {
    tasks.push_back({r->experts[i], r->rows[i], r->x.data() + at * E, r->y.data() + at * E});
    at += r->rows[i];
  }
  st.compute->run(r->layer, tasks);
}

}  // namespace

ExpertShardActor::behavior_type expert_shard_behavior(
    ExpertShardActor::stateful_pointer<ExpertShardState> self, ExpertShardConfig cfg) {
  auto& st = self->state;
  st.cfg = std::move(cfg);
  st.owned.assign(static_cast<size_t>(st.cfg.model->spec.n_expert), false);
  for (int32_t e : st.cfg.experts) st.owned.at(static_cast<size_t>(e)) = true;
  st.pool = std::make_unique<compute::ThreadPool>(st.cfg.threads);
  st.compute = std::make_unique<compute::ExpertCompute>(st.cfg.model, st.pool.get());
  return {
      [=](expert_atom, const ExpertRequestPtr& r) {
        // A request this actor dies with (a throw, an exit) is failed by its guard
        // (guard_request) when the message goes away, so the stage waiting on it goes on.
        if (self->state.crash_next) throw std::runtime_error("injected fault");
        try {
          serve(self, r);
        } catch (const std::exception& e) {
          r->error = e.what();
        }
        answer_request(*r);
      },
      [=](crash_atom) { self->state.crash_next = true; },
  };
}

ExpertShardActor spawn_expert_shard(caf::actor_system& sys, const ExpertShardConfig& cfg) {
  return sys.spawn<caf::detached>(expert_shard_behavior, cfg);
}

}  // namespace troupe::actors
