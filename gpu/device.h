// CUDA device discovery: the first piece of the GPU backend (kernels arrive with issue #5).
// Safe to call on machines without a GPU or driver: it reports zero devices and why.
#pragma once

#include <string>
#include <vector>

namespace troupe::gpu {

struct DeviceInfo {
  int index = 0;
  std::string name;
  size_t total_bytes = 0;
  size_t free_bytes = 0;
  int sm_major = 0, sm_minor = 0;
};

/// Lists CUDA devices. When none can be used, returns an empty list and sets *why
/// (e.g. "CUDA driver version is insufficient for CUDA runtime version").
std::vector<DeviceInfo> list_devices(std::string* why);

}  // namespace troupe::gpu
