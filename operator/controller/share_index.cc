// operator/controller/share_index.cc
#include "operator/controller/share_index.h"

#include "common/log.h"
#include "kube/meta_time.h"
#include "kube/types.h"
#include "operator/controller/metrics.h"
#include "operator/planner/planner.h"

namespace tidal::controller {

using nlohmann::json;

ShareIndex::ShareIndex(std::function<void(const std::string&)> wake,
                       std::optional<int64_t> yield_to_priority,
                       std::function<Clock::time_point()> now, OperatorMetrics* metrics)
    : wake_(std::move(wake)),
      yield_to_priority_(yield_to_priority),
      now_(std::move(now)),
      metrics_(metrics) {}

void ShareIndex::SetJob(const std::string& key, const json* job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!job) {
      if (!jobs_.erase(key)) return;
    } else {
      const json& md = job->value("metadata", json::object());
      const json& status = job->value("status", json::object());
      const std::string phase = status.is_object() ? status.value("phase", "") : "";
      const json& gpus = status.is_object() ? status.value("gpus", json::object()) : json();
      const int64_t current = gpus.is_object() && gpus.value("current", json()).is_number_integer()
                                  ? gpus["current"].get<int64_t>()
                                  : 0;
      // A finished, suspended or deleted job holds nothing and wants nothing; nor does one that
      // cannot run until its spec is edited (Ready=False: InvalidSpec, ConfigurationError,
      // StatusUnreadable — refused by the operator, its data phase or its workers).
      bool runnable = true;
      if (status.is_object())
        for (const json& c : status.value("conditions", json::array()))
          if (c.is_object() && c.value("type", "") == "Ready" && c.value("status", "") == "False") {
            const std::string reason = c.value("reason", "");
            runnable = reason != "InvalidSpec" && reason != "ConfigurationError" &&
                       reason != "StatusUnreadable";
          }
      const bool sharing = runnable && phase != "Succeeded" && phase != "Failed" &&
                           phase != "Suspended" &&
                           (!md.contains("deletionTimestamp") || md["deletionTimestamp"].is_null());
      const int64_t generation = md.value("generation", int64_t{0});
      Job& j = jobs_[key];
      const bool spec_changed = j.metadata_generation != generation;
      if (!spec_changed && j.current == current && (j.spec != nullptr) == sharing) return;
      j.metadata_generation = generation;
      j.current = current;
      if (const json* created =
              md.contains("creationTimestamp") && md["creationTimestamp"].is_string()
                  ? &md["creationTimestamp"]
                  : nullptr)
        if (auto t = kube::ParseRfc3339(created->get<std::string>()); t.ok()) j.created = *t;
      j.spec.reset();
      j.allowed.clear();
      if (sharing) {
        std::string refused;
        auto spec = api::ParseManagedJobSpec(job->value("spec", json::object()), &refused);
        if (spec.ok()) {
          j.allowed = spec->AllowedGpuCounts();
          j.spec = std::make_shared<const api::TrainingJobSpec>(std::move(*spec));
        }
      }
    }
  }
  Recompute();
}

void ShareIndex::SetOtherPod(const std::string& key, const kube::CachedPod* pod) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::optional<OtherPod> now;
    if (pod && pod->gpu_request > 0 && !pod->Finished() && !pod->deleting)
      now = OtherPod{pod->gpu_request, pod->priority, pod->node_name};
    // A pod the jobs yielded to, now bound: how long the GPUs took to come back.
    if (auto since = yielded_since_.find(key);
        since != yielded_since_.end() && (!now || !now->node.empty())) {
      if (now && metrics_)
        metrics_->ObserveGiveBack(std::chrono::duration<double>(now_() - since->second).count());
      yielded_since_.erase(since);
    }
    auto it = others_.find(key);
    if (!now) {
      if (it == others_.end()) return;
      others_.erase(it);
    } else {
      if (it != others_.end() && it->second.gpus == now->gpus &&
          it->second.priority == now->priority && it->second.node == now->node)
        return;
      others_[key] = *now;
    }
  }
  Recompute();
}

