// Expert routing (compute/moe_route.h).
#include "compute/moe_route.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "base/check.h"
#include "compute/detail/ops.h"

namespace troupe::compute {
namespace {

const float* f32_or_null(const model::WeightView& w) {
  return w.present() ? reinterpret_cast<const float*>(w.data) : nullptr;
}

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Group-limited routing: a group's score is the sum of its two best selection scores (or its
// best one: GroupScore::kMax); experts outside the best n_group_used groups cannot be chosen.
void limit_groups(const model::ModelSpec& s, std::vector<float>& selp) {
  const int64_t NE = s.n_expert, per = NE / s.n_group;
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
  std::vector<bool> keep(static_cast<size_t>(s.n_group), false);
  for (int64_t g = 0; g < s.n_group_used; ++g)
    keep[static_cast<size_t>(gs[static_cast<size_t>(g)].second)] = true;
  for (int64_t e = 0; e < NE; ++e)
    if (!keep[static_cast<size_t>(e / per)]) selp[static_cast<size_t>(e)] = kNegInf;
}

}  // namespace

void route_experts(const model::ModelSpec& s, const model::LayerSpec& L, const float* logits,
                   int64_t T, int32_t* ids, float* weights, const int32_t* tokens) {
  const int64_t NE = s.n_expert, K = s.n_expert_used;
  const float* sel_bias = f32_or_null(L.router_bias);
  const float* logit_bias = f32_or_null(L.router_logit_bias);
  const auto* hash = reinterpret_cast<const int32_t*>(L.hash_experts.data);
  std::vector<float> lg(static_cast<size_t>(NE)), probs(static_cast<size_t>(NE)),
      selp(static_cast<size_t>(NE));
  std::vector<int32_t> order(static_cast<size_t>(NE));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < NE; ++e)
      lg[static_cast<size_t>(e)] = logits[t * NE + e] + (logit_bias ? logit_bias[e] : 0.f);
    switch (s.gating) {
      case model::Gating::kSoftmax: {
        float mx = kNegInf;
        for (int64_t e = 0; e < NE; ++e) mx = std::max(mx, lg[static_cast<size_t>(e)]);
        double sum = 0;
        for (int64_t e = 0; e < NE; ++e) {
          probs[static_cast<size_t>(e)] = std::exp(lg[static_cast<size_t>(e)] - mx);
          sum += probs[static_cast<size_t>(e)];
        }
        const float inv = static_cast<float>(1.0 / sum);
        for (int64_t e = 0; e < NE; ++e) probs[static_cast<size_t>(e)] *= inv;
        break;
      }
      case model::Gating::kSigmoid:
        for (int64_t e = 0; e < NE; ++e)
          probs[static_cast<size_t>(e)] = detail::sigmoid(lg[static_cast<size_t>(e)]);
        break;
      case model::Gating::kSoftmaxTopk:  // chosen by logit; weighted by a softmax below
        probs = lg;
        break;
      case model::Gating::kSqrtSoftplus:  // softplus as torch's: the identity above 20
        for (int64_t e = 0; e < NE; ++e) {
          const float x = lg[static_cast<size_t>(e)];
          probs[static_cast<size_t>(e)] = std::sqrt(x > 20.0f ? x : std::log1p(std::exp(x)));
        }
        break;
    }
    int32_t* id = ids + t * K;
    float* w = weights + t * K;
    if (hash != nullptr) {  // DeepSeek-V4's first layers: the experts of the input token
      TROUPE_CHECK(tokens != nullptr && tokens[t] >= 0 && tokens[t] < s.n_vocab,
                   "%s: hash routing needs the token id of every position (token %d)",
                   L.hash_experts.name.c_str(), tokens != nullptr ? tokens[t] : -1);
      for (int64_t k = 0; k < K; ++k) {
        id[k] = hash[static_cast<int64_t>(tokens[t]) * K + k];
        w[k] = probs[static_cast<size_t>(id[k])];
      }
    } else {
      for (int64_t e = 0; e < NE; ++e)
        selp[static_cast<size_t>(e)] =
            probs[static_cast<size_t>(e)] + (sel_bias ? sel_bias[e] : 0.f);
      if (s.n_group > 1 && s.n_group_used < s.n_group) limit_groups(s, selp);
      for (int64_t e = 0; e < NE; ++e) order[static_cast<size_t>(e)] = static_cast<int32_t>(e);
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
        return selp[static_cast<size_t>(a)] > selp[static_cast<size_t>(b)];
      });
      for (int64_t k = 0; k < K; ++k) {
        id[k] = order[static_cast<size_t>(k)];
        w[k] = probs[static_cast<size_t>(id[k])];
      }
    }
    if (s.gating == model::Gating::kSoftmaxTopk) {
      const float mx = w[0];  // the largest (selection order)
      double sum = 0;
      for (int64_t k = 0; k < K; ++k) {
        w[k] = std::exp(w[k] - mx);
        sum += w[k];
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (int64_t k = 0; k < K; ++k) w[k] *= inv;
    }
    double wsum = 0;
    for (int64_t k = 0; k < K; ++k) wsum += w[k];
    for (int64_t k = 0; k < K; ++k) {
      if (s.norm_topk) w[k] = w[k] / static_cast<float>(wsum);
      w[k] *= s.routed_scale;
    }
  }
}

}  // namespace troupe::compute
