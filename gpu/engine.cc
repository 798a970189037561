// GpuEngine (gpu/engine.h): the step (validation, the packed inputs, the eager or graph-replayed
// body, the logits copy) and the engine's accessors. The set-up is in engine_setup.cc, the
// per-layer kernel orchestration (compute/engine.cc forward(), attention(), moe()) in
// engine_layers.cc; GpuEngine::Impl, which they share, in detail/engine_impl.h.
//
// Batch invariance: every launch computes a row (token) from that row alone, in an order fixed by
// the row's own data (gpu/ops.h, gpu/gemm.h, gpu/attention.h, gpu/moe.h, engine_kernels.cu).
// Nothing here picks a code path from the batch: the batch only sets grids and row counts. The
// launch parameters that differ between an eager step and a graph of the same rows (block-table
// width, max_kv_len, which head rows are computed) change grids only: attention's decode split
// depends on each sequence's context length alone, and the GEMM pins its algorithm per (N, K),
// never per M.
//
// CUDA graphs: a decode-only step (every SeqStep has one token) of a range without MoE layers is
// keyed by (number of sequences, block-table width rounded up to a power of two). The first step
// of a key runs eagerly and is then captured (capture records, it does not run the kernels); later
// steps of that key upload their inputs into the same device buffers and replay the graph. MoE
// layers sync the host once per layer (MoeForward needs the per-expert row counts to issue its
// GEMMs), so a range with MoE layers never uses graphs.
#include "gpu/engine.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <exception>
#include <limits>
#include <utility>

#include "base/check.h"
#include "gpu/collective.h"
#include "gpu/detail/engine_impl.h"
#include "gpu/runtime.h"

