// Wire codec of the control plane and of clients: node membership (JoinRequest/Reply, Heartbeat
// /Ack, Membership, LeaveNotice), placement (Placement, PlacementReport), status (StatusRequest,
// StatusSnapshot) from schemas/cluster.capnp, and the client protocol (GenerateRequest,
// CancelRequest, GenerateEvent) from schemas/client.capnp. Plain structs in, frames out; frames
// in, validated structs out. Users: the node daemon and the cluster client (actors/).
// No CAF or Cap'n Proto types here. Thread safety: free functions, no shared state.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "actors/detail/wire.h"
#include "actors/local_cluster.h"  // GenerateRequest, GenerateResult
#include "base/result.h"

namespace troupe::actors::detail {

/// The Cap'n Proto type id (capnp::typeId<T>()) of each control/client message: the transport
/// tags frames with it (transport::OutMessage::type) and the receiver dispatches on it.
enum class ControlMsg : uint8_t {
  kJoinRequest,
  kJoinReply,
  kHeartbeat,
  kHeartbeatAck,
  kMembership,
  kPlacement,
  kPlacementReport,
  kLeaveNotice,
  kStatusRequest,
  kStatusSnapshot,
  kGenerateRequest,
  kCancelRequest,
  kGenerateEvent,
  kBatchDescriptor,
  kStepResult,
  kExpertDispatch,
  kExpertCombine,
  kActorRestart,
  kEncodeImage,  // schemas/encoder.capnp; codec in detail/wire.h
  kEncodedImage,
};
/// capnp::typeId of the message's root struct (kExpertDispatch/kExpertCombine: ExpertDispatch/
/// ExpertCombine; the data-plane kinds are those of actors/detail/wire.h); 0 for a value out of
/// range.
uint64_t type_id(ControlMsg m);
/// The message a type id names, or false for an unknown id.
bool control_msg_of(uint64_t type_id, ControlMsg* out);
const char* to_string(ControlMsg m);

struct ResourcesInfo {
  uint32_t cpu_cores = 0;
  uint64_t memory_bytes = 0;
  uint64_t free_memory_bytes = 0;
};

/// One live transport link as a node sees it (schemas/cluster.capnp LinkCounters).
struct LinkCountersInfo {
  std::string node, peer, address;
  uint64_t messages_sent = 0, bytes_sent = 0, messages_received = 0, bytes_received = 0;
  uint64_t send_errors = 0, malformed = 0, corrupted = 0, oversized = 0, pulled = 0;
  bool pulls_to = false, pulls_from = false;
  bool operator==(const LinkCountersInfo&) const = default;
};

/// A node's transport as a whole (schemas/cluster.capnp TransportCounters).
struct TransportCountersInfo {
  std::string node;
  uint64_t auth_failures = 0, unauthenticated_dropped = 0, connections_accepted = 0;
  bool operator==(const TransportCountersInfo&) const = default;
};

struct JoinRequestMsg {
  WireHeader header;  // sender {node 0, nodeDaemon, 0}
  std::string name, address, version;
  uint32_t pid = 0;
  uint64_t model_hash = 0;
  ResourcesInfo resources;
  std::array<uint8_t, 32> nonce{}, proof{};
};

struct JoinReplyMsg {
  WireHeader header;
  bool accepted = false;
  uint32_t node_id = 0;
  uint32_t lease_ms = 0, heartbeat_ms = 0;
  std::array<uint8_t, 32> proof{};
  std::string error;  // when refused
};

struct HeartbeatMsg {
  WireHeader header;
  uint32_t lease_ms = 0;
  ResourcesInfo resources;
  uint32_t num_actors = 0;
  uint64_t uptime_ms = 0;
  std::vector<LinkCountersInfo> links;
  TransportCountersInfo transport;
};

struct HeartbeatAckMsg {
  WireHeader header;
  uint32_t lease_ms = 0;
  uint64_t membership_version = 0;
  bool fenced = false;
};

/// schemas::MemberState value for value.
enum class MemberState : uint8_t { kJoining = 0, kAlive = 1, kSuspect = 2, kDead = 3, kLeft = 4 };
const char* to_string(MemberState s);

struct MemberInfo {
  uint32_t node_id = 0;
  std::string name, address;
  MemberState state = MemberState::kJoining;
  uint64_t last_heartbeat_age_ms = 0;
  ResourcesInfo resources;
};

struct MembershipMsg {
  WireHeader header;
  uint64_t version = 0;
  std::vector<MemberInfo> members;
};

struct StagePlacementInfo {
  uint32_t stage = 0, node_id = 0;
  uint32_t layer_begin = 0, layer_end = 0;
  bool has_embedding = false, has_output_head = false;
  uint32_t threads = 0;
  bool operator==(const StagePlacementInfo&) const = default;
};
struct ShardPlacementInfo {
  uint32_t shard = 0, node_id = 0;
  std::vector<int32_t> experts;  // ascending
  uint32_t threads = 0;
  bool operator==(const ShardPlacementInfo&) const = default;
};
/// An image encoder instance (schemas/cluster.capnp EncoderPlacement; CPU only).
struct EncoderPlacementInfo {
  uint32_t index = 0, node_id = 0;
  uint32_t threads = 0;  // 0 = auto
  bool operator==(const EncoderPlacementInfo&) const = default;
};
struct KvPoolInfo {
  uint32_t stage = 0, node_id = 0, num_blocks = 0, block_size = 0;
  bool operator==(const KvPoolInfo&) const = default;
};

struct PlacementMsg {
  WireHeader header;
  uint64_t version = 0;
  std::string model_name;
  uint64_t model_hash = 0;
  std::vector<StagePlacementInfo> stages;
  std::vector<ShardPlacementInfo> shards;
  std::vector<KvPoolInfo> kv_pools;
  std::vector<EncoderPlacementInfo> encoders;  // empty without [model] mmproj
  uint32_t microbatches = 0;
  /// Whether `o` places the same pipeline (stages, expert shards, KV pools, model): placements
  /// that differ only in their image encoders.
  bool same_pipeline(const PlacementMsg& o) const {
    return model_name == o.model_name && model_hash == o.model_hash && stages == o.stages &&
           shards == o.shards && kv_pools == o.kv_pools && microbatches == o.microbatches;
  }
};

struct StartupPhaseInfo {
  std::string name;
  ActorRef actor;
  uint64_t start_ms = 0, duration_ms = 0;
  bool done = false;
};

struct PlacementReportMsg {
  WireHeader header;
  uint64_t version = 0;
  bool ok = false;
  std::string error;
  std::vector<StartupPhaseInfo> phases;
};

struct LeaveNoticeMsg {
  WireHeader header;
  std::string reason;
};

/// An actor of a node failed and was restarted in place (cluster.capnp ActorRestart).
struct ActorRestartMsg {
  WireHeader header;
  ActorRef actor;
  std::string reason;
  bool kv_lost = false;
  uint32_t restarts = 0;
};

struct StatusRequestMsg {
  WireHeader header;
  bool include_kv = false;
};

/// schemas::ActorState value for value.
enum class ActorStateInfo : uint8_t {
  kStarting = 0,
  kRunning = 1,
  kRestarting = 2,
  kStopped = 3,
  kFailed = 4
};

struct ActorStatusInfo {
  ActorRef actor;
  std::string name;  // "stage/2@node-b"
  ActorStateInfo state = ActorStateInfo::kRunning;
  uint32_t restarts = 0;
  uint64_t uptime_ms = 0;
  std::string last_error;
};

struct ThroughputInfo {
  uint32_t window_ms = 0;
  double prompt_tokens_per_s = 0, generation_tokens_per_s = 0, steps_per_s = 0;
  uint32_t num_requests_running = 0, num_requests_waiting = 0;
};

/// The head's image encoder (schemas/cluster.capnp EncoderCounters).
struct EncoderInfo {
  std::string mmproj;
  uint64_t requests = 0, images = 0, encoded = 0, cache_hits = 0, failed = 0;
  double encode_seconds = 0;
  uint64_t cache_entries = 0, cache_bytes = 0;
  uint64_t retried = 0;
};

struct StatusSnapshotMsg {
  WireHeader header;
  uint64_t taken_at_ms = 0;
  bool has_membership = false;
  MembershipMsg membership;  // header unused
  std::vector<ActorStatusInfo> actors;
  std::vector<StartupPhaseInfo> phases;
  bool has_throughput = false;
  ThroughputInfo throughput;
  uint64_t placement_version = 0;
  std::string reporter;   // node name of the reporter
  bool serving = false;   // the head: the cluster serves; another node: its actors run
  std::string condition;  // the head: why requests are not served right now; "" when they are
  std::vector<LinkCountersInfo> links;           // the reporter's links (the head: and its nodes')
  std::vector<TransportCountersInfo> transport;  // the same for the transports as a whole
  bool has_encoder = false;                      // the head with [model] mmproj
  EncoderInfo encoder;
};

/// The snapshot as one JSON object (what `troupe status --json` prints): node, serving,
/// placement version, members, actors, start-up phases grouped by node name, and links with
/// their counters. actors/status_json.cc.
std::string status_json(const StatusSnapshotMsg& s);
/// The snapshot's "encoder" object alone (LocalCluster's stats use it too).
std::string encoder_json(const EncoderInfo& e);
/// The same for a person (`troupe status` without --json): whether the cluster serves and why
/// not, then tables of members, actors, start-up phases and links. actors/status_json.cc.
std::string status_text(const StatusSnapshotMsg& s);

// Encoders. Errors: kUnencodable for values with no wire form (epoch 0 where required, ...).
Result<WireFrame> encode(const JoinRequestMsg& m, const SendInfo& send);
Result<WireFrame> encode(const JoinReplyMsg& m, const SendInfo& send);
Result<WireFrame> encode(const HeartbeatMsg& m, const SendInfo& send);
Result<WireFrame> encode(const HeartbeatAckMsg& m, const SendInfo& send);
Result<WireFrame> encode(const MembershipMsg& m, const SendInfo& send);
Result<WireFrame> encode(const PlacementMsg& m, const SendInfo& send);
Result<WireFrame> encode(const PlacementReportMsg& m, const SendInfo& send);
Result<WireFrame> encode(const LeaveNoticeMsg& m, const SendInfo& send);
Result<WireFrame> encode(const StatusRequestMsg& m, const SendInfo& send);
Result<WireFrame> encode(const ActorRestartMsg& m, const SendInfo& send);
Result<WireFrame> encode(const StatusSnapshotMsg& m, const SendInfo& send);

/// Each encoder above fills Header.sender/seq from `send` and Header.clusterEpoch from
/// m.header.cluster_epoch (0 is allowed only in a JoinRequest, before the node knows the epoch;
/// the other fields of m.header are ignored). Texts keep their bytes (embedded NULs included);
/// error texts are cut to kMaxErrorBytes. Placement: devices are sent as CPU ([-1] / -1).
struct ControlLimits {
  uint64_t expected_epoch = 0;  // 0 skips the epoch check
  size_t max_frame_bytes = size_t{16} << 20;
  size_t max_list = 4096;  // members, stages, shards, phases, actors
  size_t max_text = 4096;  // bytes of any text field
};

// Decoders: validate from an untrusted peer (sizes, enum values, text lengths, ids, nonce and
// proof of exactly 32 bytes, placement consistency: stages in order with non-empty ranges,
// experts ascending and non-negative). Never throw; one-line errors.
// Details: header seq >= 1, a known sender role, epoch >= 1 and the stale/future check against
// expected_epoch (when != 0) -- except decode_join_request, which accepts any epoch (0 on first
// start, a stale one after a fence). Node names, member names, actor names and phase names are
// non-empty; node ids (members, placement, an accepted JoinReply) are >= 1 and member ids unique.
// Placement: >= 1 stage, stages[i].stage == i, layers contiguous from 0 with begin < end, the
// embedding on exactly the first stage and the output head on exactly the last; shards[i].shard
// == i, experts strictly ascending in [0, 2^31), no expert in two shards; one KV pool per stage
// (any order) with blocks >= 1 and block size >= 1; encoders[i].index == i with a node id >= 1;
// numMicrobatches >= 1. Error texts are cut to kMaxErrorBytes. Not read: NodeResources.devices,
// StatusSnapshot.kvPools, device indices (no in-process home).
Result<JoinRequestMsg> decode_join_request(std::span<const uint8_t> f, const ControlLimits& l);
Result<JoinReplyMsg> decode_join_reply(std::span<const uint8_t> f, const ControlLimits& l);
Result<HeartbeatMsg> decode_heartbeat(std::span<const uint8_t> f, const ControlLimits& l);
Result<HeartbeatAckMsg> decode_heartbeat_ack(std::span<const uint8_t> f, const ControlLimits& l);
Result<MembershipMsg> decode_membership(std::span<const uint8_t> f, const ControlLimits& l);
Result<PlacementMsg> decode_placement(std::span<const uint8_t> f, const ControlLimits& l);
Result<PlacementReportMsg> decode_placement_report(std::span<const uint8_t> f,
                                                   const ControlLimits& l);
Result<LeaveNoticeMsg> decode_leave_notice(std::span<const uint8_t> f, const ControlLimits& l);
Result<ActorRestartMsg> decode_actor_restart(std::span<const uint8_t> f, const ControlLimits& l);
Result<StatusRequestMsg> decode_status_request(std::span<const uint8_t> f, const ControlLimits& l);
Result<StatusSnapshotMsg> decode_status_snapshot(std::span<const uint8_t> f,
                                                 const ControlLimits& l);

// ---- Client protocol (schemas/client.capnp) ---------------------------------------------------

struct GenerateRequestMsg {
  WireHeader header;
  uint64_t tag = 0;
  GenerateRequest request;  // sampling.stop_strings travel in GenerateRequest.stopStrings
};
struct CancelRequestMsg {
  WireHeader header;
  uint64_t tag = 0;
};
/// A streamed piece (finished = false: delta/token), or the end (finished = true: result).
struct GenerateEventMsg {
  WireHeader header;
  uint64_t tag = 0;
  std::string delta;
  int32_t token = -1;
  bool finished = false;
  GenerateResult result;  // when finished; result.logits f32 [tokens, n_vocab] when asked
};

Result<WireFrame> encode(const GenerateRequestMsg& m, const SendInfo& send);
Result<WireFrame> encode(const CancelRequestMsg& m, const SendInfo& send);
/// n_vocab: width of result.logits rows (checked: logits.size() == rows * n_vocab, rows as
/// decode_generate_event() accepts). Only a finished event carries the result fields.
Result<WireFrame> encode(const GenerateEventMsg& m, int64_t n_vocab, const SendInfo& send);

struct ClientLimits {
  int64_t n_vocab = 0;          // token ids in [0, n_vocab); 0 = only >= 0 (the client side)
  uint64_t expected_epoch = 0;  // 0 skips the stale/future check
  size_t max_frame_bytes = size_t{64} << 20;
  size_t max_prompt_tokens = 1 << 20;
  size_t max_text = size_t{4} << 20;  // prompt text bytes
  size_t max_stop_strings = 16;
  int64_t max_tokens = 1 << 20;               // GenerateRequest.maxTokens in [1, max_tokens]; also
                                              // the most GenerateEvent.tokens
  size_t max_stop_tokens = 1024;              // SamplingParams.stopTokenIds
  size_t max_images = 16;                     // GenerateRequest.images
  size_t max_image_bytes = size_t{32} << 20;  // each image file
};
/// Decoders validate as above; a GenerateRequest's sampling params (stop strings included) are
/// validated with compute::SamplingParams::validate(), each stop string non-empty and at most
/// max_text bytes; its images at most max_images, each 1 .. max_image_bytes bytes (not decoded
/// here: the encoder does that), and only with a text prompt. A GenerateEvent's result fields are
/// read only when finished (then the finish reason is one of length, eos, stop, cancelled, error,
/// overloaded); its logits are f32 [rows, width] with rows == tokens.size(), or tokens.size() + 1
/// when the finish reason is "stop" (the router keeps the row of the stop token, not the token),
/// and width == n_vocab when n_vocab > 0.
Result<GenerateRequestMsg> decode_generate_request(std::span<const uint8_t> f,
                                                   const ClientLimits& l);
Result<CancelRequestMsg> decode_cancel_request(std::span<const uint8_t> f, const ClientLimits& l);
Result<GenerateEventMsg> decode_generate_event(std::span<const uint8_t> f, const ClientLimits& l);
/// The tag of a GenerateEvent whose frame and header read, however malformed the rest: a client
/// fails that request with decode_generate_event's reason instead of waiting for it. 0 when not
/// even the tag reads.
uint64_t generate_event_tag(std::span<const uint8_t> f, const ClientLimits& l);

}  // namespace troupe::actors::detail
