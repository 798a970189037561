// Router actor: admission, tokenization, the per-request token log, detokenization that holds back
// incomplete UTF-8, stop strings, streaming to the client, and cancellation. The token log (and
// the sampler state after its last token) is what a request resumes from when the scheduler is
// replaced; the client keeps the same for when the router itself is replaced.
#include "actors/router.h"

#include <map>
#include <optional>
#include <stdexcept>

#include <caf/actor_cast.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "actors/detail/messages.h"
#include "model/tokenizer.h"

namespace troupe::actors {

namespace {

struct Pending {
  RouterClientActor client;  // whoever sent the submit
  int64_t tag = 0;
  std::optional<model::StreamDecoder> decoder;
  std::optional<compute::StopMatcher> stops;
  std::shared_ptr<GenerateResult> result;
  SeqRequestPtr req;               // as first sent to a scheduler
  std::vector<int32_t> generated;  // the token log: every token sampled so far, in order
  compute::SamplerState rng;       // after the last generated token
  bool stopped = false;    // a stop string matched: cancelled at the scheduler, finish as "stop"
  bool cancelled = false;  // the client cancelled: a resubmission is cancelled at once
};

struct RouterState {
  std::shared_ptr<const model::Model> model;
  SchedulerActor scheduler;
  EncoderActor encoder;  // null: requests with image files are refused
  // Requests whose images the encoder is laying out: (client, tag) -> cancelled meanwhile.
  std::map<std::pair<caf::actor_addr, int64_t>, bool> encoding;
  int64_t next_id = 1;
  std::map<int64_t, Pending> pending;                             // by sequence id
  std::map<std::pair<caf::actor_addr, int64_t>, int64_t> by_tag;  // (client, tag) -> seq id
  bool crash_next = false;                                        // fault injection
  static inline const char* name = "router";
};

using Self = RouterActor::stateful_base<RouterState>;
using PendingIt = std::map<int64_t, Pending>::iterator;

void reply_error(Self* self, const RouterClientActor& client, int64_t tag,
                 const std::string& reason, const std::string& error) {
  auto r = std::make_shared<GenerateResult>();
  r->finish_reason = reason;
  r->error = error;
  self->send(client, finish_atom::value, tag, GenerateResultPtr(std::move(r)));
}

void deliver(Self* self, Pending& p, const std::string& delta, int32_t token,
             std::vector<float> logits = {}) {
  p.result->text += delta;
  auto piece = std::make_shared<StreamPiece>();
  piece->delta = delta;
  piece->token = token;
  piece->logits = std::move(logits);
  piece->rng = p.rng;
  self->send(p.client, token_atom::value, p.tag, StreamPiecePtr(std::move(piece)));
}

// Flushes held-back text, sends the result to the client and closes the token log.
void complete(Self* self, PendingIt it, const std::string& reason, const std::string& error) {
  auto& st = self->state;
  Pending& p = it->second;
  if (p.decoder && !p.stopped) {
    auto out = p.stops->feed(p.decoder->flush());
    std::string rest = out.text + (out.stopped ? std::string() : p.stops->flush());
    if (out.stopped) p.stopped = true;
    if (!rest.empty()) deliver(self, p, rest, -1);
  }
  p.result->finish_reason = p.stopped ? "stop" : reason;
  p.result->error = error;
  self->send(p.client, finish_atom::value, p.tag, GenerateResultPtr(p.result));
  st.by_tag.erase({p.client.address(), p.tag});
  st.pending.erase(it);
}

// Sends the request to the current scheduler: as first built, or, once tokens were generated, as
// a replay that continues the token log with the same sampler state.
void send_to_scheduler(Self* self, PendingIt it, bool replay) {
  Pending& p = it->second;
  SeqRequestPtr req = p.req;
  if (replay) {
    const int64_t n = static_cast<int64_t>(p.generated.size());
    if (n >= p.req->max_tokens) return complete(self, it, "length", {});
    auto r = std::make_shared<SeqRequest>(*p.req);
    r->prompt.insert(r->prompt.end(), p.generated.begin(), p.generated.end());
    r->max_tokens -= n;
    r->replay = true;
    r->num_generated = n;
    r->rng = p.rng;
    req = std::move(r);
  }
  self->send(self->state.scheduler, submit_atom::value, std::move(req),
             caf::actor_cast<SchedulerClientActor>(self));
  if (p.cancelled) self->send(self->state.scheduler, cancel_atom::value, it->first);
}

// Rebuilds a resumed request's decoder and stop-string state from the tokens its client already
// has, without streaming them again.
void replay_seen(Pending& p, const ResumeState& seen) {
  p.rng = seen.rng;
  p.result->logits = seen.logits;
  for (int32_t t : seen.tokens) {
    p.generated.push_back(t);
    p.result->tokens.push_back(t);
    if (!p.decoder) continue;
    auto out = p.stops->feed(p.decoder->push(t));
    p.result->text += out.text;
    if (out.stopped) {
      p.stopped = true;
      break;
    }
  }
}

void on_submit(Self* self, const RouterClientActor& client, const GenerateRequestPtr& req,
               int64_t tag, const ResumeStatePtr& seen);

// A request with image files: the encoder lays its prompt out (seconds per new image, on its own
// thread); then it is submitted as a request with that prompt. A cancel meanwhile is kept and
// answered when the encoder is done.
void encode_then_submit(Self* self, const RouterClientActor& client, const GenerateRequestPtr& req,
                        int64_t tag, const ResumeStatePtr& seen) {
  auto& st = self->state;
  if (!st.encoder)
    return reply_error(self, client, tag, "error",
                       "this cluster has no vision encoder for the request's images (the plan's "
                       "[model] mmproj names none)");
  const auto key = std::make_pair(client.address(), tag);
  if (!st.encoding.emplace(key, false).second)
    return reply_error(self, client, tag, "error",
                       "request tag " + std::to_string(tag) + " is already in flight");
  self->request(st.encoder, caf::infinite, encode_atom::value, req)
      .then(
          [=](const EncodedPromptPtr& e) {
            auto& s = self->state;
            auto it = s.encoding.find(key);
            const bool cancelled = it != s.encoding.end() && it->second;
            if (it != s.encoding.end()) s.encoding.erase(it);
            if (cancelled) {
              auto r = std::make_shared<GenerateResult>();
              r->finish_reason = "cancelled";
              r->prompt_tokens = e->prompt ? e->prompt->tokens : std::vector<int32_t>{};
              self->send(client, finish_atom::value, tag, GenerateResultPtr(std::move(r)));
              return;
            }
            if (!e->prompt) return reply_error(self, client, tag, "error", e->error);
            auto r = std::make_shared<GenerateRequest>(*req);
            r->images = e->prompt;
            r->image_files = nullptr;
            on_submit(self, client, r, tag, seen);
          },
          [=](const caf::error& err) {
            self->state.encoding.erase(key);
            reply_error(self, client, tag, "error",
                        "the image encoder failed: " + self->system().render(err));
          });
}

void on_submit(Self* self, const RouterClientActor& client, const GenerateRequestPtr& req,
               int64_t tag, const ResumeStatePtr& seen) {
  auto& st = self->state;
  if (!client) return;
  const model::Tokenizer* tok = st.model->tokenizer.get();
  if (auto v = req->sampling.validate(); !v)
    return reply_error(self, client, tag, "error", v.error().message);
  if (req->max_tokens < 0)
    return reply_error(self, client, tag, "error", "max_tokens must be >= 0");
  if (!req->images && req->image_files && !req->image_files->empty())
    return encode_then_submit(self, client, req, tag, seen);
  auto sreq = std::make_shared<SeqRequest>();
  if (req->images) {
    sreq->prompt = req->images->tokens;
    sreq->images = req->images;
  } else if (!req->prompt_tokens.empty()) {
    sreq->prompt = req->prompt_tokens;
  } else {
    if (!tok)
      return reply_error(self, client, tag, "error", "the model has no vocabulary: send token ids");
    sreq->prompt = tok->encode(req->prompt, req->add_bos);
  }
  if (sreq->prompt.empty())
    return reply_error(self, client, tag, "error", "the prompt is empty (no tokens)");
  const int64_t id = st.next_id++;
  sreq->seq_id = id;
  sreq->max_tokens = req->max_tokens;
  sreq->sampling = std::make_shared<const compute::SamplingParams>(req->sampling);
  sreq->want_logits = req->return_logits;
  if (tok && tok->eos_id() >= 0) sreq->eos_ids.push_back(tok->eos_id());
  if (tok) {
    for (int32_t t = 0; t < tok->n_vocab(); ++t)
      if (tok->is_eog(t) && t != tok->eos_id()) sreq->eos_ids.push_back(t);
  }
  Pending p;
  p.client = client;
  p.tag = tag;
  if (tok) p.decoder.emplace(*tok);
  p.stops.emplace(req->sampling.stop_strings);
  p.result = std::make_shared<GenerateResult>();
  p.result->prompt_tokens = sreq->prompt;
  if (req->max_tokens == 0) {
    p.result->finish_reason = "length";
    self->send(client, finish_atom::value, tag, GenerateResultPtr(p.result));
    return;
  }
  if (seen) {
    // The client's previous router failed; its request was admitted there, so it bypasses the
    // scheduler's queue limit now as well.
    sreq->replay = true;
    replay_seen(p, *seen);
  }
  p.req = std::move(sreq);
  st.by_tag[{client.address(), tag}] = id;
  auto it = st.pending.emplace(id, std::move(p)).first;
  if (it->second.stopped) return complete(self, it, "stop", {});
  send_to_scheduler(self, it, !it->second.generated.empty());
}

void on_token(Self* self, const TokenEventPtr& ev) {
  auto& st = self->state;
  // Only the current scheduler's events count: a replaced one's sequences were resubmitted.
  if (caf::actor_cast<caf::actor_addr>(self->current_sender()) != st.scheduler.address()) return;
  auto it = st.pending.find(ev->seq_id);
  if (it == st.pending.end()) return;
  Pending& p = it->second;
  if (ev->token >= 0) {
    p.generated.push_back(ev->token);
    p.rng = ev->rng;
  }
  if (ev->token >= 0 && !p.stopped) {
    if (!ev->logits.empty())
      p.result->logits.insert(p.result->logits.end(), ev->logits.begin(), ev->logits.end());
    // End-of-generation and stop tokens end the output without being part of it.
    if (!p.req->sampling->is_stop_token(ev->token, p.req->eos_ids)) {
      p.result->tokens.push_back(ev->token);
      if (p.decoder) {
        auto out = p.stops->feed(p.decoder->push(ev->token));
        if (!out.text.empty() || !out.stopped) deliver(self, p, out.text, ev->token, ev->logits);
        if (out.stopped) {
          p.stopped = true;
          self->send(st.scheduler, cancel_atom::value, ev->seq_id);
        }
      } else {
        deliver(self, p, {}, ev->token, ev->logits);
      }
    }
  }
  if (ev->finished) complete(self, it, ev->finish_reason, ev->error);
}

// The scheduler was replaced: every sequence it held is gone. Requests whose stop string already
// matched only waited for their cancellation and finish now; the others go to the new scheduler
// from their token logs.
void on_new_scheduler(Self* self, SchedulerActor scheduler) {
  auto& st = self->state;
  st.scheduler = std::move(scheduler);
  std::vector<int64_t> ids;
  for (const auto& kv : st.pending) ids.push_back(kv.first);
  for (int64_t id : ids) {
    auto it = st.pending.find(id);
    if (it->second.stopped) {
      complete(self, it, "stop", {});
    } else {
      send_to_scheduler(self, it, true);
    }
  }
}

void maybe_crash(Self* self) {
  if (self->state.crash_next) throw std::runtime_error("router: injected fault");
}

}  // namespace

RouterActor::behavior_type router_behavior(RouterActor::stateful_pointer<RouterState> self,
                                           std::shared_ptr<const model::Model> model,
                                           SchedulerActor scheduler, int64_t first_seq_id,
                                           EncoderActor encoder) {
  self->state.model = std::move(model);
  self->state.scheduler = std::move(scheduler);
  self->state.next_id = first_seq_id;
  self->state.encoder = std::move(encoder);
  // Any sender may submit (the caller's scoped actor, the gateway, the node actor); it gets the
  // answers a RouterClientActor takes.
  const auto sender = [=] { return caf::actor_cast<RouterClientActor>(self->current_sender()); };
  return {
      [=](submit_atom, const GenerateRequestPtr& req, int64_t tag) {
        maybe_crash(self);
        on_submit(self, sender(), req, tag, nullptr);
      },
      [=](submit_atom, const GenerateRequestPtr& req, int64_t tag, const ResumeStatePtr& seen) {
        maybe_crash(self);
        on_submit(self, sender(), req, tag, seen);
      },
      [=](cancel_atom, int64_t tag) {
        maybe_crash(self);
        auto& st = self->state;
        const auto key =
            std::make_pair(caf::actor_cast<caf::actor_addr>(self->current_sender()), tag);
        if (auto e = st.encoding.find(key); e != st.encoding.end()) {
          e->second = true;  // answered when the encoder is done
          return;
        }
        auto it = st.by_tag.find(key);
        if (it == st.by_tag.end()) return;
        st.pending.at(it->second).cancelled = true;
        self->send(st.scheduler, cancel_atom::value, it->second);
      },
      [=](token_atom, const TokenEventPtr& ev) {
        maybe_crash(self);
        on_token(self, ev);
      },
      [=](sched_atom, SchedulerActor scheduler) { on_new_scheduler(self, std::move(scheduler)); },
      [=](crash_atom) { self->state.crash_next = true; },
  };
}

RouterActor spawn_router(caf::actor_system& sys, std::shared_ptr<const model::Model> model,
                         SchedulerActor scheduler, int64_t first_seq_id, EncoderActor encoder) {
  return sys.spawn(router_behavior, std::move(model), std::move(scheduler), first_seq_id,
                   std::move(encoder));
}

}  // namespace troupe::actors
