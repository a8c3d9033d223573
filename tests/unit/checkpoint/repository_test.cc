// The commit protocol over an object store: a checkpoint is usable only once its manifest is
// written after every shard; torn, truncated and corrupt ones are skipped or caught, with the
// previous one still loadable; retention prunes what the policy drops. The store here is in
// memory (memory_store.h); the real file:// and s3:// stores run the same protocol in the
// integration tests.
#include "worker/checkpoint/repository.h"

#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <map>

#include "tests/unit/checkpoint/memory_store.h"

namespace tidal::checkpoint {
namespace {

using nlohmann::json;

std::string Floats(int64_t first, int64_t count, float scale) {
  std::string out(static_cast<size_t>(count) * 4, '\0');
  for (int64_t i = 0; i < count; ++i) {
    float v = scale * static_cast<float>(first + i);
    std::memcpy(out.data() + i * 4, &v, 4);
  }
  return out;
}

// Rank r of `world` saves its slice of a 40-element tensor "w" (values step × index).
class RepositoryTest : public ::testing::Test {
 protected:
  std::vector<BuiltShard> Shards(int64_t step, int world) {
    std::vector<BuiltShard> shards;
    for (int r = 0; r < world; ++r) {
      int64_t lo = 40 * r / world, hi = 40 * (r + 1) / world;
      // Shards view their pieces' bytes: keep them for the fixture's lifetime.
      const std::string& bytes =
          pieces_.emplace_back(Floats(lo, hi - lo, static_cast<float>(step)));
      shards.push_back(*BuildShard(r, world, {{"w", "F32", {40}, lo, bytes}}, 32));
    }
    return shards;
  }
  Manifest Save(int64_t step, int world, CheckpointKind kind = CheckpointKind::kFull,
                bool commit = true) {
    auto shards = Shards(step, world);
    for (const auto& s : shards) EXPECT_TRUE(repo_.WriteShard(step, s).ok());
    EXPECT_TRUE(repo_.WriteTrainerState(step, {{"step", step}}).ok());
    Manifest header;
    header.step = step;
    header.kind = kind;
    header.world_size = world;
    auto m = AssembleManifest(header, shards);
    EXPECT_TRUE(m.ok()) << m.status().message();
    if (commit) EXPECT_TRUE(repo_.Commit(*m).ok());
    return *m;
  }
  std::deque<std::string> pieces_;
  MemoryStore store_;
  Repository repo_{store_};
};

TEST_F(RepositoryTest, CommittedCheckpointLoadsAtAnotherWorldSize) {
  Save(10, 2);
  EXPECT_EQ(store_.objects_.at("latest"), "step-00000010\n");
  auto m = repo_.NewestUsable();
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->step, 10);
  for (int r = 0; r < 3; ++r) {  // as 3 ranks would read it
    int64_t lo = 40 * r / 3, hi = 40 * (r + 1) / 3;
    auto bytes = repo_.ReadTensor(*m, "w", lo, hi - lo);
    ASSERT_TRUE(bytes.ok()) << bytes.status().message();
    EXPECT_EQ(*bytes, Floats(lo, hi - lo, 10));
  }
  EXPECT_EQ((*repo_.ReadTrainerState(10))["step"], 10);
}

// Chunks of 32 bytes (8 elements) over pieces [0, 13) [13, 26) [26, 40): every sub-range
// reads back whole — chunks cut at either end, inside one chunk, across pieces and shards.
TEST_F(RepositoryTest, EverySubRangeReadsBackAcrossChunkPieceAndShardBoundaries) {
  Manifest m = Save(10, 3);
  for (int64_t first = 0; first < 40; ++first)
    for (int64_t count = 1; first + count <= 40; ++count) {
      auto bytes = repo_.ReadTensor(m, "w", first, count);
      ASSERT_TRUE(bytes.ok()) << first << "+" << count << ": " << bytes.status().message();
      ASSERT_EQ(*bytes, Floats(first, count, 10)) << first << "+" << count;
    }
}

// A flipped byte in element 30 (piece [26, 40), its chunk [26, 34)) fails exactly the reads
// that touch that chunk, whether it is read whole or cut at an end.
TEST_F(RepositoryTest, ACorruptChunkFailsExactlyTheReadsThatTouchIt) {
  Manifest m = Save(10, 3);
  const PieceEntry& piece = m.Find("w")->pieces[2];
  ASSERT_EQ(piece.first, 26);
  store_.objects_.at("step-00000010/shard-00003-of-00003.safetensors")[piece.offset + 4 * 4] ^= 1;
  for (int64_t first = 0; first < 40; ++first)
    for (int64_t count = 1; first + count <= 40; ++count) {
      const bool touches = first < 34 && first + count > 26;
      auto bytes = repo_.ReadTensor(m, "w", first, count);
      ASSERT_EQ(bytes.ok(), !touches) << first << "+" << count;
      if (touches) ASSERT_EQ(bytes.status().code(), StatusCode::kDataLoss);
    }
}

// A rank's slices of several tensors in one call, as a resuming rank reads them: requests
// joined across gaps; a corrupt chunk that only lies in a gap read and dropped fails nothing.
TEST_F(RepositoryTest, BatchedReadsOfEveryRankAtAnotherWorldSizeComeBackWhole) {
  Manifest m = Save(10, 3);
  for (int ranks : {1, 2, 4, 5}) {
    std::vector<std::string> out(ranks);
    std::vector<Repository::TensorRead> reads;
    for (int r = 0; r < ranks; ++r) {
      const int64_t lo = 40 * r / ranks, hi = 40 * (r + 1) / ranks;
      out[r].assign((hi - lo) * 4, '\0');
      reads.push_back({"w", lo, hi - lo, out[r].data()});
    }
    ASSERT_TRUE(repo_.ReadTensorsInto(m, reads).ok()) << ranks;
    for (int r = 0; r < ranks; ++r)
      EXPECT_EQ(out[r], Floats(40 * r / ranks, 40 * (r + 1) / ranks - 40 * r / ranks, 10)) << r;
  }
  // Elements [0, 8) and [16, 24) of piece [0, 13) and [13, 26): [8, 16) is a chunk between.
  store_.objects_.at(
      "step-00000010/shard-00001-of-00003.safetensors")[m.Find("w")->pieces[0].offset + 4 * 9] ^= 1;
  std::string a(8 * 4, '\0'), b(8 * 4, '\0');
  ASSERT_TRUE(repo_.ReadTensorsInto(m, {{"w", 0, 8, a.data()}, {"w", 16, 8, b.data()}}).ok());
  EXPECT_EQ(a, Floats(0, 8, 10));
  EXPECT_EQ(b, Floats(16, 8, 10));
  EXPECT_EQ(repo_.ReadTensor(m, "w", 8, 1).status().code(), StatusCode::kDataLoss);
}

// A tensor larger than one read request (1 MiB) in the default 64 KiB chunks, saved by 2 ranks
// and read back by 1 and 3: whole-chunk stretches are split across several requests and still land
// where they belong.
TEST_F(RepositoryTest, TensorsLargerThanOneRequestReadBackAcrossSplitRequests) {
  const int64_t n = 700'000;  // 2.8 MB of F32
  std::vector<BuiltShard> shards;
  for (int r = 0; r < 2; ++r) {
    const int64_t lo = n * r / 2, hi = n * (r + 1) / 2;
    const std::string& bytes = pieces_.emplace_back(Floats(lo, hi - lo, 1));
    shards.push_back(*BuildShard(r, 2, {{"big", "F32", {n}, lo, bytes}}));
    ASSERT_TRUE(repo_.WriteShard(30, shards.back()).ok());
  }
  auto m = AssembleManifest(Manifest{.step = 30, .world_size = 2}, shards);
  ASSERT_TRUE(m.ok()) << m.status().message();
  for (int ranks : {1, 3}) {  // at 1, each saved piece (1.4 MB) is read whole
    std::vector<std::string> out(ranks);
    std::vector<Repository::TensorRead> reads;
    for (int r = 0; r < ranks; ++r) {
      const int64_t lo = n * r / ranks, hi = n * (r + 1) / ranks;
      out[r].assign((hi - lo) * 4, '\0');
      reads.push_back({"big", lo, hi - lo, out[r].data()});
    }
    ASSERT_TRUE(repo_.ReadTensorsInto(*m, reads).ok());
    for (int r = 0; r < ranks; ++r)
      EXPECT_TRUE(out[r] == Floats(n * r / ranks, n * (r + 1) / ranks - n * r / ranks, 1))
          << ranks << " ranks, rank " << r;
  }
}

TEST_F(RepositoryTest, ATornSaveIsIgnoredAndThePreviousOneLoads) {
  Save(10, 2);
  Save(20, 2, CheckpointKind::kFull, /*commit=*/false);  // killed before the manifest
  auto scanned = repo_.Scan();
  ASSERT_TRUE(scanned.ok());
  ASSERT_EQ(scanned->size(), 2u);
  EXPECT_EQ((*scanned)[0].step, 20);
  EXPECT_EQ((*scanned)[0].problem, "no manifest.json: never committed (torn save)");
  EXPECT_EQ(repo_.NewestUsable()->step, 10);
  EXPECT_EQ(store_.objects_.at("latest"), "step-00000010\n");
}

TEST_F(RepositoryTest, CommitRefusesWhenARanksShardIsMissingAndLeavesLatestAlone) {
  Save(10, 2);
  auto shards = Shards(20, 2);
  ASSERT_TRUE(repo_.WriteShard(20, shards[0]).ok());  // rank 1's write never arrived
  auto m = AssembleManifest(Manifest{.step = 20, .world_size = 2}, shards);
  ASSERT_TRUE(m.ok());
  Status s = repo_.Commit(*m);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "not committing step-00000020: shard-00002-of-00002.safetensors is missing");
  EXPECT_FALSE(store_.objects_.count("step-00000020/manifest.json"));
  EXPECT_EQ(store_.objects_.at("latest"), "step-00000010\n");
}

