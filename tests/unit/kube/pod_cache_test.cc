// The typed pod cache: what the controller reads of a pod, and only that; indexed by its
// controller owner; updated and emptied by the informer's events.
#include "kube/pod_cache.h"

#include <gtest/gtest.h>

#include <functional>
#include <vector>

namespace tidal::kube {
namespace {

using nlohmann::json;

json WorkerPod(const std::string& name, const std::string& owner_uid) {
  return json::parse(R"({
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": ")" +
                     name + R"(", "namespace": "ml", "uid": "pod-uid",
      "resourceVersion": "42", "labels": {"tidal.dev/slot": "3", "tidal.dev/job": "llama"},
      "annotations": {"tidal.dev/created-for-generation": "7", "note": "big"},
      "ownerReferences": [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "other", "uid": "not-the-controller"},
        {"apiVersion": "tidal.dev/v1alpha1", "kind": "TrainingJob", "name": "llama",
         "uid": ")" + owner_uid +
                     R"(", "controller": true, "blockOwnerDeletion": true}],
      "deletionTimestamp": "2026-11-27T10:00:30Z", "managedFields": [{"manager": "x"}]},
    "spec": {"nodeName": "gpu-1", "priority": 1000,
      "tolerations": [{"key": "spot", "operator": "Exists", "effect": "NoExecute",
                       "tolerationSeconds": 30}],
      "containers": [{"name": "worker", "image": "w",
                      "resources": {"limits": {"nvidia.com/gpu": "2", "memory": "64Gi"}}},
                     {"name": "sidecar", "image": "s",
                      "resources": {"requests": {"nvidia.com/gpu": 1}}}]},
    "status": {"phase": "Failed", "podIP": "10.0.0.9", "hostIP": "192.168.1.1",
      "conditions": [{"type": "Ready", "status": "False"},
                     {"type": "PodScheduled", "status": "True"}],
      "containerStatuses": [{"name": "worker", "state": {"terminated":
        {"reason": "Error", "exitCode": 3, "message": "{\"store\": \"s3://b/k\"}"}}}]}
  })");
}

PodCacheOptions Kept() {
  PodCacheOptions o;
  o.labels = {"tidal.dev/slot", "tidal.dev/role"};
  o.annotations = {"tidal.dev/created-for-generation"};
  return o;
}

