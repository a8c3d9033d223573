// operator/reconciler/children.cc
#include "operator/reconciler/children.h"

#include <openssl/rand.h>

#include <algorithm>
#include <cstdio>
#include <functional>

#include "common/base64.h"

namespace tidal::reconciler {
namespace {

using nlohmann::json;

constexpr size_t kMaxLabelValue = 63;

// FNV-1a, 32 or 64 bits: stable across processes and versions (std::hash is not).
template <typename Hash>
Hash Fnv1a(const std::string& s) {
  constexpr bool wide = sizeof(Hash) == 8;
  Hash h = wide ? Hash(0xcbf29ce484222325ull) : Hash(2166136261u);
  for (unsigned char c : s) {
    h ^= c;
    h *= wide ? Hash(0x100000001b3ull) : Hash(16777619u);
  }
  return h;
}

json Metadata(const JobRef& job, const std::string& name) {
  return {{"name", name},
          {"namespace", job.namespace_},
          {"labels", ChildLabels(job)},
          {"ownerReferences", json::array({ControllerRef(job)})}};
}

}  // namespace

std::string JobLabelValue(const std::string& job_name) {
  if (job_name.size() <= kMaxLabelValue) return job_name;
  char hash[9];
  std::snprintf(hash, sizeof(hash), "%08x", Fnv1a<uint32_t>(job_name));
  std::string cut = job_name.substr(0, kMaxLabelValue - 9);
  while (!cut.empty() && (cut.back() == '-' || cut.back() == '.')) cut.pop_back();
  return cut + "-" + hash;
}

std::string ServiceName(const std::string& job_name) { return job_name + "-workers"; }
std::string TokenSecretName(const std::string& job_name) { return job_name + "-token"; }

std::string DefaultCheckpointUri(const std::string& root, const JobRef& job) {
  return root + "/" + job.namespace_ + "/" + job.name + "/" + job.uid;
}
std::string SpecConfigMapName(const std::string& job_name) { return job_name + "-spec"; }
std::string WorkerPodName(const std::string& job_name, int slot) {
  return job_name + "-worker-" + std::to_string(slot);
}
std::string PodGroupName(const std::string& job_name, int64_t generation) {
  return JobLabelValue(job_name + "-g" + std::to_string(generation));
}
std::string DataKey(const json& raw_spec) {
  std::string text;  // each section's JSON (object keys sorted), null when absent
  for (const char* section : {"model", "dataset", "lora"}) {
    const auto it = raw_spec.is_object() ? raw_spec.find(section) : raw_spec.end();
    text += std::string(section) + "=" + (it == raw_spec.end() ? "null" : it->dump()) + "\n";
  }
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx",
                static_cast<unsigned long long>(Fnv1a<uint64_t>(text)));
  return hex;
}
std::string PrepPodName(const std::string& job_name, const std::string& data_key, int64_t attempt) {
  return job_name + "-prep-" + data_key.substr(0, 8) + "-" + std::to_string(attempt);
}

json ChildLabels(const JobRef& job) {
  return {{kJobLabel, JobLabelValue(job.name)},
          {"app.kubernetes.io/name", "tidal-worker"},
          {"app.kubernetes.io/instance", JobLabelValue(job.name)},
          {"app.kubernetes.io/managed-by", "tidal-operator"}};
}

json ControllerRef(const JobRef& job) {
  return {{"apiVersion", "tidal.dev/v1alpha1"},
          {"kind", "TrainingJob"},
          {"name", job.name},
          {"uid", job.uid},
          {"controller", true},
          {"blockOwnerDeletion", true}};
}

StatusOr<std::string> NewToken() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1)
    return Internal("the system's random source failed: cannot make a job token");
  std::string token = Base64Encode(std::string(reinterpret_cast<char*>(bytes), sizeof(bytes)));
  std::replace(token.begin(), token.end(), '+', '-');
  std::replace(token.begin(), token.end(), '/', '_');
  token.erase(std::remove(token.begin(), token.end(), '='), token.end());
  return token;
}

json HeadlessService(const JobRef& job) {
  return {{"apiVersion", "v1"},
          {"kind", "Service"},
          {"metadata", Metadata(job, ServiceName(job.name))},
          {"spec",
           {{"clusterIP", "None"},
            // Workers resolve each other (and the store) before they are Ready.
            {"publishNotReadyAddresses", true},
            {"selector", {{kJobLabel, JobLabelValue(job.name)}}},
            {"ports",
             json::array({{{"name", "control"}, {"port", kControlPort}, {"protocol", "TCP"}},
                          {{"name", "store"}, {"port", kStorePort}, {"protocol", "TCP"}},
                          {{"name", "metrics"}, {"port", kMetricsPort}, {"protocol", "TCP"}}})}}}};
}

json TokenSecret(const JobRef& job, const std::string& token) {
  return {{"apiVersion", "v1"},
          {"kind", "Secret"},
          {"metadata", Metadata(job, TokenSecretName(job.name))},
          {"type", "Opaque"},
          {"data", {{kTokenKey, Base64Encode(token)}}}};
}

