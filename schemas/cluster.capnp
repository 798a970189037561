# cluster.capnp: membership, liveness, placement, status and fault injection. Node daemons join
# the controller (JoinRequest/Reply), keep a lease alive (Heartbeat/HeartbeatAck), and learn the
# cluster's view (Membership) and what to host (Placement). StatusSnapshot feeds `troupe status`,
# /metrics and the console; FaultCommand configures the transport's fault-injection shim in tests.
# Users: actors/controller, actors/node supervisor, bin/ (status), serve/ (console), transport/.
#
# SCHEMA EVOLUTION RULE: add fields only, with the next unused ordinal; never renumber, retype or
# reuse an ordinal, never change a default; a retired field stays, renamed `deprecatedX`; enums
# grow at the end and unknown enumerants are invalid input. Readers validate sizes, ids, ranges
# and shapes: any peer may be malformed (see common.capnp for the full rule).

@0xdd72c4ec738991e3;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::schemas");

using Common = import "common.capnp";
using Kv = import "kv.capnp";

# --- Nodes and membership -------------------------------------------------------------------

enum DeviceKind {
  cpu @0;
  cuda @1;
}

struct Device {
  # One compute device of a node.
  kind @0 :DeviceKind;
  # what it is
  index @1 :UInt32;
  # device ordinal on the node (CUDA device index; 0 for the CPU)
  name @2 :Text;
  # model name, e.g. "NVIDIA H200"
  memoryBytes @3 :UInt64;
  # bytes of device memory (host memory for the CPU)
  freeMemoryBytes @4 :UInt64;
  # bytes free when the report was made
  computeCapability @5 :UInt32;
  # CUDA major * 10 + minor (e.g. 90); 0 for the CPU
}

struct NodeResources {
  # What a node can host.
  cpuCores @0 :UInt32;
  # logical cores usable by troupe
  memoryBytes @1 :UInt64;
  # bytes of host memory
  freeMemoryBytes @2 :UInt64;
  # bytes of host memory available when the report was made
  devices @3 :List(Device);
  # GPUs (and the CPU as a device when it runs compute)
}

struct NodeInfo {
  # A node daemon as it describes itself.
  name @0 :Text;
  # operator-given node name from the cluster TOML, e.g. "node-b"; unique in the cluster
  address @1 :Text;
  # "host:port" of the daemon's UCX listener
  resources @2 :NodeResources;
  # what it can host
  version @3 :Text;
  # troupe build version, e.g. "0.1.0+42e1bc1"; the controller rejects incompatible ones
  pid @4 :UInt32;
  # OS process id of the daemon (for operators)
  modelFileHash @5 :UInt64;
  # hash of the model file header the node can map; 0 = no model file found
}

struct JoinRequest {
  # Node daemon -> controller. header.sender.node is 0 and header.clusterEpoch is the last epoch
  # the node knew (0 on first start).
  header @0 :Common.Header;
  node @1 :NodeInfo;
  # who is joining
  nonce @2 :Data;
  # 32 random bytes chosen by the joiner for this attempt
  proof @3 :Data;
  # 32 bytes: HMAC-SHA256(cluster token, "troupe-join" || nonce || node.name); the controller
  # recomputes it and refuses the join on mismatch
}

struct JoinReply {
  # Controller -> node daemon. header.clusterEpoch is the epoch the node must use from now on.
  header @0 :Common.Header;
  accepted @1 :Bool;
  # false: refused (see error); the node must not act and retries later
  nodeId @2 :UInt32;
  # id assigned to the node (>= 1), used in every ActorId it hosts
  leaseMs @3 :UInt32;
  # ms the node stays a member without a heartbeat being acknowledged
  heartbeatIntervalMs @4 :UInt32;
  # ms between heartbeats the node must send (well under leaseMs)
  proof @5 :Data;
  # 32 bytes: HMAC-SHA256(cluster token, "troupe-join-reply" || nonce), proving the controller
  # knows the token too
  error @6 :Common.ErrorReport;
  # why the join was refused (bad proof, duplicate name, incompatible version)
}

