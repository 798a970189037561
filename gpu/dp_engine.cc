// GpuDpEngine (gpu/dp_engine.h): splits a step's sequences by the rank owning their KV blocks,
// steps every rank at once (its own sequences, or none), and merges the results back into the
// step's order.
#include "gpu/dp_engine.h"

#include <algorithm>
#include <exception>
#include <string>
#include <utility>

#include "base/check.h"
#include "compute/thread_pool.h"
#include "gpu/collective.h"
#include "gpu/detail/rank_group.h"
#include "gpu/runtime.h"

namespace troupe::gpu {

namespace {
constexpr int kErrBadInput = static_cast<int>(Errc::kBadInput);
}  // namespace

struct GpuDpEngine::Impl {
  std::unique_ptr<detail::RankGroup> g;
  std::unique_ptr<compute::ThreadPool> threads;  // one thread per rank
  int64_t per = 0;                               // blocks per rank
  int64_t bs = 16;                               // positions per block
  // One step's split, per rank: its sequences, their block tables in the rank's own ids, their
  // hidden rows.
  std::vector<std::vector<compute::SeqStep>> steps;
  std::vector<std::vector<std::vector<int32_t>>> tables;
  std::vector<std::vector<float>> hin, hout;
  std::vector<compute::StepResult> res;
  std::vector<Status> results;
  ~Impl() {
    threads.reset();  // workers gone before the engines they step
    g.reset();
  }
};

GpuDpEngine::GpuDpEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GpuDpEngine::~GpuDpEngine() = default;

Result<std::unique_ptr<GpuDpEngine>> GpuDpEngine::create(std::shared_ptr<const model::Model> model,
                                                         const GpuEngineOptions& opts,
                                                         std::vector<int> devices) {
  const auto n = static_cast<int64_t>(devices.size());
  if (n < 1) return Error{kErrBadInput, "GpuDpEngine: no devices"};
  if (opts.kv_block_size < 1) return Error{kErrBadInput, "GpuDpEngine: KV block size must be >= 1"};
  const int64_t blocks =
      opts.kv_num_blocks > 0
          ? opts.kv_num_blocks
          : (opts.max_tokens_in_cache + opts.kv_block_size - 1) / opts.kv_block_size;
  if (blocks < n || blocks % n != 0)
    return Error{kErrBadInput,
                 strfmt("GpuDpEngine: a KV pool of %lld blocks does not split into %lld equal "
                        "ranks' pools",
                        static_cast<long long>(blocks), static_cast<long long>(n))};
  auto g = detail::make_rank_group(std::move(model), opts, devices, detail::GroupRole::kExpert,
                                   blocks / n, "GpuDpEngine");
  if (!g) return g.error();
  auto impl = std::make_unique<Impl>();
  impl->g = std::move(*g);
  impl->per = blocks / n;
  impl->bs = opts.kv_block_size;
  const auto ranks = static_cast<size_t>(n);
  impl->steps.resize(ranks);
  impl->tables.resize(ranks);
  impl->hin.resize(ranks);
  impl->hout.resize(ranks);
  impl->res.resize(ranks);
  impl->results.assign(ranks, Status{Ok{}});
  impl->threads = std::make_unique<compute::ThreadPool>(static_cast<int>(n));
  return std::unique_ptr<GpuDpEngine>(new GpuDpEngine(std::move(impl)));
}

Status GpuDpEngine::step(std::span<const compute::SeqStep> seqs, compute::StepResult* out,
                         const float* hidden_in, std::vector<float>* hidden_out) {
  Impl& m = *impl_;
  detail::RankGroup& g = *m.g;
  const size_t n = g.ranks.size();
  const compute::LayerRange& range = g.ranks[0]->range();
  const int64_t E = g.ranks[0]->spec().n_embd;
  // The caller's buffers, with GpuEngine's messages (no sequences: nothing else is checked).
  if (Status v = g.ranks[0]->check_step({}, out, hidden_in, hidden_out); !v) return v;
  if (n > 1 && g.group[0]->aborted())
    return Error{static_cast<int>(Errc::kStepFailed),
                 "data-parallel group: a previous step failed and broke the group; recreate the "
                 "engine"};

  // Split by the rank owning each sequence's blocks.
  for (size_t r = 0; r < n; ++r) {
    m.steps[r].clear();
    m.tables[r].clear();
    m.hin[r].clear();
  }
  // Where each of the step's sequences went: its rank, its index and first token row there.
  struct Place {
    size_t rank = 0, index = 0;
    int64_t row = 0;
  };
  std::vector<Place> where(seqs.size());
  std::vector<int64_t> tok_at(seqs.size());
  std::vector<int64_t> rank_rows(n, 0);
  int64_t T = 0;
  const int64_t total = m.per * static_cast<int64_t>(n);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const compute::SeqStep& q = seqs[i];
    tok_at[i] = T;
    const auto nt = static_cast<int64_t>(q.tokens.size());
    T += nt;
    size_t r = 0;
    if (!q.blocks.empty()) {
      if (q.blocks[0] < 0 || q.blocks[0] >= total)
        return Error{kErrBadInput,
                     strfmt("step: sequence %zu: block id %d out of range", i, q.blocks[0])};
      r = static_cast<size_t>(q.blocks[0] / m.per);
    }
    const int64_t need =
        std::min<int64_t>((q.pos0 + nt + m.bs - 1) / m.bs, static_cast<int64_t>(q.blocks.size()));
    std::vector<int32_t> table(q.blocks.begin(), q.blocks.end());
    for (int64_t b = 0; b < need; ++b) {
      const int32_t id = q.blocks[static_cast<size_t>(b)];
      if (id < 0 || id >= total || static_cast<size_t>(id / m.per) != r)
        return Error{kErrBadInput,
                     strfmt("step: sequence %zu: block id %d is not on rank %zu with its first "
                            "block (a data-parallel stage keeps a sequence on one GPU)",
                            i, id, r)};
    }
    for (int32_t& id : table) id -= static_cast<int32_t>(static_cast<int64_t>(r) * m.per);
    m.tables[r].push_back(std::move(table));  // moving keeps the ids where they are
    compute::SeqStep local = q;
    local.blocks = m.tables[r].back();
    where[i] = {r, m.steps[r].size(), rank_rows[r]};
    rank_rows[r] += nt;
    m.steps[r].push_back(local);
    if (!range.embed && nt > 0)
      m.hin[r].insert(m.hin[r].end(), hidden_in + tok_at[i] * E, hidden_in + (tok_at[i] + nt) * E);
  }
  auto hidden_for = [&](size_t r) -> const float* {
    if (range.embed) return nullptr;
    return m.hin[r].empty() ? hidden_in : m.hin[r].data();  // non-null even with no rows
  };
  // Every rank's step checked before any starts: a rank that refused would leave the rest
  // waiting in the experts' exchanges.
  for (size_t r = 0; r < n; ++r)
    if (Status v = g.ranks[r]->check_step(m.steps[r], &m.res[r], hidden_for(r),
                                          range.head ? nullptr : &m.hout[r]);
        !v)
      return v;

