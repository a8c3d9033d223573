// Leader election between separate OS processes (LEASE_CONTENDER_BIN) on one Lease of a real
// `tidal local`: exactly one leads; kill -9 of the leader hands over once the lease expires;
// SIGTERM releases the lease so the other takes over without waiting for expiry; a leader whose
// API server stops answering stops leading by itself within renewDeadline.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <optional>
#include <regex>

#include "kube/leader.h"
#include "tests/integration/kube/local_cluster.h"
#include "tests/test_paths.h"

namespace tidal::kube {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

struct Timings {
  int lease_ms, renew_ms, retry_ms;
};

// One contender process and what it printed.
class Contender {
 public:
  Contender(const std::string& kubeconfig, const std::string& identity, Timings t)
      : identity_(identity),
        process_(std::make_unique<testing::Process>(std::vector<std::string>{
            LEASE_CONTENDER_BIN, "--kubeconfig", kubeconfig, "--identity", identity, "--lease",
            "tidal-test", "--lease-ms", std::to_string(t.lease_ms), "--renew-ms",
            std::to_string(t.renew_ms), "--retry-ms", std::to_string(t.retry_ms)})) {}
  const std::string& identity() const { return identity_; }
  pid_t pid() const { return process_->pid(); }
  testing::Process& process() { return *process_; }

  static std::vector<json> Parse(const std::string& out) {
    std::vector<json> events;
    size_t start = 0, end;
    while ((end = out.find('\n', start)) != std::string::npos) {
      json line = json::parse(out.substr(start, end - start), nullptr, false);
      if (!line.is_discarded()) events.push_back(line);
      start = end + 1;
    }
    return events;
  }
  // The time of the first `event` (from `leader`, for new_leader), reading output for up to
  // `wait` until it appears; nullopt if it has not.
  std::optional<double> When(const std::string& event, const std::string& leader = "",
                             std::chrono::milliseconds wait = 20ms) {
    std::optional<double> found;
    process_->WaitForOutput(
        [&](const std::string& out) {
          for (const json& e : Parse(out))
            if (e["event"] == event && (leader.empty() || e.value("leader", "") == leader)) {
              found = e["t"].get<double>();
              return true;
            }
          return false;
        },
        wait);
    return found;
  }

 private:
  std::string identity_;
  std::unique_ptr<testing::Process> process_;
};

// Waits until one of `contenders` prints `event`; that one, or nullptr.
Contender* WaitForEvent(const std::vector<Contender*>& contenders, const std::string& event,
                        std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    for (Contender* c : contenders)
      if (c->When(event, "", 50ms)) return c;
  }
  return nullptr;
}

double Now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

class LeaderElectionIntegration : public LocalClusterTest {
 protected:
  LeaderElectionRecord Lease() {
    auto lease = client_->Call(*GetRequest(Resource::Leases(), "default", "tidal-test"));
    EXPECT_TRUE(lease.ok()) << lease.status().ToString();
    return lease.ok() ? RecordFromLease(*lease) : LeaderElectionRecord{};
  }
};

