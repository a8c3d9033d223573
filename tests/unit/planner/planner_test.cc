// The GPU count decision (DESIGN.md §3) with an injected clock: schedule windows in the job's
// time zone (including daylight-saving transition days), manual override, the capacity gate,
// rounding to counts the job can run at, and the cooldown.
#include "operator/planner/planner.h"

#include <date/date.h>
#include <gtest/gtest.h>

namespace tidal::planner {
namespace {

using namespace std::chrono;
using namespace date::literals;

Clock::time_point Utc(date::year_month_day day, int hour, int minute) {
  return date::sys_days(day) + hours(hour) + minutes(minute);
}

api::ScheduleWindow Window(const std::string& name, const std::string& start,
                           const std::string& end, int64_t gpus) {
  api::ScheduleWindow w;
  w.name = name;
  w.start = start;
  w.end = end;
  w.start_cron = *api::ParseCron(start);
  w.end_cron = *api::ParseCron(end);
  w.gpus = gpus;
  return w;
}

// 2..4 GPUs, global batch 8 in micro-batches of 2: it runs at 2 or 4 (not 3).
api::TrainingJobSpec Spec() {
  api::TrainingJobSpec s;
  s.train.optimization.global_batch_size = 8;
  s.train.optimization.micro_batch_size = 2;
  s.elastic.min_gpus = 2;
  s.elastic.max_gpus = 4;
  s.elastic.time_zone = "Asia/Shanghai";
  s.elastic.schedule = {Window("night", "0 22 * * *", "0 8 * * *", 4)};
  return s;
}

TEST(WindowTest, OpensAndClosesOnTheJobsLocalClock) {
  const auto w = Window("night", "0 22 * * *", "0 8 * * *", 4);
  // Shanghai is UTC+8: 22:00 local is 14:00 UTC, 08:00 local is 00:00 UTC.
  EXPECT_FALSE(WindowOpen(w, "Asia/Shanghai", Utc(2026_y / 11 / 23, 13, 59)));
  EXPECT_TRUE(WindowOpen(w, "Asia/Shanghai", Utc(2026_y / 11 / 23, 14, 0)));
  EXPECT_TRUE(WindowOpen(w, "Asia/Shanghai", Utc(2026_y / 11 / 23, 23, 59)));
  EXPECT_FALSE(WindowOpen(w, "Asia/Shanghai", Utc(2026_y / 11 / 24, 0, 0)));
  // The same instant in UTC is mid-afternoon: closed.
  EXPECT_FALSE(WindowOpen(w, "UTC", Utc(2026_y / 11 / 23, 14, 0)));
}

TEST(WindowTest, AStartInTheSpringForwardGapHappensWhenTheGapEnds) {
  // New York, 2026-03-08: 02:00 EST jumps to 03:00 EDT (07:00 UTC); 02:30 does not exist.
  auto at = *api::ParseCron("30 2 * * *");
  auto last = LastOccurrence(at, "America/New_York", Utc(2026_y / 3 / 8, 7, 10));
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(*last, Utc(2026_y / 3 / 8, 7, 0));
  // Just before the jump, the last 02:30 was the day before, in EST (07:30 UTC).
  EXPECT_EQ(*LastOccurrence(at, "America/New_York", Utc(2026_y / 3 / 8, 6, 59)),
            Utc(2026_y / 3 / 7, 7, 30));
}

TEST(WindowTest, AStartInTheRepeatedHourHappensOnce) {
  // New York, 2026-11-01: 02:00 EDT falls back to 01:00 EST; 01:30 happens at 05:30 and 06:30
  // UTC. The window opens at the first and is not opened again by the second.
  auto at = *api::ParseCron("30 1 * * *");
  EXPECT_EQ(*LastOccurrence(at, "America/New_York", Utc(2026_y / 11 / 1, 6, 45)),
            Utc(2026_y / 11 / 1, 5, 30));
  const auto w = Window("early", "30 1 * * *", "15 2 * * *", 4);
  EXPECT_TRUE(WindowOpen(w, "America/New_York", Utc(2026_y / 11 / 1, 6, 45)));
  EXPECT_FALSE(WindowOpen(w, "America/New_York", Utc(2026_y / 11 / 1, 7, 20)));  // 02:20 EST
}

TEST(WindowTest, ANightWindowAcrossTheDstChangeClosesAtLocalEight) {
  const auto w = Window("night", "0 22 * * *", "0 8 * * *", 4);
  // 2026-03-08 08:00 EDT is 12:00 UTC (it would be 13:00 UTC in EST).
  EXPECT_TRUE(WindowOpen(w, "America/New_York", Utc(2026_y / 3 / 8, 11, 59)));
  EXPECT_FALSE(WindowOpen(w, "America/New_York", Utc(2026_y / 3 / 8, 12, 0)));
}

TEST(DesiredGpusTest, DecisionTable) {
  const auto night = Utc(2026_y / 11 / 23, 15, 0);  // 23:00 in Shanghai
  const auto day = Utc(2026_y / 11 / 23, 4, 0);     // 12:00 in Shanghai
  const auto long_ago = day - hours(1);
  struct Case {
    const char* what;
    Clock::time_point now;
    JobState state;
    int64_t idle;
    int64_t want;
    const char* reason;
  };
  const std::vector<Case> cases = {
      {"outside the window: min", day, {2, long_ago}, 8, 2, "minGPUs (outside every window)"},
      {"window open, room: grow", night, {2, long_ago}, 2, 4, "schedule window night"},
      {"window open, 1 idle: 3 reachable, runs at 2",
       night,
       {2, long_ago},
       1,
       2,
       "capacity: 1 idle GPUs, 4 wanted"},
      {"window open, none idle", night, {2, long_ago}, 0, 2, "capacity: 0 idle GPUs"},
      {"shrinking needs no capacity", day, {4, long_ago}, 0, 2, "minGPUs"},
      {"cooldown holds a grow", night, {2, night - seconds(60)}, 4, 2, "cooldown: 4 wanted"},
      {"cooldown over", night, {2, night - seconds(300)}, 4, 4, "schedule window night"},
      {"starting: at least min", night, {0, std::nullopt}, 0, 2, "capacity"},
  };
  for (const Case& c : cases) {
    Decision d = DesiredGpus(Spec(), c.state, {c.idle}, c.now);
    EXPECT_EQ(d.desired, c.want) << c.what << ": " << d.reason;
    // Issue 47: what the job wants is reported before the capacity gate and the cooldown, so a
    // job held at 2 of its window's 4 shows 2 < 4 (the below-desired alert could never fire).
    EXPECT_EQ(d.wanted, c.now == night ? 4 : 2) << c.what;
    EXPECT_NE(d.reason.find(c.reason), std::string::npos) << c.what << ": " << d.reason;
  }
}

TEST(DesiredGpusTest, ManualOverrideBeatsTheScheduleAndTheCooldownNotCapacity) {
  auto spec = Spec();
  spec.replicas = 4;
  const auto day = Utc(2026_y / 11 / 23, 4, 0);
  Decision d = DesiredGpus(spec, {2, day - seconds(10)}, {2}, day);
  EXPECT_EQ(d.desired, 4);
  EXPECT_NE(d.reason.find("manual override"), std::string::npos) << d.reason;
  EXPECT_EQ(DesiredGpus(spec, {2, day - seconds(10)}, {0}, day).desired, 2);
  spec.elastic.require_idle_capacity = false;
  EXPECT_EQ(DesiredGpus(spec, {2, day - seconds(10)}, {0}, day).desired, 4);
}

// The cluster's share (share.h) in the decision: it bounds the target, keeps a job it does not
// admit waiting with no GPU, and lets an urgent shrink skip the cooldown.
TEST(DesiredGpusTest, TheShareBoundsTheCountAndAnUrgentShrinkSkipsTheCooldown) {
  const auto night = Utc(2026_y / 11 / 23, 15, 0);  // the window wants 4
  auto share = [](int64_t gpus, bool urgent) {
    Share s;
    s.gpus = gpus;
    s.admitted = gpus > 0;
    s.urgent = urgent;
    s.shared = true;
    s.reason = gpus > 0 ? "share " + std::to_string(gpus) + " of 4 GPUs" : "waiting: minGPUs 2";
    return s;
  };
  Decision d = DesiredGpus(Spec(), {0, std::nullopt}, {4, share(0, false)}, night);
  EXPECT_TRUE(d.waiting);
  EXPECT_EQ(d.desired, 0);
  EXPECT_EQ(d.wanted, 4) << "what it wants is still shown";
  EXPECT_EQ(d.reason, "waiting: minGPUs 2");

  d = DesiredGpus(Spec(), {2, night - hours(1)}, {4, share(2, false)}, night);
  EXPECT_EQ(d.desired, 2) << "held at its share with GPUs idle";
  EXPECT_NE(d.reason.find("schedule window night; share 2 of 4 GPUs"), std::string::npos)
      << d.reason;

  // Just changed, at 4, its share 2: an urgent shrink now, an evening out after the cooldown.
  const JobState just_grown{4, night - seconds(10)};
  EXPECT_EQ(DesiredGpus(Spec(), just_grown, {0, share(2, true)}, night).desired, 2);
  d = DesiredGpus(Spec(), just_grown, {0, share(2, false)}, night);
  EXPECT_EQ(d.desired, 4);
  EXPECT_NE(d.reason.find("cooldown: 2 wanted"), std::string::npos) << d.reason;

  // A share no other job takes part in leaves the count to the capacity gate.
  Share alone = share(2, false);
  alone.shared = false;
  d = DesiredGpus(Spec(), {2, night - hours(1)}, {0, alone}, night);
  EXPECT_EQ(d.desired, 2);
  EXPECT_NE(d.reason.find("capacity: 0 idle GPUs, 4 wanted"), std::string::npos) << d.reason;
  EXPECT_EQ(d.reason.find("share"), std::string::npos) << d.reason;

  // requireIdleCapacity false: the share bounds shrinks only, the rest is asked of the scheduler.
  auto forced = Spec();
  forced.elastic.require_idle_capacity = false;
  EXPECT_EQ(DesiredGpus(forced, {2, night - hours(1)}, {0, share(2, false)}, night).desired, 4);
  EXPECT_EQ(DesiredGpus(forced, {4, night - hours(1)}, {0, share(2, true)}, night).desired, 2);
}

TEST(WindowTest, TheNextOccurrenceIsTheFirstMatchingLocalMinuteAfterNowAcrossMonthsAndDst) {
  const auto at22 = *api::ParseCron("0 22 * * *");
  // Shanghai 22:00 is 14:00 UTC; at that very instant the next one is a day later.
  EXPECT_EQ(NextOccurrence(at22, "Asia/Shanghai", Utc(2026_y / 11 / 23, 13, 59)),
            Utc(2026_y / 11 / 23, 14, 0));
  EXPECT_EQ(NextOccurrence(at22, "Asia/Shanghai", Utc(2026_y / 11 / 23, 14, 0)),
            Utc(2026_y / 11 / 24, 14, 0));
  // Only in March: from November, the first of March next year (local midnight, UTC+8).
  const auto march = *api::ParseCron("0 0 1 3 *");
  EXPECT_EQ(NextOccurrence(march, "Asia/Shanghai", Utc(2026_y / 11 / 23, 0, 0)),
            Utc(2027_y / 2 / 28, 16, 0));
  // Mondays at 09:30 in New York: Monday 2026-11-23 is EST (UTC-5).
  const auto monday = *api::ParseCron("30 9 * * 1");
  EXPECT_EQ(NextOccurrence(monday, "America/New_York", Utc(2026_y / 11 / 21, 0, 0)),
            Utc(2026_y / 11 / 23, 14, 30));
  // In the spring-forward gap: 02:30 on 2026-03-08 does not exist; it happens when the gap
  // ends (07:00 UTC), as LastOccurrence says.
  const auto at0230 = *api::ParseCron("30 2 * * *");
  EXPECT_EQ(NextOccurrence(at0230, "America/New_York", Utc(2026_y / 3 / 8, 6, 0)),
            Utc(2026_y / 3 / 8, 7, 0));
  // Every next occurrence is one LastOccurrence finds at that instant, and none is skipped.
  auto t = Utc(2026_y / 3 / 1, 0, 0);
  for (int i = 0; i < 60; ++i) {
    const auto next = NextOccurrence(at0230, "America/New_York", t);
    ASSERT_TRUE(next);
    EXPECT_GT(*next, t);
    EXPECT_EQ(LastOccurrence(at0230, "America/New_York", *next), next);
    EXPECT_EQ(LastOccurrence(at0230, "America/New_York", *next - seconds(1)),
              LastOccurrence(at0230, "America/New_York", t));
    t = *next;
  }
  // A date that never comes (30 February): none.
  EXPECT_FALSE(NextOccurrence(*api::ParseCron("0 0 30 2 *"), "UTC", Utc(2026_y / 1 / 1, 0, 0)));
}

// The controller sets a timer for the next instant the clock alone may change the decision,
// instead of polling: a window's start or end, the cooldown's end.
TEST(DesiredGpusTest, TheDecisionSaysWhenTheClockAloneMayChangeItAndWhetherCapacityHoldsIt) {
  auto spec = Spec();  // night 22:00-08:00 Shanghai (14:00-00:00 UTC), 4 GPUs
  const auto noon = Utc(2026_y / 11 / 23, 4, 0);
  Decision d = DesiredGpus(spec, {2, std::nullopt}, {8}, noon);
  EXPECT_EQ(d.revisit, Utc(2026_y / 11 / 23, 14, 0)) << "the window's start";
  EXPECT_FALSE(d.capacity_limited);
  const auto night = Utc(2026_y / 11 / 23, 15, 0);
  d = DesiredGpus(spec, {4, std::nullopt}, {8}, night);
  EXPECT_EQ(d.revisit, Utc(2026_y / 11 / 24, 0, 0)) << "the window's end";
  // Held by the cooldown: its end comes first.
  spec.elastic.cooldown_seconds = 600;
  d = DesiredGpus(spec, {2, night - seconds(60)}, {8}, night);
  EXPECT_EQ(d.desired, 2);
  EXPECT_EQ(d.revisit, night + seconds(540));
  // The capacity gate: idle GPUs elsewhere change it, which no timer knows.
  spec.elastic.require_idle_capacity = true;
  d = DesiredGpus(spec, {2, std::nullopt}, {1}, night);
  EXPECT_EQ(d.desired, 2);
  EXPECT_TRUE(d.capacity_limited);
  // No schedule, no cooldown: nothing but a change of spec or capacity changes it.
  spec.elastic.schedule.clear();
  spec.elastic.require_idle_capacity = false;
  EXPECT_FALSE(DesiredGpus(spec, {2, std::nullopt}, {8}, night).revisit);
}

TEST(DesiredGpusTest, NoScheduleRunsAtMin) {
  auto spec = Spec();
  spec.elastic.schedule.clear();
  Decision d = DesiredGpus(spec, {0, std::nullopt}, {8}, Utc(2026_y / 1 / 1, 0, 0));
  EXPECT_EQ(d.desired, 2);
  EXPECT_EQ(d.reason, "minGPUs (no schedule)");
}

}  // namespace
}  // namespace tidal::planner
