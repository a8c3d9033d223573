// FiguresPatch: what the controller's patcher writes of the step figures rank 0 pushes, between
// reconciles. Only forward, only onto a training status, and only onto the status its cache
// holds: a reconcile's newer write (a drain's checkpoint) is never overwritten by older figures.
#include <gtest/gtest.h>

#include "operator/reconciler/reconcile.h"

namespace tidal::reconciler {
namespace {

using nlohmann::json;

json Job(const std::string& status) {
  return {{"metadata", {{"name", "j"}, {"namespace", "default"}, {"resourceVersion", "41"}}},
          {"status", json::parse(status)}};
}

StepFigures Figures(int64_t generation, int64_t step, int64_t checkpoint_step) {
  StepFigures f;
  f.generation = generation;
  f.step = step;
  f.loss = 1.234567;
  f.tokens_per_second = 900;
  f.checkpoint_step = checkpoint_step;
  if (checkpoint_step >= 0) {
    f.checkpoint_kind = "full";
    f.checkpoint_uri = "file:///c/step-" + std::to_string(checkpoint_step);
  }
  return f;
}

const Clock::time_point kNow = Clock::time_point(std::chrono::seconds(1800000000));

TEST(FiguresPatch, NewerFiguresAreWrittenWithTheCachedResourceVersionAsPrecondition) {
  const json job = Job(R"({"phase": "Running", "generation": 1, "step": 10,
                           "lastCheckpoint": {"step": 5, "uri": "file:///c/step-5"}})");
  std::optional<json> patch = FiguresPatch(job, Figures(1, 12, 10), kNow);
  ASSERT_TRUE(patch);
  EXPECT_EQ((*patch)["metadata"]["resourceVersion"], "41");
  const json& status = (*patch)["status"];
  EXPECT_EQ(status["step"], 12);
  EXPECT_DOUBLE_EQ(status["loss"].get<double>(), 1.2346);  // rounded as Decide rounds it
  EXPECT_EQ(status["tokensPerSecond"], 900);
  EXPECT_EQ(status["lastCheckpoint"]["step"], 10);
  EXPECT_EQ(status["lastCheckpoint"]["uri"], "file:///c/step-10");
  EXPECT_EQ(status["lastCheckpoint"]["kind"], "full");
  EXPECT_TRUE(status["lastCheckpoint"]["time"].is_string());
}

// The case that lost a suspend's checkpoint (CI, stop 44): rank 0 paused at the drain's
// barrier, so its pushed figures stopped at its last training step and periodic checkpoint;
// the reconcile wrote the paused workers' step and checkpoint. The patcher must leave both.
TEST(FiguresPatch, OlderFiguresNeverOverwriteADrainsNewerStepOrCheckpoint) {
  const json job = Job(R"({"phase": "Running", "generation": 1, "step": 14, "members": [],
                           "lastCheckpoint": {"step": 14, "uri": "file:///c/step-14"}})");
  EXPECT_FALSE(FiguresPatch(job, Figures(1, 13, 10), kNow));
  EXPECT_FALSE(FiguresPatch(job, Figures(1, 14, 14), kNow)) << "the same figures: nothing to write";
}

// A generation that resumed from an older checkpoint (the newest was unreadable) saves ones
// behind the status's: they are the job's newest all the same, and rank 0 training past
// status.step says its figures are current.
TEST(FiguresPatch, ACheckpointBehindTheKnownOneIsWrittenWhileRankZeroTrainsPastTheStatus) {
  const json job = Job(R"({"phase": "Running", "generation": 3, "step": 91,
                           "lastCheckpoint": {"step": 100, "uri": "file:///c/step-100"}})");
  std::optional<json> patch = FiguresPatch(job, Figures(3, 96, 95), kNow);
  ASSERT_TRUE(patch);
  EXPECT_EQ((*patch)["status"]["lastCheckpoint"]["step"], 95);
  EXPECT_FALSE(FiguresPatch(job, Figures(3, 91, 95), kNow))
      << "rank 0 not past the status: its figures may be the ones it paused with";
}

TEST(FiguresPatch, AStepAheadWithTheKnownCheckpointWritesTheStepAlone) {
  const json job = Job(R"({"phase": "Scaling", "generation": 2, "step": 20,
                           "lastCheckpoint": {"step": 20, "uri": "file:///c/step-20"}})");
  std::optional<json> patch = FiguresPatch(job, Figures(2, 23, 20), kNow);
  ASSERT_TRUE(patch);
  EXPECT_EQ((*patch)["status"]["step"], 23);
  EXPECT_FALSE((*patch)["status"].contains("lastCheckpoint"));
}

TEST(FiguresPatch, ANewerCheckpointIsWrittenWhereTheStepIsCurrent) {
  const json job = Job(R"({"phase": "Running", "generation": 1, "step": 30})");
  std::optional<json> patch = FiguresPatch(job, Figures(1, 30, 30), kNow);
  ASSERT_TRUE(patch);
  EXPECT_FALSE((*patch)["status"].contains("step"));
  EXPECT_EQ((*patch)["status"]["lastCheckpoint"]["step"], 30);
}

