// The token store (format, commit, verification), the packing plan and the loader with its
// node-local cache, on a real file:// store.
#include "worker/data/token_store.h"

#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>

#include <gtest/gtest.h>

#include "tests/temp_dir.h"
#include "worker/data/loader.h"
#include "worker/data/packing.h"

namespace tidal::data {
namespace {

using testing::ScratchDir;

// Sample i has 2 + (i * 7) % 11 tokens: id = 1000 * i + position; every other token trains.
struct Sample {
  std::vector<uint32_t> ids;
  std::vector<uint8_t> mask;
};
Sample MakeSample(uint64_t i, uint64_t length) {
  Sample s;
  for (uint64_t t = 0; t < length; ++t) {
    s.ids.push_back(static_cast<uint32_t>(1000 * i + t));
    s.mask.push_back(t % 2);
  }
  return s;
}
uint64_t LengthOf(uint64_t i) { return 2 + (i * 7) % 11; }

std::unique_ptr<objstore::ObjectStore> Open(const std::string& dir) {
  auto store = objstore::OpenObjectStore("file://" + dir);
  EXPECT_TRUE(store.ok()) << store.status().message();
  return std::move(*store);
}

StoreManifest BaseManifest() {
  StoreManifest m;
  m.content_hash = "0123456789abcdef";
  m.source_format = "messages";
  m.tokenizer.kind = "tokenizer.json";
  m.tokenizer.vocab_size = 1 << 20;
  return m;
}

void WriteStore(const std::string& dir, uint64_t samples, uint64_t shard_tokens) {
  auto store = Open(dir);
  TokenStoreWriter writer(*store, shard_tokens);
  for (uint64_t i = 0; i < samples; ++i) {
    Sample s = MakeSample(i, LengthOf(i));
    ASSERT_TRUE(writer.Add(s.ids, s.mask).ok());
  }
  ASSERT_TRUE(writer.Finish(BaseManifest()).ok());
}

TEST(TokenStoreTest, SamplesReadBackThroughTheIndexAcrossShards) {
  ScratchDir dir;
  WriteStore(dir.path(), 500, 600);
  auto store = Open(dir.path());
  auto index = StoreIndex::Open(*store);
  ASSERT_TRUE(index.ok()) << index.status().message();
  ASSERT_EQ(index->num_samples(), 500u);
  EXPECT_GT(index->manifest().shards.size(), 3u);
  uint64_t tokens = 0, trained = 0;
  for (uint64_t i = 0; i < 500; ++i) {
    EXPECT_EQ(index->at(i).length(), LengthOf(i)) << i;
    tokens += LengthOf(i);
    trained += LengthOf(i) / 2;
  }
  EXPECT_EQ(index->manifest().tokens, tokens);
  EXPECT_EQ(index->manifest().trained_tokens, trained);
  EXPECT_EQ(index->manifest().tokenizer.max_id, 1000u * 499 + LengthOf(499) - 1);
}

TEST(TokenStoreTest, AStoreWithoutItsManifestIsNotAStoreYet) {
  ScratchDir dir;
  auto store = Open(dir.path());
  TokenStoreWriter writer(*store, 8);
  Sample s = MakeSample(0, 20);
  ASSERT_TRUE(writer.Add(s.ids, s.mask).ok());  // flushed a shard, no manifest yet
  auto manifest = ReadStoreManifest(*store);
  ASSERT_TRUE(manifest.ok());
  EXPECT_FALSE(manifest->has_value());
  EXPECT_EQ(StoreIndex::Open(*store).status().code(), StatusCode::kNotFound);
}

TEST(TokenStoreTest, EmptySamplesAndEmptyStoresAreRefused) {
  ScratchDir dir;
  auto store = Open(dir.path());
  TokenStoreWriter writer(*store, 8);
  EXPECT_EQ(writer.Add({}, {}).code(), StatusCode::kInvalidArgument);
  std::vector<uint32_t> ids{1, 2};
  std::vector<uint8_t> mask{1};
  EXPECT_EQ(writer.Add(ids, mask).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(writer.Finish(BaseManifest()).code(), StatusCode::kInvalidArgument);
}

TEST(TokenStoreTest, ManifestErrorsNameTheField) {
  StoreManifest m = BaseManifest();
  m.samples = 1;
  m.tokens = 3;
  m.shards.push_back(
      {"shard-00000", 1, 3, "0000000000000000", {"0000000000000000"}, {"0000000000000000"}});
  ASSERT_TRUE(StoreManifest::Parse(m.ToJson()).ok());
  auto broken = [&](auto edit) {
    nlohmann::json j = nlohmann::json::parse(m.ToJson());
    edit(j);
    return StoreManifest::Parse(j.dump()).status().message();
  };
  EXPECT_NE(broken([](auto& j) { j["format"] = "other/9"; }).find("format"), std::string::npos);
  EXPECT_NE(broken([](auto& j) { j["shards"][0]["tokens"] = "x"; }).find("shards[0].tokens"),
            std::string::npos);
  EXPECT_NE(broken([](auto& j) {
              j["shards"][0]["ids_xxh3"] = nlohmann::json::array();
            }).find("block checksums"),
            std::string::npos);
  EXPECT_NE(broken([](auto& j) { j["samples"] = 2; }).find("disagree"), std::string::npos);
  EXPECT_NE(broken([](auto& j) { j.erase("tokenizer"); }).find("tokenizer"), std::string::npos);
  EXPECT_FALSE(StoreManifest::Parse("{nope").ok());
}

TEST(TokenStoreTest, ADamagedIndexIsRefusedAsDataLoss) {
  ScratchDir dir;
  WriteStore(dir.path(), 50, 1 << 20);
  std::fstream f(dir.path() + "/shard-00000.index",
                 std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(16);
  f.put('\x7f');
  f.close();
  auto store = Open(dir.path());
  auto index = StoreIndex::Open(*store);
  EXPECT_EQ(index.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(index.status().message().find("shard-00000.index"), std::string::npos);
}

// ---- packing ----

TEST(PackingTest, EverySampleLandsInExactlyOneRowThatFits) {
  std::vector<uint32_t> lengths;
  for (uint64_t i = 0; i < 1000; ++i) lengths.push_back(static_cast<uint32_t>(1 + (i * 37) % 90));
  PackingOptions options{.seq_len = 64, .overlong = Overlong::kTruncate, .pack = true, .seed = 3};
  PackingPlan plan = BuildPackingPlan(lengths, options);
  std::set<uint64_t> seen;
  for (uint64_t r = 0; r < plan.rows(); ++r) {
    uint64_t used = 0;
    ASSERT_FALSE(plan.Row(r).empty());
    for (const Segment& s : plan.Row(r)) {
      used += s.length;
      EXPECT_TRUE(seen.insert(s.sample).second) << "sample " << s.sample << " twice";
      EXPECT_EQ(s.length, std::min<uint32_t>(lengths[s.sample], 64));
    }
    EXPECT_LE(used, 64u) << "row " << r;
  }
  uint64_t short_ones = 0, long_ones = 0;
  for (uint32_t l : lengths) {
    short_ones += l < 2;
    long_ones += l > 64;
  }
  EXPECT_EQ(seen.size() + short_ones, lengths.size());
  EXPECT_EQ(plan.too_short, short_ones);
  EXPECT_EQ(plan.truncated, long_ones);
  EXPECT_GT(plan.Utilisation(64), 0.9);
}

TEST(PackingTest, OverlongSamplesAreDroppedWhenTheSpecSaysSo) {
  std::vector<uint32_t> lengths{10, 100, 20, 65, 64};
  PackingPlan plan = BuildPackingPlan(lengths, {.seq_len = 64, .overlong = Overlong::kDrop});
  EXPECT_EQ(plan.dropped, 2u);
  EXPECT_EQ(plan.truncated, 0u);
  for (const Segment& s : plan.segments) EXPECT_TRUE(s.sample != 1 && s.sample != 3);
}

TEST(PackingTest, UnpackedRowsHoldOneSampleEach) {
  std::vector<uint32_t> lengths{10, 10, 10};
  PackingPlan plan = BuildPackingPlan(lengths, {.seq_len = 64, .pack = false});
  EXPECT_EQ(plan.rows(), 3u);
}

TEST(PackingTest, ThePlanAndTheRowOrderArePureFunctionsOfTheSeed) {
  std::vector<uint32_t> lengths(300, 0);
  for (size_t i = 0; i < lengths.size(); ++i) lengths[i] = static_cast<uint32_t>(2 + i % 50);
  PackingPlan a = BuildPackingPlan(lengths, {.seq_len = 128, .seed = 9});
  PackingPlan b = BuildPackingPlan(lengths, {.seq_len = 128, .seed = 9});
  ASSERT_EQ(a.rows(), b.rows());
  ASSERT_EQ(a.segments.size(), b.segments.size());
  EXPECT_EQ(a.row_begin, b.row_begin);
  for (size_t i = 0; i < a.segments.size(); ++i)
    ASSERT_EQ(a.segments[i].sample, b.segments[i].sample);
  RowOrder x(a.rows(), 9), y(a.rows(), 9);
  std::set<uint64_t> epoch0, epoch1;
  bool differs = false;
  for (uint64_t k = 0; k < 2 * a.rows(); ++k) {
    // y is asked out of order: the answer depends on k alone.
    const uint64_t mirrored = 2 * a.rows() - 1 - k;
    EXPECT_EQ(x.RowOf(mirrored), RowOrder(a.rows(), 9).RowOf(mirrored));
    (k < a.rows() ? epoch0 : epoch1).insert(y.RowOf(k));
    if (k >= a.rows()) differs = differs || y.RowOf(k) != RowOrder(a.rows(), 9).RowOf(k - a.rows());
  }
  EXPECT_EQ(epoch0.size(), a.rows());
  EXPECT_EQ(epoch1.size(), a.rows());
  EXPECT_TRUE(differs) << "epoch 1 repeats epoch 0's order";
}

// ---- loader ----

PackingOptions LoaderPacking() { return {.seq_len = 32, .seed = 5}; }

void ExpectRowMatchesItsSamples(const engine::PackedRow& row) {
  size_t at = 0;
  for (size_t d = 0; d < row.samples.size(); ++d) {
    const uint64_t sample = row.samples[d];
    const uint64_t length = std::min<uint64_t>(LengthOf(sample), 32);
    for (uint64_t t = 0; t < length; ++t, ++at) {
      ASSERT_EQ(row.tokens[at], 1000 * sample + t);
      EXPECT_EQ(row.positions[at], static_cast<int32_t>(t));
      EXPECT_EQ(row.documents[at], static_cast<int32_t>(d));
      // The next token of the same document, when it trains (odd positions do).
      const bool trains = t + 1 < length && (t + 1) % 2 == 1;
      EXPECT_EQ(row.targets[at], trains ? static_cast<int32_t>(1000 * sample + t + 1) : -100);
    }
  }
  EXPECT_EQ(at, row.tokens.size());
}

TEST(LoaderTest, RowsHoldTheirSamplesWithPositionsDocumentsAndShiftedTargets) {
  ScratchDir dir;
  WriteStore(dir.path(), 200, 300);
  auto loader = RowLoader::Open(Open(dir.path()), LoaderPacking(), {}, {});
  ASSERT_TRUE(loader.ok()) << loader.status().message();
  std::set<uint64_t> samples;
  for (uint64_t k = 0; k < (*loader)->rows(); ++k) {
    auto row = (*loader)->Sequence(k);
    ASSERT_TRUE(row.ok()) << row.status().message();
    ExpectRowMatchesItsSamples(*row);
    samples.insert(row->samples.begin(), row->samples.end());
  }
  EXPECT_EQ(samples.size(), 200u);  // one epoch visits every sample once
}

TEST(LoaderTest, PrefetchedRowsEqualRowsReadOnDemand) {
  ScratchDir dir;
  WriteStore(dir.path(), 200, 300);
  auto a = RowLoader::Open(Open(dir.path()), LoaderPacking(), {}, {.lookahead = 8, .threads = 3});
  auto b = RowLoader::Open(Open(dir.path()), LoaderPacking(), {}, {});
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<uint64_t> wanted;
  for (uint64_t k = 5; k < 60; k += 3) wanted.push_back(k);
  for (size_t i = 0; i < wanted.size(); ++i) {
    (*a)->Prefetch(std::span<const uint64_t>(wanted).subspan(i));
    auto x = (*a)->Sequence(wanted[i]);
    auto y = (*b)->Sequence(wanted[i]);
    ASSERT_TRUE(x.ok() && y.ok());
    EXPECT_EQ(x->tokens, y->tokens);
    EXPECT_EQ(x->targets, y->targets);
  }
}

TEST(LoaderTest, ASecondLoaderReadsItsBlocksFromTheCacheDirectory) {
  ScratchDir dir, cache;
  WriteStore(dir.path(), 200, 300);
  CacheOptions options{.dir = cache.path()};
  {
    auto cold = RowLoader::Open(Open(dir.path()), LoaderPacking(), options, {});
    ASSERT_TRUE(cold.ok());
    for (uint64_t k = 0; k < 10; ++k) ASSERT_TRUE((*cold)->Sequence(k).ok());
    EXPECT_GT((*cold)->stats().blocks_from_store, 0u);
  }
  auto warm = RowLoader::Open(Open(dir.path()), LoaderPacking(), options, {});
  ASSERT_TRUE(warm.ok());
  for (uint64_t k = 0; k < 10; ++k) ASSERT_TRUE((*warm)->Sequence(k).ok());
  EXPECT_EQ((*warm)->stats().blocks_from_store, 0u);
  EXPECT_GT((*warm)->stats().blocks_from_disk, 0u);
}

TEST(LoaderTest, ADamagedCacheFileIsFetchedAgainFromTheStore) {
  ScratchDir dir, cache;
  WriteStore(dir.path(), 200, 300);
  CacheOptions options{.dir = cache.path(), .memory_blocks = 1};
  auto loader = RowLoader::Open(Open(dir.path()), LoaderPacking(), options, {});
  ASSERT_TRUE(loader.ok());
  auto first = (*loader)->Sequence(0);
  ASSERT_TRUE(first.ok());
  for (const auto& entry : std::filesystem::recursive_directory_iterator(cache.path())) {
    if (!entry.is_regular_file()) continue;
    std::ofstream(entry.path(), std::ios::binary | std::ios::trunc) << "garbage";
  }
  auto again = RowLoader::Open(Open(dir.path()), LoaderPacking(), options, {});
  ASSERT_TRUE(again.ok());
  auto row = (*again)->Sequence(0);
  ASSERT_TRUE(row.ok()) << row.status().message();
  EXPECT_EQ(row->tokens, first->tokens);
  EXPECT_GT((*again)->stats().corrupt_refetched, 0u);
  EXPECT_GT((*again)->stats().blocks_from_store, 0u);
}

TEST(LoaderTest, AStoreBlockThatFailsItsChecksumTwiceIsRefused) {
  ScratchDir dir;
  WriteStore(dir.path(), 200, 1 << 20);
  {
    std::fstream f(dir.path() + "/shard-00000.ids",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4);
    f.put('\x55');
  }
  auto loader = RowLoader::Open(Open(dir.path()), LoaderPacking(), {}, {});
  ASSERT_TRUE(loader.ok());
  auto row = (*loader)->Sequence(0);
  ASSERT_FALSE(row.ok());
  EXPECT_EQ(row.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(row.status().message().find("shard-00000.ids"), std::string::npos);
  EXPECT_EQ((*loader)->stats().corrupt_refetched, 2u);
}

TEST(LoaderTest, SamplesThatStraddleBlocksReadBackWholeThroughTheCache) {
  ScratchDir dir, cache;
  WriteStore(dir.path(), 40000, uint64_t{1} << 22);  // ~280k tokens: two blocks in one shard
  auto store = Open(dir.path());
  auto index = StoreIndex::Open(*store);
  ASSERT_TRUE(index.ok());
  ASSERT_EQ(index->manifest().shards.size(), 1u);
  ASSERT_EQ(index->manifest().shards[0].ids_xxh3.size(), 2u);
  // One block in memory: the rest is read by range from the verified cache files.
  CacheOptions options{.dir = cache.path(), .memory_blocks = 1};
  auto loader = RowLoader::Open(Open(dir.path()), LoaderPacking(), options, {.threads = 3});
  ASSERT_TRUE(loader.ok()) << loader.status().message();
  uint64_t samples = 0;
  std::vector<uint64_t> all;
  for (uint64_t k = 0; k < (*loader)->rows(); ++k) all.push_back(k);
  for (uint64_t k = 0; k < (*loader)->rows(); ++k) {
    (*loader)->Prefetch(std::span<const uint64_t>(all).subspan(k));
    auto row = (*loader)->Sequence(k);
    ASSERT_TRUE(row.ok()) << row.status().message();
    ExpectRowMatchesItsSamples(*row);
    samples += row->samples.size();
  }
  EXPECT_EQ(samples, 40000u);
  // Block 1 of each file came from the store at its offset; a second loader finds them on disk.
  EXPECT_EQ((*loader)->stats().blocks_from_store, 4u);
  EXPECT_GT((*loader)->stats().ranges_from_disk, 1000u);
  auto again = RowLoader::Open(Open(dir.path()), LoaderPacking(), options, {});
  ASSERT_TRUE(again.ok());
  for (uint64_t k = 0; k < 50; ++k) {
    auto row = (*again)->Sequence(k);
    ASSERT_TRUE(row.ok()) << row.status().message();
    ExpectRowMatchesItsSamples(*row);
  }
  EXPECT_EQ((*again)->stats().blocks_from_store, 0u);
  EXPECT_GT((*again)->stats().blocks_from_disk, 0u);
}

TEST(LoaderTest, TheCacheDirectoryStaysWithinItsBound) {
  ScratchDir dir, cache;
  WriteStore(dir.path(), 400, 200);  // many small shards: many blocks
  CacheOptions options{.dir = cache.path(), .max_bytes = 4096, .memory_blocks = 1};
  auto loader = RowLoader::Open(Open(dir.path()), LoaderPacking(), options, {});
  ASSERT_TRUE(loader.ok());
  for (uint64_t k = 0; k < (*loader)->rows(); ++k) ASSERT_TRUE((*loader)->Sequence(k).ok());
  uint64_t bytes = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(cache.path()))
    if (entry.is_regular_file()) bytes += entry.file_size();
  EXPECT_LE(bytes, 4096u + 1000 * 4);  // the bound, plus at most the newest block
  EXPECT_GT((*loader)->stats().evicted, 0u);
}

}  // namespace
}  // namespace tidal::data
