// MoE on the GPU against a CPU reference that follows compute/engine.cc Engine::moe(): routing
// (Mixtral, Qwen3 normalized, DeepSeek-V3 sigmoid + bias + group-limited, DeepSeek-V2 softmax
// with groups ranked by their best; ids identical, ties to the lower id), the stable permutation
// by expert, the grouped SwiGLU experts, the fixed-order combine (bitwise without a shared gate),
// the whole layer, and its batch invariance.
// Tolerances: routing weights rtol 1e-5 (expf differs from glibc's by 1-2 ulp). Expert outputs:
// the SwiGLU product is rounded to bf16 before the down GEMM, and a 1-ulp f32 difference in gate
// or up can flip that rounding; each flip moves an output by <= |w_down| * ulp_bf16(act), so atol
// = 2 * max|w_down| * max ulp_bf16(act) (+ the routed weights' sum for a whole layer), rtol 1e-4.
#include "gpu/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "base/check.h"
#include "gpu/gemm.h"
#include "gpu/runtime.h"
#include "tests/gpu/gpu_test_util.h"

namespace troupe::gpu {
namespace {

using testing::all_close;
using testing::from_bf16;
using testing::random_floats;
using testing::round_bf16;
using testing::to_bf16;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// ---- CPU reference (engine.cc Engine::moe, statement for statement) ----------------------------

/// Routes one token like the CPU engine; returns the selection margin (the gap between the k-th
/// and the (k+1)-th selection score, and between the last kept and the first dropped group).
float ref_route_token(const MoeRouting& s, const float* lg, const float* bias, int32_t* sel_id,
                      float* sel_w) {
  const int64_t NE = s.n_expert, K = s.k;
  std::vector<float> probs(static_cast<size_t>(NE)), selp(static_cast<size_t>(NE));
  std::vector<int32_t> order(static_cast<size_t>(NE));
  if (s.gating == model::Gating::kSoftmax) {
    float mx = kNegInf;
    for (int64_t e = 0; e < NE; ++e) mx = std::max(mx, lg[e]);
    double sum = 0;
    for (int64_t e = 0; e < NE; ++e) {
      probs[static_cast<size_t>(e)] = std::exp(lg[e] - mx);
      sum += probs[static_cast<size_t>(e)];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t e = 0; e < NE; ++e) probs[static_cast<size_t>(e)] *= inv;
  } else {
    for (int64_t e = 0; e < NE; ++e)
      probs[static_cast<size_t>(e)] = 1.0f / (1.0f + std::exp(-lg[e]));
  }
  for (int64_t e = 0; e < NE; ++e)
    selp[static_cast<size_t>(e)] = probs[static_cast<size_t>(e)] + (bias ? bias[e] : 0.f);
  float margin = std::numeric_limits<float>::infinity();
  if (s.n_group > 1 && s.n_group_used < s.n_group) {
    const int64_t per = NE / s.n_group;
    std::vector<std::pair<float, int64_t>> gs;
    for (int64_t g = 0; g < s.n_group; ++g) {
      float b1 = kNegInf, b2 = kNegInf;
      for (int64_t e = g * per; e < (g + 1) * per; ++e) {
        const float v = selp[static_cast<size_t>(e)];
        if (v > b1) {
          b2 = b1;
          b1 = v;
        } else if (v > b2) {
          b2 = v;
        }
      }
      gs.emplace_back(s.group_score == model::GroupScore::kMax ? b1 : b1 + b2, g);
    }
    std::stable_sort(gs.begin(), gs.end(), [](auto& a, auto& b) { return a.first > b.first; });
    margin = std::min(margin, gs[static_cast<size_t>(s.n_group_used - 1)].first -
                                  gs[static_cast<size_t>(s.n_group_used)].first);
    std::vector<bool> keep(static_cast<size_t>(s.n_group), false);
    for (int64_t g = 0; g < s.n_group_used; ++g)
      keep[static_cast<size_t>(gs[static_cast<size_t>(g)].second)] = true;
    for (int64_t e = 0; e < NE; ++e)
      if (!keep[static_cast<size_t>(e / per)]) selp[static_cast<size_t>(e)] = kNegInf;
  }
  for (int64_t e = 0; e < NE; ++e) order[static_cast<size_t>(e)] = static_cast<int32_t>(e);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return selp[static_cast<size_t>(a)] > selp[static_cast<size_t>(b)];
  });
  if (K < NE) {
    const float gap = selp[static_cast<size_t>(order[static_cast<size_t>(K - 1)])] -
                      selp[static_cast<size_t>(order[static_cast<size_t>(K)])];
    if (!std::isnan(gap)) margin = std::min(margin, gap);
  }
  double wsum = 0;
  for (int64_t k = 0; k < K; ++k) {
    const int32_t e = order[static_cast<size_t>(k)];
    sel_id[k] = e;
    sel_w[k] = probs[static_cast<size_t>(e)];
    wsum += probs[static_cast<size_t>(e)];
  }
  for (int64_t k = 0; k < K; ++k) {
    float& w = sel_w[k];
    if (s.norm_topk) w = w / static_cast<float>(wsum);
    w *= s.routed_scale;
  }
  return margin;
}

