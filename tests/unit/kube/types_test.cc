// Typed views of built-in kinds: the fields Tidal uses read and written, every other field kept
// through a read-modify-write, and wrong types refused naming the field.
#include "kube/types.h"

#include <gtest/gtest.h>

namespace tidal::kube {
namespace {

using nlohmann::json;

json WorkerPod() {
  return json::parse(R"({
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "w-0", "namespace": "ml", "labels": {"tidal.dev/job": "j"}},
    "spec": {
      "nodeName": "gpu-1", "restartPolicy": "Never", "terminationGracePeriodSeconds": 60,
      "schedulerName": "volcano",
      "containers": [{
        "name": "worker", "image": "ghcr.io/tidal-dev/tidal-worker:0.1",
        "args": ["--config", "/etc/tidal/job.json"],
        "env": [{"name": "RANK", "value": "0"},
                {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "t", "key": "k"}}}],
        "ports": [{"name": "grpc", "containerPort": 50051, "protocol": "TCP"}],
        "resources": {"limits": {"nvidia.com/gpu": "2", "memory": "64Gi"}},
        "securityContext": {"runAsNonRoot": true}
      }]
    },
    "status": {
      "phase": "Running", "podIP": "10.0.0.7",
      "conditions": [{"type": "Ready", "status": "True", "lastProbeTime": null}],
      "containerStatuses": [{"name": "worker", "ready": true, "restartCount": 1,
                             "state": {"running": {"startedAt": "2026-11-23T10:00:00Z"}},
                             "lastState": {"terminated": {"exitCode": 137}}}]
    }
  })");
}

TEST(TypesTest, PodReadsWhatTheOperatorUsesAndRoundTripsEverythingElse) {
  auto pod = PodFromJson(WorkerPod());
  ASSERT_TRUE(pod.ok()) << pod.status().message();
  EXPECT_EQ(pod->node_name, "gpu-1");
  EXPECT_EQ(pod->phase, PodPhase::kRunning);
  EXPECT_EQ(pod->termination_grace_period_seconds, 60);
  ASSERT_EQ(pod->containers.size(), 1u);
  EXPECT_EQ(pod->containers[0].ports[0].container_port, 50051);
  EXPECT_EQ(pod->GpuRequest(), 2);
  EXPECT_TRUE(pod->Ready());
  EXPECT_EQ(pod->container_statuses[0].state, "running");
  EXPECT_EQ(pod->container_statuses[0].restart_count, 1);
  EXPECT_EQ(ToJson(*pod), WorkerPod());  // nothing lost, nothing added

  pod->containers[0].env[0].value = "3";
  pod->metadata.labels["tidal.dev/generation"] = "2";
  json written = ToJson(*pod);
  EXPECT_EQ(written["spec"]["containers"][0]["env"][0]["value"], "3");
  EXPECT_EQ(written["spec"]["containers"][0]["env"][1]["valueFrom"]["secretKeyRef"]["key"], "k");
  EXPECT_EQ(written["spec"]["schedulerName"], "volcano");
  EXPECT_EQ(written["spec"]["containers"][0]["securityContext"]["runAsNonRoot"], true);
  EXPECT_EQ(written["metadata"]["labels"]["tidal.dev/generation"], "2");
}

