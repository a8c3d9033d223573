// The chaos soak in CI: tidal_chaos (tests/e2e/chaos/chaos_main.cc) with seed 1 for 3 minutes of
// faults of every kind against a real job on `tidal local`, then its invariants: no two
// generations at once, every step trained with the reference loss and none lost, `latest`
// always whole, phase changes the lifecycle allows, consistent Events, nothing leaked.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>

#include "tests/integration/process.h"

namespace tidal::testing {
namespace {

using namespace std::chrono_literals;

TEST(ChaosTest, ThreeMinutesOfSeededFaultsOfEveryKindBreakNoInvariant) {
  const std::string report = (std::filesystem::temp_directory_path() /
                              ("tidal-chaos-" + std::to_string(::getpid()) + ".json"))
                                 .string();
  ProcessResult r =
      RunProcess({TIDAL_CHAOS_BIN, "--seed", "1", "--duration", "180", "--json", report}, 1100s);
  std::cout << r.out;
  EXPECT_EQ(r.exit_code, 0) << (r.err.size() > 4000 ? r.err.substr(r.err.size() - 4000) : r.err);
  std::ifstream in(report);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  std::filesystem::remove(report);
  ASSERT_FALSE(j.is_discarded()) << "tidal_chaos wrote no report";
  EXPECT_TRUE(j["violations"].empty()) << j["violations"].dump(2);
  // Faults were injected and the job came back from them (a run without faults proves nothing).
  ASSERT_GE(j["faults"].size(), 8u) << j["faults"].dump(2);
  for (const auto& f : j["faults"])
    EXPECT_FALSE(f["seconds_to_training"].is_null())
        << "the job never trained again after " << f.dump();
}

}  // namespace
}  // namespace tidal::testing
