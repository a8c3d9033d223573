// kube/workqueue.cc
#include "kube/workqueue.h"

#include <algorithm>

namespace tidal::kube {

Clock::Duration ItemExponentialFailureRateLimiter::When(const std::string& key) {
  int exp;
  {
    std::lock_guard<std::mutex> lock(mu_);
    exp = failures_[key]++;
  }
  // base · 2^exp without overflow: base · 2^exp > max  ⟺  base > ⌊max / 2^exp⌋.
  const int64_t base = base_.count(), max = max_.count();
  if (base <= 0) return Clock::Duration::zero();
  if (exp >= 62 || base > (max >> exp)) return max_;
  return Clock::Duration(base << exp);
}

void ItemExponentialFailureRateLimiter::Forget(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  failures_.erase(key);
}

int ItemExponentialFailureRateLimiter::NumRequeues(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = failures_.find(key);
  return it == failures_.end() ? 0 : it->second;
}

namespace {

Clock::Duration IntervalFor(double qps) {
  // A non-positive rate never refills: one interval longer than any delay that matters.
  if (!(qps > 0)) return std::chrono::hours(24 * 365);
  return std::chrono::duration_cast<Clock::Duration>(std::chrono::duration<double>(1.0 / qps));
}

}  // namespace

BucketRateLimiter::BucketRateLimiter(std::shared_ptr<Clock> clock, double qps, int burst)
    : clock_(std::move(clock)),
      interval_(IntervalFor(qps)),
      tolerance_(interval_ * std::max(burst, 0)) {}

Clock::Duration BucketRateLimiter::When(const std::string&) {
  const Clock::TimePoint now = clock_->Now();
  std::lock_guard<std::mutex> lock(mu_);
  // The bucket is "drawn" up to theoretical_arrival_; each token draws one more interval. The
  // part of the draw beyond burst·interval is the wait for this token.
  Clock::TimePoint tat = std::max(theoretical_arrival_.value_or(now), now) + interval_;
  theoretical_arrival_ = tat;
  Clock::Duration drawn = tat - now;
  return drawn > tolerance_ ? drawn - tolerance_ : Clock::Duration::zero();
}

Clock::Duration MaxOfRateLimiter::When(const std::string& key) {
  Clock::Duration longest = Clock::Duration::zero();
  for (auto& limiter : limiters_) longest = std::max(longest, limiter->When(key));
  return longest;
}

void MaxOfRateLimiter::Forget(const std::string& key) {
  for (auto& limiter : limiters_) limiter->Forget(key);
}

int MaxOfRateLimiter::NumRequeues(const std::string& key) {
  int most = 0;
  for (auto& limiter : limiters_) most = std::max(most, limiter->NumRequeues(key));
  return most;
}

std::unique_ptr<RateLimiter> DefaultControllerRateLimiter(std::shared_ptr<Clock> clock) {
  std::vector<std::unique_ptr<RateLimiter>> limiters;
  limiters.push_back(std::make_unique<ItemExponentialFailureRateLimiter>());
  limiters.push_back(std::make_unique<BucketRateLimiter>(std::move(clock)));
  return std::make_unique<MaxOfRateLimiter>(std::move(limiters));
}

WorkQueue::WorkQueue(std::shared_ptr<Clock> clock, std::unique_ptr<RateLimiter> limiter)
    : clock_(std::move(clock)),
      limiter_(limiter ? std::move(limiter) : DefaultControllerRateLimiter(clock_)) {}

void WorkQueue::AddLocked(const std::string& key) {
  if (shutting_down_) return;
  if (!dirty_.insert(key).second) return;  // already queued, or to be requeued on Done
  if (processing_.count(key)) return;
  queue_.push_back(key);
  cv_.notify_one();
}

void WorkQueue::PromoteReadyLocked(Clock::TimePoint now) {
  while (!waiting_.empty() && waiting_.begin()->deadline <= now) {
    std::string key = waiting_.begin()->key;
    waiting_.erase(waiting_.begin());
    waiting_deadline_.erase(key);
    AddLocked(key);
  }
}

void WorkQueue::Add(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  AddLocked(key);
}

void WorkQueue::AddAfter(const std::string& key, Clock::Duration delay) {
  if (delay <= Clock::Duration::zero()) return Add(key);
  const Clock::TimePoint deadline = clock_->Now() + delay;
  std::lock_guard<std::mutex> lock(mu_);
  if (shutting_down_) return;
  auto it = waiting_deadline_.find(key);
  if (it != waiting_deadline_.end()) {
    if (it->second.first <= deadline) return;  // already due sooner
    waiting_.erase({it->second.first, it->second.second, key});
    waiting_deadline_.erase(it);
  }
  const uint64_t seq = waiting_seq_++;
  waiting_deadline_.emplace(key, std::make_pair(deadline, seq));
  waiting_.insert({deadline, seq, key});
  cv_.notify_all();  // a Get waiting for a later deadline must wait less
}

void WorkQueue::AddAfterReplacing(const std::string& key, Clock::Duration delay) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = waiting_deadline_.find(key); it != waiting_deadline_.end()) {
      waiting_.erase({it->second.first, it->second.second, key});
      waiting_deadline_.erase(it);
    }
  }
  AddAfter(key, delay);
}

void WorkQueue::AddRateLimited(const std::string& key) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutting_down_) return;  // no failure counted for a key that will never run
  }
  AddAfter(key, limiter_->When(key));
}

void WorkQueue::Forget(const std::string& key) { limiter_->Forget(key); }

int WorkQueue::NumRequeues(const std::string& key) { return limiter_->NumRequeues(key); }

std::optional<std::string> WorkQueue::Get() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    PromoteReadyLocked(clock_->Now());
    if (!queue_.empty()) break;
    if (shutting_down_) return std::nullopt;
    if (waiting_.empty()) {
      cv_.wait(lock);
    } else {
      clock_->WaitUntil(cv_, lock, waiting_.begin()->deadline);
    }
  }
  std::string key = std::move(queue_.front());
  queue_.pop_front();
  processing_.insert(key);
  dirty_.erase(key);
  if (shutting_down_) drained_.notify_all();
  return key;
}

void WorkQueue::Done(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  if (processing_.erase(key) == 0) return;  // not handed out: nothing to finish
  if (dirty_.count(key)) {
    queue_.push_back(key);
    cv_.notify_one();
  }
  if (shutting_down_) drained_.notify_all();
}

size_t WorkQueue::Len() {
  std::lock_guard<std::mutex> lock(mu_);
  PromoteReadyLocked(clock_->Now());
  return queue_.size();
}

size_t WorkQueue::NumWaiting() {
  std::lock_guard<std::mutex> lock(mu_);
  PromoteReadyLocked(clock_->Now());
  return waiting_.size();
}

void WorkQueue::ShutDown() {
  std::lock_guard<std::mutex> lock(mu_);
  shutting_down_ = true;
  waiting_.clear();
  waiting_deadline_.clear();
  cv_.notify_all();
  drained_.notify_all();
}

void WorkQueue::ShutDownWithDrain() {
  ShutDown();
  std::unique_lock<std::mutex> lock(mu_);
  drained_.wait(lock, [&] { return queue_.empty() && processing_.empty(); });
}

bool WorkQueue::ShuttingDown() {
  std::lock_guard<std::mutex> lock(mu_);
  return shutting_down_;
}

}  // namespace tidal::kube
