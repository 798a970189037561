#include <cuda_runtime.h>

#include "gpu/device.h"

namespace troupe::gpu {

std::vector<DeviceInfo> list_devices(std::string* why) {
  std::vector<DeviceInfo> out;
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  // A non-zero return (no driver, error 35) must be treated as "no GPU", not only a count of 0.
  if (err != cudaSuccess) {
    if (why) *why = cudaGetErrorString(err);
    cudaGetLastError();  // clear the sticky error
    return out;
  }
  if (n == 0 && why) *why = "no CUDA devices";
  // cudaMemGetInfo reports on the current device: switch per device, then switch back so the
  // caller's thread stays on its own device.
  int current = 0;
  const bool restore = cudaGetDevice(&current) == cudaSuccess;
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    DeviceInfo d;
    d.index = i;
    d.name = p.name;
    d.sm_major = p.major;
    d.sm_minor = p.minor;
    d.total_bytes = p.totalGlobalMem;
    if (cudaSetDevice(i) == cudaSuccess) cudaMemGetInfo(&d.free_bytes, &d.total_bytes);
    out.push_back(d);
  }
  if (restore) cudaSetDevice(current);
  return out;
}

}  // namespace troupe::gpu
