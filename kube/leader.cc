// kube/leader.cc
#include "kube/leader.h"

#include <future>
#include <random>

#include "common/log.h"
#include "kube/meta_time.h"
#include "kube/request.h"

namespace tidal::kube {
namespace {

using nlohmann::json;

int64_t Ticks(Clock::TimePoint t) { return t.time_since_epoch().count(); }
Clock::TimePoint FromTicks(int64_t ticks) { return Clock::TimePoint(Clock::Duration(ticks)); }

// Whole seconds, rounded up: a lease never claims less than configured.
std::chrono::seconds CeilSeconds(std::chrono::milliseconds d) {
  return std::chrono::ceil<std::chrono::seconds>(d);
}

std::string StringAt(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

int64_t IntAt(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number_integer() ? it->get<int64_t>() : 0;
}

}  // namespace

LeaderElectionRecord RecordFromLease(const json& lease) {
  LeaderElectionRecord r;
  auto spec_it = lease.find("spec");
  if (spec_it == lease.end() || !spec_it->is_object()) return r;
  const json& spec = *spec_it;
  r.holder_identity = StringAt(spec, "holderIdentity");
  r.lease_duration_seconds = IntAt(spec, "leaseDurationSeconds");
  r.acquire_time = StringAt(spec, "acquireTime");
  r.renew_time = StringAt(spec, "renewTime");
  r.lease_transitions = IntAt(spec, "leaseTransitions");
  return r;
}

json LeaseSpecJson(const LeaderElectionRecord& r) {
  json spec = {{"holderIdentity", r.holder_identity},
               {"leaseDurationSeconds", r.lease_duration_seconds},
               {"leaseTransitions", r.lease_transitions}};
  if (!r.acquire_time.empty()) spec["acquireTime"] = r.acquire_time;
  if (!r.renew_time.empty()) spec["renewTime"] = r.renew_time;
  return spec;
}

void ObserveLease(LeaseObservation& observation, const LeaderElectionRecord& seen,
                  Clock::TimePoint now) {
  if (observation.record && *observation.record == seen) return;
  observation.record = seen;
  observation.observed_time = now;
}

const char* LeaseActionName(LeaseAction action) {
  switch (action) {
    case LeaseAction::kCreate:
      return "Create";
    case LeaseAction::kAcquire:
      return "Acquire";
    case LeaseAction::kRenew:
      return "Renew";
    case LeaseAction::kWait:
      return "Wait";
  }
  return "Unknown";
}

LeaseDecision DecideLease(const std::optional<LeaderElectionRecord>& current,
                          Clock::TimePoint observed_time, Clock::TimePoint now,
                          Clock::WallTime wall_now, const std::string& identity,
                          std::chrono::seconds lease_duration) {
  LeaderElectionRecord mine;
  mine.holder_identity = identity;
  mine.lease_duration_seconds = lease_duration.count();
  mine.acquire_time = mine.renew_time = FormatMicroTime(wall_now);
  if (!current) return {LeaseAction::kCreate, mine};
  if (current->holder_identity == identity) {
    mine.acquire_time = current->acquire_time;
    mine.lease_transitions = current->lease_transitions;
    return {LeaseAction::kRenew, mine};
  }
  // Another holder's lease lasts leaseDurationSeconds (its own claim) from when we saw it
  // change — by our clock. As client-go: expired once observedTime + duration ≤ now.
  const bool held = !current->holder_identity.empty() &&
                    observed_time + std::chrono::seconds(current->lease_duration_seconds) > now;
  if (held) return {LeaseAction::kWait, *current};
  mine.lease_transitions = current->lease_transitions + 1;
  return {LeaseAction::kAcquire, mine};
}

Status LeaderElectionConfig::Validate() const {
  if (identity.empty()) return InvalidArgument("leader election: identity must not be empty");
  TIDAL_RETURN_IF_ERROR(ValidateObjectName(lease_name).WithContext("leader election: lease name"));
  TIDAL_RETURN_IF_ERROR(
      ValidateObjectName(lease_namespace).WithContext("leader election: lease namespace"));
  if (retry_period <= std::chrono::milliseconds::zero())
    return InvalidArgument("leader election: retryPeriod must be > 0");
  if (lease_duration <= renew_deadline)
    return InvalidArgument("leader election: leaseDuration (" +
                           std::to_string(lease_duration.count()) +
                           " ms) must be greater than renewDeadline (" +
                           std::to_string(renew_deadline.count()) + " ms)");
  if (static_cast<double>(renew_deadline.count()) <=
      kJitterFactor * static_cast<double>(retry_period.count()))
    return InvalidArgument("leader election: renewDeadline (" +
                           std::to_string(renew_deadline.count()) +
                           " ms) must be greater than retryPeriod × 1.2 (" +
                           std::to_string(retry_period.count()) + " ms × 1.2)");
  return OkStatus();
}

LeaderElector::LeaderElector(KubeClient& client, LeaderElectionConfig config,
                             LeaderCallbacks callbacks, std::shared_ptr<Clock> clock)
    : client_(client),
      config_(std::move(config)),
      callbacks_(std::move(callbacks)),
      clock_(std::move(clock)) {}

LeaderElector::~LeaderElector() { Stop(); }

Status LeaderElector::Start() {
  TIDAL_RETURN_IF_ERROR(config_.Validate());
  std::lock_guard<std::mutex> lock(mu_);
  if (thread_.joinable() || stop_requested_)
    return FailedPrecondition("leader election: Start may be called once");
  finished_ = false;
  thread_ = std::thread([this] { Run(); });
  return OkStatus();
}

void LeaderElector::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_requested_ = true;
    wake_.notify_all();
  }
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

bool LeaderElector::IsLeader() const {
  if (!leading_.load()) return false;
  return clock_->Now() < FromTicks(renewed_at_.load()) + config_.renew_deadline;
}

std::string LeaderElector::GetLeader() const {
  std::lock_guard<std::mutex> lock(mu_);
  return observation_.record ? observation_.record->holder_identity : "";
}

bool LeaderElector::SleepFor(Clock::Duration d) {
  const Clock::TimePoint deadline = clock_->Now() + d;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_requested_ && clock_->Now() < deadline) clock_->WaitUntil(wake_, lock, deadline);
  return !stop_requested_;
}

