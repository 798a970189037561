// GpuEngine (gpu/engine.h): weight upload, the KV pool and the workspace, step validation, and
// the per-layer orchestration of the GPU kernels on the compute stream, mirroring
// compute/engine.cc forward(), attention(), attention_mla(), ffn() and moe().
//
// Batch invariance: every launch computes a row (token) from that row alone, in an order fixed by
// the row's own data (gpu/ops.h, gpu/gemm.h, gpu/attention.h, gpu/moe.h, engine_kernels.cu).
// Nothing here picks a code path from the batch: the batch only sets grids and row counts. The
// launch parameters that differ between an eager step and a graph of the same rows (block-table
// width, max_kv_len, which head rows are computed) change grids only: attention's decode split
// depends on each sequence's context length alone, and the GEMM pins its algorithm per (N, K),
// never per M.
//
// CUDA graphs: a decode-only step (every SeqStep has one token) of a range without MoE layers is
// keyed by (number of sequences, block-table width rounded up to a power of two). The first step
// of a key runs eagerly and is then captured (capture records, it does not run the kernels); later
// steps of that key upload their inputs into the same device buffers and replay the graph. MoE
// layers sync the host once per layer (MoeForward needs the per-expert row counts to issue its
// GEMMs), so a range with MoE layers never uses graphs.
#include "gpu/engine.h"

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <limits>
#include <map>
#include <set>
#include <utility>

#include "base/check.h"
#include "gpu/attention.h"
#include "gpu/detail/engine_kernels.h"
#include "gpu/gemm.h"
#include "gpu/moe.h"
#include "gpu/ops.h"
#include "gpu/runtime.h"

namespace troupe::gpu {

namespace {

using bf16 = __nv_bfloat16;
using compute::SeqStep;
using model::GgmlType;
using model::LayerSpec;
using model::ModelSpec;
using model::WeightView;

constexpr size_t kStagingBytes = size_t{64} << 20;       // weight upload: raw bytes per copy
constexpr size_t kDeviceSlackBytes = size_t{256} << 20;  // cuBLASLt, streams, graphs, staging
constexpr int kErrBadInput = static_cast<int>(Errc::kBadInput);
constexpr int kErrStepFailed = static_cast<int>(Errc::kStepFailed);

long long ll(int64_t v) { return static_cast<long long>(v); }
size_t sz(int64_t n) { return static_cast<size_t>(n); }
size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }
int64_t round_up8(int64_t n) { return (n + 7) / 8 * 8; }
double mib(uint64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }
int64_t next_pow2(int64_t n) {
  int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}

/// Counts what an Arena hands out for the same sequence of allocate() calls (the same 256-byte
/// alignment of every start): the sizing pass before the real allocation.
class ArenaSizer {
 public:
  void* allocate(size_t bytes, const char* /*what*/) {
    used_ = align_up(used_, 256) + bytes;
    return nullptr;
  }
  template <class T>
  T* allocate_n(size_t n, const char* what) {
    return static_cast<T*>(allocate(n * sizeof(T), what));
  }
  size_t used() const { return used_; }

 private:
  size_t used_ = 0;
};

/// Copies weights to the device: matrices dequantized to bf16 through a staging buffer, norm and
/// bias vectors as f32. Runs at create() only; synchronous.
class Uploader {
 public:
  explicit Uploader(cudaStream_t stream) : stream_(stream) {}

  /// All rows of w (ne[1] * ne[2] rows of ne[0] columns) as bf16 at dst, row-major.
  void rows(const WeightView& w, bf16* dst) {
    const int64_t n_rows = w.ne[1] * w.ne[2], row_bytes = w.row_bytes();
    if (n_rows == 0) return;
    const int64_t per = std::max<int64_t>(1, static_cast<int64_t>(kStagingBytes) / row_bytes);
    const size_t need = sz(std::min(per, n_rows) * row_bytes);
    if (staging_.size() < need) staging_ = DeviceBuffer<uint8_t>(need);
    for (int64_t r0 = 0; r0 < n_rows; r0 += per) {
      const int64_t n = std::min(per, n_rows - r0);
      const size_t bytes = sz(n * row_bytes);
      TROUPE_CUDA_CHECK(cudaMemcpyAsync(staging_.get(), w.data + r0 * row_bytes, bytes,
                                        cudaMemcpyHostToDevice, stream_));
      dequantize_to_bf16(staging_.get(), bytes, w.type, n, w.cols(), dst + r0 * w.cols(), stream_);
      // The next chunk overwrites the staging buffer.
      TROUPE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
  }
  void f32(const float* host, int64_t n, float* dst) {
    TROUPE_CUDA_CHECK(
        cudaMemcpyAsync(dst, host, sz(n) * sizeof(float), cudaMemcpyHostToDevice, stream_));
    TROUPE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void zeros(float* dst, int64_t n) {
    TROUPE_CUDA_CHECK(cudaMemsetAsync(dst, 0, sz(n) * sizeof(float), stream_));
  }

 private:
  cudaStream_t stream_;
  DeviceBuffer<uint8_t> staging_;
};

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
  uint8_t* in_dev = nullptr;  // InputLayout at capacity
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

}  // namespace

struct GpuEngine::Impl {
  ~Impl();

  // ---- set-up (create) ----
  void init_dims(const GpuEngineOptions& o);
  template <class Alloc>
  void place_weights(Alloc& a, Uploader* up);
  template <class Alloc>
  void place_kv(Alloc& a);
  template <class Alloc>
  void carve_work(Alloc& a);
  size_t moe_scratch_bytes() const;

  // ---- step ----
  Status validate(std::span<const SeqStep> seqs, const compute::StepResult* out,
                  const float* hidden_in, const std::vector<float>* hidden_out) const;
  void forward(std::span<const SeqStep> seqs, compute::StepResult* out, const float* hidden_in,
               std::vector<float>* hidden_out);
  StepPlan plan_step(std::span<const SeqStep> seqs, compute::StepResult* out);
  StepInputs inputs(const StepPlan& p) const;
  void run_body(const StepPlan& p);
  void try_capture(const StepPlan& p, std::pair<int64_t, int64_t> key);
  void enqueue_body(const StepPlan& p);
  void attention(const DevLayer& L, const StepPlan& p, const StepInputs& in);
  void attention_mla(const DevLayer& L, const StepPlan& p, const StepInputs& in);
  void moe(const DevLayer& L, const StepPlan& p);
  void enqueue_head(const StepInputs& in, int64_t r0, int64_t n);
  void copy_logits(const StepPlan& p, const StepInputs& in, compute::StepResult* out);
  AttnBatch batch(const StepPlan& p, const StepInputs& in) const;
  void gemm(int64_t m, int64_t n, int64_t k, const bf16* x, int64_t ldx, const bf16* w, int64_t ldw,
            void* y, int64_t ldy, GemmOut y_type, bool accumulate);
  void recover() noexcept;

  // ---- configuration ----
  std::shared_ptr<const model::Model> model;
  GpuEngineOptions opts;
  compute::LayerRange range;
  int device = 0;
  int64_t E = 0, V = 0, H = 0, HK = 0, D = 0, n_rot = 0;
  bool neox = false;
  float eps = 0;
  bool mla = false;
  int64_t q_lora = 0, lora = 0, rope = 0, nope = 0, dqk = 0, kw = 0, dv = 0;
  int64_t nope_ld = 0, lora_ld = 0, dv_ld = 0;
  int64_t attn_width = 0;  // H * dv: the wo input width
  int64_t qkv_rows = 0;    // GQA: (H + 2 HK) * D
  int64_t ff_max = 0;
  bool any_moe = false, any_shared = false, any_shared_gate = false;
  int64_t n_expert = 0, n_expert_used = 0, ff_exp = 0;
  int64_t T_cap = 0, S_cap = 0, C_cap = 0;
  int64_t bs = 0, num_blocks = 0, num_slots = 0, n_layers = 0;
  InputLayout in_cap;

