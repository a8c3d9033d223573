// The watcher state machine: transitions, resume versions, dedup, and relist differences.
#include "kube/watcher.h"

#include <gtest/gtest.h>

namespace tidal::kube {
namespace {

using nlohmann::json;

json Obj(const std::string& name, int rv) {
  return {{"metadata",
           {{"namespace", "default"}, {"name", name}, {"resourceVersion", std::to_string(rv)}}}};
}
json List(std::vector<json> items, int rv) {
  return {{"metadata", {{"resourceVersion", std::to_string(rv)}}}, {"items", items}};
}
std::vector<std::string> Describe(const std::vector<ObjectEvent>& events) {
  std::vector<std::string> out;
  for (const auto& e : events)
    out.push_back(std::string(e.type == ObjectEvent::kAdded      ? "+"
                              : e.type == ObjectEvent::kModified ? "~"
                                                                 : "-") +
                  e.object["metadata"]["name"].get<std::string>());
  return out;
}

TEST(WatcherCore, FollowsTheStateTable) {
  WatcherCore core;
  EXPECT_EQ(core.state(), WatcherState::kInitial);
  core.OnWatchOpened();  // not allowed before a list
  EXPECT_EQ(core.state(), WatcherState::kInitial);
  core.OnList(List({}, 5));
  EXPECT_EQ(core.state(), WatcherState::kListed);
  core.OnWatchOpened();
  EXPECT_EQ(core.state(), WatcherState::kWatching);
  core.OnWatchEnded();
  EXPECT_EQ(core.state(), WatcherState::kListed);
  core.OnWatchOpened();
  core.OnExpired();
  EXPECT_EQ(core.state(), WatcherState::kInitial);
}

TEST(WatcherCore, ResumesFromTheLastEventOrBookmark) {
  WatcherCore core;
  core.OnList(List({Obj("a", 3)}, 4));
  EXPECT_EQ(core.resource_version(), "4");
  core.OnWatchOpened();
  EXPECT_EQ(Describe(core.OnEvent({"ADDED", Obj("b", 6)})), std::vector<std::string>{"+b"});
  EXPECT_EQ(core.resource_version(), "6");
  EXPECT_TRUE(core.OnEvent({"BOOKMARK", {{"metadata", {{"resourceVersion", "9"}}}}}).empty());
  EXPECT_EQ(core.resource_version(), "9");
}

TEST(WatcherCore, NeverDeliversAnObjectVersionTwice) {
  WatcherCore core;
  core.OnList(List({Obj("a", 3)}, 3));
  core.OnWatchOpened();
  EXPECT_TRUE(core.OnEvent({"ADDED", Obj("a", 3)}).empty());  // replayed after a resume
  EXPECT_EQ(Describe(core.OnEvent({"MODIFIED", Obj("a", 7)})), std::vector<std::string>{"~a"});
  EXPECT_TRUE(core.OnEvent({"MODIFIED", Obj("a", 7)}).empty());
  EXPECT_EQ(Describe(core.OnEvent({"DELETED", Obj("a", 8)})), std::vector<std::string>{"-a"});
  EXPECT_TRUE(core.OnEvent({"DELETED", Obj("a", 8)}).empty());
}

// resourceVersion is opaque (API conventions): a server whose versions are not numbers, or not
// in the order their digits suggest, loses no event — only the version delivered last is
// recognised as a replay.
TEST(WatcherCore, ResourceVersionsAreOpaqueAndComparedForEqualityOnly) {
  auto obj = [](const std::string& rv) {
    return json{{"metadata", {{"namespace", "default"}, {"name", "a"}, {"resourceVersion", rv}}}};
  };
  WatcherCore core;
  core.OnList({{"metadata", {{"resourceVersion", "zz-10"}}}, {"items", {obj("zz-10")}}});
  core.OnWatchOpened();
  EXPECT_TRUE(core.OnEvent({"MODIFIED", obj("zz-10")}).empty());
  EXPECT_EQ(Describe(core.OnEvent({"MODIFIED", obj("aa-9")})), std::vector<std::string>{"~a"})
      << "a version that sorts lower is still news";
  EXPECT_EQ(core.resource_version(), "aa-9");
  EXPECT_EQ(Describe(core.OnEvent({"MODIFIED", obj("100")})), std::vector<std::string>{"~a"});
  EXPECT_EQ(Describe(core.OnEvent({"MODIFIED", obj("99")})), std::vector<std::string>{"~a"});
  EXPECT_TRUE(core.OnEvent({"MODIFIED", obj("99")}).empty());
}

TEST(WatcherCore, RelistAfterGoneEmitsOnlyTheDifference) {
  WatcherCore core;
  core.OnList(List({Obj("keep", 1), Obj("change", 2), Obj("drop", 3)}, 3));
  core.OnWatchOpened();
  core.OnExpired();
  auto diff = core.OnList(List({Obj("keep", 1), Obj("change", 9), Obj("new", 10)}, 10));
  EXPECT_EQ(Describe(diff), (std::vector<std::string>{"-drop", "~change", "+new"}));
  EXPECT_EQ(core.known_objects(), 3u);
}

TEST(WatcherCore, KeepingVersionsOnlyDeliversTheSameEventsAndStubsRelistDeletions) {
  WatcherCore core = WatcherCore::KeepingVersionsOnly();
  json full = Obj("drop", 3);
  full["spec"] = {{"big", "payload"}};
  EXPECT_EQ(Describe(core.OnList(List({Obj("keep", 1), full}, 3))),
            (std::vector<std::string>{"+drop", "+keep"}));
  core.OnWatchOpened();
  EXPECT_TRUE(core.OnEvent({"ADDED", Obj("keep", 1)}).empty()) << "versions still deduplicate";
  EXPECT_EQ(Describe(core.OnEvent({"MODIFIED", Obj("keep", 4)})),
            std::vector<std::string>{"~keep"});
  core.OnExpired();
  auto diff = core.OnList(List({Obj("keep", 4)}, 9));
  ASSERT_EQ(Describe(diff), std::vector<std::string>{"-drop"});
  // Only what identifies the object: its holder (the informer) keeps the rest.
  EXPECT_EQ(
      diff[0].object,
      (json{{"metadata", {{"namespace", "default"}, {"name", "drop"}, {"resourceVersion", "3"}}}}));
}

}  // namespace
}  // namespace tidal::kube
