// ThreadPool: a generation counter that workers poll, then sleep on (std::atomic::wait).
#include "compute/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <chrono>

namespace troupe::compute {

namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Waiting in three phases. Polling with `pause` catches the back-to-back parallel sections of
// a step within microseconds; then yielding, because on an oversubscribed machine the thread
// we wait for may need this very core; an idle worker finally sleeps on the futex.
constexpr int kPauseIters = 1 << 10;                      // ~30 us
constexpr auto kYieldFor = std::chrono::milliseconds(2);  // then sleep (workers only)

class Backoff {
 public:
  /// Waits a little; returns false once a worker should stop polling and sleep.
  bool wait() {
    if (iters_ < kPauseIters) {
      ++iters_;
      cpu_relax();
      return true;
    }
    if (iters_++ == kPauseIters) yield_start_ = std::chrono::steady_clock::now();
    std::this_thread::yield();
    return (iters_ & 15) != 0 || std::chrono::steady_clock::now() - yield_start_ < kYieldFor;
  }

 private:
  int64_t iters_ = 0;
  std::chrono::steady_clock::time_point yield_start_;
};

}  // namespace

int available_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

int resolve_threads(int requested, int sharers) {
  if (requested > 0) return requested;
  return std::max(1, available_cpus() / std::max(1, sharers));
}

ThreadPool::ThreadPool(int n_threads)
    : n_threads_(std::max(1, n_threads)),
      errors_(std::make_unique<std::exception_ptr[]>(static_cast<size_t>(n_threads_))) {
  threads_.reserve(static_cast<size_t>(n_threads_ - 1));
  for (int i = 1; i < n_threads_; ++i) threads_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::worker(int idx) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t g = generation_.load(std::memory_order_acquire);
    Backoff backoff;
    while (g == seen && backoff.wait()) g = generation_.load(std::memory_order_acquire);
    while (g == seen) {
      // Counted before the last look at generation_, both sequentially consistent, as run()'s
      // increment and its look at sleepers_: either that look sees this sleeper, or this one
      // sees the new generation.
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      if (generation_.load(std::memory_order_seq_cst) == seen)
        generation_.wait(seen, std::memory_order_acquire);
      sleepers_.fetch_sub(1, std::memory_order_relaxed);
      g = generation_.load(std::memory_order_acquire);
    }
    seen = g;
    if (stop_.load(std::memory_order_relaxed)) return;
    try {
      (*job_)(idx, n_threads_);
    } catch (...) {
      errors_[static_cast<size_t>(idx)] = std::current_exception();
    }
    pending_.fetch_sub(1, std::memory_order_release);
  }
}

void ThreadPool::run(FnRef<void(int, int)> fn) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t0 = Clock::now();
  ++stats_.runs;
  if (n_threads_ == 1) {
    fn(0, 1);
    stats_.run_s += std::chrono::duration<double>(Clock::now() - t0).count();
    return;
  }
  job_ = &fn;
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_seq_cst);
  // Only a sleeping worker needs the wake. libstdc++'s notify_all makes a futex call whenever
  // any thread of the process sleeps on an 8-byte atomic of the same hash bucket (all
  // 64-byte-aligned ones share one), such as another pool's idle worker: with the bandwidth
  // probe's pool asleep, engine_bench made one system call per parallel section
  // (docs/benchmarks.md "Engine, session 42").
  if (sleepers_.load(std::memory_order_seq_cst) != 0) generation_.notify_all();
  std::exception_ptr mine;
  try {
    fn(0, n_threads_);
  } catch (...) {
    mine = std::current_exception();
  }
  const Clock::time_point t1 = Clock::now();
  Backoff backoff;
  while (pending_.load(std::memory_order_acquire) != 0) backoff.wait();
  const Clock::time_point t2 = Clock::now();
  stats_.run_s += std::chrono::duration<double>(t2 - t0).count();
  stats_.wait_s += std::chrono::duration<double>(t2 - t1).count();
  std::exception_ptr err = mine;
  for (int i = 1; i < n_threads_; ++i) {
    auto& e = errors_[static_cast<size_t>(i)];
    if (!err && e) err = e;
    e = nullptr;
  }
  if (err) std::rethrow_exception(err);
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, FnRef<void(int64_t, int64_t)> fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t n_chunks = (n + grain - 1) / grain;
  auto part = [&](int idx, int nt) {
    const int64_t c0 = n_chunks * idx / nt;
    const int64_t c1 = n_chunks * (idx + 1) / nt;
    const int64_t b = c0 * grain, e = std::min(n, c1 * grain);
    if (b < e) fn(b, e);
  };
  if (n_chunks == 1) {
    part(0, 1);  // nothing to share: skip the hand-off
    return;
  }
  run(part);
}

}  // namespace troupe::compute
