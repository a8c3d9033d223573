// operator/controller/reconcile.cc — Decide: deletion, invalid spec, terminal phases, suspend,
// failures, the rescale stages, then the planner's count; status and conditions last.
#include "operator/controller/reconcile.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <type_traits>

#include "operator/controller/children.h"
#include "operator/kube/meta_time.h"
#include "operator/planner/planner.h"

namespace tidal::controller {
namespace {

using nlohmann::json;
using Stage = RescaleState::Stage;
using PhaseEvent = planner::Event;
using planner::Phase;
using W = api::WorkerPhase;

constexpr auto kMaxBackoff = std::chrono::minutes(10);
constexpr auto kBackoffReset = std::chrono::minutes(10);
// How soon to ask again whether the workers of running new pods answer (a worker starts in
// about a second; asking at the general poll of 2 s added up to 2 s to every scale-up), or
// whether new members have read their state from their peers' memory.
constexpr std::chrono::milliseconds kWorkerStartPoll{250};

// "a, b, c"; each item followed by `suffix`.
std::string Join(const std::vector<std::string>& items, const std::string& suffix = "") {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : ", ") + s + suffix;
  return out;
}

template <typename T>
T Value(const json& j, const char* key, T fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    return fallback;
  }
}

// Sets a metav1.Condition, moving lastTransitionTime only when the status changes.
void SetCondition(JobStatus& st, const std::string& type, bool value, const std::string& reason,
                  const std::string& message, Clock::time_point now, int64_t observed) {
  const std::string status = value ? "True" : "False";
  for (Condition& c : st.conditions) {
    if (c.type != type) continue;
    if (c.status != status) c.last_transition_time = now;
    c.status = status;
    c.reason = reason;
    c.message = message;
    c.observed_generation = observed;
    return;
  }
  st.conditions.push_back({type, status, reason, message, now, observed});
}

}  // namespace

bool ConditionTrue(const JobStatus& st, const std::string& type) {
  for (const Condition& c : st.conditions)
    if (c.type == type) return c.status == "True";
  return false;
}

void MarkReconcileError(JobStatus& status, const std::string& message, Clock::time_point now,
                        int64_t observed_generation) {
  SetCondition(status, "Ready", false, "ReconcileError", message, now, observed_generation);
}

namespace {

bool ConditionIs(const JobStatus& st, const std::string& type, const std::string& reason) {
  for (const Condition& c : st.conditions)
    if (c.type == type) return c.reason == reason;
  return false;
}

class Decider {
 public:
  Decider(const Observed& o, const ReconcileOptions& options)
      : o_(o), options_(options), st_(plan_.status) {
    plan_.status = o.status;
    plan_.status.observed_generation = o.metadata_generation;
    for (const PodView& p : o.pods) pods_[p.name] = &p;
    ClampTimes();
  }

  Plan Run() {
    ForceDeleteStuck();
    if (o_.deleting) {
      if (st_.phase != Phase::kTerminating) Move(PhaseEvent::kDeleted, "the job is being deleted");
      Delete();
      return Finish();
    }
    if (const std::string why = StatusUnusable(); !why.empty()) {
      Hold(why);
      return std::move(plan_);
    }
    if (!o_.spec.ok()) {
      InvalidSpec();
      return Finish();
    }
    spec_ = &*o_.spec;
    if (ConditionIs(st_, "Ready", "InvalidSpec"))
      SetCondition(st_, "Ready", false, "SpecAccepted", "the spec is valid", o_.now,
                   o_.metadata_generation);
    if (st_.phase == Phase::kFailed) RetryAfterSpecEdit();
    if (st_.phase == Phase::kSucceeded || st_.phase == Phase::kFailed) return Finish();  // terminal
    EnsureChildren();
    if (spec_->suspend) {
      Suspend();
      return Finish();
    }
    if (st_.phase == Phase::kSuspended) {
      Move(PhaseEvent::kUnsuspend, "spec.suspend is false");
      Emit("Normal", "Unsuspended", "resuming from the newest checkpoint");
    }
    if (Succeeded()) return Finish();
    if (FailuresHandled()) return Finish();
    if (HeldForAnomaly()) return Finish();
    if (st_.rescale && LeavingMembersStopAScaleUp()) {
      st_.rescale.reset();
      NoChangeUnderWay("a member must leave first");
    }
    if (st_.rescale) {
      Advance();
    } else if (st_.members.empty()) {
      if (DataReady()) StartGeneration(/*recovery=*/st_.generation > 0);
    } else if (!MoveOffLeavingMembers()) {
      MaybeRescale();
    }
    CollectStrays();
    CollectPrepPods();
    return Finish();
  }

 private:
  // The waits the status holds are wall-clock times (a new leader must read them). A wall
  // clock stepped back (NTP, a restored VM) would lengthen each by the step: each is capped at
  // the longest it can be from now, and a start in the future is taken as now. After a step
  // back, a wait lasts at most its usual length; a step forward shortens waits, never
  // measures a failure (those are on the monotonic clock: unreachable_since, no_progress_for).
  void ClampTimes() {
    auto at_most = [this](std::optional<Clock::time_point>& t, Clock::duration longest) {
      if (t && *t > o_.now + longest) *t = o_.now + longest;
    };
    auto not_after_now = [this](std::optional<Clock::time_point>& t) {
      if (t && *t > o_.now) t = o_.now;
    };
    not_after_now(st_.last_membership_change);
    if (st_.rescale && st_.rescale->started > o_.now) st_.rescale->started = o_.now;
    if (st_.rescale) not_after_now(st_.rescale->prepare_asked);
    if (st_.data) not_after_now(st_.data->started);
    if (!o_.spec.ok()) return;
    const api::TrainingJobSpec& spec = *o_.spec;
    at_most(st_.restart_not_before, BackoffOf(spec, st_.restart_streak));
    at_most(st_.scale_up_not_before,
            std::chrono::seconds(
                std::max(spec.elastic.cooldown_seconds, spec.elastic.scale_up_timeout_seconds)));
    if (st_.data) at_most(st_.data->retry_not_before, BackoffOf(spec, st_.data->failures));
  }

  // --- the phase ------------------------------------------------------------------------
  // Every change of status.phase: through the transition table (planner/lifecycle.h), recorded
  // in the plan with why (the shell logs each, naming the job and generation). One the table
  // refuses leaves the phase as it was and is recorded as refused: a bug the simulator finds.
  void Move(PhaseEvent event, const std::string& reason) {
    PhaseChange change{st_.phase, st_.phase, event, reason, false};
    auto to = planner::Transition(st_.phase, event);
    if (to.ok())
      st_.phase = change.to = *to;
    else
      change.refused = true;
    plan_.phase_changes.push_back(std::move(change));
  }
  // A membership change stops the training (its barrier), or a scale-down starts.
  void StartScaling(const std::string& reason) {
    if (st_.phase != Phase::kScaling) Move(PhaseEvent::kRescaleStarted, reason);
  }
  // No change is under way: a Scaling left from one that was called off is over.
  void NoChangeUnderWay(const std::string& reason) {
    if (st_.phase == Phase::kScaling) Move(PhaseEvent::kRescaleAbandoned, reason);
  }
  // The new generation trains: the start, resume, rescale or recovery that led to it is done.
  void CompleteChange(const std::string& reason) {
    switch (st_.phase) {
      case Phase::kPending:
        Move(PhaseEvent::kWorkersReady, reason);
        break;
      case Phase::kRecovering:
        Move(PhaseEvent::kRecovered, reason);
        break;
      case Phase::kScaling:
        Move(PhaseEvent::kRescaleDone, reason);
        break;
      default:  // Running already, or Terminating: a deletion's drain saw a rendezvous through
        break;
    }
  }

  // --- observations -------------------------------------------------------------------
  const PodView* Pod(const std::string& name) const {
    auto it = pods_.find(name);
    return it == pods_.end() ? nullptr : it->second;
  }
  const WorkerReport* Report(const std::string& name) const {
    auto it = o_.reports.find(name);
    return it == o_.reports.end() ? nullptr : &it->second;
  }
  int64_t GpusPerPod() const { return spec_ ? spec_->elastic.gpus_per_pod : 1; }
  // restartPolicy's backoff before retry `n` (1, 2, …): backoffSeconds × 2^(n-1), at most
  // kMaxBackoff.
  std::chrono::seconds Backoff(int64_t n) const { return BackoffOf(*spec_, n); }
  static std::chrono::seconds BackoffOf(const api::TrainingJobSpec& spec, int64_t n) {
    return std::min<std::chrono::seconds>(
        std::chrono::seconds(spec.restart_policy.backoff_seconds
                             << std::clamp<int64_t>(n - 1, 0, 20)),
        kMaxBackoff);
  }

