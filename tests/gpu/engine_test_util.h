// Helpers of the GPU engine tests (engine_test.cc, tp_engine_test.cc, ep_engine_test.cc): the
// per-model fixture, scripted multi-sequence runs on any engine with step() and blocks()
// (compute::Engine, GpuEngine, GpuTpEngine), and the per-row comparison of GPU logits with a
// reference and its tolerances.
//
// Tolerances (GPU against the CPU engine's f32 logits, per logits row):
//   bf16 keeps 8 significant bits, so each rounding is a relative error of at most 2^-8 (RMS
//   about 2^-8 / sqrt(3) over a binade's mean of 1.44 = 1.6e-3). The GPU rounds every weight
//   once and the input of every GEMM and of attention (normed h, q, k, v, the attention output,
//   the SwiGLU product). Measured on these models with the CPU engine and bf16-rounded weights
//   (the weight half of the error): a row's relative L2 error is 1.4e-3 to 6.6e-3 on average,
//   8.6e-3 at worst, and the max-abs error at most 1e-2 of the row's max|x|. The activation
//   roundings add a comparable amount in quadrature (~1.5e-2 expected); kRowTol = 3e-2 is twice
//   that.
//   Top-1 must agree where the reference's top-2 margin exceeds kMarginFrac = 6e-2 of the row's
//   max|x| (three times the expected max-abs error of ~2e-2, which could at most flip 4e-2).
//   MoE layers may route a token to another expert when two router scores lie within the bf16
//   error (a near tie, then a large change of that token's row): for MoE models at least 75% of
//   the rows must be within kRowTol, every row within kMoeRowMax (a broken layer gives ~1 or
//   NaN), and the top-1 check skips the rows beyond kRowTol.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "compute/engine.h"
#include "gpu/engine.h"
#include "tests/compute/engine_test_util.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_support.h"

namespace troupe::gpu::enginetest {

using compute::SeqStep;
using compute::StepResult;
using Logits = compute::SeqStep::Logits;

inline constexpr double kRowTol = 3e-2;
inline constexpr double kMarginFrac = 6e-2;
inline constexpr double kMoeRowMax = 1.0;
inline constexpr double kMoeMinFractionWithin = 0.75;
inline constexpr int64_t kBlockSize = 16;

inline const char* const kModels[] = {
    "models/stories260K/stories260K.gguf",     "models/synth/llama-dense/model.gguf",
    "models/synth/llama-dense-f16/model.gguf", "models/synth/mixtral-moe/model.gguf",
    "models/synth/qwen3moe/model.gguf",        "models/synth/qwen2moe/model.gguf",
    "models/synth/deepseek2/model.gguf"};

inline std::string message(const Status& s) {
  return s.has_value() ? std::string() : s.error().message;
}

inline std::vector<int32_t> make_tokens(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& t : v) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  return v;
}

inline bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

inline bool has_moe(const model::ModelSpec& s) {
  return std::any_of(s.layers.begin(), s.layers.end(), [](const auto& L) { return L.is_moe; });
}

inline GpuEngineOptions small_options() {
  GpuEngineOptions o;
  o.kv_block_size = kBlockSize;
  o.max_tokens_in_cache = 1024;
  o.max_step_tokens = 256;
  o.max_step_seqs = 16;
  return o;
}

inline std::unique_ptr<GpuEngine> make_gpu(std::shared_ptr<const model::Model> m,
                                           const GpuEngineOptions& o) {
  auto e = GpuEngine::create(std::move(m), o);
  EXPECT_TRUE(e.has_value()) << (e.has_value() ? "" : e.error().message);
  return e.has_value() ? std::move(*e) : nullptr;
}

/// A sequence on any engine's block pool: owns its blocks, grows them as tokens are added.
class Seq {
 public:
  Seq(compute::BlockAllocator& alloc, std::vector<int32_t> tokens)
      : alloc_(alloc), tokens_(std::move(tokens)) {}
  ~Seq() { alloc_.release(blocks_); }
  Seq(const Seq&) = delete;
  Seq& operator=(const Seq&) = delete;