  // ---- device state (declaration order = reverse destruction order) ----
  std::unique_ptr<StreamPair> streams;
  cudaEvent_t ev_start = nullptr, ev_stop = nullptr;
  uint8_t* in_host = nullptr;  // pinned, in_cap.total bytes
  Arena weights, kv, work;
  std::unique_ptr<Gemm> gemmer;
  std::unique_ptr<MoeForward> moe_fwd;
  std::vector<DevLayer> layers;
  const bf16* tok_embd = nullptr;   // bf16 [V, E]
  const bf16* output = nullptr;     // bf16 [V, E]
  const float* out_norm = nullptr;  // f32 [E]
  const float* rope_cos = nullptr;  // f32 [num_slots, n_rot / 2]
  const float* rope_sin = nullptr;
  Work w;
  std::unique_ptr<compute::BlockAllocator> alloc;
  std::map<std::pair<int64_t, int64_t>, cudaGraphExec_t> graphs;
  std::set<std::pair<int64_t, int64_t>> graph_failed;
  std::string graph_error;
  bool graphs_allowed = false;
  float last_ms = 0;
};

GpuEngine::Impl::~Impl() {
  // No throwing here: errors of a broken context are ignored on the way out.
  cudaSetDevice(device);
  if (streams) cudaStreamSynchronize(streams->compute());
  for (auto& [key, exec] : graphs) cudaGraphExecDestroy(exec);
  if (ev_start) cudaEventDestroy(ev_start);
  if (ev_stop) cudaEventDestroy(ev_stop);
  if (in_host) cudaFreeHost(in_host);
  cudaGetLastError();
}

// ---- set-up ------------------------------------------------------------------------------------

namespace {

[[noreturn]] void shape_error(const WeightView& w, const char* expected) {
  TROUPE_INPUT_ERROR("GpuEngine: weight %s has shape [%lld, %lld, %lld], expected %s",
                     w.name.c_str(), ll(w.ne[0]), ll(w.ne[1]), ll(w.ne[2]), expected);
}

void expect_matrix(const WeightView& w, int64_t rows, int64_t cols, int64_t stack = 1) {
  if (!w.present()) TROUPE_INPUT_ERROR("GpuEngine: weight %s is missing", w.name.c_str());
  if (w.ne[0] != cols || w.ne[1] != rows || w.ne[2] != stack)
    shape_error(
        w, strfmt("[%lld, %lld, %lld] (cols, rows, stack)", ll(cols), ll(rows), ll(stack)).c_str());
  if (!dequantize_supported(w.type))
    TROUPE_INPUT_ERROR(
        "GpuEngine: weight %s has type %s, which the GPU backend does not support (f32, f16, "
        "bf16, q8_0, q4_0, q4_K and q6_K are)",
        w.name.c_str(), model::type_name(w.type).c_str());
}

void expect_f32_vector(const WeightView& w, int64_t n) {
  if (w.type != GgmlType::kF32)
    TROUPE_INPUT_ERROR("GpuEngine: norm/bias weight %s must be f32, is %s", w.name.c_str(),
                       model::type_name(w.type).c_str());
  if (w.ne[0] * w.ne[1] * w.ne[2] != n) shape_error(w, strfmt("%lld elements", ll(n)).c_str());
}

/// A bf16 matrix of the given views' rows, in order (each [rows_i, cols]).
template <class Alloc>
bf16* place_matrix(Alloc& a, Uploader* up, std::initializer_list<const WeightView*> parts,
                   const char* what) {
  int64_t rows = 0, cols = -1;
  for (const WeightView* p : parts) {
    if (cols < 0) cols = p->cols();
    if (p->cols() != cols)
      TROUPE_INPUT_ERROR("GpuEngine: %s: %s has %lld columns, expected %lld", what, p->name.c_str(),
                         ll(p->cols()), ll(cols));
    rows += p->ne[1] * p->ne[2];
  }
  bf16* dst = a.template allocate_n<bf16>(sz(rows * cols), what);
  if (up) {
    int64_t at = 0;
    for (const WeightView* p : parts) {
      up->rows(*p, dst + at * cols);
      at += p->ne[1] * p->ne[2];
    }
  }
  return dst;
}

template <class Alloc>
const float* place_f32(Alloc& a, Uploader* up, const WeightView& w, int64_t n, const char* what) {
  if (!w.present()) return nullptr;
  expect_f32_vector(w, n);
  float* dst = a.template allocate_n<float>(sz(n), what);
  if (up) up->f32(reinterpret_cast<const float*>(w.data), n, dst);
  return dst;
}

/// place_f32 of a weight the architecture needs: a missing one is an error (in both passes).
template <class Alloc>
const float* place_f32_required(Alloc& a, Uploader* up, const WeightView& w, int64_t n,
                                const char* what) {
  if (!w.present()) TROUPE_INPUT_ERROR("GpuEngine: the model lacks a needed %s weight", what);
  return place_f32(a, up, w, n, what);
}

}  // namespace

void GpuEngine::Impl::init_dims(const GpuEngineOptions& o) {
  const ModelSpec& s = model->spec;
  E = s.n_embd;
  V = s.n_vocab;
  H = s.n_head;
  HK = s.n_head_kv;
  n_rot = s.n_rot;
  neox = s.rope_style == model::RopeStyle::kNeox;
  eps = s.rms_eps;
  mla = s.is_mla();
  n_layers = range.end - range.begin;
  if (E < 1 || V < 1 || H < 1) TROUPE_INPUT_ERROR("GpuEngine: model has an empty shape");
  if (H > 65535)
    TROUPE_INPUT_ERROR("GpuEngine: %lld heads are more than the GPU kernels take (65535)", ll(H));
  if (n_rot < 0 || n_rot % 2 != 0)
    TROUPE_INPUT_ERROR("GpuEngine: n_rot %lld must be even and >= 0", ll(n_rot));
  if (mla) {
    q_lora = s.q_lora_rank;
    lora = s.kv_lora_rank;
    rope = s.qk_rope_dim;
    nope = s.qk_nope_dim;
    dv = s.v_head_dim;
    dqk = nope + rope;
    kw = lora + rope;
    if (lora < 1 || lora > 512 || rope > 64 || rope % 2 != 0 || nope < 1 || dv < 1)
      TROUPE_INPUT_ERROR(
          "GpuEngine: MLA shape not supported on the GPU: kv_lora_rank %lld (1..512), "
          "qk_rope_dim %lld (even, <= 64), qk_nope_dim %lld (>= 1), v_head_dim %lld (>= 1)",
          ll(lora), ll(rope), ll(nope), ll(dv));
    if (rope != n_rot)
      TROUPE_INPUT_ERROR("GpuEngine: MLA needs n_rot (%lld) == qk_rope_dim (%lld)", ll(n_rot),
                         ll(rope));
    nope_ld = round_up8(nope);
    lora_ld = round_up8(lora);
    dv_ld = round_up8(dv);
    attn_width = H * dv;
  } else {
    D = s.head_dim_k;
    if (HK < 1 || H % HK != 0)
      TROUPE_INPUT_ERROR("GpuEngine: n_head %lld is not a multiple of n_head_kv %lld", ll(H),
                         ll(HK));
    if (s.head_dim_v != D)
      TROUPE_INPUT_ERROR(
          "GpuEngine: key and value head widths differ (%lld, %lld): not supported on the GPU",
          ll(D), ll(s.head_dim_v));
    if (D < 1 || D > 256)
      TROUPE_INPUT_ERROR("GpuEngine: head_dim %lld is outside 1..256 (the GPU attention kernels)",
                         ll(D));
    if (n_rot > D) TROUPE_INPUT_ERROR("GpuEngine: n_rot %lld > head_dim %lld", ll(n_rot), ll(D));
    qkv_rows = (H + 2 * HK) * D;
    attn_width = H * D;
  }
  for (int64_t il = range.begin; il < range.end; ++il) {
    const LayerSpec& L = s.layers[sz(il)];
    if (L.is_moe) {
      any_moe = true;
      if (L.shared.gate.present()) {
        any_shared = true;
        ff_max = std::max(ff_max, L.shared.gate.rows());
        if (L.shared_gate.present()) any_shared_gate = true;
      }
    } else {
      ff_max = std::max(ff_max, L.ffn_gate.rows());
    }
  }
  if (any_moe) {
    n_expert = s.n_expert;
    n_expert_used = s.n_expert_used;
    ff_exp = s.n_ff_exp;
    if (E % 8 != 0 || ff_exp % 8 != 0 || ff_exp < 8)
      TROUPE_INPUT_ERROR(
          "GpuEngine: MoE on the GPU needs n_embd (%lld) and n_ff_exp (%lld) to be positive "
          "multiples of 8",
          ll(E), ll(ff_exp));
    validate_moe_routing(MoeRouting::from_spec(s));
  }
  bs = o.kv_block_size;
  num_blocks = o.kv_num_blocks > 0 ? o.kv_num_blocks : (o.max_tokens_in_cache + bs - 1) / bs;
  if (num_blocks < 1 || num_blocks > std::numeric_limits<int32_t>::max() / bs)
    TROUPE_INPUT_ERROR(
        "GpuEngine: the KV pool of %lld blocks of %lld positions must hold 1 .. 2^31 - 1 "
        "positions",
        ll(num_blocks), ll(bs));
  num_slots = num_blocks * bs;
  T_cap = o.max_step_tokens;
  S_cap = std::min(o.max_step_seqs, o.max_step_tokens);
  C_cap = S_cap;
  const int64_t kv_heads = mla ? 1 : HK;
  if (S_cap * kv_heads > 65535)
    TROUPE_INPUT_ERROR(
        "GpuEngine: max_step_seqs %lld times %lld KV heads exceeds 65535 (the attention grid)",
        ll(S_cap), ll(kv_heads));
  in_cap = InputLayout::make(T_cap, S_cap, num_blocks, T_cap);
}

template <class Alloc>
void GpuEngine::Impl::place_weights(Alloc& a, Uploader* up) {
  const ModelSpec& s = model->spec;
  layers.assign(sz(n_layers), DevLayer{});
  tok_embd = output = nullptr;
  out_norm = rope_cos = rope_sin = nullptr;
  if (range.embed) {
    expect_matrix(s.token_embd, V, E);
    tok_embd = place_matrix(a, up, {&s.token_embd}, "token_embd");
  }
  if (range.head) {
    out_norm = place_f32_required(a, up, s.output_norm, E, "output_norm");
    expect_matrix(s.output, V, E);
    // A tied head reads the embedding table already on the device.
    if (range.embed && s.output.data == s.token_embd.data && s.output.type == s.token_embd.type)
      output = tok_embd;
    else
      output = place_matrix(a, up, {&s.output}, "output");
  }
  if (n_rot >= 2) {
    const int64_t half = n_rot / 2;
    float* c = a.template allocate_n<float>(sz(num_slots * half), "rope cos");
    float* sn = a.template allocate_n<float>(sz(num_slots * half), "rope sin");
    if (up) {
      const RopeTable t = make_rope_table(num_slots, n_rot, s.rope_theta);
      up->f32(t.cos.data(), num_slots * half, c);
      up->f32(t.sin.data(), num_slots * half, sn);
    }
    rope_cos = c;
    rope_sin = sn;
  }
  for (int64_t l = 0; l < n_layers; ++l) {
    const LayerSpec& L = s.layers[sz(range.begin + l)];
    DevLayer& d = layers[sz(l)];
    d.attn_norm = place_f32_required(a, up, L.attn_norm, E, "attn_norm");
    d.ffn_norm = place_f32_required(a, up, L.ffn_norm, E, "ffn_norm");
    if (mla) {
      if (L.wq_a.present()) {
        expect_matrix(L.wq_a, q_lora, E);
        expect_matrix(L.wq_b, H * dqk, q_lora);
        d.wq_a = place_matrix(a, up, {&L.wq_a}, "wq_a");
        d.q_a_norm = place_f32_required(a, up, L.q_a_norm, q_lora, "q_a_norm");
        d.wq_b = place_matrix(a, up, {&L.wq_b}, "wq_b");
      } else {
        expect_matrix(L.wq, H * dqk, E);
        d.wq = place_matrix(a, up, {&L.wq}, "wq");
      }
      expect_matrix(L.wkv_a, kw, E);
      d.wkv_a = place_matrix(a, up, {&L.wkv_a}, "wkv_a");
      d.kv_a_norm = place_f32_required(a, up, L.kv_a_norm, lora, "kv_a_norm");
      // Per-head matrices, each starting 16-byte aligned (Gemm's requirement on w).
      expect_matrix(L.wk_b, lora, nope, H);
      expect_matrix(L.wv_b, dv, lora, H);
      d.wk_b_stride = round_up8(lora * nope);
      d.wv_b_stride = round_up8(dv * lora);
      bf16* kb = a.template allocate_n<bf16>(sz(H * d.wk_b_stride), "wk_b");
      bf16* vb = a.template allocate_n<bf16>(sz(H * d.wv_b_stride), "wv_b");
      if (up) {
        for (int64_t h = 0; h < H; ++h) {
          up->rows(L.wk_b.slice(h), kb + h * d.wk_b_stride);
          up->rows(L.wv_b.slice(h), vb + h * d.wv_b_stride);
        }
      }
      d.wk_b = kb;
      d.wv_b = vb;
    } else {
      expect_matrix(L.wq, H * D, E);
      expect_matrix(L.wk, HK * D, E);
      expect_matrix(L.wv, HK * D, E);
      d.wqkv = place_matrix(a, up, {&L.wq, &L.wk, &L.wv}, "wqkv");
      if (L.bq.present() || L.bk.present() || L.bv.present()) {
        float* b = a.template allocate_n<float>(sz(qkv_rows), "bqkv");
        const WeightView* parts[3] = {&L.bq, &L.bk, &L.bv};
        const int64_t widths[3] = {H * D, HK * D, HK * D};
        int64_t at = 0;
        for (int i = 0; i < 3; ++i) {
          if (parts[i]->present()) {
            expect_f32_vector(*parts[i], widths[i]);
            if (up) up->f32(reinterpret_cast<const float*>(parts[i]->data), widths[i], b + at);
          } else if (up) {
            up->zeros(b + at, widths[i]);  // x + 0 == x: the CPU adds nothing there
          }
          at += widths[i];
        }
        d.bqkv = b;
      }
      d.q_norm = place_f32(a, up, L.q_norm, D, "q_norm");
      d.k_norm = place_f32(a, up, L.k_norm, D, "k_norm");
    }
    expect_matrix(L.wo, E, attn_width);
    d.wo = place_matrix(a, up, {&L.wo}, "wo");
    d.moe = L.is_moe;
    if (L.is_moe) {
      expect_matrix(L.router, n_expert, E);
      d.router = place_matrix(a, up, {&L.router}, "router");
      d.router_bias = place_f32(a, up, L.router_bias, n_expert, "router_bias");
      if (static_cast<int64_t>(L.experts.size()) != n_expert)
        TROUPE_INPUT_ERROR("GpuEngine: layer %lld has %zu experts, expected %lld",
                           ll(range.begin + l), L.experts.size(), ll(n_expert));
      bf16* g = a.template allocate_n<bf16>(sz(n_expert * ff_exp * E), "experts gate");
      bf16* u = a.template allocate_n<bf16>(sz(n_expert * ff_exp * E), "experts up");
      bf16* dn = a.template allocate_n<bf16>(sz(n_expert * E * ff_exp), "experts down");
      for (int64_t e = 0; e < n_expert; ++e) {
        const model::ExpertFfn& f = L.experts[sz(e)];
        expect_matrix(f.gate, ff_exp, E);
        expect_matrix(f.up, ff_exp, E);
        expect_matrix(f.down, E, ff_exp);
        if (up) {
          up->rows(f.gate, g + e * ff_exp * E);
          up->rows(f.up, u + e * ff_exp * E);
          up->rows(f.down, dn + e * E * ff_exp);
        }
      }
      d.exp_gate = g;
      d.exp_up = u;
      d.exp_down = dn;
      if (L.shared.gate.present()) {
        d.n_ff_sh = L.shared.gate.rows();
        expect_matrix(L.shared.gate, d.n_ff_sh, E);
        expect_matrix(L.shared.up, d.n_ff_sh, E);
        expect_matrix(L.shared.down, E, d.n_ff_sh);
        d.sh_gate_up = place_matrix(a, up, {&L.shared.gate, &L.shared.up}, "shared gate_up");
        d.sh_down = place_matrix(a, up, {&L.shared.down}, "shared down");
        if (L.shared_gate.present()) {
          expect_matrix(L.shared_gate, 1, E);
          d.sh_gate = place_matrix(a, up, {&L.shared_gate}, "shared_gate");
        }
      }
    } else {
      d.n_ff = L.ffn_gate.rows();
      expect_matrix(L.ffn_gate, d.n_ff, E);
      expect_matrix(L.ffn_up, d.n_ff, E);
      expect_matrix(L.ffn_down, E, d.n_ff);
      d.w_gate_up = place_matrix(a, up, {&L.ffn_gate, &L.ffn_up}, "ffn gate_up");
      d.w_down = place_matrix(a, up, {&L.ffn_down}, "ffn down");
    }
  }
}

template <class Alloc>
void GpuEngine::Impl::place_kv(Alloc& a) {
  const int64_t k_width = mla ? kw : HK * D;
  for (int64_t l = 0; l < n_layers; ++l) {
    DevLayer& d = layers[sz(l)];
    d.k = a.template allocate_n<bf16>(sz(num_slots * k_width), "KV cache K");
    d.v = mla ? nullptr : a.template allocate_n<bf16>(sz(num_slots * HK * D), "KV cache V");
  }
}

template <class Alloc>
void GpuEngine::Impl::carve_work(Alloc& a) {
  const size_t T = sz(T_cap), C = sz(C_cap);
  w = Work{};
  w.gemm_ws = a.allocate(Gemm::kDefaultWorkspaceBytes, "gemm workspace");
  w.in_dev = a.template allocate_n<uint8_t>(in_cap.total, "step inputs");
  w.x = a.template allocate_n<float>(T * sz(E), "residual");
  w.h = a.template allocate_n<bf16>(T * sz(E), "normed hidden");
  if (mla) {
    if (q_lora > 0) {
      w.qa = a.template allocate_n<float>(T * sz(q_lora), "q_a");
      w.qa_n = a.template allocate_n<bf16>(T * sz(q_lora), "q_a normed");
    }
    w.qf = a.template allocate_n<float>(T * sz(H * dqk), "q");
    w.kva = a.template allocate_n<float>(T * sz(kw), "kv_a");
    w.q_nope_h = a.template allocate_n<bf16>(sz(H) * T * sz(nope_ld), "q_nope by head");
    w.qlat_h = a.template allocate_n<bf16>(sz(H) * T * sz(lora_ld), "q latent by head");
    w.q_abs = a.template allocate_n<bf16>(T * sz(H * kw), "q_abs");
    w.lat = a.template allocate_n<bf16>(T * sz(H * lora), "attention latent");
    w.lat_h = a.template allocate_n<bf16>(sz(H) * T * sz(lora_ld), "latent by head");
    w.attn_h = a.template allocate_n<bf16>(sz(H) * T * sz(dv_ld), "values by head");
  } else {
    w.qkv = a.template allocate_n<float>(T * sz(qkv_rows), "qkv");
    w.q = a.template allocate_n<bf16>(T * sz(H * D), "q");
  }
  w.attn = a.template allocate_n<bf16>(T * sz(attn_width), "attention output");
  w.attn_ws_bytes = paged_attention_workspace_bytes(
      static_cast<int32_t>(S_cap), static_cast<int32_t>(H), static_cast<int32_t>(mla ? lora : D),
      static_cast<int32_t>(num_slots));
  w.attn_ws = a.allocate(w.attn_ws_bytes, "attention workspace");
  if (ff_max > 0) {
    w.gate_up = a.template allocate_n<float>(T * sz(2 * ff_max), "gate_up");
    w.act = a.template allocate_n<bf16>(T * sz(ff_max), "swiglu");
  }
  if (any_moe) {
    w.router = a.template allocate_n<float>(T * sz(n_expert), "router logits");
    w.moe_y = a.template allocate_n<float>(T * sz(E), "moe output");
    if (any_shared) w.shared_out = a.template allocate_n<float>(T * sz(E), "shared expert");
    if (any_shared_gate) w.shared_gate = a.template allocate_n<float>(T, "shared gate logit");
  }
  if (range.head) {
    w.head_x = a.template allocate_n<float>(C * sz(E), "head rows");
    w.head_h = a.template allocate_n<bf16>(C * sz(E), "head rows normed");
    w.logits = a.template allocate_n<float>(C * sz(V), "logits");
  }
}

// What MoeForward::run and run_moe_experts take from the arena for T_cap tokens (gpu/moe.cu):
// ids, weights, row_entry, entry_row (4 B per entry), x_sorted (bf16) and expert_out (f32) rows,
// per-expert counts and offsets, then gate and up (f32) and the SwiGLU product (bf16) per entry;
// 256 bytes of alignment for each of the 11 allocations.
size_t GpuEngine::Impl::moe_scratch_bytes() const {
  if (!any_moe) return 0;
  const size_t n_ent = sz(T_cap) * sz(n_expert_used);
  const size_t d = sz(E), ff = sz(ff_exp);
  return n_ent * (16 + 6 * d + 10 * ff) + 8 * sz(n_expert) + 4 + 16 * 256 + (size_t{1} << 20);
}

Result<std::unique_ptr<GpuEngine>> GpuEngine::create(std::shared_ptr<const model::Model> model,
                                                     const GpuEngineOptions& opts) {
  if (!model) return Error{kErrBadInput, "GpuEngine: no model"};
  std::string why;
  if (!gpu_available(&why))
    return Error{static_cast<int>(Errc::kNoDevice), "GpuEngine: no usable CUDA GPU: " + why};
  if (opts.kv_block_size < 1 || opts.kv_block_size > 4096)
    return Error{kErrBadInput, "GpuEngine: KV block size must be in 1..4096"};
  if (opts.max_step_tokens < 1 || opts.max_step_tokens > std::numeric_limits<int32_t>::max())
    return Error{kErrBadInput, "GpuEngine: max_step_tokens must be in 1..2^31 - 1"};
  if (opts.max_step_seqs < 1) return Error{kErrBadInput, "GpuEngine: max_step_seqs must be >= 1"};
  const ModelSpec& s = model->spec;
  compute::LayerRange range = opts.range;
  if (range.end < 0) range.end = s.n_layer;
  if (range.begin < 0 || range.begin >= range.end || range.end > s.n_layer)
    return Error{kErrBadInput, strfmt("GpuEngine: layer range [%lld, %lld) is not inside [0, %lld)",
                                      ll(range.begin), ll(range.end), ll(s.n_layer))};
  uint64_t need = 0;
  size_t free_bytes = 0;
  try {
    int count = 0;
    TROUPE_CUDA_CHECK(cudaGetDeviceCount(&count));
    if (opts.device < 0 || opts.device >= count)
      return Error{kErrBadInput, strfmt("GpuEngine: device %d does not exist (%d CUDA devices)",
                                        opts.device, count)};
    TROUPE_CUDA_CHECK(cudaSetDevice(opts.device));
    cudaDeviceProp prop{};
    TROUPE_CUDA_CHECK(cudaGetDeviceProperties(&prop, opts.device));
    if (prop.major < 8)
      return Error{kErrBadInput,
                   strfmt("GpuEngine: %s is sm_%d%d: unsupported architecture (the GPU backend "
                          "needs sm_80 or newer for bf16)",
                          prop.name, prop.major, prop.minor)};

    auto impl = std::make_unique<Impl>();
    Impl& m = *impl;
    m.model = std::move(model);
    m.opts = opts;
    m.range = range;
    m.device = opts.device;
    m.init_dims(opts);

    // Sizing passes (also every shape and type check), then one check against free memory.
    ArenaSizer wsz, ksz, xsz;
    m.place_weights(wsz, nullptr);
    m.place_kv(ksz);
    m.carve_work(xsz);
    const size_t work_bytes = xsz.used() + m.moe_scratch_bytes();
    need = wsz.used() + ksz.used() + work_bytes + kDeviceSlackBytes;
    size_t total_bytes = 0;
    TROUPE_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    auto oom = [&](const std::string& detail) {
      return Error{static_cast<int>(Errc::kOutOfMemory),
                   strfmt("GpuEngine: out of device memory on GPU %d: needs %.1f MiB (weights "
                          "%.1f, KV pool %.1f, workspace %.1f, slack %.1f), %.1f MiB free%s",
                          opts.device, mib(need), mib(wsz.used()), mib(ksz.used()), mib(work_bytes),
                          mib(kDeviceSlackBytes), mib(free_bytes), detail.c_str())};
    };
    if (need > free_bytes) return oom("");

    try {
      m.streams = std::make_unique<StreamPair>();
      TROUPE_CUDA_CHECK(cudaEventCreate(&m.ev_start));
      TROUPE_CUDA_CHECK(cudaEventCreate(&m.ev_stop));
      TROUPE_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&m.in_host), m.in_cap.total));
      m.weights = Arena(wsz.used());
      m.kv = Arena(ksz.used());
      m.work = Arena(work_bytes);
      {
        Uploader up(m.streams->compute());
        m.place_weights(m.weights, &up);
      }
      m.place_kv(m.kv);
      if (m.kv.capacity() > 0)
        TROUPE_CUDA_CHECK(cudaMemsetAsync(m.layers[0].k, 0, m.kv.capacity(), m.streams->compute()));
      m.carve_work(m.work);
      TROUPE_CUDA_CHECK(cudaStreamSynchronize(m.streams->compute()));
    } catch (const DeviceError& ex) {
      if (ex.code() == Errc::kOutOfMemory) return oom(std::string(": ") + ex.what());
      throw;
    }
    m.gemmer = std::make_unique<Gemm>(m.w.gemm_ws, Gemm::kDefaultWorkspaceBytes);
    if (m.any_moe)
      m.moe_fwd = std::make_unique<MoeForward>(MoeRouting::from_spec(s), m.gemmer.get());
    m.alloc = std::make_unique<compute::BlockAllocator>(m.num_blocks);
    m.graphs_allowed = !m.any_moe;
    return std::unique_ptr<GpuEngine>(new GpuEngine(std::move(impl)));
  } catch (const DeviceError& ex) {
    return Error{static_cast<int>(ex.code()), ex.what()};
  } catch (const std::exception& ex) {
    return Error{kErrBadInput, ex.what()};
  }
}

