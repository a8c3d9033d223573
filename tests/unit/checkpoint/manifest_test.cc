// The checkpoint format without LibTorch: shards as safetensors, manifests that name every
// piece with its byte range and checksum, validation of what readers rely on, read planning
// across a change of world size, and retention.
#include "worker/checkpoint/manifest.h"

#include <gtest/gtest.h>

#include <cstring>

namespace tidal::checkpoint {
namespace {

using nlohmann::json;

std::string Floats(int64_t first, int64_t count) {
  std::string out(static_cast<size_t>(count) * 4, '\0');
  for (int64_t i = 0; i < count; ++i) {
    float v = static_cast<float>(first + i);
    std::memcpy(out.data() + i * 4, &v, 4);
  }
  return out;
}

// Tensor "w" of shape {10, 3} (30 elements) and "b" of {5}, split over `world` ranks as
// contiguous ranges, like ZeRO slices.
StatusOr<Manifest> SaveAt(int world, std::vector<BuiltShard>& shards,
                          std::vector<std::string>& storage,
                          uint64_t chunk_bytes = kDefaultChunkBytes) {
  storage.clear();
  storage.reserve(2 * static_cast<size_t>(world));
  shards.clear();
  for (int r = 0; r < world; ++r) {
    std::vector<PieceData> pieces;
    for (auto [name, numel] : {std::pair<std::string, int64_t>{"w", 30}, {"b", 5}}) {
      int64_t lo = numel * r / world, hi = numel * (r + 1) / world;
      if (hi == lo) continue;
      storage.push_back(Floats(lo, hi - lo));
      pieces.push_back({name, "F32",
                        name == "w" ? std::vector<int64_t>{10, 3} : std::vector<int64_t>{5}, lo,
                        storage.back()});
    }
    auto shard = BuildShard(r, world, pieces, chunk_bytes);
    if (!shard.ok()) return shard.status();
    shards.push_back(std::move(*shard));
  }
  Manifest header;
  header.step = 15;
  header.world_size = world;
  header.zero_stage = 3;
  header.config_hash = "abc";
  return AssembleManifest(header, shards);
}

TEST(ManifestTest, ShardsAreSafetensorsWithPiecesAtTheManifestsOffsets) {
  std::vector<BuiltShard> shards;
  std::vector<std::string> storage;
  auto m = SaveAt(3, shards, storage);
  ASSERT_TRUE(m.ok()) << m.status().message();
  ASSERT_EQ(m->shards.size(), 3u);
  EXPECT_EQ(m->shards[1].file, "shard-00002-of-00003.safetensors");
  for (const BuiltShard& s : shards) {
    const std::string file = s.Bytes();
    uint64_t header_len = 0;
    std::memcpy(&header_len, file.data(), 8);
    EXPECT_EQ(header_len % 8, 0u);
    json header = json::parse(file.substr(8, header_len));
    EXPECT_EQ(header["__metadata__"]["format"], "tidal-checkpoint");
    EXPECT_EQ(s.entry.size, file.size());
    EXPECT_EQ(s.entry.xxh3, Xxh3Hex(file));  // streamed over the parts, equal to the whole's
  }
  // Every piece's bytes are where the manifest says, and their checksum matches.
  for (const TensorEntry& t : m->tensors)
    for (const PieceEntry& p : t.pieces) {
      std::string bytes = shards[p.shard].Bytes().substr(p.offset, p.count * 4);
      EXPECT_EQ(bytes, Floats(p.first, p.count)) << t.name << "@" << p.first;
      ASSERT_EQ(p.chunks.size(), 1u);  // pieces under the default chunk size
      EXPECT_EQ(Xxh3Hex(bytes), p.chunks[0]);
    }
}

TEST(ManifestTest, RoundTripsThroughJson) {
  std::vector<BuiltShard> shards;
  std::vector<std::string> storage;
  auto m = SaveAt(2, shards, storage);
  ASSERT_TRUE(m.ok());
  auto back = ManifestFromJson(json::parse(ToJson(*m).dump()));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(ToJson(*back), ToJson(*m));
  EXPECT_EQ(back->Find("w")->numel(), 30);
  EXPECT_EQ(back->Find("nope"), nullptr);
  EXPECT_FALSE(ToJson(*m).contains("generation")) << "an unfenced manifest is as before";
  m->generation = 7;
  EXPECT_EQ(ManifestFromJson(json::parse(ToJson(*m).dump()))->generation, 7);
}

// Fetches and verifies every range of a plan, assembling the requested elements.
StatusOr<std::string> Read(const Manifest& m, const std::vector<BuiltShard>& shards,
                           const std::string& tensor, int64_t first, int64_t count,
                           uint64_t* fetched_bytes = nullptr) {
  auto ranges = PlanRead(m, tensor, first, count);
  if (!ranges.ok()) return ranges.status();
  std::string out(static_cast<size_t>(count) * 4, '\0');
  for (const ReadRange& r : *ranges) {
    size_t shard = 0;
    while (m.shards[shard].file != r.file) ++shard;
    std::string bytes = shards[shard].Bytes().substr(r.fetch_offset, r.fetch_length);
    if (fetched_bytes) *fetched_bytes += bytes.size();
    TIDAL_RETURN_IF_ERROR(VerifyRange(r, bytes));
    std::memcpy(out.data() + r.dest_first * 4, bytes.data() + r.skip, r.length);
  }
  return out;
}

TEST(ManifestTest, ReadsAtAnotherWorldSizeTouchOnlyTheNeededChunks) {
  std::vector<BuiltShard> shards;
  std::vector<std::string> storage;
  auto m = SaveAt(3, shards, storage, /*chunk_bytes=*/16);  // w pieces: [0,10) [10,20) [20,30)
  ASSERT_TRUE(m.ok()) << m.status().message();
  // Rank 1 of 4 needs w elements [7, 15): the end of shard 0 and the start of shard 1.
  uint64_t fetched = 0;
  auto got = Read(*m, shards, "w", 7, 8, &fetched);
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(*got, Floats(7, 8));
  // 32 bytes wanted; widened to whole 4-element chunks: elements [4,10) of the first piece
  // (its last chunk is short), [10,18) of the second — never the whole pieces.
  EXPECT_EQ(fetched, 6u * 4 + 8u * 4);
  for (int64_t first = 0; first < 30; ++first)
    for (int64_t count = 1; first + count <= 30; ++count)
      ASSERT_EQ(*Read(*m, shards, "w", first, count), Floats(first, count))
          << first << "+" << count;
  EXPECT_EQ(PlanRead(*m, "w", 25, 6).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanRead(*m, "x", 0, 1).status().code(), StatusCode::kNotFound);
}

TEST(ManifestTest, ACorruptByteIsCaughtByTheChunkThatHoldsIt) {
  std::vector<BuiltShard> shards;
  std::vector<std::string> storage;
  auto m = SaveAt(2, shards, storage, 16);
  ASSERT_TRUE(m.ok());
  ASSERT_EQ(m->Find("w")->pieces[1].first, 15);            // elements [15, 30) in shard 1
  ASSERT_EQ(shards[1].data[0].data(), storage[2].data());  // shards view the pieces' bytes
  storage[2][4 * 6] ^= 0x01;                               // element 21
  auto bad = Read(*m, shards, "w", 20, 2);
  EXPECT_EQ(bad.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(bad.status().message().find("shard-00002-of-00002.safetensors: checksum mismatch"),
            std::string::npos)
      << bad.status().message();
  EXPECT_TRUE(Read(*m, shards, "w", 0, 15).ok());  // other chunks still read
}

TEST(ManifestTest, InvalidManifestsAreRefusedNamingTheField) {
  std::vector<BuiltShard> shards;
  std::vector<std::string> storage;
  auto m = SaveAt(2, shards, storage);
  ASSERT_TRUE(m.ok());
  json good = ToJson(*m);
  auto refused = [&](const std::function<void(json&)>& edit) {
    json j = good;
    edit(j);
    auto r = ManifestFromJson(j);
    return r.ok() ? std::string("accepted") : r.status().message();
  };
  EXPECT_EQ(refused([](json& j) { j["formatVersion"] = 2; }),
            "formatVersion: 2 is not supported (this build reads 1)");
  EXPECT_EQ(refused([](json& j) { j["kind"] = "partial"; }),
            "kind: expected \"full\" or \"snapshot\", got \"partial\"");
  EXPECT_EQ(refused([](json& j) { j.erase("step"); }), "step: required");
  EXPECT_EQ(refused([](json& j) { j["generation"] = -1; }), "generation: expected >= 0");
  EXPECT_EQ(refused([](json& j) { j["generation"] = "3"; }),
            "generation: wrong type or out of range");
  EXPECT_EQ(refused([](json& j) { j["zeroStage"] = 4; }), "zeroStage: expected 0-3");
  EXPECT_EQ(refused([](json& j) { j["shards"][0]["file"] = "../x"; }),
            "shards[0].file: expected a plain file name, got \"../x\"");
  EXPECT_EQ(refused([](json& j) { j["tensors"][1]["pieces"][1]["first"] = 16; }),
            "tensors[1].pieces[1].first: expected 15 (pieces must cover the tensor in order, "
            "without gaps or overlap)");
  EXPECT_EQ(refused([](json& j) {
              j["tensors"][1]["shape"] = {10, 4};
            }),
            "tensors[1].pieces: cover 30 of 40 elements");
  EXPECT_EQ(refused([](json& j) { j["tensors"][0]["dtype"] = "F33"; }),
            "tensors[0].dtype: unknown \"F33\"");
  EXPECT_NE(refused([](json& j) {
              j["tensors"][0]["pieces"][0]["offset"] = 1 << 30;
            }).find("ends past its shard"),
            std::string::npos);
  EXPECT_EQ(refused([](json& j) { j["tensors"][0]["pieces"][0]["chunks"] = {"XYZ"}; }),
            "tensors[0].pieces[0].chunks: expected 16 lowercase hex digits");
  EXPECT_EQ(refused([](json& j) { j["tensors"][0]["pieces"][0]["chunks"] = json::array(); }),
            "tensors[0].pieces[0].chunks: expected one checksum per " +
                std::to_string(kDefaultChunkBytes) + " bytes");
  EXPECT_EQ(refused([](json& j) { j["chunkBytes"] = 12; }),
            "chunkBytes: expected a positive multiple of 8");
  EXPECT_EQ(refused([](json& j) { std::swap(j["tensors"][0], j["tensors"][1]); }),
            "tensors[1].name: tensors must be sorted by name, without repeats");
  EXPECT_EQ(ManifestFromJson(json::array()).status().message(), "manifest: expected a JSON object");
  // Numbers are integers within their field's range, never converted: a float (fuzz/
  // manifest_fuzz.cc found 6e58 converted to an unsigned, which is undefined behaviour) or a
  // fraction would otherwise be truncated into a different offset.
  EXPECT_EQ(refused([](json& j) { j["shards"][0]["size"] = 6.13556e+58; }),
            "shards[0].size: wrong type or out of range");
  EXPECT_EQ(refused([](json& j) { j["step"] = 1.5; }), "step: wrong type or out of range");
  EXPECT_EQ(refused([](json& j) { j["worldSize"] = 4294967296ll; }),
            "worldSize: wrong type or out of range");
  EXPECT_EQ(refused([](json& j) { j["tensors"][0]["pieces"][0]["offset"] = -8; }),
            "tensors[0].pieces[0].offset: wrong type or out of range");
  EXPECT_EQ(refused([](json& j) { j["tensors"][0]["shape"] = {2.5}; }),
            "tensors[0].shape: wrong type or out of range");
}

TEST(ManifestTest, ShardsThatDisagreeOrCarryBadPiecesAreRefusedAtSave) {
  std::string four = Floats(0, 1);
  EXPECT_FALSE(BuildShard(0, 1, {{"w", "F32", {1}, 0, std::string_view(four).substr(0, 3)}}).ok());
  EXPECT_FALSE(BuildShard(0, 1, {{"w", "Q4", {1}, 0, four}}).ok());
  EXPECT_FALSE(BuildShard(0, 1, {{"w", "F32", {2}, 0, four}, {"w", "F32", {2}, 0, four}}).ok());
  auto a = BuildShard(0, 2, {{"w", "F32", {2}, 0, four}});
  auto b = BuildShard(1, 2, {{"w", "F32", {3}, 1, four}});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(AssembleManifest({}, {*a, *b}).status().message().find("disagree"), std::string::npos);
  // A gap (element 1 of 3 missing) is caught by the same validation readers run.
  auto c = BuildShard(1, 2, {{"w", "F32", {2}, 2, four}});
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(AssembleManifest({}, {*a, *c}).ok());
}

TEST(ManifestTest, StepDirectoriesAndShardNames) {
  EXPECT_EQ(StepDirectory(15), "step-00000015");
  EXPECT_EQ(ParseStepDirectory("step-00000015"), 15);
  EXPECT_EQ(ParseStepDirectory("step-123456789"), 123456789);
  EXPECT_FALSE(ParseStepDirectory("step-").has_value());
  EXPECT_FALSE(ParseStepDirectory("step-12a").has_value());
  EXPECT_FALSE(ParseStepDirectory("latest").has_value());
  EXPECT_EQ(ShardFileName(0, 32), "shard-00001-of-00032.safetensors");
}

TEST(ManifestTest, RetentionKeepsNewestFullsAndDropsSnapshotsBeforeTheNewestFull) {
  using K = CheckpointKind;
  std::map<int64_t, K> committed = {{10, K::kFull},     {15, K::kSnapshot}, {20, K::kFull},
                                    {25, K::kSnapshot}, {30, K::kFull},     {35, K::kSnapshot}};
  EXPECT_EQ(StepsToPrune(committed, 2), (std::vector<int64_t>{10, 15, 25}));
  EXPECT_EQ(StepsToPrune(committed, 5), (std::vector<int64_t>{15, 25}));
  EXPECT_EQ(StepsToPrune({{5, K::kSnapshot}, {6, K::kSnapshot}}, 1), std::vector<int64_t>{});
  EXPECT_EQ(StepsToPrune(committed, 0), (std::vector<int64_t>{10, 15, 20, 25}));  // keep >= 1
}

}  // namespace
}  // namespace tidal::checkpoint
