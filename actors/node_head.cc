// The head node's controller and client gateway (see detail/node_state.h): joins (token proof,
// plan membership, model identity), leases, membership broadcasts, the placement of the plan
// once every node has joined, and client requests handed to the router.
#include <cstdio>
#include <filesystem>

#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "actors/detail/node_state.h"
#include "actors/detail/replan.h"
#include "actors/router.h"
#include "actors/scheduler.h"
#include "transport/auth.h"

namespace troupe::actors::detail {

namespace {

// --- client gateway ---------------------------------------------------------------------------

struct GatewayState {
  std::shared_ptr<Link> link;
  RouterActor router;
  int64_t n_vocab = 0;
  int64_t next_tag = 1;
  std::map<int64_t, ClientTag> by_tag;                                  // router tag -> client
  std::map<std::pair<transport::PeerId, uint64_t>, int64_t> by_client;  // client -> router tag
  std::map<int64_t, LocalRequestPtr> local_by_tag;  // router tag -> request from this process
  std::map<uint64_t, int64_t> local_by_id;          // its id -> router tag
  static inline const char* name = "gateway";
};
using GatewaySelf = GatewayActor::stateful_base<GatewayState>;

void send_event(GatewaySelf* self, transport::PeerId peer, GenerateEventMsg e) {
  auto& st = self->state;
  e.header.cluster_epoch = st.link->epoch();
  auto f = encode(e, st.n_vocab, st.link->send_info(ActorRole::kGateway));
  Status s = f ? st.link->send(peer, ControlMsg::kGenerateEvent, *f) : Status(f.error());
  if (!s)
    std::fprintf(stderr, "troupe: gateway: cannot answer request %llu of '%s': %s\n",
                 static_cast<unsigned long long>(e.tag), st.link->peer_name(peer).c_str(),
                 s.error().message.c_str());
}

GatewayActor::behavior_type gateway_behavior(GatewaySelf* self, std::shared_ptr<Link> link,
                                             RouterActor router, int64_t n_vocab) {
  self->state.link = std::move(link);
  self->state.router = std::move(router);
  self->state.n_vocab = n_vocab;
  self->set_exit_handler([self](caf::exit_msg& m) {
    // Requests from this process must hear their end: their callers wait for it.
    auto& st = self->state;
    GenerateResult r;
    r.finish_reason = "error";
    r.error = "the cluster is shutting down";
    for (auto& [rtag, lr] : st.local_by_tag)
      if (lr->callbacks.on_finish) lr->callbacks.on_finish(r);
    st.local_by_tag.clear();
    st.local_by_id.clear();
    self->quit(m.reason);
  });
  return {
      [=](submit_atom, const LocalRequestPtr& lr) {
        auto& st = self->state;  // ids come from ClusterNode's counter: never one in flight
        const int64_t rtag = st.next_tag++;
        st.local_by_tag[rtag] = lr;
        st.local_by_id[lr->id] = rtag;
        self->send(st.router, submit_atom::value, lr->request, rtag);
      },
      [=](cancel_atom, uint64_t id) {
        auto& st = self->state;
        auto it = st.local_by_id.find(id);
        if (it != st.local_by_id.end()) self->send(st.router, cancel_atom::value, it->second);
      },
      [=](submit_atom, transport::PeerId peer, uint64_t tag, const GenerateRequestPtr& req) {
        auto& st = self->state;
        if (st.by_client.count({peer, tag})) {
          GenerateEventMsg e;
          e.tag = tag;
          e.finished = true;
          e.result.finish_reason = "error";
          e.result.error = "request tag " + std::to_string(tag) + " is already in flight";
          return send_event(self, peer, e);
        }
        const int64_t rtag = st.next_tag++;
        st.by_tag[rtag] = {peer, tag};
        st.by_client[{peer, tag}] = rtag;
        self->send(st.router, submit_atom::value, req, rtag);
      },
      [=](cancel_atom, transport::PeerId peer, uint64_t tag) {
        auto& st = self->state;
        auto it = st.by_client.find({peer, tag});
        if (it != st.by_client.end()) self->send(st.router, cancel_atom::value, it->second);
      },
      [=](drain_atom) -> int64_t {
        return static_cast<int64_t>(self->state.by_tag.size() + self->state.local_by_tag.size());
      },
      [=](linkdown_atom, transport::PeerId peer) {
        // The client is gone: stop its requests (their KV is freed), nothing to answer.
        auto& st = self->state;
        for (auto& [key, rtag] : st.by_client)
          if (key.first == peer) self->send(st.router, cancel_atom::value, rtag);
      },
      [=](token_atom, int64_t rtag, const StreamPiecePtr& p) {
        auto& st = self->state;
        if (auto l = st.local_by_tag.find(rtag); l != st.local_by_tag.end()) {
          if (l->second->callbacks.on_piece)
            l->second->callbacks.on_piece(p->delta, p->token, p->logits);
          return;
        }
        auto it = st.by_tag.find(rtag);
        if (it == st.by_tag.end()) return;
        GenerateEventMsg e;
        e.tag = it->second.tag;
        e.delta = p->delta;
        e.token = p->token;
        send_event(self, it->second.peer, e);
      },
      [=](finish_atom, int64_t rtag, const GenerateResultPtr& r) {
        auto& st = self->state;
        if (auto l = st.local_by_tag.find(rtag); l != st.local_by_tag.end()) {
          const LocalRequestPtr lr = l->second;
          st.local_by_id.erase(lr->id);
          st.local_by_tag.erase(l);
          if (lr->callbacks.on_finish) lr->callbacks.on_finish(*r);
          return;
        }
        auto it = st.by_tag.find(rtag);
        if (it == st.by_tag.end()) return;
        GenerateEventMsg e;
        e.tag = it->second.tag;
        e.finished = true;
        e.result = *r;
        send_event(self, it->second.peer, e);
        st.by_client.erase({it->second.peer, it->second.tag});
        st.by_tag.erase(it);
      },
  };
}

}  // namespace

// --- membership ---------------------------------------------------------------------------

MembershipMsg membership_of(NodeSelf* self) {
  auto& st = self->state;
  MembershipMsg ms;
  ms.header.cluster_epoch = st.link->epoch();
  ms.version = st.membership_version;
  for (const auto& [name, m] : st.members) {
    MemberInfo mi;
    mi.node_id = m.node_id;
    mi.name = name;
    mi.address = m.address;
    mi.state = m.state;
    mi.last_heartbeat_age_ms = name == st.me.name ? 0 : ms_since(m.last_heartbeat);
    mi.resources = m.resources;
    ms.members.push_back(std::move(mi));
  }
  return ms;
}

namespace {

void broadcast_membership(NodeSelf* self) {
  auto& st = self->state;
  ++st.membership_version;
  const MembershipMsg ms = membership_of(self);
  for (const auto& [name, m] : st.members)
    if (name != st.me.name && m.state == MemberState::kAlive)
      send_to(self, m.peer, ms, ActorRole::kController);
}

std::string missing_nodes(NodeSelf* self) {
  auto& st = self->state;
  std::string out;
  for (const auto& n : st.plan.cluster.nodes) {
    auto it = st.members.find(n.name);
    if (it == st.members.end() || it->second.state != MemberState::kAlive)
      out += (out.empty() ? "" : ", ") + n.name;
  }
  return out;
}

PlacementMsg build_placement(NodeSelf* self) {
  auto& st = self->state;
  PlacementMsg pl =
      initial_placement(st.plan, [&](const std::string& n) { return st.members.at(n).node_id; });
  pl.header.cluster_epoch = st.link->epoch();
  pl.model_hash = st.model_hash;
  return pl;
}

void maybe_place(NodeSelf* self) {
  auto& st = self->state;
  if (st.placement_sent) return;
  const std::string missing = missing_nodes(self);
  if (!missing.empty()) {
    set_waiting(self, "nodes to join: " + missing);
    return;
  }
  st.placement_sent = true;
  end_phase(self, "wait for nodes");
  begin_phase(self, "placement");
  set_waiting(self, "nodes to start their actors");
  const PlacementMsg pl = build_placement(self);
  std::fprintf(stderr,
               "troupe: head: every node joined; placing %zu stages, %zu expert shards and %zu "
               "image encoders\n",
               pl.stages.size(), pl.shards.size(), pl.encoders.size());
  for (const auto& [name, m] : st.members)
    if (name != st.me.name) send_to(self, m.peer, pl, ActorRole::kController);
  start_placement(self, pl);
}

void replace_actors(NodeSelf* self, const std::string& what);
void wait_for_capacity(NodeSelf* self, const std::string& what, const std::string& why);

// --- joins --------------------------------------------------------------------------------

void refuse(NodeSelf* self, const MessagePtr& m, const std::string& name, const std::string& why) {
  auto& st = self->state;
  std::fprintf(stderr, "troupe: head: refused node '%s': %s\n", name.c_str(), why.c_str());
  JoinReplyMsg r;
  r.header.cluster_epoch = st.link->epoch();
  r.accepted = false;
  r.error = why;
  send_to(self, m->peer, r, ActorRole::kController);
}

void on_join(NodeSelf* self, const MessagePtr& m) {
  auto& st = self->state;
  auto j = decode_join_request(m->data(), {});
  if (!j) return drop_malformed(self, m, "join request", j.error().message);
  const std::string& name = j->name;
  if (node_index(st.plan, name) < 0)
    return refuse(self, m, name, "the head's plan has no [[node]] named '" + name + "'");
  const auto want = transport::hmac_sha256(
      st.plan.cluster.token, "troupe-join",
      {j->nonce, {reinterpret_cast<const uint8_t*>(name.data()), name.size()}});
  if (!transport::digest_equal(want, j->proof))
    return refuse(self, m, name, "the join proof does not match the cluster token");
  if (st.link->peer_name(m->peer) != name)
    return refuse(self, m, name, "the link was opened by '" + st.link->peer_name(m->peer) + "'");
  if (j->model_hash != st.model_hash)
    return refuse(self, m, name,
                  "its model file differs from the head's (" + st.plan.model_path + ")");
  auto it = st.members.find(name);
  if (it != st.members.end() && it->second.state == MemberState::kAlive &&
      it->second.peer != m->peer)
    return refuse(self, m, name, "a node named '" + name + "' is already a member");
  // A node that left or died after the placement and comes back (a restarted daemon) joins as a
  // new incarnation: a new node id, hosting nothing, room for the next re-placement. Its old
  // actors were re-placed already and its old steps carry an old scheduler epoch.
  // (A join from a member that is alive on the same link is a repeat -- it missed the head's
  // heartbeat answers for a lease -- and is answered again with nothing changed.)
  const bool rejoin =
      it != st.members.end() && it->second.state != MemberState::kAlive && st.placement_sent;
  Member& mem = st.members[name];
  if (mem.node_id == 0 || rejoin) mem.node_id = st.next_node_id++;
  if (rejoin) {
    mem.reported = true;  // it has no actor of the current placement to start
    mem.phases.clear();
  }
  mem.address = j->address;
  mem.state = MemberState::kAlive;
  mem.peer = m->peer;
  mem.last_heartbeat = Clock::now();
  mem.resources = j->resources;
  JoinReplyMsg r;
  r.header.cluster_epoch = st.link->epoch();
  r.accepted = true;
  r.node_id = mem.node_id;
  r.lease_ms = static_cast<uint32_t>(st.plan.cluster.lease_ms);
  r.heartbeat_ms = static_cast<uint32_t>(st.plan.cluster.heartbeat_ms);
  const auto proof = transport::hmac_sha256(st.plan.cluster.token, "troupe-join-reply", {j->nonce});
  std::copy(proof.begin(), proof.end(), r.proof.begin());
  send_to(self, m->peer, r, ActorRole::kController);
  std::fprintf(stderr, "troupe: head: node %s %s as node %u from %s\n", name.c_str(),
               rejoin ? "rejoined (spare capacity)" : "joined", mem.node_id, j->address.c_str());
  broadcast_membership(self);
  // A rejoined node learns the current placement (where the actors are; none on it).
  if (rejoin && st.placement) send_to(self, mem.peer, *st.placement, ActorRole::kController);
  // Requests wait for room for a gone node's actors: try again with this node.
  if (rejoin && st.awaiting_capacity) return replace_actors(self, st.capacity_what);
  maybe_place(self);
}

// The live member on `peer`, and its name in `name` (the link may have forgotten it already: a
// message can be handled after its peer's link went down).
Member* member_of_peer(NodeSelf* self, transport::PeerId peer, std::string* name = nullptr) {
  for (auto& [n, m] : self->state.members)
    if (m.peer == peer && m.state == MemberState::kAlive) {
      if (name) *name = n;
      return &m;
    }
  return nullptr;
}

// The cluster cannot serve: requests in flight end with `why` (rather than wait for steps that
// will never come back) and new ones are refused with it.
void stop_serving(NodeSelf* self, const std::string& why) {
  auto& st = self->state;
  st.serving = false;
  st.replacing = false;
  st.not_serving_why = why;
  std::fprintf(stderr, "troupe: head: the cluster stops serving: %s\n", why.c_str());
  self->send(st.scheduler, fail_atom::value, why);
}

// Node `gone` hosted part of the pipeline: move its actors to the survivors (replan) and start
// the new placement everywhere. The scheduler holds its requests meanwhile (new ones queue too)
// and recomputes them from their token logs once every survivor reports (head_placement_report),
// so clients see added latency and the same tokens. A node that comes back is not a member any
// more (its lease ended) and its old steps are dropped by the scheduler's epoch. `what` says
// which node is gone and why.
void replace_actors(NodeSelf* self, const std::string& what) {
  auto& st = self->state;
  // The head's own free memory as of now (its tick refreshes it only every heartbeat).
  st.members[st.me.name].resources = node_resources(self);
  std::map<uint32_t, Survivor> alive;
  for (const auto& [n, mem] : st.members)
    if (mem.state == MemberState::kAlive) alive[mem.node_id] = {mem.resources.free_memory_bytes};
  const PlacementMsg& old = *st.placement;
  auto next = replan(old, alive, actor_memory_of(self, old));
  if (place_encoders_only(self, what, old, alive, next)) return;
  if (!next) return wait_for_capacity(self, what, next.error().message);
  if (st.awaiting_capacity)
    std::fprintf(stderr, "troupe: head: a node with room is back after %llu ms\n",
                 static_cast<unsigned long long>(ms_since(st.capacity_since)));
  st.awaiting_capacity = false;
  std::fprintf(stderr, "troupe: head: %s; re-placing its actors (placement %llu)\n", what.c_str(),
               static_cast<unsigned long long>(next->version));
  st.replacing = true;
  self->send(st.scheduler, hold_atom::value);
  send_placement(self, std::move(*next));
}

// No survivor has room for the gone node's actors: hold the requests (new ones queue too) and
// wait, up to [cluster] replace_wait_ms, for a node to join or rejoin (on_join retries); then
// the requests end with an error that says what is missing (ARCHITECTURE.md §7).
void wait_for_capacity(NodeSelf* self, const std::string& what, const std::string& why) {
  auto& st = self->state;
  st.capacity_what = what;
  st.capacity_why = why;
  if (st.plan.cluster.replace_wait_ms <= 0)
    return stop_serving(self, what + "; cannot re-place its actors: " + why);
  if (st.awaiting_capacity) return;  // still waiting: the first deadline stands
  st.awaiting_capacity = true;
  st.capacity_since = Clock::now();
  self->send(st.scheduler, hold_atom::value);
  std::fprintf(stderr,
               "troupe: head: %s; cannot re-place its actors now: %s; requests wait up to %lld ms "
               "for a node with room to join\n",
               what.c_str(), why.c_str(), static_cast<long long>(st.plan.cluster.replace_wait_ms));
}

void member_gone(NodeSelf* self, Member& m, const std::string& name, MemberState state,
                 const std::string& why) {
  auto& st = self->state;
  m.state = state;
  std::fprintf(stderr, "troupe: head: node %s is %s: %s\n", name.c_str(), to_string(state),
               why.c_str());
  if (st.placement_sent && st.serving && st.placement) {
    bool pipeline = false, encoders = false;
    for (const auto& s : st.placement->stages) pipeline |= s.node_id == m.node_id;
    for (const auto& s : st.placement->shards) pipeline |= s.node_id == m.node_id;
    for (const auto& e : st.placement->encoders) encoders |= e.node_id == m.node_id;
    if (pipeline || encoders) {
      broadcast_membership(self);
      return replace_actors(self, "node " + name + ", which hosts " +
                                      (pipeline ? "part of the pipeline" : "image encoders") +
                                      ", is " + to_string(state) + " (" + why + ")");
    }
  }
  broadcast_membership(self);
}

}  // namespace

// --- entry points -------------------------------------------------------------------------

void send_placement(NodeSelf* self, PlacementMsg next) {
  auto& st = self->state;
  for (auto& [n, mem] : st.members) mem.reported = false;
  next.header.cluster_epoch = st.link->epoch();
  for (const auto& [n, mem] : st.members)
    if (n != st.me.name && mem.state == MemberState::kAlive)
      send_to(self, mem.peer, next, ActorRole::kController);
  start_placement(self, std::move(next));
}

void head_init(NodeSelf* self) {
  auto& st = self->state;
  st.link->set_node_id(1);
  st.link->set_epoch(1);
  Member& me = st.members[st.me.name];
  me.node_id = 1;
  me.address = st.me.host + ":" + std::to_string(st.me.port);
  me.state = MemberState::kAlive;
  me.last_heartbeat = Clock::now();
  me.resources = node_resources(self);
  st.membership_version = 1;
  SchedulerActorConfig sc;
  sc.limits = st.plan.scheduler;
  sc.kv_blocks = st.plan.stages.empty() ? 0 : st.plan.stages[0].kv_blocks;
  for (const auto& s : st.plan.stages) sc.kv_blocks = std::min(sc.kv_blocks, s.kv_blocks);
  sc.kv_block_size = st.plan.kv_block_size;
  sc.kv_pools = st.plan.kv_pools();
  sc.n_vocab = st.model->spec.n_vocab;
  sc.n_embd = st.model->spec.n_embd;
  sc.step_timeout_ms = st.opts.cluster.step_timeout_ms;
  sc.step_failure_window_ms = st.opts.cluster.step_failure_window_ms;
  sc.state_slots = state_slots_for(st.model->spec, st.plan.scheduler);
  auto& sys = self->system();
  st.scheduler = spawn_scheduler(sys, sc, StageInputActor{});
  st.router = spawn_router(sys, st.model, st.scheduler, 1, st.encoder);
  st.gateway = sys.spawn(gateway_behavior, st.link, st.router, st.model->spec.n_vocab);
  begin_phase(self, "wait for nodes");
  maybe_place(self);
}

std::string head_refusal(NodeSelf* self) {
  auto& st = self->state;
  if (st.draining) return "the cluster is shutting down";
  if (st.serving) return "";
  if (!st.not_serving_why.empty()) return "the cluster is not serving: " + st.not_serving_why;
  std::string waiting;
  {
    std::lock_guard<std::mutex> lk(st.shared->mu);
    waiting = st.shared->waiting_for;
  }
  return "the cluster is not serving" +
         (waiting.empty() ? std::string() : " (waiting for " + waiting + ")");
}

std::string head_condition(NodeSelf* self) {
  auto& st = self->state;
  if (st.draining) return "draining: the head is shutting down";
  if (!st.serving && !st.not_serving_why.empty()) return "not serving: " + st.not_serving_why;
  if (st.awaiting_capacity) {
    const uint64_t waited = ms_since(st.capacity_since);
    const uint64_t wait = static_cast<uint64_t>(st.plan.cluster.replace_wait_ms);
    return "requests held: " + st.capacity_what +
           "; cannot re-place its actors: " + st.capacity_why + "; waiting " +
           std::to_string(wait > waited ? wait - waited : 0) +
           " ms more for a node with room to join";
  }
  if (st.replacing)
    return "requests held: re-placing actors (placement " +
           std::to_string(st.placement ? st.placement->version : 0) +
           "); they are recomputed when every node has started its actors";
  if (!st.serving) {
    std::lock_guard<std::mutex> lk(st.shared->mu);
    return "forming: waiting for " +
           (st.shared->waiting_for.empty() ? std::string("the placement") : st.shared->waiting_for);
  }
  return "";
}

void head_tick(NodeSelf* self) {
  auto& st = self->state;
  if (st.leaving) return;
  st.members[st.me.name].resources = node_resources(self);  // the head's own, for re-placement
  if (st.awaiting_capacity &&
      ms_since(st.capacity_since) > static_cast<uint64_t>(st.plan.cluster.replace_wait_ms)) {
    st.awaiting_capacity = false;
    stop_serving(self, st.capacity_what + "; cannot re-place its actors: " + st.capacity_why +
                           "; no node with room joined within " +
                           std::to_string(st.plan.cluster.replace_wait_ms) + " ms");
  }
  for (auto& [name, m] : st.members) {
    if (name == st.me.name || m.state != MemberState::kAlive) continue;
    const uint64_t silent = ms_since(m.last_heartbeat);
    if (silent > static_cast<uint64_t>(st.plan.cluster.lease_ms))
      member_gone(self, m, name, MemberState::kDead,
                  "no heartbeat for " + std::to_string(silent) + " ms (lease " +
                      std::to_string(st.plan.cluster.lease_ms) + " ms)");
  }
  self->delayed_send(self, std::chrono::milliseconds(st.plan.cluster.heartbeat_ms),
                     tick_atom::value);
}

void head_placement_report(NodeSelf* self, const std::string& node, bool ok,
                           const std::string& error, std::vector<Phase> phases, uint64_t version) {
  auto& st = self->state;
  auto it = st.members.find(node);
  if (it == st.members.end()) return;
  if (!st.placement || version != st.placement->version) return;  // an earlier placement's
  it->second.phases = std::move(phases);
  if (!ok && st.encoders_only == version) {
    // The pipeline is unaffected: requests with images fail in the encoder front (no instance
    // within its wait) until a later placement brings one; everything else keeps serving.
    std::fprintf(stderr, "troupe: head: image encoders of placement %llu failed on node %s: %s\n",
                 static_cast<unsigned long long>(version), node.c_str(), error.c_str());
    return;
  }
  if (!ok && st.replacing) {
    // Often a node that dies in the same lease as the one being replaced (its actors could not
    // be reached): its own verdict re-places again. So the requests wait as for missing
    // capacity, and fail only if nothing changes within replace_wait_ms.
    return wait_for_capacity(
        self, "re-placement " + std::to_string(version) + " failed on node " + node, error);
  }
  if (!ok) return fail(self, "placement failed on node " + node + ": " + error);
  it->second.reported = true;
  if (st.placement_done && !st.replacing) return;  // a rejoined node took the current placement
  for (const auto& [name, m] : st.members)
    if (m.state == MemberState::kAlive && !m.reported) {
      if (!st.replacing) set_waiting(self, "node " + name + " to start its actors");
      return;
    }
  if (st.replacing) {
    // Every survivor runs its actors of the new placement and stage 0's handle went to the
    // scheduler: recompute every request from its token log on the new pipeline.
    st.replacing = false;
    std::fprintf(stderr,
                 "troupe: head: re-placement %llu done; recomputing the requests in flight\n",
                 static_cast<unsigned long long>(version));
    self->send(st.scheduler, reset_atom::value);
    return;
  }
  st.placement_done = true;
  end_phase(self, "placement");
  // Warm-up: one token through every stage (and every expert shard the router picks), so the
  // first client does not pay for cold caches, page faults and first connections.
  begin_phase(self, "warm-up");
  set_waiting(self, "the warm-up generation");
  auto req = std::make_shared<GenerateRequest>();
  req->prompt_tokens = {static_cast<int32_t>(std::min<int64_t>(1, st.model->spec.n_vocab - 1))};
  req->max_tokens = 1;
  req->sampling.ignore_eos = true;
  self->send(st.router, submit_atom::value, GenerateRequestPtr(std::move(req)), int64_t{0});
}

void head_warmed_up(NodeSelf* self, const GenerateResult& r) {
  auto& st = self->state;
  if (st.serving || !st.placement_sent) return;
  if (!r.ok()) return fail(self, "the warm-up generation failed: " + r.error);
  end_phase(self, "warm-up");
  st.serving = true;
  std::fprintf(stderr, "troupe: head: serving (%zu nodes)\n", st.members.size());
  set_ready(self);
}

void head_on_wire(NodeSelf* self, ControlMsg kind, const MessagePtr& m) {
  auto& st = self->state;
  switch (kind) {
    case ControlMsg::kJoinRequest:
      return on_join(self, m);
    case ControlMsg::kHeartbeat: {
      auto hb = decode_heartbeat(m->data(), {});
      if (!hb) return drop_malformed(self, m, "heartbeat", hb.error().message);
      Member* mem = member_of_peer(self, m->peer);
      if (!mem) return;  // not a member (any more): it will notice its lease ran out
      mem->last_heartbeat = Clock::now();
      mem->resources = hb->resources;
      mem->links = std::move(hb->links);
      mem->transport = std::move(hb->transport);
      HeartbeatAckMsg ack;
      ack.header.cluster_epoch = st.link->epoch();
      ack.lease_ms = static_cast<uint32_t>(st.plan.cluster.lease_ms);
      ack.membership_version = st.membership_version;
      send_to(self, m->peer, ack, ActorRole::kController);
      return;
    }
    case ControlMsg::kPlacementReport: {
      auto r = decode_placement_report(m->data(), {});
      if (!r) return drop_malformed(self, m, "placement report", r.error().message);
      std::string name;
      if (!member_of_peer(self, m->peer, &name)) return;
      std::vector<Phase> phases;
      for (const auto& p : r->phases) phases.push_back({p.name, p.start_ms, p.duration_ms, p.done});
      return head_placement_report(self, name, r->ok, r->error, std::move(phases), r->version);
    }
    case ControlMsg::kLeaveNotice: {
      auto r = decode_leave_notice(m->data(), {});
      if (!r) return drop_malformed(self, m, "leave notice", r.error().message);
      std::string name;
      Member* mem = member_of_peer(self, m->peer, &name);
      if (!mem) return;
      return member_gone(self, *mem, name, MemberState::kLeft, "left (" + r->reason + ")");
    }
    case ControlMsg::kGenerateRequest: {
      ClientLimits lim;  // token ids are the router's to check: it answers with an error result
      auto r = decode_generate_request(m->data(), lim);
      if (!r) return drop_malformed(self, m, "generate request", r.error().message);
      if (std::string why = head_refusal(self); !why.empty()) {
        GenerateEventMsg e;
        e.header.cluster_epoch = st.link->epoch();
        e.tag = r->tag;
        e.finished = true;
        e.result.finish_reason = "error";
        e.result.error = std::move(why);
        auto f = encode(e, st.model->spec.n_vocab, st.link->send_info(ActorRole::kGateway));
        if (f) (void)st.link->send(m->peer, ControlMsg::kGenerateEvent, *f);
        return;
      }
      self->send(st.gateway, submit_atom::value, m->peer, r->tag,
                 GenerateRequestPtr(std::make_shared<GenerateRequest>(std::move(r->request))));
      return;
    }
    case ControlMsg::kActorRestart: {
      auto r = decode_actor_restart(m->data(), {});
      if (!r) return drop_malformed(self, m, "actor restart", r.error().message);
      std::fprintf(stderr, "troupe: head: %s restarted an actor (%s, restart %u)%s\n",
                   st.link->peer_name(m->peer).c_str(), r->reason.c_str(), r->restarts,
                   r->kv_lost ? ": recomputing the running sequences" : "");
      if (r->kv_lost) self->send(st.scheduler, reset_atom::value);
      return;
    }
    case ControlMsg::kCancelRequest: {
      auto r = decode_cancel_request(m->data(), {});
      if (!r) return drop_malformed(self, m, "cancel request", r.error().message);
      self->send(st.gateway, cancel_atom::value, m->peer, r->tag);
      return;
    }
    default:
      return drop_malformed(self, m, to_string(kind), "not expected by the head");
  }
}

}  // namespace troupe::actors::detail
