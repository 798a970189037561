// ThreadPool: every thread runs, partitions cover the range once, exceptions come back,
// sleeping workers wake up, and back-to-back calls stay correct (run under TSan too).
#include "compute/thread_pool.h"

#include <atomic>
#include <chrono>
#include <functional>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "tests/test_support.h"

namespace troupe::compute {
namespace {

TEST(ThreadPool, RunsOnEveryThreadOnce) {
  for (int n : {1, 2, 3, 5}) {
    ThreadPool pool(n);
    EXPECT_EQ(pool.size(), n);
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    pool.run([&](int idx, int nt) {
      EXPECT_EQ(nt, n);
      hits[static_cast<size_t>(idx)].fetch_add(1);
    });
    for (auto& h : hits) EXPECT_EQ(h.load(), 1);
  }
}

TEST(ThreadPool, CallerIsThreadZero) {
  ThreadPool pool(3);
  const auto me = std::this_thread::get_id();
  std::thread::id zero;
  pool.run([&](int idx, int) {
    if (idx == 0) zero = std::this_thread::get_id();
  });
  EXPECT_EQ(zero, me);
}

TEST(ThreadPool, ParallelForCoversRangeOnceInAlignedChunks) {
  ThreadPool pool(3);
  for (int64_t n : {0, 1, 5, 64, 1000, 1001}) {
    for (int64_t grain : {1, 4, 16}) {
      std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
      pool.parallel_for(n, grain, [&](int64_t b, int64_t e) {
        EXPECT_LT(b, e);
        EXPECT_EQ(b % grain, 0);
        for (int64_t i = b; i < e; ++i) seen[static_cast<size_t>(i)].fetch_add(1);
      });
      for (auto& s : seen) EXPECT_EQ(s.load(), 1) << "n=" << n << " grain=" << grain;
    }
  }
}

TEST(ThreadPool, PartitionDependsOnlyOnSizes) {
  ThreadPool pool(2);
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<std::pair<int64_t, int64_t>> got(2, {-1, -1});
    pool.parallel_for(100, 8, [&](int64_t b, int64_t e) { got[b == 0 ? 0 : 1] = {b, e}; });
    // 13 chunks of 8: chunks [0, 6) and [6, 13).
    EXPECT_EQ(got[0], std::make_pair(int64_t{0}, int64_t{48}));
    EXPECT_EQ(got[1], std::make_pair(int64_t{48}, int64_t{100}));
  }
}

TEST(ThreadPool, RethrowsWorkerException) {
  ThreadPool pool(3);
  EXPECT_THROW(pool.run([](int idx, int) {
    if (idx == 2) throw std::runtime_error("worker 2");
  }),
               std::runtime_error);
  EXPECT_THROW(pool.run([](int idx, int) {
    if (idx == 0) throw std::logic_error("caller");
  }),
               std::logic_error);
  // The pool is still usable and the error does not come back.
  std::atomic<int> n{0};
  pool.run([&](int, int) { n.fetch_add(1); });
  EXPECT_EQ(n.load(), 3);
}

TEST(ThreadPool, ManyBackToBackCalls) {
  ThreadPool pool(2);
  int64_t total = 0;
  std::vector<int64_t> part(2);
  for (int i = 0; i < 20000; ++i) {
    pool.run([&](int idx, int) { part[static_cast<size_t>(idx)] = idx + i; });
    total += part[0] + part[1];
  }
  EXPECT_EQ(total, 2 * (20000LL * 19999 / 2) + 20000);
}

TEST(ThreadPool, WakesSleepingWorkers) {
  ThreadPool pool(3);
  for (int round = 0; round < 3; ++round) {
    // Long enough for the workers to stop spinning and sleep on the futex.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::atomic<int> n{0};
    pool.run([&](int, int) { n.fetch_add(1); });
    EXPECT_EQ(n.load(), 3);
  }
}

// The caller's wake and a worker going to sleep race when a call comes just as the worker
// stops spinning (~2 ms idle): a lost wake would hang here. Gaps around that point, many times.
TEST(ThreadPool, WakesWorkersFallingAsleepAsTheCallComes) {
  ThreadPool pool(2);
  std::atomic<int> n{0};
  for (int i = 0; i < 150; ++i) {
    std::this_thread::sleep_for(std::chrono::microseconds(1500 + 10 * i));
    pool.run([&](int, int) { n.fetch_add(1); });
  }
  EXPECT_EQ(n.load(), 300);
}

TEST(ThreadPool, AcceptsStdFunction) {
  ThreadPool pool(2);
  std::atomic<int> n{0};
  const std::function<void(int, int)> f = [&](int, int) { n.fetch_add(1); };
  pool.run(f);
  EXPECT_EQ(n.load(), 2);
}

// stats(): every run and multi-chunk parallel_for counts (a single chunk runs inline and does
// not); the time in runs covers the caller's part, and the wait the time the caller spent after
// its part until the slowest worker finished.
TEST(ThreadPool, StatsCountRunsAndTheCallersWait) {
  ThreadPool pool(2);
  EXPECT_EQ(pool.stats().runs, 0);
  pool.run([](int idx, int) {
    if (idx == 1) std::this_thread::sleep_for(std::chrono::milliseconds(30));
  });
  const ThreadPool::Stats a = pool.stats();
  EXPECT_EQ(a.runs, 1);
  EXPECT_GE(a.wait_s, 0.025);  // the caller's part was empty: it waited for the worker
  EXPECT_GE(a.run_s, a.wait_s);
  pool.run([](int idx, int) {
    if (idx == 0) std::this_thread::sleep_for(std::chrono::milliseconds(30));
  });
  const ThreadPool::Stats b = pool.stats();
  EXPECT_EQ(b.runs, 2);
  EXPECT_GE(b.run_s - a.run_s, 0.025);
  EXPECT_LT(b.wait_s - a.wait_s, 0.025);               // the worker was done long before the caller
  pool.parallel_for(10, 10, [](int64_t, int64_t) {});  // one chunk: on the caller, not a run
  EXPECT_EQ(pool.stats().runs, 2);
  pool.parallel_for(10, 1, [](int64_t, int64_t) {});
  EXPECT_EQ(pool.stats().runs, 3);
  ThreadPool one(1);
  one.run([](int, int) { std::this_thread::sleep_for(std::chrono::milliseconds(5)); });
  EXPECT_EQ(one.stats().runs, 1);
  EXPECT_GE(one.stats().run_s, 0.004);
  EXPECT_EQ(one.stats().wait_s, 0);
}

}  // namespace
}  // namespace troupe::compute