  struct Failure {
    std::string cause;       // "" when healthy
    bool pod_lost = false;   // the pod must be replaced; else its worker can rejoin
    bool permanent = false;  // the worker cannot use the spec: no restart helps
  };
  // Why `name` can no longer go on in generation `generation`. A worker that reports its
  // generation FAILED (a peer died, a collective timed out) is alive and rejoins the next one;
  // a failed, vanished, deleted or silent pod is replaced.
  Failure FailureOf(const std::string& name, int64_t generation) const {
    const PodView* pod = Pod(name);
    if (!pod) return {"pod " + name + " is gone", true};
    if (pod->phase == "Failed")
      return {"pod " + name + " failed" + (pod->reason.empty() ? "" : ": " + pod->reason), true};
    if (pod->deleting && !Serves(name, generation))
      return {"pod " + name + " is being deleted", true};
    if (const WorkerReport* r = Report(name)) {
      if (r->phase == W::kFailed && r->generation >= generation && generation > 0) {
        if (r->last_error_permanent)
          return {"worker " + name + " cannot start generation " + std::to_string(r->generation) +
                      ": " + r->last_error,
                  false, true};
        return {"worker " + name + " failed generation " + std::to_string(r->generation) + ": " +
                    r->last_error,
                false};
      }
      return {};
    }
    auto since = o_.unreachable_since.find(name);
    if (pod->phase == "Running" && since != o_.unreachable_since.end() &&
        o_.now - since->second > options_.unreachable_after)
      return {"worker " + name + " has not answered for " +
                  std::to_string(options_.unreachable_after.count()) + " s",
              true};
    return {};
  }
  // Its worker answers in `generation` and takes part in it (trains, checkpoints or holds).
  bool Serves(const std::string& name, int64_t generation) const {
    const WorkerReport* r = Report(name);
    return r && generation > 0 && r->generation == generation &&
           (r->phase == W::kRunning || r->phase == W::kCheckpointing || r->phase == W::kPaused);
  }
  // Why `name` must leave while its worker may still train ("" when it need not): its pod is
  // being deleted (an eviction, a drain, `kubectl delete pod`: the kubelet sent SIGTERM), or its
  // node is cordoned or tainted NoExecute.
  std::string LeaveNotice(const std::string& name) const {
    const PodView* pod = Pod(name);
    if (!pod) return "";
    if (pod->deleting) return "pod " + name + " is being deleted";
    return pod->node_notice.empty() ? "" : pod->node_notice + " (pod " + name + ")";
  }
  // A pod deleted on a node that stopped answering stays Terminating: no kubelet confirms that
  // its processes are gone. Once its grace period is over (deletionTimestamp), it is deleted
  // with grace 0, as Kubernetes' pod garbage collector does on a node that is gone, so that a
  // suspend or a deletion of the job is not held forever. The job is safe from a process that
  // may still run there: it left that generation, whose collectives can no longer complete,
  // and rank 0 commits a checkpoint only after every rank of its generation wrote its shard.
  void ForceDeleteStuck() {
    std::vector<std::string> stuck;
    std::string where;
    for (const PodView& p : o_.pods)
      if (p.deleting && p.node_lost && p.deletion_deadline && o_.now >= *p.deletion_deadline) {
        stuck.push_back(p.name);
        where += (where.empty() ? "" : ", ") + p.name + " on " + p.node;
      }
    if (stuck.empty()) return;
    const std::string why = where +
                            ": still terminating after the grace period on a node whose kubelet "
                            "does not answer; deleted without waiting for it";
    Do(Action::Kind::kForceDeletePods, stuck, why);
    Emit("Warning", "ForceDeleted", why);
  }
  // Why the status cannot be acted on ("" when it can): it does not read, or workers run a
  // generation it does not know. The status is written before any action, so no worker can
  // be ahead of it unless it was rolled back: restored from a backup (which drops status),
  // replaced by hand, or written by something else.
  std::string StatusUnusable() const {
    if (!o_.status_error.empty()) return "the status does not read: " + o_.status_error;
    const int64_t known =
        std::max(st_.generation, st_.rescale ? st_.rescale->target_generation : int64_t{0});
    for (const auto& [pod, r] : o_.reports)
      if (r.generation > known)
        return "worker " + pod + " runs generation " + std::to_string(r.generation) +
               " but the status knows generation " + std::to_string(known) +
               " at most (was it restored or replaced?)";
    return "";
  }
  // Acts on nothing: Ready=False (StatusUnreadable) says why and what to do, once as an Event.
  void Hold(const std::string& why) {
    const std::string message =
        why + ". The operator leaves this job's workers alone until its status reads and " +
        "agrees with them: fix or remove the field (kubectl patch trainingjob " + o_.name +
        " --subresource=status), or delete its worker pods (kubectl delete pods -l " + kJobLabel +
        "=" + JobLabelValue(o_.name) + ") to restart it from its newest checkpoint";
    if (!ConditionIs(st_, "Ready", "StatusUnreadable")) Emit("Warning", "StatusUnreadable", why);
    SetCondition(st_, "Ready", false, "StatusUnreadable", message, o_.now, o_.metadata_generation);
    plan_.conditions_only = true;
    plan_.requeue_after = std::chrono::minutes(1);  // an edit of the status or pods comes sooner
  }
  // Why the current generation counts as stalled ("" when it does not): every member
  // answers "training" in it, and the step has not moved for progressDeadlineSeconds.
  std::string Stall() const {
    const int64_t deadline = spec_->restart_policy.progress_deadline_seconds;
    if (deadline <= 0 || st_.rescale || st_.members.empty() || st_.phase != Phase::kRunning ||
        o_.no_progress_for.count() < deadline)
      return "";
    for (const std::string& m : st_.members) {
      const WorkerReport* r = Report(m);
      if (!r || r->phase != W::kRunning || r->generation != st_.generation) return "";
    }
    return "no step for " + std::to_string(o_.no_progress_for.count()) + " s at step " +
           std::to_string(st_.step) + " of generation " + std::to_string(st_.generation) +
           " while every worker answers (restartPolicy.progressDeadlineSeconds " +
           std::to_string(deadline) + ")";
  }
  // Ready to be sent a Rendezvous: the pod runs and its worker answers. A new worker waits
  // for its first generation; a survivor of a failed generation may still be finishing it (a
  // Rendezvous makes it leave).
  bool ReadyFor(const std::string& name) const {
    const PodView* pod = Pod(name);
    const WorkerReport* r = Report(name);
    return pod && pod->phase == "Running" && !pod->deleting && r && r->phase != W::kSucceeded;
  }

  // --- the parts of Run -----------------------------------------------------------------
  void InvalidSpec() {
    const std::string message = o_.spec.status().message();
    if (!ConditionIs(st_, "Ready", "InvalidSpec")) Emit("Warning", "InvalidSpec", message);
    SetCondition(st_, "Ready", false, "InvalidSpec", message, o_.now, o_.metadata_generation);
    plan_.requeue_after = std::chrono::minutes(5);  // a spec edit triggers a reconcile anyway
  }

  void EnsureChildren() {
    if (!o_.has_finalizer) Do(Action::Kind::kAddFinalizer);
    if (!o_.service_exists) Do(Action::Kind::kEnsureService);
    if (!o_.token_exists) Do(Action::Kind::kEnsureTokenSecret);
    if (!o_.spec_config_exists) Do(Action::Kind::kEnsureSpecConfig);
  }

  // Checkpoints the members (if a generation is training), then stops and deletes every pod.
  // Returns true once nothing runs any more.
  bool Drain(const std::string& why) {
    // A live rendezvous under way: the new generation is reading its state from the old one's
    // memory, which the store does not hold. It is seen through first (seconds), then
    // checkpointed to the store like any training generation.
    if (st_.rescale && st_.rescale->stage == Stage::kRendezvous &&
        !st_.rescale->state_peers.empty()) {
      Rendezvous();
      if (st_.rescale) {
        plan_.requeue_after = options_.poll;
        return false;
      }
    }
    std::vector<std::string> live;
    for (const std::string& m : st_.members)
      if (Report(m) && FailureOf(m, st_.generation).cause.empty()) live.push_back(m);
    const bool members_train =
        !st_.rescale || st_.rescale->stage == Stage::kBarrier ||
        (st_.rescale->stage == Stage::kWaitingForPods && !st_.rescale->recovery);
    const bool training = members_train && !live.empty() && live.size() == st_.members.size();
    if (training && !AllPaused(st_.members)) {
      Barrier(kEndOfGeneration, why);
      plan_.requeue_after = options_.poll;
      return false;
    }
    std::vector<std::string> all;
    for (const PodView& p : o_.pods)
      if (!p.deleting) all.push_back(p.name);
    if (!all.empty()) {
      Do(Action::Kind::kShutdown, all, why);
      Do(Action::Kind::kDeletePods, all, why);
    }
    st_.members.clear();
    st_.rescale.reset();
    return true;
  }

  void Delete() {
    if (!o_.has_finalizer) return;
    if (!Drain("the job is being deleted: final checkpoint")) return;
    Do(Action::Kind::kRemoveFinalizer);
    Emit("Normal", "FinalCheckpoint", "workers checkpointed and stopped; releasing the job");
  }

  void Suspend() {
    if (st_.phase == Phase::kSuspended) {
      Drain("suspended");
      return;
    }
    if (!Drain("suspend: checkpoint, then remove the workers")) return;
    // Suspended once the pods are gone: their GPUs are free then, and a resume right after
    // finds its slots and the capacity it had.
    if (!o_.pods.empty()) {
      st_.current_gpus = 0;  // no generation trains any more
      plan_.requeue_after = options_.poll;
      return;
    }
    Move(PhaseEvent::kSuspend, "spec.suspend: checkpointed at step " + std::to_string(st_.step));
    st_.current_gpus = 0;
    Emit("Normal", "Suspended",
         "checkpointed at step " + std::to_string(st_.step) + " and removed the workers");
  }

  bool Succeeded() {
    if (st_.members.empty()) return false;
    const PodView* rank0 = Pod(st_.members[0]);
    const WorkerReport* r = Report(st_.members[0]);
    if (!(rank0 && rank0->phase == "Succeeded") && !(r && r->phase == W::kSucceeded)) return false;
    Move(PhaseEvent::kFinished, "rank 0 finished training");
    st_.rescale.reset();
    if (spec_) st_.step = std::max(st_.step, spec_->train.optimization.max_steps);
    Emit("Normal", "Succeeded", "trained to step " + std::to_string(st_.step));
    return true;
  }

  // A member (or, during a rescale, an incoming member) failed: count the restart and plan the
  // recovery. True when it did.
  bool FailuresHandled() {
    std::vector<std::string> causes, survivors;
    // Whom to watch, and from which generation on a worker's FAILED counts: the members
    // joining a rendezvous at its generation; in a recovery, the survivors (FAILED at the old
    // generation is what they are expected to be) from the next one; else the current members.
    int64_t generation = st_.generation;
    std::vector<std::string> members = st_.members;
    if (st_.rescale && st_.rescale->stage == Stage::kRendezvous) {
      generation = st_.rescale->target_generation;
      members = st_.rescale->members;
    } else if (st_.rescale && st_.rescale->recovery) {
      generation = st_.rescale->target_generation;
      members.clear();
      for (const std::string& m : st_.rescale->members)
        if (std::find(st_.rescale->new_pods.begin(), st_.rescale->new_pods.end(), m) ==
            st_.rescale->new_pods.end())
          members.push_back(m);
    }
    std::vector<std::string> failed, permanent;
    std::vector<std::string> leaving;  // alive, but told to go: no survivor of a recovery
    for (const std::string& m : members) {
      const Failure f = FailureOf(m, generation);
      if (!f.cause.empty()) causes.push_back(f.cause);
      if (f.permanent) permanent.push_back(f.cause);
      if (f.cause.empty() && !LeaveNotice(m).empty())
        leaving.push_back(m);
      else
        (f.pod_lost ? failed : survivors).push_back(m);
    }
    failed.insert(failed.end(), leaving.begin(), leaving.end());
    if (causes.empty()) {
      const std::string stall = Stall();
      if (stall.empty()) return false;
      // A worker stuck outside a collective (a hung read, a deadlock) never fails on its own,
      // and one stuck rank holds every other in its next collective: which one is stuck
      // cannot be told, so the whole generation is replaced.
      causes = {stall};
      failed = members;
      survivors.clear();
      SetCondition(st_, "Stalled", true, "NoProgress", stall, o_.now, o_.metadata_generation);
      Emit("Warning", "Stalled", stall);
    }
    if (!permanent.empty()) {
      FailForConfiguration(Join(permanent));
      return true;
    }
    // A scale-up still waiting for its pods gives up first; recovery comes before growth.
    if (st_.rescale && st_.rescale->stage == Stage::kWaitingForPods &&
        !st_.rescale->new_pods.empty())
      Do(Action::Kind::kDeletePods, st_.rescale->new_pods, "recovery first");
    if (!failed.empty()) Do(Action::Kind::kDeletePods, failed, Join(causes));
    const std::string cause = Join(causes);
    if (st_.phase == Phase::kRecovering && st_.rescale &&
        st_.rescale->stage == Stage::kWaitingForPods) {
      // More of the same incident (the rest of a generation going down): one restart, one
      // backoff; the recovery goes on with who is left, replacing the rest.
      st_.rescale.reset();
      st_.members = survivors;
      Emit("Warning", "WorkerFailed", cause + " (the same recovery: not counted again)");
      StartGeneration(/*recovery=*/true);
      return true;
    }
    ++st_.restarts;
    // The backoff doubles with each restart of a streak; a failure more than kBackoffReset
    // after the one before starts a new streak (the kubelet resets CrashLoopBackOff after a
    // container ran 10 minutes). A job that failed often in its first hour does not wait ten
    // minutes for a failure a day later.
    if (st_.last_failure_time && o_.now - *st_.last_failure_time > kBackoffReset)
      st_.restart_streak = 0;
    ++st_.restart_streak;
    st_.last_failure = cause;
    st_.last_failure_time = o_.now;
    if (st_.restarts > spec_->restart_policy.max_restarts) {
      Fail("RestartsExhausted",
           "restart " + std::to_string(st_.restarts) + " would exceed maxRestarts " +
               std::to_string(spec_->restart_policy.max_restarts) + "; last failure: " + cause);
      Emit("Warning", "RestartsExhausted", st_.failure);
      return true;
    }
    const auto backoff = Backoff(st_.restart_streak);
    // The first restart of a streak that the survivors can take on alone from their memory
    // starts at once: it creates no pod and reads no store (a crash loop still meets the
    // backoff from the second restart on, and maxRestarts).
    const bool from_memory = !st_.rescale && generation == st_.generation &&
                             st_.restart_streak == 1 && SurvivorsGoOnFromMemory(survivors);
    if (from_memory)
      st_.restart_not_before.reset();
    else
      st_.restart_not_before = o_.now + backoff;
    Move(PhaseEvent::kWorkerFailed, cause);
    st_.rescale.reset();
    st_.members = survivors;  // the next generation starts from these
    // The old generation is over: survivors wait (Failed) for the next Rendezvous.
    st_.generation = std::max(st_.generation, generation);
    Emit("Warning", "WorkerFailed",
         cause + "; restart " + std::to_string(st_.restarts) + " of " +
             std::to_string(spec_->restart_policy.max_restarts) +
             (from_memory
                  ? " now, at the survivors' size from their memory"
                  : " in " + std::to_string(backoff.count()) + " s from the newest checkpoint"));
    StartGeneration(/*recovery=*/true);
    return true;
  }

