// Controller actor: supervision. Monitors every stage and expert shard; when one terminates
// (an exception escaped a handler, or it was killed) it spawns a replacement from the same
// configuration, rewires its neighbours, and — for a stage, whose KV pool is lost — tells the
// scheduler to recompute the running sequences from their token logs.
#include "actors/controller.h"

#include <cstdio>

#include <caf/event_based_actor.hpp>
#include <caf/stateful_actor.hpp>

#include "actors/detail/messages.h"
#include "actors/expert_shard.h"
#include "actors/stage.h"

namespace troupe::actors {

namespace {

struct ControllerState {
  ControllerConfig cfg;
  std::vector<int> stage_restarts, shard_restarts;
  static inline const char* name = "controller";
};

using Self = caf::stateful_actor<ControllerState>;

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
  caf::actor next = i + 1 < c.stage_actors.size() ? c.stage_actors[i + 1] : c.scheduler;
  auto a = spawn_stage(self->system(), c.stages[i], next, placement_of(c));
  self->monitor(a);
  c.stage_actors[i] = a;
  ++self->state.stage_restarts[i];
  std::fprintf(stderr, "troupe: restart actor=stage/%zu reason=failed (restart %d)\n", i,
               self->state.stage_restarts[i]);
  if (i > 0) {
    self->send(c.stage_actors[i - 1], next_atom::value, a);
  } else {
    self->send(c.scheduler, stage_atom::value, a);
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

}  // namespace

caf::behavior controller_behavior(Self* self, ControllerConfig cfg) {
  auto& st = self->state;
  st.cfg = std::move(cfg);
  st.stage_restarts.assign(st.cfg.stage_actors.size(), 0);
  st.shard_restarts.assign(st.cfg.shard_actors.size(), 0);
  for (const auto& a : st.cfg.stage_actors) self->monitor(a);
  for (const auto& a : st.cfg.shard_actors) self->monitor(a);
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& c = self->state.cfg;
    for (size_t i = 0; i < c.stage_actors.size(); ++i)
      if (dm.source == c.stage_actors[i].address()) return restart_stage(self, i);
    for (size_t j = 0; j < c.shard_actors.size(); ++j)
      if (dm.source == c.shard_actors[j].address()) return restart_shard(self, j);
  });
  return {
      [=](crash_atom, const std::string& target) -> bool {
        auto& c = self->state.cfg;
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
      [=](stats_atom) -> std::string {
        std::string s = "{\"stage_restarts\":[";
        for (size_t i = 0; i < self->state.stage_restarts.size(); ++i)
          s += (i ? "," : "") + std::to_string(self->state.stage_restarts[i]);
        s += "],\"expert_restarts\":[";
        for (size_t i = 0; i < self->state.shard_restarts.size(); ++i)
          s += (i ? "," : "") + std::to_string(self->state.shard_restarts[i]);
        return s + "]}";
      },
  };
}

caf::actor spawn_controller(caf::actor_system& sys, ControllerConfig cfg) {
  return sys.spawn(controller_behavior, std::move(cfg));
}

}  // namespace troupe::actors
