// operator/reconciler/decider.h — the inside of Decide (reconcile.h), private to
// operator/controller: one pass over one job as a class whose parts live by concern —
// decide.cc (the pass, the job's life: deletion, suspend, success; its phase; the status it
// writes), rescale.cc (make-before-break, the barrier, the rendezvous, pod slots),
// recovery.cc (failures, restarts, buddy copies, stalls), anomaly_hold.cc (the loss-anomaly
// pause) and data_phase.cc (the prep pod); status_codec.cc reads and writes the status.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kube/meta_time.h"
#include "operator/planner/planner.h"
#include "operator/reconciler/children.h"
#include "operator/reconciler/event_reason.h"
#include "operator/reconciler/reconcile.h"

namespace tidal::reconciler::internal {

using nlohmann::json;
using Stage = RescaleState::Stage;
using PhaseEvent = planner::Event;
using planner::Phase;
using W = api::WorkerPhase;
using kube::PodPhase;

constexpr auto kMaxBackoff = std::chrono::minutes(10);
constexpr auto kBackoffReset = std::chrono::minutes(10);
// How soon to ask again whether the workers of running new pods answer (a worker starts in
// about a second; asking at the general poll of 2 s added up to 2 s to every scale-up), or
// whether new members have read their state from their peers' memory.
constexpr std::chrono::milliseconds kWorkerStartPoll{250};
// A steady job whose workers push their status is looked at again only when the clock alone
// may change what it should do, and at least this often (a resync, as controller-runtime's).
constexpr auto kSteadyResync = std::chrono::minutes(10);
// How long after such an instant (a window's start, the cooldown's end) to look: just past it.
constexpr std::chrono::milliseconds kAfterBoundary{200};

// "a, b, c"; each item followed by `suffix`.
inline std::string Join(const std::vector<std::string>& items, const std::string& suffix = "") {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : ", ") + s + suffix;
  return out;
}