  // The job stops for good (phase Failed): every pod goes, the reason stays in the status.
  void Fail(const std::string& reason, const std::string& failure) {
    Move(reason == "ConfigurationError" ? PhaseEvent::kConfigurationError
                                        : PhaseEvent::kRestartsExhausted,
         failure);
    st_.failure = failure;
    st_.failure_reason = reason;
    st_.rescale.reset();
    st_.restart_not_before.reset();
    std::vector<std::string> all;
    for (const PodView& p : o_.pods)
      if (!p.deleting) all.push_back(p.name);
    if (!all.empty()) {
      Do(Action::Kind::kShutdown, all, "the job failed");
      Do(Action::Kind::kDeletePods, all, "the job failed");
    }
    st_.members.clear();
    st_.current_gpus = 0;
  }

  // A worker cannot use the spec (it names the field): restarting cannot help, so no restart
  // is spent; the job waits in Failed until the spec is edited.
  void FailForConfiguration(const std::string& cause) {
    st_.failed_spec_generation = o_.metadata_generation;
    Fail("ConfigurationError", cause);
    Emit("Warning", "ConfigurationError",
         cause + "; no restart can fix this: edit the spec and the job starts again");
  }

  // A job failed on its configuration starts again once the spec changes (a new
  // metadata.generation), from the newest checkpoint with a fresh restart budget.
  void RetryAfterSpecEdit() {
    if (st_.failure_reason != "ConfigurationError" ||
        o_.metadata_generation <= st_.failed_spec_generation)
      return;
    Emit("Normal", "SpecChanged",
         "the spec changed (generation " + std::to_string(o_.metadata_generation) +
             ") after a configuration error: starting again from the newest checkpoint");
    Move(PhaseEvent::kSpecEdited,
         "the spec changed (generation " + std::to_string(o_.metadata_generation) + ")");
    st_.failure.clear();
    st_.failure_reason.clear();
    st_.restarts = 0;
    st_.restart_streak = 0;
    // The workers read the spec from a ConfigMap written once, so that every rank of every
    // generation trains on the same one; no worker runs now, so the edit reaches them all.
    Do(Action::Kind::kUpdateSpecConfig);
  }

  // The data phase (DataStatus): true once the token store for the current spec is ready and
  // checked; until then no worker is created. A prep pod per attempt
  // (<job>-prep-<key>-<attempt>): one that succeeded says where the store is; one whose
  // error only a spec edit can cure leaves the job Pending with Ready=False InvalidSpec (its
  // pod kept for `kubectl logs`); any other failure is retried after restartPolicy's backoff,
  // at most maxRestarts times.
  bool DataReady() {
    const std::string key = DataKey(o_.raw_spec);
    if (!st_.data || st_.data->key != key) {
      const bool said = std::any_of(plan_.events.begin(), plan_.events.end(),
                                    [](const Event& e) { return e.reason == "SpecChanged"; });
      if (st_.data && !said)
        Emit("Normal", "SpecChanged",
             "spec.model, spec.dataset or spec.lora changed: the data phase runs again");
      st_.data = DataStatus{};
      st_.data->key = key;
    }
    DataStatus& d = *st_.data;
    if (d.phase == "Ready") return true;
    if (d.phase == "Invalid") {
      plan_.requeue_after = std::chrono::minutes(5);  // a spec edit triggers a reconcile anyway
      return false;
    }
    if (d.phase == "Retrying" && d.retry_not_before && o_.now < *d.retry_not_before) {
      plan_.requeue_after =
          std::chrono::duration_cast<std::chrono::milliseconds>(*d.retry_not_before - o_.now);
      return false;
    }
    const std::string name = PrepPodName(o_.name, key, d.failures);
    const PrepPodView* pod = nullptr;
    for (const PrepPodView& p : o_.prep_pods)
      if (p.name == name && !p.deleting) pod = &p;
    plan_.requeue_after = options_.poll;
    if (!pod || pod->phase == "Pending" || pod->phase == "Running") {
      if (!pod) {
        // The prep pod reads the spec from the workers' ConfigMap: it gets this spec first (no
        // worker runs now; a new ConfigMap is created with it in this pass).
        const bool updating = std::any_of(plan_.actions.begin(), plan_.actions.end(), [](auto& a) {
          return a.kind == Action::Kind::kUpdateSpecConfig;
        });
        if (o_.spec_config_exists && !updating) Do(Action::Kind::kUpdateSpecConfig);
        Do(Action::Kind::kCreatePrepPod, {name}, "the data phase");
      }
      if (d.pod != name)
        Emit("Normal", "PreparingData",
             "tidal-prep in pod " + name + ": " + spec_->train.dataset.uri +
                 " to a token store, checked against the model");
      if (!d.started) d.started = o_.now;
      d.phase = "Preparing";
      d.pod = name;
      d.message = pod && !pod->reason.empty()
                      ? "pod " + name + ": " + pod->reason
                      : "tokenizing in pod " + name + " (kubectl logs " + name + " for progress)";
      return false;
    }
    const json result = json::parse(pod->message, nullptr, /*allow_exceptions=*/false);
    const bool answered = result.is_object();
    if (pod->phase == "Succeeded" && answered && result.contains("store") &&
        result["store"].is_string()) {
      d.phase = "Ready";
      d.store_uri = result["store"];
      d.samples = Value<int64_t>(result, "samples", 0);
      d.tokens = Value<int64_t>(result, "tokens", 0);
      d.reused = Value<bool>(result, "reused", false);
      d.retry_not_before.reset();
      d.message = std::to_string(d.samples) + " samples, " + std::to_string(d.tokens) +
                  " tokens in " + d.store_uri + (d.reused ? " (prepared before)" : "");
      Emit("Normal", "DataReady", d.message);
      Do(Action::Kind::kDeletePods, {name}, "the data phase is over");
      return true;
    }
    std::string error = answered ? Value<std::string>(result, "error", "") : "";
    if (error.empty())
      error = "prep pod " + name + " " + pod->phase +
              (pod->reason.empty() ? "" : " (" + pod->reason + ")") +
              (pod->message.empty() ? "" : ": " + pod->message);
    if (answered && Value<bool>(result, "invalidSpec", false)) {
      d.phase = "Invalid";
      d.message = error;
      Emit("Warning", "InvalidSpec", error);
      plan_.requeue_after = std::chrono::minutes(5);
      return false;
    }
    ++d.failures;
    d.message = error;
    Do(Action::Kind::kDeletePods, {name}, "retry the data phase");
    const int64_t max_restarts = spec_->restart_policy.max_restarts;
    if (d.failures > max_restarts) {
      Fail("RestartsExhausted", "the data phase failed " + std::to_string(d.failures) +
                                    " times (maxRestarts " + std::to_string(max_restarts) +
                                    "); last: " + error);
      Emit("Warning", "RestartsExhausted", st_.failure);
      return false;
    }
    const auto backoff = Backoff(d.failures);
    d.phase = "Retrying";
    d.retry_not_before = o_.now + backoff;
    plan_.requeue_after = backoff;
    Emit("Warning", "DataPreparationFailed",
         error + "; retry " + std::to_string(d.failures) + " of " + std::to_string(max_restarts) +
             " in " + std::to_string(backoff.count()) + " s");
    return false;
  }

  // Prep pods of an earlier spec or attempt go; the current one stays while it runs (or, on an
  // invalid spec, for its logs).
  void CollectPrepPods() {
    std::set<std::string> deleting;
    for (const Action& a : plan_.actions)
      if (a.kind == Action::Kind::kDeletePods) deleting.insert(a.pods.begin(), a.pods.end());
    std::vector<std::string> stale;
    for (const PrepPodView& p : o_.prep_pods) {
      const bool current = st_.data && st_.data->phase != "Ready" && st_.data->pod == p.name;
      if (!current && !p.deleting && !deleting.count(p.name)) stale.push_back(p.name);
    }
    if (!stale.empty()) Do(Action::Kind::kDeletePods, stale, "not the current data phase");
  }

