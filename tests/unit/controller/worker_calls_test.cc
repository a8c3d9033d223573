// The worker calls a reconcile starts and does not wait for: the reconcile returns at once,
// a call already running under a key is not started twice, its end is reported, and after
// Shutdown nothing is started or reported.
#include "operator/controller/worker_calls.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace tidal::controller {
namespace {

using namespace std::chrono_literals;

// A call that blocks until released: a barrier that waits for the slowest rank.
class Gate {
 public:
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  Status Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, 30s, [&] { return open_; })) return DeadlineExceeded("never opened");
    return Unavailable("the worker went away");
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

template <typename F>
bool Eventually(F done) {
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

TEST(WorkerCallsTest, AStartedCallRunsOffTheCallerOnceAtATimeAndReportsItsEnd) {
  WorkerCalls calls;
  Gate gate;
  std::atomic<int> ended{0};
  Status reported;
  std::mutex mu;
  auto done = [&](const Status& s) {
    std::lock_guard<std::mutex> lock(mu);
    reported = s;
    ++ended;
  };
  ASSERT_TRUE(calls.Start(
      "job/w-0/barrier 1", [&] { return gate.Wait(); }, done));
  // The caller did not wait: the call still runs, and the same ask is not started again.
  EXPECT_TRUE(calls.Running("job/w-0/barrier 1"));
  EXPECT_FALSE(calls.Start(
      "job/w-0/barrier 1", [&] { return gate.Wait(); }, done));
  ASSERT_TRUE(calls.Start(
      "job/w-1/barrier 1", [&] { return gate.Wait(); }, done));
  EXPECT_EQ(calls.running(), 2u);
  EXPECT_EQ(ended.load(), 0);
  gate.Open();
  ASSERT_TRUE(Eventually([&] { return calls.running() == 0; }));
  EXPECT_EQ(ended.load(), 2);
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(reported.code(), StatusCode::kUnavailable);
  }
  // Ended: the same ask may go out again (a repeated barrier answers from the one it did).
  EXPECT_TRUE(calls.Start(
      "job/w-0/barrier 1", [] { return OkStatus(); }, done));
  ASSERT_TRUE(Eventually([&] { return calls.running() == 0; }));
  EXPECT_EQ(ended.load(), 3);
}

TEST(WorkerCallsTest, AfterShutdownNoCallStartsAndNoneThatEndsIsReported) {
  WorkerCalls calls;
  Gate gate;
  std::atomic<int> ended{0};
  ASSERT_TRUE(calls.Start(
      "k", [&] { return gate.Wait(); }, [&](const Status&) { ++ended; }));
  calls.Shutdown(0ms);
  EXPECT_FALSE(calls.Start(
      "other", [] { return OkStatus(); }, [&](const Status&) { ++ended; }));
  gate.Open();
  // The running call ends on its own: the event that proves it is its leaving the set.
  ASSERT_TRUE(Eventually([&] { return calls.running() == 0; }));
  EXPECT_EQ(ended.load(), 0);
}

TEST(WorkerCallsTest, ACallThatThrowsIsReportedAsAnInternalError) {
  WorkerCalls calls;
  std::atomic<bool> internal{false};
  ASSERT_TRUE(calls.Start(
      "k", []() -> Status { throw std::runtime_error("boom"); },
      [&](const Status& s) { internal = s.code() == StatusCode::kInternal; }));
  ASSERT_TRUE(Eventually([&] { return calls.running() == 0; }));
  EXPECT_TRUE(internal.load());
}

}  // namespace
}  // namespace tidal::controller
