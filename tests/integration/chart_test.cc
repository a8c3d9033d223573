// The Helm chart (charts/tidal) through the real helm: `helm lint --strict`, `helm template`
// with default and non-default values, values.schema.json's answers to bad values, and the
// one-source rule (the CRD, the alert rules and the dashboard are the files the rest of the
// project uses, not copies).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/yaml_json.h"
#include "tests/integration/process.h"
#include "tests/test_paths.h"

namespace tidal::testing {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

const std::string kChart = std::string(TIDAL_SOURCE_DIR) + "/charts/tidal";

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

ProcessResult Helm(std::vector<std::string> args) {
  const std::string home = ::testing::TempDir() + "/chart-test-helm";
  std::vector<std::string> argv = {"/usr/bin/env", "HELM_CACHE_HOME=" + home + "/cache",
                                   "HELM_CONFIG_HOME=" + home + "/config",
                                   "HELM_DATA_HOME=" + home + "/data", HELM_BIN};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunProcess(argv, 60s);
}

// The objects of a multi-document YAML stream, by "Kind/name".
std::map<std::string, json> Objects(const std::string& yaml) {
  std::map<std::string, json> out;
  std::istringstream in(yaml);
  std::string line, doc;
  auto flush = [&] {
    auto j = ParseYaml(doc);
    doc.clear();
    EXPECT_TRUE(j.ok()) << j.status().ToString();
    if (!j.ok() || !j->is_object() || !j->contains("kind")) return;
    out[(*j)["kind"].get<std::string>() + "/" + (*j)["metadata"]["name"].get<std::string>()] = *j;
  };
  while (std::getline(in, line)) {
    if (line == "---") {
      flush();
    } else {
      doc += line + "\n";
    }
  }
  flush();
  return out;
}

std::map<std::string, json> Template(std::vector<std::string> set) {
  std::vector<std::string> args = {"template", "tidal", kChart, "--namespace", "tidal-system"};
  for (const auto& s : set) args.insert(args.end(), {"--set", s});
  ProcessResult r = Helm(args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return Objects(r.out);
}

std::vector<std::string> Strings(const json& array) {
  std::vector<std::string> out;
  for (const auto& v : array) out.push_back(v.get<std::string>());
  return out;
}

TEST(HelmChart, LintsCleanWithStrict) {
  ProcessResult r = Helm({"lint", "--strict", kChart});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("0 chart(s) failed"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("[WARNING]"), std::string::npos) << r.out;
  // And with the non-default values of the next tests.
  r = Helm({"lint", "--strict", kChart, "--set",
            "replicaCount=2,metrics.serviceMonitor.enabled=true,metrics.podMonitor.enabled=true,"
            "prometheusRule.enabled=true,watchNamespace=ml"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
}

TEST(HelmChart, DefaultValuesRenderOneLeaderElectedNonRootOperatorWithReadOnlyRoot) {
  auto objects = Template({});
  for (const char* want :
       {"ServiceAccount/tidal", "ClusterRole/tidal", "ClusterRoleBinding/tidal",
        "Role/tidal-leader-election", "RoleBinding/tidal-leader-election", "Deployment/tidal",
        "Service/tidal-metrics", "ConfigMap/tidal-dashboard"})
    EXPECT_TRUE(objects.count(want)) << want;
  // Off by default: they need the Prometheus Operator's CRDs, or a second replica.
  for (const char* absent : {"ServiceMonitor/tidal", "PodMonitor/tidal-workers",
                             "PrometheusRule/tidal", "PodDisruptionBudget/tidal"})
    EXPECT_FALSE(objects.count(absent)) << absent;

  const json& d = objects["Deployment/tidal"];
  EXPECT_EQ(d["metadata"]["namespace"], "tidal-system");
  EXPECT_EQ(d["spec"]["replicas"], 1);
  const json& pod = d["spec"]["template"]["spec"];
  EXPECT_EQ(pod["serviceAccountName"], "tidal");
  EXPECT_EQ(pod["securityContext"]["runAsNonRoot"], true);
  EXPECT_GT(pod["securityContext"]["runAsUser"].get<int>(), 0);
  const json& c = pod["containers"][0];
  EXPECT_EQ(c["image"], "ghcr.io/tidal-dev/tidal-operator:0.1.0");  // the appVersion
  EXPECT_EQ(Strings(c["args"]), (std::vector<std::string>{"operator", "--metrics-address=:8080"}));
  // The Lease goes where the pod is (also under a kustomize overlay that moves it).
  EXPECT_EQ(c["env"][0]["name"], "POD_NAMESPACE");
  EXPECT_EQ(c["env"][0]["valueFrom"]["fieldRef"]["fieldPath"], "metadata.namespace");
  EXPECT_EQ(c["securityContext"]["readOnlyRootFilesystem"], true);
  EXPECT_EQ(c["securityContext"]["allowPrivilegeEscalation"], false);
  EXPECT_EQ(c["securityContext"]["capabilities"]["drop"], json::array({"ALL"}));
  EXPECT_TRUE(c["resources"]["requests"].contains("cpu"));
  EXPECT_TRUE(c["resources"]["limits"].contains("memory"));
  EXPECT_EQ(c["ports"][0]["containerPort"], 8080);
  EXPECT_EQ(c["livenessProbe"]["httpGet"]["port"], "metrics");

  const json& service = objects["Service/tidal-metrics"];
  EXPECT_EQ(service["spec"]["selector"], d["spec"]["selector"]["matchLabels"]);
  EXPECT_EQ(service["spec"]["ports"][0]["targetPort"], "metrics");
  EXPECT_EQ(objects["Role/tidal-leader-election"]["metadata"]["namespace"], "tidal-system");
  EXPECT_EQ(objects["ConfigMap/tidal-dashboard"]["metadata"]["labels"]["grafana_dashboard"], "1");
}

TEST(HelmChart, NonDefaultValuesRenderTwoReplicasMonitorsRulesAndAOneNamespaceOperator) {
  auto objects = Template(
      {"replicaCount=2", "watchNamespace=ml", "defaultCheckpointRoot=s3://ckpt", "image.tag=1.2.3",
       "metrics.port=9100", "metrics.serviceMonitor.enabled=true",
       "metrics.serviceMonitor.labels.release=kps", "metrics.podMonitor.enabled=true",
       "prometheusRule.enabled=true", "serviceAccount.name=tidal-op", "dashboard.enabled=false"});
  const json& d = objects["Deployment/tidal"];
  EXPECT_EQ(d["spec"]["replicas"], 2);
  const json& pod = d["spec"]["template"]["spec"];
  EXPECT_EQ(pod["serviceAccountName"], "tidal-op");
  EXPECT_EQ(pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
               ["podAffinityTerm"]["topologyKey"],
            "kubernetes.io/hostname");
  const json& c = pod["containers"][0];
  EXPECT_EQ(c["image"], "ghcr.io/tidal-dev/tidal-operator:1.2.3");
  EXPECT_EQ(Strings(c["args"]),
            (std::vector<std::string>{"operator", "--metrics-address=:9100", "--namespace=ml",
                                      "--default-checkpoint-root=s3://ckpt"}));
  EXPECT_TRUE(objects.count("ServiceAccount/tidal-op"));
  EXPECT_EQ(objects["ClusterRoleBinding/tidal"]["subjects"][0]["name"], "tidal-op");
  EXPECT_EQ(objects["PodDisruptionBudget/tidal"]["spec"]["minAvailable"], 1);
  EXPECT_EQ(objects["ServiceMonitor/tidal"]["metadata"]["labels"]["release"], "kps");
  EXPECT_EQ(objects["ServiceMonitor/tidal"]["spec"]["endpoints"][0]["port"], "metrics");
  const json& workers = objects["PodMonitor/tidal-workers"]["spec"];
  EXPECT_EQ(workers["namespaceSelector"]["matchNames"], json::array({"ml"}));
  EXPECT_EQ(workers["selector"]["matchLabels"]["app.kubernetes.io/name"], "tidal-worker");
  EXPECT_FALSE(objects.count("ConfigMap/tidal-dashboard"));

  // A long release name still gives valid names (a Service's is at most 63 characters).
  const std::string long_name(53, 'r');
  ProcessResult r = Helm({"template", long_name, kChart});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const auto& [key, object] : Objects(r.out))
    EXPECT_LE(object["metadata"]["name"].get<std::string>().size(), 63u) << key;

  // Leader election off (one replica): no Lease Role, and the operator is told so.
  auto single = Template({"leaderElection.enabled=false"});
  EXPECT_FALSE(single.count("Role/tidal-leader-election"));
  EXPECT_EQ(
      Strings(single["Deployment/tidal"]["spec"]["template"]["spec"]["containers"][0]["args"]),
      (std::vector<std::string>{"operator", "--metrics-address=:8080", "--no-leader-elect"}));
}

TEST(HelmChart, TheSchemaRejectsBadValuesNamingTheFieldAndWhatItExpected) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"replicaCount=two", "replicaCount: Invalid type. Expected: integer"},
      {"replicaCount=0", "replicaCount: Must be greater than or equal to 1"},
      {"replicaCount=2,leaderElection.enabled=false", "leaderElection.enabled"},
      {"watchNamespace=Team_A", "watchNamespace: Does not match pattern"},
      {"defaultCheckpointRoot=gs://bucket", "defaultCheckpointRoot: Does not match pattern"},
      {"metrics.port=70000", "metrics.port: Must be less than or equal to 65535"},
      {"image.pullPolicy=Sometimes", "image.pullPolicy must be one of the following"},
      {"image.repository=", "image.repository: String length must be greater than or equal to 1"},
      {"metrics.serviceMonitor.interval=soon", "metrics.serviceMonitor.interval: Does not match"},
      {"metrics.service.type=ExternalName", "metrics.service.type must be one of the following"},
      {"replicas=2", "Additional property replicas is not allowed"},
      {"metrics.service.enabled=false,metrics.serviceMonitor.enabled=true",
       "metrics.service.enabled"},
      {"leaderElection.enable=true", "Additional property enable is not allowed"},
      {"dashboard.labels.grafana_dashboard=1",
       "dashboard.labels.grafana_dashboard: Invalid type. Expected: string, given: integer"},
  };
  for (const auto& [set, want] : cases) {
    ProcessResult r = Helm({"template", "tidal", kChart, "--set", set});
    EXPECT_NE(r.exit_code, 0) << set << " was accepted";
    EXPECT_NE(r.err.find("values don't meet the specifications of the schema"), std::string::npos)
        << set << ": " << r.err;
    EXPECT_NE(r.err.find(want), std::string::npos) << set << ": " << r.err;
  }
}