struct RefRoute {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

RefRoute ref_route(const MoeRouting& r, const std::vector<float>& logits, const float* bias,
                   int64_t n_tok) {
  RefRoute out;
  out.ids.resize(static_cast<size_t>(n_tok * r.k));
  out.weights.resize(out.ids.size());
  for (int64_t t = 0; t < n_tok; ++t)
    ref_route_token(r, &logits[static_cast<size_t>(t * r.n_expert)], bias, &out.ids[t * r.k],
                    &out.weights[t * r.k]);
  return out;
}

/// Random logits in [lo, hi) whose routing has no near-ties (margin > 1e-5 for every token), so
/// that 1-2 ulp differences of expf cannot change the chosen experts.
std::vector<float> tie_free_logits(const MoeRouting& r, const float* bias, int64_t n_tok,
                                   uint64_t seed, float lo, float hi) {
  std::vector<float> out(static_cast<size_t>(n_tok * r.n_expert));
  std::vector<int32_t> ids(static_cast<size_t>(r.k));
  std::vector<float> w(static_cast<size_t>(r.k));
  for (int64_t t = 0; t < n_tok; ++t) {
    for (int attempt = 0;; ++attempt) {
      const auto lg =
          random_floats(static_cast<size_t>(r.n_expert),
                        seed * 1000003 + static_cast<uint64_t>(t * 131 + attempt), lo, hi);
      if (ref_route_token(r, lg.data(), bias, ids.data(), w.data()) > 1e-5f || attempt > 200) {
        std::copy(lg.begin(), lg.end(), out.begin() + t * r.n_expert);
        break;
      }
    }
  }
  return out;
}

struct RefPerm {
  std::vector<int32_t> counts, offsets, row_entry, entry_row;
};

/// engine.cc's gather order: per expert, its entries t * k + slot in increasing order.
RefPerm ref_permute(const std::vector<int32_t>& ids, int64_t n_expert) {
  RefPerm p;
  p.counts.assign(static_cast<size_t>(n_expert), 0);
  p.offsets.assign(static_cast<size_t>(n_expert + 1), 0);
  p.entry_row.assign(ids.size(), -1);
  for (int64_t e = 0; e < n_expert; ++e) {
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] != e) continue;
      p.entry_row[i] = static_cast<int32_t>(p.row_entry.size());
      p.row_entry.push_back(static_cast<int32_t>(i));
      ++p.counts[static_cast<size_t>(e)];
    }
    p.offsets[static_cast<size_t>(e + 1)] = static_cast<int32_t>(p.row_entry.size());
  }
  return p;
}

float bf16_ulp(float v) {
  if (v == 0.f) return std::ldexp(1.0f, -133);
  int exp = 0;
  std::frexp(v, &exp);  // v = f * 2^exp, 0.5 <= |f| < 1: bf16 keeps 8 significant bits
  return std::ldexp(1.0f, exp - 8);
}

/// Experts' weights (bf16-rounded host copies) and the reference FFN of one row.
struct RefExperts {
  int64_t n_expert, d, ff;
  std::vector<float> gate, up, down;  // [ne, ff, d], [ne, ff, d], [ne, d, ff]
  float max_abs_down = 0, max_act_ulp = 0;

