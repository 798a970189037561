// Scheduler actor: iteration-level continuous batching. Each step packs decode tokens of running
// sequences and prefill chunks of newly admitted ones under a token budget (first come, first
// served), allocates KV blocks, keeps up to `microbatches` steps in flight through the pipeline,
// and preempts by recompute when the KV pool is exhausted. Lightweight: runs on CAF's scheduler.
#include "actors/scheduler.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <deque>
#include <iterator>
#include <map>
#include <set>
#include <stdexcept>

#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "actors/detail/messages.h"
#include "compute/kv_block_manager.h"
#include "compute/kv_pools.h"

namespace troupe::actors {

namespace {

struct Seq {
  SeqRequestPtr req;
  SchedulerClientActor reply_to;
  std::vector<int32_t> tokens;  // prompt + generated: the token log of this sequence
  // The same with each identified image's positions as its content id (compute::kv_image_id),
  // what the prefix cache keys blocks by; empty when it would equal `tokens`.
  std::vector<int32_t> cache_tokens;
  // Its non-causal images (Gemma 3): a prefix-cache hit takes each whole or not at all, since
  // an image must be computed in one step.
  std::vector<compute::KvWholeSpan> whole;
  int64_t num_computed = 0;  // tokens whose KV is in the cache
  int64_t num_generated = 0;
  compute::SamplerState rng;
  bool admitted = false;  // holds KV blocks (and a recurrent state slot, when the model has them)
  int32_t state = -1;     // its recurrent state slot while admitted; -1: none
  bool in_flight = false;
  bool cancelled = false;
  int64_t in_flight_tokens = 0;
  int failures = 0;  // its steps that failed in a row (a step that succeeds resets it)
  std::chrono::steady_clock::time_point failing_since;  // the first of those failures
};

// A sequence whose steps have failed for SchedulerActorConfig::step_failure_window_ms, with no
// step succeeding in between, ends with the last failure's message: a step that fails for a
// reason no retry changes (a stage that refuses it, a link that loses every step) must not loop
// forever. It must also have failed at least this many times in a row, so that a short window
// does not end a sequence after one or two slow failures; the window in turn keeps fast
// failures (while a lost node's actors are re-placed, steps fail at once, many times) from
// ending it by their count alone.
constexpr int kMinStepFailures = 8;

struct SchedulerState {
  SchedulerConfig cfg;
  int64_t n_vocab = 0;
  int64_t n_embd = 0;
  std::unique_ptr<compute::KvPools> kv;
  compute::KvBlockManagerConfig kv_cfg;
  int64_t kv_pools = 1;
  int64_t state_slots = 0;           // SchedulerActorConfig::state_slots
  std::vector<int32_t> free_states;  // recurrent state slots no admitted sequence holds
  StageInputActor first_stage;
  std::map<int64_t, Seq> seqs;
  std::deque<int64_t> waiting;   // FCFS; preempted sequences go back to the front
  std::vector<int64_t> running;  // admitted, in admission order
  int64_t in_flight = 0;
  std::map<uint64_t, std::vector<int64_t>> steps_in_flight;  // step id -> its sequences
  std::map<uint64_t, std::chrono::steady_clock::time_point> step_sent;
  double step_wall_s = 0, step_compute_s = 0;  // summed over completed steps
  uint64_t epoch = 1;
  uint64_t next_step = 1;
  // Image content digest -> index for compute::kv_image_id; never shrinks, so an id is never
  // reused for other content (at most kMaxImageIds entries).
  std::map<std::array<uint8_t, 32>, int32_t> image_index;
  std::set<caf::actor_addr> watched;  // reply_to actors we monitor (their requests die with them)
  bool crash_next = false;            // fault injection
  bool held = false;                  // (hold): no steps until the next (reset)
  // statistics
  uint64_t steps = 0, preemptions = 0, recomputes = 0, tokens_generated = 0, step_timeouts = 0;
  int64_t step_timeout_ms = 0;
  int64_t step_failure_window_ms = 60000;
  static inline const char* name = "scheduler";
};

using Self = SchedulerActor::stateful_base<SchedulerState>;

// Gives s a recurrent state slot when the model keeps states; false when none is free.
bool take_state(SchedulerState& st, Seq& s) {
  if (st.state_slots == 0) return true;
  if (st.free_states.empty()) return false;
  s.state = st.free_states.back();
  st.free_states.pop_back();
  return true;
}

void drop_state(SchedulerState& st, Seq& s) {
  if (s.state >= 0) st.free_states.push_back(s.state);
  s.state = -1;
}

// Every slot free, lowest first out.
void free_all_states(SchedulerState& st) {
  st.free_states.clear();
  for (int64_t i = st.state_slots; i-- > 0;) st.free_states.push_back(static_cast<int32_t>(i));
}

void emit(Self* self, Seq& s, int64_t id, int32_t token, bool finished, std::string reason,
          std::string error = {}, std::vector<float> logits = {}) {
  auto ev = std::make_shared<TokenEvent>();
  ev->seq_id = id;
  ev->token = token;
  ev->finished = finished;
  ev->finish_reason = std::move(reason);
  ev->error = std::move(error);
  ev->logits = std::move(logits);
  ev->rng = s.rng;
  self->send(s.reply_to, token_atom::value, TokenEventPtr(std::move(ev)));
}

void release(Self* self, int64_t id) {
  auto& st = self->state;
  auto it = st.seqs.find(id);
  if (it == st.seqs.end()) return;
  if (it->second.admitted) st.kv->free_sequence(id);
  drop_state(st, it->second);
  st.running.erase(std::remove(st.running.begin(), st.running.end(), id), st.running.end());
  st.waiting.erase(std::remove(st.waiting.begin(), st.waiting.end(), id), st.waiting.end());
  st.seqs.erase(it);
}

void finish(Self* self, int64_t id, std::string reason, std::string error = {}) {
  auto& s = self->state.seqs.at(id);
  emit(self, s, id, -1, true, std::move(reason), std::move(error));
  release(self, id);
}

// Frees the KV of the most recently admitted sequence that is not in flight (other than `keep`),
// in keep's KV pool (another pool's blocks would not help it), and puts it back at the front of
// the queue; it will be recomputed from its token log.
bool preempt_one(Self* self, int64_t keep) {
  auto& st = self->state;
  const int64_t pool = st.kv->pool_of(keep);
  for (auto it = st.running.rbegin(); it != st.running.rend(); ++it) {
    const int64_t id = *it;
    Seq& s = st.seqs.at(id);
    if (id == keep || s.in_flight || st.kv->pool_of(id) != pool) continue;
    st.kv->free_sequence(id);
    drop_state(st, s);
    s.admitted = false;
    s.num_computed = 0;
    st.running.erase(std::next(it).base());
    st.waiting.push_front(id);
    ++st.preemptions;
    return true;
  }
  return false;
}

// Distinct images the prefix cache can tell apart over the scheduler's life (about 80 bytes each).
constexpr size_t kMaxImageIds = size_t{1} << 18;

const std::vector<int32_t>& cache_view(const Seq& s) {
  return s.cache_tokens.empty() ? s.tokens : s.cache_tokens;
}

// The cache tokens of a prompt whose images all carry content keys (the encoder's): each image's
// positions become its content id.
std::vector<int32_t> cache_tokens_of(SchedulerState& st, const SeqRequest& req) {
  const compute::MultimodalPrompt* mm = req.images.get();
  if (!mm || mm->image_keys.size() != mm->images.size() || mm->images.empty()) return {};
  std::vector<int32_t> t = req.prompt;
  for (size_t i = 0; i < mm->images.size(); ++i) {
    const auto& span = mm->images[i];
    if (span.begin < 0 || span.count < 0 ||
        span.begin + span.count > static_cast<int64_t>(t.size()))
      return {};
    auto it = st.image_index.find(mm->image_keys[i]);
    if (it == st.image_index.end()) {
      // Ids are never reused (a cached block may still hold one), so the table only grows: past
      // its cap, new images are not identified and their KV is not cached (invariant 7).
      if (st.image_index.size() >= kMaxImageIds) return {};
      it = st.image_index.emplace(mm->image_keys[i], static_cast<int32_t>(st.image_index.size()))
               .first;
    }
    const int32_t index = it->second;
    for (int64_t p = span.begin; p < span.begin + span.count; ++p) {
      if (t[static_cast<size_t>(p)] != compute::SeqStep::kEmbedded) return {};
      t[static_cast<size_t>(p)] = compute::kv_image_id(index);
    }
  }
  // Replayed requests carry their generated tokens after the prompt's: nothing else is -1.
  return t;
}

// How many tokens of s the next step computes, at most `budget`. A non-causal image (Gemma 3)
// is one step of its own: a chunk ends where one begins, and one that begins here is computed
// whole, over the budget only when the step has nothing else (else it waits: 0).
int64_t next_chunk(const Seq& s, int64_t budget, bool step_empty) {
  const int64_t left = static_cast<int64_t>(s.tokens.size()) - s.num_computed;
  const int64_t n = std::min(budget, left);
  const compute::MultimodalPrompt* mm = s.req->images.get();
  if (!mm || !mm->non_causal_images) return n;
  for (const auto& img : mm->images) {
    const int64_t end = img.begin + img.count;
    if (end <= s.num_computed) continue;
    if (img.begin <= s.num_computed) {
      const int64_t whole = end - s.num_computed;
      return whole <= budget || step_empty ? whole : 0;
    }
    return std::min(n, img.begin - s.num_computed);
  }
  return n;
}

// The image rows of tokens [from, from + n) of s (null when there are none), and whether those
// tokens are a non-causal image.
void attach_images(const Seq& s, int64_t from, int64_t n, int64_t width, SeqWork& w) {
  const compute::MultimodalPrompt* mm = s.req->images.get();
  if (!mm) return;
  const auto first = s.tokens.begin() + from;
  const auto k = std::count(first, first + n, compute::SeqStep::kEmbedded);
  if (k == 0) return;
  const auto row0 = std::count(s.tokens.begin(), first, compute::SeqStep::kEmbedded);
  w.image_rows = std::make_shared<const std::vector<float>>(mm->embd.begin() + row0 * width,
                                                            mm->embd.begin() + (row0 + k) * width);
  w.non_causal = mm->non_causal_images;
}

SeqWork make_work(Self* self, int64_t id, Seq& s, int64_t n) {
  auto& st = self->state;
  SeqWork w;
  w.seq_id = id;
  w.pos0 = s.num_computed;
  w.state = s.state;
  w.tokens.assign(s.tokens.begin() + s.num_computed, s.tokens.begin() + s.num_computed + n);
  attach_images(s, s.num_computed, n, st.n_embd, w);
  auto bt = st.kv->block_table(id);
  w.blocks.assign(bt.begin(), bt.end());
  w.sample = s.num_computed + n == static_cast<int64_t>(s.tokens.size());
  w.want_logits = w.sample && s.req->want_logits;
  w.sampling = s.req->sampling;
  w.rng = s.rng;
  const auto& sp = *s.req->sampling;
  if (w.sample &&
      (sp.repetition_penalty != 1.f || sp.presence_penalty != 0.f || sp.frequency_penalty != 0.f)) {
    // Penalties see the text's tokens, not the image positions (as the single-process path).
    auto h = std::make_shared<std::vector<int32_t>>();
    h->reserve(s.tokens.size());
    std::copy_if(s.tokens.begin(), s.tokens.end(), std::back_inserter(*h),
                 [](int32_t t) { return t != compute::SeqStep::kEmbedded; });
    w.history = std::move(h);
  }
  if (w.sample && !sp.grammar.empty()) {
    // The reply so far: what the grammar has matched (a replay's prompt ends with its start).
    const size_t begin = s.req->prompt.size() - static_cast<size_t>(s.req->num_generated);
    w.output =
        std::make_shared<const std::vector<int32_t>>(s.tokens.begin() + begin, s.tokens.end());
  }
  s.in_flight = true;
  s.in_flight_tokens = n;
  return w;
}

void schedule(Self* self) {
  auto& st = self->state;
  if (!st.first_stage) return;  // requests wait until the pipeline is wired
  if (st.held) return;          // the pipeline is being re-placed: requests wait for (reset)
  while (st.in_flight < st.cfg.microbatches) {
    auto batch = std::make_shared<StepBatch>();
    int64_t budget = st.cfg.max_tokens_per_step;
    // 1. Running sequences first (they arrived earlier): a decode token or the next prefill chunk.
    for (size_t i = 0; i < st.running.size() && budget > 0; ++i) {
      const int64_t id = st.running[i];
      Seq& s = st.seqs.at(id);
      if (s.in_flight || s.cancelled) continue;
      const int64_t n = next_chunk(s, budget, batch->seqs.empty());
      if (n <= 0) continue;
      bool ok = st.kv->reserve(id, s.num_computed + n);
      while (!ok && preempt_one(self, id)) ok = st.kv->reserve(id, s.num_computed + n);
      if (!ok) continue;  // wait for blocks to come back
      batch->seqs.push_back(make_work(self, id, s, n));
      budget -= n;
    }
    // 2. Admit waiting sequences in arrival order while budget and KV allow.
    while (budget > 0 && !st.waiting.empty() &&
           static_cast<int64_t>(st.running.size()) < st.cfg.max_sequences) {
      const int64_t id = st.waiting.front();
      Seq& s = st.seqs.at(id);
      auto cached = st.kv->add_sequence(id, cache_view(s), s.whole);
      if (!cached) {
        finish(self, id, "error", cached.error().message);
        continue;
      }
      s.num_computed = *cached;
      const int64_t n = next_chunk(s, budget, batch->seqs.empty());
      if (n <= 0) {  // a whole image does not fit this step: wait for the next
        st.kv->free_sequence(id);
        break;
      }
      if (!st.kv->reserve(id, s.num_computed + n) || !take_state(st, s)) {
        st.kv->free_sequence(id);  // not enough free blocks now: keep its place in the queue
        break;
      }
      s.admitted = true;
      st.waiting.pop_front();
      st.running.push_back(id);
      batch->seqs.push_back(make_work(self, id, s, n));
      budget -= n;
    }
    if (batch->seqs.empty()) return;
    batch->epoch = st.epoch;
    batch->step_id = st.next_step++;
    batch->microbatch = static_cast<int32_t>(st.in_flight);
    ++st.in_flight;
    ++st.steps;
    auto& ids = st.steps_in_flight[batch->step_id];
    for (const SeqWork& w : batch->seqs) ids.push_back(w.seq_id);
    st.step_sent[batch->step_id] = std::chrono::steady_clock::now();
    if (st.step_timeout_ms > 0)
      self->delayed_send(self, std::chrono::milliseconds(st.step_timeout_ms), deadline_atom::value,
                         batch->step_id, st.epoch);
    self->send(st.first_stage, step_atom::value, StepBatchPtr(std::move(batch)), HiddenPtr{}, 0.0);
  }
}

// Counts a failed step of s; whether s has failed for too long to try again.
bool gave_up(const SchedulerState& st, Seq& s) {
  const auto now = std::chrono::steady_clock::now();
  if (s.failures++ == 0) s.failing_since = now;
  return s.failures >= kMinStepFailures &&
         now - s.failing_since >= std::chrono::milliseconds(st.step_failure_window_ms);
}

// A failed or timed-out step: its sequences run the same positions again (KV writes are
// idempotent). A recurrent state is not: a stage before the failure may have advanced it, and a
// step cannot undo that (the retry would repeat positions), so those sequences are computed
// again from position 0, whose step starts their states afresh. They keep their KV blocks and
// state slot: the failed step may still be on its way through later stages, and what it writes
// there is what the recomputation writes (a freed block or slot could already be another
// sequence's).
void retry_sequences(Self* self, const std::vector<int64_t>& ids, const std::string& why) {
  auto& st = self->state;
  for (int64_t id : ids) {
    auto it = st.seqs.find(id);
    if (it == st.seqs.end()) continue;
    it->second.in_flight = false;
    ++st.recomputes;
    if (it->second.cancelled)
      finish(self, id, "cancelled");
    else if (gave_up(st, it->second))
      finish(
          self, id, "error",
          strfmt("its steps failed %d times in a row over %g s; the last: %s", it->second.failures,
                 static_cast<double>(st.step_failure_window_ms) / 1000.0, why.c_str()));
    else if (st.state_slots > 0)
      it->second.num_computed = 0;
  }
}

// The step's deadline passed without its outcome: give up on it (a late outcome is dropped,
// since the step is no longer in flight) and run its sequences again.
void on_deadline(Self* self, uint64_t step_id, uint64_t epoch) {
  auto& st = self->state;
  if (epoch != st.epoch) return;
  auto it = st.steps_in_flight.find(step_id);
  if (it == st.steps_in_flight.end()) return;  // it came back in time
  const std::vector<int64_t> ids = std::move(it->second);
  st.steps_in_flight.erase(it);
  st.step_sent.erase(step_id);
  --st.in_flight;
  ++st.step_timeouts;
  std::fprintf(stderr, "troupe: scheduler: step %llu timed out after %lld ms; running it again\n",
               static_cast<unsigned long long>(step_id),
               static_cast<long long>(st.step_timeout_ms));
  retry_sequences(self, ids,
                  strfmt("the step timed out after %lld ms", (long long)st.step_timeout_ms));
  schedule(self);
}

// Drops every block and step in flight (a new epoch: late outcomes are dropped).
void reset_pipeline(Self* self) {
  auto& st = self->state;
  ++st.epoch;
  st.in_flight = 0;
  st.steps_in_flight.clear();
  st.step_sent.clear();
  st.kv = std::make_unique<compute::KvPools>(st.kv_cfg, st.kv_pools);
  free_all_states(st);
  for (auto& [id, s] : st.seqs) {
    (void)id;
    s.state = -1;
  }
}

void on_done(Self* self, const StepOutcomePtr& out) {
  auto& st = self->state;
  if (out->epoch != st.epoch) return;  // a step from before a reset: its sequences were requeued
  auto step_it = st.steps_in_flight.find(out->step_id);
  if (step_it == st.steps_in_flight.end()) return;  // unknown or duplicate outcome: dropped
  const std::vector<int64_t> ids = std::move(step_it->second);
  st.steps_in_flight.erase(step_it);
  if (auto t = st.step_sent.find(out->step_id); t != st.step_sent.end()) {
    st.step_wall_s +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t->second).count();
    st.step_compute_s += out->compute_seconds;
    st.step_sent.erase(t);
  }
  --st.in_flight;
  if (!out->error.empty()) {
    retry_sequences(self, ids, out->error);
    schedule(self);
    return;
  }
  for (const SeqResult& r : out->results) {
    auto it = st.seqs.find(r.seq_id);
    if (it == st.seqs.end()) continue;
    Seq& s = it->second;
    if (!s.in_flight) continue;
    s.in_flight = false;
    s.failures = 0;
    s.num_computed += s.in_flight_tokens;
    // Positions a recurrent model's sequence computes again after a failure were committed.
    if (s.num_computed >= st.kv->computed_length(r.seq_id))
      st.kv->commit(r.seq_id, cache_view(s), s.num_computed);
    if (s.cancelled) {
      finish(self, r.seq_id, "cancelled");
      continue;
    }
    if (!r.error.empty()) {
      finish(self, r.seq_id, "error", r.error);
      continue;
    }
    if (r.token < 0) continue;  // a prefill chunk that did not reach the end of the prompt
    s.rng = r.rng;
    s.tokens.push_back(r.token);
    if (!s.cache_tokens.empty()) s.cache_tokens.push_back(r.token);
    ++s.num_generated;
    ++st.tokens_generated;
    const auto& sp = *s.req->sampling;
    const bool eos = sp.is_stop_token(r.token, s.req->eos_ids);
    std::string reason;
    if (eos) {
      reason = "stop";
    } else if (s.num_generated >= s.req->max_tokens) {
      reason = "length";
    } else if (static_cast<int64_t>(s.tokens.size()) >= st.cfg.max_model_len) {
      reason = "length";
    }
    emit(self, s, r.seq_id, r.token, false, {}, {}, r.logits);
    if (!reason.empty()) finish(self, r.seq_id, reason);
  }
  schedule(self);
}

// Stops sequence `id`: now, or when its step in flight comes back. Returns whether it existed.
bool cancel_seq(Self* self, int64_t id) {
  auto& st = self->state;
  auto it = st.seqs.find(id);
  if (it == st.seqs.end()) return false;
  if (it->second.in_flight) {
    it->second.cancelled = true;  // finished when its step comes back
  } else {
    finish(self, id, "cancelled");
  }
  return true;
}

// An injected fault: an exception escaping a handler ends the actor; its supervisor restarts it.
void maybe_crash(Self* self) {
  if (self->state.crash_next) throw std::runtime_error("scheduler: injected fault");
}

void on_submit(Self* self, const SeqRequestPtr& req, SchedulerClientActor reply_to) {
  auto& st = self->state;
  Seq s;
  s.req = req;
  s.reply_to = std::move(reply_to);
  s.tokens = req->prompt;
  s.rng = req->rng == compute::SamplerState{} ? compute::Sampler::seeded_state(req->sampling->seed)
                                              : req->rng;
  const int64_t id = req->seq_id;
  if (st.seqs.count(id)) {
    emit(self, s, id, -1, true, "error", "duplicate request id " + std::to_string(id));
    return;
  }
  if (!req->replay && static_cast<int64_t>(st.waiting.size()) >= st.cfg.max_queue) {
    emit(self, s, id, -1, true, "overloaded",
         "server overloaded: " + std::to_string(st.waiting.size()) + " requests waiting (limit " +
             std::to_string(st.cfg.max_queue) + ")");
    return;
  }
  const int64_t len = static_cast<int64_t>(req->prompt.size());
  if (req->num_generated > 0 && len >= st.cfg.max_model_len) {
    // Its last token reached the limit before the failure; only the finish event was lost.
    emit(self, s, id, -1, true, "length");
    return;
  }
  std::string bad;
  if (req->prompt.empty()) bad = "the prompt is empty";
  int64_t n_images = 0;
  for (int32_t t : req->prompt) {
    if (t == compute::SeqStep::kEmbedded && req->images) {
      ++n_images;
      continue;
    }
    if (t < 0 || t >= st.n_vocab)
      bad = "prompt token " + std::to_string(t) + " is outside the vocabulary";
  }
  if (req->images && static_cast<int64_t>(req->images->embd.size()) != n_images * st.n_embd)
    bad = "the prompt's " + std::to_string(req->images->embd.size()) +
          " image row values are not its " + std::to_string(n_images) + " image positions x " +
          std::to_string(st.n_embd);
  if (len >= st.cfg.max_model_len)
    bad = "the prompt has " + std::to_string(req->prompt.size()) +
          " tokens; the model length limit is " + std::to_string(st.cfg.max_model_len);
  else if (!st.kv->can_fit(len + 1))
    bad = "the prompt does not fit in the KV pool";
  if (!bad.empty()) {
    emit(self, s, id, -1, true, "error", bad);
    return;
  }
  if (s.reply_to && st.watched.insert(s.reply_to.address()).second) self->monitor(s.reply_to);
  s.cache_tokens = cache_tokens_of(st, *req);
  if (req->images && req->images->non_causal_images)
    for (const auto& img : req->images->images)
      s.whole.push_back({img.begin, img.begin + img.count});
  st.seqs.emplace(id, std::move(s));
  st.waiting.push_back(id);
  schedule(self);
}

// A requester (the router) terminated: nobody will read its token events, so its sequences are
// cancelled and their blocks freed (a replacement router resubmits them under new ids).
void on_requester_down(Self* self, const caf::down_msg& dm) {
  auto& st = self->state;
  if (st.watched.erase(dm.source) == 0) return;
  std::vector<int64_t> ids;
  for (const auto& [id, s] : st.seqs)
    if (s.reply_to.address() == dm.source) ids.push_back(id);
  for (int64_t id : ids) cancel_seq(self, id);
  schedule(self);
}

}  // namespace

