// Fault-injection shim: rule parsing and seeded decisions (see fault.h).
#include "transport/fault.h"

#include <cstdlib>

#include "base/rng.h"

namespace troupe::transport {

namespace {

bool parse_u64(const std::string& s, uint64_t* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  *out = std::strtoull(s.c_str(), &end, 0);
  return end && *end == '\0' && s[0] != '-';
}

}  // namespace

Result<FaultRule> parse_fault_rule(const std::string& text) {
  auto bad = [&](const std::string& why) -> Error {
    return Error{1, "fault rule '" + text + "': " + why};
  };
  std::vector<std::string> parts;
  size_t at = 0;
  while (true) {
    const size_t colon = text.find(':', at);
    parts.push_back(text.substr(at, colon == std::string::npos ? std::string::npos : colon - at));
    if (colon == std::string::npos) break;
    at = colon + 1;
  }
  FaultRule r;
  const std::string& a = parts[0];
  if (a == "drop")
    r.action = FaultAction::kDrop;
  else if (a == "delay")
    r.action = FaultAction::kDelay;
  else if (a == "duplicate")
    r.action = FaultAction::kDuplicate;
  else if (a == "corrupt")
    r.action = FaultAction::kCorrupt;
  else if (a == "cut")
    r.action = FaultAction::kCut;
  else
    return bad("unknown action '" + a + "' (drop, delay, duplicate, corrupt, cut)");
  for (size_t i = 1; i < parts.size(); ++i) {
    const size_t eq = parts[i].find('=');
    if (eq == std::string::npos) return bad("expected key=value, got '" + parts[i] + "'");
    const std::string key = parts[i].substr(0, eq), val = parts[i].substr(eq + 1);
    uint64_t u = 0;
    if (key == "peer") {
      r.peer = val;
    } else if (key == "type") {
      if (!parse_u64(val, &r.type)) return bad("type must be an unsigned integer, got " + val);
    } else if (key == "p") {
      char* end = nullptr;
      r.probability = std::strtod(val.c_str(), &end);
      if (val.empty() || *end != '\0' || !(r.probability >= 0.0 && r.probability <= 1.0))
        return bad("p must be in [0, 1], got " + val);
    } else if (key == "seed") {
      if (!parse_u64(val, &r.seed)) return bad("seed must be an unsigned integer, got " + val);
    } else if (key == "delay_ms") {
      if (!parse_u64(val, &u) || u > 600000)
        return bad("delay_ms must be in [0, 600000], got " + val);
      r.delay_ms = static_cast<uint32_t>(u);
    } else if (key == "max") {
      if (!parse_u64(val, &u) || u > 0xffffffffull) return bad("max must be a uint32, got " + val);
      r.max_count = static_cast<uint32_t>(u);
    } else if (key == "min_bytes") {
      if (!parse_u64(val, &r.min_bytes))
        return bad("min_bytes must be an unsigned integer, got " + val);
    } else if (key == "dir") {
      if (val != "in" && val != "out") return bad("dir must be in or out, got " + val);
      r.outgoing = val == "out";
    } else {
      return bad("unknown key '" + key + "' (peer, type, p, seed, delay_ms, max, min_bytes, dir)");
    }
  }
  return r;
}

FaultShim::FaultShim(FaultRules rules) {
  for (auto& r : rules) {
    State s;
    s.rule = std::move(r);
    uint64_t x = s.rule.seed;
    for (auto& w : s.rng) w = splitmix64(x);
    rules_.push_back(std::move(s));
  }
}

std::optional<FaultDecision> FaultShim::decide(const std::string& peer, uint64_t type,
                                               bool outgoing, size_t size_bytes) {
  for (auto& s : rules_) {
    const FaultRule& r = s.rule;
    if (r.outgoing != outgoing) continue;
    if (!r.peer.empty() && r.peer != peer) continue;
    if (r.type != 0 && r.type != type) continue;
    if (size_bytes < r.min_bytes) continue;
    if (r.max_count != 0 && s.fired >= r.max_count) continue;
    const uint64_t draw = xoshiro256ss_next(s.rng);
    const double u = static_cast<double>(draw >> 11) * 0x1.0p-53;  // uniform in [0, 1)
    if (!(u < r.probability)) continue;
    ++s.fired;
    FaultDecision d;
    d.action = r.action;
    d.delay_ms = r.delay_ms;
    d.corrupt_at = size_bytes ? static_cast<size_t>(xoshiro256ss_next(s.rng) % size_bytes) : 0;
    return d;
  }
  return std::nullopt;
}

}  // namespace troupe::transport
