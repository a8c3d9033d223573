// Observability end to end: a real Prometheus server (Debian's) scrapes the operator and the
// worker pods of jobs on `tidal local`; the dashboard's every query and the alert rules run on
// what it scraped; and the anomaly rule pauses a job whose loss is made to rise while a job
// whose loss is only noisy trains on.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <regex>
#include <set>

#include "common/http/client.h"
#include "tests/e2e/local/operator_fixture.h"
#include "tests/test_paths.h"

namespace tidal::testing {
namespace {

using nlohmann::json;

const std::string kCharts = std::string(TIDAL_SOURCE_DIR) + "/charts/tidal/files";

int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
    port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

std::string UrlEncode(const std::string& s) {
  std::string out;
  char buf[4];
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      std::snprintf(buf, sizeof buf, "%%%02X", c);
      out += buf;
    }
  }
  return out;
}

class ObservabilityTest : public OperatorTest {
 protected:
  void TearDown() override {
    prometheus_.reset();
    OperatorTest::TearDown();
  }

  // Prometheus on a free loopback port, scraping every second: the operator (static) and the
  // worker pods listed in a file_sd file the test rewrites as pods come (WritePodTargets), with
  // the rules file loaded and evaluated every second.
  void StartPrometheus() {
    std::ifstream in(dir_ / "data" / "operator-metrics-port");
    int operator_port = 0;
    in >> operator_port;
    ASSERT_GT(operator_port, 0);
    prometheus_port_ = FreePort();
    ASSERT_GT(prometheus_port_, 0);
    WritePodTargets();
    const std::string config =
        WriteFile("prometheus.yml",
                  "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
                  "rule_files: ['" +
                      kCharts + "/tidal-rules.yaml']\n" +
                      "scrape_configs:\n"
                      "  - job_name: tidal-operator\n"
                      "    static_configs: [{targets: ['127.0.0.1:" +
                      std::to_string(operator_port) +
                      "'], labels: {pod: tidal-operator}}]\n"
                      "  - job_name: tidal-workers\n"
                      "    file_sd_configs: [{files: ['" +
                      (dir_ / "worker-targets.json").string() + "'], refresh_interval: 1s}]\n");
    const std::string command =
        "exec \"$0\" \"$@\" >>" + (dir_ / "prometheus.log").string() + " 2>&1";
    prometheus_ = std::make_unique<Process>(std::vector<std::string>{
        "/bin/sh", "-c", command, PROMETHEUS_BIN, "--config.file=" + config,
        "--storage.tsdb.path=" + (dir_ / "tsdb").string(),
        "--web.listen-address=127.0.0.1:" + std::to_string(prometheus_port_)});
    ASSERT_TRUE(OperatorTest::WaitUntilTrue(
        [&] {
          auto r = Get("/-/ready");
          return r.ok() && r->status == 200;
        },
        60s))
        << "Prometheus did not get ready: " << PrometheusLog();
  }
  // The job's worker pods as scrape targets, labelled as a PodMonitor would label them.
  void WritePodTargets() {
    json targets = json::array();
    const std::string out = Kubectl({"get", "pods", "-o",
                                     "jsonpath={range .items[*]}{.metadata.name} "
                                     "{.status.podIP} {.metadata.namespace}{\"\\n\"}{end}"})
                                .out;
    std::istringstream lines(out);
    std::string name, ip, ns;
    while (lines >> name >> ip >> ns)
      targets.push_back(
          {{"targets", {ip + ":9090"}}, {"labels", {{"pod", name}, {"namespace", ns}}}});
    const fs::path file = dir_ / "worker-targets.json";
    std::ofstream(file.string() + ".tmp") << targets.dump();
    fs::rename(file.string() + ".tmp", file);  // Prometheus never reads half a file
  }
  StatusOr<http::Response> Get(const std::string& target) {
    http::ClientOptions options;
    options.origin = {"http", "127.0.0.1", prometheus_port_};
    options.connect_timeout = 2s;
    options.request_timeout = 20s;
    TIDAL_ASSIGN_OR_RETURN(auto client, http::Client::Create(options));
    http::Request request;
    request.method = "GET";
    request.target = target;
    return client->Send(request);
  }
  // An instant query's result vector (`data.result`); a failed query fails the test.
  json Query(const std::string& promql) {
    auto r = Get("/api/v1/query?query=" + UrlEncode(promql));
    EXPECT_TRUE(r.ok() && r->status == 200)
        << promql << ": " << (r.ok() ? r->body : r.status().ToString());
    if (!r.ok()) return json::array();
    json body = json::parse(r->body, nullptr, false);
    EXPECT_EQ(body.value("status", ""), "success") << promql << ": " << r->body;
    return body.is_object() && body.contains("data") ? body["data"].value("result", json::array())
                                                     : json::array();
  }
  json WaitQuery(const std::string& promql, std::chrono::seconds timeout = 60s) {
    json result;
    OperatorTest::WaitUntilTrue(
        [&] {
          result = Query(promql);
          return !result.empty();
        },
        timeout);
    return result;
  }
  static double ValueOf(const json& result) {
    return std::stod(result.at(0).at("value").at(1).get<std::string>());
  }
  std::string PrometheusLog() {
    std::ifstream in(dir_ / "prometheus.log");
    std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return all.size() > 3000 ? all.substr(all.size() - 3000) : all;
  }

