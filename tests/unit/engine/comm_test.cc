// comm over real gloo process groups: the fallbacks for what gloo 1.13 lacks (reduce_scatter,
// flat all-gather) give exactly what the collectives define, at odd world sizes too.
#include "worker/engine/comm.h"

#include <thread>

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

}  // namespace
}  // namespace tidal::engine
