// The chaos run in CI: tidal_chaos (tests/e2e/chaos/chaos_main.cc) with seed 1, each fault kind
// once in an order drawn from the seed, against a real job on `tidal local`, then its
// invariants: no two generations (or incarnations) at once, every step trained with the
// reference loss and none lost, `latest` always whole, a re-applied job going on from its
// predecessor, corruption reported, phase changes the lifecycle allows, consistent Events,
// nothing leaked. Many faults of every kind, overlapping, are bench/chaos_soak.sh's 30 minutes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/integration/process.h"
#include "tests/test_paths.h"

namespace tidal::testing {
namespace {

using namespace std::chrono_literals;

TEST(ChaosTest, EachFaultKindOnceInASeededOrderBreaksNoInvariant) {
  const std::string report = (std::filesystem::temp_directory_path() /
                              ("tidal-chaos-" + std::to_string(::getpid()) + ".json"))
                                 .string();
  ProcessResult r = RunProcess({TIDAL_CHAOS_BIN, "--seed", "1", "--duration", "60", "--mean-gap",
                                "3", "--each-once", "true", "--json", report},
                               1100s);
  std::cout << r.out;
  EXPECT_EQ(r.exit_code, 0) << (r.err.size() > 4000 ? r.err.substr(r.err.size() - 4000) : r.err);
  std::ifstream in(report);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  std::filesystem::remove(report);
  ASSERT_FALSE(j.is_discarded()) << "tidal_chaos wrote no report";
  EXPECT_TRUE(j["violations"].empty()) << j["violations"].dump(2);
  // Every kind was injected (a run without faults proves nothing), and the job came back from
  // each. The kinds are tidal_chaos's kAllFaults.
  std::multiset<std::string> kinds;
  for (const auto& f : j["faults"]) {
    kinds.insert(f.value("kind", ""));
    EXPECT_FALSE(f["seconds_to_training"].is_null())
        << "the job never trained again after " << f.dump();
  }
  for (const char* kind : {"worker", "operator", "cluster", "scale", "window", "pending", "s3",
                           "corrupt", "token", "badscale", "reapply"})
    EXPECT_EQ(kinds.count(kind), 1u) << kind << " in " << j["faults"].dump(2);
}

}  // namespace
}  // namespace tidal::testing
