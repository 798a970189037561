// GpuTpEngine (gpu/tp_engine.h): the group's set-up (communicators, then one GpuEngine per rank)
// and the fan-out of each step to the ranks: rank 0 on the caller's thread, every other rank on a
// worker thread of its own that lives as long as the engine.
#include "gpu/tp_engine.h"

#include <condition_variable>
#include <cstddef>
#include <exception>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "base/check.h"
#include "gpu/collective.h"
#include "gpu/comm.h"
#include "gpu/runtime.h"

namespace troupe::gpu {

namespace {

constexpr int kErrBadInput = static_cast<int>(Errc::kBadInput);

std::string device_list(const std::vector<int>& d) {
  std::string s;
  for (size_t i = 0; i < d.size(); ++i) s += (i ? "," : "") + std::to_string(d[i]);
  return s;
}

}  // namespace

struct GpuTpEngine::Impl {
  std::vector<int> devices;
  bool nccl = false;
  std::vector<std::unique_ptr<Collective>> group;  // one per rank; empty for a group of one
  std::vector<std::unique_ptr<GpuEngine>> ranks;

  // The step being run by the workers (ranks 1..size-1).
  std::mutex mu;
  std::condition_variable job_cv, done_cv;
  uint64_t job = 0;
  int pending = 0;
  bool stop = false;
  std::span<const compute::SeqStep> seqs;
  const float* hidden_in = nullptr;
  std::vector<compute::StepResult> outs;
  std::vector<std::vector<float>> hiddens;
  std::vector<std::optional<Status>> results;
  std::vector<std::thread> workers;

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    job_cv.notify_all();
    for (std::thread& t : workers) t.join();
    ranks.clear();         // engines before the collectives they point to
    destroy_group(group);  // NCCL: collective, every rank at once
  }

  void work(size_t r) {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu);
        job_cv.wait(lock, [&] { return stop || job != seen; });
        if (stop) return;
        seen = job;
      }
      std::vector<float>* hidden = ranks[r]->range().head ? nullptr : &hiddens[r];
      Status st = Error{static_cast<int>(Errc::kStepFailed), "rank step threw"};
      try {
        st = ranks[r]->step(seqs, &outs[r], hidden_in, hidden);
      } catch (const std::exception& ex) {  // step() catches its own; this is bad_alloc & co.
        group[r]->abort();
        st = Error{static_cast<int>(Errc::kStepFailed), ex.what()};
      }
      std::lock_guard<std::mutex> lock(mu);
      results[r] = std::move(st);
      if (--pending == 0) done_cv.notify_all();
    }
  }
};

GpuTpEngine::GpuTpEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GpuTpEngine::~GpuTpEngine() = default;

Result<std::unique_ptr<GpuTpEngine>> GpuTpEngine::create(std::shared_ptr<const model::Model> model,
                                                         const GpuEngineOptions& opts,
                                                         std::vector<int> devices) {
  if (devices.empty()) return Error{kErrBadInput, "GpuTpEngine: no devices"};
  if (!model) return Error{kErrBadInput, "GpuTpEngine: no model"};
  const std::set<int> distinct(devices.begin(), devices.end());
  const int n = static_cast<int>(devices.size());
  if (distinct.size() != 1 && distinct.size() != devices.size())
    return Error{kErrBadInput,
                 strfmt("GpuTpEngine: devices %s: a tensor-parallel group uses one GPU per rank "
                        "(all different) or one GPU for every rank (the one-GPU stand-in), not "
                        "a mix",
                        device_list(devices).c_str())};
  auto impl = std::make_unique<Impl>();
  Impl& m = *impl;
  m.devices = devices;
  m.nccl = n > 1 && distinct.size() == devices.size();
  const size_t capacity = static_cast<size_t>(std::max<int64_t>(opts.max_step_tokens, 1)) *
                          static_cast<size_t>(std::max<int64_t>(model->spec.n_embd, 1));
  m.ranks.resize(static_cast<size_t>(n));
  std::vector<std::optional<Error>> errors(static_cast<size_t>(n));

  // Rank r's engine on its device; errors say which rank and GPU.
  auto make_rank = [&](int r) {
    const auto ru = static_cast<size_t>(r);
    GpuEngineOptions o = opts;
    o.device = devices[ru];
    o.tp = n > 1 ? m.group[ru].get() : nullptr;
    auto e = GpuEngine::create(model, o);
    if (e)
      m.ranks[ru] = std::move(*e);
    else
      errors[ru] = Error{e.error().code, strfmt("rank %d of %d on GPU %d: %s", r, n, devices[ru],
                                                e.error().message.c_str())};
  };

  try {
    std::string why;
    if (!gpu_available(&why))
      return Error{static_cast<int>(Errc::kNoDevice), "GpuTpEngine: no usable CUDA GPU: " + why};
    int count = 0;
    TROUPE_CUDA_CHECK(cudaGetDeviceCount(&count));
    for (int d : devices)
      if (d < 0 || d >= count)
        return Error{kErrBadInput,
                     strfmt("GpuTpEngine: device %d does not exist (%d CUDA devices)", d, count)};
    if (n == 1) {
      make_rank(0);
    } else if (!m.nccl) {
      TROUPE_CUDA_CHECK(cudaSetDevice(devices[0]));
      m.group = make_local_group(n, capacity);
      for (int r = 0; r < n; ++r) make_rank(r);  // one after another: they share the memory
    } else {
      // Every rank joins the communicator from its own thread (ncclCommInitRank blocks until all
      // have), then builds its engine there.
      const CommId id = CommId::create();
      const auto state = make_nccl_group_state();
      m.group.resize(static_cast<size_t>(n));
      std::vector<std::thread> joiners;
      for (int r = 0; r < n; ++r) {
        joiners.emplace_back([&, r] {
          const auto ru = static_cast<size_t>(r);
          try {
            TROUPE_CUDA_CHECK(cudaSetDevice(devices[ru]));
            m.group[ru] = make_nccl_rank(id, r, n, capacity, state);
          } catch (const DeviceError& ex) {
            errors[ru] = Error{static_cast<int>(ex.code()),
                               strfmt("rank %d of %d on GPU %d: %s", r, n, devices[ru], ex.what())};
            return;
          } catch (const std::exception& ex) {
            errors[ru] = Error{kErrBadInput,
                               strfmt("rank %d of %d on GPU %d: %s", r, n, devices[ru], ex.what())};
            return;
          }
          make_rank(r);
        });
      }
      for (std::thread& t : joiners) t.join();
    }
  } catch (const DeviceError& ex) {
    return Error{static_cast<int>(ex.code()), std::string("GpuTpEngine: ") + ex.what()};
  } catch (const std::exception& ex) {
    return Error{kErrBadInput, std::string("GpuTpEngine: ") + ex.what()};
  }
  for (auto& e : errors)
    if (e) return Error{e->code, "GpuTpEngine: " + e->message};

  m.outs.resize(static_cast<size_t>(n));
  m.hiddens.resize(static_cast<size_t>(n));
  m.results.resize(static_cast<size_t>(n));
  for (int r = 1; r < n; ++r) m.workers.emplace_back([&m, r] { m.work(static_cast<size_t>(r)); });
  return std::unique_ptr<GpuTpEngine>(new GpuTpEngine(std::move(impl)));
}

