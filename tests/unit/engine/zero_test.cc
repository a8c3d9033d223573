// ZeRO sharding on real gloo groups: stage 3 keeps ≈1/W of the parameter bytes (measured on
// the tensors held), gathers back exactly what was loaded, and computes the same outputs as an
// unsharded model.
#include "worker/engine/zero.h"

#include <atomic>
#include <limits>
#include <set>

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

// The engine kept across generations: a rank's next shard is filled from the base weights it
// held in the last generation wherever they overlap, and read only where they do not; the
// result is bit for bit what a fresh load gives, at every stage and world-size change. With
// the rest read ahead while the last generation trained (ReadAheadBaseWeights), a staying
// rank reads nothing at all.
TEST(ZeroTest, KeptBaseWeightsFillTheNextGenerationsShardAndOnlyTheRestIsRead) {
  DecoderModel model = TinyModel();
  auto single = MakeSingleRankComm();
  ShardedParameters reference(model, *single, {0, torch::kCPU, torch::kFloat32});
  ASSERT_TRUE(reference.Load(RandomInitReader(model, 5)).ok());
  const auto expected = *reference.GatherFull();
  // The frozen elements a reader is asked for, per rank.
  auto counting = [&](std::atomic<int64_t>& frozen_read) {
    return [&model, &frozen_read, source = RandomInitReader(model, 5)](
               const ParamSpec& spec, int64_t first, int64_t count) {
      if (!spec.trainable) frozen_read += count;
      return source(spec, first, count);
    };
  };
  struct Change {
    int stage, from, to;
  };
  // 0: nothing ahead; 1: the missing parts read ahead; 2: and the whole next shard assembled
  // (on the host), which Load then takes over without a copy.
  for (int ahead : {0, 1, 2})
    for (const Change& change :
         {Change{3, 2, 4}, Change{3, 4, 2}, Change{3, 2, 3}, Change{0, 2, 3}, Change{2, 4, 2}}) {
      SCOPED_TRACE("stage " + std::to_string(change.stage) + ", " + std::to_string(change.from) +
                   " -> " + std::to_string(change.to) + " ranks" +
                   (ahead == 1   ? ", read ahead"
                    : ahead == 2 ? ", assembled ahead"
                                 : ""));
      const ShardingOptions options{change.stage, torch::kCPU, torch::kFloat32};
      ShardingOptions next_options = options;
      next_options.allocate_frozen_in_load = true;
      std::vector<KeptBaseWeights> kept(static_cast<size_t>(change.from));
      std::vector<std::vector<const void*>> assembled(static_cast<size_t>(change.from));
      RunRanks(change.from, [&](Comm& comm) {
        const auto r = static_cast<size_t>(comm.rank());
        ShardedParameters old(model, comm, options);
        ASSERT_TRUE(old.Load(RandomInitReader(model, 5)).ok());
        std::vector<std::vector<KeptBaseWeights::Segment>> segments;
        if (ahead > 0 && comm.rank() < change.to) {
          auto read = ReadAheadBaseWeights(model, {change.stage, comm.rank(), change.from},
                                           {change.stage, comm.rank(), change.to}, torch::kFloat32,
                                           RandomInitReader(model, 5), {});
          ASSERT_TRUE(read.ok()) << read.status().ToString();
          segments = std::move(*read);
          // What it holds is what SizeOfReadAhead says, the budget's measure.
          const ReadAheadSize size =
              SizeOfReadAhead(model, {change.stage, comm.rank(), change.from},
                              {change.stage, comm.rank(), change.to});
          int64_t read_elements = 0;
          for (const auto& block : segments)
            for (const auto& segment : block) read_elements += segment.data.numel();
          EXPECT_EQ(size.read, read_elements) << "rank " << r;
          if (ahead == 2) {
            AssembleNextShards(model, {change.stage, comm.rank(), change.to}, old.FrozenShards(),
                               segments, {});
            int64_t assembled_elements = 0;
            for (const auto& block : segments)  // one whole shard per block at stage 3
              if (change.stage == 3 && block.size() == 1) {
                assembled[r].push_back(block[0].data.data_ptr());
                assembled_elements += block[0].data.numel();
              }
            EXPECT_EQ(size.assembled, assembled_elements) << "rank " << r;
          }
        }
        kept[r] = old.ReleaseBaseWeights();
        if (segments.empty()) return;
        ASSERT_EQ(segments.size(), kept[r].blocks.size());
        for (size_t b = 0; b < segments.size(); ++b) kept[r].blocks[b].ahead = segments[b];
      });
      std::vector<int64_t> reused(static_cast<size_t>(change.to), -1);
      std::vector<std::atomic<int64_t>> frozen_read(static_cast<size_t>(change.to));
      RunRanks(change.to, [&](Comm& comm) {
        const auto r = static_cast<size_t>(comm.rank());
        ShardedParameters next(model, comm, next_options);
        // The ranks that stay bring what they held; a new rank has nothing.
        KeptBaseWeights* mine = r < kept.size() ? &kept[r] : nullptr;
        std::set<const void*> old_storage;
        if (mine)
          for (const auto& block : mine->blocks) old_storage.insert(block.data.data_ptr());
        ASSERT_TRUE(next.Load(counting(frozen_read[r]), {}, mine).ok());
        if (ahead == 2 && change.stage == 3 && r < kept.size()) {  // taken over, not copied
          ASSERT_EQ(assembled[r].size(), model.blocks().size()) << "rank " << r;
          const auto shards = next.FrozenShards();
          for (size_t b = 0; b < shards.size(); ++b)
            EXPECT_EQ(shards[b].data.data_ptr(), assembled[r][b]) << "rank " << r << " block " << b;
          // Nothing was allocated, so the old shard is handed back whole, to be freed off the
          // pause, rather than freed inside it.
          std::set<const void*> retired;
          for (const auto& t : mine->retired) retired.insert(t.data_ptr());
          EXPECT_EQ(retired, old_storage) << "rank " << r;
        } else if (mine && ahead == 0) {
          // Copied block by block: each old block freed as it went, bounding the peak.
          EXPECT_TRUE(mine->retired.empty()) << "rank " << r;
        }
        if (mine) {
          reused[r] = mine->reused;
          EXPECT_EQ(mine->read, frozen_read[r].load()) << "rank " << r;
          for (const auto& block : mine->blocks) {
            EXPECT_FALSE(block.data.defined()) << "not freed";
            EXPECT_TRUE(block.ahead.empty()) << "not freed";
          }
        }
        auto gathered = next.GatherFull();
        ASSERT_TRUE(gathered.ok());
        ASSERT_EQ(gathered->size(), expected.size());
        for (size_t i = 0; i < expected.size(); ++i)
          EXPECT_TRUE(torch::equal((*gathered)[i].second, expected[i].second)) << expected[i].first;
      });
      const bool replicated = change.stage < 3;
      for (size_t r = 0; r < reused.size(); ++r) {
        if (r >= kept.size()) {
          EXPECT_GT(frozen_read[r].load(), 0) << "rank " << r << " is new: it reads its shard";
        } else if (ahead > 0) {
          EXPECT_EQ(frozen_read[r].load(), 0) << "rank " << r << " read what it had read ahead";
          EXPECT_GT(reused[r], 0) << "rank " << r;
        } else if (replicated || change.to > change.from) {
          // Every base weight at stages 0-2; at stage 3, rank 0's new shard lies inside its old
          // one when the world grows.
          if (replicated || r == 0) EXPECT_EQ(frozen_read[r].load(), 0) << "rank " << r;
          if (replicated || r == 0) EXPECT_GT(reused[r], 0) << "rank " << r;
        } else if (r == 0) {
          // Stage 3, shrinking: rank 0's new shard starts with its old one and goes on into what
          // was another rank's.
          EXPECT_GT(reused[r], 0);
          EXPECT_GT(frozen_read[r].load(), 0);
        }
      }
    }
}