GpuEngine::GpuEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GpuEngine::~GpuEngine() = default;

const model::ModelSpec& GpuEngine::spec() const { return impl_->model->spec; }
const compute::LayerRange& GpuEngine::range() const { return impl_->range; }
compute::BlockAllocator& GpuEngine::blocks() { return *impl_->alloc; }
uint64_t GpuEngine::weight_bytes() const { return impl_->weights.capacity(); }
uint64_t GpuEngine::kv_bytes() const { return impl_->kv.capacity(); }
float GpuEngine::last_step_ms() const { return impl_->last_ms; }
StreamPair& GpuEngine::streams() { return *impl_->streams; }
size_t GpuEngine::num_graphs() const { return impl_->graphs.size(); }
const std::string& GpuEngine::graph_error() const { return impl_->graph_error; }

// ---- step --------------------------------------------------------------------------------------

Status GpuEngine::step(std::span<const SeqStep> seqs, compute::StepResult* out,
                       const float* hidden_in, std::vector<float>* hidden_out) {
  Impl& m = *impl_;
  if (Status v = m.validate(seqs, out, hidden_in, hidden_out); !v) return v;
  try {
    m.forward(seqs, out, hidden_in, hidden_out);
    return Ok{};
  } catch (const std::exception& ex) {
    m.recover();
    return Error{kErrStepFailed, ex.what()};
  }
}