Status GpuTpEngine::step(std::span<const compute::SeqStep> seqs, compute::StepResult* out,
                         const float* hidden_in, std::vector<float>* hidden_out) {
  Impl& m = *impl_;
  const size_t n = m.ranks.size();
  if (n == 1) return m.ranks[0]->step(seqs, out, hidden_in, hidden_out);
  // Refused before any rank starts: every rank checks the same things (same steps, same sizes;
  // the workers' own outputs are always given), so none is left waiting for a rank that refused.
  if (Status v = m.ranks[0]->check_step(seqs, out, hidden_in, hidden_out); !v) return v;
  if (m.group[0]->aborted())
    return Error{static_cast<int>(Errc::kStepFailed),
                 "tensor-parallel group: a previous step failed and broke the group; recreate "
                 "the engine"};
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.seqs = seqs;
    m.hidden_in = hidden_in;
    for (auto& r : m.results) r.reset();
    m.pending = static_cast<int>(n) - 1;
    ++m.job;
  }
  m.job_cv.notify_all();
  Status first = Error{static_cast<int>(Errc::kStepFailed), "rank 0's step threw"};
  try {
    first = m.ranks[0]->step(seqs, out, hidden_in, hidden_out);
  } catch (const std::exception& ex) {  // the workers still use seqs: wait for them below
    m.group[0]->abort();
    first = Error{static_cast<int>(Errc::kStepFailed), ex.what()};
  }
  {
    std::unique_lock<std::mutex> lock(m.mu);
    m.done_cv.wait(lock, [&] { return m.pending == 0; });
  }
  if (!first) return first;
  // A step rejected by one rank's checks is rejected by all (they check the same things); a
  // device failure on another rank is that rank's error.
  for (size_t r = 1; r < n; ++r)
    if (!*m.results[r])
      return Error{m.results[r]->error().code,
                   strfmt("tensor-parallel rank %zu (GPU %d): %s", r, m.devices[r],
                          m.results[r]->error().message.c_str())};
  return first;
}

int GpuTpEngine::size() const { return static_cast<int>(impl_->ranks.size()); }
const std::vector<int>& GpuTpEngine::devices() const { return impl_->devices; }
bool GpuTpEngine::uses_nccl() const { return impl_->nccl; }
const model::ModelSpec& GpuTpEngine::spec() const { return impl_->ranks[0]->spec(); }
const compute::LayerRange& GpuTpEngine::range() const { return impl_->ranks[0]->range(); }
compute::BlockAllocator& GpuTpEngine::blocks() { return impl_->ranks[0]->blocks(); }
float GpuTpEngine::last_step_ms() const { return impl_->ranks[0]->last_step_ms(); }
GpuEngine& GpuTpEngine::rank(int r) { return *impl_->ranks.at(static_cast<size_t>(r)); }

uint64_t GpuTpEngine::weight_bytes() const {
  uint64_t b = 0;
  for (const auto& e : impl_->ranks) b += e->weight_bytes();
  return b;
}

uint64_t GpuTpEngine::kv_bytes() const {
  uint64_t b = 0;
  for (const auto& e : impl_->ranks) b += e->kv_bytes();
  return b;
}

}  // namespace troupe::gpu
