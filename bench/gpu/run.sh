#!/usr/bin/env bash
# The GPU device check (docs/benchmarks.md, "GPU device check"): on a machine with an NVIDIA GPU,
# builds the CUDA backend, runs gpu_tests, then gpu_bench, and prints a table, in under 8 minutes.
# Where our Debian packages are installed it configures the normal build (and builds only the two
# targets); where they are not (the lent GPU machine: CUDA, CMake, ninja, no network) it builds
# with TROUPE_GPU_ONLY from .device-deps/ (scripts/device-deps; carry it). Without a GPU it
# builds, then says "no GPU: built and skipped" and exits 0.
# A failing test is reported and the benchmarks still run; the exit status is then 1.
# Environment (all optional):
#   TROUPE_BUILD_DIR  build folder (default build/gpu-check)
#   TROUPE_GPU_ONLY   1: the GPU-only build; 0: the normal build; unset: 1 unless the packages
#                     are there
#   TROUPE_JOBS       parallel build jobs (default: nproc)
#   TROUPE_CUDA_ARCH  CMAKE_CUDA_ARCHITECTURES (default: the GPU's compute_cap, else 90)
#   TROUPE_WERROR     ON|OFF (default: ON for the normal build; OFF for GPU-only, since the GPU
#                     machine's host compiler is not CI's and a new warning must not cost the call)
#   TROUPE_TOTAL_S    the whole script's budget in seconds (default 470: under 8 minutes)
#   OUT               when set: build.log, gpu_tests.log, gpu_bench.log, gpu_bench.md,
#                     summary.txt (and sanitizer.log when a test failed) are written there
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
root=$PWD
total_s=${TROUPE_TOTAL_S:-470}
build=${TROUPE_BUILD_DIR:-build/gpu-check}
jobs=${TROUPE_JOBS:-$(nproc)}
out=${OUT:-}
logdir=${out:-$build}
summary=()

elapsed() { echo $((SECONDS)); }
left() { echo $((total_s - SECONDS)); }
say() { echo "=== [$(elapsed) s] $*"; }
note() {
  summary+=("$*")
  say "$*"
}
finish() {
  echo
  echo "=== bench/gpu/run.sh summary ($(elapsed) s of ${total_s} s)"
  printf '  %s\n' "${summary[@]}"
  if [[ -n $out ]]; then printf '%s\n' "${summary[@]}" >"$out/summary.txt"; fi
  exit "$1"
}

# ---- the machine ----
have_gpu=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  have_gpu=1
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu \
    --format=csv 2>&1
