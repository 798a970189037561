// Shared pieces of gpu_bench (the GPU device check, bench/gpu/run.sh): result rows, the measured
// ceilings, the time budget, CUDA-event timing, and the launchers of gpu_bench's own kernels
// (bench_kernels.cu). Everything runs on gpu_bench's main thread, on the current device.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace troupe::gpu::bench {

/// One line of the final table: a measurement beside the machine's limit.
struct Row {
  std::string what;      // "decode batch 1"
  std::string measured;  // "812.3 tok/s"
  std::string limit;     // "1010.2 tok/s (HBM roofline)"; "" = none
  double fraction = -1;  // measured / limit, < 0 = none
  double target = -1;    // the fraction the issue asks for, < 0 = none
  std::string note;      // "skipped (time budget)", "error: ...", caveats
};

/// The ceilings measured first and used by the later phases (0 = not measured).
struct Ceilings {
  double read_bytes_per_s = 0;  // read kernel over >= 4 GiB: the HBM roofline
  double copy_bytes_per_s = 0;  // device-to-device copy, bytes read + bytes written
  double gemm_flops_per_s = 0;  // BF16 GEMM 8192^3 through gpu::Gemm: "measured peak"
};

/// The wall-clock budget of the whole run (bench/gpu/run.sh keeps the script under 8 minutes).
class Budget {
 public:
  explicit Budget(double seconds) : start_(std::chrono::steady_clock::now()), seconds_(seconds) {}
  double elapsed_s() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  double remaining_s() const { return seconds_ - elapsed_s(); }
  /// True when `need_s` more seconds fit.
  bool fits(double need_s) const { return remaining_s() >= need_s; }

 private:
  std::chrono::steady_clock::time_point start_;
  double seconds_;
};

double median(std::vector<double> v);
std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

/// Median over `reps` timings (ms, CUDA events on `stream`) of body(), which enqueues the work
/// on `stream`; body() runs once more before, as warm-up. Throws DeviceError.
double time_ms(cudaStream_t stream, int reps, const std::function<void()>& body);

/// Throws DeviceError unless every element of the device array is finite (NaN or inf: an
/// unwritten element of a poisoned output, or a wrong result).
void check_finite_bf16(const __nv_bfloat16* p, size_t n, const char* what);
void check_finite_f32(const float* p, size_t n, const char* what);

// ---- kernels (bench_kernels.cu) ----

/// Reads `bytes` (a multiple of 16, 16-byte aligned) with 16-byte loads, several in flight per
/// thread, on a grid of `blocks` blocks of 512 threads; sink: device uint64 [blocks], written only
/// on an (improbable) magic value so that the loads cannot be dropped.
void launch_read(const void* p, size_t bytes, uint64_t* sink, int blocks, cudaStream_t stream);
/// p[i] = uniform in [lo, hi) from a hash of (seed, i): random data, never zeros (METHOD.md).
void launch_fill_uniform(__nv_bfloat16* p, size_t n, uint64_t seed, float lo, float hi,
                         cudaStream_t stream);
void launch_fill_uniform(float* p, size_t n, uint64_t seed, float lo, float hi,
                         cudaStream_t stream);

// ---- the engine phase (gpu_bench_engine.cc) ----

/// Starts generating the synthetic ~3B Llama (BF16) into `path` on `threads` CPU threads, in the
/// background, unless the file is there already. Returns at once. No-op when the GPU engine is
/// not in this build.
void start_model_synth(const std::string& path, int threads);
/// True when the synthetic model is ready (or failed, or will never come).
bool model_synth_done();
/// True when the synthetic model is still being written (main must then leave with _Exit).
bool model_synth_running();
/// Decode tokens/s at batch 1, 16, 64 and prefill tokens/s with gpu::GpuEngine on the model,
/// beside the HBM roofline and the GEMM peak in `c`. Appends rows; never throws.
void run_engine_phase(const std::string& path, const Ceilings& c, const Budget& budget,
                      std::vector<Row>* rows);
/// "yes" when gpu/engine.h was compiled in, else why not.
const char* engine_build_status();

}  // namespace troupe::gpu::bench
