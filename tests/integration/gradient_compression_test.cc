// spec.optimization.gradientCompression through tidal-train, as a user runs it (real processes,
// gloo on loopback): top-k at ratio 1 is the uncompressed curve at ZeRO stages 0-2; at 0.05 the
// loss stays within the margin docs/engine.md states of the uncompressed run's while each rank
// sends a fraction of the bytes; with groups fixed the compressed curve is the same at 1, 2 and 4
// ranks; and a resume — at the same or another world size — restores the residuals and
// continues the uninterrupted compressed curve.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "tests/integration/train_run.h"
#include "tests/test_paths.h"

namespace tidal::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;
using nlohmann::json;

// The margin docs/engine.md states for ratio 0.05 on this task at the default learning rate
// (2e-4): the mean loss of the last five of 30 steps within 8 % of the uncompressed run's
// (measured: 3.5 %; top-k with Adam lags the dense run, more at higher learning rates).
constexpr double kMargin = 0.08;

class GradientCompressionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "tidal-compression-XXXXXX").string();
    dir_ = mkdtemp(tmpl.data());
  }
  void TearDown() override { fs::remove_all(dir_); }

  // 16 sequences a step in micro-batches of 1: whole groups of whole micro-batches at 1, 2 and
  // 4 ranks. LoRA dropout on (each row's masks follow the step, not the rank layout).
  std::string Config(const std::string& name, int stage, const std::string& compression, int steps,
                     const std::string& lr = "3.0e-3") {
    const std::string path = dir_ + "/" + name + ".yaml";
    std::ofstream(path) << "model: {preset: tiny, seed: 3}\n"
                        << "dataset: {uri: " << TIDAL_SOURCE_DIR
                        << "/examples/data/sample.jsonl, format: text, maxSeqLen: 32}\n"
                        << "lora: {rank: 8, alpha: 16, dropout: 0.1, targetModules: [q_proj, "
                           "k_proj, v_proj, o_proj, up_proj]}\n"
                        << "optimization: {zeroStage: " << stage
                        << ", precision: fp32, globalBatchSize: 16, microBatchSize: 1, "
                           "learningRate: "
                        << lr << ", maxSteps: " << steps
                        << ", seed: 1, gradientCompression: " << compression << "}\n";
    return path;
  }
  static TrainRun Train(const std::string& config, int nproc, std::vector<std::string> flags = {}) {
    std::vector<std::string> argv = {TIDAL_TRAIN_BIN, "--config", config, "--nproc",
                                     std::to_string(nproc)};
    argv.insert(argv.end(), flags.begin(), flags.end());
    return RunTrain(argv);
  }
  static void ExpectSameLosses(const TrainRun& run, const TrainRun& reference, int64_t from,
                               int64_t to) {
    ASSERT_EQ(run.result.exit_code, 0) << run.result.err;
    ASSERT_EQ(run.steps.size(), static_cast<size_t>(to - from + 1)) << run.result.err;
    for (const auto& [step, line] : run.steps) {
      ASSERT_TRUE(reference.steps.count(step)) << step;
      const double want = reference.steps.at(step)["loss"].get<double>();
      EXPECT_LE(std::abs(line["loss"].get<double>() - want) / std::abs(want), 1e-5)
          << "step " << step << " at " << line["world_size"] << " ranks";
    }
  }
  static double Sum(const TrainRun& run, const char* field, int64_t from) {
    double total = 0;
    for (const auto& [step, line] : run.steps)
      if (step >= from) total += line.value(field, 0.0);
    return total;
  }
  static bool Logged(const TrainRun& run, const std::string& msg) {
    for (const json& j : run.logs)
      if (j.value("msg", "") == msg) return true;
    return false;
  }
  std::string dir_;
};

TEST_F(GradientCompressionTest, RatioOneIsTheUncompressedCurveAtZeroStagesZeroOneAndTwo) {
  const TrainRun dense = Train(Config("dense", 2, "{method: none}", 12), 2);
  ASSERT_EQ(dense.result.exit_code, 0) << dense.result.err;
  ASSERT_EQ(dense.steps.size(), 12u);
  for (int stage : {0, 1, 2}) {
    const TrainRun all = Train(Config("all" + std::to_string(stage), stage,
                                      "{method: topk, ratio: 1, warmupSteps: 0}", 12),
                               2);
    ExpectSameLosses(all, dense, 1, 12);
    for (const auto& [step, line] : all.steps) {
      EXPECT_TRUE(line.value("compressed", false)) << "step " << step;
      EXPECT_GT(line["gradient_bytes"].get<int64_t>(), 0) << "step " << step;
    }
  }
}

