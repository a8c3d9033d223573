// local/audit.h — what kube-apiserver's RequestInfoFactory makes of a request (the
// verb, group, resource and subresource RBAC authorizes), and an audit log of them in the
// shape of audit.k8s.io/v1 Events (level Metadata, stage RequestReceived), one JSON line per
// request. `tidal local --audit-log PATH` writes it; the chart's RBAC test reads which calls
// the operator makes from it.
#pragma once

#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/http/message.h"
#include "common/status.h"

namespace tidal::local {

// The non-empty segments of a URL path: "/api/v1//pods" → {"api", "v1", "pods"}.
std::vector<std::string> PathSegments(const std::string& path);

struct RequestInfo {
  bool resource_request = false;  // under /api or /apis with a resource
  std::string verb;  // get list watch create update patch delete deletecollection; else the
                     // lower-case HTTP method (non-resource requests)
  std::string api_group, api_version, ns, resource, subresource, name;
};

// As k8s.io/apiserver/pkg/endpoints/request: GET of a name → get, of a collection → list, with
// watch=true (or under the legacy /watch/ prefix) → watch; POST → create; PUT → update; PATCH →
// patch; DELETE of a name → delete, of a collection → deletecollection. `namespaces/NAME` is
// the Namespace itself; `namespaces/NS/RESOURCE/...` is a resource in NS.
RequestInfo ParseRequestInfo(const http::Request& request);

// The audit.k8s.io/v1 Event for one request (auditID is the caller's counter).
nlohmann::json AuditEvent(const http::Request& request, const RequestInfo& info, uint64_t id);

class AuditLog {
 public:
  static StatusOr<std::unique_ptr<AuditLog>> Open(const std::string& path);
  ~AuditLog();
  void Record(const http::Request& request);  // thread-safe; a line per call, flushed

 private:
  explicit AuditLog(std::FILE* file) : file_(file) {}
  std::mutex mu_;
  std::FILE* file_;
  uint64_t next_id_ = 1;
};

}  // namespace tidal::local
