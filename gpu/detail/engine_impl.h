// Private to gpu/engine.cc, gpu/engine_setup.cc and gpu/engine_layers.cc: the definition of
// GpuEngine::Impl (the configuration, device state and member functions behind one GpuEngine) and
// the plain structs those three files share: the per-step input layout and plan, one layer's device
// weights, the workspace buffers and small integer helpers. Owned by the actor that owns the
// engine; no shared state.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "gpu/attention.h"
#include "gpu/engine.h"
#include "gpu/gemm.h"
#include "gpu/moe.h"
#include "gpu/runtime.h"

namespace troupe::gpu {

namespace detail {

using bf16 = __nv_bfloat16;

inline constexpr int kErrBadInput = static_cast<int>(Errc::kBadInput);

inline long long ll(int64_t v) { return static_cast<long long>(v); }
inline size_t sz(int64_t n) { return static_cast<size_t>(n); }
inline size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

/// Copies weights to the device at create() (gpu/detail/engine_upload.h).
class Uploader;

/// The packed per-step inputs: one pinned host buffer, one device buffer, one copy per step.
/// Byte offsets of each array (256-aligned); the layout depends only on the four counts, so a
/// graph captured for a (tokens, sequences, table width, head rows) finds its inputs at the same
/// addresses at every replay.
struct InputLayout {
  size_t tok = 0;      // int32 [T]: token ids
  size_t pos = 0;      // int32 [T]: positions
  size_t slot = 0;     // int64 [T]: KV cache slots
  size_t q_start = 0;  // int32 [S]: first token of each sequence
  size_t q_len = 0;    // int32 [S]
  size_t pos0 = 0;     // int32 [S]
  size_t table = 0;    // int32 [S, W]: block tables, padded with -1
  size_t rows = 0;     // int32 [R]: the tokens whose logits are computed, ascending
  size_t total = 0;

