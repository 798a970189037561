// gpu_bench: the GPU device check (issue point 5; run by bench/gpu/run.sh). Measures the card's
// ceilings (HBM read and copy bandwidth, BF16 GEMM 8192^3 through gpu::Gemm), the GEMMs of a ~3B
// Llama layer, paged attention, exposed host-staged communication between two pipeline stages
// (a one-GPU stand-in), and decode/prefill of the GPU engine on a synthetic BF16 model; prints
// one markdown table (measured, limit, fraction, target) and writes it to $OUT/gpu_bench.md.
// Usage: gpu_bench [--budget-s 360] [--model /tmp/troupe_gpu_bench_3b.gguf] [--synth-threads N]
//                  [--skip-engine]
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/gpu/bench_util.h"
#include "gpu/attention.h"
#include "gpu/gemm.h"
#include "gpu/runtime.h"

namespace troupe::gpu::bench {

// ---- shared helpers (declared in bench_util.h) ----

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string format(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

double time_ms(cudaStream_t stream, int reps, const std::function<void()>& body) {
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  TROUPE_CUDA_CHECK(cudaEventCreate(&e0));
  TROUPE_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<double> ms;
  try {
    body();  // warm-up: module load, cuBLASLt heuristics, first touch
    TROUPE_CUDA_CHECK(cudaStreamSynchronize(stream));
    for (int r = 0; r < reps; ++r) {
      TROUPE_CUDA_CHECK(cudaEventRecord(e0, stream));
      body();
      TROUPE_CUDA_CHECK(cudaEventRecord(e1, stream));
      TROUPE_CUDA_CHECK(cudaEventSynchronize(e1));
      float t = 0;
      TROUPE_CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
      ms.push_back(t);
    }
  } catch (...) {
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    throw;
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return median(ms);
}

namespace {

template <class T, class F>
void check_finite(const T* p, size_t n, const char* what, F to_float) {
  std::vector<T> host(n);
  TROUPE_CUDA_CHECK(cudaMemcpy(host.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  size_t bad = 0, first = n;
  for (size_t i = 0; i < n; ++i)
    if (!std::isfinite(to_float(host[i]))) {
      if (bad++ == 0) first = i;
    }
  if (bad)
    throw DeviceError(Errc::kCuda, format("%s: %zu of %zu elements are not finite (first at %zu)",
                                          what, bad, n, first));
}

}  // namespace

void check_finite_bf16(const __nv_bfloat16* p, size_t n, const char* what) {
  check_finite(p, n, what, [](__nv_bfloat16 b) { return __bfloat162float(b); });
}
void check_finite_f32(const float* p, size_t n, const char* what) {
  check_finite(p, n, what, [](float f) { return f; });
}

namespace {

using bf16 = __nv_bfloat16;

// The ~3B Llama shape of the issue (also what gpu_bench_engine.cc synthesizes).
constexpr int64_t kEmbd = 3072, kHeads = 24, kKvHeads = 8, kHeadDim = 128, kFf = 8192;
// One pipeline stage of the two the communication phase models: half of the 28 layers. Its
// weights (2.8 GB, 56x the L2) are also what the GEMM phase cycles through, so decode-shaped
// GEMMs read HBM and not the L2.
constexpr int kStageLayers = 14;

struct Shape {
  const char* name;
  int64_t n, k;
  bool accumulate;  // o and down add into the f32 residual stream
};
constexpr Shape kShapes[] = {{"qkv", (kHeads + 2 * kKvHeads) * kHeadDim, kEmbd, false},
                             {"o", kEmbd, kHeads* kHeadDim, true},
                             {"gate_up", 2 * kFf, kEmbd, false},
                             {"down", kEmbd, kFf, true}};
constexpr int kNumShapes = 4;

double layer_params() {
  double p = 0;
  for (const Shape& s : kShapes) p += static_cast<double>(s.n) * static_cast<double>(s.k);
  return p;
}

// Datasheet numbers for the cards we expect (leads only: the table's limits are measured).
struct Datasheet {
  double hbm_bytes_per_s = 0;
  double bf16_dense_flops = 0;
};
Datasheet datasheet(const std::string& name) {
  if (name.find("H200") != std::string::npos) return {4.8e12, 989e12};
  if (name.find("H100") != std::string::npos) return {3.35e12, 989e12};
  return {};
}

// Buffers shared by the GEMM and communication phases.
struct Shared {
  std::vector<DeviceBuffer<bf16>> w[kNumShapes];  // [shape][layer] bf16 [n, k]
  DeviceBuffer<bf16> x;                           // bf16 [8192, 8192]: every GEMM's input
  DeviceBuffer<float> y;                          // f32 [8192, 16384]: every GEMM's output
  DeviceBuffer<uint8_t> workspace_default, workspace_peak;
};

struct Context {
  cudaStream_t stream = nullptr;
  cudaDeviceProp prop{};
  Datasheet sheet;
  Ceilings ceil;
  std::vector<Row> rows;
  Shared shared;
};

std::string tbs(double bytes_per_s) { return format("%.2f TB/s", bytes_per_s / 1e12); }
std::string tflops(double flops) { return format("%.1f TFLOP/s", flops / 1e12); }

// ---- HBM ----

void phase_hbm(Context& c) {
  const size_t bytes = size_t{4} << 30;  // 4 GiB: 80x the H200's L2
  DeviceBuffer<uint8_t> a(bytes), b(bytes);
  const int blocks = c.prop.multiProcessorCount * 4;
  DeviceBuffer<uint64_t> sink(static_cast<size_t>(blocks));
  launch_fill_uniform(reinterpret_cast<float*>(a.get()), bytes / 4, 11, -1.f, 1.f, c.stream);
  constexpr int kInner = 3;
  const double read_ms = time_ms(c.stream, 7,
                                 [&] {
                                   for (int r = 0; r < kInner; ++r)
                                     launch_read(a.get(), bytes, sink.get(), blocks, c.stream);
                                 }) /
                         kInner;
  const double copy_ms =
      time_ms(c.stream, 7,
              [&] {
                for (int r = 0; r < kInner; ++r)
                  TROUPE_CUDA_CHECK(
                      cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, c.stream));
              }) /
      kInner;
  c.ceil.read_bytes_per_s = static_cast<double>(bytes) / (read_ms * 1e-3);
  c.ceil.copy_bytes_per_s = 2.0 * static_cast<double>(bytes) / (copy_ms * 1e-3);
  std::printf("hbm: read 4 GiB %.3f ms = %s; copy 4 GiB %.3f ms = %s (read + write)\n", read_ms,
              tbs(c.ceil.read_bytes_per_s).c_str(), copy_ms, tbs(c.ceil.copy_bytes_per_s).c_str());
  const double hbm = c.sheet.hbm_bytes_per_s;
  const std::string lim = hbm > 0 ? tbs(hbm) + " (datasheet)" : "";
  c.rows.push_back({"HBM read kernel, 4 GiB", tbs(c.ceil.read_bytes_per_s), lim,
                    hbm > 0 ? c.ceil.read_bytes_per_s / hbm : -1, -1,
                    "the roofline below (decode, attention)"});
  c.rows.push_back({"HBM device-to-device copy, 4 GiB", tbs(c.ceil.copy_bytes_per_s), lim,
                    hbm > 0 ? c.ceil.copy_bytes_per_s / hbm : -1, -1, "bytes read + written"});
}

// ---- GEMM ----

GemmArgs shape_args(const Shape& s, int64_t m, const bf16* w, const Shared& sh) {
  GemmArgs a;
  a.m = m;
  a.n = s.n;
  a.k = s.k;
  a.x = sh.x.get();
  a.w = w;
  a.y = sh.y.get();
  a.y_type = GemmOut::kF32;
  a.accumulate = s.accumulate;
  return a;
}

void alloc_shared(Context& c) {
  Shared& sh = c.shared;
  uint64_t seed = 100;
  for (int si = 0; si < kNumShapes; ++si)
    for (int l = 0; l < kStageLayers; ++l) {
      const size_t n = static_cast<size_t>(kShapes[si].n * kShapes[si].k);
      sh.w[si].emplace_back(n);
      launch_fill_uniform(sh.w[si].back().get(), n, seed++, -1.f, 1.f, c.stream);
    }
  sh.x = DeviceBuffer<bf16>(size_t{8192} * 8192);
  launch_fill_uniform(sh.x.get(), sh.x.size(), 7, -1.f, 1.f, c.stream);
  sh.y = DeviceBuffer<float>(size_t{8192} * 16384);
  launch_fill_uniform(sh.y.get(), sh.y.size(), 8, -1.f, 1.f, c.stream);
  sh.workspace_default = DeviceBuffer<uint8_t>(Gemm::kDefaultWorkspaceBytes);
  sh.workspace_peak = DeviceBuffer<uint8_t>(Gemm::kDefaultWorkspaceBytes);
  TROUPE_CUDA_CHECK(cudaStreamSynchronize(c.stream));
}

void phase_gemm(Context& c) {
  Shared& sh = c.shared;
  // The peak: 8192^3, bf16 out, the algorithm picked for M = 8192.
  {
    Gemm g(sh.workspace_peak.get(), sh.workspace_peak.bytes(), GemmOptions{8192});
    DeviceBuffer<bf16> w(size_t{8192} * 8192);
    launch_fill_uniform(w.get(), w.size(), 9, -1.f, 1.f, c.stream);
    GemmArgs a;
    a.m = a.n = a.k = 8192;
    a.x = sh.x.get();
    a.w = w.get();
    a.y = sh.y.get();
    a.y_type = GemmOut::kBf16;
    TROUPE_CUDA_CHECK(cudaMemsetAsync(sh.y.get(), 0xFF, size_t{8192} * 8192 * 2, c.stream));
    constexpr int kInner = 5;
    const double ms = time_ms(c.stream, 5,
                              [&] {
                                for (int r = 0; r < kInner; ++r) g.run(a, c.stream);
                              }) /
                      kInner;
    check_finite_bf16(static_cast<const bf16*>(a.y), size_t{8192} * 8192, "GEMM 8192^3 output");
    c.ceil.gemm_flops_per_s = 2.0 * 8192.0 * 8192.0 * 8192.0 / (ms * 1e-3);
    std::printf("gemm: 8192^3 bf16 %.3f ms = %s\n  %s", ms, tflops(c.ceil.gemm_flops_per_s).c_str(),
                g.debug_string().c_str());
    const double p = c.sheet.bf16_dense_flops;
    c.rows.push_back({"BF16 GEMM 8192^3 (gpu::Gemm)", tflops(c.ceil.gemm_flops_per_s),
                      p > 0 ? tflops(p) + " (datasheet dense)" : "",
                      p > 0 ? c.ceil.gemm_flops_per_s / p : -1, -1,
                      "the GEMM peak below (prefill)"});
  }
  // The layer's shapes at decode and prefill M, cycling through the stage's 14 layers of
  // weights, with the default algorithm hint (the engine's GemmOptions default).
  Gemm g(sh.workspace_default.get(), sh.workspace_default.bytes());
  std::printf("gemm shapes (f32 out; per call; weights cycled over %d layers):\n", kStageLayers);
  std::printf("  %-8s %6s %6s %6s %10s %10s %12s\n", "shape", "M", "N", "K", "us", "GB/s",
              "TFLOP/s");
  for (int64_t m : {int64_t{1}, int64_t{16}, int64_t{64}, int64_t{2048}, int64_t{8192}}) {
    double layer_ms = 0, layer_w_bytes = 0;
    for (int si = 0; si < kNumShapes; ++si) {
      const Shape& s = kShapes[si];
      const double ms =
          time_ms(c.stream, 5,
                  [&] {
                    for (int l = 0; l < kStageLayers; ++l)
                      g.run(shape_args(s, m, sh.w[si][static_cast<size_t>(l)].get(), sh), c.stream);
                  }) /
          kStageLayers;
      const double wb = 2.0 * static_cast<double>(s.n * s.k);
      const double io = 2.0 * static_cast<double>(m * s.k) +
                        4.0 * static_cast<double>(m * s.n) * (s.accumulate ? 2.0 : 1.0);
      const double fl = 2.0 * static_cast<double>(m * s.n * s.k);
      std::printf("  %-8s %6lld %6lld %6lld %10.1f %10.0f %12.1f\n", s.name,
                  static_cast<long long>(m), static_cast<long long>(s.n),
                  static_cast<long long>(s.k), ms * 1e3, (wb + io) / (ms * 1e-3) / 1e9,
                  fl / (ms * 1e-3) / 1e12);
      layer_ms += ms;
      layer_w_bytes += wb;
    }
    const double flops = 2.0 * static_cast<double>(m) * layer_params();
    if (m <= 64) {
      const double bw = layer_w_bytes / (layer_ms * 1e-3);
      c.rows.push_back({format("GEMMs of one layer, M=%lld (decode)", static_cast<long long>(m)),
                        format("%s weights (%.1f us)", tbs(bw).c_str(), layer_ms * 1e3),
                        tbs(c.ceil.read_bytes_per_s) + " (HBM read)",
                        c.ceil.read_bytes_per_s > 0 ? bw / c.ceil.read_bytes_per_s : -1, -1,
                        "qkv+o+gate_up+down"});
    } else {
      const double f = flops / (layer_ms * 1e-3);
      c.rows.push_back({format("GEMMs of one layer, M=%lld (prefill)", static_cast<long long>(m)),
                        format("%s (%.2f ms)", tflops(f).c_str(), layer_ms),
                        tflops(c.ceil.gemm_flops_per_s) + " (GEMM peak)",
                        c.ceil.gemm_flops_per_s > 0 ? f / c.ceil.gemm_flops_per_s : -1, -1,
                        "qkv+o+gate_up+down"});
    }
  }
}

// ---- attention ----

struct AttnSetup {
  int32_t n_seqs, q_len, pos0, max_kv_len;
};

double run_attention(Context& c, const AttnSetup& st, const DeviceBuffer<bf16>& k,
                     const DeviceBuffer<bf16>& v, int64_t num_slots,
                     const DeviceBuffer<int32_t>& table, int32_t max_blocks_per_seq,
                     int32_t block_size) {
  const int64_t n_tok = static_cast<int64_t>(st.n_seqs) * st.q_len;
  std::vector<int32_t> q_start(static_cast<size_t>(st.n_seqs)), q_len(q_start.size(), st.q_len),
      pos0(q_start.size(), st.pos0);
  for (int32_t s = 0; s < st.n_seqs; ++s) q_start[static_cast<size_t>(s)] = s * st.q_len;
  DeviceBuffer<int32_t> d_start(q_start.size()), d_len(q_start.size()), d_pos0(q_start.size());
  d_start.upload(q_start);
  d_len.upload(q_len);
  d_pos0.upload(pos0);
  // upload() copies on the legacy default stream, which c.stream (non-blocking) does not wait
  // for: finish those copies before the kernels read them.
  TROUPE_CUDA_CHECK(cudaDeviceSynchronize());
  DeviceBuffer<bf16> q(static_cast<size_t>(n_tok * kHeads * kHeadDim));
  launch_fill_uniform(q.get(), q.size(), 21, -1.f, 1.f, c.stream);
  DeviceBuffer<bf16> out(q.size());
  // Poisoned on the stream the kernels run on (fill_bytes would use the legacy default stream,
  // which a non-blocking stream does not wait for).
  TROUPE_CUDA_CHECK(cudaMemsetAsync(out.get(), 0xFF, out.bytes(), c.stream));
  const size_t ws_bytes =
      st.q_len == 1 ? paged_attention_workspace_bytes(st.n_seqs, kHeads, kHeadDim, st.max_kv_len)
                    : 0;
  DeviceBuffer<uint8_t> ws(ws_bytes);
  AttnArgs a;
  a.q = q.get();
  a.n_head = kHeads;
  a.kv = AttnKv{k.get(), v.get(), num_slots, kKvHeads, kHeadDim, block_size};
  a.batch.n_seqs = st.n_seqs;
  a.batch.n_tok = n_tok;
  a.batch.q_start = d_start.get();
  a.batch.q_len = d_len.get();
  a.batch.pos0 = d_pos0.get();
  a.batch.block_table = table.get();
  a.batch.max_blocks_per_seq = max_blocks_per_seq;
  a.batch.max_q_len = st.q_len;
  a.batch.min_q_len = st.q_len;
  a.batch.max_kv_len = st.max_kv_len;
  a.out = out.get();
  a.out_type = AttnOut::kBf16;
  a.workspace = ws_bytes ? ws.get() : nullptr;
  a.workspace_bytes = ws_bytes;
  constexpr int kInner = 5;
  const double ms = time_ms(c.stream, 5,
                            [&] {
                              for (int r = 0; r < kInner; ++r) paged_attention(a, c.stream);
                            }) /
                    kInner;
  check_finite_bf16(out.get(), out.size(), "attention output");
  return ms;
}

void phase_attention(Context& c) {
  constexpr int32_t kSeqs = 64, kCtx = 4096, kBlock = 16;
  constexpr int32_t kBlocksPerSeq = kCtx / kBlock;
  const int64_t num_blocks = int64_t{kSeqs} * kBlocksPerSeq;
  const int64_t num_slots = num_blocks * kBlock;
  const size_t kv_elems = static_cast<size_t>(num_slots * kKvHeads * kHeadDim);
  DeviceBuffer<bf16> k(kv_elems), v(kv_elems);  // 512 MiB each
  launch_fill_uniform(k.get(), kv_elems, 31, -1.f, 1.f, c.stream);
  launch_fill_uniform(v.get(), kv_elems, 32, -1.f, 1.f, c.stream);
  // Blocks scattered over the pool, as after a while of serving.
  std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(5));
  DeviceBuffer<int32_t> table(ids.size());
  table.upload(ids);

  // Decode: 64 sequences, one new token each at position 4095 (4096 keys per sequence).
  const double dec_ms =
      run_attention(c, {kSeqs, 1, kCtx - 1, kCtx}, k, v, num_slots, table, kBlocksPerSeq, kBlock);
  const double kv_bytes = 2.0 * 2.0 * kSeqs * static_cast<double>(kCtx) * kKvHeads * kHeadDim;
  const double dec_bw = kv_bytes / (dec_ms * 1e-3);
  std::printf("attention decode: %d seqs x %d ctx: %.3f ms, KV %.2f GB read = %s\n", kSeqs, kCtx,
              dec_ms, kv_bytes / 1e9, tbs(dec_bw).c_str());
  c.rows.push_back({format("attention decode, %d seqs x %d ctx (KV read)", kSeqs, kCtx),
                    format("%s (%.3f ms)", tbs(dec_bw).c_str(), dec_ms),
                    tbs(c.ceil.read_bytes_per_s) + " (HBM read)",
                    c.ceil.read_bytes_per_s > 0 ? dec_bw / c.ceil.read_bytes_per_s : -1, -1,
                    "GQA 24/8 heads, head_dim 128, bf16 KV, block 16"});

  // Prefill: 4 sequences of 2048 new tokens (causal), their K/V already in the cache.
  constexpr int32_t kPSeqs = 4, kPLen = 2048;
  const double pre_ms =
      run_attention(c, {kPSeqs, kPLen, 0, kPLen}, k, v, num_slots, table, kBlocksPerSeq, kBlock);
  const double flops = kPSeqs * 4.0 * kHeads * kHeadDim * (kPLen * (kPLen + 1.0) / 2.0);
  const double f = flops / (pre_ms * 1e-3);
  std::printf("attention prefill: %d x %d tokens: %.3f ms = %.0f tok/s, %s (causal)\n", kPSeqs,
              kPLen, pre_ms, kPSeqs * kPLen / (pre_ms * 1e-3), tflops(f).c_str());
  c.rows.push_back({format("attention prefill, %d x %d tokens", kPSeqs, kPLen),
                    format("%s, %.0f tok/s", tflops(f).c_str(), kPSeqs * kPLen / (pre_ms * 1e-3)),
                    tflops(c.ceil.gemm_flops_per_s) + " (GEMM peak)",
                    c.ceil.gemm_flops_per_s > 0 ? f / c.ceil.gemm_flops_per_s : -1, -1,
                    "causal FLOPs only"});
}

// ---- exposed communication (one-GPU stand-in for two pipeline stages) ----

// Micro-batch i's hidden states go device -> pinned host -> device on the comm stream (what a
// stage does when its neighbour is on another host) while micro-batch i + 1 runs the stage's
// 14 layers of GEMMs on the compute stream. Two hidden buffers alternate; computing i + 2 waits
// for i's copy. Returns ms for one pass of kMicro micro-batches.
struct CommTimes {
  double compute_ms, copy_ms, overlapped_ms;
};

CommTimes run_comm(Context& c, Gemm& g, StreamPair& sp, int64_t m) {
  constexpr int kMicro = 8;
  const size_t hidden = static_cast<size_t>(m * kEmbd);
  DeviceBuffer<float> h[2] = {DeviceBuffer<float>(hidden), DeviceBuffer<float>(hidden)};
  DeviceBuffer<float> recv[2] = {DeviceBuffer<float>(hidden), DeviceBuffer<float>(hidden)};
  float* host[2] = {nullptr, nullptr};
  TROUPE_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&host[0]), hidden * 4));
  TROUPE_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&host[1]), hidden * 4));
  cudaEvent_t computed[2], copied[2], start, stop;
  for (int i = 0; i < 2; ++i) {
    TROUPE_CUDA_CHECK(cudaEventCreateWithFlags(&computed[i], cudaEventDisableTiming));
    TROUPE_CUDA_CHECK(cudaEventCreateWithFlags(&copied[i], cudaEventDisableTiming));
  }
  TROUPE_CUDA_CHECK(cudaEventCreate(&start));
  TROUPE_CUDA_CHECK(cudaEventCreate(&stop));
  const cudaStream_t cs = sp.compute(), ms = sp.comm();
  auto pass = [&](bool compute, bool copy) {
    TROUPE_CUDA_CHECK(cudaEventRecord(start, cs));
    TROUPE_CUDA_CHECK(cudaStreamWaitEvent(ms, start, 0));
    for (int i = 0; i < kMicro; ++i) {
      const int b = i % 2;
      if (i >= 2) TROUPE_CUDA_CHECK(cudaStreamWaitEvent(cs, copied[b], 0));
      if (compute) {
        for (int l = 0; l < kStageLayers; ++l)
          for (int si = 0; si < kNumShapes; ++si) {
            GemmArgs a =
                shape_args(kShapes[si], m, c.shared.w[si][static_cast<size_t>(l)].get(), c.shared);
            if (kShapes[si].accumulate) a.y = h[b].get();  // the residual stream
            g.run(a, cs);
          }
      }
      TROUPE_CUDA_CHECK(cudaEventRecord(computed[b], cs));
      TROUPE_CUDA_CHECK(cudaStreamWaitEvent(ms, computed[b], 0));
      if (copy) {
        TROUPE_CUDA_CHECK(
            cudaMemcpyAsync(host[b], h[b].get(), hidden * 4, cudaMemcpyDeviceToHost, ms));
        TROUPE_CUDA_CHECK(
            cudaMemcpyAsync(recv[b].get(), host[b], hidden * 4, cudaMemcpyHostToDevice, ms));
      }
      TROUPE_CUDA_CHECK(cudaEventRecord(copied[b], ms));
    }
    TROUPE_CUDA_CHECK(cudaStreamWaitEvent(cs, copied[(kMicro - 1) % 2], 0));
    TROUPE_CUDA_CHECK(cudaEventRecord(stop, cs));
    TROUPE_CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    TROUPE_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    return static_cast<double>(t);
  };
  CommTimes r{};
  try {
    for (int i = 0; i < 2; ++i) launch_fill_uniform(h[i].get(), hidden, 40 + i, -1.f, 1.f, cs);
    pass(true, true);  // warm-up
    std::vector<double> tc, tx, to;
    for (int rep = 0; rep < 5; ++rep) {
      tc.push_back(pass(true, false));
      tx.push_back(pass(false, true));
      to.push_back(pass(true, true));
    }
    r = {median(tc), median(tx), median(to)};
  } catch (...) {
    cudaFreeHost(host[0]);
    cudaFreeHost(host[1]);
    throw;
  }
  for (int i = 0; i < 2; ++i) {
    cudaEventDestroy(computed[i]);
    cudaEventDestroy(copied[i]);
    cudaFreeHost(host[i]);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return r;
}

