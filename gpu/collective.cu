// Collective groups (gpu/collective.h): the ordered-sum kernel, the local (one device, one thread
// per rank) group and the NCCL rank.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/check.h"
#include "gpu/collective.h"
#include "gpu/comm.h"
#include "gpu/runtime.h"

namespace troupe::gpu {
namespace {

constexpr int kSumThreads = 256;
// A local rank waits this long for its peers at a rendezvous before it declares the group broken:
// TROUPE_GROUP_TIMEOUT_S seconds (the device check's tests use 15), else 120.
std::chrono::seconds local_peer_timeout() {
  static const std::chrono::seconds t = [] {
    const char* env = std::getenv("TROUPE_GROUP_TIMEOUT_S");
    const long v = env ? std::strtol(env, nullptr, 10) : 0;
    return std::chrono::seconds(v > 0 ? v : 120);
  }();
  return t;
}

__global__ void __launch_bounds__(kSumThreads)
    sum_parts_kernel(const float* parts, int n_parts, size_t stride, size_t count, float* out) {
  const size_t step = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += step) {
    float s = parts[i];
    for (int p = 1; p < n_parts; ++p) s = __fadd_rn(s, parts[static_cast<size_t>(p) * stride + i]);
    out[i] = s;
  }
}

int current_device() {
  int d = 0;
  TROUPE_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

[[noreturn]] void group_broken(const char* what) {
  throw DeviceError(Errc::kStepFailed, strfmt("GPU group: %s: the group was aborted (a rank's step "
                                              "failed or a peer stopped answering)",
                                              what));
}

// ---- local group -------------------------------------------------------------------------------

// What the ranks of a local group share: the device slots, one event pair per rank, and a
// rendezvous that abort() breaks.
struct LocalShared {
  int size = 0;
  size_t cap = 0;                         // floats per all-reduce
  size_t slot_bytes = 0;                  // per rank: max(cap floats, the all-to-all bytes)
  DeviceBuffer<uint8_t> slots;            // [size, slot_bytes]
  std::vector<std::vector<size_t>> sent;  // all_to_all: each rank's send counts of this call
  std::vector<cudaEvent_t> written, read_done;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  std::atomic<bool> broken{false};

  ~LocalShared() {
    for (cudaEvent_t e : written)
      if (e) cudaEventDestroy(e);
    for (cudaEvent_t e : read_done)
      if (e) cudaEventDestroy(e);
  }

  // Every rank arrives before any leaves; throws when the group is (or gets) broken.
  void rendezvous(const char* what) {
    std::unique_lock<std::mutex> lock(mu);
    if (broken) group_broken(what);
    const uint64_t gen = generation;
    if (++arrived == size) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return;
    }
    if (!cv.wait_for(lock, local_peer_timeout(), [&] { return generation != gen || broken; })) {
      broken = true;
      cv.notify_all();
    }
    if (generation == gen) group_broken(what);
  }

  void abort() noexcept {
    {
      std::lock_guard<std::mutex> lock(mu);
      broken = true;
    }
    cv.notify_all();
  }
};

class LocalRank final : public Collective {
 public:
  LocalRank(std::shared_ptr<LocalShared> s, int rank) : s_(std::move(s)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return s_->size; }
  size_t capacity() const override { return s_->cap; }

  void all_reduce_sum(float* data, size_t count, cudaStream_t stream) override {
    if (count > s_->cap)
      TROUPE_INPUT_ERROR("tensor-parallel all-reduce of %zu floats exceeds the group's %zu", count,
                         s_->cap);
    if (count == 0 || s_->size == 1) return;
    exchange("all-reduce", stream, data, count * sizeof(float), {}, [&] {
      // Every slot's copy summed in rank order into this rank's data.
      launch_sum_parts(reinterpret_cast<const float*>(s_->slots.get()), s_->size,
                       s_->slot_bytes / sizeof(float), count, data, stream);
    });
  }

