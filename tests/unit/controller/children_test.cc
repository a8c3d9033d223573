// The objects a TrainingJob owns, and that `tidal local`'s kubelet would start its worker pods
// as tidal-worker with the spec, token and address the worker expects.
#include "operator/reconciler/children.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <variant>
#include <vector>

#include "common/base64.h"
#include "local/pod_spec.h"

namespace tidal::reconciler {
namespace {

using nlohmann::json;

json MinimalSpec() {
  return json::parse(R"({
    "model": {"preset": "tiny"},
    "dataset": {"uri": "/data/sample.jsonl", "format": "text", "maxSeqLen": 32},
    "optimization": {"globalBatchSize": 8, "microBatchSize": 2, "maxSteps": 10},
    "elastic": {"minGPUs": 2, "maxGPUs": 4, "gpusPerPod": 2},
    "worker": {"image": "ghcr.io/tidal-dev/tidal-worker:0.1",
               "resources": {"limits": {"cpu": "4", "memory": "8Gi"}},
               "nodeSelector": {"gpu": "h100"},
               "env": [{"name": "NCCL_DEBUG", "value": "INFO"}]}
  })");
}

api::TrainingJobSpec Parse(const json& spec) {
  auto parsed = api::ParseTrainingJobSpec(spec);
  EXPECT_TRUE(parsed.ok()) << parsed.status().ToString();
  return parsed.ok() ? *parsed : api::TrainingJobSpec();
}

const JobRef kJob{"llama-lora", "team-a", "uid-123"};

TEST(Children, EveryChildIsOwnedByTheJobAsItsControllerAndCarriesTheJobLabel) {
  const auto spec = Parse(MinimalSpec());
  for (const json& child :
       {HeadlessService(kJob), TokenSecret(kJob, "t"), SpecConfigMap(kJob, MinimalSpec()),
        WorkerPod(kJob, spec, {.slot = 0, .generation = 1, .group_size = 2})}) {
    SCOPED_TRACE(child["kind"].get<std::string>());
    EXPECT_EQ(child["metadata"]["namespace"], "team-a");
    ASSERT_EQ(child["metadata"]["ownerReferences"].size(), 1u);
    const json& ref = child["metadata"]["ownerReferences"][0];
    EXPECT_EQ(ref["uid"], "uid-123");
    EXPECT_EQ(ref["kind"], "TrainingJob");
    EXPECT_EQ(ref["apiVersion"], "tidal.dev/v1alpha1");
    EXPECT_TRUE(ref["controller"].get<bool>());
    EXPECT_TRUE(ref["blockOwnerDeletion"].get<bool>());
    EXPECT_EQ(child["metadata"]["labels"][kJobLabel], "llama-lora");
  }
}

TEST(Children, TheHeadlessServiceSelectsExactlyTheJobsWorkers) {
  const json svc = HeadlessService(kJob);
  EXPECT_EQ(svc["metadata"]["name"], "llama-lora-workers");
  EXPECT_EQ(svc["spec"]["clusterIP"], "None");
  EXPECT_TRUE(svc["spec"]["publishNotReadyAddresses"].get<bool>());
  const json pod = WorkerPod(kJob, Parse(MinimalSpec()), {.slot = 3});
  for (const auto& [key, value] : svc["spec"]["selector"].items())
    EXPECT_EQ(pod["metadata"]["labels"][key], value) << key;
  EXPECT_EQ(pod["spec"]["subdomain"], "llama-lora-workers");
}

TEST(Children, WorkerPodsCarryTheSlotAndOneGangGroupPerScaleStep) {
  const auto spec = Parse(MinimalSpec());
  const json a = WorkerPod(kJob, spec, {.slot = 2, .generation = 5, .group_size = 2});
  const json b = WorkerPod(kJob, spec, {.slot = 3, .generation = 5, .group_size = 2});
  EXPECT_EQ(a["metadata"]["name"], "llama-lora-worker-2");
  EXPECT_EQ(a["metadata"]["labels"][kSlotLabel], "2");
  EXPECT_EQ(a["metadata"]["labels"][kKueuePodGroupLabel], "llama-lora-g5");
  EXPECT_EQ(a["metadata"]["labels"][kKueuePodGroupLabel],
            b["metadata"]["labels"][kKueuePodGroupLabel]);
  EXPECT_EQ(a["metadata"]["annotations"][kKueuePodGroupCountAnnotation], "2");
  EXPECT_EQ(a["metadata"]["annotations"][kVolcanoGroupAnnotation], "llama-lora-g5");
  EXPECT_EQ(a["metadata"]["annotations"][kCreatedForGenerationAnnotation], "5");
  EXPECT_EQ(a["spec"]["restartPolicy"], "Never");
}

// spec.worker.placement: Pack (the default) gives each worker pod a preferred affinity for the
// hosts that run its job's pods; the local scheduler, which reads it as kube-scheduler does,
// then puts a job's second pod beside its first rather than on a tighter fit. None: no hint.
TEST(Children, PackedWorkerPodsPreferTheHostsThatRunTheirJobsPods) {
  const json first = WorkerPod(kJob, Parse(MinimalSpec()), {.slot = 0});
  const json& term =
      first["spec"]["affinity"]["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"];
  ASSERT_EQ(term.size(), 1u) << first["spec"].dump();
  EXPECT_EQ(term[0]["weight"], 100);
  EXPECT_EQ(term[0]["podAffinityTerm"]["topologyKey"], "kubernetes.io/hostname");
  EXPECT_EQ(term[0]["podAffinityTerm"]["labelSelector"]["matchLabels"],
            json({{kJobLabel, "llama-lora"}}));
  EXPECT_FALSE(first["spec"]["affinity"].contains("podAntiAffinity"));

  const std::vector<local::NodeInfo> nodes = {
      {"n0", {{"kubernetes.io/hostname", "n0"}, {"gpu", "h100"}}, 8},
      {"n1", {{"kubernetes.io/hostname", "n1"}, {"gpu", "h100"}}, 8}};
  json bound = first;
  bound["spec"]["nodeName"] = "n0";
  bound["metadata"]["uid"] = "uid-first";
  bound["metadata"]["annotations"][local::kGpuIdsAnnotation] = "0,1";
  json other = WorkerPod({"other", "team-a", "uid-other"}, Parse(MinimalSpec()), {.slot = 0});
  other["spec"]["nodeName"] = "n1";
  other["metadata"]["uid"] = "uid-other-0";
  other["metadata"]["annotations"][local::kGpuIdsAnnotation] = "0,1,2,3";
  const json second = WorkerPod(kJob, Parse(MinimalSpec()), {.slot = 1});
  EXPECT_EQ(local::Schedule(second, nodes, {bound, other}).node, "n0");

  json spec = MinimalSpec();
  spec["worker"]["placement"] = "None";
  const json unhinted = WorkerPod(kJob, Parse(spec), {.slot = 1});
  EXPECT_FALSE(unhinted["spec"].contains("affinity")) << unhinted["spec"].dump();
  EXPECT_EQ(local::Schedule(unhinted, nodes, {bound, other}).node, "n1");  // the tighter fit
}

TEST(Children, WorkerPodsRequestGpusPerPodOnTopOfTheUsersResources) {
  const json pod = WorkerPod(kJob, Parse(MinimalSpec()), {.slot = 0});
  const json& c = pod["spec"]["containers"][0];
  EXPECT_EQ(c["resources"]["limits"]["nvidia.com/gpu"], "2");
  EXPECT_EQ(c["resources"]["requests"]["nvidia.com/gpu"], "2");
  EXPECT_EQ(c["resources"]["limits"]["cpu"], "4");
  EXPECT_EQ(c["resources"]["limits"]["memory"], "8Gi");
  EXPECT_EQ(pod["spec"]["nodeSelector"]["gpu"], "h100");
  auto gpus = local::PodGpuRequest(pod);
  ASSERT_TRUE(gpus.ok()) << gpus.status().ToString();
  EXPECT_EQ(*gpus, 2);
  EXPECT_EQ(c["image"], "ghcr.io/tidal-dev/tidal-worker:0.1");
}

// A job that names a PriorityClass (spec.elastic.priorityClassName) gives it to its workers, so
// that kube-scheduler's preemption ranks them as the sharing ranks the job; one that does not
// leaves the pods to the cluster's default.
TEST(Children, WorkerPodsCarryTheJobsPriorityClass) {
  EXPECT_FALSE(
      WorkerPod(kJob, Parse(MinimalSpec()), {.slot = 0})["spec"].contains("priorityClassName"));
  json spec = MinimalSpec();
  spec["elastic"]["priorityClassName"] = "research-low";
  EXPECT_EQ(WorkerPod(kJob, Parse(spec), {.slot = 1})["spec"]["priorityClassName"], "research-low");
}

TEST(Children, TheDefaultCheckpointStoreIsPassedOnlyWhenTheSpecNamesNone) {
  json with_uri = MinimalSpec();
  with_uri["checkpoint"] = {{"uri", "s3://ckpt/job"}, {"credentialsSecret", "ckpt-s3"}};
  auto env_of = [](const json& pod) {
    std::map<std::string, json> env;
    for (const json& e : pod["spec"]["containers"][0]["env"]) env[e["name"]] = e;
    return env;
  };
  const WorkerPodOptions options{.default_checkpoint_uri = "file:///var/lib/tidal/ckpt/job"};
  auto plain = env_of(WorkerPod(kJob, Parse(MinimalSpec()), options));
  EXPECT_EQ(plain["TIDAL_CHECKPOINT_URI"]["value"], "file:///var/lib/tidal/ckpt/job");
  EXPECT_EQ(plain["TIDAL_JOB_UID"]["value"], kJob.uid) << "the owner of the checkpoint store";
  EXPECT_FALSE(plain.count("TIDAL_S3_SECRET_DIR"));
  EXPECT_EQ(plain["NCCL_DEBUG"]["value"], "INFO");
  EXPECT_EQ(plain["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"], "status.podIP");

  const json s3_pod = WorkerPod(kJob, Parse(with_uri), options);
  auto s3 = env_of(s3_pod);
  EXPECT_FALSE(s3.count("TIDAL_CHECKPOINT_URI"));
  EXPECT_EQ(s3["TIDAL_S3_SECRET_DIR"]["value"], "/etc/tidal/s3");
  bool mounted = false;
  for (const json& v : s3_pod["spec"]["volumes"])
    mounted |= v.contains("secret") && v["secret"]["secretName"] == "ckpt-s3";
  EXPECT_TRUE(mounted);
}

// Issue 47: a job deleted and applied again under the same name found the deleted one's
// checkpoints in <root>/<ns>/<name> and was Succeeded without training. Its UID is part of it.
TEST(Children, TheDefaultCheckpointStoreIsTheJobsOwnByItsUid) {
  EXPECT_EQ(DefaultCheckpointUri("file:///var/lib/tidal/ckpt", kJob),
            "file:///var/lib/tidal/ckpt/team-a/llama-lora/uid-123");
  const JobRef again{"llama-lora", "team-a", "uid-456"};
  EXPECT_NE(DefaultCheckpointUri("s3://b/c", kJob), DefaultCheckpointUri("s3://b/c", again));
}

TEST(Children, ATlsSecretIsMountedAndTheWorkerServesItsCertificate) {
  json spec = MinimalSpec();
  const auto args_of = [](const json& pod) {
    return pod["spec"]["containers"][0]["args"].get<std::vector<std::string>>();
  };
  const auto plain = args_of(WorkerPod(kJob, Parse(spec), {.slot = 0}));
  EXPECT_EQ(std::find(plain.begin(), plain.end(), "--tls-cert"), plain.end());

  spec["worker"] = {{"tlsSecretName", "worker-tls"}};
  const json pod = WorkerPod(kJob, Parse(spec), {.slot = 0});
  const auto args = args_of(pod);
  auto after = [&](const std::string& flag) {
    auto it = std::find(args.begin(), args.end(), flag);
    return it == args.end() || it + 1 == args.end() ? std::string() : *(it + 1);
  };
  EXPECT_EQ(after("--tls-cert"), "/etc/tidal/tls/tls.crt");
  EXPECT_EQ(after("--tls-key"), "/etc/tidal/tls/tls.key");
  bool volume = false, mount = false;
  for (const json& v : pod["spec"]["volumes"])
    volume |= v["name"] == "tls" && v["secret"]["secretName"] == "worker-tls";
  for (const json& m : pod["spec"]["containers"][0]["volumeMounts"])
    mount |= m["name"] == "tls" && m["mountPath"] == "/etc/tidal/tls";
  EXPECT_TRUE(volume && mount) << pod.dump(2);
  EXPECT_EQ(WorkerTlsServerName("train", "ml"), "train-workers.ml.svc");
}

TEST(Children, TheNonRootWorkerImageReadsItsSecretVolumesThroughThePodsFsGroup) {
  json spec = MinimalSpec();
  spec["worker"] = {{"tlsSecretName", "worker-tls"}};
  spec["checkpoint"] = {{"uri", "s3://ckpt/job"}, {"credentialsSecret", "s3-creds"}};
  const json pod = WorkerPod(kJob, Parse(spec), {.slot = 0});
  // deploy/docker/worker.Dockerfile runs as 65532:65532 (tests/integration/deploy_test.cc).
  EXPECT_EQ(pod["spec"]["securityContext"]["fsGroup"], 65532) << pod["spec"].dump(2);
  int secrets = 0;
  for (const json& v : pod["spec"]["volumes"]) {
    if (!v.contains("secret")) continue;
    ++secrets;
    EXPECT_EQ(v["secret"]["defaultMode"], 0400) << v;  // the owner (and fsGroup) only
  }
  EXPECT_EQ(secrets, 3);  // token, S3 credentials, TLS
}

TEST(Children, LongJobNamesGiveStableDistinctLabelValuesOfAtMost63Characters) {
  const std::string a(80, 'a'), b = std::string(79, 'a') + "b";
  EXPECT_LE(JobLabelValue(a).size(), 63u);
  EXPECT_EQ(JobLabelValue(a), JobLabelValue(a));
  EXPECT_NE(JobLabelValue(a), JobLabelValue(b));
  EXPECT_EQ(JobLabelValue("short"), "short");
  const json pod = WorkerPod({a, "ns", "u"}, Parse(MinimalSpec()), {.slot = 12});
  EXPECT_LE(pod["spec"]["hostname"].get<std::string>().size(), 63u);
  EXPECT_LE(pod["metadata"]["labels"][kKueuePodGroupLabel].get<std::string>().size(), 63u);
}

TEST(Children, TokensAreUrlSafe256BitAndNeverRepeat) {
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    auto token = NewToken();
    ASSERT_TRUE(token.ok());
    EXPECT_EQ(token->size(), 43u);
    EXPECT_EQ(token->find_first_not_of(
                  "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"),
              std::string::npos);
    EXPECT_TRUE(seen.insert(*token).second);
  }
  const json secret = TokenSecret(kJob, "abc");
  EXPECT_EQ(Base64Decode(secret["data"][kTokenKey].get<std::string>()), "abc");
}

