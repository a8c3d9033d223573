// The durable store: versions, compare-and-swap, history window, and reopening.
#include "local/store.h"

#include <gtest/gtest.h>

#include <filesystem>

namespace tidal::local {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("tidal-store-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

json Obj(const std::string& name, int v) { return {{"metadata", {{"name", name}}}, {"v", v}}; }

TEST_F(StoreTest, EveryWriteGetsTheNextVersionAndCasRejectsStaleOnes) {
  auto store = *Store::Open(dir_, 100);
  ObjectKey key{"g/things", "default", "a"};
  auto created = store->Create(key, Obj("a", 1));
  ASSERT_TRUE(created.ok());
  EXPECT_EQ((**created)["metadata"]["resourceVersion"], "1");
  EXPECT_EQ(store->Create(key, Obj("a", 1)).status().code(), StatusCode::kAlreadyExists);
  EXPECT_TRUE(store->Update(key, Obj("a", 2), 1).ok());
  auto stale = store->Update(key, Obj("a", 3), 1);
  EXPECT_EQ(stale.status().code(), StatusCode::kAborted);
  EXPECT_EQ((*store->Get(key))["v"], 2);
  EXPECT_EQ(store->CurrentVersion(), 2);
}

TEST_F(StoreTest, ReopenedStoreHasSameObjectsVersionsAndHistory) {
  ObjectKey a{"g/things", "default", "a"}, b{"g/things", "default", "b"};
  {
    auto store = *Store::Open(dir_, 100);
    ASSERT_TRUE(store->Create(a, Obj("a", 1)).ok());
    ASSERT_TRUE(store->Create(b, Obj("b", 1)).ok());
    ASSERT_TRUE(store->Update(a, Obj("a", 2), std::nullopt).ok());
    ASSERT_TRUE(store->Delete(b, std::nullopt).ok());
  }
  auto store = *Store::Open(dir_, 100);
  EXPECT_EQ(store->CurrentVersion(), 4);
  EXPECT_EQ((*store->Get(a))["metadata"]["resourceVersion"], "3");
  EXPECT_EQ(store->Get(b), nullptr);
  auto changes = store->EventsAfter(1, "g/things", 0ms);
  ASSERT_TRUE(changes.ok());
  ASSERT_EQ(changes->events.size(), 3u);
  EXPECT_EQ(changes->events[0].type, WatchEvent::kAdded);
  EXPECT_EQ(changes->events[1].type, WatchEvent::kModified);
  EXPECT_EQ(changes->events[2].type, WatchEvent::kDeleted);
  EXPECT_EQ(changes->events[2].resource_version, 4);
}

TEST_F(StoreTest, VersionsOlderThanTheHistoryWindowAreGone) {
  auto store = *Store::Open(dir_, 4);
  ObjectKey key{"g/things", "", "a"};
  ASSERT_TRUE(store->Create(key, Obj("a", 0)).ok());
  for (int i = 1; i < 20; ++i) ASSERT_TRUE(store->Update(key, Obj("a", i), std::nullopt).ok());
  auto old = store->EventsAfter(1, "", 0ms);
  ASSERT_FALSE(old.ok());
  EXPECT_EQ(old.status().code(), StatusCode::kExpired);
  auto recent = store->EventsAfter(store->CurrentVersion() - 2, "", 0ms);
  ASSERT_TRUE(recent.ok());
  EXPECT_EQ(recent->events.size(), 2u);
}

TEST_F(StoreTest, WaitingWatcherWakesOnWrite) {
  auto store = *Store::Open(dir_, 100);
  std::thread writer([&] {
    std::this_thread::sleep_for(50ms);
    store->Create({"g/things", "", "a"}, Obj("a", 1)).status().ok();
  });
  auto changes = store->EventsAfter(0, "g/things", 5s);
  writer.join();
  ASSERT_TRUE(changes.ok());
  EXPECT_EQ(changes->events.size(), 1u);
}

}  // namespace
}  // namespace tidal::local
