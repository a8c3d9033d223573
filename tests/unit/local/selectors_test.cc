// Label and field selectors with the apimachinery syntax; printer-column JSONPath.
#include "local/selectors.h"

#include <gtest/gtest.h>

namespace tidal::local {
namespace {

using nlohmann::json;

bool LabelsMatch(const std::string& selector, const json& labels) {
  auto s = ParseLabelSelector(selector);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return Matches(*s, labels);
}

TEST(LabelSelector, SupportsEveryOperator) {
  json labels = {{"team", "ml"}, {"tier", "gpu"}};
  EXPECT_TRUE(LabelsMatch("team=ml", labels));
  EXPECT_TRUE(LabelsMatch("team==ml,tier=gpu", labels));
  EXPECT_FALSE(LabelsMatch("team!=ml", labels));
  EXPECT_TRUE(LabelsMatch("missing!=x", labels));  // absent satisfies !=
  EXPECT_TRUE(LabelsMatch("tier in (cpu, gpu)", labels));
  EXPECT_FALSE(LabelsMatch("tier notin (gpu)", labels));
  EXPECT_TRUE(LabelsMatch("team", labels));
  EXPECT_TRUE(LabelsMatch("!missing", labels));
  EXPECT_FALSE(LabelsMatch("!team", labels));
  EXPECT_TRUE(LabelsMatch("", labels));
}

TEST(LabelSelector, RejectsMalformedSelectors) {
  EXPECT_FALSE(ParseLabelSelector("tier in (a").ok());
  EXPECT_FALSE(ParseLabelSelector("tier within (a)").ok());
  EXPECT_FALSE(ParseLabelSelector("bad key=1").ok());
}

TEST(FieldSelector, MatchesDottedPaths) {
  json ev = {{"metadata", {{"name", "e1"}, {"namespace", "default"}}},
             {"involvedObject", {{"name", "demo"}, {"uid", "u1"}}}};
  auto s = ParseFieldSelector(
      "involvedObject.name=demo,involvedObject.uid=u1,metadata.namespace=default");
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(Matches(*s, ev));
  auto neg = ParseFieldSelector("metadata.name!=e1");
  EXPECT_FALSE(Matches(*neg, ev));
  EXPECT_FALSE(ParseFieldSelector("nonsense").ok());
}

TEST(JsonPath, EvaluatesFieldsIndexesAndFilters) {
  json o = {
      {"status",
       {{"conditions",
         {{{"type", "Ready"}, {"status", "True"}}, {{"type", "Done"}, {"status", "False"}}}}}}};
  EXPECT_EQ(*EvalJsonPath(o, ".status.conditions[1].type"), "Done");
  EXPECT_EQ(*EvalJsonPath(o, ".status.conditions[?(@.type==\"Ready\")].status"), "True");
  EXPECT_FALSE(EvalJsonPath(o, ".status.missing").has_value());
  EXPECT_FALSE(EvalJsonPath(o, ".status.conditions[7]").has_value());
}

}  // namespace
}  // namespace tidal::local