namespace troupe::gpu {

using compute::SeqStep;
using detail::InputLayout;
using detail::kErrBadInput;
using detail::ll;
using detail::StepInputs;
using detail::StepPlan;
using detail::sz;

namespace {

constexpr int kErrStepFailed = static_cast<int>(Errc::kStepFailed);

int64_t next_pow2(int64_t n) {
  int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}

}  // namespace

GpuEngine::Impl::~Impl() {
  // No throwing here: errors of a broken context are ignored on the way out.
  cudaSetDevice(device);
  if (streams) cudaStreamSynchronize(streams->compute());
  for (auto& [key, exec] : graphs) cudaGraphExecDestroy(exec);
  if (ev_start) cudaEventDestroy(ev_start);
  if (ev_stop) cudaEventDestroy(ev_stop);
  for (cudaEvent_t e : ev_summed)
    if (e) cudaEventDestroy(e);
  if (in_host) cudaFreeHost(in_host);
  cudaGetLastError();
}

GpuEngine::GpuEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GpuEngine::~GpuEngine() = default;

const model::ModelSpec& GpuEngine::spec() const { return impl_->model->spec; }
const compute::LayerRange& GpuEngine::range() const { return impl_->range; }
compute::BlockAllocator& GpuEngine::blocks() { return *impl_->alloc; }
uint64_t GpuEngine::weight_bytes() const { return impl_->weights.capacity(); }
uint64_t GpuEngine::kv_bytes() const { return impl_->kv.capacity(); }
float GpuEngine::last_step_ms() const { return impl_->last_ms; }
StreamPair& GpuEngine::streams() { return *impl_->streams; }
size_t GpuEngine::num_graphs() const { return impl_->graphs.size(); }
const std::string& GpuEngine::graph_error() const { return impl_->graph_error; }

// ---- step --------------------------------------------------------------------------------------

Status GpuEngine::step(std::span<const SeqStep> seqs, compute::StepResult* out,
                       const float* hidden_in, std::vector<float>* hidden_out) {
  Impl& m = *impl_;
  // A group's other ranks would wait for this one forever when it stops: break the group first
  // (a refused step is a driver's bug: drivers check every rank's step before any starts).
  auto break_group = [&] {
    if (m.tp) m.tp->abort();
    if (m.ep) m.ep->abort();
  };
  if (Status v = m.validate(seqs, out, hidden_in, hidden_out); !v) {
    break_group();
    return v;
  }
  try {
    m.forward(seqs, out, hidden_in, hidden_out);
    return Ok{};
  } catch (const std::exception& ex) {
    break_group();
    m.recover();
    return Error{kErrStepFailed, ex.what()};
  }
}

Status GpuEngine::check_step(std::span<const SeqStep> seqs, const compute::StepResult* out,
                             const float* hidden_in, const std::vector<float>* hidden_out) const {
  return impl_->validate(seqs, out, hidden_in, hidden_out);
}

// The checks and messages of compute::Engine::step, plus the bounds this engine was sized for.
Status GpuEngine::Impl::validate(std::span<const SeqStep> seqs, const compute::StepResult* out,
                                 const float* hidden_in,
                                 const std::vector<float>* hidden_out) const {
  if (out == nullptr) return Error{kErrBadInput, "step: no StepResult to fill"};
  if (!range.embed && hidden_in == nullptr)
    return Error{kErrBadInput, "step: this stage does not embed: hidden states are required"};
  if (!range.head && hidden_out == nullptr)
    return Error{kErrBadInput,
                 "step: this stage has no output head: a hidden-state buffer is required"};
  if (static_cast<int64_t>(seqs.size()) > S_cap)
    return Error{kErrBadInput,
                 strfmt("step: %zu sequences exceed max_step_seqs (%lld)", seqs.size(), ll(S_cap))};
  int64_t total = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SeqStep& q = seqs[i];
    if (q.pos0 < 0)
      return Error{kErrBadInput, strfmt("step: sequence %zu has negative position", i)};
    if (q.tokens.empty()) return Error{kErrBadInput, strfmt("step: sequence %zu has no tokens", i)};
    if (q.non_causal)
      return Error{kErrBadInput, strfmt("step: sequence %zu is non-causal, which the GPU engine "
                                        "does not do yet",
                                        i)};
    if (!q.embd.empty())
      return Error{kErrBadInput, strfmt("step: sequence %zu has embedded (image) positions, which "
                                        "the GPU engine does not take yet",
                                        i)};
    for (int32_t t : q.tokens)
      if (t < 0 || t >= V)
        return Error{kErrBadInput,
                     strfmt("step: sequence %zu: token id %d is outside the vocabulary (0..%lld)",
                            i, t, ll(V - 1))};
    if (q.pos0 > num_slots)
      return Error{kErrBadInput,
                   strfmt("step: sequence %zu starts at position %lld, beyond the KV pool's %lld "
                          "positions",
                          i, ll(q.pos0), ll(num_slots))};
    const int64_t n = static_cast<int64_t>(q.tokens.size());
    const int64_t end = q.pos0 + n;
    const int64_t need = (end + bs - 1) / bs;
    if (static_cast<int64_t>(q.blocks.size()) < need)
      return Error{kErrBadInput,
                   strfmt("step: sequence %zu needs %lld KV blocks for %lld positions, has %zu", i,
                          ll(need), ll(end), q.blocks.size())};
    for (int64_t b = 0; b < need; ++b)
      if (q.blocks[sz(b)] < 0 || q.blocks[sz(b)] >= num_blocks)
        return Error{kErrBadInput,
                     strfmt("step: sequence %zu: block id %d out of range", i, q.blocks[sz(b)])};
    if (end > num_slots)
      return Error{kErrBadInput,
                   strfmt("step: sequence %zu reaches position %lld, beyond the KV pool's %lld "
                          "positions",
                          i, ll(end - 1), ll(num_slots))};
    total += n;
    if (total > T_cap)
      return Error{kErrBadInput,
                   strfmt("step: more than max_step_tokens (%lld) tokens", ll(T_cap))};
  }
  return Ok{};
}

void GpuEngine::Impl::recover() noexcept {
  cudaStreamSynchronize(streams->comm());  // a group's sums (aborted first when they hang)
  cudaStream_t cs = streams->compute();
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(cs, &st) == cudaSuccess && st != cudaStreamCaptureStatusNone) {
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(cs, &g);
    if (g) cudaGraphDestroy(g);
  }
  cudaStreamSynchronize(cs);
  cudaGetLastError();
}

