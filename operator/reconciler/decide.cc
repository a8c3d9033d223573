// operator/reconciler/decide.cc — Decider's pass (Run): deletion, an unusable status, an invalid
// spec, terminal phases, suspend, success, failures, the anomaly hold, then a change under way or
// the planner's count; the phase through the transition table; the status and conditions last.
#include "operator/reconciler/decider.h"

namespace tidal::reconciler::internal {

Plan Decider::Run() {
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
  if (ConditionIs(st_, ConditionType::kReady, "InvalidSpec"))
    SetCondition(st_, ConditionType::kReady, false, "SpecAccepted", "the spec is valid", o_.now,
                 o_.metadata_generation);
  RefuseBadReplicas();
  if (st_.phase == Phase::kFailed) RetryAfterSpecEdit();
  if (st_.phase == Phase::kSucceeded || st_.phase == Phase::kFailed) return Finish();  // terminal
  EnsureChildren();
  if (spec_->suspend) {
    Suspend();
    return Finish();
  }
  if (st_.phase == Phase::kSuspended) {
    Move(PhaseEvent::kUnsuspend, "spec.suspend is false");
    Emit(EventReason::kUnsuspended, "resuming from the newest checkpoint");
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
    if (!st_.rescale) ResumeStrayPaused();
  }
  CollectStrays();
  CollectPrepPods();
  return Finish();
}

void Decider::ClampTimes() {
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

void Decider::Move(PhaseEvent event, const std::string& reason) {
  PhaseChange change{st_.phase, st_.phase, event, reason, false};
  auto to = planner::Transition(st_.phase, event);
  if (to.ok())
    st_.phase = change.to = *to;
  else
    change.refused = true;
  plan_.phase_changes.push_back(std::move(change));
}

void Decider::CompleteChange(const std::string& reason) {
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

bool Decider::Serves(const std::string& name, int64_t generation) const {
  const WorkerReport* r = Report(name);
  return r && generation > 0 && r->generation == generation &&
         (r->phase == W::kRunning || r->phase == W::kCheckpointing || r->phase == W::kPaused);
}

std::string Decider::LeaveNotice(const std::string& name) const {
  const PodView* pod = Pod(name);
  if (!pod) return "";
  if (pod->deleting) return "pod " + name + " is being deleted";
  return pod->node_notice.empty() ? "" : pod->node_notice + " (pod " + name + ")";
}

std::string Decider::StatusUnusable() const {
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

void Decider::Hold(const std::string& why) {
  const std::string message =
      why + ". The operator leaves this job's workers alone until its status reads and " +
      "agrees with them: fix or remove the field (kubectl patch trainingjob " + o_.name +
      " --subresource=status), or delete its worker pods (kubectl delete pods -l " + kJobLabel +
      "=" + JobLabelValue(o_.name) + ") to restart it from its newest checkpoint";
  if (!ConditionIs(st_, ConditionType::kReady, "StatusUnreadable"))
    Emit(EventReason::kStatusUnreadable, why);
  SetCondition(st_, ConditionType::kReady, false, "StatusUnreadable", message, o_.now,
               o_.metadata_generation);
  plan_.conditions_only = true;
  plan_.requeue_after = std::chrono::minutes(1);  // an edit of the status or pods comes sooner
}

bool Decider::ReadyFor(const std::string& name) const {
  const PodView* pod = Pod(name);
  const WorkerReport* r = Report(name);
  return pod && pod->phase == PodPhase::kRunning && !pod->deleting && r &&
         r->phase != W::kSucceeded;
}

void Decider::InvalidSpec() {
  const std::string message = o_.spec.status().message();
  if (!ConditionIs(st_, ConditionType::kReady, "InvalidSpec"))
    Emit(EventReason::kInvalidSpec, message);
  SetCondition(st_, ConditionType::kReady, false, "InvalidSpec", message, o_.now,
               o_.metadata_generation);
  plan_.requeue_after = std::chrono::minutes(5);  // a spec edit triggers a reconcile anyway
}

void Decider::ResumeStrayPaused() {
  std::vector<std::string> paused;
  for (const std::string& m : st_.members)
    if (const WorkerReport* r = Report(m);
        r && r->phase == W::kPaused && r->generation == st_.generation)
      paused.push_back(m);
  // Held at a barrier that nothing waits for any more (its rescale was abandoned).
  if (!paused.empty()) Do(action::Resume{paused});
}

void Decider::RefuseBadReplicas() {
  if (o_.refused_replicas.empty()) {
    if (ConditionIs(st_, ConditionType::kScaleOverride, "InvalidReplicas"))
      SetCondition(st_, ConditionType::kScaleOverride, true, "Resolved",
                   "spec.replicas is valid again, or was removed", o_.now, o_.metadata_generation);
    return;
  }
  const std::string message = o_.refused_replicas +
                              " — the override is ignored and the job runs by its schedule and "
                              "range (kubectl scale to an allowed count, or remove spec.replicas)";
  if (!ConditionIs(st_, ConditionType::kScaleOverride, "InvalidReplicas"))
    Emit(EventReason::kInvalidReplicas, message);
  SetCondition(st_, ConditionType::kScaleOverride, false, "InvalidReplicas", message, o_.now,
               o_.metadata_generation);
}

void Decider::EnsureChildren() {
  if (!o_.has_finalizer) Do(action::AddFinalizer{});
  if (!o_.service_exists) Do(action::EnsureService{});
  if (!o_.token_exists) Do(action::EnsureTokenSecret{});
  if (!o_.spec_config_exists) Do(action::EnsureSpecConfig{});
}

bool Decider::Drain(const std::string& why) {
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
    Barrier(kEndOfGeneration);
    plan_.requeue_after = options_.poll;
    return false;
  }
  std::vector<std::string> all;
  for (const PodView& p : o_.pods)
    if (!p.deleting) all.push_back(p.name);
  if (!all.empty()) {
    Do(action::Shutdown{all, why});
    Do(action::DeletePods{all});
  }
  st_.members.clear();
  st_.rescale.reset();
  return true;
}

void Decider::Delete() {
  if (!o_.has_finalizer) return;
  // Where the checkpoints stay (kubectl describe shows it): the store of the newest one, as
  // rank 0 reports it now (its final checkpoint, this pass), else as the status knows it.
  std::string kept =
      st_.last_checkpoint.is_object() ? st_.last_checkpoint.value("uri", "") : std::string();
  int64_t newest =
      st_.last_checkpoint.is_object() ? st_.last_checkpoint.value("step", int64_t{0}) : 0;
  const auto& members = st_.members.empty() ? o_.status.members : st_.members;
  if (const WorkerReport* r = members.empty() ? nullptr : Report(members[0]);
      r && r->checkpoint_step && !r->checkpoint_uri.empty()) {
    kept = r->checkpoint_uri;
    newest = *r->checkpoint_step;
  }
  if (auto slash = kept.rfind("/step-"); slash != std::string::npos) kept.resize(slash);
  const std::string where = kept.empty() ? std::string()
                                         : "; its checkpoints are kept in " + kept +
                                               " (a new job of this name starts fresh: name them "
                                               "in spec.checkpoint.resumeFrom to start from them)";
  // A final checkpoint that does not come (a step that never ends, a worker that does not
  // answer) never holds `kubectl delete`: past the barrier timeout the workers are stopped
  // without it, and the newest existing checkpoint is the job's last.
  if (o_.deletion_started && o_.now - *o_.deletion_started > options_.barrier_timeout) {
    std::vector<std::string> all;
    for (const PodView& p : o_.pods)
      if (!p.deleting) all.push_back(p.name);
    const std::string why = "no final checkpoint within " +
                            std::to_string(options_.barrier_timeout.count()) +
                            " s of the deletion: the workers are stopped without it";
    if (!all.empty()) {
      Do(action::Shutdown{all, why});
      Do(action::DeletePods{all});
    }
    st_.members.clear();
    st_.rescale.reset();
    Do(action::RemoveFinalizer{});
    Emit(EventReason::kFinalCheckpointSkipped,
         why + "; the newest checkpoint is " +
             (newest > 0 ? "step " + std::to_string(newest) : std::string("none")) + where);
    return;
  }
  if (!Drain("the job is being deleted: final checkpoint")) return;
  Do(action::RemoveFinalizer{});
  Emit(EventReason::kFinalCheckpoint,
       "workers checkpointed and stopped; releasing the job" + where);
}

void Decider::Suspend() {
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
  Emit(EventReason::kSuspended,
       "checkpointed at step " + std::to_string(st_.step) + " and removed the workers");
}

bool Decider::Succeeded() {
  if (st_.members.empty()) return false;
  const PodView* rank0 = Pod(st_.members[0]);
  const WorkerReport* r = Report(st_.members[0]);
  if (!(rank0 && rank0->phase == PodPhase::kSucceeded) && !(r && r->phase == W::kSucceeded))
    return false;
  Move(PhaseEvent::kFinished, "rank 0 finished training");
  st_.rescale.reset();
  st_.current_gpus = st_.desired_gpus = 0;  // its workers are done: nothing holds a GPU
  if (spec_) st_.step = std::max(st_.step, spec_->train.optimization.max_steps);
  Emit(EventReason::kSucceeded, "trained to step " + std::to_string(st_.step));
  return true;
}

void Decider::Barrier(uint64_t low, bool live) {
  Do(action::Barrier{st_.members, (static_cast<uint64_t>(st_.generation) << 32) | low, live});
}

void Decider::ReportCorruptResume() {
  if (st_.members.empty()) return;
  const WorkerReport* r = Report(st_.members[0]);
  if (!r || r->generation != st_.generation || !r->resumed_from_step) return;
  const std::string resumed = "generation " + std::to_string(st_.generation) +
                              " resumed from step " + std::to_string(*r->resumed_from_step) + " (" +
                              r->resumed_from_uri + ")";
  if (r->skipped_checkpoints.empty()) {
    if (ConditionIs(st_, ConditionType::kCheckpointsIntact, "CorruptSkipped"))
      SetCondition(st_, ConditionType::kCheckpointsIntact, true, "Intact", resumed + ", the newest",
                   o_.now, o_.metadata_generation);
    return;
  }
  std::string skipped;
  for (const std::string& c : r->skipped_checkpoints) skipped += (skipped.empty() ? "" : "; ") + c;
  const std::string message =
      resumed +
      ": newer checkpoints are corrupt and were skipped, their steps trained again: " + skipped;
  bool known = false;  // this generation's resume, already reported
  for (const Condition& c : st_.conditions)
    known |= c.type == "CheckpointsIntact" && c.reason == "CorruptSkipped" && c.message == message;
  if (known) return;
  Emit(EventReason::kCorruptCheckpoint, message);
  SetCondition(st_, ConditionType::kCheckpointsIntact, false, "CorruptSkipped", message, o_.now,
               o_.metadata_generation);
}

void Decider::WriteStatus() {
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
      if (!r->checkpoint_interval.is_null()) st_.checkpoint_interval = r->checkpoint_interval;
      // A spec edited back to a fixed interval: the automatic one's plan is no longer the job's.
      if (o_.spec.ok() && !o_.spec->checkpoint.full_every_auto) st_.checkpoint_interval = nullptr;
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
  ReportCorruptResume();
  const int64_t gen = o_.metadata_generation;
  if (!o_.spec.ok()) return;
  const bool scaling = st_.rescale && !st_.rescale->recovery;
  const bool recovering = st_.phase == Phase::kRecovering;
  // An abandoned scale-up keeps its condition (and why) until the next rescale starts.
  if (scaling || (!ConditionIs(st_, ConditionType::kScaling, "ScaleUpAbandoned") &&
                  !ConditionIs(st_, ConditionType::kScaling, "BarrierTimedOut")))
    SetCondition(st_, ConditionType::kScaling, scaling,
                 scaling ? StageName(st_.rescale->stage) : "Stable",
                 scaling ? st_.rescale->reason : "no membership change under way", o_.now, gen);
  SetCondition(st_, ConditionType::kRecovering, recovering, recovering ? "Restarting" : "Healthy",
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
    const bool ready = data->phase == DataPhase::kReady;
    SetCondition(st_, ConditionType::kDataReady, ready,
                 ready                                ? "Prepared"
                 : data->phase == DataPhase::kInvalid ? "InvalidSpec"
                                                      : DataPhaseName(data->phase),
                 data->message, o_.now, gen);
  }
  if (data && st_.phase == Phase::kPending && data->phase == DataPhase::kInvalid) {
    SetCondition(st_, ConditionType::kReady, false, "InvalidSpec", data->message, o_.now, gen);
  } else if (o_.reconcile_failing && ConditionIs(st_, ConditionType::kReady, "ReconcileError")) {
    // Kept until a pass succeeds: a failing job's Ready flipped between the error and its
    // phase with every retry.
  } else if (data && st_.phase == Phase::kPending && data->phase != DataPhase::kReady) {
    SetCondition(st_, ConditionType::kReady, false, "PreparingData", data->message, o_.now, gen);
  } else {
    SetCondition(st_, ConditionType::kReady, running, running ? "Training" : not_ready,
                 running ? "generation " + std::to_string(st_.generation) + " at " +
                               std::to_string(st_.current_gpus) + " GPUs"
                         : (st_.phase == Phase::kFailed ? st_.failure : "phase " + phase),
                 o_.now, gen);
  }
  // Stalled (absent until a first stall): over once a later generation trains.
  if (ConditionTrue(st_, ConditionType::kStalled) && st_.phase == Phase::kRunning && !st_.rescale &&
      o_.no_progress_for.count() == 0)
    SetCondition(st_, ConditionType::kStalled, false, "Training",
                 "generation " + std::to_string(st_.generation) + " trains", o_.now, gen);
  // A job that has never trained is not progressing (issue 47: it said True, "Training", while
  // Pending at generation 0); one being restarted or started again after a failure is.
  const bool never_started = st_.generation == 0 && !st_.rescale;
  const bool progressing = running || st_.phase == Phase::kRecovering ||
                           (st_.phase == Phase::kPending && !never_started);
  // No step in the message: a condition that changed with every step made every status write
  // differ from the last, and each write woke another reconcile.
  const std::string progress_reason = running                           ? "Training"
                                      : st_.phase == Phase::kRecovering ? "Recovering"
                                      : progressing                     ? "Starting"
                                      : st_.phase == Phase::kPending    ? "NotStarted"
                                                                        : phase;
  SetCondition(st_, ConditionType::kProgressing, progressing, progress_reason,
               progressing ? "generation " + std::to_string(st_.generation) + " (" + phase + ")"
               : st_.phase == Phase::kPending
                   ? "no generation has started yet: " +
                         (st_.gpus_reason.empty() ? "phase " + phase : st_.gpus_reason)
                   : "phase " + phase,
               o_.now, gen);
}

}  // namespace tidal::reconciler::internal
