// The text format, the byte tokenizer, packing and the global cursor.
#include "worker/engine/data.h"

#include <fstream>

#include <gtest/gtest.h>

#include "tests/unit/engine/test_util.h"

namespace tidal::engine {
namespace {

using testing::TempDir;

std::string WriteLines(const TempDir& dir, const std::string& body) {
  const std::string path = dir.path() + "/d.jsonl";
  std::ofstream(path) << body;
  return path;
}

TEST(DataTest, ByteTokenizerWrapsDocumentsInBosAndEos) {
  auto ids = ByteTokenizer::Encode("hi\xc3\xa9");
  EXPECT_EQ(ids, (std::vector<int64_t>{256, 'h', 'i', 0xc3, 0xa9, 257}));
}

TEST(DataTest, PackedSequencesAreShiftedByOneForTargets) {
  TempDir dir;
  auto ds = PackedTextDataset::Load(WriteLines(dir, "{\"text\": \"abcdefghij\"}\n"), 3, 0);
  ASSERT_TRUE(ds.ok()) << ds.status().message();
  EXPECT_EQ(ds->num_sequences(), 3);  // 12 tokens / (3 + 1)
  auto batch = ds->Sequences(0, 3);
  EXPECT_TRUE(torch::equal(batch.inputs.narrow(1, 1, 2), batch.targets.narrow(1, 0, 2)));
}

TEST(DataTest, SequencesDependOnlyOnTheirRunPosition) {
  auto a = PackedTextDataset::Load(testing::SampleData(), 32, 7);
  auto b = PackedTextDataset::Load(testing::SampleData(), 32, 7);
  ASSERT_TRUE(a.ok() && b.ok());
  // However the positions are grouped into micro-batches, position k has the same tokens.
  auto whole = a->Sequences(100, 8);
  auto first = b->Sequences(100, 3), rest = b->Sequences(103, 5);
  EXPECT_TRUE(torch::equal(whole.inputs, torch::cat({first.inputs, rest.inputs})));
  // Past the end of an epoch the order is a different permutation of the same sequences.
  const int64_t n = a->num_sequences();
  auto epoch0 = a->Sequences(0, n).inputs, epoch1 = a->Sequences(n, n).inputs;
  EXPECT_FALSE(torch::equal(epoch0, epoch1));
  EXPECT_TRUE(torch::equal(std::get<0>(epoch0.sum(1).sort()), std::get<0>(epoch1.sum(1).sort())));
}

TEST(DataTest, BadLinesAreNamedByNumber) {
  TempDir dir;
  auto garbled = PackedTextDataset::Load(WriteLines(dir, "{\"text\": \"ok\"}\n{oops\n"), 4, 0);
  ASSERT_FALSE(garbled.ok());
  EXPECT_NE(garbled.status().message().find("line 2"), std::string::npos);
  auto wrong = PackedTextDataset::Load(WriteLines(dir, "{\"prompt\": \"x\"}\n"), 4, 0);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("\"text\""), std::string::npos);
}

TEST(DataTest, DatasetTooSmallForOneSequenceIsRefused) {
  TempDir dir;
  auto ds = PackedTextDataset::Load(WriteLines(dir, "{\"text\": \"ab\"}\n"), 64, 0);
  ASSERT_FALSE(ds.ok());
  EXPECT_NE(ds.status().message().find("maxSeqLen"), std::string::npos);
  EXPECT_EQ(PackedTextDataset::Load(dir.path() + "/missing.jsonl", 8, 0).status().code(),
            StatusCode::kNotFound);
}

}  // namespace
}  // namespace tidal::engine
