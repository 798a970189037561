// Weight views and their private copy in huge-page memory (see model.h: WeightStorage).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <thread>

#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include "base/check.h"
#include "base/huge_pages.h"
#include "model/model.h"
#include "model/weight_tiles.h"

namespace troupe::model {

namespace {

template <class View, class Ffn, class Fn>
void visit_ffn(Ffn& f, const Fn& fn) {
  for (View* w : {&f.gate, &f.up, &f.down, &f.gate_b, &f.up_b, &f.down_b, &f.gate_up}) fn(*w);
}

// Every view of a layer but its routed experts'.
template <class View, class Layer, class Fn>
void visit_layer(Layer& L, const Fn& fn) {
  for (View* w : {&L.attn_norm,
                  &L.wq,
                  &L.wk,
                  &L.wv,
                  &L.wo,
                  &L.bq,
                  &L.bk,
                  &L.bv,
                  &L.q_norm,
                  &L.k_norm,
                  &L.bo,
                  &L.sinks,
                  &L.attn_post_norm,
                  &L.ffn_post_norm,
                  &L.wq_a,
                  &L.q_a_norm,
                  &L.wq_b,
                  &L.wkv_a,
                  &L.kv_a_norm,
                  &L.wk_b,
                  &L.wv_b,
                  &L.idx_wq_b,
                  &L.idx_wk,
                  &L.idx_k_norm,
                  &L.idx_k_norm_b,
                  &L.idx_proj,
                  &L.ssm_in,
                  &L.ssm_qkv,
                  &L.ssm_z,
                  &L.ssm_ba,
                  &L.ssm_beta,
                  &L.ssm_alpha,
                  &L.ssm_conv,
                  &L.ssm_dt,
                  &L.ssm_a,
                  &L.ssm_norm,
                  &L.ffn_norm,
                  &L.ffn_gate,
                  &L.ffn_up,
                  &L.ffn_down,
                  &L.router,
                  &L.router_bias,
                  &L.router_logit_bias,
                  &L.shared_gate,
                  &L.hash_experts,
                  &L.hc_attn_fn,
                  &L.hc_attn_base,
                  &L.hc_attn_scale,
                  &L.hc_ffn_fn,
                  &L.hc_ffn_base,
                  &L.hc_ffn_scale,
                  &L.wo_a,
                  &L.cmp_kv,
                  &L.cmp_gate,
                  &L.cmp_ape,
                  &L.cmp_norm,
                  &L.idx_cmp_kv,
                  &L.idx_cmp_gate,
                  &L.idx_cmp_ape,
                  &L.idx_cmp_norm})
    fn(*w);
  visit_ffn<View>(L.shared, fn);
}

template <class Spec, class View, class Fn>
void visit(Spec& spec, const Fn& fn) {
  for (auto& L : spec.layers) {
    visit_layer<View>(L, fn);
    for (auto& e : L.experts) visit_ffn<View>(e, fn);
  }
  fn(spec.token_embd);
  fn(spec.output_norm);
  fn(spec.output);
  for (auto* w : {&spec.hc_head_fn, &spec.hc_head_base, &spec.hc_head_scale}) fn(*w);
}

// A file mapping of this process, from /proc/self/maps: the bytes at [begin, end) are the file's
// from `offset` on; the file is the one at `path` only if that still has this device and inode.
struct FileMapping {
  uintptr_t begin = 0, end = 0;
  uint64_t offset = 0;
  unsigned dev_major = 0, dev_minor = 0;
  uint64_t inode = 0;
  std::string path;
};

std::vector<FileMapping> file_mappings() {
  std::vector<FileMapping> out;
  std::FILE* f = std::fopen("/proc/self/maps", "r");
  if (!f) return out;
  char line[4096 + 256];
  while (std::fgets(line, sizeof(line), f)) {
    unsigned long b = 0, e = 0;
    unsigned long long off = 0, inode = 0;
    unsigned major = 0, minor = 0;
    char perms[8] = {};
    int pos = 0;
    if (std::sscanf(line, "%lx-%lx %7s %llx %x:%x %llu %n", &b, &e, perms, &off, &major, &minor,
                    &inode, &pos) < 7)
      continue;
    std::string path(line + pos);
    while (!path.empty() && (path.back() == '\n' || path.back() == ' ')) path.pop_back();
    if (inode == 0 || perms[0] != 'r' || path.empty() || path[0] != '/' ||
        path.ends_with(" (deleted)"))
      continue;
    out.push_back({b, e, off, major, minor, inode, std::move(path)});
  }
  std::fclose(f);
  std::sort(out.begin(), out.end(),
            [](const FileMapping& x, const FileMapping& y) { return x.begin < y.begin; });
  return out;
}

// The one of `maps` (sorted by begin) holding all n bytes at p, or null.
const FileMapping* mapping_of(const std::vector<FileMapping>& maps, const uint8_t* p, uint64_t n) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = std::upper_bound(maps.begin(), maps.end(), a,
                             [](uintptr_t x, const FileMapping& fm) { return x < fm.begin; });
  if (it == maps.begin()) return nullptr;
  --it;
  return a + n <= it->end ? &*it : nullptr;
}

// Reads n bytes at `offset` of fd into dst; false on an error or an early end of file.
bool pread_all(int fd, uint8_t* dst, uint64_t n, uint64_t offset) {
  while (n > 0) {
    const ssize_t r = ::pread(fd, dst, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    dst += r;
    n -= static_cast<uint64_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return true;
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

void for_each_layer_weight(const LayerSpec& layer,
                           const std::function<void(const WeightView&)>& fn) {
  visit_layer<const WeightView>(layer, fn);
}

void for_each_ffn_weight(const ExpertFfn& ffn, const std::function<void(const WeightView&)>& fn) {
  visit_ffn<const WeightView>(ffn, fn);
}

Result<WeightStorage> parse_weight_storage(const std::string& s) {
  if (s == "map") return WeightStorage::kMap;
  if (s == "memory") return WeightStorage::kMemory;
  if (s == "auto") return WeightStorage::kAuto;
  return make_error(0, "weights: expected \"map\", \"memory\" or \"auto\", got \"" + s + "\"");
}

uint64_t available_memory_bytes() {
  uint64_t avail = 0;
  if (std::FILE* f = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    unsigned long long kb = 0;
    while (std::fgets(line, sizeof(line), f))
      if (std::sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
        avail = static_cast<uint64_t>(kb) * 1024;
        break;
      }
    std::fclose(f);
  }
  // cgroup v2: the limit of this process's group (a container's), less what it already uses.
  auto read_u64 = [](const std::string& path, uint64_t* v) {
    std::FILE* f = std::fopen(path.c_str(), "r");
    if (!f) return false;
    unsigned long long x = 0;
    const bool ok = std::fscanf(f, "%llu", &x) == 1;  // "max" (no limit) does not parse
    std::fclose(f);
    *v = static_cast<uint64_t>(x);
    return ok;
  };
  std::string group;
  if (std::FILE* f = std::fopen("/proc/self/cgroup", "r")) {
    char line[4096];
    while (std::fgets(line, sizeof(line), f)) {
      std::string l(line);
      if (l.rfind("0::", 0) == 0) {
        group = l.substr(3);
        while (!group.empty() && (group.back() == '\n' || group.back() == '\r')) group.pop_back();
      }
    }
    std::fclose(f);
  }
  uint64_t max = 0, cur = 0;
  const std::string dir = "/sys/fs/cgroup" + (group == "/" ? std::string() : group);
  if (!group.empty() && read_u64(dir + "/memory.max", &max) &&
      read_u64(dir + "/memory.current", &cur)) {
    const uint64_t left = max > cur ? max - cur : 0;
    avail = avail == 0 ? left : std::min(avail, left);
  }
  return avail;
}

Result<WeightStorage> choose_weight_storage(WeightStorage requested, uint64_t bytes,
                                            uint64_t available, std::string* why) {
  auto mb = [](uint64_t b) { return static_cast<double>(b) / 1e6; };
  if (requested == WeightStorage::kMap) return WeightStorage::kMap;
  if (requested == WeightStorage::kMemory) {
    if (available != 0 && bytes > available)
      return make_error(0, strfmt("weights = \"memory\": a copy of %.1f MB of weights does not fit "
                                  "in the %.1f MB of memory available (use \"map\" or \"auto\")",
                                  mb(bytes), mb(available)));
    return WeightStorage::kMemory;
  }
  const uint64_t reserve = std::max<uint64_t>(uint64_t{1} << 30, available / 10);
  if (available != 0 && bytes + reserve <= available) return WeightStorage::kMemory;
  if (why != nullptr)
    *why = available == 0
               ? "the memory available could not be read"
               : strfmt("a copy of %.1f MB would leave less than %.1f MB of the %.1f MB available",
                        mb(bytes), mb(reserve), mb(available));
  return WeightStorage::kMap;
}

Result<std::shared_ptr<const Model>> place_weights(
    std::shared_ptr<const Model> model, WeightStorage requested,
    const std::vector<std::span<const uint8_t>>& ranges, int threads, std::string* why,
    TileTypes tile_types) {
  if (requested == WeightStorage::kMap) return model;
  auto where = choose_weight_storage(requested, weight_copy_bytes(*model, ranges),
                                     available_memory_bytes(), why);
  if (!where) return make_error(0, model->path + ": " + where.error().message);
  if (*where == WeightStorage::kMap) return model;
  return copy_weights_to_memory(std::move(model), ranges, threads, tile_types);
}

namespace {

// The views to copy, as byte intervals, sorted; overlapping or touching ones merge (a tied
// head, the slices of a stacked expert tensor).
std::vector<Interval> copy_intervals(const Model& model,
                                     const std::vector<std::span<const uint8_t>>& ranges) {
  std::vector<Interval> iv;
  for_each_weight(model.spec, [&](const WeightView& w) {
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
  return merged;
}

}  // namespace

uint64_t weight_copy_bytes(const Model& model,
                           const std::vector<std::span<const uint8_t>>& ranges) {
  uint64_t total = 0;
  for (const auto& m : copy_intervals(model, ranges))
    total += static_cast<uint64_t>(m.end - m.begin);
  return total;
}

namespace {

// Tiles (weight_tiles.h) every tileable view of a type in `types` lying in [base, base + bytes),
// in place, and marks it and every view of the same bytes (a tied head) kTiles16. A view
// overlapping another view that is not the same matrix stays in rows, and so does an F8_E4M3
// view that f8_tiles_suit refuses.
void tile_copied_views(ModelSpec& spec, uint8_t* base, uint64_t bytes, int threads,
                       TileTypes types) {
  std::vector<WeightView*> in_copy;
  for_each_weight(spec, [&](WeightView& w) {
    if (w.present() && w.data >= base && w.data + w.nbytes() <= base + bytes) in_copy.push_back(&w);
  });
  std::sort(in_copy.begin(), in_copy.end(),
            [](const WeightView* a, const WeightView* b) { return a->data < b->data; });
  auto same = [](const WeightView* a, const WeightView* b) {
    return a->data == b->data && a->type == b->type && a->ne[0] == b->ne[0] &&
           a->ne[1] == b->ne[1] && a->ne[2] == b->ne[2];
  };
  // Groups of views of the same matrix, in address order; a group is tiled when it is
  // tileable and no other group overlaps it.
  std::vector<std::pair<size_t, size_t>> groups;  // [first, last) in in_copy
  for (size_t i = 0; i < in_copy.size();) {
    size_t e = i + 1;
    while (e < in_copy.size() && same(in_copy[i], in_copy[e])) ++e;
    groups.emplace_back(i, e);
    i = e;
  }
  std::vector<size_t> todo;             // group indices
  const uint8_t* end_so_far = nullptr;  // the furthest end of all earlier groups
  for (size_t g = 0; g < groups.size(); ++g) {
    const WeightView* w = in_copy[groups[g].first];
    // Groups start in address order: one overlaps an earlier group (not only the one just
    // before: a large view may hold several) when that group ends past its start, and a later
    // one when the next group starts before its end.
    const bool overlaps_earlier = end_so_far != nullptr && end_so_far > w->data;
    const bool overlaps_next =
        g + 1 < groups.size() && w->data + w->nbytes() > in_copy[groups[g + 1].first]->data;
    if (tileable(*w) && types.has(w->type) && !overlaps_earlier && !overlaps_next)
      todo.push_back(g);
    // (A group's views are one matrix: the same start and size.)
    const uint8_t* end = w->data + w->nbytes();
    if (end_so_far == nullptr || end > end_so_far) end_so_far = end;
  }
  std::atomic<size_t> next{0};
  // An F8_E4M3 matrix with a NaN code, a huge scale or many subnormal codes stays in rows
  // (f8_tiles_suit).
  std::vector<char> tiled(todo.size(), 0);
  auto work = [&] {
    for (size_t k = next++; k < todo.size(); k = next++) {
      const WeightView* w = in_copy[groups[todo[k]].first];
      if (w->type == GgmlType::kF8_E4M3 && !f8_tiles_suit(*w)) continue;
      tile_in_place(w->type, const_cast<uint8_t*>(w->data), w->rows(), w->cols(), w->ne[2]);
      tiled[k] = 1;
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  for (size_t k = 0; k < todo.size(); ++k)
    for (size_t i = groups[todo[k]].first; tiled[k] != 0 && i < groups[todo[k]].second; ++i)
      in_copy[i]->layout = WeightLayout::kTiles16;
}

}  // namespace

Result<std::shared_ptr<const Model>> copy_weights_to_memory(
    std::shared_ptr<const Model> model, const std::vector<std::span<const uint8_t>>& ranges,
    int threads, TileTypes tile_types) {
  std::vector<Interval> merged = copy_intervals(*model, ranges);
  // Each interval starts 64-byte aligned in the copy, like the tensors of a GGUF file.
  uint64_t total = 0;
  for (auto& m : merged) {
    m.offset = total;
    total += (static_cast<uint64_t>(m.end - m.begin) + 63) / 64 * 64;
  }
  auto copy = std::make_shared<Model>(*model);
  if (total == 0) return std::shared_ptr<const Model>(std::move(copy));
  const uint64_t bytes = huge_page_round(total);
  std::shared_ptr<uint8_t> mem = map_huge_pages(bytes);
  if (!mem)
    return make_error(
        0, strfmt("%s: cannot allocate %.1f MB for the weights in memory: %s", model->path.c_str(),
                  static_cast<double>(bytes) / 1e6, std::strerror(errno)));
  uint8_t* base = mem.get();
  // Copy in 8 MiB pieces handed out to the threads. A piece that lies in a file mapping is read
  // from the file with pread (the page cache's copy, or the disk, in large reads): reading it
  // through the mapping instead page-faults 4 KiB at a time, ~10x slower (a 1.2 GB model: 0.6-1.1
  // GB/s against 7-11 GB/s, docs/benchmarks.md "Engine, session 7"). Elsewhere (weights the
  // loader converted into memory), or if the read fails, memcpy.
  struct OpenFile {
    int fd = -1;
    struct stat st {};
  };
  std::map<std::string, OpenFile> files;  // opened on first use
  const std::vector<FileMapping> maps = file_mappings();
  // The file descriptor and offset to pread n bytes at src from, or -1 (read the memory).
  auto file_source = [&](const uint8_t* src, uint64_t n, uint64_t* file_off) -> int {
    const FileMapping* it = mapping_of(maps, src, n);
    if (it == nullptr) return -1;  // not (wholly) in a file mapping
    auto [at, fresh] = files.try_emplace(it->path);
    OpenFile& f = at->second;
    if (fresh) {
      f.fd = ::open(it->path.c_str(), O_RDONLY | O_CLOEXEC);
      if (f.fd >= 0 && ::fstat(f.fd, &f.st) != 0) {
        ::close(f.fd);
        f.fd = -1;
      }
    }
    // Only the very file that is mapped: the path may name another one now (replaced since).
    if (f.fd < 0 || f.st.st_ino != it->inode || major(f.st.st_dev) != it->dev_major ||
        minor(f.st.st_dev) != it->dev_minor)
      return -1;
    *file_off = it->offset + (reinterpret_cast<uintptr_t>(src) - it->begin);
    return f.fd;
  };
  constexpr uint64_t kPiece = uint64_t{8} << 20;
  struct Piece {
    uint8_t* dst;
    const uint8_t* src;
    uint64_t n;
    int fd;  // -1: memcpy from src
    uint64_t file_off = 0;
  };
  std::vector<Piece> pieces;
  for (const Interval& m : merged)
    for (uint64_t off = 0; off < static_cast<uint64_t>(m.end - m.begin); off += kPiece) {
      Piece pc{base + m.offset + off, m.begin + off,
               std::min<uint64_t>(kPiece, static_cast<uint64_t>(m.end - m.begin) - off), -1};
      pc.fd = file_source(pc.src, pc.n, &pc.file_off);
      pieces.push_back(pc);
    }
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t k = next++; k < pieces.size(); k = next++) {
      const Piece& pc = pieces[k];
      if (pc.fd < 0 || !pread_all(pc.fd, pc.dst, pc.n, pc.file_off))
        std::memcpy(pc.dst, pc.src, pc.n);
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  for (const auto& [path, f] : files)
    if (f.fd >= 0) ::close(f.fd);
  // Drop the copied file pages from this process (the page cache may keep them): the mapping
  // stays valid and would fault them in again if anything read it. Only file mappings: on
  // anonymous memory (weights a loader converted, an earlier copy) MADV_DONTNEED would zero the
  // source, which the model copied from may still read.
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  for (const auto& m : merged) {
    if (!mapping_of(maps, m.begin, static_cast<uint64_t>(m.end - m.begin))) continue;
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
  if (!tile_types.empty()) tile_copied_views(copy->spec, base, bytes, threads, tile_types);
  ::mprotect(base, bytes, PROT_READ);  // weights are read-only, as in the mapping
  copy->storage.push_back(std::move(mem));
  return std::shared_ptr<const Model>(std::move(copy));
}

}  // namespace troupe::model