  void all_to_all(const void* send, std::span<const size_t> send_bytes, void* recv,
                  std::span<const size_t> recv_bytes, cudaStream_t stream) override {
    const auto n = static_cast<size_t>(s_->size), r = static_cast<size_t>(rank_);
    if (send_bytes.size() != n || recv_bytes.size() != n)
      TROUPE_INPUT_ERROR("all_to_all: need %zu send and receive counts, got %zu and %zu", n,
                         send_bytes.size(), recv_bytes.size());
    size_t total = 0;
    for (size_t b : send_bytes) total += b;
    if (total > s_->slot_bytes)
      TROUPE_INPUT_ERROR("all_to_all of %zu bytes exceeds the group's %zu", total, s_->slot_bytes);
    exchange("all-to-all", stream, send, total, send_bytes, [&] {
      // Every count agreed before any copy: a mismatch breaks the group (its peers go on).
      for (size_t q = 0; q < n; ++q)
        if (s_->sent[q][r] != recv_bytes[q]) {
          const size_t theirs = s_->sent[q][r];
          s_->abort();
          TROUPE_INPUT_ERROR(
              "all_to_all: rank %zu expects %zu bytes from rank %zu, which sends %zu", r,
              recv_bytes[q], q, theirs);
        }
      // This rank's block out of every rank's slot (packed by receiver there).
      size_t at = 0;
      for (size_t q = 0; q < n; ++q) {
        size_t from = 0;
        for (size_t p = 0; p < r; ++p) from += s_->sent[q][p];
        if (recv_bytes[q] > 0)
          TROUPE_CUDA_CHECK(cudaMemcpyAsync(static_cast<uint8_t*>(recv) + at,
                                            s_->slots.get() + q * s_->slot_bytes + from,
                                            recv_bytes[q], cudaMemcpyDeviceToDevice, stream));
        at += recv_bytes[q];
      }
    });
  }
  size_t a2a_capacity() const override { return s_->slot_bytes; }

  void synchronize(cudaStream_t stream) override {
    // Peers are threads of this process: a missing one breaks the rendezvous, never the device.
    TROUPE_CUDA_CHECK(cudaStreamSynchronize(stream));
    if (s_->broken) group_broken("synchronize");
  }

  void abort() noexcept override { s_->abort(); }
  bool aborted() const override { return s_->broken; }

 private:
  // The protocol of both collectives. Rendezvous 1: every rank has queued its reads of the last
  // call's slots (read_done), so once those ran this rank's slot may be overwritten: it copies
  // `bytes` of `src` there and publishes `counts` (all-to-all). Rendezvous 2: every rank has
  // queued its write (written); after those, `read` queues this rank's reads of the slots. An
  // event is re-recorded only after every peer passed the rendezvous behind its last wait on it.
  template <class Read>
  void exchange(const char* what, cudaStream_t stream, const void* src, size_t bytes,
                std::span<const size_t> counts, Read read) {
    const auto n = static_cast<size_t>(s_->size), r = static_cast<size_t>(rank_);
    s_->rendezvous(what);
    // Every rank's reads of the last call, this rank's too (it may have used another stream).
    for (size_t p = 0; p < n; ++p)
      TROUPE_CUDA_CHECK(cudaStreamWaitEvent(stream, s_->read_done[p], 0));
    if (bytes > 0)
      TROUPE_CUDA_CHECK(cudaMemcpyAsync(s_->slots.get() + r * s_->slot_bytes, src, bytes,
                                        cudaMemcpyDeviceToDevice, stream));
    TROUPE_CUDA_CHECK(cudaEventRecord(s_->written[r], stream));
    s_->sent[r].assign(counts.begin(), counts.end());
    s_->rendezvous(what);
    for (size_t p = 0; p < n; ++p)
      if (p != r) TROUPE_CUDA_CHECK(cudaStreamWaitEvent(stream, s_->written[p], 0));
    read();
    TROUPE_CUDA_CHECK(cudaEventRecord(s_->read_done[r], stream));
  }

  std::shared_ptr<LocalShared> s_;
  int rank_;
};

// ---- NCCL rank ---------------------------------------------------------------------------------

}  // namespace

