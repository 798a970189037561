// ClusterNode: the node daemon (see cluster_node.h). One CAF actor, the node actor, owns the
// daemon's state; the transport's thread hands it every frame and link event. The head's
// controller part (joins, leases, placement, client requests) lives in node_head.cc, the
// placement of actors on a node in node_place.cc; this file starts the daemon, joins and
// heartbeats, and routes the data plane (steps, results, expert rows) to local actors.
#include "actors/cluster_node.h"

#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <thread>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include "actors/detail/node_state.h"
#include "actors/detail/replan.h"
#include "actors/encoder.h"
#include "transport/auth.h"

namespace troupe::actors {

using namespace detail;

namespace detail {

// This node's resources as the head should see them: the host's, with free memory capped by
// the node's memory_limit_mb less what the actors placed on it now take (weights, and the
// stages' KV pools and recurrent states: actor_memory_of).
ResourcesInfo node_resources(NodeSelf* self) {
  auto& st = self->state;
  ResourcesInfo r = local_resources();
  if (st.me.memory_limit_mb <= 0) return r;
  uint64_t used = 0;
  if (st.placement) {
    const uint32_t me = st.link->node_id();
    const auto memory = actor_memory_of(self, *st.placement);
    for_each_placed_actor(*st.placement, [&](ActorRole role, uint32_t index, uint32_t node) {
      if (node == me) used += memory(role, index).total();
    });
  }
  const uint64_t limit = static_cast<uint64_t>(st.me.memory_limit_mb) << 20;
  r.free_memory_bytes = std::min(r.free_memory_bytes, limit > used ? limit - used : 0);
  return r;
}

void transport_counters(NodeSelf* self, std::vector<LinkCountersInfo>* links,
                        TransportCountersInfo* totals) {
  const std::string& me = self->state.me.name;
  *totals = TransportCountersInfo{me};
  links->clear();
  auto tx = self->state.link->transport();
  if (!tx) return;
  const auto s = tx->stats();
  totals->auth_failures = s.auth_failures;
  totals->unauthenticated_dropped = s.unauthenticated_dropped;
  totals->connections_accepted = s.connections_accepted;
  for (const auto& l : s.links) {
    if (!l.up) continue;  // closed links (every finished client's) would pile up
    links->push_back({me, l.name, l.address, l.messages_sent, l.bytes_sent, l.messages_received,
                      l.bytes_received, l.send_errors, l.malformed, l.corrupted, l.oversized,
                      l.pulled, l.pulls_to, l.pulls_from});
  }
}

}  // namespace detail

namespace {

// The data plane: frames that go straight to a local actor after validation.
void route_step(NodeSelf* self, const MessagePtr& m) {
  auto& st = self->state;
  const auto& spec = st.model->spec;
  StepLimits lim;
  lim.n_embd = spec.hidden_width();  // DeepSeek-V4's stages hand on all its streams
  lim.n_vocab = spec.n_vocab;
  lim.block_size = st.plan.kv_block_size;
  lim.max_positions = st.plan.scheduler.max_model_len;
  lim.num_kv_blocks = st.kv_blocks;
  lim.num_state_slots = state_slots_for(spec, st.plan.scheduler);
  // StepBatch.epoch is the scheduler's epoch (it drops stale outcomes itself), not the cluster's.
  lim.expected_epoch = 0;
  auto d = decode_step(m->data(), lim);
  if (!d) return drop_malformed(self, m, "step", d.error().message);
  auto it = st.stages.find(d->stage);
  if (it == st.stages.end())
    return drop_malformed(self, m, "step",
                          "stage " + std::to_string(d->stage) + " is not placed on this node");
  self->send(it->second, step_atom::value, d->batch, d->hidden, 0.0);
}

void route_outcome(NodeSelf* self, const MessagePtr& m) {
  auto& st = self->state;
  if (!st.head || !st.scheduler) return drop_malformed(self, m, "step result", "not the head");
  OutcomeLimits lim;
  lim.n_vocab = st.model->spec.n_vocab;
  auto d = decode_step_outcome(m->data(), lim);
  if (!d) return drop_malformed(self, m, "step result", d.error().message);
  self->send(st.scheduler, done_atom::value, d->outcome);
}

void route_dispatch(NodeSelf* self, const MessagePtr& m) {
  auto& st = self->state;
  const auto& spec = st.model->spec;
  DispatchLimits lim;
  lim.n_embd = spec.n_embd;
  lim.n_layer = spec.n_layer;
  lim.owned = st.owned_experts;
  lim.expected_epoch = st.link->epoch();
  auto d = decode_expert_dispatch(m->data(), lim);
  if (!d) return drop_malformed(self, m, "expert dispatch", d.error().message);
  ExpertRequestPtr req = d->request;
  if (req->experts.empty()) return drop_malformed(self, m, "expert dispatch", "no rows");
  const int32_t shard = st.expert_shard_of[static_cast<size_t>(req->experts[0])];
  for (int32_t e : req->experts)
    if (st.expert_shard_of[static_cast<size_t>(e)] != shard)
      return drop_malformed(self, m, "expert dispatch", "rows for experts of several shards");
  // Answer when the shard is done (on its thread): the Latch fires the send.
  std::weak_ptr<ExpertRequest> weak = req;
  auto link = st.link;
  const transport::PeerId peer = m->peer;
  const ExpertStep step = d->step;
  const int64_t n_embd = spec.n_embd;
  req->done = std::make_shared<Latch>(1, [weak, link, peer, step, n_embd, shard] {
    ExpertRequestPtr r = weak.lock();
    if (!r) return;
    auto f = encode_expert_combine(
        r, n_embd, step, link->send_info(ActorRole::kExpertShard, static_cast<uint32_t>(shard)),
        0.0);
    if (f) (void)link->send(peer, ControlMsg::kExpertCombine, *f);
  });
  // Guarded: if the shard stops with the request unanswered, the stage still gets an answer.
  self->send(st.shards.at(static_cast<uint32_t>(shard)), expert_atom::value,
             guard_request(req, "expert shard " + std::to_string(shard) + " on " + st.me.name +
                                    " stopped without answering"));
}

void route_combine(NodeSelf* self, const MessagePtr& m) {
  auto& st = self->state;
  const std::string name = st.link->peer_name(m->peer);
  auto it = st.shard_proxies.find(name);
  if (it == st.shard_proxies.end())
    return drop_malformed(self, m, "expert answer", "no expert request went to " + name);
  self->send(it->second, combine_atom::value, m);
}

// --- joining and heartbeats (every node but the head) -------------------------------------

void send_join(NodeSelf* self) {
  auto& st = self->state;
  JoinRequestMsg j;
  j.name = st.me.name;
  j.address = st.me.host + ":" + std::to_string(st.me.port);
  j.version = st.opts.version;
  j.pid = static_cast<uint32_t>(getpid());
  j.model_hash = st.model_hash;
  j.resources = node_resources(self);
  transport::random_bytes(st.join_nonce);
  j.nonce = st.join_nonce;
  const auto proof = transport::hmac_sha256(
      st.plan.cluster.token, "troupe-join",
      {st.join_nonce, {reinterpret_cast<const uint8_t*>(j.name.data()), j.name.size()}});
  std::copy(proof.begin(), proof.end(), j.proof.begin());
  send_to(self, st.head_peer, j, ActorRole::kNodeDaemon);
}

void on_join_reply(NodeSelf* self, const MessagePtr& m) {
  auto& st = self->state;
  auto r = decode_join_reply(m->data(), {});
  if (!r) return drop_malformed(self, m, "join reply", r.error().message);
  if (!r->accepted) return fail(self, "the head refused this node: " + r->error);
  const auto want =
      transport::hmac_sha256(st.plan.cluster.token, "troupe-join-reply", {st.join_nonce});
  if (!transport::digest_equal(want, r->proof))
    return fail(self, "the head's join reply does not prove the cluster token");
  st.link->set_node_id(r->node_id);
  st.link->set_epoch(r->header.cluster_epoch);
  st.lease_ms = r->lease_ms;
  st.heartbeat_ms = r->heartbeat_ms;
  st.last_ack = Clock::now();
  if (st.joined) {
    // The answer to a rejoin (worker_tick): the head had declared this node gone and takes it
    // back as a new incarnation; the placement it sends next stops the actors it had.
    st.head_lost = false;
    std::fprintf(stderr, "troupe: node %s rejoined as node %u\n", st.me.name.c_str(), r->node_id);
    return;
  }
  st.joined = true;
  end_phase(self, "join");
  std::fprintf(stderr, "troupe: node %s joined as node %u (epoch %llu)\n", st.me.name.c_str(),
               r->node_id, static_cast<unsigned long long>(r->header.cluster_epoch));
  self->send(self, tick_atom::value);
}

void worker_tick(NodeSelf* self) {
  auto& st = self->state;
  if (!st.joined || st.leaving) return;
  HeartbeatMsg hb;
  hb.header.cluster_epoch = st.link->epoch();
  hb.lease_ms = st.lease_ms;
  hb.resources = node_resources(self);
  hb.num_actors =
      static_cast<uint32_t>(st.stages.size() + st.shards.size() + st.image_workers.size());
  hb.uptime_ms = ms_since(st.started);
  transport_counters(self, &hb.links, &hb.transport);
  send_to(self, st.head_peer, hb, ActorRole::kNodeDaemon);
  repeat_image_receipts(self);
  const auto silent = ms_since(st.last_ack);
  if (silent > st.lease_ms && !st.head_lost) {
    st.head_lost = true;
    st.last_join = Clock::now();
    std::fprintf(stderr, "troupe: node %s: no heartbeat answer from the head for %llu ms\n",
                 st.me.name.c_str(), static_cast<unsigned long long>(silent));
  }
  // The head does not answer: either it is unreachable or it declared this node gone (its lease
  // ran out while a link was cut) and ignores its heartbeats. Ask to join again once per lease;
  // a head that declared it gone takes it back as spare capacity.
  if (st.head_lost && ms_since(st.last_join) > st.lease_ms) {
    st.last_join = Clock::now();
    send_join(self);
  }
  self->delayed_send(self, std::chrono::milliseconds(st.heartbeat_ms), tick_atom::value);
}

void on_wire(NodeSelf* self, const MessagePtr& m) {
  auto& st = self->state;
  ControlMsg kind;
  if (!control_msg_of(m->type, &kind))
    return drop_malformed(self, m, "message", "unknown message type " + std::to_string(m->type));
  switch (kind) {
    case ControlMsg::kBatchDescriptor:
      return route_step(self, m);
    case ControlMsg::kStepResult:
      return route_outcome(self, m);
    case ControlMsg::kExpertDispatch:
      return route_dispatch(self, m);
    case ControlMsg::kExpertCombine:
      return route_combine(self, m);
    case ControlMsg::kEncodeImage:
      return route_image(self, m);
    case ControlMsg::kEncodedImage:
      return route_image_answer(self, m);
    case ControlMsg::kJoinReply:
      return on_join_reply(self, m);
    case ControlMsg::kHeartbeatAck:
      if (auto a = decode_heartbeat_ack(m->data(), {}); a) {
        st.last_ack = Clock::now();
        st.head_lost = false;
      } else {
        drop_malformed(self, m, "heartbeat ack", a.error().message);
      }
      return;
    case ControlMsg::kMembership:
      if (auto ms = decode_membership(m->data(), {}); !ms) {
        drop_malformed(self, m, "membership", ms.error().message);
      } else if (ms->version >= st.membership.version) {  // an older view may arrive late
        st.membership = std::move(*ms);
        if (st.pending_placement) {
          PlacementMsg p = std::move(*st.pending_placement);
          st.pending_placement.reset();
          start_placement(self, std::move(p));
        }
      }
      return;
    case ControlMsg::kPlacement:
      if (auto p = decode_placement(m->data(), {}); p)
        start_placement(self, std::move(*p));
      else
        drop_malformed(self, m, "placement", p.error().message);
      return;
    case ControlMsg::kStatusRequest:
      return answer_status(self, m);
    default:
      if (st.head) return head_on_wire(self, kind, m);
      return drop_malformed(self, m, to_string(kind), "not handled by a node that is not the head");
  }
}

}  // namespace

NodeActor::behavior_type detail::node_behavior(NodeSelf* self, NodeConfig cfg) {
  auto& st = self->state;
  st.plan = std::move(cfg.plan);
  st.opts = std::move(cfg.opts);
  st.link = std::move(cfg.link);
  st.shared = std::move(cfg.shared);
  st.model = std::move(cfg.model);
  st.model_hash = cfg.model_hash;
  st.encoder = std::move(cfg.encoder);
  st.encoder_counters = std::move(cfg.encoder_counters);
  st.vision = std::move(cfg.vision);
  st.started = cfg.started;
  st.phases = std::move(cfg.phases);
  st.me = st.plan.cluster.nodes[static_cast<size_t>(node_index(st.plan, st.opts.name))];
  st.head = st.opts.name == st.plan.cluster.head;
  if (st.head)
    head_init(self);
  else
    begin_phase(self, "join");
  self->set_down_handler([self](caf::down_msg& dm) { on_actor_down(self, dm); });
  return {
      [=](wire_atom, const MessagePtr& m) { on_wire(self, m); },
      [=](peer_atom, uint64_t peer, bool up, const std::string& name, const std::string& why) {
        on_peer_event(self, peer, up, name, why);
      },
      [=](joined_atom, uint64_t peer, const std::string& error) {
        if (peer == 0) return fail(self, error);
        self->state.head_peer = peer;
        send_join(self);
      },
      [=](placed_atom, uint64_t version, const std::string& error, uint64_t map_start_ms,
          uint64_t map_ms, uint64_t map_bytes) {
        finish_placement(self, version, error, map_start_ms, map_ms, map_bytes);
      },
      // The head's warm-up generation (see head_placement_report) answers here.
      [=](token_atom, int64_t, const StreamPiecePtr&) {},
      [=](finish_atom, int64_t, const GenerateResultPtr& r) { head_warmed_up(self, *r); },
      [=](tick_atom) {
        if (self->state.head)
          head_tick(self);
        else
          worker_tick(self);
      },
      [=](leave_atom, const std::string& reason) -> bool {
        auto& s = self->state;
        if (s.leaving) return true;
        s.leaving = true;
        if (!s.head && s.joined) {
          LeaveNoticeMsg n;
          n.header.cluster_epoch = s.link->epoch();
          n.reason = reason;
          send_to(self, s.head_peer, n, ActorRole::kNodeDaemon);
        }
        stop_local_actors(self);
        return true;
      },
      [=](status_atom) -> std::string { return status_json(self); },
      [=](crash_atom, const std::string& actor) -> bool { return inject_fault(self, actor); },
      [=](drain_atom) -> caf::result<int64_t> {
        // The head stops admitting; the answer is the number of client requests in flight.
        auto& s = self->state;
        s.draining = true;
        if (!s.head || !s.gateway) return int64_t{0};
        auto rp = self->make_response_promise<int64_t>();
        self->request(s.gateway, std::chrono::seconds(5), drain_atom::value)
            .then([rp](int64_t n) mutable { rp.deliver(n); },
                  [rp](caf::error& e) mutable { rp.deliver(std::move(e)); });
        return rp;
      },
      [=](submit_atom, const LocalRequestPtr& lr) {
        auto& s = self->state;
        // Only the head has a gateway (ClusterNode::submit refuses on other nodes).
        std::string why = !s.gateway  ? "this node is not the cluster's head"
                          : s.leaving ? "the cluster is shutting down"
                                      : head_refusal(self);
        if (why.empty()) return self->send(s.gateway, submit_atom::value, lr);
        GenerateResult r;
        r.finish_reason = "error";
        r.error = std::move(why);
        if (lr->callbacks.on_finish) lr->callbacks.on_finish(r);
      },
      [=](cancel_atom, uint64_t id) {
        if (self->state.gateway) self->send(self->state.gateway, cancel_atom::value, id);
      },
      [=](stats_atom) -> caf::result<std::string> {
        auto& s = self->state;
        if (!s.head || !s.scheduler) return std::string("{}");
        auto rp = self->make_response_promise<std::string>();
        self->request(s.scheduler, std::chrono::seconds(5), stats_atom::value)
            .then([rp](const std::string& j) mutable { rp.deliver(j); },
                  [rp](caf::error&) mutable { rp.deliver(std::string("{}")); });
        return rp;
      },
  };
}

// --- ClusterNode ----------------------------------------------------------------------------

struct ClusterNode::Impl {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  NodeActor node;
  std::shared_ptr<Link> link;
  std::shared_ptr<NodeShared> shared;
  std::shared_ptr<transport::Transport> tx;
  std::thread joiner;
  std::shared_ptr<std::atomic<bool>> stop_joining = std::make_shared<std::atomic<bool>>(false);
  bool head = false;
  bool left = false;
  std::shared_ptr<const model::Model> model;
  std::shared_ptr<const model::VisionModel> vision;
  std::atomic<uint64_t> next_request{1};
  std::chrono::milliseconds drain_timeout{30000};