StepPlan GpuEngine::Impl::plan_step(std::span<const SeqStep> seqs, compute::StepResult* out,
                                    size_t in_offset) {
  StepPlan p;
  p.in_offset = in_offset;
  p.S = static_cast<int64_t>(seqs.size());
  int64_t max_need = 0, max_end = 0, max_q = 0, min_q = std::numeric_limits<int64_t>::max();
  for (const SeqStep& q : seqs) {
    const int64_t n = static_cast<int64_t>(q.tokens.size());
    p.T += n;
    max_q = std::max(max_q, n);
    min_q = std::min(min_q, n);
    max_end = std::max(max_end, q.pos0 + n);
    max_need = std::max(max_need, (q.pos0 + n + bs - 1) / bs);
  }
  p.graph = opts.cuda_graphs && graphs_allowed && max_q == 1;
  // A graph's table width and max_kv_len are fixed per key: round the width up (fewer keys).
  p.W = p.graph ? std::min(next_pow2(max_need), num_blocks) : max_need;
  p.max_q_len = static_cast<int32_t>(max_q);
  p.min_q_len = static_cast<int32_t>(min_q);
  p.max_kv_len = static_cast<int32_t>(p.graph ? p.W * bs : max_end);

  // Output rows as compute::Engine orders them; the device computes either exactly those rows
  // (eager) or every token's (graph: the row set must not depend on what the step asks for).
  out->row_begin.assign(seqs.size(), 0);
  out->row_count.assign(seqs.size(), 0);
  std::vector<int32_t> dev_rows;
  {
    int64_t t = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const int64_t n = static_cast<int64_t>(seqs[i].tokens.size());
      out->row_begin[i] = static_cast<int64_t>(p.out_src.size());
      if (head_here && seqs[i].logits != SeqStep::Logits::kNone) {
        const bool all = seqs[i].logits == SeqStep::Logits::kAll;
        for (int64_t j = all ? 0 : n - 1; j < n; ++j) {
          if (p.graph) {
            p.out_src.push_back(t + j);
          } else {
            p.out_src.push_back(static_cast<int64_t>(dev_rows.size()));
            dev_rows.push_back(static_cast<int32_t>(t + j));
          }
        }
        out->row_count[i] = all ? n : 1;
      }
      t += n;
    }
  }
  if (p.graph && head_here)
    for (int64_t t = 0; t < p.T; ++t) dev_rows.push_back(static_cast<int32_t>(t));
  p.R = static_cast<int64_t>(dev_rows.size());
  p.lay = InputLayout::make(p.T, p.S, p.W, p.R);
  TROUPE_CHECK(p.lay.total <= in_cap.total, "step inputs of %zu bytes exceed the %zu reserved",
               p.lay.total, in_cap.total);

  // Fill the pinned buffer.
  uint8_t* const in_host = this->in_host + in_offset;
  auto* tok = reinterpret_cast<int32_t*>(in_host + p.lay.tok);
  auto* pos = reinterpret_cast<int32_t*>(in_host + p.lay.pos);
  auto* slot = reinterpret_cast<int64_t*>(in_host + p.lay.slot);
  auto* q_start = reinterpret_cast<int32_t*>(in_host + p.lay.q_start);
  auto* q_len = reinterpret_cast<int32_t*>(in_host + p.lay.q_len);
  auto* pos0 = reinterpret_cast<int32_t*>(in_host + p.lay.pos0);
  auto* table = reinterpret_cast<int32_t*>(in_host + p.lay.table);
  auto* rows = reinterpret_cast<int32_t*>(in_host + p.lay.rows);
  int64_t t = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SeqStep& q = seqs[i];
    const int64_t n = static_cast<int64_t>(q.tokens.size());
    q_start[i] = static_cast<int32_t>(t);
    q_len[i] = static_cast<int32_t>(n);
    pos0[i] = static_cast<int32_t>(q.pos0);
    const int64_t need = (q.pos0 + n + bs - 1) / bs;
    int32_t* row = table + static_cast<int64_t>(i) * p.W;
    for (int64_t b = 0; b < p.W; ++b) row[b] = b < need ? q.blocks[sz(b)] : -1;
    for (int64_t j = 0; j < n; ++j, ++t) {
      const int64_t ps = q.pos0 + j;
      tok[t] = q.tokens[sz(j)];
      pos[t] = static_cast<int32_t>(ps);
      slot[t] = static_cast<int64_t>(q.blocks[sz(ps / bs)]) * bs + ps % bs;
    }
  }
  std::copy(dev_rows.begin(), dev_rows.end(), rows);
  return p;
}