  // Creates the pods of the next generation (survivors kept): the initial start, a restart
  // after suspend, or a recovery.
  void StartGeneration(bool recovery) {
    if (st_.restart_not_before && o_.now < *st_.restart_not_before) {
      plan_.requeue_after =
          std::chrono::duration_cast<std::chrono::milliseconds>(*st_.restart_not_before - o_.now);
      if (!st_.rescale) {  // record the pending recovery so status says what it waits for
        RescaleState r;
        r.stage = Stage::kWaitingForPods;
        r.target_generation = st_.generation + 1;
        r.members = st_.members;
        r.recovery = true;
        r.started = *st_.restart_not_before;
        r.reason = "recovery after backoff";
        st_.rescale = r;
      }
      return;
    }
    if (recovery && SurvivorsGoOnFromMemory(st_.members)) {
      RescaleState r;
      r.stage = Stage::kRendezvous;
      r.target_generation = st_.generation + 1;
      r.members = st_.members;
      r.recovery = true;
      r.started = o_.now;
      r.reason = "recovery at the survivors' " + std::to_string(st_.members.size() * GpusPerPod()) +
                 " GPUs from their memory (the lost GPUs come back by a live scale-up)";
      st_.rescale = r;
      st_.restart_not_before.reset();
      Rendezvous();
      return;
    }
    const int64_t held = static_cast<int64_t>(st_.members.size()) * GpusPerPod();
    const auto decision =
        planner::DesiredGpus(*spec_, {held, std::nullopt}, {o_.idle_gpus}, o_.now);
    st_.desired_gpus = decision.desired;
    st_.gpus_reason = decision.reason;
    int64_t want_pods = decision.desired / GpusPerPod();
    std::vector<std::string> members = st_.members;
    if (static_cast<int64_t>(members.size()) > want_pods) members.resize(want_pods);
    std::set<int> used;
    for (const PodView& p : o_.pods) used.insert(p.slot);
    std::vector<int> slots;
    std::vector<std::string> created;
    for (int slot = 0; static_cast<int64_t>(members.size()) < want_pods; ++slot) {
      const std::string name = o_.name + "-worker-" + std::to_string(slot);
      if (std::find(members.begin(), members.end(), name) != members.end()) continue;
      const PodView* existing = Pod(name);
      if (existing &&
          (existing->deleting || existing->phase == "Failed" || existing->phase == "Succeeded"))
        continue;  // still going away: take another slot
      if (!existing) {
        slots.push_back(slot);
        created.push_back(name);
      }
      members.push_back(name);
    }
    RescaleState r;
    r.stage = Stage::kWaitingForPods;
    r.target_generation = st_.generation + 1;
    r.members = members;
    r.new_pods = created;
    r.recovery = recovery || st_.generation == 0;
    r.started = o_.now;
    r.reason = recovery
                   ? "recovery at " + std::to_string(decision.desired) + " GPUs"
                   : "start at " + std::to_string(decision.desired) + " GPUs: " + decision.reason;
    st_.rescale = r;
    st_.restart_not_before.reset();
    if (!slots.empty()) {
      Action& a = Do(Action::Kind::kCreatePods, created, r.reason);
      a.slots = slots;
      a.generation = r.target_generation;
      Emit("Normal", "CreatingWorkers",
           std::to_string(slots.size()) + " worker pod(s) for generation " +
               std::to_string(r.target_generation) + " (" + r.reason + ")");
    }
    plan_.requeue_after = options_.poll;
  }

  void MaybeRescale() {
    const int64_t held = static_cast<int64_t>(st_.members.size()) * GpusPerPod();
    const auto decision =
        planner::DesiredGpus(*spec_, {held, st_.last_membership_change}, {o_.idle_gpus}, o_.now);
    st_.desired_gpus = decision.desired;
    st_.gpus_reason = decision.reason;
    NoChangeUnderWay("no membership change under way");
    if (decision.desired == held) return;
    if (decision.desired > held && st_.scale_up_not_before && o_.now < *st_.scale_up_not_before) {
      st_.gpus_reason = decision.reason + "; holding after an abandoned scale-up until " +
                        kube::FormatTime(*st_.scale_up_not_before);
      return;
    }
    RescaleState r;
    r.target_generation = st_.generation + 1;
    r.started = o_.now;
    r.reason = "scale " + std::to_string(held) + " -> " + std::to_string(decision.desired) +
               " GPUs: " + decision.reason;
    const int64_t want_pods = decision.desired / GpusPerPod();
    if (decision.desired < held) {  // scale down: the first ranks stay, once prepared
      r.stage = Stage::kWaitingForPods;
      r.members.assign(st_.members.begin(), st_.members.begin() + want_pods);
      StartScaling(r.reason);
      st_.rescale = r;
      Emit("Normal", "ScalingDown", r.reason);
      Advance();
      return;
    }
    r.stage = Stage::kWaitingForPods;
    r.members = st_.members;
    const std::vector<int> slots =
        AddNewPods(r, want_pods - static_cast<int64_t>(r.members.size()));
    st_.rescale = r;
    Action& a = Do(Action::Kind::kCreatePods, r.new_pods, r.reason);
    a.slots = slots;
    a.generation = r.target_generation;
    Emit("Normal", "ScalingUp",
         r.reason + "; creating " + std::to_string(slots.size()) + " pod(s), training goes on");
  }

  // A member told to leave since the change began (its pod deleted, its node cordoned or
  // tainted) is left out of the next generation when the others are still an allowed size: it
  // stays a state peer, and goes once the new generation runs. (Else it joins, and is moved off
  // on its own after.)
  void DropLeavingMembers(RescaleState& r) {
    std::vector<std::string> staying;
    std::string why;
    for (const std::string& m : r.members) {
      const std::string notice = LeaveNotice(m);
      if (notice.empty())
        staying.push_back(m);
      else
        why += (why.empty() ? "" : "; ") + notice;
    }
    if (staying.size() == r.members.size() || staying.empty()) return;
    const int64_t gpus = static_cast<int64_t>(staying.size()) * GpusPerPod();
    const auto allowed = spec_->AllowedGpuCounts();
    if (std::find(allowed.begin(), allowed.end(), gpus) == allowed.end()) return;
    r.members = staying;
    r.drain = true;
    r.reason += "; without the pod(s) that must leave: " + why;
    Emit("Normal", "MovingOff",
         why + ": left out of generation " + std::to_string(r.target_generation));
  }

  // Adds `n` new pods to a change under way (members and new_pods), in the lowest slots no pod
  // of the job holds (a terminating one included: its name is still taken, and so is one this
  // plan deletes). Returns the slots.
  std::vector<int> AddNewPods(RescaleState& r, int64_t n) const {
    std::set<int> used;
    for (const PodView& p : o_.pods) used.insert(p.slot);
    const std::string prefix = o_.name + "-worker-";
    for (const Action& a : plan_.actions)
      if (a.kind == Action::Kind::kDeletePods)
        for (const std::string& p : a.pods)
          if (p.rfind(prefix, 0) == 0) used.insert(std::atoi(p.c_str() + prefix.size()));
    std::vector<int> slots;
    for (int slot = 0; static_cast<int64_t>(slots.size()) < n; ++slot) {
      if (used.count(slot)) continue;
      slots.push_back(slot);
      const std::string name = o_.name + "-worker-" + std::to_string(slot);
      r.members.push_back(name);
      r.new_pods.push_back(name);
    }
    return slots;
  }

  // The members that must leave while their workers still train in the current generation,
  // and why (LeaveNotice).
  std::vector<std::string> LeavingMembers(std::string* why = nullptr) const {
    std::vector<std::string> leaving;
    for (const std::string& m : st_.members) {
      const std::string notice = LeaveNotice(m);
      if (notice.empty() || !Serves(m, st_.generation)) continue;
      leaving.push_back(m);
      if (why) *why += (why->empty() ? "" : "; ") + notice;
    }
    return leaving;
  }

  // A rescale still waiting for its pods (or its members' reads ahead) when a member must leave
  // gives way: its pods are deleted and the move off comes first (its GPUs are planned again
  // after it).
  bool LeavingMembersStopAScaleUp() {
    const RescaleState& r = *st_.rescale;
    if (r.stage != Stage::kWaitingForPods || r.recovery || r.drain || LeavingMembers().empty())
      return false;
    if (!r.new_pods.empty()) Do(Action::Kind::kDeletePods, r.new_pods, "a member must leave first");
    Emit("Normal", r.new_pods.empty() ? "ScaleDownCancelled" : "ScaleUpCancelled",
         "a member must leave first: " + r.reason);
    return true;
  }

  // Members that must leave (LeaveNotice) while their workers train are moved off live, before
  // their pods go: a live scale-down to the others when those are an allowed size (the GPUs come
  // back elsewhere by a scale-up, with no cooldown), else replacements first where idle GPUs
  // allow (make before break); with neither, training goes on until the pod goes, and the
  // recovery from buddy copies takes over. True when it acted (or holds for want of GPUs).
  bool MoveOffLeavingMembers() {
    std::string why;
    const std::vector<std::string> leaving = LeavingMembers(&why);
    if (leaving.empty()) return false;
    std::vector<std::string> stay;
    for (const std::string& m : st_.members)
      if (std::find(leaving.begin(), leaving.end(), m) == leaving.end()) stay.push_back(m);
    const int64_t held = static_cast<int64_t>(st_.members.size()) * GpusPerPod();
    const int64_t stay_gpus = static_cast<int64_t>(stay.size()) * GpusPerPod();
    const auto allowed = spec_->AllowedGpuCounts();
    RescaleState r;
    r.target_generation = st_.generation + 1;
    r.started = o_.now;
    r.drain = true;
    if (!stay.empty() && std::find(allowed.begin(), allowed.end(), stay_gpus) != allowed.end()) {
      r.stage = Stage::kBarrier;
      r.members = stay;
      r.reason = why + ": scale " + std::to_string(held) + " -> " + std::to_string(stay_gpus) +
                 " GPUs live, off the leaving pod(s)";
      StartScaling(r.reason);
      st_.rescale = r;
      Emit("Normal", "MovingOff",
           r.reason + "; their GPUs come back elsewhere by a scale-up once there are any");
      Advance();
      return true;
    }
    // The others alone are too few: as many new pods as leave, on GPUs that are idle now (and
    // not again before the hold after an abandoned attempt is over).
    const int64_t need = static_cast<int64_t>(leaving.size()) * GpusPerPod();
    const bool holding = st_.scale_up_not_before && o_.now < *st_.scale_up_not_before;
    if (o_.idle_gpus < need || holding) {
      const std::string blocked =
          why + ": no move off is possible: the others' " + std::to_string(stay_gpus) +
          " GPUs are not an allowed size and " + std::to_string(need) +
          " idle GPUs for replacements are not there (" + std::to_string(o_.idle_gpus) + " are" +
          (holding ? ", or a replacement was just abandoned" : "") + "); training goes on";
      if (st_.gpus_reason != blocked) Emit("Warning", "MoveOffBlocked", blocked);
      st_.gpus_reason = blocked;
      NoChangeUnderWay(blocked);
      plan_.requeue_after = options_.poll;
      return true;
    }
    r.stage = Stage::kWaitingForPods;
    r.members = stay;
    const std::vector<int> slots = AddNewPods(r, static_cast<int64_t>(leaving.size()));
    r.reason = why + ": " + std::to_string(r.new_pods.size()) +
               " replacement pod(s) first, then a live rescale off the leaving pod(s)";
    st_.rescale = r;
    Action& a = Do(Action::Kind::kCreatePods, r.new_pods, r.reason);
    a.slots = slots;
    a.generation = r.target_generation;
    Emit("Normal", "MovingOff", r.reason + "; training goes on meanwhile");
    plan_.requeue_after = options_.poll;
    return true;
  }

