// kube/types.h — typed views of the built-in kinds Tidal reads and writes: Pod,
// Service, Secret, ConfigMap, Node, CustomResourceDefinition and metav1.Status (Lease lives
// with leader election, Event with the recorder). Each struct holds the fields the operator
// uses, typed, and the whole object it came from in `raw`: ToJson writes the typed fields over
// `raw`, so a read-modify-write keeps every field this code does not know. FromJson refuses
// wrong types naming the field (e.g. "spec.containers[0].ports[1].containerPort: expected an
// integer"). Pure: no I/O.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "kube/object.h"

namespace tidal::kube {

// Nested structs keep their own `raw` too, so fields this code does not know (a condition's
// lastProbeTime, an env var's valueFrom) survive a write.
struct Condition {
  std::string type, status, reason, message, last_transition_time;
  nlohmann::json raw = nlohmann::json::object();
};

struct EnvVar {
  std::string name, value;
  nlohmann::json raw = nlohmann::json::object();  // valueFrom, when set
};

struct ContainerPort {
  std::string name;
  int32_t container_port = 0;
  nlohmann::json raw = nlohmann::json::object();
};

struct Container {
  std::string name, image;
  std::vector<std::string> command, args;
  std::vector<EnvVar> env;
  std::vector<ContainerPort> ports;
  std::map<std::string, std::string> limits, requests;  // quantities as written
  nlohmann::json raw = nlohmann::json::object();
};

// Read-only summary of a container's status (the kubelet writes those, not Tidal).
struct ContainerStatus {
  std::string name;
  bool ready = false;
  int32_t restart_count = 0;
  std::string state;  // "running", "waiting" or "terminated"
  std::string reason;
  std::optional<int32_t> exit_code;
};

// status.phase of a Pod. What a newer API server might add, and an absent phase on a pod the
// kubelet has not reported yet, read as the phases they stand for (ParsePodPhase).
enum class PodPhase { kPending, kRunning, kSucceeded, kFailed, kUnknown };
// "" is kPending (a pod no kubelet has reported on); a value this build does not know is
// kUnknown, as Kubernetes' own "Unknown" (the pod's state cannot be obtained).
PodPhase ParsePodPhase(std::string_view text);
const char* PodPhaseName(PodPhase phase);

struct Pod {
  ObjectMeta metadata;
  // spec
  std::string node_name, restart_policy, service_account_name;
  std::map<std::string, std::string> node_selector;
  std::optional<int64_t> termination_grace_period_seconds;
  std::vector<Container> containers;
  // status
  PodPhase phase = PodPhase::kPending;
  std::string pod_ip, host_ip, start_time;
  std::vector<Condition> conditions;
  std::vector<ContainerStatus> container_statuses;
  nlohmann::json raw = nlohmann::json::object();

