// local/registry.cc
#include "local/registry.h"

#include <functional>
#include <set>

#include "common/strings.h"

namespace tidal::local {
namespace {

ResourceInfo Builtin(std::string group, std::string version, std::string plural,
                     std::string singular, std::string kind, bool namespaced,
                     std::vector<std::string> short_names = {}) {
  ResourceInfo r;
  r.group = std::move(group);
  r.version = std::move(version);
  r.plural = std::move(plural);
  r.singular = std::move(singular);
  r.kind = std::move(kind);
  r.list_kind = r.kind + "List";
  r.namespaced = namespaced;
  r.short_names = std::move(short_names);
  return r;
}

std::vector<ResourceInfo> BuiltinResources() {
  std::vector<ResourceInfo> out;
  auto add = [&](ResourceInfo r, bool status = false) {
    r.status_subresource = status;
    out.push_back(std::move(r));
  };
  add(Builtin("", "v1", "namespaces", "namespace", "Namespace", false, {"ns"}), true);
  ResourceInfo pods = Builtin("", "v1", "pods", "pod", "Pod", true, {"po"});
  pods.categories = {"all"};
  pods.log_subresource = true;
  pods.eviction_subresource = true;
  add(pods, true);
  ResourceInfo services = Builtin("", "v1", "services", "service", "Service", true, {"svc"});
  services.categories = {"all"};
  add(services, true);
  add(Builtin("", "v1", "secrets", "secret", "Secret", true));
  add(Builtin("", "v1", "configmaps", "configmap", "ConfigMap", true, {"cm"}));
  add(Builtin("", "v1", "events", "event", "Event", true, {"ev"}));
  add(Builtin("", "v1", "nodes", "node", "Node", false, {"no"}), true);
  add(Builtin("", "v1", "serviceaccounts", "serviceaccount", "ServiceAccount", true, {"sa"}));
  add(Builtin("", "v1", "endpoints", "endpoints", "Endpoints", true, {"ep"}));
  add(Builtin("", "v1", "persistentvolumeclaims", "persistentvolumeclaim", "PersistentVolumeClaim",
              true, {"pvc"}),
      true);
  for (auto [plural, singular, kind, shorts] :
       std::vector<std::tuple<std::string, std::string, std::string, std::vector<std::string>>>{
           {"deployments", "deployment", "Deployment", {"deploy"}},
           {"statefulsets", "statefulset", "StatefulSet", {"sts"}},
           {"replicasets", "replicaset", "ReplicaSet", {"rs"}}}) {
    ResourceInfo r = Builtin("apps", "v1", plural, singular, kind, true, shorts);
    r.categories = {"all"};
    r.scale = ScaleSpec{};
    add(r, true);
  }
  ResourceInfo ds = Builtin("apps", "v1", "daemonsets", "daemonset", "DaemonSet", true, {"ds"});
  ds.categories = {"all"};
  add(ds, true);
  add(Builtin("batch", "v1", "jobs", "job", "Job", true), true);
  add(Builtin("batch", "v1", "cronjobs", "cronjob", "CronJob", true, {"cj"}), true);
  add(Builtin("autoscaling", "v2", "horizontalpodautoscalers", "horizontalpodautoscaler",
              "HorizontalPodAutoscaler", true, {"hpa"}),
      true);
  add(Builtin("coordination.k8s.io", "v1", "leases", "lease", "Lease", true));
  const std::string rbac = "rbac.authorization.k8s.io";
  add(Builtin(rbac, "v1", "roles", "role", "Role", true));
  add(Builtin(rbac, "v1", "rolebindings", "rolebinding", "RoleBinding", true));
  add(Builtin(rbac, "v1", "clusterroles", "clusterrole", "ClusterRole", false));
  add(Builtin(rbac, "v1", "clusterrolebindings", "clusterrolebinding", "ClusterRoleBinding",
              false));
  add(Builtin("policy", "v1", "poddisruptionbudgets", "poddisruptionbudget", "PodDisruptionBudget",
              true, {"pdb"}),
      true);
  add(Builtin("networking.k8s.io", "v1", "networkpolicies", "networkpolicy", "NetworkPolicy", true,
              {"netpol"}));
  add(Builtin("networking.k8s.io", "v1", "ingresses", "ingress", "Ingress", true, {"ing"}), true);
  add(Builtin("scheduling.k8s.io", "v1", "priorityclasses", "priorityclass", "PriorityClass", false,
              {"pc"}));
  add(Builtin("events.k8s.io", "v1", "events", "event", "Event", true, {"ev"}));
  ResourceInfo crd =
      Builtin("apiextensions.k8s.io", "v1", "customresourcedefinitions", "customresourcedefinition",
              "CustomResourceDefinition", false, {"crd", "crds"});
  add(crd, true);
  ResourceInfo review = Builtin("authorization.k8s.io", "v1", "selfsubjectaccessreviews", "",
                                "SelfSubjectAccessReview", false);
  review.verbs = {"create"};
  add(review);
  return out;
}

nlohmann::json ResourceEntry(const ResourceInfo& r) {
  nlohmann::json e = {{"name", r.plural},
                      {"singularName", r.singular},
                      {"namespaced", r.namespaced},
                      {"kind", r.kind},
                      {"verbs", r.verbs}};
  if (!r.short_names.empty()) e["shortNames"] = r.short_names;
  if (!r.categories.empty()) e["categories"] = r.categories;
  return e;
}

std::string StringAt(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

}  // namespace

Registry::Registry() : builtin_(BuiltinResources()) {}

std::vector<ResourceInfo> Registry::All() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ResourceInfo> out = builtin_;
  for (const auto& [name, resources] : crds_)
    out.insert(out.end(), resources.begin(), resources.end());
  return out;
}

std::optional<ResourceInfo> Registry::Find(const std::string& group, const std::string& version,
                                           const std::string& plural) const {
  for (const auto& r : All())
    if (r.group == group && r.version == version && r.plural == plural) return r;
  return std::nullopt;
}

std::optional<ResourceInfo> Registry::FindKind(const std::string& api_version,
                                               const std::string& kind) const {
  for (const auto& r : All())
    if (r.api_version() == api_version && r.kind == kind) return r;
  return std::nullopt;
}

StatusOr<std::vector<ResourceInfo>> Registry::ResourcesOfCrd(const nlohmann::json& crd) {
  if (!crd.is_object()) return InvalidArgument("expected a CustomResourceDefinition object");
  const nlohmann::json spec = crd.value("spec", nlohmann::json::object());
  if (!spec.is_object()) return InvalidArgument("spec: expected an object");
  std::string group = StringAt(spec, "group");
  if (group.empty() || group.find('.') == std::string::npos)
    return InvalidArgument("spec.group: expected a DNS subdomain with at least one dot");
  const nlohmann::json names = spec.value("names", nlohmann::json::object());
  std::string plural = StringAt(names, "plural");
  std::string kind = StringAt(names, "kind");
  if (plural.empty()) return InvalidArgument("spec.names.plural: Required value");
  if (kind.empty()) return InvalidArgument("spec.names.kind: Required value");
  std::string name = crd.contains("metadata") ? StringAt(crd["metadata"], "name") : "";
  if (name != plural + "." + group)
    return InvalidArgument("metadata.name: must be spec.names.plural+\".\"+spec.group (\"" +
                           plural + "." + group + "\")");
  std::string scope = StringAt(spec, "scope");
  if (scope != "Namespaced" && scope != "Cluster")
    return InvalidArgument("spec.scope: Unsupported value: \"" + scope +
                           "\": supported values: \"Cluster\", \"Namespaced\"");
  const nlohmann::json versions = spec.value("versions", nlohmann::json::array());
  if (!versions.is_array() || versions.empty())
    return InvalidArgument(
        "spec.versions: Required value: must have exactly one version marked "
        "as storage version");
  int storage = 0;
  std::vector<ResourceInfo> out;
  for (size_t i = 0; i < versions.size(); ++i) {
    const auto& v = versions[i];
    std::string at = "spec.versions[" + std::to_string(i) + "]";
    if (!v.is_object() || StringAt(v, "name").empty())
      return InvalidArgument(at + ".name: Required value");
    // (Found by fuzz/apiserver_fuzz.cc: `served: truE`, a string, answered 500.)
    for (const char* flag : {"served", "storage"})
      if (v.contains(flag) && !v[flag].is_boolean())
        return InvalidArgument(at + "." + flag + ": Invalid value: " + v[flag].type_name() +
                               ": must be a boolean");
    if (v.value("storage", false)) ++storage;
    if (!v.value("served", false)) continue;
    ResourceInfo r;
    r.group = group;
    r.version = StringAt(v, "name");
    r.plural = plural;
    r.singular = StringAt(names, "singular");
    if (r.singular.empty()) {
      r.singular = kind;
      r.singular = AsciiLower(r.singular);
    }
    r.kind = kind;
    r.list_kind = StringAt(names, "listKind").empty() ? kind + "List" : StringAt(names, "listKind");
    r.namespaced = scope == "Namespaced";
    if (names.contains("shortNames") && names["shortNames"].is_array())
      for (const auto& s : names["shortNames"])
        if (s.is_string()) r.short_names.push_back(s);
    if (names.contains("categories") && names["categories"].is_array())
      for (const auto& s : names["categories"])
        if (s.is_string()) r.categories.push_back(s);
    r.custom = true;
    if (!v.contains("schema") || !v["schema"].is_object() ||
        !v["schema"].contains("openAPIV3Schema") || !v["schema"]["openAPIV3Schema"].is_object())
      return InvalidArgument(at + ".schema.openAPIV3Schema: Required value: schemas are required");
    r.schema = v["schema"]["openAPIV3Schema"];
    if (v.contains("subresources") && v["subresources"].is_object()) {
      const auto& sub = v["subresources"];
      r.status_subresource = sub.contains("status");
      if (sub.contains("scale") && sub["scale"].is_object()) {
        ScaleSpec scale;
        scale.spec_replicas_path = StringAt(sub["scale"], "specReplicasPath");
        scale.status_replicas_path = StringAt(sub["scale"], "statusReplicasPath");
        scale.label_selector_path = StringAt(sub["scale"], "labelSelectorPath");
        if (scale.spec_replicas_path.empty())
          return InvalidArgument(at + ".subresources.scale.specReplicasPath: Required value");
        if (scale.status_replicas_path.empty())
          return InvalidArgument(at + ".subresources.scale.statusReplicasPath: Required value");
        r.scale = scale;
      }
    }
    if (v.contains("additionalPrinterColumns") && v["additionalPrinterColumns"].is_array()) {
      for (size_t c = 0; c < v["additionalPrinterColumns"].size(); ++c) {
        const auto& col = v["additionalPrinterColumns"][c];
        std::string cat = at + ".additionalPrinterColumns[" + std::to_string(c) + "]";
        PrinterColumn p;
        p.name = StringAt(col, "name");
        p.type = StringAt(col, "type");
        p.json_path = StringAt(col, "jsonPath");
        p.description = StringAt(col, "description");
        p.format = StringAt(col, "format");
        p.priority = col.value("priority", 0);
        if (p.name.empty()) return InvalidArgument(cat + ".name: Required value");
        if (p.json_path.empty() || p.json_path[0] != '.')
          return InvalidArgument(cat + ".jsonPath: must be a simple json path starting with .");
        r.printer_columns.push_back(p);
      }
    }
    out.push_back(std::move(r));
  }
  if (storage != 1)
    return InvalidArgument(
        "spec.versions: Invalid value: must have exactly one version marked as "
        "storage version");
  return out;
}

bool Registry::Conflicts(const std::string& crd_name,
                         const std::vector<ResourceInfo>& resources) const {
  for (const auto& existing : All()) {
    if (existing.custom && existing.qualified() == crd_name) continue;
    for (const auto& r : resources)
      if (existing.group == r.group && (existing.plural == r.plural || existing.kind == r.kind))
        return true;
  }
  return false;
}

void Registry::AddCrd(const std::string& crd_name, std::vector<ResourceInfo> resources) {
  std::lock_guard<std::mutex> lock(mu_);
  crds_[crd_name] = std::move(resources);
}

void Registry::RemoveCrd(const std::string& crd_name) {
  std::lock_guard<std::mutex> lock(mu_);
  crds_.erase(crd_name);
}

nlohmann::json Registry::CoreVersions() const {
  return {{"kind", "APIVersions"},
          {"versions", {"v1"}},
          {"serverAddressByClientCIDRs",
           {{{"clientCIDR", "0.0.0.0/0"}, {"serverAddress", "127.0.0.1"}}}}};
}

namespace {
// Groups in first-seen order, each with its versions in first-seen order.
std::vector<std::pair<std::string, std::vector<std::string>>> GroupVersions(
    const std::vector<ResourceInfo>& all) {
  std::vector<std::pair<std::string, std::vector<std::string>>> out;
  for (const auto& r : all) {
    if (r.group.empty()) continue;
    auto it = std::find_if(out.begin(), out.end(), [&](auto& g) { return g.first == r.group; });
    if (it == out.end()) {
      out.push_back({r.group, {}});
      it = out.end() - 1;
    }
    if (std::find(it->second.begin(), it->second.end(), r.version) == it->second.end())
      it->second.push_back(r.version);
  }
  return out;
}

nlohmann::json GroupJson(const std::string& group, const std::vector<std::string>& versions) {
  nlohmann::json g = {{"name", group}, {"versions", nlohmann::json::array()}};
  for (const auto& v : versions)
    g["versions"].push_back({{"groupVersion", group + "/" + v}, {"version", v}});
  g["preferredVersion"] = g["versions"][0];
  return g;
}
}  // namespace

nlohmann::json Registry::GroupList() const {
  nlohmann::json list = {
      {"kind", "APIGroupList"}, {"apiVersion", "v1"}, {"groups", nlohmann::json::array()}};
  for (const auto& [group, versions] : GroupVersions(All()))
    list["groups"].push_back(GroupJson(group, versions));
  return list;
}

std::optional<nlohmann::json> Registry::Group(const std::string& group) const {
  for (const auto& [g, versions] : GroupVersions(All())) {
    if (g != group) continue;
    nlohmann::json out = GroupJson(g, versions);
    out["kind"] = "APIGroup";
    out["apiVersion"] = "v1";
    return out;
  }
  return std::nullopt;
}

std::optional<nlohmann::json> Registry::ResourceList(const std::string& group,
                                                     const std::string& version) const {
  nlohmann::json resources = nlohmann::json::array();
  bool any = false;
  for (const auto& r : All()) {
    if (r.group != group || r.version != version) continue;
    any = true;
    resources.push_back(ResourceEntry(r));
    if (r.status_subresource)
      resources.push_back({{"name", r.plural + "/status"},
                           {"singularName", ""},
                           {"namespaced", r.namespaced},
                           {"kind", r.kind},
                           {"verbs", {"get", "patch", "update"}}});
    if (r.scale)
      resources.push_back({{"name", r.plural + "/scale"},
                           {"singularName", ""},
                           {"namespaced", r.namespaced},
                           {"group", "autoscaling"},
                           {"version", "v1"},
                           {"kind", "Scale"},
                           {"verbs", {"get", "patch", "update"}}});
    // kubectl drain evicts when this entry is listed (with its group and version), and
    // deletes otherwise.
    if (r.eviction_subresource)
      resources.push_back({{"name", r.plural + "/eviction"},
                           {"singularName", ""},
                           {"namespaced", r.namespaced},
                           {"group", "policy"},
                           {"version", "v1"},
                           {"kind", "Eviction"},
                           {"verbs", {"create"}}});
    if (r.log_subresource)
      resources.push_back({{"name", r.plural + "/log"},
                           {"singularName", ""},
                           {"namespaced", r.namespaced},
                           {"kind", r.kind},
                           {"verbs", {"get"}}});
  }
  if (!any && !(group.empty() && version == "v1")) return std::nullopt;
  return nlohmann::json{{"kind", "APIResourceList"},
                        {"apiVersion", "v1"},
                        {"groupVersion", group.empty() ? version : group + "/" + version},
                        {"resources", resources}};
}

nlohmann::json Registry::OpenApiRoot() const {
  nlohmann::json paths = nlohmann::json::object();
  std::set<std::pair<std::string, std::string>> seen;
  for (const auto& r : All()) {
    if (!seen.insert({r.group, r.version}).second) continue;
    std::string key = r.group.empty() ? "api/" + r.version : "apis/" + r.group + "/" + r.version;
    auto doc = OpenApiGroupVersion(r.group, r.version);
    std::string hash = std::to_string(std::hash<std::string>{}(doc ? doc->dump() : ""));
    paths[key] = {{"serverRelativeURL", "/openapi/v3/" + key + "?hash=" + hash}};
  }
  return {{"paths", paths}};
}

std::optional<nlohmann::json> Registry::OpenApiGroupVersion(const std::string& group,
                                                            const std::string& version) const {
  // What kubectl's validation reads (see ../shared/notes/kubectl-wire.md): each kind's PATCH
  // operation names its group-version-kind and accepts fieldValidation, so kubectl leaves the
  // schema check to the server (fieldValidation=Strict).
  nlohmann::json paths = nlohmann::json::object();
  bool any = false;
  for (const auto& r : All()) {
    if (r.group != group || r.version != version) continue;
    any = true;
    std::string base = group.empty() ? "/api/" + version : "/apis/" + group + "/" + version;
    if (r.namespaced) base += "/namespaces/{namespace}";
    nlohmann::json gvk = {{"group", group}, {"version", version}, {"kind", r.kind}};
    nlohmann::json field_validation = {
        {"name", "fieldValidation"}, {"in", "query"}, {"schema", {{"type", "string"}}}};
    nlohmann::json op = {{"x-kubernetes-group-version-kind", gvk},
                         {"parameters", {field_validation}},
                         {"responses", {{"200", {{"description", "OK"}}}}}};
    paths[base + "/" + r.plural + "/{name}"] = {
        {"get", op}, {"put", op}, {"patch", op}, {"delete", op}};
    paths[base + "/" + r.plural] = {{"get", op}, {"post", op}};
  }
  if (!any) return std::nullopt;
  return nlohmann::json{{"openapi", "3.0.0"},
                        {"info", {{"title", "Kubernetes (tidal local)"}, {"version", "v1.32.0"}}},
                        {"paths", paths},
                        {"components", {{"schemas", nlohmann::json::object()}}}};
}

}  // namespace tidal::local