void phase_comm(Context& c) {
  StreamPair sp;
  Gemm g(c.shared.workspace_default.get(), c.shared.workspace_default.bytes());
  std::printf(
      "exposed communication (one-GPU stand-in: 2 pipeline stages, hidden states D2H + H2D "
      "through pinned host memory on the comm stream, 8 micro-batches, stage = %d layers):\n",
      kStageLayers);
  for (int64_t m : {int64_t{64}, int64_t{2048}}) {
    const CommTimes t = run_comm(c, g, sp, m);
    const double exposed = (t.overlapped_ms - t.compute_ms) / t.overlapped_ms;
    const double mb = static_cast<double>(m * kEmbd * 4) / 1e6;
    std::printf(
        "  M=%-5lld hidden %.2f MB: compute-only %.3f ms, copies-only %.3f ms, overlapped "
        "%.3f ms, exposed %.1f%%\n",
        static_cast<long long>(m), mb, t.compute_ms, t.copy_ms, t.overlapped_ms, 100.0 * exposed);
    c.rows.push_back(
        {format("exposed comm share, micro-batch %lld tokens (stand-in)",
                static_cast<long long>(m)),
         format("%.1f%% (compute %.2f, copies %.2f, both %.2f ms)", 100.0 * exposed, t.compute_ms,
                t.copy_ms, t.overlapped_ms),
         "", -1, -1,
         format("one GPU; %.2f MB f32 D2H+H2D per micro-batch; the last one's copy cannot hide",
                mb)});
  }
}

