#include "common/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>

namespace tidal {
namespace {

TEST(ThreadPool, EveryCallRunsAndItsResultOrExceptionComesBack) {
  ThreadPool pool(3);
  std::vector<std::future<int>> results;
  for (int i = 0; i < 50; ++i) results.push_back(pool.Submit([i] { return i * i; }));
  auto failing = pool.Submit([]() -> int { throw std::runtime_error("worker gone"); });
  for (int i = 0; i < 50; ++i) EXPECT_EQ(results[i].get(), i * i);
  EXPECT_THROW(failing.get(), std::runtime_error);
}

TEST(ThreadPool, BlockingCallsRunSideBySideOnItsThreads) {
  ThreadPool pool(4);
  std::atomic<int> running{0}, most{0};
  std::mutex ids_mu;
  std::set<std::thread::id> ids;
  std::vector<std::future<void>> calls;
  for (int i = 0; i < 8; ++i)
    calls.push_back(pool.Submit([&] {
      const int now = ++running;
      for (int seen = most.load(); now > seen && !most.compare_exchange_weak(seen, now);) {
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      --running;
      std::lock_guard<std::mutex> lock(ids_mu);
      ids.insert(std::this_thread::get_id());
    }));
  for (auto& c : calls) c.get();
  EXPECT_GT(most.load(), 1) << "calls ran one at a time";
  EXPECT_LE(most.load(), 4);
  EXPECT_LE(ids.size(), 4u) << "more threads than the pool has";
}

TEST(ThreadPool, DestroyingItRunsWhatWasAlreadySubmitted) {
  std::atomic<int> done{0};
  {
    ThreadPool pool(1);
    for (int i = 0; i < 20; ++i) pool.Submit([&] { ++done; });
  }
  EXPECT_EQ(done.load(), 20);
}

// A pool that need not finish its queue (the operator's background asks) drops what is still
// queued when it goes — its futures broken — and lets the call already running finish.
TEST(ThreadPool, DestroyedWithoutFinishingItDropsTheQueuedCallsAndFinishesTheRunningOne) {
  std::mutex mu;
  std::condition_variable cv;
  bool started = false, go = false;
  std::atomic<bool> queued_ran{false};
  auto pool = std::make_unique<ThreadPool>(1, /*finish_queued=*/false);
  auto running = pool->Submit([&] {
    std::unique_lock<std::mutex> lock(mu);
    started = true;
    cv.notify_all();
    cv.wait(lock, [&] { return go; });
    return 1;
  });
  auto queued = pool->Submit([&] { queued_ran = true; });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return started; });
  }
  std::thread destroy([&] { pool.reset(); });
  queued.wait();  // broken once the destructor has dropped it
  {
    std::lock_guard<std::mutex> lock(mu);
    go = true;
  }
  cv.notify_all();
  destroy.join();
  EXPECT_EQ(running.get(), 1);
  EXPECT_FALSE(queued_ran.load());
  try {
    queued.get();
    ADD_FAILURE() << "the queued call ran";
  } catch (const std::future_error& e) {
    EXPECT_EQ(e.code(), std::future_errc::broken_promise);
  }
}

}  // namespace
}  // namespace tidal