  RefExperts(int64_t ne, int64_t d_, int64_t ff_, uint64_t seed) : n_expert(ne), d(d_), ff(ff_) {
    gate = round_bf16(random_floats(static_cast<size_t>(ne * ff * d), seed, -0.1f, 0.1f));
    up = round_bf16(random_floats(static_cast<size_t>(ne * ff * d), seed + 1, -0.1f, 0.1f));
    down = round_bf16(random_floats(static_cast<size_t>(ne * d * ff), seed + 2, -0.5f, 0.5f));
    for (float v : down) max_abs_down = std::max(max_abs_down, std::fabs(v));
  }
  /// out f32 [d] = down(bf16(silu(gate x) * up x)), sums in double over the bf16 values.
  void run(int64_t e, const float* x, float* out) {
    std::vector<float> act(static_cast<size_t>(ff));
    for (int64_t j = 0; j < ff; ++j) {
      double g = 0, u = 0;
      for (int64_t c = 0; c < d; ++c) {
        g += static_cast<double>(x[c]) * gate[static_cast<size_t>((e * ff + j) * d + c)];
        u += static_cast<double>(x[c]) * up[static_cast<size_t>((e * ff + j) * d + c)];
      }
      const float gf = static_cast<float>(g), uf = static_cast<float>(u);
      const float silu = gf / (1.0f + std::exp(-gf));
      act[static_cast<size_t>(j)] = from_bf16(to_bf16(silu * uf));
      max_act_ulp = std::max(max_act_ulp, bf16_ulp(act[static_cast<size_t>(j)]));
    }
    for (int64_t o = 0; o < d; ++o) {
      double acc = 0;
      for (int64_t j = 0; j < ff; ++j)
        acc += static_cast<double>(act[static_cast<size_t>(j)]) *
               down[static_cast<size_t>((e * d + o) * ff + j)];
      out[o] = static_cast<float>(acc);
    }
  }
  /// The bound on one output's error from bf16 rounding flips of the activation (2 flips).
  float flip_tolerance() const { return 2.0f * max_abs_down * max_act_ulp + 1e-5f; }
};

/// engine.cc's combine: slot_out = de * w, then y = slot 0, y += slot s, then + shared * g.
std::vector<float> ref_combine(int64_t n_tok, int64_t k, int64_t d,
                               const std::vector<float>& expert_out,
                               const std::vector<int32_t>& entry_row,
                               const std::vector<float>& weights, const float* shared,
                               const float* gate_logit) {
  std::vector<float> y(static_cast<size_t>(n_tok * d)), slot(static_cast<size_t>(k * d));
  for (int64_t t = 0; t < n_tok; ++t) {
    for (int64_t s = 0; s < k; ++s) {
      const int64_t row = entry_row[static_cast<size_t>(t * k + s)];
      const float w = weights[static_cast<size_t>(t * k + s)];
      for (int64_t j = 0; j < d; ++j)
        slot[static_cast<size_t>(s * d + j)] = expert_out[static_cast<size_t>(row * d + j)] * w;
    }
    float* yt = &y[static_cast<size_t>(t * d)];
    std::memcpy(yt, slot.data(), static_cast<size_t>(d) * 4);
    for (int64_t s = 1; s < k; ++s)
      for (int64_t j = 0; j < d; ++j) yt[j] += slot[static_cast<size_t>(s * d + j)];
    if (shared) {
      float g = 1.f;
      if (gate_logit) g = 1.0f / (1.0f + std::exp(-gate_logit[t]));
      for (int64_t j = 0; j < d; ++j) yt[j] += shared[t * d + j] * g;
    }
  }
  return y;
}

// ---- fixtures ---------------------------------------------------------------------------------

template <class F>
void expect_input_error(F&& f, const std::string& needle);

class MoeGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!gpu_available(&why)) GTEST_SKIP() << "no usable CUDA GPU: " << why;
    ws_ = std::make_unique<DeviceBuffer<uint8_t>>(Gemm::kDefaultWorkspaceBytes);
    gemm_ = std::make_unique<Gemm>(ws_->get(), ws_->size());
    arena_ = std::make_unique<Arena>(size_t{256} << 20);
    streams_ = std::make_unique<StreamPair>();
  }
  cudaStream_t stream() const { return streams_->compute(); }
  void sync() { TROUPE_CUDA_CHECK(cudaStreamSynchronize(stream())); }

  std::unique_ptr<DeviceBuffer<uint8_t>> ws_;
  std::unique_ptr<Gemm> gemm_;
  std::unique_ptr<Arena> arena_;
  std::unique_ptr<StreamPair> streams_;
};

template <class T>
DeviceBuffer<T> device_copy(const std::vector<T>& v) {
  DeviceBuffer<T> b(v.size());
  b.upload(v);
  return b;
}

template <class T>
DeviceBuffer<T> poisoned(size_t n) {
  DeviceBuffer<T> b(n);
  b.fill_bytes(0xFF);
  return b;
}

/// Routes on the GPU and expects the CPU's ids exactly and its weights within rtol 1e-5.
void check_routing(const MoeRouting& r, const std::vector<float>& logits,
                   const std::vector<float>* bias, int64_t n_tok, cudaStream_t stream) {
  auto d_logits = device_copy(logits);
  DeviceBuffer<float> d_bias;
  if (bias) d_bias = device_copy(*bias);
  auto d_ids = poisoned<int32_t>(static_cast<size_t>(n_tok * r.k));
  auto d_w = poisoned<float>(static_cast<size_t>(n_tok * r.k));
  launch_moe_route(r, d_logits.get(), bias ? d_bias.get() : nullptr, n_tok, d_ids.get(), d_w.get(),
                   stream);
  TROUPE_CUDA_CHECK(cudaStreamSynchronize(stream));
  const RefRoute want = ref_route(r, logits, bias ? bias->data() : nullptr, n_tok);
  const std::vector<int32_t> ids = d_ids.download();
  for (int64_t t = 0; t < n_tok; ++t) {
    const auto b = ids.begin() + t * r.k;
    const std::vector<int32_t> got(b, b + r.k),
        exp(want.ids.begin() + t * r.k, want.ids.begin() + (t + 1) * r.k);
    ASSERT_EQ(got, exp) << "token " << t;
  }
  EXPECT_TRUE(all_close(d_w.download(), want.weights, 1e-5f, 1e-7f, "routing weights"));
}

