// Label selectors as k8s.io/apimachinery/pkg/labels parses and matches them.
#include "kube/labels.h"

#include <gtest/gtest.h>

namespace tidal::kube {
namespace {

using nlohmann::json;

bool Match(const std::string& selector, const json& labels) {
  auto s = LabelSelector::Parse(selector);
  EXPECT_TRUE(s.ok()) << selector << ": " << s.status().ToString();
  return s.ok() && s->Matches(labels);
}

TEST(LabelSelector, EqualityAndSetBasedRequirements) {
  json labels = {{"app", "worker"}, {"tier", "gpu"}, {"tidal.dev/job", "j1"}, {"empty", ""}};
  EXPECT_TRUE(Match("", labels));
  EXPECT_TRUE(Match("app=worker", labels));
  EXPECT_TRUE(Match("app==worker", labels));
  EXPECT_FALSE(Match("app=operator", labels));
  EXPECT_TRUE(Match("app!=operator", labels));
  EXPECT_FALSE(Match("app!=worker", labels));
  EXPECT_TRUE(Match("tidal.dev/job in (j0, j1)", labels));
  EXPECT_FALSE(Match("tidal.dev/job notin (j0,j1)", labels));
  EXPECT_TRUE(Match("tier", labels));
  EXPECT_FALSE(Match("!tier", labels));
  EXPECT_TRUE(Match("!missing", labels));
  EXPECT_TRUE(Match("empty=", labels));
  EXPECT_TRUE(Match("app=worker, tier in (gpu), !missing", labels));
  EXPECT_FALSE(Match("app=worker,tier=cpu", labels));
}

TEST(LabelSelector, NegationsMatchObjectsWithoutTheKey) {
  json none = json::object();
  EXPECT_TRUE(Match("app!=worker", none));
  EXPECT_TRUE(Match("app notin (worker)", none));
  EXPECT_FALSE(Match("app in (worker)", none));
  EXPECT_FALSE(Match("app", none));
  EXPECT_TRUE(Match("!app", json()));  // null labels: none
}

TEST(LabelSelector, RefusesMalformedSelectorsNamingThem) {
  for (const char* bad : {"app=", "=worker", "app in (a", "app is (a)", "app=worker,", "a b",
                          "Bad_Prefix/x=y", "app=-worker", "!", "app ! x"}) {
    auto s = LabelSelector::Parse(bad);
    if (std::string(bad) == "app=") {
      EXPECT_TRUE(s.ok()) << "k= selects the empty value";
      continue;
    }
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find(bad), std::string::npos) << s.status().message();
  }
}

// apimachinery reads "()" as the one empty value and prints {""} that way; "(,)" is the same
// set. (Found by fuzz/kube_wire_fuzz.cc: "(,)" parsed, printed as "()", which was refused.)
TEST(LabelSelector, EmptyParenthesesAreTheEmptyValueAsApimachineryReadsThem) {
  for (const char* text : {"app in ()", "app in (,)"}) {
    auto s = LabelSelector::Parse(text);
    ASSERT_TRUE(s.ok()) << text << ": " << s.status().message();
    EXPECT_EQ(s->ToString(), "app in ()") << text;
    EXPECT_TRUE(s->Matches(nlohmann::json{{"app", ""}})) << text;
    EXPECT_FALSE(s->Matches(nlohmann::json{{"app", "x"}})) << text;
    auto again = LabelSelector::Parse(s->ToString());
    ASSERT_TRUE(again.ok()) << again.status().message();
    EXPECT_EQ(again->requirements(), s->requirements());
  }
  auto notin = LabelSelector::Parse("app notin ()");
  ASSERT_TRUE(notin.ok());
  EXPECT_TRUE(notin->Matches(nlohmann::json{{"app", "x"}}));
  EXPECT_FALSE(notin->Matches(nlohmann::json{{"app", ""}}));
}

TEST(LabelSelector, CanonicalStringRoundTrips) {
  auto s = LabelSelector::Parse("a = 1, b in (y, x, y), !c, d, e != 2, f notin (z)");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->ToString(), "a=1,b in (x,y),!c,d,e!=2,f notin (z)");
  auto again = LabelSelector::Parse(s->ToString());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->requirements(), s->requirements());
}

TEST(LabelSelector, FromMetav1LabelSelector) {
  auto s =
      LabelSelector::FromJson({{"matchLabels", {{"app", "worker"}}},
                               {"matchExpressions",
                                {{{"key", "tier"}, {"operator", "In"}, {"values", {"gpu", "cpu"}}},
                                 {{"key", "legacy"}, {"operator", "DoesNotExist"}}}}});
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_TRUE(s->Matches({{"app", "worker"}, {"tier", "gpu"}}));
  EXPECT_FALSE(s->Matches({{"app", "worker"}, {"tier", "gpu"}, {"legacy", "1"}}));
  EXPECT_FALSE(s->Matches({{"app", "worker"}}));
  EXPECT_TRUE(LabelSelector::FromJson(json())->Empty());
  auto bad = LabelSelector::FromJson({{"matchExpressions", {{{"key", "a"}, {"operator", "Gt"}}}}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("matchExpressions[0].operator"), std::string::npos);
  EXPECT_FALSE(
      LabelSelector::FromJson({{"matchExpressions", {{{"key", "a"}, {"operator", "In"}}}}}).ok());
  EXPECT_TRUE(LabelSelector::FromMap({{"a", "1"}}).Matches({{"a", "1"}}));
}

}  // namespace
}  // namespace tidal::kube
