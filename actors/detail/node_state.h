// The node daemon's actor: its state and the functions of cluster_node.cc (joining, heartbeats,
// the data plane), node_place.cc (placing actors on this node, status) and node_head.cc (the
// head's controller and client gateway). Private to actors/; everything here runs on the node
// actor (one message at a time) unless it says otherwise.
#pragma once

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "actors/cluster_node.h"
#include "actors/detail/actor_configs.h"
#include "actors/detail/control_wire.h"
#include "actors/detail/link.h"
#include "actors/detail/messages.h"
#include "actors/detail/node_messages.h"
#include "actors/detail/replan.h"
#include "actors/interfaces.h"
#include "actors/plan.h"
#include "model/model.h"
#include "model/vision.h"

namespace troupe::actors {
struct EncoderCounters;  // actors/encoder.h
}  // namespace troupe::actors

namespace troupe::actors::detail {

using Clock = std::chrono::steady_clock;

inline uint64_t ms_since(Clock::time_point t) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count());
}

/// A timed start-up phase (StartupPhase in cluster.capnp).
struct Phase {
  std::string name;
  uint64_t start_ms = 0, duration_ms = 0;  // from the daemon's start
  bool done = false;
};

/// What the node actor shares with ClusterNode (wait_ready).
struct NodeShared {
  std::mutex mu;
  std::condition_variable cv;
  bool ready = false;
  std::string failed;       // why the node cannot serve
  std::string waiting_for;  // what it waits for now (for a timeout's message)
};

struct NodeConfig {
  Plan plan;
  NodeOptions opts;
  std::shared_ptr<Link> link;
  std::shared_ptr<NodeShared> shared;
  std::shared_ptr<const model::Model> model;
  uint64_t model_hash = 0;
  Clock::time_point started;
  std::vector<Phase> phases;
  EncoderActor encoder;  // the head's image encoder front ([model] mmproj); null without one
  std::shared_ptr<const EncoderCounters> encoder_counters;
  std::shared_ptr<const model::VisionModel> vision;  // the head's mmproj, loaded at start
};

/// One node as the head's controller sees it.
struct Member {
  uint32_t node_id = 0;
  std::string name, address;
  MemberState state = MemberState::kJoining;
  transport::PeerId peer = 0;
  Clock::time_point last_heartbeat;
  ResourcesInfo resources;
  bool reported = false;                           // its PlacementReport said ok
  std::vector<Phase> phases;                       // from its PlacementReport
  std::vector<LinkCountersInfo> links;             // from its last heartbeat
  std::optional<TransportCountersInfo> transport;  // from its last heartbeat
};

/// A client request in flight at the head: who asked, under which tag.
struct ClientTag {
  transport::PeerId peer = 0;
  uint64_t tag = 0;
};

struct NodeState {
  Plan plan;
  NodeOptions opts;
  NodePlan me;
  bool head = false;
  std::shared_ptr<Link> link;
  std::shared_ptr<NodeShared> shared;
  std::shared_ptr<const model::Model> model;
  uint64_t model_hash = 0;
  Clock::time_point started;
  std::vector<Phase> phases;
  bool leaving = false;

  // Joining (every node but the head).
  transport::PeerId head_peer = 0;
  std::array<uint8_t, 32> join_nonce{};
  bool joined = false, head_lost = false;
  uint32_t lease_ms = 0, heartbeat_ms = 0;
  Clock::time_point last_ack;
  Clock::time_point last_join;  // the last join request sent while the head did not answer
  MembershipMsg membership;     // the head's view, as last received

