// The Events' reasons (operator/reconciler/event_reason.h): one table in code, the same one in
// docs/controller.md, names as Kubernetes writes its own, and a plan's Events carry the type the
// table gives their reason. And the condition types (reconcile.h), named once.
#include "operator/reconciler/event_reason.h"
#include "tests/test_paths.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "operator/reconciler/reconcile.h"

namespace tidal::reconciler {
namespace {

TEST(EventReasonTest, EveryReasonHasOneUpperCamelCaseNameAndAType) {
  std::set<std::string> names;
  const std::regex upper_camel("[A-Z][a-z]+([A-Z][a-z]*)*");
  for (const EventReasonInfo& r : kEventReasons) {
    EXPECT_TRUE(names.insert(r.name).second) << r.name << " twice";
    EXPECT_TRUE(std::regex_match(r.name, upper_camel)) << r.name;
    EXPECT_STREQ(EventReasonName(r.reason), r.name);
    EXPECT_STREQ(EventTypeOf(r.reason), r.warning ? "Warning" : "Normal");
  }
}

TEST(EventReasonTest, TheDocsListEveryReasonWithItsType) {
  std::ifstream in(std::string(TIDAL_SOURCE_DIR) + "/docs/controller.md");
  ASSERT_TRUE(in) << "docs/controller.md";
  std::stringstream text;
  text << in.rdbuf();
  const std::string doc = text.str();
  const auto section = doc.find("\n## Events\n");
  ASSERT_NE(section, std::string::npos) << "docs/controller.md has no Events section";
  std::map<std::string, std::string> documented;  // reason -> type
  const std::regex row(R"(\n\| `([A-Za-z]+)` \| (Normal|Warning) \|)");
  const std::string rest = doc.substr(section, doc.find("\n## ", section + 1) - section);
  for (std::sregex_iterator it(rest.begin(), rest.end(), row), end; it != end; ++it)
    EXPECT_TRUE(documented.emplace((*it)[1], (*it)[2]).second) << (*it)[1] << " listed twice";
  for (const EventReasonInfo& r : kEventReasons) {
    auto it = documented.find(r.name);
    if (it == documented.end()) {
      ADD_FAILURE() << r.name << " is not in docs/controller.md's Events table";
      continue;
    }
    EXPECT_EQ(it->second, r.warning ? "Warning" : "Normal") << r.name;
    documented.erase(it);
  }
  for (const auto& [name, type] : documented)
    ADD_FAILURE() << "docs/controller.md lists " << name << ", which the operator never emits";
}

// The condition types (reconcile.h), as `kubectl wait --for=condition=` names them: each its
// own UpperCamelCase name, none left to the "Unknown" fallback.
TEST(ConditionTypeTest, EveryConditionTypeHasItsOwnUpperCamelCaseName) {
  std::set<std::string> names;
  const std::regex upper_camel("[A-Z][a-z]+([A-Z][a-z]*)*");
  for (int t = 0; t <= static_cast<int>(ConditionType::kScaleOverride); ++t) {
    const std::string name = ConditionTypeName(static_cast<ConditionType>(t));
    EXPECT_NE(name, "Unknown") << t;
    EXPECT_TRUE(std::regex_match(name, upper_camel)) << name;
    EXPECT_TRUE(names.insert(name).second) << name << " twice";
  }
  EXPECT_EQ(names.count("Ready"), 1u);
}

}  // namespace
}  // namespace tidal::reconciler
