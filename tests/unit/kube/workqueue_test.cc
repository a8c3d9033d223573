// The work queue against client-go's workqueue semantics: dedup, one worker per key, requeue
// on Done, delays, the exponential and token-bucket rate limiters (on a FakeClock), shutdown.
#include "kube/workqueue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <map>
#include <thread>

namespace tidal::kube {
namespace {

using namespace std::chrono_literals;

std::shared_ptr<FakeClock> NewFakeClock() { return std::make_shared<FakeClock>(); }

TEST(WorkQueue, DeduplicatesAKeyAddedManyTimes) {
  WorkQueue q(NewFakeClock());
  q.Add("default/a");
  q.Add("default/b");
  q.Add("default/a");
  q.Add("default/a");
  EXPECT_EQ(q.Len(), 2u);
  EXPECT_EQ(q.Get(), "default/a");
  EXPECT_EQ(q.Get(), "default/b");
  EXPECT_EQ(q.Len(), 0u);
}

TEST(WorkQueue, KeyAddedWhileProcessingIsRequeuedOnlyAfterDone) {
  WorkQueue q(NewFakeClock());
  q.Add("k");
  ASSERT_EQ(q.Get(), "k");
  q.Add("k");  // changed again while a worker is on it
  q.Add("k");
  EXPECT_EQ(q.Len(), 0u) << "must not be handed to a second worker while processing";
  q.Done("k");
  EXPECT_EQ(q.Len(), 1u);
  ASSERT_EQ(q.Get(), "k");
  q.Done("k");
  EXPECT_EQ(q.Len(), 0u) << "processed once more, not once per Add";
}

TEST(WorkQueue, DoneWithoutReAddDoesNotRequeue) {
  WorkQueue q(NewFakeClock());
  q.Add("k");
  ASSERT_EQ(q.Get(), "k");
  q.Done("k");
  EXPECT_EQ(q.Len(), 0u);
  q.Done("k");  // a second Done is harmless
  EXPECT_EQ(q.Len(), 0u);
}

// Several workers, few keys, many adds: no key is ever processed by two workers at once, and
// every key is processed at least once after its last Add (no update is lost).
TEST(WorkQueue, NeverProcessesOneKeyConcurrentlyAndLosesNoUpdate) {
  WorkQueue q(RealClock::Get());
  constexpr int kKeys = 4, kWorkers = 8, kAdds = 20000;
  std::atomic<int> in_flight[kKeys] = {};
  std::atomic<int> violations{0};
  std::atomic<int64_t> seq{0};
  std::atomic<int64_t> last_add[kKeys] = {};
  std::atomic<int64_t> last_start[kKeys] = {};
  std::atomic<int> processed{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < kWorkers; ++w) {
    workers.emplace_back([&] {
      while (auto key = q.Get()) {
        int i = std::stoi(*key);
        if (in_flight[i].fetch_add(1) != 0) ++violations;
        last_start[i] = ++seq;  // processing "reads the world" from here on
        std::this_thread::yield();
        in_flight[i].fetch_sub(1);
        ++processed;
        q.Done(*key);
      }
    });
  }
  for (int n = 0; n < kAdds; ++n) {
    int i = n % kKeys;
    last_add[i] = ++seq;  // "the world changed", then the key is added
    q.Add(std::to_string(i));
  }
  q.ShutDownWithDrain();
  for (auto& t : workers) t.join();
  EXPECT_EQ(violations.load(), 0);
  for (int i = 0; i < kKeys; ++i)
    EXPECT_GT(last_start[i].load(), last_add[i].load()) << "key " << i << " lost its last update";
  EXPECT_GE(processed.load(), kKeys);
  EXPECT_LE(processed.load(), kAdds);
}

TEST(WorkQueue, AddAfterQueuesOnceTheDelayHasPassedAndEarlierDeadlineWins) {
  auto clock = NewFakeClock();
  WorkQueue q(clock);
  q.AddAfter("a", 10s);
  q.AddAfter("a", 30s);  // later: ignored
  q.AddAfter("b", 20s);
  q.AddAfter("b", 5s);  // earlier: wins
  EXPECT_EQ(q.Len(), 0u);
  EXPECT_EQ(q.NumWaiting(), 2u);
  clock->Advance(5s);
  EXPECT_EQ(q.Len(), 1u);
  clock->Advance(4999ms);
  EXPECT_EQ(q.Len(), 1u);
  clock->Advance(1ms);
  EXPECT_EQ(q.Len(), 2u);
  EXPECT_EQ(q.Get(), "b");
  EXPECT_EQ(q.Get(), "a");
  clock->Advance(60s);
  EXPECT_EQ(q.Len(), 0u) << "the ignored later AddAfter must not queue it again";
  q.AddAfter("c", 0s);  // no delay: at once
  EXPECT_EQ(q.Len(), 1u);
}

// A reconcile's requeue: the pass that just ran sets the key's one timed look. A steady job's
// pass asks for one in minutes; a re-check in seconds an earlier pass asked for no longer wakes
// it (each such pass over a steady job asked every peer again).
TEST(WorkQueue, AddAfterReplacingSetsTheKeysOneDeadlineSoonerOrLater) {
  auto clock = NewFakeClock();
  WorkQueue q(clock);
  q.AddAfter("a", 5s);
  q.AddAfterReplacing("a", 600s);
  q.AddAfter("b", 600s);
  q.AddAfterReplacing("b", 1s);
  EXPECT_EQ(q.NumWaiting(), 2u);
  clock->Advance(1s);
  EXPECT_EQ(q.Len(), 1u);
  EXPECT_EQ(q.Get(), "b");
  q.Done("b");
  clock->Advance(10s);
  EXPECT_EQ(q.Len(), 0u) << "the replaced 5 s deadline must not queue it";
  clock->Advance(590s);
  EXPECT_EQ(q.Len(), 1u);
  EXPECT_EQ(q.Get(), "a");
  q.AddAfterReplacing("c", 0s);  // no delay: at once
  EXPECT_EQ(q.Len(), 1u);
}

TEST(WorkQueue, DelayedKeyAlreadyQueuedIsNotDuplicated) {
  auto clock = NewFakeClock();
  WorkQueue q(clock);
  q.Add("a");
  q.AddAfter("a", 1s);
  clock->Advance(1s);
  EXPECT_EQ(q.Len(), 1u);
}

TEST(WorkQueue, GetWaitsForADelayedKey) {
  auto clock = NewFakeClock();
  WorkQueue q(clock);
  q.AddAfter("a", 1s);
  auto got = std::async(std::launch::async, [&] { return q.Get(); });
  EXPECT_EQ(got.wait_for(50ms), std::future_status::timeout);
  clock->Advance(1s);
  ASSERT_EQ(got.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(got.get(), "a");
}

TEST(ItemExponentialFailureRateLimiter, DoublesFrom5msAndCapsAt1000s) {
  ItemExponentialFailureRateLimiter limiter;
  Clock::Duration expected = 5ms;
  for (int i = 0; i < 18; ++i) {  // 5 ms · 2^17 = 655.36 s, the last below the cap
    EXPECT_EQ(limiter.When("k"), expected) << "retry " << i;
    expected *= 2;
  }
  EXPECT_EQ(limiter.When("k"), Clock::Duration(1000s));
  for (int i = 0; i < 100; ++i) limiter.When("k");  // far past 2^63: still capped
  EXPECT_EQ(limiter.When("k"), Clock::Duration(1000s));
  EXPECT_EQ(limiter.NumRequeues("k"), 120);
  EXPECT_EQ(limiter.When("other"), Clock::Duration(5ms)) << "backoff is per key";
}

TEST(ItemExponentialFailureRateLimiter, ForgetResetsTheKey) {
  ItemExponentialFailureRateLimiter limiter;
  limiter.When("k");
  limiter.When("k");
  EXPECT_EQ(limiter.When("k"), Clock::Duration(20ms));
  EXPECT_EQ(limiter.NumRequeues("k"), 3);
  limiter.Forget("k");
  EXPECT_EQ(limiter.NumRequeues("k"), 0);
  EXPECT_EQ(limiter.When("k"), Clock::Duration(5ms));
}

TEST(BucketRateLimiter, PassesTheBurstThenOnePerInterval) {
  auto clock = NewFakeClock();
  BucketRateLimiter bucket(clock, 10, 100);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(bucket.When("k"), Clock::Duration::zero()) << i;
  EXPECT_EQ(bucket.When("k"), Clock::Duration(100ms));
  EXPECT_EQ(bucket.When("k"), Clock::Duration(200ms));
  clock->Advance(1s);  // refills 10 tokens, 2 of which the reservations above took
  EXPECT_EQ(bucket.When("k"), Clock::Duration::zero());
  for (int i = 0; i < 7; ++i) bucket.When("k");
  EXPECT_EQ(bucket.When("k"), Clock::Duration(100ms));
  clock->Advance(1000s);  // refills only up to the burst
  for (int i = 0; i < 100; ++i) ASSERT_EQ(bucket.When("k"), Clock::Duration::zero()) << i;
  EXPECT_EQ(bucket.When("k"), Clock::Duration(100ms));
}

TEST(WorkQueue, AddRateLimitedUsesThePerKeyBackoff) {
  auto clock = NewFakeClock();
  WorkQueue q(clock);
  q.AddRateLimited("k");
  EXPECT_EQ(q.Len(), 0u);
  clock->Advance(4ms);
  EXPECT_EQ(q.Len(), 0u);
  clock->Advance(1ms);
  ASSERT_EQ(q.Len(), 1u);
  ASSERT_EQ(q.Get(), "k");
  q.Done("k");
  q.AddRateLimited("k");  // second failure: 10 ms
  clock->Advance(9ms);
  EXPECT_EQ(q.Len(), 0u);
  clock->Advance(1ms);
  EXPECT_EQ(q.Len(), 1u);
  EXPECT_EQ(q.NumRequeues("k"), 2);
  q.Forget("k");
  EXPECT_EQ(q.NumRequeues("k"), 0);
}

// 150 distinct keys fail at once: the first 100 (the burst) wait only their 5 ms backoff, the
// rest come out at 10 per second.
TEST(WorkQueue, BucketLimitsABurstOfDistinctKeysToTenPerSecondAfterTheFirstHundred) {
  auto clock = NewFakeClock();
  WorkQueue q(clock);
  for (int i = 0; i < 150; ++i) q.AddRateLimited("key-" + std::to_string(i));
  EXPECT_EQ(q.Len(), 0u);
  clock->Advance(5ms);
  EXPECT_EQ(q.Len(), 100u);
  clock->Advance(50ms);  // t = 55 ms
  EXPECT_EQ(q.Len(), 100u);
  clock->Advance(50ms);  // t = 105 ms: key 100 was due at 100 ms
  EXPECT_EQ(q.Len(), 101u);
  clock->Advance(900ms);  // t = 1.005 s
  EXPECT_EQ(q.Len(), 110u);
  clock->Advance(1s);  // t = 2.005 s
  EXPECT_EQ(q.Len(), 120u);
  clock->Advance(3s);  // t = 5.005 s: the last (key 149) was due at 5 s
  EXPECT_EQ(q.Len(), 150u);
  for (int i = 0; i < 150; ++i) EXPECT_EQ(q.Get(), "key-" + std::to_string(i));
}

TEST(WorkQueue, ShutDownUnblocksGet) {
  WorkQueue q(RealClock::Get());
  auto got = std::async(std::launch::async, [&] { return q.Get(); });
  EXPECT_EQ(got.wait_for(50ms), std::future_status::timeout);
  q.ShutDown();
  ASSERT_EQ(got.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(got.get(), std::nullopt);
  EXPECT_TRUE(q.ShuttingDown());
}

TEST(WorkQueue, ShutDownUnblocksGetWaitingForADelayedKey) {
  WorkQueue q(RealClock::Get());
  q.AddAfter("later", 1h);
  auto got = std::async(std::launch::async, [&] { return q.Get(); });
  EXPECT_EQ(got.wait_for(50ms), std::future_status::timeout);
  q.ShutDown();
  ASSERT_EQ(got.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(got.get(), std::nullopt);
}

TEST(WorkQueue, AfterShutDownAddsAreIgnoredAndQueuedKeysDrain) {
  auto clock = NewFakeClock();
  WorkQueue q(clock);
  q.Add("a");
  q.AddAfter("delayed", 1s);
  q.ShutDown();
  q.Add("b");
  q.AddRateLimited("c");
  clock->Advance(2s);
  EXPECT_EQ(q.Len(), 1u);
  EXPECT_EQ(q.Get(), "a");
  EXPECT_EQ(q.Get(), std::nullopt);
  EXPECT_EQ(q.NumRequeues("c"), 0);
}

TEST(WorkQueue, ShutDownWithDrainWaitsForProcessingKeys) {
  WorkQueue q(RealClock::Get());
  q.Add("a");
  ASSERT_EQ(q.Get(), "a");
  q.Add("a");  // dirty: requeued on Done even during the drain
  auto drain = std::async(std::launch::async, [&] { q.ShutDownWithDrain(); });
  EXPECT_EQ(drain.wait_for(50ms), std::future_status::timeout);
  q.Done("a");
  EXPECT_EQ(drain.wait_for(50ms), std::future_status::timeout) << "a was requeued";
  ASSERT_EQ(q.Get(), "a");
  q.Done("a");
  ASSERT_EQ(drain.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(q.Get(), std::nullopt);
}

}  // namespace
}  // namespace tidal::kube
