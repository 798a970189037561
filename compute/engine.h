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
#include "compute/ffn.h"
#include "compute/kv_cache.h"
#include "model/model.h"

namespace troupe::compute {

class ThreadPool;

/// The part of the model an engine runs: a contiguous layer range, plus the embedding (first
/// pipeline stage) and the output head (last stage). The default is the whole model.
struct LayerRange {
  int64_t begin = 0;
  int64_t end = -1;   // exclusive; -1 = n_layer
  bool embed = true;  // false: the step takes hidden states from the previous stage
  bool head = true;   // false: the step returns hidden states instead of logits
};

/// One expert's share of an MoE layer: y = expert(x) for n_rows rows.
struct ExpertTask {
  int32_t expert = 0;
  int64_t n_rows = 0;
  const float* x = nullptr;  // f32 [n_rows, n_embd] (normed hidden states)
  float* y = nullptr;        // f32 [n_rows, n_embd] (unweighted expert output)
};

/// Computes routed experts. The engine routes, gathers rows per expert, calls run(), and then
/// weights and combines the outputs in a fixed order, so where an expert runs (in process, or on
/// an expert-shard actor) never changes the result.
class ExpertRunner {
 public:
  virtual ~ExpertRunner() = default;
  /// Fills every task's y. Throws on failure (the step then fails with the message).
  virtual void run(int64_t layer, std::span<const ExpertTask> tasks) = 0;
};

/// Runs experts of a model in this process with a given thread pool: the local ExpertRunner, and
/// the compute inside an expert-shard actor. Not thread-safe (one run at a time).
class ExpertCompute : public ExpertRunner {
 public:
  ExpertCompute(std::shared_ptr<const model::Model> model, ThreadPool* pool);
  ~ExpertCompute() override;
  void run(int64_t layer, std::span<const ExpertTask> tasks) override;
  /// run(), with `also` (FFNs on inputs of their own: the layer's shared expert) computed in
  /// the same parallel sections.
  void run_with(int64_t layer, std::span<const ExpertTask> tasks, std::span<const FfnTask> also);

 private:
  std::shared_ptr<const model::Model> model_;
  ThreadPool* pool_;
  std::vector<float> gate_, up_;
};

struct EngineOptions {
  int n_threads = 1;
  LayerRange range;
  ExpertRunner* expert_runner = nullptr;  // not owned; null = compute experts in this engine
  int64_t kv_block_size = 16;             // tokens per KV block
  int64_t kv_num_blocks = 0;              // 0: enough for max_tokens_in_cache
  int64_t max_tokens_in_cache = 4096;
  KvType kv_type = KvType::kF32;  // what the KV cache stores (kv_type.h)
  /// Models with recurrent layers (Qwen3-Next's linear attention): how many recurrent state slots
  /// there are (SeqStep::state in [0, max_recurrent_seqs)). Engine::acquire_state hands them out
  /// (Sequence uses it), or the caller assigns them itself as it does KV blocks (the cluster's
  /// scheduler). A slot's memory is allocated by its first step.
  int64_t max_recurrent_seqs = 16;
  /// The longest sequence (prompt and generated tokens) this engine will run; 0: not said. A
  /// LongRoPE model (Phi-3) rotates with its long factors when it is above the model's original
  /// context (model::rope_frequencies), as llama.cpp does by its context size.
  int64_t max_positions = 0;
};

/// One sequence's part of a step.
struct SeqStep {
  /// A token id that takes its input row from `embd` instead of the token embedding table: an
  /// image position of a vision-language prompt (its row comes from the vision encoder).
  static constexpr int32_t kEmbedded = -1;

  int64_t pos0 = 0;                 // positions [0, pos0) are already in this sequence's KV
  std::span<const int32_t> tokens;  // new tokens, at positions pos0 ... pos0 + size - 1
  std::span<const int32_t> blocks;  // block table covering at least [0, pos0 + size)
  enum class Logits : uint8_t { kNone, kLast, kAll } logits = Logits::kLast;
  /// f32 [number of kEmbedded tokens, n_embd]: their input rows, in order. Used as they are
  /// (no embedding scale: Gemma's sqrt(n_embd) applies to token rows only, as in llama.cpp).
  /// Empty on a stage that does not embed (it takes hidden states for every position).
  std::span<const float> embd;
  /// Every token of this step attends to all of the step's positions, not only to earlier ones
  /// (Gemma 3's image positions, prefilled as one step of their own, as llama.cpp does). The
  /// result then depends on where the step begins and ends; causal steps never do.
  bool non_causal = false;
  /// The sequence's recurrent state slot on an engine whose layers keep one
  /// (Engine::needs_state); -1 otherwise. A step at pos0 0 starts the state afresh; any other
  /// must begin where this state's last step ended.
  int32_t state = -1;
  /// Whose state it is (the cluster's sequence id): a step at pos0 0 records it, and a later step
  /// that names another owner is refused (a late step of the slot's previous sequence must not
  /// advance its new one). -1: not checked.
  int64_t state_owner = -1;
};

struct StepResult {
  int64_t n_vocab = 0;
  std::vector<float> logits;       // f32 [num_rows, n_vocab], sequences in step order
  std::vector<int64_t> row_begin;  // per sequence: its first row in logits
  std::vector<int64_t> row_count;  // per sequence: how many rows (0, 1 or its token count)
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

