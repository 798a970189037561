// Communicator over NCCL (see gpu/comm.h). Every NCCL call is checked; failures carry NCCL's
// code string and its last-error text.
#include "gpu/comm.h"

#include <nccl.h>

#include <cstring>
#include <string>

#include "base/check.h"
#include "gpu/runtime.h"

namespace troupe::gpu {
namespace {

[[noreturn]] void throw_nccl(ncclResult_t r, const std::string& call, ncclComm_t comm) {
  const char* last = ncclGetLastError(comm);
  throw DeviceError(Errc::kNccl,
                    strfmt("%s failed: %s (%d)%s%s", call.c_str(), ncclGetErrorString(r),
                           static_cast<int>(r), last && *last ? ": " : "", last ? last : ""));
}

void nccl_check(ncclResult_t r, const char* call, ncclComm_t comm) {
  if (r != ncclSuccess) throw_nccl(r, call, comm);
}

ncclDataType_t nccl_type(CommType t) {
  switch (t) {
    case CommType::kF32:
      return ncclFloat32;
    case CommType::kBf16:
      return ncclBfloat16;
    case CommType::kInt32:
      return ncclInt32;
    case CommType::kUint8:
      return ncclUint8;
  }
  TROUPE_INPUT_ERROR("Communicator: unknown element type %d", static_cast<int>(t));
}

size_t type_bytes(CommType t) {
  switch (t) {
    case CommType::kF32:
    case CommType::kInt32:
      return 4;
    case CommType::kBf16:
      return 2;
    case CommType::kUint8:
      return 1;
  }
  TROUPE_INPUT_ERROR("Communicator: unknown element type %d", static_cast<int>(t));
}

}  // namespace

CommId CommId::create() {
  ncclUniqueId id;
  nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId", nullptr);
  static_assert(sizeof(id.internal) == kBytes, "ncclUniqueId is not 128 bytes");
  CommId out;
  std::memcpy(out.bytes.data(), id.internal, kBytes);
  return out;
}

CommId CommId::from_bytes(std::span<const uint8_t> b) {
  if (b.size() != kBytes)
    TROUPE_INPUT_ERROR("CommId: expected %zu bytes (an ncclUniqueId), got %zu", kBytes, b.size());
  CommId out;
  std::memcpy(out.bytes.data(), b.data(), kBytes);
  return out;
}

Communicator::Communicator(const CommId& id, int rank, int size) : rank_(rank), size_(size) {
  if (size < 1 || rank < 0 || rank >= size)
    TROUPE_INPUT_ERROR("Communicator: need 0 <= rank < size and size >= 1, got rank=%d size=%d",
                       rank, size);
  ncclUniqueId nid;
  std::memcpy(nid.internal, id.bytes.data(), CommId::kBytes);
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRank(&comm, size, nid, rank);
  if (r != ncclSuccess) {
    const std::string call = strfmt("ncclCommInitRank(rank=%d, size=%d)", rank, size);
    const char* last = comm ? ncclGetLastError(comm) : nullptr;
    const std::string detail = last && *last ? std::string(": ") + last : std::string();
    if (comm) ncclCommAbort(comm);  // a half-made communicator is not ours to keep
    throw DeviceError(Errc::kNccl,
                      strfmt("%s failed: %s (%d)%s", call.c_str(), ncclGetErrorString(r),
                             static_cast<int>(r), detail.c_str()));
  }
  comm_ = comm;
}

Communicator::~Communicator() {
  if (!comm_.load()) return;
  // After an asynchronous error a peer may be gone: destroying would wait for it forever.
  if (broken_)
    ncclCommAbort(comm_);
  else
    ncclCommDestroy(comm_);
}

void Communicator::all_reduce_sum(float* data, size_t count, cudaStream_t stream) {
  require_live("all_reduce_sum");
  if (count == 0) return;
  if (!data) TROUPE_INPUT_ERROR("Communicator::all_reduce_sum: null data for %zu floats", count);
  const ncclResult_t r = ncclAllReduce(data, data, count, ncclFloat32, ncclSum, comm_, stream);
  if (r != ncclSuccess) throw_nccl(r, strfmt("ncclAllReduce(f32, count=%zu)", count), comm_);
}

void Communicator::all_reduce_sum(__nv_bfloat16* data, size_t count, cudaStream_t stream) {
  require_live("all_reduce_sum");
  if (count == 0) return;
  if (!data) TROUPE_INPUT_ERROR("Communicator::all_reduce_sum: null data for %zu bf16", count);
  const ncclResult_t r = ncclAllReduce(data, data, count, ncclBfloat16, ncclSum, comm_, stream);
  if (r != ncclSuccess) throw_nccl(r, strfmt("ncclAllReduce(bf16, count=%zu)", count), comm_);
}

void Communicator::all_to_all(const void* send, std::span<const size_t> send_counts, void* recv,
                              std::span<const size_t> recv_counts, CommType type,
                              cudaStream_t stream) {
  require_live("all_to_all");
  if (send_counts.size() != static_cast<size_t>(size_) ||
      recv_counts.size() != static_cast<size_t>(size_))
    TROUPE_INPUT_ERROR(
        "Communicator::all_to_all: need one count per rank (%d), got %zu send and %zu recv counts",
        size_, send_counts.size(), recv_counts.size());
  const ncclDataType_t dt = nccl_type(type);
  const size_t elem = type_bytes(type);
  size_t send_total = 0, recv_total = 0;
  for (int p = 0; p < size_; ++p) {
    send_total += send_counts[static_cast<size_t>(p)];
    recv_total += recv_counts[static_cast<size_t>(p)];
  }
  if ((send_total && !send) || (recv_total && !recv))
    TROUPE_INPUT_ERROR("Communicator::all_to_all: null buffer (send=%p for %zu, recv=%p for %zu)",
                       send, send_total, recv, recv_total);
  nccl_check(ncclGroupStart(), "ncclGroupStart", comm_);
  // Close the group whatever happens inside it; report the first failure.
  ncclResult_t first = ncclSuccess;
  std::string first_call;
  size_t send_at = 0, recv_at = 0;
  for (int p = 0; p < size_ && first == ncclSuccess; ++p) {
    const size_t sc = send_counts[static_cast<size_t>(p)];
    const size_t rc = recv_counts[static_cast<size_t>(p)];
    if (sc) {
      const ncclResult_t r =
          ncclSend(static_cast<const char*>(send) + send_at * elem, sc, dt, p, comm_, stream);
      if (r != ncclSuccess) {
        first = r;
        first_call = strfmt("ncclSend(peer=%d, count=%zu)", p, sc);
      }
    }
    if (rc && first == ncclSuccess) {
      const ncclResult_t r =
          ncclRecv(static_cast<char*>(recv) + recv_at * elem, rc, dt, p, comm_, stream);
      if (r != ncclSuccess) {
        first = r;
        first_call = strfmt("ncclRecv(peer=%d, count=%zu)", p, rc);
      }
    }
    send_at += sc;
    recv_at += rc;
  }
  const ncclResult_t end = ncclGroupEnd();
  if (first != ncclSuccess) throw_nccl(first, first_call, comm_);
  nccl_check(end, "ncclGroupEnd (all_to_all)", comm_);
}

void Communicator::all_gather(const float* send, size_t count, float* recv, cudaStream_t stream) {
  require_live("all_gather");
  if (count == 0) return;
  if (!send || !recv)
    TROUPE_INPUT_ERROR("Communicator::all_gather: null buffer (send=%p, recv=%p) for %zu floats",
                       static_cast<const void*>(send), static_cast<void*>(recv), count);
  const ncclResult_t r = ncclAllGather(send, recv, count, ncclFloat32, comm_, stream);
  if (r != ncclSuccess) throw_nccl(r, strfmt("ncclAllGather(f32, count=%zu)", count), comm_);
}

void Communicator::require_live(const char* what) const {
  if (comm_.load() == nullptr)
    throw DeviceError(Errc::kNccl,
                      strfmt("Communicator::%s: the communicator was aborted (the group's step "
                             "failed on a rank)",
                             what));
}

void Communicator::abort() noexcept {
  ncclComm* c = comm_.exchange(nullptr);
  if (c) ncclCommAbort(c);
}

void Communicator::check_async_error() {
  require_live("check_async_error");
  ncclResult_t async = ncclSuccess;
  nccl_check(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError", comm_);
  if (async != ncclSuccess && async != ncclInProgress) {
    broken_ = true;
    throw_nccl(async, "asynchronous NCCL operation", comm_);
  }
}

}  // namespace troupe::gpu
