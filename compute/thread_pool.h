// ThreadPool: a fixed set of compute threads for one engine (or one stage actor). The calling
// thread takes part in every parallel_for. Not reentrant: one parallel_for at a time per pool.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace troupe::compute {

class ThreadPool {
 public:
  /// n_threads >= 1 counts the caller: ThreadPool(1) runs everything on the calling thread.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  /// Runs fn(thread_idx, n_threads) on every thread (the caller is thread 0) and returns when
  /// all have finished. An exception thrown by fn is rethrown here (the first one).
  void run(const std::function<void(int, int)>& fn);

  /// Splits [0, n) into size() contiguous chunks aligned to `grain` and runs fn(begin, end)
  /// on each. The partition depends only on n, grain and size().
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker(int idx);

  int n_threads_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  const std::function<void(int, int)>* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  bool stop_ = false;
  std::exception_ptr error_;
  std::mutex error_mu_;
};

}  // namespace troupe::compute