// Issue 47: a generation the operator replaced (it could not reach its worker) trained on and
// committed the same steps as its successor, moving `latest` to its own. The fence refuses the
// older generation's commit once a newer one has started, and leaves manifest and latest alone.
TEST_F(RepositoryTest, ACommitOfAGenerationOlderThanTheFenceIsRefusedAndLatestStays) {
  repo_.SetGeneration(1);
  Save(10, 2);
  EXPECT_EQ(store_.objects_.at("fence"), "1\n");
  EXPECT_EQ(repo_.ReadManifest(10)->generation, 1) << "the commit carries its fencing token";
  Repository successor(store_);
  successor.SetGeneration(2);
  ASSERT_TRUE(successor.Fence().ok());  // generation 2 starts (before its first step)
  EXPECT_EQ(*repo_.ReadFence(), 2);

  auto shards = Shards(20, 2);
  for (const auto& shard : shards) ASSERT_TRUE(repo_.WriteShard(20, shard).ok());
  auto m = AssembleManifest(Manifest{.step = 20, .world_size = 2}, shards);
  ASSERT_TRUE(m.ok());
  Status s = repo_.Commit(*m);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "superseded: generation 2 of this job has started, so generation 1 may not write to "
            "mem://test");
  EXPECT_FALSE(store_.objects_.count("step-00000020/manifest.json"));
  EXPECT_EQ(store_.objects_.at("latest"), "step-00000010\n");
  EXPECT_EQ(repo_.Fence().code(), StatusCode::kFailedPrecondition) << "a restart of generation 1";
  EXPECT_EQ(*repo_.ReadFence(), 2) << "the fence never goes back";
}

