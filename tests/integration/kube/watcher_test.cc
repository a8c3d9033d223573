// The client's watcher against a real `tidal local`: it survives kill -9 of the server without
// losing or duplicating an event, and relists correctly (emitting the difference) after 410.
#include "kube/watcher.h"
#include "tests/test_paths.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <map>

#include "tests/integration/process.h"

namespace tidal::kube {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;
using nlohmann::json;

class WatcherIntegration : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("tidal-watch-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override {
    server_.reset();
    fs::remove_all(dir_);
  }
  void StartServer() {
    server_ = std::make_unique<testing::Process>(
        std::vector<std::string>{TIDAL_BIN, "local", "--data", (dir_ / "data").string(),
                                 "--history", "8", "--bookmark-interval-ms", "200"});
    ASSERT_TRUE(server_->WaitForOutput(
        [](const std::string& out) { return out.find("export KUBECONFIG") != std::string::npos; },
        30s));
    if (!client_) {
      auto connection = LoadKubeconfig((dir_ / "data/kubeconfig").string());
      ASSERT_TRUE(connection.ok()) << connection.status().ToString();
      client_ = std::move(*KubeClient::Create(*connection));
    }
  }
  void KillServer() {
    ::kill(server_->pid(), SIGKILL);
    server_->Wait(10s);
  }
  void Create(const std::string& name) {
    json cm = {{"apiVersion", "v1"},
               {"kind", "ConfigMap"},
               {"metadata", {{"name", name}}},
               {"data", {{"v", "0"}}}};
    ASSERT_TRUE(client_->Call(*CreateRequest(Resource::ConfigMaps(), "default", cm)).ok());
  }
  void Modify(const std::string& name, const std::string& v) {
    ASSERT_TRUE(client_
                    ->Call(*MergePatchRequest(Resource::ConfigMaps(), "default", name,
                                              {{"data", {{"v", v}}}}))
                    .ok());
  }
  void Delete(const std::string& name) {
    ASSERT_TRUE(client_->Call(*DeleteRequest(Resource::ConfigMaps(), "default", name)).ok());
  }
  std::map<std::string, std::string> ServerView() {
    std::map<std::string, std::string> out;
    auto list = client_->Call(*ListRequest(Resource::ConfigMaps(), "default", {}));
    EXPECT_TRUE(list.ok());
    for (const auto& item : (*list)["items"])
      out[item["metadata"]["name"]] = item["metadata"]["resourceVersion"];
    return out;
  }

  fs::path dir_;
  std::unique_ptr<testing::Process> server_;
  std::unique_ptr<KubeClient> client_;
};

struct Recorder {
  std::mutex mu;
  std::vector<std::string> log;             // "+name@rv", "~name@rv", "-name"
  std::map<std::string, std::string> view;  // name → rv, as the consumer sees it
  void operator()(const ObjectEvent& e) {
    std::lock_guard<std::mutex> lock(mu);
    std::string name = e.object["metadata"]["name"];
    std::string rv = e.object["metadata"]["resourceVersion"];
    if (e.type == ObjectEvent::kDeleted) {
      log.push_back("-" + name);
      view.erase(name);
    } else {
      log.push_back((e.type == ObjectEvent::kAdded ? "+" : "~") + name + "@" + rv);
      view[name] = rv;
    }
  }
  size_t size() {
    std::lock_guard<std::mutex> lock(mu);
    return log.size();
  }
};

bool WaitFor(const std::function<bool()>& done) {
  for (int i = 0; i < 300; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(50ms);
  }
  return false;
}

WatcherOptions Options() {
  WatcherOptions o;
  o.resource = Resource::ConfigMaps();
  o.namespace_ = "default";
  o.initial_backoff = 100ms;
  o.max_backoff = 400ms;
  return o;
}

TEST_F(WatcherIntegration, SurvivesServerKillNineWithoutLosingOrDuplicatingEvents) {
  StartServer();
  Create("a");
  Recorder rec;
  Watcher watcher(*client_, Options(), std::ref(rec));
  ASSERT_TRUE(WaitFor([&] { return rec.size() == 1; }));
  Create("b");
  ASSERT_TRUE(WaitFor([&] { return rec.size() == 2; }));
  KillServer();
  StartServer();  // same data, port and token
  Modify("a", "1");
  Delete("b");
  Create("c");
  ASSERT_TRUE(WaitFor([&] { return rec.size() >= 5; })) << ::testing::PrintToString(rec.log);
  // A marker written after the rest: the stream is in resourceVersion order, so once its event
  // is in, any duplicate of the earlier ones would have come before it.
  Create("z-marker");
  ASSERT_TRUE(WaitFor([&] {
    std::lock_guard<std::mutex> lock(rec.mu);
    return rec.view.count("z-marker") > 0;
  })) << ::testing::PrintToString(rec.log);
  std::lock_guard<std::mutex> lock(rec.mu);
  ASSERT_EQ(rec.log.size(), 6u) << ::testing::PrintToString(rec.log);
  EXPECT_EQ(rec.log[5].substr(0, 9), "+z-marker");
  EXPECT_EQ(rec.log[0].substr(0, 2), "+a");
  EXPECT_EQ(rec.log[1].substr(0, 2), "+b");
  EXPECT_EQ(rec.log[2].substr(0, 2), "~a");
  EXPECT_EQ(rec.log[3], "-b");
  EXPECT_EQ(rec.log[4].substr(0, 2), "+c");
  EXPECT_EQ(rec.view, ServerView());
  EXPECT_EQ(watcher.relists(), 1);  // resumed, never relisted
}

TEST_F(WatcherIntegration, RelistsAfterGoneAndEmitsTheDifference) {
  StartServer();
  Create("keep");
  Create("change");
  Create("drop");
  Recorder rec;
  WatcherCore listed;
  {
    Watcher first(*client_, Options(), std::ref(rec));
    ASSERT_TRUE(WaitFor([&] { return rec.size() == 3; }));
    first.Stop();
    listed = first.core();
  }
  // More changes than the server's history (8) while nobody watches: the old version is gone.
  Modify("change", "1");
  Delete("drop");
  for (int i = 0; i < 12; ++i) Create("new-" + std::to_string(i));
  Watcher second(*client_, Options(), std::ref(rec), listed);
  ASSERT_TRUE(WaitFor([&] { return second.relists() == 1 && rec.size() == 3 + 14; }))
      << ::testing::PrintToString(rec.log);
  std::lock_guard<std::mutex> lock(rec.mu);
  EXPECT_EQ(rec.log[3], "-drop");
  EXPECT_EQ(rec.log[4].substr(0, 7), "~change");
  EXPECT_EQ(rec.view, ServerView());
}

}  // namespace
}  // namespace tidal::kube