TEST_F(GradientCompressionTest, RatioFivePercentStaysWithinTheMarginAndSendsAFractionOfTheBytes) {
  constexpr int kSteps = 30;
  const TrainRun dense = Train(Config("dense", 1, "{method: none}", kSteps, "2.0e-4"), 2);
  const TrainRun topk =
      Train(Config("topk", 1, "{method: topk, ratio: 0.05, warmupSteps: 5}", kSteps, "2.0e-4"), 2);
  ASSERT_EQ(dense.result.exit_code, 0) << dense.result.err;
  ASSERT_EQ(topk.result.exit_code, 0) << topk.result.err;
  ASSERT_EQ(topk.steps.size(), static_cast<size_t>(kSteps));
  // The warm-up is dense: the same steps, and then compression changes the curve.
  for (int64_t step = 1; step <= 5; ++step) {
    EXPECT_FALSE(topk.steps.at(step).value("compressed", false)) << step;
    EXPECT_LE(std::abs(topk.steps.at(step)["loss"].get<double>() -
                       dense.steps.at(step)["loss"].get<double>()),
              1e-5 * dense.steps.at(step)["loss"].get<double>())
        << step;
  }
  EXPECT_TRUE(topk.steps.at(6).value("compressed", false));
  EXPECT_GT(std::abs(topk.steps.at(kSteps)["loss"].get<double>() -
                     dense.steps.at(kSteps)["loss"].get<double>()),
            1e-6)
      << "ratio 0.05 left the curve as it was: nothing was compressed";
  const double dense_tail = Sum(dense, "loss", kSteps - 4) / 5;
  const double topk_tail = Sum(topk, "loss", kSteps - 4) / 5;
  const double first = dense.steps.at(1)["loss"].get<double>();
  const double gap = (topk_tail - dense_tail) / dense_tail;
  std::cout << "loss over the last 5 of " << kSteps << " steps: uncompressed " << dense_tail
            << ", top-k 0.05 " << topk_tail << " (gap " << gap * 100 << " %, from " << first
            << " at step 1)\n";
  RecordProperty("loss_gap_percent", std::to_string(gap * 100));
  EXPECT_LT(dense_tail, first * 0.9) << "the task did not train";
  EXPECT_LE(std::abs(gap), kMargin);
  // Bytes each rank handed to its gradient collectives after the warm-up: 2 × 5 % of the
  // entries, 4 bytes each, against the dense fp64 reduce-scatter's 8.
  const double ratio = Sum(topk, "gradient_bytes", 6) / Sum(dense, "gradient_bytes", 6);
  std::cout << "gradient bytes per rank, top-k 0.05 / uncompressed: " << ratio << "\n";
  EXPECT_LT(ratio, 0.1);
  EXPECT_GT(ratio, 0.02);
}

TEST_F(GradientCompressionTest, WithGroupsFixedTheCompressedCurveIsTheSameAtOneTwoAndFourRanks) {
  const std::string config =
      Config("grouped", 2, "{method: topk, ratio: 0.05, warmupSteps: 2, groups: 4}", 12);
  const TrainRun at4 = Train(config, 4);
  ASSERT_EQ(at4.result.exit_code, 0) << at4.result.err;
  ASSERT_EQ(at4.steps.size(), 12u);
  for (int nproc : {1, 2}) ExpectSameLosses(Train(config, nproc), at4, 1, 12);
  // A world size the groups are not a multiple of is refused, naming the field.
  const TrainRun eight = Train(Config("eight", 2, "{method: topk, groups: 4}", 12), 8);
  EXPECT_NE(eight.result.exit_code, 0);
  EXPECT_NE(eight.result.err.find("spec.optimization.gradientCompression.groups: 4"),
            std::string::npos)
      << eight.result.err;
}

TEST_F(GradientCompressionTest, UnderAutoMicroBatchAPassHoldsOneGroupsRowsAndTheCurveIsUnchanged) {
  // 16 rows, 4 groups, 2 ranks: 8 rows per rank in two groups of 4. Auto grows to the group's 4
  // rows, not the rank's 8, and (the exchanges waiting for the ranks' out-of-memory agreement)
  // gives the curve of fixed micro-batches of 1.
  const std::string compression = "{method: topk, ratio: 0.05, warmupSteps: 2, groups: 4}";
  const TrainRun fixed = Train(Config("fixed", 1, compression, 12), 2);
  ASSERT_EQ(fixed.result.exit_code, 0) << fixed.result.err;
  std::string config = Config("auto", 1, compression, 12);
  {  // the same job at microBatchSize auto
    std::ifstream in(config);
    std::string text((std::istreambuf_iterator<char>(in)), {});
    const std::string from = "microBatchSize: 1";
    text.replace(text.find(from), from.size(), "microBatchSize: auto");
    std::ofstream(config) << text;
  }
  const TrainRun grown = Train(config, 2);
  ExpectSameLosses(grown, fixed, 1, 12);
  int64_t largest = 0;
  for (const auto& [step, line] : grown.steps)
    largest = std::max(largest, line["micro_batch"].get<int64_t>());
  EXPECT_EQ(largest, 4) << grown.result.err;
}