json SpecConfigMap(const JobRef& job, const json& spec) {
  const json whole = {{"apiVersion", "tidal.dev/v1alpha1"},
                      {"kind", "TrainingJob"},
                      {"metadata", {{"name", job.name}, {"namespace", job.namespace_}}},
                      {"spec", spec}};
  return {{"apiVersion", "v1"},
          {"kind", "ConfigMap"},
          {"metadata", Metadata(job, SpecConfigMapName(job.name))},
          {"data", {{kSpecKey, whole.dump()}}}};
}

namespace {

// The S3 credentials Secret (spec.checkpoint.credentialsSecret), which datasets and models on
// s3:// use too, and the user's env.
void AddStoreAccess(const api::TrainingJobSpec& spec, json& volumes, json& mounts, json& env) {
  if (!spec.checkpoint.credentials_secret.empty()) {
    volumes.push_back(
        {{"name", "s3"},
         {"secret", {{"secretName", spec.checkpoint.credentials_secret}, {"defaultMode", 0400}}}});
    mounts.push_back({{"name", "s3"}, {"mountPath", "/etc/tidal/s3"}, {"readOnly", true}});
    env.push_back({{"name", "TIDAL_S3_SECRET_DIR"}, {"value", "/etc/tidal/s3"}});
  }
  for (const json& e : spec.worker.env) env.push_back(e);
}

// The workers' tolerations let a pod onto the nodes they may use; their nodeSelector (a GPU
// pool) binds only workers: the prep pod needs no GPU and must not wait for a GPU node.
void AddTolerations(const api::TrainingJobSpec& spec, json& pod_spec) {
  if (spec.worker.tolerations.is_array() && !spec.worker.tolerations.empty())
    pod_spec["tolerations"] = spec.worker.tolerations;
}

}  // namespace

json PrepPod(const JobRef& job, const api::TrainingJobSpec& spec, const std::string& name,
             const std::string& data_key) {
  json meta = Metadata(job, name);
  meta["labels"][kRoleLabel] = kPrepRole;
  meta["annotations"] = {{kDataKeyAnnotation, data_key}};
  json env = json::array();
  json volumes =
      json::array({{{"name", "job"}, {"configMap", {{"name", SpecConfigMapName(job.name)}}}}});
  json mounts = json::array({{{"name", "job"}, {"mountPath", kSpecMountPath}, {"readOnly", true}}});
  AddStoreAccess(spec, volumes, mounts, env);
  // The user's CPU and memory, no GPU: tokenizing needs none.
  json resources = spec.worker.resources.is_object() ? spec.worker.resources : json::object();
  for (const char* side : {"limits", "requests"})
    if (resources.contains(side) && resources[side].is_object())
      resources[side].erase("nvidia.com/gpu");
  json container = {{"name", "prep"},
                    {"image", spec.worker.image},
                    {"command", json::array({"tidal-prep"})},
                    {"args", json::array({"--config", std::string(kSpecMountPath) + "/" + kSpecKey,
                                          "--result", "/dev/termination-log"})},
                    {"env", env},
                    {"resources", resources},
                    // A crash that writes no result still says why: the log's tail.
                    {"terminationMessagePolicy", "FallbackToLogsOnError"},
                    {"volumeMounts", mounts}};
  if (!spec.worker.image_pull_policy.empty())
    container["imagePullPolicy"] = spec.worker.image_pull_policy;
  json pod_spec = {{"restartPolicy", "Never"},
                   {"securityContext", {{"fsGroup", kWorkerFsGroup}}},
                   {"containers", json::array({container})},
                   {"volumes", volumes}};
  AddTolerations(spec, pod_spec);
  return {{"apiVersion", "v1"}, {"kind", "Pod"}, {"metadata", meta}, {"spec", pod_spec}};
}

