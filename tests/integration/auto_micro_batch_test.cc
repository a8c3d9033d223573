// spec.optimization.microBatchSize: auto through tidal-train, as a user runs it: the engine
// grows the micro-batch while the step's measured peak (the CPU tensors' bytes here), scaled to
// the next size, stays under memoryTargetPercent of an artificial limit
// (TIDAL_MEMORY_LIMIT_BYTES, which the CPU meter enforces as a GPU would), and holds there;
// an injected allocation failure (TIDAL_TEST_OOM_AT_STEP) is caught, agreed by both ranks and
// the step run again smaller; and every loss equals the fixed microBatchSize 1 run's to 1e-5.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include <nlohmann/json.hpp>

#include "tests/integration/train_run.h"
#include "tests/test_paths.h"

namespace tidal::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kSteps = 12;

class AutoMicroBatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "tidal-auto-micro-XXXXXX").string();
    dir_ = mkdtemp(tmpl.data());
  }
  void TearDown() override { fs::remove_all(dir_); }

  // 16 sequences a step: 8 rows per rank at 2 ranks; LoRA dropout on, so equal losses also
  // show that each row keeps its own masks however rows are grouped.
  std::string Config(const std::string& name, const std::string& micro, int stage,
                     const std::string& extra = "") {
    const std::string path = dir_ + "/" + name + ".yaml";
    std::ofstream(path)
        << "model: {preset: tiny, seed: 3}\n"
        << "dataset: {uri: " << TIDAL_SOURCE_DIR
        << "/examples/data/sample.jsonl, format: text, maxSeqLen: 32}\n"
        << "lora: {rank: 4, alpha: 8, dropout: 0.1, targetModules: [q_proj, v_proj]}\n"
        << "optimization: {zeroStage: " << stage
        << ", precision: fp32, globalBatchSize: 16, microBatchSize: " << micro
        << ", learningRate: 2.0e-3, maxSteps: " << kSteps << ", seed: 1" << extra << "}\n";
    return path;
  }
  static TrainRun Train(const std::string& config, int nproc, std::vector<std::string> env = {},
                        std::vector<std::string> flags = {}) {
    std::vector<std::string> argv = {"/usr/bin/env"};
    argv.insert(argv.end(), env.begin(), env.end());
    argv.insert(argv.end(),
                {TIDAL_TRAIN_BIN, "--config", config, "--nproc", std::to_string(nproc)});
    argv.insert(argv.end(), flags.begin(), flags.end());
    return RunTrain(argv);
  }
  static void ExpectSameLosses(const TrainRun& run, const TrainRun& reference) {
    ASSERT_EQ(run.steps.size(), static_cast<size_t>(kSteps)) << run.result.err;
    for (const auto& [step, line] : run.steps) {
      const double want = reference.steps.at(step)["loss"].get<double>();
      EXPECT_LE(std::abs(line["loss"].get<double>() - want) / std::abs(want), 1e-5)
          << "step " << step << " at micro-batch " << line["micro_batch"];
    }
  }
  static std::vector<int64_t> Sizes(const TrainRun& run) {
    std::vector<int64_t> sizes;
    for (const auto& [step, line] : run.steps) sizes.push_back(line["micro_batch"].get<int64_t>());
    return sizes;
  }
  static int Count(const TrainRun& run, const std::string& msg) {
    int n = 0;
    for (const json& j : run.logs) n += j.value("msg", "") == msg;
    return n;
  }
  std::string dir_;
};

