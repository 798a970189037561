// Remote proxies (see detail/remote.h): encode in-process messages and send them over the Link.
#include "actors/detail/remote.h"

#include <atomic>
#include <cstdio>
#include <map>

#include <caf/sec.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "actors/detail/messages.h"

namespace troupe::actors::detail {

namespace {

// A step that cannot leave this node fails at the scheduler (which recomputes it), instead of
// vanishing.
void fail_step(const SchedulerActor& scheduler, const StepBatch& b, const std::string& why) {
  auto out = std::make_shared<StepOutcome>();
  out->epoch = b.epoch;
  out->step_id = b.step_id;
  out->microbatch = b.microbatch;
  out->error = why;
  if (scheduler) caf::anon_send(scheduler, done_atom::value, StepOutcomePtr(std::move(out)));
}

// A message of the interface that no proxy forwards (see detail/remote.h): logged and dropped,
// as CAF's default handler did for the untyped proxies; refuse() answers a request with
// sec::unexpected_message, as that handler did.
void drop(const char* proxy, const char* what) {
  std::fprintf(stderr, "troupe: %s proxy: dropped an unexpected (%s)\n", proxy, what);
}

caf::error refuse(const char* proxy, const char* what) {
  drop(proxy, what);
  return caf::make_error(caf::sec::unexpected_message);
}

struct RemoteStageState {
  static inline const char* name = "remote_stage";
};

struct RemoteSchedulerState {
  static inline const char* name = "remote_scheduler";
};

struct RemoteShardsState {
  uint64_t next_id = 1;
  // By dispatch id (ExpertStep.step_id). The stage sends guarded requests (guard_request): a
  // proxy that stops with requests pending (a re-placement replaced it, the node shuts down)
  // drops them here, and each guard fails its request, so the stage does not wait out its expert
  // timeout for answers that can no longer arrive.
  std::map<uint64_t, ExpertRequestPtr> pending;
  static inline const char* name = "remote_shards";
};

StageActor::behavior_type remote_stage(StageActor::stateful_pointer<RemoteStageState>,
                                       std::shared_ptr<Link> link, std::string node, uint32_t stage,
                                       int64_t n_embd, SchedulerActor scheduler) {
  return {
      [=](step_atom, const StepBatchPtr& b, const HiddenPtr& h, double) {
        auto f = encode_step(*b, h, n_embd, stage, link->send_info(ActorRole::kStage, stage));
        Status s = f ? link->send(node, ControlMsg::kBatchDescriptor, *f) : Status(f.error());
        if (!s)
          fail_step(scheduler, *b,
                    "stage " + std::to_string(stage) + " on " + node + ": " + s.error().message);
      },
      [](sched_atom, const SchedulerActor&) { drop("remote stage", "sched"); },
      [](next_atom, const StageInputActor&) { drop("remote stage", "next"); },
      [](shards_atom, const std::vector<ExpertShardActor>&) { drop("remote stage", "shards"); },
      [](crash_atom) { drop("remote stage", "crash"); },
      [](stats_atom) -> caf::result<std::string> { return refuse("remote stage", "stats"); },
  };
}

SchedulerActor::behavior_type remote_scheduler(
    SchedulerActor::stateful_pointer<RemoteSchedulerState>, std::shared_ptr<Link> link,
    std::string head, int64_t n_vocab) {
  return {
      [=](done_atom, const StepOutcomePtr& out) {
        auto f = encode_step_outcome(*out, n_vocab, link->send_info(ActorRole::kStage));
        Status s = f ? link->send(head, ControlMsg::kStepResult, *f) : Status(f.error());
        // The scheduler is on the head: if it cannot be told, its step deadline (or the
        // head's lease check) recovers; say why here.
        if (!s)
          std::fprintf(stderr, "troupe: step %llu: cannot return the result to %s: %s\n",
                       static_cast<unsigned long long>(out->step_id), head.c_str(),
                       s.error().message.c_str());
      },
      [](submit_atom, const SeqRequestPtr&, const SchedulerClientActor&) {
        drop("remote scheduler", "submit");
      },
      [](cancel_atom, int64_t) { drop("remote scheduler", "cancel"); },
      [](stage_atom, const StageInputActor&) { drop("remote scheduler", "stage"); },
      [](reset_atom) { drop("remote scheduler", "reset"); },
      [](hold_atom) { drop("remote scheduler", "hold"); },
      [](deadline_atom, uint64_t, uint64_t) { drop("remote scheduler", "deadline"); },
      [](fail_atom, const std::string&) { drop("remote scheduler", "fail"); },
      [](crash_atom) { drop("remote scheduler", "crash"); },
      [](stats_atom) -> caf::result<std::string> { return refuse("remote scheduler", "stats"); },
      [](kv_atom) -> caf::result<compute::KvStats> { return refuse("remote scheduler", "kv"); },
  };
}

RemoteShardsActor::behavior_type remote_shards(
    RemoteShardsActor::stateful_pointer<RemoteShardsState> self, std::shared_ptr<Link> link,
    std::string node, int64_t n_embd) {
  return {
      [=](expert_atom, const ExpertRequestPtr& r) {
        const uint64_t id = self->state.next_id++;
        ExpertStep step{link->epoch(), id, 0};
        auto f = encode_expert_dispatch(r, n_embd, step, link->send_info(ActorRole::kStage));
        Status s = f ? link->send(node, ControlMsg::kExpertDispatch, *f) : Status(f.error());
        if (!s) return fail_request(*r, "expert shards on " + node + ": " + s.error().message);
        self->state.pending.emplace(id, r);
      },
      [=](combine_atom, const MessagePtr& m) {
        CombineLimits lim;
        lim.n_embd = n_embd;
        lim.expected_rows = 0;  // any: checked against the pending request below
        lim.expected_epoch = link->epoch();
        auto d = decode_expert_combine(m->data(), lim);
        if (!d) {
          link->report_malformed(m->peer);
          std::fprintf(stderr, "troupe: dropped an expert answer from %s: %s\n", node.c_str(),
                       d.error().message.c_str());
          return;
        }
        auto it = self->state.pending.find(d->step.step_id);
        if (it == self->state.pending.end()) return;  // late answer of a failed step
        ExpertRequestPtr r = it->second;
        self->state.pending.erase(it);
        if (!d->error.empty()) return fail_request(*r, d->error);
        if (d->y.size() != r->y.size())
          return fail_request(*r, "expert shards on " + node + " answered " +
                                      std::to_string(d->y.size()) + " values, expected " +
                                      std::to_string(r->y.size()));
        r->y = std::move(d->y);
        answer_request(*r);
      },
      [=](linkdown_atom) {
        for (auto& [id, r] : self->state.pending)
          fail_request(*r, "the link to " + node + " went down");
        self->state.pending.clear();
      },
      [](crash_atom) { drop("remote shards", "crash"); },
  };
}

using Clock = std::chrono::steady_clock;

// Job ids, unique in this process across proxies, so that no answer can be taken for another
// proxy's job.
std::atomic<uint64_t> next_image_job{1};

struct RemoteImageState {
  struct Job {
    caf::typed_response_promise<ImageRowsPtr> promise;
    bool accepted = false;    // the node's first receipt came
    Clock::time_point heard;  // the last receipt (or the send, before the first)
  };
  std::map<uint64_t, Job> pending;  // by job id
  static inline const char* name = "remote_image";
};

// Answers job `id` with `r` and forgets it; a job no longer pending (answered, given up) is left.
void answer_job(RemoteImageActor::stateful_pointer<RemoteImageState> self, uint64_t id,
                ImageRowsPtr r) {
  auto it = self->state.pending.find(id);
  if (it == self->state.pending.end()) return;
  auto rp = it->second.promise;
  self->state.pending.erase(it);
  rp.deliver(std::move(r));
}

ImageRowsPtr unreachable(const std::string& why) {
  auto r = std::make_shared<ImageRows>();
  r->error = why;
  r->retry = true;
  return r;
}

// A job is lost when its node has said nothing of it for `silence`: the node sends a receipt as
// soon as the image reaches its instance, before any encoding, and sends it again every heartbeat
// until the answer goes. No first receipt: the image was lost; no more receipts and no answer:
// the answer was.
RemoteImageActor::behavior_type remote_image(
    RemoteImageActor::stateful_pointer<RemoteImageState> self, std::shared_ptr<Link> link,
    std::string node, uint32_t index, int64_t n_rows, int64_t n_embd,
    std::chrono::milliseconds silence) {
  const std::string who = "image encoder " + std::to_string(index) + " on " + node;
  return {
      [=](image_atom, const ImageJobPtr& job) -> caf::result<ImageRowsPtr> {
        const uint64_t id = next_image_job.fetch_add(1);
        ImageJobWire w{id, index, job->bytes, job->what};
        auto f = encode_encode_image(w, link->epoch(), link->send_info(ActorRole::kEncoder, index));
        Status s = f ? link->send(node, ControlMsg::kEncodeImage, *f) : Status(f.error());
        if (!s) {
          // An image the wire refuses (too large) is the image's fault, not the link's.
          if (!f) {
            auto r = std::make_shared<ImageRows>();
            r->error = job->what + ": " + f.error().message;
            return ImageRowsPtr(std::move(r));
          }
          return unreachable(who + ": " + s.error().message);
        }
        auto rp = self->make_response_promise<ImageRowsPtr>();
        self->state.pending.emplace(id, RemoteImageState::Job{rp, false, Clock::now()});
        self->delayed_send(self, silence, deadline_atom::value, id);
        return rp;
      },
      [=](combine_atom, const MessagePtr& m) {
        EncodedImageLimits lim;
        lim.n_rows = n_rows;
        lim.n_embd = n_embd;
        auto d = decode_encoded_image(m->data(), lim);
        if (!d) {
          link->report_malformed(m->peer);
          std::fprintf(stderr, "troupe: dropped an image encoder answer from %s: %s\n",
                       node.c_str(), d.error().message.c_str());
          // Its job ends with the reason rather than wait for an answer that will not come.
          uint64_t job = 0;
          (void)peek_encoded_image(m->data(), lim.max_frame_bytes, &job);
          auto r = std::make_shared<ImageRows>();
          r->error = who + " sent an answer that does not decode: " + d.error().message;
          return answer_job(self, job, std::move(r));
        }
        if (d->accepted) {
          if (auto it = self->state.pending.find(d->job_id); it != self->state.pending.end()) {
            it->second.accepted = true;
            it->second.heard = Clock::now();
          }
          return;
        }
        auto r = std::make_shared<ImageRows>();
        r->seconds = d->seconds;
        r->retry = d->retry;
        if (!d->error.empty())
          r->error = d->error;
        else
          r->rows = std::make_shared<const std::vector<float>>(std::move(d->rows));
        answer_job(self, d->job_id, std::move(r));
      },
      [=](linkdown_atom) {
        for (auto& [id, job] : self->state.pending)
          job.promise.deliver(unreachable("the link to " + node + " went down"));
        self->state.pending.clear();
      },
      [=](deadline_atom, uint64_t id) {
        auto it = self->state.pending.find(id);
        if (it == self->state.pending.end()) return;
        const auto quiet = Clock::now() - it->second.heard;
        if (quiet < silence)
          return self->delayed_send(self, silence - quiet, deadline_atom::value, id);
        // A late receipt or answer is then ignored.
        const std::string ms = std::to_string(silence.count()) + " ms";
        answer_job(self, id,
                   unreachable(it->second.accepted ? who + " stopped reporting on the image for " +
                                                         ms + " (its answer was lost)"
                                                   : who + " did not take the image within " + ms));
      },
  };
}

}  // namespace

RemoteImageActor spawn_remote_image(caf::actor_system& sys, std::shared_ptr<Link> link,
                                    std::string node, uint32_t index, int64_t n_rows,
                                    int64_t n_embd, std::chrono::milliseconds silence) {
  return sys.spawn(remote_image, std::move(link), std::move(node), index, n_rows, n_embd, silence);
}

StageActor spawn_remote_stage(caf::actor_system& sys, std::shared_ptr<Link> link, std::string node,
                              uint32_t stage, int64_t n_embd, SchedulerActor scheduler) {
  return sys.spawn(remote_stage, std::move(link), std::move(node), stage, n_embd,
                   std::move(scheduler));
}

SchedulerActor spawn_remote_scheduler(caf::actor_system& sys, std::shared_ptr<Link> link,
                                      std::string head, int64_t n_vocab) {
  return sys.spawn(remote_scheduler, std::move(link), std::move(head), n_vocab);
}

RemoteShardsActor spawn_remote_shards(caf::actor_system& sys, std::shared_ptr<Link> link,
                                      std::string node, int64_t n_embd) {
  return sys.spawn(remote_shards, std::move(link), std::move(node), n_embd);
}

}  // namespace troupe::actors::detail