TEST_F(GradientCompressionTest, ResumeAndRescaleRestoreTheResidualsAndContinueTheCompressedCurve) {
  const std::string config =
      Config("resumed", 1, "{method: topk, ratio: 0.05, warmupSteps: 2, groups: 4}", 20);
  const std::string ref = dir_ + "/ref";
  const TrainRun uninterrupted = Train(config, 2, {"--checkpoint-uri", ref, "--full-every", "10"});
  ASSERT_EQ(uninterrupted.result.exit_code, 0) << uninterrupted.result.err;
  ASSERT_EQ(uninterrupted.steps.size(), 20u);
  // The step-10 checkpoint holds every group's residuals.
  std::ifstream manifest_file(ref + "/step-00000010/manifest.json");
  const json manifest = json::parse(manifest_file, nullptr, false);
  ASSERT_TRUE(manifest.is_object());
  std::set<std::string> groups;
  for (const json& t : manifest["tensors"]) {
    const std::string name = t["name"];
    const std::string prefix = "optimizer.residual.";
    if (name.rfind(prefix, 0) == 0)
      groups.insert(name.substr(prefix.size(), name.find('.', prefix.size()) - prefix.size()));
  }
  EXPECT_EQ(groups, (std::set<std::string>{"0", "1", "2", "3"}));
  // The PEFT export takes the adapter and leaves the residuals out, as it does the moments.
  const ProcessResult exported =
      RunProcess({TIDAL_EXPORT_BIN, "--checkpoint", ref, "--out", dir_ + "/adapter"}, 120s);
  ASSERT_EQ(exported.exit_code, 0) << exported.err;
  std::ifstream adapter(dir_ + "/adapter/adapter_model.safetensors", std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(adapter)), {});
  EXPECT_GT(bytes.size(), 8u);
  EXPECT_EQ(bytes.find("residual"), std::string::npos);
  EXPECT_NE(bytes.find("lora_A"), std::string::npos);
  for (int nproc : {2, 4, 1}) {
    const std::string copy = dir_ + "/at" + std::to_string(nproc);
    fs::create_directories(copy);
    fs::copy(ref + "/step-00000010", copy + "/step-00000010", fs::copy_options::recursive);
    const TrainRun resumed = Train(config, nproc, {"--checkpoint-uri", copy});
    EXPECT_TRUE(Logged(resumed, "resumed")) << resumed.result.err;
    EXPECT_FALSE(Logged(resumed,
                        "resuming without gradient compression residuals: they start "
                        "from zero"))
        << resumed.result.err;
    ExpectSameLosses(resumed, uninterrupted, 11, 20);
  }
}

TEST_F(GradientCompressionTest,
       WithoutGroupsARescaleRegroupsTheResidualsSaysSoAndMovesTheCurveByAMeasuredAmount) {
  // groups left out: one group per rank, so a resume at 4 ranks of a 2-rank checkpoint
  // regroups the residuals (their sum kept) and continues on the 4-group curve.
  const std::string config =
      Config("default", 0, "{method: topk, ratio: 0.05, warmupSteps: 2}", 16);
  const std::string ref = dir_ + "/ref";
  const TrainRun uninterrupted = Train(config, 2, {"--checkpoint-uri", ref, "--full-every", "8"});
  ASSERT_EQ(uninterrupted.result.exit_code, 0) << uninterrupted.result.err;
  const std::string copy = dir_ + "/at4";
  fs::create_directories(copy);
  fs::copy(ref + "/step-00000008", copy + "/step-00000008", fs::copy_options::recursive);
  const TrainRun resumed = Train(config, 4, {"--checkpoint-uri", copy});
  ASSERT_EQ(resumed.result.exit_code, 0) << resumed.result.err;
  ASSERT_EQ(resumed.steps.size(), 8u);
  bool regrouped = false;
  for (const json& j : resumed.logs)
    if (j.value("msg", "").rfind("gradient compression groups changed", 0) == 0)
      regrouped = j.value("saved_groups", 0) == 2 && j.value("groups", 0) == 4;
  EXPECT_TRUE(regrouped) << resumed.result.err;
  // Step 9's loss is the checkpoint's weights' (the residuals act from its update on); after
  // it the curve is the 4-group one, apart from the uninterrupted run by what docs/engine.md
  // states (0.1 % two steps after the rescale, a few % twenty steps after, at this rate).
  double largest = 0;
  for (const auto& [step, line] : resumed.steps) {
    const double want = uninterrupted.steps.at(step)["loss"].get<double>();
    const double off = std::abs(line["loss"].get<double>() - want) / want;
    if (step == 9) EXPECT_LE(off, 1e-5);
    largest = std::max(largest, off);
  }
  std::cout << "largest relative loss difference over steps 9-16 after a 2 -> 4 rescale without "
               "groups: "
            << largest * 100 << " %\n";
  EXPECT_GT(largest, 1e-5) << "regrouping left the curve as it was: the groups did not change";
  EXPECT_LT(largest, 0.05);
}

}  // namespace
}  // namespace tidal::testing
