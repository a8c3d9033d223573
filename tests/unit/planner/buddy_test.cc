// Buddy copies' planning (operator/planner/buddy.h): who keeps whose copy, and after a loss
// where each rank's state is read from.
#include "operator/planner/buddy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

namespace tidal::planner {
namespace {

// Every rank is exactly one rank's ward, and no rank its own (beyond one rank).
void ExpectPermutationWithoutSelf(const std::vector<int>& ward) {
  std::set<int> seen(ward.begin(), ward.end());
  EXPECT_EQ(seen.size(), ward.size());
  for (size_t r = 0; r < ward.size() && ward.size() > 1; ++r)
    EXPECT_NE(ward[r], static_cast<int>(r)) << "rank " << r << " keeps its own copy";
}

TEST(BuddyWardsTest, OnOneNodeOrUnknownNodesTheRingFollowsRankOrder) {
  EXPECT_EQ(BuddyWards({"a", "a", "a"}), (std::vector<int>{2, 0, 1}));
  EXPECT_EQ(BuddyWards({"", "", "", ""}), (std::vector<int>{3, 0, 1, 2}));
  EXPECT_EQ(BuddyWards({"a"}), (std::vector<int>{0}));
  EXPECT_EQ(BuddyWards({}), (std::vector<int>{}));
}

TEST(BuddyWardsTest, EveryCopyIsOnAnotherNodeWhenNoNodeHoldsMoreThanHalfTheRanks) {
  const std::vector<std::vector<std::string>> layouts = {
      {"a", "a", "b", "b"},
      {"a", "a", "a", "a", "b", "b", "b", "b"},
      {"a", "b", "a", "b", "c", "c"},
      {"a", "a", "b", "c"},
      {"n1", "n1", "n1", "n2", "n2", "n3"},
  };
  for (const auto& nodes : layouts) {
    const std::vector<int> ward = BuddyWards(nodes);
    ExpectPermutationWithoutSelf(ward);
    for (size_t r = 0; r < nodes.size(); ++r)
      EXPECT_NE(nodes[r], nodes[ward[r]])
          << "rank " << r << " keeps rank " << ward[r] << "'s copy on its own node " << nodes[r];
  }
}

// The same over many seeded layouts: any ranks, any nodes.
TEST(BuddyWardsTest, OnRandomLayoutsCopiesCrossNodesWheneverNoNodeHoldsMoreThanHalf) {
  std::mt19937 rng(7);
  int checked = 0;
  for (int trial = 0; trial < 5000; ++trial) {
    const int n = 2 + static_cast<int>(rng() % 9), kinds = 1 + static_cast<int>(rng() % 5);
    std::vector<std::string> nodes;
    std::map<std::string, int> count;
    for (int r = 0; r < n; ++r) {
      nodes.push_back(std::string(1, static_cast<char>('a' + rng() % kinds)));
      ++count[nodes.back()];
    }
    const std::vector<int> ward = BuddyWards(nodes);
    ExpectPermutationWithoutSelf(ward);
    int most = 0;
    for (const auto& [node, c] : count) most = std::max(most, c);
    if (most > n / 2) continue;
    ++checked;
    for (int r = 0; r < n; ++r) ASSERT_NE(nodes[r], nodes[ward[r]]) << "trial " << trial;
  }
  EXPECT_GT(checked, 1000);
}

TEST(BuddyWardsTest, ANodeWithMostRanksStillGivesEveryRankOneWard) {
  const std::vector<std::string> nodes = {"a", "a", "a", "b"};
  const std::vector<int> ward = BuddyWards(nodes);
  ExpectPermutationWithoutSelf(ward);
  int across = 0;
  for (size_t r = 0; r < nodes.size(); ++r) across += nodes[r] != nodes[ward[r]];
  EXPECT_EQ(across, 2) << "b keeps one of a's copies and one of a's ranks keeps b's";
}

Holder H(const std::string& name, int rank, std::vector<HeldPartView> held) {
  return {name, rank, std::move(held)};
}

TEST(PlanBuddyRecoveryTest, ALostRankIsReadFromItsBuddyAtTheNewestStepEveryPartIsHeld) {
  // Generation 4 at 3 ranks, copies every step; rank 1 (w1) is lost. w2 keeps rank 1's copy,
  // w0 keeps rank 2's. w2 had not yet copied step 8 of rank 1 when it was lost.
  const std::vector<Holder> holders = {
      H("w0", 0, {{4, 0, 3, 7}, {4, 2, 3, 7}, {4, 0, 3, 8}, {4, 2, 3, 8}}),
      H("w2", 2, {{4, 2, 3, 7}, {4, 1, 3, 7}, {4, 2, 3, 8}}),
  };
  const BuddyRecovery plan = PlanBuddyRecovery(4, 3, holders);
  EXPECT_EQ(plan.step, 7);
  EXPECT_EQ(plan.sources, (std::vector<std::string>{"w0", "w2", "w2"}))
      << "rank 2's part is read from rank 2 itself, not from w0's copy";
  EXPECT_TRUE(plan.missing.empty());
}

TEST(PlanBuddyRecoveryTest, ARankLostWithItsBuddyLeavesNoStepAndIsNamed) {
  // 4 ranks, ring 0<-1<-2<-3<-0 (rank r+1 keeps rank r): ranks 1 and 2 lost together.
  const std::vector<Holder> holders = {
      H("w0", 0, {{2, 0, 4, 5}, {2, 3, 4, 5}}),
      H("w3", 3, {{2, 3, 4, 5}, {2, 2, 4, 5}}),
  };
  const BuddyRecovery plan = PlanBuddyRecovery(2, 4, holders);
  EXPECT_EQ(plan.step, 0);
  EXPECT_TRUE(plan.sources.empty());
  EXPECT_EQ(plan.missing, (std::vector<int>{1}));
}

TEST(PlanBuddyRecoveryTest, PartsOfAnotherGenerationOrWorldSizeOrBadRanksCountForNothing) {
  const std::vector<Holder> holders = {
      H("w0", 0, {{3, 0, 2, 9}, {2, 1, 2, 9}, {3, 1, 4, 9}, {3, 7, 2, 9}, {3, 1, 2, 0}}),
  };
  EXPECT_EQ(PlanBuddyRecovery(3, 2, holders).step, 0);
  EXPECT_EQ(PlanBuddyRecovery(3, 2, {H("w0", 0, {{3, 0, 2, 9}, {3, 1, 2, 9}})}).step, 9);
  EXPECT_EQ(PlanBuddyRecovery(3, 0, holders).step, 0);
}

TEST(PlanBuddyRecoveryTest, NoCopiesAtAllIsNoPlanAndNamesNoRank) {
  const BuddyRecovery plan = PlanBuddyRecovery(5, 2, {H("w0", 0, {})});
  EXPECT_EQ(plan.step, 0);
  EXPECT_TRUE(plan.missing.empty());
}

}  // namespace
}  // namespace tidal::planner
