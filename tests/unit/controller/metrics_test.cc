// The operator's metric definitions (operator/controller/metrics.h): what a scrape shows after
// the controller's calls, rendered by prometheus-cpp's own text serializer.
#include "operator/controller/metrics.h"

#include <gtest/gtest.h>
#include <prometheus/text_serializer.h>

#include <string>

namespace tidal::controller {
namespace {

std::string Render(const OperatorMetrics& m) {
  return prometheus::TextSerializer().Serialize(m.registry()->Collect());
}

bool Has(const std::string& text, const std::string& line) {
  return text.find(line + "\n") != std::string::npos;
}

OperatorMetrics::JobFigures Job(const std::string& phase, int64_t desired, int64_t current,
                                bool anomaly = false) {
  OperatorMetrics::JobFigures f;
  f.phase = phase;
  f.desired_gpus = desired;
  f.current_gpus = current;
  f.step = 120;
  f.generation = 3;
  f.loss_anomaly = anomaly;
  return f;
}

// Issue 50's sharing: each job's share, the cluster's GPUs by state, the give-back times.
TEST(OperatorMetrics, TheSharingShowsEachJobsShareTheClustersGpusAndGiveBackTimes) {
  OperatorMetrics m;
  auto job = Job("Running", 4, 4);
  job.share_gpus = 2;
  m.SetJob("ml", "a", job);
  m.SetClusterGpus(8, 6, 3);
  m.ObserveGiveBack(1.2);
  const std::string text = Render(m);
  EXPECT_TRUE(Has(text, R"(tidal_trainingjob_gpus_share{namespace="ml",trainingjob="a"} 2)"))
      << text;
  EXPECT_TRUE(Has(text, R"(tidal_cluster_gpus{state="shared"} 8)")) << text;
  EXPECT_TRUE(Has(text, R"(tidal_cluster_gpus{state="given"} 6)")) << text;
  EXPECT_TRUE(Has(text, R"(tidal_cluster_gpus{state="asked_by_others"} 3)")) << text;
  EXPECT_TRUE(Has(text, "tidal_cluster_give_back_seconds_count 1")) << text;
  m.ForgetJob("ml", "a");
  EXPECT_EQ(Render(m).find("tidal_trainingjob_gpus_share{"), std::string::npos);
}

TEST(OperatorMetrics, JobsAreCountedByPhaseAndTheirSeriesGoWithThem) {
  OperatorMetrics m;
  m.SetJob("ml", "a", Job("Running", 4, 2));
  m.SetJob("ml", "b", Job("Running", 2, 2));
  m.SetJob("ml", "c", Job("Suspended", 0, 0));
  std::string text = Render(m);
  EXPECT_TRUE(Has(text, R"(tidal_trainingjobs{phase="Running"} 2)")) << text;
  EXPECT_TRUE(Has(text, R"(tidal_trainingjobs{phase="Suspended"} 1)")) << text;
  EXPECT_TRUE(Has(text, R"(tidal_trainingjobs{phase="Failed"} 0)")) << "every phase has a series";
  EXPECT_TRUE(Has(text, R"(tidal_trainingjob_gpus_desired{namespace="ml",trainingjob="a"} 4)"))
      << text;
  EXPECT_TRUE(Has(text, R"(tidal_trainingjob_gpus_current{namespace="ml",trainingjob="a"} 2)"));

  EXPECT_TRUE(Has(text, R"(tidal_trainingjob_step{namespace="ml",trainingjob="a"} 120)"));
  EXPECT_TRUE(Has(text, R"(tidal_trainingjob_generation{namespace="ml",trainingjob="a"} 3)"));
  EXPECT_TRUE(
      Has(text, R"(tidal_trainingjob_phase{namespace="ml",phase="Running",trainingjob="a"} 1)"));
  EXPECT_TRUE(
      Has(text, R"(tidal_trainingjob_phase{namespace="ml",phase="Paused",trainingjob="a"} 0)"));

  m.SetJob("ml", "a", Job("Scaling", 4, 4));  // a phase change moves the job between counts
  m.CountRestart("ml", "a");
  m.ForgetJob("ml", "b");
  text = Render(m);
  EXPECT_TRUE(Has(text, R"(tidal_trainingjobs{phase="Running"} 0)")) << text;
  EXPECT_TRUE(Has(text, R"(tidal_trainingjobs{phase="Scaling"} 1)")) << text;
  EXPECT_EQ(text.find(R"(trainingjob="b")"), std::string::npos) << "a deleted job's series stay";
  EXPECT_TRUE(Has(text, R"(tidal_trainingjob_restarts_total{namespace="ml",trainingjob="a"} 1)"));
  // Issue 47: a resume that skipped corrupt checkpoints is counted (from 0, for increase()).
  EXPECT_TRUE(Has(
      text,
      R"(tidal_trainingjob_corrupt_checkpoint_resumes_total{namespace="ml",trainingjob="a"} 0)"))
      << text;
  m.CountCorruptResume("ml", "a");
  EXPECT_TRUE(Has(
      Render(m),
      R"(tidal_trainingjob_corrupt_checkpoint_resumes_total{namespace="ml",trainingjob="a"} 1)"));
  m.ForgetJob("ml", "a");
  EXPECT_EQ(Render(m).find(R"(trainingjob="a")"), std::string::npos);
}

TEST(OperatorMetrics, ALossAnomalyShowsWhileItsConditionHoldsAndIsCountedOnce) {
  OperatorMetrics m;
  m.SetJob("ml", "a", Job("Running", 2, 2));
  std::string text = Render(m);
  EXPECT_TRUE(Has(text, R"(tidal_trainingjob_loss_anomaly{namespace="ml",trainingjob="a"} 0)"));
  EXPECT_TRUE(
      Has(text, R"(tidal_trainingjob_loss_anomalies_total{namespace="ml",trainingjob="a"} 0)"))
      << text;
  m.SetJob("ml", "a", Job("Paused", 2, 2, true));
  m.SetJob("ml", "a", Job("Paused", 2, 2, true));  // the same anomaly, seen again
  text = Render(m);
  EXPECT_TRUE(Has(text, R"(tidal_trainingjob_loss_anomaly{namespace="ml",trainingjob="a"} 1)"));
  EXPECT_TRUE(
      Has(text, R"(tidal_trainingjob_loss_anomalies_total{namespace="ml",trainingjob="a"} 1)"));
  m.SetJob("ml", "a", Job("Running", 2, 2));
  m.SetJob("ml", "a", Job("Running", 2, 2, true));  // a new one
  EXPECT_TRUE(Has(Render(m),
                  R"(tidal_trainingjob_loss_anomalies_total{namespace="ml",trainingjob="a"} 2)"));
}

TEST(OperatorMetrics, ReconcilesRescalesAndApiErrorsLandInTheirSeries) {
  OperatorMetrics m;
  m.ObserveReconcile(0.004, OperatorMetrics::PassResult::kOk);
  m.ObserveReconcile(0.5, OperatorMetrics::PassResult::kError);
  m.ObserveReconcile(0.001, OperatorMetrics::PassResult::kAwaiting);
  m.ObserveRescale("scale_up", 7.5);
  m.ObserveRescale("no-such-kind", 1);  // ignored rather than a new series
  m.CountApiError("put", 409);
  m.CountApiError("put", 409);
  m.ObserveApiRequest("put", 0.02);
  m.ObserveApiRequest("put", 0.2);
  m.ObservePlanWrites(0.03, true);
  m.ObservePlanWrites(0.5, false);
  m.ObservePlanWrites(0.01, true);
  m.SetQueueDepth(3);
  m.SetLeader(true);
  const std::string text = Render(m);
  EXPECT_TRUE(Has(text, R"(tidal_operator_reconcile_duration_seconds_count{result="ok"} 1)"))
      << text;
  EXPECT_TRUE(Has(text, R"(tidal_operator_reconcile_duration_seconds_count{result="error"} 1)"));
  EXPECT_TRUE(Has(text, R"(tidal_operator_reconcile_duration_seconds_count{result="awaiting"} 1)"));
  EXPECT_TRUE(Has(text, R"(tidal_trainingjob_rescale_duration_seconds_sum{kind="scale_up"} 7.5)"));
  EXPECT_TRUE(Has(text, R"(tidal_operator_api_request_duration_seconds_count{verb="put"} 2)"))
      << text;
  EXPECT_TRUE(Has(text, R"(tidal_trainingjob_rescale_duration_seconds_count{kind="start"} 0)"));
  EXPECT_TRUE(Has(text, R"(tidal_operator_plan_writes_duration_seconds_count{result="ok"} 2)"));
  EXPECT_TRUE(Has(text, R"(tidal_operator_plan_writes_duration_seconds_sum{result="error"} 0.5)"));
  EXPECT_EQ(text.find("no-such-kind"), std::string::npos);
  EXPECT_TRUE(Has(text, R"(tidal_operator_api_errors_total{code="409",verb="put"} 2)")) << text;
  EXPECT_TRUE(Has(text, "tidal_operator_workqueue_depth 3"));
  EXPECT_TRUE(Has(text, "tidal_operator_leader 1"));
}

}  // namespace
}  // namespace tidal::controller
