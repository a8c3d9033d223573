// kube/object.cc
#include "kube/object.h"

namespace tidal::kube {
namespace {

using nlohmann::json;

Status ReadString(const json& j, const char* key, std::string& out, const std::string& path) {
  if (!j.contains(key) || j[key].is_null()) return OkStatus();
  if (!j[key].is_string())
    return InvalidArgument(path + "." + key + ": expected a string, got " + j[key].dump());
  out = j[key].get<std::string>();
  return OkStatus();
}

Status ReadStringMap(const json& j, const char* key, std::map<std::string, std::string>& out,
                     const std::string& path) {
  if (!j.contains(key) || j[key].is_null()) return OkStatus();
  if (!j[key].is_object()) return InvalidArgument(path + "." + key + ": expected a map of strings");
  for (const auto& [k, v] : j[key].items()) {
    if (!v.is_string())
      return InvalidArgument(path + "." + key + "." + k + ": expected a string, got " + v.dump());
    out[k] = v.get<std::string>();
  }
  return OkStatus();
}

}  // namespace

StatusOr<ObjectMeta> ObjectMetaFromJson(const json& j) {
  const std::string path = "metadata";
  if (!j.is_object()) return InvalidArgument("metadata: expected an object");
  ObjectMeta m;
  TIDAL_RETURN_IF_ERROR(ReadString(j, "name", m.name, path));
  TIDAL_RETURN_IF_ERROR(ReadString(j, "generateName", m.generate_name, path));
  TIDAL_RETURN_IF_ERROR(ReadString(j, "namespace", m.namespace_, path));
  TIDAL_RETURN_IF_ERROR(ReadString(j, "uid", m.uid, path));
  TIDAL_RETURN_IF_ERROR(ReadString(j, "resourceVersion", m.resource_version, path));
  TIDAL_RETURN_IF_ERROR(ReadString(j, "creationTimestamp", m.creation_timestamp, path));
  if (j.contains("deletionTimestamp") && !j["deletionTimestamp"].is_null()) {
    std::string ts;
    TIDAL_RETURN_IF_ERROR(ReadString(j, "deletionTimestamp", ts, path));
    m.deletion_timestamp = ts;
  }
  if (j.contains("generation") && !j["generation"].is_null()) {
    if (!j["generation"].is_number_integer())
      return InvalidArgument("metadata.generation: expected an integer");
    m.generation = j["generation"].get<int64_t>();
  }
  TIDAL_RETURN_IF_ERROR(ReadStringMap(j, "labels", m.labels, path));
  TIDAL_RETURN_IF_ERROR(ReadStringMap(j, "annotations", m.annotations, path));
  if (j.contains("finalizers") && !j["finalizers"].is_null()) {
    if (!j["finalizers"].is_array()) return InvalidArgument("metadata.finalizers: expected a list");
    for (const auto& f : j["finalizers"]) {
      if (!f.is_string()) return InvalidArgument("metadata.finalizers: expected strings");
      m.finalizers.push_back(f.get<std::string>());
    }
  }
  if (j.contains("ownerReferences") && !j["ownerReferences"].is_null()) {
    if (!j["ownerReferences"].is_array())
      return InvalidArgument("metadata.ownerReferences: expected a list");
    for (size_t i = 0; i < j["ownerReferences"].size(); ++i) {
      const json& r = j["ownerReferences"][i];
      const std::string at = "metadata.ownerReferences[" + std::to_string(i) + "]";
      if (!r.is_object()) return InvalidArgument(at + ": expected an object");
      OwnerReference ref;
      TIDAL_RETURN_IF_ERROR(ReadString(r, "apiVersion", ref.api_version, at));
      TIDAL_RETURN_IF_ERROR(ReadString(r, "kind", ref.kind, at));
      TIDAL_RETURN_IF_ERROR(ReadString(r, "name", ref.name, at));
      TIDAL_RETURN_IF_ERROR(ReadString(r, "uid", ref.uid, at));
      ref.controller = r.value("controller", false);
      ref.block_owner_deletion = r.value("blockOwnerDeletion", false);
      m.owner_references.push_back(std::move(ref));
    }
  }
  static const char* kKnown[] = {"name",
                                 "generateName",
                                 "namespace",
                                 "uid",
                                 "resourceVersion",
                                 "creationTimestamp",
                                 "deletionTimestamp",
                                 "generation",
                                 "labels",
                                 "annotations",
                                 "finalizers",
                                 "ownerReferences"};
  m.unknown = j;
  for (const char* key : kKnown) m.unknown.erase(key);
  return m;
}

json ToJson(const ObjectMeta& m) {
  json j = m.unknown.is_object() ? m.unknown : json::object();
  auto put = [&](const char* key, const std::string& v) {
    if (!v.empty()) j[key] = v;
  };
  put("name", m.name);
  put("generateName", m.generate_name);
  put("namespace", m.namespace_);
  put("uid", m.uid);
  put("resourceVersion", m.resource_version);
  put("creationTimestamp", m.creation_timestamp);
  if (m.deletion_timestamp) j["deletionTimestamp"] = *m.deletion_timestamp;
  if (m.generation != 0) j["generation"] = m.generation;
  if (!m.labels.empty()) j["labels"] = m.labels;
  if (!m.annotations.empty()) j["annotations"] = m.annotations;
  if (!m.finalizers.empty()) j["finalizers"] = m.finalizers;
  if (!m.owner_references.empty()) {
    j["ownerReferences"] = json::array();
    for (const auto& r : m.owner_references) {
      json o = {{"apiVersion", r.api_version}, {"kind", r.kind}, {"name", r.name}, {"uid", r.uid}};
      if (r.controller) o["controller"] = true;
      if (r.block_owner_deletion) o["blockOwnerDeletion"] = true;
      j["ownerReferences"].push_back(std::move(o));
    }
  }
  return j;
}

StatusOr<Object> ObjectFromJson(const json& j) {
  if (!j.is_object()) return InvalidArgument("object: expected a JSON object");
  Object o;
  TIDAL_RETURN_IF_ERROR(ReadString(j, "apiVersion", o.api_version, "object"));
  TIDAL_RETURN_IF_ERROR(ReadString(j, "kind", o.kind, "object"));
  if (o.api_version.empty()) return InvalidArgument("apiVersion: required");
  if (o.kind.empty()) return InvalidArgument("kind: required");
  if (j.contains("metadata")) {
    TIDAL_ASSIGN_OR_RETURN(o.metadata, ObjectMetaFromJson(j["metadata"]));
  }
  o.rest = j;
  for (const char* key : {"apiVersion", "kind", "metadata"}) o.rest.erase(key);
  return o;
}

json ToJson(const Object& o) {
  json j = o.rest.is_object() ? o.rest : json::object();
  j["apiVersion"] = o.api_version;
  j["kind"] = o.kind;
  j["metadata"] = ToJson(o.metadata);
  return j;
}

}  // namespace tidal::kube