  // The anomaly rule (spec.anomaly, planner/anomaly.h) over the members' newest steps: an
  // Event and the LossAnomaly condition for a rise; with action Pause, the members are
  // checkpointed and held (phase Paused) until acknowledgedStep reaches the rise's last step.
  // True while the job is held: nothing else (no rescale) happens meanwhile.
  bool HeldForAnomaly() {
    if (!spec_->anomaly) {
      st_.anomaly.reset();
      if (st_.phase == Phase::kPaused) ResumeFromAnomaly("spec.anomaly was removed");
      return false;
    }
    if (st_.rescale || st_.members.empty()) return false;
    const api::AnomalySpec& rule = *spec_->anomaly;
    AnomalyStatus& a = st_.anomaly ? *st_.anomaly : st_.anomaly.emplace();
    // Every member's steps: the loss is the job's (the same on every rank); a step's GPU
    // utilisation is the busiest member's, so the clause holds only when all GPUs idle.
    std::map<int64_t, planner::StepSample> steps;
    bool utilization_reported = false;
    for (const std::string& m : st_.members) {
      const WorkerReport* r = Report(m);
      if (!r) continue;
      for (const planner::StepSample& s : r->recent_steps) {
        auto [it, fresh] = steps.try_emplace(s.step, s);
        if (!s.gpu_utilization_percent) continue;
        utilization_reported = true;
        auto& util = it->second.gpu_utilization_percent;
        if (!fresh) util = std::max(util.value_or(0), *s.gpu_utilization_percent);
      }
    }
    std::vector<planner::StepSample> samples;
    for (const auto& [step, sample] : steps) samples.push_back(sample);
    if (!samples.empty()) {
      a.rule = planner::DescribeRule(rule, utilization_reported);
      a.checked_step = std::max(a.checked_step, samples.back().step);
    } else if (a.rule.empty()) {
      a.rule = planner::DescribeRule(rule, false);
    }
    // A held job's rise is the one it was paused for (the steps trained before the pause
    // took hold go on rising): nothing new to find until it resumes.
    const int64_t after = std::max(rule.acknowledged_step, a.step.value_or(0));
    std::optional<planner::LossAnomaly> found;
    if (!a.paused) found = planner::FindLossAnomaly(samples, rule, after);
    if (found) {
      // With action Alert, a rise that goes on past the step already reported is the same one.
      const bool continuing = rule.action != "Pause" && a.step && found->first_step <= *a.step &&
                              ConditionTrue(st_, "LossAnomaly");
      a.step = found->last_step;
      a.message = found->message;
      a.time = o_.now;
      a.paused = rule.action == "Pause";
      if (continuing) return false;
      std::string message = found->message;
      if (a.paused)
        message += "; checkpointed and paused: resume with kubectl patch trainingjob " + o_.name +
                   " --type merge -p '{\"spec\":{\"anomaly\":{\"acknowledgedStep\":" +
                   std::to_string(found->last_step) + "}}}'";
      SetCondition(st_, "LossAnomaly", true, "LossRising", message, o_.now, o_.metadata_generation);
      Emit("Warning", "LossAnomaly", message);
    } else if (ConditionIs(st_, "LossAnomaly", "LossRising") && !a.paused && a.step &&
               a.checked_step >= *a.step + rule.consecutive_steps) {
      SetCondition(st_, "LossAnomaly", false, "NoLongerRising",
                   "no rise since step " + std::to_string(*a.step), o_.now, o_.metadata_generation);
    }
    if (!a.paused) {
      if (st_.phase == Phase::kPaused) ResumeFromAnomaly("the anomaly no longer pauses the job");
      return false;
    }
    if (rule.action != "Pause" || (a.step && rule.acknowledged_step >= *a.step)) {
      ResumeFromAnomaly(rule.action != "Pause"
                            ? "spec.anomaly.action is no longer Pause"
                            : "acknowledgedStep " + std::to_string(rule.acknowledged_step));
      return true;
    }
    if (st_.phase != Phase::kPaused) {
      Emit("Normal", "Pausing", "checkpointing every rank, then holding: " + a.message);
      Move(PhaseEvent::kAnomalyPause, a.message);
    }
    plan_.requeue_after = options_.poll;
    if (!AllPaused(st_.members)) Barrier(static_cast<uint64_t>(a.step.value_or(0)), "loss anomaly");
    return true;
  }

  void ResumeFromAnomaly(const std::string& why) {
    if (st_.anomaly) {
      // The steps trained between the rise and the pause were there to see: only rises that
      // end after them can pause the job again.
      AnomalyStatus& a = *st_.anomaly;
      a.paused = false;
      if (a.step) a.step = std::max(*a.step, a.checked_step);
    }
    if (ConditionIs(st_, "LossAnomaly", "LossRising"))
      SetCondition(st_, "LossAnomaly", false, "Acknowledged", why, o_.now, o_.metadata_generation);
    std::vector<std::string> paused;
    for (const std::string& m : st_.members)
      if (const WorkerReport* r = Report(m); r && r->phase == W::kPaused) paused.push_back(m);
    if (!paused.empty()) Do(Action::Kind::kResume, paused, why);
    if (st_.phase == Phase::kPaused) Move(PhaseEvent::kUnpause, why);
    Emit("Normal", "Resumed", "training goes on: " + why);
    plan_.requeue_after = options_.poll;
  }

  // Every one of `names` holds at one step with a checkpoint of it: in the store, or with
  // `live_ok` in its memory.
  bool AllPaused(const std::vector<std::string>& names, bool live_ok = false) const {
    std::optional<int64_t> step;
    for (const std::string& n : names) {
      const WorkerReport* r = Report(n);
      if (!r || r->phase != W::kPaused) return false;
      const bool stored = r->checkpoint_step && *r->checkpoint_step == r->step;
      const bool live = live_ok && r->live_step && *r->live_step == r->step;
      if (!stored && !live) return false;
      if (step && *step != r->step) return false;
      step = r->step;
    }
    return !names.empty();
  }

  void Advance() {
    RescaleState& r = *st_.rescale;
    switch (r.stage) {
      case Stage::kWaitingForPods: {
        if (st_.restart_not_before) {
          StartGeneration(true);  // waits out the backoff, then creates the pods
          return;
        }
        // Pods the status says were created but are not there (the creating leader died, or
        // its create failed): create them again, under the same names.
        std::vector<std::string> missing;
        std::vector<int> slots;
        const std::string prefix = o_.name + "-worker-";
        for (const std::string& p : r.new_pods)
          if (!Pod(p) && p.rfind(prefix, 0) == 0) {
            missing.push_back(p);
            slots.push_back(std::atoi(p.c_str() + prefix.size()));
          }
        if (!missing.empty()) {
          Action& a = Do(Action::Kind::kCreatePods, missing, r.reason);
          a.slots = slots;
          a.generation = r.target_generation;
        }
        bool ready = true, all_running = true;
        std::vector<std::string> waiting;
        for (const std::string& m : r.members) {
          if (std::find(st_.members.begin(), st_.members.end(), m) != st_.members.end() &&
              !r.recovery)
            continue;  // current members keep training
          if (!ReadyFor(m)) {
            ready = false;
            const PodView* p = Pod(m);
            all_running = all_running && p && p->phase == "Running";
            std::string why =
                p ? p->phase + (p->reason.empty() ? "" : ": " + p->reason) : "not created yet";
            if (auto e = o_.unreachable_error.find(m); p && e != o_.unreachable_error.end())
              why += "; worker does not answer: " + e->second;
            waiting.push_back(m + " (" + why + ")");
          }
        }
        r.waiting_for = Join(waiting);
        for (const std::string& p : r.new_pods)
          if (const PodView* pod = Pod(p); pod && pod->phase == "Failed") {
            Abandon({p + " (Failed" + (pod->reason.empty() ? "" : ": " + pod->reason) + ")"});
            return;
          }
        if (!ready) {
          const auto timeout = std::chrono::seconds(spec_->elastic.scale_up_timeout_seconds);
          if (o_.now - r.started > timeout) Abandon(waiting);
          // A pod's phase changing wakes the controller (the informer); its worker starting to
          // answer does not: once every pod waited for runs, ask again soon.
          plan_.requeue_after =
              all_running ? std::min(options_.poll, kWorkerStartPoll) : options_.poll;
          return;
        }
        if (r.recovery || st_.members.empty()) {
          r.stage = Stage::kRendezvous;
          Rendezvous();
          return;
        }
        if (!EnginesPrepared(r)) return;
        r.stage = Stage::kBarrier;
        StartScaling(r.reason);
        Emit("Normal", "CheckpointBarrier",
             "new workers ready; checkpointing every rank at one step before generation " +
                 std::to_string(r.target_generation));
        Advance();
        return;
      }
      case Stage::kBarrier:
        StartScaling(r.reason);
        if (!AllPaused(st_.members, /*live_ok=*/true)) {
          Barrier(kEndOfGeneration, r.reason, /*live=*/true);
          // The shell runs the barrier calls off the reconcile (they return once every rank
          // holds, or one fails) and the first to end wakes the job: the Rendezvous goes out
          // then, not a poll later. The poll is the safety net.
          plan_.requeue_after = options_.poll;
          return;
        }
        // Every member holds a live checkpoint of the step it paused at: the new generation
        // reads it from them. (Ranks paused at a store checkpoint only, say by a barrier of
        // a suspend that was then taken back, resume from the store.)
        r.state_peers.clear();
        r.state_step = 0;
        if (std::all_of(st_.members.begin(), st_.members.end(), [&](const std::string& m) {
              const WorkerReport* w = Report(m);
              return w->live_step && *w->live_step == w->step;
            })) {
          r.state_peers = st_.members;
          r.state_step = Report(st_.members.front())->step;
        }
        DropLeavingMembers(r);
        r.stage = Stage::kRendezvous;
        Rendezvous();
        return;
      case Stage::kRendezvous:
        Rendezvous();
        return;
    }
  }

  // Make before break to the end: every member of the next generation readies itself for the
  // rank planned for it while the old generation trains — a new worker loads its engine (the
  // model, the rows, its base-weight shard), a current one reads the base weights its new
  // ZeRO-3 shard adds — so that the pause between the barrier and the next generation's first
  // step holds no load. Asked once (status.rescale.prepareAsked); the barrier then waits while
  // a member reports it is still at it, for at most scaleUpTimeoutSeconds after the ask. One
  // that reports nothing (it refused, as TIDAL_KEEP_ENGINE=0 does; the ask was lost with a
  // leader), one for another plan, or a failure holds nothing: it loads after the Rendezvous,
  // as without the ask. A move off a leaving pod (drain) does not wait: the pod's grace period
  // runs, and its replacements load in the pause as before.
  bool EnginesPrepared(RescaleState& r) {
    if (r.members.empty() || r.drain) return true;
    const auto soon = std::min(options_.poll, kWorkerStartPoll);
    if (!r.prepare_asked) {
      Action& a = Do(Action::Kind::kPrepareEngine, r.members, r.reason);
      a.generation = r.target_generation;
      for (size_t rank = 0; rank < r.members.size(); ++rank)
        a.ranks.push_back(static_cast<int>(rank));
      a.world_size = static_cast<int>(r.members.size());
      r.prepare_asked = o_.now;
      r.waiting_for = Join(r.members, " (preparing)");
      Emit("Normal", "PreparingEngines",
           Join(r.members) + " ready what they lack for generation " +
               std::to_string(r.target_generation) +
               " (a new pod its engine, a member the base weights its new shard adds) while " +
               "the job trains");
      plan_.requeue_after = soon;
      return false;
    }
    std::vector<std::string> loading;
    for (size_t rank = 0; rank < r.members.size(); ++rank) {
      const WorkerReport* w = Report(r.members[rank]);
      if (!w || !w->prepared) continue;
      const WorkerReport::Prepared& p = *w->prepared;
      if (p.generation == r.target_generation && p.rank == static_cast<int>(rank) &&
          p.world_size == static_cast<int>(r.members.size()) && !p.ready && p.error.empty())
        loading.push_back(r.members[rank]);
    }
    if (loading.empty()) return true;
    const auto timeout = std::chrono::seconds(spec_->elastic.scale_up_timeout_seconds);
    if (o_.now - *r.prepare_asked > timeout) {
      Emit("Normal", "EnginesStillLoading",
           Join(loading) + " still preparing " + std::to_string(timeout.count()) +
               " s after the ask (elastic.scaleUpTimeoutSeconds): the barrier goes on, and " +
               "they finish loading in generation " + std::to_string(r.target_generation));
      return true;
    }
    r.waiting_for = Join(loading, " (preparing)");
    plan_.requeue_after = soon;
    return false;
  }