TEST(Children, TheSpecConfigMapHoldsAJobTheWorkersParseBackUnchanged) {
  const json cm = SpecConfigMap(kJob, MinimalSpec());
  const json whole = json::parse(cm["data"][kSpecKey].get<std::string>());
  EXPECT_EQ(whole["metadata"]["name"], "llama-lora");
  EXPECT_EQ(whole["spec"], MinimalSpec());
  auto parsed = api::ParseTrainingJobSpec(whole["spec"]);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->elastic.gpus_per_pod, 2);
}

// What the process kubelet of `tidal local` makes of a worker pod: tidal-worker, with the
// spec and token at their mounted paths and the control API on the pod's own address.
TEST(Children, TheLocalKubeletStartsAWorkerPodAsTidalWorkerOnItsPodIp) {
  const json pod = WorkerPod(kJob, Parse(MinimalSpec()), {.slot = 1});
  local::ImageTable images;
  images.Set("ghcr.io/tidal-dev/tidal-worker", "/opt/tidal/tidal-worker");
  local::PodContext context;
  context.pod_ip = "127.0.0.7";
  context.pod_dir = "/var/pods/w1";
  context.mounts = local::ContainerMounts(
      pod["spec"]["containers"][0],
      {{"job", "/var/pods/w1/volumes/job"}, {"token", "/var/pods/w1/volumes/token"}});
  context.lookup = [](const std::string&, const std::string&) -> std::optional<json> {
    return std::nullopt;
  };
  auto launch = local::PrepareContainer(pod, pod["spec"]["containers"][0], images, context);
  ASSERT_TRUE(std::holds_alternative<local::ContainerLaunch>(launch))
      << std::get<local::LaunchError>(launch).message;
  const auto& argv = std::get<local::ContainerLaunch>(launch).argv;
  const std::vector<std::string> want = {"/opt/tidal/tidal-worker",
                                         "--spec",
                                         "/var/pods/w1/volumes/job/trainingjob.json",
                                         "--token-file",
                                         "/var/pods/w1/volumes/token/token",
                                         "--listen",
                                         "127.0.0.7:50051",
                                         "--metrics-listen",
                                         "127.0.0.7:9090"};
  EXPECT_EQ(argv, want);
  EXPECT_EQ(std::get<local::ContainerLaunch>(launch).env.at("POD_IP"), "127.0.0.7");
}