TEST(HelmChart, ShipsTheCrdTheRulesAndTheDashboardFromTheirOneSource) {
  // The CRD: helm's crds/ is the project's crds/.
  ProcessResult crds = Helm({"show", "crds", kChart});
  ASSERT_EQ(crds.exit_code, 0) << crds.err;
  auto shown = ParseYaml(crds.out);
  auto source = ReadYamlFile(std::string(TIDAL_SOURCE_DIR) + "/crds/tidal.dev_trainingjobs.yaml");
  ASSERT_TRUE(shown.ok() && source.ok());
  EXPECT_EQ(*shown, *source);

  auto objects = Template({"prometheusRule.enabled=true"});
  auto rules = ReadYamlFile(kChart + "/files/tidal-rules.yaml");
  ASSERT_TRUE(rules.ok()) << rules.status().ToString();
  EXPECT_EQ(objects["PrometheusRule/tidal"]["spec"], *rules);
  const std::string dashboard = ReadAll(kChart + "/files/tidal-dashboard.json");
  EXPECT_EQ(
      json::parse(
          objects["ConfigMap/tidal-dashboard"]["data"]["tidal-dashboard.json"].get<std::string>()),
      json::parse(dashboard));
  // deploy/ links to the same files for users without the chart.
  EXPECT_EQ(ReadAll(std::string(TIDAL_SOURCE_DIR) + "/deploy/prometheus/tidal-rules.yaml"),
            ReadAll(kChart + "/files/tidal-rules.yaml"));
  EXPECT_EQ(ReadAll(std::string(TIDAL_SOURCE_DIR) + "/deploy/grafana/tidal-dashboard.json"),
            dashboard);
}

}  // namespace
}  // namespace tidal::testing
