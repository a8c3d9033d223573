// What the process kubelet decides from a Pod spec, without processes: scheduling by GPU
// requests, images, env, path translation, restart policy and phase.
#include "local/pod_spec.h"

#include <gtest/gtest.h>

namespace tidal::local {
namespace {

using nlohmann::json;

json GpuPod(const std::string& name, int gpus, const std::string& node = "",
            const std::string& ids = "") {
  json pod = {{"metadata", {{"name", name}, {"namespace", "default"}, {"uid", "uid-" + name}}},
              {"spec",
               {{"containers",
                 {{{"name", "main"},
                   {"image", "busybox"},
                   {"resources", {{"limits", {{"nvidia.com/gpu", std::to_string(gpus)}}}}}}}}}}};
  if (!node.empty()) pod["spec"]["nodeName"] = node;
  if (!ids.empty()) pod["metadata"]["annotations"][kGpuIdsAnnotation] = ids;
  return pod;
}

TEST(ImageTableTest, FindsByExactReferenceThenByRepositoryWithoutTagOrDigest) {
  ImageTable images;
  images.Set("ghcr.io/tidal-dev/tidal-worker", "/opt/tidal-worker");
  images.Set("ghcr.io/tidal-dev/tidal-worker:debug", "/opt/tidal-worker-debug");
  EXPECT_EQ(images.Find("ghcr.io/tidal-dev/tidal-worker:0.1"), "/opt/tidal-worker");
  EXPECT_EQ(images.Find("ghcr.io/tidal-dev/tidal-worker@sha256:abc"), "/opt/tidal-worker");
  EXPECT_EQ(images.Find("ghcr.io/tidal-dev/tidal-worker:debug"), "/opt/tidal-worker-debug");
  EXPECT_EQ(images.Find("busybox:1.36"), "host");
  EXPECT_FALSE(images.Find("nginx").has_value());
  EXPECT_EQ(ImageRepository("localhost:5000/x/y:2"), "localhost:5000/x/y");
  EXPECT_EQ(ImageRepository("localhost:5000/x/y"), "localhost:5000/x/y");
}

TEST(ImageTableTest, RejectsFlagValuesThatAreNotImageEqualsExecutable) {
  ImageTable images;
  EXPECT_NE(images.Add("no-equals").message().find("IMAGE=EXECUTABLE"), std::string::npos);
  EXPECT_FALSE(images.Add("=/bin/sh").ok());
  EXPECT_FALSE(images.Add("img=").ok());
  EXPECT_NE(images.Add("img=/nonexistent/exe").message().find("not an executable"),
            std::string::npos);
  EXPECT_TRUE(images.Add("img=/bin/sh").ok());
  EXPECT_TRUE(images.Add("other=host").ok());
}

TEST(PodGpuRequestTest, SumsContainersTakesLargestInitContainerAndRefusesFractions) {
  json pod = GpuPod("a", 2);
  pod["spec"]["containers"].push_back(
      {{"name", "side"}, {"resources", {{"requests", {{"nvidia.com/gpu", 1}}}}}});
  EXPECT_EQ(*PodGpuRequest(pod), 3);
  pod["spec"]["initContainers"] = {
      {{"name", "init"}, {"resources", {{"limits", {{"nvidia.com/gpu", "4"}}}}}}};
  EXPECT_EQ(*PodGpuRequest(pod), 4);
  pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "0.5";
  auto bad = PodGpuRequest(pod);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("spec.containers[0].resources.limits[nvidia.com/gpu]"),
            std::string::npos);
}

TEST(ScheduleTest, BindsWhereGpusFitPackingTheFullestNodeAndGivesLowestFreeIds) {
  std::vector<NodeInfo> nodes = {{"n0", {}, 8}, {"n1", {}, 8}};
  std::vector<json> pods = {GpuPod("x", 4, "n1", "0,1,2,3"), GpuPod("y", 2, "n0", "1,2")};
  ScheduleResult r = Schedule(GpuPod("new", 2), nodes, pods);
  EXPECT_EQ(r.node, "n1");  // 4 free on n1 < 6 free on n0
  EXPECT_EQ(r.gpu_ids, (std::vector<int>{4, 5}));
  r = Schedule(GpuPod("new", 5), nodes, pods);
  EXPECT_EQ(r.node, "n0");
  EXPECT_EQ(r.gpu_ids, (std::vector<int>{0, 3, 4, 5, 6}));
}

TEST(ScheduleTest, FinishedPodsReleaseTheirGpus) {
  std::vector<NodeInfo> nodes = {{"n0", {}, 4}};
  json done = GpuPod("done", 4, "n0", "0,1,2,3");
  done["status"]["phase"] = "Succeeded";
  EXPECT_EQ(Schedule(GpuPod("new", 4), nodes, {done}).node, "n0");
}

TEST(ScheduleTest, UnschedulableSaysWhyInTheSchedulersWords) {
  std::vector<NodeInfo> nodes = {{"n0", {{"zone", "a"}}, 8}, {"n1", {{"zone", "b"}}, 8}};
  ScheduleResult r = Schedule(GpuPod("huge", 16), nodes, std::vector<json>{});
  EXPECT_TRUE(r.node.empty());
  EXPECT_EQ(r.message, "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.");
  json pinned = GpuPod("pinned", 1);
  pinned["spec"]["nodeSelector"] = {{"zone", "c"}};
  r = Schedule(pinned, nodes, std::vector<json>{});
  EXPECT_EQ(r.message,
            "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector.");
  pinned["spec"]["nodeSelector"] = {{"zone", "b"}};
  EXPECT_EQ(Schedule(pinned, nodes, std::vector<json>{}).node, "n1");
}

// `kubectl cordon` (spec.unschedulable) and `kubectl taint`: kube-scheduler's NodeUnschedulable
// and TaintToleration filters, in its words; PreferNoSchedule does not filter; tolerations
// match by Exists (an empty key: every taint) or Equal, an empty effect matching every effect.
TEST(ScheduleTest, CordonedAndTaintedNodesTakeOnlyPodsThatTolerateThemSayingWhy) {
  std::vector<NodeInfo> nodes = {{"n0", {}, 8}, {"n1", {}, 8}, {"n2", {}, 8}};
  ReadNodeSpec(json::parse(R"({"spec": {"unschedulable": true}})"), nodes[0]);
  ReadNodeSpec(json::parse(R"({"spec": {"taints": [
                 {"key": "cloud.google.com/gke-spot", "value": "true", "effect": "NoSchedule"}]}})"),
               nodes[1]);
  ReadNodeSpec(json::parse(R"({"spec": {"taints": [
                 {"key": "aws.amazon.com/spot-itn", "effect": "NoExecute"},
                 {"key": "soon", "effect": "PreferNoSchedule"}]}})"),
               nodes[2]);
  ScheduleResult r = Schedule(GpuPod("p", 1), nodes, std::vector<json>{});
  EXPECT_TRUE(r.node.empty());
  EXPECT_EQ(r.message,
            "0/3 nodes are available: 1 node(s) had untolerated taint {aws.amazon.com/spot-itn: }, "
            "1 node(s) had untolerated taint {cloud.google.com/gke-spot: true}, 1 node(s) were "
            "unschedulable.");
  struct Case {
    const char* tolerations;
    const char* node;
  } cases[] = {
      {R"([{"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}])",
       "n0"},
      {R"([{"key": "cloud.google.com/gke-spot", "value": "true"}])", "n1"},
      {R"([{"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "false"}])", ""},
      {R"([{"key": "aws.amazon.com/spot-itn", "operator": "Exists", "effect": "NoExecute"}])",
       "n2"},
      {R"([{"key": "aws.amazon.com/spot-itn", "operator": "Exists", "effect": "NoSchedule"}])", ""},
  };
  for (const Case& c : cases) {
    json pod = GpuPod("p", 1);
    pod["spec"]["tolerations"] = json::parse(c.tolerations);
    EXPECT_EQ(Schedule(pod, nodes, std::vector<json>{}).node, c.node) << c.tolerations;
  }
  json everything = GpuPod("p", 1);
  everything["spec"]["tolerations"] = json::parse(R"([{"operator": "Exists"}])");
  EXPECT_FALSE(Schedule(everything, nodes, std::vector<json>{}).node.empty());
  ReadNodeSpec(json::parse(R"({"spec": {}})"), nodes[0]);  // uncordoned
  EXPECT_EQ(Schedule(GpuPod("p", 1), nodes, std::vector<json>{}).node, "n0");
}

