// kube/request.cc
#include "kube/request.h"

#include <cctype>

#include "common/http/message.h"

namespace tidal::kube {
namespace {

StatusOr<std::string> CollectionPath(const Resource& r, const std::string& ns) {
  if (r.version.empty() || r.plural.empty())
    return InvalidArgument("resource: version and plural are required");
  std::string path = r.group.empty() ? "/api/" + r.version : "/apis/" + r.group + "/" + r.version;
  if (r.namespaced) {
    if (ns.empty()) {
      // A namespaced collection without a namespace lists across all namespaces (as kubectl -A).
    } else {
      TIDAL_RETURN_IF_ERROR(ValidateObjectName(ns).WithContext("namespace"));
      path += "/namespaces/" + ns;
    }
  } else if (!ns.empty()) {
    return InvalidArgument("namespace: " + r.plural + " are cluster-scoped, got namespace \"" + ns +
                           "\"");
  }
  return path + "/" + r.plural;
}

StatusOr<std::string> ObjectPath(const Resource& r, const std::string& ns, const std::string& name,
                                 const std::string& subresource) {
  if (r.namespaced && ns.empty()) return InvalidArgument("namespace: required for " + r.plural);
  TIDAL_RETURN_IF_ERROR(ValidateObjectName(name).WithContext("metadata.name"));
  if (!subresource.empty() && subresource != "status" && subresource != "scale")
    return InvalidArgument("subresource: expected status or scale, got \"" + subresource + "\"");
  TIDAL_ASSIGN_OR_RETURN(std::string path, CollectionPath(r, ns));
  path += "/" + name;
  if (!subresource.empty()) path += "/" + subresource;
  return path;
}

void AddSelectors(Request& req, const std::string& labels, const std::string& fields) {
  if (!labels.empty()) req.query.emplace_back("labelSelector", labels);
  if (!fields.empty()) req.query.emplace_back("fieldSelector", fields);
}

}  // namespace

std::string Request::Target() const {
  std::string target = path;
  for (size_t i = 0; i < query.size(); ++i)
    target += (i == 0 ? "?" : "&") + query[i].first + "=" + http::PercentEncode(query[i].second);
  return target;
}

Status ValidateObjectName(const std::string& name) {
  if (name.empty()) return InvalidArgument("must not be empty");
  if (name.size() > 253)
    return InvalidArgument("\"" + name.substr(0, 20) + "...\" is longer than 253 characters");
  for (char c : name)
    if (!(std::islower(static_cast<unsigned char>(c)) ||
          std::isdigit(static_cast<unsigned char>(c)) || c == '-' || c == '.'))
      return InvalidArgument("\"" + name +
                             "\" must consist of lower case alphanumerics, '-' or '.' (RFC 1123)");
  if (!std::isalnum(static_cast<unsigned char>(name.front())) ||
      !std::isalnum(static_cast<unsigned char>(name.back())))
    return InvalidArgument("\"" + name + "\" must start and end with an alphanumeric character");
  return OkStatus();
}

StatusOr<Request> GetRequest(const Resource& r, const std::string& ns, const std::string& name,
                             const std::string& subresource) {
  TIDAL_ASSIGN_OR_RETURN(std::string path, ObjectPath(r, ns, name, subresource));
  return Request{"GET", path, {}, std::nullopt, ""};
}

StatusOr<Request> ListRequest(const Resource& r, const std::string& ns, const ListOptions& o) {
  TIDAL_ASSIGN_OR_RETURN(std::string path, CollectionPath(r, ns));
  Request req{"GET", path, {}, std::nullopt, ""};
  AddSelectors(req, o.label_selector, o.field_selector);
  if (o.limit) {
    if (*o.limit <= 0) return InvalidArgument("limit: must be > 0");
    req.query.emplace_back("limit", std::to_string(*o.limit));
  }
  if (!o.continue_token.empty()) req.query.emplace_back("continue", o.continue_token);
  if (!o.resource_version.empty()) req.query.emplace_back("resourceVersion", o.resource_version);
  return req;
}

StatusOr<Request> WatchRequest(const Resource& r, const std::string& ns, const WatchOptions& o) {
  TIDAL_ASSIGN_OR_RETURN(std::string path, CollectionPath(r, ns));
  Request req{"GET", path, {{"watch", "true"}}, std::nullopt, ""};
  AddSelectors(req, o.label_selector, o.field_selector);
  if (!o.resource_version.empty()) req.query.emplace_back("resourceVersion", o.resource_version);
  if (o.allow_watch_bookmarks) req.query.emplace_back("allowWatchBookmarks", "true");
  if (o.timeout_seconds) {
    if (*o.timeout_seconds <= 0) return InvalidArgument("timeoutSeconds: must be > 0");
    req.query.emplace_back("timeoutSeconds", std::to_string(*o.timeout_seconds));
  }
  return req;
}

StatusOr<Request> CreateRequest(const Resource& r, const std::string& ns,
                                const nlohmann::json& object) {
  if (!object.is_object()) return InvalidArgument("body: expected an object");
  TIDAL_ASSIGN_OR_RETURN(std::string path, CollectionPath(r, ns));
  if (r.namespaced && ns.empty()) return InvalidArgument("namespace: required for " + r.plural);
  return Request{"POST", path, {}, object.dump(), "application/json"};
}

StatusOr<Request> ReplaceRequest(const Resource& r, const std::string& ns, const std::string& name,
                                 const nlohmann::json& object, const std::string& subresource) {
  if (!object.is_object()) return InvalidArgument("body: expected an object");
  TIDAL_ASSIGN_OR_RETURN(std::string path, ObjectPath(r, ns, name, subresource));
  return Request{"PUT", path, {}, object.dump(), "application/json"};
}

StatusOr<Request> MergePatchRequest(const Resource& r, const std::string& ns,
                                    const std::string& name, const nlohmann::json& patch,
                                    const std::string& subresource) {
  if (!patch.is_object()) return InvalidArgument("patch: a merge patch must be an object");
  TIDAL_ASSIGN_OR_RETURN(std::string path, ObjectPath(r, ns, name, subresource));
  return Request{"PATCH", path, {}, patch.dump(), "application/merge-patch+json"};
}

StatusOr<Request> DeleteRequest(const Resource& r, const std::string& ns, const std::string& name,
                                const DeleteOptions& o) {
  TIDAL_ASSIGN_OR_RETURN(std::string path, ObjectPath(r, ns, name, ""));
  if (!o.propagation_policy.empty() && o.propagation_policy != "Foreground" &&
      o.propagation_policy != "Background" && o.propagation_policy != "Orphan")
    return InvalidArgument("propagationPolicy: expected Foreground, Background or Orphan, got \"" +
                           o.propagation_policy + "\"");
  nlohmann::json body = {{"apiVersion", "v1"}, {"kind", "DeleteOptions"}};
  if (!o.propagation_policy.empty()) body["propagationPolicy"] = o.propagation_policy;
  if (o.grace_period_seconds) body["gracePeriodSeconds"] = *o.grace_period_seconds;
  if (o.precondition_uid) body["preconditions"]["uid"] = *o.precondition_uid;
  if (o.precondition_resource_version)
    body["preconditions"]["resourceVersion"] = *o.precondition_resource_version;
  return Request{"DELETE", path, {}, body.dump(), "application/json"};
}

}  // namespace tidal::kube
