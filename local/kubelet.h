// local/kubelet.h — `tidal local`'s process kubelet: binds Pods to the local nodes
// when their nvidia.com/gpu requests fit (else Pending, PodScheduled=False, Unschedulable),
// runs each container's command as a local process in its own process group (the image →
// executable table of pod_spec.h), with env, Secret and ConfigMap volumes materialised under
// DIR/pods/<ns>/<pod>, a loopback address of its own (127.B.x.y, in a block B no other
// `tidal local` on the machine holds) as status.podIP, output
// captured to DIR/logs/<ns>/<pod>/<container>.log for `kubectl logs`, phases and container
// statuses, exit codes, restart policy with CrashLoopBackOff, readiness probes (tcpSocket,
// httpGet), and graceful deletion: SIGTERM to the process group, SIGKILL after the grace
// period, then the final delete. Children die with the kubelet's thread (PR_SET_PDEATHSIG), so
// no process outlives `tidal local`, even after kill -9. Level-triggered: every pass compares
// what the store says with the processes it has.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "local/apiserver.h"
#include "local/pod_spec.h"

namespace tidal::local {

struct KubeletOptions {
  std::string data_dir;
  std::vector<NodeInfo> nodes;
  ImageTable images;
  int api_port = 0;  // exported as KUBERNETES_SERVICE_HOST/PORT
  std::chrono::milliseconds initial_backoff{std::chrono::seconds(10)};  // CrashLoopBackOff start
  std::chrono::milliseconds max_backoff{std::chrono::minutes(5)};
  std::chrono::milliseconds resync{200};
  // Keep the output of every container run: before a log is replaced (a restart, a new pod of
  // the same name) or removed with its pod, it is linked under
  // DIR/logs-archive/<ns>/<pod>/<container>-<unix ms>-<n>.log, and a process still writing to it
  // goes on writing there (`tidal local --keep-logs`; what a cluster's log shipper keeps).
  bool keep_logs = false;
};

// A node annotated local.tidal.dev/lost=true (`kubectl annotate node tidal-node-1
// local.tidal.dev/lost=true`) is a machine that lost power: its pods' processes die at once, its
// kubelet posts nothing more (a pod deleted there stays Terminating, as on a real cluster), and
// what the node lifecycle controller does after its grace period is done at once: the node's
// Ready condition becomes Unknown and it is tainted node.kubernetes.io/unreachable (NoSchedule,
// NoExecute), so nothing is scheduled there. Without the annotation the node is back: Ready,
// untainted, and its kubelet finishes what was asked meanwhile (deletions, restarts).
inline constexpr const char* kLostNodeAnnotation = "local.tidal.dev/lost";

class ProcessKubelet {
 public:
  ProcessKubelet(ApiServer& api, KubeletOptions options);
  ~ProcessKubelet();
  // Starts the loop thread.
  void Start();
  // Kills every container (SIGTERM, then SIGKILL after a short grace) and stops the loop.
  void Stop();

  // Where a container's output goes; the API server serves it for pods/log.
  static std::string LogPath(const std::string& data_dir, const std::string& ns,
                             const std::string& pod, const std::string& container);

 private:
  struct Container;
  struct PodRuntime;

  void Run();
  void Pass();
  void Bind(const nlohmann::json& pod, const std::vector<NodeInfo>& nodes, GpuUsage& usage);
  // The nodes annotated lost; a node that becomes lost (or comes back) is handled here.
  std::set<std::string> LostNodes();
  void MarkNode(const std::string& name, bool lost);
  // The taint manager's part: pods on a node with a NoExecute taint they do not tolerate (or
  // tolerate only for tolerationSeconds, now over) are deleted gracefully.
  void EvictForTaints(const nlohmann::json& pod, const NodeInfo& node);
  void Sync(const nlohmann::json& pod);
  void Terminate(PodRuntime& runtime, const nlohmann::json& pod);
  Status Materialise(PodRuntime& runtime, const nlohmann::json& pod);
  void StartContainer(PodRuntime& runtime, const nlohmann::json& pod, const nlohmann::json& spec,
                      Container& c);
  void RecordEvent(const nlohmann::json& pod, const std::string& type, const std::string& reason,
                   const std::string& message, const std::string& component);
  void Reap(PodRuntime& runtime);
  // The message of a terminated container (terminationMessagePath / Policy).
  static std::string TerminationMessage(const Container& c, const std::string& log);
  void Probe(PodRuntime& runtime, const nlohmann::json& pod);
  void WriteStatus(const nlohmann::json& pod, PodRuntime& runtime);
  void Forget(const std::string& uid);
  // With keep_logs: links `log` (of `container` of pod ns/name) into the archive.
  void KeepLog(const std::string& log, const std::string& ns, const std::string& pod,
               const std::string& container);
  // The lowest address of this kubelet's block that no pod holds (ips_in_use_, gathered by
  // the pass), taken.
  std::string AllocateIp();

  ApiServer& api_;
  KubeletOptions options_;
  std::map<std::string, std::unique_ptr<PodRuntime>> pods_;  // by uid, loop thread only
  std::set<std::string> ips_in_use_;                         // loop thread only
  // Pod addresses are 127.<block_>.x.y: a /16 of the loopback network this process holds
  // alone on the machine (an flock on /tmp/tidal-local-127.<block>.lock, released when the
  // process ends, however it ends), so two clusters on one machine never hand out the same
  // address and a job of one never reaches the other's workers. 0 when every block is held.
  int block_ = 0;
  int block_lock_ = -1;
  std::set<std::string> lost_;  // loop thread only
  // When this kubelet first saw a NoExecute taint without timeAdded, by node and taint key.
  std::map<std::string, std::chrono::system_clock::time_point> taint_seen_;  // loop thread only
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace tidal::local