// Sets a metav1.Condition, moving lastTransitionTime only when the status changes.
inline void SetCondition(JobStatus& st, ConditionType condition, bool value,
                         const std::string& reason, const std::string& message,
                         Clock::time_point now, int64_t observed) {
  const std::string type = ConditionTypeName(condition);
  const ConditionStatus status = value ? ConditionStatus::kTrue : ConditionStatus::kFalse;
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

inline bool ConditionIs(const JobStatus& st, ConditionType condition, const std::string& reason) {
  const std::string type = ConditionTypeName(condition);
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

  Plan Run();

 private:
  // The waits the status holds are wall-clock times (a new leader must read them). A wall
  // clock stepped back (NTP, a restored VM) would lengthen each by the step: each is capped at
  // the longest it can be from now, and a start in the future is taken as now. After a step
  // back, a wait lasts at most its usual length; a step forward shortens waits, never
  // measures a failure (those are on the monotonic clock: unreachable_since, no_progress_for).
  void ClampTimes();

  // --- the phase ------------------------------------------------------------------------
  // Every change of status.phase: through the transition table (planner/lifecycle.h), recorded
  // in the plan with why (the shell logs each, naming the job and generation). One the table
  // refuses leaves the phase as it was and is recorded as refused: a bug the simulator finds.
  void Move(PhaseEvent event, const std::string& reason);
  // A membership change stops the training (its barrier), or a scale-down starts.
  void StartScaling(const std::string& reason) {
    if (st_.phase != Phase::kScaling) Move(PhaseEvent::kRescaleStarted, reason);
  }
  // No change is under way: a Scaling left from one that was called off is over.
  void NoChangeUnderWay(const std::string& reason) {
    if (st_.phase == Phase::kScaling) Move(PhaseEvent::kRescaleAbandoned, reason);
  }
  // The new generation trains: the start, resume, rescale or recovery that led to it is done.
  void CompleteChange(const std::string& reason);

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
  Failure FailureOf(const std::string& name, int64_t generation) const;
  // Its worker answers in `generation` and takes part in it (trains, checkpoints or holds).
  bool Serves(const std::string& name, int64_t generation) const;
  // Why `name` must leave while its worker may still train ("" when it need not): its pod is
  // being deleted (an eviction, a drain, `kubectl delete pod`: the kubelet sent SIGTERM), or its
  // node is cordoned or tainted NoExecute.
  std::string LeaveNotice(const std::string& name) const;
  // A pod deleted on a node that stopped answering stays Terminating: no kubelet confirms that
  // its processes are gone. Once its grace period is over (deletionTimestamp), it is deleted
  // with grace 0, as Kubernetes' pod garbage collector does on a node that is gone, so that a
  // suspend or a deletion of the job is not held forever. The job is safe from a process that
  // may still run there: it left that generation, whose collectives can no longer complete,
  // and rank 0 commits a checkpoint only after every rank of its generation wrote its shard.
  void ForceDeleteStuck();
  // Why the status cannot be acted on ("" when it can): it does not read, or workers run a
  // generation it does not know. The status is written before any action, so no worker can
  // be ahead of it unless it was rolled back: restored from a backup (which drops status),
  // replaced by hand, or written by something else.
  std::string StatusUnusable() const;
  // Acts on nothing: Ready=False (StatusUnreadable) says why and what to do, once as an Event.
  void Hold(const std::string& why);
  // Why the current generation counts as stalled ("" when it does not): every member
  // answers "training" in it, and the step has not moved for progressDeadlineSeconds.
  std::string Stall() const;
  // Ready to be sent a Rendezvous: the pod runs and its worker answers. A new worker waits
  // for its first generation; a survivor of a failed generation may still be finishing it (a
  // Rendezvous makes it leave).
  bool ReadyFor(const std::string& name) const;

  // --- the parts of Run -----------------------------------------------------------------
  void InvalidSpec();

  // A spec.replicas left out of the spec (Observed::refused_replicas): an Event and the
  // ScaleOverride condition say so; management goes on.
  // Rank 0's resume skipped corrupt checkpoints: a Warning Event (once per generation), the
  // CheckpointsIntact condition, and the operator's counter (Landing). A later clean resume
  // sets the condition True again.
  void ReportCorruptResume();
  void RefuseBadReplicas();
  void EnsureChildren();

  // Checkpoints the members (if a generation is training), then stops and deletes every pod.
  // Returns true once nothing runs any more.
  bool Drain(const std::string& why);

  void Delete();

  void Suspend();

  bool Succeeded();

  // A member (or, during a rescale, an incoming member) failed: count the restart and plan the
  // recovery. True when it did.
  bool FailuresHandled();

  // The job stops for good (phase Failed): every pod goes, the reason stays in the status.
  void Fail(const std::string& reason, const std::string& failure);

  // A worker cannot use the spec (it names the field): restarting cannot help, so no restart
  // is spent; the job waits in Failed until the spec is edited.
  void FailForConfiguration(const std::string& cause);

  // A job failed on its configuration starts again once the spec changes (a new
  // metadata.generation), from the newest checkpoint with a fresh restart budget.
  void RetryAfterSpecEdit();

  // The data phase (DataStatus): true once the token store for the current spec is ready and
  // checked; until then no worker is created. A prep pod per attempt
  // (<job>-prep-<key>-<attempt>): one that succeeded says where the store is; one whose
  // error only a spec edit can cure leaves the job Pending with Ready=False InvalidSpec (its
  // pod kept for `kubectl logs`); any other failure is retried after restartPolicy's backoff,
  // at most maxRestarts times.
  bool DataReady();

  // Prep pods of an earlier spec or attempt go; the current one stays while it runs (or, on an
  // invalid spec, for its logs).
  void CollectPrepPods();

  // Creates the pods of the next generation (survivors kept): the initial start, a restart
  // after suspend, or a recovery.
  void StartGeneration(bool recovery);

  void MaybeRescale();

  // A member told to leave since the change began (its pod deleted, its node cordoned or
  // tainted) is left out of the next generation when the others are still an allowed size: it
  // stays a state peer, and goes once the new generation runs. (Else it joins, and is moved off
  // on its own after.)
  void DropLeavingMembers(RescaleState& r);

  // Nothing to change: with every member pushing its status (Observed::pushed), running and
  // answering, and no capacity gate or anomaly rule to re-read, the next look is a timer — the
  // decision's revisit, `until`, the progress deadline (a stall is a step unchanged across two
  // looks), kSteadyResync — instead of the poll.
  void Steady(const planner::Decision& decision, std::optional<Clock::time_point> until);
  // Adds `n` new pods to a change under way (members and new_pods), in the lowest free slots
  // (FillSlots). Returns the slots.
  std::vector<int> AddNewPods(RescaleState& r, int64_t n) const;
  // The one slot allocator. Fills `members` up to `want` in slot order: a slot held by a member
  // is passed; one whose pod of the job still exists is taken — with `adopt`, joining `members`
  // when that pod runs on, is no stray of this plan and is not going away; else it is passed —
  // and a slot with no pod gets a new pod (`created`). A pod this plan deletes is never a
  // member, nor its name reused while it goes. Returns the new pods' slots.
  std::vector<int> FillSlots(std::vector<std::string>& members, std::vector<std::string>& created,
                             int64_t want, bool adopt) const;

  // The members that must leave while their workers still train in the current generation,
  // and why (LeaveNotice).
  std::vector<std::string> LeavingMembers(std::string* why = nullptr) const;

  // A rescale still waiting for its pods (or its members' reads ahead) when a member must leave
  // gives way: its pods are deleted and the move off comes first (its GPUs are planned again
  // after it).
  bool LeavingMembersStopAScaleUp();

  // Members that must leave (LeaveNotice) while their workers train are moved off live, before
  // their pods go: a live scale-down to the others when those are an allowed size (the GPUs come
  // back elsewhere by a scale-up, with no cooldown), else replacements first where idle GPUs
  // allow (make before break); with neither, training goes on until the pod goes, and the
  // recovery from buddy copies takes over. True when it acted (or holds for want of GPUs).
  bool MoveOffLeavingMembers();

  // The anomaly rule (spec.anomaly, planner/anomaly.h) over the members' newest steps: an
  // Event and the LossAnomaly condition for a rise; with action Pause, the members are
  // checkpointed and held (phase Paused) until acknowledgedStep reaches the rise's last step.
  // True while the job is held: nothing else (no rescale) happens meanwhile.
  bool HeldForAnomaly();

  void ResumeFromAnomaly(const std::string& why);

  // Every one of `names` holds at one step with a checkpoint of it: in the store, or with
  // `live_ok` in its memory.
  bool AllPaused(const std::vector<std::string>& names, bool live_ok = false) const;

  void Advance();

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
  bool EnginesPrepared(RescaleState& r);
  // The members of a new generation in rank order with those on one node next to each other
  // (each node's where its first member is, in the order they had): the ring's neighbours share
  // a node wherever they can. Once every member runs (its node is known), before any rank is
  // given out.
  void GroupByNode(std::vector<std::string>& members) const;

  // What the survivors of the lost generation (`members` that report it) hold in memory, and
  // whether every rank's part is there at one step (planner::PlanBuddyRecovery). `holders` gets
  // how many of them hold any copy.
  planner::BuddyRecovery BuddyPlan(const std::vector<std::string>& members,
                                   size_t* holders_out = nullptr) const;

  // A recovery that needs neither a new pod nor the store: the survivors hold every rank's part
  // of the lost generation (buddy copies) and are an allowed size. They train on at once, and
  // the lost GPUs come back by an ordinary scale-up (make-before-break, live) once they can.
  bool SurvivorsGoOnFromMemory(const std::vector<std::string>& survivors) const;

  // A recovery's first Rendezvous: where the survivors of the lost generation (FAILED at it)
  // hold a buddy copy of every rank's part at one step, the new generation reads its state
  // from their memory at the newest such step (DESIGN.md §4 step 5) instead of the store's
  // newest checkpoint. A rank lost together with the rank that kept its copy leaves the store.
  void ReadLostStateFromBuddies(RescaleState& r);

  // The new pods never became ready: delete them. A scale-up leaves the job as it was; a
  // recovery goes on with the survivors alone when they are an allowed size (DESIGN.md §4),
  // else tries again after the backoff.
  void Abandon(const std::vector<std::string>& waiting);
  // A rescale's barrier that not every member reached within ReconcileOptions::barrier_timeout:
  // abandoned (BarrierTimedOut), its new pods deleted, the members that hold resumed.
  void AbandonBarrier();
  // Steady, with no change under way: members that hold at a barrier (one whose rescale was
  // abandoned while they still stepped towards it) are resumed.
  void ResumeStrayPaused();

  // Status first (generation, members), then Rendezvous to every member not there yet, and
  // the surplus shut down. Done when every member reports the new generation.
  void Rendezvous();

  // Pods of the job that neither the current generation nor the change under way counts on
  // (a surplus rank whose Shutdown was lost with a crashed leader, a pod of an abandoned step)
  // are stopped and deleted: they hold GPUs.
  void CollectStrays();

  // --- output ---------------------------------------------------------------------------
  // Appends an action to the plan (action.h: one type per kind).
  template <class A>
  void Do(A action) {
    plan_.actions.emplace_back(std::move(action));
  }
  // Checkpoint{pause} on every member, named (action::Barrier::id) so that a call reaching a
  // rank already in the barrier, or a re-send once it is over, joins it instead of asking for
  // another.
  static constexpr uint64_t kEndOfGeneration = 0xFFFFFFFFu;
  void Barrier(uint64_t low, bool live = false);
  void Emit(EventReason reason, const std::string& message) {
    plan_.events.push_back({EventTypeOf(reason), EventReasonName(reason), message});
  }

  void WriteStatus();

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

}  // namespace tidal::reconciler::internal
