// common/clock.h — time as an injected interface (STYLE.md rule 7): a monotonic clock for
// delays, deadlines and expiry, and a wall clock for the timestamps written into objects.
// RealClock is the system's; FakeClock moves only when a test advances it, so backoff,
// rate-limit and lease arithmetic is tested without sleeping. Header-only; std only.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>

namespace tidal {

class Clock {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  using Duration = std::chrono::steady_clock::duration;
  using WallTime = std::chrono::system_clock::time_point;

  virtual ~Clock() = default;
  // Monotonic: for delays, deadlines and expiry.
  virtual TimePoint Now() const = 0;
  // Calendar time: for timestamps that other processes read (renewTime, lastTimestamp).
  virtual WallTime WallNow() const = 0;
  // Blocks on `cv` (whose mutex `lock` holds) until notified or until Now() may have reached
  // `deadline`. May return early (spuriously): callers re-check their condition and Now().
  virtual void WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                         TimePoint deadline) const = 0;
};

class RealClock final : public Clock {
 public:
  // The process-wide instance (stateless; shared so that owners can hold a shared_ptr).
  static std::shared_ptr<Clock> Get() {
    static const std::shared_ptr<Clock> clock = std::make_shared<RealClock>();
    return clock;
  }
  TimePoint Now() const override { return std::chrono::steady_clock::now(); }
  WallTime WallNow() const override { return std::chrono::system_clock::now(); }
  void WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                 TimePoint deadline) const override {
    cv.wait_until(lock, deadline);
  }
};

// Starts at an arbitrary fixed point and moves only through Advance(). Waiters poll in short
// real-time steps, so a thread blocked in WaitUntil notices an Advance() without the clock
// having to know the waiter's mutex.
class FakeClock final : public Clock {
 public:
  FakeClock()
      : now_(TimePoint(std::chrono::hours(1000))),
        wall_(WallTime(std::chrono::seconds(1700000000))) {}
  TimePoint Now() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return now_;
  }
  WallTime WallNow() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return wall_;
  }
  void Advance(Duration d) {
    std::lock_guard<std::mutex> lock(mu_);
    now_ += d;
    wall_ += std::chrono::duration_cast<WallTime::duration>(d);
  }
  void WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                 TimePoint deadline) const override {
    if (Now() >= deadline) return;
    cv.wait_for(lock, std::chrono::milliseconds(1));
  }

 private:
  mutable std::mutex mu_;
  TimePoint now_;
  WallTime wall_;
};

}  // namespace tidal
