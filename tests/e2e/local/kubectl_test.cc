// The real kubectl against `tidal local`, driven as a user would, checking what it prints.
// Each test starts its own `tidal local` on a free port in a fresh directory.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include "tests/e2e/local/kubectl_fixture.h"
#include "tests/test_paths.h"

namespace tidal::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

TEST_F(KubectlTest, AppliesCrdAndCustomResourceThenGetsWithColumnsYamlAndLabels) {
  ApplyWidgetKind();
  EXPECT_EQ(Ok({"apply", "-f", kFixtures + "/widget.yaml"}),
            "widget.test.tidal.dev/demo created\n");
  EXPECT_EQ(Ok({"apply", "-f", kFixtures + "/widget.yaml"}),
            "widget.test.tidal.dev/demo unchanged\n");
  std::string table = Ok({"get", "widgets"});
  EXPECT_TRUE(std::regex_search(table, std::regex("NAME +REPLICAS +COLOR +PHASE +AGE")));
  EXPECT_TRUE(std::regex_search(table, std::regex("demo +2 +green")));  // schema default
  std::string yaml = Ok({"get", "wd", "demo", "-o", "yaml"});
  EXPECT_NE(yaml.find("color: green"), std::string::npos);
  EXPECT_NE(yaml.find("generation: 1"), std::string::npos);
  EXPECT_NE(yaml.find("uid: "), std::string::npos);
  WriteFile("other.yaml",
            "apiVersion: test.tidal.dev/v1\nkind: Widget\nmetadata: {name: other, labels: {team: "
            "web}}\nspec: {replicas: 1}\n");
  Ok({"apply", "-f", (dir_ / "other.yaml").string()});
  EXPECT_EQ(Ok({"get", "wd", "-l", "team=ml", "-o", "name"}), "widget.test.tidal.dev/demo\n");
  EXPECT_EQ(Ok({"get", "wd", "-l", "team!=ml", "-o", "name"}), "widget.test.tidal.dev/other\n");
  std::string described = Ok({"describe", "wd", "demo"});
  EXPECT_NE(described.find("Replicas:  2"), std::string::npos) << described;
  EXPECT_NE(Ok({"api-resources"}).find("widgets"), std::string::npos);
}

TEST_F(KubectlTest, ScalePatchAndEditChangeSpecAndBumpGeneration) {
  ApplyWidgetKind();
  Ok({"apply", "-f", kFixtures + "/widget.yaml"});
  EXPECT_EQ(Ok({"scale", "wd", "demo", "--replicas=5"}), "widget.test.tidal.dev/demo scaled\n");
  EXPECT_EQ(Ok({"get", "wd", "demo", "-o", "jsonpath={.spec.replicas} {.metadata.generation}"}),
            "5 2");
  // --current-replicas goes through GET + PUT of the Scale with its resourceVersion.
  EXPECT_EQ(Kubectl({"scale", "wd", "demo", "--current-replicas=3", "--replicas=4"}).exit_code, 1);
  Ok({"scale", "wd", "demo", "--current-replicas=5", "--replicas=6"});
  Ok({"patch", "wd", "demo", "--type=merge", "-p", R"({"spec":{"color":"red"}})"});
  // A status write through the subresource leaves the generation alone.
  Ok({"patch", "wd", "demo", "--subresource=status", "--type=merge", "-p",
      R"({"status":{"phase":"Running","replicas":6}})"});
  EXPECT_EQ(Ok({"get", "wd", "demo", "-o",
                "jsonpath={.spec.color} {.status.phase} {.metadata.generation}"}),
            "red Running 4");
  std::string editor =
      WriteFile("editor.sh", "#!/bin/sh\nsed -i 's/replicas: 6/replicas: 9/' \"$1\"\n");
  fs::permissions(editor, fs::perms::owner_all);
  EXPECT_EQ(Ok({"edit", "wd", "demo"}, {"KUBE_EDITOR=" + editor}),
            "widget.test.tidal.dev/demo edited\n");
  EXPECT_EQ(Ok({"get", "wd", "demo", "-o", "jsonpath={.spec.replicas}"}), "9");
}

TEST_F(KubectlTest, WatchPrintsEachChangeAsARow) {
  ApplyWidgetKind();
  Ok({"apply", "-f", kFixtures + "/widget.yaml"});
  Process watch({"/usr/bin/env", KUBECTL_BIN, "--kubeconfig=" + (dir_ / "data/kubeconfig").string(),
                 "--cache-dir=" + (dir_ / "kube-cache").string(), "get", "wd", "-w"});
  ASSERT_TRUE(watch.WaitForOutput(
      [](const std::string& out) { return out.find("demo") != std::string::npos; }, 30s));
  Ok({"scale", "wd", "demo", "--replicas=7"});
  EXPECT_TRUE(watch.WaitForOutput(
      [](const std::string& out) { return std::regex_search(out, std::regex("demo +7 +green")); },
      30s));
}