TEST(PodCacheTest, ACachedPodHoldsWhatTheControllerReadsTyped) {
  const CachedPod p = CachedPodOf(WorkerPod("llama-worker-3", "job-uid"), Kept());
  EXPECT_EQ(p.namespace_, "ml");
  EXPECT_EQ(p.name, "llama-worker-3");
  EXPECT_EQ(p.controller_uid, "job-uid") << "the controller reference, not the first one";
  EXPECT_EQ(p.Label("tidal.dev/slot"), "3");
  EXPECT_EQ(p.Label("tidal.dev/job"), "") << "a label nobody asked for is not kept";
  EXPECT_EQ(p.labels.size(), 1u);
  EXPECT_EQ(p.Annotation("tidal.dev/created-for-generation"), "7");
  EXPECT_EQ(p.annotations.size(), 1u);
  EXPECT_TRUE(p.deleting);
  ASSERT_TRUE(p.deletion_deadline);
  EXPECT_EQ(p.node_name, "gpu-1");
  ASSERT_EQ(p.tolerations.size(), 1u);
  EXPECT_EQ(p.tolerations[0], (PodToleration{"spot", "Exists", "", "NoExecute", 30}));
  EXPECT_EQ(p.gpu_request, 3) << "limits of one container, requests of the other";
  EXPECT_EQ(p.priority, 1000);
  EXPECT_EQ(p.phase, PodPhase::kFailed);
  EXPECT_TRUE(p.Finished());
  EXPECT_EQ(p.ip, "10.0.0.9");
  EXPECT_FALSE(p.ready);
  EXPECT_EQ(p.not_running_reason, "Error (exit code 3)");
  EXPECT_EQ(p.termination_message, R"({"store": "s3://b/k"})");
}

TEST(PodCacheTest, WhyAPodDoesNotRunComesFromTheSchedulerOrItsContainer) {
  json pending = WorkerPod("p", "u");
  pending["status"] = json::parse(R"({"phase": "Pending", "conditions": [
      {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
       "message": "0/3 nodes are available"}]})");
  EXPECT_EQ(CachedPodOf(pending).not_running_reason, "Unschedulable: 0/3 nodes are available");
  json waiting = WorkerPod("p", "u");
  waiting["status"] = json::parse(R"({"phase": "Pending", "containerStatuses": [
      {"name": "worker", "state": {"waiting": {"reason": "ImagePullBackOff"}}}]})");
  EXPECT_EQ(CachedPodOf(waiting).not_running_reason, "ImagePullBackOff");
  json running = WorkerPod("p", "u");
  running["metadata"].erase("deletionTimestamp");
  running["status"] = json::parse(R"({"phase": "Running", "conditions": [
      {"type": "Ready", "status": "True"}], "containerStatuses": [
      {"name": "worker", "state": {"running": {"startedAt": "2026-11-27T10:00:00Z"}}}]})");
  const CachedPod r = CachedPodOf(running);
  EXPECT_EQ(r.not_running_reason, "");
  EXPECT_TRUE(r.ready);
  EXPECT_FALSE(r.deleting);
  // Fields of an unexpected shape take their defaults; nothing throws.
  const CachedPod odd = CachedPodOf(json::parse(R"({"metadata": {"name": 5, "labels": []},
      "spec": {"containers": "none", "tolerations": {}}, "status": {"phase": 1}})"));
  EXPECT_EQ(odd.name, "");
  EXPECT_EQ(odd.phase, PodPhase::kPending);
  EXPECT_EQ(odd.gpu_request, 0);
}

TEST(PodCacheTest, TheInformerKeepsOnlyThePodsIdentityAndControllerOwner) {
  json pod = WorkerPod("llama-worker-3", "job-uid");
  KeepIdentity(pod);
  EXPECT_EQ(pod, json::parse(R"({"metadata": {"name": "llama-worker-3", "namespace": "ml",
      "ownerReferences": [{"kind": "TrainingJob", "name": "llama", "uid": "job-uid",
                           "controller": true}]}})"));
  json orphan = {{"metadata", {{"name", "x"}, {"namespace", "ml"}}}, {"spec", json::object()}};
  KeepIdentity(orphan);
  EXPECT_EQ(orphan, json::parse(R"({"metadata": {"name": "x", "namespace": "ml"}})"));
}

// The Secrets cache keeps what the controller reads of a Secret (its data) beside its identity;
// the Services and ConfigMaps caches only the identity.
TEST(PodCacheTest, ASecretKeepsItsDataBesideItsIdentityAndNothingElse) {
  json secret = json::parse(R"({"metadata": {"name": "llama-token", "namespace": "ml",
      "labels": {"a": "b"}, "resourceVersion": "7", "ownerReferences": [{"kind": "TrainingJob",
      "name": "llama", "uid": "u", "controller": true}]}, "type": "Opaque",
      "data": {"token": "c2VjcmV0"}})");
  KeepIdentityAndData(secret);
  EXPECT_EQ(secret, json::parse(R"({"metadata": {"name": "llama-token", "namespace": "ml",
      "ownerReferences": [{"kind": "TrainingJob", "name": "llama", "uid": "u",
                           "controller": true}]}, "data": {"token": "c2VjcmV0"}})"));
  json empty = {{"metadata", {{"name", "x"}, {"namespace", "ml"}}}};
  KeepIdentityAndData(empty);
  EXPECT_EQ(empty, json::parse(R"({"metadata": {"name": "x", "namespace": "ml"}})"))
      << "no data: none made up";
}