struct LinkCounters {
  # One live transport link as a node daemon sees it (transport::LinkStats), for operators:
  # traffic, what was dropped and why, and whether large messages take same-host pulls.
  node @0 :Text;
  # the reporting node
  peer @1 :Text;
  # the node name the peer proved at connect (a client's own name for `troupe generate`)
  address @2 :Text;
  # "ip:port" of the peer's end
  messagesSent @3 :UInt64;
  bytesSent @4 :UInt64;
  messagesReceived @5 :UInt64;
  bytesReceived @6 :UInt64;
  sendErrors @7 :UInt64;
  # sends the transport failed (peer gone, link cut)
  malformed @8 :UInt64;
  # dropped: bad header, broken fragment sequence, failed validation above the transport, ...
  corrupted @9 :UInt64;
  # dropped (and counted in malformed): payload checksum mismatch
  oversized @10 :UInt64;
  # dropped: larger than the transport's limit
  pulled @11 :UInt64;
  # messages received by same-host pull (also in messagesReceived)
  pullsTo @12 :Bool;
  # large messages to the peer go by same-host pull
  pullsFrom @13 :Bool;
  # large messages from the peer come by same-host pull
}

struct TransportCounters {
  # A node daemon's transport as a whole (transport::TransportStats), for operators.
  node @0 :Text;
  # the reporting node
  authFailures @1 :UInt64;
  # peers refused: a bad proof of the cluster token, a malformed hello, or no hello in time
  unauthenticatedDropped @2 :UInt64;
  # messages dropped because their sender had not authenticated (or named no live link)
  connectionsAccepted @3 :UInt64;
  # connections its listener accepted
}

struct Heartbeat {
  # Node daemon -> controller every heartbeatIntervalMs.
  header @0 :Common.Header;
  leaseMs @1 :UInt32;
  # ms of lease the node asks for, counted from when the controller receives this
  resources @2 :NodeResources;
  # current free memory per device
  numActors @3 :UInt32;
  # actors the node hosts now
  uptimeMs @4 :UInt64;
  # ms since the daemon started
  links @5 :List(LinkCounters);
  # the node's live links, for the controller's status
  transport @6 :TransportCounters;
  # the node's transport as a whole
}

struct HeartbeatAck {
  # Controller -> node daemon.
  header @0 :Common.Header;
  leaseMs @1 :UInt32;
  # ms of lease granted, counted from when the node sent the heartbeat
  membershipVersion @2 :UInt64;
  # Membership.version the controller holds; a node with an older one asks for the new view
  fenced @3 :Bool;
  # true: the node's epoch is over (it was declared dead and its actors re-placed); it must stop
  # its actors and join again
}

enum MemberState {
  joining @0;
  alive @1;
  suspect @2;   # lease about to expire, or endpoint errors
  dead @3;      # lease expired: its actors are being re-placed, its epoch fenced
  left @4;      # left in an orderly way
}

struct Member {
  # One node as the controller sees it.
  nodeId @0 :UInt32;
  # id assigned at join (>= 1)
  name @1 :Text;
  # NodeInfo.name
  address @2 :Text;
  # NodeInfo.address
  state @3 :MemberState;
  # liveness
  lastHeartbeatAgeMs @4 :UInt64;
  # ms since the controller last heard from it (relative: clocks of hosts differ)
  resources @5 :NodeResources;
  # last reported resources
}

struct Membership {
  # Controller -> every node daemon (and the router): the current cluster view.
  header @0 :Common.Header;
  version @1 :UInt64;
  # bumped on every change of the member list or of a member's state
  members @2 :List(Member);
  # all known nodes, dead ones included until their actors are re-placed
}

# --- Placement -------------------------------------------------------------------------------

struct StagePlacement {
  stage @0 :UInt32;
  # pipeline stage index
  nodeId @1 :UInt32;
  # node hosting it
  devices @2 :List(Int32);
  # device indices of its tensor-parallel group on that node; [-1] = CPU
  layerBegin @3 :UInt32;
  # first model layer (inclusive)
  layerEnd @4 :UInt32;
  # last model layer (exclusive); stages cover [0, nLayer) without gaps or overlap
  hasEmbedding @5 :Bool;
  # true for stage 0: owns the token embedding
  hasOutputHead @6 :Bool;
  # true for the last stage: owns the final norm and the output head
  threads @7 :UInt32;
  # compute threads of the stage (CPU); 0 = the node's choice
}

struct ExpertShardPlacement {
  shard @0 :UInt32;
  # expert shard index
  nodeId @1 :UInt32;
  # node hosting it
  device @2 :Int32;
  # device index on that node; -1 = CPU
  experts @3 :List(UInt32);
  # [numExperts] global expert ids it owns (the same ids in every MoE layer), ascending
  threads @4 :UInt32;
  # compute threads of the shard (CPU); 0 = the node's choice
}

