// tests/integration/kube/local_cluster.h — a fixture that runs a real `tidal local` (TIDAL_BIN)
// on a fresh temporary directory and connects a KubeClient with the kubeconfig it writes, plus
// small helpers shared by the integration tests of kube.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kube/client.h"
#include "kube/config.h"
#include "kube/request.h"
#include "tests/integration/process.h"
#include "tests/test_paths.h"

namespace tidal::kube {

class LocalClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("tidal-kube-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    server_ = std::make_unique<testing::Process>(std::vector<std::string>{
        TIDAL_BIN, "local", "--data", (dir_ / "data").string(), "--bookmark-interval-ms", "500"});
    ASSERT_TRUE(server_->WaitForOutput(
        [](const std::string& out) { return out.find("export KUBECONFIG") != std::string::npos; },
        std::chrono::seconds(30)))
        << "tidal local did not start";
    auto connection = LoadKubeconfig(kubeconfig());
    ASSERT_TRUE(connection.ok()) << connection.status().ToString();
    auto client = KubeClient::Create(*connection);
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    client_ = std::move(*client);
  }
  void TearDown() override {
    client_.reset();
    server_.reset();
    std::filesystem::remove_all(dir_);
  }
  std::string kubeconfig() const { return (dir_ / "data/kubeconfig").string(); }

  // The created object as the server returned it (uid, resourceVersion filled in).
  nlohmann::json Create(const Resource& r, const std::string& ns, const nlohmann::json& object) {
    auto created = client_->Call(*CreateRequest(r, ns, object));
    EXPECT_TRUE(created.ok()) << created.status().ToString() << " creating " << object.dump();
    return created.ok() ? *created : nlohmann::json();
  }

  std::filesystem::path dir_;
  std::unique_ptr<testing::Process> server_;
  std::unique_ptr<KubeClient> client_;
};

// Polls `done` every 50 ms until it holds or `timeout` passes.
inline bool WaitUntil(const std::function<bool()>& done,
                      std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return done();
}

}  // namespace tidal::kube
