// kube/pod_cache.cc
#include "kube/pod_cache.h"

#include "kube/meta_time.h"

namespace tidal::kube {
namespace {

using nlohmann::json;

const json& Child(const json& j, const char* key) {
  static const json kNull;
  if (!j.is_object()) return kNull;
  auto it = j.find(key);
  return it == j.end() ? kNull : *it;
}

std::string Text(const json& j, const char* key, const std::string& fallback = "") {
  const json& v = Child(j, key);
  return v.is_string() ? v.get<std::string>() : fallback;
}

std::vector<std::pair<std::string, std::string>> Kept(const json& map,
                                                      const std::set<std::string>& keys) {
  std::vector<std::pair<std::string, std::string>> out;
  if (!map.is_object()) return out;
  for (const std::string& key : keys)
    if (auto it = map.find(key); it != map.end() && it->is_string())
      out.emplace_back(key, it->get<std::string>());
  return out;
}

std::string Find(const std::vector<std::pair<std::string, std::string>>& kept,
                 const std::string& key) {
  for (const auto& [k, v] : kept)
    if (k == key) return v;
  return "";
}

// The ownerReference with controller: true, or null.
const json* ControllerRef(const json& metadata) {
  const json& refs = Child(metadata, "ownerReferences");
  if (!refs.is_array()) return nullptr;
  for (const json& r : refs)
    if (Child(r, "controller").is_boolean() && Child(r, "controller").get<bool>()) return &r;
  return nullptr;
}

}  // namespace

std::string CachedPod::Label(const std::string& key) const { return Find(labels, key); }
std::string CachedPod::Annotation(const std::string& key) const { return Find(annotations, key); }

CachedPod CachedPodOf(const json& pod, const PodCacheOptions& options) {
  CachedPod p;
  const json& md = Child(pod, "metadata");
  p.namespace_ = Text(md, "namespace");
  p.name = Text(md, "name");
  p.uid = Text(md, "uid");
  if (const json* ref = ControllerRef(md)) p.controller_uid = Text(*ref, "uid");
  p.labels = Kept(Child(md, "labels"), options.labels);
  p.annotations = Kept(Child(md, "annotations"), options.annotations);
  const json& deletion = Child(md, "deletionTimestamp");
  p.deleting = !deletion.is_null();
  if (deletion.is_string())
    if (auto t = ParseRfc3339(deletion.get<std::string>()); t.ok()) p.deletion_deadline = *t;
  const json& spec = Child(pod, "spec");
  p.node_name = Text(spec, "nodeName");
  p.tolerations = TolerationsOf(Child(spec, "tolerations"));
  // Set by the API server's Priority admission from spec.priorityClassName.
  if (const json& priority = Child(spec, "priority"); priority.is_number_integer())
    p.priority = priority.get<int64_t>();
  if (const json& containers = Child(spec, "containers"); containers.is_array())
    for (const json& c : containers) {
      const json& resources = Child(c, "resources");
      const json* quantity = &Child(Child(resources, "requests"), "nvidia.com/gpu");
      if (quantity->is_null()) quantity = &Child(Child(resources, "limits"), "nvidia.com/gpu");
      if (!quantity->is_null()) p.gpu_request += WholeQuantity(*quantity).value_or(0);
    }
  const json& status = Child(pod, "status");
  p.phase = ParsePodPhase(Text(status, "phase"));
  p.ip = Text(status, "podIP");
  if (const json& conditions = Child(status, "conditions"); conditions.is_array())
    for (const json& c : conditions) {
      const std::string type = Text(c, "type");
      if (type == "Ready") p.ready = Text(c, "status") == "True";
      if (type == "PodScheduled" && Text(c, "status") == "False")
        p.not_running_reason = Text(c, "reason") + ": " + Text(c, "message");
    }
  if (const json& statuses = Child(status, "containerStatuses"); statuses.is_array())
    for (const json& c : statuses) {
      const json& state = Child(c, "state");
      if (const json& t = Child(state, "terminated"); t.is_object()) {
        const json& code = Child(t, "exitCode");
        p.not_running_reason = Text(t, "reason", "Terminated") + " (exit code " +
                               std::to_string(code.is_number_integer() ? code.get<int>() : -1) +
                               ")";
        p.termination_message = Text(t, "message");
      } else if (const json& w = Child(state, "waiting"); w.is_object()) {
        p.not_running_reason = Text(w, "reason", "Waiting");
      }
    }
  return p;
}

void KeepIdentity(json& object) {
  const json& md = Child(object, "metadata");
  json kept = {{"name", Text(md, "name")}, {"namespace", Text(md, "namespace")}};
  if (const json* ref = ControllerRef(md))
    kept["ownerReferences"] = json::array({{{"kind", Text(*ref, "kind")},
                                            {"name", Text(*ref, "name")},
                                            {"uid", Text(*ref, "uid")},
                                            {"controller", true}}});
  object = {{"metadata", std::move(kept)}};
}

void KeepIdentityAndData(json& object) {
  json data = Child(object, "data");
  KeepIdentity(object);
  if (!data.is_null()) object["data"] = std::move(data);
}

std::shared_ptr<const CachedPod> PodCache::Apply(ObjectEvent::Type type, const json& pod,
                                                 std::shared_ptr<const CachedPod>* before) {
  const json& md = Child(pod, "metadata");
  const std::string key = Text(md, "namespace") + "/" + Text(md, "name");
  std::shared_ptr<const CachedPod> next;
  if (type != ObjectEvent::kDeleted)
    next = std::make_shared<const CachedPod>(CachedPodOf(pod, options_));
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pods_.find(key);
  if (before) *before = it != pods_.end() ? it->second : nullptr;
  if (it != pods_.end()) {
    UnindexLocked(key, *it->second);
    if (next)
      it->second = next;
    else
      pods_.erase(it);
  } else if (next) {
    pods_.emplace(key, next);
  }
  if (next && !next->controller_uid.empty()) by_controller_[next->controller_uid].insert(key);
  return next;
}

void PodCache::UnindexLocked(const std::string& key, const CachedPod& pod) {
  if (pod.controller_uid.empty()) return;
  auto it = by_controller_.find(pod.controller_uid);
  if (it == by_controller_.end()) return;
  it->second.erase(key);
  if (it->second.empty()) by_controller_.erase(it);
}

std::shared_ptr<const CachedPod> PodCache::Get(const std::string& ns,
                                               const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pods_.find(ns + "/" + name);
  return it == pods_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<const CachedPod>> PodCache::ByController(const std::string& uid) const {
  std::vector<std::shared_ptr<const CachedPod>> out;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_controller_.find(uid);
  if (it == by_controller_.end()) return out;
  for (const std::string& key : it->second) out.push_back(pods_.at(key));
  return out;
}

size_t PodCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pods_.size();
}

}  // namespace tidal::kube
