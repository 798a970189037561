// Controller actor: supervision. Monitors every stage, expert shard, the scheduler and the router;
// when one terminates (an exception escaped a handler, or it was killed) it spawns a replacement
// from the same configuration and rewires its peers. A stage's KV pool is lost with it: the
// scheduler recomputes the running sequences from their token logs. A scheduler's sequences are
// lost with it: the router resubmits them from its token logs. A router's token logs are lost
// with it: its clients resubmit what they have seen (see LocalCluster::generate_many).
#include "actors/controller.h"

#include <cstdio>

#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "actors/detail/messages.h"
#include "actors/expert_shard.h"
#include "actors/router.h"
#include "actors/scheduler.h"
#include "actors/stage.h"

namespace troupe::actors {

namespace {

struct ControllerState {
  ControllerConfig cfg;
  std::vector<int> stage_restarts, shard_restarts;
  int scheduler_restarts = 0, router_restarts = 0;
  static inline const char* name = "controller";
};

using Self = ControllerActor::stateful_base<ControllerState>;

ExpertPlacement placement_of(const ControllerConfig& c) {
  ExpertPlacement p;
  if (!c.shard_actors.empty()) {
    p.shards = c.shard_actors;
    p.owner = c.expert_owner;
  }
  return p;
}

void restart_stage(Self* self, size_t i) {
  auto& c = self->state.cfg;
  // The last stage has no next stage: it reports to c.stages[i].scheduler.
  StageInputActor next;
  if (i + 1 < c.stage_actors.size()) next = c.stage_actors[i + 1];
  auto a = spawn_stage(self->system(), c.stages[i], next, placement_of(c));
  self->monitor(a);
  c.stage_actors[i] = a;
  ++self->state.stage_restarts[i];
  std::fprintf(stderr, "troupe: restart actor=stage/%zu reason=failed (restart %d)\n", i,
               self->state.stage_restarts[i]);
  if (i > 0) {
    self->send(c.stage_actors[i - 1], next_atom::value, StageInputActor{a});
  } else {
    self->send(c.scheduler, stage_atom::value, StageInputActor{a});
  }
  self->send(c.scheduler, reset_atom::value);
}

void restart_shard(Self* self, size_t j) {
  auto& c = self->state.cfg;
  auto a = spawn_expert_shard(self->system(), c.shards[j]);
  self->monitor(a);
  c.shard_actors[j] = a;
  ++self->state.shard_restarts[j];
  std::fprintf(stderr, "troupe: restart actor=expert/%zu reason=failed (restart %d)\n", j,
               self->state.shard_restarts[j]);
  for (const auto& s : c.stage_actors) self->send(s, shards_atom::value, c.shard_actors);
}

// The replacement gets the same limits and pool, an epoch range of its own (steps of the failed
// scheduler still in the pipeline come back to it and must be dropped) and the first stage at
// spawn (the router's resubmissions may reach it before any further message from us).
void restart_scheduler(Self* self) {
  auto& st = self->state;
  auto& c = st.cfg;
  ++st.scheduler_restarts;
  c.scheduler_cfg.epoch0 = (static_cast<uint64_t>(st.scheduler_restarts) << 32) + 1;
  auto a = spawn_scheduler(self->system(), c.scheduler_cfg, c.stage_actors.front());
  self->monitor(a);
  c.scheduler = a;
  std::fprintf(stderr, "troupe: restart actor=scheduler reason=failed (restart %d)\n",
               st.scheduler_restarts);
  for (auto& sc : c.stages) sc.scheduler = a;  // a stage restarted later reports there
  // Every stage reports failed steps, and the last one its outcomes, to the new scheduler.
  for (const auto& s : c.stage_actors) self->send(s, sched_atom::value, a);
  self->send(c.router, sched_atom::value, a);
}

// Sequence ids of the replacement start above any its predecessors used: the scheduler may still
// hold the old router's sequences while it cancels them.
void restart_router(Self* self) {
  auto& st = self->state;
  auto& c = st.cfg;
  ++st.router_restarts;
  const int64_t first_seq_id = (static_cast<int64_t>(st.router_restarts) << 40) + 1;
  c.router = spawn_router(self->system(), c.model, c.scheduler, first_seq_id, c.encoder);
  self->monitor(c.router);
  std::fprintf(stderr, "troupe: restart actor=router reason=failed (restart %d)\n",
               st.router_restarts);
}

}  // namespace

ControllerActor::behavior_type controller_behavior(
    ControllerActor::stateful_pointer<ControllerState> self, ControllerConfig cfg) {
  auto& st = self->state;
  st.cfg = std::move(cfg);
  st.stage_restarts.assign(st.cfg.stage_actors.size(), 0);
  st.shard_restarts.assign(st.cfg.shard_actors.size(), 0);
  for (const auto& a : st.cfg.stage_actors) self->monitor(a);
  for (const auto& a : st.cfg.shard_actors) self->monitor(a);
  self->monitor(st.cfg.scheduler);
  self->monitor(st.cfg.router);
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& c = self->state.cfg;
    if (dm.source == c.scheduler.address()) return restart_scheduler(self);
    // A router a client already had replaced (see router_atom) is not the current one any more.
    if (dm.source == c.router.address()) return restart_router(self);
    for (size_t i = 0; i < c.stage_actors.size(); ++i)
      if (dm.source == c.stage_actors[i].address()) return restart_stage(self, i);
    for (size_t j = 0; j < c.shard_actors.size(); ++j)
      if (dm.source == c.shard_actors[j].address()) return restart_shard(self, j);
  });
  return {
      [=](crash_atom, const std::string& target) -> bool {
        auto& c = self->state.cfg;
        if (target == "router") {
          self->send(c.router, crash_atom::value);
          return true;
        }
        if (target == "scheduler") {
          self->send(c.scheduler, crash_atom::value);
          return true;
        }
        const auto slash = target.find('/');
        if (slash == std::string::npos) return false;
        const std::string kind = target.substr(0, slash);
        size_t idx = 0;
        try {
          idx = std::stoul(target.substr(slash + 1));
        } catch (...) {
          return false;
        }
        if (kind == "stage" && idx < c.stage_actors.size()) {
          self->send(c.stage_actors[idx], crash_atom::value);
          return true;
        }
        if (kind == "expert" && idx < c.shard_actors.size()) {
          self->send(c.shard_actors[idx], crash_atom::value);
          return true;
        }
        return false;
      },
      [=](router_atom, const caf::actor_addr& failed) -> RouterActor {
        auto& c = self->state.cfg;
        if (failed && failed == c.router.address()) restart_router(self);
        return c.router;
      },
      [=](actors_atom) -> ActorHandles {
        const auto& c = self->state.cfg;
        return ActorHandles{c.router, c.scheduler, c.stage_actors, c.shard_actors};
      },
      [=](stats_atom) -> std::string {
        std::string s =
            "{\"scheduler_restarts\":" + std::to_string(self->state.scheduler_restarts) +
            ",\"router_restarts\":" + std::to_string(self->state.router_restarts) +
            ",\"stage_restarts\":[";
        for (size_t i = 0; i < self->state.stage_restarts.size(); ++i)
          s += (i ? "," : "") + std::to_string(self->state.stage_restarts[i]);
        s += "],\"expert_restarts\":[";
        for (size_t i = 0; i < self->state.shard_restarts.size(); ++i)
          s += (i ? "," : "") + std::to_string(self->state.shard_restarts[i]);
        return s + "]}";
      },
  };
}

ControllerActor spawn_controller(caf::actor_system& sys, ControllerConfig cfg) {
  return sys.spawn(controller_behavior, std::move(cfg));
}

}  // namespace troupe::actors
