// The training loop on one rank: only LoRA weights move, the base stays bit-identical, ZeRO-3
// matches ZeRO-0, and gradient accumulation matches one large micro-batch.
#include "worker/engine/trainer.h"

#include <gtest/gtest.h>

#include "tests/unit/engine/test_util.h"

namespace tidal::engine {
namespace {

using testing::TinyConfig;

using testing::OpenRows;

TrainerOptions WithRows(const TrainConfig& config) {
  TrainerOptions options;
  options.data = OpenRows(config);
  return options;
}

std::unique_ptr<Trainer> MakeTrainer(const TrainConfig& config) {
  auto trainer = Trainer::Create(config, MakeSingleRankComm(), WithRows(config));
  EXPECT_TRUE(trainer.ok()) << trainer.status().message();
  return trainer.ok() ? std::move(*trainer) : nullptr;
}

std::vector<double> Losses(const TrainConfig& config, int steps) {
  auto trainer = MakeTrainer(config);
  std::vector<double> losses;
  for (int i = 0; i < steps && trainer; ++i) {
    auto r = trainer->Step();
    EXPECT_TRUE(r.ok()) << r.status().message();
    if (r.ok()) losses.push_back(r->loss);
  }
  return losses;
}

void ExpectRelativelyEqual(const std::vector<double>& a, const std::vector<double>& b, double tol) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_LE(std::abs(a[i] - b[i]), tol * std::abs(a[i]))
        << "step " << i + 1 << ": " << a[i] << " vs " << b[i];
}

class TrainerStageTest : public ::testing::TestWithParam<int> {};

TEST_P(TrainerStageTest, OnlyLoraParametersChangeAndBaseWeightsStayBitIdentical) {
  auto trainer = MakeTrainer(TinyConfig(GetParam(), /*dropout=*/0.1));
  ASSERT_TRUE(trainer);
  auto before = *trainer->parameters().GatherFull();
  for (auto& [name, t] : before) t = t.clone();
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(trainer->Step().ok());
  auto after = *trainer->parameters().GatherFull();
  ASSERT_EQ(before.size(), after.size());
  int changed_adapters = 0;
  for (size_t i = 0; i < before.size(); ++i) {
    const bool adapter = before[i].first.find(".lora_") != std::string::npos;
    const bool equal = torch::equal(before[i].second, after[i].second);
    if (adapter) {
      changed_adapters += !equal;
    } else {
      EXPECT_TRUE(equal) << before[i].first << " changed";
    }
  }
  EXPECT_EQ(changed_adapters, 4 /*layers*/ * 4 /*modules*/ * 2 /*A and B*/);
}

INSTANTIATE_TEST_SUITE_P(Stages, TrainerStageTest, ::testing::Values(0, 3));

// A trainer moved into the next generation (LeaveGroup + JoinGroup) starts where Create starts:
// step 0, no optimizer state, initial adapters, the same base weights. Trained from there, its
// losses and weights are a fresh trainer's, bit for bit: nothing of the last generation leaks
// into the next one but what the resume brings.
TEST_P(TrainerStageTest, ARegroupedTrainerStartsExactlyWhereAFreshOneStarts) {
  const TrainConfig config = TinyConfig(GetParam(), /*dropout=*/0.1);
  auto kept = MakeTrainer(config);
  ASSERT_TRUE(kept);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(kept->Step().ok());
  const uint64_t base = kept->parameters().FrozenChecksum();
  kept->LeaveGroup();
  ASSERT_TRUE(kept->JoinGroup(MakeSingleRankComm()).ok());
  EXPECT_EQ(kept->step(), 0);
  EXPECT_EQ(kept->optimizer().steps(), 0);
  EXPECT_EQ(kept->optimizer().StateBytes(), 0);
  EXPECT_EQ(kept->parameters().FrozenChecksum(), base);
  auto fresh = MakeTrainer(config);
  ASSERT_TRUE(fresh);
  for (int i = 0; i < 3; ++i) {
    auto a = kept->Step();
    auto b = fresh->Step();
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->step, b->step);
    EXPECT_EQ(a->loss, b->loss) << "step " << i + 1;
    EXPECT_EQ(a->lr, b->lr) << "step " << i + 1;
  }
  auto got = *kept->parameters().GatherFull();
  auto want = *fresh->parameters().GatherFull();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_TRUE(torch::equal(got[i].second, want[i].second)) << got[i].first;
  // A JoinGroup while in a group is refused, not a second set of shards.
  EXPECT_FALSE(kept->JoinGroup(MakeSingleRankComm()).ok());
}

