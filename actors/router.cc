// Router actor: admission, tokenization, the per-request token log, detokenization that holds back
// incomplete UTF-8, stop strings, streaming to the client, and cancellation.
#include "actors/router.h"

#include <map>
#include <optional>

#include <caf/event_based_actor.hpp>
#include <caf/stateful_actor.hpp>

#include "actors/detail/messages.h"
#include "model/tokenizer.h"

namespace troupe::actors {

namespace {

struct Pending {
  caf::actor client;
  int64_t tag = 0;
  std::optional<model::StreamDecoder> decoder;
  std::optional<compute::StopMatcher> stops;
  std::shared_ptr<GenerateResult> result;
  std::shared_ptr<const compute::SamplingParams> sampling;
  std::vector<int32_t> eos_ids;
  bool stopped = false;  // a stop string matched: cancelled at the scheduler, finish as "stop"
};

struct RouterState {
  std::shared_ptr<const model::Model> model;
  caf::actor scheduler;
  int64_t next_id = 1;
  std::map<int64_t, Pending> pending;                             // by sequence id
  std::map<std::pair<caf::actor_addr, int64_t>, int64_t> by_tag;  // (client, tag) -> seq id
  static inline const char* name = "router";
};

using Self = caf::stateful_actor<RouterState>;

void reply_error(Self* self, const caf::actor& client, int64_t tag, const std::string& reason,
                 const std::string& error) {
  auto r = std::make_shared<GenerateResult>();
  r->finish_reason = reason;
  r->error = error;
  self->send(client, finish_atom::value, tag, GenerateResultPtr(std::move(r)));
}

void on_submit(Self* self, const GenerateRequestPtr& req, int64_t tag) {
  auto& st = self->state;
  auto client = caf::actor_cast<caf::actor>(self->current_sender());
  if (!client) return;
  const model::Tokenizer* tok = st.model->tokenizer.get();
  if (auto v = req->sampling.validate(); !v)
    return reply_error(self, client, tag, "error", v.error().message);
  if (req->max_tokens < 0)
    return reply_error(self, client, tag, "error", "max_tokens must be >= 0");
  auto sreq = std::make_shared<SeqRequest>();
  if (!req->prompt_tokens.empty()) {
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
  p.sampling = sreq->sampling;
  p.eos_ids = sreq->eos_ids;
  if (req->max_tokens == 0) {
    p.result->finish_reason = "length";
    self->send(client, finish_atom::value, tag, GenerateResultPtr(p.result));
    return;
  }
  st.by_tag[{client.address(), tag}] = id;
  st.pending.emplace(id, std::move(p));
  self->send(st.scheduler, submit_atom::value, SeqRequestPtr(std::move(sreq)),
             caf::actor_cast<caf::actor>(self));
}

void deliver(Self* self, Pending& p, const std::string& delta, int32_t token) {
  p.result->text += delta;
  self->send(p.client, token_atom::value, p.tag, delta, token);
}

void on_token(Self* self, const TokenEventPtr& ev) {
  auto& st = self->state;
  auto it = st.pending.find(ev->seq_id);
  if (it == st.pending.end()) return;
  Pending& p = it->second;
  if (ev->token >= 0 && !p.stopped) {
    if (!ev->logits.empty())
      p.result->logits.insert(p.result->logits.end(), ev->logits.begin(), ev->logits.end());
    // End-of-generation and stop tokens end the output without being part of it.
    if (!p.sampling->is_stop_token(ev->token, p.eos_ids)) {
      p.result->tokens.push_back(ev->token);
      if (p.decoder) {
        auto out = p.stops->feed(p.decoder->push(ev->token));
        if (!out.text.empty() || !out.stopped) deliver(self, p, out.text, ev->token);
        if (out.stopped) {
          p.stopped = true;
          self->send(st.scheduler, cancel_atom::value, ev->seq_id);
        }
      }
    }
  }
  if (!ev->finished) return;
  if (p.decoder && !p.stopped) {
    auto out = p.stops->feed(p.decoder->flush());
    std::string rest = out.text + (out.stopped ? std::string() : p.stops->flush());
    if (out.stopped) p.stopped = true;
    if (!rest.empty()) deliver(self, p, rest, -1);
  }
  p.result->finish_reason = p.stopped ? "stop" : ev->finish_reason;
  p.result->error = ev->error;
  self->send(p.client, finish_atom::value, p.tag, GenerateResultPtr(p.result));
  st.by_tag.erase({p.client.address(), p.tag});
  st.pending.erase(it);
}

}  // namespace

caf::behavior router_behavior(Self* self, std::shared_ptr<const model::Model> model,
                              caf::actor scheduler) {
  self->state.model = std::move(model);
  self->state.scheduler = std::move(scheduler);
  return {
      [=](submit_atom, const GenerateRequestPtr& req, int64_t tag) { on_submit(self, req, tag); },
      [=](cancel_atom, int64_t tag) {
        auto& st = self->state;
        auto it = st.by_tag.find(
            std::make_pair(caf::actor_cast<caf::actor_addr>(self->current_sender()), tag));
        if (it != st.by_tag.end()) self->send(st.scheduler, cancel_atom::value, it->second);
      },
      [=](token_atom, const TokenEventPtr& ev) { on_token(self, ev); },
  };
}

caf::actor spawn_router(caf::actor_system& sys, std::shared_ptr<const model::Model> model,
                        caf::actor scheduler) {
  return sys.spawn(router_behavior, std::move(model), std::move(scheduler));
}

}  // namespace troupe::actors
