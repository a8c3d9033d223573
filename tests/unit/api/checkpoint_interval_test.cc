// spec.checkpoint.fullEverySteps: auto — Young's interval from the measured cost and the
// failure rate estimated with expectedMTBF as the prior, in whole steps within the bounds; the
// duration syntax of expectedMTBF.
#include "api/checkpoint_interval.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace tidal::api {
namespace {

IntervalInputs Inputs(double cost, double step, int64_t failures, double trained,
                      double mtbf = 3600, int64_t min_steps = 10, int64_t max_steps = 10000) {
  IntervalInputs in;
  in.spec.expected_mtbf_seconds = mtbf;
  in.spec.min_steps = min_steps;
  in.spec.max_steps = max_steps;
  in.cost_seconds = cost;
  in.step_seconds = step;
  in.failures = failures;
  in.trained_seconds = trained;
  return in;
}

TEST(CheckpointIntervalTest, TheTableOfCostAndMtbfGivesYoungsIntervalInWholeStepsWithinTheBounds) {
  struct Row {
    const char* what;
    IntervalInputs in;
    int64_t steps;
    IntervalPlan::Reason reason;
    double mtbf;
  };
  using R = IntervalPlan::Reason;
  const Row rows[] = {
      // √(2 · 2 s · 3600 s) = 120 s at 1 s a step.
      {"the prior alone", Inputs(2, 1, 0, 0), 120, R::kOptimal, 3600},
      // √(2 · 8 · 3600) = 240 s: four times the cost, twice the interval.
      {"a dearer checkpoint", Inputs(8, 1, 0, 0), 240, R::kOptimal, 3600},
      // M = (3600 + 3600) / (1 + 3) = 1800 s: √(2 · 2 · 1800) = 84.85 s → 85 steps.
      {"three failures in an hour", Inputs(2, 1, 3, 3600), 85, R::kOptimal, 1800},
      // M = (3600 + 32400) / 1 = 36000 s: √(2 · 2 · 36000) = 379.47 s → 379 steps.
      {"nine hours without a failure", Inputs(2, 1, 0, 32400), 379, R::kOptimal, 36000},
      // 120 s at 0.25 s a step.
      {"a faster step", Inputs(2, 0.25, 0, 0), 480, R::kOptimal, 3600},
      // √(2 · 0.001 · 3600) = 2.68 s → 3 steps, under the least.
      {"a cheap checkpoint", Inputs(0.001, 1, 0, 0), 10, R::kAtMinimum, 3600},
      {"above the most", Inputs(2, 0.001, 0, 0), 10000, R::kAtMaximum, 3600},
      {"cost not measured yet", Inputs(0, 1, 0, 0), 10, R::kUnmeasured, 3600},
      {"step time not measured yet", Inputs(2, 0, 2, 0), 10, R::kUnmeasured, 1200},
      {"a negative cost is none", Inputs(-1, 1, 0, 0), 10, R::kUnmeasured, 3600},
      {"a NaN step time is none", Inputs(2, std::numeric_limits<double>::quiet_NaN(), 0, 0), 10,
       R::kUnmeasured, 3600},
      // A step time so small the quotient would overflow int64: the bound, no UB.
      {"a denormal step time", Inputs(2, 1e-300, 0, 0), 10000, R::kAtMaximum, 3600},
      {"bounds that meet", Inputs(2, 1, 0, 0, 3600, 50, 50), 50, R::kAtMaximum, 3600},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.what);
    const IntervalPlan plan = PlanCheckpointInterval(row.in);
    EXPECT_EQ(plan.steps, row.steps);
    EXPECT_EQ(plan.reason, row.reason) << ReasonName(plan.reason);
    EXPECT_NEAR(plan.mtbf_seconds, row.mtbf, 1e-9);
    if (row.reason == R::kUnmeasured) {
      EXPECT_EQ(plan.optimum_seconds, 0);
      EXPECT_EQ(plan.expected_waste, 0);
    } else {
      EXPECT_NEAR(plan.optimum_seconds, std::sqrt(2 * row.in.cost_seconds * plan.mtbf_seconds),
                  1e-9);
    }
  }
}

TEST(CheckpointIntervalTest, TheExpectedWasteIsLeastAtTheOptimumItPlans) {
  // C/τ + τ/(2M) at Young's τ is √(2C/M); any other interval wastes more.
  const IntervalInputs in = Inputs(2, 1, 0, 0);
  const IntervalPlan plan = PlanCheckpointInterval(in);
  EXPECT_NEAR(plan.expected_waste, 2.0 / 120 + 120.0 / 7200, 1e-12);
  for (int64_t other : {60, 100, 140, 240}) {
    const double tau = static_cast<double>(other);
    EXPECT_GT(2 / tau + tau / 7200, plan.expected_waste) << other;
  }
}

TEST(CheckpointIntervalTest, MoreFailuresNeverLengthenTheInterval) {
  int64_t before = std::numeric_limits<int64_t>::max();
  for (int64_t failures = 0; failures < 50; ++failures) {
    const IntervalPlan plan = PlanCheckpointInterval(Inputs(3, 0.5, failures, 7200, 86400, 1));
    EXPECT_LE(plan.steps, before) << failures;
    before = plan.steps;
  }
  EXPECT_LT(before, PlanCheckpointInterval(Inputs(3, 0.5, 0, 7200, 86400, 1)).steps);
}

TEST(CheckpointIntervalTest, DurationsParseAsKubernetesWritesThem) {
  struct Row {
    const char* text;
    double seconds;
  };
  for (const Row& row : {Row{"24h", 86400}, Row{"1h30m", 5400}, Row{"90m", 5400},
                         Row{"3600s", 3600}, Row{"2.5h", 9000}, Row{"1h0m30s", 3630}}) {
    auto parsed = ParseDurationSeconds(row.text);
    ASSERT_TRUE(parsed.ok()) << row.text << ": " << parsed.status().message();
    EXPECT_DOUBLE_EQ(*parsed, row.seconds) << row.text;
  }
}

TEST(CheckpointIntervalTest, BadDurationsAreRefusedSayingWhatWasExpected) {
  struct Row {
    std::string text;
    const char* says;
  };
  for (const Row& row :
       {Row{"", "empty"}, Row{"24", "has no unit"}, Row{"1d", "unit \"d\""},
        Row{"h", "expected a number"}, Row{"0s", "longer than 0s"}, Row{"1.2.3h", "not a number"},
        Row{"-1h", "expected a number"}, Row{"90ms", "expected a number"},
        Row{"1000000h", "at most 100 years"}, Row{std::string(400, '9') + "h", "at most 100"}}) {
    auto parsed = ParseDurationSeconds(row.text);
    ASSERT_FALSE(parsed.ok()) << row.text;
    EXPECT_NE(parsed.status().message().find(row.says), std::string::npos)
        << row.text << ": " << parsed.status().message();
    EXPECT_NE(parsed.status().message().find("24h, 1h30m"), std::string::npos);
  }
}

}  // namespace
}  // namespace tidal::api