TEST_F(MoeGpu, MixtralSoftmaxTopKMatchesCpu) {
  TROUPE_REQUIRE_GPU();
  MoeRouting r;
  r.n_expert = 8;
  r.k = 2;
  const int64_t n_tok = 300;
  check_routing(r, tie_free_logits(r, nullptr, n_tok, 1, -4.f, 4.f), nullptr, n_tok, stream());
}

TEST_F(MoeGpu, Qwen3NormalizedTopKMatchesCpu) {
  TROUPE_REQUIRE_GPU();
  MoeRouting r;
  r.n_expert = 128;
  r.k = 8;
  r.norm_topk = true;
  const int64_t n_tok = 200;
  check_routing(r, tie_free_logits(r, nullptr, n_tok, 2, -4.f, 4.f), nullptr, n_tok, stream());
}

TEST_F(MoeGpu, DeepSeekV3GroupLimitedSigmoidMatchesCpu) {
  TROUPE_REQUIRE_GPU();
  MoeRouting r;  // DeepSeek-V3: 256 experts, 8 groups of 32, 4 groups kept, 8 experts per token
  r.n_expert = 256;
  r.k = 8;
  r.gating = model::Gating::kSigmoid;
  r.norm_topk = true;
  r.routed_scale = 2.5f;
  r.n_group = 8;
  r.n_group_used = 4;
  const int64_t n_tok = 150;
  const auto bias = random_floats(256, 3, -0.1f, 0.1f);
  check_routing(r, tie_free_logits(r, bias.data(), n_tok, 4, -3.f, 3.f), &bias, n_tok, stream());
  // The same without the bias and without normalization (the bias only moves the selection).
  r.norm_topk = false;
  check_routing(r, tie_free_logits(r, nullptr, n_tok, 5, -3.f, 3.f), nullptr, n_tok, stream());
}

TEST_F(MoeGpu, DeepSeekV2GroupLimitedSoftmaxMatchesCpu) {
  TROUPE_REQUIRE_GPU();
  MoeRouting r;  // DeepSeek-V2: 160 experts, 8 groups of 20 ranked by their best, 3 kept, 6 used
  r.n_expert = 160;
  r.k = 6;
  r.gating = model::Gating::kSoftmax;
  r.routed_scale = 16.f;
  r.n_group = 8;
  r.n_group_used = 3;
  r.group_score = model::GroupScore::kMax;
  const int64_t n_tok = 150;
  check_routing(r, tie_free_logits(r, nullptr, n_tok, 7, -3.f, 3.f), nullptr, n_tok, stream());
}

TEST_F(MoeGpu, TiesPickTheLowerExpertIdLikeTheCpu) {
  TROUPE_REQUIRE_GPU();
  // Logits from {-1, 0, 1}: many exact ties in scores and in group scores.
  std::mt19937 rng(6);
  std::uniform_int_distribution<int> pick(-1, 1);
  const int64_t n_tok = 64;
  for (auto gating : {model::Gating::kSoftmax, model::Gating::kSigmoid}) {
    MoeRouting r;
    r.n_expert = 16;
    r.k = 4;
    r.gating = gating;
    r.norm_topk = true;
    r.n_group = 4;
    r.n_group_used = 2;
    std::vector<float> logits(static_cast<size_t>(n_tok * r.n_expert));
    for (auto& v : logits) v = static_cast<float>(pick(rng));
    check_routing(r, logits, nullptr, n_tok, stream());
    // More experts than the kept groups hold: the rest are -inf and still chosen in id order.
    r.k = 10;
    check_routing(r, logits, nullptr, n_tok, stream());
  }
}

