// operator/controller/manager.cc
#include "operator/controller/manager.h"

#include <unistd.h>

#include <cctype>
#include <mutex>

#include "common/log.h"
#include "common/metrics/endpoint.h"
#include "common/yaml_json.h"
#include "kube/leader.h"
#include "operator/controller/metrics.h"

namespace tidal::controller {

extern const char* const kBuiltInCrdYaml;  // crd_yaml.cc, generated from crds/ at configure time

StatusOr<nlohmann::json> BuiltInCrd() { return ParseYaml(kBuiltInCrdYaml); }

Status InstallCrd(kube::KubeClient& client) {
  TIDAL_ASSIGN_OR_RETURN(nlohmann::json crd, BuiltInCrd());
  const auto resource = kube::Resource::CustomResourceDefinitions();
  const std::string name = crd["metadata"]["name"];
  TIDAL_ASSIGN_OR_RETURN(auto create, kube::CreateRequest(resource, "", crd));
  auto made = client.Call(create);
  if (made.ok()) {
    LogInfo("installed the TrainingJob CRD", {{"name", name}});
    return OkStatus();
  }
  if (made.status().code() != StatusCode::kAlreadyExists)
    return made.status().WithContext("CRD " + name);
  TIDAL_ASSIGN_OR_RETURN(auto get, kube::GetRequest(resource, "", name));
  TIDAL_ASSIGN_OR_RETURN(nlohmann::json current, client.Call(get));
  crd["metadata"]["resourceVersion"] = current["metadata"].value("resourceVersion", "");
  TIDAL_ASSIGN_OR_RETURN(auto replace, kube::ReplaceRequest(resource, "", name, crd));
  auto replaced = client.Call(replace);
  if (!replaced.ok()) return replaced.status().WithContext("updating CRD " + name);
  return OkStatus();
}

struct Manager::State {
  ManagerOptions options;
  OperatorMetrics metrics;
  std::unique_ptr<metrics::Endpoint> endpoint;
  std::unique_ptr<kube::KubeClient> client;
  std::unique_ptr<kube::EventRecorder> recorder;
  std::unique_ptr<kube::LeaderElector> elector;
  std::mutex mu;
  std::unique_ptr<TrainingJobController> controller;

  void StartController() {
    std::lock_guard<std::mutex> lock(mu);
    if (controller) return;
    controller = std::make_unique<TrainingJobController>(*client, *recorder, options.controller);
    if (Status s = controller->Start(); !s.ok()) {
      LogError("controller did not start", {{"error", s.ToString()}});
      controller.reset();
      return;
    }
    metrics.SetLeader(true);
  }
  void StopController() {
    std::lock_guard<std::mutex> lock(mu);
    if (!controller) return;
    controller->Stop();
    controller.reset();
    metrics.SetLeader(false);
    metrics.ForgetAllJobs();
    LogInfo("controller stopped", {});
  }
};

Manager::Manager(std::unique_ptr<State> state) : state_(std::move(state)) {}

Manager::~Manager() { Stop(); }

StatusOr<std::unique_ptr<Manager>> Manager::Start(ManagerOptions options) {
  auto state = std::make_unique<State>();
  state->options = std::move(options);
  state->options.controller.metrics = &state->metrics;
  if (!state->options.metrics_address.empty()) {
    TIDAL_ASSIGN_OR_RETURN(state->endpoint, metrics::Endpoint::Start(state->options.metrics_address,
                                                                     state->metrics.registry()));
    LogInfo("serving /metrics", {{"port", state->endpoint->port()}});
  }
  TIDAL_ASSIGN_OR_RETURN(state->client, kube::KubeClient::Create(state->options.connection));
  // Every request's time (tidal_operator_api_request_duration_seconds; not a watch's, which
  // lasts as long as it is open), and the failed ones (tidal_operator_api_errors_total). A 404
  // is an answer the controller asks for (does it exist yet?), not a failure.
  state->client->set_observer([metrics = &state->metrics](const kube::Request& request, bool watch,
                                                          int code, double seconds) {
    std::string verb = watch ? "watch" : request.method;
    for (char& c : verb) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (!watch) metrics->ObserveApiRequest(verb, seconds);
    if (code != 0 && (code < 400 || code == 404)) return;
    metrics->CountApiError(verb, code);
  });
  if (state->options.install_crd) TIDAL_RETURN_IF_ERROR(InstallCrd(*state->client));
  std::string identity = state->options.identity;
  if (identity.empty()) {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    identity = std::string(host) + "_" + std::to_string(getpid());
  }
  kube::EventRecorderOptions recorder;
  recorder.source = {"tidal-operator", identity};
  // A job's Events are its story: a start, each rescale (four or five Events), each recovery,
  // suspends. client-go's spam filter (25, then one per 5 minutes per object) cut a busy job's
  // story short: the chaos soak lost a Succeeded after 28 Events in 3 minutes, and under load
  // ChartTest lost a second Unsuspended. The filter still stops a loop that emits on every
  // pass, after 100 Events, at one per 10 s; the rare Events an incident must show, and a
  // job's last word, are never filtered.
  recorder.correlator.spam_burst = 100;
  recorder.correlator.spam_refill_interval = std::chrono::seconds(10);
  recorder.correlator.unfiltered_reasons = {
      "Succeeded",    "RestartsExhausted", "ConfigurationError",
      "ForceDeleted", "Stalled",           "StatusUnreadable"};
  state->recorder = std::make_unique<kube::EventRecorder>(*state->client, recorder);
  State* raw = state.get();
  if (!state->options.leader_elect) {
    raw->StartController();
    return std::unique_ptr<Manager>(new Manager(std::move(state)));
  }
  kube::LeaderElectionConfig election;
  election.lease_namespace = state->options.lease_namespace;
  election.lease_name = state->options.lease_name;
  election.identity = identity;
  election.lease_duration = state->options.lease_duration;
  election.renew_deadline = state->options.renew_deadline;
  election.retry_period = state->options.retry_period;
  kube::LeaderCallbacks callbacks;
  callbacks.on_started_leading = [raw] {
    LogInfo("leading: starting the controller", {});
    raw->StartController();
  };
  callbacks.on_stopped_leading = [raw] { raw->StopController(); };
  state->elector = std::make_unique<kube::LeaderElector>(*state->client, election, callbacks);
  TIDAL_RETURN_IF_ERROR(state->elector->Start());
  return std::unique_ptr<Manager>(new Manager(std::move(state)));
}

void Manager::Stop() {
  if (!state_) return;
  if (state_->elector) state_->elector->Stop();  // releases the lease, stops the controller
  state_->StopController();
}

int Manager::metrics_port() const { return state_->endpoint ? state_->endpoint->port() : 0; }

bool Manager::leading() const {
  if (!state_->elector) return true;
  return state_->elector->IsLeader();
}

}  // namespace tidal::controller