  // Placement (every node). Local actors by index; proxies for remote ones.
  std::optional<PlacementMsg> placement;
  std::optional<PlacementMsg> pending_placement;  // waits for a membership naming its nodes
  int64_t kv_blocks = 0;
  std::map<uint32_t, StageActor> stages;
  std::map<uint32_t, ExpertShardActor> shards;
  std::map<std::string, RemoteShardsActor> shard_proxies;  // by node name
  SchedulerActor scheduler_proxy;                          // not on the head: the head's scheduler
  std::vector<StageActor> stage_proxies;                   // stages on other nodes this one feeds
  std::vector<int32_t> owned_experts;  // experts of this node's shards, ascending
  // Image encoder instances placed here, by index, and (the head) the proxies of the others.
  std::map<uint32_t, ImageWorkerActor> image_workers;
  std::map<uint32_t, RemoteImageActor> image_proxies;
  // Images this node's instances hold (queued or encoding): the instance's index by sender and
  // job id. Their receipt is sent again every heartbeat until the answer goes
  // (repeat_image_receipts).
  std::map<std::pair<transport::PeerId, uint64_t>, uint32_t> images_in_flight;
  // The mmproj, once a placement put an encoder instance here (or the head loaded it at start).
  std::shared_ptr<const model::VisionModel> vision;
  struct VisionSlot {  // filled by the placement thread, read after its (placed) message
    std::shared_ptr<const model::VisionModel> model;
    uint64_t start_ms = 0, duration_ms = 0;  // its loading, from the daemon's start
    /// Loads `mmproj` into `model`, timed from `started`; the error text, "" when loaded.
    std::string load(const std::string& mmproj, Clock::time_point started) {
      start_ms = ms_since(started);
      auto v = model::load_vision_model(mmproj);
      duration_ms = ms_since(started) - start_ms;
      if (!v) return "[model] mmproj: " + v.error().message;
      model = *v;
      return {};
    }
  };
  std::shared_ptr<VisionSlot> placed_vision;
  // The version of a placement that moved only image encoders (same_pipeline): the stages and
  // shards keep running, and only the instances are restarted. 0: none.
  uint64_t encoders_only = 0;
  // How each local actor was built, to restart it in place when it fails.
  struct StageBuild {
    StageConfig cfg;
    StageInputActor next;  // null for the last stage
  };
  std::map<uint32_t, StageBuild> stage_builds;
  std::map<uint32_t, ExpertShardConfig> shard_builds;
  ExpertPlacement expert_placement;  // what local stages were given (shards: local or proxies)
  std::map<std::string, uint32_t> restarts;  // by actor name
  std::vector<int32_t> expert_shard_of;      // [n_expert] -> shard index, -1 = elsewhere
  bool placed = false;
  // The current placement's weights in huge-page memory, once its thread made them (else null:
  // the actors read the file mapping, `model`).
  std::shared_ptr<std::shared_ptr<const model::Model>> placed_model;
  // The model the actors of the last finished placement compute with (the copy or `model`);
  // set on this actor's thread only, so a new placement may read it while an older
  // placement's thread may still be writing its slot above.
  std::shared_ptr<const model::Model> placed_weights;

  // The head: controller, router, scheduler, client gateway.
  SchedulerActor scheduler;
  RouterActor router;
  GatewayActor gateway;
  EncoderActor encoder;  // [model] mmproj: lays out requests with images; null without one
  std::shared_ptr<const EncoderCounters> encoder_counters;  // for the status snapshot
  std::map<std::string, Member> members;                    // by node name
  uint32_t next_node_id = 2;                                // the head is node 1
  uint64_t membership_version = 0;
  bool placement_sent = false, serving = false, draining = false;
  bool placement_done = false;  // every node started the first placement (warm-up follows)
  // No survivor had room for a gone node's actors: requests are held until a node with room
  // (re)joins, or replace_wait_ms after capacity_since (then they fail with what + why).
  bool awaiting_capacity = false;
  Clock::time_point capacity_since;
  std::string capacity_what, capacity_why;
  bool replacing = false;       // a re-placement is under way: requests queue at the scheduler
  std::string not_serving_why;  // set when the cluster stopped serving (a node left or died)
  static inline const char* name = "node";
};

using NodeSelf = NodeActor::stateful_base<NodeState>;

NodeActor::behavior_type node_behavior(NodeSelf* self, NodeConfig cfg);

// --- shared helpers (node_place.cc) ---------------------------------------------------------

/// Counts, logs (to stderr) and drops a frame that failed validation.
void drop_malformed(NodeSelf* self, const MessagePtr& m, const std::string& what,
                    const std::string& why);