  static InputLayout make(int64_t T, int64_t S, int64_t W, int64_t R) {
    InputLayout l;
    size_t at = 0;
    auto take = [&](size_t bytes) {
      const size_t offset = at;
      at = align_up(at + bytes, 256);
      return offset;
    };
    l.tok = take(sz(T) * 4);
    l.pos = take(sz(T) * 4);
    l.slot = take(sz(T) * 8);
    l.q_start = take(sz(S) * 4);
    l.q_len = take(sz(S) * 4);
    l.pos0 = take(sz(S) * 4);
    l.table = take(sz(S) * sz(W) * 4);
    l.rows = take(sz(R) * 4);
    l.total = at;
    return l;
  }
};

/// One step as the device sees it.
struct StepPlan {
  int64_t T = 0, S = 0;  // tokens, sequences
  int64_t W = 0;         // block-table width (blocks per sequence row)
  int64_t R = 0;         // head rows computed on the device (0 without a head)
  int32_t max_q_len = 0, min_q_len = 0, max_kv_len = 0;
  bool graph = false;
  size_t in_offset = 0;  // where its inputs sit in in_host and Work::in_dev (two micro-batches)
  InputLayout lay;
  std::vector<int64_t> out_src;  // per output logits row: its index among the R computed rows
};

/// One layer's device weights and cache. bf16 matrices are row-major [rows, cols] as stored.
struct DevLayer {
  bool moe = false;
  const float* attn_norm = nullptr;  // f32 [E]
  const float* ffn_norm = nullptr;   // f32 [E]
  // Grouped-query attention.
  const bf16* wqkv = nullptr;     // bf16 [(H + 2 HK) * D, E]: wq, wk, wv rows
  const float* bqkv = nullptr;    // f32 [(H + 2 HK) * D] or null (Qwen2; missing parts 0)
  const float* q_norm = nullptr;  // f32 [D] or null (Qwen3)
  const float* k_norm = nullptr;  // f32 [D] or null
  // Multi-head latent attention.
  const bf16* wq_a = nullptr;                // bf16 [q_lora, E] or null (then wq)
  const float* q_a_norm = nullptr;           // f32 [q_lora]
  const bf16* wq_b = nullptr;                // bf16 [H * (nope + rope), q_lora]
  const bf16* wq = nullptr;                  // bf16 [H * (nope + rope), E] when there is no wq_a
  const bf16* wkv_a = nullptr;               // bf16 [lora + rope, E]
  const float* kv_a_norm = nullptr;          // f32 [lora]
  const bf16* wk_b = nullptr;                // head h at h * wk_b_stride: bf16 [lora, nope]
  const bf16* wv_b = nullptr;                // head h at h * wv_b_stride: bf16 [v_head_dim, lora]
  int64_t wk_b_stride = 0, wv_b_stride = 0;  // elements, multiples of 8 (16-byte aligned heads)
  const bf16* wo = nullptr;                  // bf16 [E, H * dv]
  // Dense FFN.
  int64_t n_ff = 0;
  const bf16* w_gate_up = nullptr;  // bf16 [2 n_ff, E]: gate rows, then up rows
  const bf16* w_down = nullptr;     // bf16 [E, n_ff]
  // Mixture of experts.
  const bf16* router = nullptr;        // bf16 [n_expert, E]
  const float* router_bias = nullptr;  // f32 [n_expert] or null
  const bf16* exp_gate = nullptr;      // bf16 [n_expert, n_ff_exp, E]
  const bf16* exp_up = nullptr;        // bf16 [n_expert, n_ff_exp, E]
  const bf16* exp_down = nullptr;      // bf16 [n_expert, E, n_ff_exp]
  int64_t n_ff_sh = 0;
  const bf16* sh_gate_up = nullptr;  // bf16 [2 n_ff_sh, E] or null
  const bf16* sh_down = nullptr;     // bf16 [E, n_ff_sh]
  const bf16* sh_gate = nullptr;     // bf16 [E] or null (Qwen2 sigmoid gate of the shared expert)
  // KV cache of this layer (PagedKv layout; MLA: k holds the latent rows, v is null).
  bf16* k = nullptr;
  bf16* v = nullptr;
};

/// The step's per-step buffers, carved from the workspace arena once at create().
struct Work {
  void* gemm_ws = nullptr;
  uint8_t* in_dev = nullptr;  // InputLayout at capacity (twice with tensor parallelism)
  float* x = nullptr;         // f32 [T, E]: the residual stream
  bf16* h = nullptr;          // bf16 [T, E]: normed hidden states (the GEMM input)
  float* qkv = nullptr;       // f32 [T, (H + 2 HK) D]
  bf16* q = nullptr;          // bf16 [T, H, D]: roped queries
  bf16* attn = nullptr;       // bf16 [T, H * dv]: attention output, the wo input
  void* attn_ws = nullptr;    // split-K partials of the decode attention
  size_t attn_ws_bytes = 0;
  // MLA (head-major matrices are [H, T_cap, ld] with ld a multiple of 8).
  float* qa = nullptr;       // f32 [T, q_lora]
  bf16* qa_n = nullptr;      // bf16 [T, q_lora]
  float* qf = nullptr;       // f32 [T, H, nope + rope]
  float* kva = nullptr;      // f32 [T, lora + rope]
  bf16* q_nope_h = nullptr;  // bf16 [H, T_cap, nope_ld]
  bf16* qlat_h = nullptr;    // bf16 [H, T_cap, lora_ld]: wk_b . q_nope
  bf16* q_abs = nullptr;     // bf16 [T, H, lora + rope]: the attention query
  bf16* lat = nullptr;       // bf16 [T, H, lora]: the attention output
  bf16* lat_h = nullptr;     // bf16 [H, T_cap, lora_ld]
  bf16* attn_h = nullptr;    // bf16 [H, T_cap, dv_ld]: wv_b . lat
  // FFN and MoE.
  float* gate_up = nullptr;      // f32 [T, 2 ff_max]
  bf16* act = nullptr;           // bf16 [T, ff_max]
  float* router = nullptr;       // f32 [T, n_expert]
  float* shared_out = nullptr;   // f32 [T, E]
  float* shared_gate = nullptr;  // f32 [T]
  float* moe_y = nullptr;        // f32 [T, E]
  // Head.
  float* head_x = nullptr;  // f32 [C, E]: gathered rows
  bf16* head_h = nullptr;   // bf16 [C, E]
  float* logits = nullptr;  // f32 [C, V]
};

/// Device pointers of one step's inputs (into Work::in_dev).
struct StepInputs {
  const int32_t* tok = nullptr;
  const int32_t* pos = nullptr;
  const int64_t* slot = nullptr;
  const int32_t* q_start = nullptr;
  const int32_t* q_len = nullptr;
  const int32_t* pos0 = nullptr;
  const int32_t* table = nullptr;
  const int32_t* rows = nullptr;
};

/// One micro-batch of a step: its plan and inputs, its first row in the step's buffers, and the
/// event its last sum records on the comm stream (null: sums are waited for at once).
struct MicroBatch {
  const StepPlan* p = nullptr;
  StepInputs in;
  int64_t t0 = 0;
  cudaEvent_t summed = nullptr;
};

}  // namespace detail

struct GpuEngine::Impl {
  ~Impl();

  // ---- set-up (create) ----
  void init_dims(const GpuEngineOptions& o);
  template <class Alloc>
  void place_weights(Alloc& a, detail::Uploader* up);
  template <class Alloc>
  void place_kv(Alloc& a);
  template <class Alloc>
  void carve_work(Alloc& a);
  size_t moe_scratch_bytes() const;

