// The TrainingJob phase machine, as a whole table: every (phase, event) pair is either the
// listed transition or refused naming both — so adding a transition means changing this test.
#include "operator/planner/lifecycle.h"

#include <gtest/gtest.h>

#include <map>

namespace tidal::planner {
namespace {

TEST(LifecycleTest, EveryPhaseEventPairIsTheTablesTransitionOrRefused) {
  std::map<std::pair<std::string, std::string>, std::string> allowed = {
      {{"Pending", "WorkersReady"}, "Running"},
      {{"Running", "RescaleStarted"}, "Scaling"},
      {{"Scaling", "RescaleDone"}, "Running"},
      {{"Scaling", "RescaleAbandoned"}, "Running"},
      {{"Pending", "WorkerFailed"}, "Recovering"},
      {{"Running", "WorkerFailed"}, "Recovering"},
      {{"Scaling", "WorkerFailed"}, "Recovering"},
      {{"Recovering", "WorkerFailed"}, "Recovering"},
      {{"Paused", "WorkerFailed"}, "Recovering"},
      {{"Paused", "RestartsExhausted"}, "Failed"},
      {{"Paused", "ConfigurationError"}, "Failed"},
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
  for (const char* phase : {"Pending", "Running", "Scaling", "Recovering", "Paused", "Suspended",
                            "Succeeded", "Failed"})
    allowed[{phase, "Deleted"}] = "Terminating";
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

// Succeeded is final but for its deletion; Failed leaves only on a spec edit (after a
// configuration error) or its deletion; Terminating leaves on nothing.
TEST(LifecycleTest, TerminalPhasesAcceptNothingButAnEditOfAFailedJobsSpecOrTheirDeletion) {
  for (Event event : AllEvents()) {
    EXPECT_EQ(Transition(Phase::kSucceeded, event).ok(), event == Event::kDeleted)
        << EventName(event);
    EXPECT_EQ(Transition(Phase::kFailed, event).ok(),
              event == Event::kSpecEdited || event == Event::kDeleted)
        << EventName(event);
    EXPECT_FALSE(Transition(Phase::kTerminating, event).ok()) << EventName(event);
  }
}

TEST(LifecycleTest, EveryPhaseReadsBackFromItsNameAndAnUnknownNameIsRefusedListingThem) {
  for (Phase p : AllPhases()) {
    auto read = PhaseFromName(PhaseName(p));
    ASSERT_TRUE(read.ok()) << PhaseName(p);
    EXPECT_EQ(*read, p);
  }
  auto unknown = PhaseFromName("running");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().message(),
            "expected one of Pending, Running, Scaling, Recovering, Paused, Suspended, Succeeded, "
            "Failed, Terminating, got \"running\"");
}

}  // namespace
}  // namespace tidal::planner