  // What the survivors of the lost generation (`members` that report it) hold in memory, and
  // whether every rank's part is there at one step (planner::PlanBuddyRecovery). `holders` gets
  // how many of them hold any copy.
  planner::BuddyRecovery BuddyPlan(const std::vector<std::string>& members,
                                   size_t* holders_out = nullptr) const {
    std::vector<planner::Holder> holders;
    int world_size = 0;
    for (const std::string& m : members) {
      const WorkerReport* w = Report(m);
      if (!w || w->generation != st_.generation || w->held.empty()) continue;
      holders.push_back({m, w->rank, w->held});
      world_size = w->world_size;
    }
    if (holders_out) *holders_out = holders.size();
    return planner::PlanBuddyRecovery(st_.generation, world_size, holders);
  }

  // A recovery that needs neither a new pod nor the store: the survivors hold every rank's part
  // of the lost generation (buddy copies) and are an allowed size. They train on at once, and
  // the lost GPUs come back by an ordinary scale-up (make-before-break, live) once they can.
  bool SurvivorsGoOnFromMemory(const std::vector<std::string>& survivors) const {
    if (survivors.empty() || st_.generation == 0) return false;
    const int64_t gpus = static_cast<int64_t>(survivors.size()) * GpusPerPod();
    const auto allowed = spec_->AllowedGpuCounts();
    if (std::find(allowed.begin(), allowed.end(), gpus) == allowed.end()) return false;
    return BuddyPlan(survivors).step > 0;
  }

  // A recovery's first Rendezvous: where the survivors of the lost generation (FAILED at it)
  // hold a buddy copy of every rank's part at one step, the new generation reads its state
  // from their memory at the newest such step (DESIGN.md §4 step 5) instead of the store's
  // newest checkpoint. A rank lost together with the rank that kept its copy leaves the store.
  void ReadLostStateFromBuddies(RescaleState& r) {
    size_t holders = 0;
    const planner::BuddyRecovery plan = BuddyPlan(r.members, &holders);
    if (plan.step == 0) {
      if (spec_->checkpoint.buddy_every_steps == 0) return;
      std::string ranks;
      for (int k : plan.missing) ranks += (ranks.empty() ? "" : ", ") + std::to_string(k);
      Emit("Warning", "BuddyCopiesLost",
           "generation " + std::to_string(st_.generation) + ": " +
               (holders == 0    ? std::string("no survivor holds a buddy copy")
                : ranks.empty() ? std::string("no step has every rank's part held by a survivor")
                                : "no survivor holds the state of rank " + ranks +
                                      " (lost with the rank keeping its copy)") +
               "; resuming from the store's newest checkpoint");
      return;
    }
    r.state_peers = plan.sources;
    r.state_step = plan.step;
    Emit("Normal", "RecoveringFromMemory",
         "generation " + std::to_string(st_.generation) + "'s state at step " +
             std::to_string(plan.step) +
             " is read from the survivors' buddy copies; the store is not read");
  }

  // The new pods never became ready: delete them. A scale-up leaves the job as it was; a
  // recovery goes on with the survivors alone when they are an allowed size (DESIGN.md §4),
  // else tries again after the backoff.
  void Abandon(const std::vector<std::string>& waiting) {
    RescaleState r = *st_.rescale;
    const std::string why =
        std::string(r.recovery ? "replacement" : "scale-up") + " pods abandoned after " +
        std::to_string(spec_->elastic.scale_up_timeout_seconds) + " s: not ready: " + Join(waiting);
    if (!r.new_pods.empty()) Do(Action::Kind::kDeletePods, r.new_pods, why);
    Emit("Warning", "ScaleUpAbandoned", why);
    SetCondition(st_, "Scaling", false, "ScaleUpAbandoned", why, o_.now, o_.metadata_generation);
    if (!r.recovery) {
      st_.rescale.reset();
      st_.last_membership_change = o_.now;
      st_.scale_up_not_before =
          o_.now + std::chrono::seconds(std::max(spec_->elastic.cooldown_seconds,
                                                 spec_->elastic.scale_up_timeout_seconds));
      return;
    }
    std::vector<std::string> survivors;
    for (const std::string& m : r.members)
      if (std::find(r.new_pods.begin(), r.new_pods.end(), m) == r.new_pods.end())
        survivors.push_back(m);
    const int64_t gpus = static_cast<int64_t>(survivors.size()) * GpusPerPod();
    const auto allowed = spec_->AllowedGpuCounts();
    if (!survivors.empty() && std::find(allowed.begin(), allowed.end(), gpus) != allowed.end()) {
      st_.rescale->members = survivors;
      st_.rescale->new_pods.clear();
      st_.rescale->reason = "recovery at the survivors' " + std::to_string(gpus) + " GPUs";
      st_.rescale->stage = Stage::kRendezvous;
      Rendezvous();
      return;
    }
    st_.rescale.reset();
    st_.members = survivors;
    st_.restart_not_before = o_.now + std::chrono::seconds(spec_->restart_policy.backoff_seconds);
    StartGeneration(/*recovery=*/true);  // records the wait
  }

  // Status first (generation, members), then Rendezvous to every member not there yet, and
  // the surplus shut down. Done when every member reports the new generation.
  void Rendezvous() {
    RescaleState& r = *st_.rescale;
    // Pods of the old generation that are not in the new one. Under a live rescale they hold
    // state the new generation reads: they go once it runs (below).
    if (st_.generation != r.target_generation && r.recovery && st_.generation > 0 &&
        r.state_peers.empty())
      ReadLostStateFromBuddies(r);
    std::vector<std::string> surplus;
    for (const std::string& m : r.state_peers.empty() ? st_.members : r.state_peers)
      if (std::find(r.members.begin(), r.members.end(), m) == r.members.end() &&
          std::find(surplus.begin(), surplus.end(), m) == surplus.end())
        surplus.push_back(m);
    if (st_.generation != r.target_generation) {
      st_.generation = r.target_generation;
      st_.members = r.members;
      // A recovery starts no cooldown: the GPUs it lost are wanted back as soon as they can be
      // had (a recovery at the survivors' size is followed by a scale-up).
      // Nor does a move off pods that had to leave: their GPUs are wanted back elsewhere.
      if (st_.phase != Phase::kRecovering && !r.drain) st_.last_membership_change = o_.now;
      st_.current_gpus = static_cast<int64_t>(r.members.size()) * GpusPerPod();
      Emit("Normal", "Rendezvous",
           "generation " + std::to_string(r.target_generation) + " at " +
               std::to_string(st_.current_gpus) + " GPUs: " + r.reason);
    }
    if (!surplus.empty() && r.state_peers.empty()) {
      Do(Action::Kind::kShutdown, surplus, r.reason);
      Do(Action::Kind::kDeletePods, surplus, r.reason);
    }
    std::vector<std::string> pending, joining;
    for (const std::string& m : r.members) {
      const WorkerReport* w = Report(m);
      if (!w || w->generation < r.target_generation)
        pending.push_back(m);
      else if (w->generation == r.target_generation && w->phase == W::kJoining)
        joining.push_back(m);  // still reading its state
    }
    if (!pending.empty() || (!r.state_peers.empty() && !joining.empty())) {
      if (!pending.empty()) {
        Action& a = Do(Action::Kind::kRendezvous, r.members, r.reason);
        a.targets = pending;
        a.generation = r.target_generation;
        a.state_peers = r.state_peers;
        a.state_step = r.state_step;
        std::vector<std::string> nodes;
        for (const std::string& m : r.members) {
          const PodView* p = Pod(m);
          nodes.push_back(p ? p->node : "");
        }
        a.wards = planner::BuddyWards(nodes);
      }
      // Members reading their state from their peers' memory are done in tens of milliseconds.
      plan_.requeue_after =
          pending.empty() ? std::min(options_.poll, kWorkerStartPoll) : options_.poll;
      return;
    }
    if (!surplus.empty() && !r.state_peers.empty()) {
      Do(Action::Kind::kShutdown, surplus, r.reason);
      Do(Action::Kind::kDeletePods, surplus, r.reason);
    }
    const bool recovery = st_.phase == Phase::kRecovering;
    const int64_t from_memory_step = r.state_peers.empty() ? 0 : r.state_step;
    // A change with no member from before it is a start (nothing trained yet), a recovery
    // (after a failure) or a resume (after suspend); else it grew or shrank the generation.
    const bool all_new = r.new_pods.size() == r.members.size();
    plan_.finished_rescale = Plan::FinishedRescale{recovery                ? "recovery"
                                                   : st_.generation == 1   ? "start"
                                                   : r.drain               ? "drain"
                                                   : all_new || r.recovery ? "resume"
                                                   : r.new_pods.empty()    ? "scale_down"
                                                                           : "scale_up",
                                                   r.started};
    st_.rescale.reset();
    CompleteChange("generation " + std::to_string(st_.generation) + " trains");
    // A recovery at fewer GPUs than wanted (the survivors alone) grows again on the next pass.
    if (recovery) plan_.requeue_after = std::chrono::milliseconds(0);
    if (recovery)
      Emit("Normal", "Recovered",
           "generation " + std::to_string(st_.generation) +
               (from_memory_step == 0 ? " resumed from the newest checkpoint"
                                      : " resumed from the survivors' memory at step " +
                                            std::to_string(from_memory_step)));
    else if (!recovery)
      Emit("Normal", "Rescaled",
           "generation " + std::to_string(st_.generation) + " training at " +
               std::to_string(st_.current_gpus) + " GPUs");
  }

  // Pods of the job that neither the current generation nor the change under way counts on
  // (a surplus rank whose Shutdown was lost with a crashed leader, a pod of an abandoned step)
  // are stopped and deleted: they hold GPUs.
  void CollectStrays() {
    std::set<std::string> known(st_.members.begin(), st_.members.end());
    if (st_.rescale) {
      known.insert(st_.rescale->members.begin(), st_.rescale->members.end());
      known.insert(st_.rescale->new_pods.begin(), st_.rescale->new_pods.end());
      known.insert(st_.rescale->state_peers.begin(), st_.rescale->state_peers.end());
    }
    for (const Action& a : plan_.actions)
      if (a.kind == Action::Kind::kDeletePods) known.insert(a.pods.begin(), a.pods.end());
    std::vector<std::string> strays, leaving;
    for (const PodView& p : o_.pods)
      if (!known.count(p.name) && !p.deleting && p.phase != "Succeeded")
        strays.push_back(p.name);
      else if (!known.count(p.name) && p.deleting && Report(p.name) &&
               Report(p.name)->phase != W::kSucceeded)
        leaving.push_back(p.name);
    // A pod moved off that still answers (its Shutdown was lost with a crashed leader) waits in
    // its grace period for one: it is sent again, so that its deletion ends now.
    if (!leaving.empty())
      Do(Action::Kind::kShutdown, leaving,
         "moved off: not a member of generation " + std::to_string(st_.generation));
    if (strays.empty()) return;
    Do(Action::Kind::kShutdown, strays,
       "not a member of generation " + std::to_string(st_.generation));
    Do(Action::Kind::kDeletePods, strays,
       "not a member of generation " + std::to_string(st_.generation));
  }

