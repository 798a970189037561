// Communicator: a thin NCCL wrapper for tensor-parallel all-reduce and expert-parallel
// all-to-all between the GPUs of a stage. The id travels as 128 plain bytes (a Cap'n Proto Data
// field); each rank joins from its own thread or process.
// Thread safety: one Communicator per rank, used from one thread; operations are enqueued on
// the stream given (the stage's comm stream) and complete asynchronously.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>

struct ncclComm;  // nccl.h: typedef struct ncclComm* ncclComm_t

namespace troupe::gpu {

/// A communicator's identity (ncclUniqueId, 128 bytes): made once by one rank, sent to the rest.
struct CommId {
  static constexpr size_t kBytes = 128;
  std::array<uint8_t, kBytes> bytes{};

  /// A fresh id (ncclGetUniqueId: opens the bootstrap listener on this host). Throws
  /// DeviceError(kNccl) with NCCL's message.
  static CommId create();
  /// The id from its serialized bytes. Throws InputError unless `b` has exactly 128 bytes.
  static CommId from_bytes(std::span<const uint8_t> b);
  std::span<const uint8_t> as_bytes() const { return bytes; }
  bool operator==(const CommId&) const = default;
};

/// Element types of all_to_all (counts are in elements of this type).
enum class CommType : uint8_t { kF32 = 0, kBf16 = 1, kInt32 = 2, kUint8 = 3 };

class Communicator {
 public:
  /// Joins communicator `id` as `rank` of `size` on the current CUDA device; blocks until all
  /// `size` ranks have joined. Throws InputError (rank/size out of range), DeviceError(kNccl).
  Communicator(const CommId& id, int rank, int size);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  /// In place: data[i] = sum over ranks of data[i] (every rank gets the same bits). f32 [count]
  /// or bf16 [count] on this rank's device. Enqueued on `stream`. Throws DeviceError(kNccl).
  void all_reduce_sum(float* data, size_t count, cudaStream_t stream);
  void all_reduce_sum(__nv_bfloat16* data, size_t count, cudaStream_t stream);

  /// Sends send_counts[p] elements to rank p and receives recv_counts[p] elements from rank p,
  /// packed by peer: peer p's block starts at the sum of the counts of peers before p, in `send`
  /// and in `recv` alike (sending to oneself copies). Rank q's recv_counts[p] must equal rank p's
  /// send_counts[q]. Both spans have size() entries (InputError otherwise). One NCCL group of
  /// ncclSend/ncclRecv on `stream`; zero counts are skipped. Throws DeviceError(kNccl).
  void all_to_all(const void* send, std::span<const size_t> send_counts, void* recv,
                  std::span<const size_t> recv_counts, CommType type, cudaStream_t stream);

  /// recv[p * count + i] = rank p's send[i] for every rank p (ncclAllGather): f32 [count] in,
  /// f32 [size * count] out on this rank's device. Enqueued on `stream`. Throws DeviceError(kNccl).
  void all_gather(const float* send, size_t count, float* recv, cudaStream_t stream);

  /// Throws DeviceError(kNccl) when NCCL reports an asynchronous error (a peer failed, a network
  /// error) on this communicator; otherwise returns. After such an error the destructor aborts
  /// the communicator instead of waiting for its peers.
  void check_async_error();

  /// Aborts the communicator now (ncclCommAbort: pending operations of this rank end, peers see
  /// an error); every later call throws DeviceError(kNccl). For a group whose step failed on
  /// another rank. Call from any thread; idempotent.
  void abort() noexcept;

 private:
  void require_live(const char* what) const;  // throws DeviceError(kNccl) after abort()
  std::atomic<ncclComm*> comm_{nullptr};      // null after abort()
  int rank_ = 0, size_ = 0;
  bool broken_ = false;  // an asynchronous error was seen: the destructor aborts
};

}  // namespace troupe::gpu
