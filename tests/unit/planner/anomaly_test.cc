// The anomaly rule of spec.anomaly (operator/planner/anomaly.h): a sustained rise matches,
// noise does not, and the GPU utilisation clause holds, blocks or is skipped.
#include "operator/planner/anomaly.h"

#include <gtest/gtest.h>

namespace tidal::planner {
namespace {

api::AnomalySpec Rule(double rise_percent = 15, int64_t steps = 3, double min_util = 40) {
  api::AnomalySpec r;
  r.loss_rise_percent = rise_percent;
  r.consecutive_steps = steps;
  r.min_gpu_util_percent = min_util;
  return r;
}

std::vector<StepSample> Losses(int64_t first_step, const std::vector<double>& losses,
                               std::optional<double> util = std::nullopt) {
  std::vector<StepSample> out;
  for (size_t i = 0; i < losses.size(); ++i)
    out.push_back({first_step + static_cast<int64_t>(i), losses[i], util});
  return out;
}

TEST(AnomalyRule, ARiseOverTheConsecutiveStepsMatchesWithItsStepsAndSize) {
  auto found = FindLossAnomaly(Losses(10, {2.0, 1.9, 2.0, 2.1, 2.4}), Rule(), 0);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->first_step, 11);
  EXPECT_EQ(found->last_step, 14);
  EXPECT_DOUBLE_EQ(found->from_loss, 1.9);
  EXPECT_DOUBLE_EQ(found->to_loss, 2.4);
  EXPECT_NEAR(found->rise_percent, 26.3158, 1e-3);
  EXPECT_NE(found->message.find("steps 11-14"), std::string::npos) << found->message;
}

TEST(AnomalyRule, NoisyLossWithLargeSwingsNeverMatches) {
  // ±30% every step: each rise is larger than the threshold, but none lasts 3 steps.
  std::vector<double> losses;
  for (int i = 0; i < 60; ++i) losses.push_back(2.0 * (i % 2 ? 1.3 : 0.7));
  EXPECT_FALSE(FindLossAnomaly(Losses(1, losses), Rule(), 0).has_value());
}

TEST(AnomalyRule, ARiseOfFewerStepsOrBelowThePercentDoesNotMatch) {
  EXPECT_FALSE(FindLossAnomaly(Losses(1, {1.0, 1.2, 1.5, 1.4}), Rule(), 0).has_value());
  EXPECT_FALSE(FindLossAnomaly(Losses(1, {1.0, 1.04, 1.08, 1.12}), Rule(), 0).has_value());
  EXPECT_TRUE(FindLossAnomaly(Losses(1, {1.0, 1.04, 1.08, 1.16}), Rule(), 0).has_value());
}

TEST(AnomalyRule, AGapInTheStepsBreaksTheRun) {
  std::vector<StepSample> steps = Losses(1, {1.0, 1.1});
  for (StepSample s : Losses(5, {1.2, 1.3})) steps.push_back(s);
  EXPECT_FALSE(FindLossAnomaly(steps, Rule(), 0).has_value());
}

TEST(AnomalyRule, RisesEndingAtOrBeforeTheAcknowledgedStepAreIgnored) {
  const auto steps = Losses(1, {1.0, 1.1, 1.2, 1.3, 1.4});
  EXPECT_EQ(FindLossAnomaly(steps, Rule(), 0)->last_step, 4);
  EXPECT_EQ(FindLossAnomaly(steps, Rule(), 4)->last_step, 5);
  EXPECT_FALSE(FindLossAnomaly(steps, Rule(), 5).has_value());
}

TEST(AnomalyRule, BusyGpusBlockTheRuleAndIdleOnesLetItMatch) {
  const std::vector<double> rising = {1.0, 1.1, 1.2, 1.3};
  EXPECT_FALSE(FindLossAnomaly(Losses(1, rising, 95.0), Rule(), 0).has_value());
  auto idle = FindLossAnomaly(Losses(1, rising, 12.0), Rule(), 0);
  ASSERT_TRUE(idle.has_value());
  EXPECT_TRUE(idle->utilization_measured);
  EXPECT_DOUBLE_EQ(idle->max_utilization_percent, 12.0);
  // One busy step in the rise is enough to block it.
  auto steps = Losses(1, rising, 12.0);
  steps[2].gpu_utilization_percent = 40.0;
  EXPECT_FALSE(FindLossAnomaly(steps, Rule(), 0).has_value());
}

TEST(AnomalyRule, WithoutUtilisationTheClauseIsSkippedAndTheMessageSaysSo) {
  auto found = FindLossAnomaly(Losses(1, {1.0, 1.1, 1.2, 1.3}), Rule(), 0);
  ASSERT_TRUE(found.has_value());
  EXPECT_FALSE(found->utilization_measured);
  EXPECT_NE(found->message.find("GPU utilisation not reported"), std::string::npos);
  EXPECT_NE(DescribeRule(Rule(), false).find("clause is skipped"), std::string::npos);
  EXPECT_EQ(DescribeRule(Rule(), true),
            "loss up > 15% over 3 consecutive rising steps while GPU utilisation < 40%");
}

TEST(AnomalyRule, AStepSeenTwiceCountsWithItsNewestSample) {
  // A recovery replayed steps 3-4 from a checkpoint: the replay's losses fall.
  std::vector<StepSample> steps = Losses(1, {1.0, 1.1, 1.2, 1.3});
  for (StepSample s : Losses(3, {1.05, 1.0})) steps.push_back(s);
  EXPECT_FALSE(FindLossAnomaly(steps, Rule(), 0).has_value());
}

TEST(AnomalyRule, ALossOfZeroOrLessNeverStartsARise) {
  EXPECT_FALSE(FindLossAnomaly(Losses(1, {0.0, 0.1, 0.2, 0.3}), Rule(), 0).has_value());
}

}  // namespace
}  // namespace tidal::planner