// ---- driver ----

struct Options {
  double budget_s = 360;
  std::string model = "/tmp/troupe_gpu_bench_3b.gguf";
  int synth_threads = 0;
  bool skip_engine = false;
};

bool parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--skip-engine") {
      o->skip_engine = true;
      continue;
    }
    if (i + 1 >= argc) return false;
    const char* v = argv[++i];
    if (k == "--budget-s") {
      o->budget_s = std::atof(v);
    } else if (k == "--model") {
      o->model = v;
    } else if (k == "--synth-threads") {
      o->synth_threads = std::atoi(v);
    } else {
      return false;
    }
  }
  return true;
}

// Runs a phase unless the budget is short; a failure becomes an error row, not an abort.
void run_phase(Context& c, const Budget& budget, const char* name, double need_s,
               void (*fn)(Context&)) {
  const double t0 = budget.elapsed_s();
  if (!budget.fits(need_s)) {
    c.rows.push_back(
        {name, "", "", -1, -1,
         format("skipped (time budget: %.0f s left, needs ~%.0f)", budget.remaining_s(), need_s)});
    std::printf("[%6.1f s] %s: skipped, time budget\n", t0, name);
    return;
  }
  std::printf("[%6.1f s] %s ...\n", t0, name);
  std::fflush(stdout);
  try {
    fn(c);
  } catch (const std::exception& e) {
    c.rows.push_back({name, "", "", -1, -1, format("error: %s", e.what())});
    std::printf("%s: error: %s\n", name, e.what());
    cudaGetLastError();  // clear a non-sticky error so the next phase can run
  }
  std::printf("[%6.1f s] %s done (%.1f s)\n", budget.elapsed_s(), name, budget.elapsed_s() - t0);
  std::fflush(stdout);
}

