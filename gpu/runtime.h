// The GPU runtime pieces every kernel and actor uses: error checking, a device memory arena
// allocated once at start (no cudaMalloc on the hot path), owned buffers for set-up and tests,
// and the compute/communication stream pair a stage or expert-shard actor owns.
// Errors: CUDA, cuBLAS and NCCL failures throw DeviceError with the call, file and line; public
// entry points of the backend catch it and return a Result.
// Thread safety: an Arena, a DeviceBuffer or a StreamPair belongs to one actor at a time.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace troupe::gpu {

/// Error codes of the GPU backend (Error::code). Pinned numbers: they are logged and compared.
enum class Errc : int {
  kCuda = 1,
  kCublas = 2,
  kNccl = 3,
  kOutOfMemory = 4,
  kNoDevice = 5,
  kBadInput = 6,    // bad options, an unsupported model, a malformed step
  kStepFailed = 7,  // the forward pass failed after it started (the message says where)
};

class DeviceError : public std::runtime_error {
 public:
  DeviceError(Errc code, const std::string& what) : std::runtime_error(what), code_(code) {}
  Errc code() const { return code_; }

 private:
  Errc code_;
};

[[noreturn]] void throw_cuda(cudaError_t err, const char* call, const char* file, int line);

/// Checks a CUDA runtime call; throws DeviceError naming the call on failure.
#define TROUPE_CUDA_CHECK(call)                                               \
  do {                                                                        \
    const cudaError_t troupe_cuda_err_ = (call);                              \
    if (troupe_cuda_err_ != cudaSuccess)                                      \
      ::troupe::gpu::throw_cuda(troupe_cuda_err_, #call, __FILE__, __LINE__); \
  } while (0)

/// Checks the last kernel launch (launch configuration errors surface here, not at the <<<>>>).
#define TROUPE_CUDA_CHECK_LAUNCH() TROUPE_CUDA_CHECK(cudaGetLastError())

/// True when a CUDA device can be used; else false with the reason (no driver, no device).
/// cudaGetDeviceCount can fail with a count of 0 (no driver): both mean "no GPU".
bool gpu_available(std::string* why);

/// A device memory region allocated once, handed out by bumping an offset (256-byte aligned).
/// reset() returns everything at once (per-step workspaces); mark()/rewind() nest scopes.
class Arena {
 public:
  Arena() = default;
  /// Allocates `bytes` of device memory on the current device. Throws DeviceError.
  explicit Arena(size_t bytes);
  ~Arena();
  Arena(Arena&& o) noexcept { *this = std::move(o); }
  Arena& operator=(Arena&& o) noexcept;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  /// Device pointer to `bytes` bytes; throws DeviceError(kOutOfMemory) naming `what` when the
  /// arena is full.
  void* allocate(size_t bytes, const char* what = "buffer");
  template <class T>
  T* allocate_n(size_t n, const char* what = "buffer") {
    return static_cast<T*>(allocate(n * sizeof(T), what));
  }
  size_t mark() const { return used_; }
  void rewind(size_t mark) { used_ = mark; }
  void reset() { used_ = 0; }
  size_t used() const { return used_; }
  size_t capacity() const { return capacity_; }
  size_t high_water() const { return high_water_; }

 private:
  char* base_ = nullptr;
  size_t capacity_ = 0, used_ = 0, high_water_ = 0;
};

/// Gives an arena's scratch back when a scope ends (returns or throws): rewinds to the mark taken
/// at construction. Stream order keeps the memory safe for later users on the same stream.
class ArenaScope {
 public:
  explicit ArenaScope(Arena& a) : arena_(a), mark_(a.mark()) {}
  ~ArenaScope() { arena_.rewind(mark_); }
  ArenaScope(const ArenaScope&) = delete;
  ArenaScope& operator=(const ArenaScope&) = delete;

 private:
  Arena& arena_;
  size_t mark_;
};

/// An owned device allocation of n elements of T (set-up, weights, tests; not the hot path).
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (n) TROUPE_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)));
  }
  ~DeviceBuffer() {
    if (p_) cudaFree(p_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      if (p_) cudaFree(p_);
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }

  // upload/download/fill_bytes are for set-up and tests, not the hot path: each waits for the
  // whole device first and after, so they are ordered with work on any stream, including the
  // non-blocking streams of a StreamPair (which the legacy default stream does not wait for).
  void upload(const std::vector<T>& host) {
    if (host.size() != n_) throw DeviceError(Errc::kCuda, "DeviceBuffer::upload: size mismatch");
    if (!n_) return;
    TROUPE_CUDA_CHECK(cudaDeviceSynchronize());
    TROUPE_CUDA_CHECK(cudaMemcpy(p_, host.data(), bytes(), cudaMemcpyHostToDevice));
    TROUPE_CUDA_CHECK(cudaDeviceSynchronize());
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    if (!n_) return host;
    TROUPE_CUDA_CHECK(cudaDeviceSynchronize());
    TROUPE_CUDA_CHECK(cudaMemcpy(host.data(), p_, bytes(), cudaMemcpyDeviceToHost));
    return host;
  }
  /// Fills every byte with `byte` (0xFF makes every f32/bf16/f16 element a NaN: tests poison
  /// outputs with it so that an element a kernel never writes fails the comparison).
  void fill_bytes(int byte) {
    if (!n_) return;
    TROUPE_CUDA_CHECK(cudaDeviceSynchronize());
    TROUPE_CUDA_CHECK(cudaMemset(p_, byte, bytes()));
    TROUPE_CUDA_CHECK(cudaDeviceSynchronize());
  }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

/// The two streams of a compute actor: kernels go on `compute`, NCCL and host transfers on
/// `comm`; events order them without blocking the host.
class StreamPair {
 public:
  StreamPair();  // non-blocking streams on the current device; throws DeviceError
  ~StreamPair();
  StreamPair(const StreamPair&) = delete;
  StreamPair& operator=(const StreamPair&) = delete;

  cudaStream_t compute() const { return compute_; }
  cudaStream_t comm() const { return comm_; }
  /// Makes `comm` wait for the work queued on `compute` so far (and the reverse).
  void comm_waits_for_compute();
  void compute_waits_for_comm();

 private:
  cudaStream_t compute_ = nullptr, comm_ = nullptr;
  cudaEvent_t compute_done_ = nullptr, comm_done_ = nullptr;
};

}  // namespace troupe::gpu