// The data phase's pod: tidal-prep on the spec, its outcome as termination message, the
// workers' image, store access, env, CPU/memory — and no GPU, nor the GPU pool's nodeSelector.
TEST(Children, ThePrepPodRunsTidalPrepOnTheSpecWithoutAGpuAndReportsThroughItsTerminationMessage) {
  json spec = MinimalSpec();
  spec["checkpoint"] = {{"uri", "s3://ckpt/x"}, {"credentialsSecret", "s3-creds"}};
  spec["worker"]["resources"]["limits"]["nvidia.com/gpu"] = "2";
  const std::string key = DataKey(spec);
  const std::string name = PrepPodName(kJob.name, key, 0);
  EXPECT_EQ(name, "llama-lora-prep-" + key.substr(0, 8) + "-0");
  const json pod = PrepPod(kJob, Parse(spec), name, key);
  EXPECT_EQ(pod["metadata"]["labels"][kRoleLabel], kPrepRole);
  EXPECT_EQ(pod["metadata"]["labels"][kJobLabel], "llama-lora");
  EXPECT_EQ(pod["metadata"]["annotations"][kDataKeyAnnotation], key);
  EXPECT_EQ(pod["metadata"]["ownerReferences"][0]["uid"], "uid-123");
  const json& c = pod["spec"]["containers"][0];
  EXPECT_EQ(c["image"], "ghcr.io/tidal-dev/tidal-worker:0.1");
  EXPECT_EQ(c["command"], json::array({"tidal-prep"}));
  EXPECT_EQ(c["args"], json::array({"--config", "/etc/tidal/job/trainingjob.json", "--result",
                                    "/dev/termination-log"}));
  EXPECT_EQ(c["terminationMessagePolicy"], "FallbackToLogsOnError");
  EXPECT_FALSE(c["resources"]["limits"].contains("nvidia.com/gpu")) << c["resources"];
  EXPECT_EQ(c["resources"]["limits"]["cpu"], "4");
  EXPECT_EQ(pod["spec"]["restartPolicy"], "Never");
  EXPECT_FALSE(pod["spec"].contains("nodeSelector")) << "a prep pod waiting for a GPU node";
  std::set<std::string> env;
  for (const json& e : c["env"]) env.insert(e["name"].get<std::string>());
  EXPECT_EQ(env, (std::set<std::string>{"TIDAL_S3_SECRET_DIR", "NCCL_DEBUG"}));
  bool secret = false;
  for (const json& v : pod["spec"]["volumes"])
    secret |= v.contains("secret") && v["secret"]["secretName"] == "s3-creds";
  EXPECT_TRUE(secret);
}