Clock::Duration LeaderElector::JitteredRetryPeriod() {
  // client-go wait.JitterUntil: period + rand[0,1) · 1.2 · period.
  thread_local std::mt19937_64 rng{std::random_device{}()};
  double factor =
      1.0 + std::uniform_real_distribution<double>(0, 1)(rng) * LeaderElectionConfig::kJitterFactor;
  return std::chrono::duration_cast<Clock::Duration>(config_.retry_period * factor);
}

LeaderElector::Attempt LeaderElector::TryAcquireOrRenew() {
  Attempt attempt;
  attempt.started = clock_->Now();
  const auto fields = [&](const Status& s) {
    return json{{"lease", config_.lease_namespace + "/" + config_.lease_name},
                {"identity", config_.identity},
                {"error", s.message()}};
  };
  auto get =
      client_.Call(*GetRequest(Resource::Leases(), config_.lease_namespace, config_.lease_name));
  if (!get.ok() && get.status().code() != StatusCode::kNotFound) {
    LogWarn("leader election: cannot read the lease", fields(get.status()));
    return attempt;
  }
  const Clock::TimePoint now = clock_->Now();
  const Clock::WallTime wall = clock_->WallNow();
  std::optional<LeaderElectionRecord> current;
  Clock::TimePoint observed_time;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (get.ok()) {
      lease_ = *get;
      ObserveLease(observation_, RecordFromLease(lease_), now);
      current = observation_.record;
    }
    observed_time = observation_.observed_time;
  }
  LeaseDecision decision = DecideLease(current, observed_time, now, wall, config_.identity,
                                       CeilSeconds(config_.lease_duration));
  if (decision.action == LeaseAction::kWait) return attempt;

  json lease;
  StatusOr<Request> request = InvalidArgument("unset");
  if (decision.action == LeaseAction::kCreate) {
    lease = {{"apiVersion", "coordination.k8s.io/v1"},
             {"kind", "Lease"},
             {"metadata", {{"name", config_.lease_name}, {"namespace", config_.lease_namespace}}},
             {"spec", LeaseSpecJson(decision.record)}};
    request = CreateRequest(Resource::Leases(), config_.lease_namespace, lease);
  } else {
    lease = *get;  // metadata.resourceVersion makes the PUT a compare-and-swap
    lease["spec"] = LeaseSpecJson(decision.record);
    request =
        ReplaceRequest(Resource::Leases(), config_.lease_namespace, config_.lease_name, lease);
  }
  auto written = client_.Call(*request);
  if (!written.ok()) {
    // 409: another candidate created or updated it first — it won this round.
    if (written.status().code() != StatusCode::kAborted &&
        written.status().code() != StatusCode::kAlreadyExists)
      LogWarn(std::string("leader election: ") + LeaseActionName(decision.action) + " failed",
              fields(written.status()));
    return attempt;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    lease_ = *written;
    ObserveLease(observation_, RecordFromLease(lease_), clock_->Now());
  }
  attempt.ok = true;
  return attempt;
}

void LeaderElector::ReportLeader() {
  std::string holder;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!observation_.record) return;
    holder = observation_.record->holder_identity;
    if (holder.empty() || holder == reported_leader_) return;
    reported_leader_ = holder;
  }
  LogInfo("leader election: new leader",
          {{"lease", config_.lease_namespace + "/" + config_.lease_name}, {"leader", holder}});
  if (callbacks_.on_new_leader) callbacks_.on_new_leader(holder);
}