  bool HasEvent(const std::string& reason) {
    return !WaitFor(
                {"events"}, "{.items[*].reason}",
                [&](const std::string& reasons) {
                  return reasons.find(reason) != std::string::npos;
                },
                60s, 500ms)
                .empty() &&
           Ok({"get", "events", "-o", "jsonpath={.items[*].reason}"}).find(reason) !=
               std::string::npos;
  }
  // A range query over the last `seconds`: what a Grafana annotation sees.
  json QueryRange(const std::string& promql, int seconds) {
    const auto now = std::chrono::duration_cast<std::chrono::seconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
    auto r = Get("/api/v1/query_range?query=" + UrlEncode(promql) + "&start=" +
                 std::to_string(now - seconds) + "&end=" + std::to_string(now) + "&step=2");
    EXPECT_TRUE(r.ok() && r->status == 200)
        << promql << ": " << (r.ok() ? r->body : r.status().ToString());
    if (!r.ok()) return json::array();
    json body = json::parse(r->body, nullptr, false);
    return body.is_object() && body.contains("data") ? body["data"].value("result", json::array())
                                                     : json::array();
  }

  std::unique_ptr<Process> prometheus_;
  int prometheus_port_ = 0;
};

// Every expression of the dashboard's panels (`annotations` false) or of its annotations, with
// Grafana's variables as Grafana would substitute them for this job.
std::vector<std::string> DashboardQueries(const std::string& job, bool annotations) {
  std::ifstream in(kCharts + "/tidal-dashboard.json");
  json dashboard = json::parse(in);
  std::vector<std::string> out;
  auto substitute = [&](std::string e) {
    e = std::regex_replace(e, std::regex(R"(\$namespace)"), "default");
    e = std::regex_replace(e, std::regex(R"(\$trainingjob)"), job);
    e = std::regex_replace(e, std::regex(R"(\$__rate_interval)"), "30s");
    return e;
  };
  if (annotations) {
    for (const json& a : dashboard["annotations"]["list"])
      out.push_back(substitute(a.at("expr").get<std::string>()));
    return out;
  }
  for (const json& panel : dashboard["panels"])
    for (const json& target : panel.value("targets", json::array()))
      out.push_back(substitute(target.at("expr").get<std::string>()));
  return out;
}