TEST(Children, TheDataKeyChangesWithModelDatasetOrLoraAndWithNothingElse) {
  const json spec = MinimalSpec();
  const std::string key = DataKey(spec);
  EXPECT_EQ(key.size(), 16u);
  EXPECT_EQ(DataKey(spec), key) << "not stable";
  json other = spec;
  other["optimization"]["maxSteps"] = 99;
  other["elastic"]["maxGPUs"] = 8;
  other["suspend"] = true;
  EXPECT_EQ(DataKey(other), key);
  for (const char* edit : {R"({"dataset": {"maxSeqLen": 64}})", R"({"model": {"preset": "small"}})",
                           R"({"lora": {"rank": 4}})"}) {
    json changed = spec;
    changed.merge_patch(json::parse(edit));
    EXPECT_NE(DataKey(changed), key) << edit;
  }
}

TEST(Children, WorkerPodsAreToldTheDataPhasesStore) {
  const json plain = WorkerPod(kJob, Parse(MinimalSpec()), {.slot = 0});
  for (const json& e : plain["spec"]["containers"][0]["env"])
    EXPECT_NE(e["name"], "TIDAL_DATASET_STORE");
  const json pod = WorkerPod(kJob, Parse(MinimalSpec()),
                             {.slot = 0, .dataset_store = "s3://data/.tidal-tokens/feed"});
  bool found = false;
  for (const json& e : pod["spec"]["containers"][0]["env"])
    if (e["name"] == "TIDAL_DATASET_STORE") found = e["value"] == "s3://data/.tidal-tokens/feed";
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace tidal::reconciler