json WorkerPod(const JobRef& job, const api::TrainingJobSpec& spec,
               const WorkerPodOptions& options) {
  json meta = Metadata(job, WorkerPodName(job.name, options.slot));
  const std::string group = PodGroupName(job.name, options.generation);
  meta["labels"][kSlotLabel] = std::to_string(options.slot);
  meta["labels"][kKueuePodGroupLabel] = group;
  meta["annotations"] = {{kCreatedForGenerationAnnotation, std::to_string(options.generation)},
                         {kKueuePodGroupCountAnnotation, std::to_string(options.group_size)},
                         {kVolcanoGroupAnnotation, group}};

  json env = json::array(
      {{{"name", "POD_IP"}, {"valueFrom", {{"fieldRef", {{"fieldPath", "status.podIP"}}}}}},
       {{"name", "TIDAL_SLOT"}, {"value", std::to_string(options.slot)}},
       // The job its checkpoint store belongs to: a job made again under the same name has
       // another UID, and never resumes (or overwrites) the deleted one's checkpoints.
       {{"name", "TIDAL_JOB_UID"}, {"value", job.uid}}});
  if (spec.checkpoint.uri.empty() && !options.default_checkpoint_uri.empty())
    env.push_back({{"name", "TIDAL_CHECKPOINT_URI"}, {"value", options.default_checkpoint_uri}});
  if (!options.dataset_store.empty())
    env.push_back({{"name", "TIDAL_DATASET_STORE"}, {"value", options.dataset_store}});
  // After its SIGTERM (a drain, an eviction, a deletion) a worker trains on for the operator to
  // move the job off its pod live, for half the grace period; the other half is left for it to
  // checkpoint to the store and leave on its own if the operator does not come.
  env.push_back({{"name", "TIDAL_DRAIN_SECONDS"},
                 {"value", std::to_string(spec.worker.termination_grace_period_seconds / 2)}});
  json volumes = json::array(
      {{{"name", "job"}, {"configMap", {{"name", SpecConfigMapName(job.name)}}}},
       {{"name", "token"},
        {"secret", {{"secretName", TokenSecretName(job.name)}, {"defaultMode", 0400}}}}});
  json mounts =
      json::array({{{"name", "job"}, {"mountPath", kSpecMountPath}, {"readOnly", true}},
                   {{"name", "token"}, {"mountPath", kTokenMountPath}, {"readOnly", true}}});
  AddStoreAccess(spec, volumes, mounts, env);
  json args = {"--spec",           std::string(kSpecMountPath) + "/" + kSpecKey,
               "--token-file",     std::string(kTokenMountPath) + "/" + kTokenKey,
               "--listen",         "$(POD_IP):" + std::to_string(kControlPort),
               "--metrics-listen", "$(POD_IP):" + std::to_string(kMetricsPort)};
  if (!spec.worker.tls_secret_name.empty()) {
    volumes.push_back(
        {{"name", "tls"},
         {"secret", {{"secretName", spec.worker.tls_secret_name}, {"defaultMode", 0400}}}});
    mounts.push_back({{"name", "tls"}, {"mountPath", kTlsMountPath}, {"readOnly", true}});
    for (const char* part : {"cert", "key"}) {
      args.push_back(std::string("--tls-") + part);
      args.push_back(std::string(kTlsMountPath) + "/tls." + (part[0] == 'c' ? "crt" : "key"));
    }
  }

  // The user's resources, with nvidia.com/gpu set to gpusPerPod (it is the unit of scaling).
  json resources = spec.worker.resources.is_object() ? spec.worker.resources : json::object();
  const std::string gpus = std::to_string(spec.elastic.gpus_per_pod);
  resources["limits"]["nvidia.com/gpu"] = gpus;
  resources["requests"]["nvidia.com/gpu"] = gpus;

  json container = {
      {"name", "worker"},
      {"image", spec.worker.image},
      {"args", args},
      {"env", env},
      {"ports", json::array({{{"name", "control"}, {"containerPort", kControlPort}},
                             {{"name", "store"}, {"containerPort", kStorePort}},
                             {{"name", "metrics"}, {"containerPort", kMetricsPort}}})},
      {"readinessProbe",
       {{"tcpSocket", {{"port", kControlPort}}}, {"periodSeconds", 2}, {"failureThreshold", 3}}},
      {"resources", resources},
      {"volumeMounts", mounts}};
  if (!spec.worker.image_pull_policy.empty())
    container["imagePullPolicy"] = spec.worker.image_pull_policy;

  json pod_spec = {{"restartPolicy", "Never"},
                   {"subdomain", ServiceName(job.name)},
                   {"hostname", JobLabelValue(WorkerPodName(job.name, options.slot))},
                   {"terminationGracePeriodSeconds", spec.worker.termination_grace_period_seconds},
                   {"securityContext", {{"fsGroup", kWorkerFsGroup}}},
                   {"containers", json::array({container})},
                   {"volumes", volumes}};
  if (spec.worker.node_selector.is_object() && !spec.worker.node_selector.empty())
    pod_spec["nodeSelector"] = spec.worker.node_selector;
  AddTolerations(spec, pod_spec);
  if (!spec.elastic.priority_class_name.empty())
    pod_spec["priorityClassName"] = spec.elastic.priority_class_name;
  // Pack: each pod prefers the hosts that already run the job's pods (kube-scheduler's
  // InterPodAffinity score, the heaviest weight), so that a job's ranks share as few nodes as
  // its GPUs allow and its ring's neighbours talk over NVLink more than over the network. A
  // preference, never a requirement: a job that does not fit on one node still starts.
  if (spec.worker.placement == "Pack")
    pod_spec["affinity"] = {
        {"podAffinity",
         {{"preferredDuringSchedulingIgnoredDuringExecution",
           json::array(
               {{{"weight", 100},
                 {"podAffinityTerm",
                  {{"labelSelector", {{"matchLabels", {{kJobLabel, JobLabelValue(job.name)}}}}},
                   {"topologyKey", "kubernetes.io/hostname"}}}}})}}}};
  return {{"apiVersion", "v1"}, {"kind", "Pod"}, {"metadata", meta}, {"spec", pod_spec}};
}

}  // namespace tidal::reconciler
