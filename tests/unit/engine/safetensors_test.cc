// The project's safetensors reader/writer: round trips in every float dtype, reads ranges,
// and refuses damaged files with a message instead of crashing.
#include "worker/engine/safetensors.h"

#include <fstream>

#include <gtest/gtest.h>

#include "tests/unit/engine/test_util.h"
#include "worker/engine/safetensors_header.h"

namespace tidal::engine {
namespace {

using testing::TempDir;

TEST(SafetensorsTest, RoundTripKeepsValuesShapesDtypesAndMetadata) {
  TempDir dir;
  const std::string path = dir.path() + "/t.safetensors";
  auto f32 = torch::randn({3, 5});
  auto bf16 = torch::randn({7}).to(torch::kBFloat16);
  auto f16 = torch::randn({2, 2, 2}).to(torch::kFloat16);
  ASSERT_TRUE(
      WriteSafetensors(path, {{"a", f32}, {"b", bf16}, {"c", f16}}, {{"format", "pt"}}).ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_EQ((*file)->metadata()["format"], "pt");
  EXPECT_TRUE(torch::equal(*(*file)->Read("a", torch::kFloat32), f32));
  EXPECT_TRUE(torch::equal(*(*file)->Read("b", torch::kBFloat16), bf16));
  EXPECT_TRUE(torch::equal(*(*file)->Read("c", torch::kFloat16), f16));
  // Conversion on read: bf16 → fp32 is exact.
  EXPECT_TRUE(torch::equal(*(*file)->Read("b", torch::kFloat32), bf16.to(torch::kFloat32)));
  EXPECT_EQ((*file)->entries().at("c").shape, (std::vector<int64_t>{2, 2, 2}));
}

TEST(SafetensorsTest, FlatRangeReadsExactlyThoseElements) {
  TempDir dir;
  const std::string path = dir.path() + "/t.safetensors";
  auto t = torch::arange(24, torch::kFloat32).view({4, 6});
  ASSERT_TRUE(WriteSafetensors(path, {{"w", t}}).ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok());
  auto slice = (*file)->ReadFlatRange("w", 5, 9, torch::kFloat32);
  ASSERT_TRUE(slice.ok());
  EXPECT_TRUE(torch::equal(*slice, torch::arange(5, 14, torch::kFloat32)));
  EXPECT_FALSE((*file)->ReadFlatRange("w", 20, 5, torch::kFloat32).ok());
  EXPECT_EQ((*file)->Read("missing", torch::kFloat32).status().code(), StatusCode::kNotFound);
}

TEST(SafetensorsTest, TruncatedFileIsDataLossNotACrash) {
  TempDir dir;
  const std::string path = dir.path() + "/t.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, {{"w", torch::randn({64})}}).ok());
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 10);
  auto file = SafetensorsFile::Open(path);
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(file.status().message().find("\"w\""), std::string::npos) << file.status().message();
}

TEST(SafetensorsTest, GarbledHeaderIsDataLoss) {
  TempDir dir;
  const std::string path = dir.path() + "/t.safetensors";
  {
    std::ofstream out(path, std::ios::binary);
    const char len[8] = {12, 0, 0, 0, 0, 0, 0, 0};
    out.write(len, 8);
    out << "{not json!!}";
  }
  auto file = SafetensorsFile::Open(path);
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.status().message().find("not valid JSON"), std::string::npos);
  {
    std::ofstream out(path, std::ios::binary);
    const char len[8] = {char(0xff), char(0xff), char(0xff), char(0xff), 0, 0, 0, 0};
    out.write(len, 8);
  }
  EXPECT_EQ(SafetensorsFile::Open(path).status().code(), StatusCode::kDataLoss);
}

TEST(SafetensorsTest, ShapeWhoseByteSizeOverflowsIsRefused) {
  TempDir dir;
  const std::string path = dir.path() + "/t.safetensors";
  // 2^61 + 1 doubles: the byte size wraps to 8 in 64 bits, which would match the offsets.
  const std::string header =
      R"({"w":{"dtype":"F64","shape":[2305843009213693953],"data_offsets":[0,8]}})";
  {
    std::ofstream out(path, std::ios::binary);
    char len[8] = {};
    for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
    out.write(len, 8);
    out << header << std::string(8, '\0');
  }
  auto file = SafetensorsFile::Open(path);
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.status().message().find("too large"), std::string::npos)
      << file.status().message();
}

// The header parser (common/, no LibTorch) and the engine agree on every dtype: what the
// parser accepts maps to a tensor type of the same element size, and what the engine writes
// the parser accepts.
TEST(SafetensorsTest, EveryDtypeTheHeaderParserAcceptsIsATensorTypeOfTheSameSize) {
  const torch::ScalarType types[] = {torch::kFloat64,  torch::kFloat32,       torch::kFloat16,
                                     torch::kBFloat16, torch::kInt64,         torch::kInt32,
                                     torch::kInt16,    torch::kInt8,          torch::kUInt8,
                                     torch::kBool,     torch::kFloat8_e4m3fn, torch::kFloat8_e5m2};
  for (torch::ScalarType type : types) {
    auto name = SafetensorsDtypeName(type);
    ASSERT_TRUE(name.ok()) << name.status().message();
    auto bytes = safetensors::DtypeBytes(*name);
    ASSERT_TRUE(bytes.has_value()) << *name;
    EXPECT_EQ(*bytes, c10::elementSize(type)) << *name;
    auto back = ScalarTypeFromSafetensors(*name);
    ASSERT_TRUE(back.ok()) << back.status().message();
    EXPECT_EQ(*back, type) << *name;
  }
  for (const char* name : {"U16", "U32", "U64", "F8_E8M0", "f32", ""})
    EXPECT_FALSE(safetensors::DtypeBytes(name).has_value()) << name;
}

}  // namespace
}  // namespace tidal::engine
