// Collective: a group of GPU engine ranks as one rank sees it, with the two exchanges the forward
// pass needs. Tensor parallelism (a rank holds a share of every layer) sums the ranks' partial
// outputs: deterministic and batch-invariant, each element summed in rank order
// (((d0 + d1) + d2) + ...) with plain f32 adds whatever the element count, the algorithm or the
// number of GPUs, every rank getting the same bits. Expert parallelism with data-parallel
// attention (each rank its own tokens, a share of the experts) sends MoE rows to their experts'
// ranks and back with all_to_all.
// Two kinds of group:
//  - NCCL (make_nccl_rank): one rank per GPU, each used from its own thread or process. The sum is
//    a reduce-scatter by grouped send/recv (rank r sums slice r of everyone's data in rank order),
//    then an all-gather: the bytes of a ring all-reduce, with a fixed order NCCL's own all-reduce
//    does not promise (its order depends on the message size, so on the batch). all_to_all is
//    one group of ncclSend/ncclRecv.
//  - Local (make_local_group): all ranks on one device in one process, one thread each,
//    exchanging through shared device slots. A stand-in for a multi-GPU host where a machine has
//    one GPU (NCCL refuses two ranks on one device): the engine runs exactly the multi-GPU code
//    path with the same arithmetic, so its tests run on a single GPU.
// Users: GpuEngine (gpu/engine.h, GpuEngineOptions::tp and ::ep), MoeForward::run_dispatch
// (gpu/moe.h) and GpuTpEngine (gpu/tp_engine.h).
// Thread safety: one rank object per thread; abort() may be called from any thread.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <span>
#include <vector>

namespace troupe::gpu {

struct CommId;

class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Most floats one all_reduce_sum takes.
  virtual size_t capacity() const = 0;

  /// In place: data[i] = the sum over ranks of data[i], in rank order (see above). f32 [count] on
  /// this rank's device, count <= capacity(); every rank calls with the same count, calls in the
  /// same order. Enqueued on `stream` (returns before the device has done it). Throws
  /// DeviceError: kNccl for an NCCL failure, kStepFailed when the group was aborted or a peer
  /// did not arrive within the local group's timeout; InputError when count > capacity().
  virtual void all_reduce_sum(float* data, size_t count, cudaStream_t stream) = 0;

  /// Expert dispatch and combine: sends send_bytes[p] bytes to rank p and receives recv_bytes[p]
  /// bytes from rank p, both packed by rank (rank p's block starts at the sum of the counts of
  /// the ranks before p; the block for oneself is copied). Rank q's recv_bytes[p] must equal
  /// rank p's send_bytes[q]. Every rank calls, with its own counts (zeros allowed). Enqueued on
  /// `stream`. Throws DeviceError as all_reduce_sum; InputError for wrong span sizes, a count
  /// mismatch the group can see, or more than a2a_capacity() bytes to send.
  virtual void all_to_all(const void* send, std::span<const size_t> send_bytes, void* recv,
                          std::span<const size_t> recv_bytes, cudaStream_t stream) = 0;
  /// Most bytes one rank sends in one all_to_all (SIZE_MAX where the group has no limit).
  virtual size_t a2a_capacity() const = 0;

  /// Waits until `stream` has run everything queued so far, watching the group: throws
  /// DeviceError when the group is aborted or NCCL reports an asynchronous error meanwhile,
  /// instead of waiting forever on a peer that will never send.
  virtual void synchronize(cudaStream_t stream) = 0;

  /// Breaks the group for every rank (after one rank failed mid-step, so that the others stop
  /// waiting for it): pending and later calls on any rank throw. Idempotent; any thread.
  virtual void abort() noexcept = 0;
  virtual bool aborted() const = 0;
};

/// `size` ranks of one group on the current device, for `size` threads of this process.
/// capacity: most floats per all_reduce_sum; a2a_bytes: most bytes a rank sends in one
/// all_to_all (GpuEngineOptions::ep says what an engine needs). Allocates size slots of the
/// larger of the two. Throws InputError for size < 1, DeviceError.
std::vector<std::unique_ptr<Collective>> make_local_group(int size, size_t capacity,
                                                          size_t a2a_bytes = 0);

/// What the NCCL ranks of one process share: abort() on any of them marks the group broken and
/// aborts every rank's communicator (each from its own thread, as NCCL asks), so that ranks
/// waiting on a peer's sums stop instead of waiting forever. Ranks in other processes are not
/// reached (they see NCCL's own errors).
struct NcclGroupState;
std::shared_ptr<NcclGroupState> make_nccl_group_state();

/// Rank `rank` of an NCCL group of `size` on the current device (one GPU per rank); blocks until
/// every rank has joined (ncclCommInitRank). `state`: shared by the group's ranks in this
/// process (null: this rank alone). Allocates about 2 * capacity floats of device memory first,
/// then joins. Throws InputError, DeviceError(kNccl).
std::unique_ptr<Collective> make_nccl_rank(const CommId& id, int rank, int size, size_t capacity,
                                           std::shared_ptr<NcclGroupState> state = nullptr);

/// Destroys the ranks of a group held by one thread, each on a thread of its own at once: NCCL's
/// communicator destruction is collective (each rank waits for the others), so destroying them
/// one after another from one thread would wait forever. Leaves `group` empty.
void destroy_group(std::vector<std::unique_ptr<Collective>>& group) noexcept;

/// out[i] = ((parts[0*stride + i] + parts[1*stride + i]) + ...) over n_parts, i < count: the
/// group's ordered sum (exposed for tests). out may be one of the parts. Throws InputError.
void launch_sum_parts(const float* parts, int n_parts, size_t stride, size_t count, float* out,
                      cudaStream_t stream);

}  // namespace troupe::gpu
