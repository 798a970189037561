// Stage actor: a contiguous range of layers on its own thread (spawned detached) with its own
// compute pool and KV pool. Runs a step, forwards hidden states to the next stage or, on the last
// stage, samples and reports the outcome to the scheduler. MoE rows go to expert-shard actors.
#include "actors/stage.h"

#ifdef TROUPE_HAVE_CUDA
#include "gpu/dp_engine.h"
#include "gpu/tp_engine.h"
#endif

#include <chrono>
#include <cstring>
#include <future>
#include <stdexcept>

#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "actors/detail/messages.h"
#include "actors/plan.h"
#include "base/check.h"
#include "compute/grammar_sampling.h"

namespace troupe::actors {

namespace {

// Sends each expert's rows to the shard that owns it and waits for all of them.
class ShardedExperts : public compute::ExpertRunner {
 public:
  ShardedExperts(int64_t n_embd, std::chrono::milliseconds timeout)
      : n_embd_(n_embd), timeout_(timeout) {}
  ExpertPlacement placement;

  void run(int64_t layer, std::span<const compute::ExpertTask> tasks) override {
    const size_t num_shards = placement.shards.size();
    std::vector<ExpertRequestPtr> reqs(num_shards);
    int used = 0;
    for (const auto& t : tasks) {
      TROUPE_CHECK(t.expert >= 0 && static_cast<size_t>(t.expert) < placement.owner.size(),
                   "expert %d has no owner", t.expert);
      const size_t s = static_cast<size_t>(placement.owner[static_cast<size_t>(t.expert)]);
      if (!reqs[s]) {
        reqs[s] = std::make_shared<ExpertRequest>();
        reqs[s]->layer = layer;
        ++used;
      }
      auto& r = *reqs[s];
      r.experts.push_back(t.expert);
      r.rows.push_back(t.n_rows);
      r.x.insert(r.x.end(), t.x, t.x + t.n_rows * n_embd_);
    }
    auto latch = std::make_shared<Latch>(used);
    for (size_t s = 0; s < num_shards; ++s) {
      if (!reqs[s]) continue;
      reqs[s]->done = latch;
      reqs[s]->y.resize(reqs[s]->x.size());
      // Guarded: a request the shard drops unanswered (it stopped, or was replaced) fails at
      // once instead of leaving this thread to wait out the timeout.
      caf::anon_send(placement.shards[s], expert_atom::value,
                     guard_request(reqs[s], "expert shard " + std::to_string(s) +
                                                " stopped without answering"));
    }
    if (!latch->wait_for(timeout_))
      throw std::runtime_error(strfmt("layer %lld: an expert shard did not answer within %lld ms",
                                      static_cast<long long>(layer),
                                      static_cast<long long>(timeout_.count())));
    // Copy each shard's outputs back in task order.
    std::vector<size_t> at(num_shards, 0);
    for (const auto& t : tasks) {
      const size_t s = static_cast<size_t>(placement.owner[static_cast<size_t>(t.expert)]);
      const auto& r = *reqs[s];
      if (!r.error.empty())
        throw std::runtime_error("expert shard " + std::to_string(s) + ": " + r.error);
      std::memcpy(t.y, r.y.data() + at[s], static_cast<size_t>(t.n_rows * n_embd_) * sizeof(float));
      at[s] += static_cast<size_t>(t.n_rows * n_embd_);
    }
  }

 private:
  int64_t n_embd_;
  std::chrono::milliseconds timeout_;
};

// The engine a stage computes with: the CPU engine, or the GPU engine on device "cuda:N" or a
// tensor-parallel group on "cuda:N,M,..." (when this build has the CUDA backend). Both take the
// same steps and give the same results' shape.
class StageCompute {
 public:
  virtual ~StageCompute() = default;
  virtual Status step(std::span<const compute::SeqStep> steps, compute::StepResult* out,
                      const float* hidden_in, std::vector<float>* hidden_out) = 0;
  virtual uint64_t kv_bytes() const = 0;
  virtual uint64_t state_bytes() const { return 0; }  // recurrent states allocated so far
};

class CpuCompute : public StageCompute {
 public:
  explicit CpuCompute(std::unique_ptr<compute::Engine> e) : e_(std::move(e)) {}
  Status step(std::span<const compute::SeqStep> steps, compute::StepResult* out,
              const float* hidden_in, std::vector<float>* hidden_out) override {
    return e_->step(steps, out, hidden_in, hidden_out);
  }
  uint64_t kv_bytes() const override { return e_->kv_cache().bytes(); }
  uint64_t state_bytes() const override { return e_->state_bytes(); }