struct NcclGroupState {
  std::atomic<bool> broken{false};
  std::mutex mu;
  std::vector<Communicator*> comms;  // the live ranks' communicators

  void add(Communicator* c) {
    std::lock_guard<std::mutex> lock(mu);
    comms.push_back(c);
  }
  void remove(Communicator* c) {
    std::lock_guard<std::mutex> lock(mu);
    comms.erase(std::remove(comms.begin(), comms.end(), c), comms.end());
  }
  // Marks the group broken and aborts every communicator, one thread each (ncclCommAbort of a
  // group's ranks is collective within the node). Pending NCCL kernels then end.
  void abort_all() noexcept {
    if (broken.exchange(true)) return;
    std::lock_guard<std::mutex> lock(mu);
    std::vector<std::thread> t;
    for (Communicator* c : comms) {
      try {
        t.emplace_back([c] { c->abort(); });
      } catch (...) {
        c->abort();  // no thread left: abort here
      }
    }
    for (std::thread& th : t) th.join();
  }
};

std::shared_ptr<NcclGroupState> make_nccl_group_state() {
  return std::make_shared<NcclGroupState>();
}

namespace {

class NcclRank final : public Collective {
 public:
  // The buffers first: a failed allocation must not leave a joined communicator behind (its
  // destruction would wait for the other ranks).
  NcclRank(const CommId& id, int rank, int size, size_t capacity,
           std::shared_ptr<NcclGroupState> state)
      : device_(current_device()),
        cap_(capacity),
        slice_cap_((capacity + static_cast<size_t>(size) - 1) / static_cast<size_t>(size)),
        recv_(static_cast<size_t>(size) * slice_cap_),
        mine_(slice_cap_),
        gathered_(static_cast<size_t>(size) * slice_cap_),
        state_(state ? std::move(state) : make_nccl_group_state()),
        comm_(id, rank, size) {
    state_->add(&comm_);
  }
  ~NcclRank() override {
    state_->remove(&comm_);
    cudaSetDevice(device_);  // destroy_group runs this on a thread of its own
  }

  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  size_t capacity() const override { return cap_; }

  // Reduce-scatter: data's slice p (slice = ceil(count / size) elements, the last ones shorter)
  // goes to rank p, which receives its slice from every rank, packed by rank (the self copy
  // included), and sums them in rank order. All-gather of the padded slices, then the first
  // `count` floats back into data.
  void all_reduce_sum(float* data, size_t count, cudaStream_t stream) override {
    if (state_->broken) group_broken("all-reduce");
    if (count > cap_)
      TROUPE_INPUT_ERROR("tensor-parallel all-reduce of %zu floats exceeds the group's %zu", count,
                         cap_);
    const int n = comm_.size();
    if (count == 0 || n == 1) return;
    const size_t slice = (count + static_cast<size_t>(n) - 1) / static_cast<size_t>(n);
    auto len = [&](int p) {
      const size_t at = static_cast<size_t>(p) * slice;
      return at >= count ? size_t{0} : std::min(slice, count - at);
    };
    std::vector<size_t> send_counts(static_cast<size_t>(n)), recv_counts(static_cast<size_t>(n));
    const size_t own = len(comm_.rank());
    for (int p = 0; p < n; ++p) {
      send_counts[static_cast<size_t>(p)] = len(p);
      recv_counts[static_cast<size_t>(p)] = own;
    }
    comm_.all_to_all(data, send_counts, recv_.get(), recv_counts, CommType::kF32, stream);
    if (own > 0) launch_sum_parts(recv_.get(), n, own, own, mine_.get(), stream);
    if (own < slice)
      TROUPE_CUDA_CHECK(
          cudaMemsetAsync(mine_.get() + own, 0, (slice - own) * sizeof(float), stream));
    comm_.all_gather(mine_.get(), slice, gathered_.get(), stream);
    TROUPE_CUDA_CHECK(cudaMemcpyAsync(data, gathered_.get(), count * sizeof(float),
                                      cudaMemcpyDeviceToDevice, stream));
  }

