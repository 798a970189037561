// Expert routing: a MoE layer's router logits → each token's chosen experts and their weights,
// by the model's gating (softmax, sigmoid with a selection bias and group limits, softmax over
// the top-k logits, DeepSeek-V4's sqrt-softplus and token-id tables). Per token, in a fixed order:
// batch-invariant.
#pragma once

#include <cstdint>

#include "model/model_spec.h"

namespace troupe::compute {

/// logits: [T, n_expert] as the router computed them (router_logit_bias not yet added).
/// ids, weights: [T, n_expert_used], each token's experts in selection order. tokens: [T], each
/// position's input token id, which a layer with hash_experts (DeepSeek-V4's first layers)
/// routes by; unused otherwise (may be null).
void route_experts(const model::ModelSpec& s, const model::LayerSpec& L, const float* logits,
                   int64_t T, int32_t* ids, float* weights, const int32_t* tokens = nullptr);

}  // namespace troupe::compute