void ShareIndex::SetNode(const std::string& name, const json* object) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::optional<Node> now;
    if (object)
      if (auto node = kube::NodeFromJson(*object); node.ok())
        now = Node{node->AllocatableGpus(), node->Ready() && !node->unschedulable};
    auto it = nodes_.find(name);
    if (!now) {
      if (it == nodes_.end()) return;
      nodes_.erase(it);
    } else {
      if (it != nodes_.end() && it->second.gpus == now->gpus && it->second.open == now->open)
        return;
      nodes_[name] = *now;
    }
  }
  Recompute();
}

void ShareIndex::SetPriorityClass(const std::string& name, std::optional<int64_t> value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = priority_classes_.find(name);
    if (!value) {
      if (it == priority_classes_.end()) return;
      priority_classes_.erase(it);
    } else {
      if (it != priority_classes_.end() && it->second == *value) return;
      priority_classes_[name] = *value;
    }
  }
  Recompute();
}

std::optional<planner::Share> ShareIndex::Get(const std::string& key) {
  std::vector<std::string> changed;
  std::optional<planner::Share> share;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (now_() - computed_ >= std::chrono::seconds(1)) changed = RecomputeLocked();
    if (auto it = shares_.find(key); it != shares_.end()) share = it->second;
  }
  for (const std::string& job : changed)
    if (job != key) wake_(job);
  return share;
}

void ShareIndex::Recompute() {
  std::vector<std::string> changed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    changed = RecomputeLocked();
  }
  for (const std::string& job : changed) wake_(job);
}

std::vector<std::string> ShareIndex::RecomputeLocked() {
  const Clock::time_point now = now_();
  computed_ = now;
  planner::ShareInput in;
  in.yield_to_priority = yield_to_priority_;
  for (const auto& [name, node] : nodes_)
    if (node.open) in.gpus += node.gpus;
  for (const auto& [key, pod] : others_) {
    if (pod.node.empty()) {
      in.waiting.push_back({key, pod.gpus, pod.priority});
      continue;
    }
    auto node = nodes_.find(pod.node);
    if (node != nodes_.end() && node->second.open) in.gpus -= pod.gpus;
  }
  in.gpus = std::max<int64_t>(in.gpus, 0);
  for (const auto& [key, j] : jobs_) {
    if (!j.spec) continue;
    planner::ShareJob s;
    s.key = key;
    s.priority = j.spec->elastic.priority;
    // A PriorityClass not (yet) there counts as priority 0; its pods are refused until it is.
    if (const std::string& c = j.spec->elastic.priority_class_name; !c.empty())
      s.priority = priority_classes_.count(c) ? priority_classes_.at(c) : 0;
    s.weight = j.spec->elastic.weight;
    s.created = j.created;
    s.min_gpus = j.spec->elastic.min_gpus;
    s.allowed = j.allowed;
    s.wanted = planner::WantedGpus(*j.spec, now);
    s.current = j.current;
    in.jobs.push_back(std::move(s));
  }
  std::map<std::string, planner::Share> shares = planner::ShareGpus(in);
  int64_t given = 0, asked = 0;
  for (const auto& [key, s] : shares) given += s.gpus;
  for (const planner::WaitingPod& p : in.waiting) {
    asked += p.gpus;
    bool yielded = false;
    for (const planner::ShareJob& j : in.jobs)
      yielded = yielded || planner::Yields(j.priority, p.priority, in.yield_to_priority);
    if (yielded) yielded_since_.try_emplace(p.key, now);
  }
  if (metrics_) metrics_->SetClusterGpus(in.gpus, given, asked);
  std::vector<std::string> changed;
  for (const auto& [key, s] : shares) {
    auto before = shares_.find(key);
    if (before == shares_.end() || before->second.gpus != s.gpus ||
        before->second.admitted != s.admitted || before->second.urgent != s.urgent ||
        before->second.reason != s.reason) {
      changed.push_back(key);
      if (before == shares_.end() || before->second.gpus != s.gpus ||
          before->second.admitted != s.admitted)
        LogInfo("share", {{"job", key},
                          {"gpus", s.gpus},
                          {"admitted", s.admitted},
                          {"urgent", s.urgent},
                          {"reason", s.reason}});
    }
  }
  shares_ = std::move(shares);
  return changed;
}

}  // namespace tidal::controller
