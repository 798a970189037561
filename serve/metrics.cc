// Prometheus text for the gateway's metrics (see metrics.h).
#include "serve/metrics.h"

#include <cstdio>

#include <nlohmann/json.hpp>

namespace troupe::serve {

namespace {

std::string num(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}

std::string gauge(const std::string& name, const std::string& help, const std::string& v) {
  return "# HELP " + name + " " + help + "\n# TYPE " + name + " gauge\n" + name + " " + v + "\n";
}

std::string counter(const std::string& name, const std::string& help, uint64_t v,
                    const std::string& labels = "", bool header = true) {
  std::string out;
  if (header) out += "# HELP " + name + " " + help + "\n# TYPE " + name + " counter\n";
  return out + name + labels + " " + std::to_string(v) + "\n";
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  std::lock_guard<std::mutex> lk(mu_);
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++count_;
}

std::string Histogram::text(const std::string& name, const std::string& help) const {
  std::lock_guard<std::mutex> lk(mu_);
  std::string out = "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    out += name + "_bucket{le=\"" + num(bounds_[i]) + "\"} " + std::to_string(cum) + "\n";
  }
  cum += counts_.back();
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(cum) + "\n";
  out += name + "_sum " + num(sum_) + "\n" + name + "_count " + std::to_string(count_) + "\n";
  return out;
}

double Histogram::sum() const {
  std::lock_guard<std::mutex> lk(mu_);
  return sum_;
}

uint64_t Histogram::count() const {
  std::lock_guard<std::mutex> lk(mu_);
  return count_;
}

std::string GatewayMetrics::json() const {
  nlohmann::json j = {{"in_flight", in_flight.load()},
                      {"prompt_tokens", prompt_tokens.load()},
                      {"finished_stop", finished_stop.load()},
                      {"finished_length", finished_length.load()},
                      {"finished_cancelled", finished_cancelled.load()},
                      {"finished_error", finished_error.load()},
                      {"http_2xx", http_2xx.load()},
                      {"http_4xx", http_4xx.load()},
                      {"http_5xx", http_5xx.load()},
                      {"ttft_sum", ttft.sum()},
                      {"ttft_count", ttft.count()},
                      {"e2e_sum", e2e.sum()},
                      {"e2e_count", e2e.count()}};
  return j.dump();
}

GatewayMetrics::GatewayMetrics()
    : ttft({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10,
            20, 40, 80}),
      e2e({0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960}),
      per_token({0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10,
                 20, 40, 80}) {}

void GatewayMetrics::count_status(int status) {
  if (status >= 500)
    ++http_5xx;
  else if (status >= 400)
    ++http_4xx;
  else
    ++http_2xx;
}

void GatewayMetrics::count_finish(const std::string& r) {
  if (r == "stop")
    ++finished_stop;
  else if (r == "length")
    ++finished_length;
  else if (r == "cancelled")
    ++finished_cancelled;
  else
    ++finished_error;
}

std::string GatewayMetrics::text(bool serving, const std::string& scheduler_json) const {
  std::string o;
  o += gauge("troupe:cluster_serving", "1 when the cluster admits requests.", serving ? "1" : "0");
  o += gauge("troupe:gateway_requests_in_flight",
             "Generation requests in flight through the HTTP gateway.",
             std::to_string(in_flight.load()));
  const auto j = nlohmann::json::parse(scheduler_json, nullptr, false);
  if (j.is_object() && j.contains("running")) {
    auto n = [&](const char* k) { return num(j.value(k, 0.0)); };
    o += gauge("troupe:num_requests_running", "Sequences in the scheduler's running batch.",
               n("running"));
    o += gauge("troupe:num_requests_waiting", "Sequences queued at the scheduler.", n("waiting"));
    o += gauge("troupe:kv_cache_usage_perc", "Share of KV blocks in use (1 = all).",
               n("kv_usage_perc"));
    auto total = [&](const char* name, const char* help, const char* k) {
      o += "# HELP " + std::string(name) + " " + help + "\n# TYPE " + name + " counter\n" + name +
           " " + n(k) + "\n";
    };
    total("troupe:generation_tokens_total", "Tokens the scheduler generated (every client).",
          "tokens_generated");
    total("troupe:num_preemptions_total", "Sequences preempted (recomputed later).", "preemptions");
    total("troupe:scheduler_steps_total", "Pipeline steps the scheduler ran.", "steps");
    total("troupe:step_timeouts_total", "Steps run again after their deadline.", "step_timeouts");
    total("troupe:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.",
          "prefix_query_tokens");
    total("troupe:prefix_cache_hits_total", "Prompt tokens found in the prefix cache.",
          "prefix_hit_tokens");
    total("troupe:step_wall_seconds_total", "Seconds of pipeline steps, dispatch to outcome.",
          "step_wall_seconds");
    total("troupe:step_compute_seconds_total", "Seconds the stages computed within those steps.",
          "step_compute_seconds");
  }
  o += counter("troupe:prompt_tokens_total", "Prompt tokens of the gateway's finished requests.",
               prompt_tokens.load());
  const char* rs = "troupe:request_success_total";
  o += counter(rs, "Finished choices by finish reason.", finished_stop.load(),
               "{finished_reason=\"stop\"}");
  o += counter(rs, "", finished_length.load(), "{finished_reason=\"length\"}", false);
  o += counter(rs, "", finished_cancelled.load(), "{finished_reason=\"cancelled\"}", false);
  o += counter(rs, "", finished_error.load(), "{finished_reason=\"error\"}", false);
  const char* hr = "troupe:http_requests_total";
  o += counter(hr, "HTTP answers by status class.", http_2xx.load(), "{code=\"2xx\"}");
  o += counter(hr, "", http_4xx.load(), "{code=\"4xx\"}", false);
  o += counter(hr, "", http_5xx.load(), "{code=\"5xx\"}", false);
  o += ttft.text("troupe:time_to_first_token_seconds",
                 "Seconds from admission to a choice's first token.");
  o += per_token.text("troupe:time_per_output_token_seconds",
                      "Seconds between a choice's streamed tokens.");
  o += e2e.text("troupe:e2e_request_latency_seconds", "Seconds from admission to the end.");
  return o;
}

}  // namespace troupe::serve