TEST(PodCacheTest, EventsAddReplaceAndRemovePodsAndTheirControllerIndex) {
  PodCache cache(Kept());
  ASSERT_TRUE(cache.Apply(ObjectEvent::kAdded, WorkerPod("a", "job-1")));
  cache.Apply(ObjectEvent::kAdded, WorkerPod("b", "job-1"));
  cache.Apply(ObjectEvent::kAdded, WorkerPod("c", "job-2"));
  EXPECT_EQ(cache.size(), 3u);
  ASSERT_EQ(cache.ByController("job-1").size(), 2u);
  EXPECT_EQ(cache.ByController("job-1")[0]->name, "a");
  EXPECT_EQ(cache.ByController("job-1")[1]->name, "b");
  // An update that moves the pod to another owner moves it in the index too.
  json moved = WorkerPod("b", "job-2");
  moved["status"]["phase"] = "Running";
  const auto updated = cache.Apply(ObjectEvent::kModified, moved);
  ASSERT_TRUE(updated);
  EXPECT_EQ(updated->phase, PodPhase::kRunning);
  EXPECT_EQ(cache.Get("ml", "b")->phase, PodPhase::kRunning);
  EXPECT_EQ(cache.ByController("job-1").size(), 1u);
  EXPECT_EQ(cache.ByController("job-2").size(), 2u);
  // A deletion carries only metadata when a relist finds it: that is enough.
  EXPECT_FALSE(
      cache.Apply(ObjectEvent::kDeleted, {{"metadata", {{"name", "a"}, {"namespace", "ml"}}}}));
  EXPECT_EQ(cache.Get("ml", "a"), nullptr);
  EXPECT_TRUE(cache.ByController("job-1").empty());
  EXPECT_FALSE(
      cache.Apply(ObjectEvent::kDeleted, {{"metadata", {{"name", "zz"}, {"namespace", "ml"}}}}))
      << "an unknown pod's deletion changes nothing";
  EXPECT_EQ(cache.size(), 2u);
}

// The controller's predicate for pod updates: only a change of what it reads of a pod wakes the
// pod's job. Apply hands back the pod as cached before, to compare with.
TEST(PodCacheTest, AnUpdateOfWhatTheControllerDoesNotReadLeavesTheCachedPodEqual) {
  PodCache cache(Kept());
  cache.Apply(ObjectEvent::kAdded, WorkerPod("a", "job-1"));
  json touched = WorkerPod("a", "job-1");
  touched["metadata"]["resourceVersion"] = "43";
  touched["metadata"]["annotations"]["note"] = "bigger";
  touched["metadata"]["labels"]["tidal.dev/job"] = "renamed";
  touched["status"]["hostIP"] = "192.168.1.2";
  touched["status"]["conditions"][1]["lastTransitionTime"] = "2026-11-27T10:00:31Z";
  std::shared_ptr<const CachedPod> before;
  std::shared_ptr<const CachedPod> after = cache.Apply(ObjectEvent::kModified, touched, &before);
  ASSERT_TRUE(before && after);
  EXPECT_EQ(*before, *after);
  for (const auto& change : std::vector<std::function<void(json&)>>{
           [](json& p) { p["status"]["podIP"] = "10.0.0.10"; },
           [](json& p) { p["status"]["phase"] = "Running"; },
           [](json& p) { p["status"]["conditions"][0]["status"] = "True"; },
           [](json& p) { p["metadata"]["deletionTimestamp"] = "2026-11-27T10:01:00Z"; },
           [](json& p) { p["metadata"]["annotations"]["tidal.dev/created-for-generation"] = "8"; },
           [](json& p) { p["spec"]["nodeName"] = "gpu-2"; },
           [](json& p) {
             p["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] = 4;
           },
       }) {
    json changed = touched;
    change(changed);
    after = cache.Apply(ObjectEvent::kModified, changed, &before);
    ASSERT_TRUE(before && after);
    EXPECT_NE(*before, *after) << changed.dump();
    cache.Apply(ObjectEvent::kModified, touched);
  }
  // A pod first seen in an update has no "before": it wakes its job.
  after = cache.Apply(ObjectEvent::kModified, WorkerPod("new", "job-1"), &before);
  EXPECT_FALSE(before);
  EXPECT_TRUE(after);
}

}  // namespace
}  // namespace tidal::kube
