// The shipped alert rules and Grafana dashboard (charts/tidal/files/), without a cluster:
// promtool checks and unit-tests the rules; every metric either file names is one the
// operator or the worker defines (a renamed metric would leave a panel or an alert silent).
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/integration/process.h"
#include "tests/test_paths.h"

namespace tidal::testing {
namespace {

using namespace std::chrono_literals;
const std::string kSource = TIDAL_SOURCE_DIR;

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// tidal_* names in `text`, with a histogram's _bucket/_sum/_count taken back to its name.
std::set<std::string> MetricNames(const std::string& text) {
  std::set<std::string> out;
  static const std::regex name(R"(\btidal_[a-z_]+)");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), name); it != std::sregex_iterator();
       ++it) {
    std::string n = it->str();
    for (const char* suffix : {"_bucket", "_sum", "_count"})
      if (n.size() > std::strlen(suffix) &&
          n.compare(n.size() - std::strlen(suffix), std::string::npos, suffix) == 0 &&
          n.find("_seconds") != std::string::npos)
        n.resize(n.size() - std::strlen(suffix));
    out.insert(n);
  }
  return out;
}

// The names the binaries register: the string literals of their metric definitions.
std::set<std::string> DefinedMetrics() {
  std::set<std::string> out;
  static const std::regex literal(R"re("(tidal_[a-z_]+)")re");
  for (const char* file : {"/operator/controller/metrics.cc", "/worker/control/metrics.cc"}) {
    const std::string text = Read(kSource + file);
    for (auto it = std::sregex_iterator(text.begin(), text.end(), literal);
         it != std::sregex_iterator(); ++it)
      out.insert((*it)[1].str());
  }
  return out;
}

TEST(AlertRules, PromtoolChecksThemAndTheirUnitTestsPass) {
  ProcessResult check = RunProcess(
      {PROMTOOL_BIN, "check", "rules", kSource + "/charts/tidal/files/tidal-rules.yaml"}, 60s);
  EXPECT_EQ(check.exit_code, 0) << check.out << check.err;
  EXPECT_NE(check.out.find("SUCCESS: 7 rules found"), std::string::npos) << check.out;
  ProcessResult test = RunProcess(
      {PROMTOOL_BIN, "test", "rules", kSource + "/tests/prometheus/tidal-rules.test.yaml"}, 120s);
  EXPECT_EQ(test.exit_code, 0) << test.out << test.err;
  EXPECT_NE(test.out.find("SUCCESS"), std::string::npos) << test.out << test.err;
}

TEST(AlertRules, EveryAlertHasAUnitTestThatFiresIt) {
  const std::string rules = Read(kSource + "/charts/tidal/files/tidal-rules.yaml");
  const std::string tests = Read(kSource + "/tests/prometheus/tidal-rules.test.yaml");
  static const std::regex alert(R"(- alert: (\w+))");
  int alerts = 0;
  for (auto it = std::sregex_iterator(rules.begin(), rules.end(), alert);
       it != std::sregex_iterator(); ++it, ++alerts)
    EXPECT_NE(tests.find("alertname: " + (*it)[1].str()), std::string::npos) << (*it)[1];
  EXPECT_EQ(alerts, 7);
}

TEST(ShippedMonitoring, EveryMetricTheRulesAndDashboardNameIsOneTheBinariesDefine) {
  const std::set<std::string> defined = DefinedMetrics();
  ASSERT_GT(defined.size(), 25u) << "the metric definitions moved?";
  for (const char* file :
       {"/charts/tidal/files/tidal-rules.yaml", "/charts/tidal/files/tidal-dashboard.json"})
    for (const std::string& name : MetricNames(Read(kSource + file)))
      EXPECT_TRUE(defined.count(name)) << file << " names " << name << ", which nothing defines";
}

TEST(GrafanaDashboard, EveryPanelHasAQueryTheJobVariablesAndAUniqueId) {
  nlohmann::json d =
      nlohmann::json::parse(Read(kSource + "/charts/tidal/files/tidal-dashboard.json"));
  std::set<int> ids;
  int queries = 0;
  for (const auto& panel : d.at("panels")) {
    EXPECT_TRUE(ids.insert(panel.at("id").get<int>()).second) << "panel id " << panel["id"];
    if (panel.at("type") == "row") continue;
    ASSERT_TRUE(panel.contains("targets")) << panel.at("title");
    for (const auto& target : panel["targets"]) {
      const std::string expr = target.at("expr");
      ++queries;
      // The operator's own series, and rescale durations (by kind, over all jobs), are not
      // per job.
      const bool per_job = expr.find("tidal_operator_") == std::string::npos &&
                           expr.find("tidal_trainingjobs") == std::string::npos &&
                           expr.find("tidal_trainingjob_rescale_duration") == std::string::npos;
      if (per_job)
        EXPECT_NE(expr.find(R"(trainingjob=~"$trainingjob")"), std::string::npos)
            << panel.at("title") << ": a per-job panel that ignores the job picker: " << expr;
    }
  }
  EXPECT_GE(queries, 20);
  std::set<std::string> variables;
  for (const auto& v : d.at("templating").at("list")) variables.insert(v.at("name"));
  EXPECT_EQ(variables, (std::set<std::string>{"datasource", "namespace", "trainingjob"}));
}

// tools/plot-demo.sh draws the README's picture from what `make demo` scraped.
TEST(DemoPlot, DrawsAPngOfLossAndGpusFromAScrapedTimeline) {
  const std::string dir = ::testing::TempDir();
  {
    std::ofstream t(dir + "/timeline.tsv");
    // seconds step loss desired current generation; "-" where a scrape found nothing
    t << "0 - - - - -\n2 0 - 2 0 0\n4 5 6.6 2 2 1\n6 18 4.4 4 2 1\n8 30 4.2 4 4 2\n"
         "10 44 4.0 2 4 2\n12 57 3.9 2 2 3\n";
  }
  std::remove((dir + "/plot.png").c_str());
  ProcessResult r = RunProcess({std::string(TIDAL_SOURCE_DIR) + "/tools/plot-demo.sh",
                                dir + "/timeline.tsv", dir + "/plot.png"},
                               60s);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream png(dir + "/plot.png", std::ios::binary);
  char magic[8] = {};
  png.read(magic, 8);
  EXPECT_EQ(std::string(magic, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  // A new generation is marked where it changes: not where one is first seen, not at a
  // scrape that found nothing.
  EXPECT_NE(r.out.find("generation changes at: 4 8 12 \n"), std::string::npos) << r.out;
  EXPECT_EQ(r.err, "");
}

TEST(DemoPlot, AnEmptyTimelineIsAClearError) {
  const std::string empty = ::testing::TempDir() + "/empty-timeline.tsv";
  std::ofstream(empty).close();
  ProcessResult r = RunProcess(
      {std::string(TIDAL_SOURCE_DIR) + "/tools/plot-demo.sh", empty, empty + ".png"}, 60s);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("is empty"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace tidal::testing