/// Runs the permutation and checks every output exactly against ref_permute.
void check_permutation(const std::vector<int32_t>& ids, int64_t n_tok, int64_t k, int64_t n_expert,
                       int64_t d, cudaStream_t stream) {
  SCOPED_TRACE(strfmt("n_tok=%lld k=%lld n_expert=%lld d=%lld", static_cast<long long>(n_tok),
                      static_cast<long long>(k), static_cast<long long>(n_expert),
                      static_cast<long long>(d)));
  const size_t n = ids.size();
  const auto x = to_bf16(random_floats(static_cast<size_t>(n_tok * d), 11));
  auto d_ids = device_copy(ids);
  auto d_x = device_copy(x);
  auto d_xs = poisoned<__nv_bfloat16>(n * static_cast<size_t>(d));
  auto counts = poisoned<int32_t>(static_cast<size_t>(n_expert));
  auto offsets = poisoned<int32_t>(static_cast<size_t>(n_expert + 1));
  auto row_entry = poisoned<int32_t>(n), entry_row = poisoned<int32_t>(n);
  MoePermutation p{counts.get(), offsets.get(), row_entry.get(), entry_row.get()};
  launch_moe_permute(d_ids.get(), n_tok, k, n_expert, d_x.get(), d, d_xs.get(), p, stream);
  TROUPE_CUDA_CHECK(cudaStreamSynchronize(stream));
  const RefPerm want = ref_permute(ids, n_expert);
  EXPECT_EQ(counts.download(), want.counts);
  EXPECT_EQ(offsets.download(), want.offsets);
  EXPECT_EQ(row_entry.download(), want.row_entry);
  EXPECT_EQ(entry_row.download(), want.entry_row);
  const auto xs = d_xs.download();
  for (size_t r = 0; r < n; ++r) {
    const int64_t tok = want.row_entry[r] / k;
    ASSERT_EQ(0, std::memcmp(&xs[r * static_cast<size_t>(d)], &x[static_cast<size_t>(tok * d)],
                             static_cast<size_t>(d) * sizeof(__nv_bfloat16)))
        << "sorted row " << r << " is not token " << tok;
  }
}

TEST_F(MoeGpu, PermutationGroupsByExpertInTokenThenSlotOrder) {
  TROUPE_REQUIRE_GPU();
  // 6 tokens x 2 slots over 5 experts; expert 2 is chosen by 5 entries, expert 4 by none.
  const std::vector<int32_t> ids = {2, 0, 2, 1, 0, 2, 3, 2, 2, 0, 1, 3};
  const RefPerm want = ref_permute(ids, 5);
  // Spelled out once, so the reference itself is checked too.
  ASSERT_EQ(want.offsets, (std::vector<int32_t>{0, 3, 5, 10, 12, 12}));
  ASSERT_EQ(want.row_entry, (std::vector<int32_t>{1, 4, 9, 3, 10, 0, 2, 5, 7, 8, 6, 11}));
  check_permutation(ids, 6, 2, 5, 24, stream());  // d % 8 == 0: 16-byte copies
  check_permutation(ids, 6, 2, 5, 13, stream());  // odd d: element copies
}

TEST_F(MoeGpu, PermutationOfManyTokensAcrossChunks) {
  TROUPE_REQUIRE_GPU();
  const int64_t n_tok = 1000, k = 8, ne = 64;  // 8000 entries: 32 chunks of 256 per expert
  std::mt19937 rng(12);
  std::vector<int32_t> ids;
  std::vector<int32_t> experts(static_cast<size_t>(ne));
  std::iota(experts.begin(), experts.end(), 0);
  for (int64_t t = 0; t < n_tok; ++t) {
    std::shuffle(experts.begin(), experts.end(), rng);  // k distinct experts, like top-k
    // Skew: half the tokens put expert 5 first, so one expert gets a long run.
    if (t % 2 == 0) std::iter_swap(experts.begin(), std::find(experts.begin(), experts.end(), 5));
    ids.insert(ids.end(), experts.begin(), experts.begin() + k);
  }
  check_permutation(ids, n_tok, k, ne, 64, stream());
}

