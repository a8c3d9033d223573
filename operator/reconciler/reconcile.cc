// operator/reconciler/reconcile.cc — Decide (its parts: decider.h), and the small public
// helpers of reconcile.h.
#include "operator/reconciler/reconcile.h"

#include "operator/reconciler/decider.h"

namespace tidal::reconciler {

using internal::W;
using kube::PodPhase;
using Stage = RescaleState::Stage;

const char* ConditionTypeName(ConditionType type) {
  switch (type) {
    case ConditionType::kReady:
      return "Ready";
    case ConditionType::kProgressing:
      return "Progressing";
    case ConditionType::kScaling:
      return "Scaling";
    case ConditionType::kRecovering:
      return "Recovering";
    case ConditionType::kStalled:
      return "Stalled";
    case ConditionType::kDataReady:
      return "DataReady";
    case ConditionType::kLossAnomaly:
      return "LossAnomaly";
    case ConditionType::kCheckpointsIntact:
      return "CheckpointsIntact";
    case ConditionType::kScaleOverride:
      return "ScaleOverride";
  }
  return "Unknown";
}

bool ConditionTrue(const JobStatus& st, ConditionType type) {
  for (const Condition& c : st.conditions)
    if (c.type == ConditionTypeName(type)) return c.status == ConditionStatus::kTrue;
  return false;
}

void MarkReconcileError(JobStatus& status, const std::string& message, Clock::time_point now,
                        int64_t observed_generation) {
  internal::SetCondition(status, ConditionType::kReady, false, "ReconcileError", message, now,
                         observed_generation);
}

const char* DataPhaseName(DataPhase phase) {
  switch (phase) {
    case DataPhase::kPreparing:
      return "Preparing";
    case DataPhase::kReady:
      return "Ready";
    case DataPhase::kInvalid:
      return "Invalid";
    case DataPhase::kRetrying:
      return "Retrying";
  }
  return "Unknown";
}

StatusOr<DataPhase> DataPhaseFromName(const std::string& name) {
  for (DataPhase p :
       {DataPhase::kPreparing, DataPhase::kReady, DataPhase::kInvalid, DataPhase::kRetrying})
    if (name == DataPhaseName(p)) return p;
  return InvalidArgument("one of Preparing, Ready, Invalid, Retrying");
}

const char* ConditionStatusName(ConditionStatus status) {
  switch (status) {
    case ConditionStatus::kTrue:
      return "True";
    case ConditionStatus::kFalse:
      return "False";
    case ConditionStatus::kUnknown:
      return "Unknown";
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
  for (const PodView& p : pods) running += p.phase == PodPhase::kRunning && !p.deleting;
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

Plan Decide(const Observed& observed, const ReconcileOptions& options) {
  return internal::Decider(observed, options).Run();
}

}  // namespace tidal::reconciler
