// LocalCluster: spawns the actors of a resolved plan in one actor system and drives requests
// through the router from a scoped actor. The client side of router supervision lives here: the
// client keeps what it was streamed, and when its router fails it resumes each request it still
// waits for at the replacement the controller names.
#include "actors/local_cluster.h"

#include <chrono>
#include <cstdlib>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include "actors/controller.h"
#include "actors/detail/control_wire.h"
#include "actors/detail/messages.h"
#include "actors/encoder.h"
#include "actors/expert_shard.h"
#include "actors/router.h"
#include "actors/scheduler.h"
#include "actors/stage.h"
#include "base/check.h"
#include "compute/thread_pool.h"

namespace troupe::actors {

namespace {

constexpr auto kControlTimeout = std::chrono::seconds(10);

// The value of an unsigned field of a stage's one-line stats JSON; 0 when absent. actors/ may not
// include a JSON parser (STYLE.md), and the stage writes this field itself with "%llu".
uint64_t json_uint(const std::string& s, const std::string& key) {
  const std::string k = "\"" + key + "\":";
  const size_t at = s.find(k);
  if (at == std::string::npos) return 0;
  return std::strtoull(s.c_str() + at + k.size(), nullptr, 10);
}

void stop_all(const ActorHandles& h) {
  if (h.router) caf::anon_send_exit(h.router, caf::exit_reason::user_shutdown);
  if (h.scheduler) caf::anon_send_exit(h.scheduler, caf::exit_reason::user_shutdown);
  for (const auto& a : h.stages) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  for (const auto& a : h.shards) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
}

}  // namespace

/// The client's side of one generate_many call.
struct ClientRun {
  caf::scoped_actor* self = nullptr;
  std::vector<char> cancelled;  // per request: the caller cancelled it
};

struct LocalCluster::Impl {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  ClusterOptions opts;
  ControllerActor controller;
  RouterActor router;    // the router the client talks to (the controller's current one)
  ActorHandles spawned;  // until the controller exists: what start() spawned
  EncoderActor encoder;  // null without a vision encoder; not supervised (it does not throw)
  std::shared_ptr<EncoderCounters> encoder_counters;
  std::vector<std::pair<int64_t, int64_t>> layers;  // per stage: [begin, end)
  ClientRun* active = nullptr;                      // the running generate_many

  // The supervised actors as they are now, restarted ones included; `spawned` without controller.
  ActorHandles handles(caf::scoped_actor& self) {
    if (!controller) return spawned;
    ActorHandles h;
    self->request(controller, kControlTimeout, actors_atom::value)
        .receive([&](ActorHandles& x) { h = std::move(x); }, [](const caf::error&) {});
    return h;
  }

  // The current router; `failed` (non-null) is one this client saw terminate.
  RouterActor current_router(caf::scoped_actor& self, const caf::actor_addr& failed) {
    RouterActor r;
    self->request(controller, kControlTimeout, router_atom::value, failed)
        .receive([&](RouterActor& x) { r = std::move(x); }, [](const caf::error&) {});
    return r;
  }