TEST_F(MoeGpu, CombineSumsSlotsInOrderBitwiseLikeTheCpu) {
  TROUPE_REQUIRE_GPU();
  const int64_t n_tok = 50, k = 4, d = 40, n = n_tok * k;
  const auto out = random_floats(static_cast<size_t>(n * d), 20, -3.f, 3.f);
  const auto weights = random_floats(static_cast<size_t>(n), 21, 0.f, 1.f);
  const auto shared = random_floats(static_cast<size_t>(n_tok * d), 22);
  const auto gate = random_floats(static_cast<size_t>(n_tok), 23, -2.f, 2.f);
  std::vector<int32_t> entry_row(static_cast<size_t>(n));
  std::iota(entry_row.begin(), entry_row.end(), 0);
  std::shuffle(entry_row.begin(), entry_row.end(), std::mt19937(24));
  auto d_out = device_copy(out);
  auto d_w = device_copy(weights);
  auto d_shared = device_copy(shared);
  auto d_gate = device_copy(gate);
  auto d_rows = device_copy(entry_row);
  for (int variant = 0; variant < 3; ++variant) {  // routed only; + shared; + gated shared
    SCOPED_TRACE(variant);
    auto d_y = poisoned<float>(static_cast<size_t>(n_tok * d));
    MoeCombineArgs a;
    a.n_tok = n_tok;
    a.k = k;
    a.d = d;
    a.expert_out = d_out.get();
    a.entry_row = d_rows.get();
    a.weights = d_w.get();
    a.shared_out = variant >= 1 ? d_shared.get() : nullptr;
    a.shared_gate_logit = variant == 2 ? d_gate.get() : nullptr;
    a.y = d_y.get();
    launch_moe_combine(a, stream());
    sync();
    const auto want =
        ref_combine(n_tok, k, d, out, entry_row, weights, variant >= 1 ? shared.data() : nullptr,
                    variant == 2 ? gate.data() : nullptr);
    // Same operations in the same order: bitwise, except expf in the gate's sigmoid.
    const float tol = variant == 2 ? 1e-6f : 0.f;
    EXPECT_TRUE(all_close(d_y.download(), want, tol, tol, "combine y"));
  }
}

TEST_F(MoeGpu, GroupedExpertFfnMatchesCpu) {
  TROUPE_REQUIRE_GPU();
  const int64_t ne = 6, d = 64, ff = 96;
  const std::vector<int32_t> offsets = {0,  5,  5, 22,
                                        23, 32, 35};  // expert 1 empty, expert 3: 1 row
  const int64_t rows = offsets.back();
  RefExperts ref(ne, d, ff, 30);
  const auto x = round_bf16(random_floats(static_cast<size_t>(rows * d), 33));
  auto d_x = device_copy(to_bf16(x));
  auto d_gate = device_copy(to_bf16(ref.gate));
  auto d_up = device_copy(to_bf16(ref.up));
  auto d_down = device_copy(to_bf16(ref.down));
  auto d_out = poisoned<float>(static_cast<size_t>(rows * d));
  MoeExpertWeights w{d_gate.get(), d_up.get(), d_down.get(), ne, d, ff};
  const size_t arena_before = arena_->used();
  run_moe_experts(*gemm_, w, offsets, d_x.get(), d_out.get(), *arena_, stream());
  sync();
  EXPECT_EQ(arena_->used(), arena_before) << "scratch not given back";
  std::vector<float> want(static_cast<size_t>(rows * d));
  for (int64_t e = 0; e < ne; ++e)
    for (int64_t r = offsets[static_cast<size_t>(e)]; r < offsets[static_cast<size_t>(e + 1)]; ++r)
      ref.run(e, &x[static_cast<size_t>(r * d)], &want[static_cast<size_t>(r * d)]);
  EXPECT_TRUE(all_close(d_out.download(), want, 1e-4f, ref.flip_tolerance(), "expert out"));
}

/// A small DeepSeek-V3-like layer: routing, experts, shared expert with a gate.
struct LayerCase {
  MoeRouting r;
  int64_t d = 64, ff = 32, n_tok = 37;
  std::vector<float> bias, logits, x, shared, gate_logit;
  std::unique_ptr<RefExperts> ref;
  LayerCase() {
    r.n_expert = 16;
    r.k = 4;
    r.gating = model::Gating::kSigmoid;
    r.norm_topk = true;
    r.routed_scale = 2.5f;
    r.n_group = 4;
    r.n_group_used = 2;
    bias = random_floats(16, 40, -0.05f, 0.05f);
    logits = tie_free_logits(r, bias.data(), n_tok, 41, -3.f, 3.f);
    x = round_bf16(random_floats(static_cast<size_t>(n_tok * d), 42));
    shared = random_floats(static_cast<size_t>(n_tok * d), 43, -0.5f, 0.5f);
    gate_logit = random_floats(static_cast<size_t>(n_tok), 44, -2.f, 2.f);
    ref = std::make_unique<RefExperts>(r.n_expert, d, ff, 45);
  }
};

