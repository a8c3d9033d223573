// microBatchSize auto's policy (worker/engine/auto_micro_batch.h): how the size grows, when it
// stops, what an out-of-memory or a peak over the target leaves. The Trainer's end-to-end
// behaviour (a real memory meter, injected allocation failures, the loss curve unchanged) is
// tests/integration/auto_micro_batch_test.cc.
#include "worker/engine/auto_micro_batch.h"

#include <gtest/gtest.h>

namespace tidal::engine {
namespace {

TEST(AutoMicroBatchPolicyTest, GrowsByAFifthAtLeastOneRowAndNeverPastTheRowsOrTheCap) {
  AutoMicroBatch a;
  EXPECT_EQ(a.Next(64), 2);  // 1 × 1.2 rounds down to 1: one more
  a.size = 5;
  EXPECT_EQ(a.Next(64), 6);
  a.size = 10;
  EXPECT_EQ(a.Next(64), 12);
  EXPECT_EQ(a.Next(11), 11);  // the rows a rank runs per step
  a.cap = 10;
  EXPECT_EQ(a.Next(64), 10);  // not past the cap
  EXPECT_EQ(a.Max(64), 10);
  EXPECT_EQ(a.Max(8), 8);
}

TEST(AutoMicroBatchPolicyTest, AStepRunsWithinOneAndTheLargestAllowed) {
  AutoMicroBatch a{.size = 40, .cap = 0};
  EXPECT_EQ(a.Clamp(16), 16);  // a rescale left fewer rows per rank
  a.size = 0;
  EXPECT_EQ(a.Clamp(16), 1);
  a = {.size = 12, .cap = 6};
  EXPECT_EQ(a.Clamp(16), 6);
}

TEST(AutoMicroBatchPolicyTest, AnOutOfMemoryCapsBelowTheFailedSizeAndRunsAgainSmaller) {
  AutoMicroBatch a;
  a.ShrinkAfterOutOfMemory(12);
  EXPECT_EQ(a.cap, 11);
  EXPECT_EQ(a.size, 10);  // 12 / 1.2
  a.ShrinkAfterOutOfMemory(3);
  EXPECT_EQ(a.cap, 2);
  EXPECT_EQ(a.size, 2);
  a.ShrinkAfterOutOfMemory(2);
  EXPECT_EQ(a.cap, 1);
  EXPECT_EQ(a.size, 1);
  EXPECT_EQ(a.Next(64), 1) << "a failed size is never tried again";
}

TEST(AutoMicroBatchPolicyTest, TheNextSizeIsJudgedByThePeakScaledFromWhatTheRowsAdded) {
  // 100 bytes resident before the step, 200 at its peak with 2 rows: 50 a row, 250 at 3.
  EXPECT_FALSE(AutoMicroBatch::Judge(2, 3, 100, 200, 260).blocked);
  EXPECT_TRUE(AutoMicroBatch::Judge(2, 3, 100, 200, 240).blocked);
  EXPECT_TRUE(AutoMicroBatch::Judge(2, 2, 100, 200, 1e9).blocked) << "no larger size to go to";
  EXPECT_FALSE(AutoMicroBatch::Judge(2, 3, 100, 200, 240).over);
  EXPECT_TRUE(AutoMicroBatch::Judge(2, 3, 100, 200, 190).over);
  EXPECT_FALSE(AutoMicroBatch::Judge(1, 2, 100, 200, 190).over) << "1 is the floor";
}

TEST(AutoMicroBatchPolicyTest, TheRanksVerdictsGrowHoldOrCutForAll) {
  AutoMicroBatch a{.size = 5, .cap = 0};
  EXPECT_NE(a.After(5, 6, /*any_blocked=*/false, /*any_over=*/false), "");
  EXPECT_EQ(a.size, 6);
  EXPECT_EQ(a.After(6, 7, /*any_blocked=*/true, /*any_over=*/false), "");
  EXPECT_EQ(a.size, 6);
  EXPECT_EQ(a.cap, 0);
  EXPECT_EQ(a.After(6, 7, /*any_blocked=*/true, /*any_over=*/true), "peak over the memory target");
  EXPECT_EQ(a.size, 5);
  EXPECT_EQ(a.cap, 5);
}

TEST(AutoMicroBatchPolicyTest, RanksAgreeOnTheLeastSizeAndCapAndAProcessCapBoundsIt) {
  constexpr int64_t kNoCap = 1'000'000;
  AutoMicroBatch a{.size = 8, .cap = 0};
  a.Agree(4, kNoCap, kNoCap);
  EXPECT_EQ(a.size, 4);
  EXPECT_EQ(a.cap, 0);
  a.Agree(4, 6, kNoCap);
  EXPECT_EQ(a.cap, 6);
  a.CapAt(0);
  EXPECT_EQ(a.cap, 6);
  a.CapAt(9);
  EXPECT_EQ(a.cap, 6);
  a.CapAt(3);
  EXPECT_EQ(a.cap, 3);
}

}  // namespace
}  // namespace tidal::engine
