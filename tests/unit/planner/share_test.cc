// ShareGpus: how TrainingJobs share the cluster's GPUs (operator/planner/share.h). Every answer
// in these tests, the scenarios' and a thousand random clusters', is also checked against the
// invariants (CheckInvariants): no GPU given twice, a running job never below its minimum, a
// waiting job only kept out by minima of running or earlier jobs, no job short of a step that a
// lower priority's headroom would give it, and the same cluster always the same answer.
#include "operator/planner/share.h"

#include <gtest/gtest.h>

#include <numeric>
#include <random>

namespace tidal::planner {
namespace {

using std::chrono::seconds;
using std::chrono::system_clock;

ShareJob Job(const std::string& key, int64_t min, int64_t max, int64_t current = 0,
             int64_t priority = 0, int64_t weight = 1, int64_t step = 1, int age = 0) {
  ShareJob j;
  j.key = key;
  j.priority = priority;
  j.weight = weight;
  j.created = system_clock::time_point(seconds(1000 - age));
  j.min_gpus = min;
  for (int64_t n = min; n <= max; n += step) j.allowed.push_back(n);
  j.wanted = max;
  j.current = current;
  return j;
}

int64_t NextStep(const ShareJob& j, int64_t now) {
  for (int64_t n : j.allowed)
    if (n > now && n <= std::max(j.wanted, j.min_gpus)) return n;
  return 0;
}

void CheckInvariants(const ShareInput& in, const std::map<std::string, Share>& out) {
  ASSERT_EQ(out.size(), in.jobs.size());
  int64_t given = 0, running_minima = 0;
  for (const ShareJob& j : in.jobs) {
    SCOPED_TRACE(j.key);
    const Share& s = out.at(j.key);
    given += s.gpus;
    if (j.current > 0) {
      running_minima += j.min_gpus;
      EXPECT_TRUE(s.admitted) << "a running job is never taken below its minimum";
    }
    if (j.current == 0) {
      // Admitted exactly when its minimum fits beside the minima of running jobs and of jobs
      // ahead of it, and the pods that outrank it: recomputed here from the rules.
      int64_t ahead = 0, claim = 0;
      for (const ShareJob& o : in.jobs) {
        if (&o == &j || !out.at(o.key).admitted) continue;
        const bool before = o.priority > j.priority ||
                            (o.priority == j.priority && o.created < j.created) ||
                            (o.priority == j.priority && o.created == j.created && o.key < j.key);
        if (o.current > 0 || before) ahead += o.min_gpus;
      }
      for (const WaitingPod& p : in.waiting)
        if (Yields(j.priority, p.priority, in.yield_to_priority)) claim += p.gpus;
      EXPECT_EQ(s.admitted, in.gpus - ahead - claim >= j.min_gpus)
          << (s.admitted ? "admitted past minima or pods ahead of it"
                         : "a waiting job whose minimum fits");
    }
    if (!s.admitted) {
      EXPECT_EQ(s.gpus, 0);
      EXPECT_NE(s.reason.find("waiting"), std::string::npos) << s.reason;
      continue;
    }
    EXPECT_GE(s.gpus, j.min_gpus);
    EXPECT_LE(s.gpus, std::max(j.wanted, j.min_gpus));
    EXPECT_TRUE(s.gpus == j.min_gpus ||
                std::find(j.allowed.begin(), j.allowed.end(), s.gpus) != j.allowed.end())
        << s.gpus << " is no count its batch allows";
    EXPECT_EQ(s.urgent && s.gpus >= j.current, false) << "urgent without a shrink";
  }
  EXPECT_LE(given, std::max(in.gpus, running_minima)) << "a GPU given twice";
  // Priorities: with no pods in the way, a job short of its next step does not find that step
  // in the headroom of jobs of a lower priority plus what nobody was given.
  if (in.waiting.empty()) {
    const int64_t unused = std::max<int64_t>(in.gpus - given, 0);
    for (const ShareJob& j : in.jobs) {
      const Share& s = out.at(j.key);
      const int64_t next = NextStep(j, s.gpus);
      if (!s.admitted || next == 0) continue;
      int64_t lower = 0;
      for (const ShareJob& o : in.jobs)
        if (o.priority < j.priority && out.at(o.key).admitted)
          lower += out.at(o.key).gpus - o.min_gpus;
      EXPECT_LT(lower + unused, next - s.gpus)
          << j.key << " at " << s.gpus << " is short of a step lower priorities hold";
    }
  }
  // The same cluster, the same answer: nothing but rule 1 reads the current sizes, so jobs
  // moved to their shares (the admitted started) change no one's share (no flapping).
  ShareInput moved = in;
  for (ShareJob& j : moved.jobs)
    if (out.at(j.key).admitted) j.current = out.at(j.key).gpus;
  const auto again = ShareGpus(moved);
  for (const ShareJob& j : in.jobs)
    EXPECT_EQ(again.at(j.key).gpus, out.at(j.key).gpus) << j.key << " moves once it has its share";
}

std::map<std::string, Share> Shares(const ShareInput& in) {
  auto out = ShareGpus(in);
  CheckInvariants(in, out);
  return out;
}

TEST(ShareGpus, TheHeadroomAboveTheMinimaIsSplitByWeight) {
  ShareInput in;
  in.gpus = 16;
  in.jobs = {Job("a/light", 1, 16, 0, 0, 1), Job("a/also-light", 1, 16, 0, 0, 1, 1, 1),
             Job("b/heavy", 1, 16, 0, 0, 2, 1, 2)};
  const auto s = Shares(in);
  // 13 GPUs above the three minima: 3.25, 3.25, 6.5 by weight, in whole GPUs.
  EXPECT_EQ(s.at("a/light").gpus + s.at("a/also-light").gpus + s.at("b/heavy").gpus, 16);
  EXPECT_NEAR(s.at("b/heavy").gpus - 1, 6.5, 1.0);
  EXPECT_NEAR(s.at("a/light").gpus - 1, 3.25, 1.0);
  EXPECT_NEAR(s.at("a/also-light").gpus - 1, 3.25, 1.0);
}

TEST(ShareGpus, AHigherPriorityGetsAllItWantsBeforeALowerOneGetsHeadroom) {
  ShareInput in;
  in.gpus = 8;
  in.jobs = {Job("t/low", 1, 8, 6, /*priority=*/0), Job("t/high", 2, 6, 2, /*priority=*/100)};
  const auto s = Shares(in);
  EXPECT_EQ(s.at("t/high").gpus, 6);
  EXPECT_EQ(s.at("t/low").gpus, 2);
  EXPECT_TRUE(s.at("t/low").urgent) << "a higher priority waits for its GPUs";
  EXPECT_NE(s.at("t/low").reason.find("t/high 6 (priority 100"), std::string::npos)
      << s.at("t/low").reason;
}

// Issue 50's scenario: w1 (min 1, max 4) holds all 4 GPUs when w2 (min 1, max 4) arrives.
TEST(ShareGpus, ANewJobsMinimumIsMetByShrinkingAJobAboveItsOwnAtOnce) {
  ShareInput in;
  in.gpus = 4;
  in.jobs = {Job("team/w1", 1, 4, /*current=*/4, 0, 1, 1, /*age=*/10), Job("team/w2", 1, 4)};
  const auto s = Shares(in);
  EXPECT_TRUE(s.at("team/w2").admitted);
  EXPECT_EQ(s.at("team/w1").gpus, 2);
  EXPECT_EQ(s.at("team/w2").gpus, 2);
  EXPECT_TRUE(s.at("team/w1").urgent) << "a job waits below its minimum: no cooldown";
  EXPECT_TRUE(s.at("team/w1").shared);
  // Alone, a job's share is what the GPUs allow: nothing the capacity gate does not say.
  in.jobs.pop_back();
  in.gpus = 3;
  EXPECT_EQ(Shares(in).at("team/w1").gpus, 3);
  EXPECT_FALSE(Shares(in).at("team/w1").shared);
}

TEST(ShareGpus, EveningOutJobsOfOnePriorityIsNoUrgentShrink) {
  ShareInput in;
  in.gpus = 8;
  // Both run; b has just grown into what a left idle. Evening out waits for the cooldown.
  in.jobs = {Job("n/a", 2, 8, 2, 0, 1, 2, 5), Job("n/b", 2, 8, 6, 0, 1, 2)};
  const auto s = Shares(in);
  EXPECT_EQ(s.at("n/a").gpus, 4);
  EXPECT_EQ(s.at("n/b").gpus, 4);
  EXPECT_FALSE(s.at("n/b").urgent);
}

TEST(ShareGpus, AMinimumThatDoesNotFitWaitsAndASmallerJobAfterItIsAdmitted) {
  ShareInput in;
  in.gpus = 8;
  in.jobs = {Job("x/running", 4, 8, 8, 0, 1, 4, 20), Job("x/big", 6, 8, 0, 0, 1, 1, 10),
             Job("x/small", 2, 4, 0, 0, 1, 2)};
  const auto s = Shares(in);
  EXPECT_FALSE(s.at("x/big").admitted);
  EXPECT_EQ(s.at("x/big").gpus, 0);
  EXPECT_NE(s.at("x/big").reason.find("waiting: minGPUs 6, 4 GPUs of 8"), std::string::npos)
      << s.at("x/big").reason;
  EXPECT_NE(
      s.at("x/big").reason.find(
          "(held by x/running 4 (priority 0, its minimum), x/small 4 (priority 0, weight 1))"),
      std::string::npos)
      << s.at("x/big").reason;
  EXPECT_EQ(s.at("x/running").gpus, 4) << "the minimum it keeps; 8 is no step of 4 above";
  EXPECT_EQ(s.at("x/small").gpus, 4);
}

TEST(ShareGpus, CountsAreOnesTheBatchAllows) {
  ShareInput in;
  in.gpus = 10;
  in.jobs = {Job("m/a", 2, 8, 0, 0, 1, 2, 1), Job("m/b", 4, 8, 0, 0, 1, 4)};
  const auto s = Shares(in);
  EXPECT_EQ(s.at("m/a").gpus % 2, 0);
  EXPECT_TRUE(s.at("m/b").gpus == 4 || s.at("m/b").gpus == 8);
  EXPECT_LE(s.at("m/a").gpus + s.at("m/b").gpus, 10);
}

TEST(ShareGpus, AHigherPriorityPodIsGivenTheGpusItAsksForFromTheHeadroom) {
  ShareInput in;
  in.gpus = 8;
  in.jobs = {Job("train/j", 2, 8, 8, 0, 1, 2)};
  in.waiting = {{"serving/llm-0", 3, 1000}};
  auto s = Shares(in);
  EXPECT_EQ(s.at("train/j").gpus, 4) << "8 - 3 = 5 free, 4 the largest count it can run at";
  EXPECT_TRUE(s.at("train/j").urgent);
  EXPECT_NE(s.at("train/j").reason.find("yielding to serving/llm-0 (priority 1000)"),
            std::string::npos)
      << s.at("train/j").reason;
  // Not to a pod of its own or a lower priority.
  in.waiting = {{"batch/p", 3, 0}};
  EXPECT_EQ(Shares(in).at("train/j").gpus, 8);
  // With a threshold: only pods at or above it, but then also those of the job's priority.
  in.yield_to_priority = 0;
  EXPECT_EQ(Shares(in).at("train/j").gpus, 4);
  in.yield_to_priority = 2000;
  in.waiting = {{"serving/llm-0", 3, 1000}};
  EXPECT_EQ(Shares(in).at("train/j").gpus, 8);
}

TEST(ShareGpus, APodNeverTakesAJobBelowItsMinimum) {
  ShareInput in;
  in.gpus = 8;
  in.jobs = {Job("train/j", 6, 8, 8)};
  in.waiting = {{"serving/llm-0", 4, 1000}};
  EXPECT_EQ(Shares(in).at("train/j").gpus, 6);
}

TEST(ShareGpus, APodIsServedByTheLowestPrioritiesFirst) {
  ShareInput in;
  in.gpus = 12;
  in.jobs = {Job("t/high", 2, 6, 6, 100), Job("t/low", 2, 6, 6, 0)};
  in.waiting = {{"serving/x", 4, 500}};
  const auto s = Shares(in);
  EXPECT_EQ(s.at("t/high").gpus, 6);
  EXPECT_EQ(s.at("t/low").gpus, 2);
  // A pod between the two priorities is yielded to by the lower one alone.
  in.waiting = {{"serving/x", 4, 50}};
  const auto between = Shares(in);
  EXPECT_EQ(between.at("t/high").gpus, 6);
  EXPECT_EQ(between.at("t/low").gpus, 2);
  // And a waiting job whose minimum the pod would need waits for it.
  in.jobs.push_back(Job("t/new", 6, 6, 0, 0));  // 12 - 4 of minima - 4 for the pod < 6
  in.waiting = {{"serving/x", 4, 500}};
  EXPECT_FALSE(Shares(in).at("t/new").admitted);
}

TEST(ShareGpus, AWantedCountBelowTheShareIsKeptAndTheRestGoesToOthers) {
  ShareInput in;
  in.gpus = 8;
  ShareJob night = Job("s/night", 1, 8, 1, 0, 1, 1, 3);
  night.wanted = 2;  // outside its window: the schedule asks for 2
  in.jobs = {night, Job("s/other", 1, 8, 1)};
  const auto s = Shares(in);
  EXPECT_EQ(s.at("s/night").gpus, 2);
  EXPECT_EQ(s.at("s/other").gpus, 6);
}

TEST(ShareGpus, LostNodesLeaveRunningJobsAtTheirMinimaAndAdmitNoOne) {
  ShareInput in;
  in.gpus = 3;
  in.jobs = {Job("l/a", 2, 4, 4), Job("l/b", 2, 4, 4), Job("l/c", 1, 4, 0)};
  const auto s = Shares(in);
  EXPECT_EQ(s.at("l/a").gpus, 2);
  EXPECT_EQ(s.at("l/b").gpus, 2);
  EXPECT_FALSE(s.at("l/c").admitted);
}

// A thousand random clusters: jobs of three priorities and weights, steps of 1, 2 or 4, some
// running, pods of other workloads; each answer is checked against the invariants.
TEST(ShareGpus, RandomClustersKeepEveryInvariant) {
  std::mt19937 rng(50);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int round = 0; round < 1000; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    ShareInput in;
    in.gpus = pick(0, 64);
    const int jobs = pick(1, 8);
    for (int k = 0; k < jobs; ++k) {
      const int64_t step = std::vector<int64_t>{1, 2, 4}[pick(0, 2)];
      const int64_t min = step * pick(1, 3);
      const int64_t max = min + step * pick(0, 6);
      ShareJob j = Job("ns/j" + std::to_string(k), min, max, 0, 100 * pick(0, 2), pick(1, 3), step,
                       pick(0, 5));
      j.wanted = std::vector<int64_t>{min, max, (min + max) / 2}[pick(0, 2)];
      if (pick(0, 1)) j.current = j.allowed[pick(0, static_cast<int>(j.allowed.size()) - 1)];
      in.jobs.push_back(j);
    }
    for (int k = pick(0, 2); k > 0; --k)
      in.waiting.push_back({"other/p" + std::to_string(k), pick(1, 8), 100 * pick(0, 3) - 50});
    if (pick(0, 3) == 0) in.yield_to_priority = 100 * pick(0, 3);
    CheckInvariants(in, ShareGpus(in));
    if (HasFailure()) return;
  }
}

}  // namespace
}  // namespace tidal::planner
