// YAML → JSON: scalars resolve as YAML 1.2's core schema says; garbled YAML is an error with
// a line number, never an exception.
#include "common/yaml_json.h"

#include <gtest/gtest.h>

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

TEST(YamlJsonTest, MissingFileIsNotFound) {
  auto j = ReadYamlFile("/nonexistent/tidal.yaml");
  ASSERT_FALSE(j.ok());
  EXPECT_EQ(j.status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace tidal