  // --- output ---------------------------------------------------------------------------
  // Appends an action; the caller fills in the kind-specific fields through the reference.
  Action& Do(Action::Kind kind, std::vector<std::string> pods = {}, std::string reason = "") {
    Action a;
    a.kind = kind;
    a.pods = std::move(pods);
    a.reason = std::move(reason);
    plan_.actions.push_back(std::move(a));
    return plan_.actions.back();
  }
  // Checkpoint{pause} on every member, named (Action::barrier_id) so that a call reaching a
  // rank already in the barrier, or a re-send once it is over, joins it instead of asking for
  // another.
  static constexpr uint64_t kEndOfGeneration = 0xFFFFFFFFu;
  void Barrier(uint64_t low, const std::string& why, bool live = false) {
    Action& a = Do(Action::Kind::kBarrier, st_.members, why);
    a.barrier_id = (static_cast<uint64_t>(st_.generation) << 32) | low;
    a.live = live;
  }
  void Emit(const std::string& type, const std::string& reason, const std::string& message) {
    plan_.events.push_back({type, reason, message});
  }

  void WriteStatus() {
    // Rank 0 reports for the job; after a drain (suspend, deletion) the members are gone from
    // the new status but their last answers (the checkpoint they paused at) still count.
    const auto& members = st_.members.empty() ? o_.status.members : st_.members;
    if (!members.empty()) {
      if (const WorkerReport* r = Report(members[0])) {
        if (r->step > 0) {
          st_.step = r->step;
          st_.loss = std::round(r->loss * 1e4) / 1e4;  // the LOSS column; exact ones are logged
          st_.tokens_per_second = r->tokens_per_second;
        }
        const std::string known =
            st_.last_checkpoint.is_object() ? st_.last_checkpoint.value("uri", "") : std::string();
        if (r->checkpoint_step && r->checkpoint_uri != known) {
          st_.last_checkpoint = {{"step", *r->checkpoint_step},
                                 {"kind", r->checkpoint_kind},
                                 {"uri", r->checkpoint_uri},
                                 {"time", kube::FormatTime(o_.now)}};
        }
      }
    }
    if (st_.phase != Phase::kSuspended && st_.phase != Phase::kFailed &&
        st_.phase != Phase::kSucceeded)
      st_.current_gpus = static_cast<int64_t>(st_.members.size()) * GpusPerPod();
    const int64_t gen = o_.metadata_generation;
    if (!o_.spec.ok()) return;
    const bool scaling = st_.rescale && !st_.rescale->recovery;
    const bool recovering = st_.phase == Phase::kRecovering;
    // An abandoned scale-up keeps its condition (and why) until the next rescale starts.
    if (scaling || !ConditionIs(st_, "Scaling", "ScaleUpAbandoned"))
      SetCondition(st_, "Scaling", scaling, scaling ? StageName(st_.rescale->stage) : "Stable",
                   scaling ? st_.rescale->reason : "no membership change under way", o_.now, gen);
    SetCondition(st_, "Recovering", recovering, recovering ? "Restarting" : "Healthy",
                 recovering ? "restart " + std::to_string(st_.restarts) + " of " +
                                  std::to_string(o_.spec->restart_policy.max_restarts) +
                                  " after: " + st_.last_failure
                            : "no failure being recovered",
                 o_.now, gen);
    const bool running = st_.phase == Phase::kRunning || st_.phase == Phase::kScaling;
    const std::string phase = planner::PhaseName(st_.phase);
    const std::string not_ready =
        st_.phase == Phase::kFailed && !st_.failure_reason.empty() ? st_.failure_reason : phase;
    const DataStatus* data = st_.data ? &*st_.data : nullptr;
    if (data) {
      const bool ready = data->phase == "Ready";
      SetCondition(st_, "DataReady", ready,
                   ready                      ? "Prepared"
                   : data->phase == "Invalid" ? "InvalidSpec"
                                              : data->phase,
                   data->message, o_.now, gen);
    }
    if (data && st_.phase == Phase::kPending && data->phase == "Invalid") {
      SetCondition(st_, "Ready", false, "InvalidSpec", data->message, o_.now, gen);
    } else if (data && st_.phase == Phase::kPending && data->phase != "Ready") {
      SetCondition(st_, "Ready", false, "PreparingData", data->message, o_.now, gen);
    } else {
      SetCondition(st_, "Ready", running, running ? "Training" : not_ready,
                   running ? "generation " + std::to_string(st_.generation) + " at " +
                                 std::to_string(st_.current_gpus) + " GPUs"
                           : (st_.phase == Phase::kFailed ? st_.failure : "phase " + phase),
                   o_.now, gen);
    }
    // Stalled (absent until a first stall): over once a later generation trains.
    if (ConditionTrue(st_, "Stalled") && st_.phase == Phase::kRunning && !st_.rescale &&
        o_.no_progress_for.count() == 0)
      SetCondition(st_, "Stalled", false, "Training",
                   "generation " + std::to_string(st_.generation) + " trains", o_.now, gen);
    const bool progressing =
        running || st_.phase == Phase::kPending || st_.phase == Phase::kRecovering;
    SetCondition(st_, "Progressing", progressing, progressing ? "Training" : phase,
                 "step " + std::to_string(st_.step), o_.now, gen);
  }

  Plan Finish() {
    WriteStatus();
    return std::move(plan_);
  }

  const Observed& o_;
  const ReconcileOptions& options_;
  Plan plan_;
  JobStatus& st_;
  const api::TrainingJobSpec* spec_ = nullptr;
  std::map<std::string, const PodView*> pods_;
};

}  // namespace

const char* ActionKindName(Action::Kind kind) {
  switch (kind) {
    case Action::Kind::kAddFinalizer:
      return "AddFinalizer";
    case Action::Kind::kRemoveFinalizer:
      return "RemoveFinalizer";
    case Action::Kind::kEnsureService:
      return "EnsureService";
    case Action::Kind::kEnsureTokenSecret:
      return "EnsureTokenSecret";
    case Action::Kind::kEnsureSpecConfig:
      return "EnsureSpecConfig";
    case Action::Kind::kUpdateSpecConfig:
      return "UpdateSpecConfig";
    case Action::Kind::kCreatePods:
      return "CreatePods";
    case Action::Kind::kForceDeletePods:
      return "ForceDeletePods";
    case Action::Kind::kDeletePods:
      return "DeletePods";
    case Action::Kind::kBarrier:
      return "Barrier";
    case Action::Kind::kRendezvous:
      return "Rendezvous";
    case Action::Kind::kShutdown:
      return "Shutdown";
    case Action::Kind::kResume:
      return "Resume";
    case Action::Kind::kCreatePrepPod:
      return "CreatePrepPod";
    case Action::Kind::kPrepareEngine:
      return "PrepareEngine";
  }
  return "Unknown";
}

const char* StageName(Stage stage) {
  switch (stage) {
    case Stage::kWaitingForPods:
      return "WaitingForPods";
    case Stage::kBarrier:
      return "Barrier";
    case Stage::kRendezvous:
      return "Rendezvous";
  }
  return "Unknown";
}

std::chrono::seconds ProgressClock::Observe(const std::vector<PodView>& pods,
                                            const std::map<std::string, WorkerReport>& reports,
                                            std::chrono::steady_clock::time_point now) {
  size_t running = 0;
  for (const PodView& p : pods) running += p.phase == "Running" && !p.deleting;
  bool training = running > 0 && reports.size() == running;
  int64_t generation = -1, step = -1;
  for (const auto& [pod, r] : reports) {
    training = training && r.phase == W::kRunning && (generation < 0 || r.generation == generation);
    generation = r.generation;
    step = std::max(step, r.step);
  }
  if (!training || generation != generation_ || step != step_) {
    generation_ = training ? generation : -1;
    step_ = training ? step : -1;
    since_ = now;
    return std::chrono::seconds(0);
  }
  return std::chrono::duration_cast<std::chrono::seconds>(now - since_);
}

namespace {

// Reads the status subresource strictly: an absent field takes its default (a status written
// by an older operator), a present one of the wrong type is an error naming it. A status the
// operator cannot read is never replaced by defaults: the controller would forget the
// generation and members of workers that still run.
class StatusReader {
 public:
  template <typename T>
  T Get(const json& j, const std::string& path, const char* key, T fallback) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return fallback;
    const json& v = *it;
    bool fits = false;
    if constexpr (std::is_same_v<T, bool>)
      fits = v.is_boolean();
    else if constexpr (std::is_same_v<T, std::string>)
      fits = v.is_string();
    else if constexpr (std::is_integral_v<T>)
      fits = v.is_number_integer();
    else
      fits = v.is_number();
    if (fits) return v.get<T>();
    const char* expected = std::is_same_v<T, bool>          ? "a boolean"
                           : std::is_same_v<T, std::string> ? "a string"
                           : std::is_integral_v<T>          ? "an integer"
                                                            : "a number";
    Fail(path + key, expected, v);
    return fallback;
  }
  std::optional<Clock::time_point> Time(const json& j, const std::string& path, const char* key) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return std::nullopt;
    if (it->is_string())
      if (auto t = kube::ParseRfc3339(it->get<std::string>()); t.ok()) return *t;
    Fail(path + key, "an RFC 3339 time", *it);
    return std::nullopt;
  }
  std::vector<std::string> Strings(const json& j, const std::string& path, const char* key) {
    std::vector<std::string> out;
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return out;
    if (!it->is_array()) {
      Fail(path + key, "a list of strings", *it);
      return out;
    }
    for (const json& item : *it) {
      if (!item.is_string()) {
        Fail(path + key, "a list of strings", *it);
        return {};
      }
      out.push_back(item.get<std::string>());
    }
    return out;
  }
  // The object at `key`, or null when absent; an error when it is something else.
  const json* Object(const json& j, const std::string& path, const char* key) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return nullptr;
    if (it->is_object()) return &*it;
    Fail(path + key, "an object", *it);
    return nullptr;
  }
  void Fail(const std::string& field, const std::string& expected, const json& got) {
    if (error.empty()) {
      std::string shown = got.dump();
      if (shown.size() > 80) shown = shown.substr(0, 77) + "...";
      error = field + ": expected " + expected + ", got " + shown;
    }
  }
  std::string error;  // the first field that does not read
};

}  // namespace