  /// Runs one batched step. Validates every SeqStep (token ids in range or kEmbedded with one
  /// embd row each, block tables long enough, block ids in range) and returns an Error without
  /// computing when one is bad.
  /// hidden_in: f32 [num_tokens, hidden_width] when the range does not embed (else ignored);
  /// hidden_width is ModelSpec::hidden_width(): n_embd, or DeepSeek-V4's hc_mult streams of it.
  /// hidden_out: receives f32 [num_tokens, hidden_width] when the range has no head (then `out`
  /// only gets its row bookkeeping and no logits).
  Status step(std::span<const SeqStep> seqs, StepResult* out, const float* hidden_in = nullptr,
              std::vector<float>* hidden_out = nullptr);

  const model::Model& model() const { return *model_; }
  const model::ModelSpec& spec() const { return model_->spec; }
  const LayerRange& range() const { return range_; }
  KvCache& kv_cache() { return *kv_; }
  BlockAllocator& blocks() { return *alloc_; }
  int n_threads() const;
  /// The engine's compute threads (ThreadPool::stats: where a step's time went).
  const ThreadPool& pool() const;

  /// Whether this engine's layers keep a fixed-size state per sequence beside its KV (Gated
  /// DeltaNet's): then every SeqStep names one (SeqStep::state).
  bool needs_state() const { return state_floats_ > 0; }
  /// A free recurrent state slot; Error when all EngineOptions::max_recurrent_seqs are held.
  Result<int32_t> acquire_state();
  /// Returns a slot from acquire_state (-1: nothing).
  void release_state(int32_t state);
  /// How many positions the slot's state holds (-1 after a failed step: it must start again at
  /// 0; -1 too for a slot no step has used).
  int64_t state_positions(int32_t state) const;
  /// Bytes of the recurrent states allocated so far (0 on a model without them).
  uint64_t state_bytes() const;

 private:
  Engine() = default;
  struct Scratch;
  void forward(std::span<const SeqStep> seqs, StepResult* out, const float* hidden_in,
               std::vector<float>* hidden_out);
  void attention(int64_t il, std::span<const SeqStep> seqs);
  void attention_mla(int64_t il, std::span<const SeqStep> seqs);
  void indexer(int64_t il, std::span<const SeqStep> seqs);
  void linear_attention(int64_t il, std::span<const SeqStep> seqs);
  // DeepSeek-V4 (compute/engine_v4.cc): a whole layer, its attention, its compressed entries and
  // its indexer's choice; the hyper-connection into a block (the streams' weighted sum, normed
  // by `norm`, into the block input) and out of it (the block output and the mixed streams); the
  // final collapse of the streams of `rows` into normed head inputs.
  void layer_v4(int64_t il, std::span<const SeqStep> seqs);
  void attention_v4(int64_t il, std::span<const SeqStep> seqs);
  void compress_v4(int64_t il, std::span<const SeqStep> seqs, bool indexer);
  void select_v4(int64_t il, std::span<const SeqStep> seqs);
  void hc_pre(const model::WeightView& fn, const model::WeightView& base,
              const model::WeightView& scale, const model::WeightView& norm);
  void hc_post();
  void head_v4(std::span<const int64_t> rows);
  Status check_states(std::span<const SeqStep> seqs) const;
  /// Layer il's layer in the KV pool.
  int64_t kv_layer(int64_t il) const { return kv_layer_[static_cast<size_t>(il - range_.begin)]; }
  void ffn(int64_t il);
  void moe(int64_t il);

  std::shared_ptr<const model::Model> model_;
  std::unique_ptr<ThreadPool> pool_;
  LayerRange range_;
  std::unique_ptr<ExpertCompute> local_experts_;
  ExpertRunner* experts_ = nullptr;
  std::unique_ptr<KvCache> kv_;
  std::unique_ptr<BlockAllocator> alloc_;
  std::unique_ptr<Scratch> s_;
  // Recurrent states: per slot, whether acquire_state handed it out, how many positions it has
  // absorbed, whose they are (SeqStep::state_owner), and its floats (state_floats_: for each
  // recurrent layer of the range, at state_offset_[layer]). Slots are added as steps and
  // acquire_state first name them, up to max_states_.
  struct RecurrentState {
    bool held = false;
    int64_t pos = -1;
    int64_t owner = -1;
    std::vector<float> data;
  };
  std::vector<RecurrentState> states_;
  int64_t max_states_ = 0;
  std::vector<int64_t> state_offset_;  // [layer - range.begin]; -1: not recurrent
  std::vector<int64_t> kv_layer_;      // [layer - range.begin]: its layer in the KV pool; -1: none
  int64_t state_floats_ = 0;
};

/// The KV pool an engine over `range` of s reserves (EngineOptions' block size, block count and
/// type): a row per position for each attention layer of the range (at least one layer; a
/// linear-attention layer keeps no rows). kv_pool_bytes of it is what the engine reserves.
KvCacheConfig kv_cache_config(const model::ModelSpec& s, const LayerRange& range,
                              int64_t block_size, int64_t num_blocks, KvType type);
/// Bytes of one sequence's recurrent state over `range` of s (Gated DeltaNet's layers); 0 when
/// the range has no linear-attention layer.
uint64_t recurrent_state_bytes(const model::ModelSpec& s, const LayerRange& range);

/// A single sequence on an engine: owns its blocks, grows them as tokens are added.
/// Convenience for the CLI, tests and benchmarks; the scheduler manages blocks itself.
class Sequence {
 public:
  /// Takes a recurrent state when the engine needs one; throws std::runtime_error when none is
  /// free.
  explicit Sequence(Engine& engine);
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
  /// The recurrent state it holds on an engine that needs one (else -1).
  int32_t state() const { return state_; }

 private:
  Engine& engine_;
  std::vector<int32_t> blocks_;
  int64_t length_ = 0;
  int32_t state_ = -1;
};

}  // namespace troupe::compute