std::string table(const std::vector<Row>& rows) {
  std::string t =
      "| check | measured | limit | fraction | target | met? | note |\n"
      "|---|---|---|---|---|---|---|\n";
  for (const Row& r : rows) {
    const std::string frac = r.fraction >= 0 ? format("%.0f%%", 100.0 * r.fraction) : "";
    const std::string target = r.target >= 0 ? format(">= %.0f%%", 100.0 * r.target) : "";
    std::string met;
    if (r.target >= 0) met = r.fraction < 0 ? "n/a" : (r.fraction >= r.target ? "yes" : "NO");
    t += "| " + r.what + " | " + r.measured + " | " + r.limit + " | " + frac + " | " + target +
         " | " + met + " | " + r.note + " |\n";
  }
  return t;
}

}  // namespace
}  // namespace troupe::gpu::bench

int main(int argc, char** argv) {
  using namespace troupe::gpu;
  using namespace troupe::gpu::bench;
  Options opt;
  if (!parse(argc, argv, &opt)) {
    std::fprintf(stderr,
                 "usage: gpu_bench [--budget-s 360] [--model PATH] [--synth-threads N] "
                 "[--skip-engine]\n");
    return 2;
  }
  const Budget budget(opt.budget_s);
  std::string why;
  if (!gpu_available(&why)) {
    std::printf("gpu_bench: no usable CUDA GPU (%s): nothing measured\n", why.c_str());
    return 3;
  }
  Context c;
  std::string setup;
  try {
    TROUPE_CUDA_CHECK(cudaSetDevice(0));
    TROUPE_CUDA_CHECK(cudaGetDeviceProperties(&c.prop, 0));
    int mem_khz = 0, bus_bits = 0, sm_khz = 0;
    cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, 0);
    cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, 0);
    cudaDeviceGetAttribute(&sm_khz, cudaDevAttrClockRate, 0);
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    c.sheet = datasheet(c.prop.name);
#ifdef NDEBUG
    const char* build = "release";