  // ---- step ----
  Status validate(std::span<const compute::SeqStep> seqs, const compute::StepResult* out,
                  const float* hidden_in, const std::vector<float>* hidden_out) const;
  void forward(std::span<const compute::SeqStep> seqs, compute::StepResult* out,
               const float* hidden_in, std::vector<float>* hidden_out);
  detail::StepPlan plan_step(std::span<const compute::SeqStep> seqs, compute::StepResult* out,
                             size_t in_offset = 0);
  void forward_split(std::span<const compute::SeqStep> seqs, size_t k, compute::StepResult* out,
                     const float* hidden_in, std::vector<float>* hidden_out);
  detail::StepInputs inputs(const detail::StepPlan& p) const;
  void run_body(const detail::StepPlan& p);
  void try_capture(const detail::StepPlan& p, std::pair<int64_t, int64_t> key);
  void enqueue_body(const detail::StepPlan& p);
  void enqueue_layers(std::span<const detail::MicroBatch> mbs);
  void attention_part(const detail::DevLayer& L, const detail::MicroBatch& mb);
  void ffn_part(const detail::DevLayer& L, const detail::MicroBatch& mb);
  detail::Work rows_from(const detail::Work& base, int64_t t0) const;
  void attention(const detail::DevLayer& L, const detail::StepPlan& p,
                 const detail::StepInputs& in);
  void attention_mla(const detail::DevLayer& L, const detail::StepPlan& p,
                     const detail::StepInputs& in);
  void moe(const detail::DevLayer& L, const detail::StepPlan& p);
  void enqueue_head(const detail::StepInputs& in, int64_t r0, int64_t n);
  void copy_logits(const detail::StepPlan& p, const detail::StepInputs& in,
                   compute::StepResult* out);
  AttnBatch batch(const detail::StepPlan& p, const detail::StepInputs& in) const;
  void gemm(int64_t m, int64_t n, int64_t k, const detail::bf16* x, int64_t ldx,
            const detail::bf16* w, int64_t ldw, void* y, int64_t ldy, GemmOut y_type,
            bool accumulate);
  void recover() noexcept;
  void serve_experts();  // ep with no sequences: this rank's part of every MoE layer
  // Tensor parallelism: the sum over ranks of data (or nothing) on the comm stream; `summed`
  // null: the compute stream waits for it at once, else it is recorded there for later.
  void reduce(float* data, int64_t count, cudaEvent_t summed);

  // ---- configuration ----
  std::shared_ptr<const model::Model> model;
  GpuEngineOptions opts;
  compute::LayerRange range;
  int device = 0;
  Collective* tp = nullptr;  // null or a group of one: no tensor parallelism
  Collective* ep = nullptr;  // data-parallel ranks sharing experts (GpuEngineOptions::ep)
  int tp_rank = 0, tp_size = 1;
  bool head_here = false;  // range.head and tp_rank == 0
  // H and HK are this rank's heads (the model's / tp_size); H_all, HK_all the model's.
  int64_t E = 0, V = 0, H = 0, HK = 0, D = 0, n_rot = 0, H_all = 0, HK_all = 0;
  bool neox = false;
  double kq_scale_mult = 1.0;  // ModelSpec::kq_scale_mult
  float eps = 0;
  bool mla = false;
  int64_t q_lora = 0, lora = 0, rope = 0, nope = 0, dqk = 0, kw = 0, dv = 0;
  int64_t nope_ld = 0, lora_ld = 0, dv_ld = 0;
  int64_t attn_width = 0;  // H * dv: the wo input width
  int64_t qkv_rows = 0;    // GQA: (H + 2 HK) * D
  int64_t ff_max = 0;
  bool any_moe = false, any_shared = false, any_shared_gate = false;
  int64_t n_expert = 0, n_expert_used = 0, ff_exp = 0;  // ff_exp: this rank's share
  // Tensor parallelism by experts: this rank holds experts [exp_begin, exp_begin + exp_count)
  // at full width (otherwise all n_expert experts, ff_exp wide each).
  bool expert_parallel = false;
  int64_t exp_begin = 0, exp_count = 0;
  int64_t T_cap = 0, S_cap = 0, C_cap = 0;
  int64_t bs = 0, num_blocks = 0, num_slots = 0, n_layers = 0;
  detail::InputLayout in_cap;

  // ---- device state (declaration order = reverse destruction order) ----
  std::unique_ptr<StreamPair> streams;
  cudaEvent_t ev_start = nullptr, ev_stop = nullptr;
  cudaEvent_t ev_summed[2] = {nullptr, nullptr};  // tensor parallelism: per micro-batch
  uint8_t* in_host = nullptr;  // pinned, in_cap.total bytes (twice with tensor parallelism)
  Arena weights, kv, work;
  std::unique_ptr<Gemm> gemmer;
  std::unique_ptr<MoeForward> moe_fwd;
  std::vector<detail::DevLayer> layers;
  const detail::bf16* tok_embd = nullptr;  // bf16 [V, E]
  const detail::bf16* output = nullptr;    // bf16 [V, E]
  const float* out_norm = nullptr;         // f32 [E]
  const float* rope_cos = nullptr;         // f32 [num_slots, n_rot / 2]
  const float* rope_sin = nullptr;
  detail::Work w;
  std::unique_ptr<compute::BlockAllocator> alloc;
  std::map<std::pair<int64_t, int64_t>, cudaGraphExec_t> graphs;
  std::set<std::pair<int64_t, int64_t>> graph_failed;
  std::string graph_error;
  bool graphs_allowed = false;
  float last_ms = 0;
};

}  // namespace troupe::gpu