  /// The step of the next n tokens (blocks reserved); advance(n) after the step.
  SeqStep next(int64_t n, Logits logits) {
    const int64_t need =
        (len_ + n + kBlockSize - 1) / kBlockSize - static_cast<int64_t>(blocks_.size());
    if (need > 0) {
      EXPECT_TRUE(alloc_.allocate(need, &blocks_)) << "KV pool exhausted";
    }
    EXPECT_LE(len_ + n, static_cast<int64_t>(tokens_.size()));
    SeqStep st;
    st.pos0 = len_;
    st.tokens = std::span<const int32_t>(tokens_.data() + len_, static_cast<size_t>(n));
    st.blocks = blocks_;
    st.logits = logits;
    return st;
  }
  void advance(int64_t n) { len_ += n; }

 private:
  compute::BlockAllocator& alloc_;
  std::vector<int32_t> tokens_;
  std::vector<int32_t> blocks_;
  int64_t len_ = 0;
};

/// One sequence's part of a scripted step.
struct Part {
  int seq;
  int64_t n;
  Logits logits;
};
using Script = std::vector<std::vector<Part>>;

/// Runs `script` on `eng` (compute::Engine or GpuEngine) for sequences with the given token
/// streams; returns, per sequence, the logits rows it received, in order.
template <class Engine>
inline std::vector<std::vector<float>> run_script(Engine& eng,
                                                  const std::vector<std::vector<int32_t>>& toks,
                                                  const Script& script) {
  std::vector<std::unique_ptr<Seq>> seqs;
  for (const auto& t : toks) seqs.push_back(std::make_unique<Seq>(eng.blocks(), t));
  std::vector<std::vector<float>> got(toks.size());
  for (size_t s = 0; s < script.size(); ++s) {
    std::vector<SeqStep> steps;
    for (const Part& p : script[s])
      steps.push_back(seqs[static_cast<size_t>(p.seq)]->next(p.n, p.logits));
    StepResult r;
    const Status st = eng.step(steps, &r);
    EXPECT_TRUE(st.has_value()) << "step " << s << ": " << message(st);
    if (!st.has_value()) return {};
    for (size_t i = 0; i < script[s].size(); ++i) {
      const Part& p = script[s][i];
      if (r.row_count[i] > 0) {
        const float* row = r.row(i);
        got[static_cast<size_t>(p.seq)].insert(got[static_cast<size_t>(p.seq)].end(), row,
                                               row + r.row_count[i] * r.n_vocab);
      }
      seqs[static_cast<size_t>(p.seq)]->advance(p.n);
    }
  }
  return got;
}

/// Sequence 0's logits (33 tokens: a 29-token prefill, then 4 decode steps) are bitwise the same
/// run alone in one chunk, in chunks of 8, 8, 8, 5, and in mixed batches with two other sequences
/// (one prefilling 6 then decoding, one prefilling 13 a step; sequence 0 in the middle, its rows
/// at varying offsets), then all three decoding together.
template <class Engine>
void expect_batch_and_chunk_invariant(Engine& e, int64_t V) {
  const std::vector<std::vector<int32_t>> toks = {make_tokens(33, V, 1), make_tokens(17, V, 2),
                                                  make_tokens(60, V, 3)};
  Script alone = {{{0, 29, Logits::kAll}}};
  for (int i = 0; i < 4; ++i) alone.push_back({{0, 1, Logits::kLast}});
  const auto ref = run_script(e, toks, alone);
  ASSERT_EQ(ref.size(), 3u);
  ASSERT_EQ(ref[0].size(), static_cast<size_t>(V) * 33);
  // Chunks of more than one token (the prefill kernel path).
  Script chunked = {{{0, 8, Logits::kAll}},
                    {{0, 8, Logits::kAll}},
                    {{0, 8, Logits::kAll}},
                    {{0, 5, Logits::kAll}}};
  for (int i = 0; i < 4; ++i) chunked.push_back({{0, 1, Logits::kLast}});
  EXPECT_TRUE(bit_equal(ref[0], run_script(e, toks, chunked)[0])) << "chunked prefill";
  Script mixed;
  const int64_t chunks0[] = {8, 8, 8, 5};
  for (int i = 0; i < 4; ++i)
    mixed.push_back({{1, i == 0 ? 6 : 1, Logits::kLast},
                     {0, chunks0[i], Logits::kAll},
                     {2, 13, Logits::kLast}});
  for (int i = 0; i < 4; ++i)
    mixed.push_back({{1, 1, Logits::kLast}, {0, 1, Logits::kLast}, {2, 1, Logits::kAll}});
  EXPECT_TRUE(bit_equal(ref[0], run_script(e, toks, mixed)[0])) << "mixed batch";
}

