// Node daemon: placing actors on this node, link events (its status snapshot: node_status.cc;
// the helpers the node actor's files share are in node_common.cc).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <thread>

#include <caf/send.hpp>
#include <sys/mman.h>

#include "actors/detail/node_state.h"
#include "actors/detail/remote.h"
#include "actors/expert_shard.h"
#include "actors/stage.h"
#include "compute/matmul.h"
#include "compute/thread_pool.h"

namespace troupe::actors::detail {

namespace {

struct Where {
  std::string name, host;
  uint16_t port = 0;
  // The node sends to us too and has the lower id: it connects, we wait for its link (a bounded
  // while, then connect ourselves), so that the pair does not open two links at once.
  bool wait_for_it = false;
};

// Whether node `from` sends to node `to` under placement `pl`: the next stage of each of its
// stages, and every expert shard's node (the head's link to stage 0's node exists since it
// joined).
bool sends_to(const PlacementMsg& pl, uint32_t from, uint32_t to) {
  for (size_t s = 0; s < pl.stages.size(); ++s) {
    if (pl.stages[s].node_id != from) continue;
    if (s + 1 < pl.stages.size() && pl.stages[s + 1].node_id == to) return true;
    for (const auto& sh : pl.shards)
      if (sh.node_id == to) return true;
  }
  return false;
}

// Node id -> name and address: the head's member table, or the membership it sent.
std::map<uint32_t, Where> node_table(NodeSelf* self) {
  auto& st = self->state;
  std::map<uint32_t, Where> out;
  auto address_of = [&](const std::string& name) {
    const int i = node_index(st.plan, name);
    Where w;
    w.name = name;
    if (i >= 0) {
      w.host = st.plan.cluster.nodes[static_cast<size_t>(i)].host;
      w.port = static_cast<uint16_t>(st.plan.cluster.nodes[static_cast<size_t>(i)].port);
    }
    return w;
  };
  if (st.head) {
    for (const auto& [name, m] : st.members) out[m.node_id] = address_of(name);
  } else {
    for (const auto& m : st.membership.members) out[m.node_id] = address_of(m.name);
  }
  return out;
}

// The stages and expert shards of `pl` placed on node `me` that compute on its CPUs (`plan`
// names each stage's device; stages past its list run on the CPU).
int cpu_actors_on(const PlacementMsg& pl, uint32_t me, const Plan& plan) {
  int n = 0;
  for (size_t k = 0; k < pl.stages.size(); ++k)
    n += pl.stages[k].node_id == me && (k >= plan.stages.size() || plan.stages[k].on_cpu());
  for (const auto& sh : pl.shards) n += sh.node_id == me;
  return n;
}

// The bytes of the model file this node's actors read: the layers (and embedding or output
// head) of its stages — routed experts only when no shard owns them — and its shards' experts.
std::vector<std::span<const uint8_t>> owned_weights(const model::ModelSpec& spec,
                                                    const PlacementMsg& pl, uint32_t me) {
  std::vector<std::span<const uint8_t>> out;
  auto add = [&](const model::WeightView& w) {
    if (w.present()) out.push_back({w.data, static_cast<size_t>(w.nbytes())});
  };
  auto add_ffn = [&](const model::ExpertFfn& f) { model::for_each_ffn_weight(f, add); };
  for (const auto& sp : pl.stages) {
    if (sp.node_id != me) continue;
    if (sp.has_embedding) add(spec.token_embd);
    if (sp.has_output_head) {
      add(spec.output_norm);
      if (spec.output.data != spec.token_embd.data || !sp.has_embedding) add(spec.output);
      for (const auto* w : {&spec.hc_head_fn, &spec.hc_head_base, &spec.hc_head_scale}) add(*w);
    }
    for (uint32_t l = sp.layer_begin; l < sp.layer_end && l < spec.layers.size(); ++l) {
      const model::LayerSpec& L = spec.layers[l];
      model::for_each_layer_weight(L, add);  // the shared expert too
      if (pl.shards.empty())
        for (const auto& e : L.experts) add_ffn(e);
    }
  }
  for (const auto& sh : pl.shards) {
    if (sh.node_id != me) continue;
    for (const auto& L : spec.layers)
      for (int32_t e : sh.experts)
        if (L.is_moe && static_cast<size_t>(e) < L.experts.size())
          add_ffn(L.experts[static_cast<size_t>(e)]);
  }
  return out;
}

// Reads every page of `ranges` into memory (page cache) with `threads` threads: the weights are
// resident before the first request instead of faulting in during it.
uint64_t prefetch(const std::vector<std::span<const uint8_t>>& ranges, int threads) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  uint64_t total = 0;
  for (const auto& r : ranges) total += r.size();
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> sink{0};
  auto work = [&] {
    uint64_t acc = 0;
    for (size_t i = next++; i < ranges.size(); i = next++) {
      const uint8_t* p = ranges[i].data();
      const size_t n = ranges[i].size();
      const uintptr_t a = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
      madvise(reinterpret_cast<void*>(a), n + (reinterpret_cast<uintptr_t>(p) - a), MADV_WILLNEED);
      for (size_t off = 0; off < n; off += page) acc += p[off];
    }
    sink += acc;
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  return total;
}

}  // namespace

void report_placement(NodeSelf* self, bool ok, const std::string& error) {
  auto& st = self->state;
  if (st.head)
    return head_placement_report(self, st.me.name, ok, error, st.phases,
                                 st.placement ? st.placement->version : 0);
  PlacementReportMsg r;
  r.header.cluster_epoch = st.link->epoch();
  r.version = st.placement ? st.placement->version : 0;
  r.ok = ok;
  r.error = error;
  r.phases = phase_infos(st.phases, st.link->node_id());
  send_to(self, st.head_peer, r, ActorRole::kNodeDaemon);
  if (ok)
    set_ready(self);
  else
    fail(self, error);
}

uint64_t actor_weight_bytes(const model::ModelSpec& spec, const PlacementMsg& pl, ActorRole role,
                            uint32_t index) {
  // The weights owned_weights() gives a node that hosts this one actor and nothing else.
  constexpr uint32_t kOnly = 0xffffffffu;
  PlacementMsg one = pl;
  for (auto& s : one.stages) s.node_id = role == ActorRole::kStage && s.stage == index ? kOnly : 0;
  for (auto& s : one.shards)
    s.node_id = role == ActorRole::kExpertShard && s.shard == index ? kOnly : 0;
  uint64_t bytes = 0;
  for (const auto& r : owned_weights(spec, one, kOnly)) bytes += r.size();
  return bytes;
}

// Stops the actors of the current placement (stages, shards and the proxies they use) before a
// re-placement: the head's scheduler recomputes every sequence afterwards, so nothing they hold
// is needed. Stopped with user_shutdown, so on_actor_down does not restart them. Image encoder
// instances `next` keeps in place go on (their jobs are not the scheduler's).
void stop_placed_actors(NodeSelf* self, const PlacementMsg* next = nullptr) {
  auto& st = self->state;
  for (auto& [i, a] : st.stages) self->send_exit(a, caf::exit_reason::user_shutdown);
  for (auto& [i, a] : st.shards) self->send_exit(a, caf::exit_reason::user_shutdown);
  for (auto& [n, a] : st.shard_proxies) self->send_exit(a, caf::exit_reason::user_shutdown);
  self->send_exit(st.scheduler_proxy, caf::exit_reason::user_shutdown);  // no-op when null
  for (auto& a : st.stage_proxies) self->send_exit(a, caf::exit_reason::user_shutdown);
  stop_image_encoders(self, next);
  st.stages.clear();
  st.shards.clear();
  st.shard_proxies.clear();
  st.scheduler_proxy = nullptr;
  st.stage_proxies.clear();
  st.stage_builds.clear();
  st.shard_builds.clear();
  st.owned_experts.clear();
  st.expert_shard_of.clear();
  st.expert_placement = {};
  st.placed = false;
}

void start_placement(NodeSelf* self, PlacementMsg p) {
  auto& st = self->state;
  if (st.placement && p.version <= st.placement->version) {
    std::fprintf(stderr, "troupe: node %s: ignored placement %llu (have %llu)\n",
                 st.me.name.c_str(), static_cast<unsigned long long>(p.version),
                 static_cast<unsigned long long>(st.placement->version));
    return;
  }
  if (st.placement && st.placed && st.placement->same_pipeline(p))
    return replace_image_encoders(self, std::move(p));
  if (st.placement) {
    // A re-placement (a node hosting part of the pipeline is gone): start over with the new
    // placement. Actors that stay on this node are rebuilt too; their weights are resident.
    std::fprintf(stderr, "troupe: node %s: re-placement %llu\n", st.me.name.c_str(),
                 static_cast<unsigned long long>(p.version));
    stop_placed_actors(self, &p);
    st.placement.reset();
  }
  const uint32_t me = st.link->node_id();
  // A placement names nodes by id; their names and addresses come in a Membership. The head
  // sends the membership first, but nothing here relies on the order: wait for one that names
  // every node of this placement.
  {
    auto known = node_table(self);
    bool complete = known.count(me) > 0;
    for (const auto& s : p.stages) complete &= known.count(s.node_id) > 0;
    for (const auto& s : p.shards) complete &= known.count(s.node_id) > 0;
    for (const auto& e : p.encoders) complete &= known.count(e.node_id) > 0;
    if (!complete) {
      st.pending_placement = std::move(p);
      return;
    }
  }
  st.pending_placement.reset();
  st.placement = std::move(p);
  const PlacementMsg& pl = *st.placement;
  begin_phase(self, "connect peers");
  set_waiting(self, "connecting to the nodes of its neighbours");
  // The nodes this one sends to: the next stage of each local stage, every expert shard's node,
  // and (the head) stage 0's node. Answers go back on the link they came by.
  auto table = node_table(self);
  std::vector<Where> peers;
  auto want = [&](uint32_t id) {
    if (id == me) return;
    auto it = table.find(id);
    if (it == table.end()) return;
    for (const auto& w : peers)
      if (w.name == it->second.name) return;
    peers.push_back(it->second);
    peers.back().wait_for_it = id < me && sends_to(pl, id, me);
  };
  for (size_t s = 0; s < pl.stages.size(); ++s) {
    if (pl.stages[s].node_id != me) continue;
    if (s + 1 < pl.stages.size()) want(pl.stages[s + 1].node_id);
    for (const auto& sh : pl.shards) want(sh.node_id);
  }
  if (st.head && !pl.stages.empty()) want(pl.stages[0].node_id);
  if (st.head)
    for (const auto& e : pl.encoders) want(e.node_id);
  const std::string mmproj = mmproj_to_load(self, pl);
  auto vision_slot = std::make_shared<NodeState::VisionSlot>();
  st.placed_vision = vision_slot;
  auto link = st.link;
  NodeActor node = caf::actor_cast<NodeActor>(self);
  const uint64_t version = pl.version;
  auto ranges = owned_weights(st.model->spec, pl, me);
  const int threads = compute::available_cpus();
  const auto started = st.started;
  // Where this node's stages and shards read their weights ([model] weights): a copy of just
  // their tensors in huge-page memory, or the file mapping (prefetched). "auto" copies where a
  // CPU computes with them and the copy fits (model::choose_weight_storage); a node whose
  // stages are all on GPUs uploads from the mapping, and a copy would only cost time.
  const bool cpu_here = cpu_actors_on(pl, me, st.plan) > 0;
  // The copy puts int8 matrices in the CPU kernels' tiles only in a plan without GPU stages: the
  // GPU engine uploads rows, and a later re-placement may give this node a GPU stage whose
  // tensors an earlier (tiled) copy already holds.
  const bool gpu_in_plan = std::any_of(st.plan.stages.begin(), st.plan.stages.end(),
                                       [](const StagePlan& s) { return !s.on_cpu(); });
  const model::TileTypes tile_types =
      cpu_here && !gpu_in_plan ? compute::tiled_weight_types() : model::TileTypes{};
  const auto requested = model::parse_weight_storage(st.plan.weights);  // the parser checked it
  model::WeightStorage storage = requested ? *requested : model::WeightStorage::kMap;
  if (storage == model::WeightStorage::kAuto && !cpu_here) storage = model::WeightStorage::kMap;
  // A re-placement copies only what this node does not hold yet: the views of the model its
  // actors computed with point into its earlier copy (which the new one keeps alive), the rest
  // into the mapping; a survivor that takes over a lost stage copies that stage's tensors only.
  // So a node copies each tensor at most once; the copies of actors moved away stay allocated
  // (they share buffers with the ones kept) until a placement falls back to the mapping.
  // `held` (a copy's storage holds the mapping too) keeps the mapping alive while the thread
  // reads it.
  std::shared_ptr<const model::Model> held = st.placed_weights ? st.placed_weights : st.model;
  auto slot = std::make_shared<std::shared_ptr<const model::Model>>();
  st.placed_model = slot;
  std::thread([link, peers, node, version, ranges, held, threads, started, storage, slot,
               tile_types, mmproj, vision_slot] {
    std::string error;
    for (const auto& w : peers) {
      for (int i = 0; w.wait_for_it && i < 500 && link->peer_of(w.name) == 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      auto r = link->ensure(w.name, w.host, w.port, std::chrono::milliseconds(10000));
      if (!r) {
        error = "cannot reach node " + w.name + ": " + r.error().message;
        break;
      }
    }
    const uint64_t map_start = ms_since(started);
    uint64_t bytes = 0;
    if (error.empty()) {
      std::string why;
      auto placed = model::place_weights(held, storage, ranges, threads, &why, tile_types);
      if (!placed) {
        error = placed.error().message;
      } else if (*placed != held) {
        *slot = *placed;  // written before the message below, read by the node actor after it
        bytes = model::weight_copy_bytes(*held, ranges);
      } else {
        if (!why.empty())
          std::fprintf(stderr, "troupe: reading this node's weights through the file mapping: %s\n",
                       why.c_str());
        bytes = prefetch(ranges, threads);
      }
    }
    // The slot is written before the message below, and read after it.
    if (error.empty() && !mmproj.empty()) error = vision_slot->load(mmproj, started);
    caf::anon_send(node, placed_atom::value, version, error, map_start,
                   ms_since(started) - map_start, bytes);
  }).detach();
}

void finish_placement(NodeSelf* self, uint64_t version, const std::string& error,
                      uint64_t map_start_ms, uint64_t map_ms, uint64_t map_bytes) {
  auto& st = self->state;
  if (!st.placement || st.placement->version != version) return;
  if (st.encoders_only == version) return finish_image_encoders(self, version, error);
  for (auto& p : st.phases)  // connecting ended where mapping began
    if (p.name == "connect peers" && !p.done) {
      p.duration_ms = map_start_ms - std::min(map_start_ms, p.start_ms);
      p.done = true;
    }
  if (!error.empty()) return report_placement(self, false, error);
  // The model the actors compute with: the copy in memory when one was made, else the mapping.
  std::shared_ptr<const model::Model> weights = st.model;
  if (st.placed_model && *st.placed_model) weights = *st.placed_model;
  const bool mapped = weights == st.model;
  st.placed_weights = weights;
  st.phases.push_back({mapped ? "map weights" : "copy weights", map_start_ms, map_ms, true});
  std::fprintf(stderr, "troupe: node %s: %s %.1f MB of weights (%s) in %llu ms\n",
               st.me.name.c_str(), mapped ? "mapped" : "copied into huge-page memory",
               static_cast<double>(map_bytes) / 1e6,
               mapped ? "its actors' tensors" : "the tensors of its actors it did not hold yet",
               static_cast<unsigned long long>(map_ms));
  begin_phase(self, "start actors");
  set_waiting(self, "its stages to map their weights and allocate their KV pools");
  const PlacementMsg& pl = *st.placement;
  const auto& spec = st.model->spec;
  const uint32_t me = st.link->node_id();
  auto table = node_table(self);
  auto name_of = [&](uint32_t id) { return table.count(id) ? table[id].name : std::string(); };
  auto& sys = self->system();
  st.kv_blocks = pl.kv_pools.empty() ? 0 : pl.kv_pools[0].num_blocks;
  for (const auto& k : pl.kv_pools) st.kv_blocks = std::min<int64_t>(st.kv_blocks, k.num_blocks);

  SchedulerActor to_scheduler = st.scheduler;
  if (!st.head) {
    to_scheduler = spawn_remote_scheduler(sys, st.link, st.plan.cluster.head, spec.n_vocab);
    st.scheduler_proxy = to_scheduler;
  }
  // threads = 0 ("auto"): this node's CPUs divided among the CPU stages and shards it hosts.
  const int cpu_actors = cpu_actors_on(pl, me, st.plan);
  ExpertPlacement ep;
  if (!pl.shards.empty()) {
    ep.owner.assign(static_cast<size_t>(spec.n_expert), -1);
    ep.shards.resize(pl.shards.size());
    st.expert_shard_of.assign(static_cast<size_t>(spec.n_expert), -1);
    for (size_t j = 0; j < pl.shards.size(); ++j) {
      const auto& sp = pl.shards[j];
      for (int32_t e : sp.experts) ep.owner[static_cast<size_t>(e)] = static_cast<int32_t>(j);
      if (sp.node_id == me) {
        ExpertShardConfig sc;
        sc.index = static_cast<int>(j);
        sc.experts = sp.experts;
        sc.threads = compute::resolve_threads(static_cast<int>(sp.threads), cpu_actors);
        sc.model = weights;
        ExpertShardActor a = spawn_expert_shard(sys, sc);
        self->monitor(a);
        st.shard_builds[static_cast<uint32_t>(j)] = sc;
        st.shards[static_cast<uint32_t>(j)] = a;
        ep.shards[j] = a;
        for (int32_t e : sp.experts) {
          st.owned_experts.push_back(e);
          st.expert_shard_of[static_cast<size_t>(e)] = static_cast<int32_t>(j);
        }
      } else {
        const std::string n = name_of(sp.node_id);
        auto it = st.shard_proxies.find(n);
        if (it == st.shard_proxies.end())
          it = st.shard_proxies.emplace(n, spawn_remote_shards(sys, st.link, n, spec.n_embd)).first;
        ep.shards[j] = it->second;
      }
    }
    std::sort(st.owned_experts.begin(), st.owned_experts.end());
  }
  st.expert_placement = ep;
  const size_t num_stages = pl.stages.size();
  for (size_t k = num_stages; k-- > 0;) {
    const auto& sp = pl.stages[k];
    if (sp.node_id != me) continue;
    StageInputActor next;  // stays null for the last stage: it reports to c.scheduler
    if (k + 1 < num_stages && pl.stages[k + 1].node_id == me) {
      next = st.stages[static_cast<uint32_t>(k + 1)];
    } else if (k + 1 < num_stages) {
      StageActor proxy =
          spawn_remote_stage(sys, st.link, name_of(pl.stages[k + 1].node_id),
                             static_cast<uint32_t>(k + 1), spec.hidden_width(), to_scheduler);
      st.stage_proxies.push_back(proxy);
      next = proxy;
    }
    StageConfig c;
    c.index = static_cast<int>(k);
    c.num_stages = static_cast<int>(num_stages);
    c.range = {sp.layer_begin, sp.layer_end, sp.has_embedding, sp.has_output_head};
    c.threads = compute::resolve_threads(static_cast<int>(sp.threads), cpu_actors);
    c.device = k < st.plan.stages.size() ? st.plan.stages[k].device : "cpu";
    c.parallel = k < st.plan.stages.size() ? st.plan.stages[k].parallel : "tensor";
    c.kv_blocks = st.kv_blocks;
    c.kv_block_size = st.plan.kv_block_size;
    c.kv_type = st.plan.kv_type;
    c.state_slots = state_slots_for(spec, st.plan.scheduler);
    c.max_positions = st.plan.scheduler.max_model_len;
    c.model = weights;
    c.expert_timeout = std::chrono::milliseconds(st.opts.cluster.expert_timeout_ms);
    c.scheduler = to_scheduler;
    StageActor a = spawn_stage(sys, c, next, ep);
    self->monitor(a);
    st.stages[static_cast<uint32_t>(k)] = a;
    st.stage_builds[static_cast<uint32_t>(k)] = {c, next};
  }
  if (st.head && num_stages > 0) {
    StageActor first = pl.stages[0].node_id == me
                           ? st.stages[0]
                           : spawn_remote_stage(sys, st.link, name_of(pl.stages[0].node_id), 0,
                                                spec.hidden_width(), st.scheduler);
    if (pl.stages[0].node_id != me) st.stage_proxies.push_back(first);
    self->send(st.scheduler, stage_atom::value, StageInputActor{first});
  }
  if (auto e = start_image_encoders(self, pl, me); !e.empty())
    return report_placement(self, false, e);
  // Ready once every local stage answers: its engine is built and its KV pool allocated.
  auto remaining = std::make_shared<size_t>(st.stages.size());
  auto failed = std::make_shared<std::string>();
  auto done = [self, remaining, failed, version] {
    if (--*remaining > 0) return;
    // A newer placement replaced this one while its stages started: it reports for itself.
    if (!self->state.placement || self->state.placement->version != version) return;
    end_phase(self, "start actors");
    self->state.placed = failed->empty();
    report_placement(self, failed->empty(), *failed);
  };
  if (st.stages.empty()) {
    ++*remaining;
    done();
    return;
  }
  for (auto& [idx, a] : st.stages) {
    const uint32_t i = idx;
    self->request(a, std::chrono::seconds(300), stats_atom::value)
        .then([done](const std::string&) { done(); },
              [self, i, done, failed](const caf::error& e) {
                if (failed->empty())
                  *failed = "stage " + std::to_string(i) + " on " + self->state.me.name +
                            " failed to start: " +
                            (e.context().match_elements<std::string>()
                                 ? e.context().get_as<std::string>(0)
                                 : self->system().render(e));
                done();
              });
  }
}

void on_actor_down(NodeSelf* self, const caf::down_msg& dm) {
  auto& st = self->state;
  if (st.leaving || dm.reason == caf::exit_reason::user_shutdown) return;
  const std::string why = self->system().render(dm.reason);
  auto& sys = self->system();
  auto tell_head = [&](ActorRole role, uint32_t index, const std::string& name, bool kv_lost) {
    const uint32_t n = ++st.restarts[name];
    std::fprintf(stderr, "troupe: node %s: restarted %s (restart %u): %s\n", st.me.name.c_str(),
                 name.c_str(), n, why.c_str());
    if (st.head) {
      if (kv_lost) self->send(st.scheduler, reset_atom::value);
      return;
    }
    ActorRestartMsg m;
    m.header.cluster_epoch = st.link->epoch();
    m.actor = {st.link->node_id(), role, index};
    m.reason = why;
    m.kv_lost = kv_lost;
    m.restarts = n;
    send_to(self, st.head_peer, m, ActorRole::kNodeDaemon);
  };
  for (auto& [i, a] : st.stages) {
    if (dm.source != a.address()) continue;
    const auto& b = st.stage_builds.at(i);
    StageActor fresh = spawn_stage(sys, b.cfg, b.next, st.expert_placement);
    self->monitor(fresh);
    a = fresh;
    // A local previous stage (or the scheduler, for stage 0 on the head) points at the old one;
    // remote ones reach it by index through this node, so they need nothing.
    if (auto prev = st.stages.find(i - 1); i > 0 && prev != st.stages.end()) {
      self->send(prev->second, next_atom::value, StageInputActor{fresh});
      st.stage_builds.at(i - 1).next = fresh;
    }
    if (i == 0 && st.head) self->send(st.scheduler, stage_atom::value, StageInputActor{fresh});
    return tell_head(ActorRole::kStage, i, "stage/" + std::to_string(i) + "@" + st.me.name, true);
  }
  for (auto& [j, a] : st.shards) {
    if (dm.source != a.address()) continue;
    ExpertShardActor fresh = spawn_expert_shard(sys, st.shard_builds.at(j));
    self->monitor(fresh);
    a = fresh;
    st.expert_placement.shards[j] = fresh;
    for (auto& [i, s] : st.stages) self->send(s, shards_atom::value, st.expert_placement.shards);
    return tell_head(ActorRole::kExpertShard, j, "expert/" + std::to_string(j) + "@" + st.me.name,
                     false);
  }
  if (auto j = restart_image_worker(self, dm); j >= 0)
    return tell_head(ActorRole::kEncoder, static_cast<uint32_t>(j),
                     "encoder/" + std::to_string(j) + "@" + st.me.name, false);
  std::fprintf(stderr, "troupe: node %s: an actor failed: %s\n", st.me.name.c_str(), why.c_str());
}

bool inject_fault(NodeSelf* self, const std::string& actor) {
  auto& st = self->state;
  const size_t slash = actor.find('/');
  if (slash == std::string::npos) return false;
  const std::string kind = actor.substr(0, slash);
  uint32_t idx = 0;
  try {
    idx = static_cast<uint32_t>(std::stoul(actor.substr(slash + 1)));
  } catch (...) {
    return false;
  }
  auto crash = [&](const auto& actors) {
    auto it = actors.find(idx);
    if (it == actors.end()) return false;
    self->send(it->second, crash_atom::value);
    return true;
  };
  if (kind == "stage") return crash(st.stages);
  if (kind == "expert") return crash(st.shards);
  return false;
}

void stop_local_actors(NodeSelf* self) {
  auto& st = self->state;
  stop_placed_actors(self);
  self->send_exit(st.router, caf::exit_reason::user_shutdown);
  self->send_exit(st.scheduler, caf::exit_reason::user_shutdown);
  self->send_exit(st.gateway, caf::exit_reason::user_shutdown);
  self->send_exit(st.encoder, caf::exit_reason::user_shutdown);
}

void on_peer_event(NodeSelf* self, uint64_t peer, bool up, const std::string& name,
                   const std::string& why) {
  auto& st = self->state;
  if (up) {
    st.link->add_peer(name, peer);
    return;
  }
  st.link->drop_peer(peer);
  if (!st.leaving)
    std::fprintf(stderr, "troupe: node %s: link to %s down: %s\n", st.me.name.c_str(), name.c_str(),
                 why.c_str());
  auto it = st.shard_proxies.find(name);
  if (it != st.shard_proxies.end()) self->send(it->second, linkdown_atom::value);
  image_link_down(self, name);
  if (st.gateway)
    self->send(st.gateway, linkdown_atom::value, static_cast<transport::PeerId>(peer));
  if (!st.head && peer == st.head_peer && !st.leaving) st.head_lost = true;
}

}  // namespace troupe::actors::detail
