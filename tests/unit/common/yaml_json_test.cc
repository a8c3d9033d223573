// YAML → JSON: scalars resolve as YAML 1.2's core schema says; garbled YAML is an error with
// a line number, never an exception.
#include "common/yaml_json.h"

#include <gtest/gtest.h>

#include "common/utf8.h"

namespace tidal {
namespace {

TEST(YamlJsonTest, PlainScalarsBecomeTypedAndQuotedStayStrings) {
  auto j = ParseYaml("a: 1\nb: 2.5e-4\nc: true\nd: ~\ne: hello\nf: \"42\"\ng: [x, 3]\n");
  ASSERT_TRUE(j.ok()) << j.status().message();
  EXPECT_EQ((*j)["a"], 1);
  EXPECT_DOUBLE_EQ((*j)["b"].get<double>(), 2.5e-4);
  EXPECT_EQ((*j)["c"], true);
  EXPECT_TRUE((*j)["d"].is_null());
  EXPECT_EQ((*j)["e"], "hello");
  EXPECT_EQ((*j)["f"], "42");
  EXPECT_EQ((*j)["g"][0], "x");
  EXPECT_EQ((*j)["g"][1], 3);
}

TEST(YamlJsonTest, GarbledYamlIsAnErrorNamingTheLine) {
  auto j = ParseYaml("model:\n  preset: tiny\n lora: [1, 2\n");
  ASSERT_FALSE(j.ok());
  EXPECT_NE(j.status().message().find("line"), std::string::npos) << j.status().message();
}

// Found by fuzz/training_job_spec_fuzz.cc: bytes that are not UTF-8 passed through into
// strings JSON cannot hold, and a refusal that quoted one ended the process.
TEST(YamlJsonTest, BytesThatAreNotUtf8AreRefusedNamingLineAndColumn) {
  auto j = ParseYaml(
      "# caf\xc3\xa9 is fine\nmetadata:\n  name: b\xc2"
      "d\n");
  ASSERT_FALSE(j.ok());
  EXPECT_EQ(j.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(j.status().message().find("line 3, column 10: 0xC2 is not UTF-8"), std::string::npos)
      << j.status().message();
  auto fine = ParseYaml("name: \"\xf0\x9f\x98\x80 caf\xc3\xa9\"\n");
  ASSERT_TRUE(fine.ok()) << fine.status().message();
  EXPECT_EQ((*fine)["name"], "\xf0\x9f\x98\x80 caf\xc3\xa9");
}

// yaml-cpp decodes "\N" (U+0085) and "\x85" to one raw byte, not UTF-8: refused naming where.
TEST(YamlJsonTest, EscapesThatYieldNoUtf8AreRefusedNamingTheField) {
  for (const char* text : {"spec:\n  name: \"a\\Nb\"\n", "spec:\n  name: \"a\\x85\"\n"}) {
    auto j = ParseYaml(text);
    if (j.ok()) {
      // A yaml-cpp that encodes them right gives U+0085 as UTF-8.
      EXPECT_EQ(FirstInvalidUtf8((*j)["spec"]["name"].get<std::string>()), std::nullopt) << text;
      continue;
    }
    EXPECT_NE(j.status().message().find("spec.name: an escape sequence"), std::string::npos)
        << j.status().message();
  }
}

TEST(Utf8Test, FirstInvalidUtf8FindsEveryIllFormedSequence) {
  EXPECT_EQ(FirstInvalidUtf8("plain ascii"), std::nullopt);
  EXPECT_EQ(FirstInvalidUtf8("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\xf4\x8f\xbf\xbf"), std::nullopt);
  const std::pair<std::string, size_t> bad[] = {
      {"a\x80", 1},             // a continuation byte alone
      {"ab\xc0\x80", 2},        // overlong NUL
      {"\xc1\xbf", 0},          // overlong
      {"\xe0\x80\x80", 0},      // overlong three-byte
      {"x\xed\xa0\x80", 1},     // a surrogate
      {"\xf0\x80\x80\x80", 0},  // overlong four-byte
      {"\xf4\x90\x80\x80", 0},  // above U+10FFFF
      {"\xf5\x80\x80\x80", 0},  // no such lead byte
      {"ok\xe2\x82", 2},        // truncated at the end
      {"\xe2\x28\xa1", 0},      // a broken continuation
  };
  for (const auto& [text, at] : bad)
    EXPECT_EQ(FirstInvalidUtf8(text), at) << ::testing::PrintToString(text);
}

TEST(YamlJsonTest, MissingFileIsNotFound) {
  auto j = ReadYamlFile("/nonexistent/tidal.yaml");
  ASSERT_FALSE(j.ok());
  EXPECT_EQ(j.status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace tidal
