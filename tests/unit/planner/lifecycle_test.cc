// The TrainingJob phase machine, as a whole table: every (phase, event) pair is either the
// listed transition or refused naming both — so adding a transition means changing this test.
#include "operator/planner/lifecycle.h"

#include <gtest/gtest.h>

#include <map>

namespace tidal::planner {
namespace {

TEST(LifecycleTest, EveryPhaseEventPairIsTheTablesTransitionOrRefused) {
  const std::map<std::pair<std::string, std::string>, std::string> allowed = {
      {{"Pending", "WorkersReady"}, "Running"},
      {{"Running", "RescaleStarted"}, "Scaling"},
      {{"Scaling", "RescaleDone"}, "Running"},
      {{"Scaling", "RescaleAbandoned"}, "Running"},
      {{"Pending", "WorkerFailed"}, "Recovering"},
      {{"Running", "WorkerFailed"}, "Recovering"},
      {{"Scaling", "WorkerFailed"}, "Recovering"},
      {{"Recovering", "WorkerFailed"}, "Recovering"},
      {{"Recovering", "Recovered"}, "Running"},
      {{"Pending", "RestartsExhausted"}, "Failed"},
      {{"Running", "RestartsExhausted"}, "Failed"},
      {{"Scaling", "RestartsExhausted"}, "Failed"},
      {{"Recovering", "RestartsExhausted"}, "Failed"},
      {{"Pending", "ConfigurationError"}, "Failed"},
      {{"Running", "ConfigurationError"}, "Failed"},
      {{"Scaling", "ConfigurationError"}, "Failed"},
      {{"Recovering", "ConfigurationError"}, "Failed"},
      {{"Failed", "SpecEdited"}, "Pending"},
      {{"Running", "AnomalyPause"}, "Paused"},
      {{"Paused", "Unpause"}, "Running"},
      {{"Pending", "Suspend"}, "Suspended"},
      {{"Running", "Suspend"}, "Suspended"},
      {{"Scaling", "Suspend"}, "Suspended"},
      {{"Recovering", "Suspend"}, "Suspended"},
      {{"Paused", "Suspend"}, "Suspended"},
      {{"Suspended", "Unsuspend"}, "Pending"},
      {{"Running", "Finished"}, "Succeeded"},
      {{"Scaling", "Finished"}, "Succeeded"},
  };
  size_t seen = 0;
  for (Phase from : AllPhases())
    for (Event event : AllEvents()) {
      auto to = Transition(from, event);
      auto it = allowed.find({PhaseName(from), EventName(event)});
      if (it != allowed.end()) {
        ++seen;
        ASSERT_TRUE(to.ok()) << PhaseName(from) << " + " << EventName(event);
        EXPECT_EQ(PhaseName(*to), it->second) << PhaseName(from) << " + " << EventName(event);
      } else {
        ASSERT_FALSE(to.ok()) << PhaseName(from) << " + " << EventName(event) << " → "
                              << PhaseName(*to);
        EXPECT_EQ(to.status().code(), StatusCode::kFailedPrecondition);
        EXPECT_EQ(to.status().message(), std::string("event ") + EventName(event) +
                                             " is not allowed in phase " + PhaseName(from));
      }
    }
  EXPECT_EQ(seen, allowed.size());
}

// Succeeded is final; Failed leaves only on a spec edit (after a configuration error).
TEST(LifecycleTest, TerminalPhasesAcceptNothingButAnEditOfAFailedJobsSpec) {
  for (Event event : AllEvents()) {
    EXPECT_FALSE(Transition(Phase::kSucceeded, event).ok()) << EventName(event);
    EXPECT_EQ(Transition(Phase::kFailed, event).ok(), event == Event::kSpecEdited)
        << EventName(event);
  }
}

}  // namespace
}  // namespace tidal::planner