  ~Impl() {
    if (!sys) return;
    caf::scoped_actor self{*sys};
    const ActorHandles h = handles(self);
    // Stop supervision first, and wait for it, so that shutting the others down restarts nothing.
    if (controller) {
      self->send_exit(controller, caf::exit_reason::user_shutdown);
      self->wait_for(controller);
    }
    stop_all(h);
    if (encoder) caf::anon_send_exit(encoder, caf::exit_reason::user_shutdown);
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
  // One pool per GPU of a data-parallel stage (resolve_plan makes the pools divide).
  const int64_t kv_pools = opts.kv_pools > 0 ? opts.kv_pools : plan.kv_pools();
  if (kv_blocks % kv_pools != 0)
    return Error{1, plan.source + ": a KV pool of " + std::to_string(kv_blocks) +
                        " blocks does not split into " + std::to_string(kv_pools) +
                        " pools (resolve the plan first)"};

  // threads = 0 ("auto"): this process's CPUs divided among its CPU stages and expert shards.
  int cpu_actors = static_cast<int>(plan.expert_shards.size());
  for (const auto& s : plan.stages) cpu_actors += s.on_cpu();
  ControllerConfig cc;
  cc.model = model;
  if (!plan.expert_shards.empty()) {
    cc.expert_owner.assign(static_cast<size_t>(spec.n_expert), -1);
    for (size_t j = 0; j < plan.expert_shards.size(); ++j) {
      ExpertShardConfig sc;
      sc.index = static_cast<int>(j);
      sc.experts = plan.expert_shards[j].experts;
      sc.threads = compute::resolve_threads(plan.expert_shards[j].threads, cpu_actors);
      sc.model = model;
      for (int32_t e : sc.experts)
        cc.expert_owner[static_cast<size_t>(e)] = static_cast<int32_t>(j);
      cc.shards.push_back(sc);
      cc.shard_actors.push_back(spawn_expert_shard(*im.sys, sc));
    }
  }
  im.spawned.shards = cc.shard_actors;
  cc.scheduler_cfg.limits = plan.scheduler;
  cc.scheduler_cfg.kv_blocks = kv_blocks;
  cc.scheduler_cfg.kv_pools = kv_pools;
  cc.scheduler_cfg.kv_block_size = plan.kv_block_size;
  cc.scheduler_cfg.n_vocab = spec.n_vocab;
  cc.scheduler_cfg.n_embd = spec.n_embd;
  cc.scheduler_cfg.state_slots = state_slots_for(spec, plan.scheduler);
  cc.scheduler_cfg.step_timeout_ms = opts.step_timeout_ms;
  cc.scheduler_cfg.step_failure_window_ms = opts.step_failure_window_ms;
  // The stages need the scheduler's handle, the scheduler the first stage's: it learns that one
  // by message, before any request exists.
  cc.scheduler = spawn_scheduler(*im.sys, cc.scheduler_cfg, StageInputActor{});
  im.spawned.scheduler = cc.scheduler;
  ExpertPlacement placement;
  if (!cc.shard_actors.empty()) {
    placement.shards = cc.shard_actors;
    placement.owner = cc.expert_owner;
  }
  cc.stages.resize(static_cast<size_t>(num_stages));
  cc.stage_actors.resize(static_cast<size_t>(num_stages));
  StageInputActor next;  // none after the last stage: it reports to c.scheduler
  for (int64_t i = num_stages - 1; i >= 0; --i) {
    const StagePlan& sp = plan.stages[static_cast<size_t>(i)];
    StageConfig c;
    c.index = static_cast<int>(i);
    c.num_stages = static_cast<int>(num_stages);
    c.range = {sp.layer_begin, sp.layer_end, i == 0, i == num_stages - 1};
    c.threads = compute::resolve_threads(sp.threads, cpu_actors);
    c.device = sp.device;
    c.parallel = sp.parallel;
    c.kv_blocks = kv_blocks;
    c.kv_block_size = plan.kv_block_size;
    c.kv_type = plan.kv_type;
    c.state_slots = cc.scheduler_cfg.state_slots;
    c.max_positions = plan.scheduler.max_model_len;
    c.model = model;
    c.expert_timeout = std::chrono::milliseconds(opts.expert_timeout_ms);
    c.scheduler = cc.scheduler;
    cc.stages[static_cast<size_t>(i)] = c;
    cc.stage_actors[static_cast<size_t>(i)] = spawn_stage(*im.sys, c, next, placement);
    next = cc.stage_actors[static_cast<size_t>(i)];
  }
  im.spawned.stages = cc.stage_actors;
  for (const StagePlan& sp : plan.stages) im.layers.emplace_back(sp.layer_begin, sp.layer_end);
  caf::anon_send(cc.scheduler, stage_atom::value, StageInputActor{cc.stage_actors[0]});
  // Every stage must have built its engine (KV pool allocated) before we accept requests.
  {
    caf::scoped_actor self{*im.sys};
    for (size_t i = 0; i < cc.stage_actors.size(); ++i) {
      std::string err;
      self->request(cc.stage_actors[i], std::chrono::seconds(120), stats_atom::value)
          .receive([](const std::string&) {},
                   [&](const caf::error& e) {
                     // A stage that could not build its engine says why in the error's text.
                     if (e.context().match_elements<std::string>())
                       err = e.context().get_as<std::string>(0);
                     else
                       err = im.sys->render(e);
                   });
      if (!err.empty()) return Error{1, "stage " + std::to_string(i) + " failed to start: " + err};
    }
  }
  if (opts.vision) {
    EncoderConfig ec;
    ec.vision = opts.vision;
    ec.model = model;
    ec.cache_bytes = opts.image_cache_bytes;
    ec.counters = im.encoder_counters = std::make_shared<EncoderCounters>();
    // One instance, or one per [[encoder]] of a plan that names several.
    std::vector<int> threads{opts.vision_threads};
    if (plan.encoders.size() > 1) {
      threads.clear();
      for (const EncoderPlan& e : plan.encoders) threads.push_back(e.threads);
    }
    auto enc = spawn_local_encoder(*im.sys, std::move(ec), threads);
    if (!enc) return enc.error();
    im.encoder = *enc;
    cc.encoder = im.encoder;
  }
  cc.router = spawn_router(*im.sys, model, cc.scheduler, 1, cc.encoder);
  im.spawned.router = cc.router;
  im.router = cc.router;
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
  ClientRun run;
  run.self = &self;
  run.cancelled.assign(reqs.size(), 0);
  im.active = &run;
  // A router replaced while no call ran is picked up here; a failure during this call arrives as
  // a down message.
  if (auto r = im.current_router(self, caf::actor_addr{})) im.router = r;
  self->monitor(im.router);
  std::vector<GenerateRequestPtr> ptrs;
  for (const auto& r : reqs) ptrs.push_back(std::make_shared<GenerateRequest>(r));
  // What the client was streamed per request: a replacement router resumes from it.
  std::vector<ResumeState> seen(reqs.size());
  std::vector<bool> submitted(reqs.size(), false), finished(reqs.size(), false);
  size_t next = 0, done = 0;
  auto submit = [&](size_t i) {
    submitted[i] = true;
    self->send(im.router, submit_atom::value, ptrs[i], static_cast<int64_t>(i));
  };
  for (; next < reqs.size() && next < concurrency; ++next) submit(next);
  std::string failure;  // why the remaining requests got no answer
  while (done < reqs.size() && failure.empty()) {
    self->receive(
        [&](token_atom, int64_t tag, const StreamPiecePtr& piece) {
          const size_t i = static_cast<size_t>(tag);
          if (i >= results.size() || finished[i]) return;
          if (piece->token >= 0) {
            seen[i].tokens.push_back(piece->token);
            seen[i].logits.insert(seen[i].logits.end(), piece->logits.begin(), piece->logits.end());
            seen[i].rng = piece->rng;
          }
          if (on_delta) on_delta(i, piece->delta, piece->token);
        },
        [&](finish_atom, int64_t tag, const GenerateResultPtr& r) {
          const size_t i = static_cast<size_t>(tag);
          if (i >= results.size() || finished[i]) return;
          results[i] = *r;
          finished[i] = true;
          ++done;
          if (next < reqs.size()) submit(next++);
        },
        [&](caf::down_msg& dm) {
          // Everything the failed router sent us was delivered before this message: resume each
          // request it held from exactly what we were streamed.
          if (dm.source != im.router.address()) return;
          RouterActor r = im.current_router(self, dm.source);
          if (!r) {
            failure = "the router failed and the controller named no replacement";
            return;
          }
          im.router = r;
          self->monitor(im.router);
          for (size_t i = 0; i < reqs.size(); ++i) {
            if (!submitted[i] || finished[i]) continue;
            self->send(im.router, submit_atom::value, ptrs[i], static_cast<int64_t>(i),
                       ResumeStatePtr(std::make_shared<ResumeState>(seen[i])));
            if (run.cancelled[i])
              self->send(im.router, cancel_atom::value, static_cast<int64_t>(i));
          }
        },
        caf::after(std::chrono::milliseconds(im.opts.request_timeout_ms)) >>
            [&] {
              failure = "no answer within " + std::to_string(im.opts.request_timeout_ms) + " ms";
            });
  }
  im.active = nullptr;
  for (size_t i = 0; i < results.size(); ++i) {
    if (finished[i]) continue;
    results[i].finish_reason = "error";
    results[i].error = failure;
  }
  return results;
}

void LocalCluster::cancel(size_t index) {
  ClientRun* run = impl_->active;
  if (!run || index >= run->cancelled.size()) return;
  run->cancelled[index] = 1;  // a router that replaces a failed one is told again
  (*run->self)->send(impl_->router, cancel_atom::value, static_cast<int64_t>(index));
}

GenerateResult LocalCluster::generate(const GenerateRequest& req, const StreamCallback& on_delta) {
  return generate_many({req}, 1, on_delta)[0];
}

Status LocalCluster::inject_fault(const std::string& actor) {
  caf::scoped_actor self{*impl_->sys};
  bool ok = false;
  self->request(impl_->controller, kControlTimeout, crash_atom::value, actor)
      .receive([&](bool r) { ok = r; }, [&](const caf::error&) { ok = false; });
  if (!ok)
    return Error{1, "no actor named '" + actor + "' (use stage/N, expert/N, scheduler or router)"};
  return Ok{};
}

std::string LocalCluster::stats_json() {
  Impl& im = *impl_;
  caf::scoped_actor self{*im.sys};
  const ActorHandles h = im.handles(self);
  std::string sched = "null", ctrl = "null";
  compute::KvStats kv;
  if (h.scheduler) {
    self->request(h.scheduler, kControlTimeout, stats_atom::value)
        .receive([&](const std::string& s) { sched = s; }, [&](const caf::error&) {});
    self->request(h.scheduler, kControlTimeout, kv_atom::value)
        .receive([&](const compute::KvStats& s) { kv = s; }, [&](const caf::error&) {});
  }
  self->request(im.controller, kControlTimeout, stats_atom::value)
      .receive([&](const std::string& s) { ctrl = s; }, [&](const caf::error&) {});
  std::string stages;
  for (size_t i = 0; i < h.stages.size() && i < im.layers.size(); ++i) {
    uint64_t pool_bytes = 0, state_bytes = 0;
    self->request(h.stages[i], kControlTimeout, stats_atom::value)
        .receive(
            [&](const std::string& s) {
              pool_bytes = json_uint(s, "kv_bytes");
              state_bytes = json_uint(s, "state_bytes");
            },
            [&](const caf::error&) {});
    const uint64_t block_bytes =
        kv.num_blocks > 0 ? pool_bytes / static_cast<uint64_t>(kv.num_blocks) : 0;
    stages += strfmt(
        "%s{\"stage\":%zu,\"layers\":[%lld,%lld],\"blocks_total\":%lld,\"blocks_used\":%lld,"
        "\"blocks_cached\":%lld,\"blocks_free\":%lld,\"block_bytes\":%llu,\"bytes_used\":%llu,"
        "\"fragmentation_perc\":%.4f,\"state_bytes\":%llu}",
        i ? "," : "", i, (long long)im.layers[i].first, (long long)im.layers[i].second,
        (long long)kv.num_blocks, (long long)kv.num_used, (long long)kv.num_cached,
        (long long)kv.num_free, (unsigned long long)block_bytes,
        (unsigned long long)(block_bytes * static_cast<uint64_t>(kv.num_used)),
        kv.fragmentation_perc, (unsigned long long)state_bytes);
  }
  const std::string encoder =
      im.encoder_counters
          ? ",\"encoder\":" +
                detail::encoder_json(encoder_info(im.opts.vision->path, *im.encoder_counters))
          : std::string();
  return "{\"scheduler\":" + sched + ",\"controller\":" + ctrl + ",\"kv_stages\":[" + stages + "]" +
         encoder + "}";
}

}  // namespace troupe::actors