TEST(TypesTest, WrongTypesAreRefusedNamingTheField) {
  json pod = WorkerPod();
  pod["spec"]["containers"][0]["ports"][0]["containerPort"] = "50051";
  EXPECT_EQ(PodFromJson(pod).status().message(),
            R"(spec.containers[0].ports[0].containerPort: expected an integer, got "50051")");
  pod = WorkerPod();
  pod["spec"]["containers"] = json::object();
  EXPECT_EQ(PodFromJson(pod).status().message(), "spec.containers: expected a list, got {}");
  pod = WorkerPod();
  pod["status"]["containerStatuses"][0]["ready"] = "yes";
  EXPECT_EQ(PodFromJson(pod).status().message(),
            R"(status.containerStatuses[0].ready: expected true or false, got "yes")");
  EXPECT_FALSE(SecretFromJson({{"data", {{"k", "not base64!"}}}}).ok());
  EXPECT_EQ(SecretFromJson({{"data", {{"k", "not base64!"}}}}).status().message(),
            "data.k: expected base64");
  EXPECT_FALSE(NodeFromJson({{"spec", {{"unschedulable", 1}}}}).ok());
  // An integer beyond its field's type is refused, not wrapped.
  pod = WorkerPod();
  pod["spec"]["containers"][0]["ports"][0]["containerPort"] = 4294967297;
  EXPECT_EQ(PodFromJson(pod).status().message(),
            "spec.containers[0].ports[0].containerPort: expected an integer, got 4294967297");
}

TEST(TypesTest, SecretCarriesDecodedBytesAndWritesBase64) {
  auto secret = SecretFromJson({{"apiVersion", "v1"},
                                {"kind", "Secret"},
                                {"metadata", {{"name", "s3"}}},
                                {"type", "Opaque"},
                                {"data", {{"AWS_ACCESS_KEY_ID", "QUtJREVYQU1QTEU="}}}});
  ASSERT_TRUE(secret.ok());
  EXPECT_EQ(secret->data["AWS_ACCESS_KEY_ID"], "AKIDEXAMPLE");
  secret->data["token"] = std::string("\x00\xff", 2);
  EXPECT_EQ(ToJson(*secret)["data"]["token"], "AP8=");
}

TEST(TypesTest, NodeGpusServiceAndConfigMap) {
  auto node = NodeFromJson({{"metadata", {{"name", "n"}}},
                            {"status",
                             {{"allocatable", {{"nvidia.com/gpu", "8"}, {"cpu", "16"}}},
                              {"conditions", {{{"type", "Ready"}, {"status", "True"}}}}}}});
  ASSERT_TRUE(node.ok());
  EXPECT_EQ(node->AllocatableGpus(), 8);
  EXPECT_TRUE(node->Ready());
  node->allocatable["nvidia.com/gpu"] = "0.5";
  EXPECT_EQ(node->AllocatableGpus(), 0);

  Service svc;
  svc.metadata.name = "job-workers";
  svc.cluster_ip = "None";
  svc.selector = {{"tidal.dev/job", "j"}};
  svc.publish_not_ready_addresses = true;
  svc.ports.push_back({"grpc", "TCP", 50051, {{"targetPort", "grpc"}}});
  json j = ToJson(svc);
  EXPECT_EQ(j["apiVersion"], "v1");
  EXPECT_EQ(j["kind"], "Service");
  EXPECT_EQ(j["spec"]["clusterIP"], "None");
  EXPECT_EQ(j["spec"]["ports"][0]["targetPort"], "grpc");
  auto back = ServiceFromJson(j);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(ToJson(*back), j);

  auto cm = ConfigMapFromJson({{"metadata", {{"name", "c"}}}, {"data", {{"a", "b"}}}});
  ASSERT_TRUE(cm.ok());
  EXPECT_EQ(cm->data.at("a"), "b");
}