SchedulerActor::behavior_type scheduler_behavior(
    SchedulerActor::stateful_pointer<SchedulerState> self, SchedulerActorConfig cfg,
    StageInputActor first_stage) {
  auto& st = self->state;
  st.cfg = cfg.limits;
  st.n_vocab = cfg.n_vocab;
  st.n_embd = cfg.n_embd;
  st.epoch = cfg.epoch0;
  st.step_timeout_ms = cfg.step_timeout_ms;
  st.step_failure_window_ms = cfg.step_failure_window_ms;
  st.first_stage = std::move(first_stage);
  st.kv_cfg.num_blocks = cfg.kv_blocks;
  st.kv_cfg.block_size = cfg.kv_block_size;
  st.state_slots = cfg.state_slots;
  st.kv_cfg.enable_prefix_cache = cfg.limits.prefix_cache && st.state_slots == 0;
  st.kv_pools = cfg.kv_pools;
  free_all_states(st);
  st.kv = std::make_unique<compute::KvPools>(st.kv_cfg, st.kv_pools);
  self->set_down_handler([=](caf::down_msg& dm) { on_requester_down(self, dm); });
  return {
      [=](submit_atom, const SeqRequestPtr& req, SchedulerClientActor reply_to) {
        maybe_crash(self);
        on_submit(self, req, std::move(reply_to));
      },
      [=](cancel_atom, int64_t id) {
        maybe_crash(self);
        if (cancel_seq(self, id)) schedule(self);
      },
      [=](done_atom, const StepOutcomePtr& out) {
        maybe_crash(self);
        on_done(self, out);
      },
      [=](stage_atom, StageInputActor first) {
        maybe_crash(self);
        self->state.first_stage = std::move(first);
        schedule(self);
      },
      [=](reset_atom) {
        maybe_crash(self);
        // A stage restarted with an empty KV pool: drop every block (and the prefix cache, whose
        // contents that stage no longer has) and recompute all sequences from their token logs.
        auto& st = self->state;
        st.held = false;
        reset_pipeline(self);
        std::deque<int64_t> requeue;
        for (int64_t id : st.running) requeue.push_back(id);
        for (int64_t id : st.waiting) requeue.push_back(id);
        st.running.clear();
        st.waiting = std::move(requeue);
        for (auto& [id, s] : st.seqs) {
          (void)id;
          s.admitted = false;
          s.in_flight = false;
          s.num_computed = 0;
        }
        ++st.recomputes;
        for (auto it = st.seqs.begin(); it != st.seqs.end();) {
          auto cur = it++;
          if (cur->second.cancelled) finish(self, cur->first, "cancelled");
        }
        schedule(self);
      },
      [=](stats_atom) -> std::string {
        auto& st = self->state;
        const auto kv = st.kv->stats();
        return strfmt(
            "{\"running\":%zu,\"waiting\":%zu,\"steps\":%llu,\"preemptions\":%llu,"
            "\"recomputes\":%llu,\"step_timeouts\":%llu,\"tokens_generated\":%llu,\"kv_usage_"
            "perc\":%.2f,"
            "\"prefix_hit_tokens\":%llu,\"prefix_query_tokens\":%llu,"
            "\"step_wall_seconds\":%.6f,\"step_compute_seconds\":%.6f}",
            st.running.size(), st.waiting.size(), (unsigned long long)st.steps,
            (unsigned long long)st.preemptions, (unsigned long long)st.recomputes,
            (unsigned long long)st.step_timeouts, (unsigned long long)st.tokens_generated,
            kv.usage_perc, (unsigned long long)kv.prefix_hit_tokens,
            (unsigned long long)kv.prefix_query_tokens, st.step_wall_s, st.step_compute_s);
      },
      [=](kv_atom) -> compute::KvStats { return self->state.kv->stats(); },
      [=](deadline_atom, uint64_t step_id, uint64_t epoch) { on_deadline(self, step_id, epoch); },
      [=](hold_atom) {
        // Part of the pipeline is gone and is being re-placed: send no steps (they would go to
        // actors that are no more) until (reset) says the new pipeline is wired.
        self->state.held = true;
      },
      [=](fail_atom, const std::string& why) {
        // The pipeline cannot run (a node hosting its actors is gone): end every request with
        // the reason instead of letting it wait.
        auto& st = self->state;
        std::vector<int64_t> ids;
        for (const auto& [id, s] : st.seqs) ids.push_back(id);
        for (int64_t id : ids) finish(self, id, "error", why);
        st.held = false;
        reset_pipeline(self);
      },
      [=](crash_atom) { self->state.crash_next = true; },
  };
}

SchedulerActor spawn_scheduler(caf::actor_system& sys, const SchedulerActorConfig& cfg,
                               StageInputActor first_stage) {
  return sys.spawn(scheduler_behavior, cfg, std::move(first_stage));
}

}  // namespace troupe::actors
