// comm over real gloo process groups: the fallbacks for what gloo lacks (flat reduce_scatter and
// all-gather) give exactly what the collectives define, at odd world sizes too; the device rule
// NCCL imposes is enforced on every backend; control values travel as host values.
#include "worker/engine/comm.h"

#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/unit/engine/multi_rank.h"

namespace tidal::engine {
namespace {

using testing::RunRanks;

class CommTest : public ::testing::TestWithParam<int> {};

TEST_P(CommTest, CollectivesComputeTheirDefinitions) {
  const int world = GetParam();
  RunRanks(world, [world](Comm& comm) {
    const int r = comm.rank();
    ASSERT_EQ(comm.world_size(), world);
    auto t = torch::full({4}, static_cast<float>(r + 1));
    ASSERT_TRUE(comm.AllReduceSum(t).ok());
    EXPECT_TRUE(torch::equal(t, torch::full({4}, world * (world + 1) / 2.0f)));

    auto shard = torch::arange(3, torch::kFloat32) + 10.0f * r;
    auto full = torch::empty({3 * world});
    ASSERT_TRUE(comm.AllGather(shard, full).ok());
    for (int i = 0; i < world; ++i)
      EXPECT_TRUE(
          torch::equal(full.narrow(0, 3 * i, 3), torch::arange(3, torch::kFloat32) + 10.0f * i));

    // Rank r contributes (r+1)·[0, 1, …]; slice i of the sum is Σ(r+1) · [3i, 3i+1, 3i+2].
    auto contribution = torch::arange(3 * world, torch::kFloat32) * static_cast<float>(r + 1);
    auto mine = torch::empty({3});
    ASSERT_TRUE(comm.ReduceScatterSum(contribution, mine).ok());
    EXPECT_TRUE(torch::equal(
        mine, torch::arange(3 * r, 3 * r + 3, torch::kFloat32) * (world * (world + 1) / 2.0f)));
    EXPECT_TRUE(torch::equal(contribution,
                             torch::arange(3 * world, torch::kFloat32) * static_cast<float>(r + 1)))
        << "the input of reduce_scatter must not be modified";

    auto b = torch::full({2}, static_cast<float>(r));
    ASSERT_TRUE(comm.Broadcast(b, world - 1).ok());
    EXPECT_TRUE(torch::equal(b, torch::full({2}, static_cast<float>(world - 1))));
    EXPECT_TRUE(comm.Barrier().ok());
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, CommTest, ::testing::Values(2, 3));

// A rank that takes longer than the group's collective timeout to arrive (loading its base
// weights while the others kept theirs) is waited for by WaitForAll, not by Barrier.
TEST(CommTest, WaitForAllOutwaitsTheCollectiveTimeoutThatFailsABarrier) {
  const auto group_timeout = std::chrono::milliseconds(700);
  const auto late = std::chrono::milliseconds(2000);
  std::vector<Status> barrier(2), waited(2);
  RunRanks(
      2,
      [&](Comm& comm) {
        if (comm.rank() == 1) std::this_thread::sleep_for(late);
        barrier[comm.rank()] = comm.Barrier();
      },
      group_timeout);
  EXPECT_FALSE(barrier[0].ok()) << "rank 0 waited past the group's timeout";
  RunRanks(
      2,
      [&](Comm& comm) {
        if (comm.rank() == 1) std::this_thread::sleep_for(late);
        waited[comm.rank()] = comm.WaitForAll(std::chrono::seconds(30));
      },
      group_timeout);
  EXPECT_TRUE(waited[0].ok()) << waited[0].message();
  EXPECT_TRUE(waited[1].ok()) << waited[1].message();
}

TEST(CommTest, SingleRankCollectivesAreIdentities) {
  auto comm = MakeSingleRankComm();
  auto shard = torch::randn({5});
  auto full = torch::empty({5});
  ASSERT_TRUE(comm->AllGather(shard, full).ok());
  EXPECT_TRUE(torch::equal(full, shard));
  auto out = torch::empty({5});
  ASSERT_TRUE(comm->ReduceScatterSum(shard, out).ok());
  EXPECT_TRUE(torch::equal(out, shard));
}

// NCCL takes only dense tensors on the group's GPU and fails obscurely otherwise. Comm checks
// the rule itself, for every backend, so a caller that hands a tensor on the wrong device fails
// on a CPU test machine as it would on a GPU, with the collective and both devices named. The
// meta device stands in for "not the group's device" where no GPU exists.
TEST(CommTest, EveryCollectiveRefusesATensorOffTheGroupsDeviceBeforeTheBackendSeesIt) {
  auto expect_refused = [](const Status& s, const std::string& what, const std::string& backend) {
    EXPECT_EQ(s.code(), StatusCode::kInternal) << s.ToString();
    EXPECT_NE(s.message().find(what + ": tensor on meta, but the " + backend +
                               " process group's collectives take tensors on cpu"),
              std::string::npos)
        << s.message();
  };
  auto check = [&](Comm& comm, const std::string& backend) {
    const int world = comm.world_size();
    auto meta = torch::empty({2 * world}, torch::TensorOptions().device(torch::kMeta));
    auto meta_shard = torch::empty({2}, torch::TensorOptions().device(torch::kMeta));
    auto cpu_full = torch::zeros({2 * world});
    auto cpu_shard = torch::zeros({2});
    expect_refused(comm.AllReduceSum(meta), "all_reduce", backend);
    expect_refused(comm.AllGather(meta_shard, cpu_full), "all_gather", backend);
    expect_refused(comm.AllGather(cpu_shard, meta), "all_gather", backend);
    expect_refused(comm.ReduceScatterSum(meta, cpu_shard), "reduce_scatter", backend);
    expect_refused(comm.Broadcast(meta, 0), "broadcast", backend);
    auto sparse = torch::zeros({2 * world}).to_sparse();
    Status s = comm.AllReduceSum(sparse);
    EXPECT_NE(s.message().find("all_reduce: a sparse tensor"), std::string::npos) << s.message();
    // Nothing reached the backend: the group still works.
    auto ok = torch::ones({3});
    ASSERT_TRUE(comm.AllReduceSum(ok).ok());
    EXPECT_TRUE(torch::equal(ok, torch::full({3}, static_cast<float>(world))));
  };
  RunRanks(2, [&](Comm& comm) { check(comm, "gloo"); });
  check(*MakeSingleRankComm(), "single-rank");
}

TEST(CommTest, ControlValuesTravelAsHostValuesAndAgreeOnEveryRank) {
  RunRanks(3, [](Comm& comm) {
    const int r = comm.rank();
    std::vector<int64_t> flags{r == 1 ? 1 : 0, 1, int64_t{1} << 40};
    ASSERT_TRUE(comm.AllReduceSumHost(flags).ok());
    EXPECT_EQ(flags, (std::vector<int64_t>{1, 3, int64_t{3} << 40}));
    std::vector<double> values{0.5 * r, -1.0};
    ASSERT_TRUE(comm.AllReduceSumHost(values).ok());
    EXPECT_EQ(values, (std::vector<double>{1.5, -3.0}));
    std::vector<int64_t> chosen{r == 2 ? 42 : -1};
    ASSERT_TRUE(comm.BroadcastHost(chosen, 2).ok());
    EXPECT_EQ(chosen[0], 42);
    // Different lengths, an empty one, and bytes that are not text.
    const std::vector<std::string> mine = {"rank zero", "", std::string("\0\xff\x01", 3)};
    auto all = comm.AllGatherStrings(mine[static_cast<size_t>(r)]);
    ASSERT_TRUE(all.ok()) << all.status().ToString();
    EXPECT_EQ(*all, mine);
  });
}

TEST(CommTest, JoiningAStoreThatIsNotThereIsUnavailable) {
  ProcessGroupOptions options;
  options.store_port = 1;  // nothing listens on port 1 of loopback
  options.rank = 1;
  options.world_size = 2;
  options.timeout = std::chrono::seconds(2);
  auto comm = ConnectProcessGroup(options);
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(comm.status().message().find("127.0.0.1:1"), std::string::npos)
      << comm.status().message();
}

// When a generation forms, the other ranks usually ask before rank 0's store listens; they
// wait for it (and then join at once) instead of failing.
TEST(CommTest, RanksThatAskBeforeTheStoreListensJoinOnceItDoes) {
  // A port that is free now: bind to 0, read it, release it.
  int port = 0;
  {
    auto probe = StoreServer::Start("127.0.0.1");
    ASSERT_TRUE(probe.ok()) << probe.status().message();
    port = (*probe)->port();
  }
  auto join = [port](int rank) {
    ProcessGroupOptions options;
    options.store_port = port;
    options.rank = rank;
    options.world_size = 2;
    options.timeout = std::chrono::seconds(30);
    return ConnectProcessGroup(options);
  };
  std::string early_failure;
  std::thread early([&] {
    auto comm = join(1);
    if (!comm.ok()) {
      early_failure = comm.status().message();
      return;
    }
    auto t = torch::ones({1});
    if (!(*comm)->AllReduceSum(t).ok() || t.item<float>() != 2.0f) early_failure = "all_reduce";
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto server = StoreServer::Start("127.0.0.1", port);
  EXPECT_TRUE(server.ok()) << server.status().message();
  if (server.ok()) {  // (without it, rank 1 gives up after its timeout)
    auto comm = join(0);
    EXPECT_TRUE(comm.ok()) << comm.status().message();
    auto t = torch::ones({1});
    if (comm.ok()) EXPECT_TRUE((*comm)->AllReduceSum(t).ok());
  }
  early.join();
  EXPECT_EQ(early_failure, "");
}

// Pods that share one network namespace (tidal local's; host-network pods) have their own
// addresses but one set of ports. Two jobs whose ranks 0 host a store for the same
// generation ask for the same port: each store listens on its rank's own address, so both
// start, and each group meets only its own ranks.
TEST(CommTest, TwoGroupsOnOnePortOfDifferentAddressesStayApart) {
  int port = 0;
  {
    auto probe = StoreServer::Start("127.0.0.2");
    ASSERT_TRUE(probe.ok()) << probe.status().message();
    port = (*probe)->port();
  }
  auto first = StoreServer::Start("127.0.0.2", port);
  ASSERT_TRUE(first.ok()) << first.status().message();
  auto second = StoreServer::Start("127.0.0.3", port);
  ASSERT_TRUE(second.ok()) << second.status().message();
  // The same address and port twice is refused, naming them.
  auto again = StoreServer::Start("127.0.0.2", port);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(again.status().message().find("127.0.0.2:" + std::to_string(port)), std::string::npos)
      << again.status().message();

  // Two ranks per group, every one with the same key prefix (the same generation).
  std::vector<std::thread> ranks;
  std::vector<float> sums(4, 0.0f);
  std::vector<std::string> failures(4);
  for (int i = 0; i < 4; ++i)
    ranks.emplace_back([&, i] {
      const std::string host = i < 2 ? "127.0.0.2" : "127.0.0.3";
      ProcessGroupOptions options;
      options.store_host = host;
      options.interface_host = host;
      options.store_port = port;
      options.rank = i % 2;
      options.world_size = 2;
      options.key_prefix = "generation-1";
      options.timeout = std::chrono::seconds(30);
      auto comm = ConnectProcessGroup(options);
      if (!comm.ok()) {
        failures[static_cast<size_t>(i)] = comm.status().message();
        return;
      }
      auto t = torch::full({1}, i < 2 ? 1.0f : 10.0f);
      if (Status s = (*comm)->AllReduceSum(t); !s.ok())
        failures[static_cast<size_t>(i)] = s.message();
      sums[static_cast<size_t>(i)] = t.item<float>();
    });
  for (auto& r : ranks) r.join();
  EXPECT_EQ(failures, std::vector<std::string>(4));
  EXPECT_EQ(sums, (std::vector<float>{2.0f, 2.0f, 20.0f, 20.0f}));
}

}  // namespace
}  // namespace tidal::engine