// The taint manager's matching: Exists (an empty key: every taint) or Equal on the value; an
// empty effect matches every effect; of several matching tolerations the first counts, with
// its tolerationSeconds or for good (upstream's GetMatchingTolerations).
TEST(TypesTest, TolerationsMatchTaintsAndTheFirstMatchingOneCounts) {
  auto node = NodeFromJson(json::parse(R"({"metadata": {"name": "n1"}, "spec": {"taints": [
      {"key": "spot", "value": "true", "effect": "NoExecute", "timeAdded": "2026-11-27T06:00:00Z"},
      {"key": "gpu", "effect": "NoSchedule"}, 7]}})"));
  ASSERT_TRUE(node.ok()) << node.status().message();
  ASSERT_EQ(node->taints.size(), 2u);
  EXPECT_EQ(node->taints[0].time_added, "2026-11-27T06:00:00Z");
  const Taint spot = node->taints[0];
  auto pod = [](const char* tolerations) {
    return nlohmann::json::parse(std::string(R"({"spec": {"tolerations": )") + tolerations + "}}");
  };
  EXPECT_FALSE(TolerationOf(pod("[]"), spot).tolerated);
  EXPECT_FALSE(TolerationOf(pod(R"([{"key": "spot", "value": "false"}])"), spot).tolerated);
  EXPECT_FALSE(
      TolerationOf(pod(R"([{"key": "spot", "value": "true", "effect": "NoSchedule"}])"), spot)
          .tolerated);
  const Toleration forever = TolerationOf(pod(R"([{"key": "spot", "value": "true"}])"), spot);
  EXPECT_TRUE(forever.tolerated);
  EXPECT_FALSE(forever.seconds);
  const Toleration brief = TolerationOf(pod(R"([{"key": "other", "operator": "Exists"},
             {"key": "spot", "operator": "Exists", "tolerationSeconds": 30},
             {"key": "spot", "value": "true", "effect": "NoExecute", "tolerationSeconds": 5}])"),
                                        spot);
  EXPECT_TRUE(brief.tolerated);
  EXPECT_EQ(brief.seconds, 30);
  const Toleration everything = TolerationOf(
      pod(R"([{"operator": "Exists"}, {"key": "spot", "operator": "Exists", "tolerationSeconds": 5}])"),
      spot);
  EXPECT_TRUE(everything.tolerated);
  EXPECT_FALSE(everything.seconds);
}

TEST(TypesTest, CrdAndStatus) {
  json crd_json = {
      {"apiVersion", "apiextensions.k8s.io/v1"},
      {"kind", "CustomResourceDefinition"},
      {"metadata", {{"name", "trainingjobs.tidal.dev"}}},
      {"spec",
       {{"group", "tidal.dev"},
        {"scope", "Namespaced"},
        {"names", {{"kind", "TrainingJob"}, {"plural", "trainingjobs"}, {"shortNames", {"tj"}}}},
        {"versions",
         {{{"name", "v1alpha1"},
           {"served", true},
           {"storage", true},
           {"schema", {{"openAPIV3Schema", {{"type", "object"}}}}}}}}}},
      {"status", {{"conditions", {{{"type", "Established"}, {"status", "True"}}}}}}};
  auto crd = CrdFromJson(crd_json);
  ASSERT_TRUE(crd.ok()) << crd.status().message();
  EXPECT_EQ(crd->short_names, std::vector<std::string>{"tj"});
  EXPECT_TRUE(crd->Established());
  EXPECT_EQ(ToJson(*crd), crd_json);

  auto status = ApiStatusFromJson(json::parse(R"({"kind":"Status","apiVersion":"v1",
    "status":"Failure","message":"invalid","reason":"Invalid","code":422,
    "details":{"causes":[{"reason":"FieldValueInvalid","message":"bad","field":"spec.x"}]}})"));
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->code, 422);
  ASSERT_EQ(status->causes.size(), 1u);
  EXPECT_EQ(status->causes[0].field, "spec.x");
}

TEST(TypesTest, APodPhaseReadsAsItsEnumAndOneThisBuildDoesNotKnowIsUnknown) {
  EXPECT_EQ(ParsePodPhase(""), PodPhase::kPending);  // no kubelet has reported on it
  for (PodPhase p : {PodPhase::kPending, PodPhase::kRunning, PodPhase::kSucceeded,
                     PodPhase::kFailed, PodPhase::kUnknown})
    EXPECT_EQ(ParsePodPhase(PodPhaseName(p)), p) << PodPhaseName(p);
  EXPECT_EQ(ParsePodPhase("Hibernating"), PodPhase::kUnknown);
  EXPECT_EQ(ParsePodPhase("running"), PodPhase::kUnknown);  // the API's values are case-sensitive
}

}  // namespace
}  // namespace tidal::kube
