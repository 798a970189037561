// Weight views and their private copy in huge-page memory (see model.h: WeightStorage).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <thread>

#include <sys/mman.h>

#include "base/check.h"
#include "model/model.h"

namespace troupe::model {

namespace {

template <class Spec, class View, class Fn>
void visit(Spec& spec, const Fn& fn) {
  auto ffn = [&](auto& f) {
    fn(f.gate);
    fn(f.up);
    fn(f.down);
  };
  for (auto& L : spec.layers) {
    for (View* w :
         {&L.attn_norm, &L.wq,     &L.wk,        &L.wv,     &L.wo,          &L.bq,
          &L.bk,        &L.bv,     &L.q_norm,    &L.k_norm, &L.wq_a,        &L.q_a_norm,
          &L.wq_b,      &L.wkv_a,  &L.kv_a_norm, &L.wk_b,   &L.wv_b,        &L.ffn_norm,
          &L.ffn_gate,  &L.ffn_up, &L.ffn_down,  &L.router, &L.router_bias, &L.shared_gate})
      fn(*w);
    for (auto& e : L.experts) ffn(e);
    ffn(L.shared);
  }
  fn(spec.token_embd);
  fn(spec.output_norm);
  fn(spec.output);
}

struct Interval {
  const uint8_t* begin;
  const uint8_t* end;
  uint64_t offset = 0;  // where it starts in the copy
};

}  // namespace

void for_each_weight(ModelSpec& spec, const std::function<void(WeightView&)>& fn) {
  visit<ModelSpec, WeightView>(spec, fn);
}

void for_each_weight(const ModelSpec& spec, const std::function<void(const WeightView&)>& fn) {
  visit<const ModelSpec, const WeightView>(spec, fn);
}

Result<WeightStorage> parse_weight_storage(const std::string& s) {
  if (s == "map") return WeightStorage::kMap;
  if (s == "memory") return WeightStorage::kMemory;
  return make_error(0, "weights: expected \"map\" or \"memory\", got \"" + s + "\"");
}

Result<std::shared_ptr<const Model>> copy_weights_to_memory(
    std::shared_ptr<const Model> model, const std::vector<std::span<const uint8_t>>& ranges,
    int threads) {
  // The views to copy, as byte intervals; overlapping or touching ones merge (a tied head, the
  // slices of a stacked expert tensor).
  std::vector<Interval> iv;
  for_each_weight(model->spec, [&](const WeightView& w) {
    if (!w.present()) return;
    const uint8_t* b = w.data;
    const uint8_t* e = w.data + w.nbytes();
    bool keep = ranges.empty();
    for (const auto& r : ranges) keep |= b >= r.data() && e <= r.data() + r.size();
    if (keep) iv.push_back({b, e});
  });
  std::sort(iv.begin(), iv.end(),
            [](const Interval& a, const Interval& b) { return a.begin < b.begin; });
  std::vector<Interval> merged;
  for (const auto& i : iv) {
    if (!merged.empty() && i.begin <= merged.back().end)
      merged.back().end = std::max(merged.back().end, i.end);
    else
      merged.push_back(i);
  }
  // Each interval starts 64-byte aligned in the copy, like the tensors of a GGUF file.
  uint64_t total = 0;
  for (auto& m : merged) {
    m.offset = total;
    total += (static_cast<uint64_t>(m.end - m.begin) + 63) / 64 * 64;
  }
  auto copy = std::make_shared<Model>(*model);
  if (total == 0) return std::shared_ptr<const Model>(std::move(copy));
  constexpr uint64_t kHuge = uint64_t{2} << 20;
  const uint64_t bytes = (total + kHuge - 1) / kHuge * kHuge;
  void* mem = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED)
    return make_error(
        0, strfmt("%s: cannot allocate %.1f MB for the weights in memory: %s", model->path.c_str(),
                  static_cast<double>(bytes) / 1e6, std::strerror(errno)));
  ::madvise(mem, bytes, MADV_HUGEPAGE);
  std::shared_ptr<const void> owner(
      mem, [bytes](const void* p) { ::munmap(const_cast<void*>(p), bytes); });
  auto* base = static_cast<uint8_t*>(mem);
  // Copy in 8 MiB pieces handed out to the threads.
  constexpr uint64_t kPiece = uint64_t{8} << 20;
  std::vector<std::pair<size_t, uint64_t>> pieces;  // (interval, offset within it)
  for (size_t i = 0; i < merged.size(); ++i)
    for (uint64_t off = 0; off < static_cast<uint64_t>(merged[i].end - merged[i].begin);
         off += kPiece)
      pieces.push_back({i, off});
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t k = next++; k < pieces.size(); k = next++) {
      const Interval& m = merged[pieces[k].first];
      const uint64_t off = pieces[k].second;
      const uint64_t n = std::min<uint64_t>(kPiece, static_cast<uint64_t>(m.end - m.begin) - off);
      std::memcpy(base + m.offset + off, m.begin + off, n);
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  ::mprotect(mem, bytes, PROT_READ);  // weights are read-only, as in the mapping
  // Drop the copied file pages from this process (the page cache may keep them): the mapping
  // stays valid and would fault them in again if anything read it.
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  for (const auto& m : merged) {
    const uintptr_t b = (reinterpret_cast<uintptr_t>(m.begin) + page - 1) & ~(page - 1);
    const uintptr_t e = reinterpret_cast<uintptr_t>(m.end) & ~(page - 1);
    if (e > b) ::madvise(reinterpret_cast<void*>(b), e - b, MADV_DONTNEED);
  }
  // Re-point the copied views.
  for_each_weight(copy->spec, [&](WeightView& w) {
    if (!w.present()) return;
    auto it = std::upper_bound(merged.begin(), merged.end(), w.data,
                               [](const uint8_t* p, const Interval& m) { return p < m.begin; });
    if (it == merged.begin()) return;
    --it;
    if (w.data + w.nbytes() <= it->end) w.data = base + it->offset + (w.data - it->begin);
  });
  copy->storage.push_back(std::move(owner));
  return std::shared_ptr<const Model>(std::move(copy));
}

}  // namespace troupe::model