void LeaderElector::StopLeading(const char* why) {
  leading_ = false;
  LogInfo("leader election: stopped leading",
          {{"lease", config_.lease_namespace + "/" + config_.lease_name},
           {"identity", config_.identity},
           {"reason", why}});
  if (callbacks_.on_stopped_leading) callbacks_.on_stopped_leading();
}

void LeaderElector::Release() {
  auto get =
      client_.Call(*GetRequest(Resource::Leases(), config_.lease_namespace, config_.lease_name));
  if (!get.ok()) {
    LogWarn("leader election: cannot read the lease to release it",
            {{"lease", config_.lease_name}, {"error", get.status().message()}});
    return;
  }
  LeaderElectionRecord current = RecordFromLease(*get);
  if (current.holder_identity != config_.identity) return;  // expired and taken: not ours
  // As client-go's release(): no holder, a 1 s lease, the transition count kept.
  LeaderElectionRecord released;
  released.lease_duration_seconds = 1;
  released.acquire_time = released.renew_time = FormatMicroTime(clock_->WallNow());
  released.lease_transitions = current.lease_transitions;
  json lease = *get;
  lease["spec"] = LeaseSpecJson(released);
  auto put = client_.Call(
      *ReplaceRequest(Resource::Leases(), config_.lease_namespace, config_.lease_name, lease));
  if (!put.ok()) {
    LogWarn("leader election: release failed; the lease expires on its own",
            {{"lease", config_.lease_name}, {"error", put.status().message()}});
    return;
  }
  LogInfo("leader election: released the lease",
          {{"lease", config_.lease_namespace + "/" + config_.lease_name},
           {"identity", config_.identity}});
}

void LeaderElector::Run() {
  const auto stopping = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    return stop_requested_;
  };
  // Acquire: retry with jitter until we hold the lease or are stopped.
  bool acquired = false;
  while (!stopping()) {
    Attempt attempt = TryAcquireOrRenew();
    ReportLeader();
    if (attempt.ok) {
      renewed_at_ = Ticks(attempt.started);
      acquired = true;
      break;
    }
    if (!SleepFor(JitteredRetryPeriod())) break;
  }
  if (!acquired) {
    finished_ = true;
    return;
  }
  if (stopping()) {  // won the lease just as we were told to stop: give it back
    if (config_.release_on_cancel) Release();
    finished_ = true;
    return;
  }
  leading_ = true;
  LogInfo("leader election: started leading",
          {{"lease", config_.lease_namespace + "/" + config_.lease_name},
           {"identity", config_.identity}});
  if (callbacks_.on_started_leading) callbacks_.on_started_leading();

  // Renew every retryPeriod; give up as soon as renewDeadline has passed since the start of
  // the last successful renew, even while a request hangs.
  bool clean = false, lost_to_deadline = false;
  const char* why = "";
  while (true) {
    if (!SleepFor(config_.retry_period)) {
      clean = true;
      break;
    }
    const Clock::TimePoint deadline = FromTicks(renewed_at_.load()) + config_.renew_deadline;
    if (clock_->Now() >= deadline) {
      why = "renew deadline passed";
      lost_to_deadline = true;
      break;
    }
    std::future<Attempt> pending =
        std::async(std::launch::async, [this] { return TryAcquireOrRenew(); });
    bool stop = false, timed_out = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      while (pending.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
        if (stop_requested_) {
          stop = true;
          break;
        }
        if (clock_->Now() >= deadline) {
          timed_out = true;
          break;
        }
        // Woken by Stop(); otherwise re-check the attempt every few milliseconds.
        clock_->WaitUntil(wake_, lock,
                          std::min(deadline, clock_->Now() + std::chrono::milliseconds(5)));
      }
    }
    if (timed_out) {
      StopLeading("renew deadline passed during a renew request");
      // The request ends within its own timeout. Had it renewed after all, the lease would
      // name this process for another leaseDuration: hand it back (as client-go releases
      // after a failed renew when ReleaseOnCancel).
      if (pending.get().ok && config_.release_on_cancel) Release();
      finished_ = true;
      return;
    }
    Attempt attempt = pending.get();  // after a stop request, wait for the request in flight
    ReportLeader();
    if (attempt.ok) {
      renewed_at_ = Ticks(attempt.started);
    } else if (GetLeader() != config_.identity && !GetLeader().empty()) {
      why = "another candidate holds the lease";
      break;
    }
    if (stop) {
      clean = true;
      break;
    }
  }
  if (!clean) {
    StopLeading(why);
    // Release() re-reads the lease and clears it only if it still names this process.
    if (lost_to_deadline && config_.release_on_cancel) Release();
    finished_ = true;
    return;
  }
  // Clean shutdown: stop working first, then hand the lease over, so that no successor starts
  // while this process still acts as leader.
  StopLeading("stopped");
  if (config_.release_on_cancel) Release();
  finished_ = true;
}

}  // namespace tidal::kube
