// kube/leader.h — leader election on a coordination.k8s.io/v1 Lease, as client-go's
// tools/leaderelection (the operator runs as a Deployment with replicas > 1; one leads):
//  - a candidate acquires by creating the Lease, or by updating it when it is released
//    (empty holderIdentity) or expired; it then renews every retryPeriod and, if it cannot
//    renew within renewDeadline, stops leading at once;
//  - expiry is judged by the observer's own monotonic clock from when it last saw the record
//    change (client-go's observedTime), never by comparing renewTime with the local wall
//    clock, so clock skew between machines cannot hand the lease to two holders;
//  - writes are compare-and-swap on metadata.resourceVersion: a 409 means another candidate
//    won this round;
//  - on a clean Stop the leader releases (holderIdentity "", leaseDurationSeconds 1, as
//    ReleaseOnCancel) so a successor takes over at its next retry instead of after expiry.
// Safety rests on leaseDuration > renewDeadline: the leader gives up, measured from before
// its last successful renew was sent, strictly before any observer can consider it expired.
// DecideLease and ObserveLease are the pure decision (table-tested); LeaderElector runs them
// against a KubeClient on a thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/status.h"
#include "kube/client.h"
#include "kube/meta_time.h"

namespace tidal::kube {

// LeaseSpec as client-go's LeaderElectionRecord.
struct LeaderElectionRecord {
  std::string holder_identity;
  int64_t lease_duration_seconds = 0;
  std::string acquire_time;  // MicroTime
  std::string renew_time;    // MicroTime
  int64_t lease_transitions = 0;
  bool operator==(const LeaderElectionRecord&) const = default;
};
// From a Lease object's spec (absent fields are zero/empty).
LeaderElectionRecord RecordFromLease(const nlohmann::json& lease);
nlohmann::json LeaseSpecJson(const LeaderElectionRecord& record);

// What this candidate last saw, and when by its own monotonic clock.
struct LeaseObservation {
  std::optional<LeaderElectionRecord> record;
  Clock::TimePoint observed_time{};
};
// Records `seen` at `now` if it differs from what was observed (client-go compares the whole
// record): a holder that keeps renewing keeps moving observed_time forward.
void ObserveLease(LeaseObservation& observation, const LeaderElectionRecord& seen,
                  Clock::TimePoint now);

enum class LeaseAction {
  kCreate,   // no Lease yet: create it, holding it
  kAcquire,  // released or expired: take it over (a new holder: transitions + 1)
  kRenew,    // ours: refresh renewTime
  kWait,     // another holder's, not expired by our clock
};
const char* LeaseActionName(LeaseAction action);

struct LeaseDecision {
  LeaseAction action;
  LeaderElectionRecord record;  // what to write (unused for kWait)
};

// Pure. `current`: the Lease's record as just read (nullopt when there is no Lease);
// `observed_time`: when `current` was first seen in this form.
LeaseDecision DecideLease(const std::optional<LeaderElectionRecord>& current,
                          Clock::TimePoint observed_time, Clock::TimePoint now,
                          Clock::WallTime wall_now, const std::string& identity,
                          std::chrono::seconds lease_duration);

struct LeaderElectionConfig {
  // client-go / controller-runtime defaults.
  static constexpr std::chrono::milliseconds kDefaultLeaseDuration{15000};
  static constexpr std::chrono::milliseconds kDefaultRenewDeadline{10000};
  static constexpr std::chrono::milliseconds kDefaultRetryPeriod{2000};
  static constexpr double kJitterFactor = 1.2;  // client-go's JitterFactor for acquire retries

  std::string lease_namespace = "default";
  std::string lease_name;
  std::string identity;  // unique per candidate, e.g. pod name + "_" + a random suffix
  std::chrono::milliseconds lease_duration = kDefaultLeaseDuration;  // whole seconds are written
  std::chrono::milliseconds renew_deadline = kDefaultRenewDeadline;
  std::chrono::milliseconds retry_period = kDefaultRetryPeriod;
  bool release_on_cancel = true;

  // As client-go's NewLeaderElector: leaseDuration > renewDeadline > jitter · retryPeriod > 0,
  // an identity, a valid lease name.
  Status Validate() const;
};

// Run on the elector's thread, one at a time. They must not call Stop().
struct LeaderCallbacks {
  std::function<void()> on_started_leading;  // start the controllers; return promptly
  std::function<void()> on_stopped_leading;  // stop them now (leadership lost or released)
  std::function<void(const std::string& identity)> on_new_leader;  // any holder, self included
};

class LeaderElector {
 public:
  LeaderElector(KubeClient& client, LeaderElectionConfig config, LeaderCallbacks callbacks,
                std::shared_ptr<Clock> clock = RealClock::Get());
  ~LeaderElector();
  LeaderElector(const LeaderElector&) = delete;
  LeaderElector& operator=(const LeaderElector&) = delete;

  // Validates the config and starts one election term on a thread: acquire, lead, renew, until
  // leadership is lost or Stop() is called (as client-go's Run, it does not re-contend after a
  // loss: the operator exits and restarts, so controllers never run twice in one process).
  Status Start();
  // Ends the term: if leading, stops leading (callback), then releases the Lease when
  // release_on_cancel. Blocks until the thread has finished (at most one request timeout).
  void Stop();

  // Leading, and the last successful renew is younger than renewDeadline. Turns false at once
  // when the deadline passes, even while a renew request is still hanging.
  bool IsLeader() const;
  // The holder last observed ("" before the first read).
  std::string GetLeader() const;
  // The term has ended (lost, stopped, or never started).
  bool Finished() const { return finished_.load(); }

 private:
  struct Attempt {
    bool ok = false;
    Clock::TimePoint started{};  // before the request was sent
  };
  void Run();
  Attempt TryAcquireOrRenew();
  void Release();
  void ReportLeader();
  void StopLeading(const char* why);
  // Sleeps up to `d`; false when Stop() was requested.
  bool SleepFor(Clock::Duration d);
  Clock::Duration JitteredRetryPeriod();

  KubeClient& client_;
  const LeaderElectionConfig config_;
  const LeaderCallbacks callbacks_;
  const std::shared_ptr<Clock> clock_;

  mutable std::mutex mu_;  // guards the fields below and the stop flag's condition variable
  std::condition_variable wake_;
  bool stop_requested_ = false;
  LeaseObservation observation_;
  nlohmann::json lease_;  // as last read or written (for its resourceVersion)
  std::string reported_leader_;

  std::atomic<bool> leading_{false};
  std::atomic<int64_t> renewed_at_{0};  // Clock::TimePoint ticks of the last renew's start
  std::atomic<bool> finished_{true};
  std::thread thread_;
};

}  // namespace tidal::kube
