// The actor-system path of `troupe generate` (bin/cmd_generate_cluster.cc).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "actors/cluster_client.h"
#include "bin/args.h"
#include "compute/sampler.h"

namespace troupe::cli {

/// Runs the prompts of `ap` through the actor system of a plan (--config, or --stages/
/// --expert-shards). Returns the exit code; throws CliError on bad input.
int generate_with_plan(const ArgParser& ap, const compute::SamplingParams& sp, int64_t max_tokens);

/// Sends the prompts of `ap` to a running cluster's head (--head HOST:PORT).
int generate_with_head(const ArgParser& ap, const compute::SamplingParams& sp, int64_t max_tokens);

/// A client of the head at --head HOST:PORT (token as below). Throws CliError.
std::unique_ptr<actors::ClusterClient> connect_head(const ArgParser& ap);

/// The cluster token: --token, else TROUPE_CLUSTER_TOKEN, else the [cluster] of --config.
std::string cluster_token(const ArgParser& ap);

}  // namespace troupe::cli
