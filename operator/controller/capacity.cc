// operator/controller/capacity.cc — the GPU capacity index: what bound pods hold (counted as
// the pod informer sees them change), what the pods a plan creates book until they are bound,
// and what is idle for a job on the nodes that would take its workers.
#include <set>

#include "operator/controller/controller_internal.h"

namespace tidal::controller {

using nlohmann::json;
using reconciler::As;
using reconciler::Decide;
using shell::Key;
using shell::NodeNotice;
using shell::NodeSilent;

Plan TrainingJobController::DecideWithCapacity(Observed& observed) {
  observed.share = shares_.Get(Key(observed.namespace_, observed.name));
  std::lock_guard<std::mutex> lock(capacity_mu_);
  observed.idle_gpus =
      IdleGpus(observed.spec.ok() ? observed.spec->worker.tolerations : json::array());
  Plan plan = Decide(observed, options_.reconcile);
  if (observed.spec.ok())
    for (const Action& a : plan.actions)
      if (const auto* create = As<action::CreatePods>(a))
        for (const std::string& pod : create->pods)
          booked_gpus_[Key(observed.namespace_, pod)] = {observed.spec->elastic.gpus_per_pod,
                                                         observed.now};
  return plan;
}

int64_t TrainingJobController::IdleGpus(const json& tolerations) {
  int64_t allocatable = 0;
  std::set<std::string> closed;  // nodes that offer nothing
  const std::vector<kube::PodToleration> worker = kube::TolerationsOf(tolerations);
  for (const kube::ObjectPtr& n : nodes_->store().List()) {
    auto node = kube::NodeFromJson(*n);
    // A node that is not Ready (lost, its kubelet silent), cordoned (`kubectl cordon`, a
    // drain) or about to evict the job's workers (NodeNotice: a NoExecute taint) offers
    // nothing, and what its pods hold is not taken from the others.
    const bool shut = !node.ok() || NodeSilent(*node) || !NodeNotice(worker, *node).empty();
    if (node.ok() && shut) closed.insert(node->metadata.name);
    if (shut) continue;
    auto it = node->allocatable.find("nvidia.com/gpu");
    if (it != node->allocatable.end()) allocatable += std::atoll(it->second.c_str());
  }
  // Requested by any bound pod, the job's own included: what is left is truly idle (the
  // planner adds what the job holds itself).
  int64_t requested = held_total_;
  if (!closed.empty())
    for (const auto& [key, held] : held_gpus_)
      if (closed.count(held.node)) requested -= held.gpus;
  // Bookings end with their pod's events (CountPod); one whose pod never showed up (its
  // creation failed) ends after a minute.
  const auto now = Clock::now();
  for (auto it = booked_gpus_.begin(); it != booked_gpus_.end();) {
    if (now - it->second.at > std::chrono::minutes(1)) {
      it = booked_gpus_.erase(it);
    } else {
      requested += it->second.gpus;
      ++it;
    }
  }
  return std::max<int64_t>(0, allocatable - requested);
}

void TrainingJobController::CountPod(const std::string& key, const kube::CachedPod* pod) {
  int64_t gpus = 0;
  std::string node;
  if (pod && !pod->Finished() && !pod->node_name.empty()) {
    gpus = pod->gpu_request;
    node = pod->node_name;
  }
  std::lock_guard<std::mutex> lock(capacity_mu_);
  // A booked pod bound to a node now counts as held; one finished or deleted before it was
  // bound (an abandoned scale-up's) holds nothing: either way its booking ends here, in the
  // same step, so its GPUs are never counted twice nor idle for a moment too early.
  if (!pod || !pod->node_name.empty() || pod->Finished()) booked_gpus_.erase(key);
  auto it = held_gpus_.find(key);
  held_total_ += gpus - (it == held_gpus_.end() ? 0 : it->second.gpus);
  if (gpus > 0)
    held_gpus_[key] = {gpus, node};
  else if (it != held_gpus_.end())
    held_gpus_.erase(it);
}

}  // namespace tidal::controller
