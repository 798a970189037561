// Private to gpu/tp_engine.cc and gpu/dp_engine.cc: a group of GpuEngine ranks, one per listed
// GPU (NCCL when the GPUs differ, the one-GPU stand-in when one repeats), and the threads that
// step them together (rank 0 on the caller's thread, each other rank on a worker of its own).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
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
  ~RankGroup();  // engines first, then the collectives, all NCCL ranks at once
};

/// The ranks on `devices` with opts (device, tp/ep and, for kExpert, kv_num_blocks set per
/// rank: `rank_kv_blocks`). `who` names the caller in messages ("GpuTpEngine"). Errors as
/// GpuTpEngine::create.
Result<std::unique_ptr<RankGroup>> make_rank_group(std::shared_ptr<const model::Model> model,
                                                   const GpuEngineOptions& opts,
                                                   const std::vector<int>& devices, GroupRole role,
                                                   int64_t rank_kv_blocks, const char* who);

/// Runs one job per rank at a time: rank 0 on the calling thread, ranks 1.. on persistent
/// workers. The job must not throw (it catches and records its own errors).
class RankThreads {
 public:
  explicit RankThreads(int n);
  ~RankThreads();
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;
  void run(const std::function<void(int)>& job);

 private:
  void work(int r);
  std::mutex mu_;
  std::condition_variable job_cv_, done_cv_;
  uint64_t job_id_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  const std::function<void(int)>* job_ = nullptr;
  std::vector<std::thread> workers_;
};

std::string device_list(const std::vector<int>& d);

}  // namespace troupe::gpu::detail
