// The real helm against `tidal local`: a chart with the kinds an operator chart creates
// (ServiceAccount, RBAC, Deployment, Service, ConfigMap, PodDisruptionBudget, a CRD from
// crds/ and a custom resource) installs, upgrades, rejects a schema violation, and uninstalls.
// Helm keeps its releases in Secrets written as protobuf, so this also covers that path.
#include <gtest/gtest.h>

#include <regex>

#include "tests/e2e/local/kubectl_fixture.h"

namespace tidal::testing {
namespace {

class HelmTest : public KubectlTest {
 protected:
  const std::string chart_ = kFixtures + "/sample-chart";
};

TEST_F(HelmTest, InstallUpgradeAndUninstallAChartWithCrdsRbacAndWorkloads) {
  EXPECT_NE(HelmOk({"install", "rel", chart_}).find("STATUS: deployed"), std::string::npos);
  std::string created = Ok({"get",
                            "sa,clusterrole,clusterrolebinding,role,rolebinding,deployment,service,"
                            "configmap,pdb,widgets",
                            "-o", "name"});
  for (const char* want :
       {"serviceaccount/rel-operator", "clusterrole.rbac.authorization.k8s.io/rel-operator",
        "clusterrolebinding.rbac.authorization.k8s.io/rel-operator",
        "role.rbac.authorization.k8s.io/rel-leases",
        "rolebinding.rbac.authorization.k8s.io/rel-leases", "deployment.apps/rel-operator",
        "service/rel-metrics", "configmap/rel-dashboard", "poddisruptionbudget.policy/rel-operator",
        "widget.test.tidal.dev/rel-widget"})
    EXPECT_NE(created.find(want), std::string::npos) << want << " missing from\n" << created;
  EXPECT_EQ(Ok({"get", "wd", "rel-widget", "-o", "jsonpath={.spec.replicas} {.spec.color}"}),
            "3 green");  // the chart's value, the CRD's default
  EXPECT_TRUE(std::regex_search(HelmOk({"list"}), std::regex("rel\\s+default\\s+1\\s+.*deployed")));

  HelmOk({"upgrade", "rel", chart_, "--set", "widgetReplicas=5"});
  EXPECT_EQ(Ok({"get", "wd", "rel-widget", "-o", "jsonpath={.spec.replicas}"}), "5");
  EXPECT_TRUE(std::regex_search(HelmOk({"history", "rel"}), std::regex("2\\s+.*deployed")));

  // A value the CRD schema refuses fails the install with the API server's message.
  ProcessResult bad = Helm({"install", "bad", chart_, "--set", "widgetReplicas=-1"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("spec.replicas"), std::string::npos) << bad.err;

  EXPECT_NE(HelmOk({"uninstall", "rel"}).find("uninstalled"), std::string::npos);
  EXPECT_EQ(Ok({"get", "deployment,service,sa,widgets", "-l", "app.kubernetes.io/instance=rel",
                "-o", "name"}),
            "");
  EXPECT_EQ(Ok({"get", "secrets", "-l", "owner=helm,name=rel", "-o", "name"}), "");
}

}  // namespace
}  // namespace tidal::testing