// A read ahead is done only where the host memory it holds fits its budget: the segments and the
// assembled shard together to assemble, the segments alone to read; otherwise not at all.
TEST(ZeroTest, AReadAheadHoldsOnlyWhatTheHostMemoryBudgetAllows) {
  struct Case {
    ReadAheadSize size;
    int64_t element_bytes, budget_bytes;
    ReadAheadFit want;
  };
  const Case cases[] = {
      {{100, 400}, 4, 2000, ReadAheadFit::kReadAndAssemble},  // exactly 500 elements
      {{100, 400}, 4, 1999, ReadAheadFit::kReadOnly},
      {{100, 400}, 4, 400, ReadAheadFit::kReadOnly},
      {{100, 400}, 4, 399, ReadAheadFit::kNothing},
      {{100, 400}, 2, 1000, ReadAheadFit::kReadAndAssemble},  // bf16 halves the bytes
      {{100, 0}, 4, 1 << 20, ReadAheadFit::kReadOnly},        // below stage 3, nothing to build
      {{0, 0}, 4, 0, ReadAheadFit::kReadOnly},                // nothing to read fits anything
      {{1, 0}, 4, 0, ReadAheadFit::kNothing},                 // TIDAL_READ_AHEAD_MAX_BYTES=0
      {{1, 0}, 4, -5, ReadAheadFit::kNothing},
      // Sizes of a 70 B model's shard in bytes do not overflow the check.
      {{int64_t{1} << 40, int64_t{1} << 40},
       4,
       std::numeric_limits<int64_t>::max(),
       ReadAheadFit::kReadAndAssemble},
  };
  for (const Case& c : cases)
    EXPECT_EQ(FitReadAhead(c.size, c.element_bytes, c.budget_bytes), c.want)
        << c.size.read << " + " << c.size.assembled << " elements of " << c.element_bytes
        << " bytes, budget " << c.budget_bytes;
}

