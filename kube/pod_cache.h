// kube/pod_cache.h — the pods an operator reads, typed and cut down to what it reads
// (controller-runtime's cache with a TransformFunc, kube-rs's reflector over a projection):
// a Pod's JSON tree costs about 7.7× its text in an informer's store; a CachedPod, with the
// identity stub the informer keeps beside it (KeepIdentity), about 1× (informer_memory_bench).
// Fed by the pods informer's observe hook; read by any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "kube/types.h"
#include "kube/watcher.h"

namespace tidal::kube {

struct CachedPod {
  std::string namespace_, name, uid;
  std::string controller_uid;  // the ownerReference with controller: true
  // The labels and annotations the cache was asked to keep (PodCacheOptions), by key.
  std::vector<std::pair<std::string, std::string>> labels, annotations;
  bool deleting = false;  // metadata.deletionTimestamp set
  std::optional<std::chrono::system_clock::time_point> deletion_deadline;  // its value
  std::string node_name;                                                   // spec.nodeName
  std::vector<PodToleration> tolerations;                                  // spec.tolerations
  int64_t gpu_request = 0;              // nvidia.com/gpu of its containers (requests, else limits)
  int64_t priority = 0;                 // spec.priority (its PriorityClass's value)
  PodPhase phase = PodPhase::kPending;  // status.phase
  std::string ip;                       // status.podIP
  bool ready = false;                   // condition Ready=True
  // Why it does not run, when it does not: "Unschedulable: 0/3 nodes ...", "Error (exit code
  // 1)", "ImagePullBackOff" (the PodScheduled=False condition, then its container's state).
  std::string not_running_reason;
  std::string termination_message;  // of its (last) terminated container

  std::string Label(const std::string& key) const;
  std::string Annotation(const std::string& key) const;
  bool Finished() const { return phase == PodPhase::kSucceeded || phase == PodPhase::kFailed; }
  bool operator==(const CachedPod&) const = default;
};

struct PodCacheOptions {
  std::set<std::string> labels, annotations;  // the keys kept
};

// The pod as the cache keeps it. Lenient: the API server validated the pod; a field of an
// unexpected shape takes its default.
CachedPod CachedPodOf(const nlohmann::json& pod, const PodCacheOptions& options = {});

// The informer transform that goes with a PodCache, and with any cache whose readers ask only
// whether an object is there and whose it is: metadata.name, namespace and the controller's
// ownerReference (kind, name, uid) — what the store's keys and owner indexes and an owner's
// work-queue key need — and nothing else.
void KeepIdentity(nlohmann::json& object);
// KeepIdentity, and the object's `data` (a Secret whose value is read).
void KeepIdentityAndData(nlohmann::json& object);

class PodCache {
 public:
  explicit PodCache(PodCacheOptions options = {}) : options_(std::move(options)) {}
  PodCache(const PodCache&) = delete;
  PodCache& operator=(const PodCache&) = delete;

  // The pods informer's observe hook. Returns the pod as now cached (null once deleted);
  // `before`, when given, gets it as cached until now (null: it was not).
  std::shared_ptr<const CachedPod> Apply(ObjectEvent::Type type, const nlohmann::json& pod,
                                         std::shared_ptr<const CachedPod>* before = nullptr);

  std::shared_ptr<const CachedPod> Get(const std::string& ns, const std::string& name) const;
  // The pods whose controller ownerReference has `uid`, by name.
  std::vector<std::shared_ptr<const CachedPod>> ByController(const std::string& uid) const;
  size_t size() const;

 private:
  void UnindexLocked(const std::string& key, const CachedPod& pod);

  const PodCacheOptions options_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<const CachedPod>> pods_;          // by "namespace/name"
  std::unordered_map<std::string, std::set<std::string>> by_controller_;  // uid -> keys
};

}  // namespace tidal::kube
