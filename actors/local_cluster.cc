// LocalCluster: spawns the actors of a resolved plan in one actor system and drives requests
// through the router from a scoped actor.
#include "actors/local_cluster.h"

#include <chrono>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include "actors/controller.h"
#include "actors/detail/messages.h"
#include "actors/expert_shard.h"
#include "actors/router.h"
#include "actors/scheduler.h"
#include "actors/stage.h"

namespace troupe::actors {

struct LocalCluster::Impl {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  ClusterOptions opts;
  caf::actor scheduler, router, controller;
  std::vector<caf::actor> stages, shards;  // as first spawned (the controller tracks restarts)
  caf::scoped_actor* active = nullptr;     // the client of the running generate_many

  ~Impl() {
    if (!sys) return;
    // Stop supervision first, so that shutting the others down does not restart them.
    for (const caf::actor& a : {controller, router, scheduler})
      if (a) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    // Replacements the controller spawned after a failure are not listed here: they hold no
    // references once their peers are gone and end with the system.
    // TODO(#3): ask the controller for its current actors and stop those explicitly.
    for (const caf::actor& a : stages) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    for (const caf::actor& a : shards) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  }
};

LocalCluster::LocalCluster() : impl_(std::make_unique<Impl>()) {}
LocalCluster::~LocalCluster() = default;

Result<std::unique_ptr<LocalCluster>> LocalCluster::start(const Plan& plan,
                                                          std::shared_ptr<const model::Model> model,
                                                          const ClusterOptions& opts) {
  std::unique_ptr<LocalCluster> lc(new LocalCluster());
  Impl& im = *lc->impl_;
  im.opts = opts;
  // The light actors (router, scheduler, controller) need one CAF worker; compute runs on the
  // stages' and shards' own threads. More workers, polling for messages, would take cores away
  // from the compute pools (measured: a 2-thread stage ran at half speed on a 2-core machine).
  im.cfg.set("scheduler.max-threads", size_t{1});
  im.cfg.set("work-stealing.aggressive-poll-attempts", size_t{10});
  im.cfg.set("work-stealing.moderate-poll-attempts", size_t{1});
  im.sys = std::make_unique<caf::actor_system>(im.cfg);
  const auto& spec = model->spec;
  const int64_t num_stages = static_cast<int64_t>(plan.stages.size());
  if (num_stages == 0) return Error{1, plan.source + ": the plan has no stages (resolve it first)"};
  // Block ids are shared along the pipeline (one logical block table per sequence), so every
  // stage's pool has the same number of blocks: the smallest the plan gives.
  int64_t kv_blocks = plan.stages[0].kv_blocks;
  for (const auto& s : plan.stages) kv_blocks = std::min(kv_blocks, s.kv_blocks);

  ControllerConfig cc;
  if (!plan.expert_shards.empty()) {
    cc.expert_owner.assign(static_cast<size_t>(spec.n_expert), -1);
    for (size_t j = 0; j < plan.expert_shards.size(); ++j) {
      ExpertShardConfig sc;
      sc.index = static_cast<int>(j);
      sc.experts = plan.expert_shards[j].experts;
      sc.threads = plan.expert_shards[j].threads;
      sc.model = model;
      for (int32_t e : sc.experts)
        cc.expert_owner[static_cast<size_t>(e)] = static_cast<int32_t>(j);
      cc.shards.push_back(sc);
      cc.shard_actors.push_back(spawn_expert_shard(*im.sys, sc));
    }
  }
  im.scheduler =
      spawn_scheduler(*im.sys, plan.scheduler, kv_blocks, plan.kv_block_size, spec.n_vocab);
  ExpertPlacement placement;
  if (!cc.shard_actors.empty()) {
    placement.shards = cc.shard_actors;
    placement.owner = cc.expert_owner;
  }
  cc.stages.resize(static_cast<size_t>(num_stages));
  cc.stage_actors.resize(static_cast<size_t>(num_stages));
  caf::actor next = im.scheduler;
  for (int64_t i = num_stages - 1; i >= 0; --i) {
    const StagePlan& sp = plan.stages[static_cast<size_t>(i)];
    StageConfig c;
    c.index = static_cast<int>(i);
    c.num_stages = static_cast<int>(num_stages);
    c.range = {sp.layer_begin, sp.layer_end, i == 0, i == num_stages - 1};
    c.threads = sp.threads;
    c.kv_blocks = kv_blocks;
    c.kv_block_size = plan.kv_block_size;
    c.model = model;
    c.expert_timeout = std::chrono::milliseconds(opts.expert_timeout_ms);
    c.scheduler = im.scheduler;
    cc.stages[static_cast<size_t>(i)] = c;
    next = spawn_stage(*im.sys, c, next, placement);
    cc.stage_actors[static_cast<size_t>(i)] = next;
  }
  caf::anon_send(im.scheduler, stage_atom::value, cc.stage_actors[0]);
  // Every stage must have built its engine (KV pool allocated) before we accept requests.
  {
    caf::scoped_actor self{*im.sys};
    for (size_t i = 0; i < cc.stage_actors.size(); ++i) {
      std::string err;
      self->request(cc.stage_actors[i], std::chrono::seconds(120), stats_atom::value)
          .receive([](const std::string&) {},
                   [&](const caf::error& e) { err = im.sys->render(e); });
      if (!err.empty()) return Error{1, "stage " + std::to_string(i) + " failed to start: " + err};
    }
  }
  im.stages = cc.stage_actors;
  im.shards = cc.shard_actors;
  cc.scheduler = im.scheduler;
  im.router = spawn_router(*im.sys, model, im.scheduler);
  cc.router = im.router;
  im.controller = spawn_controller(*im.sys, std::move(cc));
  return lc;
}

std::vector<GenerateResult> LocalCluster::generate_many(const std::vector<GenerateRequest>& reqs,
                                                        size_t concurrency,
                                                        const StreamCallback& on_delta) {
  Impl& im = *impl_;
  std::vector<GenerateResult> results(reqs.size());
  if (reqs.empty()) return results;
  if (concurrency == 0) concurrency = reqs.size();
  caf::scoped_actor self{*im.sys};
  im.active = &self;
  size_t next = 0, done = 0;
  auto submit = [&](size_t i) {
    self->send(im.router, submit_atom::value,
               GenerateRequestPtr(std::make_shared<GenerateRequest>(reqs[i])),
               static_cast<int64_t>(i));
  };
  for (; next < reqs.size() && next < concurrency; ++next) submit(next);
  std::vector<bool> finished(reqs.size(), false);
  bool timed_out = false;
  while (done < reqs.size() && !timed_out) {
    self->receive(
        [&](token_atom, int64_t tag, const std::string& delta, int32_t token) {
          if (on_delta) on_delta(static_cast<size_t>(tag), delta, token);
        },
        [&](finish_atom, int64_t tag, const GenerateResultPtr& r) {
          const size_t i = static_cast<size_t>(tag);
          if (i >= results.size() || finished[i]) return;
          results[i] = *r;
          finished[i] = true;
          ++done;
          if (next < reqs.size()) submit(next++);
        },
        caf::after(std::chrono::milliseconds(im.opts.request_timeout_ms)) >>
            [&] { timed_out = true; });
  }
  im.active = nullptr;
  for (size_t i = 0; i < results.size(); ++i) {
    if (finished[i]) continue;
    results[i].finish_reason = "error";
    results[i].error = "no answer within " + std::to_string(im.opts.request_timeout_ms) + " ms";
  }
  return results;
}

void LocalCluster::cancel(size_t index) {
  if (impl_->active)
    (*impl_->active)->send(impl_->router, cancel_atom::value, static_cast<int64_t>(index));
}

GenerateResult LocalCluster::generate(const GenerateRequest& req, const StreamCallback& on_delta) {
  return generate_many({req}, 1, on_delta)[0];
}

Status LocalCluster::inject_fault(const std::string& actor) {
  caf::scoped_actor self{*impl_->sys};
  bool ok = false;
  self->request(impl_->controller, std::chrono::seconds(10), crash_atom::value, actor)
      .receive([&](bool r) { ok = r; }, [&](const caf::error&) { ok = false; });
  if (!ok) return Error{1, "no actor named '" + actor + "' (use stage/N or expert/N)"};
  return Ok{};
}

std::string LocalCluster::stats_json() {
  caf::scoped_actor self{*impl_->sys};
  std::string sched = "null", ctrl = "null";
  self->request(impl_->scheduler, std::chrono::seconds(10), stats_atom::value)
      .receive([&](const std::string& s) { sched = s; }, [&](const caf::error&) {});
  self->request(impl_->controller, std::chrono::seconds(10), stats_atom::value)
      .receive([&](const std::string& s) { ctrl = s; }, [&](const caf::error&) {});
  return "{\"scheduler\":" + sched + ",\"controller\":" + ctrl + "}";
}

}  // namespace troupe::actors
