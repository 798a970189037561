// Plan: how one model is laid out over the actors — pipeline stages (layer ranges), expert shards
// (expert id sets), the KV pool of each stage and the scheduler's budget. Read from a TOML file
// (conf/plan-*.toml) or built from `--stages N --expert-shards M`, then resolved against the
// model once at start. Plain structs; callers on any thread; no toml++ or CAF here.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"
#include "compute/kv_type.h"

namespace troupe::model {
struct ModelSpec;
}

namespace troupe::actors {

/// Why a plan was rejected (Error::code of the functions below). Numbers are pinned.
enum class PlanErrc : uint8_t {
  kIo = 1,       ///< the plan file could not be read
  kSyntax = 2,   ///< the file is not valid TOML
  kSchema = 3,   ///< an unknown key, a value of the wrong type, or a value out of its range
  kInvalid = 4,  ///< the plan does not fit the model: overlap, gap, ownership, pool size
};
const char* to_string(PlanErrc e);

/// The continuous-batching scheduler's limits. TOML table [scheduler].
struct SchedulerConfig {
  int64_t max_tokens_per_step = 512;  // token budget per step: decode tokens + prefill chunks
  int64_t max_sequences = 64;         // sequences running at once
  int64_t max_queue = 256;            // waiting requests beyond which admission says overloaded
  int64_t microbatches = 2;           // micro-batches in flight through the pipeline
  int64_t max_model_len = 2048;       // prompt + generated tokens per sequence
  bool prefix_cache = true;           // reuse KV blocks of a shared prompt prefix
};

/// The GPU indices of a stage device "cuda:N" or "cuda:N,M,..." (at most 16, each 0..999); empty
/// for anything else (plan files are checked with this).
std::vector<int> cuda_devices(std::string_view device);

/// One pipeline stage. TOML: one [[stage]] table, in pipeline order.
struct StagePlan {
  int64_t layer_begin = -1;  // first layer; -1 = auto
  int64_t layer_end = -1;    // one past the last layer ([begin, end)); -1 = auto
  int64_t kv_blocks = 0;     // KV pool of this stage, in blocks of Plan::kv_block_size; 0 = auto
  int threads = 1;           // compute threads of this stage; 0 = "auto" (resolve_threads)
  std::string node;          // node daemon hosting it (multi-host plans); "" = auto
  // "cpu" (compute::Engine), "cuda:N" (gpu::GpuEngine on GPU N) or "cuda:N,M,..." (a
  // tensor-parallel group, gpu::GpuTpEngine, one rank per listed GPU; one GPU repeated, e.g.
  // "cuda:0,0", runs the one-GPU stand-in of a group).
  std::string device = "cpu";
  // With a GPU list, how the GPUs share the stage: "tensor" (every GPU a share of every layer,
  // gpu::GpuTpEngine) or "data" (every GPU the whole stage for its own sequences, the experts of
  // MoE layers shared out and reached by all-to-all: gpu::GpuDpEngine; the KV block ids split
  // into one pool per GPU).
  std::string parallel = "tensor";
  bool on_cpu() const { return device == "cpu"; }
  /// GPUs of a data-parallel stage, else 1.
  int64_t data_ranks() const;
  int line = 0;  // line of its [[stage]] table in Plan::source; 0 = not from a file
};

/// One expert shard: the routed experts it owns in every MoE layer. TOML: one [[expert_shard]].
struct ExpertShardPlan {
  std::vector<int32_t> experts;  // expert ids; sorted and unique once resolved
  bool auto_experts = true;      // true = `experts` is to be filled by resolve_plan
  int threads = 1;               // compute threads of this shard; 0 = "auto"
  std::string node;              // node daemon hosting it (multi-host plans); "" = auto
  int line = 0;                  // line of its [[expert_shard]] table; 0 = not from a file
};

/// One image encoder ([model] mmproj): decodes and encodes the images of requests the head's
/// encoder front sends it (actors/encoder.h). TOML: one [[encoder]] table. A plan with an mmproj
/// and no [[encoder]] gets one on the head (resolve_placement).
struct EncoderPlan {
  int threads = 0;   // compute threads; 0 = "auto"; default: [model] vision_threads
  std::string node;  // node daemon hosting it; "" = the head
  int line = 0;      // line of its [[encoder]] table; 0 = not from a file
};

/// One node daemon of a multi-host cluster. TOML: one [[node]] table.
struct NodePlan {
  std::string name;  // unique in the cluster, e.g. "node-b"
  std::string host;  // address its transport listens on (and peers connect to)
  int64_t port = 0;  // 1..65535
  // The most memory the actors placed on this node may take, in MiB (for a host shared with
  // other work): their weights, and the stages' KV pools and recurrent states; 0 = no limit
  // beyond the memory it has. A plan that places more on it is refused when the nodes start
  // (placed_memory_bytes); re-placement moves an actor onto it only if it fits under it.
  int64_t memory_limit_mb = 0;
  int line = 0;
};

/// The cluster around a plan (ARCHITECTURE §9). TOML: [cluster] and [[node]] tables; a plan
/// without them runs in one process.
struct ClusterPlan {
  std::string name = "troupe";
  std::string token;       // shared secret; TROUPE_CLUSTER_TOKEN in the environment overrides it
  std::string token_file;  // or read from this file (relative to the plan's directory)
  std::string head;        // node running the controller, router and scheduler; "" = first node
  int64_t heartbeat_ms = 500;  // node -> controller heartbeat period
  int64_t lease_ms = 3000;     // a node missing heartbeats this long is declared dead
  // When no survivor has room for a lost node's actors, requests wait this long for a node with
  // room to join (or rejoin) before they fail; 0 fails them at once.
  int64_t replace_wait_ms = 60000;
  std::string ucx_tls;              // UCX_TLS for the transport; "" = UCX's default (all)
  std::string ucx_net_devices;      // UCX_NET_DEVICES; "" = UCX's default
  std::string error_mode = "auto";  // transport error handling: auto, peer or none
  // A checksum on every message payload, verified by the receiver (docs/transport.md). Off saves
  // a pass over each payload on both sides (TCP at >= 4 MiB: 0.72-0.83 of ucx_perftest with it,
  // 0.91-1.20 without, docs/benchmarks.md) and leaves corruption above the link undetected.
  bool payload_checksums = true;
  // Nodes of one host read each other's large messages out of memory (docs/transport.md,
  // Same-host pulls); false sends them over the UCX endpoint like any other.
  bool same_host_pull = true;
  std::vector<NodePlan> nodes;
  int line = 0;  // line of [cluster]
  bool present() const { return !nodes.empty(); }
};

struct Plan {
  std::string source;      // where the plan came from (file name), the prefix of every message
  std::string model_path;  // GGUF file or HF directory; "" = the command line names it
  std::string weights =
      "auto";  // [model] weights: "auto", "memory" or "map" (model.h WeightStorage)
  // [model] mmproj: the vision encoder (llama.cpp mmproj GGUF) for requests with images; "" =
  // none (they are refused). The head lays prompts out and keeps image_cache_mb of encoded
  // images (0 = none); the encoders ([[encoder]], default: one on the head with vision_threads,
  // 0 = "auto") decode and encode them.
  std::string mmproj;
  int64_t image_cache_mb = 256;
  int64_t vision_threads = 0;
  int64_t kv_block_size = 16;  // tokens per KV block
  // [stages] kv_type: what the CPU stages' KV pools store ("f32", "f16" or "bf16",
  // compute/kv_type.h); GPU stages keep bf16 whatever it says.
  compute::KvType kv_type = compute::KvType::kF32;
  int64_t num_stages = 1;         // pipeline stages
  int64_t num_expert_shards = 0;  // 0 = experts stay inside the stages
  std::vector<StagePlan> stages;  // num_stages entries once resolved (padded with auto ones)
  std::vector<ExpertShardPlan> expert_shards;  // num_expert_shards entries once resolved
  std::vector<EncoderPlan> encoders;           // [[encoder]]; one on the head once resolved
  SchedulerConfig scheduler;
  ClusterPlan cluster;
  /// The scheduler's KV pools: the GPU count of the data-parallel stages (all equal), else 1.
  int64_t kv_pools() const;
};

/// Reads a plan from a TOML file (schema: conf/plan-example.toml). A relative model path is
/// taken relative to the file's directory. Checks types, unknown keys and the ranges that need
/// no model; errors read "<path>:<line>: <key path>: <what>" (code PlanErrc). Fields set to
/// "auto" stay auto (-1 / 0 / auto_experts) until resolve_plan.
Result<Plan> parse_plan_file(const std::string& path);

/// As parse_plan_file, from text; `source_name` names it in messages and, when it has a
/// directory part, anchors a relative model path.
Result<Plan> parse_plan_string(std::string_view toml, const std::string& source_name);

/// The `--stages N --expert-shards M` shortcut: N auto stages, M auto expert shards, defaults
/// for the rest. Never fails; resolve_plan judges N and M against the model.
Plan even_plan(const std::string& model_path, int64_t num_stages, int64_t num_expert_shards);

/// Fills every auto part from the model, then validates the whole plan. After success every
/// field is concrete (no -1, no 0 kv_blocks, auto_experts false) and calling it again changes
/// nothing.
///  - Layers: a run of auto stages splits the layers between its explicit neighbours (or 0 and
///    n_layer) evenly, earlier stages taking the extra layer: 5 over 2 = [0,3) [3,5). Then the
///    ranges must be non-empty, in order and cover [0, n_layer) exactly; overlap, gap, range
///    past n_layer and more stages than layers are errors naming the stages and ranges.
///  - Experts: auto shards split the experts no explicit shard owns evenly and contiguously
///    (runs of adjacent ids, earlier shards taking the extra one: 8 over 3 = 0-2, 3-5, 6-7), so
///    a shard's slice of each stacked expert tensor is one contiguous range. Then each of
///    [0, n_expert) must be owned exactly once; shards for a dense model are an error.
///  - KV: auto = max_sequences full-length sequences, max_sequences * ceil(max_model_len /
///    kv_block_size) blocks; any pool below one full-length sequence is an error.
///  - Scheduler values in range; max_model_len within the model's training context.
/// Failure: code PlanErrc::kInvalid or kSchema, message prefixed with plan.source; `plan` may
/// then be partly filled.
Status resolve_plan(Plan& plan, const model::ModelSpec& spec);

/// For a multi-host plan (cluster.present()): checks the nodes (unique names and addresses, a
/// head among them), resolves the token (environment, then token, then token_file), and places
/// every stage and expert shard without a node round-robin over the nodes in file order (stages
/// first, then shards), and every image encoder without a node on the head. Errors name the key
/// and its line. For a single-process plan it only checks that nothing names a node. Either way
/// a plan with an mmproj and no [[encoder]] gets one, and [[encoder]] without an mmproj is an
/// error.
Status resolve_placement(Plan& plan);

/// What the first placement of a resolved multi-host plan (resolve_plan, resolve_placement) puts
/// on each of its nodes, in bytes, by node name: the weights of the stages, expert shards and
/// image encoders placed there, and the CPU stages' KV pools and recurrent states. This is what
/// a node's memory_limit_mb is checked against at start (ClusterNode::start refuses a plan that
/// puts more on a node), and what re-placement counts.
std::map<std::string, uint64_t> placed_memory_bytes(const Plan& plan, const model::ModelSpec& spec);

/// Index of the node named `name` in plan.cluster.nodes, or -1.
int node_index(const Plan& plan, const std::string& name);

/// A human-readable summary: the model and scheduler on one line, then one line per stage and
/// per expert shard. Auto parts print as "auto" when the plan is not resolved yet.
std::string describe_plan(const Plan& plan);

}  // namespace troupe::actors