  void all_to_all(const void* send, std::span<const size_t> send_bytes, void* recv,
                  std::span<const size_t> recv_bytes, cudaStream_t stream) override {
    if (state_->broken) group_broken("all-to-all");
    comm_.all_to_all(send, send_bytes, recv, recv_bytes, CommType::kUint8, stream);
  }
  size_t a2a_capacity() const override { return SIZE_MAX; }

  void synchronize(cudaStream_t stream) override {
    for (;;) {
      const cudaError_t q = cudaStreamQuery(stream);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) TROUPE_CUDA_CHECK(q);
      if (state_->broken) group_broken("synchronize");
      comm_.check_async_error();
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  void abort() noexcept override { state_->abort_all(); }
  bool aborted() const override { return state_->broken; }

 private:
  int device_;
  size_t cap_, slice_cap_;
  DeviceBuffer<float> recv_;      // f32 [size, slice]: this rank's slice from every rank
  DeviceBuffer<float> mine_;      // f32 [slice]: its sum
  DeviceBuffer<float> gathered_;  // f32 [size, slice]
  std::shared_ptr<NcclGroupState> state_;
  Communicator comm_;  // last: destroyed first, joined last
};

}  // namespace

void launch_sum_parts(const float* parts, int n_parts, size_t stride, size_t count, float* out,
                      cudaStream_t stream) {
  if (count == 0) return;
  if (n_parts < 1 || stride < count || !parts || !out)
    TROUPE_INPUT_ERROR("launch_sum_parts: %d parts of stride %zu for %zu floats (%p -> %p)",
                       n_parts, stride, count, static_cast<const void*>(parts),
                       static_cast<void*>(out));
  const size_t blocks = std::min<size_t>((count + kSumThreads - 1) / kSumThreads, 4096);
  sum_parts_kernel<<<static_cast<unsigned>(blocks), kSumThreads, 0, stream>>>(parts, n_parts,
                                                                              stride, count, out);
  TROUPE_CUDA_CHECK_LAUNCH();
}

std::vector<std::unique_ptr<Collective>> make_local_group(int size, size_t capacity,
                                                          size_t a2a_bytes) {
  if (size < 1) TROUPE_INPUT_ERROR("make_local_group: size %d must be at least 1", size);
  auto s = std::make_shared<LocalShared>();
  s->size = size;
  s->cap = capacity;
  s->slot_bytes = (std::max(capacity * sizeof(float), a2a_bytes) + 255) / 256 * 256;
  s->slots = DeviceBuffer<uint8_t>(static_cast<size_t>(size) * s->slot_bytes);
  s->sent.assign(static_cast<size_t>(size), std::vector<size_t>(static_cast<size_t>(size), 0));
  s->written.assign(static_cast<size_t>(size), nullptr);
  s->read_done.assign(static_cast<size_t>(size), nullptr);
  for (int p = 0; p < size; ++p) {
    TROUPE_CUDA_CHECK(
        cudaEventCreateWithFlags(&s->written[static_cast<size_t>(p)], cudaEventDisableTiming));
    TROUPE_CUDA_CHECK(
        cudaEventCreateWithFlags(&s->read_done[static_cast<size_t>(p)], cudaEventDisableTiming));
  }
  std::vector<std::unique_ptr<Collective>> ranks;
  for (int p = 0; p < size; ++p) ranks.push_back(std::make_unique<LocalRank>(s, p));
  return ranks;
}

std::unique_ptr<Collective> make_nccl_rank(const CommId& id, int rank, int size, size_t capacity,
                                           std::shared_ptr<NcclGroupState> state) {
  return std::make_unique<NcclRank>(id, rank, size, capacity, std::move(state));
}

void destroy_group(std::vector<std::unique_ptr<Collective>>& group) noexcept {
  std::vector<std::thread> t;
  for (auto& r : group) {
    if (!r) continue;
    try {
      t.emplace_back([&r] { r.reset(); });
    } catch (...) {
      r.reset();
    }
  }
  for (std::thread& th : t) th.join();
  group.clear();
}

}  // namespace troupe::gpu