StatusOr<JobStatus> JobStatusFromJson(const json& j) {
  JobStatus st;
  if (j.is_null()) return st;
  if (!j.is_object()) return InvalidArgument("status: expected an object, got " + j.dump());
  StatusReader in;
  const std::string at = "status.";
  const std::string phase = in.Get<std::string>(j, at, "phase", "Pending");
  if (auto read = planner::PhaseFromName(phase); read.ok())
    st.phase = *read;
  else
    in.Fail(at + "phase", "one of " + planner::PhaseNames(), phase);
  st.generation = in.Get<int64_t>(j, at, "generation", 0);
  st.members = in.Strings(j, at, "members");
  st.restarts = in.Get<int64_t>(j, at, "restarts", 0);
  // A status from before the streak was kept: its restarts were all one streak.
  st.restart_streak = in.Get<int64_t>(j, at, "restartStreak", st.restarts);
  st.restart_not_before = in.Time(j, at, "restartNotBefore");
  st.last_membership_change = in.Time(j, at, "lastMembershipChange");
  st.scale_up_not_before = in.Time(j, at, "scaleUpNotBefore");
  st.step = in.Get<int64_t>(j, at, "step", 0);
  st.loss = in.Get<double>(j, at, "loss", 0);
  st.tokens_per_second = in.Get<double>(j, at, "tokensPerSecond", 0);
  if (const json* c = in.Object(j, at, "lastCheckpoint")) st.last_checkpoint = *c;
  if (const json* g = in.Object(j, at, "gpus")) {
    st.desired_gpus = in.Get<int64_t>(*g, "status.gpus.", "desired", 0);
    st.current_gpus = in.Get<int64_t>(*g, "status.gpus.", "current", 0);
    st.gpus_reason = in.Get<std::string>(*g, "status.gpus.", "reason", "");
  }
  st.failure = in.Get<std::string>(j, at, "failure", "");
  st.failure_reason = in.Get<std::string>(j, at, "failureReason", "");
  st.failed_spec_generation = in.Get<int64_t>(j, at, "failedSpecGeneration", 0);
  if (const json* f = in.Object(j, at, "lastFailure")) {
    st.last_failure = in.Get<std::string>(*f, "status.lastFailure.", "message", "");
    st.last_failure_time = in.Time(*f, "status.lastFailure.", "time");
  }
  if (const json* a = in.Object(j, at, "anomaly")) {
    const std::string in_a = "status.anomaly.";
    AnomalyStatus an;
    an.rule = in.Get<std::string>(*a, in_a, "rule", "");
    an.checked_step = in.Get<int64_t>(*a, in_a, "checkedStep", 0);
    if (a->contains("step") && !(*a)["step"].is_null())
      an.step = in.Get<int64_t>(*a, in_a, "step", 0);
    an.message = in.Get<std::string>(*a, in_a, "message", "");
    an.time = in.Time(*a, in_a, "time");
    an.paused = in.Get<bool>(*a, in_a, "paused", false);
    st.anomaly = an;
  }
  if (const json* d = in.Object(j, at, "data")) {
    const std::string in_d = "status.data.";
    DataStatus data;
    data.key = in.Get<std::string>(*d, in_d, "key", "");
    data.phase = in.Get<std::string>(*d, in_d, "phase", "");
    data.pod = in.Get<std::string>(*d, in_d, "pod", "");
    data.store_uri = in.Get<std::string>(*d, in_d, "storeUri", "");
    data.samples = in.Get<int64_t>(*d, in_d, "samples", 0);
    data.tokens = in.Get<int64_t>(*d, in_d, "tokens", 0);
    data.reused = in.Get<bool>(*d, in_d, "reused", false);
    data.message = in.Get<std::string>(*d, in_d, "message", "");
    data.failures = in.Get<int64_t>(*d, in_d, "failures", 0);
    data.started = in.Time(*d, in_d, "started");
    data.retry_not_before = in.Time(*d, in_d, "retryNotBefore");
    st.data = data;
  }
  if (auto c = j.find("conditions"); c != j.end() && !c->is_null()) {
    if (auto read = ConditionsFromJson(*c); read.ok())
      st.conditions = std::move(*read);
    else if (in.error.empty())
      in.error = read.status().message();
  }
  st.observed_generation = in.Get<int64_t>(j, at, "observedGeneration", 0);
  if (const json* r = in.Object(j, at, "rescale")) {
    const std::string in_r = "status.rescale.";
    RescaleState rs;
    const std::string stage = in.Get<std::string>(*r, in_r, "stage", "");
    if (stage == "WaitingForPods")
      rs.stage = Stage::kWaitingForPods;
    else if (stage == "Barrier")
      rs.stage = Stage::kBarrier;
    else if (stage == "Rendezvous")
      rs.stage = Stage::kRendezvous;
    else if (in.error.empty())
      return InvalidArgument("status.rescale.stage: unknown \"" + stage + "\"");
    rs.target_generation = in.Get<int64_t>(*r, in_r, "targetGeneration", 0);
    rs.members = in.Strings(*r, in_r, "members");
    rs.new_pods = in.Strings(*r, in_r, "newPods");
    rs.reason = in.Get<std::string>(*r, in_r, "reason", "");
    rs.recovery = in.Get<bool>(*r, in_r, "recovery", false);
    rs.drain = in.Get<bool>(*r, in_r, "drain", false);
    rs.started = in.Time(*r, in_r, "started").value_or(Clock::time_point{});
    rs.waiting_for = in.Get<std::string>(*r, in_r, "waitingFor", "");
    rs.state_peers = in.Strings(*r, in_r, "statePeers");
    rs.state_step = in.Get<int64_t>(*r, in_r, "stateStep", 0);
    rs.prepare_asked = in.Time(*r, in_r, "prepareAsked");
    st.rescale = rs;
  }
  if (!in.error.empty()) return InvalidArgument(in.error);
  return st;
}

void ObserveStatus(const json& raw, Observed& o) {
  auto status = JobStatusFromJson(raw);
  if (status.ok()) {
    o.status = *status;
    o.status_error.clear();
    return;
  }
  o.status = JobStatus{};
  o.status_error = status.status().message();
  if (auto c = raw.find("conditions"); raw.is_object() && c != raw.end())
    if (auto read = ConditionsFromJson(*c); read.ok()) o.status.conditions = std::move(*read);
}

json ToJson(const std::vector<Condition>& conditions) {
  json out = json::array();
  for (const Condition& c : conditions)
    out.push_back({{"type", c.type},
                   {"status", c.status},
                   {"reason", c.reason},
                   {"message", c.message},
                   {"lastTransitionTime", kube::FormatTime(c.last_transition_time)},
                   {"observedGeneration", c.observed_generation}});
  return out;
}

StatusOr<std::vector<Condition>> ConditionsFromJson(const json& j) {
  std::vector<Condition> out;
  if (j.is_null()) return out;
  StatusReader in;
  if (!j.is_array()) {
    in.Fail("status.conditions", "a list", j);
    return InvalidArgument(in.error);
  }
  for (size_t i = 0; i < j.size() && in.error.empty(); ++i) {
    const std::string at = "status.conditions[" + std::to_string(i) + "].";
    const json& c = j[i];
    if (!c.is_object()) {
      in.Fail(at.substr(0, at.size() - 1), "an object", c);
      break;
    }
    Condition read;
    read.type = in.Get<std::string>(c, at, "type", "");
    if (read.type.empty() && in.error.empty()) in.Fail(at + "type", "a condition type", c);
    read.status = in.Get<std::string>(c, at, "status", "");
    if (read.status != "True" && read.status != "False" && read.status != "Unknown" &&
        in.error.empty())
      in.Fail(at + "status", "True, False or Unknown", c.value("status", json()));
    read.reason = in.Get<std::string>(c, at, "reason", "");
    read.message = in.Get<std::string>(c, at, "message", "");
    read.last_transition_time = in.Time(c, at, "lastTransitionTime").value_or(Clock::time_point{});
    read.observed_generation = in.Get<int64_t>(c, at, "observedGeneration", 0);
    out.push_back(std::move(read));
  }
  if (!in.error.empty()) return InvalidArgument(in.error);
  return out;
}

json ToJson(const JobStatus& st, const std::string& label_selector) {
  json j = {{"phase", planner::PhaseName(st.phase)},
            {"generation", st.generation},
            {"members", st.members},
            {"restarts", st.restarts},
            {"restartStreak", st.restart_streak},
            {"step", st.step},
            {"loss", st.loss},
            {"tokensPerSecond", st.tokens_per_second},
            {"gpus",
             {{"desired", st.desired_gpus},
              {"current", st.current_gpus},
              {"summary", std::to_string(st.current_gpus) + "/" + std::to_string(st.desired_gpus)},
              {"reason", st.gpus_reason}}},
            {"selector", label_selector},
            {"conditions", ToJson(st.conditions)},
            {"observedGeneration", st.observed_generation}};
  if (!st.last_checkpoint.is_null()) j["lastCheckpoint"] = st.last_checkpoint;
  if (!st.failure.empty()) j["failure"] = st.failure;
  if (!st.failure_reason.empty()) j["failureReason"] = st.failure_reason;
  if (st.failed_spec_generation > 0) j["failedSpecGeneration"] = st.failed_spec_generation;
  if (!st.last_failure.empty()) {
    j["lastFailure"] = {{"message", st.last_failure}};
    if (st.last_failure_time) j["lastFailure"]["time"] = kube::FormatTime(*st.last_failure_time);
  }
  if (st.anomaly) {
    const AnomalyStatus& a = *st.anomaly;
    json& out = j["anomaly"] = {{"rule", a.rule}, {"checkedStep", a.checked_step}};
    if (a.step) {
      out["step"] = *a.step;
      out["message"] = a.message;
      out["paused"] = a.paused;
    }
    if (a.time) out["time"] = kube::FormatTime(*a.time);
  }
  if (st.data) {
    const DataStatus& d = *st.data;
    json& out = j["data"] = {{"key", d.key},          {"phase", d.phase},
                             {"pod", d.pod},          {"storeUri", d.store_uri},
                             {"samples", d.samples},  {"tokens", d.tokens},
                             {"reused", d.reused},    {"message", d.message},
                             {"failures", d.failures}};
    if (d.started) out["started"] = kube::FormatTime(*d.started);
    if (d.retry_not_before) out["retryNotBefore"] = kube::FormatTime(*d.retry_not_before);
  }
  if (st.restart_not_before) j["restartNotBefore"] = kube::FormatTime(*st.restart_not_before);
  if (st.last_membership_change)
    j["lastMembershipChange"] = kube::FormatTime(*st.last_membership_change);
  if (st.scale_up_not_before) j["scaleUpNotBefore"] = kube::FormatTime(*st.scale_up_not_before);
  if (st.rescale) {
    const RescaleState& r = *st.rescale;
    j["rescale"] = {{"stage", StageName(r.stage)},
                    {"targetGeneration", r.target_generation},
                    {"members", r.members},
                    {"newPods", r.new_pods},
                    {"reason", r.reason},
                    {"recovery", r.recovery},
                    {"started", kube::FormatTime(r.started)}};
    if (r.drain) j["rescale"]["drain"] = true;
    if (!r.waiting_for.empty()) j["rescale"]["waitingFor"] = r.waiting_for;
    if (r.prepare_asked) j["rescale"]["prepareAsked"] = kube::FormatTime(*r.prepare_asked);
    if (!r.state_peers.empty()) {
      j["rescale"]["statePeers"] = r.state_peers;
      j["rescale"]["stateStep"] = r.state_step;
    }
  }
  return j;
}

Plan Decide(const Observed& observed, const ReconcileOptions& options) {
  return Decider(observed, options).Run();
}

}  // namespace tidal::controller