struct KvPoolPlacement {
  stage @0 :UInt32;
  # the stage whose KV this pool holds (one pool per stage, on the stage's node)
  nodeId @1 :UInt32;
  # node hosting it
  device @2 :Int32;
  # device index; -1 = CPU (host memory)
  numBlocks @3 :UInt32;
  # blocks in the pool
  blockSizeTokens @4 :UInt32;
  # tokens per block
}

struct EncoderPlacement {
  index @0 :UInt32;
  # encoder instance index
  nodeId @1 :UInt32;
  # node hosting it
  device @2 :Int32;
  # device index; -1 = CPU
  threads @3 :UInt32;
  # compute threads; 0 = auto
}

struct Placement {
  # Controller -> every node daemon: which actor lives where. Each daemon starts, keeps or stops
  # the actors placed on it; a new placement always comes with a new header.clusterEpoch.
  header @0 :Common.Header;
  version @1 :UInt64;
  # bumped on every re-placement
  modelName @2 :Text;
  # model name as served (OpenAI "model")
  modelFileHash @3 :UInt64;
  # hash of the model file header every node must map (NodeInfo.modelFileHash)
  stages @4 :List(StagePlacement);
  # in stage order
  expertShards @5 :List(ExpertShardPlacement);
  # in shard order; empty for dense models
  kvPools @6 :List(KvPoolPlacement);
  # one per stage
  encoders @7 :List(EncoderPlacement);
  # empty for text-only models
  numMicrobatches @8 :UInt32;
  # micro-batches the scheduler keeps in flight
}

struct PlacementReport {
  # Node daemon -> controller: the actors of Placement `version` placed on this node are running
  # (ok) or could not start (error). The controller serves requests once every node reported ok.
  header @0 :Common.Header;
  version @1 :UInt64;
  # Placement.version this report is about
  ok @2 :Bool;
  # true: every actor placed here runs
  error @3 :Common.ErrorReport;
  # why not (model file missing or different, not enough memory, a bad range)
  startupPhases @4 :List(StartupPhase);
  # this node's start-up phases (map weights, alloc kv, ...), in start order
}

struct LeaveNotice {
  # Node daemon -> controller: the node leaves in an orderly way (SIGTERM, after draining). The
  # controller marks it `left` at once instead of waiting for its lease to expire.
  header @0 :Common.Header;
  reason @1 :Text;
  # why, for the log (e.g. "SIGTERM")
}

struct ActorRestart {
  # Node daemon -> controller: an actor placed on this node failed and the node restarted it in
  # place (same configuration). A restarted stage has an empty KV pool: the scheduler then
  # recomputes its running sequences from their token logs.
  header @0 :Common.Header;
  actor @1 :Common.ActorId;
  # the actor that failed (and now runs again)
  reason @2 :Text;
  # why it failed, for the log
  kvLost @3 :Bool;
  # true: its KV pool is empty now (a stage)
  restarts @4 :UInt32;
  # restarts of this actor since the node started
}

# --- Status ----------------------------------------------------------------------------------

struct StatusRequest {
  # `troupe status`, the console or the controller -> a node daemon or the controller.
  header @0 :Common.Header;
  includeKv @1 :Bool;
  # true: fill StatusSnapshot.kvPools
}

enum ActorState {
  starting @0;    # loading weights, allocating pools
  running @1;
  restarting @2;  # crashed; its supervisor is restarting it
  stopped @3;
  failed @4;      # gave up restarting; the controller re-places or declares degraded
}

struct ActorStatus {
  actor @0 :Common.ActorId;
  # which actor
  name @1 :Text;
  # its printable name, e.g. "stage/2@node-b"
  state @2 :ActorState;
  # lifecycle state
  restarts @3 :UInt32;
  # restarts since the node started (counter)
  uptimeMs @4 :UInt64;
  # ms since its last (re)start
  lastError @5 :Text;
  # why it last crashed; empty if never
}

struct StartupPhase {
  # One timed phase of bringing up a node or actor (e.g. "join", "map weights", "alloc kv").
  name @0 :Text;
  # phase name
  actor @1 :Common.ActorId;
  # who ran it (role nodeDaemon for node-level phases)
  startMs @2 :UInt64;
  # ms from the daemon's start to the phase's start
  durationMs @3 :UInt64;
  # ms the phase took (so far, while not done)
  done @4 :Bool;
  # false while it is still running
}

