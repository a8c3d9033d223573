// operator/reconciler/event_reason.h — the reasons of the Events the operator records on a
// TrainingJob (what `kubectl describe` and `kubectl events` show), each with its type: one
// table, so that a reason is a name the compiler checks and its type (Normal or Warning) is the
// same wherever it is emitted. docs/controller.md says when each one comes.
#pragma once

#include <cstddef>
#include <iterator>

namespace tidal::reconciler {

enum class EventReason {
  kBarrierTimedOut,
  kBuddyCopiesLost,
  kCheckpointBarrier,
  kConfigurationError,
  kCorruptCheckpoint,
  kCreatingWorkers,
  kDataPreparationFailed,
  kDataReady,
  kEnginesStillLoading,
  kFinalCheckpoint,
  kFinalCheckpointSkipped,
  kForceDeleted,
  kInvalidReplicas,
  kInvalidSpec,
  kLossAnomaly,
  kMoveOffBlocked,
  kMovingOff,
  kPausing,
  kPreparingData,
  kPreparingEngines,
  kReconcileError,
  kRecovered,
  kRecoveringFromMemory,
  kRendezvous,
  kRescaled,
  kRestartsExhausted,
  kResumed,
  kScaleDownCancelled,
  kScaleUpAbandoned,
  kScaleUpCancelled,
  kScalingDown,
  kScalingUp,
  kSpecChanged,
  kStalled,
  kStatusUnreadable,
  kSucceeded,
  kSuspended,
  kTokenSecretRecreated,
  kUnsuspended,
  kWaitingForGpus,
  kWorkerFailed,
};

struct EventReasonInfo {
  EventReason reason;
  const char* name;  // UpperCamelCase, as Kubernetes' own reasons
  bool warning;      // type Warning, else Normal
};

inline constexpr EventReasonInfo kEventReasons[] = {
    {EventReason::kBarrierTimedOut, "BarrierTimedOut", true},
    {EventReason::kBuddyCopiesLost, "BuddyCopiesLost", true},
    {EventReason::kCheckpointBarrier, "CheckpointBarrier", false},
    {EventReason::kConfigurationError, "ConfigurationError", true},
    {EventReason::kCorruptCheckpoint, "CorruptCheckpoint", true},
    {EventReason::kCreatingWorkers, "CreatingWorkers", false},
    {EventReason::kDataPreparationFailed, "DataPreparationFailed", true},
    {EventReason::kDataReady, "DataReady", false},
    {EventReason::kEnginesStillLoading, "EnginesStillLoading", false},
    {EventReason::kFinalCheckpoint, "FinalCheckpoint", false},
    {EventReason::kFinalCheckpointSkipped, "FinalCheckpointSkipped", true},
    {EventReason::kForceDeleted, "ForceDeleted", true},
    {EventReason::kInvalidReplicas, "InvalidReplicas", true},
    {EventReason::kInvalidSpec, "InvalidSpec", true},
    {EventReason::kLossAnomaly, "LossAnomaly", true},
    {EventReason::kMoveOffBlocked, "MoveOffBlocked", true},
    {EventReason::kMovingOff, "MovingOff", false},
    {EventReason::kPausing, "Pausing", false},
    {EventReason::kPreparingData, "PreparingData", false},
    {EventReason::kPreparingEngines, "PreparingEngines", false},
    {EventReason::kReconcileError, "ReconcileError", true},
    {EventReason::kRecovered, "Recovered", false},
    {EventReason::kRecoveringFromMemory, "RecoveringFromMemory", false},
    {EventReason::kRendezvous, "Rendezvous", false},
    {EventReason::kRescaled, "Rescaled", false},
    {EventReason::kRestartsExhausted, "RestartsExhausted", true},
    {EventReason::kResumed, "Resumed", false},
    {EventReason::kScaleDownCancelled, "ScaleDownCancelled", false},
    {EventReason::kScaleUpAbandoned, "ScaleUpAbandoned", true},
    {EventReason::kScaleUpCancelled, "ScaleUpCancelled", false},
    {EventReason::kScalingDown, "ScalingDown", false},
    {EventReason::kScalingUp, "ScalingUp", false},
    {EventReason::kSpecChanged, "SpecChanged", false},
    {EventReason::kStalled, "Stalled", true},
    {EventReason::kStatusUnreadable, "StatusUnreadable", true},
    {EventReason::kSucceeded, "Succeeded", false},
    {EventReason::kSuspended, "Suspended", false},
    {EventReason::kTokenSecretRecreated, "TokenSecretRecreated", true},
    {EventReason::kUnsuspended, "Unsuspended", false},
    {EventReason::kWaitingForGpus, "WaitingForGpus", false},
    {EventReason::kWorkerFailed, "WorkerFailed", true},
};

namespace event_reason_detail {
constexpr bool InEnumOrder() {
  for (size_t i = 0; i < std::size(kEventReasons); ++i)
    if (kEventReasons[i].reason != static_cast<EventReason>(i)) return false;
  return true;
}
}  // namespace event_reason_detail
static_assert(event_reason_detail::InEnumOrder() &&
                  std::size(kEventReasons) == static_cast<size_t>(EventReason::kWorkerFailed) + 1,
              "kEventReasons: one row per EventReason, in the enum's order");

inline const char* EventReasonName(EventReason reason) {
  return kEventReasons[static_cast<size_t>(reason)].name;
}
inline const char* EventTypeOf(EventReason reason) {
  return kEventReasons[static_cast<size_t>(reason)].warning ? "Warning" : "Normal";
}

}  // namespace tidal::reconciler
