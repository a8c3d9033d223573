// ZeRO sharding on real gloo groups: stage 3 keeps ≈1/W of the parameter bytes (measured on
// the tensors held), gathers back exactly what was loaded, and computes the same outputs as an
// unsharded model.
#include "worker/engine/zero.h"

#include <gtest/gtest.h>

#include "tests/unit/engine/multi_rank.h"
#include "tests/unit/engine/test_util.h"
#include "worker/engine/hf_checkpoint.h"

namespace tidal::engine {
namespace {

using testing::Logits;

using testing::RunRanks;

DecoderModel TinyModel() {
  LoraSpec lora;
  lora.rank = 4;
  lora.target_modules = {"q_proj", "v_proj", "up_proj"};
  return DecoderModel(*PresetModelConfig("tiny"), lora);
}

class ZeroMemoryTest : public ::testing::TestWithParam<int> {};

TEST_P(ZeroMemoryTest, Stage3ResidentParameterBytesAreAtMostTotalOverWPlusOneBlock) {
  const int world = GetParam();
  DecoderModel model = TinyModel();
  RunRanks(world, [&](Comm& comm) {
    ShardedParameters sharded(model, comm, {3, torch::kCPU, torch::kFloat32});
    ASSERT_TRUE(sharded.Load(RandomInitReader(model, 1)).ok());
    auto tokens = torch::randint(0, 256, {1, 8}, torch::kInt64);
    Logits(sharded, model, tokens);  // gathers and frees every block
    const int64_t resident = sharded.ResidentParameterBytes();
    EXPECT_LE(resident, sharded.TotalParameterBytes() / world + sharded.LargestBlockBytes());
    EXPECT_GE(resident, sharded.TotalParameterBytes() / world);
    // The measurement is not a formula: unsharded, every byte is resident.
    ShardedParameters replicated(model, comm, {0, torch::kCPU, torch::kFloat32});
    EXPECT_GE(replicated.ResidentParameterBytes(), replicated.TotalParameterBytes());
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ZeroMemoryTest, ::testing::Values(2, 4));

TEST(ZeroTest, Stage3GathersBackExactlyWhatWasLoadedAndComputesTheSameLogits) {
  DecoderModel model = TinyModel();
  auto single = MakeSingleRankComm();
  ShardedParameters reference(model, *single, {0, torch::kCPU, torch::kFloat32});
  ASSERT_TRUE(reference.Load(RandomInitReader(model, 9)).ok());
  auto expected = *reference.GatherFull();
  auto tokens = torch::randint(0, 256, {2, 12}, torch::kInt64);
  auto expected_logits = Logits(reference, model, tokens);
  RunRanks(3, [&](Comm& comm) {  // 3 does not divide most sizes: padding is exercised
    ShardedParameters sharded(model, comm, {3, torch::kCPU, torch::kFloat32});
    // Progress counts this rank's elements: rising, ending at its total; the totals of the ranks
    // add up to the model.
    int64_t last = 0, total = 0, calls = 0;
    const bool monotonic = [&] {
      bool rising = true;
      EXPECT_TRUE(sharded
                      .Load(RandomInitReader(model, 9),
                            [&](int64_t loaded, int64_t of) {
                              rising = rising && loaded > last && (total == 0 || of == total);
                              last = loaded, total = of, ++calls;
                            })
                      .ok());
      return rising;
    }();
    EXPECT_TRUE(monotonic);
    EXPECT_GT(calls, 1);
    EXPECT_EQ(last, total);
    int64_t params = 0;
    for (const BlockSpec& block : model.blocks())
      for (const ParamSpec& p : block.params) params += p.numel();
    std::vector<int64_t> all_ranks{total};  // the ranks' shares add up to the whole model
    ASSERT_TRUE(comm.AllReduceSumHost(all_ranks).ok());
    EXPECT_EQ(all_ranks[0], params);
    auto gathered = sharded.GatherFull();
    ASSERT_TRUE(gathered.ok());
    ASSERT_EQ(gathered->size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_EQ((*gathered)[i].first, expected[i].first);
      EXPECT_TRUE(torch::equal((*gathered)[i].second, expected[i].second)) << expected[i].first;
    }
    EXPECT_TRUE(torch::allclose(Logits(sharded, model, tokens), expected_logits, 1e-5, 1e-6));
  });
}

}  // namespace
}  // namespace tidal::engine
