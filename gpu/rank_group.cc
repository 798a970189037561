// The ranks of a GPU group and their threads (gpu/detail/rank_group.h).
#include "gpu/detail/rank_group.h"

#include <algorithm>
#include <cstddef>
#include <exception>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "base/check.h"
#include "gpu/comm.h"
#include "gpu/runtime.h"

namespace troupe::gpu::detail {

namespace {
constexpr int kErrBadInput = static_cast<int>(Errc::kBadInput);
}  // namespace

std::string device_list(const std::vector<int>& d) {
  std::string s;
  for (size_t i = 0; i < d.size(); ++i) s += (i ? "," : "") + std::to_string(d[i]);
  return s;
}

RankGroup::~RankGroup() {
  ranks.clear();         // engines before the collectives they point to
  destroy_group(group);  // NCCL: collective, every rank at once
}

Result<std::unique_ptr<RankGroup>> make_rank_group(std::shared_ptr<const model::Model> model,
                                                   const GpuEngineOptions& opts,
                                                   const std::vector<int>& devices, GroupRole role,
                                                   int64_t rank_kv_blocks, const char* who) {
  const std::string w = who;
  if (devices.empty()) return Error{kErrBadInput, w + ": no devices"};
  if (!model) return Error{kErrBadInput, w + ": no model"};
  const std::set<int> distinct(devices.begin(), devices.end());
  const int n = static_cast<int>(devices.size());
  if (distinct.size() != 1 && distinct.size() != devices.size())
    return Error{kErrBadInput,
                 strfmt("%s: devices %s: a group uses one GPU per rank (all different) or one GPU "
                        "for every rank (the one-GPU stand-in), not a mix",
                        who, device_list(devices).c_str())};
  auto g = std::make_unique<RankGroup>();
  RankGroup& m = *g;
  m.devices = devices;
  m.nccl = n > 1 && distinct.size() == devices.size();
  const auto T = static_cast<size_t>(std::max<int64_t>(opts.max_step_tokens, 1));
  const auto E = static_cast<size_t>(std::max<int64_t>(model->spec.n_embd, 1));
  const auto k = static_cast<size_t>(std::max<int64_t>(model->spec.n_expert_used, 1));
  // Tensor: one sum of T x E floats at a time. Expert: the largest exchange is the results of
  // every rank's T x k rows (GpuEngineOptions::ep).
  const size_t capacity = role == GroupRole::kTensor ? T * E : 64;
  const size_t a2a = role == GroupRole::kExpert ? static_cast<size_t>(n) * T * k * E * 4 : 0;
  m.ranks.resize(static_cast<size_t>(n));
  std::vector<std::optional<Error>> errors(static_cast<size_t>(n));

  // Rank r's engine on its device; errors say which rank and GPU.
  auto make_rank = [&](int r) {
    const auto ru = static_cast<size_t>(r);
    GpuEngineOptions o = opts;
    o.device = devices[ru];
    o.tp = nullptr;
    o.ep = nullptr;
    if (n > 1) (role == GroupRole::kTensor ? o.tp : o.ep) = m.group[ru].get();
    if (role == GroupRole::kExpert) o.kv_num_blocks = rank_kv_blocks;
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
      return Error{static_cast<int>(Errc::kNoDevice), w + ": no usable CUDA GPU: " + why};
    int count = 0;
    TROUPE_CUDA_CHECK(cudaGetDeviceCount(&count));
    for (int d : devices)
      if (d < 0 || d >= count)
        return Error{kErrBadInput,
                     strfmt("%s: device %d does not exist (%d CUDA devices)", who, d, count)};
    if (n == 1) {
      make_rank(0);
    } else if (!m.nccl) {
      TROUPE_CUDA_CHECK(cudaSetDevice(devices[0]));
      m.group = make_local_group(n, capacity, a2a);
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
    return Error{static_cast<int>(ex.code()), w + ": " + ex.what()};
  } catch (const std::exception& ex) {
    return Error{kErrBadInput, w + ": " + ex.what()};
  }
  for (auto& e : errors)
    if (e) return Error{e->code, w + ": " + e->message};
  return g;
}

uint64_t RankGroup::weight_bytes() const {
  uint64_t b = 0;
  for (const auto& e : ranks) b += e->weight_bytes();
  return b;
}

uint64_t RankGroup::kv_bytes() const {
  uint64_t b = 0;
  for (const auto& e : ranks) b += e->kv_bytes();
  return b;
}

}  // namespace troupe::gpu::detail
