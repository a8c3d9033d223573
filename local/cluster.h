// local/cluster.h — `tidal local`: one process holding the API server and the
// process kubelet (`tidal local` in operator/main.cc adds the operator on top). On first start
// it creates, under DIR, a CA, a serving certificate for 127.0.0.1/localhost, an admin bearer
// token and a kubeconfig; later starts reuse them (and the port), so clients and watchers carry
// on after a restart.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "local/apiserver.h"
#include "local/kubelet.h"

namespace tidal::local {

struct ClusterOptions {
  std::string data_dir = ".tidal/local";
  int port = -1;  // -1: the port of the previous start, else any free port; 0: any free port
  int nodes = 1;
  int gpus_per_node = 8;
  size_t history_size = 10000;
  std::chrono::milliseconds bookmark_interval{std::chrono::seconds(60)};
  std::vector<std::string> images;  // --image NAME=PATH entries, on top of the defaults
  std::chrono::milliseconds crash_backoff{std::chrono::seconds(10)};
  std::string audit_log_path;  // "" → none; else every API request, as audit.k8s.io/v1 Events
  bool keep_logs = false;      // KubeletOptions::keep_logs
  ApiServerOptions::AdmitCreate admit_create;  // tests: refuse some creations (ApiServerOptions)
  ApiServerOptions::AdmitUpdate admit_update;  // tests: refuse or hold some updates
};

// The image table `tidal local` starts with: base images run host commands, and Tidal's own
// images run the binaries built beside `tidal` (tidal-worker, tidal-train).
StatusOr<ImageTable> DefaultImages(const std::vector<std::string>& extra);

class LocalCluster {
 public:
  static StatusOr<std::unique_ptr<LocalCluster>> Start(ClusterOptions options);
  ~LocalCluster();
  std::string kubeconfig_path() const { return options_.data_dir + "/kubeconfig"; }
  int port() const { return api_->port(); }
  ApiServer& api() { return *api_; }
  ProcessKubelet& kubelet() { return *kubelet_; }
  void Stop();

 private:
  explicit LocalCluster(ClusterOptions options) : options_(std::move(options)) {}
  Status RegisterNodes();

  ClusterOptions options_;
  std::unique_ptr<ApiServer> api_;
  std::unique_ptr<ProcessKubelet> kubelet_;
};

}  // namespace tidal::local