fi
arch=${TROUPE_CUDA_ARCH:-}
if [[ -z $arch && $have_gpu == 1 ]]; then
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '. ')
fi
arch=${arch:-90}
nvcc=${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
if [[ ! -x $nvcc ]]; then
  note "FAIL: no nvcc (looked on PATH and at /usr/local/cuda/bin/nvcc)"
  finish 1
fi

# ---- full or GPU-only build ----
packages_present() {
  local h
  for h in caf/all.hpp capnp/message.h ucp/api/ucp.h openssl/ssl.h toml++/toml.h \
    gtest/gtest.h nlohmann/json.hpp; do
    [[ -f /usr/include/$h ]] || return 1
  done
}
gpu_only=${TROUPE_GPU_ONLY:-}
if [[ -z $gpu_only ]]; then
  if packages_present; then gpu_only=0; else gpu_only=1; fi
fi
cmake_args=(-DCMAKE_BUILD_TYPE=Release -DTROUPE_CUDA=ON "-DCMAKE_CUDA_COMPILER=$nvcc"
  "-DCMAKE_CUDA_ARCHITECTURES=$arch")
if [[ $gpu_only == 1 ]]; then
  if [[ ! -f .device-deps/googletest/googletest/CMakeLists.txt ]]; then
    note "FAIL: GPU-only build needs .device-deps/ (run scripts/device-deps and carry .device-deps)"
    finish 1
  fi
  cmake_args+=(-DTROUPE_GPU_ONLY=ON -DTROUPE_USE_DEVICE_DEPS=ON
    "-DTROUPE_GTEST_SOURCE=$root/.device-deps/googletest"
    "-DTROUPE_JSON_INCLUDE=$root/.device-deps/include"
    "-DTROUPE_WERROR=${TROUPE_WERROR:-OFF}")
else
  cmake_args+=(-DTROUPE_GPU_ONLY=OFF "-DTROUPE_WERROR=${TROUPE_WERROR:-ON}")
fi
# NCCL: the toolkit's, else the one PyTorch's wheels bring (nvidia-nccl-cu13).
cuda_inc=$(dirname "$(dirname "$nvcc")")/include
if [[ ! -f $cuda_inc/nccl.h ]]; then
  nccl_dir=$(python3 -c 'import importlib.util as u; s = u.find_spec("nvidia.nccl"); print(list(s.submodule_search_locations)[0])' 2>/dev/null || true)
  nccl_lib=
  if [[ -n $nccl_dir ]]; then
    nccl_lib=$(find "$nccl_dir/lib" -name 'libnccl.so*' 2>/dev/null | sort | head -1)
  fi
  if [[ -n $nccl_lib && -f $nccl_dir/include/nccl.h ]]; then
    cmake_args+=("-DNCCL_INCLUDE_DIR=$nccl_dir/include" "-DNCCL_LIBRARY=$nccl_lib")
    export LD_LIBRARY_PATH=$nccl_dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    say "NCCL from $nccl_dir"
  fi
fi
gen=()
command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
note "machine: gpu=$have_gpu arch=sm_$arch gpu_only=$gpu_only jobs=$jobs nvcc=$($nvcc --version | tail -1) cxx=$(c++ --version | head -1) cmake=$(cmake --version | head -1)"

# ---- configure and build ----
mkdir -p "$build"
say "configure ($build)"
t0=$SECONDS
# A normal-build folder must not turn GPU-only, nor the reverse (the cache would keep targets).
if [[ -f $build/CMakeCache.txt ]] && ! grep -q "^TROUPE_GPU_ONLY:BOOL=$([[ $gpu_only == 1 ]] && echo ON || echo OFF)$" "$build/CMakeCache.txt"; then
  rm -rf "$build"
  mkdir -p "$build"
fi
timeout 180 cmake -S . -B "$build" "${gen[@]}" "${cmake_args[@]}" >"$logdir/build.log" 2>&1
rc=$?
tail -5 "$logdir/build.log"
if [[ $rc != 0 ]]; then
  tail -40 "$logdir/build.log"
  note "FAIL: configure (rc $rc, $((SECONDS - t0)) s); log: $logdir/build.log"
  finish 1
fi
note "configure: $((SECONDS - t0)) s"

build_target() {  # target timeout_s
  timeout "$2" cmake --build "$build" -j "$jobs" --target "$1" >>"$logdir/build.log" 2>&1
}
t0=$SECONDS
say "build gpu_tests (-j $jobs)"
if ! build_target gpu_tests $(($(left) - 120)); then
  grep -E "error|Error|FAILED" "$logdir/build.log" | head -40
  note "FAIL: build of gpu_tests ($((SECONDS - t0)) s); log: $logdir/build.log"
  finish 1
fi
note "build gpu_tests: $((SECONDS - t0)) s"
t0=$SECONDS
say "build gpu_bench"
bench_ok=1
if ! build_target gpu_bench $(($(left) - 90)); then
  grep -E "error|FAILED" "$logdir/build.log" | head -20
  say "gpu_bench did not build; again without the engine phase"
  if cmake -S . -B "$build" -DTROUPE_GPU_BENCH_ENGINE=OFF >>"$logdir/build.log" 2>&1 &&
    build_target gpu_bench $(($(left) - 80)); then
    note "WARN: gpu_bench built without the engine phase (engine part failed to compile)"
  else
    note "FAIL: build of gpu_bench; log: $logdir/build.log"
    bench_ok=0
  fi
fi
note "build gpu_bench: $((SECONDS - t0)) s"

if [[ $have_gpu == 0 ]]; then
  note "no GPU: built and skipped (gpu_tests and gpu_bench need an NVIDIA GPU)"
  finish 0
fi

# ---- GPU tests ----
# Two runs: the single-GPU tests, then the multi-rank ones (tensor parallelism, expert dispatch;
# they run as a one-GPU stand-in group on one GPU) with a short group timeout, so that a hang in
# a group costs seconds and cannot hide the other tests' results.
status=0
t0=$SECONDS
test_s=$(($(left) - 200))
((test_s > 150)) && test_s=150
((test_s < 40)) && test_s=40
multi='Collective.*:GpuTpEngine.*:*GpuTpEngineModel.*:MoeDispatch.*:*EpEngineModel.*'
single_s=$((test_s * 3 / 5))
say "gpu_tests, single-GPU (timeout $single_s s)"
timeout "$single_s" "$build/tests/gpu_tests" --gtest_brief=1 --gtest_filter="-$multi" 2>&1 |
  tee "$logdir/gpu_tests.log" | grep -vE '^\[       OK \]|^\[ RUN      \]'
rc=${PIPESTATUS[0]}
multi_s=$((test_s - (SECONDS - t0)))
((multi_s < 20)) && multi_s=20
say "gpu_tests, multi-rank (timeout $multi_s s, group timeout 15 s)"
TROUPE_GROUP_TIMEOUT_S=15 timeout "$multi_s" "$build/tests/gpu_tests" --gtest_brief=1 \
  --gtest_filter="$multi" 2>&1 | tee -a "$logdir/gpu_tests.log" |
  grep -vE '^\[       OK \]|^\[ RUN      \]'
rc2=${PIPESTATUS[0]}
((rc == 0)) && rc=$rc2
counts=$(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$logdir/gpu_tests.log" | tr '\n' ' ')
if [[ $rc == 0 ]]; then
  note "gpu_tests: passed ($((SECONDS - t0)) s): $counts"
else
  status=1
  note "FAIL: gpu_tests rc $rc ($((SECONDS - t0)) s; 124 = timeout): $counts"
  while read -r l; do note "  $l"; done < <(grep -E '^\[  FAILED  \] [A-Za-z]' "$logdir/gpu_tests.log" | head -10)
  # The first failed tests again under compute-sanitizer's memcheck (out-of-bounds and misaligned
  # accesses, which a wrong result alone does not locate), at most 60 s of the budget.
  sanitizer=$(dirname "$nvcc")/compute-sanitizer
  failed=$(grep -E '^\[  FAILED  \] [A-Za-z]' "$logdir/gpu_tests.log" | awk '{sub(/,$/, "", $4); print $4}' |
    sort -u | head -3 | paste -sd: -)
  if [[ -x $sanitizer && -n $failed ]] && (($(left) > 200)); then
    t0=$SECONDS
    say "compute-sanitizer memcheck on $failed (timeout 60 s)"
    timeout 60 "$sanitizer" --tool memcheck --print-limit 20 "$build/tests/gpu_tests" \
      --gtest_filter="$failed" >"$logdir/sanitizer.log" 2>&1
    note "memcheck of the failed tests ($((SECONDS - t0)) s): $(grep -cE '^========= (Invalid|Misaligned|Out-of-range|Program hit)' "$logdir/sanitizer.log") reports; log: ${out:+$out/}sanitizer.log"
    while read -r l; do note "  $l"; done < <(grep -E '^========= (Invalid|Misaligned|Out-of-range|Program hit)' -A2 "$logdir/sanitizer.log" | head -9)
  fi
fi

# ---- benchmarks ----
if [[ $bench_ok == 1 ]]; then
  t0=$SECONDS
  bench_s=$(($(left) - 10))
  if ((bench_s < 60)); then
    note "FAIL: gpu_bench skipped: only $bench_s s left"
    finish 1
  fi
  say "gpu_bench (budget $((bench_s - 15)) s, timeout $bench_s s)"
  timeout "$bench_s" "$build/bench/gpu_bench" --budget-s $((bench_s - 15)) 2>&1 |
    tee "$logdir/gpu_bench.log"
  rc=${PIPESTATUS[0]}
  if [[ $rc == 0 ]]; then
    note "gpu_bench: done ($((SECONDS - t0)) s); table in ${out:+$out/}gpu_bench.md"
  else
    status=1
    note "FAIL: gpu_bench rc $rc ($((SECONDS - t0)) s; 124 = timeout)"
  fi
fi
finish "$status"
