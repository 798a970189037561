// Node daemon: its image encoder instances ([[encoder]]; actors/encoder.h). Starting the ones a
// placement puts here and, on the head, the proxies of the others; encoding the images the head
// sends (EncodeImage) and routing the answers (EncodedImage) to the proxy that asked; restarts
// and lost links. Runs on the node actor (detail/node_state.h).
#include <chrono>
#include <cstdio>
#include <thread>

#include <caf/send.hpp>

#include "actors/detail/node_state.h"
#include "actors/detail/remote.h"
#include "actors/detail/replan.h"
#include "actors/encoder.h"

namespace troupe::actors::detail {

namespace {

// The name of node `id` as the head's member table has it ("" when unknown).
std::string member_name(NodeSelf* self, uint32_t id) {
  for (const auto& [name, m] : self->state.members)
    if (m.node_id == id) return name;
  return {};
}

// Instance `index` in placement `pl`; null when it has none.
const EncoderPlacementInfo* encoder_at(const PlacementMsg* pl, uint32_t index) {
  if (pl)
    for (const auto& e : pl->encoders)
      if (e.index == index) return &e;
  return nullptr;
}
const EncoderPlacementInfo* encoder_at(const std::optional<PlacementMsg>& pl, uint32_t index) {
  return pl ? encoder_at(&*pl, index) : nullptr;
}

// Stops the actors of `instances` (local workers or proxies) but those `stays` keeps, which go
// to *kept; returns whether any stopped.
template <class Map, class Stays>
bool stop_unless_kept(NodeSelf* self, Map& instances, const Stays& stays,
                      std::vector<ImageWorkerActor>* kept) {
  bool stopped = false;
  for (auto it = instances.begin(); it != instances.end();) {
    if (stays(it->first)) {
      kept->push_back(caf::actor_cast<ImageWorkerActor>(it->second));
      ++it;
      continue;
    }
    self->send_exit(it->second, caf::exit_reason::user_shutdown);
    it = instances.erase(it);
    stopped = true;
  }
  return stopped;
}

// The instances in index order, local ones or proxies (the head's front gets this list).
std::vector<ImageWorkerActor> instance_list(NodeSelf* self) {
  auto& st = self->state;
  std::vector<ImageWorkerActor> list;
  if (!st.placement) return list;
  for (const auto& e : st.placement->encoders) {
    if (auto w = st.image_workers.find(e.index); w != st.image_workers.end())
      list.push_back(w->second);
    else if (auto p = st.image_proxies.find(e.index); p != st.image_proxies.end())
      list.push_back(caf::actor_cast<ImageWorkerActor>(p->second));
  }
  return list;
}

}  // namespace

uint64_t mmproj_bytes(const Plan& plan) { return model::vision_weight_bytes(plan.mmproj); }

std::function<ActorMemory(ActorRole, uint32_t)> actor_memory_in(const model::ModelSpec& spec,
                                                                const Plan& plan,
                                                                const PlacementMsg& pl) {
  return [&spec, &plan, &pl](ActorRole role, uint32_t index) -> ActorMemory {
    if (role == ActorRole::kEncoder) return {mmproj_bytes(plan)};
    ActorMemory m;
    if (role == ActorRole::kStage)
      m = stage_pools_memory(spec, plan, pl, index, state_slots_for(spec, plan.scheduler));
    m.weights = actor_weight_bytes(spec, pl, role, index);
    return m;
  };
}

std::function<ActorMemory(ActorRole, uint32_t)> actor_memory_of(NodeSelf* self,
                                                                const PlacementMsg& pl) {
  return actor_memory_in(self->state.model->spec, self->state.plan, pl);
}

std::string mmproj_to_load(NodeSelf* self, const PlacementMsg& pl) {
  auto& st = self->state;
  if (st.vision) return {};
  const uint32_t me = st.link->node_id();
  for (const auto& e : pl.encoders)
    if (e.node_id == me) return st.plan.mmproj;
  return {};
}

std::string start_image_encoders(NodeSelf* self, const PlacementMsg& pl, uint32_t me) {
  auto& st = self->state;
  if (st.placed_vision && st.placed_vision->model) {
    st.vision = st.placed_vision->model;
    st.phases.push_back(
        {"load vision encoder", st.placed_vision->start_ms, st.placed_vision->duration_ms, true});
  }
  for (const auto& e : pl.encoders) {
    const std::string who = "image encoder " + std::to_string(e.index);
    if (e.node_id == me) {
      if (st.image_workers.count(e.index)) continue;  // kept from the last placement
      if (!st.vision) return who + " on " + st.me.name + ": the plan names no [model] mmproj";
      auto w = spawn_image_worker(self->system(), st.vision, static_cast<int>(e.threads));
      if (!w) return who + " on " + st.me.name + ": " + w.error().message;
      self->monitor(*w);
      st.image_workers[e.index] = *w;
    } else if (st.head && st.vision) {
      if (st.image_proxies.count(e.index)) continue;  // kept from the last placement
      const auto& spec = st.vision->spec;
      // The node repeats its receipt every heartbeat: a job it says nothing of for a lease (the
      // silence that makes a node gone) is lost.
      const auto silence = std::chrono::milliseconds(st.plan.cluster.lease_ms);
      st.image_proxies[e.index] =
          spawn_remote_image(self->system(), st.link, member_name(self, e.node_id), e.index,
                             spec.n_image_tokens(), spec.n_embd_out, silence);
    }
  }
  if (st.head && st.encoder) {
    if (pl.encoders.empty())  // the plan has an mmproj, so they were dropped for lack of room
      self->send(st.encoder, encoders_atom::value,
                 std::string("the cluster has no image encoder now: its node is gone and no "
                             "other node had room for it (see the head's log)"));
    else
      self->send(st.encoder, encoders_atom::value, instance_list(self));
  }
  return {};
}

bool place_encoders_only(NodeSelf* self, const std::string& what, const PlacementMsg& old,
                         const std::map<uint32_t, Survivor>& alive, Result<PlacementMsg>& next) {
  auto& st = self->state;
  if (!next) {
    // When only image encoders find no room, the pipeline need not wait for capacity: they are
    // dropped (images then fail in the encoder front, naming why) and text keeps being served.
    PlacementMsg kept = old;
    kept.encoders.clear();
    for (const auto& e : old.encoders)
      if (alive.count(e.node_id))
        kept.encoders.push_back(
            {static_cast<uint32_t>(kept.encoders.size()), e.node_id, e.threads});
    if (kept.encoders.size() == old.encoders.size()) return false;
    auto without = replan(kept, alive, actor_memory_of(self, old));
    if (!without) return false;
    std::fprintf(stderr, "troupe: head: %s; its image encoders are dropped: %s\n", what.c_str(),
                 next.error().message.c_str());
    next = std::move(without);
  }
  if (!next->same_pipeline(old)) return false;
  // Only image encoders move: the pipeline keeps serving (nothing is held or recomputed); images
  // wait in the encoder front until the new instances run.
  std::fprintf(stderr, "troupe: head: %s; re-placing its image encoders (placement %llu)\n",
               what.c_str(), static_cast<unsigned long long>(next->version));
  st.awaiting_capacity = false;
  send_placement(self, std::move(*next));
  return true;
}

void stop_image_encoders(NodeSelf* self, const PlacementMsg* next) {
  auto& st = self->state;
  // Instance i stays where `next` places it on the same node with the same threads.
  auto stays = [&](uint32_t i) {
    const EncoderPlacementInfo* was = encoder_at(st.placement, i);
    const EncoderPlacementInfo* will = encoder_at(next, i);
    return was && will && *was == *will;
  };
  std::vector<ImageWorkerActor> kept;
  const bool stopped_workers = stop_unless_kept(self, st.image_workers, stays, &kept);
  const bool stopped = stop_unless_kept(self, st.image_proxies, stays, &kept) || stopped_workers;
  // The front's jobs on the stopped ones go to those kept, or wait for the next list, instead of
  // failing on them; jobs on those kept stay.
  if (st.head && st.encoder && stopped) self->send(st.encoder, encoders_atom::value, kept);
}

void replace_image_encoders(NodeSelf* self, PlacementMsg p) {
  auto& st = self->state;
  std::fprintf(stderr, "troupe: node %s: placement %llu moves image encoders only\n",
               st.me.name.c_str(), static_cast<unsigned long long>(p.version));
  stop_image_encoders(self, &p);
  st.placement = std::move(p);
  st.encoders_only = st.placement->version;
  auto slot = std::make_shared<NodeState::VisionSlot>();
  st.placed_vision = slot;
  const std::string mmproj = mmproj_to_load(self, *st.placement);
  if (mmproj.empty()) return finish_image_encoders(self, st.placement->version, "");
  // First instance on this node: load the mmproj off the node actor.
  NodeActor node = caf::actor_cast<NodeActor>(self);
  const uint64_t version = st.placement->version;
  const auto started = st.started;
  std::thread([node, version, mmproj, slot, started] {
    const std::string error = slot->load(mmproj, started);  // read after the message
    caf::anon_send(node, placed_atom::value, version, error, uint64_t{0}, uint64_t{0}, uint64_t{0});
  }).detach();
}

void finish_image_encoders(NodeSelf* self, uint64_t version, const std::string& error) {
  auto& st = self->state;
  if (!st.placement || st.placement->version != version) return;
  std::string e = error;
  if (e.empty()) e = start_image_encoders(self, *st.placement, st.link->node_id());
  report_placement(self, e.empty(), e);
}

int64_t restart_image_worker(NodeSelf* self, const caf::down_msg& dm) {
  auto& st = self->state;
  for (auto& [j, a] : st.image_workers) {
    if (dm.source != a.address()) continue;
    const EncoderPlacementInfo* e = encoder_at(st.placement, j);
    const uint32_t threads = e ? e->threads : 0;
    auto fresh = spawn_image_worker(self->system(), st.vision, static_cast<int>(threads));
    if (!fresh) {
      std::fprintf(stderr, "troupe: node %s: image encoder %u failed and cannot restart: %s\n",
                   st.me.name.c_str(), j, fresh.error().message.c_str());
      return -1;
    }
    self->monitor(*fresh);
    a = *fresh;
    if (st.head && st.encoder) self->send(st.encoder, encoders_atom::value, instance_list(self));
    return j;
  }
  return -1;
}

void image_link_down(NodeSelf* self, const std::string& node) {
  auto& st = self->state;
  if (!st.placement) return;
  for (const auto& e : st.placement->encoders)
    if (member_name(self, e.node_id) == node)
      if (auto p = st.image_proxies.find(e.index); p != st.image_proxies.end())
        self->send(p->second, linkdown_atom::value);
}

namespace {

// Sends w (job_id set here) for encoder `index` to `peer`; an answer with no wire form (rows that
// are not finite, ...) goes as the error that says so.
void send_encoded(Link& link, transport::PeerId peer, uint64_t job_id, uint32_t index,
                  ImageRowsWire w, int64_t n_rows, int64_t n_embd) {
  w.job_id = job_id;
  const auto info = link.send_info(ActorRole::kEncoder, index);
  auto f = encode_encoded_image(w, n_rows, n_embd, link.epoch(), info);
  if (!f) {
    w = {job_id, nullptr, "the encoder's answer has no wire form: " + f.error().message, false,
         w.seconds};
    f = encode_encoded_image(w, n_rows, n_embd, link.epoch(), info);
  }
  if (f) (void)link.send(peer, ControlMsg::kEncodedImage, *f);
}

// A receipt for job `job_id` of encoder `index` (it carries no rows, so no shape).
void send_receipt(Link& link, transport::PeerId peer, uint64_t job_id, uint32_t index) {
  ImageRowsWire r;
  r.accepted = true;
  send_encoded(link, peer, job_id, index, std::move(r), 1, 1);
}

}  // namespace

// An image for an encoder instance placed here: encode it on the instance's thread, answer on
// the link it came by. An instance that is not running here (a re-placement moved it, or is
// starting it) answers "try again".
void route_image(NodeSelf* self, const MessagePtr& m) {
  auto& st = self->state;
  EncodeImageLimits lim;
  lim.num_encoders = st.placement ? static_cast<uint32_t>(st.placement->encoders.size()) : 0;
  auto d = decode_encode_image(m->data(), lim);
  if (!d) return drop_malformed(self, m, "image", d.error().message);
  auto link = st.link;
  const transport::PeerId peer = m->peer;
  const uint64_t job_id = d->job.job_id;
  const uint32_t index = d->job.encoder;
  auto it = st.image_workers.find(index);
  if (it == st.image_workers.end() || !st.vision) {
    ImageRowsWire r{
        0, nullptr,
        "image encoder " + std::to_string(index) + " is not running on node " + st.me.name, true,
        0.0};
    return send_encoded(*link, peer, job_id, index, std::move(r), 1, 1);
  }
  const int64_t n_rows = st.vision->spec.n_image_tokens();
  const int64_t n_embd = st.vision->spec.n_embd_out;
  // The receipt: the head stops waiting for one (it retries a job whose image was lost), and
  // then waits for the answer as long as the receipt keeps coming (repeat_image_receipts).
  send_receipt(*link, peer, job_id, index);
  const auto key = std::make_pair(peer, job_id);
  st.images_in_flight[key] = index;
  auto answer = [self, link, key, index, n_rows, n_embd](ImageRowsWire w) {
    self->state.images_in_flight.erase(key);
    send_encoded(*link, key.first, key.second, index, std::move(w), n_rows, n_embd);
  };
  auto job = std::make_shared<const ImageJob>(ImageJob{d->job.image, d->job.what});
  self->request(it->second, caf::infinite, image_atom::value, ImageJobPtr(job))
      .then(
          [=](const ImageRowsPtr& r) {
            answer({0, r->rows, r->error, r->retry, r->seconds});
          },
          [=](const caf::error& e) {
            answer(
                {0, nullptr,
                 "image encoder " + std::to_string(index) + " stopped: " + self->system().render(e),
                 true, 0.0});
          });
}

void repeat_image_receipts(NodeSelf* self) {
  auto& st = self->state;
  for (const auto& [key, index] : st.images_in_flight)
    send_receipt(*st.link, key.first, key.second, index);
}

void route_image_answer(NodeSelf* self, const MessagePtr& m) {
  auto& st = self->state;
  auto who = peek_encoded_image(m->data());
  if (!who) return drop_malformed(self, m, "image encoder answer", who.error().message);
  const uint32_t index = who->sender.index;
  auto it = st.image_proxies.find(index);
  if (it == st.image_proxies.end())
    return drop_malformed(self, m, "image encoder answer",
                          "no image went to encoder " + std::to_string(index));
  // Only from the node the instance is placed on now: a late answer of its previous node (which
  // the head declared gone) must not complete a job of the new one.
  const EncoderPlacementInfo* e = encoder_at(st.placement, index);
  const std::string placed_on = e ? member_name(self, e->node_id) : std::string();
  const std::string from = st.link->peer_name(m->peer);
  if (from != placed_on)
    return drop_malformed(
        self, m, "image encoder answer",
        "encoder " + std::to_string(index) + " is on " + placed_on + ", not " + from);
  self->send(it->second, combine_atom::value, m);
}

}  // namespace troupe::actors::detail
