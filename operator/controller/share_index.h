// operator/controller/share_index.h — the inputs of the cluster's GPU shares (planner/share.h),
// kept current from the informers' events, and the shares themselves: computed again whenever
// an input changes (a job's spec, phase or size; a node; a pod of another workload that waits
// for GPUs or holds them) and at most a second after a pass asks (schedule windows open with the
// clock alone). A job whose share changes is woken, so that the job above its share shrinks
// when another's minimum or a higher-priority pod needs its GPUs, without a poll.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "api/training_job.h"
#include "kube/pod_cache.h"
#include "operator/planner/share.h"

namespace tidal::controller {

class OperatorMetrics;

class ShareIndex {
 public:
  using Clock = std::chrono::system_clock;
  // `wake(job)`: the job's share changed. Called without the index's lock held.
  // `metrics` (may be null): the cluster's GPUs and the give-back times are recorded there.
  ShareIndex(std::function<void(const std::string& job)> wake,
             std::optional<int64_t> yield_to_priority, std::function<Clock::time_point()> now,
             OperatorMetrics* metrics = nullptr);

  // A TrainingJob as its informer caches it now; null: deleted.
  void SetJob(const std::string& key, const nlohmann::json* job);
  // A pod of another workload (not a TrainingJob's) as cached now; null: gone.
  void SetOtherPod(const std::string& key, const kube::CachedPod* pod);
  // A node as its informer caches it now; null: gone.
  void SetNode(const std::string& name, const nlohmann::json* node);
  // A PriorityClass's value (none: deleted): the priority of the jobs that name it.
  void SetPriorityClass(const std::string& name, std::optional<int64_t> value);

  // The job's share (none: not indexed — deleted, finished, or an invalid spec), computed
  // again first when older than a second.
  std::optional<planner::Share> Get(const std::string& key);

 private:
  struct Job {
    std::shared_ptr<const api::TrainingJobSpec> spec;  // null: not shared (invalid, finished)
    std::vector<int64_t> allowed;
    int64_t metadata_generation = -1;
    Clock::time_point created{};
    int64_t current = 0;
  };
  struct Node {
    int64_t gpus = 0;
    bool open = false;  // Ready and schedulable
  };
  struct OtherPod {
    int64_t gpus = 0, priority = 0;
    std::string node;  // "": waiting to be scheduled
  };
  // Computes the shares, and returns the jobs whose share changed. Under mu_.
  std::vector<std::string> RecomputeLocked();
  void Recompute();

  const std::function<void(const std::string&)> wake_;
  const std::optional<int64_t> yield_to_priority_;
  const std::function<Clock::time_point()> now_;
  OperatorMetrics* const metrics_;
  std::mutex mu_;
  std::map<std::string, Job> jobs_;
  std::map<std::string, Node> nodes_;
  std::map<std::string, OtherPod> others_;
  std::map<std::string, int64_t> priority_classes_;  // value by name
  std::map<std::string, planner::Share> shares_;
  Clock::time_point computed_{};
  // Pending pods of other workloads some job yields to, since when (the give-back's start).
  std::map<std::string, Clock::time_point> yielded_since_;
};

}  // namespace tidal::controller