// A read ahead cut short (its generation ended first) keeps the elements it read, and the
// next Load reads exactly the rest: the shard is bit for bit a fresh load's either way.
TEST(ZeroTest, AReadAheadCutShortKeepsWhatItReadAndTheNextLoadReadsOnlyTheRest) {
  DecoderModel model = TinyModel();
  const ShardPlacement from{3, 1, 4}, to{3, 1, 2};  // rank 1's new half lies outside its quarter
  std::vector<KeptBaseWeights> kept(4);
  RunRanks(4, [&](Comm& comm) {
    ShardedParameters old(model, comm, {3, torch::kCPU, torch::kFloat32});
    ASSERT_TRUE(old.Load(RandomInitReader(model, 5)).ok());
    kept[static_cast<size_t>(comm.rank())] = old.ReleaseBaseWeights();
  });
  bool complete = true;
  int reads = 0;
  std::atomic<int64_t> read_ahead{0};
  auto source = RandomInitReader(model, 5);
  auto counting = [&](std::atomic<int64_t>& frozen) {
    return [&frozen, &source](const ParamSpec& spec, int64_t first, int64_t count) {
      if (!spec.trainable) frozen += count;
      return source(spec, first, count);
    };
  };
  auto segments = ReadAheadBaseWeights(
      model, from, to, torch::kFloat32, counting(read_ahead), [&] { return ++reads > 5; },
      &complete);
  ASSERT_TRUE(segments.ok()) << segments.status().ToString();
  EXPECT_FALSE(complete);
  int64_t kept_elements = 0;
  for (size_t b = 0; b < segments->size(); ++b)
    for (const auto& segment : (*segments)[b]) kept_elements += segment.data.numel();
  EXPECT_EQ(kept_elements, read_ahead.load()) << "what was read is what is kept";
  EXPECT_GT(kept_elements, 0);
  for (size_t b = 0; b < segments->size(); ++b) kept[1].blocks[b].ahead = (*segments)[b];

  auto single = MakeSingleRankComm();
  ShardedParameters reference(model, *single, {0, torch::kCPU, torch::kFloat32});
  ASSERT_TRUE(reference.Load(RandomInitReader(model, 5)).ok());
  const auto expected = *reference.GatherFull();
  std::vector<std::atomic<int64_t>> frozen_read(2);
  RunRanks(2, [&](Comm& comm) {
    const auto r = static_cast<size_t>(comm.rank());
    ShardingOptions options{3, torch::kCPU, torch::kFloat32};
    options.allocate_frozen_in_load = true;
    ShardedParameters next(model, comm, options);
    ASSERT_TRUE(next.Load(counting(frozen_read[r]), {}, &kept[r]).ok());
    auto gathered = next.GatherFull();
    ASSERT_TRUE(gathered.ok());
    for (size_t i = 0; i < expected.size(); ++i)
      EXPECT_TRUE(torch::equal((*gathered)[i].second, expected[i].second)) << expected[i].first;
  });
  // Rank 1's new half came from memory (its quarter, the segments read ahead) and the rest
  // was read now: something, since the read ahead was cut short.
  int64_t half = 0;
  for (const BlockSpec& spec : model.blocks()) {
    int64_t n = 0;
    for (const ParamSpec& p : spec.params)
      if (!p.trainable) n += p.numel();
    half += n - std::min(n, (n + 1) / 2);
  }
  EXPECT_EQ(kept[1].read, frozen_read[1].load());
  EXPECT_GT(kept[1].read, 0);
  EXPECT_GE(kept[1].reused, kept_elements);
  EXPECT_EQ(kept[1].reused + kept[1].read, half);
}

}  // namespace
}  // namespace tidal::engine