 private:
  std::unique_ptr<compute::Engine> e_;
};

#ifdef TROUPE_HAVE_CUDA
template <class Engine>
class GpuCompute : public StageCompute {
 public:
  explicit GpuCompute(std::unique_ptr<Engine> e) : e_(std::move(e)) {}
  Status step(std::span<const compute::SeqStep> steps, compute::StepResult* out,
              const float* hidden_in, std::vector<float>* hidden_out) override {
    return e_->step(steps, out, hidden_in, hidden_out);
  }
  uint64_t kv_bytes() const override { return e_->kv_bytes(); }

 private:
  std::unique_ptr<Engine> e_;  // GpuTpEngine (one GPU or a tensor-parallel group) or GpuDpEngine
};
#endif

// Builds the stage's engine on its device; errors name the stage.
Result<std::unique_ptr<StageCompute>> make_compute(const StageConfig& cfg,
                                                   const compute::EngineOptions& eo) {
  if (cfg.device == "cpu") {
    auto eng = compute::Engine::create(cfg.model, eo);
    if (!eng) return eng.error();
    if ((*eng)->needs_state() && cfg.state_slots <= 0)
      return Error{1, "stage: " + cfg.model->path +
                          ": its linear-attention layers keep a recurrent state per sequence, "
                          "but the stage was given no state slots (StageConfig::state_slots)"};
    return std::unique_ptr<StageCompute>(std::make_unique<CpuCompute>(std::move(*eng)));
  }
#ifdef TROUPE_HAVE_CUDA
  const std::vector<int> devices = cuda_devices(cfg.device);  // checked by the plan parser
  if (devices.empty())
    return Error{1, "device \"" + cfg.device + "\" is not \"cpu\" or \"cuda:N[,M...]\""};
  gpu::GpuEngineOptions go;
  go.range = eo.range;
  go.kv_block_size = eo.kv_block_size;
  go.kv_num_blocks = eo.kv_num_blocks;
  go.max_positions = eo.max_positions;
  if (cfg.parallel == "data") {
    auto eng = gpu::GpuDpEngine::create(cfg.model, go, devices);
    if (!eng) return Error{eng.error().code, cfg.device + ": " + eng.error().message};
    return std::unique_ptr<StageCompute>(
        std::make_unique<GpuCompute<gpu::GpuDpEngine>>(std::move(*eng)));
  }
  auto eng = gpu::GpuTpEngine::create(cfg.model, go, devices);
  if (!eng) return Error{eng.error().code, cfg.device + ": " + eng.error().message};
  return std::unique_ptr<StageCompute>(
      std::make_unique<GpuCompute<gpu::GpuTpEngine>>(std::move(*eng)));
#else
  return Error{1, "device " + cfg.device +
                      ": this build has no CUDA backend (configure with -DTROUPE_CUDA=ON where "
                      "nvcc is installed)"};
#endif
}

struct StageState {
  StageConfig cfg;
  std::unique_ptr<ShardedExperts> experts;
  std::unique_ptr<StageCompute> engine;  // null when it could not be built: create_error says why
  std::string create_error;
  StageInputActor next;  // the next stage; null on the last stage (it reports to cfg.scheduler)
  bool crash_next = false;
  // Constrained sequences' matchers and masks (the last stage; made at the first grammar).
  std::unique_ptr<compute::GrammarSampling> grammars;
  static inline const char* name = "stage";
};

using Self = StageActor::stateful_base<StageState>;

void fail_step(Self* self, const StepBatch& b, const std::string& err) {
  auto out = std::make_shared<StepOutcome>();
  out->epoch = b.epoch;
  out->step_id = b.step_id;
  out->microbatch = b.microbatch;
  out->error = "stage " + std::to_string(self->state.cfg.index) + ": " + err;
  self->send(self->state.cfg.scheduler, done_atom::value, StepOutcomePtr(std::move(out)));
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The stage's GrammarSampling, made at the first grammar; error when the model has no vocabulary.
Status ensure_grammars(StageState& st) {
  if (st.grammars) return Ok{};
  if (!st.cfg.model->tokenizer)
    return make_error(0, "the model has no vocabulary: a grammar cannot be followed");
  st.grammars =
      std::make_unique<compute::GrammarSampling>(compute::TokenVocab::of(*st.cfg.model->tokenizer));
  return Ok{};
}

const std::vector<int32_t>& reply_tokens(const SeqWork& w) {
  static const std::vector<int32_t> kNone;
  return w.output ? *w.output : kNone;
}

// A draw under the sequence's grammar (compute/grammar_sampling.h).
Result<int32_t> sample_constrained(StageState& st, const SeqWork& w, compute::Sampler& sampler,
                                   std::span<const float> row, std::span<const int32_t> history) {
  if (auto ok = ensure_grammars(st); !ok) return ok.error();
  return st.grammars->sample(w.seq_id, *w.sampling, reply_tokens(w), sampler, row, history);
}

// Builds the masks of the step's constrained draws on a thread of its own while the forward pass
// runs (the grammar state is known before the logits are). Greedy draws are left out: their best
// token is usually allowed, and then no mask is needed. The future must be waited on before
// st.grammars is used again.
std::future<void> prepare_masks(StageState& st, const StepBatch& b) {
  std::vector<const SeqWork*> todo;
  for (const SeqWork& w : b.seqs)
    if (w.sample && w.sampling && !w.sampling->grammar.empty() && w.sampling->temperature > 0)
      todo.push_back(&w);
  if (todo.empty() || !ensure_grammars(st)) return {};
  return std::async(std::launch::async, [&st, todo = std::move(todo)] {
    for (const SeqWork* w : todo) st.grammars->prepare(w->seq_id, *w->sampling, reply_tokens(*w));
  });
}

void run_step(Self* self, const StepBatchPtr& b, const HiddenPtr& h, double compute_s) {
  auto& st = self->state;
  const bool last = st.cfg.range.head;
  std::vector<compute::SeqStep> steps(b->seqs.size());
  for (size_t i = 0; i < b->seqs.size(); ++i) {
    const SeqWork& w = b->seqs[i];
    steps[i].pos0 = w.pos0;
    steps[i].tokens = w.tokens;
    steps[i].blocks = w.blocks;
    steps[i].logits = (last && (w.sample || w.want_logits)) ? compute::SeqStep::Logits::kLast
                                                            : compute::SeqStep::Logits::kNone;
    if (w.image_rows && st.cfg.range.embed) steps[i].embd = *w.image_rows;
    steps[i].non_causal = w.non_causal;
    steps[i].state = w.state;
    steps[i].state_owner = w.seq_id;
  }
  compute::StepResult res;
  if (!last) {
    auto hidden = std::make_shared<std::vector<float>>();
    const double t0 = now_s();
    auto s = st.engine->step(steps, &res, h ? h->data() : nullptr, hidden.get());
    if (!s) return fail_step(self, *b, s.error().message);
    self->send(st.next, step_atom::value, b, HiddenPtr(std::move(hidden)),
               compute_s + now_s() - t0);
    return;
  }
  const double t0 = now_s();
  std::future<void> masks = prepare_masks(st, *b);
  auto s = st.engine->step(steps, &res, h ? h->data() : nullptr, nullptr);
  if (masks.valid()) masks.get();
  if (!s) return fail_step(self, *b, s.error().message);
  auto out = std::make_shared<StepOutcome>();
  out->epoch = b->epoch;
  out->step_id = b->step_id;
  out->microbatch = b->microbatch;
  out->results.resize(b->seqs.size());
  for (size_t i = 0; i < b->seqs.size(); ++i) {
    const SeqWork& w = b->seqs[i];
    SeqResult& r = out->results[i];
    r.seq_id = w.seq_id;
    r.rng = w.rng;
    if (res.row_count[i] == 0) continue;
    std::span<const float> row(res.row(i), static_cast<size_t>(res.n_vocab));
    if (w.want_logits) r.logits.assign(row.begin(), row.end());
    if (w.sample) {
      compute::Sampler sampler(*w.sampling);
      if (auto ok = sampler.set_state(w.rng); !ok) return fail_step(self, *b, ok.error().message);
      static const std::vector<int32_t> kNoHistory;
      const auto& history = w.history ? *w.history : kNoHistory;
      if (w.sampling->grammar.empty()) {
        r.token = sampler.sample(row, history);
      } else if (auto t = sample_constrained(st, w, sampler, row, history)) {
        r.token = *t;
      } else {
        r.error = t.error().message;  // this sequence ends; the step's others go on
      }
      r.rng = sampler.state();
    }
  }
  if (st.grammars) st.grammars->end_step();
  out->compute_seconds = compute_s + now_s() - t0;  // sampling counts as compute
  self->send(st.cfg.scheduler, done_atom::value, StepOutcomePtr(std::move(out)));
}

}  // namespace

StageActor::behavior_type stage_behavior(StageActor::stateful_pointer<StageState> self,
                                         StageConfig cfg, StageInputActor next,
                                         ExpertPlacement placement) {
  auto& st = self->state;
  st.cfg = std::move(cfg);
  st.next = std::move(next);
  compute::EngineOptions eo;
  eo.n_threads = st.cfg.threads;
  eo.range = st.cfg.range;
  eo.kv_block_size = st.cfg.kv_block_size;
  eo.kv_num_blocks = st.cfg.kv_blocks;
  eo.kv_type = st.cfg.kv_type;
  if (st.cfg.state_slots > 0) eo.max_recurrent_seqs = st.cfg.state_slots;
  eo.max_positions = st.cfg.max_positions;
  if (!placement.shards.empty()) {
    st.experts = std::make_unique<ShardedExperts>(st.cfg.model->spec.n_embd, st.cfg.expert_timeout);
    st.experts->placement = std::move(placement);
    eo.expert_runner = st.experts.get();
  }
  // A stage whose engine cannot be built (no GPU, no memory for its KV pool) stays up and says
  // why: its readiness check (stats) answers with the error, and steps fail with it.
  auto eng = make_compute(st.cfg, eo);
  if (eng)
    st.engine = std::move(*eng);
  else
    st.create_error = "stage " + std::to_string(st.cfg.index) + ": " + eng.error().message;
  return {
      [=](step_atom, const StepBatchPtr& b, const HiddenPtr& h, double compute_s) {
        if (self->state.crash_next) throw std::runtime_error("injected fault");
        if (!self->state.engine) return fail_step(self, *b, self->state.create_error);
        run_step(self, b, h, compute_s);
      },
      [=](next_atom, StageInputActor n) { self->state.next = std::move(n); },
      // The scheduler was replaced: outcomes and failed steps are reported to the new one.
      [=](sched_atom, SchedulerActor s) { self->state.cfg.scheduler = std::move(s); },
      [=](shards_atom, std::vector<ExpertShardActor> shards) {
        if (self->state.experts) self->state.experts->placement.shards = std::move(shards);
      },
      [=](crash_atom) { self->state.crash_next = true; },
      [=](stats_atom) -> caf::result<std::string> {
        if (!self->state.engine)
          return caf::make_error(caf::sec::runtime_error, self->state.create_error);
        return strfmt(
            "{\"stage\":%d,\"layers\":[%lld,%lld],\"kv_bytes\":%llu,\"state_bytes\":%llu}",
            self->state.cfg.index, (long long)self->state.cfg.range.begin,
            (long long)self->state.cfg.range.end,
            (unsigned long long)self->state.engine->kv_bytes(),
            (unsigned long long)self->state.engine->state_bytes());
      },
  };
}

StageActor spawn_stage(caf::actor_system& sys, const StageConfig& cfg, StageInputActor next,
                       ExpertPlacement placement) {
  return sys.spawn<caf::detached>(stage_behavior, cfg, std::move(next), std::move(placement));
}

}  // namespace troupe::actors