TEST_F(KubectlTest, DeleteCascadesToOwnedObjectsAndWaitsForFinalizers) {
  ApplyWidgetKind();
  Ok({"apply", "-f", kFixtures + "/widget.yaml"});
  std::string uid = Ok({"get", "wd", "demo", "-o", "jsonpath={.metadata.uid}"});
  WriteFile("child.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: child\n"
            "  ownerReferences:\n  - {apiVersion: test.tidal.dev/v1, kind: Widget, "
            "name: demo, uid: " +
                uid + "}\ndata: {a: b}\n");
  Ok({"apply", "-f", (dir_ / "child.yaml").string()});
  EXPECT_EQ(Ok({"delete", "wd", "demo"}), "widget.test.tidal.dev \"demo\" deleted\n");
  EXPECT_EQ(Kubectl({"get", "cm", "child"}).exit_code, 1);  // garbage-collected

  // A finalizer holds the object (deletionTimestamp set) until it is removed.
  WriteFile("held.yaml",
            "apiVersion: test.tidal.dev/v1\nkind: Widget\nmetadata: {name: held, "
            "finalizers: [test.tidal.dev/hold]}\nspec: {replicas: 1}\n");
  Ok({"apply", "-f", (dir_ / "held.yaml").string()});
  EXPECT_EQ(Ok({"delete", "wd", "held", "--wait=false"}),
            "widget.test.tidal.dev \"held\" deleted\n");
  EXPECT_NE(Ok({"get", "wd", "held", "-o", "jsonpath={.metadata.deletionTimestamp}"}), "");
  Ok({"patch", "wd", "held", "--type=merge", "-p", R"({"metadata":{"finalizers":null}})"});
  ProcessResult gone = Kubectl({"get", "wd", "held"});
  EXPECT_EQ(gone.exit_code, 1);
  EXPECT_NE(gone.err.find("NotFound"), std::string::npos) << gone.err;
}

TEST_F(KubectlTest, BadInputGetsTheStatusKubectlShowsAndChangesNothing) {
  ApplyWidgetKind();
  Ok({"apply", "-f", kFixtures + "/widget.yaml"});
  std::string before = Ok({"get", "wd", "demo", "-o", "jsonpath={.metadata.resourceVersion}"});

  WriteFile("invalid.yaml",
            "apiVersion: test.tidal.dev/v1\nkind: Widget\nmetadata: {name: demo}\n"
            "spec: {replicas: 100, color: purple, owner: Bad}\n");
  ProcessResult invalid = Kubectl({"apply", "-f", (dir_ / "invalid.yaml").string()});
  EXPECT_EQ(invalid.exit_code, 1);
  EXPECT_NE(invalid.err.find("spec.replicas: Invalid value: 100"), std::string::npos)
      << invalid.err;
  EXPECT_NE(invalid.err.find("spec.color: Unsupported value: \"purple\""), std::string::npos);
  EXPECT_NE(invalid.err.find("spec.owner: Invalid value: \"Bad\""), std::string::npos);

  WriteFile("unknown.yaml",
            "apiVersion: test.tidal.dev/v1\nkind: Widget\nmetadata: {name: demo}\n"
            "spec: {replicas: 1, bogus: 1}\n");
  ProcessResult unknown = Kubectl({"apply", "-f", (dir_ / "unknown.yaml").string()});
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_NE(unknown.err.find("unknown field \"spec.bogus\""), std::string::npos) << unknown.err;

  WriteFile("malformed.yaml", "apiVersion: [\n");
  EXPECT_EQ(Kubectl({"apply", "-f", (dir_ / "malformed.yaml").string()}).exit_code, 1);
  ProcessResult raw_malformed =
      Kubectl({"create", "--raw", "/apis/test.tidal.dev/v1/namespaces/default/widgets", "-f",
               WriteFile("malformed.json", "{\"kind\": ")});
  EXPECT_NE(raw_malformed.exit_code, 0);
  EXPECT_NE(raw_malformed.err.find("BadRequest"), std::string::npos) << raw_malformed.err;

  WriteFile("gadget.yaml", "apiVersion: test.tidal.dev/v1\nkind: Gadget\nmetadata: {name: g}\n");
  EXPECT_EQ(Kubectl({"apply", "--validate=false", "-f", (dir_ / "gadget.yaml").string()}).exit_code,
            1);

  // A stale resourceVersion: 409 Conflict.
  WriteFile("stale.yaml",
            "apiVersion: test.tidal.dev/v1\nkind: Widget\nmetadata: {name: demo, "
            "resourceVersion: \"1\"}\nspec: {replicas: 3}\n");
  ProcessResult stale = Kubectl({"replace", "-f", (dir_ / "stale.yaml").string()});
  EXPECT_EQ(stale.exit_code, 1);
  EXPECT_NE(stale.err.find("Conflict"), std::string::npos) << stale.err;
  EXPECT_NE(stale.err.find("the object has been modified"), std::string::npos);

  // Oversize: over the 3 MiB request limit.
  std::string big =
      "{\"apiVersion\":\"v1\",\"kind\":\"ConfigMap\",\"metadata\":{\"name\":\"big\"},"
      "\"data\":{\"x\":\"" +
      std::string(4 << 20, 'x') + "\"}}";
  ProcessResult oversize = Kubectl({"create", "--raw", "/api/v1/namespaces/default/configmaps",
                                    "-f", WriteFile("big.json", big)});
  EXPECT_NE(oversize.exit_code, 0);
  EXPECT_NE(oversize.err.find("RequestEntityTooLarge"), std::string::npos) << oversize.err;
  EXPECT_EQ(Kubectl({"get", "cm", "big"}).exit_code, 1);

  EXPECT_EQ(Ok({"get", "wd", "demo", "-o", "jsonpath={.metadata.resourceVersion}"}), before);
  EXPECT_EQ(Ok({"get", "wd", "-o", "name"}), "widget.test.tidal.dev/demo\n");
}

