#include "gpu/runtime.h"

#include <cuda_runtime.h>

#include <cstdio>

namespace troupe::gpu {

void throw_cuda(cudaError_t err, const char* call, const char* file, int line) {
  char buf[512];
  std::snprintf(buf, sizeof buf, "CUDA error %d (%s) in %s at %s:%d", static_cast<int>(err),
                cudaGetErrorString(err), call, file, line);
  cudaGetLastError();  // clear a non-sticky error so the next call does not report it again
  throw DeviceError(err == cudaErrorMemoryAllocation ? Errc::kOutOfMemory : Errc::kCuda, buf);
}

bool gpu_available(std::string* why) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    if (why) *why = cudaGetErrorString(err);
    cudaGetLastError();
    return false;
  }
  if (n == 0) {
    if (why) *why = "no CUDA devices";
    return false;
  }
  return true;
}

Arena::Arena(size_t bytes) : capacity_(bytes) {
  if (bytes) TROUPE_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&base_), bytes));
}

Arena::~Arena() {
  if (base_) cudaFree(base_);
}

Arena& Arena::operator=(Arena&& o) noexcept {
  if (this != &o) {
    if (base_) cudaFree(base_);
    base_ = std::exchange(o.base_, nullptr);
    capacity_ = std::exchange(o.capacity_, 0);
    used_ = std::exchange(o.used_, 0);
    high_water_ = std::exchange(o.high_water_, 0);
  }
  return *this;
}

void* Arena::allocate(size_t bytes, const char* what) {
  const size_t begin = (used_ + 255) & ~size_t{255};
  if (begin > capacity_ || bytes > capacity_ - begin) {
    char buf[256];
    std::snprintf(buf, sizeof buf, "device arena full: %s needs %zu bytes, %zu of %zu used", what,
                  bytes, used_, capacity_);
    throw DeviceError(Errc::kOutOfMemory, buf);
  }
  used_ = begin + bytes;
  if (used_ > high_water_) high_water_ = used_;
  return base_ + begin;
}

StreamPair::StreamPair() {
  TROUPE_CUDA_CHECK(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
  TROUPE_CUDA_CHECK(cudaStreamCreateWithFlags(&comm_, cudaStreamNonBlocking));
  TROUPE_CUDA_CHECK(cudaEventCreateWithFlags(&compute_done_, cudaEventDisableTiming));
  TROUPE_CUDA_CHECK(cudaEventCreateWithFlags(&comm_done_, cudaEventDisableTiming));
}

StreamPair::~StreamPair() {
  if (compute_done_) cudaEventDestroy(compute_done_);
  if (comm_done_) cudaEventDestroy(comm_done_);
  if (compute_) cudaStreamDestroy(compute_);
  if (comm_) cudaStreamDestroy(comm_);
}

void StreamPair::comm_waits_for_compute() {
  TROUPE_CUDA_CHECK(cudaEventRecord(compute_done_, compute_));
  TROUPE_CUDA_CHECK(cudaStreamWaitEvent(comm_, compute_done_, 0));
}

void StreamPair::compute_waits_for_comm() {
  TROUPE_CUDA_CHECK(cudaEventRecord(comm_done_, comm_));
  TROUPE_CUDA_CHECK(cudaStreamWaitEvent(compute_, comm_done_, 0));
}

}  // namespace troupe::gpu