// The kubelet builds the usage once per pass and records each bind in it: pods bound in the
// same pass get distinct GPUs, and the node fills up, without another look at every pod.
TEST(ScheduleTest, APassBindsAgainstOneUsageTableUpdatedAsItBinds) {
  std::vector<NodeInfo> nodes = {{"n0", {}, 4}, {"n1", {}, 2}};
  GpuUsage usage;
  json done = GpuPod("done", 2, "n0", "0,1");
  done["status"]["phase"] = "Failed";
  usage.Add(done);                       // finished: holds nothing
  usage.Add(GpuPod("pending", 2));       // unbound: holds nothing
  usage.Add(GpuPod("x", 1, "n1", "1"));  // bound with ids
  usage.Add(GpuPod("manual", 1, "n0"));  // bound without ids
  EXPECT_EQ(usage.ids("n1"), (std::set<int>{1}));
  EXPECT_EQ(usage.unnumbered("n0"), 1);
  std::vector<std::vector<int>> given;
  std::vector<std::string> where;
  for (int i = 0; i < 3; ++i) {
    ScheduleResult r = Schedule(GpuPod("p" + std::to_string(i), 1), nodes, usage);
    where.push_back(r.node);
    given.push_back(r.gpu_ids);
    if (!r.node.empty()) usage.Hold(r.node, r.gpu_ids);
  }
  // n1 (1 free) is fullest first; then n0, whose unnumbered pod is assumed to hold id 0.
  EXPECT_EQ(where, (std::vector<std::string>{"n1", "n0", "n0"}));
  EXPECT_EQ(given, (std::vector<std::vector<int>>{{0}, {1}, {2}}));
  ScheduleResult full = Schedule(GpuPod("big", 2), nodes, usage);
  EXPECT_TRUE(full.node.empty());
  EXPECT_EQ(full.message, "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.");
}