TEST_F(ObservabilityTest, PrometheusScrapesTheJobAndEveryDashboardQueryAndAlertRuleRunsOnIt) {
  Ok({"apply", "-f", JobYaml("obs", 2000)});
  WaitInt(
      "obs", "{.status.step}", [](int64_t s) { return s >= 3; }, 120s);
  StartPrometheus();
  // Scraped before the rescale, so that Prometheus sees the generation change.
  ASSERT_FALSE(WaitQuery(R"(tidal_trainingjob_generation{trainingjob="obs"})").empty())
      << PrometheusLog();
  // A rescale, so that the generation panels and the scale-up's histograms have something.
  Ok({"scale", "tj", "obs", "--replicas=4"});
  WaitInt(
      "obs", "{.status.generation}", [](int64_t g) { return g >= 2; }, 120s);
  WritePodTargets();

  // The job's loss, tokens/s and GPU counts, as Prometheus scraped them.
  const json loss = WaitQuery(R"(tidal_worker_loss{trainingjob="obs"})");
  ASSERT_FALSE(loss.empty()) << PrometheusLog();
  EXPECT_GT(ValueOf(loss), 0);
  EXPECT_GT(ValueOf(WaitQuery(R"(tidal_worker_tokens_per_second{trainingjob="obs"})")), 0);
  EXPECT_EQ(ValueOf(WaitQuery(R"(tidal_trainingjob_gpus_current{trainingjob="obs"} == 4)")), 4);
  EXPECT_EQ(ValueOf(WaitQuery(R"(tidal_trainingjob_gpus_desired{trainingjob="obs"})")), 4);
  // All four workers are scraped, and up.
  EXPECT_EQ(ValueOf(WaitQuery(R"(count(up{job="tidal-workers"} == 1) == 4)")), 4)
      << Query("up").dump();
  // Every panel has data once its rate window holds two samples of the 4-GPU generation: each
  // query is asked until it answers (bounded), not after a fixed wait for the windows to fill.
  for (const std::string& expr : DashboardQueries("obs", /*annotations=*/false)) {
    if (expr.find("tidal_worker_gpu_") != std::string::npos) continue;  // below
    EXPECT_FALSE(WaitQuery(expr, 90s).empty()) << "no data for the dashboard's " << expr;
  }
  // CPU workers: no GPU series at all, never a made-up number (asked after the others had
  // data, so with every worker scraped).
  for (const std::string& expr : DashboardQueries("obs", /*annotations=*/false))
    if (expr.find("tidal_worker_gpu_") != std::string::npos)
      EXPECT_TRUE(Query(expr).empty()) << expr << " returned " << Query(expr).dump();
  // Annotations mark moments (a new generation): over the last 3 minutes, the rescale.
  for (const std::string& expr : DashboardQueries("obs", /*annotations=*/true))
    EXPECT_FALSE(QueryRange(expr, 180).empty())
        << "no data for the annotation " << expr << "; the generation over that time: "
        << QueryRange(R"(tidal_trainingjob_generation{trainingjob="obs"})", 180).dump();

  // Every alert rule was evaluated on this data, without error.
  ASSERT_TRUE(OperatorTest::WaitUntilTrue(
      [&] {
        auto r = Get("/api/v1/rules");
        if (!r.ok()) return false;
        json body = json::parse(r->body, nullptr, false);
        if (body.is_discarded()) return false;
        for (const json& group : body["data"]["groups"])
          for (const json& rule : group["rules"])
            if (rule.value("lastEvaluation", "").rfind("0001-", 0) == 0) return false;
        return true;
      },
      30s));
  json rules = json::parse(Get("/api/v1/rules")->body);
  std::set<std::string> names;
  for (const json& group : rules["data"]["groups"])
    for (const json& rule : group["rules"]) {
      names.insert(rule.value("name", ""));
      EXPECT_EQ(rule.value("health", ""), "ok") << rule.dump();
      EXPECT_EQ(rule.value("lastError", ""), "") << rule.dump();
    }
  EXPECT_EQ(names,
            (std::set<std::string>{"TidalTrainingJobLossAnomaly", "TidalTrainingJobStalled",
                                   "TidalTrainingJobRestartingRepeatedly",
                                   "TidalCheckpointsFailing", "TidalTrainingJobBelowDesiredGpus",
                                   "TidalOperatorNoLeader", "TidalCheckpointCorrupt"}));
  // A healthy, growing job raises none of them.
  EXPECT_TRUE(Query("ALERTS").empty()) << Query("ALERTS").dump();
}

