// operator/controller/plan_executor.cc — each kind of action (operator/reconciler/action.h)
// turned into work: API writes (created, patched or deleted in the plan's order after the pass)
// and worker calls (each on its own thread once the status is written). execute.cc runs them.
#include <future>

#include "common/log.h"
#include "operator/controller/controller_internal.h"
#include "operator/reconciler/event_reason.h"

namespace tidal::controller {

using nlohmann::json;
using reconciler::DataPhase;
using reconciler::DefaultCheckpointUri;
using reconciler::HeadlessService;
using reconciler::kControlPort;
using reconciler::kFinalizer;
using reconciler::NewToken;
using reconciler::PrepPod;
using reconciler::SpecConfigMap;
using reconciler::SpecConfigMapName;
using reconciler::StorePort;
using reconciler::TokenSecret;
using reconciler::TokenSecretName;
using reconciler::WorkerPod;
using reconciler::WorkerPodOptions;

TrainingJobController::PlanExecutor::PlanExecutor(TrainingJobController& controller,
                                                  const json& job, const Observed& o,
                                                  const Plan& plan, WorkerConnections& connections,
                                                  std::shared_ptr<std::string> version)
    : c_(controller),
      job_(job),
      o_(o),
      plan_(plan),
      connections_(connections),
      version_(std::move(version)),
      ref_{o.name, o.namespace_, o.uid},
      token_(controller.TokenOf(o.namespace_, o.name)),
      job_key_(shell::Key(o.namespace_, o.name)) {}

std::function<Status()> TrainingJobController::PlanExecutor::Create(kube::Resource r,
                                                                    json object) const {
  return [&client = c_.client_, ns = o_.namespace_, r, object = std::move(object)]() -> Status {
    TIDAL_ASSIGN_OR_RETURN(auto request, kube::CreateRequest(r, ns, object));
    auto made = client.Call(request);
    if (made.ok() || made.status().code() == StatusCode::kAlreadyExists) return OkStatus();
    return made.status().WithContext("creating " + r.plural + "/" +
                                     object["metadata"].value("name", std::string()));
  };
}

std::function<Status()> TrainingJobController::PlanExecutor::Call(kube::Request request) const {
  return [&client = c_.client_, request = std::move(request)] {
    return client.Call(request).status();
  };
}

std::string TrainingJobController::PlanExecutor::PodIp(const std::string& pod) const {
  for (const PodView& p : o_.pods)
    if (p.name == pod) return p.ip;
  return "";
}

std::shared_ptr<contract::WorkerApi> TrainingJobController::PlanExecutor::WorkerOf(
    const std::string& pod, Status* unusable) {
  const std::string ip = PodIp(pod);
  if (ip.empty()) return nullptr;
  std::shared_ptr<contract::WorkerApi> w =
      c_.ClientFor(connections_, pod, ip, token_, c_.options_.status_timeout);
  if (!w) *unusable = FailedPrecondition(connections_.tls_unusable);
  return w;
}

void TrainingJobController::PlanExecutor::Start(const std::string& pod, const std::string& what,
                                                std::function<Status()> call, bool wake) {
  starts.push_back([&c = c_, job_key = job_key_, pod, what, wake, call = std::move(call)] {
    c.worker_calls_.Start(
        job_key + "/" + pod + "/" + what, call, [&c, job_key, pod, what, wake](const Status& s) {
          if (!s.ok())
            LogInfo("worker call failed",
                    {{"job", job_key}, {"pod", pod}, {"call", what}, {"error", s.ToString()}});
          if (wake) c.queue_.Add(job_key);
        });
  });
}

// --- API writes ---------------------------------------------------------------------------

Status TrainingJobController::PlanExecutor::Finalizer(bool add) {
  json finalizers = json::array();
  for (const json& f : job_["metadata"].value("finalizers", json::array()))
    if (f != kFinalizer) finalizers.push_back(f);
  if (add) finalizers.push_back(kFinalizer);
  // Named at the version the status write (before it) leaves.
  writes.push_back(
      {add ? action::AddFinalizer::kName : action::RemoveFinalizer::kName,
       [&client = c_.client_, version = version_, finalizers, ns = o_.namespace_,
        name = o_.name]() -> Status {
         const json patch = {
             {"metadata", {{"finalizers", finalizers}, {"resourceVersion", *version}}}};
         TIDAL_ASSIGN_OR_RETURN(auto request, kube::MergePatchRequest(
                                                  kube::Resource::TrainingJobs(), ns, name, patch));
         return client.Call(request).status();
       }});
  return OkStatus();
}

Status TrainingJobController::PlanExecutor::operator()(const action::EnsureService&) {
  writes.push_back(
      {action::EnsureService::kName, Create(kube::Resource::Services(), HeadlessService(ref_))});
  return OkStatus();
}

Status TrainingJobController::PlanExecutor::operator()(const action::EnsureTokenSecret&) {
  // The token this job's workers hold, when it had one: its Secret was deleted under them.
  // Emitted so that `kubectl describe` says why the Secret is back.
  std::string known = connections_.token_uid == o_.uid && !o_.uid.empty() ? connections_.token : "";
  if (!known.empty()) {
    c_.recorder_.Record(job_, EventTypeOf(EventReason::kTokenSecretRecreated),
                        EventReasonName(EventReason::kTokenSecretRecreated),
                        "Secret " + TokenSecretName(o_.name) +
                            " was deleted while the job's workers hold its token: made again "
                            "with the same token");
  } else {
    TIDAL_ASSIGN_OR_RETURN(known, NewToken());
  }
  writes.push_back({action::EnsureTokenSecret::kName,
                    Create(kube::Resource::Secrets(), TokenSecret(ref_, known))});
  return OkStatus();
}

Status TrainingJobController::PlanExecutor::operator()(const action::EnsureSpecConfig&) {
  writes.push_back({action::EnsureSpecConfig::kName,
                    Create(kube::Resource::ConfigMaps(), SpecConfigMap(ref_, o_.raw_spec))});
  return OkStatus();
}

Status TrainingJobController::PlanExecutor::operator()(const action::UpdateSpecConfig&) {
  json config = SpecConfigMap(ref_, o_.raw_spec);
  TIDAL_ASSIGN_OR_RETURN(auto request, kube::MergePatchRequest(
                                           kube::Resource::ConfigMaps(), o_.namespace_,
                                           SpecConfigMapName(o_.name), {{"data", config["data"]}}));
  writes.push_back(
      {action::UpdateSpecConfig::kName,
       [patch = Call(std::move(request)), make = Create(kube::Resource::ConfigMaps(), config)] {
         Status patched = patch();
         return patched.code() == StatusCode::kNotFound ? make() : patched;
       }});
  return OkStatus();
}

Status TrainingJobController::PlanExecutor::operator()(const action::CreatePods& a) {
  if (!o_.spec.ok()) return OkStatus();
  WorkerPodOptions w;
  w.generation = a.generation;
  w.group_size = static_cast<int>(a.slots.size());
  if (!c_.options_.default_checkpoint_root.empty())
    w.default_checkpoint_uri = DefaultCheckpointUri(c_.options_.default_checkpoint_root, ref_);
  if (plan_.status.data && plan_.status.data->phase == DataPhase::kReady)
    w.dataset_store = plan_.status.data->store_uri;
  std::vector<std::function<Status()>> each;
  for (int slot : a.slots) {
    w.slot = slot;
    each.push_back(Create(kube::Resource::Pods(), WorkerPod(ref_, *o_.spec, w)));
  }
  if (each.empty()) return OkStatus();
  // All pods of the step at once (one gang). The first alone: a pod the server refuses (quota,
  // admission, a bad field) is refused once, not once per slot. The rest side by side, as the
  // Job controller's slow start does: a 10-pod gang costs two round trips.
  writes.push_back({action::CreatePods::kName, [each = std::move(each)] {
                      Status made = each[0]();
                      if (!made.ok()) return made;
                      std::vector<std::future<Status>> rest;
                      for (size_t i = 1; i < each.size(); ++i)
                        rest.push_back(std::async(std::launch::async, each[i]));
                      for (auto& f : rest)
                        if (Status s = f.get(); !s.ok()) made = s;
                      return made;
                    }});
  return OkStatus();
}

Status TrainingJobController::PlanExecutor::operator()(const action::CreatePrepPod& a) {
  if (!o_.spec.ok() || !plan_.status.data) return OkStatus();
  writes.push_back(
      {action::CreatePrepPod::kName,
       Create(kube::Resource::Pods(), PrepPod(ref_, *o_.spec, a.pod, plan_.status.data->key))});
  return OkStatus();
}

Status TrainingJobController::PlanExecutor::Delete(const std::vector<std::string>& pods,
                                                   bool force) {
  for (const std::string& pod : pods) {
    kube::DeleteOptions options;
    if (force) options.grace_period_seconds = 0;
    TIDAL_ASSIGN_OR_RETURN(
        auto request, kube::DeleteRequest(kube::Resource::Pods(), o_.namespace_, pod, options));
    writes.push_back({force ? action::ForceDeletePods::kName : action::DeletePods::kName,
                      [delete_pod = Call(std::move(request))] {
                        Status deleted = delete_pod();
                        return deleted.code() == StatusCode::kNotFound ? OkStatus() : deleted;
                      }});
    connections_.clients.erase(pod);
    connections_.answered.erase(pod);
    connections_.unreachable_since.erase(pod);
    connections_.unreachable_error.erase(pod);
    connections_.asking.erase(pod);
  }
  return OkStatus();
}

// --- worker calls ---------------------------------------------------------------------------

Status TrainingJobController::PlanExecutor::operator()(const action::Barrier& a) {
  // Returns when every rank holds (or one fails): its end wakes the job, whose next pass finds
  // the ranks paused and goes on (the Rendezvous, without waiting for a poll).
  Status done = OkStatus();
  const auto timeout =
      std::chrono::duration_cast<std::chrono::milliseconds>(c_.options_.reconcile.barrier_timeout);
  for (const std::string& pod : a.pods)
    if (std::shared_ptr<contract::WorkerApi> w = WorkerOf(pod, &done))
      Start(
          pod, "barrier " + std::to_string(a.id),
          [w, timeout, id = a.id, live = a.live] {
            return w->Checkpoint(/*pause=*/true, timeout, id, live).status();
          },
          /*wake=*/true);
  return done;
}

Status TrainingJobController::PlanExecutor::operator()(const action::Rendezvous& a) {
  if (a.pods.empty()) return OkStatus();
  Status done = OkStatus();
  const std::string store = PodIp(a.pods[0]) + ":" + std::to_string(StorePort(a.generation));
  // The old ranks' control addresses; one that has none any more makes the new ranks resume
  // from the store (they would fail to read from it anyway).
  std::vector<std::string> peers;
  for (const std::string& pod : a.state_peers) {
    const std::string ip = PodIp(pod);
    if (ip.empty()) {
      peers.clear();
      break;
    }
    peers.push_back(ip + ":" + std::to_string(kControlPort));
  }
  // The members' control addresses, for buddy copies (none when one has no address yet).
  std::vector<std::string> members;
  for (const std::string& pod : a.pods) {
    const std::string ip = PodIp(pod);
    if (ip.empty() || a.wards.size() != a.pods.size()) {
      members.clear();
      break;
    }
    members.push_back(ip + ":" + std::to_string(kControlPort));
  }
  for (const std::string& pod : a.targets) {
    const auto rank = std::find(a.pods.begin(), a.pods.end(), pod) - a.pods.begin();
    std::shared_ptr<contract::WorkerApi> w = WorkerOf(pod, &done);
    if (!w) continue;
    const int ward = members.empty() ? static_cast<int>(rank) : a.wards[rank];
    Start(
        pod, "rendezvous " + std::to_string(a.generation),
        [w, generation = a.generation, world = static_cast<int>(a.pods.size()),
         rank = static_cast<int>(rank), store, peers, step = peers.empty() ? 0 : a.state_step,
         members, ward, restarts = a.restarts] {
          Status s =
              w->Rendezvous(generation, world, rank, store, peers, step, members, ward, restarts);
          // Already there (a repeated call after a crash) is success.
          return s.code() == StatusCode::kAlreadyExists ? OkStatus() : s;
        },
        /*wake=*/true);
  }
  return done;
}

Status TrainingJobController::PlanExecutor::operator()(const action::PrepareEngine& a) {
  // A refusal (TIDAL_KEEP_ENGINE=0, an older worker) only means that worker loads after the
  // Rendezvous: Decide does not wait for it (its failure is logged).
  Status done = OkStatus();
  for (size_t i = 0; i < a.pods.size() && i < a.ranks.size(); ++i)
    if (std::shared_ptr<contract::WorkerApi> w = WorkerOf(a.pods[i], &done))
      Start(
          a.pods[i], "prepare " + std::to_string(a.generation),
          [w, generation = a.generation, world = a.world_size, rank = a.ranks[i]] {
            return w->PrepareEngine(generation, world, rank);
          },
          /*wake=*/false);
  return done;
}

Status TrainingJobController::PlanExecutor::operator()(const action::Resume& a) {
  Status done = OkStatus();
  for (const std::string& pod : a.pods)
    if (std::shared_ptr<contract::WorkerApi> w = WorkerOf(pod, &done))
      Start(
          pod, "resume",
          [w] {
            // Not paused (any more) is what this asks for: Decide looks again.
            Status s = w->Resume();
            return s.code() == StatusCode::kFailedPrecondition ? OkStatus() : s;
          },
          /*wake=*/true);
  return done;
}

Status TrainingJobController::PlanExecutor::operator()(const action::Shutdown& a) {
  for (const std::string& pod : a.pods) {
    const std::string ip = PodIp(pod);
    if (ip.empty() || token_.empty()) continue;
    if (std::shared_ptr<contract::WorkerApi> w =
            c_.ClientFor(connections_, pod, ip, token_, c_.options_.status_timeout))
      Start(
          pod, "shutdown", [w, reason = a.reason] { return w->Shutdown(reason); },
          /*wake=*/false);  // the pod is deleted anyway
  }
  return OkStatus();
}

}  // namespace tidal::controller
