// ClusterClient: a client of a running cluster's head (`troupe generate --head`, `troupe status
// --head`, tests): sends generation requests over the transport and collects the streamed
// answers. No CAF. Thread safety: one caller at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "actors/local_cluster.h"
#include "base/result.h"

namespace troupe::actors {

class ClusterClient {
 public:
  /// Connects to the head at host:port, proving `token`. Errors: unreachable, refused.
  static Result<std::unique_ptr<ClusterClient>> connect(
      const std::string& host, uint16_t port, const std::string& token,
      std::chrono::milliseconds timeout = std::chrono::milliseconds(10000));
  ~ClusterClient();

  /// As LocalCluster::generate_many: at most `concurrency` requests in flight (0 = all), results
  /// in request order, streamed pieces to `on_delta`. A request gets an error result when the
  /// head refuses it, when the link to the head fails, or after `timeout` without its end.
  std::vector<GenerateResult> generate_many(
      const std::vector<GenerateRequest>& reqs, size_t concurrency = 0,
      const StreamCallback& on_delta = nullptr,
      std::chrono::milliseconds timeout = std::chrono::milliseconds(600000));

  /// The head's status snapshot as JSON (see `troupe status --json`).
  Result<std::string> status_json(
      std::chrono::milliseconds timeout = std::chrono::milliseconds(10000));
  /// The same as text for a person (`troupe status`).
  Result<std::string> status_text(
      std::chrono::milliseconds timeout = std::chrono::milliseconds(10000));

 private:
  ClusterClient();
  Result<std::string> status(std::chrono::milliseconds timeout, bool text);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe::actors
