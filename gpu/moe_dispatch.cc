// MoeForward::run_dispatch (gpu/moe.h): a MoE layer whose experts are spread over a group of GPUs
// and whose tokens stay on the rank that owns their sequence (data-parallel attention, expert
// parallelism). Rows travel by the group's all-to-all (gpu/collective.h): out to the experts'
// owners and back.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "base/check.h"
#include "gpu/collective.h"
#include "gpu/moe.h"
#include "gpu/runtime.h"

namespace troupe::gpu {

namespace {

long long ll(int64_t v) { return static_cast<long long>(v); }
size_t sz(int64_t v) { return static_cast<size_t>(v); }

}  // namespace

void MoeForward::run_dispatch(const MoeForwardArgs& a, Collective& group, Arena& arena,
                              cudaStream_t stream) {
  const int64_t ne = routing_.n_expert, k = routing_.k, d = a.experts.d;
  check_args(a);
  const int64_t P = group.size(), r = group.rank();
  if (ne % P != 0)
    TROUPE_INPUT_ERROR("MoeForward: %lld experts do not divide over a group of %lld ranks", ll(ne),
                       ll(P));
  const int64_t EC = ne / P;
  if (a.experts.n_expert != EC || a.expert_begin != r * EC)
    TROUPE_INPUT_ERROR(
        "MoeForward: rank %lld of %lld must hold experts [%lld, %lld), the weights hold [%lld, "
        "%lld)",
        ll(r), ll(P), ll(r * EC), ll((r + 1) * EC), ll(a.expert_begin),
        ll(a.expert_begin + a.experts.n_expert));
  const int64_t n_ent = a.n_tok * k;
  ArenaScope scope(arena);
  const size_t ents = sz(std::max<int64_t>(n_ent, 1));
  int32_t* ids = arena.allocate_n<int32_t>(ents, "moe ids");
  float* weights = arena.allocate_n<float>(ents, "moe weights");
  MoePermutation perm;
  perm.counts = arena.allocate_n<int32_t>(sz(ne), "moe counts");
  perm.offsets = arena.allocate_n<int32_t>(sz(ne + 1), "moe offsets");
  perm.row_entry = arena.allocate_n<int32_t>(ents, "moe row_entry");
  perm.entry_row = arena.allocate_n<int32_t>(ents, "moe entry_row");
  int32_t* recv_counts = arena.allocate_n<int32_t>(sz(ne), "moe counts from every rank");
  auto* x_sorted = arena.allocate_n<__nv_bfloat16>(ents * sz(d), "moe x_sorted");
  float* expert_out = arena.allocate_n<float>(ents * sz(d), "moe expert_out");

  // 1. Route and group this rank's entries by expert: the rows for rank p's experts are one run.
  if (a.n_tok > 0)
    launch_moe_route(routing_, a.router_logits, a.router_bias, a.n_tok, ids, weights, stream);
  launch_moe_permute(ids, a.n_tok, k, ne, a.x, d, x_sorted, perm, stream);
  TROUPE_CUDA_CHECK(cudaMemcpyAsync(offsets_host_, perm.offsets, offsets_len_ * sizeof(int32_t),
                                    cudaMemcpyDeviceToHost, stream));
  // 2. Every rank tells each owner how many of its rows go to each of the owner's experts.
  const std::vector<size_t> count_bytes(sz(P), sz(EC) * sizeof(int32_t));
  group.all_to_all(perm.counts, count_bytes, recv_counts, count_bytes, stream);
  TROUPE_CUDA_CHECK(cudaMemcpyAsync(recv_counts_host_, recv_counts, sz(ne) * sizeof(int32_t),
                                    cudaMemcpyDeviceToHost, stream));
  group.synchronize(stream);  // a dead peer throws here instead of hanging
  TROUPE_CHECK(offsets_host_[ne] == n_ent,
               "MoE routing counted %d of %lld (token, slot) entries: an expert id is outside "
               "[0, %lld)",
               offsets_host_[ne], ll(n_ent), ll(ne));
  std::vector<int64_t> send_rows(sz(P)), recv_rows(sz(P), 0);
  for (int64_t p = 0; p < P; ++p) {
    send_rows[sz(p)] = offsets_host_[(p + 1) * EC] - offsets_host_[p * EC];
    for (int64_t e = 0; e < EC; ++e) {
      const int32_t c = recv_counts_host_[p * EC + e];
      TROUPE_CHECK(c >= 0 && c <= (int32_t{1} << 30),
                   "MoE dispatch: rank %lld sends %d rows for expert %lld", ll(p), c,
                   ll(r * EC + e));
      recv_rows[sz(p)] += c;
    }
  }
  int64_t R = 0;
  for (int64_t c : recv_rows) R += c;

  // 3. Rows out to the owners (packed by owner: x_sorted's order), theirs in (packed by sender).
  auto* xr = arena.allocate_n<__nv_bfloat16>(sz(std::max<int64_t>(R, 1) * d), "moe rows in");
  float* yr = arena.allocate_n<float>(sz(std::max<int64_t>(R, 1) * d), "moe results out");
  std::vector<size_t> sb(sz(P)), rb(sz(P));
  for (int64_t p = 0; p < P; ++p) {
    sb[sz(p)] = sz(send_rows[sz(p)] * d) * sizeof(__nv_bfloat16);
    rb[sz(p)] = sz(recv_rows[sz(p)] * d) * sizeof(__nv_bfloat16);
  }
  group.all_to_all(x_sorted, sb, xr, rb, stream);

  // 4. This rank's experts over each sender's block (sorted by expert within it).
  std::vector<int32_t> local(sz(EC + 1));
  int64_t at = 0;
  for (int64_t q = 0; q < P; ++q) {
    local[0] = 0;
    for (int64_t e = 0; e < EC; ++e)
      local[sz(e + 1)] = local[sz(e)] + recv_counts_host_[q * EC + e];
    if (recv_rows[sz(q)] > 0)
      run_moe_experts(*gemm_, a.experts, local, xr + at * d, yr + at * d, arena, stream);
    at += recv_rows[sz(q)];
  }

  // 5. Results back to the senders; they arrive in x_sorted's order, where the combine reads them.
  for (int64_t p = 0; p < P; ++p) {
    sb[sz(p)] = sz(recv_rows[sz(p)] * d) * sizeof(float);
    rb[sz(p)] = sz(send_rows[sz(p)] * d) * sizeof(float);
  }
  group.all_to_all(yr, sb, expert_out, rb, stream);
  if (a.n_tok > 0) combine(a, expert_out, perm.entry_row, weights, stream);
}

}  // namespace troupe::gpu
