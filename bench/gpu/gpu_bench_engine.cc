// gpu_bench's engine phase: decode tokens/s at batch 1, 16 and 64 and prefill tokens/s of
// gpu::GpuEngine on a synthetic ~3B Llama in BF16, beside the HBM roofline and the GEMM peak.
// The model is synthesized on CPU threads in the background while the kernel phases run.
// Built without the engine (gpu/engine.h absent, or TROUPE_GPU_BENCH_NO_ENGINE) it reports why.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <sys/stat.h>

#include "bench/gpu/bench_util.h"
#include "model/synth.h"

#if __has_include("gpu/engine.h") && !defined(TROUPE_GPU_BENCH_NO_ENGINE)
#define TROUPE_GPU_BENCH_HAS_ENGINE 1
#include "compute/engine.h"
#include "gpu/engine.h"
#include "gpu/tp_engine.h"
#include "model/model.h"
#endif

namespace troupe::gpu::bench {

#ifdef TROUPE_GPU_BENCH_HAS_ENGINE

namespace {

using Clock = std::chrono::steady_clock;

double now_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

// The synthesis running in the background: its thread, and what it reported.
struct SynthJob {
  std::thread thread;
  std::atomic<bool> started{false}, done{false};
  std::mutex mu;
  std::string error;  // "" = ok
  std::string summary;
};
SynthJob& job() {
  static SynthJob* j = new SynthJob;  // never destroyed: the thread may outlive main (_Exit)
  return *j;
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace

const char* engine_build_status() { return "yes"; }

void start_model_synth(const std::string& path, int threads) {
  SynthJob& j = job();
  j.started = true;
  if (file_exists(path)) {
    j.summary = "reusing " + path;
    j.done = true;
    return;
  }
  j.thread = std::thread([path, threads, &j] {
    model::SynthOptions o;
    o.arch = "llama";
    o.name = "gpu-bench-3b";
    o.n_embd = 3072;
    o.n_layer = 28;
    o.n_head = 24;
    o.n_head_kv = 8;
    o.n_ff = 8192;
    o.n_vocab = 32000;
    o.n_ctx = 4096;
    o.dtype = *model::parse_synth_dtype("bf16");
    o.num_threads = threads;
    const std::string tmp = path + ".part";
    auto r = model::synth_model_summary(o, tmp);
    std::lock_guard<std::mutex> lock(j.mu);
    if (!r) {
      j.error = r.error().message;
    } else if (std::rename(tmp.c_str(), path.c_str()) != 0) {
      j.error = "cannot rename " + tmp + " to " + path;
    } else {
      j.summary = r->line();
    }
    j.done = true;
  });
  j.thread.detach();
}

bool model_synth_done() { return !job().started || job().done; }
bool model_synth_running() { return job().started && !job().done; }

namespace {

// Bytes of weights one decode token reads (engine_bench.cc's count): every matrix of the
// layers, the head, and one embedding row.
double weight_bytes_per_token(const model::ModelSpec& s) {
  double b = static_cast<double>(s.output.nbytes()) + static_cast<double>(s.token_embd.row_bytes());
  for (const auto& L : s.layers)
    for (const model::WeightView* w :
         {&L.wq, &L.wk, &L.wv, &L.wo, &L.ffn_gate, &L.ffn_up, &L.ffn_down})
      if (w->present()) b += static_cast<double>(w->nbytes());
  return b;
}

// Multiply-accumulate weights per token of the layers (2 FLOP each), without the head.
double layer_params(const model::ModelSpec& s) {
  double p = 0;
  for (const auto& L : s.layers)
    for (const model::WeightView* w :
         {&L.wq, &L.wk, &L.wv, &L.wo, &L.ffn_gate, &L.ffn_up, &L.ffn_down})
      if (w->present()) p += static_cast<double>(w->cols()) * static_cast<double>(w->rows());
  return p;
}

struct Seq {
  std::vector<int32_t> tokens;
  std::vector<int32_t> blocks;
};

// Sequences of `len` random tokens each, their blocks taken from the engine's allocator.
template <class Engine>
bool make_seqs(Engine& e, int64_t n, int64_t len, int64_t block_size, uint32_t seed,
               std::vector<Seq>* out) {
  std::mt19937 rng(seed);
  const auto vocab = static_cast<uint32_t>(e.spec().n_vocab);
  out->assign(static_cast<size_t>(n), Seq{});
  for (Seq& s : *out) {
    s.tokens.resize(static_cast<size_t>(len));
    for (auto& t : s.tokens) t = static_cast<int32_t>(rng() % vocab);
    if (!e.blocks().allocate((len + block_size - 1) / block_size, &s.blocks)) return false;
  }
  return true;
}

template <class Engine>
void release(Engine& e, std::vector<Seq>* seqs) {
  for (Seq& s : *seqs) e.blocks().release(s.blocks);
  seqs->clear();
}

// Runs one step and returns its wall time (the step is synchronous). Throws on error.
template <class Engine>
double timed_step(Engine& e, const std::vector<compute::SeqStep>& steps, compute::StepResult* res) {
  const double t0 = now_s();
  const Status st = e.step(steps, res);
  const double dt = now_s() - t0;
  if (!st) throw std::runtime_error("GpuEngine::step: " + st.error().message);
  return dt;
}

struct DecodeResult {
  double step_s = 0, engine_ms = 0;
};

// `batch` sequences: a prompt of kPrompt tokens each (one step), then kWarm + kSteps decode steps
// of one token each; the median of the last kSteps.
constexpr int64_t kPrompt = 128, kWarm = 4, kSteps = 32;

// A step of `tokens` at pos0 whose last position gives logits.
compute::SeqStep last_step(int64_t pos0, std::span<const int32_t> tokens,
                           std::span<const int32_t> blocks) {
  compute::SeqStep st;
  st.pos0 = pos0;
  st.tokens = tokens;
  st.blocks = blocks;
  st.logits = compute::SeqStep::Logits::kLast;
  return st;
}

template <class Engine>
DecodeResult decode(Engine& e, int64_t batch, int64_t block_size) {
  std::vector<Seq> seqs;
  if (!make_seqs(e, batch, kPrompt + kWarm + kSteps, block_size, static_cast<uint32_t>(batch),
                 &seqs))
    throw std::runtime_error("KV pool too small for the decode batch");
  compute::StepResult res;
  std::vector<compute::SeqStep> steps(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i)
    steps[i] =
        last_step(0, std::span<const int32_t>(seqs[i].tokens.data(), kPrompt), seqs[i].blocks);
  timed_step(e, steps, &res);
  std::vector<double> t, eng;
  for (int64_t d = 0; d < kWarm + kSteps; ++d) {
    const int64_t pos = kPrompt + d;
    for (size_t i = 0; i < seqs.size(); ++i)
      steps[i] =
          last_step(pos, std::span<const int32_t>(&seqs[i].tokens[static_cast<size_t>(pos)], 1),
                    seqs[i].blocks);
    const double dt = timed_step(e, steps, &res);
    if (d >= kWarm) {
      t.push_back(dt);
      eng.push_back(e.last_step_ms());
    }
  }
  release(e, &seqs);
  return {median(t), median(eng)};
}

// kPrefillSeqs prompts of kPrefillLen tokens in one step, logits of the last token each.
constexpr int64_t kPrefillSeqs = 4, kPrefillLen = 2048;

double prefill(GpuEngine& e, int64_t block_size) {
  std::vector<double> t;
  for (int r = 0; r < 4; ++r) {  // the first is warm-up
    std::vector<Seq> seqs;
    if (!make_seqs(e, kPrefillSeqs, kPrefillLen, block_size, 100 + static_cast<uint32_t>(r), &seqs))
      throw std::runtime_error("KV pool too small for the prefill batch");
    std::vector<compute::SeqStep> steps;
    for (const Seq& s : seqs) steps.push_back(last_step(0, s.tokens, s.blocks));
    compute::StepResult res;
    const double dt = timed_step(e, steps, &res);
    if (r > 0) t.push_back(dt);
    release(e, &seqs);
  }
  return median(t);
}

// Tensor parallelism over 2 ranks: decode step times beside the one-GPU engine `one`. With two
// GPUs, NCCL (each rank half the work): exposed communication = 1 - (one's step / 2) / the TP
// step, an upper bound (imperfect scaling counts as exposed). With one GPU, the stand-in group
// (both ranks on it: the same total compute as `one`): the share of the TP step that is not
// `one`'s step, i.e. the sums, rendezvous and extra launches not hidden. Overlap on and off.
void tp_rows(std::shared_ptr<const model::Model> m, const GpuEngineOptions& o, GpuEngine& one,
             const Budget& budget, std::vector<Row>* rows) {
  int n_gpu = 0;
  if (cudaGetDeviceCount(&n_gpu) != cudaSuccess) n_gpu = 0;
  const bool nccl = n_gpu >= 2;
  const std::vector<int> devices = nccl ? std::vector<int>{0, 1} : std::vector<int>{0, 0};
  for (int64_t b : {int64_t{16}, int64_t{64}}) {
    if (!budget.fits(40)) {
      rows->push_back({format("TP=2 decode batch %lld", static_cast<long long>(b)), "", "", -1, -1,
                       "skipped (time budget)"});
      continue;
    }
    const double t1 = decode(one, b, o.kv_block_size).step_s;
    double t_on = 0, t_off = 0;
    for (bool overlap : {true, false}) {
      GpuEngineOptions to = o;
      to.tp_overlap = overlap;
      auto tp = GpuTpEngine::create(m, to, devices);
      if (!tp) throw std::runtime_error("GpuTpEngine::create: " + tp.error().message);
      (overlap ? t_on : t_off) = decode(**tp, b, o.kv_block_size).step_s;
    }
    const double ideal = nccl ? t1 / 2 : t1;
    auto exposed = [&](double t) { return std::max(0.0, 1.0 - ideal / t); };
    std::printf(
        "TP=2 %s decode batch %lld: step %.3f ms overlapped, %.3f ms not; one GPU alone %.3f ms; "
        "exposed %.1f%% / %.1f%%\n",
        nccl ? "NCCL on GPUs 0,1" : "stand-in on GPU 0", static_cast<long long>(b), t_on * 1e3,
        t_off * 1e3, t1 * 1e3, 100 * exposed(t_on), 100 * exposed(t_off));
    rows->push_back(
        {format("TP=2 exposed comm share, decode batch %lld (%s)", static_cast<long long>(b),
                nccl ? "NCCL, 2 GPUs" : "one-GPU stand-in"),
         format("%.1f%% overlapped, %.1f%% not", 100 * exposed(t_on), 100 * exposed(t_off)), "", -1,
         -1,
         format("step %.3f / %.3f ms vs %.3f ms on one GPU%s", t_on * 1e3, t_off * 1e3, t1 * 1e3,
                nccl ? " (ideal: half)" : " (same total compute)")});
  }
}

void engine_rows(const std::string& path, const Ceilings& c, const Budget& budget,
                 std::vector<Row>* rows) {
  SynthJob& j = job();
  const double wait0 = now_s();
  while (!j.done && budget.fits(60)) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  if (!j.done) throw std::runtime_error("skipped (time budget): the synthetic model is not ready");
  {
    std::lock_guard<std::mutex> lock(j.mu);
    if (!j.error.empty()) throw std::runtime_error("synth: " + j.error);
    std::printf("synth: %s (waited %.1f s)\n", j.summary.c_str(), now_s() - wait0);
  }
  double t0 = now_s();
  auto m = model::load_model(path);
  if (!m) throw std::runtime_error("load_model: " + m.error().message);
  GpuEngineOptions o;
  o.kv_block_size = 16;
  o.max_tokens_in_cache = 20480;  // decode 64 x 164 and prefill 4 x 2048, with slack
  o.max_step_tokens = kPrefillSeqs * kPrefillLen;
  o.max_step_seqs = 256;
  auto created = GpuEngine::create(*m, o);
  if (!created) throw std::runtime_error("GpuEngine::create: " + created.error().message);
  GpuEngine& e = **created;
  const model::ModelSpec& s = e.spec();
  std::printf("engine: model loaded and uploaded in %.1f s: weights %.2f GB, KV %.2f GB\n",
              now_s() - t0, static_cast<double>(e.weight_bytes()) / 1e9,
              static_cast<double>(e.kv_bytes()) / 1e9);

  const double wbytes = weight_bytes_per_token(s);
  // bf16 K and V per token per layer (the GPU cache's type).
  const double kv_token = 2.0 * static_cast<double>(s.n_layer * s.n_head_kv) *
                          static_cast<double>(s.head_dim_k + s.head_dim_v);
  const double bw = c.read_bytes_per_s;
  for (int64_t b : {int64_t{1}, int64_t{16}, int64_t{64}}) {
    if (!budget.fits(20)) {
      rows->push_back({format("decode batch %lld", static_cast<long long>(b)), "", "", -1, -1,
                       "skipped (time budget)"});
      continue;
    }
    const DecodeResult d = decode(e, b, o.kv_block_size);
    const double tps = static_cast<double>(b) / d.step_s;
    // Floor of a step: every weight once plus each sequence's K/V (mean context of the timed
    // steps) at the measured HBM read bandwidth.
    const double ctx = kPrompt + kWarm + kSteps / 2.0;
    const double floor_s = (wbytes + static_cast<double>(b) * ctx * kv_token) / bw;
    const double roof_tps = static_cast<double>(b) / floor_s;
    std::printf(
        "decode batch %lld: step %.3f ms wall (engine %.3f ms), %.1f tok/s; roofline "
        "%.1f tok/s (%.2f GB weights + KV per step)\n",
        static_cast<long long>(b), d.step_s * 1e3, d.engine_ms, tps, roof_tps, floor_s * bw / 1e9);
    rows->push_back(
        {format("decode batch %lld, 3B BF16 (tok/s)", static_cast<long long>(b)),
         format("%.1f tok/s (%.3f ms/step)", tps, d.step_s * 1e3),
         format("%.1f tok/s (HBM roofline)", roof_tps), bw > 0 ? tps / roof_tps : -1,
         b == 1 ? 0.70 : -1,
         format("weights %.2f GB + KV/step; engine's own step %.3f ms; %zu CUDA "
                "graphs%s%s",
                wbytes / 1e9, d.engine_ms, e.num_graphs(),
                e.graph_error().empty() ? "" : ", capture failed: ", e.graph_error().c_str())});
  }
  if (!budget.fits(20)) {
    rows->push_back({"prefill 4 x 2048", "", "", -1, -1, "skipped (time budget)"});
    return;
  }
  const double p_s = prefill(e, o.kv_block_size);
  const double tokens = static_cast<double>(kPrefillSeqs * kPrefillLen);
  const double flops =
      2.0 * layer_params(s) * tokens + 2.0 * static_cast<double>(kPrefillSeqs) *
                                           static_cast<double>(s.output.rows() * s.output.cols());
  const double f = flops / p_s;
  std::printf("prefill %lld x %lld: %.2f ms, %.0f tok/s, %.1f TFLOP/s of GEMM work\n",
              static_cast<long long>(kPrefillSeqs), static_cast<long long>(kPrefillLen), p_s * 1e3,
              tokens / p_s, f / 1e12);
  rows->push_back(
      {format("prefill %lld x %lld, 3B BF16 (tok/s)", static_cast<long long>(kPrefillSeqs),
              static_cast<long long>(kPrefillLen)),
       format("%.0f tok/s (%.1f TFLOP/s)", tokens / p_s, f / 1e12),
       format("%.0f tok/s (GEMM peak)",
              c.gemm_flops_per_s > 0 ? tokens / flops * c.gemm_flops_per_s : 0.0),
       c.gemm_flops_per_s > 0 ? f / c.gemm_flops_per_s : -1, 0.60,
       "2 x params x tokens; attention FLOPs not counted"});
  tp_rows(*m, o, e, budget, rows);
}

}  // namespace

void run_engine_phase(const std::string& path, const Ceilings& c, const Budget& budget,
                      std::vector<Row>* rows) {
  try {
    engine_rows(path, c, budget, rows);
  } catch (const std::exception& e) {
    rows->push_back({"GPU engine decode/prefill", "", "", -1, -1, format("error: %s", e.what())});
    std::printf("engine: error: %s\n", e.what());
  }
}

#else  // no GPU engine in this build

const char* engine_build_status() {
#if defined(TROUPE_GPU_BENCH_NO_ENGINE)
  return "no (built with TROUPE_GPU_BENCH_NO_ENGINE)";
#else
  return "no (gpu/engine.h is not in this checkout)";
#endif
}
void start_model_synth(const std::string&, int) {}
bool model_synth_done() { return true; }
bool model_synth_running() { return false; }
void run_engine_phase(const std::string&, const Ceilings&, const Budget&, std::vector<Row>* rows) {
  rows->push_back({"GPU engine decode/prefill", "", "", -1, -1,
                   std::string("not measured: GPU engine ") + engine_build_status()});
}

#endif

}  // namespace troupe::gpu::bench