  // The pod's nvidia.com/gpu request (limits stand in for requests, as for extended resources).
  int64_t GpuRequest() const;
  bool Ready() const;  // condition Ready=True
  bool Finished() const { return phase == PodPhase::kSucceeded || phase == PodPhase::kFailed; }
};

struct ServicePort {
  std::string name, protocol;
  int32_t port = 0;
  nlohmann::json raw = nlohmann::json::object();  // targetPort (number or name), nodePort
};

struct Service {
  ObjectMeta metadata;
  std::string cluster_ip, type;
  std::map<std::string, std::string> selector;
  std::vector<ServicePort> ports;
  bool publish_not_ready_addresses = false;
  nlohmann::json raw = nlohmann::json::object();
};

struct Secret {
  ObjectMeta metadata;
  std::string type;
  std::map<std::string, std::string> data;  // decoded bytes (the API carries base64)
  nlohmann::json raw = nlohmann::json::object();
};

struct ConfigMap {
  ObjectMeta metadata;
  std::map<std::string, std::string> data;
  nlohmann::json raw = nlohmann::json::object();
};

// A node taint (spec.taints): key, value, effect (NoSchedule, PreferNoSchedule, NoExecute),
// and when a NoExecute one was put on (timeAdded, RFC 3339; "" when not said).
struct Taint {
  std::string key, value, effect, time_added = {};
};
// The node object's spec.taints; entries that are not objects are skipped.
std::vector<Taint> TaintsOf(const nlohmann::json& node);

// How the pod's spec.tolerations take `taint`, as the scheduler and the taint manager match
// them: operator Exists (any value; an empty key: every taint) or Equal (the default: the same
// value); an empty effect tolerates every effect.
struct Toleration {
  bool tolerated = false;
  // For a tolerated NoExecute taint: the tolerationSeconds of the first matching toleration,
  // as upstream's taint manager takes it (≤ 0: evicted at once; none: tolerated for good).
  std::optional<int64_t> seconds = {};
};
// One of a pod's spec.tolerations.
struct PodToleration {
  std::string key, op, value, effect;  // op: Exists | Equal ("" = Equal)
  std::optional<int64_t> seconds;      // tolerationSeconds
  bool operator==(const PodToleration&) const = default;
};
// A spec.tolerations list (entries that are not objects are skipped, as the server would
// have refused them).
std::vector<PodToleration> TolerationsOf(const nlohmann::json& tolerations);
Toleration TolerationOf(const std::vector<PodToleration>& tolerations, const Taint& taint);
// Of the pod's spec.tolerations.
Toleration TolerationOf(const nlohmann::json& pod, const Taint& taint);
inline bool Tolerates(const nlohmann::json& pod, const Taint& taint) {
  return TolerationOf(pod, taint).tolerated;
}

struct Node {
  ObjectMeta metadata;
  bool unschedulable = false;
  std::vector<Taint> taints;  // spec.taints (read only: written back through `raw`)
  std::map<std::string, std::string> capacity, allocatable;
  std::vector<Condition> conditions;
  nlohmann::json raw = nlohmann::json::object();

  int64_t AllocatableGpus() const;  // nvidia.com/gpu, 0 when absent or not a whole number
  bool Ready() const;
};

struct CrdVersion {
  std::string name;
  bool served = false, storage = false;
  nlohmann::json raw = nlohmann::json::object();  // schema, subresources, printer columns
};

struct CustomResourceDefinition {
  ObjectMeta metadata;
  std::string group, scope, kind, plural, singular;
  std::vector<std::string> short_names, categories;
  std::vector<CrdVersion> versions;
  std::vector<Condition> conditions;
  nlohmann::json raw = nlohmann::json::object();

  bool Established() const;
};

struct StatusCause {
  std::string reason, message, field;
};

// metav1.Status, as the API server answers errors.
struct ApiStatus {
  std::string status, message, reason;
  int32_t code = 0;
  std::vector<StatusCause> causes;
  nlohmann::json raw = nlohmann::json::object();
};

StatusOr<Pod> PodFromJson(const nlohmann::json& json);
nlohmann::json ToJson(const Pod& pod);
StatusOr<Service> ServiceFromJson(const nlohmann::json& json);
nlohmann::json ToJson(const Service& service);
// A value that is not valid base64 is refused, naming its key.
StatusOr<Secret> SecretFromJson(const nlohmann::json& json);
nlohmann::json ToJson(const Secret& secret);
StatusOr<ConfigMap> ConfigMapFromJson(const nlohmann::json& json);
nlohmann::json ToJson(const ConfigMap& config_map);
StatusOr<Node> NodeFromJson(const nlohmann::json& json);
nlohmann::json ToJson(const Node& node);
StatusOr<CustomResourceDefinition> CrdFromJson(const nlohmann::json& json);
nlohmann::json ToJson(const CustomResourceDefinition& crd);
StatusOr<ApiStatus> ApiStatusFromJson(const nlohmann::json& json);
nlohmann::json ToJson(const ApiStatus& status);

// Parses a Kubernetes quantity of a countable resource ("2", 2); nullopt for anything else
// (fractions, suffixed quantities, negatives).
std::optional<int64_t> WholeQuantity(const nlohmann::json& value);

}  // namespace tidal::kube