// The checks and messages of compute::Engine::step, plus the bounds this engine was sized for.
Status GpuEngine::Impl::validate(std::span<const SeqStep> seqs, const compute::StepResult* out,
                                 const float* hidden_in,
                                 const std::vector<float>* hidden_out) const {
  if (out == nullptr) return Error{kErrBadInput, "step: no StepResult to fill"};
  if (!range.embed && hidden_in == nullptr)
    return Error{kErrBadInput, "step: this stage does not embed: hidden states are required"};
  if (!range.head && hidden_out == nullptr)
    return Error{kErrBadInput,
                 "step: this stage has no output head: a hidden-state buffer is required"};
  if (static_cast<int64_t>(seqs.size()) > S_cap)
    return Error{kErrBadInput,
                 strfmt("step: %zu sequences exceed max_step_seqs (%lld)", seqs.size(), ll(S_cap))};
  int64_t total = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SeqStep& q = seqs[i];
    if (q.pos0 < 0)
      return Error{kErrBadInput, strfmt("step: sequence %zu has negative position", i)};
    if (q.tokens.empty()) return Error{kErrBadInput, strfmt("step: sequence %zu has no tokens", i)};
    for (int32_t t : q.tokens)
      if (t < 0 || t >= V)
        return Error{kErrBadInput,
                     strfmt("step: sequence %zu: token id %d is outside the vocabulary (0..%lld)",
                            i, t, ll(V - 1))};
    if (q.pos0 > num_slots)
      return Error{kErrBadInput,
                   strfmt("step: sequence %zu starts at position %lld, beyond the KV pool's %lld "
                          "positions",
                          i, ll(q.pos0), ll(num_slots))};
    const int64_t n = static_cast<int64_t>(q.tokens.size());
    const int64_t end = q.pos0 + n;
    const int64_t need = (end + bs - 1) / bs;
    if (static_cast<int64_t>(q.blocks.size()) < need)
      return Error{kErrBadInput,
                   strfmt("step: sequence %zu needs %lld KV blocks for %lld positions, has %zu", i,
                          ll(need), ll(end), q.blocks.size())};
    for (int64_t b = 0; b < need; ++b)
      if (q.blocks[sz(b)] < 0 || q.blocks[sz(b)] >= num_blocks)
        return Error{kErrBadInput,
                     strfmt("step: sequence %zu: block id %d out of range", i, q.blocks[sz(b)])};
    if (end > num_slots)
      return Error{kErrBadInput,
                   strfmt("step: sequence %zu reaches position %lld, beyond the KV pool's %lld "
                          "positions",
                          i, ll(end - 1), ll(num_slots))};
    total += n;
    if (total > T_cap)
      return Error{kErrBadInput,
                   strfmt("step: more than max_step_tokens (%lld) tokens", ll(T_cap))};
  }
  return Ok{};
}