TEST_F(KubectlTest, CallsWithoutTheTokenAreRejected) {
  ProcessResult r = Kubectl({"--token=wrong", "get", "namespaces"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("You must be logged in to the server"), std::string::npos) << r.err;
  EXPECT_NE(Ok({"get", "namespaces"}).find("default"), std::string::npos);
}

TEST_F(KubectlTest, ObjectsSurviveKillNineWithTheirResourceVersions) {
  ApplyWidgetKind();
  Ok({"apply", "-f", kFixtures + "/widget.yaml"});
  Ok({"scale", "wd", "demo", "--replicas=3"});
  std::string before =
      Ok({"get", "wd", "demo", "-o", "jsonpath={.metadata.resourceVersion} {.spec.replicas}"});
  ::kill(cluster_->pid(), SIGKILL);
  cluster_->Wait(10s);
  StartCluster();  // same directory, same port and credentials
  EXPECT_EQ(
      Ok({"get", "wd", "demo", "-o", "jsonpath={.metadata.resourceVersion} {.spec.replicas}"}),
      before);
  EXPECT_NE(Ok({"get", "crd"}).find("widgets.test.tidal.dev"), std::string::npos);
}

// kubectl's imperative create sends protobuf bodies (client-go typed clients); they decode.
TEST_F(KubectlTest, ImperativeCreateOfSecretsConfigMapsAndNamespacesWorks) {
  EXPECT_EQ(Ok({"create", "namespace", "team-a"}), "namespace/team-a created\n");
  EXPECT_EQ(Ok({"create", "secret", "generic", "s3-creds", "-n", "team-a",
                "--from-literal=AWS_ACCESS_KEY_ID=AKIDEXAMPLE"}),
            "secret/s3-creds created\n");
  EXPECT_EQ(Ok({"get", "secret", "s3-creds", "-n", "team-a", "-o",
                "jsonpath={.type} {.data.AWS_ACCESS_KEY_ID}"}),
            "Opaque QUtJREVYQU1QTEU=");  // the Secret strategy's default type
  EXPECT_EQ(Ok({"create", "configmap", "settings", "--from-literal=mode=fast"}),
            "configmap/settings created\n");
  EXPECT_EQ(Ok({"get", "configmap", "settings", "-o", "jsonpath={.data.mode}"}), "fast");
  ProcessResult again = Kubectl({"create", "configmap", "settings", "--from-literal=mode=slow"});
  EXPECT_EQ(again.exit_code, 1);
  EXPECT_NE(again.err.find("configmaps \"settings\" already exists"), std::string::npos)
      << again.err;
  EXPECT_EQ(Ok({"get", "configmap", "settings", "-o", "jsonpath={.data.mode}"}), "fast");
}

}  // namespace
}  // namespace tidal::testing
