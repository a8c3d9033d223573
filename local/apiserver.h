// local/apiserver.h — the Kubernetes-API-compatible server inside `tidal local`:
// HTTPS on 127.0.0.1 with a bearer token, discovery and OpenAPI for kubectl, CRUD + watch for
// every registered kind over the durable Store, CustomResourceDefinitions with schema
// validation, status/scale subresources, merge/JSON/apply patches, finalizers and
// ownerReference garbage collection. Each behaviour mirrors kube-apiserver as described in
// docs/local-cluster.md; it is not a Kubernetes replacement (no RBAC, no admission webhooks,
// no CEL, no protobuf). Depends on common/http and the Store; nothing in the operator
// depends on it.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "common/http/server.h"
#include "common/status.h"
#include "local/audit.h"
#include "local/object_writer.h"
#include "local/registry.h"
#include "local/store.h"

namespace tidal::local {

struct ApiServerOptions {
  std::string data_dir;
  std::string token;  // required bearer token
  std::string cert_pem, key_pem;
  int port = 0;
  size_t history_size = 10000;  // watch window, in changes (older versions get 410 Gone)
  std::chrono::milliseconds bookmark_interval{std::chrono::seconds(60)};
  size_t max_body_bytes = 3 * 1024 * 1024;  // kube-apiserver's request size limit
  std::string audit_log_path;               // "" → no audit log (audit.h)
  // A validating admission step for creations over HTTP: a non-empty answer refuses the object
  // with 422 Invalid and that message, as a webhook's or a policy's denial reaches a client
  // (tests use it to make the server refuse what a controller creates).
  using AdmitCreate = std::function<std::string(const std::string& plural, const std::string& ns,
                                                const nlohmann::json& object)>;
  AdmitCreate admit_create;
  // The same for updates over HTTP (PUT and PATCH, `subresource` "" or e.g. "status"; `body`
  // as sent); it may also take its time, as a slow webhook holds a request (tests hold a
  // controller's writes).
  using AdmitUpdate = std::function<std::string(
      const std::string& plural, const std::string& ns, const std::string& name,
      const std::string& subresource, const std::string& body)>;
  AdmitUpdate admit_update;
  // Where `kubectl logs` reads a pod container's output (set by the process kubelet).
  std::function<std::string(const std::string& ns, const std::string& pod,
                            const std::string& container)>
      log_path;
};

class ApiServer {
 public:
  static StatusOr<std::unique_ptr<ApiServer>> Start(ApiServerOptions options);
  ~ApiServer();
  int port() const { return http_->port(); }
  Store& store() { return *store_; }
  void Stop();

  // The handler, public for in-process callers (the kubelet writes through it too).
  void Handle(const http::Request& request, http::ResponseWriter& writer);

  // In-process access with the same semantics as HTTP (the process kubelet writes here).
  ObjectWriter& writer() { return *writer_; }
  Registry& registry() { return registry_; }

 private:
  explicit ApiServer(ApiServerOptions options) : options_(std::move(options)) {}
  Status Bootstrap();

  ApiServerOptions options_;
  std::unique_ptr<Store> store_;
  Registry registry_;
  std::unique_ptr<ObjectWriter> writer_;
  std::unique_ptr<AuditLog> audit_;  // of requests over HTTP, when asked for
  std::unique_ptr<http::Server> http_;
  friend class RequestContext;
  std::atomic<bool> stopped_{false};
};

}  // namespace tidal::local