TEST_F(MoeGpu, WholeLayerMatchesCpuReference) {
  TROUPE_REQUIRE_GPU();
  LayerCase c;
  auto d_logits = device_copy(c.logits);
  auto d_bias = device_copy(c.bias);
  auto d_x = device_copy(to_bf16(c.x));
  auto d_shared = device_copy(c.shared);
  auto d_gate_logit = device_copy(c.gate_logit);
  auto d_gate = device_copy(to_bf16(c.ref->gate));
  auto d_up = device_copy(to_bf16(c.ref->up));
  auto d_down = device_copy(to_bf16(c.ref->down));
  auto d_y = poisoned<float>(static_cast<size_t>(c.n_tok * c.d));
  MoeForward fwd(c.r, gemm_.get());
  MoeForwardArgs a;
  a.n_tok = c.n_tok;
  a.x = d_x.get();
  a.router_logits = d_logits.get();
  a.router_bias = d_bias.get();
  a.experts = {d_gate.get(), d_up.get(), d_down.get(), c.r.n_expert, c.d, c.ff};
  a.shared_out = d_shared.get();
  a.shared_gate_logit = d_gate_logit.get();
  a.y = d_y.get();
  fwd.run(a, *arena_, stream());
  sync();
  EXPECT_EQ(arena_->used(), 0u) << "scratch not given back";

  // The CPU path: route, run each (token, slot) through its expert, combine in slot order.
  const RefRoute route = ref_route(c.r, c.logits, c.bias.data(), c.n_tok);
  const RefPerm perm = ref_permute(route.ids, c.r.n_expert);
  EXPECT_EQ(std::vector<int32_t>(fwd.offsets().begin(), fwd.offsets().end()), perm.offsets);
  std::vector<float> expert_out(route.ids.size() * static_cast<size_t>(c.d));
  for (size_t row = 0; row < perm.row_entry.size(); ++row) {
    const int64_t entry = perm.row_entry[row];
    c.ref->run(route.ids[static_cast<size_t>(entry)],
               &c.x[static_cast<size_t>(entry / c.r.k * c.d)],
               &expert_out[row * static_cast<size_t>(c.d)]);
  }
  const auto want = ref_combine(c.n_tok, c.r.k, c.d, expert_out, perm.entry_row, route.weights,
                                c.shared.data(), c.gate_logit.data());
  // Routed weights sum to routed_scale per token: flips scale with it.
  const float atol = c.r.routed_scale * c.ref->flip_tolerance();
  EXPECT_TRUE(all_close(d_y.download(), want, 1e-4f, atol, "moe layer y"));
}

TEST_F(MoeGpu, LayerRowsDoNotDependOnTheBatch) {
  TROUPE_REQUIRE_GPU();
  LayerCase c;
  auto d_logits = device_copy(c.logits);
  auto d_bias = device_copy(c.bias);
  auto d_x = device_copy(to_bf16(c.x));
  auto d_shared = device_copy(c.shared);
  auto d_gate = device_copy(to_bf16(c.ref->gate));
  auto d_up = device_copy(to_bf16(c.ref->up));
  auto d_down = device_copy(to_bf16(c.ref->down));
  MoeForward fwd(c.r, gemm_.get());
  auto run_first = [&](int64_t n_tok) {
    auto d_y = poisoned<float>(static_cast<size_t>(n_tok * c.d));
    MoeForwardArgs a;
    a.n_tok = n_tok;
    a.x = d_x.get();
    a.router_logits = d_logits.get();
    a.router_bias = d_bias.get();
    a.experts = {d_gate.get(), d_up.get(), d_down.get(), c.r.n_expert, c.d, c.ff};
    a.shared_out = d_shared.get();
    a.y = d_y.get();
    fwd.run(a, *arena_, stream());
    sync();
    return d_y.download();
  };
  const auto all = run_first(c.n_tok);
  for (int64_t n : {1, 7}) {
    const auto part = run_first(n);
    EXPECT_EQ(0, std::memcmp(part.data(), all.data(), part.size() * sizeof(float)))
        << "the first " << n << " tokens differ from the same tokens in a batch of " << c.n_tok;
  }
}

