// The gateway's request metrics and their Prometheus text (/metrics). Names follow vLLM's where
// the meaning is the same ("troupe:" prefix, ARCHITECTURE §8). Thread safety: every method may
// be called from any thread.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace troupe::serve {

/// A cumulative histogram with fixed upper bounds (seconds).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  /// Prometheus text lines of `name` (with _bucket, _sum and _count).
  std::string text(const std::string& name, const std::string& help) const;
  double sum() const;
  uint64_t count() const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // per bound, then +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

struct GatewayMetrics {
  GatewayMetrics();
  std::atomic<int64_t> in_flight{0};       // generation requests in flight through the gateway
  std::atomic<uint64_t> prompt_tokens{0};  // of the gateway's requests, when they finish
  std::atomic<uint64_t> finished_stop{0}, finished_length{0}, finished_cancelled{0},
      finished_error{0};
  std::atomic<uint64_t> http_2xx{0}, http_4xx{0}, http_5xx{0};
  Histogram ttft;       // first streamed token, from admission
  Histogram e2e;        // whole request
  Histogram per_token;  // between streamed tokens
  void count_status(int status);
  void count_finish(const std::string& api_finish_reason);
  /// Everything above, `serving` (the cluster's state when asked) as a gauge, and the head's
  /// scheduler's counters (ClusterNode::scheduler_stats_json; "{}" leaves them out).
  std::string text(bool serving, const std::string& scheduler_json) const;
  /// The gateway's own numbers as one JSON object (the console's "gateway"): in_flight,
  /// prompt_tokens, finished_{stop,length,cancelled,error}, http_{2xx,4xx,5xx},
  /// {ttft,e2e}_{sum,count}.
  std::string json() const;
};

}  // namespace troupe::serve