// Issue 47: a job deleted and made again under the same name resumed the deleted one's
// checkpoints. The store belongs to the first job that claims it.
TEST_F(RepositoryTest, AStoreBelongsToTheJobThatClaimedItAndAnotherJobIsRefusedNamingBoth) {
  ASSERT_TRUE(repo_.Claim({"uid-a", "ml", "lora"}).ok());
  EXPECT_EQ(json::parse(store_.objects_.at("owner"))["uid"], "uid-a");
  EXPECT_TRUE(repo_.Claim({"uid-a", "ml", "lora"}).ok()) << "its own store, again";
  Status other = repo_.Claim({"uid-b", "ml", "lora"});
  EXPECT_EQ(other.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(other.message(),
            "spec.checkpoint.uri: mem://test holds the checkpoints of job ml/lora (uid uid-a), not "
            "of this job (uid uid-b): a job never resumes or overwrites another's. To start from "
            "them, set spec.checkpoint.resumeFrom: mem://test and give this job a store of its "
            "own (another spec.checkpoint.uri)");
  EXPECT_EQ(json::parse(store_.objects_.at("owner"))["uid"], "uid-a") << "the claim moved";
  EXPECT_TRUE(repo_.Claim({"", "", ""}).ok()) << "a run outside the operator claims nothing";
  store_.objects_["owner"] = "not json";
  EXPECT_EQ(repo_.Claim({"uid-a", "ml", "lora"}).code(), StatusCode::kDataLoss);
}

TEST_F(RepositoryTest, AnUnfencedRunCommitsWithoutTouchingTheFenceAndAnUnreadableFenceIsDataLoss) {
  Save(10, 1);  // generation 0: tidal-train, tools
  EXPECT_FALSE(store_.objects_.count("fence"));
  EXPECT_EQ(repo_.ReadManifest(10)->generation, 0);
  store_.objects_["fence"] = "two\n";
  repo_.SetGeneration(3);
  Status s = repo_.Fence();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("fence: expected a generation number, got \"two"), std::string::npos)
      << s.message();
}