void GpuEngine::Impl::recover() noexcept {
  cudaStream_t cs = streams->compute();
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(cs, &st) == cudaSuccess && st != cudaStreamCaptureStatusNone) {
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(cs, &g);
    if (g) cudaGraphDestroy(g);
  }
  cudaStreamSynchronize(cs);
  cudaGetLastError();
}

StepPlan GpuEngine::Impl::plan_step(std::span<const SeqStep> seqs, compute::StepResult* out) {
  StepPlan p;
  p.S = static_cast<int64_t>(seqs.size());
  int64_t max_need = 0, max_end = 0, max_q = 0, min_q = std::numeric_limits<int64_t>::max();
  for (const SeqStep& q : seqs) {
    const int64_t n = static_cast<int64_t>(q.tokens.size());
    p.T += n;
    max_q = std::max(max_q, n);
    min_q = std::min(min_q, n);
    max_end = std::max(max_end, q.pos0 + n);
    max_need = std::max(max_need, (q.pos0 + n + bs - 1) / bs);
  }
  p.graph = opts.cuda_graphs && graphs_allowed && max_q == 1;
  // A graph's table width and max_kv_len are fixed per key: round the width up (fewer keys).
  p.W = p.graph ? std::min(next_pow2(max_need), num_blocks) : max_need;
  p.max_q_len = static_cast<int32_t>(max_q);
  p.min_q_len = static_cast<int32_t>(min_q);
  p.max_kv_len = static_cast<int32_t>(p.graph ? p.W * bs : max_end);

  // Output rows as compute::Engine orders them; the device computes either exactly those rows
  // (eager) or every token's (graph: the row set must not depend on what the step asks for).
  out->row_begin.assign(seqs.size(), 0);
  out->row_count.assign(seqs.size(), 0);
  std::vector<int32_t> dev_rows;
  {
    int64_t t = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const int64_t n = static_cast<int64_t>(seqs[i].tokens.size());
      out->row_begin[i] = static_cast<int64_t>(p.out_src.size());
      if (range.head && seqs[i].logits != SeqStep::Logits::kNone) {
        const bool all = seqs[i].logits == SeqStep::Logits::kAll;
        for (int64_t j = all ? 0 : n - 1; j < n; ++j) {
          if (p.graph) {
            p.out_src.push_back(t + j);
          } else {
            p.out_src.push_back(static_cast<int64_t>(dev_rows.size()));
            dev_rows.push_back(static_cast<int32_t>(t + j));
          }
        }
        out->row_count[i] = all ? n : 1;
      }
      t += n;
    }
  }
  if (p.graph && range.head)
    for (int64_t t = 0; t < p.T; ++t) dev_rows.push_back(static_cast<int32_t>(t));
  p.R = static_cast<int64_t>(dev_rows.size());
  p.lay = InputLayout::make(p.T, p.S, p.W, p.R);
  TROUPE_CHECK(p.lay.total <= in_cap.total, "step inputs of %zu bytes exceed the %zu reserved",
               p.lay.total, in_cap.total);

  // Fill the pinned buffer.
  auto* tok = reinterpret_cast<int32_t*>(in_host + p.lay.tok);
  auto* pos = reinterpret_cast<int32_t*>(in_host + p.lay.pos);
  auto* slot = reinterpret_cast<int64_t*>(in_host + p.lay.slot);
  auto* q_start = reinterpret_cast<int32_t*>(in_host + p.lay.q_start);
  auto* q_len = reinterpret_cast<int32_t*>(in_host + p.lay.q_len);
  auto* pos0 = reinterpret_cast<int32_t*>(in_host + p.lay.pos0);
  auto* table = reinterpret_cast<int32_t*>(in_host + p.lay.table);
  auto* rows = reinterpret_cast<int32_t*>(in_host + p.lay.rows);
  int64_t t = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SeqStep& q = seqs[i];
    const int64_t n = static_cast<int64_t>(q.tokens.size());
    q_start[i] = static_cast<int32_t>(t);
    q_len[i] = static_cast<int32_t>(n);
    pos0[i] = static_cast<int32_t>(q.pos0);
    const int64_t need = (q.pos0 + n + bs - 1) / bs;
    int32_t* row = table + static_cast<int64_t>(i) * p.W;
    for (int64_t b = 0; b < p.W; ++b) row[b] = b < need ? q.blocks[sz(b)] : -1;
    for (int64_t j = 0; j < n; ++j, ++t) {
      const int64_t ps = q.pos0 + j;
      tok[t] = q.tokens[sz(j)];
      pos[t] = static_cast<int32_t>(ps);
      slot[t] = static_cast<int64_t>(q.blocks[sz(ps / bs)]) * bs + ps % bs;
    }
  }
  std::copy(dev_rows.begin(), dev_rows.end(), rows);
  return p;
}

