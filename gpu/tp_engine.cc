// GpuTpEngine (gpu/tp_engine.h): a tensor-parallel group (gpu/detail/rank_group.h) and the
// fan-out of each step to its ranks.
#include "gpu/tp_engine.h"

#include <exception>
#include <string>
#include <utility>

#include "base/check.h"
#include "compute/thread_pool.h"
#include "gpu/collective.h"
#include "gpu/detail/rank_group.h"
#include "gpu/runtime.h"

namespace troupe::gpu {

struct GpuTpEngine::Impl {
  std::unique_ptr<detail::RankGroup> g;
  std::unique_ptr<compute::ThreadPool> threads;  // one thread per rank
  std::vector<compute::StepResult> outs;         // ranks 1..: their (unused) results
  std::vector<std::vector<float>> hiddens;
  std::vector<Status> results;
  ~Impl() {
    threads.reset();  // workers gone before the engines they step
    g.reset();
  }
};

GpuTpEngine::GpuTpEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GpuTpEngine::~GpuTpEngine() = default;

Result<std::unique_ptr<GpuTpEngine>> GpuTpEngine::create(std::shared_ptr<const model::Model> model,
                                                         const GpuEngineOptions& opts,
                                                         std::vector<int> devices) {
  auto g = detail::make_rank_group(std::move(model), opts, devices, detail::GroupRole::kTensor, 0,
                                   "GpuTpEngine");
  if (!g) return g.error();
  auto impl = std::make_unique<Impl>();
  const size_t n = (*g)->ranks.size();
  impl->g = std::move(*g);
  impl->outs.resize(n);
  impl->hiddens.resize(n);
  impl->results.assign(n, Status{Ok{}});
  impl->threads = std::make_unique<compute::ThreadPool>(static_cast<int>(n));
  return std::unique_ptr<GpuTpEngine>(new GpuTpEngine(std::move(impl)));
}

Status GpuTpEngine::step(std::span<const compute::SeqStep> seqs, compute::StepResult* out,
                         const float* hidden_in, std::vector<float>* hidden_out) {
  Impl& m = *impl_;
  detail::RankGroup& g = *m.g;
  const size_t n = g.ranks.size();
  if (n == 1) return g.ranks[0]->step(seqs, out, hidden_in, hidden_out);
  // Refused before any rank starts: every rank checks the same things (same steps, same sizes;
  // the workers' own outputs are always given), so none is left waiting for a rank that refused.
  if (Status v = g.ranks[0]->check_step(seqs, out, hidden_in, hidden_out); !v) return v;
  if (g.group[0]->aborted())
    return Error{static_cast<int>(Errc::kStepFailed),
                 "tensor-parallel group: a previous step failed and broke the group; recreate "
                 "the engine"};
  m.threads->run([&](int r, int) {
    const auto ru = static_cast<size_t>(r);
    compute::StepResult* o = r == 0 ? out : &m.outs[ru];
    std::vector<float>* h =
        r == 0 ? hidden_out : (g.ranks[ru]->range().head ? nullptr : &m.hiddens[ru]);
    try {
      m.results[ru] = g.ranks[ru]->step(seqs, o, hidden_in, h);
    } catch (const std::exception& ex) {  // step() catches its own; this is bad_alloc & co.
      g.group[ru]->abort();
      m.results[ru] = Error{static_cast<int>(Errc::kStepFailed), ex.what()};
    } catch (...) {
      g.group[ru]->abort();
      m.results[ru] = Error{static_cast<int>(Errc::kStepFailed), "a rank's step threw"};
    }
  });
  if (!m.results[0]) return m.results[0];
  // A device failure on another rank is that rank's error.
  for (size_t r = 1; r < n; ++r)
    if (!m.results[r])
      return Error{m.results[r].error().code,
                   strfmt("tensor-parallel rank %zu (GPU %d): %s", r, g.devices[r],
                          m.results[r].error().message.c_str())};
  return Ok{};
}

int GpuTpEngine::size() const { return static_cast<int>(impl_->g->ranks.size()); }
const std::vector<int>& GpuTpEngine::devices() const { return impl_->g->devices; }
bool GpuTpEngine::uses_nccl() const { return impl_->g->nccl; }
const model::ModelSpec& GpuTpEngine::spec() const { return impl_->g->ranks[0]->spec(); }
const compute::LayerRange& GpuTpEngine::range() const { return impl_->g->ranks[0]->range(); }
compute::BlockAllocator& GpuTpEngine::blocks() { return impl_->g->ranks[0]->blocks(); }
float GpuTpEngine::last_step_ms() const { return impl_->g->ranks[0]->last_step_ms(); }
GpuEngine& GpuTpEngine::rank(int r) { return *impl_->g->ranks.at(static_cast<size_t>(r)); }

uint64_t GpuTpEngine::weight_bytes() const { return impl_->g->weight_bytes(); }

uint64_t GpuTpEngine::kv_bytes() const { return impl_->g->kv_bytes(); }

}  // namespace troupe::gpu
