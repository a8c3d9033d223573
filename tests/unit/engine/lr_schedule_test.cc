// Warmup + cosine, and adaptive warmup holding the LR while the gradient norm is erratic.
#include "worker/engine/lr_schedule.h"

#include <gtest/gtest.h>

namespace tidal::engine {
namespace {

OptimizationSpec Spec(int64_t warmup, bool adaptive, int64_t max_steps = 100) {
  OptimizationSpec s;
  s.learning_rate = 1.0;
  s.min_lr_ratio = 0.1;
  s.max_steps = max_steps;
  s.warmup.steps = warmup;
  s.warmup.adaptive = adaptive;
  s.warmup.window = 4;
  s.warmup.cv_threshold = 0.5;
  return s;
}

TEST(LrScheduleTest, LinearWarmupThenCosineToTheFloor) {
  LrSchedule lr(Spec(10, false));
  for (int i = 1; i <= 10; ++i) EXPECT_DOUBLE_EQ(lr.Next(1.0), i / 10.0) << "step " << i;
  double previous = 1.0;
  double last = 0;
  for (int i = 11; i <= 100; ++i) {
    last = lr.Next(1.0);
    EXPECT_LE(last, previous + 1e-12);
    previous = last;
  }
  EXPECT_NEAR(last, 0.1, 1e-12);
}

TEST(LrScheduleTest, NoWarmupStartsAtThePeak) {
  LrSchedule lr(Spec(0, false));
  EXPECT_NEAR(lr.Next(1.0), 1.0, 1e-3);
}

TEST(LrScheduleTest, AdaptiveWarmupHoldsWhileGradNormIsErratic) {
  LrSchedule lr(Spec(10, true));
  const double noisy[] = {0.1, 5.0, 0.2, 8.0, 0.1, 9.0, 0.3, 7.0};
  double value = 0;
  for (double n : noisy) value = lr.Next(n);
  // The window (4) filled after 4 steps; from then on the variation stays above 0.5.
  EXPECT_EQ(lr.warmup_progress(), 3);
  EXPECT_EQ(lr.held_steps(), 5);
  EXPECT_DOUBLE_EQ(value, 0.3);
  // Calm gradients resume warmup.
  for (int i = 0; i < 20; ++i) value = lr.Next(1.0);
  EXPECT_FALSE(lr.in_warmup());
}

TEST(LrScheduleTest, AdaptiveWarmupDoesNotHoldOnSteadyNorms) {
  LrSchedule lr(Spec(10, true));
  for (int i = 0; i < 10; ++i) lr.Next(1.0 + 0.01 * (i % 2));
  EXPECT_EQ(lr.held_steps(), 0);
  EXPECT_FALSE(lr.in_warmup());
}

TEST(LrScheduleTest, AdaptiveHoldIsBoundedByMaxExtraSteps) {
  auto spec = Spec(5, true);
  spec.warmup.max_extra_steps = 3;
  LrSchedule lr(spec);
  for (int i = 0; i < 30; ++i) lr.Next(i % 2 ? 10.0 : 0.1);
  EXPECT_EQ(lr.held_steps(), 3);
  EXPECT_FALSE(lr.in_warmup());
}

}  // namespace
}  // namespace tidal::engine
