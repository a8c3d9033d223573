// operator/reconciler/children.h — the objects a TrainingJob owns, built as the controller
// wants them: the headless Service of its workers, the Secret holding the job token, the
// ConfigMap holding the spec the workers read, and one Pod per worker slot. Pure functions of
// the job (no I/O besides the token's randomness), so a reconcile that crashes half way and
// runs again builds the same objects under the same names.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "api/training_job.h"
#include "common/status.h"

namespace tidal::reconciler {

inline constexpr const char* kJobLabel = "tidal.dev/job";
inline constexpr const char* kSlotLabel = "tidal.dev/slot";
// The data phase's pod carries tidal.dev/role=prep (workers carry no role label).
inline constexpr const char* kRoleLabel = "tidal.dev/role";
inline constexpr const char* kPrepRole = "prep";
inline constexpr const char* kDataKeyAnnotation = "tidal.dev/data-key";
// The generation (membership round) a pod was created for: the scale step it belongs to.
inline constexpr const char* kCreatedForGenerationAnnotation = "tidal.dev/created-for-generation";
// Gang scheduling: every pod of one scale step is one group, created together.
inline constexpr const char* kKueuePodGroupLabel = "kueue.x-k8s.io/pod-group-name";
inline constexpr const char* kKueuePodGroupCountAnnotation = "kueue.x-k8s.io/pod-group-total-count";
inline constexpr const char* kVolcanoGroupAnnotation = "scheduling.k8s.io/group-name";

inline constexpr int kControlPort = 50051;  // tidal.worker.v1
// The generation's c10d TCPStore, hosted by its rank 0 on kStorePort + generation % kStorePorts:
// consecutive generations never share a port, so a rank cannot reach the store of the
// generation before (still closing on the same pod) instead of its own.
inline constexpr int kStorePort = 29400;
inline constexpr int kStorePorts = 8;
inline int StorePort(int64_t generation) {
  return kStorePort + static_cast<int>(generation % kStorePorts);
}
inline constexpr int kMetricsPort = 9090;
// The group the worker image runs as (deploy/docker/worker.Dockerfile: USER 65532:65532). Worker
// pods set it as fsGroup, so that the kubelet gives their 0400 Secret volumes (token, S3, TLS)
// that group with read access; an image that runs as root reads them either way.
inline constexpr int kWorkerFsGroup = 65532;

inline constexpr const char* kSpecMountPath = "/etc/tidal/job";
inline constexpr const char* kSpecKey = "trainingjob.json";
inline constexpr const char* kTokenMountPath = "/etc/tidal/token";
inline constexpr const char* kTlsMountPath = "/etc/tidal/tls";
// The name a worker's certificate must hold (spec.worker.tlsSecretName): its Service's.
inline std::string WorkerTlsServerName(const std::string& job, const std::string& ns) {
  return job + "-workers." + ns + ".svc";
}
inline constexpr const char* kTokenKey = "token";

// The TrainingJob a child belongs to.
struct JobRef {
  std::string name, namespace_, uid;
};

// Label values are at most 63 characters: longer job names are cut and suffixed with a hash.
std::string JobLabelValue(const std::string& job_name);
std::string ServiceName(const std::string& job_name);      // <job>-workers
std::string TokenSecretName(const std::string& job_name);  // <job>-token
// The store of a job whose spec names none, under the operator's --default-checkpoint-root:
// <root>/<namespace>/<name>/<uid>. The UID keeps a job made again under the same name (deleted
// and re-applied) from resuming the deleted one's checkpoints.
std::string DefaultCheckpointUri(const std::string& root, const JobRef& job);
std::string SpecConfigMapName(const std::string& job_name);        // <job>-spec
std::string WorkerPodName(const std::string& job_name, int slot);  // <job>-worker-<slot>
// The pod group of one scale step: <job>-g<generation>.
std::string PodGroupName(const std::string& job_name, int64_t generation);
// Which spec the data phase ran for: a hash of spec.model, spec.dataset and spec.lora (what
// tidal-prep reads and checks), 16 hex digits.
std::string DataKey(const nlohmann::json& raw_spec);
// The data phase's pod of one attempt: <job>-prep-<first 8 of the key>-<attempt>.
std::string PrepPodName(const std::string& job_name, const std::string& data_key, int64_t attempt);

// metadata.labels every child carries (the job label, app.kubernetes.io/*).
nlohmann::json ChildLabels(const JobRef& job);
// The controller ownerReference (cascading deletion, blockOwnerDeletion).
nlohmann::json ControllerRef(const JobRef& job);

// 32 random bytes, base64url without padding (43 characters).
StatusOr<std::string> NewToken();

nlohmann::json HeadlessService(const JobRef& job);
nlohmann::json TokenSecret(const JobRef& job, const std::string& token);
// The whole TrainingJob the workers read (name and spec), as JSON.
nlohmann::json SpecConfigMap(const JobRef& job, const nlohmann::json& spec);

struct WorkerPodOptions {
  int slot = 0;
  int64_t generation = 0;  // the scale step it is created for (gang group)
  int group_size = 1;      // pods created together in that step
  // Where checkpoints go when spec.checkpoint.uri is empty (the operator's default store).
  std::string default_checkpoint_uri;
  // The token store of the data phase (status.data.storeUri): TIDAL_DATASET_STORE.
  std::string dataset_store;
};

// The data phase: `tidal-prep --config <the spec> --result /dev/termination-log` in the
// workers' image, with their store access, env, tolerations, CPU and memory — no GPU and not
// their nodeSelector (a GPU pool); restartPolicy Never (the controller retries with backoff). Its
// termination message (FallbackToLogsOnError) is the outcome.
nlohmann::json PrepPod(const JobRef& job, const api::TrainingJobSpec& spec, const std::string& name,
                       const std::string& data_key);

// One worker: tidal-worker with the spec and token mounted, its pod IP from the downward
// API, the control port probed for readiness, gpusPerPod nvidia.com/gpu, the user's
// resources/nodeSelector/tolerations/env, restartPolicy Never (the operator replaces
// workers; a restarted process would rejoin nothing).
nlohmann::json WorkerPod(const JobRef& job, const api::TrainingJobSpec& spec,
                         const WorkerPodOptions& options);

}  // namespace tidal::reconciler
