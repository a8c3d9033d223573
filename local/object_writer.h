// local/object_writer.h — every write `tidal local` accepts, as kube-apiserver's
// generic registry does it: create (uid, creationTimestamp, generation, generateName), update
// with optimistic concurrency (409 on a stale resourceVersion), the status and scale
// subresources, JSON merge / JSON / apply patches, CRD schema validation and defaulting,
// delete with preconditions, finalizers and deletionTimestamp, and ownerReference garbage
// collection (Background, Foreground, Orphan). Writes are serialised so each
// read-check-write is atomic. No HTTP here: the server and the process kubelet both call it.
#pragma once

#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "local/api_error.h"
#include "local/registry.h"
#include "local/store.h"

namespace tidal::local {

struct WriteOptions {
  std::string field_validation = "Strict";  // Strict | Warn | Ignore (kubectl sends Strict)
  bool dry_run = false;
};

struct ApiResult {
  std::optional<ApiError> error;
  nlohmann::json object;
  int code = 200;
  std::vector<std::string> warnings;
  bool ok() const { return !error; }
  static ApiResult Error(ApiError e) {
    ApiResult r;
    r.error = std::move(e);
    return r;
  }
};

class ObjectWriter {
 public:
  ObjectWriter(Store& store, Registry& registry) : store_(store), registry_(registry) {}

  ApiResult Create(const ResourceInfo& r, const std::string& ns, nlohmann::json body,
                   const WriteOptions& options);
  // PUT of the object or of its status/scale subresource.
  ApiResult Update(const ResourceInfo& r, const std::string& ns, const std::string& name,
                   nlohmann::json body, const std::string& subresource,
                   const WriteOptions& options);
  ApiResult Patch(const ResourceInfo& r, const std::string& ns, const std::string& name,
                  const std::string& content_type, const std::string& patch,
                  const std::string& subresource, const WriteOptions& options);
  ApiResult Delete(const ResourceInfo& r, const std::string& ns, const std::string& name,
                   const nlohmann::json& delete_options);
  // The autoscaling/v1 Scale view of an object with a scale subresource.
  ApiResult GetScale(const ResourceInfo& r, const std::string& ns, const std::string& name);

  // Registers the kinds of every stored CRD (at startup).
  void RegisterStoredCrds();

 private:
  ApiResult UpdateLocked(const ResourceInfo& r, const std::string& ns, const std::string& name,
                         nlohmann::json body, const std::string& subresource,
                         const WriteOptions& options);
  ApiResult CreateLocked(const ResourceInfo& r, const std::string& ns, nlohmann::json body,
                         const WriteOptions& options);
  // A pod on a node is marked for graceful deletion; an empty result means "delete now".
  ApiResult DeletePodGracefully(const ResourceInfo& r, const std::string& ns,
                                const std::string& name, std::optional<int64_t> grace,
                                const nlohmann::json& preconditions);
  ApiResult DeleteLocked(const ResourceInfo& r, const std::string& ns, const std::string& name,
                         const std::string& propagation, const nlohmann::json& preconditions);
  // Schema, names and kind checks shared by create and update; fills warnings.
  std::optional<ApiError> Admit(const ResourceInfo& r, const std::string& name,
                                nlohmann::json& object, const WriteOptions& options,
                                std::vector<std::string>& warnings);
  // After `owner_uid` is gone: delete (or orphan) its dependents, then finish foreground
  // deletions that were waiting for them.
  void CollectDependents(const std::string& owner_uid, const std::string& propagation);
  void FinishForegroundDeletions();
  // Really removes an object whose finalizers are done (and what hangs off it).
  ApiResult Remove(const ResourceInfo& r, const std::string& ns, const std::string& name,
                   const std::string& propagation);
  std::optional<ResourceInfo> ResourceOf(const ObjectKey& key) const;
  std::optional<ApiError> AdmitPriority(const ResourceInfo& r, const std::string& name,
                                        nlohmann::json& pod);
  ObjectKey Key(const ResourceInfo& r, const std::string& ns, const std::string& name) const {
    return {r.storage_resource(), r.namespaced ? ns : "", name};
  }

  Store& store_;
  Registry& registry_;
  std::recursive_mutex mu_;
};

}  // namespace tidal::local
