// kube/object.h — Kubernetes object metadata as a typed struct, and the unstructured
// object the client carries for any kind. Round trips keep every field this code does not
// know (a newer API server's fields must survive a read-modify-write). Pure: no I/O.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace tidal::kube {

struct OwnerReference {
  std::string api_version, kind, name, uid;
  bool controller = false;
  bool block_owner_deletion = false;
  bool operator==(const OwnerReference&) const = default;
};

// metav1.ObjectMeta: the fields Tidal reads or writes; everything else rides in `unknown`.
struct ObjectMeta {
  std::string name;
  std::string generate_name;
  std::string namespace_;
  std::string uid;
  std::string resource_version;
  int64_t generation = 0;
  std::string creation_timestamp;
  std::optional<std::string> deletion_timestamp;
  std::map<std::string, std::string> labels;
  std::map<std::string, std::string> annotations;
  std::vector<OwnerReference> owner_references;
  std::vector<std::string> finalizers;
  nlohmann::json unknown = nlohmann::json::object();
};

StatusOr<ObjectMeta> ObjectMetaFromJson(const nlohmann::json& json);
nlohmann::json ToJson(const ObjectMeta& meta);

// Any object: apiVersion, kind, typed metadata, and the rest (spec, status, data, ...) as JSON.
struct Object {
  std::string api_version;
  std::string kind;
  ObjectMeta metadata;
  nlohmann::json rest = nlohmann::json::object();
};

// Refuses what is not an object or lacks apiVersion/kind, naming the field.
StatusOr<Object> ObjectFromJson(const nlohmann::json& json);
nlohmann::json ToJson(const Object& object);

}  // namespace tidal::kube
