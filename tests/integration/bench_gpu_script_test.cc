// bench/gpu.sh as a GPU session uses it, on the CPU: `pack` bundles engine_step_bench with the
// libraries a torch image lacks, `run` runs it (from the bundle, on the torch of the Python it
// is given) against transformers + PEFT and prints one comparison line per config, so that
// device time is spent measuring, not debugging the script.
#include <gtest/gtest.h>

#include <sstream>

#include <nlohmann/json.hpp>

#include "tests/integration/process.h"
#include "tests/test_paths.h"

namespace tidal::testing {
namespace {

using namespace std::chrono_literals;

TEST(BenchGpuScript, PacksTheEngineBenchAndComparesItWithTransformersPeftOnTheCpu) {
  const std::string script = std::string(TIDAL_SOURCE_DIR) + "/bench/gpu.sh";
  ProcessResult pack = RunProcess({script, "pack", TIDAL_BUILD_DIR}, 600s);
  ASSERT_EQ(pack.exit_code, 0) << pack.out << pack.err;
  EXPECT_NE(pack.out.find("out/gpu-bench"), std::string::npos) << pack.out;

  ProcessResult run =
      RunProcess({"/usr/bin/env", "DEVICE=cpu", "CONFIGS=tiny", "STEPS=2", "WARMUP=1", "THREADS=1",
                  "PYTHON=" + std::string(TIDAL_PYTHON), script, "run"},
                 600s);
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  std::istringstream lines(run.out);
  int compared = 0, kept = 0, buddy = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] != '{') continue;
    auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j["config"], "tiny");
    EXPECT_EQ(j["device"], "cpu");
    if (j.contains("kept_over_built")) {  // issue 25: the engine kept into the next generation
      EXPECT_GT(j["engine_built_s"].get<double>(), 0);
      EXPECT_GT(j["engine_kept_s"].get<double>(), 0);
      EXPECT_GT(j["kept_over_built"].get<double>(), 0);
      ++kept;
      continue;
    }
    if (j.contains("buddy_capture_over_step")) {  // and a buddy copy against the step
      EXPECT_GT(j["buddy_bytes"].get<double>(), 0);
      EXPECT_GT(j["buddy_capture_s"].get<double>(), 0);
      EXPECT_GT(j["step_s"].get<double>(), 0);
      ++buddy;
      continue;
    }
    EXPECT_GT(j["engine_tokens_per_s"].get<double>(), 0);
    EXPECT_GT(j["hf_tokens_per_s"].get<double>(), 0);
    EXPECT_GT(j["step_time_ratio_engine_over_hf"].get<double>(), 0);
    EXPECT_GT(j["engine_mfu"].get<double>(), 0);
    EXPECT_LT(j["engine_mfu"].get<double>(), 1);
    ++compared;
  }
  EXPECT_EQ(compared, 1) << run.out;
  EXPECT_EQ(kept, 1) << run.out;
  EXPECT_EQ(buddy, 1) << run.out;
  // The table a person reads names both implementations.
  EXPECT_NE(run.out.find("transformers+peft"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("tidal"), std::string::npos) << run.out;
}

}  // namespace
}  // namespace tidal::testing
