// kube/request.h — pure request builders (kube-rs style): resource + options →
// method, path, query and body. No sockets: the HTTP client sends what these return, and the
// unit tests check them without a server. Semantics follow the Kubernetes API conventions
// (k8s.io/apimachinery): paths /api/v1/... for the core group, /apis/GROUP/VERSION/...
// otherwise; namespaced resources live under namespaces/NS.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace tidal::kube {

// Which collection a request is about.
struct Resource {
  std::string group;  // "" for the core group (pods, services, ...)
  std::string version;
  std::string plural;
  bool namespaced = true;

  static Resource Pods() { return {"", "v1", "pods", true}; }
  static Resource Services() { return {"", "v1", "services", true}; }
  static Resource Secrets() { return {"", "v1", "secrets", true}; }
  static Resource ConfigMaps() { return {"", "v1", "configmaps", true}; }
  static Resource Events() { return {"", "v1", "events", true}; }
  static Resource Nodes() { return {"", "v1", "nodes", false}; }
  static Resource Leases() { return {"coordination.k8s.io", "v1", "leases", true}; }
  static Resource PriorityClasses() {
    return {"scheduling.k8s.io", "v1", "priorityclasses", false};
  }
  static Resource CustomResourceDefinitions() {
    return {"apiextensions.k8s.io", "v1", "customresourcedefinitions", false};
  }
  static Resource TrainingJobs() { return {"tidal.dev", "v1alpha1", "trainingjobs", true}; }
};

struct Request {
  std::string method;
  std::string path;
  std::vector<std::pair<std::string, std::string>> query;
  std::optional<std::string> body;
  std::string content_type;  // of the body, when there is one
  // path?k=v&... with every value percent-encoded (RFC 3986 unreserved kept).
  std::string Target() const;
};

struct ListOptions {
  std::string label_selector;
  std::string field_selector;
  std::optional<int64_t> limit;
  std::string continue_token;
  std::string resource_version;
};

struct WatchOptions {
  std::string resource_version;  // watch events after this version
  bool allow_watch_bookmarks = true;
  std::optional<int64_t> timeout_seconds;
  std::string label_selector;
  std::string field_selector;
};

struct DeleteOptions {
  std::string propagation_policy;  // "", Foreground, Background, Orphan
  std::optional<std::string> precondition_uid;
  std::optional<std::string> precondition_resource_version;
  std::optional<int64_t> grace_period_seconds;
};

// `subresource` is "", "status" or "scale".
StatusOr<Request> GetRequest(const Resource& r, const std::string& ns, const std::string& name,
                             const std::string& subresource = "");
StatusOr<Request> ListRequest(const Resource& r, const std::string& ns, const ListOptions& o);
StatusOr<Request> WatchRequest(const Resource& r, const std::string& ns, const WatchOptions& o);
StatusOr<Request> CreateRequest(const Resource& r, const std::string& ns,
                                const nlohmann::json& object);
// PUT of the whole object; its metadata.resourceVersion makes it a compare-and-swap (409).
StatusOr<Request> ReplaceRequest(const Resource& r, const std::string& ns, const std::string& name,
                                 const nlohmann::json& object, const std::string& subresource = "");
// RFC 7386 JSON merge patch (application/merge-patch+json).
StatusOr<Request> MergePatchRequest(const Resource& r, const std::string& ns,
                                    const std::string& name, const nlohmann::json& patch,
                                    const std::string& subresource = "");
StatusOr<Request> DeleteRequest(const Resource& r, const std::string& ns, const std::string& name,
                                const DeleteOptions& o = {});

// RFC 1123 subdomain (names of most kinds): lowercase alphanumerics, '-' and '.', ≤ 253.
Status ValidateObjectName(const std::string& name);

}  // namespace tidal::kube
