// tidal.checksums.json and verified ranged reads of an HF directory (worker/engine/
// model_files.h): the checksums round-trip, each kind of damaged checksums file is refused
// naming the field, and a damaged byte is caught in the block that holds it — not before.
#include "worker/engine/model_files.h"

#include <gtest/gtest.h>

#include <fstream>

#include "tests/unit/engine/test_util.h"
#include "worker/engine/safetensors.h"

namespace tidal::engine {
namespace {

class ModelFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    torch::manual_seed(1);
    ASSERT_TRUE(WriteSafetensors(dir_.path() + "/model.safetensors",
                                 {{"a", torch::randn({64, 64})}, {"b", torch::randn({64, 64})}},
                                 {{"format", "pt"}})
                    .ok());
  }
  testing::TempDir dir_;
};

TEST_F(ModelFilesTest, ChecksumsRoundTripAndEachDamagedFieldIsRefusedByName) {
  auto files = LocalModelFiles(dir_.path());
  auto sums = ComputeModelChecksums(*files, 4096);
  ASSERT_TRUE(sums.ok()) << sums.status().message();
  const auto& file = sums->files.at("model.safetensors");
  EXPECT_EQ(file.blocks.size(), (file.size + 4095) / 4096);
  auto back = ModelChecksums::FromJson(sums->ToJson(), "sums");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->files.at("model.safetensors").blocks, file.blocks);

  auto json = nlohmann::json::parse(sums->ToJson());
  const std::vector<std::pair<nlohmann::json, std::string>> damaged = {
      {{{"format", "other"}}, "format must be"},
      {{{"blockBytes", 0}}, "blockBytes must be a positive integer"},
      {{{"files", {{"model.safetensors", {{"size", 1}, {"xxh3", nlohmann::json::array()}}}}}},
       "files.model.safetensors.xxh3: 0 hashes, a file of"},
      {{{"files", {{"model.safetensors", {{"size", nullptr}}}}}}, "needs size and xxh3"},
  };
  for (const auto& [patch, expect] : damaged) {
    auto bad = json;
    bad.merge_patch(patch);
    auto r = ModelChecksums::FromJson(bad.dump(), "sums");
    ASSERT_FALSE(r.ok()) << patch.dump();
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(r.status().message().find(expect), std::string::npos) << r.status().message();
  }
  EXPECT_FALSE(ModelChecksums::FromJson("not json", "sums").ok());
  auto not_hex = json;
  not_hex["files"]["model.safetensors"]["xxh3"][0] = "zz00000000000000";
  auto r = ModelChecksums::FromJson(not_hex.dump(), "sums");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("\"zz00000000000000\" is not hex"), std::string::npos)
      << r.status().message();
}

TEST_F(ModelFilesTest, ADamagedByteIsCaughtInTheBlockThatHoldsItOnly) {
  auto files = LocalModelFiles(dir_.path());
  auto sums = ComputeModelChecksums(*files, 4096);
  ASSERT_TRUE(sums.ok());
  // Damage one byte of tensor b (the second half of the data section).
  const std::string path = dir_.path() + "/model.safetensors";
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(-10, std::ios::end);
  f.put('\x7f');
  f.close();
  const auto& sum = sums->files.at("model.safetensors");
  auto file = SafetensorsFile::Open(*files, "model.safetensors", &sum, 4096);
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_TRUE((*file)->Read("a", torch::kFloat32).ok());  // blocks of a are intact
  auto b = (*file)->Read("b", torch::kFloat32);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(b.status().message().find(path + ": bytes ["), std::string::npos)
      << b.status().message();
  EXPECT_NE(b.status().message().find("reading tensor \"b\""), std::string::npos);
  // A file whose size differs from its checksums is refused at open.
  ModelChecksums::File shorter = sum;
  shorter.size -= 1;
  auto changed = SafetensorsFile::Open(*files, "model.safetensors", &shorter, 4096);
  ASSERT_FALSE(changed.ok());
  EXPECT_NE(changed.status().message().find("changed after its checksums were taken"),
            std::string::npos);
}

}  // namespace
}  // namespace tidal::engine
