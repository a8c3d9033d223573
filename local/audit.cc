#include "local/audit.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <sstream>
#include <vector>

#include "kube/meta_time.h"

namespace tidal::local {
namespace {

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

}  // namespace

std::vector<std::string> PathSegments(const std::string& path) {
  std::vector<std::string> out;
  std::stringstream ss(path);
  std::string seg;
  while (std::getline(ss, seg, '/'))
    if (!seg.empty()) out.push_back(seg);
  return out;
}

RequestInfo ParseRequestInfo(const http::Request& request) {
  RequestInfo info;
  info.verb = Lower(request.method);
  std::vector<std::string> seg = PathSegments(request.path);
  size_t i = 0;
  if (seg.size() >= 2 && seg[0] == "api") {
    info.api_version = seg[1];
    i = 2;
  } else if (seg.size() >= 3 && seg[0] == "apis") {
    info.api_group = seg[1];
    info.api_version = seg[2];
    i = 3;
  } else {
    return info;  // /version, /healthz, /openapi/..., discovery of /api and /apis
  }
  if (i >= seg.size()) return info;  // discovery of one group version
  bool watch = false;
  if (seg[i] == "watch") {  // the deprecated /watch/ path prefix
    watch = true;
    ++i;
    if (i >= seg.size()) return info;
  }
  std::vector<std::string> rest(seg.begin() + static_cast<long>(i), seg.end());
  if (rest[0] == "namespaces" && rest.size() >= 3 && rest[2] != "status" && rest[2] != "finalize") {
    info.ns = rest[1];
    rest.erase(rest.begin(), rest.begin() + 2);
  } else if (rest[0] == "namespaces" && rest.size() >= 2) {
    info.ns = rest[1];  // the Namespace object: its namespace is itself, as upstream
  }
  info.resource_request = true;
  info.resource = rest[0];
  if (rest.size() >= 2) info.name = rest[1];
  if (rest.size() >= 3) info.subresource = rest[2];
  if (request.QueryValue("watch").value_or("") == "true" ||
      request.QueryValue("watch").value_or("") == "1")
    watch = true;
  const std::string& m = request.method;
  if (m == "GET" || m == "HEAD")
    info.verb = watch ? "watch" : (info.name.empty() ? "list" : "get");
  else if (m == "POST")
    info.verb = "create";
  else if (m == "PUT")
    info.verb = "update";
  else if (m == "PATCH")
    info.verb = "patch";
  else if (m == "DELETE")
    info.verb = info.name.empty() ? "deletecollection" : "delete";
  return info;
}

nlohmann::json AuditEvent(const http::Request& request, const RequestInfo& info, uint64_t id) {
  nlohmann::json e = {
      {"kind", "Event"},
      {"apiVersion", "audit.k8s.io/v1"},
      {"level", "Metadata"},
      {"auditID", std::to_string(id)},
      {"stage", "RequestReceived"},
      {"requestURI", request.target},
      {"verb", info.verb},
      {"userAgent", request.headers.Get("user-agent").value_or("")},
      {"requestReceivedTimestamp", kube::FormatMicroTime(std::chrono::system_clock::now())}};
  if (info.resource_request) {
    nlohmann::json ref = {{"resource", info.resource}, {"apiVersion", info.api_version}};
    if (!info.api_group.empty()) ref["apiGroup"] = info.api_group;
    if (!info.ns.empty()) ref["namespace"] = info.ns;
    if (!info.name.empty()) ref["name"] = info.name;
    if (!info.subresource.empty()) ref["subresource"] = info.subresource;
    e["objectRef"] = ref;
  }
  return e;
}

StatusOr<std::unique_ptr<AuditLog>> AuditLog::Open(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "ae");
  if (!f) return InvalidArgument("--audit-log: cannot open " + path + ": " + std::strerror(errno));
  return std::unique_ptr<AuditLog>(new AuditLog(f));
}

AuditLog::~AuditLog() { std::fclose(file_); }

void AuditLog::Record(const http::Request& request) {
  RequestInfo info = ParseRequestInfo(request);
  std::lock_guard<std::mutex> lock(mu_);
  std::string line = AuditEvent(request, info, next_id_++).dump() + "\n";
  std::fwrite(line.data(), 1, line.size(), file_);
  std::fflush(file_);
}

}  // namespace tidal::local