TEST_F(AutoMicroBatchTest, GrowsThenHoldsUnderAnArtificialLimitWithTheFixedSizesLossCurve) {
  const TrainRun fixed = Train(Config("fixed", "1", 2), 2);
  ASSERT_EQ(fixed.result.exit_code, 0) << fixed.result.err;
  ASSERT_EQ(fixed.steps.size(), static_cast<size_t>(kSteps));

  // Without a limit of its own the host's memory leaves room: ×1.2 steps up to all 8 rows.
  const TrainRun free = Train(Config("free", "auto", 2), 2);
  ASSERT_EQ(free.result.exit_code, 0) << free.result.err;
  ExpectSameLosses(free, fixed);
  const std::vector<int64_t> grown = Sizes(free);
  EXPECT_EQ(grown.front(), 1);
  EXPECT_EQ(grown.back(), 8);
  for (size_t i = 1; i < grown.size(); ++i) {
    EXPECT_GE(grown[i], grown[i - 1]);
    EXPECT_LE(grown[i], std::max<int64_t>(grown[i - 1] + 1, grown[i - 1] * 6 / 5));
  }

  // A limit whose 80 % lies halfway between the peaks at 1 and 8 rows (as measured above: the
  // tensors' bytes grow with the rows), so that growth stops midway.
  const auto peak_at = [&](int64_t size) {
    for (const auto& [step, line] : free.steps)
      if (line["micro_batch"] == size) return line["peak_memory_bytes"].get<double>();
    return -1.0;
  };
  const double p1 = peak_at(1), p8 = peak_at(8);
  ASSERT_GT(p8, p1) << "the peak does not grow with the micro-batch";
  const double target = p1 + (p8 - p1) * 0.5;
  const auto limit = static_cast<int64_t>(target / 0.8);
  const TrainRun held =
      Train(Config("held", "auto", 2), 2, {"TIDAL_MEMORY_LIMIT_BYTES=" + std::to_string(limit)});
  ASSERT_EQ(held.result.exit_code, 0) << held.result.err;
  ExpectSameLosses(held, fixed);
  const std::vector<int64_t> sizes = Sizes(held);
  EXPECT_GT(sizes.back(), 1) << held.result.err;
  EXPECT_LT(sizes.back(), 8) << held.result.err;
  EXPECT_EQ(sizes[sizes.size() - 2], sizes.back()) << "it holds once it has stopped";
  for (const auto& [step, line] : held.steps)
    EXPECT_LE(line["peak_memory_bytes"].get<double>(), target * 1.05) << "step " << step;
  EXPECT_EQ(Count(held, "out of memory: the step runs again at a smaller micro-batch"), 0);
  EXPECT_GE(Count(held, "micro-batch size"), 1);
}

// Both ranks fail an allocation in step 6 (ZeRO-2: no collective inside a pass, so they
// agree after it): the step's gradients are dropped, it runs again smaller, no larger size is
// tried after, and the curve is the fixed run's.
TEST_F(AutoMicroBatchTest, AnInjectedAllocationFailureIsRetriedSmallerAndTheCurveIsUnchanged) {
  const TrainRun fixed = Train(Config("fixed", "1", 2), 2);
  ASSERT_EQ(fixed.result.exit_code, 0) << fixed.result.err;
  const TrainRun failed = Train(Config("oom", "auto", 2), 2, {"TIDAL_TEST_OOM_AT_STEP=6"});
  ASSERT_EQ(failed.result.exit_code, 0) << failed.result.err;
  ExpectSameLosses(failed, fixed);
  int retries = 0;
  int64_t from = 0, to = 0;
  for (const json& j : failed.logs)
    if (j.value("msg", "") == "out of memory: the step runs again at a smaller micro-batch") {
      ++retries;
      from = j["from"];
      to = j["to"];
      EXPECT_EQ(j["step"], 6);
    }
  EXPECT_GE(retries, 1) << failed.result.err;
  EXPECT_LT(to, from);
  const std::vector<int64_t> sizes = Sizes(failed);
  EXPECT_EQ(sizes[5], to) << "step 6 ran at the smaller size";
  for (size_t i = 5; i < sizes.size(); ++i) EXPECT_LT(sizes[i], from) << "step " << i + 1;
}

