// local/pod_spec.h — what the process kubelet decides from a Pod spec before it starts
// anything, as pure functions (table-tested without processes): which node a pod fits on
// (nvidia.com/gpu requests against allocatable, node selectors), which local executable an
// image stands for, the container's argv/env/working directory (env from values, Secrets,
// ConfigMaps and the downward API; $(VAR) expansion; mount paths translated into the pod's
// directory), and the pod phase from its containers and restart policy.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "kube/types.h"

namespace tidal::local {

// Annotation the kubelet writes at binding: the node-local GPU indices a pod holds ("0,1"),
// exported to its containers as NVIDIA_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES.
inline constexpr const char* kGpuIdsAnnotation = "tidal.dev/local-gpu-ids";
inline constexpr const char* kGpuResource = "nvidia.com/gpu";

// Image reference → local executable. The same Pod spec runs in a real cluster (the image)
// and here (the executable). PATH "host" means the container's command runs from the host's
// PATH (for base images such as busybox or debian). A container command names the entrypoint
// (by base name), another executable beside it, or one on the host's PATH.
class ImageTable {
 public:
  ImageTable();  // busybox, alpine, debian and ubuntu map to "host"
  // "NAME=PATH" (the --image flag); refuses anything else, naming what was expected.
  Status Add(const std::string& entry);
  void Set(const std::string& image, const std::string& path) { entries_[image] = path; }
  // The exact reference first, then the repository without tag or digest.
  std::optional<std::string> Find(const std::string& image) const;

 private:
  std::map<std::string, std::string> entries_;
};
// "reg.io/a/b:1.0@sha256:…" → "reg.io/a/b"; a registry port ("host:5000/x") is kept.
std::string ImageRepository(const std::string& image);

// The pod's nvidia.com/gpu request: the sum over containers, or the largest init container's
// when that is more (the scheduler's effective request). Limits stand in for missing requests.
// Not a whole non-negative number → an error naming the field.
StatusOr<int64_t> PodGpuRequest(const nlohmann::json& pod);

using kube::Taint;
using kube::Tolerates;

struct NodeInfo {
  std::string name;
  std::map<std::string, std::string> labels;
  int64_t gpus = 0;
  bool unschedulable = false;      // spec.unschedulable: cordoned (`kubectl cordon`, a drain)
  std::vector<Taint> taints = {};  // spec.taints
};

// The node's fields the scheduler reads from its object: spec.unschedulable and spec.taints.
void ReadNodeSpec(const nlohmann::json& node, NodeInfo& info);

struct ScheduleResult {
  std::string node;          // empty: unschedulable
  std::vector<int> gpu_ids;  // node-local indices given to the pod
  std::string message;       // why not, in the scheduler's words
};

// The GPUs that bound, unfinished pods hold on each node: their recorded ids, or for pods
// bound without ids (by hand, `spec.nodeName`) their count. Built once per scheduling pass,
// linear in the pods, and updated as the pass binds, so a pass over N pods costs O(N) and not
// O(N) per pending pod.
class GpuUsage {
 public:
  GpuUsage() = default;
  // Counts `pod` when it is bound and not finished.
  void Add(const nlohmann::json& pod);
  // Records GPUs given to `pod`, just bound to `node` (and the pod itself, for affinity).
  void Hold(const std::string& node, const std::vector<int>& ids,
            const nlohmann::json& pod = nullptr);
  const std::set<int>& ids(const std::string& node) const;
  int64_t unnumbered(const std::string& node) const;
  // The bound, unfinished pods on a node, as pod affinity reads them.
  struct Placed {
    std::string namespace_;
    std::map<std::string, std::string> labels;
  };
  const std::vector<Placed>& pods(const std::string& node) const;

 private:
  struct Held {
    std::set<int> ids;
    int64_t unnumbered = 0;
    std::vector<Placed> pods;
  };
  std::map<std::string, Held> nodes_;
};

// Picks a node for `pod` among `nodes` given what the other pods hold: nodeSelector must
// match; a cordoned node takes only pods that tolerate node.kubernetes.io/unschedulable, and a
// node's NoSchedule and NoExecute taints only pods that tolerate them (kube-scheduler's
// NodeUnschedulable and TaintToleration filters); GPUs must fit. Among fitting nodes the one
// that scores highest on the pod's preferred pod affinity wins (kube-scheduler's
// InterPodAffinity score: the weights of the terms a node's topology domain meets, a term met
// where a bound pod of its namespaces matches its labelSelector's matchLabels), then the one
// with the fewest free GPUs (bin packing keeps whole nodes free for large jobs), then by name.
// (Required affinity, anti-affinity and matchExpressions are not read.)
ScheduleResult Schedule(const nlohmann::json& pod, const std::vector<NodeInfo>& nodes,
                        const GpuUsage& usage);
// The same against a list of pods (`pod` itself, by uid, does not count).
ScheduleResult Schedule(const nlohmann::json& pod, const std::vector<NodeInfo>& nodes,
                        const std::vector<nlohmann::json>& pods);

// A volume as the process sees it: mountPath inside the container, hostPath on this machine.
struct Mount {
  std::string mount_path;
  std::string host_path;
};
// Every path in `value` that lies under a mount path — the whole value, "--flag=/path", or a
// path inside a shell command line — is rewritten onto the mount's host directory; the
// longest matching mount wins; "/etc/cfgx" is not under "/etc/cfg".
std::string TranslatePath(const std::string& value, const std::vector<Mount>& mounts);
// Kubernetes' $(VAR) expansion of command, args and env values: known variables are
// replaced, unknown references kept verbatim, "$$" is an escaped "$".
std::string ExpandVars(const std::string& text, const std::map<std::string, std::string>& env);

struct LaunchError {
  std::string reason;  // ErrImagePull, CreateContainerConfigError, …
  std::string message;
};

// What the kubelet knows of the pod when it prepares a container.
struct PodContext {
  std::string pod_ip;
  std::string node_name;
  std::string pod_dir;  // the pod's own directory: working directory and HOME
  std::vector<Mount> mounts;
  std::map<std::string, std::string> base_env;  // PATH, KUBERNETES_SERVICE_*, GPU ids, …
  // Secret or ConfigMap by kind and name in the pod's namespace; nullopt if absent.
  std::function<std::optional<nlohmann::json>(const std::string& kind, const std::string& name)>
      lookup;
};

struct ContainerLaunch {
  std::vector<std::string> argv;  // argv[0] resolved to an executable path
  std::map<std::string, std::string> env;
  std::string working_dir;
};

// Everything needed to exec one container, or why it cannot start.
std::variant<ContainerLaunch, LaunchError> PrepareContainer(const nlohmann::json& pod,
                                                            const nlohmann::json& container,
                                                            const ImageTable& images,
                                                            const PodContext& context);

// The mounts of `container` given where each of the pod's volumes lives on the host.
std::vector<Mount> ContainerMounts(const nlohmann::json& container,
                                   const std::map<std::string, std::string>& volume_dirs);

// What a container is doing, as the kubelet tracks it.
struct ContainerRun {
  enum State { kWaiting, kRunning, kTerminated } state = kWaiting;
  int exit_code = 0;
  bool terminated_before = false;  // waiting to restart after an exit (back-off)
};
// restartPolicy Always | OnFailure | Never: whether a container that exited with `exit_code`
// is started again.
bool ShouldRestart(const std::string& restart_policy, int exit_code);
// The pod phase (Pending, Running, Succeeded, Failed) as kubelet's getPhase derives it.
std::string PodPhase(const std::string& restart_policy, const std::vector<ContainerRun>& runs);

}  // namespace tidal::local