TEST_F(LeaderElectionIntegration, ExactlyOneLeadsAndKillNineHandsOverAfterExpiry) {
  const Timings t{3000, 2000, 500};
  Contender a(kubeconfig(), "contender-a", t), b(kubeconfig(), "contender-b", t);
  Contender* leader = WaitForEvent({&a, &b}, "leading", 30s);
  ASSERT_NE(leader, nullptr) << "nobody acquired the lease";
  Contender* standby = leader == &a ? &b : &a;
  // The standby sees the leader as such, and keeps waiting while the leader renews.
  ASSERT_TRUE(WaitUntil([&] {
    return standby->When("new_leader", leader->identity()).has_value();
  })) << "the standby never observed the leader";
  LeaderElectionRecord first = Lease();
  EXPECT_EQ(first.holder_identity, leader->identity());
  EXPECT_EQ(first.lease_duration_seconds, 3);
  EXPECT_EQ(first.lease_transitions, 0);
  const std::regex micro_time(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z)");
  EXPECT_TRUE(std::regex_match(first.renew_time, micro_time)) << first.renew_time;
  EXPECT_TRUE(std::regex_match(first.acquire_time, micro_time)) << first.acquire_time;
  // Several renewals (each moves renewTime) while the standby stays a standby: longer than a
  // lease duration in all, so a standby that ignored renewals would have taken over.
  std::string renew = first.renew_time;
  int renewals = 0;
  ASSERT_TRUE(WaitUntil(
      [&] {
        LeaderElectionRecord now = Lease();
        EXPECT_EQ(now.holder_identity, leader->identity());
        if (now.renew_time != renew) ++renewals, renew = now.renew_time;
        return renewals >= 8;
      },
      30s));
  EXPECT_FALSE(standby->When("leading")) << "two leaders at once";
  EXPECT_EQ(Lease().acquire_time, first.acquire_time) << "renewing keeps acquireTime";

  ::kill(leader->pid(), SIGKILL);
  const double killed = Now();
  // Takeover needs the lease to expire by the standby's clock: ≤ leaseDuration + its retry
  // (with jitter) after the last renewal it saw. Waited for generously.
  std::optional<double> took_over;
  ASSERT_TRUE(WaitUntil([&] { return (took_over = standby->When("leading")).has_value(); }, 30s))
      << "the standby never took over";
  EXPECT_GE(*took_over, killed);
  ::testing::Test::RecordProperty("handover_seconds", std::to_string(*took_over - killed));
  LeaderElectionRecord after = Lease();
  EXPECT_EQ(after.holder_identity, standby->identity());
  EXPECT_EQ(after.lease_transitions, 1);
  EXPECT_NE(after.acquire_time, first.acquire_time);
}

TEST_F(LeaderElectionIntegration, SigtermReleasesTheLeaseAndTheOtherTakesOverWithoutExpiry) {
  // A 60 s lease: a takeover within the 20 s waited for below can only come from the release.
  const Timings t{60000, 10000, 500};
  Contender a(kubeconfig(), "contender-a", t);
  ASSERT_TRUE(a.When("leading", "", 30s)) << "the first contender did not lead";
  Contender b(kubeconfig(), "contender-b", t);
  ASSERT_TRUE(WaitUntil([&] { return b.When("new_leader", "contender-a").has_value(); }));
  EXPECT_FALSE(b.When("leading"));

  ::kill(a.pid(), SIGTERM);
  testing::ProcessResult exit = a.process().Wait(20s);
  ASSERT_FALSE(exit.timed_out);
  EXPECT_EQ(exit.exit_code, 0) << exit.err;
  std::vector<json> a_events = Contender::Parse(exit.out);
  auto stopped = std::find_if(a_events.begin(), a_events.end(),
                              [](const json& e) { return e["event"] == "stopped"; });
  ASSERT_NE(stopped, a_events.end()) << exit.out;

  std::optional<double> b_leads;
  ASSERT_TRUE(WaitUntil([&] { return (b_leads = b.When("leading")).has_value(); }, 20s))
      << "no takeover: the lease was not released";
  EXPECT_GE(*b_leads, (*stopped)["t"].get<double>()) << "the old leader stopped first";
  LeaderElectionRecord lease = Lease();
  EXPECT_EQ(lease.holder_identity, "contender-b");
  EXPECT_EQ(lease.lease_duration_seconds, 60);
  EXPECT_EQ(lease.lease_transitions, 1) << "a → released → b counts once, as client-go";
}

TEST_F(LeaderElectionIntegration, LeaderStopsLeadingWhenTheApiServerHangs) {
  const Timings t{3000, 2000, 500};
  Contender a(kubeconfig(), "contender-a", t);
  ASSERT_TRUE(a.When("leading", "", 30s));
  // Let it renew at least once, then freeze the API server: requests hang, none fail.
  std::string renew = Lease().renew_time;
  ASSERT_TRUE(WaitUntil([&] { return Lease().renew_time != renew; }));
  ::kill(server_->pid(), SIGSTOP);
  const double frozen = Now();
  std::optional<double> stopped;
  bool ok = WaitUntil([&] { return (stopped = a.When("stopped")).has_value(); }, 20s);
  ::kill(server_->pid(), SIGCONT);
  ASSERT_TRUE(ok) << "still leading with an unreachable API server";
  ::testing::Test::RecordProperty("stopped_after_seconds", std::to_string(*stopped - frozen));
  testing::ProcessResult exit = a.process().Wait(20s);
  EXPECT_EQ(exit.exit_code, 1) << "a lost lease ends the process";
}

}  // namespace
}  // namespace tidal::kube
