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

TEST(OperatorMetrics, JobsAreCountedByPhaseAndTheirSeriesGoWithThem) {
  OperatorMetrics m;
  m.SetJob("ml", "a", "Running", 4, 2);
  m.SetJob("ml", "b", "Running", 2, 2);
  m.SetJob("ml", "c", "Suspended", 0, 0);
  std::string text = Render(m);
  EXPECT_TRUE(Has(text, R"(tidal_trainingjobs{phase="Running"} 2)")) << text;
  EXPECT_TRUE(Has(text, R"(tidal_trainingjobs{phase="Suspended"} 1)")) << text;
  EXPECT_TRUE(Has(text, R"(tidal_trainingjobs{phase="Failed"} 0)")) << "every phase has a series";
  EXPECT_TRUE(Has(text, R"(tidal_trainingjob_gpus_desired{namespace="ml",trainingjob="a"} 4)"))
      << text;
  EXPECT_TRUE(Has(text, R"(tidal_trainingjob_gpus_current{namespace="ml",trainingjob="a"} 2)"));

  m.SetJob("ml", "a", "Scaling", 4, 4);  // a phase change moves the job between counts
  m.CountRestart("ml", "a");
  m.ForgetJob("ml", "b");
  text = Render(m);
  EXPECT_TRUE(Has(text, R"(tidal_trainingjobs{phase="Running"} 0)")) << text;
  EXPECT_TRUE(Has(text, R"(tidal_trainingjobs{phase="Scaling"} 1)")) << text;
  EXPECT_EQ(text.find(R"(trainingjob="b")"), std::string::npos) << "a deleted job's series stay";
  EXPECT_TRUE(Has(text, R"(tidal_trainingjob_restarts_total{namespace="ml",trainingjob="a"} 1)"));
  m.ForgetJob("ml", "a");
  EXPECT_EQ(Render(m).find(R"(trainingjob="a")"), std::string::npos);
}

TEST(OperatorMetrics, ReconcilesRescalesAndApiErrorsLandInTheirSeries) {
  OperatorMetrics m;
  m.ObserveReconcile(0.004, true);
  m.ObserveReconcile(0.5, false);
  m.ObserveRescale("scale_up", 7.5);
  m.ObserveRescale("no-such-kind", 1);  // ignored rather than a new series
  m.CountApiError("put", 409);
  m.CountApiError("put", 409);
  m.SetQueueDepth(3);
  m.SetLeader(true);
  const std::string text = Render(m);
  EXPECT_TRUE(Has(text, R"(tidal_operator_reconcile_duration_seconds_count{result="ok"} 1)"))
      << text;
  EXPECT_TRUE(Has(text, R"(tidal_operator_reconcile_duration_seconds_count{result="error"} 1)"));
  EXPECT_TRUE(Has(text, R"(tidal_trainingjob_rescale_duration_seconds_sum{kind="scale_up"} 7.5)"));
  EXPECT_TRUE(Has(text, R"(tidal_trainingjob_rescale_duration_seconds_count{kind="start"} 0)"));
  EXPECT_EQ(text.find("no-such-kind"), std::string::npos);
  EXPECT_TRUE(Has(text, R"(tidal_operator_api_errors_total{code="409",verb="put"} 2)")) << text;
  EXPECT_TRUE(Has(text, "tidal_operator_workqueue_depth 3"));
  EXPECT_TRUE(Has(text, "tidal_operator_leader 1"));
}

}  // namespace
}  // namespace tidal::controller
