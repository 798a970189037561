#include "compute/thread_pool.h"

#include <algorithm>

namespace troupe::compute {

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  for (int i = 1; i < n_threads_; ++i) threads_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
    generation_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::worker(int idx) {
  uint64_t seen = 0;
  for (;;) {
    // Spin briefly: steps issue many short parallel sections back to back.
    uint64_t g = generation_.load(std::memory_order_acquire);
    for (int spin = 0; g == seen && spin < 20000; ++spin) {
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
      g = generation_.load(std::memory_order_acquire);
    }
    if (g == seen) {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return generation_.load(std::memory_order_acquire) != seen || stop_; });
      g = generation_.load(std::memory_order_acquire);
    }
    seen = g;
    const std::function<void(int, int)>* job;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (stop_) return;
      job = job_;
    }
    try {
      (*job)(idx, n_threads_);
    } catch (...) {
      std::lock_guard<std::mutex> lk(error_mu_);
      if (!error_) error_ = std::current_exception();
    }
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::run(const std::function<void(int, int)>& fn) {
  if (n_threads_ == 1) {
    fn(0, 1);
    return;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    job_ = &fn;
    pending_.store(n_threads_ - 1, std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
  std::exception_ptr mine;
  try {
    fn(0, n_threads_);
  } catch (...) {
    mine = std::current_exception();
  }
  while (pending_.load(std::memory_order_acquire) != 0) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
  std::exception_ptr err;
  {
    std::lock_guard<std::mutex> lk(error_mu_);
    err = error_;
    error_ = nullptr;
  }
  if (mine) std::rethrow_exception(mine);
  if (err) std::rethrow_exception(err);
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t n_chunks = (n + grain - 1) / grain;
  run([&](int idx, int nt) {
    const int64_t c0 = n_chunks * idx / nt;
    const int64_t c1 = n_chunks * (idx + 1) / nt;
    const int64_t b = c0 * grain, e = std::min(n, c1 * grain);
    if (b < e) fn(b, e);
  });
}

}  // namespace troupe::compute