/// The node cannot serve: log, and let wait_ready() return the error.
void fail(NodeSelf* self, const std::string& why);
void set_ready(NodeSelf* self);
void set_waiting(NodeSelf* self, const std::string& what);
void begin_phase(NodeSelf* self, const std::string& name);
void end_phase(NodeSelf* self, const std::string& name);
ResourcesInfo local_resources();
/// The resources this node reports (join, heartbeats): local_resources() with the free memory
/// capped by its [[node]] memory_limit_mb less the weights of the actors placed on it.
ResourcesInfo node_resources(NodeSelf* self);
/// This node's live transport links with their counters, and its transport's totals
/// (heartbeats, status), from one Transport::stats().
void transport_counters(NodeSelf* self, std::vector<LinkCountersInfo>* links,
                        TransportCountersInfo* totals);
/// Hash of the model file's first MiB and size (of config.json for a Hugging Face directory).
uint64_t model_file_hash(const std::string& path);

/// Encodes and sends a control message; failures are logged (the caller's next step is the
/// same either way: leases and timeouts recover).
void report_send_error(NodeSelf* self, ControlMsg kind, const std::string& why);
ControlMsg control_kind(const JoinRequestMsg&);
ControlMsg control_kind(const JoinReplyMsg&);
ControlMsg control_kind(const HeartbeatMsg&);
ControlMsg control_kind(const HeartbeatAckMsg&);
ControlMsg control_kind(const MembershipMsg&);
ControlMsg control_kind(const PlacementMsg&);
ControlMsg control_kind(const PlacementReportMsg&);
ControlMsg control_kind(const LeaveNoticeMsg&);
ControlMsg control_kind(const StatusSnapshotMsg&);
ControlMsg control_kind(const ActorRestartMsg&);

template <class Msg>
void send_to(NodeSelf* self, transport::PeerId peer, const Msg& m, ActorRole role) {
  auto f = encode(m, self->state.link->send_info(role));
  Status s = f ? self->state.link->send(peer, control_kind(m), *f) : Status(f.error());
  if (!s) report_send_error(self, control_kind(m), s.error().message);
}

/// Placement on this node: connect to the peers it needs (on a helper thread), then spawn the
/// local stages and shards and the proxies of remote ones; report to the head.
/// Starts this node's actors of placement p; a newer version than the current one (a
/// re-placement) first stops the actors of the current one.
void start_placement(NodeSelf* self, PlacementMsg p);
/// Tells the head (or, on the head, itself) that this node's actors of the current placement run
/// (ok) or could not start (error).
void report_placement(NodeSelf* self, bool ok, const std::string& error);
/// Bytes of the weights that the actor (role, index) of placement pl reads.
uint64_t actor_weight_bytes(const model::ModelSpec& spec, const PlacementMsg& pl, ActorRole role,
                            uint32_t index);
void finish_placement(NodeSelf* self, uint64_t version, const std::string& error,
                      uint64_t map_start_ms, uint64_t map_ms, uint64_t map_bytes);
void stop_local_actors(NodeSelf* self);
/// A local actor ended with `reason`: restart it in place, rewire its local neighbours and tell
/// the head (whose scheduler recomputes the sequences whose KV a restarted stage lost).
void on_actor_down(NodeSelf* self, const caf::down_msg& dm);
/// Fault injection (tests): "stage/N" or "expert/N" placed on this node throws on its next message.
bool inject_fault(NodeSelf* self, const std::string& actor);
void on_peer_event(NodeSelf* self, uint64_t peer, bool up, const std::string& name,
                   const std::string& why);
void answer_status(NodeSelf* self, const MessagePtr& m);
std::string status_json(NodeSelf* self);
StatusSnapshotMsg snapshot(NodeSelf* self);
std::vector<StartupPhaseInfo> phase_infos(const std::vector<Phase>& phases, uint32_t node_id);

// --- image encoder instances (node_images.cc) -------------------------------------------------

/// The mmproj to load for placement pl: the plan's when it puts an encoder instance on this node
/// and the node has none loaded yet (the head loads it at start), else "".
std::string mmproj_to_load(NodeSelf* self, const PlacementMsg& pl);
/// Bytes of an encoder instance's weights (the mmproj file, or a Hugging Face directory's vision
/// tower), for memory accounting; 0 if unknown.
uint64_t mmproj_bytes(const Plan& plan);
/// The memory actor (role, index) of placement pl takes (replan's actor_memory): the weights of
/// a stage or shard (actor_weight_bytes) and a stage's KV pool and recurrent states
/// (stage_pools_memory), the mmproj of an image encoder. Keeps a reference to pl.
std::function<ActorMemory(ActorRole, uint32_t)> actor_memory_of(NodeSelf* self,
                                                                const PlacementMsg& pl);
