// operator/reconciler/anomaly_hold.cc — the loss-anomaly rule (spec.anomaly): its condition and
// Event, and the checkpointed hold until the step is acknowledged.
#include "operator/reconciler/decider.h"

namespace tidal::reconciler::internal {

bool Decider::HeldForAnomaly() {
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
                            ConditionTrue(st_, ConditionType::kLossAnomaly);
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
    SetCondition(st_, ConditionType::kLossAnomaly, true, "LossRising", message, o_.now,
                 o_.metadata_generation);
    Emit(EventReason::kLossAnomaly, message);
  } else if (ConditionIs(st_, ConditionType::kLossAnomaly, "LossRising") && !a.paused && a.step &&
             a.checked_step >= *a.step + rule.consecutive_steps) {
    SetCondition(st_, ConditionType::kLossAnomaly, false, "NoLongerRising",
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
    Emit(EventReason::kPausing, "checkpointing every rank, then holding: " + a.message);
    Move(PhaseEvent::kAnomalyPause, a.message);
  }
  plan_.requeue_after = options_.poll;
  if (!AllPaused(st_.members)) Barrier(static_cast<uint64_t>(a.step.value_or(0)));
  return true;
}

void Decider::ResumeFromAnomaly(const std::string& why) {
  if (st_.anomaly) {
    // The steps trained between the rise and the pause were there to see: only rises that
    // end after them can pause the job again.
    AnomalyStatus& a = *st_.anomaly;
    a.paused = false;
    if (a.step) a.step = std::max(*a.step, a.checked_step);
  }
  if (ConditionIs(st_, ConditionType::kLossAnomaly, "LossRising"))
    SetCondition(st_, ConditionType::kLossAnomaly, false, "Acknowledged", why, o_.now,
                 o_.metadata_generation);
  std::vector<std::string> paused;
  for (const std::string& m : st_.members)
    if (const WorkerReport* r = Report(m); r && r->phase == W::kPaused) paused.push_back(m);
  if (!paused.empty()) Do(action::Resume{paused});
  if (st_.phase == Phase::kPaused) Move(PhaseEvent::kUnpause, why);
  Emit(EventReason::kResumed, "training goes on: " + why);
  plan_.requeue_after = options_.poll;
}

}  // namespace tidal::reconciler::internal
