// gpu_bench's own kernels: an HBM read kernel (the roofline of decode) and random fills (GEMM and
// attention inputs are never zeros: METHOD.md saw a bf16 GEMM run 13% faster on zeros).
// Host launchers are declared in bench/gpu/bench_util.h.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "bench/gpu/bench_util.h"
#include "gpu/runtime.h"

namespace troupe::gpu::bench {
namespace {

constexpr int kReadThreads = 512;
constexpr uint32_t kMagic = 0x9e3779b9u;

// Grid-stride loop with four independent 16-byte loads in flight per thread before their first
// use; the XOR of everything decides a store that (almost) never happens, so nothing is dropped.
__global__ void read_kernel(const uint4* __restrict__ p, size_t n, uint64_t* sink) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  uint32_t acc = 0;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = p[i];
    const uint4 b = p[i + stride];
    const uint4 c = p[i + 2 * stride];
    const uint4 d = p[i + 3 * stride];
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w;
    acc ^= c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
  }
  for (; i < n; i += stride) {
    const uint4 a = p[i];
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (acc == kMagic) sink[blockIdx.x] = acc;
}

__device__ __forceinline__ float uniform01(uint64_t seed, uint64_t i) {
  uint64_t z = seed * 0x9e3779b97f4a7c15ull + i + 1;  // splitmix64
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (1.0f / 16777216.0f);  // 24 bits: [0, 1)
}

template <class T>
__global__ void fill_uniform_kernel(T* p, size_t n, uint64_t seed, float lo, float hi) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float v = lo + (hi - lo) * uniform01(seed, i);
    if constexpr (sizeof(T) == 2) {
      p[i] = __float2bfloat16(v);
    } else {
      p[i] = v;
    }
  }
}

template <class T>
void fill(T* p, size_t n, uint64_t seed, float lo, float hi, cudaStream_t stream) {
  if (n == 0) return;
  const size_t blocks = (n + 255) / 256;
  fill_uniform_kernel<T>
      <<<static_cast<unsigned>(blocks < 65536 ? blocks : 65536), 256, 0, stream>>>(p, n, seed, lo,
                                                                                   hi);
  TROUPE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_read(const void* p, size_t bytes, uint64_t* sink, int blocks, cudaStream_t stream) {
  read_kernel<<<blocks, kReadThreads, 0, stream>>>(static_cast<const uint4*>(p), bytes / 16, sink);
  TROUPE_CUDA_CHECK_LAUNCH();
}

void launch_fill_uniform(__nv_bfloat16* p, size_t n, uint64_t seed, float lo, float hi,
                         cudaStream_t stream) {
  fill(p, n, seed, lo, hi, stream);
}

void launch_fill_uniform(float* p, size_t n, uint64_t seed, float lo, float hi,
                         cudaStream_t stream) {
  fill(p, n, seed, lo, hi, stream);
}

}  // namespace troupe::gpu::bench
