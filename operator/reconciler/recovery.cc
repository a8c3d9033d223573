// operator/reconciler/recovery.cc — failures: who failed and why, restarts with backoff, a job that
// fails, a stall, the survivors going on from their buddy copies, an abandoned replacement.
#include "operator/reconciler/decider.h"

namespace tidal::reconciler::internal {

Decider::Failure Decider::FailureOf(const std::string& name, int64_t generation) const {
  const PodView* pod = Pod(name);
  if (!pod) return {"pod " + name + " is gone", true};
  if (pod->phase == PodPhase::kFailed)
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
  if (pod->phase != PodPhase::kRunning || since == o_.unreachable_since.end() ||
      o_.now - since->second <= options_.unreachable_after)
    return {};
  const std::string seconds = std::to_string(options_.unreachable_after.count());
  // A worker that answers, but refuses the operator's token, is alive: say so, with the cause
  // (its job token's Secret was replaced), rather than that it is silent.
  auto error = o_.unreachable_error.find(name);
  if (error != o_.unreachable_error.end() && error->second.starts_with("UNAUTHENTICATED"))
    return {"worker " + name + " has refused the operator's job token for " + seconds + " s (" +
                error->second + "): it holds another token than Secret " +
                TokenSecretName(o_.name) + ", which was replaced while it ran",
            true};
  return {"worker " + name + " has not answered for " + seconds + " s" +
              (error != o_.unreachable_error.end() && !error->second.empty()
                   ? " (" + error->second + ")"
                   : ""),
          true};
}

void Decider::ForceDeleteStuck() {
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
  Do(action::ForceDeletePods{stuck});
  Emit(EventReason::kForceDeleted, why);
}

std::string Decider::Stall() const {
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

bool Decider::FailuresHandled() {
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
  // The members that are gone or do not answer lead the causes: a survivor's failure (a
  // collective that timed out on the lost peer) follows from theirs (issue 47: WorkerFailed led
  // with the survivor's reduce_scatter error when its peer had been killed).
  std::vector<std::string> lost_causes;
  for (const std::string& m : members) {
    const Failure f = FailureOf(m, generation);
    if (!f.cause.empty()) (f.pod_lost ? lost_causes : causes).push_back(f.cause);
    if (f.permanent) permanent.push_back(f.cause);
    if (f.cause.empty() && !LeaveNotice(m).empty())
      leaving.push_back(m);
    else
      (f.pod_lost ? failed : survivors).push_back(m);
  }
  failed.insert(failed.end(), leaving.begin(), leaving.end());
  // The generation failed, and a member's worker does not answer at all: it is the likeliest
  // cause (a killed process whose pod the kubelet has not marked failed yet — the survivors
  // push their failure within milliseconds of it), and it could not join the next generation
  // anyway. It is replaced, not counted a survivor: taken as one, it failed the next
  // generation's rendezvous and cost a second restart.
  if (!causes.empty() || !lost_causes.empty())
    for (auto it = survivors.begin(); it != survivors.end();) {
      const PodView* pod = Pod(*it);
      if (Report(*it) || (pod && pod->phase != PodPhase::kRunning)) {
        ++it;
        continue;
      }
      lost_causes.push_back("pod " + *it + "'s worker does not answer");
      failed.push_back(*it);
      it = survivors.erase(it);
    }
  causes.insert(causes.begin(), lost_causes.begin(), lost_causes.end());
  if (causes.empty()) {
    const std::string stall = Stall();
    if (stall.empty()) return false;
    // A worker stuck outside a collective (a hung read, a deadlock) never fails on its own,
    // and one stuck rank holds every other in its next collective: which one is stuck
    // cannot be told, so the whole generation is replaced.
    causes = {stall};
    failed = members;
    survivors.clear();
    SetCondition(st_, ConditionType::kStalled, true, "NoProgress", stall, o_.now,
                 o_.metadata_generation);
    Emit(EventReason::kStalled, stall);
  }
  if (!permanent.empty()) {
    FailForConfiguration(Join(permanent));
    return true;
  }
  // A scale-up still waiting for its pods gives up first; recovery comes before growth.
  if (st_.rescale && st_.rescale->stage == Stage::kWaitingForPods && !st_.rescale->new_pods.empty())
    Do(action::DeletePods{st_.rescale->new_pods});
  if (!failed.empty()) Do(action::DeletePods{failed});
  const std::string cause = Join(causes);
  if (st_.phase == Phase::kRecovering && st_.rescale &&
      st_.rescale->stage == Stage::kWaitingForPods) {
    // More of the same incident (the rest of a generation going down): one restart, one
    // backoff; the recovery goes on with who is left, replacing the rest.
    st_.rescale.reset();
    st_.members = survivors;
    Emit(EventReason::kWorkerFailed, cause + " (the same recovery: not counted again)");
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
    Emit(EventReason::kRestartsExhausted, st_.failure);
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
  Emit(EventReason::kWorkerFailed,
       cause + "; restart " + std::to_string(st_.restarts) + " of " +
           std::to_string(spec_->restart_policy.max_restarts) +
           (from_memory
                ? " now, at the survivors' size from their memory"
                : " in " + std::to_string(backoff.count()) + " s from the newest checkpoint"));
  StartGeneration(/*recovery=*/true);
  return true;
}

void Decider::Fail(const std::string& reason, const std::string& failure) {
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
    Do(action::Shutdown{all, "the job failed"});
    Do(action::DeletePods{all});
  }
  st_.members.clear();
  st_.current_gpus = st_.desired_gpus = 0;
}

void Decider::FailForConfiguration(const std::string& cause) {
  st_.failed_spec_generation = o_.metadata_generation;
  Fail("ConfigurationError", cause);
  Emit(EventReason::kConfigurationError,
       cause + "; no restart can fix this: edit the spec and the job starts again");
}

void Decider::RetryAfterSpecEdit() {
  if (st_.failure_reason != "ConfigurationError" ||
      o_.metadata_generation <= st_.failed_spec_generation)
    return;
  Emit(EventReason::kSpecChanged,
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
  Do(action::UpdateSpecConfig{});
}

planner::BuddyRecovery Decider::BuddyPlan(const std::vector<std::string>& members,
                                          size_t* holders_out) const {
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

bool Decider::SurvivorsGoOnFromMemory(const std::vector<std::string>& survivors) const {
  if (survivors.empty() || st_.generation == 0) return false;
  const int64_t gpus = static_cast<int64_t>(survivors.size()) * GpusPerPod();
  const auto allowed = spec_->AllowedGpuCounts();
  if (std::find(allowed.begin(), allowed.end(), gpus) == allowed.end()) return false;
  return BuddyPlan(survivors).step > 0;
}

void Decider::ReadLostStateFromBuddies(RescaleState& r) {
  size_t holders = 0;
  const planner::BuddyRecovery plan = BuddyPlan(r.members, &holders);
  if (plan.step == 0) {
    if (spec_->checkpoint.buddy_every_steps == 0) return;
    std::string ranks;
    for (int k : plan.missing) ranks += (ranks.empty() ? "" : ", ") + std::to_string(k);
    Emit(EventReason::kBuddyCopiesLost,
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
  Emit(EventReason::kRecoveringFromMemory,
       "generation " + std::to_string(st_.generation) + "'s state at step " +
           std::to_string(plan.step) +
           " is read from the survivors' buddy copies; the store is not read");
}

void Decider::AbandonBarrier() {
  const RescaleState r = *st_.rescale;
  std::vector<std::string> held, missing;
  for (const std::string& m : st_.members) {
    const WorkerReport* w = Report(m);
    (w && w->phase == W::kPaused ? held : missing).push_back(m);
  }
  const std::string why =
      "the checkpoint barrier before generation " + std::to_string(r.target_generation) +
      " was not reached by " + (missing.empty() ? std::string("every member") : Join(missing)) +
      " within " + std::to_string(options_.barrier_timeout.count()) +
      " s (a step that does not end, or a rank that does not answer): " + r.reason +
      " is abandoned" + (r.new_pods.empty() ? "" : " and its new pods deleted") +
      "; the job trains on as it was";
  if (!r.new_pods.empty()) Do(action::DeletePods{r.new_pods});
  if (!held.empty()) Do(action::Resume{held});
  Emit(EventReason::kBarrierTimedOut, why);
  SetCondition(st_, ConditionType::kScaling, false, "BarrierTimedOut", why, o_.now,
               o_.metadata_generation);
  st_.rescale.reset();
  NoChangeUnderWay(why);
  st_.last_membership_change = o_.now;
  st_.scale_up_not_before =
      o_.now + std::chrono::seconds(std::max(spec_->elastic.cooldown_seconds,
                                             spec_->elastic.scale_up_timeout_seconds));
}

void Decider::Abandon(const std::vector<std::string>& waiting) {
  RescaleState r = *st_.rescale;
  const std::string why =
      std::string(r.recovery ? "replacement" : "scale-up") + " pods abandoned after " +
      std::to_string(spec_->elastic.scale_up_timeout_seconds) + " s: not ready: " + Join(waiting);
  if (!r.new_pods.empty()) Do(action::DeletePods{r.new_pods});
  Emit(EventReason::kScaleUpAbandoned, why);
  SetCondition(st_, ConditionType::kScaling, false, "ScaleUpAbandoned", why, o_.now,
               o_.metadata_generation);
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

}  // namespace tidal::reconciler::internal