TEST(TrainerTest, Zero3MatchesZero0OnOneRank) {
  ExpectRelativelyEqual(Losses(TinyConfig(0, 0.1), 6), Losses(TinyConfig(3, 0.1), 6), 1e-5);
}

TEST(TrainerTest, GradientAccumulationMatchesOneLargeMicroBatch) {
  auto accumulated = TinyConfig(0);
  accumulated.optimization.micro_batch_size = 1;  // 4 micro-batches of 1
  auto single = TinyConfig(0);
  single.optimization.micro_batch_size = 4;  // 1 micro-batch of 4
  ExpectRelativelyEqual(Losses(accumulated, 5), Losses(single, 5), 1e-5);
}

TEST(TrainerTest, ReportsFiniteStepStatistics) {
  auto trainer = MakeTrainer(TinyConfig(3));
  ASSERT_TRUE(trainer);
  auto r = trainer->Step();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->step, 1);
  // A random model is near uniform over the 512-token vocabulary (fan-in init: within 1 nat).
  EXPECT_GT(r->loss, std::log(512.0) - 0.5);
  EXPECT_LT(r->loss, std::log(512.0) + 1.0);
  EXPECT_GT(r->grad_norm, 0);
  EXPECT_GT(r->tokens_per_s, 0);
  EXPECT_GT(r->lr, 0);
  EXPECT_EQ(trainer->gradient_accumulation(), 2);
}

TEST(TrainerTest, BadModelChoicesAreRefusedBeforeTraining) {
  auto long_seq = TinyConfig(0);
  long_seq.dataset.max_seq_len = 4096;  // tiny has 1024 positions
  auto s = Trainer::Create(long_seq, MakeSingleRankComm(), WithRows(long_seq));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("spec.dataset.maxSeqLen"), std::string::npos);

  auto fp16 = TinyConfig(0);
  fp16.optimization.precision = "fp16";
  s = Trainer::Create(fp16, MakeSingleRankComm(), WithRows(fp16));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("spec.optimization.precision"), std::string::npos);
}

}  // namespace
}  // namespace tidal::engine

namespace tidal::engine {
namespace {

TEST(TrainerPrecisionTest, Bf16KeepsFp32MasterWeightsAndTracksTheFp32Curve) {
  auto fp32 = TinyConfig(3);
  auto bf16 = TinyConfig(3);
  bf16.optimization.precision = "bf16";
  auto trainer = MakeTrainer(bf16);
  ASSERT_TRUE(trainer);
  std::vector<double> low;
  for (int i = 0; i < 5; ++i) {
    auto r = trainer->Step();
    ASSERT_TRUE(r.ok()) << r.status().message();
    low.push_back(r->loss);
  }
  auto named = trainer->parameters().GatherFull();
  ASSERT_TRUE(named.ok());
  for (const auto& [name, t] : *named) {
    const bool adapter = name.find(".lora_") != std::string::npos;
    EXPECT_EQ(t.scalar_type(), adapter ? torch::kFloat32 : torch::kBFloat16) << name;
  }
  const auto high = Losses(fp32, 5);
  for (size_t i = 0; i < high.size(); ++i)
    EXPECT_NEAR(low[i], high[i], 0.02 * high[i]) << "step " << i + 1;
}

}  // namespace
}  // namespace tidal::engine
