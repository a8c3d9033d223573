// Rules about the source tree itself, checked by scripts this test runs:
// - tools/check_layers.py: the include rule of docs/architecture.md (which area may include
//   which); on the tree, and on a copy of it with one wrong-way include planted, which it must
//   report by file and line;
// - tests/check_measured_tests.py: every test tests/measured_tests.cmake names exists in this
//   build with the COST and PROCESSORS the list gives it;
// and one read by the test itself: no compile command carries a path of the checkout.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/integration/process.h"
#include "tests/temp_dir.h"
#include "tests/test_paths.h"

namespace tidal::testing {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

ProcessResult CheckLayers(const std::string& root) {
  return RunProcess(
      {TIDAL_PYTHON, std::string(TIDAL_SOURCE_DIR) + "/tools/check_layers.py", "--root", root},
      60s);
}

TEST(ArchitectureTest, IncludesCrossNoWallTheWrongWay) {
  const ProcessResult r = CheckLayers(TIDAL_SOURCE_DIR);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
}

// A copy of the product's sources in `root` with `include` appended to `file`; returns the
// number of the line it went to.
int PlantInclude(const fs::path& root, const std::string& file, const std::string& include) {
  for (const char* top : {"api", "common", "contract", "kube", "local", "operator", "worker"}) {
    const fs::path from = fs::path(TIDAL_SOURCE_DIR) / top;
    if (fs::exists(from) && !fs::exists(root / top))
      fs::copy(from, root / top, fs::copy_options::recursive);
  }
  const fs::path planted = root / file;
  EXPECT_TRUE(fs::exists(planted)) << planted;
  int lines = 0;
  {
    std::ifstream in(planted);
    for (std::string line; std::getline(in, line);) ++lines;
  }
  std::ofstream(planted, std::ios::app) << "#include \"" << include << "\"\n";
  return lines + 1;
}

// The check is only worth something if it fails: a copy of the product's sources with one
// include the wrong way (the engine reaching into the operator's controller).
TEST(ArchitectureTest, AWrongWayIncludeIsReportedWithItsFileAndLine) {
  ScratchDir tmp;
  const int line =
      PlantInclude(tmp.path(), "worker/engine/lr_schedule.h", "operator/controller/controller.h");
  const ProcessResult r = CheckLayers(tmp.path());
  ASSERT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("worker/engine/lr_schedule.h:" + std::to_string(line) +
                       ": #include \"operator/controller/controller.h\" crosses a wall the "
                       "wrong way (worker/engine/ may include"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("1 new"), std::string::npos) << r.out;
}

// The operator may use the contract's plain types and client, never its protobuf edge.
TEST(ArchitectureTest, TheOperatorIncludingTheProtobufEdgeOfTheContractIsReported) {
  ScratchDir tmp;
  const int line =
      PlantInclude(tmp.path(), "operator/controller/status_feed.cc", "contract/wire.h");
  const ProcessResult r = CheckLayers(tmp.path());
  ASSERT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("operator/controller/status_feed.cc:" + std::to_string(line) +
                       ": #include \"contract/wire.h\" crosses a wall the wrong way "
                       "(contract/wire.h is for contract, worker/control/ only)"),
            std::string::npos)
      << r.out;
}

// A path of the checkout on a compile command (-DTIDAL_SOURCE_DIR="/the/clone" was one) makes
// that source a ccache miss in every new clone of the same commit, which is what CI builds:
// ~80 test sources did, 490 CPU-s of a "warm" build (issue 48). Such paths go to the sources
// tidal_test_paths generates (CMakeLists.txt, tests/test_paths.h).
TEST(BuildRules, NoCompileCommandDefinesAPathOfTheCheckout) {
  std::ifstream in(std::string(TIDAL_BUILD_DIR) + "/compile_commands.json");
  ASSERT_TRUE(in) << "no compile_commands.json in " << TIDAL_BUILD_DIR;
  const nlohmann::json commands = nlohmann::json::parse(in, nullptr, false);
  ASSERT_TRUE(commands.is_array()) << "compile_commands.json does not parse";
  std::string found;
  for (const nlohmann::json& c : commands) {
    std::istringstream words(c.value("command", ""));
    for (std::string word; words >> word;)
      if (word.rfind("-D", 0) == 0 && word.find(TIDAL_SOURCE_DIR) != std::string::npos)
        found += c.value("file", "") + ": " + word + "\n";
  }
  EXPECT_GT(commands.size(), 100u);
  EXPECT_EQ(found, "");
}

// Each precompiled header of a ccache build has its inputs' checksum beside it
// (tools/ccache-launch.sh), which ccache hashes instead of the .gch, whose bytes differ from one
// build to the next: without it, a new clone's sources that use the header miss the cache.
TEST(BuildRules, EveryPrecompiledHeaderHasTheChecksumCcacheHashes) {
  std::ifstream rules(std::string(TIDAL_BUILD_DIR) + "/CMakeFiles/rules.ninja");
  std::string text((std::istreambuf_iterator<char>(rules)), std::istreambuf_iterator<char>());
  if (text.find("tools/ccache-launch.sh") == std::string::npos)
    GTEST_SKIP() << "this build compiles without tools/ccache-launch.sh (no ccache, or not Ninja)";
  int headers = 0;
  std::string without;
  for (const auto& entry : fs::recursive_directory_iterator(TIDAL_BUILD_DIR)) {
    if (entry.path().extension() != ".gch") continue;
    ++headers;
    if (!fs::exists(entry.path().string() + ".sum")) without += entry.path().string() + "\n";
  }
  // clang's headers (.pch, the sanitizer build) are the same bytes each build already.
  if (headers == 0) GTEST_SKIP() << "no GCC precompiled header in " << TIDAL_BUILD_DIR;
  EXPECT_EQ(without, "");
}

TEST(TestScheduling, EveryMeasuredTestIsATestOfThisBuild) {
#ifndef TIDAL_ALL_TESTS_BUILT
  GTEST_SKIP() << "this build leaves LibTorch's tests out; the ordinary build checks the list";
#endif
  const ProcessResult r = RunProcess(
      {TIDAL_PYTHON, std::string(TIDAL_SOURCE_DIR) + "/tests/check_measured_tests.py", CTEST_BIN,
       std::string(TIDAL_SOURCE_DIR) + "/tests/measured_tests.cmake", TIDAL_BUILD_DIR},
      60s);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
}

}  // namespace
}  // namespace tidal::testing
