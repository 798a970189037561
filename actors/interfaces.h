// The typed interfaces of the engine's actors (expert shard, stage, scheduler, router, controller):
// every message each one accepts, and what it answers; sending an actor a message its interface
// lacks does not compile. Private to actors/ (the node daemon's own actors: node_messages.h).
// Light on purpose: the message structs are only declared here (detail/messages.h defines them).
// A handle converts to a narrower interface (StageActor to StageInputActor) on assignment, but a
// message must carry a handle of exactly the type its signature names: StageInputActor{stage}.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <caf/actor_addr.hpp>
#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/atom.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

namespace troupe::compute {
struct KvStats;
struct MultimodalPrompt;
}  // namespace troupe::compute

namespace troupe::actors {

// Atoms: verbs of at most 10 characters (CAF 0.17).
using step_atom = caf::atom_constant<caf::atom("step")>;
using done_atom = caf::atom_constant<caf::atom("done")>;
using submit_atom = caf::atom_constant<caf::atom("submit")>;
using cancel_atom = caf::atom_constant<caf::atom("cancel")>;
using token_atom = caf::atom_constant<caf::atom("token")>;
using finish_atom = caf::atom_constant<caf::atom("finish")>;
using expert_atom = caf::atom_constant<caf::atom("expert")>;
using crash_atom = caf::atom_constant<caf::atom("crash")>;
using next_atom = caf::atom_constant<caf::atom("next")>;
using shards_atom = caf::atom_constant<caf::atom("shards")>;
using reset_atom = caf::atom_constant<caf::atom("reset")>;
using stats_atom = caf::atom_constant<caf::atom("stats")>;
using stage_atom = caf::atom_constant<caf::atom("stage")>;
using sched_atom = caf::atom_constant<caf::atom("sched")>;
using router_atom = caf::atom_constant<caf::atom("router")>;
using actors_atom = caf::atom_constant<caf::atom("actors")>;
using kv_atom = caf::atom_constant<caf::atom("kv")>;
using deadline_atom = caf::atom_constant<caf::atom("deadline")>;  // a step's time is up
using fail_atom = caf::atom_constant<caf::atom("fail")>;          // end every request with an error
using drain_atom = caf::atom_constant<caf::atom("drain")>;        // stop admitting; -> in flight
using hold_atom = caf::atom_constant<caf::atom("hold")>;          // send no steps until (reset)
using encode_atom = caf::atom_constant<caf::atom("encode")>;      // a request's images -> rows
using image_atom = caf::atom_constant<caf::atom("image")>;        // one image file -> rows
using encoders_atom = caf::atom_constant<caf::atom("encoders")>;  // the image encoders now

// Within one process messages move as shared pointers: no serialization, no tensor copies.
struct GenerateRequest;  // local_cluster.h
struct GenerateResult;   // local_cluster.h
struct StepBatch;        // the rest: detail/messages.h
struct StepOutcome;
struct ExpertRequest;
struct SeqRequest;
struct TokenEvent;
struct StreamPiece;
struct ResumeState;
struct ActorHandles;  // detail/actor_configs.h
using StepBatchPtr = std::shared_ptr<const StepBatch>;
using HiddenPtr = std::shared_ptr<const std::vector<float>>;  // f32 [num_tokens, n_embd]
using StepOutcomePtr = std::shared_ptr<const StepOutcome>;
using ExpertRequestPtr = std::shared_ptr<ExpertRequest>;
using SeqRequestPtr = std::shared_ptr<const SeqRequest>;
using TokenEventPtr = std::shared_ptr<const TokenEvent>;
using StreamPiecePtr = std::shared_ptr<const StreamPiece>;
using ResumeStatePtr = std::shared_ptr<const ResumeState>;
using GenerateRequestPtr = std::shared_ptr<const GenerateRequest>;
using GenerateResultPtr = std::shared_ptr<const GenerateResult>;

/// A request's prompt with its images encoded, or why it could not be.
struct EncodedPrompt {
  std::shared_ptr<const compute::MultimodalPrompt> prompt;  // null on error
  std::string error;                                        // one line; "" = ok
};
using EncodedPromptPtr = std::shared_ptr<const EncodedPrompt>;

/// Expert shard (expert_shard.cc):
///   (expert, ExpertRequestPtr)  compute the request's rows for experts this shard owns, fill y,
///                               count down the request's latch (also when it fails)
///   (crash)                     fault injection: throw while computing the next request
using ExpertShardActor =
    caf::typed_actor<caf::reacts_to<expert_atom, ExpertRequestPtr>, caf::reacts_to<crash_atom>>;

/// A stage as its upstream (the scheduler, the previous stage) sees it; StageActor extends it.
/// (next, ...) and (stage, ...) carry this narrower handle: an interface cannot name itself, and
/// the scheduler's and the stage's would name each other.
///   (step, StepBatchPtr, HiddenPtr, double compute_s)  run the step (see StageActor)
using StageInputActor =
    caf::typed_actor<caf::reacts_to<step_atom, StepBatchPtr, HiddenPtr, double>>;

/// What the scheduler sends whoever submitted a sequence (the router):
///   (token, TokenEventPtr)  a sampled token, or the end of the sequence
using SchedulerClientActor = caf::typed_actor<caf::reacts_to<token_atom, TokenEventPtr>>;

/// Scheduler (scheduler.cc):
///   (submit, SeqRequestPtr, SchedulerClientActor reply_to)
///                               queue a request; token events go to reply_to. The scheduler
///                               monitors reply_to: when it terminates, its requests are cancelled
///                               and their KV blocks freed
///   (cancel, int64 seq_id)      stop a request; its KV blocks are freed
///   (done, StepOutcomePtr)      a step came back from the last stage (or failed at any stage)
///   (stage, StageInputActor)    the first stage was replaced (or is known at last)
///   (reset)                     a stage lost its KV: recompute every running sequence (also
///                               ends a hold)
///   (hold)                      the pipeline is being re-placed: queue, send no steps, until
///                               (reset)
///   (deadline, uint64 step_id, uint64 epoch)
///                               its own timer: that step's time is up, run it again
///   (fail, string why)          the pipeline cannot run: end every request with `why`
///   (crash)                     fault injection: throw while handling the next submit, cancel,
///                               done, stage or reset
///   (stats) -> string           a one-line summary (JSON)
///   (kv) -> compute::KvStats    the logical KV pool (every stage's pool mirrors it)
using SchedulerActor =
    caf::typed_actor<caf::reacts_to<submit_atom, SeqRequestPtr, SchedulerClientActor>,
                     caf::reacts_to<cancel_atom, int64_t>,
                     caf::reacts_to<done_atom, StepOutcomePtr>,
                     caf::reacts_to<stage_atom, StageInputActor>, caf::reacts_to<reset_atom>,
                     caf::reacts_to<hold_atom>, caf::reacts_to<deadline_atom, uint64_t, uint64_t>,
                     caf::reacts_to<fail_atom, std::string>, caf::reacts_to<crash_atom>,
                     caf::replies_to<stats_atom>::with<std::string>,
                     caf::replies_to<kv_atom>::with<compute::KvStats>>;

/// Pipeline stage (stage.cc):
///   (step, StepBatchPtr, HiddenPtr, double compute_s)
///                               run the step; forward (step, batch, hidden, compute_s) to the
///                               next stage or, on the last stage, send (done, StepOutcomePtr)
///                               to the scheduler; a failed step goes to the scheduler as well
///   (next, StageInputActor)     rewire after the next stage restarted (the last stage has none)
///   (sched, SchedulerActor)     the scheduler was replaced: outcomes go to the new one
///   (shards, vector<ExpertShardActor>)
///                               new expert-shard handles after a shard restarted
///   (crash)                     fault injection: throw on the next step
///   (stats) -> string           its layers and KV pool size (JSON); answered once the engine is
///                               built, so it doubles as a readiness check
using StageActor = StageInputActor::extend<
    caf::reacts_to<next_atom, StageInputActor>, caf::reacts_to<sched_atom, SchedulerActor>,
    caf::reacts_to<shards_atom, std::vector<ExpertShardActor>>, caf::reacts_to<crash_atom>,
    caf::replies_to<stats_atom>::with<std::string>>;

/// What the router sends the client of a request (LocalCluster's caller, the head's gateway, the
/// node actor's warm-up), under the client's tag:
///   (token, int64 tag, StreamPiecePtr)     a piece of the stream
///   (finish, int64 tag, GenerateResultPtr) the end of the request
using RouterClientActor = caf::typed_actor<caf::reacts_to<token_atom, int64_t, StreamPiecePtr>,
                                           caf::reacts_to<finish_atom, int64_t, GenerateResultPtr>>;

/// One image file for an encoder instance, and what it gives back.
struct ImageJob {
  std::shared_ptr<const std::string> bytes;  // PNG or JPEG, as the client sent it
  std::string what;                          // "image 2": errors name it
};
struct ImageRows {
  std::shared_ptr<const std::vector<float>> rows;  // f32 [tokens per image, n_embd]; null: error
  std::string error;                               // one line; "" = ok
  bool retry = false;  // the instance could not be reached (not the image's fault): try again
  double seconds = 0;  // spent decoding and encoding
};
using ImageJobPtr = std::shared_ptr<const ImageJob>;
using ImageRowsPtr = std::shared_ptr<const ImageRows>;

/// An image encoder instance ([[encoder]]; encoder.cc spawn_image_worker, or the proxy of one on
/// another node, detail/remote.h):
///   (image, ImageJobPtr) -> ImageRowsPtr   decode the file and run the vision encoder
using ImageWorkerActor =
    caf::typed_actor<caf::replies_to<image_atom, ImageJobPtr>::with<ImageRowsPtr>>;

/// The head's image encoder front (encoder.cc): the row cache, the prompt layout, and the jobs
/// it hands its encoder instances.
///   (encode, GenerateRequestPtr) -> EncodedPromptPtr
///                               encode the request's image_files (cache misses go to the
///                               instance with the fewest jobs), then lay out its text prompt
///                               around them; a bad image is an error result naming it
///   (encoders, vector<ImageWorkerActor>)
///                               the instances now (a placement or re-placement): the jobs of
///                               instances no longer listed go to the others; with none, jobs
///                               wait (a bounded while) for the next list
///   (encoders, string why)      there is no instance and none is coming (the placement has
///                               none): waiting jobs and new requests with images fail with `why`
///                               until a list arrives
///   (deadline)                  its own timer: retry or fail jobs that wait
/// Its counts are atomics the owner reads without asking (EncoderCounters).
using EncoderActor =
    caf::typed_actor<caf::replies_to<encode_atom, GenerateRequestPtr>::with<EncodedPromptPtr>,
                     caf::reacts_to<encoders_atom, std::vector<ImageWorkerActor>>,
                     caf::reacts_to<encoders_atom, std::string>, caf::reacts_to<deadline_atom>>;

/// Router (router.cc); a client is whoever sent the submit, addressed as a RouterClientActor:
///   (submit, GenerateRequestPtr, int64 tag)
///                               tokenize (a request with image files: have the encoder lay out
///                               its prompt first), open the token log, queue with the scheduler
///   (submit, GenerateRequestPtr, int64 tag, ResumeStatePtr)
///                               as above, for a request whose router failed: the pieces the
///                               client saw are not streamed again
///   (cancel, int64 tag)         from the same client: stop that request
///   (token, TokenEventPtr)      from the scheduler (events of any other sender are dropped: they
///                               come from a replaced scheduler)
///   (sched, SchedulerActor)     the scheduler was replaced: resubmit every request in flight
///                               from its token log and sampler state
///   (crash)                     fault injection: throw while handling the next submit, cancel
///                               or token
using RouterActor = SchedulerClientActor::extend<
    caf::reacts_to<submit_atom, GenerateRequestPtr, int64_t>,
    caf::reacts_to<submit_atom, GenerateRequestPtr, int64_t, ResumeStatePtr>,
    caf::reacts_to<cancel_atom, int64_t>, caf::reacts_to<sched_atom, SchedulerActor>,
    caf::reacts_to<crash_atom>>;

/// Controller (controller.cc): supervises the actors above in one process.
///   (crash, string "stage/N" | "expert/N" | "scheduler" | "router") -> bool
///                               fault injection: forward `crash` to that actor; false if no such
///   (router, actor_addr failed) -> RouterActor
///                               the current router, for a client. A client that saw `failed` (its
///                               router) terminate passes its address: if the controller has not
///                               replaced it yet it does so now. A null address only asks.
///   (actors) -> ActorHandles    the supervised actors as they are now (shutdown, stats)
///   (stats) -> string           restarts per actor, as JSON
using ControllerActor =
    caf::typed_actor<caf::replies_to<crash_atom, std::string>::with<bool>,
                     caf::replies_to<router_atom, caf::actor_addr>::with<RouterActor>,
                     caf::replies_to<actors_atom>::with<ActorHandles>,
                     caf::replies_to<stats_atom>::with<std::string>>;

}  // namespace troupe::actors

// Never serialized: in-process only (the cross-host form is the wire codec, detail/wire.h).
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::GenerateRequestPtr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::GenerateResultPtr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::EncodedPromptPtr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::ImageJobPtr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::ImageRowsPtr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::StepBatchPtr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::HiddenPtr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::StepOutcomePtr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::ExpertRequestPtr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::SeqRequestPtr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::TokenEventPtr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::StreamPiecePtr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::ResumeStatePtr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::ActorHandles)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::compute::KvStats)