TEST(FiguresPatch, OnlyATrainingStatusOfTheFiguresGenerationIsWritten) {
  for (const char* phase : {"Pending", "Suspended", "Succeeded", "Failed", "Recovering"})
    EXPECT_FALSE(
        FiguresPatch(Job(std::string(R"({"generation": 1, "step": 3, "phase": ")") + phase + "\"}"),
                     Figures(1, 9, 5), kNow))
        << phase;
  // The old generation's rank 0 trains on until the new one starts: its figures are not the
  // job's once the status names the new generation.
  EXPECT_FALSE(FiguresPatch(Job(R"({"phase": "Scaling", "generation": 3, "step": 3})"),
                            Figures(2, 9, 5), kNow));
  EXPECT_TRUE(FiguresPatch(Job(R"({"phase": "Running", "generation": 3, "step": 3})"),
                           Figures(3, 9, 5), kNow));
}

TEST(FiguresPatch, AnUnreadableStatusGetsNoPatch) {
  const StepFigures f = Figures(1, 9, 5);
  EXPECT_FALSE(FiguresPatch(json::array(), f, kNow));
  EXPECT_FALSE(FiguresPatch({{"metadata", {{"resourceVersion", "1"}}}}, f, kNow));
  EXPECT_FALSE(FiguresPatch(Job(R"("Running")"), f, kNow));
  EXPECT_FALSE(FiguresPatch(Job(R"({"phase": "Running", "step": "3"})"), f, kNow));
  EXPECT_FALSE(FiguresPatch(Job(R"({"phase": 7, "step": 3})"), f, kNow));
  // A hand-edited checkpoint without a step counts as none: the pushed one is written.
  std::optional<json> patch =
      FiguresPatch(Job(R"({"phase": "Running", "step": 3, "lastCheckpoint": "x"})"), f, kNow);
  ASSERT_TRUE(patch);
  EXPECT_EQ((*patch)["status"]["lastCheckpoint"]["step"], 5);
}

// status.checkpointInterval (spec.checkpoint.fullEverySteps auto): written when rank 0's plan
// changes, with or without a newer step, never when it is the one the status shows; and its
// change alone asks for no reconcile.
TEST(FiguresPatch, ANewCheckpointIntervalIsWrittenOnceAndAsksForNoReconcile) {
  StepFigures f = Figures(1, 12, 10);
  f.checkpoint_interval = {{"fullEverySteps", 240}, {"reason", "Optimal"}, {"failures", 0}};
  const json job = Job(R"({"phase": "Running", "generation": 1, "step": 12,
                           "lastCheckpoint": {"step": 10, "uri": "file:///c/step-10"}})");
  std::optional<json> patch = FiguresPatch(job, f, kNow);
  ASSERT_TRUE(patch);
  EXPECT_EQ((*patch)["status"]["checkpointInterval"], f.checkpoint_interval);
  EXPECT_FALSE((*patch)["status"].contains("step")) << "the step is the known one";
  json written = job;
  written["status"]["checkpointInterval"] = f.checkpoint_interval;
  EXPECT_FALSE(FiguresPatch(written, f, kNow)) << "the same plan: nothing to write";
  EXPECT_TRUE(OnlyFiguresChanged(job, written));
  f.checkpoint_interval["fullEverySteps"] = 170;
  f.checkpoint_interval["failures"] = 1;
  patch = FiguresPatch(written, f, kNow);
  ASSERT_TRUE(patch);
  EXPECT_EQ((*patch)["status"]["checkpointInterval"]["fullEverySteps"], 170);
  f.checkpoint_interval = nullptr;  // a fixed interval reports none: nothing is erased
  EXPECT_FALSE(FiguresPatch(written, f, kNow));
}

// A job update that moved nothing but the figures (the patcher's) asks for no reconcile.
TEST(FiguresPatch, OnlyAChangeOfTheFiguresIsAnUpdateThatAsksForNoReconcile) {
  const json before = Job(R"({"phase": "Running", "generation": 1, "step": 10, "members": ["a"],
                              "lastCheckpoint": {"step": 5}})");
  json after = before;
  after["metadata"]["resourceVersion"] = "42";
  after["metadata"]["managedFields"] = json::array({{{"manager", "tidal"}}});
  after["status"]["step"] = 12;
  after["status"]["loss"] = 1.5;
  after["status"]["tokensPerSecond"] = 10;
  after["status"]["lastCheckpoint"] = {{"step", 10}};
  EXPECT_TRUE(OnlyFiguresChanged(before, after));
  json members = after;
  members["status"]["members"] = json::array({"a", "b"});
  EXPECT_FALSE(OnlyFiguresChanged(before, members));
  json spec = after;
  spec["spec"] = {{"suspend", true}};
  EXPECT_FALSE(OnlyFiguresChanged(before, spec));
  json label = after;
  label["metadata"]["labels"] = {{"x", "y"}};
  EXPECT_FALSE(OnlyFiguresChanged(before, label));
}

}  // namespace
}  // namespace tidal::reconciler
