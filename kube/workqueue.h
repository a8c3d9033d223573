// kube/workqueue.h — the controller's rate-limited work queue, with the semantics of
// client-go's workqueue (k8s.io/client-go/util/workqueue) that controller-runtime builds on:
//  - keys ("namespace/name") are deduplicated: a key waiting in the queue is queued once,
//    however often it is added (the dirty set);
//  - a key being processed is never handed to a second worker: added again meanwhile, it is
//    queued again when the first worker calls Done (the processing set);
//  - AddAfter delays a key (an earlier deadline for the same key wins); AddAfterReplacing
//    sets its one deadline;
//  - AddRateLimited delays it by the rate limiter: by default the larger of a per-key
//    exponential backoff (5 ms doubling to 1000 s) and an overall token bucket (10 qps, burst
//    100), as client-go's DefaultControllerRateLimiter;
//  - ShutDown makes Add a no-op; Get hands out what is still queued, then returns nullopt.
// Time comes from an injected Clock, so the arithmetic is tested with a FakeClock. Delayed
// keys are moved into the queue by whichever call looks next (Get, Len), not by a thread of
// their own. Depends on common only.
#pragma once

#include <chrono>
#include <compare>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/clock.h"

namespace tidal::kube {

// How long a key must wait before it is retried (client-go's RateLimiter). Thread-safe.
class RateLimiter {
 public:
  virtual ~RateLimiter() = default;
  // The delay for this retry of `key`; counts it as a failure.
  virtual Clock::Duration When(const std::string& key) = 0;
  // The key succeeded: stop tracking it (its backoff starts again from the base).
  virtual void Forget(const std::string& key) = 0;
  // How many times When(key) was called since the last Forget(key).
  virtual int NumRequeues(const std::string& key) = 0;
};

// base · 2^failures, capped at max_delay (client-go ItemExponentialFailureRateLimiter).
class ItemExponentialFailureRateLimiter final : public RateLimiter {
 public:
  // client-go DefaultControllerRateLimiter's values.
  static constexpr Clock::Duration kDefaultBase = std::chrono::milliseconds(5);
  static constexpr Clock::Duration kDefaultMax = std::chrono::seconds(1000);

  explicit ItemExponentialFailureRateLimiter(Clock::Duration base = kDefaultBase,
                                             Clock::Duration max_delay = kDefaultMax)
      : base_(base), max_(max_delay) {}
  Clock::Duration When(const std::string& key) override;
  void Forget(const std::string& key) override;
  int NumRequeues(const std::string& key) override;

 private:
  const Clock::Duration base_, max_;
  std::mutex mu_;
  std::unordered_map<std::string, int> failures_;
};

// One token bucket shared by all keys (client-go BucketRateLimiter over golang.org/x/time/rate):
// `burst` retries pass at once, then one every 1/qps. Every call takes a token — reserving
// one in the future when the bucket is empty, so the delays of a burst line up 1/qps apart.
// Kept as a theoretical arrival time (GCRA) in integer nanoseconds: exact, no float drift.
class BucketRateLimiter final : public RateLimiter {
 public:
  static constexpr double kDefaultQps = 10;  // client-go DefaultControllerRateLimiter
  static constexpr int kDefaultBurst = 100;

  BucketRateLimiter(std::shared_ptr<Clock> clock, double qps = kDefaultQps,
                    int burst = kDefaultBurst);
  Clock::Duration When(const std::string& key) override;
  void Forget(const std::string&) override {}
  int NumRequeues(const std::string&) override { return 0; }

 private:
  const std::shared_ptr<Clock> clock_;
  const Clock::Duration interval_;   // 1/qps
  const Clock::Duration tolerance_;  // burst · interval: how far ahead the bucket may be drawn
  std::mutex mu_;
  std::optional<Clock::TimePoint> theoretical_arrival_;  // when the bucket is full again
};

// The longest delay of its limiters; every limiter sees every call (client-go MaxOfRateLimiter).
class MaxOfRateLimiter final : public RateLimiter {
 public:
  explicit MaxOfRateLimiter(std::vector<std::unique_ptr<RateLimiter>> limiters)
      : limiters_(std::move(limiters)) {}
  Clock::Duration When(const std::string& key) override;
  void Forget(const std::string& key) override;
  int NumRequeues(const std::string& key) override;

 private:
  std::vector<std::unique_ptr<RateLimiter>> limiters_;
};

// Max(per-key 5 ms·2^n ≤ 1000 s, bucket 10 qps burst 100): controller-runtime's default.
std::unique_ptr<RateLimiter> DefaultControllerRateLimiter(std::shared_ptr<Clock> clock);

class WorkQueue {
 public:
  // `limiter`: null for DefaultControllerRateLimiter(clock).
  explicit WorkQueue(std::shared_ptr<Clock> clock = RealClock::Get(),
                     std::unique_ptr<RateLimiter> limiter = nullptr);
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // Queues `key` unless it is queued already; a key being processed is queued on Done().
  void Add(const std::string& key);
  // Queues `key` once `delay` has passed (at once when delay ≤ 0). A key already waiting
  // keeps the earlier of its two deadlines.
  void AddAfter(const std::string& key, Clock::Duration delay);
  // A processed key's next timed look: queues `key` once `delay` has passed, replacing any
  // deadline it was waiting for, sooner or later (a reconcile that just ran knows best when the
  // clock alone may change what it does; a re-check an earlier pass asked for is moot).
  void AddAfterReplacing(const std::string& key, Clock::Duration delay);
  // AddAfter(key, limiter.When(key)).
  void AddRateLimited(const std::string& key);
  // Resets the key's failure count (call when it was processed successfully).
  void Forget(const std::string& key);
  int NumRequeues(const std::string& key);

  // Blocks until a key is ready, and marks it processing; nullopt once shut down and empty.
  std::optional<std::string> Get();
  // The worker is finished with `key` (which Get returned). Requeues it if it was added
  // while being processed.
  void Done(const std::string& key);

  // Keys ready to be handed out (not counting those processing or still delayed).
  size_t Len();
  // Keys whose delay has not yet passed.
  size_t NumWaiting();

  // No more adds (delayed keys are dropped); Get returns what is queued, then nullopt.
  void ShutDown();
  // ShutDown, then blocks until the queued keys were handed out and every one handed out is
  // Done (client-go ShutDownWithDrain): workers must keep calling Get/Done meanwhile.
  void ShutDownWithDrain();
  bool ShuttingDown();

 private:
  void AddLocked(const std::string& key);
  void PromoteReadyLocked(Clock::TimePoint now);

  const std::shared_ptr<Clock> clock_;
  const std::unique_ptr<RateLimiter> limiter_;
  std::mutex mu_;
  std::condition_variable cv_;                  // a key was queued, or shutdown
  std::condition_variable drained_;             // processing_ or queue_ shrank during a drain
  std::deque<std::string> queue_;               // ready keys, in order; each is also in dirty_
  std::unordered_set<std::string> dirty_;       // needs processing (queued or to be requeued)
  std::unordered_set<std::string> processing_;  // handed out, not Done yet
  // Delayed keys by deadline, then in the order they were added (FIFO among equal deadlines).
  struct Waiting {
    Clock::TimePoint deadline;
    uint64_t seq;
    std::string key;
    auto operator<=>(const Waiting&) const = default;
  };
  std::set<Waiting> waiting_;
  std::unordered_map<std::string, std::pair<Clock::TimePoint, uint64_t>> waiting_deadline_;
  uint64_t waiting_seq_ = 0;
  bool shutting_down_ = false;
};

}  // namespace tidal::kube