  ~Impl() {
    stop_joining->store(true);
    if (joiner.joinable()) joiner.join();
    if (link) link->set_transport(nullptr);
    tx.reset();  // no more frames to the node actor
    if (sys) {
      if (node) {
        caf::scoped_actor self{*sys};
        self->request(node, std::chrono::seconds(5), leave_atom::value, std::string("shutdown"))
            .receive([](bool) {}, [](const caf::error&) {});
        caf::anon_send_exit(node, caf::exit_reason::user_shutdown);
      }
    }
  }
};

namespace {

// A resolved plan's nodes numbered by their place in it (1, 2, ...), before any joins: enough to
// tell which actors share a node.
uint32_t plan_node_id(const Plan& plan, const std::string& name) {
  return static_cast<uint32_t>(node_index(plan, name) + 1);
}

PlacementMsg plan_placement(const Plan& plan) {
  return initial_placement(plan, [&](const std::string& n) { return plan_node_id(plan, n); });
}

}  // namespace

std::map<std::string, uint64_t> placed_memory_bytes(const Plan& plan,
                                                    const model::ModelSpec& spec) {
  const PlacementMsg pl = plan_placement(plan);
  const auto memory = actor_memory_in(spec, plan, pl);
  std::map<std::string, uint64_t> out;
  for (const auto& n : plan.cluster.nodes) out[n.name] = 0;
  for_each_placed_actor(pl, [&](ActorRole role, uint32_t index, uint32_t node) {
    out[plan.cluster.nodes.at(node - 1).name] += memory(role, index).total();
  });
  return out;
}

ClusterNode::ClusterNode() : impl_(std::make_unique<Impl>()) {}

ClusterNode::~ClusterNode() {
  if (impl_ && !impl_->left) leave("shutdown");
}

Result<std::unique_ptr<ClusterNode>> ClusterNode::start(Plan plan, const NodeOptions& opts) {
  const auto started = Clock::now();
  if (!plan.cluster.present())
    return Error{1, plan.source + ": no [[node]] tables: this plan describes no cluster"};
  if (auto s = resolve_placement(plan); !s) return s.error();
  const int idx = node_index(plan, opts.name);
  if (idx < 0) {
    std::string names;
    for (const auto& n : plan.cluster.nodes) names += (names.empty() ? "" : ", ") + n.name;
    return Error{1,
                 plan.source + ": no [[node]] is named '" + opts.name + "' (nodes: " + names + ")"};
  }
  std::unique_ptr<ClusterNode> cn(new ClusterNode());
  Impl& im = *cn->impl_;
  im.head = opts.name == plan.cluster.head;
  im.drain_timeout = opts.drain_timeout;
  std::vector<Phase> phases;
  // Every node maps the model at start: the join carries its hash, so that a node with another
  // file is refused before anything is placed on it. The mapping is lazy: only the pages of the
  // tensors this node's actors use are ever read.
  phases.push_back({"load model", ms_since(started), 0, false});
  auto model = model::load_model(plan.model_path);
  if (!model) return model.error();
  if (auto s = resolve_plan(plan, (*model)->spec); !s) return s.error();
  if (auto s = resolve_placement(plan); !s) return s.error();
  {
    // A node whose memory_limit_mb cannot hold what the plan puts on it: every node says so at
    // start, before anything is loaded (as re-placement would refuse to move those actors there).
    const PlacementMsg first = plan_placement(plan);
    if (auto s = check_memory_limits(
            plan, first, [&](const std::string& n) { return plan_node_id(plan, n); },
            actor_memory_in((*model)->spec, plan, first));
        !s)
      return s.error();
  }
  phases.back().duration_ms = ms_since(started) - phases.back().start_ms;
  phases.back().done = true;

  im.cfg.set("scheduler.max-threads", size_t{1});
  im.cfg.set("work-stealing.aggressive-poll-attempts", size_t{10});
  im.cfg.set("work-stealing.moderate-poll-attempts", size_t{1});
  im.sys = std::make_unique<caf::actor_system>(im.cfg);
  im.link = std::make_shared<Link>(im.head ? 1u : 0u);
  im.shared = std::make_shared<NodeShared>();

  const NodePlan me = plan.cluster.nodes[static_cast<size_t>(idx)];
  NodeConfig nc;
  nc.plan = plan;
  nc.opts = opts;
  nc.link = im.link;
  nc.shared = im.shared;
  nc.model = *model;
  im.model = *model;
  nc.model_hash = model_file_hash(plan.model_path);
  nc.started = started;
  if (im.head && !plan.mmproj.empty()) {
    // The head encodes the images of client requests: load the encoder now, so that a file that
    // is missing or does not belong to the model stops `troupe serve` at once.
    phases.push_back({"load vision encoder", ms_since(started), 0, false});
    auto vision = model::load_vision_model(plan.mmproj);
    if (!vision) return Error{1, plan.source + ": [model] mmproj: " + vision.error().message};
    nc.vision = *vision;
    im.vision = *vision;
    EncoderConfig ec;
    ec.vision = *vision;
    ec.model = *model;
    ec.cache_bytes = plan.image_cache_mb << 20;
    ec.counters = std::make_shared<EncoderCounters>();
    nc.encoder_counters = ec.counters;
    auto enc = spawn_encoder(*im.sys, std::move(ec));
    if (!enc) return Error{1, plan.source + ": [model] mmproj: " + enc.error().message};
    nc.encoder = *enc;
    phases.back().duration_ms = ms_since(started) - phases.back().start_ms;
    phases.back().done = true;
  }
  nc.phases = std::move(phases);
  const EncoderActor encoder = nc.encoder;
  im.node = im.sys->spawn(node_behavior, std::move(nc));

  transport::TransportOptions to;
  to.node_name = opts.name;
  to.cluster_token = plan.cluster.token;
  to.listen_host = me.host;
  to.listen_port = static_cast<uint16_t>(me.port);
  to.tls = plan.cluster.ucx_tls;
  to.net_devices = plan.cluster.ucx_net_devices;
  to.error_mode = plan.cluster.error_mode == "peer"   ? transport::ErrorMode::kPeer
                  : plan.cluster.error_mode == "none" ? transport::ErrorMode::kNone
                                                      : transport::ErrorMode::kAuto;
  to.checksum_payloads = plan.cluster.payload_checksums;
  to.same_host_pull = plan.cluster.same_host_pull;
  to.faults = opts.faults;
  NodeActor node = im.node;
  auto tx = transport::Transport::start(
      to,
      [node](transport::Message&& m) {
        caf::anon_send(node, wire_atom::value,
                       MessagePtr(std::make_shared<transport::Message>(std::move(m))));
      },
      [node](transport::PeerId p, transport::PeerEvent e, const std::string& name,
             const std::string& why) {
        caf::anon_send(node, peer_atom::value, static_cast<uint64_t>(p),
                       e == transport::PeerEvent::kUp, name, why);
      });
  if (!tx) {
    caf::anon_send_exit(im.node, caf::exit_reason::user_shutdown);
    if (encoder) caf::anon_send_exit(encoder, caf::exit_reason::user_shutdown);
    im.node = nullptr;
    return Error{1, "node " + opts.name + ": " + tx.error().message};
  }
  im.tx = std::move(*tx);
  im.link->set_transport(im.tx);
  std::fprintf(stderr, "troupe: node %s listening on %s:%u%s\n", opts.name.c_str(), me.host.c_str(),
               im.tx->port(), im.head ? " (head)" : "");
  if (!im.head) {
    // Reach the head in the background; the node actor sends the join once linked.
    const NodePlan head =
        plan.cluster.nodes[static_cast<size_t>(node_index(plan, plan.cluster.head))];
    auto link = im.link;
    const auto timeout = opts.join_timeout;
    auto stop = im.stop_joining;
    im.joiner = std::thread([link, head, node, timeout, stop] {
      const auto deadline = Clock::now() + timeout;
      std::string last;
      // Nodes usually start together with the head: retry soon, then back off.
      auto pause = std::chrono::milliseconds(10);
      while (Clock::now() < deadline && !stop->load()) {
        auto r = link->ensure(head.name, head.host, static_cast<uint16_t>(head.port),
                              std::chrono::milliseconds(2000));
        if (r)
          return caf::anon_send(node, joined_atom::value, static_cast<uint64_t>(*r), std::string());
        last = r.error().message;
        if (last.find("refused by") != std::string::npos) break;  // wrong token: do not retry
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, std::chrono::milliseconds(500));
      }
      if (stop->load()) return;
      caf::anon_send(node, joined_atom::value, uint64_t{0},
                     "cannot join the head " + head.name + " at " + head.host + ":" +
                         std::to_string(head.port) + ": " + last);
    });
  } else {
    caf::anon_send(im.node, tick_atom::value);
  }
  return cn;
}