// kube-scheduler's InterPodAffinity score, as the operator's worker pods ask for it (a preferred
// term on the host, weight 100): a node whose topology domain holds a bound pod that matches
// wins over a tighter fit; a match in another namespace, or a term the pod does not carry,
// leaves the tightest fit.
TEST(ScheduleTest, APreferredPodAffinityWinsOverTheTighterFitWhereAMatchingPodRuns) {
  const std::vector<NodeInfo> nodes = {{"n0", {{"kubernetes.io/hostname", "n0"}}, 8},
                                       {"n1", {{"kubernetes.io/hostname", "n1"}}, 8}};
  json mine = GpuPod("mine-0", 2, "n0", "0,1");
  mine["metadata"]["labels"] = {{"tidal.dev/job", "mine"}};
  json other = GpuPod("other-0", 4, "n1", "0,1,2,3");
  other["metadata"]["labels"] = {{"tidal.dev/job", "other"}};
  json next = GpuPod("mine-1", 2);
  next["metadata"]["labels"] = {{"tidal.dev/job", "mine"}};
  next["spec"]["affinity"]["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] =
      json::array({{{"weight", 100},
                    {"podAffinityTerm",
                     {{"labelSelector", {{"matchLabels", {{"tidal.dev/job", "mine"}}}}},
                      {"topologyKey", "kubernetes.io/hostname"}}}}});
  ScheduleResult packed = Schedule(next, nodes, {mine, other});
  EXPECT_EQ(packed.node, "n0") << packed.message;
  EXPECT_EQ(packed.gpu_ids, (std::vector<int>{2, 3}));

  json plain = next;
  plain["spec"].erase("affinity");
  EXPECT_EQ(Schedule(plain, nodes, {mine, other}).node, "n1");  // 4 free is the tighter fit

  json elsewhere = mine;
  elsewhere["metadata"]["namespace"] = "team-b";
  EXPECT_EQ(Schedule(next, nodes, {elsewhere, other}).node, "n1");

  // Where the preferred node has no room, the pod goes where it fits.
  json full = GpuPod("filler", 6, "n0", "2,3,4,5,6,7");
  EXPECT_EQ(Schedule(next, nodes, {mine, other, full}).node, "n1");

  // Pods bound in the same pass count: Hold records them.
  GpuUsage usage;
  usage.Add(other);
  usage.Hold("n0", {0, 1}, mine);
  EXPECT_EQ(Schedule(next, nodes, usage).node, "n0");
}

TEST(ScheduleTest, PodsBoundWithoutIdsStillCountAgainstTheNode) {
  std::vector<NodeInfo> nodes = {{"n0", {}, 4}};
  ScheduleResult r = Schedule(GpuPod("new", 2), nodes, {GpuPod("manual", 3, "n0")});
  EXPECT_TRUE(r.node.empty());
}

TEST(TranslatePathTest, RewritesPathsUnderMountsWholeInFlagsAndInsideShellCommands) {
  std::vector<Mount> mounts = {
      {"/etc/cfg", "/d/pods/u/volumes/cfg"}, {"/etc/cfg/deep", "/d/deep"}, {"/data/", "/mnt/data"}};
  EXPECT_EQ(TranslatePath("/etc/cfg", mounts), "/d/pods/u/volumes/cfg");
  EXPECT_EQ(TranslatePath("/etc/cfg/a.yaml", mounts), "/d/pods/u/volumes/cfg/a.yaml");
  EXPECT_EQ(TranslatePath("/etc/cfg/deep/x", mounts), "/d/deep/x");
  EXPECT_EQ(TranslatePath("--config=/etc/cfg/a.yaml", mounts),
            "--config=/d/pods/u/volumes/cfg/a.yaml");
  EXPECT_EQ(TranslatePath("cat /etc/cfg/a; ls /data/x", mounts),
            "cat /d/pods/u/volumes/cfg/a; ls /mnt/data/x");
  EXPECT_EQ(TranslatePath("/etc/cfgx/a", mounts), "/etc/cfgx/a");
  EXPECT_EQ(TranslatePath("/usr/etc/cfg/a", mounts), "/usr/etc/cfg/a");
  EXPECT_EQ(TranslatePath("relative/etc/cfg", mounts), "relative/etc/cfg");
}

TEST(ExpandVarsTest, ExpandsKnownKeepsUnknownAndHonoursDollarEscape) {
  std::map<std::string, std::string> env = {{"A", "1"}, {"B", "two"}};
  EXPECT_EQ(ExpandVars("$(A)-$(B)", env), "1-two");
  EXPECT_EQ(ExpandVars("$(C)", env), "$(C)");
  EXPECT_EQ(ExpandVars("$$(A)", env), "$(A)");
  EXPECT_EQ(ExpandVars("cost $5 $(A", env), "cost $5 $(A");
  EXPECT_EQ(ExpandVars("$HOME", env), "$HOME");
}

class PrepareContainerTest : public ::testing::Test {
 protected:
  PrepareContainerTest() {
    images_.Set("ghcr.io/tidal-dev/tidal", "/bin/true");
    context_.pod_ip = "127.0.0.7";
    context_.node_name = "tidal-node-0";
    context_.pod_dir = "/data/pods/uid-1";
    context_.base_env = {{"PATH", "/usr/bin:/bin"}};
    context_.mounts = {{"/etc/job", "/data/pods/uid-1/volumes/job"}};
    context_.lookup = [this](const std::string& kind, const std::string& name) {
      auto it = objects_.find(kind + "/" + name);
      return it == objects_.end() ? std::nullopt : std::optional<json>(it->second);
    };
    objects_["Secret/token"] = {{"data", {{"value", "czNjcjN0"}}}};  // "s3cr3t"
    objects_["ConfigMap/settings"] = {{"data", {{"LEVEL", "debug"}, {"MODE", "fast"}}}};
    pod_ = {{"metadata",
             {{"name", "w-0"}, {"namespace", "ml"}, {"uid", "uid-1"}, {"labels", {{"rank", "0"}}}}},
            {"spec", {{"nodeName", "tidal-node-0"}}}};
  }
  ImageTable images_;
  PodContext context_;
  std::map<std::string, json> objects_;
  json pod_;
};

TEST_F(PrepareContainerTest, BuildsEnvFromValuesSecretsConfigMapsAndTheDownwardApi) {
  json c = {{"name", "main"},
            {"image", "busybox"},
            {"command", {"sh", "-c", "echo $(RANK) > /etc/job/out"}},
            {"envFrom", {{{"configMapRef", {{"name", "settings"}}}, {"prefix", "CFG_"}}}},
            {"env",
             {{{"name", "TOKEN"},
               {"valueFrom", {{"secretKeyRef", {{"name", "token"}, {"key", "value"}}}}}},
              {{"name", "IP"}, {"valueFrom", {{"fieldRef", {{"fieldPath", "status.podIP"}}}}}},
              {{"name", "RANK"},
               {"valueFrom", {{"fieldRef", {{"fieldPath", "metadata.labels['rank']"}}}}}},
              {{"name", "ADDR"}, {"value", "$(IP):29500"}},
              {{"name", "CONFIG"}, {"value", "/etc/job/spec.json"}}}}};
  auto result = PrepareContainer(pod_, c, images_, context_);
  ASSERT_TRUE(std::holds_alternative<ContainerLaunch>(result))
      << std::get<LaunchError>(result).message;
  const auto& launch = std::get<ContainerLaunch>(result);
  EXPECT_EQ(launch.env.at("TOKEN"), "s3cr3t");
  EXPECT_EQ(launch.env.at("IP"), "127.0.0.7");
  EXPECT_EQ(launch.env.at("ADDR"), "127.0.0.7:29500");
  EXPECT_EQ(launch.env.at("CFG_LEVEL"), "debug");
  EXPECT_EQ(launch.env.at("CONFIG"), "/data/pods/uid-1/volumes/job/spec.json");
  ASSERT_EQ(launch.argv.size(), 3u);
  EXPECT_TRUE(launch.argv[0] == "/usr/bin/sh" || launch.argv[0] == "/bin/sh") << launch.argv[0];
  EXPECT_EQ(launch.argv[2], "echo 0 > /data/pods/uid-1/volumes/job/out");
  EXPECT_EQ(launch.working_dir, "/data/pods/uid-1");
}

TEST_F(PrepareContainerTest, ImageEntrypointRunsWhenNoCommandAndCommandNamesItByBaseName) {
  json c = {{"name", "main"}, {"image", "ghcr.io/tidal-dev/tidal:0.1"}, {"args", {"local"}}};
  auto launch = std::get<ContainerLaunch>(PrepareContainer(pod_, c, images_, context_));
  EXPECT_EQ(launch.argv, (std::vector<std::string>{"/bin/true", "local"}));
  c["command"] = {"/usr/local/bin/true", "x"};
  launch = std::get<ContainerLaunch>(PrepareContainer(pod_, c, images_, context_));
  EXPECT_EQ(launch.argv, (std::vector<std::string>{"/bin/true", "x", "local"}));
}

TEST_F(PrepareContainerTest, MissingImageSecretKeyOrExecutableSayWhatIsMissing) {
  json c = {{"name", "main"}, {"image", "nginx:1"}};
  auto r = PrepareContainer(pod_, c, images_, context_);
  ASSERT_TRUE(std::holds_alternative<LaunchError>(r));
  EXPECT_EQ(std::get<LaunchError>(r).reason, "ErrImagePull");
  EXPECT_NE(std::get<LaunchError>(r).message.find("--image nginx="), std::string::npos);

  c = {{"name", "main"},
       {"image", "busybox"},
       {"command", {"true"}},
       {"env",
        {{{"name", "T"}, {"valueFrom", {{"secretKeyRef", {{"name", "nope"}, {"key", "k"}}}}}}}}};
  r = PrepareContainer(pod_, c, images_, context_);
  EXPECT_EQ(std::get<LaunchError>(r).reason, "CreateContainerConfigError");
  EXPECT_EQ(std::get<LaunchError>(r).message, "secret \"nope\" not found");
  c["env"][0]["valueFrom"]["secretKeyRef"]["optional"] = true;
  EXPECT_TRUE(
      std::holds_alternative<ContainerLaunch>(PrepareContainer(pod_, c, images_, context_)));

  c["env"] = {
      {{"name", "T"}, {"valueFrom", {{"secretKeyRef", {{"name", "token"}, {"key", "k"}}}}}}};
  r = PrepareContainer(pod_, c, images_, context_);
  EXPECT_EQ(std::get<LaunchError>(r).message, "couldn't find key k in Secret ml/token");

  c = {{"name", "main"}, {"image", "busybox"}, {"command", {"no-such-binary-xyz"}}};
  r = PrepareContainer(pod_, c, images_, context_);
  EXPECT_EQ(std::get<LaunchError>(r).reason, "RunContainerError");
  c = {{"name", "main"}, {"image", "busybox"}};
  r = PrepareContainer(pod_, c, images_, context_);
  EXPECT_NE(std::get<LaunchError>(r).message.find("give container main a command"),
            std::string::npos);
}

TEST(RestartPolicyTest, AlwaysOnFailureNeverAsKubelet) {
  EXPECT_TRUE(ShouldRestart("Always", 0));
  EXPECT_TRUE(ShouldRestart("", 0));
  EXPECT_TRUE(ShouldRestart("OnFailure", 1));
  EXPECT_FALSE(ShouldRestart("OnFailure", 0));
  EXPECT_FALSE(ShouldRestart("Never", 1));
}

TEST(PodPhaseTest, FollowsKubeletGetPhase) {
  using R = ContainerRun;
  R waiting{R::kWaiting, 0, false}, running{R::kRunning, 0, false};
  R ok{R::kTerminated, 0, false}, failed{R::kTerminated, 2, false};
  R backoff{R::kWaiting, 0, true};
  EXPECT_EQ(PodPhase("Always", {waiting}), "Pending");
  EXPECT_EQ(PodPhase("Always", {running, waiting}), "Pending");
  EXPECT_EQ(PodPhase("Never", {running, ok}), "Running");
  EXPECT_EQ(PodPhase("Never", {ok, ok}), "Succeeded");
  EXPECT_EQ(PodPhase("Never", {ok, failed}), "Failed");
  EXPECT_EQ(PodPhase("OnFailure", {ok}), "Succeeded");
  EXPECT_EQ(PodPhase("OnFailure", {failed}), "Running");
  EXPECT_EQ(PodPhase("Always", {ok}), "Running");
  EXPECT_EQ(PodPhase("Always", {backoff}), "Running");
  EXPECT_EQ(PodPhase("Always", {}), "Pending");
}

}  // namespace
}  // namespace tidal::local