struct Throughput {
  # Recent rates, averaged over `windowMs`.
  windowMs @0 :UInt32;
  # ms of history the rates cover
  promptTokensPerS @1 :Float64;
  # prompt tokens computed per second
  generationTokensPerS @2 :Float64;
  # tokens generated per second
  stepsPerS @3 :Float64;
  # scheduler steps per second
  numRequestsRunning @4 :UInt32;
  # requests being generated now
  numRequestsWaiting @5 :UInt32;
  # requests admitted and queued
}

struct StatusSnapshot {
  # A node daemon or the controller -> whoever asked (StatusRequest), or pushed periodically to
  # the console. The controller's snapshot merges its nodes'.
  header @0 :Common.Header;
  takenAtMs @1 :UInt64;
  # ms since the reporting daemon started
  membership @2 :Membership;
  # the controller's view; absent in a single node's snapshot
  actors @3 :List(ActorStatus);
  # every actor the reporter knows of
  startupPhases @4 :List(StartupPhase);
  # in start order
  kvPools @5 :List(Kv.KvStats);
  # one per stage whose pool the reporter knows (when asked with includeKv)
  throughput @6 :Throughput;
  # absent where no scheduler runs
  placementVersion @7 :UInt64;
  # Placement.version the reporter runs
  reporter @8 :Text;
  # node name of the reporter
  serving @9 :Bool;
  # the head: every placed actor runs and requests are served; another node: its actors run
  condition @10 :Text;
  # the head: why requests are not being served right now, in words ("" when they are): the
  # cluster is forming, re-placing a lost node's actors, waiting for a node with room, or has
  # stopped serving (and why)
  links @11 :List(LinkCounters);
  # the reporter's live links; the controller's adds each node's from its last heartbeat
  transport @12 :List(TransportCounters);
  # the reporter's transport; the controller's adds each node's from its last heartbeat
  encoder @13 :EncoderCounters;
  # the head's image encoder ([model] mmproj); absent where none runs
}

struct EncoderCounters {
  # The head's image encoder (actors/encoder.h), for operators. Counts since it started.
  mmproj @0 :Text;
  # file name of the vision encoder
  requests @1 :UInt64;
  # requests with images it laid out (or refused)
  images @2 :UInt64;
  # images of those requests
  encoded @3 :UInt64;
  # images run through the encoder; the rest came from the cache
  cacheHits @4 :UInt64;
  # images found in the cache, or already being encoded for another request
  failed @5 :UInt64;
  # requests refused: an image that does not decode, a marker count that does not match, ...
  encodeSeconds @6 :Float64;
  # time spent encoding, in seconds (finite, >= 0)
  cacheEntries @7 :UInt64;
  # images in the cache now
  cacheBytes @8 :UInt64;
  # bytes of encoded rows in the cache now
  retried @9 :UInt64;
  # images sent to an instance again: the message or its answer was lost, the instance was not
  # running (yet) where it was sent, or a re-placement stopped it
}

# --- Fault injection (tests only) --------------------------------------------------------------

enum FaultAction {
  drop @0;        # the message is not delivered
  delay @1;       # delivered delayMs late
  duplicate @2;   # delivered twice
  corrupt @3;     # one byte of the frame flipped (position drawn from the seeded RNG)
  cut @4;         # the link to the peer fails, as if the network were cut, until cleared
}

struct FaultRule {
  # One rule of the transport's fault shim: for each matching message, with the given
  # probability, do the action. Decisions come from an RNG seeded with `seed`, so a test
  # replays the same faults.
  action @0 :FaultAction;
  # what to do
  peerNode @1 :UInt32;
  # node id of the other end of the link; 0 = any peer
  messageTypeId @2 :UInt64;
  # Cap'n Proto type id of the message's root struct (capnp::typeId<T>()); 0 = any message
  probability @3 :Float32;
  # chance per matching message, in [0, 1]
  seed @4 :UInt64;
  # RNG seed of this rule
  delayMs @5 :UInt32;
  # ms of added latency (action delay only)
  maxCount @6 :UInt32;
  # the rule fires at most this many times; 0 = unlimited
  outgoing @7 :Bool = true;
  # true: applies to messages this node sends; false: to messages it receives
}

struct FaultCommand {
  # Test harness -> node daemon: replace the node's fault rules.
  header @0 :Common.Header;
  rules @1 :List(FaultRule);
  # the new rule set (replaces the old one); empty = faults off
}
