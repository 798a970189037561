// GpuTpEngine: one pipeline stage computed by a tensor-parallel group of GPUs of one host — one
// GpuEngine rank per GPU (gpu/engine.h, GpuEngineOptions::tp), each driven by its own thread,
// summing partial outputs through a Collective (gpu/collective.h): NCCL when every rank has its
// own GPU; the local stand-in group when all ranks share one GPU (a one-GPU machine running the
// same tensor-parallel code, for tests and trials).
// Same step() contract as GpuEngine (and compute::Engine): the caller sees one engine whose
// results are rank 0's. Numerics: deterministic and batch-invariant like GpuEngine (the sums run
// in rank order), not bitwise equal to a one-GPU engine (a GEMM's reduction over its input width
// is split between the ranks); a given device list always gives the same bits.
// Failure: a rank whose step fails aborts the group (the other ranks' sums throw instead of
// waiting) and step() returns that rank's error; the group is then broken for good and every
// later step fails with Errc::kStepFailed: recreate the engine.
// Thread safety: one step at a time, from any one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "base/result.h"
#include "compute/engine.h"
#include "compute/kv_cache.h"
#include "gpu/engine.h"
#include "model/model.h"

namespace troupe::gpu {

class GpuTpEngine {
 public:
  /// Ranks on `devices` (rank r on devices[r]): all distinct (NCCL, one GPU per rank) or all the
  /// same (the local stand-in); opts.device and opts.tp are ignored. One device is a group of one
  /// (a plain GpuEngine behind the same interface). Errors as GpuEngine::create, plus
  /// Errc::kBadInput for an empty or mixed device list or a model the group size does not divide
  /// (the message names the dimension), Errc::kNccl when the communicators cannot form.
  static Result<std::unique_ptr<GpuTpEngine>> create(std::shared_ptr<const model::Model> model,
                                                     const GpuEngineOptions& opts,
                                                     std::vector<int> devices);
  ~GpuTpEngine();
  GpuTpEngine(const GpuTpEngine&) = delete;
  GpuTpEngine& operator=(const GpuTpEngine&) = delete;

  /// GpuEngine::step on every rank at once (the same steps, the same hidden_in); out and
  /// hidden_out are rank 0's.
  Status step(std::span<const compute::SeqStep> seqs, compute::StepResult* out,
              const float* hidden_in = nullptr, std::vector<float>* hidden_out = nullptr);

  int size() const;
  const std::vector<int>& devices() const;
  bool uses_nccl() const;  // false: one rank, or the one-device stand-in
  const model::ModelSpec& spec() const;
  const compute::LayerRange& range() const;
  compute::BlockAllocator& blocks();  // block ids valid on every rank (same pool sizes)
  uint64_t weight_bytes() const;      // summed over ranks
  uint64_t kv_bytes() const;          // summed over ranks
  float last_step_ms() const;         // rank 0's device time of the last step
  GpuEngine& rank(int r);             // diagnostics and tests

 private:
  struct Impl;
  explicit GpuTpEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe::gpu