// One rank at ZeRO-3 (nothing to agree on) survives the failure too; the size chosen is in
// the checkpoint and a resume starts from it.
TEST_F(AutoMicroBatchTest, OneRankAtStageThreeSurvivesAFailureAndAResumeKeepsTheChosenSize) {
  const std::string config = Config("stage3", "auto", 3);
  const std::string store = dir_ + "/ckpt";
  const TrainRun first =
      Train(config, 1, {"TIDAL_TEST_OOM_AT_STEP=4"},
            {"--checkpoint-uri", store, "--max-steps", "8", "--full-every", "8"});
  ASSERT_EQ(first.result.exit_code, 0) << first.result.err;
  ASSERT_EQ(first.steps.size(), 8u);
  EXPECT_EQ(Count(first, "out of memory: the step runs again at a smaller micro-batch"), 1);
  std::ifstream state(store + "/step-00000008/trainer_state.json");
  ASSERT_TRUE(state.good());
  const json saved = json::parse(state);
  const int64_t chosen = saved["microBatch"]["size"];
  EXPECT_GE(chosen, 1);
  EXPECT_GT(saved["microBatch"]["cap"].get<int64_t>(), 0) << "the failure's cap is kept";
  const TrainRun resumed = Train(config, 1, {}, {"--checkpoint-uri", store, "--max-steps", "10"});
  ASSERT_EQ(resumed.result.exit_code, 0) << resumed.result.err;
  ASSERT_TRUE(resumed.steps.count(9)) << resumed.result.err;
  EXPECT_EQ(resumed.steps.at(9)["micro_batch"], chosen);
}

// bf16 on CPU runs oneDNN kernels, which take their memory through raw_allocate: the counting
// allocator's blocks must be their own context (an assertion failed at the first forward).
TEST_F(AutoMicroBatchTest, Bf16OnCpuTrainsThroughTheCountingAllocator) {
  std::string config = Config("bf16", "auto", 3);
  {
    std::ifstream in(config);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    text.replace(text.find("precision: fp32"), std::string("precision: fp32").size(),
                 "precision: bf16");
    std::ofstream(config) << text;
  }
  const TrainRun run = Train(config, 1, {}, {"--max-steps", "3"});
  ASSERT_EQ(run.result.exit_code, 0) << run.result.err;
  ASSERT_EQ(run.steps.size(), 3u);
  EXPECT_EQ(run.steps.at(3)["micro_batch"], 3);
  EXPECT_GT(run.steps.at(3)["peak_memory_bytes"].get<int64_t>(),
            run.steps.at(1)["peak_memory_bytes"].get<int64_t>());
}

TEST_F(AutoMicroBatchTest, BadSettingsAreRefusedNamingTheFieldOrTheVariable) {
  struct Case {
    std::string config;
    std::vector<std::string> env;
    std::string says;
  };
  const std::vector<Case> cases = {
      {Config("word", "large", 2), {}, "spec.optimization.microBatchSize: expected an integer or"},
      {Config("target", "auto", 2, ", memoryTargetPercent: 0"),
       {},
       "spec.optimization.memoryTargetPercent: must be in (0, 100], got 0"},
      {Config("target2", "auto", 2, ", memoryTargetPercent: 150"),
       {},
       "spec.optimization.memoryTargetPercent: must be in (0, 100]"},
      {Config("limit", "auto", 2), {"TIDAL_MEMORY_LIMIT_BYTES=lots"}, "TIDAL_MEMORY_LIMIT_BYTES"},
      {Config("oom", "auto", 2), {"TIDAL_TEST_OOM_AT_STEP=-1"}, "TIDAL_TEST_OOM_AT_STEP"},
  };
  for (const Case& c : cases) {
    const TrainRun run = Train(c.config, 1, c.env, {"--max-steps", "1"});
    EXPECT_NE(run.result.exit_code, 0) << c.says;
    EXPECT_NE(run.result.err.find(c.says), std::string::npos) << run.result.err;
  }
}

}  // namespace
}  // namespace tidal::testing