StepInputs GpuEngine::Impl::inputs(const StepPlan& p) const {
  StepInputs in;
  in.tok = reinterpret_cast<const int32_t*>(w.in_dev + p.lay.tok);
  in.pos = reinterpret_cast<const int32_t*>(w.in_dev + p.lay.pos);
  in.slot = reinterpret_cast<const int64_t*>(w.in_dev + p.lay.slot);
  in.q_start = reinterpret_cast<const int32_t*>(w.in_dev + p.lay.q_start);
  in.q_len = reinterpret_cast<const int32_t*>(w.in_dev + p.lay.q_len);
  in.pos0 = reinterpret_cast<const int32_t*>(w.in_dev + p.lay.pos0);
  in.table = reinterpret_cast<const int32_t*>(w.in_dev + p.lay.table);
  in.rows = reinterpret_cast<const int32_t*>(w.in_dev + p.lay.rows);
  return in;
}

void GpuEngine::Impl::forward(std::span<const SeqStep> seqs, compute::StepResult* out,
                              const float* hidden_in, std::vector<float>* hidden_out) {
  TROUPE_CUDA_CHECK(cudaSetDevice(device));
  out->n_vocab = V;
  if (seqs.empty()) {
    out->row_begin.clear();
    out->row_count.clear();
    out->logits.clear();
    if (!range.head) hidden_out->clear();
    last_ms = 0;
    return;
  }
  const StepPlan p = plan_step(seqs, out);
  const StepInputs in = inputs(p);
  cudaStream_t cs = streams->compute();
  TROUPE_CUDA_CHECK(cudaEventRecord(ev_start, cs));
  TROUPE_CUDA_CHECK(cudaMemcpyAsync(w.in_dev, in_host, p.lay.total, cudaMemcpyHostToDevice, cs));
  if (!range.embed)
    TROUPE_CUDA_CHECK(
        cudaMemcpyAsync(w.x, hidden_in, sz(p.T * E) * sizeof(float), cudaMemcpyHostToDevice, cs));
  run_body(p);
  if (range.head) {
    copy_logits(p, in, out);
  } else {
    out->logits.clear();
    hidden_out->resize(sz(p.T * E));
    TROUPE_CUDA_CHECK(cudaMemcpyAsync(hidden_out->data(), w.x, sz(p.T * E) * sizeof(float),
                                      cudaMemcpyDeviceToHost, cs));
  }
  TROUPE_CUDA_CHECK(cudaEventRecord(ev_stop, cs));
  TROUPE_CUDA_CHECK(cudaEventSynchronize(ev_stop));
  TROUPE_CUDA_CHECK(cudaEventElapsedTime(&last_ms, ev_start, ev_stop));
}

