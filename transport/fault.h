// Fault-injection shim of the transport (tests only; off unless rules are set): drop, delay,
// duplicate, corrupt or cut, by peer name, message type, direction and probability, from a seeded
// RNG so that a test replays the same faults. The C++ form of schemas/cluster.capnp FaultRule,
// with the peer named by node name (the transport does not know node ids).
// Thread safety: FaultShim is used by the transport's progress thread only.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/result.h"

namespace troupe::transport {

enum class FaultAction : uint8_t {
  kDrop = 0,       // not delivered
  kDelay = 1,      // delivered delay_ms late (later messages of the link may overtake it)
  kDuplicate = 2,  // delivered twice
  kCorrupt = 3,    // one byte flipped, at a position drawn from the rule's RNG
  kCut = 4,        // the link fails (every message both ways dropped) until the rules change
};

struct FaultRule {
  FaultAction action = FaultAction::kDrop;
  std::string peer;          // the other end's node name; "" = any peer
  uint64_t type = 0;         // message type id; 0 = any
  double probability = 1.0;  // per matching message, in [0, 1]
  uint64_t seed = 1;
  uint32_t delay_ms = 0;   // kDelay only
  uint32_t max_count = 0;  // fires at most this often; 0 = unlimited
  bool outgoing = true;    // true: messages this node sends; false: messages it receives
  uint64_t min_bytes = 0;  // only messages of at least this many bytes (0 = any size)
};
using FaultRules = std::vector<FaultRule>;

/// Parses one rule from "action[:key=value]..." with keys peer, type, p, seed, delay_ms, max,
/// min_bytes, dir=out|in, e.g. "drop:peer=node-b:p=0.1:seed=7" (used by `troupe node --fault`,
/// tests).
Result<FaultRule> parse_fault_rule(const std::string& text);

/// What the shim decided for one message.
struct FaultDecision {
  FaultAction action = FaultAction::kDrop;
  uint32_t delay_ms = 0;
  size_t corrupt_at = 0;  // byte index to flip (kCorrupt), already reduced modulo the size
};

class FaultShim {
 public:
  FaultShim() = default;
  explicit FaultShim(FaultRules rules);
  bool active() const { return !rules_.empty(); }
  /// The first rule that matches and fires for this message, if any. Advances that rule's RNG
  /// (rules that match but do not fire advance theirs too, so decisions depend only on the
  /// sequence of matching messages).
  std::optional<FaultDecision> decide(const std::string& peer, uint64_t type, bool outgoing,
                                      size_t size_bytes);

 private:
  struct State {
    FaultRule rule;
    uint64_t rng[4] = {0, 0, 0, 0};
    uint32_t fired = 0;
  };
  std::vector<State> rules_;
};

}  // namespace troupe::transport
