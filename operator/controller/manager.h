// operator/controller/manager.h — the operator process around the controller: the API
// connection, the Event recorder, Lease leader election (the controller runs only while this
// process leads; a new leader picks up half-done rescales from status), and optionally the
// TrainingJob CRD installed from the copy built into the binary (crds/, the one source).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "common/status.h"
#include "kube/config.h"
#include "kube/leader.h"
#include "operator/controller/controller.h"

namespace tidal::controller {

struct ManagerOptions {
  kube::Connection connection;
  ControllerOptions controller;
  bool leader_elect = true;
  std::string lease_namespace = "default";
  std::string lease_name = "tidal-operator";
  std::string identity;  // "" → hostname + pid
  // Leader election's timing (kube::LeaderElectionConfig's defaults are client-go's).
  std::chrono::milliseconds lease_duration = kube::LeaderElectionConfig::kDefaultLeaseDuration;
  std::chrono::milliseconds renew_deadline = kube::LeaderElectionConfig::kDefaultRenewDeadline;
  std::chrono::milliseconds retry_period = kube::LeaderElectionConfig::kDefaultRetryPeriod;
  bool install_crd = false;
  // Where /metrics is served ("host:port", port 0 picks one; "" serves none).
  std::string metrics_address;
};

// The CRD as built into the binary (crds/tidal.dev_trainingjobs.yaml), as JSON.
StatusOr<nlohmann::json> BuiltInCrd();
// Creates the CRD, or replaces an older copy with this one.
Status InstallCrd(kube::KubeClient& client);

class Manager {
 public:
  static StatusOr<std::unique_ptr<Manager>> Start(ManagerOptions options);
  ~Manager();
  void Stop();
  bool leading() const;
  int metrics_port() const;  // 0 when no /metrics is served

 private:
  struct State;
  explicit Manager(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace tidal::controller