/// The same for the model `spec` and plan `plan` (keeps references to all three).
std::function<ActorMemory(ActorRole, uint32_t)> actor_memory_in(const model::ModelSpec& spec,
                                                                const Plan& plan,
                                                                const PlacementMsg& pl);
/// Starts the encoder instances of placement pl placed on node `me` (loaded by the placement
/// thread into placed_vision) and, on the head, the proxies of the others; tells the head's front.
/// Returns an error text, "" when all started.
std::string start_image_encoders(NodeSelf* self, const PlacementMsg& pl, uint32_t me);
/// Restarts the local instance that `dm` reports down; its index, or -1 when it is none of them.
int64_t restart_image_worker(NodeSelf* self, const caf::down_msg& dm);
/// The link to `node` went down: the proxies of its instances answer their jobs "retry".
void image_link_down(NodeSelf* self, const std::string& node);
/// The head's re-placement when image encoders alone need it (`next`: replan's answer for the
/// survivors `alive`). If replan failed only for lack of room for encoders, they are dropped
/// (logged) and `next` becomes the placement without them. When `next` moves nothing but
/// encoders, it is sent and started and the pipeline keeps serving: true. Else false (next
/// unchanged unless encoders were dropped): the caller re-places everything.
bool place_encoders_only(NodeSelf* self, const std::string& what, const PlacementMsg& old,
                         const std::map<uint32_t, Survivor>& alive, Result<PlacementMsg>& next);
/// Stops the local instances and the proxies, but those `next` (the placement about to start, if
/// any) keeps where they are with the same threads: their jobs go on. The head's front then
/// sends the stopped ones' jobs to those kept, or waits for the next list.
void stop_image_encoders(NodeSelf* self, const PlacementMsg* next = nullptr);
/// A placement that moves only image encoders: adopt it, restart the instances (loading the
/// mmproj on a helper thread when this node has not yet), report. The pipeline keeps running.
void replace_image_encoders(NodeSelf* self, PlacementMsg p);
/// The helper thread of replace_image_encoders is done (`error` "" = the mmproj loaded).
void finish_image_encoders(NodeSelf* self, uint64_t version, const std::string& error);
/// EncodeImage: encode on the local instance, answer on the link it came by.
void route_image(NodeSelf* self, const MessagePtr& m);
/// Sends again the receipt of every image an instance here still holds (each heartbeat), so that
/// the head can tell a lost answer from a long encoding.
void repeat_image_receipts(NodeSelf* self);
/// EncodedImage (the head): to the proxy of the instance that sent it.
void route_image_answer(NodeSelf* self, const MessagePtr& m);

// --- the head (node_head.cc) ----------------------------------------------------------------

void head_init(NodeSelf* self);
/// Sends placement `next` (a re-placement) to every other live node and starts it here; the
/// members' reports are expected anew.
void send_placement(NodeSelf* self, PlacementMsg next);
/// The head's member table as a Membership message (also the status snapshot's).
MembershipMsg membership_of(NodeSelf* self);
void head_tick(NodeSelf* self);
/// Why the head does not serve requests right now, in words; "" when it does (status snapshot).
std::string head_condition(NodeSelf* self);
/// Why the head refuses a client's request now ("" when it admits it): draining, not serving.
std::string head_refusal(NodeSelf* self);
void head_on_wire(NodeSelf* self, ControlMsg kind, const MessagePtr& m);
/// The warm-up generation finished: the head serves (or fails with its error).
void head_warmed_up(NodeSelf* self, const GenerateResult& r);
/// A node's placement `version` finished on the head itself or a report arrived.
void head_placement_report(NodeSelf* self, const std::string& node, bool ok,
                           const std::string& error, std::vector<Phase> phases, uint64_t version);

}  // namespace troupe::actors::detail
