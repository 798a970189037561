// ThreadPool: a fixed set of compute threads for one engine (or one stage actor). The calling
// thread takes part in every parallel_for. Not reentrant: one run/parallel_for at a time per
// pool, from one thread at a time.
// Low overhead by design (steps call it hundreds of times per token): a call allocates nothing,
// workers spin on a generation counter for a while before they sleep on it (futex), and the
// caller spins until the workers are done.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace troupe::compute {

/// A non-owning reference to a callable, for arguments only: it never allocates (a
/// std::function that captures more than two pointers does). The callable must outlive the
/// call it is passed to, which a lambda or std::function written at the call site does.
template <typename Sig>
class FnRef;

template <typename R, typename... Args>
class FnRef<R(Args...)> {
 public:
  template <typename F>
  requires(!std::is_same_v<std::remove_cvref_t<F>, FnRef> && std::is_invocable_r_v<R, F&, Args...>)
      FnRef(F&& f)  // NOLINT(google-explicit-constructor): implicit, like std::function
      : obj_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* obj, Args... args) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(obj))(std::forward<Args>(args)...);
        }) {}

  R operator()(Args... args) const { return call_(obj_, std::forward<Args>(args)...); }

 private:
  void* obj_;
  R (*call_)(void*, Args...);
};

/// The CPUs this process may run on (its affinity mask, which taskset and cpusets narrow), at
/// least 1.
int available_cpus();

/// Compute threads for one of `sharers` CPU compute actors of a process: `requested` when > 0,
/// else ("auto") available_cpus() divided among them, at least 1.
int resolve_threads(int requested, int sharers);

class ThreadPool {
 public:
  /// n_threads >= 1 counts the caller: ThreadPool(1) runs everything on the calling thread.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  /// Runs fn(thread_idx, n_threads) on every thread (the caller is thread 0) and returns when
  /// all have finished. An exception thrown by fn is rethrown here (the caller's first, else
  /// the lowest-numbered worker's).
  void run(FnRef<void(int, int)> fn);

  /// Splits [0, n) into size() contiguous chunks aligned to `grain` and runs fn(begin, end)
  /// on each non-empty one. The partition depends only on n, grain and size().
  void parallel_for(int64_t n, int64_t grain, FnRef<void(int64_t, int64_t)> fn);

  /// Where the calling thread's time went, since the pool was made: runs (parallel sections,
  /// each run() and each parallel_for() of more than one chunk), the time from their start to
  /// their end, and of that the time the caller waited for the other threads once its own part
  /// was done. The rest of a caller's time (a step's minus run_s) is serial: the caller alone.
  /// Read on the calling thread (as run()).
  struct Stats {
    int64_t runs = 0;
    double run_s = 0;
    double wait_s = 0;
  };
  const Stats& stats() const { return stats_; }

 private:
  void worker(int idx);

  int n_threads_;
  std::vector<std::thread> threads_;
  // Published by the release increment of generation_, read by workers after acquiring it;
  // rewritten only after pending_ drops to 0, so no worker still reads it.
  const FnRef<void(int, int)>* job_ = nullptr;
  alignas(64) std::atomic<uint64_t> generation_{0};
  alignas(64) std::atomic<int> pending_{0};
  std::atomic<int> sleepers_{0};  // workers in (or about to enter) generation_.wait
  std::atomic<bool> stop_{false};
  // One slot per worker: each written only by its worker, read by the caller after pending_.
  std::unique_ptr<std::exception_ptr[]> errors_;
  Stats stats_;  // the caller's only
};

}  // namespace troupe::compute