/// Per-row comparison of GPU logits with a reference (CPU engine or golden).
struct RowStats {
  int rows = 0, within = 0, argmax_checked = 0, argmax_mismatch = 0;
  double max_rel = 0, worst_row = 0;
  bool finite = true;
};

inline int argmax(const float* v, int64_t n) {
  return static_cast<int>(std::max_element(v, v + n) - v);
}

inline void compare_row(const float* got, const float* ref, int64_t n, RowStats* st) {
  double num = 0, den = 0, mx = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(got[i])) st->finite = false;
    const double d = static_cast<double>(got[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
    mx = std::max(mx, std::fabs(static_cast<double>(ref[i])));
  }
  const double rel = std::sqrt(num / std::max(den, 1e-30));
  st->rows++;
  st->worst_row = std::max(st->worst_row, rel);
  if (rel <= kRowTol) st->within++;
  std::vector<float> top(ref, ref + n);
  std::partial_sort(top.begin(), top.begin() + 2, top.end(), std::greater<float>());
  if (rel <= kRowTol && static_cast<double>(top[0]) - top[1] > kMarginFrac * mx) {
    st->argmax_checked++;
    if (argmax(got, n) != argmax(ref, n)) st->argmax_mismatch++;
  }
}

inline void expect_stats(const RowStats& st, bool moe, const std::string& what) {
  std::printf(
      "[gpu-engine] %s: %d rows, %d within %.0e (worst %.3g), top-1 checked %d, "
      "mismatched %d\n",
      what.c_str(), st.rows, st.within, kRowTol, st.worst_row, st.argmax_checked,
      st.argmax_mismatch);
  EXPECT_TRUE(st.finite) << what << ": NaN or infinity in the logits";
  EXPECT_GT(st.rows, 0) << what;
  if (moe) {
    EXPECT_GE(st.within, static_cast<int>(std::ceil(kMoeMinFractionWithin * st.rows))) << what;
    EXPECT_LE(st.worst_row, kMoeRowMax) << what;
  } else {
    EXPECT_EQ(st.within, st.rows) << what << ": worst row error " << st.worst_row;
  }
  EXPECT_EQ(st.argmax_mismatch, 0) << what;
}
/// A test over one model of ../shared (the parameter: its path there); skips, saying why, without
/// a GPU or without ../shared.
class GpuModelTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    TROUPE_REQUIRE_GPU();
    TROUPE_SHARED_OR_SKIP(shared);
    model_ = compute::load_model_for_test(shared + "/" + GetParam());
    ASSERT_TRUE(model_) << GetParam();
    V_ = model_->spec.n_vocab;
    moe_ = has_moe(model_->spec);
  }
  std::shared_ptr<const model::Model> model_;
  int64_t V_ = 0;
  bool moe_ = false;
};

}  // namespace troupe::gpu::enginetest