TEST_F(MoeGpu, ExpertSubsetsGivePartialSumsOfTheWholeLayer) {
  // Expert parallelism: two calls holding experts [0, 8) and [8, 16) (a rank's share each). A
  // token whose k experts are all in one half gets that half's output bitwise equal to the whole
  // layer's and exactly 0 from the other half; a token with experts in both halves gets partial
  // sums that add up to the whole layer's output (up to the order of the sum).
  TROUPE_REQUIRE_GPU();
  LayerCase c;
  auto d_logits = device_copy(c.logits);
  auto d_bias = device_copy(c.bias);
  auto d_x = device_copy(to_bf16(c.x));
  auto d_gate = device_copy(to_bf16(c.ref->gate));
  auto d_up = device_copy(to_bf16(c.ref->up));
  auto d_down = device_copy(to_bf16(c.ref->down));
  MoeForward fwd(c.r, gemm_.get());
  const int64_t h = c.r.n_expert / 2, per = c.ff * c.d;  // elements of one expert's matrix
  auto run = [&](int64_t e0, int64_t n) {
    auto d_y = poisoned<float>(static_cast<size_t>(c.n_tok * c.d));
    MoeForwardArgs a;
    a.n_tok = c.n_tok;
    a.x = d_x.get();
    a.router_logits = d_logits.get();
    a.router_bias = d_bias.get();
    a.experts = {
        d_gate.get() + e0 * per, d_up.get() + e0 * per, d_down.get() + e0 * per, n, c.d, c.ff};
    a.expert_begin = e0;
    a.y = d_y.get();
    fwd.run(a, *arena_, stream());
    sync();
    return d_y.download();
  };
  const auto whole = run(0, c.r.n_expert), lo = run(0, h), hi = run(h, h);
  const RefRoute route = ref_route(c.r, c.logits, c.bias.data(), c.n_tok);
  int pure = 0, mixed = 0;
  const auto d = static_cast<size_t>(c.d);
  for (int64_t t = 0; t < c.n_tok; ++t) {
    int in_lo = 0;
    for (int64_t s = 0; s < c.r.k; ++s) in_lo += route.ids[static_cast<size_t>(t * c.r.k + s)] < h;
    const size_t at = static_cast<size_t>(t) * d;
    if (in_lo == 0 || in_lo == c.r.k) {
      ++pure;
      const auto& own = in_lo ? lo : hi;
      const auto& other = in_lo ? hi : lo;
      EXPECT_EQ(0, std::memcmp(&own[at], &whole[at], d * sizeof(float))) << "token " << t;
      for (size_t i = 0; i < d; ++i) ASSERT_EQ(other[at + i], 0.f) << "token " << t;
    } else {
      ++mixed;
      for (size_t i = 0; i < d; ++i)
        ASSERT_NEAR(lo[at + i] + hi[at + i], whole[at + i],
                    1e-5f * (1.f + std::fabs(whole[at + i])))
            << "token " << t << " element " << i;
    }
  }
  std::printf("[moe] expert halves: %d tokens in one half, %d in both\n", pure, mixed);
  EXPECT_GT(pure, 0);
  EXPECT_GT(mixed, 0);
  // A range outside the routing's experts is refused.
  MoeForwardArgs bad;
  bad.n_tok = 1;
  bad.experts = {d_gate.get(), d_up.get(), d_down.get(), h, c.d, c.ff};
  bad.expert_begin = h + 1;
  expect_input_error([&] { fwd.run(bad, *arena_, stream()); }, "hold experts [9, 17)");
}

// ---- argument checks: no GPU needed -----------------------------------------------------------

template <class F>
void expect_input_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "accepted; expected an error containing '" << needle << "'";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(MoeRoutingCheck, RejectsBadConfigurations) {
  MoeRouting ok;
  ok.n_expert = 16;
  ok.k = 4;
  EXPECT_NO_THROW(validate_moe_routing(ok));
  MoeRouting r = ok;
  r.k = 0;
  expect_input_error([&] { validate_moe_routing(r); }, "got 0");
  r = ok;
  r.k = 17;
  expect_input_error([&] { validate_moe_routing(r); }, "n_expert=16");
  r = ok;
  r.n_expert = 0;
  expect_input_error([&] { validate_moe_routing(r); }, "n_expert must be in");
  r = ok;
  r.n_group = 3;
  r.n_group_used = 1;
  expect_input_error([&] { validate_moe_routing(r); }, "multiple of n_group");
  r = ok;
  r.n_group = 4;
  r.n_group_used = 5;
  expect_input_error([&] { validate_moe_routing(r); }, "n_group_used=5");
  // Checked before any device work: MoeForward and the launchers refuse the same way.
  r = ok;
  r.k = 0;
  expect_input_error([&] { MoeForward f(r, nullptr); }, "got 0");
  expect_input_error([&] { launch_moe_route(r, nullptr, nullptr, 1, nullptr, nullptr, nullptr); },
                     "got 0");
}

TEST(MoeLaunchCheck, RejectsBadShapes) {
  MoePermutation p;
  expect_input_error(
      [&] { launch_moe_permute(nullptr, 4, 0, 8, nullptr, 16, nullptr, p, nullptr); }, "k=0");
  expect_input_error(
      [&] { launch_moe_permute(nullptr, 4, 2, 8, nullptr, 16, nullptr, p, nullptr); },
      "null counts");
  MoeCombineArgs c;
  c.n_tok = 1;
  c.k = 1;
  c.d = 1;
  c.shared_gate_logit = reinterpret_cast<const float*>(uintptr_t{0x1000});
  expect_input_error([&] { launch_moe_combine(c, nullptr); }, "without shared_out");
  c.shared_gate_logit = nullptr;
  expect_input_error([&] { launch_moe_combine(c, nullptr); }, "null pointer");
}

}  // namespace
}  // namespace troupe::gpu