#else
    const char* build = "DEBUG (asserts on: numbers are not meaningful)";
#endif
    setup = format(
        "gpu_bench: %s (sm_%d%d), %d SMs, L2 %d MiB, %.1f GiB, SM clock %d MHz, memory clock "
        "%d MHz x %d bit; driver %d, runtime %d; %u CPU threads; build %s; GPU engine: %s; "
        "budget %.0f s\n",
        c.prop.name, c.prop.major, c.prop.minor, c.prop.multiProcessorCount,
        c.prop.l2CacheSize >> 20, static_cast<double>(c.prop.totalGlobalMem) / (1 << 30),
        sm_khz / 1000, mem_khz / 1000, bus_bits, driver, runtime,
        std::thread::hardware_concurrency(), build, engine_build_status(), opt.budget_s);
    std::fputs(setup.c_str(), stdout);
    TROUPE_CUDA_CHECK(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking));
  } catch (const std::exception& e) {
    std::printf("gpu_bench: set-up failed: %s\n", e.what());
    return 1;
  }
  // The synthetic model is written by CPU threads while the GPU phases run (two cores stay free
  // for this thread's launches).
  if (!opt.skip_engine) {
    const int hw = static_cast<int>(std::thread::hardware_concurrency());
    start_model_synth(opt.model, opt.synth_threads > 0 ? opt.synth_threads : std::max(1, hw - 2));
  }
  run_phase(c, budget, "hbm bandwidth", 10, phase_hbm);
  run_phase(c, budget, "allocate stage weights", 10, alloc_shared);
  run_phase(c, budget, "gemm", 30, phase_gemm);
  bool engine_done = opt.skip_engine;
  std::vector<Row> engine_rows;
  auto engine = [&] {
    std::printf("[%6.1f s] engine ...\n", budget.elapsed_s());
    std::fflush(stdout);
    run_engine_phase(opt.model, c.ceil, budget, &engine_rows);
    std::printf("[%6.1f s] engine done\n", budget.elapsed_s());
    engine_done = true;
  };
  if (!engine_done && model_synth_done()) engine();
  run_phase(c, budget, "attention", 15, phase_attention);
  run_phase(c, budget, "exposed communication", 20, phase_comm);
  c.shared = Shared{};  // give the stage weights back before the engine loads its model
  if (!engine_done) engine();
  c.rows.insert(c.rows.end(), engine_rows.begin(), engine_rows.end());

  const std::string t = table(c.rows);
  std::printf("\n%s\n%s", setup.c_str(), t.c_str());
  if (const char* out = std::getenv("OUT"); out && *out) {
    const std::string path = std::string(out) + "/gpu_bench.md";
    if (FILE* f = std::fopen(path.c_str(), "w")) {
      std::fprintf(f, "# gpu_bench\n\n%s\n%s", setup.c_str(), t.c_str());
      std::fclose(f);
      std::printf("written to %s\n", path.c_str());
    }
  }
  std::fflush(stdout);
  // A synthesis still running (budget ran out) must not race the static destructors.
  if (model_synth_running()) std::_Exit(0);
  return 0;
}
