// tests/e2e/local/kubectl_fixture.h — a fresh `tidal local` per test on a free port in its own
// directory, and the real kubectl pointed at it (run as a user would, output captured).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/process.h"
#include "tests/test_paths.h"

namespace tidal::testing {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

inline const std::string kFixtures = std::string(TIDAL_SOURCE_DIR) + "/tests/fixtures/local";

class KubectlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    test_start_ = std::chrono::steady_clock::now();
    dir_ = fs::temp_directory_path() /
           ("tidal-e2e-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    StartCluster(ExtraClusterArgs());
  }
  void TearDown() override {
    cluster_.reset();
    // TIDAL_E2E_KEEP_LOGS=DIR: a failed test's whole cluster log (operator and kubelet) is
    // kept there, for what the failure message's tail does not show, and beside it every
    // container's output (the cluster runs with --keep-logs then).
    if (const char* keep = KeepLogsDir(); keep && HasFailure()) {
      const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
      std::error_code ec;
      fs::create_directories(keep, ec);
      fs::copy_file(dir_ / "tidal-local.log", fs::path(keep) / (test + ".log"),
                    fs::copy_options::overwrite_existing, ec);
      // File by file: one that cannot be copied (a log still being rotated) costs only itself.
      for (const char* logs : {"logs", "logs-archive"})
        for (fs::recursive_directory_iterator it(dir_ / "data" / logs, ec), end; !ec && it != end;
             it.increment(ec)) {
          std::error_code ignored;
          if (!it->is_regular_file(ignored)) continue;
          const fs::path to = fs::path(keep) / (test + "-" + logs) /
                              fs::relative(it->path(), dir_ / "data" / logs, ignored);
          fs::create_directories(to.parent_path(), ignored);
          fs::copy_file(it->path(), to, fs::copy_options::overwrite_existing, ignored);
        }
    }
    fs::remove_all(dir_);
  }

  virtual std::vector<std::string> ExtraClusterArgs() { return {}; }
  static const char* KeepLogsDir() {
    const char* keep = std::getenv("TIDAL_E2E_KEEP_LOGS");
    return keep && *keep ? keep : nullptr;
  }
  void StartCluster(std::vector<std::string> extra = {}) {
    // Its log goes to a file (a pipe nobody drains would stall it); `exec` keeps the pid.
    std::string command = "exec \"$0\" \"$@\" 2>>" + (dir_ / "tidal-local.log").string();
    std::vector<std::string> argv = {
        "/bin/sh", "-c", command, TIDAL_BIN, "local", "--data", (dir_ / "data").string()};
    if (!with_operator_) argv.push_back("--no-operator");  // these tests are about the cluster
    if (KeepLogsDir()) argv.push_back("--keep-logs");
    argv.insert(argv.end(), extra.begin(), extra.end());
    cluster_ = std::make_unique<Process>(argv);
    ASSERT_TRUE(cluster_->WaitForOutput(
        [](const std::string& out) { return out.find("export KUBECONFIG=") != std::string::npos; },
        30s))
        << "tidal local did not start";
  }

  ProcessResult Kubectl(std::vector<std::string> args, std::vector<std::string> env = {}) {
    std::vector<std::string> argv = {"/usr/bin/env"};
    argv.insert(argv.end(), env.begin(), env.end());
    argv.insert(argv.end(), {KUBECTL_BIN, "--kubeconfig=" + (dir_ / "data/kubeconfig").string(),
                             "--cache-dir=" + (dir_ / "kube-cache").string()});
    argv.insert(argv.end(), args.begin(), args.end());
    return RunProcess(argv, 60s);
  }
  // Runs kubectl and expects success; returns stdout.
  std::string Ok(std::vector<std::string> args, std::vector<std::string> env = {}) {
    ProcessResult r = Kubectl(args, env);
    EXPECT_EQ(r.exit_code, 0) << "kubectl " << ::testing::PrintToString(args) << "\n" << r.err;
    return r.out;
  }
  // Polls `done` twice a second until it holds or `timeout` passes.
  static bool WaitUntilTrue(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!done()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(500ms);
    }
    return true;
  }
  std::string WriteFile(const std::string& name, const std::string& text) {
    std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  // Polls `kubectl get <args> -o jsonpath=<path>` until its output satisfies `done`; returns
  // the last output (the caller asserts on it). The pause between reads starts at `poll` and
  // doubles up to `max_poll`: each kubectl costs about 0.1 s of CPU, and at a steady 100 ms the
  // reads alone took 40% of the CPU of a test that waits a minute (LostNodeTest: 24 s -> 14 s).
  std::string WaitFor(std::vector<std::string> args, const std::string& jsonpath,
                      const std::function<bool(const std::string&)>& done,
                      std::chrono::milliseconds timeout = 30s,
                      std::chrono::milliseconds poll = 100ms,
                      std::chrono::milliseconds max_poll = 500ms) {
    args.insert(args.begin(), "get");
    args.push_back("-o");
    args.push_back("jsonpath=" + jsonpath);
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + timeout;
    std::string out;
    while (true) {
      ProcessResult r = Kubectl(args);
      out = r.exit_code == 0 ? r.out : "<error: " + r.err + ">";
      if (done(out) || std::chrono::steady_clock::now() > deadline) {
        // Where a test's time goes (ctest shows it for a failed test, or with -V).
        std::cout << "[wait " << ElapsedSeconds(start) << " s, test at "
                  << ElapsedSeconds(test_start_) << " s] " << ::testing::PrintToString(args)
                  << " -> " << out.substr(0, 80) << std::endl;
        return out;
      }
      std::this_thread::sleep_for(poll);
      poll = std::min(poll * 2, std::max(poll, max_poll));
    }
  }
#ifdef HELM_BIN
  // The real helm against this cluster, its caches and config in the test's directory.
  ProcessResult Helm(std::vector<std::string> args) {
    std::vector<std::string> argv = {"/usr/bin/env",
                                     "HELM_CACHE_HOME=" + (dir_ / "helm/cache").string(),
                                     "HELM_CONFIG_HOME=" + (dir_ / "helm/config").string(),
                                     "HELM_DATA_HOME=" + (dir_ / "helm/data").string(),
                                     HELM_BIN,
                                     "--kubeconfig=" + (dir_ / "data/kubeconfig").string()};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunProcess(argv, 120s);
  }
  std::string HelmOk(std::vector<std::string> args) {
    ProcessResult r = Helm(args);
    EXPECT_EQ(r.exit_code, 0) << "helm " << ::testing::PrintToString(args) << "\n" << r.err;
    return r.out;
  }
#endif
  void ApplyWidgetKind() {
    EXPECT_NE(Ok({"apply", "-f", kFixtures + "/widget-crd.yaml"}).find("created"),
              std::string::npos);
  }

  static std::string ElapsedSeconds(std::chrono::steady_clock::time_point since) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - since);
    std::ostringstream s;
    s << std::fixed << std::setprecision(1) << ms.count() / 1000.0;
    return s.str();
  }

  std::chrono::steady_clock::time_point test_start_;
  fs::path dir_;
  bool with_operator_ = false;  // set in the constructor of fixtures that test the operator
  std::unique_ptr<Process> cluster_;
};

}  // namespace tidal::testing
