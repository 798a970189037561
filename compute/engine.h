// Engine: the CPU forward pass of a decoder over a batch of sequences with paged KV.
// One step runs many sequences of different lengths at once, mixing prefill chunks and single
// decode tokens. Numerics are batch-invariant: a sequence's logits do not depend on what else is
// in the step, on how its prompt was chunked, or on the thread count.
// Thread safety: one step at a time per Engine; the engine uses its own thread pool.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "base/result.h"
#include "compute/kv_cache.h"
#include "model/model.h"

namespace troupe::compute {

class ThreadPool;

struct EngineOptions {
  int n_threads = 1;
  int64_t kv_block_size = 16;   // tokens per KV block
  int64_t kv_num_blocks = 0;    // 0: enough for max_tokens_in_cache
  int64_t max_tokens_in_cache = 4096;
};

/// One sequence's part of a step.
struct SeqStep {
  int64_t pos0 = 0;                   // positions [0, pos0) are already in this sequence's KV
  std::span<const int32_t> tokens;    // new tokens, at positions pos0 ... pos0 + size - 1
  std::span<const int32_t> blocks;    // block table covering at least [0, pos0 + size)
  enum class Logits : uint8_t { kNone, kLast, kAll } logits = Logits::kLast;
};

struct StepResult {
  int64_t n_vocab = 0;
  std::vector<float> logits;        // f32 [num_rows, n_vocab], sequences in step order
  std::vector<int64_t> row_begin;   // per sequence: its first row in logits
  std::vector<int64_t> row_count;   // per sequence: how many rows (0, 1 or its token count)
  const float* row(size_t seq, int64_t i = 0) const {
    return logits.data() + (row_begin[seq] + i) * n_vocab;
  }
};

class Engine {
 public:
  /// Builds the engine and allocates its KV pool. Errors: pool too large, bad options.
  static Result<std::unique_ptr<Engine>> create(std::shared_ptr<const model::Model> model,
                                                const EngineOptions& opts);
  ~Engine();

  /// Runs one batched step. Validates every SeqStep (token ids in range, block tables long
  /// enough, block ids in range) and returns an Error without computing when one is bad.
  Status step(std::span<const SeqStep> seqs, StepResult* out);

  const model::Model& model() const { return *model_; }
  const model::ModelSpec& spec() const { return model_->spec; }
  KvCache& kv_cache() { return *kv_; }
  BlockAllocator& blocks() { return *alloc_; }
  int n_threads() const;

 private:
  Engine() = default;
  struct Scratch;
  void forward(std::span<const SeqStep> seqs, StepResult* out);
  void attention(int64_t il, std::span<const SeqStep> seqs);
  void attention_mla(int64_t il, std::span<const SeqStep> seqs);
  void ffn(int64_t il);
  void moe(int64_t il);

  std::shared_ptr<const model::Model> model_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<KvCache> kv_;
  std::unique_ptr<BlockAllocator> alloc_;
  std::unique_ptr<Scratch> s_;
};

/// A single sequence on an engine: owns its blocks, grows them as tokens are added.
/// Convenience for the CLI, tests and benchmarks; the scheduler manages blocks itself.
class Sequence {
 public:
  explicit Sequence(Engine& engine) : engine_(engine) {}
  ~Sequence();
  Sequence(const Sequence&) = delete;
  Sequence& operator=(const Sequence&) = delete;

  int64_t length() const { return length_; }
  /// Makes room for n more tokens; false when the pool is exhausted.
  bool reserve(int64_t n);
  /// Describes the next n tokens for a step (call reserve first), then advance() after the step.
  SeqStep next(std::span<const int32_t> tokens, SeqStep::Logits logits) const;
  void advance(int64_t n) { length_ += n; }
  const std::vector<int32_t>& blocks() const { return blocks_; }

 private:
  Engine& engine_;
  std::vector<int32_t> blocks_;
  int64_t length_ = 0;
};

}  // namespace troupe::compute
