// ClusterNode: one node daemon of a multi-host cluster (`troupe node`, `troupe serve`). Every
// node listens on its [[node]] address, joins the head through it with the cluster token,
// heartbeats, and hosts the stages and expert shards the head places on it; the head node also
// runs the controller (membership, leases, placement), the router and the scheduler, and serves
// clients (ClusterClient). The public face of the multi-host actor system: it hides CAF and UCX.
// Thread safety: every method may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "actors/local_cluster.h"
#include "actors/plan.h"
#include "base/result.h"
#include "model/vision.h"
#include "transport/fault.h"

namespace troupe::actors {

/// What a request submitted in this process (ClusterNode::submit: the HTTP gateway) receives:
/// the pieces of its stream, then its end, exactly once. Both are called on one of the node's
/// actor threads, in order for one request: they must return quickly, and never block or call
/// back into the node.
struct RequestCallbacks {
  /// `logits`: f32 [n_vocab] of `token` when the request set return_logits, else empty; token
  /// -1: text flushed at the end (no token).
  std::function<void(const std::string& delta, int32_t token, const std::vector<float>& logits)>
      on_piece;
  std::function<void(const GenerateResult& result)> on_finish;
};

struct NodeOptions {
  std::string name;  // which [[node]] of the plan this process is
  ClusterOptions cluster;
  std::chrono::milliseconds join_timeout{120000};  // keep trying to reach the head this long
  transport::FaultRules faults;                    // fault-injection shim (tests); off if empty
  std::string version = "0.1.0";                   // told to the head in the join
  /// The head, when leaving: stop admitting and let requests in flight finish for this long.
  std::chrono::milliseconds drain_timeout{30000};
  NodeOptions() { cluster.step_timeout_ms = 30000; }
};

class ClusterNode {
 public:
  /// Starts the daemon for `plan` (parsed; placement is resolved here): the transport on this
  /// node's address, then joining in the background. Errors: a bad plan, a name not in the plan,
  /// an address that cannot be bound, a model that cannot be loaded (the head loads it first).
  static Result<std::unique_ptr<ClusterNode>> start(Plan plan, const NodeOptions& opts);
  /// Leaves (if not done) and stops.
  ~ClusterNode();

  bool is_head() const;
  uint16_t port() const;

  /// Blocks until this node is part of a serving cluster — the head: every node joined and
  /// reported its actors running; another node: its own actors run — or fails: placement failed
  /// (the message says where and why), or the time ran out.
  Status wait_ready(std::chrono::milliseconds timeout);

  /// Orderly leave. The head first drains: new requests are refused ("shutting down") and those
  /// in flight get up to drain_timeout to finish. A node tells the head (which marks it `left` at
  /// once; requests whose pipeline ran through it end with an error naming it), then closes its
  /// links. Idempotent.
  void leave(const std::string& reason);

  /// The head: hands `req` to the router as a client over the transport would; its stream and
  /// end go to `cb`. While the cluster is not serving (forming, re-placing with no room, draining)
  /// it ends at once with an error result saying why. The id it returns names it to cancel().
  /// Another node: an error.
  Result<uint64_t> submit(GenerateRequest req, RequestCallbacks cb);
  /// Stops a submitted request (its end comes to on_finish as "cancelled"; its KV is freed). An
  /// unknown or finished id is ignored.
  void cancel(uint64_t id);
  /// The head's scheduler's counters as JSON: running, waiting, steps, preemptions, recomputes,
  /// step_timeouts, tokens_generated, kv_usage_perc (0-1), prefix_hit_tokens,
  /// prefix_query_tokens, step_wall_seconds, step_compute_seconds. "{}" on another node.
  std::string scheduler_stats_json();
  /// The model this node loaded (the head's tokenizer and chat template for a gateway).
  std::shared_ptr<const model::Model> model() const;
  /// The head's vision encoder ([model] mmproj), which lays out requests with image files; null
  /// without one (such requests are refused) and on other nodes.
  std::shared_ptr<const model::VisionModel> vision() const;

  /// Fault injection (tests): "stage/N" or "expert/N" placed on this node throws while handling
  /// its next message; the node restarts it and the outputs stay identical.
  Status inject_fault(const std::string& actor);

  /// Replaces the transport's fault-injection rules (tests: e.g. "cut" every link of this node
  /// to make it look dead to the others). Empty: no faults.
  void set_faults(transport::FaultRules rules);
  /// Membership, placement, actors and start-up phases as JSON (what `troupe status` prints).
  std::string status_json();

 private:
  ClusterNode();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe::actors
