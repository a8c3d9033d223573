// local/registry.h — which resources `tidal local` serves: the built-in kinds that
// the operator, manifests and Helm charts use, and every kind a stored CustomResourceDefinition
// declares. It produces the discovery documents (/api, /apis, group versions) and the OpenAPI
// v3 documents kubectl's validation needs. Pure: no I/O, no storage.
#pragma once

#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace tidal::local {

struct PrinterColumn {
  std::string name, type, json_path, description, format;
  int priority = 0;
};

struct ScaleSpec {
  std::string spec_replicas_path = ".spec.replicas";
  std::string status_replicas_path = ".status.replicas";
  std::string label_selector_path;  // optional
};

struct ResourceInfo {
  std::string group;  // "" for core
  std::string version;
  std::string plural;
  std::string singular;
  std::string kind;
  std::string list_kind;
  bool namespaced = true;
  std::vector<std::string> short_names;
  std::vector<std::string> categories;
  std::vector<std::string> verbs{"create", "delete", "deletecollection", "get",
                                 "list",   "patch",  "update",           "watch"};
  bool status_subresource = false;
  std::optional<ScaleSpec> scale;
  bool log_subresource = false;                // pods/log
  bool eviction_subresource = false;           // pods/eviction (policy/v1 Eviction)
  bool custom = false;                         // from a CustomResourceDefinition
  nlohmann::json schema;                       // openAPIV3Schema (custom kinds), null otherwise
  std::vector<PrinterColumn> printer_columns;  // custom kinds only

  std::string api_version() const { return group.empty() ? version : group + "/" + version; }
  // The storage key prefix: "<group>/<plural>".
  std::string storage_resource() const { return group + "/" + plural; }
  // "trainingjobs.tidal.dev", "pods": how errors name the resource (as kube-apiserver).
  std::string qualified() const { return group.empty() ? plural : plural + "." + group; }
};

class Registry {
 public:
  Registry();  // with the built-in kinds

  std::optional<ResourceInfo> Find(const std::string& group, const std::string& version,
                                   const std::string& plural) const;
  // The served version (first one) of a kind, e.g. to resolve ownerReferences' apiVersion/kind.
  std::optional<ResourceInfo> FindKind(const std::string& api_version,
                                       const std::string& kind) const;
  std::vector<ResourceInfo> All() const;

  // Validates a CustomResourceDefinition (apiextensions.k8s.io/v1) and returns the resources it
  // declares; errors name the field (spec.names.plural, spec.versions[0].schema, ...).
  static StatusOr<std::vector<ResourceInfo>> ResourcesOfCrd(const nlohmann::json& crd);
  // Serves / stops serving what a CRD declares (keyed by the CRD's name).
  void AddCrd(const std::string& crd_name, std::vector<ResourceInfo> resources);
  void RemoveCrd(const std::string& crd_name);
  // Whether a kind or plural of this group is already served by something else.
  bool Conflicts(const std::string& crd_name, const std::vector<ResourceInfo>& resources) const;

  // Discovery (k8s.io/apimachinery/pkg/apis/meta/v1 types).
  nlohmann::json CoreVersions() const;                                  // /api  APIVersions
  nlohmann::json GroupList() const;                                     // /apis APIGroupList
  std::optional<nlohmann::json> Group(const std::string& group) const;  // /apis/g APIGroup
  std::optional<nlohmann::json> ResourceList(const std::string& group,
                                             const std::string& version) const;
  // OpenAPI v3: the root index and one document per group version.
  nlohmann::json OpenApiRoot() const;
  std::optional<nlohmann::json> OpenApiGroupVersion(const std::string& group,
                                                    const std::string& version) const;

 private:
  mutable std::mutex mu_;
  std::vector<ResourceInfo> builtin_;
  std::map<std::string, std::vector<ResourceInfo>> crds_;  // by CRD name
};

}  // namespace tidal::local
