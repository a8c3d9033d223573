// operator/planner/lifecycle.cc
#include "operator/planner/lifecycle.h"

#include <map>
#include <utility>

namespace tidal::planner {
namespace {

using P = Phase;
using E = Event;

// The whole machine: (from, event) → to. Anything absent is refused.
const std::map<std::pair<Phase, Event>, Phase>& Table() {
  static const std::map<std::pair<Phase, Event>, Phase> kTable = [] {
    std::map<std::pair<Phase, Event>, Phase> t = {
        {{P::kPending, E::kWorkersReady}, P::kRunning},
        {{P::kRunning, E::kRescaleStarted}, P::kScaling},
        {{P::kScaling, E::kRescaleDone}, P::kRunning},
        {{P::kScaling, E::kRescaleAbandoned}, P::kRunning},
        {{P::kRecovering, E::kRecovered}, P::kRunning},
        {{P::kRunning, E::kAnomalyPause}, P::kPaused},
        {{P::kPaused, E::kUnpause}, P::kRunning},
        {{P::kSuspended, E::kUnsuspend}, P::kPending},
        {{P::kRunning, E::kFinished}, P::kSucceeded},
        {{P::kScaling, E::kFinished}, P::kSucceeded},
    };
    for (Phase held : {P::kPending, P::kRunning, P::kScaling, P::kRecovering, P::kPaused}) {
      t[{held, E::kWorkerFailed}] = P::kRecovering;
      t[{held, E::kRestartsExhausted}] = P::kFailed;
      t[{held, E::kConfigurationError}] = P::kFailed;
      t[{held, E::kSuspend}] = P::kSuspended;
    }
    for (Phase any : AllPhases())
      if (any != P::kTerminating) t[{any, E::kDeleted}] = P::kTerminating;
    t[{P::kFailed, E::kSpecEdited}] = P::kPending;  // the controller checks the failure's reason
    return t;
  }();
  return kTable;
}

}  // namespace

const char* PhaseName(Phase phase) {
  switch (phase) {
    case P::kPending:
      return "Pending";
    case P::kRunning:
      return "Running";
    case P::kScaling:
      return "Scaling";
    case P::kRecovering:
      return "Recovering";
    case P::kPaused:
      return "Paused";
    case P::kSuspended:
      return "Suspended";
    case P::kSucceeded:
      return "Succeeded";
    case P::kFailed:
      return "Failed";
    case P::kTerminating:
      return "Terminating";
  }
  return "?";
}

std::string PhaseNames() {
  std::string names;
  for (Phase p : AllPhases()) names += std::string(names.empty() ? "" : ", ") + PhaseName(p);
  return names;
}

StatusOr<Phase> PhaseFromName(const std::string& name) {
  for (Phase p : AllPhases())
    if (name == PhaseName(p)) return p;
  return InvalidArgument("expected one of " + PhaseNames() + ", got \"" + name + "\"");
}

const char* EventName(Event event) {
  switch (event) {
    case E::kWorkersReady:
      return "WorkersReady";
    case E::kRescaleStarted:
      return "RescaleStarted";
    case E::kRescaleDone:
      return "RescaleDone";
    case E::kRescaleAbandoned:
      return "RescaleAbandoned";
    case E::kWorkerFailed:
      return "WorkerFailed";
    case E::kRecovered:
      return "Recovered";
    case E::kRestartsExhausted:
      return "RestartsExhausted";
    case E::kConfigurationError:
      return "ConfigurationError";
    case E::kSpecEdited:
      return "SpecEdited";
    case E::kAnomalyPause:
      return "AnomalyPause";
    case E::kUnpause:
      return "Unpause";
    case E::kSuspend:
      return "Suspend";
    case E::kUnsuspend:
      return "Unsuspend";
    case E::kFinished:
      return "Finished";
    case E::kDeleted:
      return "Deleted";
  }
  return "?";
}

std::vector<Phase> AllPhases() {
  return {P::kPending,   P::kRunning,   P::kScaling, P::kRecovering, P::kPaused,
          P::kSuspended, P::kSucceeded, P::kFailed,  P::kTerminating};
}

std::vector<Event> AllEvents() {
  return {E::kWorkersReady,
          E::kRescaleStarted,
          E::kRescaleDone,
          E::kRescaleAbandoned,
          E::kWorkerFailed,
          E::kRecovered,
          E::kRestartsExhausted,
          E::kConfigurationError,
          E::kSpecEdited,
          E::kAnomalyPause,
          E::kUnpause,
          E::kSuspend,
          E::kUnsuspend,
          E::kFinished,
          E::kDeleted};
}

StatusOr<Phase> Transition(Phase from, Event event) {
  auto it = Table().find({from, event});
  if (it == Table().end())
    return FailedPrecondition(std::string("event ") + EventName(event) +
                              " is not allowed in phase " + PhaseName(from));
  return it->second;
}

}  // namespace tidal::planner
