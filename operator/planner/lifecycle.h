// operator/planner/lifecycle.h — the TrainingJob's phase machine (DESIGN.md §2 status.phase,
// §4 protocol): which event may move a job from which phase to which. The controller asks
// before acting, so an event in the wrong phase (a rescale while recovering, a resume of a job
// that is not suspended) is refused with both named instead of half-done.
//
//   Pending    --WorkersReady-->      Running
//   Running    --RescaleStarted-->    Scaling     (new pods ready, checkpoint barrier next)
//   Scaling    --RescaleDone-->       Running     (new generation resumed)
//   Scaling    --RescaleAbandoned-->  Running     (pods stayed Pending; training never stopped)
//   *active*|Paused --WorkerFailed--> Recovering  (restart counted; a pause is no shelter)
//   Recovering --Recovered-->         Running
//   *active*|Paused --RestartsExhausted--> Failed (final)
//   *active*|Paused --ConfigurationError--> Failed (a worker cannot use the spec; no restart)
//   Failed     --SpecEdited-->        Pending     (only after ConfigurationError)
//   Running    --AnomalyPause-->      Paused      (checkpointed first)
//   Paused     --Unpause-->           Running
//   *active*|Paused --Suspend-->      Suspended   (checkpointed, pods removed)
//   Suspended  --Unsuspend-->         Pending     (resumes from that checkpoint)
//   Running|Scaling --Finished-->     Succeeded
//   any but Terminating --Deleted-->  Terminating (final checkpoint, then the finalizer goes;
//                                      as a Namespace's phase says it while it is deleted)
// *active* is Pending, Running, Scaling and Recovering. An invalid spec is not an event: the
// phase stays and the InvalidSpec condition is set.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace tidal::planner {

enum class Phase {
  kPending,
  kRunning,
  kScaling,
  kRecovering,
  kPaused,
  kSuspended,
  kSucceeded,
  kFailed,
  kTerminating,
};
enum class Event {
  kWorkersReady,
  kRescaleStarted,
  kRescaleDone,
  kRescaleAbandoned,
  kWorkerFailed,
  kRecovered,
  kRestartsExhausted,
  kConfigurationError,
  kSpecEdited,
  kAnomalyPause,
  kUnpause,
  kSuspend,
  kUnsuspend,
  kFinished,
  kDeleted,
};

const char* PhaseName(Phase phase);  // as in status.phase: "Running"
// The phase named `name` as status.phase spells it; InvalidArgument naming the ones there are.
StatusOr<Phase> PhaseFromName(const std::string& name);
std::string PhaseNames();  // "Pending, Running, ..."
const char* EventName(Event event);
std::vector<Phase> AllPhases();
std::vector<Event> AllEvents();

// The phase `event` leads to from `from`, or FailedPrecondition "event X is not allowed in
// phase Y".
StatusOr<Phase> Transition(Phase from, Event event);

}  // namespace tidal::planner
