// Leader election's pure parts against client-go's leaderelection: the acquire / renew / wait
// decision (expiry judged by the observer's clock from when it saw the record change),
// transitions, the observation rule, MicroTime, and the config checks of NewLeaderElector.
#include "kube/leader.h"

#include <gtest/gtest.h>

namespace tidal::kube {
namespace {

using namespace std::chrono_literals;

const Clock::TimePoint kT0 = Clock::TimePoint(1000h);
const Clock::WallTime kWall = Clock::WallTime(1700000000s) + 123456us;

LeaderElectionRecord Held(const std::string& holder, int64_t duration = 15, int64_t transitions = 2,
                          const std::string& renew = "2023-11-14T22:13:20.000000Z") {
  return {holder, duration, "2023-11-14T22:00:00.000000Z", renew, transitions};
}

TEST(DecideLease, CreatesAMissingLeaseHoldingIt) {
  LeaseDecision d = DecideLease(std::nullopt, {}, kT0, kWall, "me", 15s);
  EXPECT_EQ(d.action, LeaseAction::kCreate);
  EXPECT_EQ(d.record.holder_identity, "me");
  EXPECT_EQ(d.record.lease_duration_seconds, 15);
  EXPECT_EQ(d.record.lease_transitions, 0);
  EXPECT_EQ(d.record.acquire_time, "2023-11-14T22:13:20.123456Z");
  EXPECT_EQ(d.record.renew_time, d.record.acquire_time);
}

TEST(DecideLease, WaitsWhileAnotherHolderIsNotExpiredByOurClock) {
  // Observed at kT0, 15 s lease: held until kT0 + 15 s, exclusive (client-go: observed + d
  // After now).
  EXPECT_EQ(DecideLease(Held("other"), kT0, kT0, kWall, "me", 15s).action, LeaseAction::kWait);
  EXPECT_EQ(DecideLease(Held("other"), kT0, kT0 + 14999ms, kWall, "me", 15s).action,
            LeaseAction::kWait);
  LeaseDecision d = DecideLease(Held("other"), kT0, kT0 + 15s, kWall, "me", 15s);
  EXPECT_EQ(d.action, LeaseAction::kAcquire);
  EXPECT_EQ(d.record.holder_identity, "me");
  EXPECT_EQ(d.record.lease_transitions, 3) << "a change of holder is a transition";
  EXPECT_EQ(d.record.acquire_time, "2023-11-14T22:13:20.123456Z");
  EXPECT_EQ(d.record.renew_time, d.record.acquire_time);
}

TEST(DecideLease, UsesTheHoldersDeclaredDurationNotOurs) {
  // The holder claimed 60 s; our own 15 s setting does not shorten its claim.
  EXPECT_EQ(DecideLease(Held("other", 60), kT0, kT0 + 30s, kWall, "me", 15s).action,
            LeaseAction::kWait);
  EXPECT_EQ(DecideLease(Held("other", 60), kT0, kT0 + 60s, kWall, "me", 15s).action,
            LeaseAction::kAcquire);
}

TEST(DecideLease, IgnoresRenewTimeAgainstOurWallClock) {
  // The holder's clock is a year behind ours: its renewTime looks ancient, but we saw the
  // record change just now, so it is held.
  EXPECT_EQ(DecideLease(Held("other", 15, 0, "2022-11-14T22:13:20.000000Z"), kT0, kT0 + 1s, kWall,
                        "me", 15s)
                .action,
            LeaseAction::kWait);
  // And a renewTime in our future does not extend a record we have watched stand still.
  EXPECT_EQ(DecideLease(Held("other", 15, 0, "2030-01-01T00:00:00.000000Z"), kT0, kT0 + 16s, kWall,
                        "me", 15s)
                .action,
            LeaseAction::kAcquire);
}

TEST(DecideLease, RenewsItsOwnLeaseKeepingAcquireTimeAndTransitions) {
  LeaseDecision d = DecideLease(Held("me", 15, 4), kT0, kT0 + 100s, kWall, "me", 15s);
  EXPECT_EQ(d.action, LeaseAction::kRenew);
  EXPECT_EQ(d.record.holder_identity, "me");
  EXPECT_EQ(d.record.acquire_time, "2023-11-14T22:00:00.000000Z");
  EXPECT_EQ(d.record.renew_time, "2023-11-14T22:13:20.123456Z");
  EXPECT_EQ(d.record.lease_transitions, 4);
}

TEST(DecideLease, TakesAReleasedLeaseAtOnce) {
  LeaderElectionRecord released{"", 1, "t", "t", 5};
  LeaseDecision d = DecideLease(released, kT0, kT0, kWall, "me", 15s);
  EXPECT_EQ(d.action, LeaseAction::kAcquire);
  EXPECT_EQ(d.record.lease_transitions, 6);
  EXPECT_EQ(d.record.lease_duration_seconds, 15);
}

TEST(ObserveLease, ObservedTimeMovesOnlyWhenTheRecordChanges) {
  LeaseObservation obs;
  ObserveLease(obs, Held("other"), kT0);
  EXPECT_EQ(obs.observed_time, kT0);
  ObserveLease(obs, Held("other"), kT0 + 10s);  // unchanged: the holder stopped renewing
  EXPECT_EQ(obs.observed_time, kT0);
  EXPECT_EQ(DecideLease(obs.record, obs.observed_time, kT0 + 15s, kWall, "me", 15s).action,
            LeaseAction::kAcquire);
  ObserveLease(obs, Held("other", 15, 2, "2023-11-14T22:13:30.000000Z"), kT0 + 12s);  // renewed
  EXPECT_EQ(obs.observed_time, kT0 + 12s);
  EXPECT_EQ(DecideLease(obs.record, obs.observed_time, kT0 + 15s, kWall, "me", 15s).action,
            LeaseAction::kWait);
}

TEST(LeaseRecord, RoundTripsThroughTheLeaseSpec) {
  LeaderElectionRecord r = Held("me", 15, 3);
  nlohmann::json lease = {
      {"apiVersion", "coordination.k8s.io/v1"}, {"kind", "Lease"}, {"spec", LeaseSpecJson(r)}};
  EXPECT_EQ(lease["spec"]["holderIdentity"], "me");
  EXPECT_EQ(lease["spec"]["leaseDurationSeconds"], 15);
  EXPECT_EQ(lease["spec"]["leaseTransitions"], 3);
  EXPECT_EQ(RecordFromLease(lease), r);
  EXPECT_EQ(RecordFromLease({{"kind", "Lease"}}), LeaderElectionRecord{});
}

TEST(MicroTime, FormatsUtcWithMicroseconds) {
  EXPECT_EQ(FormatMicroTime(Clock::WallTime(0s)), "1970-01-01T00:00:00.000000Z");
  EXPECT_EQ(FormatMicroTime(kWall), "2023-11-14T22:13:20.123456Z");
  EXPECT_EQ(FormatMicroTime(kWall + 999ns), "2023-11-14T22:13:20.123456Z") << "truncated";
  EXPECT_EQ(FormatMicroTime(Clock::WallTime(-1s) + 250ms), "1969-12-31T23:59:59.250000Z");
}

TEST(MicroTime, ParsesRfc3339) {
  auto t = ParseRfc3339("2023-11-14T22:13:20.123456Z");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(*t, kWall);
  EXPECT_EQ(*ParseRfc3339("2023-11-14T22:13:20Z"), Clock::WallTime(1700000000s));
  EXPECT_EQ(*ParseRfc3339("2023-11-14T23:13:20.5+01:00"), Clock::WallTime(1700000000s) + 500ms);
  EXPECT_EQ(FormatMicroTime(*ParseRfc3339(FormatMicroTime(kWall))), FormatMicroTime(kWall));
  for (const char* bad : {"", "2023-11-14", "2023-11-14T22:13:20", "2023-11-14T22:13:20.Z",
                          "2023-11-14T22:13:20+0100"})
    EXPECT_EQ(ParseRfc3339(bad).status().code(), StatusCode::kInvalidArgument) << bad;
}

TEST(LeaderElectionConfig, DefaultsAreClientGos) {
  LeaderElectionConfig c;
  EXPECT_EQ(c.lease_duration, 15s);
  EXPECT_EQ(c.renew_deadline, 10s);
  EXPECT_EQ(c.retry_period, 2s);
  EXPECT_TRUE(c.release_on_cancel);
  c.identity = "pod-a";
  c.lease_name = "tidal-operator";
  EXPECT_TRUE(c.Validate().ok()) << c.Validate().ToString();
}

TEST(LeaderElectionConfig, RefusesUnsafeTimings) {
  LeaderElectionConfig c;
  c.identity = "pod-a";
  c.lease_name = "tidal-operator";
  c.renew_deadline = 15s;  // = leaseDuration: no safety margin
  EXPECT_NE(c.Validate().message().find("leaseDuration"), std::string::npos);
  c.renew_deadline = 2400ms;  // = 1.2 · retryPeriod
  EXPECT_NE(c.Validate().message().find("renewDeadline"), std::string::npos);
  c.renew_deadline = 10s;
  c.retry_period = 0s;
  EXPECT_FALSE(c.Validate().ok());
  c.retry_period = 2s;
  c.identity = "";
  EXPECT_NE(c.Validate().message().find("identity"), std::string::npos);
  c.identity = "pod-a";
  c.lease_name = "Not_Valid";
  EXPECT_FALSE(c.Validate().ok());
}

}  // namespace
}  // namespace tidal::kube
