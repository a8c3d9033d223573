// tests/e2e/local/operator_fixture.h — `tidal local` with the operator, a tiny TrainingJob's
// YAML, and the waits and reads its e2e tests share (kubectl, status, logs, /metrics).
#pragma once

#include <signal.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tests/e2e/local/kubectl_fixture.h"
#include "tests/integration/metrics_scrape.h"
#include "tests/integration/reference_run.h"
#include "tests/test_paths.h"

namespace tidal::testing {

class OperatorTest : public KubectlTest {
 protected:
  OperatorTest() { with_operator_ = true; }
  std::vector<std::string> ExtraClusterArgs() override { return {"--gpus", "4"}; }

  // A tiny job: 8 sequences per step (whole micro-batches at 2 and 4 ranks), a full
  // checkpoint every 5 steps, no cooldown, one intra-op thread per worker (4 share 2 cores).
  // `worker_fields` go first in spec.worker (e.g. "tlsSecretName: s, "); `env_items` are more
  // entries of its env list (e.g. "{name: X, value: \"1\"}").
  static constexpr const char* kElastic =
      "{minGPUs: 2, maxGPUs: 4, cooldownSeconds: 0, scaleUpTimeoutSeconds: 120}";
  std::string JobYaml(const std::string& name, int max_steps, const std::string& extra = "",
                      const std::string& elastic = kElastic, const std::string& worker_fields = "",
                      const std::string& env_items = "") {
    std::ostringstream y;
    y << "apiVersion: tidal.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: " << name
      << "}\nspec:\n"
      << "  model: {preset: tiny, seed: 3}\n"
      << "  dataset: {uri: " << TIDAL_SOURCE_DIR
      << "/examples/data/sample.jsonl, format: text, maxSeqLen: 32}\n"
      << "  lora: {rank: 4, alpha: 8, dropout: 0.1, targetModules: [q_proj, v_proj]}\n"
      << "  optimization: {zeroStage: 3, precision: fp32, globalBatchSize: 8, microBatchSize: 2,"
      << " learningRate: 2.0e-3, warmup: {steps: 5, adaptive: true}, maxSteps: " << max_steps
      << ", seed: 1}\n"
      << "  elastic: " << elastic << "\n"
      << "  checkpoint: " << checkpoint_ << "\n"
      << "  restartPolicy: {maxRestarts: 3, backoffSeconds: 1}\n"
      << "  worker: {" << worker_fields << "env: [{name: TIDAL_INTRA_OP_THREADS, value: \"1\"}"
      << (env_items.empty() ? "" : ", " + env_items) << "]}\n"
      << extra;
    return WriteFile(name + ".yaml", y.str());
  }
  // spec.checkpoint of the jobs JobYaml writes.
  std::string checkpoint_ = "{fullEverySteps: 5, snapshotEverySteps: 0, keep: 2}";
  // SIGKILL to the worker process of `pod`, found by its pod directory (named by uid).
  void KillWorkerProcess(const std::string& pod) {
    const std::string uid = Ok({"get", "pod", pod, "-o", "jsonpath={.metadata.uid}"});
    ASSERT_FALSE(uid.empty());
    auto r = RunProcess({"/usr/bin/pgrep", "-f", uid + "/volumes/job/trainingjob.json"}, 10s);
    ASSERT_EQ(r.exit_code, 0) << "no worker process found for " << pod;
    const pid_t pid = std::atoi(r.out.c_str());
    ASSERT_GT(pid, 0);
    kill(pid, SIGKILL);
  }
  std::string Status(const std::string& job, const std::string& path) {
    return Kubectl({"get", "tj", job, "-o", "jsonpath=" + path}).out;
  }
  int64_t Int(const std::string& job, const std::string& path) {
    const std::string v = Status(job, path);
    return v.empty() ? -1 : std::atoll(v.c_str());
  }
  void WaitInt(const std::string& job, const std::string& path,
               const std::function<bool(int64_t)>& done, std::chrono::seconds timeout) {
    const std::string out = WaitFor(
        {"tj", job}, path,
        [&](const std::string& v) { return !v.empty() && done(std::atoll(v.c_str())); }, timeout);
    ASSERT_TRUE(!out.empty() && done(std::atoll(out.c_str())))
        << path << " = " << out << "\nstatus: " << Status(job, "{.status}")
        << "\nlog tail: " << LogTail();
  }
  std::string LogTail() {
    std::ifstream in(dir_ / "tidal-local.log");
    std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return all.size() > 4000 ? all.substr(all.size() - 4000) : all;
  }
  // step → losses logged by rank 0 (`kubectl logs`; worker-0 is rank 0 in every generation).
  std::map<int64_t, std::vector<double>> StepLosses(const std::string& pod) {
    std::map<int64_t, std::vector<double>> out;
    std::istringstream in(Ok({"logs", pod}));
    std::string line;
    while (std::getline(in, line)) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.is_object() || j.value("msg", "") != "step") continue;
      out[j["step"].get<int64_t>()].push_back(j["loss"].get<double>());
    }
    return out;
  }
  // The length of the jobs whose curve is held to the reference: long enough to still train
  // after two rescales, a kill or a drain, and one length so that they share one reference.
  static constexpr int kReferenceSteps = 150;
  // The losses of an uninterrupted 2-rank run of `manifest` (made once per build and spec).
  std::map<int64_t, double> ReferenceLosses(const std::string& manifest, int steps) {
    std::string err;
    auto losses =
        ReferenceRunLosses(TIDAL_TEST_CACHE_DIR, TIDAL_TRAIN_BIN, manifest, 2, steps, &err);
    EXPECT_FALSE(losses.empty()) << "the reference run failed: " << err;
    std::cout << "[reference run of " << steps << " steps ready, test at "
              << ElapsedSeconds(test_start_) << " s]" << std::endl;
    return losses;
  }
  // Rank 0's log holds every step of the reference run exactly once, each with its loss to
  // 1e-5 relative: nothing lost, nothing trained twice (two generations at once would).
  void ExpectEveryStepOnceWithTheReferenceLoss(const std::string& pod,
                                               const std::map<int64_t, double>& reference) {
    const auto losses = StepLosses(pod);
    EXPECT_EQ(losses.size(), reference.size()) << "a step was lost";
    for (const auto& [step, seen] : losses) {
      EXPECT_EQ(seen.size(), 1u) << "step " << step << " ran " << seen.size() << " times";
      ASSERT_TRUE(reference.count(step)) << "step " << step << " is past the last one";
      const double want = reference.at(step);
      EXPECT_LE(std::abs(seen[0] - want) / std::abs(want), 1e-5) << "step " << step;
    }
  }
  // The in-process operator's /metrics (its port is in the data directory).
  std::string OperatorMetrics() {
    std::ifstream in(dir_ / "data" / "operator-metrics-port");
    int port = 0;
    in >> port;
    EXPECT_GT(port, 0) << "tidal local wrote no operator-metrics-port";
    auto text = ScrapeMetrics("127.0.0.1", port);
    EXPECT_TRUE(text.ok()) << text.status().ToString();
    return text.ok() ? *text : "";
  }
  std::string PodMetrics(const std::string& pod) {
    const std::string ip = Ok({"get", "pod", pod, "-o", "jsonpath={.status.podIP}"});
    auto text = ScrapeMetrics(ip, 9090);
    EXPECT_TRUE(text.ok()) << pod << " at " << ip << ": " << text.status().ToString();
    return text.ok() ? *text : "";
  }
  // The job's worker pods (not the data phase's prep pod).
  int PodCount(const std::string& job) {
    std::string out =
        Ok({"get", "pods", "-l", "tidal.dev/job=" + job + ",!tidal.dev/role", "-o", "name"});
    return static_cast<int>(std::count(out.begin(), out.end(), '\n'));
  }
};

}  // namespace tidal::testing
