// The NCCL group of the multi-GPU tests (tp_engine_test.cc, moe_dispatch_test.cc): ranks 0..n-1
// on GPUs 0..n-1, each joined from its own thread; a rank that fails to join is a test failure.
#pragma once

#include <exception>
#include <memory>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "gpu/collective.h"
#include "gpu/comm.h"
#include "gpu/runtime.h"

namespace troupe::gpu::testing {

/// Empty entries where a rank did not join (reported with ADD_FAILURE). Destroy the group with
/// destroy_group (NCCL's destroy is collective).
inline std::vector<std::unique_ptr<Collective>> nccl_test_group(int n, size_t capacity) {
  const CommId id = CommId::create();
  const auto state = make_nccl_group_state();
  std::vector<std::unique_ptr<Collective>> group(static_cast<size_t>(n));
  std::vector<std::thread> joiners;
  for (int r = 0; r < n; ++r) {
    joiners.emplace_back([&, r] {
      try {
        TROUPE_CUDA_CHECK(cudaSetDevice(r));
        group[static_cast<size_t>(r)] = make_nccl_rank(id, r, n, capacity, state);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << r << ": " << e.what();
      }
    });
  }
  for (std::thread& t : joiners) t.join();
  return group;
}

}  // namespace troupe::gpu::testing
