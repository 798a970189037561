// Private to gpu/tp_engine.cc and gpu/dp_engine.cc: a group of GpuEngine ranks, one per listed
// GPU (NCCL when the GPUs differ, the one-GPU stand-in when one repeats). Its ranks step together
// on a compute::ThreadPool of one thread per rank (rank 0 on the caller's thread).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/result.h"
#include "gpu/collective.h"
#include "gpu/engine.h"
#include "model/model.h"

namespace troupe::gpu::detail {

/// What the group's collective is for.
enum class GroupRole : uint8_t {
  kTensor,  // GpuEngineOptions::tp: each rank a share of every layer, partial outputs summed
  kExpert,  // GpuEngineOptions::ep: each rank its own sequences, a share of the experts
};

struct RankGroup {
  std::vector<int> devices;
  bool nccl = false;
  std::vector<std::unique_ptr<Collective>> group;  // one per rank; empty for a group of one
  std::vector<std::unique_ptr<GpuEngine>> ranks;
  ~RankGroup();                   // engines first, then the collectives, all NCCL ranks at once
  uint64_t weight_bytes() const;  // summed over ranks
  uint64_t kv_bytes() const;      // summed over ranks
};

/// The ranks on `devices` with opts (device, tp/ep and, for kExpert, kv_num_blocks set per
/// rank: `rank_kv_blocks`). `who` names the caller in messages ("GpuTpEngine"). Errors as
/// GpuTpEngine::create.
Result<std::unique_ptr<RankGroup>> make_rank_group(std::shared_ptr<const model::Model> model,
                                                   const GpuEngineOptions& opts,
                                                   const std::vector<int>& devices, GroupRole role,
                                                   int64_t rank_kv_blocks, const char* who);

std::string device_list(const std::vector<int>& d);

}  // namespace troupe::gpu::detail