bool ClusterNode::is_head() const { return impl_->head; }
uint16_t ClusterNode::port() const { return impl_->tx ? impl_->tx->port() : 0; }

Status ClusterNode::wait_ready(std::chrono::milliseconds timeout) {
  NodeShared& sh = *impl_->shared;
  std::unique_lock<std::mutex> lk(sh.mu);
  if (!sh.cv.wait_for(lk, timeout, [&] { return sh.ready || !sh.failed.empty(); }))
    return Error{1, "not ready within " + std::to_string(timeout.count()) + " ms: " +
                        (sh.waiting_for.empty() ? std::string("still starting") : sh.waiting_for)};
  if (!sh.failed.empty()) return Error{1, sh.failed};
  return Ok{};
}

void ClusterNode::leave(const std::string& reason) {
  Impl& im = *impl_;
  if (im.left) return;
  im.left = true;
  if (im.sys && im.node) {
    caf::scoped_actor self{*im.sys};
    if (im.head) {
      // Drain: no new requests; those in flight get drain_timeout to finish.
      const auto deadline = std::chrono::steady_clock::now() + im.drain_timeout;
      int64_t in_flight = 1;
      while (in_flight > 0 && std::chrono::steady_clock::now() < deadline) {
        self->request(im.node, std::chrono::seconds(5), drain_atom::value)
            .receive([&](int64_t n) { in_flight = n; }, [&](const caf::error&) { in_flight = 0; });
        if (in_flight > 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      if (in_flight > 0)
        std::fprintf(
            stderr, "troupe: head: %lld requests still in flight after draining for %lld ms\n",
            static_cast<long long>(in_flight), static_cast<long long>(im.drain_timeout.count()));
    }
    self->request(im.node, std::chrono::seconds(5), leave_atom::value, reason)
        .receive([](bool) {}, [](const caf::error&) {});
  }
  im.stop_joining->store(true);
  if (im.joiner.joinable()) im.joiner.join();
  if (im.link) im.link->set_transport(nullptr);  // null when start() failed before the link
  im.tx.reset();  // says bye on every link (after the leave notice, in order)
}

Status ClusterNode::inject_fault(const std::string& actor) {
  Impl& im = *impl_;
  bool ok = false;
  if (im.sys && im.node) {
    caf::scoped_actor self{*im.sys};
    self->request(im.node, std::chrono::seconds(5), crash_atom::value, actor)
        .receive([&](bool r) { ok = r; }, [](const caf::error&) {});
  }
  if (!ok) return Error{1, "no actor '" + actor + "' on this node (stage/N or expert/N)"};
  return Ok{};
}

void ClusterNode::set_faults(transport::FaultRules rules) {
  if (impl_->tx) impl_->tx->set_faults(std::move(rules));
}

Result<uint64_t> ClusterNode::submit(GenerateRequest req, RequestCallbacks cb) {
  Impl& im = *impl_;
  if (!im.head) return Error{1, "this node is not the cluster's head: submit requests there"};
  if (!im.sys || !im.node) return Error{1, "the node has stopped"};
  auto lr = std::make_shared<LocalRequest>();
  lr->id = im.next_request++;
  lr->request = std::make_shared<const GenerateRequest>(std::move(req));
  lr->callbacks = std::move(cb);
  caf::anon_send(im.node, submit_atom::value, LocalRequestPtr(lr));
  return lr->id;
}

void ClusterNode::cancel(uint64_t id) {
  Impl& im = *impl_;
  if (im.sys && im.node) caf::anon_send(im.node, cancel_atom::value, id);
}

std::shared_ptr<const model::Model> ClusterNode::model() const { return impl_->model; }
std::shared_ptr<const model::VisionModel> ClusterNode::vision() const { return impl_->vision; }

std::string ClusterNode::scheduler_stats_json() {
  Impl& im = *impl_;
  std::string out = "{}";
  if (!im.sys || !im.node) return out;
  caf::scoped_actor self{*im.sys};
  self->request(im.node, std::chrono::seconds(5), stats_atom::value)
      .receive([&](const std::string& s) { out = s; }, [](const caf::error&) {});
  return out;
}

std::string ClusterNode::status_json() {
  Impl& im = *impl_;
  std::string out = "{}";
  if (!im.sys || !im.node) return out;
  caf::scoped_actor self{*im.sys};
  self->request(im.node, std::chrono::seconds(5), status_atom::value)
      .receive([&](const std::string& s) { out = s; }, [](const caf::error&) {});
  return out;
}

}  // namespace troupe::actors
