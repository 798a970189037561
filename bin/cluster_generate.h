// The actor-system path of `troupe generate` (bin/cmd_generate_cluster.cc).
#pragma once

#include <cstdint>

#include "bin/args.h"
#include "compute/sampler.h"

namespace troupe::cli {

/// Runs the prompts of `ap` through the actor system of a plan (--config, or --stages/
/// --expert-shards). Returns the exit code; throws CliError on bad input.
int generate_with_plan(const ArgParser& ap, const compute::SamplingParams& sp, int64_t max_tokens);

}  // namespace troupe::cli