// Two jobs of 2 GPUs side by side, both with the rule {15%, 3 steps, Pause}: "rising" reports a
// loss made to rise 20% a step from step 8 (the worker's test hook), "noisy" one that swings
// ±30% around the real loss's running mean every step. Only "rising" is paused; acknowledging its
// step resumes it.
TEST_F(ObservabilityTest, ALossMadeToRisePausesItsJobAndANoisyLossDoesNot) {
  const std::string rule =
      "  anomaly: {lossRisePercent: 15, consecutiveSteps: 3, minGPUUtilPercent: 40, "
      "action: Pause}\n";
  const std::string fixed = "{minGPUs: 2, maxGPUs: 2, cooldownSeconds: 0}";
  Ok({"apply", "-f",
      JobYaml("rising", 2000, rule, fixed, "",
              "{name: TIDAL_TEST_LOSS_HOOK, value: \"rise:8:1.2\"}")});
  Ok({"apply", "-f",
      JobYaml("noisy", 2000, rule, fixed, "",
              "{name: TIDAL_TEST_LOSS_HOOK, value: \"noise:0.3\"}")});
  EXPECT_EQ(WaitFor(
                {"tj", "rising"}, "{.status.phase}",
                [](const std::string& p) { return p == "Paused"; }, 180s),
            "Paused")
      << Status("rising", "{.status}") << LogTail();
  const int64_t at = Int("rising", "{.status.anomaly.step}");
  EXPECT_GE(at, 10) << "the rise begins at step 8";
  EXPECT_EQ(Status("rising", R"({.status.conditions[?(@.type=="LossAnomaly")].status})"), "True");
  const std::string message =
      Status("rising", R"({.status.conditions[?(@.type=="LossAnomaly")].message})");
  EXPECT_NE(message.find("acknowledgedStep\":" + std::to_string(at)), std::string::npos) << message;
  EXPECT_NE(Status("rising", "{.status.anomaly.rule}").find("clause is skipped"), std::string::npos)
      << "CPU workers: the status says the utilisation clause is skipped";
  // Events are recorded once the pass's actions are done (the pause waits for a step).
  EXPECT_TRUE(HasEvent("LossAnomaly")) << Ok({"get", "events"});
  // Held: checkpointed at the step it paused at, and no step is trained while it waits.
  WaitInt(
      "rising", "{.status.lastCheckpoint.step}", [&](int64_t s) { return s >= at; }, 60s);
  const int64_t held = Int("rising", "{.status.step}");
  EXPECT_EQ(Status("rising", "{.status.phase}"), "Paused");

  // The noisy job trained on meanwhile, far past where "rising" stopped, never flagged; and
  // while it trained those 20 steps, "rising" trained none (the noisy job's steps are the
  // clock of that negative, not a fixed wait).
  WaitInt(
      "noisy", "{.status.step}", [&](int64_t s) { return s >= held + 20; }, 180s);
  EXPECT_EQ(Int("rising", "{.status.step}"), held) << "a paused job trained on";
  EXPECT_EQ(Status("rising", "{.status.phase}"), "Paused");
  EXPECT_EQ(Status("noisy", "{.status.phase}"), "Running");
  EXPECT_EQ(Status("noisy", R"({.status.conditions[?(@.type=="LossAnomaly")].status})"), "")
      << Status("noisy", "{.status}");
  // The rule's pass runs on its own period, behind the step: it has looked at the noisy
  // loss at least ten steps past where "rising" stopped, and still not flagged it.
  WaitInt(
      "noisy", "{.status.anomaly.checkedStep}", [&](int64_t s) { return s >= held + 10; }, 60s);
  EXPECT_EQ(Status("noisy", R"({.status.conditions[?(@.type=="LossAnomaly")].status})"), "")
      << Status("noisy", "{.status}");

  // kubectl patch with the step the condition names: it trains again.
  Ok({"patch", "tj", "rising", "--type=merge", "-p",
      R"({"spec":{"anomaly":{"acknowledgedStep":)" + std::to_string(at) + "}}}"});
  WaitInt(
      "rising", "{.status.step}", [&](int64_t s) { return s > held; }, 60s);
  EXPECT_TRUE(HasEvent("Resumed")) << Ok({"get", "events"});
  // Its loss still rises, so the rule pauses it again, at a later step.
  EXPECT_EQ(WaitFor(
                {"tj", "rising"}, "{.status.phase}",
                [](const std::string& p) { return p == "Paused"; }, 120s),
            "Paused");
  EXPECT_GT(Int("rising", "{.status.anomaly.step}"), held);
  // Two jobs side by side on one machine, each rank 0 hosting its store for generation 1
  // on the same port of its own address: neither had to restart (-1: the field is absent).
  EXPECT_LE(Int("rising", "{.status.restarts}"), 0) << Status("rising", "{.status.conditions}");
  EXPECT_LE(Int("noisy", "{.status.restarts}"), 0) << Status("noisy", "{.status.conditions}");
  Ok({"delete", "tj", "rising", "noisy", "--wait=false"});
}

}  // namespace
}  // namespace tidal::testing