TEST_F(RepositoryTest, ACorruptByteFailsTheReadAndTheCallerFallsBack) {
  Save(10, 2);
  Manifest newest = Save(20, 2);
  store_.objects_.at("step-00000020/shard-00002-of-00002.safetensors")[200] ^= 0x40;
  // The corrupt byte lies in the data of rank 1's piece: whichever read covers it fails.
  auto bad = repo_.ReadTensor(newest, "w", 0, 40);
  EXPECT_EQ(bad.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(bad.status().message().find("mem://test/step-00000020/shard-00002-of-00002"),
            std::string::npos)
      << bad.status().message();
  auto previous = repo_.NewestUsable({20});
  ASSERT_TRUE(previous.ok());
  EXPECT_EQ(previous->step, 10);
  EXPECT_EQ(*repo_.ReadTensor(*previous, "w", 0, 40), Floats(0, 40, 10));
}

TEST_F(RepositoryTest, TruncatedShardsAndBrokenManifestsAreSkippedWithTheReason) {
  Save(10, 2);
  Save(20, 2);
  Save(30, 2);
  store_.objects_.at("step-00000020/shard-00001-of-00002.safetensors").resize(100);
  store_.objects_.at("step-00000030/manifest.json") = "{\"formatVersion\": 1";
  auto result = repo_.Scan();
  ASSERT_TRUE(result.ok());
  const auto& scanned = *result;
  EXPECT_NE(scanned[0].problem.find("manifest.json invalid"), std::string::npos)
      << scanned[0].problem;
  EXPECT_NE(scanned[1].problem.find("has 100 bytes, expected"), std::string::npos);
  // Issue 47: the resume says which newer ones it skipped as corrupt — a torn save (step 40,
  // never committed) is none of them.
  Save(40, 2, CheckpointKind::kFull, /*commit=*/false);
  std::vector<std::string> corrupt;
  EXPECT_EQ(repo_.NewestUsable({}, &corrupt)->step, 10);
  ASSERT_EQ(corrupt.size(), 2u);
  EXPECT_EQ(corrupt[0].rfind("step-00000030: manifest.json invalid", 0), 0u) << corrupt[0];
  EXPECT_EQ(corrupt[1].rfind("step-00000020: shard-00001-of-00002.safetensors has 100 bytes", 0),
            0u)
      << corrupt[1];
}

TEST_F(RepositoryTest, AFailingStoreFailsTheSaveClearlyWithoutTouchingLatest) {
  Save(10, 2);
  store_.fail_puts_matching_ = "step-00000020/shard";
  auto shards = Shards(20, 2);
  Status s = repo_.WriteShard(20, shards[0]);
  EXPECT_EQ(s.message(),
            "writing step-00000020/shard-00001-of-00002.safetensors: No space left on device");
  store_.fail_puts_matching_ = "manifest.json";
  for (const auto& shard : shards)
    store_.objects_["step-00000020/" + shard.entry.file] = shard.Bytes();
  EXPECT_FALSE(repo_.Commit(*AssembleManifest(Manifest{.step = 20, .world_size = 2}, shards)).ok());
  EXPECT_EQ(store_.objects_.at("latest"), "step-00000010\n");
  EXPECT_EQ(repo_.NewestUsable()->step, 10);
}

TEST_F(RepositoryTest, PruneKeepsNewestFullsAndLaterSnapshotsAndDropsTornOnes) {
  Save(10, 1);
  Save(15, 1, CheckpointKind::kFull, /*commit=*/false);  // torn
  Save(20, 1);
  Save(25, 1, CheckpointKind::kSnapshot);
  Save(30, 1);
  Save(35, 1, CheckpointKind::kSnapshot);
  auto pruned = repo_.Prune(2);
  ASSERT_TRUE(pruned.ok());
  EXPECT_EQ(*pruned, (std::vector<int64_t>{10, 15, 25}));
  auto scanned = repo_.Scan();
  ASSERT_TRUE(scanned.ok());
  std::vector<int64_t> left;
  for (const auto& c : *scanned) left.push_back(c.step);
  EXPECT_EQ(left, (std::vector<int64_t>{35, 30, 20}));
  EXPECT_EQ(repo_.NewestUsable()->step, 35);
}

}  // namespace
}  // namespace tidal::checkpoint