void GpuEngine::Impl::run_body(const StepPlan& p) {
  if (!p.graph) {
    enqueue_body(p);
    return;
  }
  const std::pair<int64_t, int64_t> key{p.S, p.W};
  if (auto it = graphs.find(key); it != graphs.end()) {
    TROUPE_CUDA_CHECK(cudaGraphLaunch(it->second, streams->compute()));
    return;
  }
  enqueue_body(p);  // the first step of a key runs eagerly, then is recorded for the next ones
  if (!graph_failed.count(key)) try_capture(p, key);
}

// Records the body into a graph without running it. A failure leaves the step's (eager) results
// intact: the key is marked and stays eager, and graph_error says why.
void GpuEngine::Impl::try_capture(const StepPlan& p, std::pair<int64_t, int64_t> key) {
  cudaStream_t cs = streams->compute();
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  try {
    TROUPE_CUDA_CHECK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeRelaxed));
    try {
      enqueue_body(p);
    } catch (...) {
      cudaGraph_t broken = nullptr;
      cudaStreamEndCapture(cs, &broken);
      if (broken) cudaGraphDestroy(broken);
      cudaGetLastError();
      throw;
    }
    TROUPE_CUDA_CHECK(cudaStreamEndCapture(cs, &graph));
    TROUPE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    cudaGraphDestroy(graph);
    graph = nullptr;
    graphs.emplace(key, exec);
  } catch (const std::exception& ex) {
    if (graph) cudaGraphDestroy(graph);
    graph_failed.insert(key);
    graph_error = strfmt("CUDA graph capture for %lld sequences, table width %lld failed: %s",
                         ll(key.first), ll(key.second), ex.what());
  }
}

AttnBatch GpuEngine::Impl::batch(const StepPlan& p, const StepInputs& in) const {
  AttnBatch b;
  b.n_seqs = static_cast<int32_t>(p.S);
  b.n_tok = p.T;
  b.q_start = in.q_start;
  b.q_len = in.q_len;
  b.pos0 = in.pos0;
  b.block_table = in.table;
  b.max_blocks_per_seq = static_cast<int32_t>(p.W);
  b.max_q_len = p.max_q_len;
  b.min_q_len = p.min_q_len;
  b.max_kv_len = p.max_kv_len;
  return b;
}

void GpuEngine::Impl::gemm(int64_t m, int64_t n, int64_t k, const bf16* x, int64_t ldx,
                           const bf16* wt, int64_t ldw, void* y, int64_t ldy, GemmOut y_type,
                           bool accumulate) {
  GemmArgs g;
  g.m = m;
  g.n = n;
  g.k = k;
  g.x = x;
  g.ldx = ldx;
  g.w = wt;
  g.ldw = ldw;
  g.y = y;
  g.ldy = ldy;
  g.y_type = y_type;
  g.accumulate = accumulate;
  gemmer->run(g, streams->compute());
}

void GpuEngine::Impl::enqueue_body(const StepPlan& p) {
  cudaStream_t cs = streams->compute();
  const StepInputs in = inputs(p);
  const int64_t T = p.T;
  if (range.embed) embed_rows(tok_embd, V, E, in.tok, T, w.x, cs);
  for (const DevLayer& L : layers) {
    add_rms_norm(w.x, nullptr, L.attn_norm, T, E, eps, w.h, cs);
    if (mla) {
      attention_mla(L, p, in);
    } else {
      attention(L, p, in);
    }
    // x += attn . wo^T (the residual add fused into the GEMM).
    gemm(T, E, attn_width, w.attn, attn_width, L.wo, attn_width, w.x, E, GemmOut::kF32, true);
    add_rms_norm(w.x, nullptr, L.ffn_norm, T, E, eps, w.h, cs);
    if (L.moe) {
      moe(L, p);
      add_inplace(w.x, w.moe_y, T * E, cs);
    } else {
      gemm(T, 2 * L.n_ff, E, w.h, E, L.w_gate_up, E, w.gate_up, 2 * L.n_ff, GemmOut::kF32, false);
      swiglu(w.gate_up, T, L.n_ff, w.act, cs);
      gemm(T, E, L.n_ff, w.act, L.n_ff, L.w_down, L.n_ff, w.x, E, GemmOut::kF32, true);
    }
  }
  if (range.head && p.R > 0) enqueue_head(in, 0, std::min(p.R, C_cap));
}

void GpuEngine::Impl::attention(const DevLayer& L, const StepPlan& p, const StepInputs& in) {
  cudaStream_t cs = streams->compute();
  const int64_t T = p.T;
  gemm(T, qkv_rows, E, w.h, E, L.wqkv, E, w.qkv, qkv_rows, GemmOut::kF32, false);
  RopeQkvArgs r;
  r.qkv = w.qkv;
  r.bias = L.bqkv;
  r.num_tokens = T;
  r.n_head = H;
  r.n_head_kv = HK;
  r.head_dim = D;
  r.q_norm = L.q_norm;
  r.k_norm = L.k_norm;
  r.norm_eps = eps;
  r.n_rot = rope_cos ? n_rot : 0;
  r.neox = neox;
  r.rope_cos = rope_cos;
  r.rope_sin = rope_sin;
  r.max_pos = rope_cos ? num_slots : 0;
  r.positions = in.pos;
  r.slots = in.slot;
  r.q_out = w.q;
  r.kv.k = L.k;
  r.kv.v = L.v;
  r.kv.num_blocks = num_blocks;
  r.kv.block_size = bs;
  r.kv.n_head_kv = HK;
  r.kv.head_dim = D;
  rope_qkv_write(r, cs);
  AttnArgs a;
  a.q = w.q;
  a.n_head = static_cast<int32_t>(H);
  a.kv.k = L.k;
  a.kv.v = L.v;
  a.kv.num_slots = num_slots;
  a.kv.n_head_kv = static_cast<int32_t>(HK);
  a.kv.head_dim = static_cast<int32_t>(D);
  a.kv.block_size = static_cast<int32_t>(bs);
  a.batch = batch(p, in);
  a.scale = 1.0f / std::sqrt(static_cast<float>(D));  // compute/engine.cc attention()
  a.out = w.attn;
  a.out_type = AttnOut::kBf16;
  a.workspace = w.attn_ws;
  a.workspace_bytes = w.attn_ws_bytes;
  paged_attention(a, cs);
}

