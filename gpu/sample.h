// Next-token selection on the GPU for the last pipeline stage: greedy argmax, and seeded sampling
// (temperature, top-k, top-p, min-p) that picks exactly the token compute::Sampler::sample picks
// for the same logits and RNG state. The split: the host keeps each request's SamplerState and
// takes the uniform draw from it (make_sample_row, one xoshiro256** step per sampled token, as
// the CPU does); the kernel does the rest (NaN handling, truncation, weights, inverse-CDF pick).
// Host launchers only (kernels in sample.cu); one block per row, rows independent.
//
// Exactness: every float operation of compute/sampler.cc is repeated with the same operands in
// the same order (no FMA contraction), including its own exp. The order-sensitive double sums
// (the softmax total, the top-p mass and the inverse-CDF walk) run left to right on one warp in
// the CPU's draw order; top-p's per-bucket masses are sums of same-binade f32 weights, exact in
// double in any order; the top-p boundary search replays the CPU's weighted quickselect on the
// sorted bucket. Cost: a sequential f64 add chain over the draw order (estimated ~0.5 ms for
// 150k tokens without top-k; small with top-k); top-k > 2048 or a top-p edge bucket of more
// than 2048 tokens is sorted in global memory (slower, still exact). Rows run in parallel.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <limits>

#include "compute/sampler.h"

namespace troupe::gpu {

/// Largest vocabulary sample_rows and argmax_rows accept.
constexpr int64_t kMaxSampleVocab = int64_t{1} << 20;

/// One row's settings as the sampling kernel reads them (a device array, one per row).
/// Build it with make_sample_row rather than by hand.
struct SampleRow {
  double u = 0;           // the uniform draw in [0, 1) (unused when greedy)
  float temperature = 0;  // 0 = greedy (argmax); else > 0
  int32_t top_k = 0;      // 0 = off
  float top_p = 1;        // in (0, 1]; 1 = off
  float log_min_p = -std::numeric_limits<float>::infinity();  // std::log(min_p); -inf = off
};

/// True when compute::Sampler with `params` draws from the logits as given: no repetition,
/// presence or frequency penalty is in effect (those read the token history; a caller with
/// penalties samples on the CPU).
bool gpu_sampler_supports(const compute::SamplingParams& params);

/// The uniform double compute::Sampler::sample draws for one token: advances `state` by one
/// xoshiro256** step and returns the top 53 bits of the output times 2^-53, in [0, 1).
double draw_uniform(compute::SamplerState& state);

/// The kernel's settings for one row of a request. temperature == 0 (greedy) leaves `state`
/// untouched; otherwise it takes one draw_uniform step, exactly as Sampler::sample would, so the
/// state stays in step with a CPU Sampler of the same request. Throws InputError when
/// params.validate() fails, when !gpu_sampler_supports(params), or when state is all zeros.
SampleRow make_sample_row(const compute::SamplingParams& params, compute::SamplerState& state);

/// tokens[r] = argmax of logits row r (ties: the lowest id; NaN counts as -inf, so a row of NaN
/// and -inf gives 0) for r < num_rows: what compute::Sampler returns with temperature 0.
/// logits: f32 [num_rows, n_vocab]; tokens: device int32 [num_rows].
/// Throws InputError unless 0 <= num_rows <= INT_MAX and 1 <= n_vocab <= kMaxSampleVocab.
void argmax_rows(const float* logits, int64_t num_rows, int64_t n_vocab, int32_t* tokens,
                 cudaStream_t stream);

/// Workspace elements (uint64) one concurrently sampled row needs: the next power of two
/// >= n_vocab.
int64_t sample_workspace_per_row(int64_t n_vocab);

/// tokens[r] = the token compute::Sampler::sample(logits row r, {}) returns for a Sampler with
/// the row's params whose RNG, before the call, was the state make_sample_row drew rows[r].u
/// from. Rows with temperature 0 take the argmax.
/// logits: f32 [num_rows, n_vocab]; rows: device SampleRow [num_rows]; tokens: device int32
/// [num_rows]. workspace: device uint64 [workspace_elems], scratch of the call; each block owns
/// sample_workspace_per_row(n_vocab) elements and samples rows blockIdx.x, + gridDim.x, ... so
/// min(num_rows, workspace_elems / per_row) rows run at once (the result does not depend on it).
/// Throws InputError for sizes out of range or a workspace smaller than one row's.
void sample_rows(const float* logits, int64_t num_rows, int64_t n_vocab, const SampleRow* rows,
                 uint64_t* workspace, int64_t workspace_elems, int32_t* tokens,
                 cudaStream_t stream);

}  // namespace troupe::gpu