StepInputs GpuEngine::Impl::inputs(const StepPlan& p) const {
  StepInputs in;
  const uint8_t* const in_dev = w.in_dev + p.in_offset;
  in.tok = reinterpret_cast<const int32_t*>(in_dev + p.lay.tok);
  in.pos = reinterpret_cast<const int32_t*>(in_dev + p.lay.pos);
  in.slot = reinterpret_cast<const int64_t*>(in_dev + p.lay.slot);
  in.q_start = reinterpret_cast<const int32_t*>(in_dev + p.lay.q_start);
  in.q_len = reinterpret_cast<const int32_t*>(in_dev + p.lay.q_len);
  in.pos0 = reinterpret_cast<const int32_t*>(in_dev + p.lay.pos0);
  in.table = reinterpret_cast<const int32_t*>(in_dev + p.lay.table);
  in.rows = reinterpret_cast<const int32_t*>(in_dev + p.lay.rows);
  return in;
}

void GpuEngine::Impl::forward(std::span<const SeqStep> seqs, compute::StepResult* out,
                              const float* hidden_in, std::vector<float>* hidden_out) {
  TROUPE_CUDA_CHECK(cudaSetDevice(device));
  out->n_vocab = V;
  if (seqs.empty()) {
    out->row_begin.clear();
    out->row_count.clear();
    out->logits.clear();
    if (hidden_out) hidden_out->clear();
    if (ep) serve_experts();
    last_ms = 0;
    return;
  }
  if (tp && opts.tp_overlap && seqs.size() >= 2) {
    // Two micro-batches: the first k sequences hold about half the tokens.
    int64_t total = 0, half = 0;
    for (const SeqStep& q : seqs) total += static_cast<int64_t>(q.tokens.size());
    size_t k = 0;
    while (k + 1 < seqs.size() && 2 * (half + static_cast<int64_t>(seqs[k].tokens.size())) <= total)
      half += static_cast<int64_t>(seqs[k++].tokens.size());
    forward_split(seqs, std::max<size_t>(k, 1), out, hidden_in, hidden_out);
    return;
  }
  const StepPlan p = plan_step(seqs, out);
  const StepInputs in = inputs(p);
  cudaStream_t cs = streams->compute();
  TROUPE_CUDA_CHECK(cudaEventRecord(ev_start, cs));
  TROUPE_CUDA_CHECK(cudaMemcpyAsync(w.in_dev, in_host, p.lay.total, cudaMemcpyHostToDevice, cs));
  if (!range.embed)
    TROUPE_CUDA_CHECK(
        cudaMemcpyAsync(w.x, hidden_in, sz(p.T * E) * sizeof(float), cudaMemcpyHostToDevice, cs));
  run_body(p);
  if (head_here) {
    copy_logits(p, in, out);
  } else {
    // Tensor-parallel ranks other than 0 of a range with the head return nothing.
    out->logits.clear();
    if (hidden_out) {
      hidden_out->resize(sz(p.T * E));
      TROUPE_CUDA_CHECK(cudaMemcpyAsync(hidden_out->data(), w.x, sz(p.T * E) * sizeof(float),
                                        cudaMemcpyDeviceToHost, cs));
    }
  }
  TROUPE_CUDA_CHECK(cudaEventRecord(ev_stop, cs));
  if (tp || ep)
    (tp ? tp : ep)->synchronize(cs);  // watches the group: a dead peer throws, never hangs
  else
    TROUPE_CUDA_CHECK(cudaEventSynchronize(ev_stop));
  TROUPE_CUDA_CHECK(cudaEventElapsedTime(&last_ms, ev_start, ev_stop));
}