// compute/engine.cc attention_mla(): q (optionally through the q LoRA), the latent cache row,
// q_abs = [wk_b[h] . q_nope[h], q_pe[h]], attention over the latent rows, then wv_b[h] per head.
// The per-head products read and write head-major copies (dense, 16-byte aligned matrices).
void GpuEngine::Impl::attention_mla(const DevLayer& L, const StepPlan& p, const StepInputs& in) {
  cudaStream_t cs = streams->compute();
  const int64_t T = p.T;
  if (L.wq_a) {
    gemm(T, q_lora, E, w.h, E, L.wq_a, E, w.qa, q_lora, GemmOut::kF32, false);
    add_rms_norm(w.qa, nullptr, L.q_a_norm, T, q_lora, eps, w.qa_n, cs);
    gemm(T, H * dqk, q_lora, w.qa_n, q_lora, L.wq_b, q_lora, w.qf, H * dqk, GemmOut::kF32, false);
  } else {
    gemm(T, H * dqk, E, w.h, E, L.wq, E, w.qf, H * dqk, GemmOut::kF32, false);
  }
  gemm(T, kw, E, w.h, E, L.wkv_a, E, w.kva, kw, GemmOut::kF32, false);
  detail::MlaPrepArgs m;
  m.num_tokens = T;
  m.n_head = H;
  m.nope = nope;
  m.rope = rope;
  m.lora = lora;
  m.kva = w.kva;
  m.kv_norm = L.kv_a_norm;
  m.eps = eps;
  m.q = w.qf;
  m.rope_cos = rope_cos;
  m.rope_sin = rope_sin;
  m.max_pos = rope_cos ? num_slots : 0;
  m.neox = neox ? 1 : 0;
  m.positions = in.pos;
  m.slots = in.slot;
  m.cache = L.k;
  m.num_slots = num_slots;
  m.q_abs = w.q_abs;
  m.q_nope = w.q_nope_h;
  m.nope_head_stride = T_cap * nope_ld;
  m.nope_ld = nope_ld;
  detail::launch_mla_prep(m, cs);
  for (int64_t h = 0; h < H; ++h)
    gemm(T, lora, nope, w.q_nope_h + h * T_cap * nope_ld, nope_ld, L.wk_b + h * L.wk_b_stride, nope,
         w.qlat_h + h * T_cap * lora_ld, lora_ld, GemmOut::kBf16, false);
  detail::HeadCopyArgs c;  // q_abs[t, h, 0:lora] = qlat_h[h, t, :]
  c.src = w.qlat_h;
  c.src_a = T_cap * lora_ld;
  c.src_b = lora_ld;
  c.dst = w.q_abs;
  c.dst_a = kw;
  c.dst_b = H * kw;
  c.n_a = H;
  c.n_b = T;
  c.n_c = lora;
  detail::launch_copy_heads(c, cs);
  AttnMlaArgs a;
  a.q = w.q_abs;
  a.n_head = static_cast<int32_t>(H);
  a.kv.kv = L.k;
  a.kv.num_slots = num_slots;
  a.kv.kv_lora_rank = static_cast<int32_t>(lora);
  a.kv.rope_dim = static_cast<int32_t>(rope);
  a.kv.block_size = static_cast<int32_t>(bs);
  a.batch = batch(p, in);
  a.scale = 1.0f / std::sqrt(static_cast<float>(dqk));  // compute/engine.cc attention_mla()
  a.out = w.lat;
  a.out_type = AttnOut::kBf16;
  a.workspace = w.attn_ws;
  a.workspace_bytes = w.attn_ws_bytes;
  paged_attention_mla(a, cs);
  c = detail::HeadCopyArgs{};  // lat_h[h, t, :] = lat[t, h, :]
  c.src = w.lat;
  c.src_a = lora;
  c.src_b = H * lora;
  c.dst = w.lat_h;
  c.dst_a = T_cap * lora_ld;
  c.dst_b = lora_ld;
  c.n_a = H;
  c.n_b = T;
  c.n_c = lora;
  detail::launch_copy_heads(c, cs);
  for (int64_t h = 0; h < H; ++h)
    gemm(T, dv, lora, w.lat_h + h * T_cap * lora_ld, lora_ld, L.wv_b + h * L.wv_b_stride, lora,
         w.attn_h + h * T_cap * dv_ld, dv_ld, GemmOut::kBf16, false);
  c = detail::HeadCopyArgs{};  // attn[t, h * dv : (h + 1) * dv] = attn_h[h, t, :]
  c.src = w.attn_h;
  c.src_a = T_cap * dv_ld;
  c.src_b = dv_ld;
  c.dst = w.attn;
  c.dst_a = dv;
  c.dst_b = H * dv;
  c.n_a = H;
  c.n_b = T;
  c.n_c = dv;
  detail::launch_copy_heads(c, cs);
}

// compute/engine.cc moe(): router logits, the shared expert (and its sigmoid gate), then the
// routed experts and the fixed-order combine (MoeForward) into moe_y; the caller adds moe_y.
void GpuEngine::Impl::moe(const DevLayer& L, const StepPlan& p) {
  cudaStream_t cs = streams->compute();
  const int64_t T = p.T;
  gemm(T, n_expert, E, w.h, E, L.router, E, w.router, n_expert, GemmOut::kF32, false);
  const float* shared = nullptr;
  const float* shared_gate = nullptr;
  if (L.sh_gate_up) {
    const int64_t ff = L.n_ff_sh;
    gemm(T, 2 * ff, E, w.h, E, L.sh_gate_up, E, w.gate_up, 2 * ff, GemmOut::kF32, false);
    swiglu(w.gate_up, T, ff, w.act, cs);
    gemm(T, E, ff, w.act, ff, L.sh_down, ff, w.shared_out, E, GemmOut::kF32, false);
    shared = w.shared_out;
    if (L.sh_gate) {
      detail::launch_row_dot(w.h, E, L.sh_gate, E, T, w.shared_gate, cs);
      shared_gate = w.shared_gate;
    }
  }
  MoeForwardArgs m;
  m.n_tok = T;
  m.x = w.h;
  m.router_logits = w.router;
  m.router_bias = L.router_bias;
  m.experts.gate = L.exp_gate;
  m.experts.up = L.exp_up;
  m.experts.down = L.exp_down;
  m.experts.n_expert = n_expert;
  m.experts.d = E;
  m.experts.d_ff = ff_exp;
  m.shared_out = shared;
  m.shared_gate_logit = shared_gate;
  m.y = w.moe_y;
  moe_fwd->run(m, work, cs);
}

// Logits of computed rows [r0, r0 + n) (n <= C_cap) into w.logits: gather, output norm, head.
void GpuEngine::Impl::enqueue_head(const StepInputs& in, int64_t r0, int64_t n) {
  cudaStream_t cs = streams->compute();
  detail::launch_gather_rows(w.x, E, in.rows + r0, n, w.head_x, cs);
  add_rms_norm(w.head_x, nullptr, out_norm, n, E, eps, w.head_h, cs);
  gemm(n, V, E, w.head_h, E, output, E, w.logits, V, GemmOut::kF32, false);
}

// Copies the asked rows to out->logits, computing the head C_cap rows at a time (the body
// already queued the first pass). Copies to pageable memory return when done, so the next pass
// may overwrite w.logits.
void GpuEngine::Impl::copy_logits(const StepPlan& p, const StepInputs& in,
                                  compute::StepResult* out) {
  cudaStream_t cs = streams->compute();
  const size_t n_out = p.out_src.size();
  out->logits.resize(n_out * sz(V));
  size_t k = 0;
  for (int64_t c0 = 0; c0 < p.R; c0 += C_cap) {
    const int64_t n = std::min(C_cap, p.R - c0);
    if (c0 > 0) enqueue_head(in, c0, n);
    while (k < n_out && p.out_src[k] < c0 + n) {
      size_t e = k + 1;  // a run of rows that are consecutive on both sides
      while (e < n_out && p.out_src[e] == p.out_src[e - 1] + 1 && p.out_src[e] < c0 + n) ++e;
      TROUPE_CUDA_CHECK(
          cudaMemcpyAsync(out->logits.data() + k * sz(V), w.logits + (p.out_src[k] - c0) * V,
                          (e - k) * sz(V) * sizeof(float), cudaMemcpyDeviceToHost, cs));
      k = e;
    }
  }
  TROUPE_CHECK(k == n_out, "copied %zu of %zu logits rows", k, n_out);
}

}  // namespace troupe::gpu