  m.threads->run([&](int ri, int) {
    const auto r = static_cast<size_t>(ri);
    try {
      m.results[r] =
          g.ranks[r]->step(m.steps[r], &m.res[r], hidden_for(r), range.head ? nullptr : &m.hout[r]);
    } catch (const std::exception& ex) {  // step() catches its own; this is bad_alloc & co.
      if (!g.group.empty()) g.group[r]->abort();
      m.results[r] = Error{static_cast<int>(Errc::kStepFailed), ex.what()};
    } catch (...) {
      if (!g.group.empty()) g.group[r]->abort();
      m.results[r] = Error{static_cast<int>(Errc::kStepFailed), "a rank's step threw"};
    }
  });
  for (size_t r = 0; r < n; ++r)
    if (!m.results[r])
      return Error{m.results[r].error().code,
                   strfmt("data-parallel rank %zu (GPU %d): %s", r, g.devices[r],
                          m.results[r].error().message.c_str())};

  // Merge in the step's order.
  const int64_t V = g.ranks[0]->spec().n_vocab;
  out->n_vocab = V;
  out->row_begin.assign(seqs.size(), 0);
  out->row_count.assign(seqs.size(), 0);
  out->logits.clear();
  if (!range.head) hidden_out->assign(static_cast<size_t>(T * E), 0.f);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const auto [r, j, row0] = where[i];
    const auto nt = static_cast<int64_t>(seqs[i].tokens.size());
    if (range.head) {
      const compute::StepResult& s = m.res[r];
      out->row_begin[i] = static_cast<int64_t>(out->logits.size()) / V;
      out->row_count[i] = s.row_count[j];
      if (s.row_count[j] > 0) {
        const float* row = s.row(j);
        out->logits.insert(out->logits.end(), row, row + s.row_count[j] * V);
      }
    } else {
      std::copy(m.hout[r].begin() + row0 * E, m.hout[r].begin() + (row0 + nt) * E,
                hidden_out->begin() + tok_at[i] * E);
    }
  }
  return Ok{};
}

int GpuDpEngine::size() const { return static_cast<int>(impl_->g->ranks.size()); }
bool GpuDpEngine::uses_nccl() const { return impl_->g->nccl; }
int64_t GpuDpEngine::blocks_per_rank() const { return impl_->per; }
const model::ModelSpec& GpuDpEngine::spec() const { return impl_->g->ranks[0]->spec(); }
const compute::LayerRange& GpuDpEngine::range() const { return impl_->g->ranks[0]->range(); }
GpuEngine& GpuDpEngine::rank(int r) { return *impl_->g->ranks.at(static_cast<size_t>(r)); }

uint64_t GpuDpEngine::weight_bytes() const { return impl_->g->weight_bytes(); }

uint64_t GpuDpEngine::kv_bytes() const { return impl_->g->kv_bytes(); }

}  // namespace troupe::gpu
