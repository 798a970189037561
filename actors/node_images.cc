// Node daemon: its image encoder instances ([[encoder]]; actors/encoder.h). Starting the ones a
// placement puts here and, on the head, the proxies of the others; encoding the images the head
// sends (EncodeImage) and routing the answers (EncodedImage) to the proxy that asked; restarts
// and lost links. Runs on the node actor (detail/node_state.h).
#include <cstdio>

#include <caf/send.hpp>

#include "actors/detail/node_state.h"
#include "actors/detail/remote.h"
#include "actors/encoder.h"

namespace troupe::actors::detail {

namespace {

// The name of node `id` as the head's member table has it ("" when unknown).
std::string member_name(NodeSelf* self, uint32_t id) {
  for (const auto& [name, m] : self->state.members)
    if (m.node_id == id) return name;
  return {};
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
      if (!st.vision) return who + " on " + st.me.name + ": the plan names no [model] mmproj";
      auto w = spawn_image_worker(self->system(), st.vision, static_cast<int>(e.threads));
      if (!w) return who + " on " + st.me.name + ": " + w.error().message;
      self->monitor(*w);
      st.image_workers[e.index] = *w;
    } else if (st.head && st.vision) {
      const auto& spec = st.vision->spec;
      st.image_proxies[e.index] =
          spawn_remote_image(self->system(), st.link, member_name(self, e.node_id), e.index,
                             spec.n_image_tokens(), spec.n_embd_out);
    }
  }
  if (st.head && st.encoder) self->send(st.encoder, encoders_atom::value, instance_list(self));
  return {};
}

int64_t restart_image_worker(NodeSelf* self, const caf::down_msg& dm) {
  auto& st = self->state;
  for (auto& [j, a] : st.image_workers) {
    if (dm.source != a.address()) continue;
    uint32_t threads = 0;
    if (st.placement)
      for (const auto& e : st.placement->encoders)
        if (e.index == j) threads = e.threads;
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
  auto send_answer = [link, peer, job_id, index](const ImageRows& r, int64_t n_rows,
                                                 int64_t n_embd) {
    ImageRowsWire w{job_id, r.rows, r.error, r.retry, r.seconds};
    auto f = encode_encoded_image(w, n_rows, n_embd, link->epoch(),
                                  link->send_info(ActorRole::kEncoder, index));
    if (!f) {
      w = {job_id, nullptr, "the encoder's answer has no wire form: " + f.error().message, false,
           r.seconds};
      f = encode_encoded_image(w, n_rows, n_embd, link->epoch(),
                               link->send_info(ActorRole::kEncoder, index));
    }
    if (f) (void)link->send(peer, ControlMsg::kEncodedImage, *f);
  };
  auto it = st.image_workers.find(index);
  if (it == st.image_workers.end() || !st.vision) {
    ImageRows r;
    r.error = "image encoder " + std::to_string(index) + " is not running on node " + st.me.name;
    r.retry = true;
    return send_answer(r, 1, 1);
  }
  const int64_t n_rows = st.vision->spec.n_image_tokens();
  const int64_t n_embd = st.vision->spec.n_embd_out;
  auto job = std::make_shared<const ImageJob>(ImageJob{d->job.image, d->job.what});
  self->request(it->second, caf::infinite, image_atom::value, ImageJobPtr(job))
      .then([=](const ImageRowsPtr& r) { send_answer(*r, n_rows, n_embd); },
            [=](const caf::error& e) {
              ImageRows r;
              r.error = "image encoder " + std::to_string(index) +
                        " stopped: " + self->system().render(e);
              r.retry = true;
              send_answer(r, n_rows, n_embd);
            });
}

void route_image_answer(NodeSelf* self, const MessagePtr& m) {
  auto& st = self->state;
  auto who = peek_encoded_image(m->data());
  if (!who) return drop_malformed(self, m, "image encoder answer", who.error().message);
  auto it = st.image_proxies.find(who->sender.index);
  if (it == st.image_proxies.end())
    return drop_malformed(self, m, "image encoder answer",
                          "no image went to encoder " + std::to_string(who->sender.index));
  self->send(it->second, combine_atom::value, m);
}

}  // namespace troupe::actors::detail
