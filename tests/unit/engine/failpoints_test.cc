// The worker's test hooks (worker/engine/failpoints.h): one table, read from the environment
// only through it; a TIDAL_TEST_ variable it does not list is refused, naming it.
#include "worker/engine/failpoints.h"

#include <gtest/gtest.h>

#include <set>
#include <stdexcept>

namespace tidal::engine {
namespace {

TEST(FailpointsTest, ASetHookIsReadAndAnUnsetOrEmptyOneIsEmpty) {
  auto f = Failpoints::From({{"TIDAL_TEST_OOM_AT_STEP", "3"},
                             {"TIDAL_TEST_BARRIER_HOLD", ""},
                             {"TIDAL_DRAIN_SECONDS", "5"},
                             {"HOME", "/root"}});
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->Get("TIDAL_TEST_OOM_AT_STEP"), "3");
  EXPECT_EQ(f->Get("TIDAL_TEST_BARRIER_HOLD"), "");
  EXPECT_EQ(f->Get("TIDAL_TEST_STALL_AT_STEP"), "");
}

// A misspelt hook would test nothing while its test passed: refused at start, naming it and the
// hooks there are.
TEST(FailpointsTest, AnUnknownTestVariableIsRefusedNamingItAndTheKnownHooks) {
  auto f = Failpoints::From({{"TIDAL_TEST_OOM_AT_STPE", "3"}});
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument);
  const std::string& m = f.status().message();
  EXPECT_EQ(m.rfind("TIDAL_TEST_OOM_AT_STPE: no such test hook", 0), 0u) << m;
  for (const FailpointInfo& known : kFailpoints)
    EXPECT_NE(m.find(known.name), std::string::npos) << m;
}

TEST(FailpointsTest, EveryHookIsNamedOnceUnderThePrefixAndSaysWhatItTakesAndDoes) {
  std::set<std::string> names;
  for (const FailpointInfo& f : kFailpoints) {
    EXPECT_TRUE(names.insert(f.name).second) << f.name;
    EXPECT_EQ(std::string(f.name).rfind("TIDAL_TEST_", 0), 0u) << f.name;
    EXPECT_FALSE(std::string(f.takes).empty()) << f.name;
    EXPECT_FALSE(std::string(f.does).empty()) << f.name;
  }
}

// Code that asks for a hook the table does not list is a bug of the build, not of the input.
TEST(FailpointsTest, AskingForAHookNotInTheTableIsAProgrammingError) {
  auto f = Failpoints::From({});
  ASSERT_TRUE(f.ok());
  EXPECT_THROW(f->Get("TIDAL_TEST_NOT_A_HOOK"), std::logic_error);
}

}  // namespace
}  // namespace tidal::engine
