// local/api_error.h — errors as the Kubernetes API returns them: a metav1.Status with
// code, reason and message (kubectl prints the message), and details naming the object and,
// for 422 Invalid, one cause per field. Pure.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "local/registry.h"
#include "local/schema.h"

namespace tidal::local {

struct ApiError {
  int code = 500;
  std::string reason;  // NotFound, AlreadyExists, Conflict, Invalid, BadRequest, ...
  std::string message;
  nlohmann::json details = nlohmann::json::object();  // {name, group, kind, causes}
};

inline nlohmann::json StatusJson(const ApiError& e) {
  nlohmann::json s = {
      {"kind", "Status"},    {"apiVersion", "v1"},   {"metadata", nlohmann::json::object()},
      {"status", "Failure"}, {"message", e.message}, {"reason", e.reason},
      {"code", e.code}};
  if (!e.details.empty()) s["details"] = e.details;
  return s;
}

inline nlohmann::json Details(const ResourceInfo& r, const std::string& name) {
  nlohmann::json d = {{"kind", r.plural}};
  if (!name.empty()) d["name"] = name;
  if (!r.group.empty()) d["group"] = r.group;
  return d;
}

inline ApiError NotFoundError(const ResourceInfo& r, const std::string& name) {
  return {404, "NotFound", r.qualified() + " \"" + name + "\" not found", Details(r, name)};
}

inline ApiError BadRequest(const std::string& message) { return {400, "BadRequest", message, {}}; }

inline ApiError ConflictError(const ResourceInfo& r, const std::string& name) {
  // kube-apiserver's wording for a stale resourceVersion (storage.NewResourceVersionConflictsError)
  return {409, "Conflict",
          "Operation cannot be fulfilled on " + r.qualified() + " \"" + name +
              "\": the object has been modified; please apply your changes to the latest version "
              "and try again",
          Details(r, name)};
}

// 422 with a cause per field, message as kube-apiserver's errors.NewInvalid.
inline ApiError InvalidError(const ResourceInfo& r, const std::string& name,
                             const std::vector<FieldCause>& causes) {
  std::string kind = r.group.empty() ? r.kind : r.kind + "." + r.group;
  std::string list;
  for (size_t i = 0; i < causes.size(); ++i) {
    if (i) list += ", ";
    list += causes[i].field + ": " + causes[i].message;
  }
  std::string message = kind + " \"" + name + "\" is invalid: ";
  message += causes.size() == 1 ? list : "[" + list + "]";
  nlohmann::json details = Details(r, name);
  details["kind"] = r.kind;
  details["causes"] = nlohmann::json::array();
  for (const auto& c : causes)
    details["causes"].push_back({{"reason", c.reason}, {"message", c.message}, {"field", c.field}});
  return {422, "Invalid", message, details};
}

}  // namespace tidal::local