// Tensor parallelism with overlap: sequences [0, k) and [k, S) as two micro-batches in the
// step's buffers (the second's rows after the first's), their layers interleaved by
// enqueue_layers; then each one's logits (the head's buffers are shared: one after the other),
// merged into `out` in sequence order.
void GpuEngine::Impl::forward_split(std::span<const SeqStep> seqs, size_t k,
                                    compute::StepResult* out, const float* hidden_in,
                                    std::vector<float>* hidden_out) {
  compute::StepResult part[2];
  const StepPlan p0 = plan_step(seqs.first(k), &part[0], 0);
  const StepPlan p1 = plan_step(seqs.subspan(k), &part[1], in_cap.total);
  const detail::MicroBatch mbs[2] = {{&p0, inputs(p0), 0, ev_summed[0]},
                                     {&p1, inputs(p1), p0.T, ev_summed[1]}};
  const int64_t T = p0.T + p1.T;
  cudaStream_t cs = streams->compute();
  TROUPE_CUDA_CHECK(cudaEventRecord(ev_start, cs));
  for (const StepPlan* p : {&p0, &p1})
    TROUPE_CUDA_CHECK(cudaMemcpyAsync(w.in_dev + p->in_offset, in_host + p->in_offset, p->lay.total,
                                      cudaMemcpyHostToDevice, cs));
  // Each micro-batch's hidden rows where its Work view has them (rows_from).
  if (!range.embed)
    for (const detail::MicroBatch& mb : mbs)
      TROUPE_CUDA_CHECK(cudaMemcpyAsync(rows_from(w, mb.t0).x, hidden_in + mb.t0 * E,
                                        sz(mb.p->T * E) * sizeof(float), cudaMemcpyHostToDevice,
                                        cs));
  enqueue_layers(mbs);
  out->logits.clear();
  if (head_here) {
    const detail::Work base = w;
    for (int i = 0; i < 2; ++i) {
      w = rows_from(base, mbs[i].t0);  // the head reads x from the micro-batch's rows
      try {
        if (mbs[i].p->R > 0) enqueue_head(mbs[i].in, 0, std::min(mbs[i].p->R, C_cap));
        copy_logits(*mbs[i].p, mbs[i].in, &part[i]);
      } catch (...) {
        w = base;
        throw;
      }
      w = base;
    }
    out->n_vocab = V;
    out->row_begin = part[0].row_begin;
    out->row_count = part[0].row_count;
    const auto rows0 = static_cast<int64_t>(part[0].logits.size() / sz(V));
    for (size_t i = 0; i < part[1].row_begin.size(); ++i) {
      out->row_begin.push_back(part[1].row_begin[i] + rows0);
      out->row_count.push_back(part[1].row_count[i]);
    }
    out->logits = std::move(part[0].logits);
    out->logits.insert(out->logits.end(), part[1].logits.begin(), part[1].logits.end());
  } else {
    out->row_begin.assign(seqs.size(), 0);
    out->row_count.assign(seqs.size(), 0);
    if (hidden_out) {
      hidden_out->resize(sz(T * E));
      for (const detail::MicroBatch& mb : mbs)
        TROUPE_CUDA_CHECK(cudaMemcpyAsync(hidden_out->data() + mb.t0 * E, rows_from(w, mb.t0).x,
                                          sz(mb.p->T * E) * sizeof(float), cudaMemcpyDeviceToHost,
                                          cs));
    }
  }
  TROUPE_CUDA_CHECK(cudaEventRecord(ev_stop, cs));
  tp->synchronize(cs);
  TROUPE_CUDA_CHECK(cudaEventElapsedTime(&last_ms, ev_start, ev_stop));
}

void GpuEngine::Impl::run_body(const StepPlan& p) {
  if (!p.graph) {
    enqueue_body(p);
    return;
  }
  const std::pair<int64_t, int64_t> key{p.S, p.W};
  if (auto it = graphs.find(key); it != graphs.end()) {
    TROUPE_CUDA_CHECK(cudaGraphLaunch(it->second, streams->compute()));
    return;
  }
  enqueue_body(p);  // the first step of a key runs eagerly, then is recorded for the next ones
  if (!graph_failed.count(key)) try_capture(p, key);
}

// Records the body into a graph without running it. A failure leaves the step's (eager) results
// intact: the key is marked and stays eager, and graph_error says why.
void GpuEngine::Impl::try_capture(const StepPlan& p, std::pair<int64_t, int64_t> key) {
  cudaStream_t cs = streams->compute();
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  try {
    TROUPE_CUDA_CHECK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeRelaxed));
    try {
      enqueue_body(p);
    } catch (...) {
      cudaGraph_t broken = nullptr;
      cudaStreamEndCapture(cs, &broken);
      if (broken) cudaGraphDestroy(broken);
      cudaGetLastError();
      throw;
    }
    TROUPE_CUDA_CHECK(cudaStreamEndCapture(cs, &graph));
    TROUPE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    cudaGraphDestroy(graph);
    graph = nullptr;
    graphs.emplace(key, exec);
  } catch (const std::exception& ex) {
    if (graph) cudaGraphDestroy(graph);
    graph_failed.insert(key);
    graph_error = strfmt("CUDA graph capture for %lld sequences, table width %lld failed: %s",
                         ll(key.first), ll(key.second), ex.what());
  }
}

}  // namespace troupe::gpu
